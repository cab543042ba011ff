"""One loop three ways: as a `scan` (on CUDA, the body's kernels recorded once per step in one
graph, as scans of up to `accy.config.cuda_unrolled_nodes` nodes are), as the same
scan run as one graph WHILE node (`scan-node`, CUDA only: the body recorded once, its step
counter and pointer table on the device, as longer scans are) and as a `while_loop` over a step
counter (a WHILE node too, its condition a kernel of the program). Compile time (the first
call) and step time, for many short steps and for a few heavy ones.

    python -m bench.loop_kinds --device cuda
    python -m bench.loop_kinds --device cpu --cases short
    ACCY_CUDA_CUBLAS_IN_CONDITIONALS=0 python -m bench.loop_kinds --device cuda  # old path

Cases: `short`, 1024 steps of h = tanh(h W + x_t) with a 256-vector carry; `heavy`, 48 steps
of H = tanh(H W + X_t) with 2048 x 2048 matrices (a GEMM of 17 GFLOP per step). The
while_loop reads x_t with `dynamic_slice` at its counter and writes nothing per step; both
return the final carry, which is compared.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

CASES = {"short": (1024, 1, 256), "heavy": (48, 2048, 2048)}  # steps, rows, width


def programs(steps: int, rows: int, width: int):
    """(scan program, the same under another name, while_loop program), each (W, H0, XS) ->
    final H. The second is compiled as a WHILE node: its own name keeps it out of the
    executable cache entry of the first."""
    import accy
    from accy import f32, i32, spec

    types = [
        spec(f32, h=width, o=width),
        spec(f32, r=rows, h=width),
        spec(f32, t=steps, r=rows, h=width),
    ]

    def cell(h, w, x):
        return (h.contract(w, "h").rename("o", "h") + x).tanh()

    def scanned(b, args):
        w, h0, xs = args
        (final,), _ = b.scan(lambda b, a: (cell(a[0], w, a[1]),), carries=[h0], xs=[xs], axis="t")
        return final

    def looped(b, args):
        w, h0, xs = args

        def body(b, c):
            h, step = c
            x = xs.dynamic_slice({"t": step}, {"t": 1}).sum("t")
            return [cell(h, w, x), step + 1]

        final, _ = b.while_loop(lambda b, c: c[1] < steps, body, [h0, b.scalar(i32, 0)])
        return final

    return (
        accy.trace.define("scanned", types, scanned),
        accy.trace.define("scanned_as_a_node", types, scanned),
        accy.trace.define("looped", types, looped),
    )


def _compile(program, device: str, unrolled_nodes: int | None):
    """`accy.compile`, with CUDA scans unrolled up to `unrolled_nodes` nodes (None: default)."""
    import accy

    if unrolled_nodes is None:
        return accy.compile(program, device=device)
    with accy.config.override(cuda_unrolled_nodes=unrolled_nodes):
        return accy.compile(program, device=device)


def measure(program, inputs, device: str, repeat: int, unrolled_nodes: int | None = None) -> dict:
    import numpy as np

    start = time.perf_counter()
    compiled = _compile(program, device, unrolled_nodes)
    if device == "cuda":
        import cupy

        inputs = [cupy.asarray(x) for x in inputs]

        def host(x):
            return cupy.asnumpy(x)
    else:
        host = np.asarray
    out = host(compiled(*inputs)[0])
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        host(compiled(*inputs)[0])
        times.append(time.perf_counter() - t)
    return {"compile_s": compile_s, "step_s": sorted(times)[len(times) // 2], "out": out}


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cases", default="short,heavy")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    # On CUDA, contractions inside WHILE nodes are cuBLAS unless
    # ACCY_CUDA_CUBLAS_IN_CONDITIONALS=0 (`accy.config.cuda_cublas_in_conditionals`).
    import accy

    cublas_inside = args.device == "cuda" and accy.config.cuda_cublas_in_conditionals
    results = []
    for case in args.cases.split(","):
        steps, rows, width = CASES[case]
        rng = np.random.default_rng(0)
        inputs = [
            (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
            rng.standard_normal((rows, width)).astype(np.float32) * 0.1,
            rng.standard_normal((steps, rows, width)).astype(np.float32) * 0.1,
        ]
        outs = {}
        kinds = zip(("scan", "scan-node", "while"), programs(steps, rows, width), strict=True)
        for kind, program in kinds:
            if kind == "scan-node" and args.device != "cuda":
                continue  # the CPU runs every scan as a C loop
            nodes = 0 if kind == "scan-node" else None
            result = measure(program, inputs, args.device, args.repeat, nodes)
            outs[kind] = result.pop("out")
            result.update(case=case, kind=kind, device=args.device, steps=steps)
            result["cublas_in_conditionals"] = cublas_inside
            results.append(result)
            print(
                f"loop {case:5} {kind:9} steps={steps:5} compile+first call "
                f"{result['compile_s']:7.2f} s step {result['step_s'] * 1e3:9.3f} ms"
                f"{' (cuBLAS inside nodes)' if cublas_inside and kind != 'scan' else ''}",
                flush=True,
            )
        for kind in [k for k in outs if k != "scan"]:
            difference = float(np.abs(outs["scan"] - outs[kind]).max())
            print(f"loop {case:5} max |scan - {kind}| = {difference:.2e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
