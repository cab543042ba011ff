"""`python -m bench.training`: whole training steps of small models on the CPU, accy side by
side with JAX (`jax.jit`, optax), PyTorch eager and PyTorch `torch.compile`, each in a fresh
process, values checked against JAX.

Workloads (each a full step: loss, gradients, AdamW, parameters and state updated in place):
- `cnn` (`bench.cnn`): two 3x3 convolutions each with a 2x2 max pool, dropout, two dense
  layers, on 8x8 digit images, batch 128; f32.
- `char-gpt` (the model of `bench.gpt2` at `gpt2.CHAR_SCALES`): a byte vocabulary (256), 2
  pre-LayerNorm blocks of width 64, 4 heads, context 32, batch 16; f32, and bf16 mixed
  precision (f32 master weights, bf16 compute: `bench.gpt2`'s `--dtype bf16`).

    python -m bench.training                          # both workloads, f32 and bf16
    python -m bench.training --workloads cnn --systems accy,jax
    python -m bench.training --scale check --budget 0.1   # tiny sizes, a smoke run
    python -m bench --workloads cnn,char-gpt          # the same, from the main command

Per system and precision it reports the first call (from nothing traced or compiled to the
first step's loss; accy with an empty disk cache), the step time (the median of three rounds
of `bench.measure.time_steps` in the one process, each round a median of many steps), GFLOP/s
(the workload's FLOP count over the step) and that as a fraction of this machine's measured
peak (a 1024x1024 float32 GEMM through NumPy's BLAS, best of 30, measured once per run), and
the step and first call over JAX's.

The check: every system's losses of its first three steps (the same data each step) against
JAX's, normwise within `bench.compare.tolerance` of the precision; in f32 also the loss
decrements (loss_k - loss_0), whose scale is that of the updates, so that the gradients and
the AdamW step are checked, not only the forward pass. A mismatch or a failed system makes the
command exit with 1. The JSON goes to bench/results/<workload>-cpu-<cores>core-<dtype>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import cnn, gpt2
from bench.compare import normwise_error, tolerance
from bench.measure import run_captured, time_steps
from bench.report import machine

RESULTS = Path(__file__).resolve().parent / "results"
SYSTEMS = ("accy", "jax", "torch", "torch-compile")
MODULES = {"accy": "accy", "jax": "jax", "torch": "torch", "torch-compile": "torch"}
CHECK_STEPS = 3  # losses compared between systems: the first step's and two after updates
ROUNDS = 3  # timing rounds in one process; the step is their median
BUDGET_S = 1.0  # seconds of timed steps per round
WORKER_TIMEOUT_S = 600.0
Step = Callable[[], float]


@dataclass(frozen=True)
class TrainingWorkload:
    """A training workload: its precisions, its sizes by scale ("cpu", "check"), its FLOPs per
    step at a size, and `step(system, size, dtype)`, which builds one system's step."""

    name: str
    dtypes: tuple[str, ...]
    sizes: Mapping[str, Any]
    flops: Callable[[Any], float]
    flops_formula: str
    step: Callable[[str, Any, str], Step]


def _cnn_step(system: str, size: cnn.Scale, dtype: str) -> Step:
    if system.startswith("torch"):
        return cnn.torch_step(size, dtype, compiled=system == "torch-compile")
    return cnn.BUILDERS[system](size, dtype)


def _char_gpt_step(system: str, size: gpt2.Scale, dtype: str) -> Step:
    if system == "accy":
        return gpt2.accy_stepper(size, "cpu", dtype, fused=True)
    if system == "jax":
        return gpt2.jax_step(size, "cpu", dtype)
    return gpt2.torch_step(size, "cpu", dtype, compiled=system == "torch-compile")


WORKLOADS = {
    "cnn": TrainingWorkload(
        "cnn",
        ("f32",),
        cnn.SCALES,
        cnn.flops,
        "2*batch*(2*conv1 + 3*conv2 + 3*dense) multiply-adds (bench/cnn.py)",
        _cnn_step,
    ),
    "char-gpt": TrainingWorkload(
        "char-gpt",
        ("f32", "bf16"),
        gpt2.CHAR_SCALES,
        lambda size: float(gpt2.model_flops(size)),
        "6*N*B*T + 12*L*B*T^2*d (N without position embeddings)",
        _char_gpt_step,
    ),
}


# -- the worker (one system, one workload, one precision, in a fresh process) -------------------


def worker(workload: str, system: str, scale: str, dtype: str, budget_s: float) -> dict:
    """Build the step, time its first call, run the checked steps, then ROUNDS timing rounds."""
    w = WORKLOADS[workload]
    step = w.step(system, w.sizes[scale], dtype)
    start = time.perf_counter()
    losses = [step()]
    first = time.perf_counter() - start
    losses += [step() for _ in range(CHECK_STEPS - 1)]
    rounds = [asdict(time_steps(step, budget_s)) for _ in range(ROUNDS)]
    return {"first_call_s": first, "losses": losses, "rounds": rounds}


def spawn(workload: str, system: str, args: argparse.Namespace) -> dict:
    """One worker process (accy with an empty disk cache); its result, or {"error": ...}."""
    with tempfile.TemporaryDirectory(prefix="accy-training-cache-") as cache:
        env = dict(os.environ, ACCY_CACHE_DIR=cache)
        if system == "accy":
            from bench.machine_cache import seed

            seed(Path(cache))  # empty but for per-machine libraries
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "bench.training", "--worker", system]
        command += ["--workloads", workload, "--scale", args.scale, "--dtype", args.dtype]
        command += ["--budget", str(args.budget)]
        done = run_captured(command, args.timeout, env)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"error": (lines or ["failed"])[-1], "tail": "\n".join(lines[-12:])}
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the harness ---------------------------------------------------------------------------------


def measure_peak_gflops(n: int = 1024, repeats: int = 30) -> float:
    """This machine's float32 GEMM rate through NumPy's BLAS (best of `repeats` n x n x n
    products, each a few milliseconds, so that the best falls in a quiet moment of a busy
    machine), GFLOP/s: the peak the workloads' rates are compared with.

    >>> measure_peak_gflops(64, 1) > 0
    True
    """
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    a @ b  # BLAS's threads started, the pages touched
    best = min(_seconds(lambda: a @ b) for _ in range(repeats))
    return 2.0 * n**3 / best / 1e9


def _seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def check(losses: Sequence[float], reference: Sequence[float], dtype: str) -> dict:
    """The losses (and in f32 their decrements) against the reference's, normwise."""
    actual, expected = np.asarray(losses, np.float64), np.asarray(reference, np.float64)
    errors = {"losses": normwise_error(actual, expected)}
    if dtype == "f32":
        errors["decrements"] = normwise_error(actual[1:] - actual[0], expected[1:] - expected[0])
    limit = tolerance(dtype)
    return {"errors": errors, "tolerance": limit, "ok": all(e <= limit for e in errors.values())}


def summarize(result: dict, flops: float, peak_gflops: float) -> dict:
    """Step (median of the rounds' medians), GFLOP/s and fraction of peak from a worker's."""
    if "error" in result:
        return result
    step = statistics.median(r["median_s"] for r in result["rounds"])
    gflops = flops / step / 1e9
    return {
        "step_s": step,
        "round_medians_s": [r["median_s"] for r in result["rounds"]],
        "gflops": gflops,
        "fraction_of_peak": gflops / peak_gflops,
        **{k: result[k] for k in ("first_call_s", "losses", "rounds")},
    }


def run_workload(name: str, args: argparse.Namespace, peak_gflops: float) -> dict:
    """Every chosen system on one workload in `args.dtype`; checks and ratios against JAX."""
    w = WORKLOADS[name]
    size = w.sizes[args.scale]
    flops = w.flops(size)
    systems: dict[str, dict] = {}
    for system in args.systems:
        if not _installed(system):
            systems[system] = {"error": "not installed"}
            continue
        print(f"{name} {args.dtype}: {system} ...", flush=True)
        systems[system] = summarize(spawn(name, system, args), flops, peak_gflops)
    reference = systems.get("jax", {})
    for system, measured in systems.items():
        if "error" in measured or "error" in reference or not reference or system == "jax":
            continue
        measured["check_against_jax"] = check(measured["losses"], reference["losses"], args.dtype)
        measured["step_over_jax"] = measured["step_s"] / reference["step_s"]
        measured["first_call_over_jax"] = measured["first_call_s"] / reference["first_call_s"]
    return {
        "workload": name,
        "dtype": args.dtype,
        "scale": args.scale,
        "size": asdict(size) if is_dataclass(size) else size,
        "flops_per_step": flops,
        "flops_formula": w.flops_formula,
        "peak_gflops": peak_gflops,
        "peak_method": "1024^3 float32 GEMM through NumPy's BLAS, best of 30",
        "machine": machine(),
        "load_average": os.getloadavg(),
        # OpenBLAS's kernels (accy's GEMMs): a core type set here holds them to it.
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "systems": systems,
    }


def failed(report: dict) -> bool:
    """A system failed (other than not being installed) or disagreed with JAX."""
    for measured in report["systems"].values():
        if "error" in measured and measured["error"] != "not installed":
            return True
        if not measured.get("check_against_jax", {"ok": True})["ok"]:
            return True
    return False


def print_report(report: dict) -> None:
    print(
        f"\n{report['workload']} ({report['dtype']}, {report['scale']}): "
        f"{report['flops_per_step'] / 1e6:.1f} MFLOP a step; peak {report['peak_gflops']:.1f} "
        f"GFLOP/s ({report['peak_method']})"
    )
    print("system | step ms | GFLOP/s | % peak | first call s | step/JAX | 1st/JAX | check")
    for system, m in report["systems"].items():
        if "error" in m:
            print(f"{system} | error: {m['error']}")
            continue
        verdict = m.get("check_against_jax")
        checked = "-" if verdict is None else _verdict(verdict)
        print(
            f"{system} | {m['step_s'] * 1e3:.3f} | {m['gflops']:.2f} | "
            f"{m['fraction_of_peak'] * 100:.1f} | {m['first_call_s']:.2f} | "
            f"{_ratio(m.get('step_over_jax'))} | {_ratio(m.get('first_call_over_jax'))} | "
            f"{checked}"
        )


def _verdict(verdict: dict) -> str:
    worst = max(verdict["errors"].values())
    return f"{'ok' if verdict['ok'] else 'MISMATCH'} {worst:.1e}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _installed(system: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(MODULES[system]) is not None


def default_json(workload: str, dtype: str, scale: str) -> Path | None:
    """bench/results/<workload>-cpu-<cores>core-<dtype>.json at the CPU scale; None (nothing
    written) at the check scale, a smoke run.

    >>> default_json("cnn", "f32", "check") is None
    True
    """
    if scale != "cpu":
        return None
    return RESULTS / f"{workload}-cpu-{len(os.sched_getaffinity(0))}core-{dtype}.json"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.training", description=__doc__)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument(
        "--dtype", default=None, choices=("f32", "bf16"), help="default: each one a workload has"
    )
    parser.add_argument("--scale", default="cpu", choices=("cpu", "check"))
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds a timing round")
    parser.add_argument("--timeout", type=float, default=WORKER_TIMEOUT_S)
    parser.add_argument("--json", type=Path, default=None, help="one workload and dtype only")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workloads = _names(args.workloads, WORKLOADS, "workload")
    args.systems = _names(args.systems, SYSTEMS, "system")
    if args.budget <= 0 or args.timeout <= 0:
        parser.error("--budget and --timeout must be positive seconds")
    return args


def _names(text: str, known: Sequence[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(
            f"unknown {what} {', '.join(unknown) or '(none)'}; known: {', '.join(known)}"
        )
    return names


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen workloads in each of their precisions (or `--dtype`), print the tables,
    write one JSON per workload and precision; 1 when a system failed or disagreed."""
    args = parse_args(argv)
    if args.worker:
        dtype = args.dtype or "f32"
        result = worker(args.workloads[0], args.worker, args.scale, dtype, args.budget)
        print(json.dumps(result))
        return 0
    runs = [
        (name, dtype)
        for name in args.workloads
        for dtype in WORKLOADS[name].dtypes
        if args.dtype in (None, dtype)
    ]
    if not runs:
        raise SystemExit(f"--dtype {args.dtype}: none of {', '.join(args.workloads)} has it")
    if args.json and len(runs) > 1:
        raise SystemExit("--json names one file: choose one workload and one --dtype")
    peak = measure_peak_gflops()
    code = 0
    for name, dtype in runs:
        report = run_workload(name, argparse.Namespace(**{**vars(args), "dtype": dtype}), peak)
        print_report(report)
        path = args.json or default_json(name, dtype, args.scale)
        if path is not None:
            path.write_text(json.dumps(report, indent=2))
            print(f"written to {path}")
        code |= failed(report)
    return int(code)


if __name__ == "__main__":
    raise SystemExit(main())
