"""FP8 GEMMs (`accy.nn.fp8_matmul`) against bf16: GPT-2's GEMMs, its training step, the demo.

    python -m bench.fp8 --device cuda --json bench/results/fp8-h200-bf16.json
    python -m bench.fp8 --sections demo --preset tiny --steps 300   # the CPU: emulated FP8

Three sections, each with FP8 off and on in one run:

- `gemms`: the model's MLP and head GEMMs at 8,192 tokens (GPT-2 small: 768 -> 3072,
  3072 -> 768, 768 -> 50304; the 1B Llama of `bench.llama1b`: 2048 -> 8192, 8192 -> 2048,
  2048 -> 32000), bf16 operands: accy's bf16 contraction against `fp8_matmul` (which includes
  both operands' amax and quantisation, as in a training step), each call `REPLICAS`
  independent GEMMs so that the call overhead is amortised; with PyTorch's bf16 matmul and
  `torch._scaled_mm` (the FP8 GEMM alone, operands already in float8) as ceilings;
- `step`: the model's AdamW training step (`--model gpt2`: `accy.models.gpt2` small, 8 x 1024
  tokens, vocab 50304; `--model llama1b`: `accy.models.llama` at `bench.llama1b`'s cuda
  scale, 4 x 2048 tokens), `mixed_precision(f32, bf16, f32)` against the same with
  `fp8=("mlp", "head")`;
- `demo`: a demo preset's GPT-2 over bytes trained the same steps on the same batches with FP8
  off and on, and the held-out loss of each (`accy.demo.preset`'s data and schedule).

Times are medians of wall time around calls that end with a wait for the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import optree

import accy
from accy import models, nn, random
from accy.backends.cuda import fp8 as cuda_fp8
from accy.demo import gpt2 as demo_gpt2
from accy.demo.common import language_model_step
from accy.demo.preset import learning_rate, preset_named
from accy.demo.text import ByteText
from accy.nn import fp8

TOKENS = 8 * 1024
GEMMS = {  # each model's (contracted, output) extents at TOKENS tokens
    "gpt2": {"mlp_up": (768, 3072), "mlp_down": (3072, 768), "head": (768, 50304)},
    "llama1b": {"mlp_up": (2048, 8192), "mlp_down": (8192, 2048), "head": (2048, 32000)},
}
REPLICAS = 4
FP8 = ("mlp", "head")
E4M3 = "float8_e4m3fn"


def _median_ms(call, repeats: int) -> dict:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return {"median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times)}


def gemm_section(device: str, repeats: int, model: str = "gpt2") -> dict:
    """bf16 and FP8 GEMMs of the model's shapes, per GEMM (a call's time over `REPLICAS`)."""
    rng = np.random.default_rng(0)
    results = {}
    for name, (k, n) in GEMMS[model].items():
        xs = [
            accy.named(rng.normal(size=(TOKENS, k)).astype(np.float32), ("token", "embed"))
            .to(device)
            .convert(accy.bf16)
            for _ in range(REPLICAS)
        ]
        w = accy.named(0.02 * rng.normal(size=(k, n)).astype(np.float32), ("embed", "out"))
        w = w.to(device).convert(accy.bf16)
        row = {"tokens": TOKENS, "k": k, "n": n, "gflop": 2 * TOKENS * k * n / 1e9}
        row.update(_torch_gemms(device, k, n, repeats))  # first: they do not depend on accy's
        row["fp8_path"] = _fp8_path(device, xs[0], w)
        kinds = {
            "bf16": lambda x, w: x.contract(w, "embed"),
            "fp8": lambda x, w: nn.fp8_matmul(x, w, "embed"),
        }
        outputs = {}
        for kind, gemm in kinds.items():
            many = accy.jit(lambda xs, w, gemm=gemm: [gemm(x, w) for x in xs])
            outputs[kind] = np.asarray(many(xs, w)[0].to("cpu").convert(accy.f32).array)
            timing = _median_ms(
                lambda many=many, xs=xs, w=w: accy.block_until_ready(many(xs, w)), repeats
            )
            row[kind] = {key: value / REPLICAS for key, value in timing.items()}
        exact = np.asarray(xs[0].to("cpu").convert(accy.f32).array) @ np.asarray(
            w.to("cpu").convert(accy.f32).array
        )
        for kind, out in outputs.items():
            row[kind]["relative_error"] = float(np.linalg.norm(out - exact) / np.linalg.norm(exact))
        row["speedup"] = row["bf16"]["median_ms"] / row["fp8"]["median_ms"]
        results[name] = row
        print(
            f"{name:9s} {TOKENS}x{k}x{n}: bf16 {row['bf16']['median_ms']:.3f} ms, fp8 "
            f"{row['fp8']['median_ms']:.3f} ms ({row['speedup']:.2f}x, {row['fp8_path']}); "
            "torch bf16 "
            f"{row.get('torch_bf16_ms', float('nan')):.3f}, _scaled_mm "
            f"{row.get('torch_scaled_mm_ms', float('nan')):.3f} ms",
            flush=True,
        )
    return results


def _fp8_path(device: str, x, w) -> str:
    """What runs `fp8_matmul(x, w, "embed")` on `device`: cuBLASLt, or the composition (with
    cuBLASLt's reason when it refused)."""
    if device != "cuda":
        return "composition"
    s = fp8.Signature(("embed",), (x.ty.axes, w.ty.axes), (E4M3, E4M3), "float8_e5m2", "bf16")
    step = cuda_fp8.describe(s, (x.ty, w.ty), fp8.result_type(s, x.ty, w.ty))
    why = "not a cuBLASLt shape" if step is None else cuda_fp8.refusal(step)
    return "cublaslt" if why is None else f"composition ({why})"


def _torch_gemms(device: str, k: int, n: int, repeats: int) -> dict:
    """PyTorch's bf16 matmul and its FP8 GEMM alone (`torch._scaled_mm`), CUDA-event timed."""
    if device != "cuda":
        return {}
    try:
        import torch
    except ImportError:
        return {}
    x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    one = torch.ones((), device="cuda")
    x8, w8 = x.to(torch.float8_e4m3fn), (w * 64).to(torch.float8_e4m3fn)
    calls = {
        "torch_bf16_ms": lambda: x @ w.t(),
        "torch_scaled_mm_ms": lambda: torch._scaled_mm(
            x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16
        ),
    }
    found = {}
    for name, call in calls.items():
        try:
            for _ in range(3):
                call()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times = []
            for _ in range(repeats):
                start.record()
                call()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            found[name] = statistics.median(times)
        except Exception as error:  # an old PyTorch without _scaled_mm: leave it out
            found[name.replace("_ms", "_error")] = repr(error)
    return found


def gpt2_config() -> models.gpt2.Config:
    return models.gpt2.Config(vocab=50304, positions=1024, embed=768, layers=12, heads=12)


def step_section(device: str, steps: int, model: str = "gpt2", fp8: tuple = FP8) -> dict:
    """The model's AdamW step in bf16 with FP8 off and on (each its own compile)."""
    (vocab, sequences), fresh_model = _step_model(model, device)
    ids = np.random.default_rng(1).integers(0, vocab, size=(sequences, TOKENS // sequences + 1))
    ids = ids.astype(np.int32)
    results = {"model": model, "groups": list(fp8)}
    for name, chosen in (("bf16", None), ("fp8", fp8)):
        policy = nn.mixed_precision(accy.f32, accy.bf16, accy.f32, fp8=chosen)
        step, params, state = language_model_step(fresh_model(), device, 3e-4, 0.1, policy)
        x = accy.named(ids[:, :-1].copy(), ("batch", "token"), device=device)
        y = accy.named(ids[:, 1:].copy(), ("batch", "token"), device=device)
        rate = accy.named(np.float32(3e-4), (), device=device)
        start = time.perf_counter()
        value, params, state = step(params, state, x, y, rate)
        losses = [float(value)]
        first = time.perf_counter() - start
        print(f"step {name}: first step {first:.1f} s", flush=True)  # before a limit ends it
        times = []
        for _ in range(steps):
            tick = time.perf_counter()
            value, params, state = step(params, state, x, y, rate)
            losses.append(float(value))
            times.append(time.perf_counter() - tick)
        results[name] = {
            "first_step_s": first,
            "median_ms": 1e3 * statistics.median(times),
            "min_ms": 1e3 * min(times),
            "losses": losses,
        }
        print(f"step {name}: {results[name]['median_ms']:.2f} ms (first {first:.1f} s)", flush=True)
        del step, params, state
    results["speedup"] = results["bf16"]["median_ms"] / results["fp8"]["median_ms"]
    return results


def _step_model(model: str, device: str) -> tuple[tuple[int, int], Callable[[], Any]]:
    """((the vocabulary, the sequences of a batch), a function that gives a fresh copy of the
    model's initial weights on `device`, which the step donates)."""
    if model == "llama1b":
        from bench.llama1b import SCALES, accy_config, initial_tensors

        s = SCALES["cuda"]
        tensors = initial_tensors(s)
        return (s.vocab, s.batch), lambda: models.llama.Llama.from_tensors(
            accy_config(s), tensors, device=device
        )
    config = gpt2_config()
    # Drawn once on the host (nn.init draws on the reference evaluator: about a minute for
    # GPT-2 small), then a copy of its own on the device for each run.
    initial = models.gpt2.GPT2.init(config, random.key(0))
    return (config.vocab, 8), lambda: optree.tree_map(
        lambda leaf: accy.named(leaf.array.copy(), leaf.ty.axes, device=device),
        initial,
        namespace="accy",
    )


def demo_section(
    device: str, preset_name: str, steps: int, seed: int = 0, fp8: tuple = FP8
) -> dict:
    """The preset's byte GPT-2 trained `steps` steps with FP8 off and on: held-out losses."""
    preset = preset_named(preset_name)
    c = preset.config
    text = ByteText.load()
    held = np.random.default_rng([seed, 1])
    held_batches = [text.batch(held, c.batch, c.tokens, True) for _ in range(preset.eval_batches)]
    config = models.gpt2.Config(
        vocab=c.vocab, positions=c.tokens, embed=c.width, layers=c.layers, heads=c.heads
    )
    results = {"preset": preset_name, "steps": steps, "fp8": list(fp8)}
    for name, chosen in (("bf16", None), ("fp8", fp8)):
        policy = nn.mixed_precision(accy.f32, accy.bf16, accy.f32, fp8=chosen)
        model = models.gpt2.GPT2.init(config, random.key(seed), device=device)
        model = model.replace(blocks=model.blocks.replace(unroll=True))
        step, params, state = language_model_step(
            model, device, preset.learning_rate, demo_gpt2.WEIGHT_DECAY, policy
        )

        def loss(model, ids, targets, policy=policy):
            scores = policy.cast_to_output(policy.cast_to_compute(model)(ids))
            return nn.cross_entropy(scores, targets, "vocab").mean()

        held_loss = accy.jit(loss)

        def ids(array):
            return accy.named(array, ("batch", "token"), device=device)

        started = time.perf_counter()
        for index in range(steps):
            rate = learning_rate(preset, index, index / steps)
            x, y = text.batch(np.random.default_rng([seed, 0, index]), c.batch, c.tokens)
            rate = accy.named(np.float32(rate), (), device=device)
            value, params, state = step(params, state, ids(x), ids(y), rate)
            if index == 0:
                print(f"demo {name}: first step {time.perf_counter() - started:.1f} s", flush=True)
        last = float(value)
        held_out = [float(held_loss(params, ids(x), ids(y))) for x, y in held_batches]
        results[name] = {
            "held_out_loss": float(np.mean(held_out)),
            "last_training_loss": last,
            "seconds": time.perf_counter() - started,
        }
        print(f"demo {name}: held-out {results[name]['held_out_loss']:.4f} nats/byte", flush=True)
    bf16, fp8 = results["bf16"]["held_out_loss"], results["fp8"]["held_out_loss"]
    results["relative_difference"] = (fp8 - bf16) / bf16
    return results


def machine() -> dict:
    info = {"python": platform.python_version(), "host": platform.node()}
    info["load_average"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sections", default="gemms,step,demo")
    parser.add_argument("--model", default="gpt2", choices=sorted(GEMMS), help="gemms, step")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--steps", type=int, default=None, help="demo steps (default 300)")
    parser.add_argument("--step-repeats", type=int, default=10)
    parser.add_argument("--preset", default=None, help="demo preset (cuda: gpt2-small)")
    parser.add_argument("--fp8", default=",".join(FP8), help="the FP8 groups (mlp,head)")
    parser.add_argument("--seed", type=int, default=0, help="the demo's seed")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    sections, groups = args.sections.split(","), tuple(args.fp8.split(","))
    report: dict[str, Any] = {"device": args.device, "machine_before": machine()}
    report["command"] = " ".join(["python -m bench.fp8", *sys.argv[1:]])

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)

    if "gemms" in sections:
        report["gemms"] = gemm_section(args.device, args.repeats, args.model)
        save()
    if "step" in sections:
        report["step"] = step_section(args.device, args.step_repeats, args.model, groups)
        save()
    if "demo" in sections:
        preset = args.preset or ("gpt2-small" if args.device == "cuda" else "tiny")
        report["demo"] = demo_section(args.device, preset, args.steps or 300, args.seed, groups)
        save()
    report["machine_after"] = machine()
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
