"""Host time of one call of a sharded GPT-2 training step around its executable, no GPU needed:
`accy.shard` of bench.gpt2's step (12 layers at the check scale's width: GPT-2 small's 448
arguments), called as on a GPU process (`_call_local`) with the executable replaced by one that
returns at once. What is left is what Python does per step: flattening and checking the
arguments, cutting blocks, wrapping the results.

    PYTHONPATH=src:. python3 tools/shard_overhead.py
"""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np

sys.path.insert(0, ".")
from accy.mesh import Mesh, shard  # noqa: E402
from bench import gpt2  # noqa: E402


class _Rank0:
    rank = 0


def main(calls: int = 20) -> None:
    s = dataclasses.replace(gpt2.SCALES["check"], layers=12)
    args = gpt2.accy_inputs(s, "cpu")
    step = shard(gpt2.accy_step(s, "cpu").fn, Mesh(range(2), "data"), {"batch": "data"})
    entry, leaves = step._entry(args, {})
    outputs = [np.zeros(1)] * len(entry.local_output_types)
    step.distributed, entry.executable, entry.captured = _Rank0(), lambda *a: outputs, []
    for _ in range(3):
        step._call_local(*step._entry(args, {}))
    rounds = []  # the fastest of several rounds: this machine's other work only adds time
    for _ in range(40):
        start = time.perf_counter()
        for _ in range(calls):
            step._call_local(*step._entry(args, {}))
        rounds.append((time.perf_counter() - start) / calls * 1e3)
    print(
        f"{len(leaves)} arguments: {min(rounds):.2f} ms of host time a call around the executable"
    )


if __name__ == "__main__":
    main()
