"""accy's f32 FlashAttention kernels (`accy.attention.flash_cuda`) alone at GPT-2 small's shape
(8 x 12 heads, 1,024 tokens, dim 64, causal), against PyTorch's SDPA in f32 (its
memory-efficient kernels) in the same process.

    PYTHONPATH=src:. python3 tools/flash_attention_f32.py

The kernels are also checked against the NumPy composition on a small odd shape.
"""

from __future__ import annotations

import sys

import cupy
import numpy as np

sys.path.insert(0, ".")
import accy  # noqa: E402
from accy.attention import composition  # noqa: E402
from accy.attention import flash_cuda as fc  # noqa: E402
from accy.attention.signature import Signature, backward_type, check, packed_type  # noqa: E402
from tools.cuda_timing import cuda_ms  # noqa: E402

AXES = (("batch", "head", "token", "dim"), ("batch", "head", "key", "dim"))


SHIPPED = {"KERNELS": fc.KERNELS, "FORWARD_TILE_ROWS": fc.FORWARD_TILE_ROWS}
VARIANTS = {  # name: the module's settings that differ from what ships
    "as shipped": {},
    "forward tiles of 4 rows": {"FORWARD_TILE_ROWS": 4},
    # What the dQ atomics cost (wrong dQ: a timing only).
    "backward, dQ stored (timing only)": {
        "KERNELS": SHIPPED["KERNELS"].replace(
            "atomicAdd(dq + (long long)i * D + 4 * ct + c, acc[e][c])",
            "dq[(long long)i * D + 4 * ct + c] = acc[e][c]",
        )
    },
}


def configure(settings: dict) -> None:
    for name, value in {**SHIPPED, **settings}.items():
        setattr(fc, name, value)
    fc._kernel.cache_clear()


def calls(b, h, t, d, causal=True):
    s = Signature(AXES[0], AXES[1], AXES[1], causal=causal)
    q = accy.spec(accy.f32, batch=b, head=h, token=t, dim=d)
    k = accy.spec(accy.f32, batch=b, head=h, key=t, dim=d)
    shape = check(s, q, k, k)
    packed = packed_type(s, shape)
    forward = fc._kernel(s, "forward", (q, k, k), packed)
    backward = fc._kernel(s, "backward", (q, k, k, packed, packed), backward_type(s, shape))
    return s, forward, backward, packed, backward_type(s, shape)


def run(b, h, t, d, arrays, causal=True, repeats=0):
    """(packed, grads, forward ms, backward ms) of the kernels on `arrays` (q, k, v, dpacked)."""
    _, forward, backward, packed_t, grads_t = calls(b, h, t, d, causal)
    issue_f = forward.library.load(0)
    issue_b = backward.library.load(0)
    q, k, v, dpacked = arrays
    packed = cupy.zeros(packed_t.extents, cupy.float32)
    grads = cupy.zeros(grads_t.extents, cupy.float32)
    scratch = cupy.zeros(max(backward.library.scratch_bytes, 1), cupy.uint8)
    stream = cupy.cuda.get_current_stream()
    issue_f.bind(stream.ptr)
    issue_b.bind(stream.ptr)

    def f():
        issue_f.issue(packed.data.ptr, (q.data.ptr, k.data.ptr, v.data.ptr), 0)

    def g():
        operands = (q.data.ptr, k.data.ptr, v.data.ptr, packed.data.ptr, dpacked.data.ptr)
        issue_b.issue(grads.data.ptr, operands, scratch.data.ptr)

    f()
    g()
    times = []
    for fn in (f, g):
        if not repeats:
            times.append(0.0)
            continue
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        fn()
        start.record()
        for _ in range(repeats):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / repeats)
    return cupy.asnumpy(packed), cupy.asnumpy(grads), *times


def check_small(causal: bool) -> float:
    b, h, t, d = 2, 3, 100, 64
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(3))
    dpacked = rng.standard_normal((b, h, t, d + 1)).astype(np.float32)
    s = calls(b, h, t, d, causal)[0]
    arrays = [cupy.asarray(x) for x in (q, k, v, dpacked)]
    packed, grads, _, _ = run(b, h, t, d, arrays, causal)
    f64 = [x.astype(np.float64) for x in (q, k, v)]
    expected_packed = composition.numpy_forward(s, *f64)
    expected_grads = composition.numpy_backward(
        s, *f64, expected_packed, dpacked.astype(np.float64)
    )
    errors = [
        np.max(np.abs(packed - expected_packed)) / np.max(np.abs(expected_packed)),
        np.max(np.abs(grads - expected_grads)) / np.max(np.abs(expected_grads)),
    ]
    return float(max(errors))


def main() -> None:
    b, h, t, d = 8, 12, 1024, 64
    rng = cupy.random.default_rng(0)
    arrays = [rng.standard_normal((b, h, t, d), dtype=cupy.float32) for _ in range(3)]
    arrays.append(rng.standard_normal((b, h, t, d + 1), dtype=cupy.float32))
    flops_f = 4 * b * h * t * t * d / 2  # causal: half the scores
    for name, settings in VARIANTS.items():
        configure(settings)
        try:
            error = max(check_small(True), check_small(False))
            _, _, fms, bms = run(b, h, t, d, arrays, repeats=20)
        except Exception as e:  # a variant that does not build or run: say why
            print(f"{name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        print(
            f"{name}: forward {fms:.3f} ms ({flops_f / fms / 1e9:.1f} TFLOP/s), backward "
            f"{bms:.3f} ms ({2.5 * flops_f / bms / 1e9:.1f} TFLOP/s of 2.5x), x12 layers "
            f"{12 * (fms + bms):.1f} ms; max relative error {error:.1e}"
        )
    configure({})
    try:
        import torch

        shape = (b, h, t, d)
        q, k, v = (torch.randn(shape, device="cuda", requires_grad=True) for _ in range(3))
        do = torch.randn(shape, device="cuda")
        sdpa = torch.nn.functional.scaled_dot_product_attention

        fwd = cuda_ms(lambda: sdpa(q, k, v, is_causal=True), 20, 1)
        both = cuda_ms(
            lambda: torch.autograd.grad(sdpa(q, k, v, is_causal=True), (q, k, v), do), 20, 1
        )
        print(f"torch SDPA f32: forward {fwd:.3f} ms, backward {both - fwd:.3f} ms")
        print(f"  x12 layers {12 * both:.1f} ms")
    except Exception as e:  # PyTorch is optional here
        print(f"torch: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
