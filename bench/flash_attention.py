"""Fused attention, forward + backward: accy's `nn.attention` against the unfused composition,
JAX's `jax.nn.dot_product_attention` (its default implementation, XLA's, and cuDNN's) and
PyTorch's `scaled_dot_product_attention`.

Each system runs in its own process (`--system` runs one in this process). The step is
value_and_grad of sum(f32(attention(q, k, v)) * w) with respect to q, k and v (q, k, v in
`--dtype`, w in f32). Reported per system: the median step time, TFLOP/s counted as
4·b·h·t²·d·(1 + 2.5) per step (forward and backward, halved when causal: FlashAttention's
count, which includes the scores recomputed in the backward pass), the normwise error of its
outputs (loss, dq, dk, dv) against the first system that ran (`bench.compare`'s tolerance of
the dtype: 16 unit roundoffs in bf16), and on the CPU the step's peak memory beyond what the
process held before it (VmHWM, reset through /proc/self/clear_refs), less its outputs' bytes.

    python -m bench.flash_attention                       # CPU: 1 head x 8192 tokens x dim 64
    python -m bench.flash_attention --device cuda --preset gpt2 --json attention-gpt2.json
                                                          # GPT-2 small's attention: batch 8,
                                                          # 12 heads, 1024 tokens, dim 64,
                                                          # causal, bf16

Missing packages (jax, torch, cupy) are reported as not installed; `jax-cudnn` runs only on
cuda. bf16 inputs are `ml_dtypes.bfloat16` arrays for accy (CuPy bf16 arrays on cuda), bf16
device arrays for JAX and bf16 tensors for PyTorch, all of the same values.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from bench.measure import run_captured

SYSTEMS = ("accy", "accy-composition", "jax", "jax-cudnn", "torch")
GPU_ONLY = ("jax-cudnn",)
PRESETS = {
    "gpt2": {"batch": 8, "heads": 12, "tokens": 1024, "dim": 64, "causal": True, "dtype": "bf16"}
}
HOLDERS = {"f32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16)}
OUTPUT_NAMES = ("loss", "d/dq", "d/dk", "d/dv")


def flops(batch: int, heads: int, tokens: int, dim: int, causal: bool) -> float:
    """4·b·h·t²·d·(1 + 2.5), halved when causal: forward and backward of one step.

    >>> round(flops(8, 12, 1024, 64, True) / 1e9, 1)
    45.1
    """
    return 4 * batch * heads * tokens**2 * dim * 3.5 / (2 if causal else 1)


def _memory_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def make_inputs(a: argparse.Namespace) -> list[np.ndarray]:
    """q, k, v in `a.dtype` (bf16: the float32 samples rounded) and w in float32, each
    (batch, head, token, dim); the same values in every process."""
    rng = np.random.default_rng(0)
    shape = (a.batch, a.heads, a.tokens, a.dim)
    q, k, v, w = (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))
    return [x.astype(HOLDERS[a.dtype]) for x in (q, k, v)] + [w]


def accy_program(a: argparse.Namespace, fused: bool):
    """The value-and-grad program of the step, with respect to q, k and v."""
    import accy
    from accy import nn

    dtype = {"f32": accy.f32, "bf16": accy.bf16}[a.dtype]
    q_spec = accy.spec(dtype, batch=a.batch, head=a.heads, token=a.tokens, dim=a.dim)
    k_spec = accy.spec(dtype, batch=a.batch, head=a.heads, key=a.tokens, dim=a.dim)
    w_spec = q_spec.with_dtype(accy.f32)

    def loss(b, args):
        q, k, v, w = args
        if fused:
            out = nn.attention(q, k, v, causal=a.causal, implementation="fused")
        else:
            scores = q.contract(k, "dim") * (1.0 / math.sqrt(a.dim))
            if a.causal:
                scores = nn.causal_mask(scores, "token", "key")
            out = nn.softmax(scores, "key").contract(v, "key")
        return (out.convert(accy.f32) * w).sum() if dtype != accy.f32 else (out * w).sum()

    program = accy.trace.define("attention_step", [q_spec, k_spec, k_spec, w_spec], loss)
    return accy.value_and_grad(program, wrt=(0, 1, 2))


def _accy_step(a: argparse.Namespace, fused: bool) -> Callable[..., Any]:
    import accy

    compiled = accy.compile(accy_program(a, fused), device=a.device)

    def prepare(arrays):
        if a.device != "cuda":
            return arrays
        from bench.systems.accy_system import device_array

        return [device_array(x) for x in arrays]

    def step(*arrays):
        outputs = compiled(*arrays)
        if a.device == "cuda":
            import cupy

            cupy.cuda.Device().synchronize()
        return outputs

    def to_numpy(outputs):
        from bench.systems.accy_system import to_numpy

        return to_numpy(outputs)

    step.prepare, step.to_numpy = prepare, to_numpy
    return step


def _jax_step(a: argparse.Namespace, implementation: str | None) -> Callable[..., Any]:
    import jax
    import jax.numpy as jnp

    if a.device != "cuda" and implementation == "cudnn":
        raise RuntimeError("cuDNN attention runs only on cuda")
    if a.dtype == "f32":
        jax.config.update("jax_default_matmul_precision", "highest")

    def loss(q, k, v, w):  # jax's layout: (batch, token, head, dim)
        out = jax.nn.dot_product_attention(
            q, k, v, is_causal=a.causal, implementation=implementation
        )
        return (out.astype(jnp.float32) * w).sum()

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    device = jax.devices("gpu" if a.device == "cuda" else "cpu")[0]

    def step(q, k, v, w):
        return jax.block_until_ready(grad(q, k, v, w))

    def to_numpy(outputs):
        loss, grads = outputs
        return [np.asarray(loss)] + [np.swapaxes(np.asarray(g), 1, 2) for g in grads]

    step.prepare = lambda arrays: [jax.device_put(np.swapaxes(x, 1, 2), device) for x in arrays]
    step.to_numpy = to_numpy
    return step


def _torch_step(a: argparse.Namespace) -> Callable[..., Any]:
    import torch
    import torch.nn.functional as F

    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    device = "cuda" if a.device == "cuda" else "cpu"

    def step(q, k, v, w):
        for x in (q, k, v):
            x.grad = None
        out = F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
        loss = (out.float() * w).sum()
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        return [loss, q.grad, k.grad, v.grad]

    def prepare(arrays):
        tensors = [torch.from_numpy(np.asarray(x, np.float32)).to(device) for x in arrays]
        return [t.to(dtype).requires_grad_() for t in tensors[:3]] + [tensors[3]]

    def to_numpy(outputs):
        return [x.detach().float().cpu().numpy() for x in outputs]

    step.prepare, step.to_numpy = prepare, to_numpy
    return step


def _maker(a: argparse.Namespace) -> Callable[[], Callable[..., Any]]:
    return {
        "accy": lambda: _accy_step(a, True),
        "accy-composition": lambda: _accy_step(a, False),
        "jax": lambda: _jax_step(a, None),
        "jax-cudnn": lambda: _jax_step(a, "cudnn"),
        "torch": lambda: _torch_step(a),
    }[a.system]


def run_one(a: argparse.Namespace) -> dict[str, Any]:
    """Build, run once (measuring the step's peak memory on the CPU; saving the outputs under
    `a.save`), then time the step. The first call counts from before the build (trace,
    differentiation and compilation, or JAX's tracing and compilation at its first call)."""
    start = time.perf_counter()
    try:
        step = _maker(a)()
    except ImportError as error:
        return {"system": a.system, "status": f"not installed ({error.name})"}
    arrays = step.prepare(make_inputs(a))
    result: dict[str, Any] = {"system": a.system, "status": "ok"}
    if a.device == "cpu":
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # VmHWM := VmRSS
        before = _memory_kb("VmRSS")
        outputs = step(*arrays)
        output_bytes = sum(np.asarray(x).nbytes for x in step.to_numpy(outputs))
        peak = (_memory_kb("VmHWM") - before) * 1024 - output_bytes
        result["peak_extra_mb"] = round(max(peak, 0) / 2**20, 1)
    else:
        outputs = step(*arrays)
    result["first_call_s"] = round(time.perf_counter() - start, 3)
    if a.save:
        np.savez(a.save, *[np.asarray(x, np.float32) for x in step.to_numpy(outputs)])
    del outputs
    times = []
    deadline = time.perf_counter() + a.seconds
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 1000):
        start = time.perf_counter()
        step(*arrays)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    result["step_ms"] = round(median * 1e3, 3)
    tflops = flops(a.batch, a.heads, a.tokens, a.dim, a.causal) / median / 1e12
    result["tflops"] = float(f"{tflops:.4g}")
    return result


def check_outputs(rows: list[dict[str, Any]], saved: dict[str, Path], dtype: str) -> None:
    """Each row's worst normwise error against the first system's outputs (`error_vs`,
    `max_error`, `agrees` with the tolerance of `dtype`)."""
    from bench.compare import normwise_error, tolerance

    ran = [r for r in rows if r["status"] == "ok" and saved[r["system"]].exists()]
    if not ran:
        return
    reference = ran[0]["system"]
    with np.load(saved[reference]) as expected_file:
        expected = [expected_file[f"arr_{i}"] for i in range(len(OUTPUT_NAMES))]
    for row in ran[1:]:
        with np.load(saved[row["system"]]) as actual_file:
            errors = {
                name: normwise_error(actual_file[f"arr_{i}"], expected[i])
                for i, name in enumerate(OUTPUT_NAMES)
            }
        worst = max(errors, key=errors.get)
        row |= {
            "error_vs": reference,
            "max_error": float(f"{errors[worst]:.3g}"),
            "max_error_output": worst,
            "tolerance": tolerance(dtype),
            "agrees": errors[worst] <= tolerance(dtype),
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.flash_attention", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), help="gpt2: batch 8, 12 heads, 1024 tokens, dim 64, "
        "causal, bf16 (options given with it still apply)",
    )  # fmt: skip
    parser.add_argument("--dtype", default="f32", choices=tuple(HOLDERS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--systems", default=None, help=f"comma-separated subset of {','.join(SYSTEMS)}"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per system")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("--system", help="run this one system in this process (JSON out)")
    parser.add_argument("--save", type=Path, default=None, help=argparse.SUPPRESS)
    preset = parser.parse_known_args(argv)[0].preset
    if preset:  # the preset's values become the defaults: options given still apply
        parser.set_defaults(**PRESETS[preset])
    return parser.parse_args(argv)


def chosen_systems(a: argparse.Namespace) -> list[str]:
    """`--systems` (default: all, without the cuda-only ones on the CPU)."""
    if a.systems is None:
        return [s for s in SYSTEMS if a.device == "cuda" or s not in GPU_ONLY]
    names = [s.strip() for s in a.systems.split(",") if s.strip()]
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown system {', '.join(unknown)}; known: {', '.join(SYSTEMS)}")
    return names


def shared_flags(a: argparse.Namespace) -> list[str]:
    flags = [f"--device={a.device}", f"--dtype={a.dtype}", f"--batch={a.batch}"]
    flags += [f"--heads={a.heads}", f"--tokens={a.tokens}", f"--dim={a.dim}"]
    return flags + [f"--seconds={a.seconds}", "--causal" if a.causal else "--no-causal"]


def spawn(a: argparse.Namespace, system: str, save: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.flash_attention", *shared_flags(a)]
    command += ["--system", system, "--save", str(save)]
    done = run_captured(command, a.timeout)
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    last = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
    return {"system": system, "status": f"failed: {last[0]}"}


def report(a: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "benchmark": "attention forward + backward",
        "device": a.device,
        "shape": {"batch": a.batch, "heads": a.heads, "tokens": a.tokens, "dim": a.dim},
        "causal": a.causal,
        "dtype": a.dtype,
        "flops_per_step": flops(a.batch, a.heads, a.tokens, a.dim, a.causal),
        "flops_formula": "4*b*h*t^2*d*(1 + 2.5), halved when causal",
        "rows": rows,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print("system | step ms | TFLOP/s | first call s | max error (vs) | status")
    for r in rows:
        error = f"{r['max_error']:.2e} ({r['error_vs']})" if "max_error" in r else "-"
        status = r["status"] if r.get("agrees", True) else "MISMATCH"
        print(
            f"{r['system']} | {r.get('step_ms', '-')} | {r.get('tflops', '-')} | "
            f"{r.get('first_call_s', '-')} | {error} | {status}"
        )


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.system:
        print(json.dumps(run_one(a)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-attention-") as scratch:
        saved = {s: Path(scratch) / f"{s}.npz" for s in chosen_systems(a)}
        for system in saved:
            rows.append(spawn(a, system, saved[system]))
            print(json.dumps(rows[-1]), flush=True)
        check_outputs(rows, saved, a.dtype)
    print_table(rows)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(report(a, rows), indent=2) + "\n")
    usable = all(r["status"] == "ok" or "not installed" in r["status"] for r in rows)
    return 0 if usable and all(r.get("agrees", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
