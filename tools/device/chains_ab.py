"""On the GPU: milliseconds per call of GPT-2-sized row losses with their reduction chains
(`accy.lower.grouping.reduction_chains`) and without (CHAIN_WINDOW = 0), and whether both give
the same bits (a chain's loop phase may contract into FMAs where a loop's own kernel does not:
then the bits may differ in the last place). Run from the repo root:
python3 tools/device/chains_ab.py"""

from __future__ import annotations

import os
import sys
import tempfile

import cupy
import numpy as np

sys.path.insert(0, ".")

import accy  # noqa: E402
from accy import bf16, spec  # noqa: E402
from accy.backends.base import CACHE  # noqa: E402
from accy.backends.cuda import reductions  # noqa: E402
from accy.lower import grouping  # noqa: E402


def cross_entropy(rows=8192, classes=50304):
    return accy.trace.define(
        "ce",
        [spec(bf16, row=rows, v=classes), spec(accy.i32, row=rows)],
        lambda b, a: accy.nn.cross_entropy(a[0], a[1], "v").mean("row"),
    )


def layer_norm_backward(rows=8192, cols=768):
    def body(b, a):
        y = accy.nn.layer_norm(a[0], "col") * a[1]
        return (y * a[2]).sum()

    program = accy.trace.define(
        "ln",
        [spec(bf16, row=rows, col=cols), spec(bf16, col=cols), spec(bf16, row=rows, col=cols)],
        body,
    )
    return accy.value_and_grad(program, wrt=[0])


def inputs_of(program):
    rng = np.random.default_rng(0)
    arrays = []
    for t in program.parameter_types:
        if t.dtype == accy.i32:
            arrays.append(cupy.asarray(rng.integers(0, 50304, t.extents).astype(np.int32)))
        else:
            x = rng.standard_normal(t.extents).astype(np.float32)
            arrays.append(cupy.asarray(x.astype(t.dtype.numpy)))
    return arrays


def timed(program, arrays, repeats=20):
    # A fresh memory cache and disk cache folder: the disk cache's key knows nothing of
    # CHAIN_WINDOW.
    CACHE.clear()
    os.environ["ACCY_CACHE_DIR"] = tempfile.mkdtemp(prefix="chains-ab-")
    run = accy.compile(program, device="cuda")
    outputs = [cupy.asnumpy(o) for o in run(*arrays)]
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(3):
        run(*arrays)
    start.record()
    for _ in range(repeats):
        run(*arrays)
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / repeats, outputs


def variant(program, arrays, **patches):
    """ms and outputs with module constants patched ("grouping.X" or "reductions.X")."""
    modules = {"grouping": grouping, "reductions": reductions}
    saved = {}
    for key, value in patches.items():
        module, name = key.split("__")
        saved[(module, name)] = getattr(modules[module], name)
        setattr(modules[module], name, value)
    try:
        return timed(program, arrays)
    finally:
        for (module, name), value in saved.items():
            setattr(modules[module], name, value)


for name, build in (
    ("cross-entropy 8192x50304 bf16", cross_entropy),
    ("layer-norm fwd+bwd 8192x768 bf16", layer_norm_backward),
):
    program = build()
    arrays = inputs_of(program)
    chained, a = variant(program, arrays)
    apart, c = variant(program, arrays, grouping__CHAIN_WINDOW=0)
    same = all(
        np.asarray(x).tobytes() == np.asarray(z).tobytes() for x, z in zip(a, c, strict=True)
    )
    scaled = max(
        float(np.max(np.abs(x.astype(np.float64) - z.astype(np.float64))))
        / max(float(np.max(np.abs(z.astype(np.float64)))), 1e-30)
        for x, z in zip(a, c, strict=True)
    )
    print(
        f"{name}: chained {chained:.3f} ms, apart {apart:.3f} ms; same bits: {same} "
        f"(chained vs apart: {scaled:.1e} of the max)"
    )
