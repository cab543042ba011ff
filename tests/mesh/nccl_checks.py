"""Every collective and the data-parallel / FSDP gradient programs through `accy.mesh.nccl`,
against NumPy: run on GPUs by nccl_worker.py (one process per GPU), and on the CPU by
test_nccl_simulated.py (threads and fake_nccl's stand-ins for CuPy and NCCL)."""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np

import accy
from accy import bf16, f32, i32, spec
from accy.core.types import bool_
from accy.mesh import shard_program
from accy.mesh.nccl import Distributed, NcclExecutable


def run_checks(
    distributed: Distributed, lock=None, graph: bool | None = None, bucket_bytes: int | None = None
) -> list[str]:
    """What went wrong on this rank (empty: everything matched). `lock` serializes compiling
    (ranks that are threads of one process); `graph` and `bucket_bytes` go to every
    `NcclExecutable` (on GPUs, graph=None runs each program as one CUDA graph with NCCL steps
    where it can, graph=False as segments between NCCL calls). Every collective reads an
    ordinary value (2 x) so that a graph can hold it."""
    cupy, mesh, me = distributed.cupy, distributed.mesh, distributed.rank
    size = mesh.size
    failures: list[str] = []
    lock = lock or contextlib.nullcontext()

    def executable(program, donate=()):
        with lock:
            return NcclExecutable(
                program, distributed, graph=graph, bucket_bytes=bucket_bytes, donate=donate
            )

    def host(x) -> np.ndarray:
        return cupy.asnumpy(x) if hasattr(cupy, "asnumpy") else np.asarray(x)

    def check(name, got, want, tol=1e-5):
        got = host(got).astype(np.float64)
        want = np.asarray(want, np.float64)
        if got.shape != want.shape or not np.allclose(got, want, rtol=tol, atol=tol):
            failures.append(
                f"rank {me}: {name}: got {got.shape} {got.ravel()[:4]}..., "
                f"want {want.shape} {want.ravel()[:4]}..."
            )

    def inputs(rank):
        return np.random.default_rng(rank).standard_normal((2 * size, 4 * size)).astype(np.float32)

    xs = [inputs(r) for r in range(size)]
    attrs = {"mesh_axis": "data", "size": size}
    cases = {
        "psum": ({}, sum(xs)),
        "all_gather": ({"axis": "m"}, np.concatenate(xs, axis=1)),  # not the leading axis
        "reduce_scatter": ({"axis": "n"}, np.split(sum(xs), size, axis=0)[me]),
        "all_to_all": (
            {"split_axis": "m", "concat_axis": "n"},
            np.concatenate([np.split(x, size, axis=1)[me] for x in xs], axis=0),
        ),
        "ppermute": (
            {"perm": tuple((i, (i + 1) % size) for i in range(size))},
            xs[(me - 1) % size],
        ),
    }
    for kind, (extra, want) in cases.items():
        for dtype, cast, tol in ((f32, np.float32, 1e-5), (bf16, ml_dtypes.bfloat16, 3e-2)):
            program = accy.trace.define(
                kind,
                [spec(dtype, n=2 * size, m=4 * size)],
                lambda b, a, kind=kind, extra=extra: b.emit(kind, [a[0] * 2.0], {**attrs, **extra}),
            )
            mine = xs[me].astype(cast)
            try:
                (got,) = executable(program)(cupy.asarray(mine))
            except Exception as error:  # noqa: BLE001 - reported with the rank, then the rest run
                failures.append(f"rank {me}: {kind} {dtype}: {type(error).__name__}: {error}")
                continue
            check(f"{kind} {dtype}", got, 2 * np.asarray(want, np.float64), tol)

    # Booleans travel as bytes.
    program = accy.trace.define(
        "bool_gather",
        [spec(bool_, n=3)],
        lambda b, a: b.emit("all_gather", [~a[0]], {**attrs, "axis": "n"}),
    )
    flags = [np.arange(3) % (r + 2) == 0 for r in range(size)]
    (got,) = executable(program)(cupy.asarray(flags[me]))
    check("all_gather bool", got, ~np.concatenate(flags), 0)

    # Integers are summed exactly; axis_index gives each device its position.
    program = accy.trace.define(
        "int_psum", [spec(i32, n=3)], lambda b, a: b.emit("psum", [a[0] * 2], attrs)
    )
    (got,) = executable(program)(cupy.asarray(np.arange(3, dtype=np.int32) + me))
    check("psum i32", got, 2 * sum(np.arange(3) + r for r in range(size)), 0)
    program = accy.trace.define(
        "where",
        [spec(f32, n=1)],
        lambda b, a: a[0] + b.convert(b.emit("axis_index", [], attrs), f32),
    )
    (got,) = executable(program)(cupy.asarray(np.zeros(1, np.float32)))
    check("axis_index", got, [me], 0)

    # Donation: an update of a donated input by a psum-med gradient returns, as one CUDA graph,
    # the donated array itself, updated in place (segments ignore donation).
    program = accy.trace.define(
        "sgd",
        [spec(f32, n=4 * size)] * 2,
        lambda b, a: a[0] - b.emit("psum", [a[1] * 1.0], attrs) * 0.5,
    )
    run = executable(program, donate=(0,))
    weights = cupy.asarray(np.ones(4 * size, np.float32))
    (got,) = run(weights, cupy.asarray(np.full(4 * size, me + 1.0, np.float32)))
    check("donated sgd", got, np.full(4 * size, 1 - 0.5 * sum(range(1, size + 1))), 0)
    if run.mode == "graph" and got is not weights:
        failures.append(f"rank {me}: donated sgd: the result is not the donated array")

    def mlp_loss(b, a):
        x, y, w1, b1, w2 = a
        h = (x.contract(w1, "feature") + b1).tanh()
        return ((h.contract(w2, "hidden") - y) ** 2.0).mean(("batch", "out"))

    specs = [
        spec(f32, batch=16 * size, feature=32),
        spec(f32, batch=16 * size, out=8),
        spec(f32, feature=32, hidden=32 * size),
        spec(f32, hidden=32 * size),
        spec(f32, hidden=32 * size, out=8),
    ]
    whole = accy.gradient.value_and_grad(accy.trace.define("mlp", specs, mlp_loss), (2, 3, 4))
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(t.extents).astype(np.float32) for t in specs]
    want = accy.reference.run(whole, arrays)
    for name, mapping in (("dp", {"batch": "data"}), ("fsdp", {"batch": "data", "hidden": "data"})):
        sharded = shard_program(whole, mesh, mapping)
        run = executable(sharded)
        if graph is not False and distributed.segment_device.is_cuda and run.mode != "graph":
            failures.append(f"rank {me}: {name} ran as segments: {run.reason}")
        outputs = run(*run.local_inputs(arrays))
        for i, (out, t, s) in enumerate(
            zip(outputs, whole.output_types, sharded.output_shardings, strict=True)
        ):
            check(f"{name} output {i}", out, want[i][sharded.block(me, t, s)], tol=1e-4)
    return failures
