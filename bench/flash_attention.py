"""Fused attention, forward + backward: accy's `nn.attention` against the unfused composition,
JAX's `jax.nn.dot_product_attention` and PyTorch's `scaled_dot_product_attention`.

Each system runs in its own process (`--system` runs one in this process). The step is
value_and_grad of sum(attention(q, k, v) * w) with respect to q, k and v. Reported per
system: the median step time, TFLOP/s counted as 4·b·h·t²·d·(1 + 2.5) per step (forward and
backward, halved when causal), and on the CPU the step's peak memory beyond what the process
held before it (VmHWM, reset through /proc/self/clear_refs), less its outputs' bytes.

    python -m bench.flash_attention                       # CPU: 1 head x 8192 tokens x dim 64
    python -m bench.flash_attention --device cuda --dtype bf16 --batch 8 --heads 12 \\
        --tokens 1024 --dim 64                            # GPT-2 small's attention on a GPU

Missing packages (jax, torch, cupy) are reported as not installed. bf16 inputs are bf16 values
(rounded from float32); on CUDA accy gets them as CuPy `ml_dtypes.bfloat16` arrays.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

SYSTEMS = ("accy", "accy-composition", "jax", "torch")


def flops(batch: int, heads: int, tokens: int, dim: int, causal: bool) -> float:
    """4·b·h·t²·d·(1 + 2.5), halved when causal: forward and backward of one step.

    >>> round(flops(8, 12, 1024, 64, True) / 1e9, 1)
    90.2
    """
    return 4 * batch * heads * tokens**2 * dim * 3.5 / (2 if causal else 1)


def _memory_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def _inputs(a: argparse.Namespace) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    shape = (a.batch, a.heads, a.tokens, a.dim)
    arrays = [rng.standard_normal(shape, dtype=np.float32) for _ in range(4)]
    if a.dtype == "bf16":  # float32 arrays holding bf16 values
        from accy.core.types import round_to_bf16

        arrays = [round_to_bf16(x) for x in arrays]
    return arrays


def _accy_step(a: argparse.Namespace, fused: bool) -> Callable[..., Any]:
    import accy
    from accy import nn

    dtype = {"f32": accy.f32, "bf16": accy.bf16, "f16": accy.f16}[a.dtype]
    q_spec = accy.spec(dtype, batch=a.batch, head=a.heads, token=a.tokens, dim=a.dim)
    k_spec = accy.spec(dtype, batch=a.batch, head=a.heads, key=a.tokens, dim=a.dim)

    def loss(b, args):
        q, k, v, w = args
        if fused:
            out = nn.attention(q, k, v, causal=a.causal)
        else:
            scores = q.contract(k, "dim") * (1.0 / math.sqrt(a.dim))
            if a.causal:
                rows = b.iota(accy.spec(accy.i32, token=a.tokens, key=a.tokens), "token")
                cols = b.iota(accy.spec(accy.i32, token=a.tokens, key=a.tokens), "key")
                scores = b.select(rows >= cols, scores, float("-inf"))
            out = nn.softmax(scores, "key").contract(v, "key")
        return (out * w).convert(accy.f32).sum()

    program = accy.trace.define("attention_step", [q_spec, k_spec, k_spec, q_spec], loss)
    compiled = accy.compile(accy.value_and_grad(program, wrt=(0, 1, 2)), device=a.device)
    if a.device != "cuda":
        return compiled
    import cupy

    def step(*arrays):
        outputs = compiled(*arrays)
        cupy.cuda.Device().synchronize()
        return outputs

    return step


def _jax_step(a: argparse.Namespace) -> Callable[..., Any]:
    import jax
    import jax.numpy as jnp

    dtype = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}[a.dtype]

    def loss(q, k, v, w):  # jax's layout: (batch, token, head, dim)
        out = jax.nn.dot_product_attention(
            q.astype(dtype), k.astype(dtype), v.astype(dtype), is_causal=a.causal
        )
        return (out.astype(jnp.float32) * w).sum()

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    device = jax.devices("gpu" if a.device == "cuda" else "cpu")[0]

    def step(q, k, v, w):
        return jax.block_until_ready(grad(q, k, v, w))

    step.prepare = lambda arrays: [jax.device_put(np.swapaxes(x, 1, 2), device) for x in arrays]
    return step


def _torch_step(a: argparse.Namespace) -> Callable[..., Any]:
    import torch
    import torch.nn.functional as F

    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
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
        tensors = [torch.tensor(x, device=device) for x in arrays]
        return [t.to(dtype).requires_grad_(i < 3) for i, t in enumerate(tensors)]

    step.prepare = prepare
    return step


def run_one(a: argparse.Namespace) -> dict[str, Any]:
    """Build, run once (measuring the step's peak memory on the CPU), then time the step."""
    arrays = _inputs(a)
    makers = {
        "accy": lambda: _accy_step(a, True),
        "accy-composition": lambda: _accy_step(a, False),
        "jax": lambda: _jax_step(a),
        "torch": lambda: _torch_step(a),
    }
    try:
        step = makers[a.system]()
    except ImportError as error:
        return {"system": a.system, "status": f"not installed ({error.name})"}
    prepare = getattr(step, "prepare", None)
    if prepare is not None:
        arrays = prepare(arrays)
    elif a.system.startswith("accy") and a.device == "cuda":
        import cupy
        import ml_dtypes

        # The arrays accy holds for the dtype (bfloat16 for bf16): no conversion in the step.
        held = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}[a.dtype]
        arrays = [cupy.asarray(x.astype(held)) for x in arrays]
    result: dict[str, Any] = {"system": a.system, "status": "ok"}
    if a.device == "cpu":
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # VmHWM := VmRSS
        before = _memory_kb("VmRSS")
        outputs = step(*arrays)
        output_bytes = sum(np.asarray(x).nbytes for x in outputs)
        peak = (_memory_kb("VmHWM") - before) * 1024 - output_bytes
        result["peak_extra_mb"] = round(max(peak, 0) / 2**20, 1)
    else:
        step(*arrays)
    times = []
    deadline = time.perf_counter() + a.seconds
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 1000):
        start = time.perf_counter()
        step(*arrays)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    result["step_ms"] = round(median * 1e3, 3)
    result["tflops"] = round(flops(a.batch, a.heads, a.tokens, a.dim, a.causal) / median / 1e12, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="f32", choices=("f32", "bf16", "f16"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--system", help="run this one system in this process (JSON out)")
    a = parser.parse_args(argv)
    if a.system:
        print(json.dumps(run_one(a)))
        return 0
    shared = [f"--device={a.device}", f"--dtype={a.dtype}", f"--batch={a.batch}"]
    shared += [f"--heads={a.heads}", f"--tokens={a.tokens}", f"--dim={a.dim}"]
    shared += [f"--seconds={a.seconds}", "--causal" if a.causal else "--no-causal"]
    rows = []
    for system in a.systems.split(","):
        command = [sys.executable, "-m", "bench.flash_attention", *shared, "--system", system]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        lines = done.stdout.strip().splitlines()
        row = (
            json.loads(lines[-1])
            if done.returncode == 0 and lines
            else {
                "system": system,
                "status": f"failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}",
            }
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return 0 if all(r["status"] == "ok" or "not installed" in r["status"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
