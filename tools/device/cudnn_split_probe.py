"""Does cuDNN's attention backward get faster when one long head's queries are cut into
chunks that act as heads sharing one key/value head (grouped-query attention)? The `attention`
workload's shape: one head of 2048 tokens, dim 64, a bf16 bias over (token, key), bf16. For
each chunk count c (1 = as accy runs it today): forward and backward graph-replay times, and the
largest difference of o, dq, dk, dv from c = 1 on the same random data.

    PYTHONPATH=src:/tmp/site python3 tools/device/cudnn_split_probe.py
"""

from __future__ import annotations

import cupy
import ml_dtypes
import numpy as np

from accy.kernel.cudnn import handle, module

TOKENS, DIM = 2048, 64


def build(cudnn, h, part: str, c: int):
    io, f32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
    graph = cudnn.pygraph(
        io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, handle=h
    )
    rows = TOKENS // c
    qd, qs = [1, c, rows, DIM], [TOKENS * DIM, rows * DIM, DIM, 1]
    kd, ks = [1, 1, TOKENS, DIM], [TOKENS * DIM, TOKENS * DIM, DIM, 1]
    t = {
        "q": graph.tensor(name="q", dim=qd, stride=qs, data_type=io),
        "k": graph.tensor(name="k", dim=kd, stride=ks, data_type=io),
        "v": graph.tensor(name="v", dim=kd, stride=ks, data_type=io),
        "bias": graph.tensor(
            name="bias",
            dim=[1, c, rows, TOKENS],
            stride=[TOKENS * TOKENS, rows * TOKENS, TOKENS, 1],
            data_type=io,
        ),
    }
    sd, ss = [1, c, rows, 1], [TOKENS, rows, 1, 1]
    common = dict(attn_scale=1.0, bias=t["bias"])
    if part == "forward":
        o, stats = graph.sdpa(
            name="sdpa", q=t["q"], k=t["k"], v=t["v"], generate_stats=True, **common
        )
        o.set_output(True).set_dim(qd).set_stride(qs).set_data_type(io)
        stats.set_output(True).set_dim(sd).set_stride(ss).set_data_type(f32)
        t |= {"o": o, "stats": stats}
    else:
        t["o"] = graph.tensor(name="o", dim=qd, stride=qs, data_type=io)
        t["do"] = graph.tensor(name="do", dim=qd, stride=qs, data_type=io)
        t["stats"] = graph.tensor(name="stats", dim=sd, stride=ss, data_type=f32)
        dq, dk, dv = graph.sdpa_backward(
            name="b", q=t["q"], k=t["k"], v=t["v"], o=t["o"], dO=t["do"], stats=t["stats"], **common
        )
        dq.set_output(True).set_dim(qd).set_stride(qs).set_data_type(io)
        dk.set_output(True).set_dim(kd).set_stride(ks).set_data_type(io)
        dv.set_output(True).set_dim(kd).set_stride(ks).set_data_type(io)
        t |= {"dq": dq, "dk": dk, "dv": dv}
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    return graph, t


def main() -> None:
    cudnn = module()
    h = handle(0)
    rng = np.random.default_rng(0)
    bf16 = ml_dtypes.bfloat16

    def array(shape, scale=1.0):
        return cupy.asarray((rng.standard_normal(shape) * scale).astype(bf16))

    q, k, v = (array((TOKENS, DIM), DIM**-0.25) for _ in range(3))
    mask = np.where(np.tril(np.ones((TOKENS, TOKENS), bool)), 0.0, -30.0).astype(bf16)
    bias, do = cupy.asarray(mask), array((TOKENS, DIM))
    results = {}
    stream = cupy.cuda.Stream(non_blocking=True)
    cudnn.set_stream(handle=h, stream=stream.ptr)
    for c in (1, 2, 4, 8, 16):
        row = {}
        try:
            fwd, tf = build(cudnn, h, "forward", c)
            bwd, tb = build(cudnn, h, "backward", c)
        except Exception as error:  # noqa: BLE001
            print(f"c={c}: not supported: {str(error)[:200]}")
            continue
        o = cupy.empty((TOKENS, DIM), bf16)
        stats = cupy.empty((TOKENS,), np.float32)
        dq, dk, dv = (cupy.empty((TOKENS, DIM), bf16) for _ in range(3))
        size = max(fwd.get_workspace_size(), bwd.get_workspace_size(), 1)
        workspace = cupy.empty(size, np.uint8)
        base = {"q": q, "k": k, "v": v, "bias": bias}
        pf = {int(tf[n].uid): x.data.ptr for n, x in (base | {"o": o, "stats": stats}).items()}
        extra = {"o": o, "do": do, "stats": stats, "dq": dq, "dk": dk, "dv": dv}
        pb = {int(tb[n].uid): x.data.ptr for n, x in (base | extra).items()}
        for name, graph, pack in (("forward", fwd, pf), ("backward", bwd, pb)):
            with stream:
                graph.execute(pack, workspace.data.ptr, handle=h)
                stream.synchronize()
                stream.begin_capture()
                graph.execute(pack, workspace.data.ptr, handle=h)
                captured = stream.end_capture()
                captured.launch(stream)
                start, stop = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(stream)
                for _ in range(100):
                    captured.launch(stream)
                stop.record(stream)
                stop.synchronize()
            row[name] = cupy.cuda.get_elapsed_time(start, stop) / 100 * 1e3
        outs = {
            n: cupy.asnumpy(x).astype(np.float32)
            for n, x in (("o", o), ("dq", dq), ("dk", dk), ("dv", dv))
        }
        results[c] = outs
        diff = (
            {n: float(np.abs(outs[n] - results[1][n]).max()) for n in outs} if 1 in results else {}
        )
        scale = {n: float(np.abs(results[1][n]).max()) for n in outs} if 1 in results else {}
        print(
            f"c={c:2d}: forward {row['forward']:6.1f} us, backward {row['backward']:6.1f} us; "
            + ", ".join(f"{n} diff {diff[n]:.3g} (max {scale[n]:.3g})" for n in diff)
        )


if __name__ == "__main__":
    main()
