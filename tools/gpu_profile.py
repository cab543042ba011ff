"""Where does a GPU step's time go? For each benchmark workload at GPU scale: the whole step
(one graph launch, median of 100, CUDA events) and each action of its schedule timed alone
(`CudaFragment.profile`), the slowest first.

    PYTHONPATH=src python3 tools/gpu_profile.py [workload ...] [--top N]
"""

from __future__ import annotations

import argparse
import sys

import cupy
import numpy as np

sys.path.insert(0, ".")
from accy.backends.cuda.compile import compile_program  # noqa: E402
from accy.backends.cuda.runtime import load  # noqa: E402
from bench.workloads import WORKLOADS  # noqa: E402


def step_ms(fragment, addresses, repeats=100) -> float:
    for _ in range(10):
        fragment.run(addresses)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        fragment.run(addresses)
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def profile(name: str, top: int) -> None:
    workload = WORKLOADS[name]
    program = workload.value_and_grad("cuda")
    fragment = load(compile_program(program))
    inputs = [cupy.asarray(x) for x in workload.make_inputs("cuda")]
    outputs = [cupy.empty(t.extents, dtype=t.dtype.numpy) for t in program.output_types]
    addresses = [a.data.ptr for a in (*inputs, *outputs)]
    whole = step_ms(fragment, addresses)
    actions = fragment.profile(addresses)
    gemms = sum(t for what, t in actions if what.startswith("gemm"))
    total = sum(t for _, t in actions)
    print(
        f"\n== {name}: step {whole * 1e3:.0f} us; {len(actions)} actions alone sum to "
        f"{total * 1e3:.0f} us, GEMMs {gemms * 1e3:.0f} us"
    )
    for what, t in sorted(actions, key=lambda item: -item[1])[:top]:
        print(f"  {t * 1e3:8.1f} us  {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    for name in args.workloads:
        profile(name, args.top)


if __name__ == "__main__":
    main()
