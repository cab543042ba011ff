"""Where does a GPU step's time go? For each benchmark workload at GPU scale: the whole step
(one graph launch, median of 100, CUDA events), the same through `accy.compile` as the
benchmark calls it (wall clock), and each action of its schedule timed alone
(`CudaFragment.profile`), the slowest first.

    PYTHONPATH=src python3 tools/gpu_profile.py [workload ...] [--top N]
"""

from __future__ import annotations

import argparse
import sys
import time

import cupy
import numpy as np

sys.path.insert(0, ".")
import accy  # noqa: E402
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


def call_us(call, inputs, repeats=200) -> tuple[float, float]:
    """(whole synchronized call, its host part before the sync) through `accy.compile`, in us:
    what the benchmark's step time is made of."""
    for _ in range(20):
        call(*inputs)
    cupy.cuda.Device().synchronize()
    wholes, hosts = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        call(*inputs)
        issued = time.perf_counter()
        cupy.cuda.Device().synchronize()
        done = time.perf_counter()
        wholes.append(done - start)
        hosts.append(issued - start)
    return float(np.median(wholes)) * 1e6, float(np.median(hosts)) * 1e6


def profile(name: str, top: int) -> None:
    workload = WORKLOADS[name]
    program = workload.value_and_grad("cuda")
    fragment = load(compile_program(program))
    inputs = [cupy.asarray(x) for x in workload.make_inputs("cuda")]
    outputs = [cupy.empty(t.extents, dtype=t.dtype.numpy) for t in program.output_types]
    addresses = [a.data.ptr for a in (*inputs, *outputs)]
    whole = step_ms(fragment, addresses)
    synchronized, host = call_us(accy.compile(program, device="cuda"), inputs)
    actions = fragment.profile(addresses)
    gemms = sum(t for what, t in actions if what.startswith("gemm"))
    total = sum(t for _, t in actions)
    print(
        f"\n== {name}: step {whole * 1e3:.0f} us; {len(actions)} actions alone sum to "
        f"{total * 1e3:.0f} us, GEMMs {gemms * 1e3:.0f} us; through accy.compile "
        f"{synchronized:.0f} us synchronized, of which {host:.0f} us on the host before the sync"
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
