"""`accy.mesh.nccl` with ranks as threads and NumPy stand-ins for CuPy and NCCL (fake_nccl):
the bootstrap, the NCCL unique ids, every collective's pointers, counts, types and peers, and
the sharded gradient programs, checked on the CPU by the same checks the GPUs run."""

from __future__ import annotations

import threading

import pytest

from accy.errors import MeshError
from accy.mesh import Mesh
from accy.mesh.bootstrap import Environment, Store
from accy.mesh.nccl import Distributed, communicator, unsigned_id

from .fake_nccl import FakeNccl, cupy
from .nccl_checks import run_checks

SECRET = "the secret of the simulated job"


def run_ranks(size: int, body) -> list:
    """`body(distributed)` on `size` ranks (threads), each with its Distributed; the results."""
    nccl = FakeNccl()
    mesh = Mesh(range(size), "data")
    first = Store.connect(Environment(0, size, 0, "127.0.0.1", 0, SECRET), timeout=60)
    port = first.server.server_address[1]
    results: list = [None] * size
    lock = threading.Lock()

    def rank(r: int) -> None:
        env = Environment(r, size, r, "127.0.0.1", port, SECRET)
        store = first if r == 0 else Store.connect(env, timeout=60)
        try:
            distributed = Distributed(mesh, env, store, modules=(cupy, nccl), segment_device="cpu")
            results[r] = body(distributed, lock)
            distributed.close()
        except Exception as error:  # noqa: BLE001 - the test reports it
            results[r] = error

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 3])
def test_every_collective_and_sharded_program_through_simulated_nccl(size):
    results = run_ranks(size, lambda d, lock: run_checks(d, lock=lock))
    for r, result in enumerate(results):
        assert not isinstance(result, Exception), f"rank {r}: {result!r}"
        assert result == [], "\n".join(result)


def test_unique_ids_cross_the_store_as_unsigned_bytes_for_either_cupy():
    raw = bytes(range(256))[:128]
    assert unsigned_id(raw) == list(raw)
    signed = tuple(b - 256 if b > 127 else b for b in raw)  # CuPy 13's tuple of chars
    assert unsigned_id(signed) == list(raw)

    class OldNccl:  # CuPy 13: the id only as a tuple
        @staticmethod
        def NcclCommunicator(size, unique_id, rank):  # noqa: N802
            if not isinstance(unique_id, tuple):
                raise TypeError("expected tuple")
            return unique_id

    assert communicator(OldNccl, 2, list(raw), 0) == signed
    assert communicator(FakeNccl(), 1, list(raw), 0).rank == 0


def test_a_mesh_of_other_size_than_the_processes_is_an_error():
    with pytest.raises(MeshError, match="one process per device"):
        Distributed(Mesh(range(2), "data"), Environment(0, 3, 0), modules=(cupy, FakeNccl()))


def test_a_sum_of_a_dtype_nccl_cannot_add_is_an_error_naming_those_it_can():
    # The type rules refuse boolean psums before this; the NCCL layer still says it plainly.
    from accy import spec
    from accy.core.types import bool_

    def body(distributed, lock):
        with pytest.raises(MeshError, match="NCCL cannot add bool.*f32"):
            distributed.sum_type(spec(bool_, n=2), "psum")
        return True

    assert run_ranks(1, body) == [True]


def test_a_data_parallel_step_is_two_segments_around_its_psums_side_by_side():
    import accy
    from accy import f32, spec
    from accy.mesh import shard_program, split_program
    from accy.mesh.segments import MeshStep

    def loss(b, a):
        x, w1, w2 = a
        return (x.contract(w1, "feature").tanh().contract(w2, "hidden") ** 2.0).mean("batch")

    specs = [spec(f32, batch=8, feature=4), spec(f32, feature=4, hidden=6), spec(f32, hidden=6)]
    grads = accy.gradient.value_and_grad(accy.trace.define("mlp", specs, loss), (1, 2))

    def step(b, a):  # the SGD update of each parameter reads its psum-med gradient
        value, g1, g2 = b.call(grads, a)
        return value, a[1] - g1 * 0.1, a[2] - g2 * 0.1

    program = accy.trace.define("train", specs, step)
    steps = split_program(shard_program(program, Mesh(range(2), "data"), {"batch": "data"}).program)
    kinds = [s.op.kind if isinstance(s, MeshStep) else "segment" for s in steps]
    assert kinds == ["segment", "psum", "psum", "psum", "segment"]


def test_the_executable_says_which_way_it_runs_and_refuses_a_graph_it_cannot_build():
    import accy
    from accy import f32, spec
    from accy.backends.cuda.collectives import registered_group
    from accy.mesh.nccl import NcclExecutable

    attrs = {"mesh_axis": "data", "size": 1}
    program = accy.trace.define(
        "twice", [spec(f32, n=2)], lambda b, a: b.emit("psum", [a[0] * 2.0], attrs)
    )

    def body(distributed, lock):
        assert registered_group(distributed.group).communicators is distributed.communicators
        run = NcclExecutable(program, distributed)  # CPU segments: no graph
        assert run.mode == "segments" and "'cpu', not CUDA" in run.reason
        with pytest.raises(MeshError, match=r"graph=True\): program 'twice' cannot run as one"):
            NcclExecutable(program, distributed, graph=True)
        return distributed.group

    (group,) = run_ranks(1, body)
    with pytest.raises(accy.errors.RuntimeUnavailable, match=f"group {group} is closed"):
        registered_group(group)  # Distributed.close() unregistered it


def test_accy_nccl_graph_0_turns_the_graph_off(configure):
    import accy
    from accy import f32, spec
    from accy.mesh.nccl import NcclExecutable

    configure(nccl_graph=False)
    program = accy.trace.define(
        "twice",
        [spec(f32, n=2)],
        lambda b, a: b.emit("psum", [a[0] * 2.0], {"mesh_axis": "data", "size": 1}),
    )
    reasons = run_ranks(1, lambda d, lock: NcclExecutable(program, d).reason)
    assert reasons == ["turned off (graph=False or ACCY_NCCL_GRAPH=0)"]


def test_close_releases_the_graphs_holding_nccl_calls_before_the_communicators():
    """ncclCommDestroy waits until every CUDA graph that captured calls to the communicator is
    destroyed: a data-parallel GPT-2 run hung in `close` while its step was still alive."""
    events: list[str] = []
    alive: list = []

    class GraphedExecutable:
        def release_graphs(self) -> None:
            events.append("graphs released")

    def body(distributed, lock):
        communicator = distributed.communicators["data"]
        destroy = communicator.destroy

        def recorded_destroy() -> None:
            events.append("communicator destroyed")
            destroy()

        communicator.destroy = recorded_destroy
        alive.append(GraphedExecutable())  # still referenced when close() runs
        distributed.executables.add(alive[-1])
        return True

    assert run_ranks(1, body) == [True]
    assert events == ["graphs released", "communicator destroyed"]
