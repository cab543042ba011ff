"""`python -m bench.call_paths`: the fixed cost of one call, by each way of calling accy.

On the tiny workload's value_and_grad program (two f32[lane=4] inputs, three outputs), this
times, in one process and interleaved so that a busy machine slows each alike:

- `compile(p)(*arrays)`: the array call (fresh output arrays each call);
- `Cpu(p).launch(inputs, outputs)`: the fragment API's raw-buffer call
  (`accy.compat.execute`), on arrays;
- the same on bytes and memoryviews (the raw-buffer layout checked once, then only addresses);
- `compile(p).run_buffers(inputs, outputs)`: the same raw-buffer call on the executable.

It prints the median microseconds per call of `--rounds` rounds of `--calls` calls each.
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from collections.abc import Callable

import numpy as np

import accy
import accy.compat
from bench.workloads import WORKLOADS


def call_paths(device: str = "cpu") -> dict[str, Callable[[], object]]:
    """The calls to time, by name, on the tiny workload's inputs."""
    workload = WORKLOADS["tiny"]
    program = workload.value_and_grad("cpu")
    inputs = workload.make_inputs("cpu")
    outputs = [np.zeros(t.extents, t.dtype.numpy) for t in program.output_types]
    compiled = accy.compile(program, device=device)
    launcher = accy.compat.execute.Cpu(program)
    raw_inputs = [inputs[0].tobytes(), *(memoryview(i.tobytes()) for i in inputs[1:])]
    raw_outputs = [memoryview(bytearray(o.nbytes)) for o in outputs]
    return {
        "compile(p)(*arrays)": lambda: compiled(*inputs),
        "Cpu(p).launch(buffers)": lambda: launcher.launch(inputs, outputs),
        "Cpu(p).launch(bytes, memoryviews)": lambda: launcher.launch(raw_inputs, raw_outputs),
        "compile(p).run_buffers": lambda: compiled.run_buffers(inputs, outputs),
    }


def measure(paths: dict[str, Callable[[], object]], calls: int, rounds: int) -> dict[str, float]:
    """Median microseconds per call of each path."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, call in paths.items():
            samples[name].append(timeit.timeit(call, number=calls) / calls * 1e6)
    return {name: statistics.median(times) for name, times in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.call_paths", description=__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=31, help="rounds (the median is shown)")
    arguments = parser.parse_args(argv)
    results = measure(call_paths(), arguments.calls, arguments.rounds)
    width = max(map(len, results))
    for name, microseconds in results.items():
        print(f"{name:<{width}}  {microseconds:8.2f} µs per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
