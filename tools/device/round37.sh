#!/usr/bin/env bash
# Session 9, calls 5 and 7 (one H200): the f32 attention kernels:
# their tests (as shipped), and every variant of tools/device/flash_f32.py.
source tools/device/common.sh
flash_tests
timeout 150 python3 tools/device/flash_f32.py > "$OUT/flash.txt" 2>&1
echo "== flash f32 kernels"; grep -v Warning "$OUT/flash.txt" | tail -8
