"""Several GPUs: one process per GPU, the per-device program's collectives through NCCL.

`Distributed(mesh)` sets up this process: its rank from the launcher's variables, its GPU
`LOCAL_RANK` (the only one it keeps visible), one NCCL communicator per mesh axis (the devices
of this rank's group along it, built from an id shared through the bootstrap store).

`NcclExecutable(sharded, distributed)` runs the per-device program of a `ShardedProgram`, called
with this device's arrays (its blocks) and returning this device's outputs (CuPy arrays);
`local_inputs` cuts them from whole arrays. Two ways (`mode`):

- "graph" (the default on GPUs): `accy.mesh.graph` rewrites the collectives into NCCL library
  steps and the CUDA backend compiles the whole program, so a call is ONE CUDA graph launch:
  kernels, GEMMs and NCCL calls captured together, gradient psums in ~25 MiB buckets on a second
  stream that overlaps the backward pass (`bucket_bytes`, `ACCY_NCCL_BUCKET_MB`; 0: no
  overlap).
- "segments" (the fallback): the program is cut at its collectives (`accy.mesh.segments`);
  every segment is compiled by the backend of `distributed.segment_device` (one CUDA graph per
  segment on the current CuPy stream) and every collective is an NCCL call enqueued on that same
  stream from Python between them. Used when `graph=False` or `ACCY_NCCL_GRAPH=0`, when the
  segments are not CUDA (the CPU stand-ins of the tests), and for programs the graph cannot hold
  (`accy.mesh.graph.in_graph_reason`: a collective in a loop body, or a program of
  collectives only, where calling NCCL on the caller's arrays saves the copies a graph's fixed
  addresses need). `reason` says why.

NCCL needs its operand contiguous with the gathered or scattered axis first: an axis elsewhere
is moved first and back (a copy each way); the sharding keeps batch axes first where it can.
Sums (`psum`, `reduce_scatter`) go in the NCCL type of the value's accy dtype (bf16 as
`ncclBfloat16`, whatever array type holds it); collectives that only move data (`all_gather`,
`all_to_all`, `ppermute`) move bytes, so every dtype travels, booleans included.

The NCCL unique id crosses the bootstrap store as 128 unsigned bytes; CuPy 14 takes it back as
`bytes`, CuPy 13 and older as a tuple of signed chars (`communicator` accepts either).

CuPy (`cupy.cuda.nccl`) is imported only here, when a `Distributed` is made.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..api import compile as compile_program
from ..backends.cuda.collectives import (
    NCCL_SUM_TYPES,
    CommunicatorGroup,
    register_group,
    sum_type_name,
    unregister_group,
)
from ..backends.cuda.executable import CudaExecutable, DonatingCudaExecutable
from ..backends.devices import Device, as_device
from ..config import config
from ..core import Program
from ..core.types import TensorType
from ..errors import MeshError, RuntimeUnavailable
from .bootstrap import Environment, Store, share_ids
from .executable import check_mesh_attrs
from .graph import GraphPlan, bucket_bytes_from_env, compile_for_cuda, in_graph_reason
from .mesh import Mesh
from .segments import MeshStep, Segment, split_program
from .spmd import ShardedProgram


def unsigned_id(raw: Any) -> list[int]:
    """An NCCL unique id as 128 numbers 0..255, whether CuPy gave bytes (CuPy 14) or a tuple of
    signed chars (CuPy 13): what the bootstrap store carries.

    >>> unsigned_id(bytes([1, 255])), unsigned_id((1, -1))
    ([1, 255], [1, 255])
    """
    return [int(b) % 256 for b in raw]


def _contiguous(cupy: Any, x: Any) -> Any:
    """`x` in C order with its shape: `ascontiguousarray` alone makes a 0-d array (a scalar
    loss) 1-d, as NumPy's does."""
    return cupy.ascontiguousarray(x).reshape(x.shape)


def communicator(nccl: Any, size: int, unique_id: Sequence[int], rank: int) -> Any:
    """`nccl.NcclCommunicator(size, id, rank)` with the id in the form this CuPy takes: bytes
    (CuPy 14), else a tuple of signed chars (CuPy 13 and older refuse bytes with a TypeError,
    before NCCL is called)."""
    try:
        return nccl.NcclCommunicator(size, bytes(unique_id), rank)
    except TypeError:
        signed = tuple(b - 256 if b > 127 else b for b in unique_id)
        return nccl.NcclCommunicator(size, signed, rank)


def pin_one_gpu(local_rank: int, environ: dict[str, str] | None = None) -> str:
    """Keep only this process's GPU visible (CUDA_VISIBLE_DEVICES, read when CUDA starts): the
    `local_rank`-th of those visible now. Returns the value set.

    >>> pin_one_gpu(1, {"CUDA_VISIBLE_DEVICES": "4,5,6"})
    '5'
    """
    visible = (config.environment if environ is None else environ.get)("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(local_rank + 1)]
    if len(devices) == 1 and visible:
        return visible  # already one GPU per process (set by the launcher or the user)
    if local_rank >= len(devices):
        raise MeshError(
            f"LOCAL_RANK {local_rank}, but CUDA_VISIBLE_DEVICES={visible!r} lists "
            f"{len(devices)} GPUs"
        )
    if environ is None:
        config.set_environment("CUDA_VISIBLE_DEVICES", devices[local_rank])
    else:
        environ["CUDA_VISIBLE_DEVICES"] = devices[local_rank]
    return devices[local_rank]


def _import_nccl():
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as error:  # CuPy absent, or built without NCCL
        raise RuntimeUnavailable(
            f"several GPUs need CuPy with NCCL (pip install cupy-cuda13x): {error}"
        ) from error
    if not getattr(nccl, "available", True):
        raise RuntimeUnavailable("CuPy was built without NCCL: several GPUs need it")
    return cupy, nccl


class Distributed:
    """This process's GPU and its NCCL communicators, one per mesh axis (see the module
    docstring). `mesh` has one device per process, in rank order. `modules` replaces
    `(cupy, cupy.cuda.nccl)` and `segment_device` the backend the segments between collectives
    are compiled for: tests pass NumPy stand-ins that run ranks as threads, and "cpu" (then no
    GPU is pinned)."""

    def __init__(
        self,
        mesh: Mesh,
        env: Environment | None = None,
        store: Store | None = None,
        *,
        modules: tuple[Any, Any] | None = None,
        segment_device: str | Device = "cuda",
    ):
        self.segment_device = as_device(segment_device)
        self.env = env or Environment.from_env()
        if mesh.size != self.env.world_size:
            raise MeshError(
                f"the mesh has {mesh.size} devices but {self.env.world_size} processes were "
                "started: one process per device (accy launch --gpus N)"
            )
        if modules is None:
            pin_one_gpu(self.env.local_rank)
        self.cupy, self.nccl = modules or _import_nccl()
        if self.cupy.cuda.runtime.getDeviceCount() != 1:
            raise MeshError(
                "this process sees several GPUs: make Distributed(...) before anything uses CUDA "
                "(it then keeps only GPU LOCAL_RANK visible), or set CUDA_VISIBLE_DEVICES to one "
                "GPU per process; accy's CUDA backend runs on the process's GPU 0"
            )
        self.mesh = mesh
        self.rank = self.env.rank
        self.cupy.cuda.Device(0).use()
        self.store = store or Store.connect(self.env)
        ids = share_ids(self.store, mesh, self.rank, lambda: unsigned_id(self.nccl.get_unique_id()))
        self.communicators = {}
        for mesh_axis in mesh.axis_names:  # the same order on every rank: no deadlock
            group = mesh.group(self.rank, mesh_axis)
            self.communicators[mesh_axis] = communicator(
                self.nccl, len(group), ids[mesh_axis], group.index(self.rank)
            )
        self.store.barrier("communicators")
        # NCCL steps inside CUDA graphs find the communicators under this number.
        self.group = register_group(CommunicatorGroup(self.cupy, self.nccl, self.communicators))
        self.executables: weakref.WeakSet = weakref.WeakSet()  # whose graphs `close` releases

    def position(self, mesh_axis: str) -> int:
        return self.mesh.coordinates(self.rank)[mesh_axis]

    def close(self) -> None:
        """Wait for the GPU, free the communicators and leave the store (rank 0, which serves
        it, waits for every rank): call once at the end of a run, on every rank. The CUDA
        graphs of this process's executables go first: NCCL does not free a communicator while
        a graph holds calls to it (`ncclCommDestroy` would wait forever)."""
        self.cupy.cuda.Device(0).synchronize()
        for executable in list(self.executables):
            executable.release_graphs()
        unregister_group(self.group)
        for comm in self.communicators.values():
            comm.destroy()
        self.communicators = {}
        self.store.close()

    def sum_type(self, t: TensorType, kind: str) -> int:
        """The NCCL type that sums values of `t` (a MeshError for a dtype NCCL cannot add)."""
        name = sum_type_name(t.dtype.name)
        if name is None:
            raise MeshError(
                f"{kind} over NCCL: NCCL cannot add {t.dtype} values; sums need a float or "
                f"integer dtype ({', '.join(sorted(NCCL_SUM_TYPES))})"
            )
        return getattr(self.nccl, name)

    # -- the collectives, on `stream` -----------------------------------------------------------

    def psum(self, x: Any, attrs, stream: Any, t: TensorType) -> Any:
        x = _contiguous(self.cupy, x)
        out = self.cupy.empty_like(x)
        self.communicators[attrs["mesh_axis"]].allReduce(
            x.data.ptr, out.data.ptr, x.size, self.sum_type(t, "psum"), self.nccl.NCCL_SUM,
            stream.ptr,
        )  # fmt: skip
        return out

    def psums(self, items: Sequence[tuple[Any, Any, TensorType]], stream: Any) -> list[Any]:
        """Several independent psums ((x, attrs, type) each) as one NCCL group: NCCL issues
        them together (a data-parallel step's gradients: one launch, not one per parameter).
        The operands stay referenced here until the group is issued."""
        if len(items) == 1:
            x, attrs, t = items[0]
            return [self.psum(x, attrs, stream, t)]
        operands = [_contiguous(self.cupy, x) for x, _, _ in items]
        outs = [self.cupy.empty_like(x) for x in operands]
        self.nccl.groupStart()
        try:
            for x, out, (_, attrs, t) in zip(operands, outs, items, strict=True):
                self.communicators[attrs["mesh_axis"]].allReduce(
                    x.data.ptr, out.data.ptr, x.size, self.sum_type(t, "psum"),
                    self.nccl.NCCL_SUM, stream.ptr,
                )  # fmt: skip
        finally:
            self.nccl.groupEnd()
        return outs

    def all_gather(self, x: Any, attrs, stream: Any, position: int) -> Any:
        cupy, size = self.cupy, attrs["size"]
        front = cupy.ascontiguousarray(cupy.moveaxis(x, position, 0))
        out = cupy.empty((size * front.shape[0], *front.shape[1:]), front.dtype)
        self.communicators[attrs["mesh_axis"]].allGather(
            front.data.ptr, out.data.ptr, front.nbytes, self.nccl.NCCL_UINT8, stream.ptr
        )
        return cupy.ascontiguousarray(cupy.moveaxis(out, 0, position))

    def reduce_scatter(self, x: Any, attrs, stream: Any, position: int, t: TensorType) -> Any:
        cupy, size = self.cupy, attrs["size"]
        front = cupy.ascontiguousarray(cupy.moveaxis(x, position, 0))
        out = cupy.empty((front.shape[0] // size, *front.shape[1:]), front.dtype)
        self.communicators[attrs["mesh_axis"]].reduceScatter(
            front.data.ptr, out.data.ptr, out.size, self.sum_type(t, "reduce_scatter"),
            self.nccl.NCCL_SUM, stream.ptr,
        )  # fmt: skip
        return cupy.ascontiguousarray(cupy.moveaxis(out, 0, position))

    def all_to_all(self, x: Any, attrs, stream: Any, split: int, concat: int) -> Any:
        """Block j of the split axis to position j, by grouped sends and receives (bytes)."""
        cupy, size, uint8 = self.cupy, attrs["size"], self.nccl.NCCL_UINT8
        communicator = self.communicators[attrs["mesh_axis"]]
        blocks = [cupy.ascontiguousarray(b) for b in cupy.split(x, size, axis=split)]
        received = [cupy.empty_like(b) for b in blocks]
        self.nccl.groupStart()
        for peer in range(size):
            communicator.send(blocks[peer].data.ptr, blocks[peer].nbytes, uint8, peer, stream.ptr)
            communicator.recv(
                received[peer].data.ptr, received[peer].nbytes, uint8, peer, stream.ptr
            )
        self.nccl.groupEnd()
        return cupy.concatenate(received, axis=concat)

    def ppermute(self, x: Any, attrs, stream: Any) -> Any:
        me = self.position(attrs["mesh_axis"])
        communicator = self.communicators[attrs["mesh_axis"]]
        x = _contiguous(self.cupy, x)
        out = self.cupy.zeros_like(x)  # a device no one sends to gets zeros
        uint8 = self.nccl.NCCL_UINT8
        self.nccl.groupStart()
        for source, destination in attrs["perm"]:
            if source == me:
                communicator.send(x.data.ptr, x.nbytes, uint8, destination, stream.ptr)
            if destination == me:
                communicator.recv(out.data.ptr, out.nbytes, uint8, source, stream.ptr)
        self.nccl.groupEnd()
        return out


class NcclExecutable:
    """The per-device program of `sharded` on this process's GPU (see the module docstring).
    `precision` is the CUDA backend's ("f32", or "tf32" for TF32 f32 GEMMs); `graph` chooses
    the mode (None: "graph" where it can run, else "segments"; True: "graph" or a MeshError
    saying why not; False: "segments"); `bucket_bytes` the gradient buckets' size in "graph"
    mode (None: `ACCY_NCCL_BUCKET_MB`, default 25 MiB; 0: no buckets, no overlap)."""

    def __init__(
        self,
        program: ShardedProgram | Program,
        distributed: Distributed,
        *,
        precision: str = "f32",
        graph: bool | None = None,
        bucket_bytes: int | None = None,
        donate: Sequence[int] = (),
    ):
        sharded = program if isinstance(program, ShardedProgram) else None
        if sharded is not None and sharded.mesh != distributed.mesh:
            raise MeshError("NcclExecutable: the program was sharded for another mesh")
        self.sharded, self.distributed = sharded, distributed
        self.program = sharded.program if sharded is not None else program
        for op in self.program.operations:
            if "mesh_axis" in op.attrs:
                check_mesh_attrs(distributed.mesh, op)
        self.reason = self._segments_reason(graph)
        self.mode = "segments" if self.reason else "graph"
        self.plan: GraphPlan | None = None
        self._positions: dict[str, Any] = {}
        if self.mode == "graph":
            positions = {a: distributed.position(a) for a in distributed.mesh.axis_names}
            if bucket_bytes is None:
                bucket_bytes = bucket_bytes_from_env()
            self.plan, artifact = compile_for_cuda(
                self.program, positions, distributed.group, bucket_bytes
            )
            # Loading warms every NCCL step up, outside any capture (the same on every rank).
            loaded = CudaExecutable(artifact, 0, precision)
            self.fragment = loaded.fragment
            self.executable = DonatingCudaExecutable(loaded, donate) if donate else loaded
            distributed.executables.add(self)
            return
        self.steps = split_program(self.program)
        self.compiled = {
            id(s): compile_program(s.program, distributed.segment_device, precision=precision)
            for s in self.steps
            if isinstance(s, Segment)
        }

    def release_graphs(self) -> None:
        """Destroy the CUDA graph of this executable's step ("graph" mode; see
        `Distributed.close`)."""
        if self.mode == "graph":
            self.fragment.release_graphs()

    def _segments_reason(self, graph: bool | None) -> str | None:
        """Why this executable runs segments (None: it runs one graph)."""
        if graph is False or (graph is None and not config.nccl_graph):
            reason = "turned off (graph=False or ACCY_NCCL_GRAPH=0)"
        elif not self.distributed.segment_device.is_cuda:
            reason = f"the segments run on '{self.distributed.segment_device}', not CUDA"
        else:
            reason = in_graph_reason(self.program)
        if reason is not None and graph is True:
            raise MeshError(
                f"NcclExecutable(graph=True): program {self.program.name!r} cannot run as one "
                f"CUDA graph: {reason}; pass graph=None to fall back to segments"
            )
        return reason

    def local_inputs(self, arrays: Sequence[Any]) -> list[Any]:
        """This device's blocks of whole arrays (one per parameter of the source program)."""
        if self.sharded is None:
            raise MeshError("local_inputs: this executable runs a per-device program as it is")
        return self.sharded.local(self.distributed.rank, arrays)

    def __call__(self, *arrays: Any) -> list[Any]:
        if self.mode == "graph":
            return list(self.executable(*arrays))
        cupy = self.distributed.cupy
        stream = cupy.cuda.get_current_stream()
        env = {v: cupy.asarray(a) for v, a in zip(self.program.parameters, arrays, strict=True)}
        psums: list[MeshStep] = []  # independent psums side by side: issued as one group
        for step in self.steps:
            if isinstance(step, MeshStep) and step.op.kind == "psum":
                if any(step.op.operands[0] in p.op.results for p in psums):
                    self._psums(psums, env, stream)
                psums.append(step)
                continue
            self._psums(psums, env, stream)
            if isinstance(step, MeshStep):
                env[step.op.results[0]] = self._collective(step, env, stream)
            else:
                outputs = self.compiled[id(step)](*[env[v] for v in step.inputs])
                env.update(zip(step.outputs, map(cupy.asarray, outputs), strict=True))
        self._psums(psums, env, stream)
        return [env[v] for v in self.program.outputs]

    def _psums(self, steps: list[MeshStep], env: dict[int, Any], stream: Any) -> None:
        """Issue the pending psums (one NCCL group) and forget them."""
        if not steps:
            return
        items = [(env[s.op.operands[0]], s.op.attrs, s.op.operand_types[0]) for s in steps]
        results = self.distributed.psums(items, stream)
        env.update((s.op.results[0], r) for s, r in zip(steps, results, strict=True))
        steps.clear()

    def _collective(self, step: MeshStep, env: dict[int, Any], stream: Any) -> Any:
        op, d = step.op, self.distributed
        if op.kind == "axis_index":
            axis = op.attrs["mesh_axis"]
            if axis not in self._positions:  # uploaded once
                self._positions[axis] = d.cupy.asarray(np.int32(d.position(axis)))
            return self._positions[axis]
        x = env[op.operands[0]]
        t = op.operand_types[0]
        if op.kind == "psum":
            return d.psum(x, op.attrs, stream, t)
        if op.kind == "all_gather":
            return d.all_gather(x, op.attrs, stream, t.position(op.attrs["axis"]))
        if op.kind == "reduce_scatter":
            return d.reduce_scatter(x, op.attrs, stream, t.position(op.attrs["axis"]), t)
        if op.kind == "all_to_all":
            split, concat = t.position(op.attrs["split_axis"]), t.position(op.attrs["concat_axis"])
            return d.all_to_all(x, op.attrs, stream, split, concat)
        return d.ppermute(x, op.attrs, stream)


__all__ = ["Distributed", "NcclExecutable", "communicator", "pin_one_gpu", "unsigned_id"]
