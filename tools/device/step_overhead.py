"""Where the GPT-2 bf16 step's wall time goes beyond its graph: the step as bench.gpt2 times it
(call + wait for the loss), its fragment's graph alone (batched order, and the serial plan
order that a donated pair in `Schedule.hazards` forces), whether the step's calls take the
serial order, and a cProfile of the calls' host time.

    PYTHONPATH=src:. python3 tools/device/step_overhead.py
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import cupy
import numpy as np

sys.path.insert(0, ".")
from bench.gpt2 import SCALES, accy_inputs, accy_step  # noqa: E402


def graph_ms(fragment, addresses, serial: bool, repeats: int = 20) -> float:
    """The fragment's graph in one order, replayed `repeats` times."""
    slot = fragment._slots[0]
    fragment.run(addresses)  # captures the batched graph where needed
    stream = cupy.cuda.get_current_stream()
    cupy.cuda.Device().synchronize()
    if serial not in slot.graphs:
        slot.graphs[serial] = fragment._capture(cupy, slot, serial)
    graph = slot.graphs[serial]
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(repeats):
        cupy.cuda.runtime.graphLaunch(graph.graphExec, stream.ptr)
    stop.record(stream)
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / repeats


def main() -> None:
    scale = SCALES["cuda"]
    step = accy_step(scale, "cuda", "bf16", True)
    params, state, ids, targets = accy_inputs(scale, "cuda", dtype="bf16")
    for _ in range(3):
        loss, params, state = step(params, state, ids, targets)
    cupy.cuda.Device().synchronize()
    (staged,) = step._staged.values()
    (entry,) = staged.cache.values()
    (executable,) = entry.compiled.values()
    fragment = getattr(executable, "executable", executable).fragment
    seen = []
    run = fragment.run

    def spying(addresses, stream=None):
        entered = time.perf_counter()
        seen.append(fragment._aliased_hazard(addresses))
        addresses_seen[:] = list(addresses)
        result = run(addresses, stream)
        moments.append((entered, time.perf_counter()))
        return result

    addresses_seen: list[int] = []
    moments: list[tuple[float, float]] = []
    fragment.run = spying
    times, before, inside, after = [], [], [], []
    for _ in range(10):
        t0 = time.perf_counter()
        loss, params, state = step(params, state, ids, targets)
        returned = time.perf_counter()
        float(np.asarray(loss.array.get()))
        times.append(time.perf_counter() - t0)
        entered, left = moments[-1]
        before.append(entered - t0)
        inside.append(left - entered)
        after.append(returned - left)
    print(f"step as bench.gpt2 times it: median {1e3 * np.median(times):.2f} ms")
    print(
        f"host, ms: call to fragment.run {1e3 * np.median(before):.3f}, inside run (the "
        f"launch) {1e3 * np.median(inside):.3f}, run to the call's return "
        f"{1e3 * np.median(after):.3f}"
    )
    print(f"calls taking the serial order: {sum(seen)} of {len(seen)}")
    schedule = fragment.compiled.schedule
    print(
        f"actions: batched {len(schedule.actions)}, serial "
        f"{len(schedule.serial or [])}; hazard pairs {len(schedule.hazards)}"
    )
    fragment.run = run
    for serial in (False, True):
        print(f"graph alone, serial={serial}: {graph_ms(fragment, addresses_seen, serial):.3f} ms")
    t0 = time.perf_counter()
    for _ in range(10):
        loss, params, state = step(params, state, ids, targets)
    host = (time.perf_counter() - t0) / 10
    cupy.cuda.Device().synchronize()
    print(f"host time per call, not waiting: {1e3 * host:.2f} ms")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(10):
        loss, params, state = step(params, state, ids, targets)
        cupy.cuda.Device().synchronize()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
