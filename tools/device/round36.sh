#!/usr/bin/env bash
# Session 9, call 4 (one H200): variants of the f32 attention kernels
# (tools/device/flash_f32.py) and the whole suite with CUDA. (The call also ran
# tools/device/loop_pairs.py, removed since with the paired loops it measured: no gain.)
source tools/device/common.sh
timeout 120 python3 tools/device/flash_f32.py > "$OUT/flash.txt" 2>&1
echo "== flash f32 kernels"; grep -v Warning "$OUT/flash.txt" | tail -8
suite 200
