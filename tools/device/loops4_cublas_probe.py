"""Why did cuBLAS inside a CUDA graph conditional node fail to instantiate? (GPU only.)

A conditional node's body may hold only kernel, empty, child-graph, memset, memcpy and
conditional nodes (CUDA_CONDITIONAL_NODE_PARAMS in the driver API docs). This probe captures
one cuBLAS GEMM of each kind accy issues (cublasGemmEx, ...BatchedEx) on a stream, lists the
node types and edge ports (a non-zero `from_port` is a programmatic-dependent-launch edge) of
the captured graph, and then tries a cond program whose branch holds a cuBLAS GEMM, with
accy's "kernels inside conditionals" rule switched off, reporting whether it instantiates and
its values.

    PYTHONPATH=src python3 tools/device/loops4_cublas_probe.py
"""

from __future__ import annotations

import ctypes
import dataclasses
from ctypes import POINTER, c_int, c_size_t, c_void_p

import numpy as np

NODE_TYPES = {
    0: "kernel",
    1: "memcpy",
    2: "memset",
    3: "host",
    4: "graph",
    5: "empty",
    6: "wait_event",
    7: "event_record",
    8: "ext_semaphore_signal",
    9: "ext_semaphore_wait",
    10: "mem_alloc",
    11: "mem_free",
    12: "batch_mem_op",
    13: "conditional",
}


class EdgeData(ctypes.Structure):
    _fields_ = [
        ("from_port", ctypes.c_ubyte),
        ("to_port", ctypes.c_ubyte),
        ("type", ctypes.c_ubyte),
        ("reserved", ctypes.c_ubyte * 5),
    ]


def captured_graph_report(issue) -> str:
    """Capture `issue(stream_pointer)` into a graph; its node types and edge ports."""
    import cupy

    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuStreamBeginCapture_v2.argtypes = [c_void_p, c_int]
    lib.cuStreamEndCapture.argtypes = [c_void_p, POINTER(c_void_p)]
    lib.cuGraphGetNodes.argtypes = [c_void_p, POINTER(c_void_p), POINTER(c_size_t)]
    lib.cuGraphNodeGetType.argtypes = [c_void_p, POINTER(c_int)]
    lib.cuGraphGetEdges_v2.argtypes = [
        c_void_p,
        POINTER(c_void_p),
        POINTER(c_void_p),
        POINTER(EdgeData),
        POINTER(c_size_t),
    ]
    stream = cupy.cuda.Stream(non_blocking=True)
    assert lib.cuStreamBeginCapture_v2(stream.ptr, 2) == 0  # relaxed
    issue(stream.ptr)
    graph = c_void_p()
    assert lib.cuStreamEndCapture(stream.ptr, graph) == 0
    count = c_size_t()
    lib.cuGraphGetNodes(graph, None, count)
    nodes = (c_void_p * max(count.value, 1))()
    lib.cuGraphGetNodes(graph, nodes, count)
    types = []
    for i in range(count.value):
        kind = c_int()
        lib.cuGraphNodeGetType(nodes[i], kind)
        types.append(NODE_TYPES.get(kind.value, str(kind.value)))
    edges = c_size_t()
    lib.cuGraphGetEdges_v2(graph, None, None, None, edges)
    ports = []
    if edges.value:
        sources = (c_void_p * edges.value)()
        targets = (c_void_p * edges.value)()
        data = (EdgeData * edges.value)()
        lib.cuGraphGetEdges_v2(graph, sources, targets, data, edges)
        ports = [(d.from_port, d.to_port, d.type) for d in data]
    return f"nodes {types}, edges (from_port, to_port, type) {ports}"


def gemm_reports() -> list[str]:
    import cupy

    from accy.backends.cuda.runtime import Device
    from accy.backends.cuda.schedule import Address, Gemm

    device = Device.get(0)
    a, b, c = (cupy.ones((256, 256), np.float32) for _ in range(3))
    pointers = cupy.asarray(np.array([a.data.ptr, b.data.ptr, c.data.ptr], np.uint64))
    reports = []
    for name, arrays in (("cublasGemmEx 256x1x256", None), ("cublasGemmBatchedEx", 0)):
        g = Gemm("f32", 0, 0, 256, 1, 256, Address(-1), 256, Address(-1), 256, Address(-1), 256)

        def issue(stream, g=g, arrays=arrays):
            device.cublas.bind(stream)
            if arrays is None:
                device.cublas.gemm(g, a.data.ptr, b.data.ptr, c.data.ptr)
            else:
                p = pointers.data.ptr
                batched = dataclasses.replace(g, arrays=0)
                device.cublas.gemm(batched, p, p + 8, p + 16)

        try:
            reports.append(f"{name}: {captured_graph_report(issue)}")
        except Exception as error:  # noqa: BLE001 - a probe reports whatever happens
            reports.append(f"{name}: capture failed: {error!r}")
    return reports


def cond_with_cublas() -> str:
    """A cond whose branch is a 64x64 GEMM, cuBLAS allowed inside conditional bodies."""
    import cupy

    import accy
    from accy import f32, spec
    from accy.backends.cuda import compile_program
    from accy.backends.cuda.runtime import load
    from accy.backends.cuda.schedule import Conditional, Gemm
    from accy.backends.cuda.steps import dot

    def program(b, args):
        p, x, w = args
        return b.cond(
            p,
            lambda b, v: v[0].contract(v[1], "k"),
            lambda b, v: v[0].contract(v[1], "k") * 2.0,
            [x, w],
        )

    source = accy.trace.define(
        "cond_gemm", [spec(accy.bool_), spec(f32, m=64, k=64), spec(f32, k=64, n=64)], program
    )
    original = dot._by_cublas

    def allowing(ctx):
        inside, ctx.inside_conditional = ctx.inside_conditional, False
        try:
            return original(ctx)
        finally:
            ctx.inside_conditional = inside

    dot._by_cublas = allowing
    try:
        compiled = compile_program(source)
    finally:
        dot._by_cublas = original
    gemms = [
        a
        for node in compiled.schedule.actions
        if isinstance(node, Conditional)
        for a in node.body
        if isinstance(a, Gemm)
    ]
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2))
    out = cupy.empty((64, 64), np.float32)
    inputs = [cupy.asarray(np.array(True)), cupy.asarray(x), cupy.asarray(w)]
    try:
        fragment = load(compiled)
        fragment.run([int(v.data.ptr) for v in [*inputs, out]])
        cupy.cuda.get_current_stream().synchronize()
    except Exception as error:  # noqa: BLE001
        return f"cond with {len(gemms)} cuBLAS GEMMs in its branches: FAILED {error!r}"
    error = float(np.abs(cupy.asnumpy(out) - x @ w).max())
    return f"cond with {len(gemms)} cuBLAS GEMMs in its branches: ran, max error {error:.2e}"


def main() -> None:
    for line in gemm_reports():
        print("cublas-probe", line)
    print("cublas-probe", cond_with_cublas())


if __name__ == "__main__":
    main()
