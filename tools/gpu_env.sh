# Sourced first by the one-call GPU scripts (tools/gpu_*.sh): $OUT made, the wheels in .whl
# installed into /tmp/site, the paths and accy's cache set, the card's state printed.
T0=$SECONDS
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export ACCY_CACHE_DIR="${ACCY_CACHE_DIR:-/tmp/accy-cache}"
# Bytecode written first, as an installed package has it: a fresh copy of the tree would charge
# Python's compiling of accy's modules to the first step of every process that imports them.
python3 -m compileall -q -j 0 src bench tools > /dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader
