"""Where PyTorch's f32 GPT-2 step spends its GPU time, against accy's (issue 20, f32 bar).

On the GPU machine, from the repo root (PYTHONPATH=src:/tmp/site:.):

    python3 tools/device/f32_probe.py

Prints, for `torch.compile`'s f32 step of `bench.gpt2` (TF32 off, as the bench runs it), the
GPU time per step by kernel family (GEMMs, attention, Triton, other) from `torch.profiler`;
then PyTorch's causal SDPA alone in f32 at GPT-2's shape (forward, forward + backward), and
`torch.matmul` at each GEMM shape of the step (true f32), for comparison with
`tools/gpt2_profile.py --dtype f32`.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, ".")
from bench.gpt2 import SCALES, batch, initial_values, torch_loss  # noqa: E402
from tools.device.timing import cuda_ms  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
S = SCALES["cuda"]


def family(name: str) -> str:
    lowered = name.lower()
    if "fmha" in lowered or "attention" in lowered or "flash" in lowered:
        return "attention"
    if "gemm" in lowered or "cutlass" in lowered or "sm90_xmma" in lowered:
        return "gemm"
    if "triton" in lowered:
        return "triton"
    return "other"


def torch_step_profile() -> None:
    params = {
        k: torch.tensor(v, device="cuda", requires_grad=True) for k, v in initial_values(S).items()
    }
    ids, targets = (torch.tensor(a, device="cuda", dtype=torch.long) for a in batch(S))
    optimizer = torch.optim.AdamW(list(params.values()), 1e-4, fused=True)
    compiled = torch.compile(lambda i, t: torch_loss(S, params, i, t))

    def step():
        loss = compiled(ids, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    print(f"torch f32 step: {cuda_ms(step, 5):.2f} ms (events)")
    steps = 3
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    kernels: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        if us is None:
            us = event.self_cuda_time_total
        if us <= 0:
            continue
        totals[family(event.key)] += us / steps
        kernels[event.key] += us / steps
    print("torch f32 step by family (ms per step):")
    for name, us in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {name:10s} {us / 1e3:8.2f}")
    print(f"  total      {sum(totals.values()) / 1e3:8.2f}")
    print("torch f32 slowest kernels (ms per step):")
    for name, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {us / 1e3:8.3f}  {family(name):9s} {name[:110]}")


def sdpa_alone() -> None:
    shape = (S.batch, S.heads, S.tokens, S.width // S.heads)
    q, k, v = (torch.randn(shape, device="cuda", requires_grad=True) for _ in range(3))
    do = torch.randn(shape, device="cuda")
    f = torch.nn.functional.scaled_dot_product_attention
    forward = cuda_ms(lambda: f(q, k, v, is_causal=True))

    def both():
        out = f(q, k, v, is_causal=True)
        torch.autograd.grad(out, (q, k, v), do)

    total = cuda_ms(both)
    print(
        f"torch SDPA f32 causal {shape}: forward {forward:.3f} ms, forward+backward {total:.3f} ms"
        f" (x{S.layers} layers: {total * S.layers:.1f} ms)"
    )


def gemm_shapes() -> None:
    tokens, width, vocab = S.batch * S.tokens, S.width, S.vocab
    shapes = {
        "qkv": (tokens, width, 3 * width),
        "proj": (tokens, width, width),
        "fc": (tokens, width, 4 * width),
        "out": (tokens, 4 * width, width),
        "lm head": (tokens, width, vocab),
        "lm head dx": (tokens, vocab, width),
        "lm head dW": (vocab, tokens, width),
        "fc dW": (width, tokens, 4 * width),
    }
    print("torch.matmul true f32 (m x k x n: ms, TFLOP/s):")
    for name, (m, k, n) in shapes.items():
        a = torch.randn(m, k, device="cuda")
        b = torch.randn(k, n, device="cuda")
        ms = cuda_ms(lambda a=a, b=b: a @ b)
        print(f"  {name:11s} {m}x{k}x{n}: {ms:.3f} ms, {2 * m * k * n / ms / 1e9:.1f}")
        bt = torch.randn(n, k, device="cuda")
        ms = cuda_ms(lambda a=a, bt=bt: a @ bt.T)
        print(
            f"  {name:11s} {m}x{k}x{n} (B transposed): {ms:.3f} ms, {2 * m * k * n / ms / 1e9:.1f}"
        )


if __name__ == "__main__":
    started = time.perf_counter()
    sdpa_alone()
    gemm_shapes()
    torch_step_profile()
    print(f"f32_probe: {time.perf_counter() - started:.0f} s")
