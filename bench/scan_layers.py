"""The demo's transformer at several depths, its layers unrolled or run as one scan over
parameters stacked along `layer` (`accy demo --scan-layers`): compile time and step time of
value_and_grad of the loss, for accy and (when importable) JAX, unrolled and with `lax.scan`.

    python -m bench.scan_layers                          # 12 and 48 layers, on the CPU
    python -m bench.scan_layers --device cuda --layers 12,48 --json out/scan_layers.json

The model is the demo's (`accy.demo.model`: channels 64, 4 heads, hidden 128, the sorting
task's 20 tokens, batch 64). Each (system, layers, layout) runs in a fresh process with a fresh
accy disk cache, so `compile_s` (the first call, which traces and compiles) is a real build.
JAX's model is the same computation written with jax.numpy (pre-norm layers, causal softmax
attention, tanh GELU, weighted cross-entropy), its layers a Python loop or `lax.scan`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from bench.measure import run_captured
from bench.systems import missing

LAYOUTS = ("scan", "unrolled")  # scan first: a time limit cuts the unrolled runs


def _setup(layers: int, scan: bool):
    import numpy as np

    from accy.demo.data import VOCAB, SortingTask
    from accy.demo.model import Config, initial_parameters

    task = SortingTask()
    config = Config(vocab=VOCAB, tokens=task.tokens, layers=layers, scan_layers=scan)
    values = initial_parameters(config, np.random.default_rng(0))
    batch = task.batch(np.random.default_rng(1), config.batch)
    return config, values, batch


def run_accy(layers: int, scan: bool, device: str, repeat: int) -> dict:
    import numpy as np

    import accy
    from accy.demo.model import loss, parameter_specs

    config, values, batch = _setup(layers, scan)
    specs = parameter_specs(config)
    params = {k: accy.named(v, specs[k].axes, device=device) for k, v in values.items()}
    ids, targets, weights = (accy.named(a, ("batch", "token"), device=device) for a in batch)

    def step(p, ids, targets, weights):
        return accy.value_and_grad(lambda p: loss(p, ids, targets, weights, config))(p)

    def host(value) -> float:  # waits for the step (on CUDA, one graph: all of it)
        array = value.array
        return float(array.get() if hasattr(array, "get") else np.asarray(array))

    function = accy.jit(step)
    start = time.perf_counter()
    first = host(function(params, ids, targets, weights)[0])
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        host(function(params, ids, targets, weights)[0])
        times.append(time.perf_counter() - t)
    return {"compile_s": compile_s, "step_s": sorted(times)[len(times) // 2], "loss": first}


def _jax_loss(layers: int, scan: bool, heads: int):
    import jax
    import jax.numpy as jnp

    def norm(x, gain, bias):
        mean = x.mean(-1, keepdims=True)
        centered = x - mean
        return centered * jax.lax.rsqrt((centered**2).mean(-1, keepdims=True) + 1e-5) * gain + bias

    def layer(x, q):
        tokens = x.shape[1]
        h = norm(x, q["norm1_gain"], q["norm1_bias"])
        queries = jnp.einsum("btc,chd->bhtd", h, q["query"])
        keys = jnp.einsum("btc,chd->bhtd", h, q["key"])
        values = jnp.einsum("btc,chd->bhtd", h, q["value"])
        scores = jnp.einsum("bhtd,bhkd->bhtk", queries, keys) / jnp.sqrt(queries.shape[-1])
        mask = jnp.tril(jnp.ones((tokens, tokens), bool))
        scores = jnp.where(mask, scores, -jnp.inf)
        mixed = jnp.einsum("bhtk,bhkd->bhtd", jax.nn.softmax(scores, -1), values)
        x = x + jnp.einsum("bhtd,hdc->btc", mixed, q["out"])
        h = norm(x, q["norm2_gain"], q["norm2_bias"])
        up = jnp.einsum("btc,ch->bth", h, q["up"])
        return x + jnp.einsum("bth,hc->btc", jax.nn.gelu(up, approximate=True), q["down"])

    def loss(p, ids, targets, weights):
        x = p["embed"][ids] + p["position"]
        stacked = {k.removeprefix("layers_"): v for k, v in p.items() if k.startswith("layers_")}
        if scan:
            x, _ = jax.lax.scan(lambda x, q: (layer(x, q), None), x, stacked)
        else:
            for i in range(layers):
                x = layer(x, {k: v[i] for k, v in stacked.items()})
        scores = norm(x, p["final_gain"], p["final_bias"]) @ p["unembed"]
        logp = jax.nn.log_softmax(scores, -1)
        picked = jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
        return -(picked * weights).sum() / weights.sum()

    return loss


def run_jax(layers: int, scan: bool, device: str, repeat: int) -> dict:
    import jax

    from accy.demo.model import stack_layers

    config, values, batch = _setup(layers, False)
    values = stack_layers(values, config)  # JAX reads the layers stacked in both layouts
    target = jax.devices("gpu" if device == "cuda" else "cpu")[0]
    params = {k: jax.device_put(v, target) for k, v in values.items()}
    ids, targets, weights = (jax.device_put(a, target) for a in batch)
    function = jax.jit(jax.value_and_grad(_jax_loss(layers, scan, config.heads)))
    start = time.perf_counter()
    value, _ = jax.block_until_ready(function(params, ids, targets, weights))
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(function(params, ids, targets, weights))
        times.append(time.perf_counter() - t)
    return {"compile_s": compile_s, "step_s": sorted(times)[len(times) // 2], "loss": float(value)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="12,48")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--systems", default="accy,jax", help="accy and/or jax")
    parser.add_argument("--json", default=None)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per measurement")
    parser.add_argument("--worker", nargs=3, metavar=("SYSTEM", "LAYERS", "LAYOUT"))
    args = parser.parse_args(argv)
    if args.worker:
        system, layers, layout = args.worker
        run = run_accy if system == "accy" else run_jax
        result = run(int(layers), layout == "scan", args.device, args.repeat)
        result.update(system=system, layers=int(layers), layout=layout, device=args.device)
        print(json.dumps(result))
        return 0
    systems = [s for s in args.systems.split(",") if s == "accy" or missing("jax") is None]
    results = []
    for layout in LAYOUTS:
        for layers in [int(n) for n in args.layers.split(",")]:
            for system in systems:
                command = [sys.executable, "-m", "bench.scan_layers", "--device", args.device]
                command += ["--repeat", str(args.repeat), "--worker", system, str(layers), layout]
                with tempfile.TemporaryDirectory() as cache:
                    environment = dict(os.environ, ACCY_CACHE_DIR=cache)
                    done = run_captured(command, args.timeout, environment)
                if done.returncode != 0:
                    print(f"{system} layers={layers} {layout}: {done.stderr[-1500:]}", flush=True)
                    results.append(dict(system=system, layers=layers, layout=layout, error=True))
                    continue
                result = json.loads(done.stdout.strip().splitlines()[-1])
                results.append(result)
                print(
                    f"{system:5} layers={layers:3} {layout:8} compile+first call "
                    f"{result['compile_s']:7.2f} s step {result['step_s'] * 1e3:8.2f} ms "
                    f"loss {result['loss']:.5f}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
