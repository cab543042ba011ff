"""GPU smoke check of cuDNN attention (run by tools/device/cudnn.sh): compiles value_and_grad
of a bf16 attention loss at GPT-2 small's shape on CUDA with every cuDNN graph-building step
logged, says whether cuDNN ran (library steps in the schedule) or why it declined, checks the
step against the composition (ACCY_CUDNN_ATTENTION=0 in a child process is not needed: the
f32 reference on the host is), and profiles the schedule's actions one by one.

    PYTHONPATH=src python3 tools/device/cudnn_smoke.py [--tokens 1024]
"""

from __future__ import annotations

import argparse
import logging
import time
import traceback

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=64)
    a = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    import cupy
    import ml_dtypes

    import accy
    from accy.attention import cuda as cudnn_attention
    from accy.backends.cuda.schedule import Library

    try:
        import cudnn

        print(
            "cudnn frontend", getattr(cudnn, "__version__", "?"), "backend", cudnn.backend_version()
        )
    except Exception:
        traceback.print_exc()
    q_spec = accy.spec(accy.bf16, batch=a.batch, head=a.heads, token=a.tokens, dim=a.dim)
    k_spec = accy.spec(accy.bf16, batch=a.batch, head=a.heads, key=a.tokens, dim=a.dim)

    def loss(b, args):
        q, k, v, w = args
        out = accy.nn.attention(q, k, v, causal=True)
        return (out * w).convert(accy.f32).sum()

    program = accy.trace.define("smoke", [q_spec, k_spec, k_spec, q_spec], loss)
    gradient = accy.value_and_grad(program, wrt=(0, 1, 2))
    start = time.perf_counter()
    executable = accy.compile(gradient, device="cuda")
    print(f"compiled in {time.perf_counter() - start:.1f} s")
    actions = executable.compiled.schedule.actions
    libraries = [x.symbol for x in actions if isinstance(x, Library)]
    print(f"schedule: {len(actions)} actions, library steps: {libraries or 'NONE'}")
    for where, why in cudnn_attention.decline_reasons().items():
        print(f"declined: {where}\n  {why}")
    rng = np.random.default_rng(0)
    host = [
        rng.standard_normal(t.extents, dtype=np.float32) for t in (q_spec, k_spec, k_spec, q_spec)
    ]
    inputs = [cupy.asarray(x.astype(ml_dtypes.bfloat16)) for x in host]
    start = time.perf_counter()
    outputs = executable(*inputs)
    cupy.cuda.Device().synchronize()
    print(f"first call (captures the graph) {time.perf_counter() - start:.2f} s")
    got = [cupy.asnumpy(x).astype(np.float64) for x in outputs]
    print("finite:", [bool(np.isfinite(g).all()) for g in got], "loss", float(got[0]))
    # The same step through torch (f32 math on the same bf16 values) as an independent check.
    try:
        import torch

        tq, tk, tv, tw = (
            torch.tensor(x.astype(ml_dtypes.bfloat16).astype(np.float32), device="cuda")
            for x in host
        )
        for t in (tq, tk, tv):
            t.requires_grad_(True)
        out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
        value = (out * tw).sum()
        value.backward()
        expected = [value.item(), tq.grad, tk.grad, tv.grad]
        for name, g, e in zip(["loss", "dq", "dk", "dv"], got, expected, strict=True):
            e = np.asarray(e.cpu().numpy() if hasattr(e, "cpu") else e, np.float64)
            scale = max(float(np.max(np.abs(e))), 1e-6)
            error = float(np.max(np.abs(g - e))) / scale
            print(f"  {name}: max |accy - torch f32| / max|torch| = {error:.2e}")
    except Exception:
        traceback.print_exc()
    for _ in range(3):
        executable(*inputs)
    cupy.cuda.Device().synchronize()
    start, rounds = time.perf_counter(), 20
    for _ in range(rounds):
        executable(*inputs)
    cupy.cuda.Device().synchronize()
    print(f"graph step {1e3 * (time.perf_counter() - start) / rounds:.3f} ms")
    outs = [cupy.empty(o.shape, o.dtype) for o in outputs]
    addresses = [x.data.ptr for x in inputs] + [o.data.ptr for o in outs]
    profile = executable.fragment.profile(addresses, repeats=5)
    total = sum(t for _, t in profile)
    print(f"profile (actions outside the graph): {len(profile)} actions, {total:.3f} ms; top 8:")
    for what, ms in sorted(profile, key=lambda x: -x[1])[:8]:
        print(f"  {ms:8.3f} ms  {what}")


if __name__ == "__main__":
    main()
