"""PyTorch DDP on bench/gpt2.py's model, for comparison with `python -m bench.gpt2 --gpus N`.

    torchrun --standalone --nproc-per-node 2 bench/ddp_torch.py --json out.json
    torchrun --standalone --nproc-per-node 1 bench/ddp_torch.py --compile

The same GPT-2 (bench.gpt2's parameter shapes, initialisation, batch and AdamW) as an
`nn.Module` wrapped in `DistributedDataParallel` (NCCL, gradient buckets overlapped with the
backward pass), `bench.gpt2`'s batch per GPU (8 x 1024 at the cuda scale), each rank its own
rows of one batch. Precision: f32 with TF32 off (as bench.gpt2), or `--dtype bf16`: autocast to
bfloat16 with f32 master weights. `--compile` runs the module through torch.compile:
`--wrap compile-ddp` compiles the DDP module (its graph broken at the buckets, so that their
all-reduces overlap the backward pass), `--wrap ddp-compile` wraps the compiled module (one
graph; the all-reduces wait for the whole backward); `--wrap none` (one GPU) is the compiled
module without DDP, what DDP's cost is measured against. Rank 0 prints one JSON line: median step
time, tokens/s of all GPUs together and per GPU, first step time, losses.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench` from the repo root

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from bench.gpt2 import (  # noqa: E402
    BETA1,
    BETA2,
    EPS,
    LR,
    SCALES,
    WEIGHT_DECAY,
    Scale,
    batch,
    decayed,
    initial_values,
    parameter_shapes,
    torch_loss,
)


class GPT2(torch.nn.Module):
    """bench.gpt2's model (the same computation as its run_torch) over a ParameterDict."""

    def __init__(self, s: Scale):
        super().__init__()
        self.s = s
        values = initial_values(s)
        # ParameterDict keys cannot contain '.', and these never do.
        self.p = torch.nn.ParameterDict(
            {k: torch.nn.Parameter(torch.tensor(v)) for k, v in values.items()}
        )

    def forward(self, ids, targets):
        return torch_loss(self.s, self.p, ids, targets)


def print_profile(step) -> None:
    """torch.profiler over 3 steps: the device time the kernels take against the wall time
    (a step that is slower than its kernels waits on the host), and the busiest operators."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as profiler:
        start = time.perf_counter()
        for _ in range(3):
            step()
        wall = (time.perf_counter() - start) / 3 * 1e3
    averages = profiler.key_averages()
    kernels = sum(getattr(e, "self_device_time_total", 0) for e in averages) / 3 / 1e3
    print(f"profile: {wall:.1f} ms a step (profiled), kernels {kernels:.1f} ms a step")
    print(averages.table(sort_by="self_device_time_total", row_limit=12))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", default="cuda", choices=sorted(SCALES))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtype", default="f32", choices=("f32", "bf16"))
    parser.add_argument("--compile", action="store_true")
    parser.add_argument(
        "--wrap",
        default="compile-ddp",
        choices=("compile-ddp", "ddp-compile", "none"),
        help="with --compile: torch.compile(DDP(model)) (graph broken at the buckets, so "
        "all-reduces overlap the backward), DDP(torch.compile(model)) (one graph), or, on "
        "one GPU, torch.compile(model) without DDP (what DDP itself costs)",
    )
    parser.add_argument(
        "--bucket-view",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="DDP's gradient_as_bucket_view (default on)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="after timing: torch.profiler of 3 steps (rank 0)"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    s = SCALES[args.scale]
    shapes = parameter_shapes(s)
    model = GPT2(s).to(device)
    # The gradients are views of DDP's buckets (no copy into them before the all-reduce).
    options = {"device_ids": [local], "gradient_as_bucket_view": args.bucket_view}
    if args.wrap == "none":
        if world != 1:
            parser.error("--wrap none runs one process: without DDP nothing sums the gradients")
        forward = torch.compile(model) if args.compile else model
    elif args.compile and args.wrap == "ddp-compile":
        forward = DistributedDataParallel(torch.compile(model), **options)
    else:
        ddp = DistributedDataParallel(model, **options)
        forward = torch.compile(ddp) if args.compile else ddp
    named = dict(model.p.items())
    groups = [
        {"params": [v for k, v in named.items() if decayed(k, shapes[k])]},
        {"params": [v for k, v in named.items() if not decayed(k, shapes[k])], "weight_decay": 0},
    ]
    optimizer = torch.optim.AdamW(
        groups, LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=WEIGHT_DECAY, fused=True
    )
    whole_ids, whole_targets = batch(Scale(**{**s.__dict__, "batch": s.batch * world}))
    rows = slice(rank * s.batch, (rank + 1) * s.batch)
    ids = torch.tensor(whole_ids[rows], device=device, dtype=torch.long)
    targets = torch.tensor(whole_targets[rows], device=device, dtype=torch.long)

    def step() -> float:
        with torch.autocast("cuda", torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = forward(ids, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss)  # synchronizes

    torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    losses = [step()]
    first = time.perf_counter() - start
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    if args.profile and rank == 0:
        print_profile(step)
    tokens = world * s.batch * s.tokens
    result = {
        "system": ("torch" if args.wrap == "none" else "torch DDP")
        + (f" compiled ({args.wrap})" if args.compile else " eager"),
        "gpus": world,
        "dtype": args.dtype,
        "batch_per_gpu": s.batch,
        "tokens": s.tokens,
        "step_ms": median * 1e3,
        "tokens_per_s": tokens / median,
        "tokens_per_s_per_gpu": tokens / median / world,
        "first_step_s": first,
        "step_times_ms": [round(t * 1e3, 2) for t in times],
        "peak_device_bytes": torch.cuda.max_memory_allocated(device),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    }
    if rank == 0:
        print(json.dumps(result))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
