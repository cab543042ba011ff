"""NumPy stand-ins for `cupy` and `cupy.cuda.nccl`, for running `accy.mesh.nccl` with one thread
per rank on a CPU: arrays are NumPy arrays with CuPy's `.data.ptr`, and the communicators move
bytes between those pointers with ctypes. The calls take what CuPy 14's take (the unique id as
bytes, counts in elements of the NCCL type, pointers as integers), so a wrong count, pointer,
type or peer in `accy.mesh.nccl` shows here as it would on GPUs."""

from __future__ import annotations

import ctypes
import os
import threading
from collections import defaultdict, deque
from types import SimpleNamespace

import ml_dtypes
import numpy as np


class DeviceArray(np.ndarray):
    """A NumPy array that answers `.data.ptr`, as a CuPy array does."""

    @property
    def data(self):  # type: ignore[override]
        return SimpleNamespace(ptr=self.ctypes.data)


def _wrap(x):
    return np.asarray(x).view(DeviceArray)


def _asarray(x):
    return _wrap(np.asarray(x, order="C"))


def _contiguous(x):
    """C order and at least 1-d: CuPy's ascontiguousarray, like NumPy's, makes a 0-d array 1-d
    (seen on the GPU machine with CuPy 14)."""
    return _wrap(np.ascontiguousarray(x))


def _stream():
    return SimpleNamespace(ptr=0, synchronize=lambda: None)


cupy = SimpleNamespace(
    asarray=_asarray,
    ascontiguousarray=_contiguous,
    empty=lambda shape, dtype: _wrap(np.full(shape, 7, dtype)),  # garbage, not zeros
    empty_like=lambda x: _wrap(np.full(x.shape, 7, x.dtype)),
    zeros_like=lambda x: _wrap(np.zeros_like(x)),
    moveaxis=lambda x, a, b: _wrap(np.moveaxis(x, a, b)),
    split=lambda x, n, axis: [_wrap(b) for b in np.split(x, n, axis=axis)],
    concatenate=lambda xs, axis: _wrap(np.concatenate(xs, axis=axis)),
    cuda=SimpleNamespace(
        get_current_stream=_stream,
        runtime=SimpleNamespace(getDeviceCount=lambda: 1),
        Device=lambda ordinal: SimpleNamespace(use=lambda: None, synchronize=lambda: None),
    ),
)

TYPES = {
    0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
    6: np.float16, 7: np.float32, 8: np.float64, 9: ml_dtypes.bfloat16,
}  # fmt: skip


def _read(pointer: int, count: int, datatype: int) -> np.ndarray:
    dtype = np.dtype(TYPES[datatype])
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(pointer)
    return np.frombuffer(raw, dtype).copy()


def _write(pointer: int, values: np.ndarray) -> None:
    values = np.ascontiguousarray(values)
    ctypes.memmove(pointer, values.ctypes.data, values.nbytes)


class _Group:
    def __init__(self, size: int):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=60)
        self.slots: list = [None] * size
        self.mail: dict = defaultdict(deque)
        self.mail_changed = threading.Condition()


class FakeNccl:
    """The module `cupy.cuda.nccl`, for ranks that are threads of one process."""

    NCCL_SUM = 0
    NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = range(6)
    NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16 = 6, 7, 8, 9
    available = True

    def __init__(self) -> None:
        self.groups: dict[bytes, _Group] = {}
        self.lock = threading.Lock()
        self.pending = threading.local()
        self.calls: list[str] = []

    def get_unique_id(self) -> bytes:
        return os.urandom(128)

    def NcclCommunicator(self, size: int, unique_id: bytes, rank: int):  # noqa: N802
        if not isinstance(unique_id, bytes) or len(unique_id) != 128:
            raise TypeError(f"commId must be 128 bytes (CuPy 14), got {type(unique_id)}")
        with self.lock:
            group = self.groups.setdefault(unique_id, _Group(size))
        if group.size != size or not 0 <= rank < size:
            raise ValueError(f"rank {rank} of {size} in a group of {group.size}")
        return _Communicator(self, group, rank)

    def groupStart(self) -> None:  # noqa: N802
        self.pending.receives = []

    def groupEnd(self) -> None:  # noqa: N802
        for communicator, pointer, count, datatype, peer in self.pending.receives:
            communicator._receive(pointer, count, datatype, peer)
        self.pending.receives = None


class _Communicator:
    def __init__(self, nccl: FakeNccl, group: _Group, rank: int):
        self.nccl, self.group, self.rank = nccl, group, rank

    def _all(self, values: np.ndarray) -> list[np.ndarray]:
        """Every rank's `values`, by rank (two barriers: all deposited, all read)."""
        g = self.group
        g.slots[self.rank] = values
        g.barrier.wait()
        every = list(g.slots)
        g.barrier.wait()
        return every

    def allReduce(self, send, receive, count, datatype, op, stream):  # noqa: N802
        assert op == FakeNccl.NCCL_SUM
        every = self._all(_read(send, count, datatype))
        total = np.sum([v.astype(np.float64) for v in every], axis=0)
        _write(receive, total.astype(TYPES[datatype]))

    def allGather(self, send, receive, count, datatype, stream):  # noqa: N802
        _write(receive, np.concatenate(self._all(_read(send, count, datatype))))

    def reduceScatter(self, send, receive, count, datatype, op, stream):  # noqa: N802
        assert op == FakeNccl.NCCL_SUM
        every = self._all(_read(send, count * self.group.size, datatype))
        total = np.sum([v.astype(np.float64) for v in every], axis=0)
        mine = total[self.rank * count : (self.rank + 1) * count]
        _write(receive, mine.astype(TYPES[datatype]))

    def send(self, pointer, count, datatype, peer, stream):
        assert self.nccl.pending.receives is not None, "send outside groupStart/groupEnd"
        g = self.group
        with g.mail_changed:
            g.mail[(self.rank, peer)].append(_read(pointer, count, datatype))
            g.mail_changed.notify_all()

    def recv(self, pointer, count, datatype, peer, stream):
        assert self.nccl.pending.receives is not None, "recv outside groupStart/groupEnd"
        self.nccl.pending.receives.append((self, pointer, count, datatype, peer))

    def _receive(self, pointer, count, datatype, peer):
        g = self.group
        with g.mail_changed:
            if not g.mail_changed.wait_for(lambda: g.mail[(peer, self.rank)], timeout=60):
                raise TimeoutError(f"rank {self.rank} waited for a send from {peer}")
            values = g.mail[(peer, self.rank)].popleft()
        if values.size != count or values.dtype != TYPES[datatype]:
            raise ValueError(f"recv of {count} x {datatype}, but {values.size} were sent")
        _write(pointer, values)

    def destroy(self) -> None:
        pass
