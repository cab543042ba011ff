"""The gradient of a tanh RNN over a scan: compile time, step time and peak memory against
the number of steps, for accy (always) and JAX's `lax.scan` (when JAX is importable).

    python -m bench.scan_rnn                       # 64, 1024 and 16384 steps, on the CPU
    python -m bench.scan_rnn --steps 64,1024 --device cuda --json out/scan_rnn.json
    python -m bench.scan_rnn --remat on --systems accy   # only remat, only accy
    python -m bench.scan_rnn --device cuda --unrolled-nodes 0   # every CUDA scan a WHILE node

The RNN: h' = tanh(h W + x U), carry 256, input 256, batch 1; the loss is the sum of the final
carry and of every step's carry; its gradient with respect to W, U, h0 and the inputs. Each
(system, steps, remat) runs in a fresh process (`--worker`), so that compile caches and peak
memory (the process's maximum resident set, `ru_maxrss`, which covers native workspaces too)
are its own; on CUDA `peak_device_mib` is the device memory in use at its peak (CuPy's pool
for accy, XLA's `peak_bytes_in_use` for JAX), from before the inputs are uploaded (so it counts
the inputs, the outputs and the workspace). `compile_s` includes the first call (as JAX's jit
compiles on it), and so one step; `build_s` is the compile alone, before anything runs: accy's
grad + `accy.compile`, JAX's `jit(grad(loss)).lower(...).compile()` (ahead of time). The
issue's "compile time flat" bar compares `build_s`. accy compiles with its disk
cache in a fresh private folder, so the compile time is a real build.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

from bench.measure import run_captured
from bench.systems import missing

CARRY = 256
INPUT = 256


def _inputs(steps: int):
    import numpy as np

    rng = np.random.default_rng(0)
    scale = 1.0 / np.sqrt(CARRY)
    return [
        (rng.standard_normal((CARRY, CARRY)) * scale).astype(np.float32),
        (rng.standard_normal((INPUT, CARRY)) * scale).astype(np.float32),
        (rng.standard_normal(CARRY) * 0.1).astype(np.float32),
        rng.standard_normal((steps, INPUT)).astype(np.float32),
    ]


def accy_program(steps: int, remat: bool, carry: int = CARRY, inputs: int = INPUT):
    """The RNN loss in accy: the weights are closures of the scan body (also the tests' RNN,
    at smaller `carry` and `inputs`)."""
    import accy
    from accy import f32, spec

    def loss(b, args):
        w, u, h0, xs = args

        def step(_, a):
            h, x = a
            new = (h.contract(w, "h") + x.contract(u, "i")).rename("o", "h").tanh()
            return new, new

        (final,), (hs,) = b.scan(step, carries=[h0], xs=[xs], axis="t", remat=remat)
        return final.sum("h") + hs.sum(("t", "h"))

    types = [
        spec(f32, h=carry, o=carry),
        spec(f32, i=inputs, o=carry),
        spec(f32, h=carry),
        spec(f32, t=steps, i=inputs),
    ]
    return accy.trace.define("rnn", types, loss)


def run_accy(
    steps: int, remat: bool, device: str, repeat: int, unrolled_nodes: int | None = None
) -> dict:
    import accy

    if unrolled_nodes is not None:  # CUDA: longer scans run as one graph WHILE node
        accy.config.update("cuda_unrolled_nodes", unrolled_nodes)

    memory = None
    if device == "cuda":
        from bench.systems.cupy_memory import CupyPoolPeak

        memory = CupyPoolPeak()
    start = time.perf_counter()
    gradient = accy.grad(accy_program(steps, remat), (0, 1, 2, 3))
    compiled = accy.compile(gradient, device=device)
    build_s = time.perf_counter() - start
    inputs = _inputs(steps)
    if device == "cuda":
        import cupy

        inputs = [cupy.asarray(x) for x in inputs]
        sync = cupy.cuda.get_current_stream().synchronize
    else:
        sync = lambda: None  # noqa: E731
    compiled(*inputs)
    sync()
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        compiled(*inputs)
        sync()
        times.append(time.perf_counter() - t)
    median = sorted(times)[len(times) // 2]
    result = {"compile_s": compile_s, "build_s": build_s, "step_s": median}
    if memory is not None:
        result["peak_device_mib"] = memory.peak_bytes() / 2**20
    return result


def run_jax(steps: int, remat: bool, device: str, repeat: int) -> dict:
    import jax
    import jax.numpy as jnp

    def loss(w, u, h0, xs):
        def step(h, x):
            new = jnp.tanh(h @ w + x @ u)
            return new, new

        body = jax.checkpoint(step) if remat else step
        final, hs = jax.lax.scan(body, h0, xs)
        return final.sum() + hs.sum()

    start = time.perf_counter()
    target = jax.devices("gpu" if device == "cuda" else "cpu")[0]
    baseline = (target.memory_stats() or {}).get("peak_bytes_in_use", 0)
    inputs = [jax.device_put(x, target) for x in _inputs(steps)]
    built = time.perf_counter()
    function = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(*inputs).compile()
    build_s = time.perf_counter() - built  # tracing, lowering and XLA's compile, ahead of time
    jax.block_until_ready(function(*inputs))
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(function(*inputs))
        times.append(time.perf_counter() - t)
    result = {"compile_s": compile_s, "build_s": build_s, "step_s": sorted(times)[len(times) // 2]}
    if device == "cuda":
        peak = (target.memory_stats() or {}).get("peak_bytes_in_use", 0) - baseline
        result["peak_device_mib"] = peak / 2**20
    return result


def worker(
    system: str, steps: int, remat: bool, device: str, repeat: int, unrolled_nodes: int | None
) -> dict:
    """One measurement in this process; peak memory is this process's maximum resident set."""
    if system == "accy":
        result = run_accy(steps, remat, device, repeat, unrolled_nodes)
    else:
        result = run_jax(steps, remat, device, repeat)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result.update(system=system, steps=steps, remat=remat, device=device)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="64,1024,16384")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--remat", default="both", choices=("both", "off", "on"))
    parser.add_argument("--systems", default="accy,jax", help="accy and/or jax")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per measurement")
    parser.add_argument(
        "--unrolled-nodes",
        type=int,
        default=None,
        help="CUDA: unroll scans of up to this many nodes, run longer ones as a WHILE node "
        "(default: accy's own threshold)",
    )
    parser.add_argument("--worker", nargs=3, metavar=("SYSTEM", "STEPS", "REMAT"))
    args = parser.parse_args(argv)
    if args.worker:
        system, steps, remat = args.worker
        result = worker(
            system, int(steps), remat == "1", args.device, args.repeat, args.unrolled_nodes
        )
        print(json.dumps(result))
        return 0
    systems = [s for s in args.systems.split(",") if s == "accy" or missing("jax") is None]
    if "jax" in args.systems and "jax" not in systems:
        print("JAX is not importable here: measuring accy only", file=sys.stderr)
    remats = {"both": (False, True), "off": (False,), "on": (True,)}[args.remat]
    results = []
    for steps in [int(s) for s in args.steps.split(",")]:
        for remat in remats:
            for system in systems:
                with tempfile.TemporaryDirectory() as cache:
                    environment = dict(os.environ, ACCY_CACHE_DIR=cache)
                    command = [sys.executable, "-m", "bench.scan_rnn", "--device", args.device]
                    command += ["--repeat", str(args.repeat)]
                    if args.unrolled_nodes is not None:
                        command += ["--unrolled-nodes", str(args.unrolled_nodes)]
                    command += ["--worker", system, str(steps), "1" if remat else "0"]
                    done = run_captured(command, args.timeout, environment)
                if done.returncode != 0:
                    print(done.stderr, file=sys.stderr)
                    results.append(
                        {
                            "system": system,
                            "steps": steps,
                            "remat": remat,
                            "error": done.stderr[-2000:],
                        }
                    )
                    continue
                result = json.loads(done.stdout.strip().splitlines()[-1])
                results.append(result)
                build = result.get("build_s")
                print(
                    f"{system:5} steps={steps:6} remat={remat!s:5} "
                    f"compile+first call {result['compile_s']:7.2f} s "
                    + (f"(build {build:5.2f} s) " if build is not None else "")
                    + f"step {result['step_s'] * 1e3:9.2f} ms "
                    f"peak RSS {result['peak_rss_mib']:8.1f} MiB"
                    + (
                        f" device {result['peak_device_mib']:8.1f} MiB"
                        if "peak_device_mib" in result
                        else ""
                    ),
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
