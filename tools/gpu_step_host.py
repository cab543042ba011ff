"""How much of a training step's wall time is the host's? The jitted, donating step of
`bench.gpt2` (or `--workload llama1b`) called as the bench calls it: per step, the host part
(from the call until it returns, the graph issued), the whole step (until the loss is on the
host), and the GPU's part between CUDA events on the null stream; then where the host part
goes (cProfile over `--profile` steps, the functions by own time).

    PYTHONPATH=src:. python3 tools/gpu_step_host.py [--workload llama1b] [--scale cuda-b64]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time

import cupy
import numpy as np

sys.path.insert(0, ".")
import accy  # noqa: E402


def gpt2_step(scale: str):
    """`step() -> loss array`: bench.gpt2's bf16 step at `scale`, in place."""
    from bench import gpt2

    s = gpt2.SCALES[scale]
    params, state, ids, targets = gpt2.accy_inputs(s, "cuda", dtype="bf16")
    train = gpt2.accy_step(s, "cuda", "bf16", fused=True)
    held = [params, state]

    def step():
        loss, held[0], held[1] = train(held[0], held[1], ids, targets)
        return loss

    return step


def llama1b_step(scale: str):
    """`step() -> loss array`: bench.llama1b's bf16 step at `scale`, in place."""
    from bench import llama1b

    s = llama1b.SCALES[scale]
    train, model, state = llama1b.accy_step(s, "cuda", "bf16")
    ids, targets = (accy.named(a, ("batch", "token"), device="cuda") for a in llama1b.batch(s))
    held = [model, state]

    def step():
        loss, held[0], held[1] = train(held[0], held[1], ids, targets)
        return loss

    return step


def measure(step, steps: int) -> dict[str, float]:
    """Medians in ms over `steps` of: the host part, the whole step, the GPU's part."""
    hosts, wholes, gpus = [], [], []
    for _ in range(steps):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        t0 = time.perf_counter()
        start.record()
        loss = step()
        issued = time.perf_counter()
        stop.record()
        float(np.asarray(loss.array.get()))
        done = time.perf_counter()
        hosts.append(issued - t0)
        wholes.append(done - t0)
        gpus.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return {k: statistics.median(v) * 1e3 for k, v in
            (("host", hosts), ("whole", wholes), ("gpu", gpus))}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gpt2", choices=("gpt2", "llama1b"))
    parser.add_argument("--scale", default="cuda")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--profile", type=int, default=5, help="steps under cProfile")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    step = (gpt2_step if args.workload == "gpt2" else llama1b_step)(args.scale)
    for _ in range(3):
        float(np.asarray(step().array.get()))
    times = measure(step, args.steps)
    parts = ", ".join(f"{k} {v:.2f} ms" for k, v in times.items())
    print(f"{args.workload} {args.scale}: {parts}")
    if not args.profile:
        return
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.profile):
        float(np.asarray(step().array.get()))
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
    print(text.getvalue())


if __name__ == "__main__":
    main()
