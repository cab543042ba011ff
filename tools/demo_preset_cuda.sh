#!/usr/bin/env bash
# On the GPU machine, from the repo root (after tools/gpu_validate.sh's wheel setup):
# `accy demo --preset gpt2-small --device cuda --dtype bf16 --minutes 9` (the bar it is held to:
# below 1.5 nats/byte on held-out standard-library files within 10 minutes on the H200).
# A 20-step smoke run of the tiny preset on cuda first (a minute at most); if the bf16 run
# fails, the rest of the time goes to an f32 run. Full log: $OUT/preset.log; the loss plot(s)
# come back as $OUT/preset-*.png (the 1.5 GB checkpoint stays in /tmp). The whole script stays
# under PRESET_TOTAL_S (default 590 s): one 10-minute call.
set -uo pipefail
OUT="${OUT:-/tmp}"
LOG="$OUT/preset.log"
SUMMARY="$OUT/preset-summary.txt"
TOTAL="${PRESET_TOTAL_S:-590}"
MINUTES="${PRESET_MINUTES:-9}"
export PYTHONPATH="${PYTHONPATH:-src}" PYTHONUNBUFFERED=1
export ACCY_CACHE_DIR="/tmp/accy-cache-preset"
: > "$LOG"
: > "$SUMMARY"

step() {  # step NAME SECONDS COMMAND...: run with a timeout, log everything, note the status
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  echo "===== $name: $*" >> "$LOG"
  timeout "$limit" "$@" 2>&1 | tr '\r' '\n' >> "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$LOG" >> "$SUMMARY"
  return "$rc"
}

outcome() {  # the lines that say how each run went, and the last held-out losses
  grep -E 'compiled|before training|throughput|sample|Error|error' "$1" | tail -20
  grep -E '^step [0-9]+: held-out' "$1" | tail -8
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$SUMMARY" 2>&1

step tiny-cuda 60 python3 -m accy demo --preset tiny --device cuda --dtype bf16 --steps 20 \
  --out /tmp/preset-tiny
left=$((TOTAL - SECONDS - 50))  # 50 s: data, first evaluation, checkpoint, plot, sample
minutes=$(python3 -c "print(min($MINUTES, max($left, 0) / 60))")
if step gpt2-small-bf16 $((left + 45)) python3 -m accy demo --preset gpt2-small --device cuda \
  --dtype bf16 --minutes "$minutes" --out /tmp/preset-bf16; then
  cp /tmp/preset-bf16/loss.png "$OUT/preset-bf16.png" 2>/dev/null
else
  left=$((TOTAL - SECONDS - 50))
  if [ "$left" -gt 60 ]; then
    step gpt2-small-f32 $((left + 45)) python3 -m accy demo --preset gpt2-small --device cuda \
      --minutes "$(python3 -c "print($left / 60)")" --out /tmp/preset-f32 \
      && cp /tmp/preset-f32/loss.png "$OUT/preset-f32.png" 2>/dev/null
  fi
fi

{
  echo "== preset summary (bar: final held-out below 1.5 nats/byte; MFU over 989 TFLOP/s)"
  cat "$SUMMARY"
  awk '/^===== /{print}' "$LOG"
  outcome "$LOG"
} | head -45
