"""Conditional nodes in a graph being captured, through the CUDA driver API (ctypes).

CuPy captures the schedule on a stream; a conditional node cannot be captured from a launch, so
it is added to the capturing graph by hand, as PyTorch's `CUDAGraph` does: read the stream's
capture graph and its current dependencies (`cuStreamGetCaptureInfo`), create a handle on that
graph, add the node after the dependencies (`cuGraphAddNode`), capture the node's body graph on
a second stream (`cuStreamBeginCaptureToGraph`), and make the node the capturing stream's one
dependency (`cuStreamUpdateCaptureDependencies`). Needs a driver for CUDA 12.4 or later.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_int, c_size_t, c_uint, c_uint64, c_void_p
from dataclasses import dataclass

from ...errors import AccyError, RuntimeUnavailable

NODE_TYPE_CONDITIONAL = 13  # CU_GRAPH_NODE_TYPE_CONDITIONAL
CONDITIONAL_TYPES = {"if": 0, "while": 1}  # CU_GRAPH_COND_TYPE_IF, _WHILE
CAPTURE_ACTIVE = 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE
CAPTURE_MODE_RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED
SET_DEPENDENCIES = 1  # CU_STREAM_SET_CAPTURE_DEPENDENCIES


class ConditionalParams(ctypes.Structure):
    """CUDA_CONDITIONAL_NODE_PARAMS (cuda.h, CUDA 12.4+): 32 bytes."""

    _fields_ = [
        ("handle", c_uint64),
        ("type", c_int),
        ("size", c_uint),
        ("graphs", POINTER(c_void_p)),  # phGraph_out: the body graphs, filled by the driver
        ("context", c_void_p),
    ]


class NodeParams(ctypes.Structure):
    """CUgraphNodeParams: a type, 12 reserved bytes, a 232-byte union, 8 reserved: 256 bytes."""

    _fields_ = [
        ("type", c_int),
        ("reserved0", c_int * 3),
        ("conditional", ConditionalParams),
        ("rest", ctypes.c_byte * (232 - ctypes.sizeof(ConditionalParams))),
        ("reserved2", ctypes.c_longlong),
    ]


SIGNATURES = {
    "cuCtxGetCurrent": [POINTER(c_void_p)],
    "cuStreamGetCaptureInfo_v3": [
        c_void_p,
        POINTER(c_int),
        POINTER(c_uint64),
        POINTER(c_void_p),
        POINTER(POINTER(c_void_p)),
        POINTER(c_void_p),
        POINTER(c_size_t),
    ],
    "cuGraphConditionalHandleCreate": [POINTER(c_uint64), c_void_p, c_void_p, c_uint, c_uint],
    "cuGraphAddNode_v2": [
        POINTER(c_void_p),
        c_void_p,
        POINTER(c_void_p),
        c_void_p,
        c_size_t,
        POINTER(NodeParams),
    ],
    "cuStreamBeginCaptureToGraph": [c_void_p, c_void_p, c_void_p, c_void_p, c_size_t, c_int],
    "cuStreamEndCapture": [c_void_p, POINTER(c_void_p)],
    "cuStreamUpdateCaptureDependencies_v2": [
        c_void_p,
        POINTER(c_void_p),
        c_void_p,
        c_size_t,
        c_uint,
    ],
}


@dataclass
class Capture:
    """Where a capturing stream stands: its graph and the nodes the next one will follow."""

    graph: int
    dependencies: list[int]


class Driver:
    """The few driver calls conditional nodes need (loaded once per process)."""

    _instance: Driver | None = None

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise RuntimeUnavailable(f"the CUDA driver library does not load: {error}") from None
        for name, arguments in SIGNATURES.items():
            try:
                function = getattr(self.lib, name)
            except AttributeError:
                raise RuntimeUnavailable(
                    f"this CUDA driver has no {name}: cond and while_loop on the GPU need "
                    "graph conditional nodes (a driver for CUDA 12.4 or later)"
                ) from None
            function.argtypes = arguments
            function.restype = c_int

    @classmethod
    def get(cls) -> Driver:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            raise AccyError(f"CUDA driver error {result} in {what} (building a conditional node)")

    def capture(self, stream: int) -> Capture:
        """The graph `stream` is capturing into and its current dependencies."""
        status, identifier, graph = c_int(), c_uint64(), c_void_p()
        nodes, edges, count = POINTER(c_void_p)(), c_void_p(), c_size_t()
        self._check(
            self.lib.cuStreamGetCaptureInfo_v3(
                stream, status, identifier, graph, nodes, edges, count
            ),
            "cuStreamGetCaptureInfo",
        )
        if status.value != CAPTURE_ACTIVE:
            raise AccyError("internal: a conditional node is added outside a graph capture")
        return Capture(graph.value, [nodes[i] for i in range(count.value)])

    def handle(self, graph: int) -> int:
        """A new conditional handle of `graph` (no default value: a kernel always sets it)."""
        context, handle = c_void_p(), c_uint64()
        self._check(self.lib.cuCtxGetCurrent(context), "cuCtxGetCurrent")
        self._check(
            self.lib.cuGraphConditionalHandleCreate(handle, graph, context, 0, 0),
            "cuGraphConditionalHandleCreate",
        )
        return handle.value

    def add_conditional(self, capture: Capture, kind: str, handle: int) -> tuple[int, int]:
        """Add a conditional node after the capture's dependencies: (node, its body graph)."""
        context = c_void_p()
        self._check(self.lib.cuCtxGetCurrent(context), "cuCtxGetCurrent")
        params = NodeParams()
        params.type = NODE_TYPE_CONDITIONAL
        params.conditional.handle = handle
        params.conditional.type = CONDITIONAL_TYPES[kind]
        params.conditional.size = 1
        params.conditional.context = context
        count = len(capture.dependencies)
        dependencies = (c_void_p * max(count, 1))(*capture.dependencies)
        node = c_void_p()
        self._check(
            self.lib.cuGraphAddNode_v2(node, capture.graph, dependencies, None, count, params),
            "cuGraphAddNode",
        )
        return node.value, params.conditional.graphs[0]

    def begin_capture_to(self, stream: int, graph: int) -> None:
        self._check(
            self.lib.cuStreamBeginCaptureToGraph(
                stream, graph, None, None, 0, CAPTURE_MODE_RELAXED
            ),
            "cuStreamBeginCaptureToGraph",
        )

    def end_capture(self, stream: int) -> None:
        graph = c_void_p()
        self._check(self.lib.cuStreamEndCapture(stream, graph), "cuStreamEndCapture")

    def follow(self, stream: int, node: int) -> None:
        """Make `node` the only dependency of what `stream` captures next."""
        nodes = (c_void_p * 1)(node)
        self._check(
            self.lib.cuStreamUpdateCaptureDependencies_v2(stream, nodes, None, 1, SET_DEPENDENCIES),
            "cuStreamUpdateCaptureDependencies",
        )


assert ctypes.sizeof(ConditionalParams) == 32 and ctypes.sizeof(NodeParams) == 256
