"""`python -m bench`: the command line."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from bench.report import print_tables, problems, write_json
from bench.runner import WORKER_TIMEOUT_S, Options, WorkloadRun
from bench.systems import SYSTEMS
from bench.workloads import DTYPES, SCALES, WORKLOADS, supporting

RESULTS = Path(__file__).resolve().parent / "results"
TRAINING = ("cnn", "char-gpt")
REAL_SCALE = ("gpt2", "llama1b", *TRAINING)
"""Workloads with a runner of their own (WORKLOADS.md, "Real-scale workloads": `bench.gpt2`,
`bench.llama1b`; the training steps of `bench.training`), run only when named in
`--workloads`."""
BUSY_LOAD = 0.5  # a 1-minute load average above this means other work shares the cores
BUDGET_S = 1.0
QUICK_BUDGET_S = 0.2


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="accy, JAX and PyTorch side by side on the workloads of WORKLOADS.md.",
    )
    parser.add_argument(
        "--workloads",
        default=None,
        help="comma-separated (default: all seven; with --dtype bf16, mlp, attention, block, "
        "conv); gpt2 (GPT-2 small's training step, `bench.gpt2`), llama1b (a 1B Llama's, "
        "`bench.llama1b`) and cnn, char-gpt (small "
        "models' training steps, `bench.training`) run when named",
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--dtype",
        default=None,
        choices=DTYPES,
        help="precision of inputs and losses (default f32; gpt2 on cuda: bf16 at 8 and 64 x 1024)",
    )
    parser.add_argument(
        "--scale", default=None, choices=SCALES, help="sizes (default: the device's)"
    )
    parser.add_argument(
        "--worker-timeout",
        type=float,
        default=WORKER_TIMEOUT_S,
        help=f"seconds one worker process may take (default {WORKER_TIMEOUT_S})",
    )
    parser.add_argument("--repeat", type=int, default=None, help="timed steps (default: adaptive)")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="default bench/results/<device>.json (<device>-bf16.json in bf16)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="short time budget; no memory, no warm first call"
    )
    return parser.parse_args(argv)


def split_names(text: str, known: Sequence[str], what: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"unknown {what} {', '.join(unknown)}; known: {', '.join(known)}")
    return names


def chosen_workloads(text: str | None, dtype: str) -> list[str]:
    """The workloads of `--workloads` (default: every one that runs in `dtype`); one that has
    no `dtype` version is an error naming those that do."""
    if text is None:
        return supporting(dtype)
    names = split_names(text, [*WORKLOADS, *REAL_SCALE], "workload")
    refused = [name for name in names if name in WORKLOADS and dtype not in WORKLOADS[name].dtypes]
    if refused:
        raise SystemExit(
            f"--dtype {dtype}: {', '.join(refused)} {'has' if len(refused) == 1 else 'have'} "
            f"no {dtype} version; the {dtype} workloads are {', '.join(supporting(dtype))}"
        )
    return names


def default_json(device: str, dtype: str, scale: str | None) -> Path:
    """bench/results/<device>[-<dtype>][-<scale>].json (f32 at the device's scale: <device>)."""
    parts = [device] + ([dtype] if dtype != "f32" else [])
    parts += [scale] if scale not in (None, device) else []
    return RESULTS / f"{'-'.join(parts)}.json"


def warn_if_busy() -> float:
    """The 1-minute load average; warns when other processes are using the cores."""
    load = os.getloadavg()[0]
    if load > BUSY_LOAD:
        print(
            f"warning: load average {load:.2f} before the run: other processes are using the "
            "cores, timings will be slower and noisier than on a quiet machine"
        )
    return load


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen workloads, print the tables, write the JSON.

    Returns 1 when a workload's systems disagree or a system failed, else 0. The JSON is
    written after each workload, so a run stopped part way keeps what it measured.
    """
    args = parse_args(argv)
    gpt2_dtypes = gpt2_precisions(args)
    llama_dtype = args.dtype or "bf16"  # mixed precision, as such a model is trained
    training_dtype = args.dtype  # None: each precision a training workload has
    args.dtype = args.dtype or "f32"
    workloads = chosen_workloads(args.workloads, args.dtype)
    systems = split_names(args.systems, SYSTEMS, "system")
    if args.worker_timeout <= 0:
        raise SystemExit(f"--worker-timeout must be positive seconds, got {args.worker_timeout}")
    options = Options(
        device=args.device,
        seed=args.seed,
        budget_s=QUICK_BUDGET_S if args.quick else BUDGET_S,
        repeat=args.repeat,
        quick=args.quick,
        dtype=args.dtype,
        scale=args.scale,
        worker_timeout_s=args.worker_timeout,
    )
    code = 0
    training = [name for name in workloads if name in TRAINING]
    if training:
        workloads = [name for name in workloads if name not in TRAINING]
        code |= run_training(
            argparse.Namespace(**{**vars(args), "dtype": training_dtype}), training
        )
        if not workloads:
            return code
    runs = gpt2_runs(args, gpt2_dtypes) if "gpt2" in workloads else []
    others = [name for name in workloads if name not in ("gpt2", "llama1b")]
    alone = len(runs) + ("llama1b" in workloads) + bool(others) == 1  # the command's one report
    for dtype, scale in runs:
        run = argparse.Namespace(**{**vars(args), "dtype": dtype, "scale": scale})
        code |= run_gpt2(run, alone)
    if "llama1b" in workloads:
        code |= run_llama1b(args, llama_dtype, alone)
    workloads = others
    if not workloads:
        return code
    path = args.json or default_json(args.device, args.dtype, args.scale)
    load_before = warn_if_busy()
    results = []
    for name in workloads:
        print(f"{name} ...", flush=True)
        results.append(WorkloadRun(WORKLOADS[name], systems, options).run())
        write_json(path, results, options, load_average=(load_before, os.getloadavg()[0]))
    print_tables(results, options)
    print(f"results written to {path}")
    return 1 if problems(results) or code else 0


def gpt2_precisions(args: argparse.Namespace) -> list[str]:
    """The precisions gpt2 runs in: `--dtype`'s, else bf16 on CUDA (mixed precision, as GPT-2
    is trained on GPUs), f32 on the CPU."""
    if args.dtype:
        return [args.dtype]
    return ["bf16"] if args.device == "cuda" else ["f32"]


def gpt2_runs(args: argparse.Namespace, dtypes: list[str]) -> list[tuple[str, str | None]]:
    """(dtype, scale) of each gpt2 run: `--scale`'s, else on CUDA in bf16 both batch sizes of
    GPT-2 small (8 and 64 sequences of 1024 tokens: `bench.gpt2.SCALES` "cuda", "cuda-b64").

    >>> gpt2_runs(argparse.Namespace(device="cuda", scale=None), ["bf16"])
    [('bf16', None), ('bf16', 'cuda-b64')]
    """
    if args.scale or args.device != "cuda":
        return [(dtype, args.scale) for dtype in dtypes]
    return [(d, s) for d in dtypes for s in ([None, "cuda-b64"] if d == "bf16" else [None])]


def report_path(args: argparse.Namespace, name: str, alone: bool) -> Path:
    """Where a gpt2 or llama1b run writes its report `name` (its default file's name):
    `--json` when it is the command's only report (`alone`); among several, beside `--json`'s
    file with its stem in front (one command's reports stay together); without `--json`, in
    bench/results.

    >>> ns = argparse.Namespace
    >>> str(report_path(ns(json="out/run.json"), "gpt2-cuda-bf16.json", False))
    'out/run-gpt2-cuda-bf16.json'
    >>> str(report_path(ns(json="out/run.json"), "gpt2-cuda-bf16.json", True))
    'out/run.json'
    """
    if not args.json:
        return RESULTS / name
    given = Path(args.json)
    return given if alone else given.with_name(f"{given.stem}-{name}")


def run_gpt2(args: argparse.Namespace, alone: bool) -> int:
    """`bench.gpt2` with this command's device, dtype, systems and scale; its JSON goes where
    `report_path` says, named gpt2-<device>[-bf16][-<scale>].json."""
    from bench import gpt2

    large = args.scale == "cuda-b64"  # the device's model at 64 x 1024: -b64 after the dtype
    name = default_json(args.device, args.dtype, None if large else args.scale).stem
    name += "-b64" if large else ""
    path = report_path(args, f"gpt2-{name}.json", alone)
    argv = ["--device", args.device, "--dtype", args.dtype, "--systems", args.systems]
    argv += ["--scale", args.scale] if args.scale else []
    return gpt2.main([*argv, "--json", str(path)])


def run_llama1b(args: argparse.Namespace, dtype: str, alone: bool) -> int:
    """`bench.llama1b` with this command's device, systems and scale, in `dtype`; its JSON
    goes where `report_path` says, named llama1b-<device>-<dtype>[-<scale>].json."""
    from bench import llama1b

    scale = [args.scale] if args.scale not in (None, args.device) else []
    name = "-".join([args.device, dtype, *scale])
    path = report_path(args, f"llama1b-{name}.json", alone)
    argv = ["--device", args.device, "--dtype", dtype, "--systems", args.systems]
    argv += ["--scale", args.scale] if args.scale else []
    return llama1b.main([*argv, "--json", str(path)])


def run_training(args: argparse.Namespace, names: list[str]) -> int:
    """`bench.training` on `names` with this command's systems (torch: eager and compiled),
    `--dtype` (default: each precision a workload has) and scale; JSON to its default files."""
    from bench import training

    if args.device != "cpu":
        raise SystemExit(f"{', '.join(names)}: CPU workloads; --device {args.device} is not one")
    chosen = split_names(args.systems, SYSTEMS, "system")
    systems = [t for s in chosen for t in (["torch", "torch-compile"] if s == "torch" else [s])]
    argv = ["--workloads", ",".join(names), "--systems", ",".join(systems)]
    argv += ["--dtype", args.dtype] if args.dtype else []
    if args.scale == "cuda":
        raise SystemExit(f"{', '.join(names)}: CPU workloads; they have no --scale cuda")
    argv += ["--scale", args.scale] if args.scale else []
    argv += ["--budget", str(QUICK_BUDGET_S)] if args.quick else []
    return training.main(argv)
