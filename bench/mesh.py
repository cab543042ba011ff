"""Several GPUs: the bus bandwidth of a 256 MB all-reduce, and data-parallel scaling.

Run one process per GPU through accy's launcher (rank 0 prints and writes the JSON):

    python -m accy.launch --gpus 2 bench/mesh.py --json bench/results/mesh-2gpu.json
    python -m accy.launch --gpus 1 bench/mesh.py --json bench/results/mesh-1gpu.json

1. all-reduce: a `psum` program of float32[64 Mi] (256 MB) run by `NcclExecutable`, and the same
   NCCL `allReduce` called directly; bus bandwidth = size / time * 2 (n - 1) / n, the figure
   NCCL's `all_reduce_perf` reports (on one GPU there is nothing to move: skipped). Timed two
   ways: each call synchronized (median), and `repeat` calls back to back between two CUDA
   events (mean; what all_reduce_perf does), on a non-blocking stream.
2. data parallel: a GPT-2-sized MLP block trained with SGD (value_and_grad and the update in
   one program), sharded `{"batch": "data"}`, at the same batch per GPU; tokens per second of
   the whole mesh. Scaling = tokens/s on N GPUs / tokens/s on one (the two JSON files). Each of
   `--modes` runs it: "graph" (one CUDA graph per step, NCCL inside, gradients in 25 MiB
   buckets overlapping the backward pass), "graph-4mib" (4 MiB buckets), "graph-nobuckets"
   (psums on the step's stream), "segments" (the fallback: segments and NCCL calls from
   Python). `data_parallel` is the first mode's result, `data_parallel_modes` all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np

import accy
from accy import f32, spec
from accy.mesh import Mesh, shard_program
from accy.mesh.bootstrap import Environment
from accy.mesh.nccl import Distributed, NcclExecutable
from accy.mesh.segments import Segment


def timed(cupy, run, repeat: int, warmup: int = 3) -> float:
    """Median seconds of `run()` (each one synchronized)."""
    for _ in range(warmup):
        run()
    cupy.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        cupy.cuda.get_current_stream().synchronize()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def back_to_back(cupy, run, repeat: int) -> float:
    """Mean seconds of `run()` issued `repeat` times without waiting, by CUDA events."""
    stream = cupy.cuda.get_current_stream()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(repeat):
        run()
    stop.record(stream)
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / 1e3 / repeat


def all_reduce(distributed: Distributed, megabytes: int, repeat: int) -> dict:
    cupy, n = distributed.cupy, distributed.mesh.size
    elements = megabytes * 2**20 // 4
    program = accy.trace.define(
        "psum",
        [spec(f32, n=elements)],
        lambda b, a: b.emit("psum", [a[0]], {"mesh_axis": "data", "size": n}),
    )
    executable = NcclExecutable(program, distributed)
    x = cupy.ones(elements, cupy.float32)
    out = cupy.empty_like(x)
    communicator = distributed.communicators["data"]
    stream = cupy.cuda.get_current_stream()

    def raw() -> None:
        communicator.allReduce(
            x.data.ptr, out.data.ptr, elements, distributed.nccl.NCCL_FLOAT32,
            distributed.nccl.NCCL_SUM, stream.ptr,
        )  # fmt: skip

    result = {"bytes": elements * 4}
    for name, run in (("accy_psum", lambda: executable(x)), ("nccl_allreduce", raw)):
        for how, seconds in (
            ("synchronized", timed(cupy, run, repeat)),
            ("back_to_back", back_to_back(cupy, run, repeat)),
        ):
            algbw = elements * 4 / seconds / 1e9
            result[f"{name}_{how}"] = {
                "seconds": seconds,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * 2 * (n - 1) / n,
            }
    (check,) = executable(x)
    result["correct"] = bool(float(check[0]) == n and float(check[-1]) == n)
    return result


def mlp_block(b, a):
    x, w_in, w_out = a
    h = x.contract(w_in, "channel")
    h = h * (h * 1.702).logistic()  # GELU (sigmoid form)
    y = h.contract(w_out, "hidden")
    return (y * y).mean(("batch", "token", "out"))


MODES = {  # name -> NcclExecutable's (graph, bucket_bytes)
    "graph": (None, None),
    "graph-4mib": (True, 4 * 2**20),
    "graph-nobuckets": (True, 0),
    "segments": (False, None),
}


def data_parallel(
    distributed: Distributed,
    batch: int,
    tokens: int,
    repeat: int,
    precision: str,
    mode: str = "graph",
) -> dict:
    cupy, n = distributed.cupy, distributed.mesh.size
    channel, hidden = 768, 3072
    specs = [
        spec(f32, batch=batch * n, token=tokens, channel=channel),
        spec(f32, channel=channel, hidden=hidden),
        spec(f32, hidden=hidden, out=channel),
    ]
    loss = accy.trace.define("mlp_block", specs, mlp_block)
    grads = accy.gradient.value_and_grad(loss, (1, 2))

    def step(b, a):  # value_and_grad and an SGD update in one program
        value, g_in, g_out = b.call(grads, a)
        return value, a[1] - g_in * 0.01, a[2] - g_out * 0.01

    program = accy.trace.define("train_step", specs, step)
    sharded = shard_program(program, distributed.mesh, {"batch": "data"})
    graph, bucket_bytes = MODES[mode]
    executable = NcclExecutable(
        sharded, distributed, precision=precision, graph=graph, bucket_bytes=bucket_bytes
    )
    rng = np.random.default_rng(0)
    whole = [rng.standard_normal(t.extents).astype(np.float32) * 0.02 for t in specs]
    local = [cupy.asarray(a) for a in executable.local_inputs(whole)]
    state = {"params": local[1:]}

    def run() -> None:
        _, *state["params"] = executable(local[0], *state["params"])

    seconds = timed(cupy, run, repeat)
    plan = executable.plan
    return {
        "devices": n,
        "precision": precision,
        "mode": executable.mode,
        "reason": executable.reason,
        "buckets": [b.nbytes for b in plan.buckets] if plan is not None else None,
        "segments": (
            sum(isinstance(s, Segment) for s in executable.steps) if plan is None else None
        ),
        "batch_per_device": batch,
        "tokens": tokens,
        "step_seconds": seconds,
        "tokens_per_second": n * batch * tokens / seconds,
        "psums": sharded.program.count("psum"),
    }


def describe(distributed: Distributed) -> dict:
    """The GPU and library versions this rank runs on (for the log)."""
    cupy, nccl = distributed.cupy, distributed.nccl
    properties = cupy.cuda.runtime.getDeviceProperties(0)
    name = properties["name"]
    return {
        "rank": distributed.rank,
        "gpu": name.decode(errors="replace") if isinstance(name, bytes) else str(name),
        "pci_bus": properties.get("pciBusID"),
        "cupy": cupy.__version__,
        "nccl": nccl.get_version(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
    }


def section(results: dict, name: str, run, rank: int) -> None:
    """`results[name] = run()`, or the error it raised (the other sections still run)."""
    started = time.perf_counter()
    try:
        results[name] = run()
    except Exception as error:  # noqa: BLE001 - reported in the JSON, then the next section
        results[name] = {"error": f"{type(error).__name__}: {error}"}
        traceback.print_exc()
    print(f"rank {rank}: {name} took {time.perf_counter() - started:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="per GPU")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--precision", default="f32", choices=("f32", "tf32"))
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--modes", default="graph,segments", help=f"comma-separated, of {', '.join(MODES)}"
    )
    arguments = parser.parse_args()
    env = Environment.from_env()
    distributed = Distributed(Mesh(range(env.world_size), "data"), env)
    results: dict = {"devices": env.world_size, "rank": env.rank}
    section(results, "device", lambda: describe(distributed), env.rank)
    if env.world_size > 1:
        section(
            results,
            "all_reduce",
            lambda: all_reduce(distributed, arguments.megabytes, arguments.repeat),
            env.rank,
        )
    modes = arguments.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; the modes are {', '.join(MODES)}")
    every: dict = {}
    results["data_parallel_modes"] = every
    for mode in modes:
        section(
            every,
            mode,
            lambda mode=mode: data_parallel(
                distributed,
                arguments.batch,
                arguments.tokens,
                arguments.repeat,
                arguments.precision,
                mode,
            ),
            env.rank,
        )
    results["data_parallel"] = every[modes[0]]
    if env.rank == 0:
        print(json.dumps(results, indent=2))
        if arguments.json:
            with open(arguments.json, "w") as out:
                json.dump(results, out, indent=2)
    distributed.close()
    failed = [k for k, v in {**results, **every}.items() if isinstance(v, dict) and "error" in v]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
