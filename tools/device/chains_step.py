"""On the GPU: the GPT-2 bf16 training step (fused attention) as one graph, in ms, compiled
with reduction chains, with chains but no loop after their last reduction
(CHAIN_TRAILING_LOOPS = False), and without chains (CHAIN_WINDOW = 0), alternating twice.
The program is traced from `accy.demo.gpt2.training_step` without running it. Run from the
repo root: python3 tools/device/chains_step.py"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, ".")
sys.path.insert(0, "tools")

from gpt2_profile import random_buffers, whole_step_ms  # noqa: E402

from accy.backends.base import CACHE, backend_for, compile_artifact  # noqa: E402
from accy.backends.cuda.runtime import load  # noqa: E402
from accy.frontend.tracing import flatten  # noqa: E402
from accy.lower import grouping  # noqa: E402
from bench.gpt2 import SCALES, accy_inputs, accy_step  # noqa: E402


def step_program(dtype: str = "bf16"):
    scale = SCALES["cuda"]
    step = accy_step(scale, "cuda", dtype, True)
    leaves, treedef = flatten((accy_inputs(scale, "cuda", dtype=dtype), {}))
    return step._build((), leaves, treedef).program


def fragment(program, **patches):
    """The step compiled with `grouping`'s constants patched, in a fresh cache folder."""
    saved = {name: getattr(grouping, name) for name in patches}
    for name, value in patches.items():
        setattr(grouping, name, value)
    CACHE.clear()
    os.environ["ACCY_CACHE_DIR"] = tempfile.mkdtemp(prefix="chains-step-")
    try:
        start = time.perf_counter()
        loaded = load(compile_artifact(backend_for("cuda"), program, None))
        print(f"compiled {patches or 'as is'} in {time.perf_counter() - start:.1f} s")
        return loaded
    finally:
        for name, value in saved.items():
            setattr(grouping, name, value)


program = step_program()
buffers = random_buffers(program)
addresses = [b.data.ptr for b in buffers]
variants = {
    "chained": fragment(program),
    "chained, no trailing loops": fragment(program, CHAIN_TRAILING_LOOPS=False),
    "apart": fragment(program, CHAIN_WINDOW=0),
}
times: dict[str, list[float]] = {name: [] for name in variants}
for _ in range(2):
    for name, loaded in variants.items():
        times[name].append(whole_step_ms(loaded, addresses))
for name, values in times.items():
    print(f"GPT-2 bf16 step {name}: " + ", ".join(f"{ms:.3f}" for ms in values) + " ms")
