"""The `gpt2` workload of WORKLOADS.md ("Real-scale workloads"): one full training step of
GPT-2 (loss, gradients, AdamW) in accy, JAX and PyTorch, each in a fresh process.

    python -m bench.gpt2                                # the CPU scale, every installed system
    python -m bench.gpt2 --device cuda                  # the GPU scale (GPT-2 small, 8 x 1024)
    python -m bench.gpt2 --systems accy --scale check   # a tiny model: seconds, for the tests
    python -m bench.gpt2 --device cuda --json bench/results/gpt2-cuda.json
    python -m bench.gpt2 --device cuda --dtype bf16     # mixed precision (below)
    python -m bench.gpt2 --device cuda --dtype bf16 --scale cuda-b64   # GPT-2 small, 64 x 1024
    python -m bench.gpt2 --device cuda --dtype bf16 --systems accy,accy-layers   # both models

The model (same in the three systems; accy's is `accy.demo.gpt2`, shared with
`accy demo --preset`): token embedding over a vocab padded to 50304, learned
position embeddings, pre-LayerNorm blocks (causal attention with biases on the query/key/value
and output projections, a GELU-tanh MLP 4x wide with biases), a final LayerNorm, logits by the
token embedding (tied); loss = mean cross-entropy against integer next-token targets. The
system `accy-layers` is the same model as `accy.models.gpt2` (separate query, key and value
projections; the layers stacked and run by a scan, as `bench.llama1b`'s Llama) from the same
weights: one layer traced and compiled instead of twelve. AdamW:
lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices (rank >= 2, the embeddings
included, as nanoGPT; not on gains and biases), f32 master weights.
Precision (`--dtype`):
- f32: exact f32 GEMMs (JAX `precision="highest"`, PyTorch TF32 off).
- bf16, mixed precision, each system as its users write it; f32 master weights and AdamW state
  in all three, the loss in f32:
  - accy: `accy.nn.mixed_precision(f32, bf16, f32)`: the parameters cast to bf16 for the
    forward and backward pass, the logits cast to f32 for the cross-entropy, the gradients
    converted back to f32 (the transpose of `convert`);
  - JAX: the parameters cast to bf16 inside the jitted loss (`astype`), bf16 GEMMs with f32
    sums, the logits in f32, `jax.nn.dot_product_attention` (XLA's implementation);
  - PyTorch: `torch.autocast(dtype=torch.bfloat16)` around the compiled loss (bf16 GEMMs and
    SDPA's fused attention; PyTorch keeps layer norms and the cross-entropy in f32).
- accy's attention is `accy.nn.attention` (causal; on CUDA cuDNN's fused attention in bf16, as
  PyTorch's SDPA, and accy's FlashAttention kernels in f32, as PyTorch's memory-efficient
  SDPA; on the CPU the flash kernel or the composition, by size);
  `--accy-attention composition` writes it out (scores, `nn.causal_mask`, softmax) instead.

Reported per system: step time (median), tokens/s, model FLOP utilisation, peak memory, and
the time from a cold start to the end of the first step (tracing, differentiation, compilation
and the first step; for accy with empty disk caches: accy's and CuPy's of NVRTC binaries), and
for accy the same with warm disk caches (a second process), each split into phases
(`first_step_phases_s`: `bench.cold_phases`). Model FLOPs per step, as WORKLOADS.md:

    6 * N * B * T + 12 * L * B * T^2 * d

with N the parameters without the position embeddings (nanoGPT's count: 123,689,472 for
GPT-2 small), B the batch, T the tokens, L the layers, d the width. MFU divides the model
FLOP/s by the peak: 989 TFLOP/s (the H100/H200 dense bf16 peak WORKLOADS.md uses) on cuda, and
on the CPU `--cpu-peak-gflops` if given (else no MFU). accy updates parameters and optimizer
state in place (`donate_argnums=(0, 1)`, on cpu and cuda), and so does JAX (`jax.jit(step,
donate_argnums=(0, 1))`); PyTorch's optimizer updates its tensors in place anyway.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from accy.demo.gpt2 import (  # the model, shared with `accy demo --preset`
    BETA1,
    BETA2,
    EPS,
    LR,
    WEIGHT_DECAY,
    decayed,
    initial_values,
    model_flops,
    model_parameters,
    parameter_shapes,
)
from accy.demo.gpt2 import Config as Scale
from bench.measure import run_captured

GPU_PEAK_FLOPS = 989e12

SCALES = {
    "cuda": Scale(layers=12, heads=12, width=768, batch=8, tokens=1024),
    "cuda-b64": Scale(layers=12, heads=12, width=768, batch=64, tokens=1024),  # the large batch
    "cpu": Scale(layers=4, heads=4, width=256, batch=4, tokens=256),
    "check": Scale(layers=2, heads=2, width=16, batch=2, tokens=8, vocab=64),
}
CHAR_SCALES = {  # the char-gpt workload (bench.training): a byte vocabulary, 2 small blocks
    "cpu": Scale(layers=2, heads=4, width=64, batch=16, tokens=32, vocab=256),
    "check": Scale(layers=1, heads=2, width=8, batch=2, tokens=4, vocab=16),
}


def batch(s: Scale, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Random token ids {batch, token} and their next-token targets (int32)."""
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, s.vocab, (s.batch, s.tokens + 1), dtype=np.int32)
    return stream[:, :-1].copy(), stream[:, 1:].copy()


# -- accy ----------------------------------------------------------------------------------------


def accy_loss(p: dict, ids, targets, s: Scale, policy=None, fused: bool = False):
    """The mean next-token cross-entropy, in accy's named-axis API (`accy.demo.gpt2.loss`)."""
    from accy.demo.gpt2 import loss

    return loss(p, ids, targets, s, policy, fused)


def accy_step(s: Scale, device: str, dtype: str = "f32", fused: bool = False):
    """`step(params, state, ids, targets) -> (loss, params, state)`: one jitted function; in
    bf16 under `accy.nn.mixed_precision(f32, bf16, f32)` (`accy.demo.gpt2.training_step`)."""
    from accy.demo.gpt2 import training_step

    return training_step(s, device, dtype, fused)


def accy_inputs(s: Scale, device: str, seed: int = 0, dtype: str = "f32"):
    """Parameters, AdamW state (grouped "decay" and "plain"), ids and targets as named arrays.
    Parameters and state are f32 in every `dtype`: in bf16 they are the policy's f32 masters,
    cast to bf16 inside the step."""
    import accy
    from accy.demo.gpt2 import initial_state

    groups, state = initial_state(s, device, seed)
    ids, targets = batch(s)
    return (
        groups,
        state,
        accy.named(ids, ("batch", "token"), device=device),
        accy.named(targets, ("batch", "token"), device=device),
    )


def accy_stepper(s: Scale, device: str, dtype: str = "f32", fused: bool = True):
    """One accy training step in place, `step() -> loss` (a float: the step has finished);
    traced and compiled at its first call."""
    params, state, ids, targets = accy_inputs(s, device)
    train = accy_step(s, device, dtype, fused)
    held = [params, state]

    def step() -> float:
        loss, held[0], held[1] = train(held[0], held[1], ids, targets)
        return float(np.asarray(_host(loss.array)))

    return step


def run_accy(s: Scale, device: str, steps: int, dtype: str = "f32", fused: bool = False) -> dict:
    def make():
        params, state, ids, targets = accy_inputs(s, device)
        return accy_step(s, device, dtype, fused), [params, state], ids, targets

    return timed_accy_steps(make, device, steps, "nn.attention" if fused else "composition")


def timed_accy_steps(make, device: str, steps: int, attention: str) -> dict:
    """`timed_steps` of the accy step `make()` builds, `(step, [params, state], ids, targets)`
    (`step(params, state, ids, targets) -> (loss, params, state)`), with the time that took
    (`setup_s`) and where the first step's time goes (`first_step_phases_s`)."""
    import accy
    from bench.cold_phases import Phases, instrument, summary

    phases = Phases()  # where the first step's time goes (a few wrapped calls: no overhead)
    instrument(phases, gpu=device == "cuda")
    start = time.perf_counter()
    step, held, ids, targets = make()
    made = time.perf_counter()

    def one_step() -> float:
        loss, held[0], held[1] = step(held[0], held[1], ids, targets)
        return float(np.asarray(_host(loss.array)))

    result = timed_steps(one_step, steps, phases.measuring("first call (other)"))
    return result | {
        "setup_s": made - start,
        "backend": accy.__name__ + " " + device,
        "attention": attention,
        "first_step_phases_s": summary(phases),
    }


def hf_tensors(s: Scale, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`initial_values`' weights as Hugging Face's GPT-2 tensors by name (`wte.weight`,
    `h.0.attn.c_attn.weight`, ...: what `accy.models.gpt2.GPT2.from_tensors` reads).

    >>> tensors = hf_tensors(SCALES["check"], initial_values(SCALES["check"]))
    >>> tensors["h.1.attn.c_attn.weight"].shape, tensors["wpe.weight"].shape
    ((16, 48), (8, 16))
    """
    e = s.width
    tensors = {"wte.weight": values["embed"], "wpe.weight": values["position"]}
    for i in range(s.layers):
        p, h = f"l{i}_", f"h.{i}."
        tensors |= {
            h + "ln_1.weight": values[p + "ln1_gain"],
            h + "ln_1.bias": values[p + "ln1_bias"],
            h + "attn.c_attn.weight": values[p + "qkv"].reshape(e, 3 * e),
            h + "attn.c_attn.bias": values[p + "qkv_bias"].reshape(3 * e),
            h + "attn.c_proj.weight": values[p + "proj"].reshape(e, e),
            h + "attn.c_proj.bias": values[p + "proj_bias"],
            h + "ln_2.weight": values[p + "ln2_gain"],
            h + "ln_2.bias": values[p + "ln2_bias"],
            h + "mlp.c_fc.weight": values[p + "fc"],
            h + "mlp.c_fc.bias": values[p + "fc_bias"],
            h + "mlp.c_proj.weight": values[p + "out"],
            h + "mlp.c_proj.bias": values[p + "out_bias"],
        }
    return tensors | {"ln_f.weight": values["final_gain"], "ln_f.bias": values["final_bias"]}


def accy_layers_model(s: Scale, device: str, values: dict[str, np.ndarray] | None = None):
    """`accy.models.gpt2.GPT2` (its layers stacked and run by a scan, as the Llama of
    `bench.llama1b`) with `values` (default: `initial_values`, the weights every system starts
    from), the same model as `accy.demo.gpt2`'s."""
    from accy.models.gpt2 import GPT2

    values = initial_values(s) if values is None else values
    return GPT2.from_tensors(layers_config(s), hf_tensors(s, values), device=device)


def layers_config(s: Scale):
    """`accy.models.gpt2.Config` of scale `s` (its vocabulary padded as `s`'s)."""
    from accy.models.gpt2 import Config

    return Config(vocab=s.vocab, positions=s.tokens, embed=s.width, layers=s.layers,
                  heads=s.heads)  # fmt: skip


def layers_decayed(model) -> list[bool]:
    """Which of `accy_layers_model`'s leaves AdamW decays: the `weight` of every `Linear` and
    `Embedding` (the matrices and embeddings `decayed` names), not the layer norms' nor any
    bias."""
    from accy.frontend.tracing import leaf_paths

    return [path.endswith("['weight']") and "['ln_" not in path for path in leaf_paths(model)]


def accy_layers_step(s: Scale, device: str, dtype: str = "f32"):
    """(`step(model, state, ids, targets) -> (loss, model, state)`, the model, its AdamW
    state) for `accy_layers_model` (`accy_layers_training_step`)."""
    from accy.frontend.tracing import flatten

    model = accy_layers_model(s, device)
    step, optimizer = accy_layers_training_step(model, device, dtype)
    return step, model, optimizer.init(flatten(model)[0])


def accy_layers_training_step(model, device: str, dtype: str = "f32"):
    """(the jitted `step(model, state, ids, targets) -> (loss, model, state)`, its AdamW) for a
    model of `accy_layers_model`'s structure (its arrays or their types): weight decay on the
    matrices and embeddings (`layers_decayed`), as the other systems' (`model_training_step`)."""
    from accy import optim

    mask = layers_decayed(model)
    optimizer = optim.adamw(LR, BETA1, BETA2, EPS, weight_decay=WEIGHT_DECAY, mask=mask)
    return model_training_step(optimizer, device, dtype), optimizer


def model_training_step(optimizer, device: str, dtype: str = "f32", fp8=None):
    """The jitted `step(model, state, ids, targets) -> (loss, model, state)` of a language
    model of `accy.models` (called on token ids, giving logits over `vocab`): the mean
    cross-entropy, its gradient and `optimizer`'s update; in bf16 under
    `accy.nn.mixed_precision(f32, bf16, f32)` (`fp8`: the GEMM groups it runs in FP8). On
    devices that take donations, the model and state are donated (updated in place)."""
    import accy
    from accy import nn, optim
    from accy.frontend.tracing import flatten

    device = accy.device(device)
    policy = nn.mixed_precision(accy.f32, accy.bf16, accy.f32, fp8=fp8) if dtype == "bf16" else None

    def step(model, state, ids, targets):
        def loss(m):
            if policy is not None:
                m = policy.cast_to_compute(m)
                return nn.cross_entropy(policy.cast_to_output(m(ids)), targets, "vocab").mean()
            return nn.cross_entropy(m(ids), targets, "vocab").mean()

        value, grads = accy.value_and_grad(loss)(model)
        leaves, treedef = flatten(model)
        updates, state = optimizer.update(flatten(grads)[0], state, leaves)
        return value, treedef.unflatten(optim.apply_updates(leaves, updates)), state

    donate = (0, 1) if device.takes_donations else ()
    return accy.jit(step, device=device, donate_argnums=donate)


def abstract_layers_model(s: Scale):
    """`accy_layers_model` at scale `s` with each weight an abstract array (of its type,
    holding no memory), to trace and plan the step without the weights (as
    `bench.llama1b.abstract_model`).

    >>> print(abstract_layers_model(SCALES["cuda"]).blocks.layers.mlp.up.weight.ty)
    f32[layer=12, embed=768, hidden=3072]
    """
    import optree

    import accy
    from accy.frontend.lowered import abstract_inputs
    from accy.frontend.tracing import NAMESPACE

    tiny = Scale(layers=1, heads=1, width=2, batch=1, tokens=1, vocab=2)
    extents = {"layer": s.layers, "embed": s.width, "position": s.tokens, "head": s.heads,
               "dim": s.head_dim, "hidden": s.hidden, "vocab": s.vocab}  # fmt: skip

    def abstract(leaf):
        return abstract_inputs(accy.spec(leaf.dtype, **{axis: extents[axis] for axis in leaf.axes}))

    model = accy_layers_model(tiny, "reference")
    return optree.tree_map(abstract, model, namespace=NAMESPACE).replace(config=layers_config(s))


def run_accy_layers(
    s: Scale, device: str, steps: int, dtype: str = "f32", fused: bool = False
) -> dict:
    """`run_accy` for `accy_layers_step`'s model (its attention is `nn.attention`'s)."""

    def make():
        import accy

        step, model, state = accy_layers_step(s, device, dtype)
        ids, targets = (accy.named(a, ("batch", "token"), device=device) for a in batch(s))
        return step, [model, state], ids, targets

    return timed_accy_steps(make, device, steps, "nn.attention")


def _host(array):
    get = getattr(array, "get", None)
    return get() if callable(get) else array


def timed_steps(step, steps: int, first=None) -> dict:
    """The first call of `step` (building included; inside context `first`, if any), then
    `steps` timed steps, with losses."""
    start = time.perf_counter()
    with first or contextlib.nullcontext():
        losses = [step()]
    done = time.perf_counter()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
    return {"first_step_s": done - start, "step_times_s": times, "losses": losses}


# -- JAX -----------------------------------------------------------------------------------------


def jax_step(s: Scale, device: str, dtype: str = "f32"):
    """One JAX training step in place, `step() -> loss` (a float: the step has finished);
    nothing is traced or compiled before its first call."""
    import jax
    import jax.numpy as jnp
    import optax

    if dtype == "f32":
        jax.config.update("jax_default_matmul_precision", "highest")
    shapes = parameter_shapes(s)
    params = {k: jnp.asarray(v) for k, v in initial_values(s).items()}
    ids, targets = (jnp.asarray(a) for a in batch(s))
    mask = {k: decayed(k, shapes[k]) for k in params}
    optimizer = optax.adamw(LR, BETA1, BETA2, EPS, weight_decay=WEIGHT_DECAY, mask=mask)

    def norm(x, g, b):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g + b

    def loss_fn(p, ids, targets):
        if dtype == "bf16":  # f32 master weights, bf16 compute
            p = jax.tree.map(lambda value: value.astype(jnp.bfloat16), p)
        x = p["embed"][ids] + p["position"]
        for i in range(s.layers):
            h = norm(x, p[f"l{i}_ln1_gain"], p[f"l{i}_ln1_bias"])
            qkv = jnp.einsum("btc,cphk->pbthk", h, p[f"l{i}_qkv"])
            qkv = qkv + p[f"l{i}_qkv_bias"][:, None, None]
            mixed = jax.nn.dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            x = x + jnp.einsum("bthk,hkc->btc", mixed, p[f"l{i}_proj"]) + p[f"l{i}_proj_bias"]
            h = norm(x, p[f"l{i}_ln2_gain"], p[f"l{i}_ln2_bias"])
            u = jax.nn.gelu(h @ p[f"l{i}_fc"] + p[f"l{i}_fc_bias"], approximate=True)
            x = x + u @ p[f"l{i}_out"] + p[f"l{i}_out_bias"]
        logits = norm(x, p["final_gain"], p["final_bias"]) @ p["embed"].T
        logits = logits.astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))  # in place, as accy's step (fair)
    def step(p, opt, ids, targets):
        loss, grads = jax.value_and_grad(loss_fn)(p, ids, targets)
        updates, opt = optimizer.update(grads, opt, p)
        return loss, optax.apply_updates(p, updates), opt

    held = [params, optimizer.init(params)]

    def one_step() -> float:
        loss, held[0], held[1] = step(held[0], held[1], ids, targets)
        return float(loss)

    return one_step


def run_jax(s: Scale, device: str, steps: int, dtype: str = "f32", fused: bool = False) -> dict:
    return timed_jax_steps(jax_step(s, device, dtype), steps, device)


def timed_jax_steps(step, steps: int, device: str) -> dict:
    """`timed_steps` of a JAX step, with the device's peak memory on a GPU."""
    import jax

    result = timed_steps(step, steps)
    stats = jax.devices()[0].memory_stats() if device == "cuda" else None
    if stats:
        result["peak_device_bytes"] = stats.get("peak_bytes_in_use")
    return result


# -- PyTorch -------------------------------------------------------------------------------------


def torch_loss(s: Scale, p, ids, targets):
    """The model's mean cross-entropy in PyTorch, over parameters `p` (a mapping of the names
    of `parameter_shapes` to tensors); shared with bench/ddp_torch.py."""
    import torch
    import torch.nn.functional as F

    x = p["embed"][ids] + p["position"]
    b, t = ids.shape
    for i in range(s.layers):
        h = F.layer_norm(x, (s.width,), p[f"l{i}_ln1_gain"], p[f"l{i}_ln1_bias"])
        qkv = torch.einsum("btc,cphk->pbhtk", h, p[f"l{i}_qkv"])
        qkv = qkv + p[f"l{i}_qkv_bias"][:, None, :, None, :]
        mixed = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        attended = torch.einsum("bhtk,hkc->btc", mixed, p[f"l{i}_proj"])
        x = x + attended + p[f"l{i}_proj_bias"]
        h = F.layer_norm(x, (s.width,), p[f"l{i}_ln2_gain"], p[f"l{i}_ln2_bias"])
        u = F.gelu(h @ p[f"l{i}_fc"] + p[f"l{i}_fc_bias"], approximate="tanh")
        x = x + u @ p[f"l{i}_out"] + p[f"l{i}_out_bias"]
    x = F.layer_norm(x, (s.width,), p["final_gain"], p["final_bias"])
    logits = x @ p["embed"].T
    return F.cross_entropy(logits.float().view(b * t, -1), targets.view(-1))


def torch_step(s: Scale, device: str, dtype: str = "f32", compiled: bool = True):
    """One PyTorch training step, `step() -> loss` (a float: the step has finished): the loss
    under `torch.compile` (or eager: `compiled=False`), `backward()`, AdamW."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    where = torch.device(device)
    shapes = parameter_shapes(s)
    params = {
        k: torch.tensor(v, device=where, requires_grad=True) for k, v in initial_values(s).items()
    }
    ids, targets = (torch.tensor(a, device=where, dtype=torch.long) for a in batch(s))
    groups = [
        {"params": [p for k, p in params.items() if decayed(k, shapes[k])]},
        {"params": [p for k, p in params.items() if not decayed(k, shapes[k])], "weight_decay": 0},
    ]
    fused = device == "cuda"
    optimizer = torch.optim.AdamW(
        groups, LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=WEIGHT_DECAY, fused=fused
    )

    def loss_fn(ids, targets):
        return torch_loss(s, params, ids, targets)

    compiled_loss = torch.compile(loss_fn) if compiled else loss_fn
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bf16")

    def step():
        with autocast:
            loss = compiled_loss(ids, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())  # float() synchronizes

    return step


def run_torch(s: Scale, device: str, steps: int, dtype: str = "f32", fused: bool = False) -> dict:
    return timed_torch_steps(torch_step(s, device, dtype), steps, device)


def timed_torch_steps(step, steps: int, device: str) -> dict:
    """`timed_steps` of a PyTorch step, with the peak memory allocated on a GPU."""
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    result = timed_steps(step, steps)
    if device == "cuda":
        result["peak_device_bytes"] = torch.cuda.max_memory_allocated()
    return result


# -- accy, data-parallel over several GPUs (--gpus N) --------------------------------------------


def run_accy_data_parallel(s: Scale, steps: int, dtype: str = "f32", fused: bool = False) -> dict:
    """In each process of `accy launch --gpus N`: the accy step sharded {"batch": "data"} over
    the N GPUs (one process each, gradients psum-med through NCCL), at `s.batch` per GPU, the
    parameters and optimizer state donated; `fused` computes attention with `nn.attention`,
    as the one-GPU step does."""
    import dataclasses

    import accy
    from accy.mesh import Mesh
    from accy.mesh.bootstrap import Environment
    from accy.mesh.nccl import Distributed

    env = Environment.from_env()
    distributed = Distributed(Mesh(range(env.world_size), "data"), env)
    start = time.perf_counter()
    params, state, _, _ = accy_inputs(s, "cuda", dtype=dtype)
    whole = dataclasses.replace(s, batch=s.batch * env.world_size)
    _, _, ids, targets = accy_inputs(whole, "cuda", dtype=dtype)  # every process cuts its rows
    step = accy.shard(
        accy_step(s, "cuda", dtype, fused).fn, distributed.mesh, {"batch": "data"},
        device="cuda", distributed=distributed, donate_argnums=(0, 1),
    )  # fmt: skip
    made = time.perf_counter()
    loss, params, state = step(params, state, ids, targets)
    losses = [float(np.asarray(_host(loss.array)))]
    done = time.perf_counter()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss, params, state = step(params, state, ids, targets)
        losses.append(float(np.asarray(_host(loss.array))))
        times.append(time.perf_counter() - t0)
    sharded = step.sharded(params, state, ids, targets)
    executable = step.executable(params, state, ids, targets)
    import cupy

    result = {
        "rank": env.rank,
        "gpus": env.world_size,
        "batch_per_gpu": s.batch,
        "first_step_s": done - made,
        "setup_s": made - start,
        "step_times_s": times,
        "losses": losses,
        "psums": sharded.program.count("psum"),
        "mode": executable.mode,  # one CUDA graph per step, or segments between NCCL calls
        "mode_reason": executable.reason,
        "buckets": [b.nbytes for b in executable.plan.buckets] if executable.plan else None,
        "peak_device_bytes": cupy.get_default_memory_pool().total_bytes(),
    }
    distributed.close()
    return result


def data_parallel_main(args) -> int:
    """`--gpus N`: launch N processes (rank 0 reports), then summarize as `main` does."""
    from accy.launch import launch

    s = SCALES[args.scale or args.device]
    dtype = getattr(args, "dtype", "f32")
    with tempfile.TemporaryDirectory(prefix="accy-gpt2-dp-") as folder:
        out = os.path.join(folder, "rank0.json")
        command = [sys.executable, "-m", "bench.gpt2", "--dp-worker", out, "--scale"]
        command += [args.scale or args.device, "--steps", str(args.steps)]
        command += ["--dtype", dtype] if dtype != "f32" else []
        command += ["--accy-attention", args.accy_attention]
        command += ["--timeout", str(args.timeout)] if args.timeout else []
        code = launch(args.gpus, command)
        done = code == 0 and os.path.exists(out)
        result = json.loads(Path(out).read_text()) if done else None
    if result is None:
        print(f"gpt2 --gpus {args.gpus}: the processes failed (exit code {code})")
        return 1
    step = statistics.median(result["step_times_s"])
    tokens = args.gpus * s.batch * s.tokens
    report = {
        "workload": "gpt2",
        "system": "accy data-parallel",
        "accy_attention": args.accy_attention,
        "gpus": args.gpus,
        "dtype": dtype,
        "scale": asdict(s),
        "batch_per_gpu": s.batch,
        "step_ms": step * 1e3,
        "tokens_per_s": tokens / step,
        "tokens_per_s_per_gpu": tokens / step / args.gpus,
        "model_tflops_per_s": model_flops(s) * args.gpus / step / 1e12,
        **{k: result[k] for k in ("first_step_s", "setup_s", "psums", "peak_device_bytes")},
        **{k: result.get(k) for k in ("mode", "mode_reason", "buckets")},
        "loss_first": result["losses"][0],
        "loss_last": result["losses"][-1],
    }
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=2)
    return 0


# -- the harness ---------------------------------------------------------------------------------

RUNNERS = {"accy": run_accy, "accy-layers": run_accy_layers, "jax": run_jax, "torch": run_torch}
MODULES = {"accy": "accy", "accy-layers": "accy", "jax": "jax", "torch": "torch"}


def worker(
    system: str, scale: str, device: str, steps: int, dtype: str = "f32", fused: bool = False
) -> dict:
    s = SCALES[scale]
    result = RUNNERS[system](s, device, steps, dtype, fused)
    if device == "cuda" and MODULES[system] == "accy":
        import cupy

        result["peak_device_bytes"] = cupy.get_default_memory_pool().total_bytes()
    result["peak_host_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


def _installed(system: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(MODULES[system]) is not None


def _spawn(system: str, args: argparse.Namespace, scale: str, steps: int, cache: str) -> dict:
    # Both disk caches (accy's, and CuPy's of NVRTC binaries) start empty for the cold start.
    env = dict(os.environ, ACCY_CACHE_DIR=cache, CUPY_CACHE_DIR=os.path.join(cache, "cupy"))
    command = [sys.executable, "-m", "bench.gpt2", "--worker", system, "--scale", scale]
    command += ["--device", args.device, "--steps", str(steps), "--dtype", args.dtype]
    command += ["--accy-attention", args.accy_attention]
    done = run_captured(command, args.timeout, env)
    if done.returncode != 0:
        return {
            "error": done.stderr.strip().splitlines()[-1:] or ["failed"],
            "tail": done.stderr[-2000:],
        }
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(system: str, result: dict, s: Scale, device: str, peak_flops: float | None) -> dict:
    """Step time, tokens/s, MFU and memory from one worker's result."""
    if "error" in result:
        return {"system": system, **result}
    step = statistics.median(result["step_times_s"])
    flops = model_flops(s)
    summary = {
        "system": system,
        "step_ms": step * 1e3,
        "tokens_per_s": s.batch * s.tokens / step,
        "model_tflops_per_s": flops / step / 1e12,
        "mfu": flops / step / peak_flops if peak_flops else None,
        "first_step_s": result["first_step_s"],
        "peak_device_bytes": result.get("peak_device_bytes"),
        "peak_host_rss_bytes": result["peak_host_rss_bytes"],
        "loss_first": result["losses"][0],
        "loss_last": result["losses"][-1],
        "losses": result["losses"],  # every step's, to compare the systems' trajectories
    }
    for key in ("warm_first_step_s", "first_step_phases_s", "warm_first_step_phases_s"):
        if key in result:
            summary[key] = result[key]
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpt2", description=__doc__)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--scale", default=None, choices=sorted(SCALES))
    parser.add_argument("--systems", default="accy,jax,torch")
    parser.add_argument("--dtype", default="f32", choices=("f32", "bf16"))
    parser.add_argument(
        "--accy-attention", default="auto", choices=("auto", "composition", "fused")
    )
    parser.add_argument("--steps", type=int, default=10, help="timed steps after the first")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds each worker process may take"
    )
    parser.add_argument("--cpu-peak-gflops", type=float, default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    add_gpus_arguments(parser)
    args = parser.parse_args(argv)
    args.accy_attention = attention_for(args)
    if args.gpus or args.dp_worker:
        return gpus_main(args)
    scale = args.scale or args.device
    fused = args.accy_attention == "fused"
    if args.worker:
        print(json.dumps(worker(args.worker, scale, args.device, args.steps, args.dtype, fused)))
        return 0
    s = SCALES[scale]
    peak = GPU_PEAK_FLOPS if args.device == "cuda" else (args.cpu_peak_gflops or 0) * 1e9 or None
    rows: list[dict] = []
    for system in args.systems.split(","):
        if not _installed(system):
            rows.append({"system": system, "error": ["not installed"]})
            continue
        with tempfile.TemporaryDirectory(prefix="accy-gpt2-cache-") as cache:
            if MODULES[system] == "accy" and args.device == "cpu":
                from bench.machine_cache import seed

                seed(Path(cache))  # empty but for per-machine libraries
            result = _spawn(system, args, scale, args.steps, cache)
            if MODULES[system] == "accy" and "error" not in result:
                warm = _spawn(system, args, scale, 1, cache)  # the disk caches are filled
                result["warm_first_step_s"] = warm.get("first_step_s")
                result["warm_first_step_phases_s"] = warm.get("first_step_phases_s")
        rows.append(summarize(system, result, s, args.device, peak))
        _write(args.json, _report(args, s, peak, rows))  # what was measured so far
    report = _report(args, s, peak, rows)
    _print(report)
    _write(args.json, report)
    return 1 if any("error" in r and r["error"] != ["not installed"] for r in rows) else 0


def attention_for(args: argparse.Namespace) -> str:
    """`--accy-attention auto`: `nn.attention` (cuDNN's kernels in bf16 on CUDA, accy's f32
    FlashAttention kernels in f32; the CPU kernels or the composition by size on the CPU).
    "composition" writes the scores, softmax and weighted sum out instead."""
    return "fused" if args.accy_attention == "auto" else args.accy_attention


def _report(args: argparse.Namespace, s: Scale, peak: float | None, rows: list[dict]) -> dict:
    return {
        "workload": "gpt2",
        "device": args.device,
        "dtype": args.dtype,
        "accy_attention": args.accy_attention,
        "scale": asdict(s),
        "model_parameters": model_parameters(s),
        "model_flops_per_step": model_flops(s),
        "flops_formula": "6*N*B*T + 12*L*B*T^2*d (N without position embeddings)",
        "peak_flops": peak,
        "results": rows,
    }


def _write(path: str | None, report: dict) -> None:
    if path:
        with open(path, "w") as out:
            json.dump(report, out, indent=2)


def add_gpus_arguments(parser: argparse.ArgumentParser) -> None:
    """`--gpus N`: accy alone, data-parallel on N GPUs (one process each, accy.launch)."""
    parser.add_argument(
        "--gpus", type=int, default=0, help="accy data-parallel on N GPUs (batch per GPU)"
    )
    parser.add_argument("--dp-worker", default=None, help=argparse.SUPPRESS)


def gpus_main(args) -> int:
    if args.dp_worker:  # one process of the launch: rank 0 writes its result
        if args.timeout:  # a hung collective leaves every thread's stack in the log, not silence
            faulthandler.dump_traceback_later(args.timeout, exit=True)
        fused = getattr(args, "accy_attention", "composition") == "fused"
        result = run_accy_data_parallel(
            SCALES[args.scale or "cuda"], args.steps, getattr(args, "dtype", "f32"), fused
        )
        if result["rank"] == 0:
            with open(args.dp_worker, "w") as file:
                json.dump(result, file)
        return 0
    args.device = "cuda"
    return data_parallel_main(args)


def _print(report: dict) -> None:
    s = report["scale"]
    print(
        f"gpt2 on {report['device']} in {report['dtype']}: {s['layers']} layers, "
        f"{s['heads']} heads, width {s['width']}, batch {s['batch']} x {s['tokens']} tokens, "
        f"vocab {s['vocab']}; "
        f"N = {report['model_parameters']:,}, {report['model_flops_per_step'] / 1e9:.1f} "
        f"GFLOP a step"
    )
    header = (
        "system | step ms | tokens/s | TFLOP/s | MFU | first step s | warm first s | peak MB | loss"
    )
    print(header)
    for r in report["results"]:
        if "error" in r:
            print(f"{r['system']} | error: {' '.join(r['error'])}")
            continue
        mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] else "-"
        warm = r.get("warm_first_step_s")
        peak = r["peak_device_bytes"] or r["peak_host_rss_bytes"]
        print(
            f"{r['system']} | {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | "
            f"{r['model_tflops_per_s']:.3f} | {mfu} | {r['first_step_s']:.2f} | "
            f"{'-' if warm is None else f'{warm:.2f}'} | {peak / 2**20:.0f} | "
            f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
