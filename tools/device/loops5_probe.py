"""Which cuBLAS GEMMs instantiate and compute right inside CUDA graph conditional nodes? (GPU.)

For each result shape (rows x columns, contraction k), with the size rule of
`accy.backends.cuda.steps.dot.CONDITIONAL_GEMM_MIN` lifted so that cuBLAS is used whatever
the shape: (1) a cond whose true branch is the GEMM (IF node; fixed staged addresses, cublasGemmEx);
(2) a scan of 5 steps run as a WHILE node whose body is the GEMM plus tanh (pointer arrays in
the scan's region, cublasGemmBatchedEx); (3) a while_loop of 5 steps with the same body
(pointer arrays in pool tables). Each prints one line: instantiated and max error against
NumPy, or the error. The shapes go from the known-good to the one that failed in session 3
(1 x 1 x 3), so that a sticky error cannot hide the others.

    PYTHONPATH=src:. python3 tools/device/loops5_probe.py
"""

from __future__ import annotations

import numpy as np

SHAPES = [(64, 64, 64), (16, 16, 16), (256, 256, 256), (1, 256, 256), (256, 1, 256), (1, 1, 3)]
STEPS = 5


def _programs(rows: int, cols: int, k: int):
    import accy
    from accy import f32, i32, spec
    from accy.trace import define

    def cond(b, a):
        p, x, w = a
        return b.cond(
            p,
            lambda b, v: v[0].contract(v[1], "k"),
            lambda b, v: v[0].contract(v[1], "k") * 2.0,
            [x, w],
        )

    def scanned(b, a):
        w, h0, xs = a
        (final,), _ = b.scan(
            lambda b, c: [(c[0].contract(w, "k").rename("n", "k") + c[1]).tanh()],
            carries=[h0],
            xs=[xs],
            axis="t",
        )
        return final

    def looped(b, a):
        w, h0, xs = a

        def body(b, c):
            x = xs.dynamic_slice({"t": c[1]}, {"t": 1}).sum("t")
            return [(c[0].contract(w, "k").rename("n", "k") + x).tanh(), c[1] + 1]

        final, _ = b.while_loop(lambda b, c: c[1] < STEPS, body, [h0, b.scalar(i32, 0)])
        return final

    # The loops need a square weight (the carry keeps its shape): k x k, carry rows x k.
    square = [spec(f32, k=k, n=k), spec(f32, m=rows, k=k), spec(f32, t=STEPS, m=rows, k=k)]
    return {
        "cond": define(
            "probe_cond",
            [spec(accy.bool_), spec(f32, m=rows, k=k), spec(f32, k=k, n=cols)],
            cond,
        ),
        "scan-node": define("probe_scan", square, scanned),
        "while": define("probe_while", square, looped),
    }


def _want(kind: str, inputs):
    if kind == "cond":
        _, x, w = inputs
        return x.astype(np.float64) @ w
    w, h, xs = (a.astype(np.float64) for a in inputs)
    for s in range(STEPS):
        h = np.tanh(h @ w + xs[s])
    return h


def probe(kind: str, rows: int, cols: int, k: int) -> str:
    import cupy

    from accy.backends.cuda import compile_program
    from accy.backends.cuda.runtime import load
    from accy.backends.cuda.schedule import Conditional, Gemm
    from accy.backends.cuda.steps import dot, scan

    dot.CONDITIONAL_GEMM_MIN, scan.UNROLLED_NODES = 1, 0
    program = _programs(rows, cols, k)[kind]
    compiled = compile_program(program)

    def inside(actions, within=False):
        for a in actions:
            if isinstance(a, Conditional):
                yield from inside(a.body, True)
            elif isinstance(a, Gemm) and within:
                yield a

    gemms = list(inside(compiled.schedule.actions))
    rng = np.random.default_rng(0)
    inputs = [
        (rng.standard_normal(t.extents) / np.sqrt(max(k, 1))).astype(np.float32)
        for t in program.parameter_types
    ]
    if kind == "cond":
        inputs[0] = np.array(True)
    what = f"{kind:9} {rows}x{cols}x{k}: {len(gemms)} cuBLAS GEMM(s) inside"
    try:
        out = cupy.empty(program.output_types[0].extents, np.float32)
        fragment = load(compiled)
        arguments = [cupy.asarray(x) for x in inputs]
        fragment.run([int(a.data.ptr) for a in [*arguments, out]])
        cupy.cuda.get_current_stream().synchronize()
    except Exception as error:  # noqa: BLE001 - a probe reports whatever happens
        return f"{what}: FAILED {type(error).__name__}: {str(error)[:160]}"
    error = float(np.abs(cupy.asnumpy(out) - _want(kind, inputs)).max())
    return f"{what}: ran, max error {error:.1e}"


def main() -> None:
    for rows, cols, k in SHAPES:
        for kind in ("cond", "scan-node", "while"):
            if kind != "cond" and cols != k:
                continue  # the loops' weight is square
            try:
                line = probe(kind, rows, cols, k)
            except Exception as error:  # noqa: BLE001 - e.g. no CuPy, no GPU
                line = f"{kind} {rows}x{cols}x{k}: not run: {type(error).__name__}: {error}"
            print("loops5-probe", line, flush=True)


if __name__ == "__main__":
    main()
