"""What the data-parallel GPT-2 step costs over the plain one on the same GPU, split into GPU
time and host time. Run in each process of `python -m accy.launch --gpus N` (N = 1 on a
one-GPU machine: NCCL with one rank, its steps in the graph as on several):

    python -m accy.launch --gpus 1 tools/gpt2_dp_profile.py --out DIR

Prints, for the bf16 step with fused attention at bench.gpt2's GPU scale (8 x 1024 a GPU):
the whole step's graph alone (GPU time, back to back) for the plain program and for the
sharded one with and without gradient buckets; the wall time of a step called as a training
loop calls it (host + GPU, the loss read every step) through `accy.jit` and `accy.shard`; and
each action of the plain and the unbucketed sharded schedule timed alone (totals per category),
written to DIR/plain and DIR/sharded (actions.tsv, and the kernels' CUDA C).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import cupy

sys.path.insert(0, ".")
from accy.backends.base import backend_for, compile_artifact  # noqa: E402
from accy.backends.cuda.runtime import load  # noqa: E402
from accy.mesh import Mesh, shard, shard_program  # noqa: E402
from accy.mesh.bootstrap import Environment  # noqa: E402
from accy.mesh.nccl import Distributed, NcclExecutable  # noqa: E402
from bench.gpt2 import SCALES, accy_inputs, accy_step  # noqa: E402
from tools.gpt2_profile import (  # noqa: E402
    category,
    dump,
    random_buffers,
    traced_program,
    whole_step_ms,
)

DTYPE = "bf16"
DP = {"batch": "data"}


def per_category(actions) -> str:
    totals: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for what, ms in actions:
        kind = category(what)
        if kind == "kernel":
            kind = what.split(": ", 1)[-1].split(" (")[0]  # loop, group, reduce, chain, ...
        totals[kind][0] += ms
        totals[kind][1] += 1
    rows = sorted(totals.items(), key=lambda item: -item[1][0])
    return ", ".join(f"{k} {ms:.2f} ms/{n}" for k, (ms, n) in rows)


def loop_wall_ms(step, args, steps: int = 20) -> str:
    """Median wall time of a step whose loss is read every step (as bench.gpt2 does), and of
    its host part (until the call returns, the graph launched)."""
    loss, params, state = step(*args)
    float(cupy.asnumpy(loss.array))
    times, host = [], []
    for _ in range(steps):
        start = time.perf_counter()
        loss, params, state = step(params, state, *args[2:])
        host.append(time.perf_counter() - start)
        float(cupy.asnumpy(loss.array))
        times.append(time.perf_counter() - start)
    wall, launch = statistics.median(times) * 1e3, statistics.median(host) * 1e3
    return f"{wall:.3f} ms (the call returns after {launch:.3f} ms)"


def host_profile(step, args, steps: int = 20, top: int = 14) -> str:
    """cProfile of a training loop's calls of `step` (host time only): the functions that
    take the most time of their own."""
    import cProfile
    import io
    import pstats

    loss, params, state = step(*args)
    profiler = cProfile.Profile()
    for _ in range(steps):
        profiler.enable()
        loss, params, state = step(params, state, *args[2:])
        profiler.disable()
        float(cupy.asnumpy(loss.array))
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def launch_ms(fragment, addresses, repeats: int = 20) -> float:
    """Host milliseconds of `fragment.run` (the pointer table and the graph launch), each run
    waited for before the next."""
    stream = cupy.cuda.get_current_stream()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fragment.run(addresses, stream)
        times.append(time.perf_counter() - start)
        stream.synchronize()
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/dp-profile")
    parser.add_argument("--no-actions", action="store_true", help="skip timing each action")
    args = parser.parse_args()
    env = Environment.from_env()
    distributed = Distributed(Mesh(range(env.world_size), "data"), env)
    report = print if env.rank == 0 else (lambda *a, **k: None)
    s = SCALES["cuda"]

    program = traced_program(DTYPE, True, s)
    plain = load(compile_artifact(backend_for("cuda"), program, None))
    addresses = [b.data.ptr for b in random_buffers(program, s.vocab)]
    report(f"plain step, the graph alone: {whole_step_ms(plain, addresses):.3f} ms")
    report(f"plain step, fragment.run's host time: {launch_ms(plain, addresses):.3f} ms")
    # The whole batch is every GPU's batch together, so that each holds the plain step's.
    whole = dataclasses.replace(s, batch=s.batch * env.world_size)
    sharded = shard_program(traced_program(DTYPE, True, whole), distributed.mesh, DP)
    sharded_buffers = random_buffers(sharded.program, s.vocab)
    sharded_addresses = [b.data.ptr for b in sharded_buffers]
    unbucketed = None
    for bucket_bytes in (None, 0):
        executable = NcclExecutable(sharded, distributed, bucket_bytes=bucket_bytes)
        ms = whole_step_ms(executable.fragment, sharded_addresses)
        buckets = len(executable.plan.buckets)
        report(f"sharded step ({buckets} buckets), the graph alone: {ms:.3f} ms")
        launch = launch_ms(executable.fragment, sharded_addresses)
        report(f"sharded step ({buckets} buckets), fragment.run's host time: {launch:.3f} ms")
        if bucket_bytes == 0:
            unbucketed = executable

    jitted = accy_step(s, "cuda", DTYPE, True)
    plain_args = accy_inputs(s, "cuda", dtype=DTYPE)
    report(f"plain step, a training loop's wall time: {loop_wall_ms(jitted, plain_args)}")
    report(host_profile(jitted, accy_inputs(s, "cuda", dtype=DTYPE)))
    params, state, ids, targets = accy_inputs(whole, "cuda", dtype=DTYPE)
    step = shard(
        jitted.fn, distributed.mesh, DP,
        device="cuda", distributed=distributed, donate_argnums=(0, 1),
    )  # fmt: skip
    wall = loop_wall_ms(step, (params, state, ids, targets))
    report(f"sharded step, a training loop's wall time: {wall}")
    params, state, ids, targets = accy_inputs(whole, "cuda", dtype=DTYPE)
    report(host_profile(step, (params, state, ids, targets)))
    if args.no_actions:
        distributed.close()
        return

    out = Path(args.out)
    for name, fragment, where in (
        ("plain", plain, addresses),
        ("sharded", unbucketed.fragment, sharded_addresses),
    ):
        actions = fragment.profile(where, repeats=10)
        total = sum(ms for _, ms in actions)
        report(f"{name}: {len(actions)} actions alone {total:.2f} ms: {per_category(actions)}")
        if env.rank == 0:
            dump(str(out / name), fragment, actions)
    distributed.close()


if __name__ == "__main__":
    main()
