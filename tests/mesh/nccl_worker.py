"""Run by test_nccl.py in each process of `accy launch --gpus N` (one GPU each): every
collective through NCCL, and data-parallel / FSDP gradient programs, against NumPy."""

from __future__ import annotations

import sys

import numpy as np

import accy
from accy import f32, spec
from accy.mesh import Mesh, shard_program
from accy.mesh.bootstrap import Environment
from accy.mesh.nccl import Distributed, NcclExecutable


def main() -> None:
    env = Environment.from_env()
    size = env.world_size
    mesh = Mesh(range(size), "data")
    distributed = Distributed(mesh, env)
    cupy = distributed.cupy
    failures = []

    def check(name, got, want, tol=1e-5):
        got = cupy.asnumpy(got) if hasattr(got, "device") else np.asarray(got)
        if got.shape != np.shape(want) or not np.allclose(got, want, rtol=tol, atol=tol):
            failures.append(
                f"rank {env.rank}: {name}: got {got.ravel()[:4]}..., want {np.ravel(want)[:4]}..."
            )

    def inputs(rank):
        return np.random.default_rng(rank).standard_normal((2 * size, 4 * size)).astype(np.float32)

    xs = [inputs(r) for r in range(size)]
    me = env.rank
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
        program = accy.trace.define(
            kind,
            [spec(f32, n=2 * size, m=4 * size)],
            lambda b, a, kind=kind, extra=extra: b.emit(kind, [a[0]], {**attrs, **extra}),
        )
        (got,) = NcclExecutable(program, distributed)(xs[me])
        check(kind, got, want)

    def mlp_loss(b, a):
        x, y, w1, b1, w2 = a
        h = (x.contract(w1, "feature") + b1).tanh()
        return ((h.contract(w2, "hidden") - y) ** 2.0).mean(("batch", "out"))

    specs = [
        spec(f32, batch=16 * size, feature=32),
        spec(f32, batch=16 * size, out=8),
        spec(f32, feature=32, hidden=64),
        spec(f32, hidden=64),
        spec(f32, hidden=64, out=8),
    ]
    whole = accy.gradient.value_and_grad(accy.trace.define("mlp", specs, mlp_loss), (2, 3, 4))
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(t.extents).astype(np.float32) for t in specs]
    want = accy.reference.run(whole, arrays)
    for name, mapping in (("dp", {"batch": "data"}), ("fsdp", {"batch": "data", "hidden": "data"})):
        sharded = shard_program(whole, mesh, mapping)
        executable = NcclExecutable(sharded, distributed)
        outputs = executable(*executable.local_inputs(arrays))
        for i, (out, t, s) in enumerate(
            zip(outputs, whole.output_types, sharded.output_shardings, strict=True)
        ):
            check(f"{name} output {i}", out, want[i][sharded.block(me, t, s)], tol=1e-4)

    distributed.store.close()
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"rank {me}: every collective and sharded program matches")


if __name__ == "__main__":
    main()
