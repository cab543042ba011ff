"""The `llama1b` workload: one full training step (loss, gradients, AdamW) of a 1B-parameter
Llama in accy, JAX and PyTorch, each in a fresh process.

    python -m bench.llama1b --device cuda               # 16 layers, width 2048, 4 x 2048 tokens
    python -m bench.llama1b --scale check               # a tiny model on the CPU: seconds
    python -m bench --device cuda --dtype bf16 --workloads gpt2,llama1b

The model (the same in the three systems; accy's is `accy.models.llama`): a token embedding,
pre-RMSNorm layers of grouped-query causal attention (rotary position embeddings as Hugging
Face's `rotate_half`, theta 10,000) and a SwiGLU MLP, no biases, a final RMSNorm and an untied
output layer; loss = mean cross-entropy against integer next-token targets. At the cuda scale:
16 layers, width 2048, 32 query and 8 key/value heads of 64, MLP 8192, vocabulary 32,000, a
batch of 4 sequences of 2,048 tokens (8,192 tokens a step, as gpt2's 8 x 1024), 1.10 B
parameters. The weights are drawn once from the seed (N(0, 0.02) matrices, unit norm
weights) in Hugging Face's layout and given to every system. AdamW: lr 3e-4, betas 0.9/0.95,
eps 1e-8, weight decay 0.1 on the matrices and embeddings (not on the norm weights), f32
master weights and state.

Precision (`--dtype`): bf16 (the default) is mixed precision as each system's users write
it, the loss in f32: accy `accy.nn.mixed_precision(f32, bf16, f32)` (attention is
`nn.attention`: cuDNN's fused kernels on CUDA); JAX casts the parameters to bf16 inside the
jitted loss and uses `jax.nn.dot_product_attention`; PyTorch `torch.compile` of the loss under
`torch.autocast(bfloat16)`, `F.scaled_dot_product_attention` and the fused AdamW. f32 runs
everything in f32 (TF32 off).

Reported per system: step time (median), tokens/s, model FLOP utilisation against 989 TFLOP/s
(the H100/H200 dense bf16 peak), peak device memory (also as the most bytes the allocator
handed out at once and held, alike for accy and PyTorch: `worker`), and the first step from a
cold start (accy: empty disk caches; a second process with them filled gives the warm first
step).
Model FLOPs a step: 6 N B T + 12 L B T^2 d, N the parameters without the input embedding
(a lookup), B the batch, T the tokens, L the layers, d the query width (heads x head size).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import resource
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass

import numpy as np

from bench.gpt2 import (
    GPU_PEAK_FLOPS,
    _host,
    _write,
    batch,
    model_training_step,
    timed_jax_steps,
    timed_steps,
    timed_torch_steps,
)
from bench.measure import run_captured

LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 3e-4, 0.9, 0.95, 1e-8, 0.1
NORM_EPS, ROPE_THETA = 1e-6, 10000.0


@dataclass(frozen=True)
class Scale:
    """The model's size and the batch (`tokens` a sequence, `batch` sequences a step).

    >>> SCALES["cuda"].head_dim, SCALES["cuda"].group
    (64, 4)
    """

    layers: int
    embed: int
    heads: int
    kv_heads: int
    hidden: int
    vocab: int
    batch: int
    tokens: int

    @property
    def head_dim(self) -> int:
        return self.embed // self.heads

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


SCALES = {
    "cuda": Scale(layers=16, embed=2048, heads=32, kv_heads=8, hidden=8192, vocab=32000,
                  batch=4, tokens=2048),
    "cpu": Scale(layers=2, embed=256, heads=8, kv_heads=2, hidden=704, vocab=4096, batch=2,
                 tokens=128),
    "check": Scale(layers=2, embed=32, heads=4, kv_heads=2, hidden=64, vocab=64, batch=2,
                   tokens=8),
}  # fmt: skip


def tensor_shapes(s: Scale) -> dict[str, tuple[int, ...]]:
    """Every weight by its Hugging Face name, in `LlamaForCausalLM`'s layout ((out, in)).

    >>> tensor_shapes(SCALES["check"])["model.layers.0.self_attn.k_proj.weight"]
    (16, 32)
    """
    kv = s.kv_heads * s.head_dim
    shapes = {"model.embed_tokens.weight": (s.vocab, s.embed)}
    for i in range(s.layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (s.embed,),
            p + "self_attn.q_proj.weight": (s.embed, s.embed),
            p + "self_attn.k_proj.weight": (kv, s.embed),
            p + "self_attn.v_proj.weight": (kv, s.embed),
            p + "self_attn.o_proj.weight": (s.embed, s.embed),
            p + "post_attention_layernorm.weight": (s.embed,),
            p + "mlp.gate_proj.weight": (s.hidden, s.embed),
            p + "mlp.up_proj.weight": (s.hidden, s.embed),
            p + "mlp.down_proj.weight": (s.embed, s.hidden),
        }
    return shapes | {"model.norm.weight": (s.embed,), "lm_head.weight": (s.vocab, s.embed)}


def is_norm(name: str) -> bool:
    """Whether a weight is an RMSNorm's (no weight decay)."""
    return "norm" in name


def initial_tensors(s: Scale, seed: int = 0) -> dict[str, np.ndarray]:
    """The weights every system starts from (f32): N(0, 0.02) matrices, unit norm weights."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in tensor_shapes(s).items():
        if is_norm(name):
            tensors[name] = np.ones(shape, np.float32)
        else:
            values = rng.standard_normal(shape, dtype=np.float32)
            values *= np.float32(0.02)
            tensors[name] = values
    return tensors


def model_parameters(s: Scale) -> int:
    """All the weights' elements.

    >>> model_parameters(SCALES["cuda"])
    1104218112
    """
    return sum(math.prod(shape) for shape in tensor_shapes(s).values())


def model_flops(s: Scale) -> float:
    """Model FLOPs of one training step: 6 N B T + 12 L B T^2 d (N without the embedding)."""
    n = model_parameters(s) - s.vocab * s.embed
    tokens = s.batch * s.tokens
    return 6.0 * n * tokens + 12.0 * s.layers * tokens * s.tokens * s.heads * s.head_dim


# -- accy ----------------------------------------------------------------------------------------


def accy_config(s: Scale):
    from accy.models.llama import Config

    return Config(
        vocab=s.vocab, embed=s.embed, hidden=s.hidden, layers=s.layers, heads=s.heads,
        kv_heads=s.kv_heads, positions=s.tokens, eps=NORM_EPS, rope_theta=ROPE_THETA,
    )  # fmt: skip


def accy_step(s: Scale, device: str, dtype: str = "bf16", fp8: tuple[str, ...] | None = None):
    """(`step(model, state, ids, targets) -> (loss, model, state)`, the model, the AdamW
    state): one jitted function, the model and state donated (updated in place); `fp8`: the
    groups of GEMMs that run in FP8 under bf16 (`accy.nn.mixed_precision(..., fp8=)`)."""
    from accy.frontend.tracing import flatten
    from accy.models.llama import Llama

    model = Llama.from_tensors(accy_config(s), initial_tensors(s), device=device)
    step, optimizer = accy_training_step(model, device, dtype, fp8)
    return step, model, optimizer.init(flatten(model)[0])


def abstract_model(s: Scale):
    """accy's model at scale `s` with each weight an abstract array (of its type, holding no
    memory: what tracing takes for an `accy.spec`), to trace and plan the step without the
    weights: the structure of a tiny model of the same kind (grouped or not), its axes given
    the extents of `s`.

    >>> print(abstract_model(SCALES["cuda"]).blocks.layers.mlp.gate.weight.ty)
    f32[layer=16, hidden=8192, embed=2048]
    """
    import optree

    import accy
    from accy.frontend.lowered import abstract_inputs
    from accy.frontend.tracing import NAMESPACE
    from accy.models.llama import Llama

    tiny = Scale(layers=1, embed=4 * s.group, heads=2 * s.group, kv_heads=2, hidden=8, vocab=8,
                 batch=1, tokens=1)  # fmt: skip
    extents = {"layer": s.layers, "embed": s.embed, "head": s.kv_heads, "group": s.group,
               "dim": s.head_dim, "hidden": s.hidden, "vocab": s.vocab}  # fmt: skip

    def abstract(leaf):
        return abstract_inputs(accy.spec(leaf.dtype, **{axis: extents[axis] for axis in leaf.axes}))

    model = Llama.from_tensors(accy_config(tiny), initial_tensors(tiny), device="reference")
    return optree.tree_map(abstract, model, namespace=NAMESPACE).replace(config=accy_config(s))


def accy_training_step(model, device: str, dtype: str = "bf16", fp8=None):
    """(the jitted `step(model, state, ids, targets) -> (loss, model, state)`, its AdamW) for
    a model of `model`'s structure (its arrays or their types: the weight decay's mask is made
    from its leaves' paths; `bench.gpt2.model_training_step`)."""
    from accy import optim
    from accy.frontend.tracing import leaf_paths

    mask = [not is_norm(path) for path in leaf_paths(model)]
    optimizer = optim.adamw(LR, BETA1, BETA2, EPS, weight_decay=WEIGHT_DECAY, mask=mask)
    return model_training_step(optimizer, device, dtype, fp8), optimizer


def run_accy(s: Scale, device: str, steps: int, dtype: str = "bf16") -> dict:
    import time

    import accy

    start = time.perf_counter()
    step, model, state = accy_step(s, device, dtype)
    ids, targets = (accy.named(a, ("batch", "token"), device=device) for a in batch(s))
    made = time.perf_counter()
    held = [model, state]

    def one_step() -> float:
        loss, held[0], held[1] = step(held[0], held[1], ids, targets)
        return float(np.asarray(_host(loss.array)))

    result = timed_steps(one_step, steps)
    result["setup_s"] = made - start
    return result


# -- JAX -----------------------------------------------------------------------------------------


def rope_tables(s: Scale, xp):
    """cos and sin {token, head_dim} of Hugging Face's default rotary embedding."""
    inv = 1.0 / ROPE_THETA ** (np.arange(0, s.head_dim, 2, dtype=np.float32) / s.head_dim)
    angles = np.outer(np.arange(s.tokens, dtype=np.float32), inv)
    angles = np.concatenate([angles, angles], axis=-1)
    return xp(np.cos(angles)), xp(np.sin(angles))


def jax_step(s: Scale, device: str, dtype: str = "bf16"):
    """One JAX training step in place, `step() -> loss` (a float: the step has finished)."""
    import jax
    import jax.numpy as jnp
    import optax

    if dtype == "f32":
        jax.config.update("jax_default_matmul_precision", "highest")
    params = {k: jnp.asarray(v) for k, v in initial_tensors(s).items()}
    ids, targets = (jnp.asarray(a) for a in batch(s))
    mask = {k: not is_norm(k) for k in params}
    optimizer = optax.adamw(LR, BETA1, BETA2, EPS, weight_decay=WEIGHT_DECAY, mask=mask)
    cos, sin = rope_tables(s, jnp.asarray)

    def norm(x, w):
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + NORM_EPS)
        return w * x32.astype(x.dtype)

    def rotate(x):  # x {batch, token, head, dim}
        half = s.head_dim // 2
        turned = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return (x * cos[:, None] + turned * sin[:, None]).astype(x.dtype)

    def loss_fn(p, ids, targets):
        if dtype == "bf16":  # f32 master weights, bf16 compute
            p = jax.tree.map(lambda value: value.astype(jnp.bfloat16), p)
        b, t = ids.shape
        x = p["model.embed_tokens.weight"][ids]
        for i in range(s.layers):
            w = functools.partial(lambda name, i: p[f"model.layers.{i}.{name}.weight"], i=i)
            h = norm(x, w("input_layernorm"))
            q = (h @ w("self_attn.q_proj").T).reshape(b, t, s.heads, s.head_dim)
            k = (h @ w("self_attn.k_proj").T).reshape(b, t, s.kv_heads, s.head_dim)
            v = (h @ w("self_attn.v_proj").T).reshape(b, t, s.kv_heads, s.head_dim)
            mixed = jax.nn.dot_product_attention(rotate(q), rotate(k), v, is_causal=True)
            x = x + mixed.reshape(b, t, s.embed) @ w("self_attn.o_proj").T
            h = norm(x, w("post_attention_layernorm"))
            gated = jax.nn.silu(h @ w("mlp.gate_proj").T) * (h @ w("mlp.up_proj").T)
            x = x + gated @ w("mlp.down_proj").T
        logits = norm(x, p["model.norm.weight"]) @ p["lm_head.weight"].T
        logits = logits.astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(p, opt, ids, targets):
        loss, grads = jax.value_and_grad(loss_fn)(p, ids, targets)
        updates, opt = optimizer.update(grads, opt, p)
        return loss, optax.apply_updates(p, updates), opt

    held = [params, optimizer.init(params)]

    def one_step() -> float:
        loss, held[0], held[1] = step(held[0], held[1], ids, targets)
        return float(loss)

    return one_step


def run_jax(s: Scale, device: str, steps: int, dtype: str = "bf16") -> dict:
    return timed_jax_steps(jax_step(s, device, dtype), steps, device)


# -- PyTorch -------------------------------------------------------------------------------------


def torch_loss(s: Scale, p, ids, targets, cos, sin):
    """The mean next-token cross-entropy in PyTorch over weights `p` (Hugging Face names)."""
    import torch
    import torch.nn.functional as F

    def norm(x, w):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + NORM_EPS)
        return w * x32.to(x.dtype)

    def rotate(x):  # x {batch, head, token, dim}
        half = s.head_dim // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    b, t = ids.shape
    x = F.embedding(ids, p["model.embed_tokens.weight"])
    for i in range(s.layers):
        w = functools.partial(lambda name, i: p[f"model.layers.{i}.{name}.weight"], i=i)
        h = norm(x, w("input_layernorm"))
        q = F.linear(h, w("self_attn.q_proj")).view(b, t, s.heads, s.head_dim).transpose(1, 2)
        k = F.linear(h, w("self_attn.k_proj")).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        v = F.linear(h, w("self_attn.v_proj")).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        mixed = F.scaled_dot_product_attention(
            rotate(q), rotate(k), v, is_causal=True, enable_gqa=True
        )
        x = x + F.linear(mixed.transpose(1, 2).reshape(b, t, s.embed), w("self_attn.o_proj"))
        h = norm(x, w("post_attention_layernorm"))
        gated = F.silu(F.linear(h, w("mlp.gate_proj"))) * F.linear(h, w("mlp.up_proj"))
        x = x + F.linear(gated, w("mlp.down_proj"))
    logits = F.linear(norm(x, p["model.norm.weight"]), p["lm_head.weight"])
    return F.cross_entropy(logits.float().view(b * t, -1), targets.view(-1))


def torch_step(s: Scale, device: str, dtype: str = "bf16", compiled: bool = True):
    """One PyTorch training step, `step() -> loss` (a float: the step has finished): the loss
    under `torch.compile` (or eager), `backward()`, AdamW (fused on CUDA)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    where = torch.device(device)
    params = {
        k: torch.tensor(v, device=where, requires_grad=True) for k, v in initial_tensors(s).items()
    }
    ids, targets = (torch.tensor(a, device=where, dtype=torch.long) for a in batch(s))
    cos, sin = rope_tables(s, lambda a: torch.tensor(a, device=where))
    groups = [
        {"params": [p for k, p in params.items() if not is_norm(k)]},
        {"params": [p for k, p in params.items() if is_norm(k)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(
        groups, LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=WEIGHT_DECAY,
        fused=device == "cuda",
    )  # fmt: skip

    def loss_fn(ids, targets):
        return torch_loss(s, params, ids, targets, cos, sin)

    compiled_loss = torch.compile(loss_fn) if compiled else loss_fn
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bf16")

    def step() -> float:
        with autocast:
            loss = compiled_loss(ids, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def run_torch(s: Scale, device: str, steps: int, dtype: str = "bf16") -> dict:
    return timed_torch_steps(torch_step(s, device, dtype), steps, device)


# -- the harness ---------------------------------------------------------------------------------

RUNNERS = {"accy": run_accy, "jax": run_jax, "torch": run_torch}


def worker(system: str, scale: str, device: str, steps: int, dtype: str) -> dict:
    """One system's run in this process. On CUDA, besides `peak_device_bytes` (the table's
    `peak MB`: CuPy's pool for accy, every block it held; PyTorch's peak allocated; XLA's peak
    in use), `peak_allocated_bytes` and `peak_reserved_bytes` measure accy and PyTorch alike:
    the most bytes their allocators handed out at once (accy: a CuPy memory hook installed
    before the model is made) and held from the device."""
    tracker = None
    if device == "cuda" and system == "accy":
        from bench.systems.cupy_memory import CupyPoolPeak

        tracker = CupyPoolPeak()
    result = RUNNERS[system](SCALES[scale], device, steps, dtype)
    if tracker is not None:
        import cupy

        result["peak_device_bytes"] = cupy.get_default_memory_pool().total_bytes()
        result["peak_reserved_bytes"] = result["peak_device_bytes"]
        result["peak_allocated_bytes"] = tracker.peak_bytes()
    if device == "cuda" and system == "torch":
        import torch

        result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    result["peak_host_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


def _spawn(system: str, args: argparse.Namespace, steps: int, cache: str) -> dict:
    env = dict(os.environ, ACCY_CACHE_DIR=cache, CUPY_CACHE_DIR=os.path.join(cache, "cupy"))
    command = [sys.executable, "-m", "bench.llama1b", "--worker", system, "--scale", args.scale]
    command += ["--device", args.device, "--steps", str(steps), "--dtype", args.dtype]
    done = run_captured(command, args.timeout, env)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["failed"],
                "tail": done.stderr[-2000:]}  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(system: str, result: dict, s: Scale, peak_flops: float | None) -> dict:
    """Step time, tokens/s, MFU and memory from one worker's result."""
    if "error" in result:
        return {"system": system, **result}
    step = statistics.median(result["step_times_s"])
    flops = model_flops(s)
    return {
        "system": system,
        "step_ms": step * 1e3,
        "tokens_per_s": s.batch * s.tokens / step,
        "model_tflops_per_s": flops / step / 1e12,
        "mfu": flops / step / peak_flops if peak_flops else None,
        "first_step_s": result["first_step_s"],
        "warm_first_step_s": result.get("warm_first_step_s"),
        "peak_device_bytes": result.get("peak_device_bytes"),
        "peak_allocated_bytes": result.get("peak_allocated_bytes"),
        "peak_reserved_bytes": result.get("peak_reserved_bytes"),
        "peak_host_rss_bytes": result["peak_host_rss_bytes"],
        "losses": result["losses"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.llama1b", description=__doc__)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--scale", default=None, choices=sorted(SCALES))
    parser.add_argument("--systems", default="accy,jax,torch")
    parser.add_argument("--dtype", default="bf16", choices=("f32", "bf16"))
    parser.add_argument("--steps", type=int, default=10, help="timed steps after the first")
    parser.add_argument("--timeout", type=float, default=None, help="seconds a worker may take")
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.scale = args.scale or args.device
    if args.worker:
        print(json.dumps(worker(args.worker, args.scale, args.device, args.steps, args.dtype)))
        return 0
    s = SCALES[args.scale]
    peak = GPU_PEAK_FLOPS if args.device == "cuda" else None
    rows = []
    for system in args.systems.split(","):
        with tempfile.TemporaryDirectory(prefix="accy-llama1b-cache-") as cache:
            result = _spawn(system, args, args.steps, cache)
            if system == "accy" and "error" not in result:
                warm = _spawn(system, args, 1, cache)  # the disk caches are filled
                result["warm_first_step_s"] = warm.get("first_step_s")
        rows.append(summarize(system, result, s, peak))
        _write(args.json, _report(args, s, peak, rows))  # what was measured so far
    report = _report(args, s, peak, rows)
    _print(report)
    _write(args.json, report)
    return 1 if any("error" in r for r in rows) else 0


def _report(args: argparse.Namespace, s: Scale, peak: float | None, rows: list[dict]) -> dict:
    return {
        "workload": "llama1b",
        "device": args.device,
        "dtype": args.dtype,
        "scale": asdict(s),
        "model_parameters": model_parameters(s),
        "model_flops_per_step": model_flops(s),
        "flops_formula": "6*N*B*T + 12*L*B*T^2*d (N without the input embedding)",
        "peak_flops": peak,
        "results": rows,
    }


def _print(report: dict) -> None:
    s = report["scale"]
    print(
        f"llama1b on {report['device']} in {report['dtype']}: {s['layers']} layers, width "
        f"{s['embed']}, {s['heads']}/{s['kv_heads']} heads, MLP {s['hidden']}, vocab "
        f"{s['vocab']}, batch {s['batch']} x {s['tokens']} tokens; "
        f"N = {report['model_parameters']:,}, {report['model_flops_per_step'] / 1e12:.2f} "
        "TFLOP a step"
    )
    print(
        "system | step ms | tokens/s | TFLOP/s | MFU | first step s | warm first s | peak MB | "
        "allocated / reserved MB | loss"
    )
    for r in report["results"]:
        if "error" in r:
            print(f"{r['system']} | error: {' '.join(r['error'])}")
            continue
        mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] else "-"
        warm = r.get("warm_first_step_s")
        peak = r["peak_device_bytes"] or r["peak_host_rss_bytes"]
        held = (r.get("peak_allocated_bytes"), r.get("peak_reserved_bytes"))
        both = " / ".join(f"{b / 2**20:.0f}" for b in held) if None not in held else "-"
        print(
            f"{r['system']} | {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | "
            f"{r['model_tflops_per_s']:.1f} | {mfu} | {r['first_step_s']:.2f} | "
            f"{'-' if warm is None else f'{warm:.2f}'} | {peak / 2**20:.0f} | {both} | "
            f"{r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
