"""One loop two ways: as a `scan` (on CUDA, the body's kernels recorded once per step in one
graph) and as a `while_loop` over a step counter (on CUDA, a graph WHILE node: one copy of the
body, its condition set on the device). Compile time (the first call) and step time, for many
short steps and for a few heavy ones.

    python -m bench.loop_kinds --device cuda
    python -m bench.loop_kinds --device cpu --cases short

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
    """(scan program, while_loop program), each (W, H0, XS) -> final H."""
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
        accy.trace.define("looped", types, looped),
    )


def measure(program, inputs, device: str, repeat: int) -> dict:
    import numpy as np

    import accy

    start = time.perf_counter()
    compiled = accy.compile(program, device=device)
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
        for kind, program in zip(("scan", "while"), programs(steps, rows, width), strict=True):
            result = measure(program, inputs, args.device, args.repeat)
            outs[kind] = result.pop("out")
            result.update(case=case, kind=kind, device=args.device, steps=steps)
            results.append(result)
            print(
                f"loop {case:5} {kind:5} steps={steps:5} compile+first call "
                f"{result['compile_s']:7.2f} s step {result['step_s'] * 1e3:9.3f} ms",
                flush=True,
            )
        difference = float(np.abs(outs["scan"] - outs["while"]).max())
        print(f"loop {case:5} max |scan - while| = {difference:.2e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
