"""The llama1b workload at the check scale: accy's training step (Llama, AdamW, the norms not
decayed) takes the same losses as the JAX (optax) and PyTorch (eager, `torch.optim.AdamW`)
steps written independently in the same file, in f32 and in bf16 mixed precision; and the
parameter and FLOP counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import llama1b

S = llama1b.SCALES["check"]
STEPS = 3


def _losses(run, steps=STEPS):
    return np.array([run() for _ in range(steps)])


def _accy_stepper(dtype):
    import accy

    step, model, state = llama1b.accy_step(S, "cpu", dtype)
    ids, targets = (accy.named(a, ("batch", "token")) for a in llama1b.batch(S))
    held = [model, state]

    def run():
        loss, held[0], held[1] = step(held[0], held[1], ids, targets)
        return float(loss.array)

    return run


F32_STEPPERS = {
    "accy": lambda: _accy_stepper("f32"),
    "jax": lambda: llama1b.jax_step(S, "cpu", "f32"),
    "torch": lambda: llama1b.torch_step(S, "cpu", "f32", compiled=False),
}


@pytest.fixture(scope="module")
def f32_losses():
    losses = {}

    def of(system):
        if system not in losses:
            losses[system] = _losses(F32_STEPPERS[system]())
        return losses[system]

    return of


@pytest.mark.slow
@pytest.mark.parametrize("peer", ["jax", "torch"])
def test_the_f32_steps_take_the_peers_losses(f32_losses, peer):
    pytest.importorskip(peer)  # PyTorch is a heavy oracle: not in the test extra
    accy_losses, theirs = f32_losses("accy"), f32_losses(peer)
    np.testing.assert_allclose(accy_losses, theirs, rtol=1e-5)
    # The decrements are the scale of the updates: gradients and AdamW, not only the forward.
    decrements = accy_losses[1:] - accy_losses[0]
    assert np.all(decrements < -1e-3)
    np.testing.assert_allclose(decrements, theirs[1:] - theirs[0], rtol=2e-3)
    assert abs(accy_losses[0] - math.log(S.vocab)) < 0.1


@pytest.mark.slow
def test_the_bf16_step_takes_jax_s_bf16_losses():
    accy_losses = _losses(_accy_stepper("bf16"))
    jax_losses = _losses(llama1b.jax_step(S, "cpu", "bf16"))
    np.testing.assert_allclose(accy_losses, jax_losses, rtol=2e-3)
    assert np.all(np.diff(accy_losses) < 0)


def test_weight_decay_skips_exactly_the_norm_weights():
    names = llama1b.tensor_shapes(S)
    assert sum(llama1b.is_norm(n) for n in names) == 2 * S.layers + 1
    assert not any(llama1b.is_norm(n) for n in names if n.endswith("proj.weight"))


def test_the_cuda_scale_is_a_1b_llama():
    s = llama1b.SCALES["cuda"]
    assert (s.layers, s.embed, s.heads, s.kv_heads, s.hidden, s.vocab, s.tokens) == (
        16, 2048, 32, 8, 8192, 32000, 2048,
    )  # fmt: skip
    per_layer = 2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 2048 * 8192 + 2 * 2048
    assert llama1b.model_parameters(s) == 16 * per_layer + 2 * 32000 * 2048 + 2048
    tokens = s.batch * s.tokens
    n = llama1b.model_parameters(s) - 32000 * 2048
    assert llama1b.model_flops(s) == 6 * n * tokens + 12 * 16 * tokens * 2048 * 2048


@pytest.mark.slow
def test_the_abstract_model_traces_the_step_of_the_weights():
    # tools/gpt2_memory.py plans the cuda scale's step from the model's types alone: the
    # program must be the one the bench's weights trace.
    import accy
    from tools.gpt2_memory import llama1b_program

    program, donated = llama1b_program("check", "bf16")
    step, model, state = llama1b.accy_step(S, "cpu", "bf16")
    ids, targets = (accy.named(a, ("batch", "token")) for a in llama1b.batch(S))
    staged, args, kwargs = step._staged_for((model, state, ids, targets), {})
    entry = staged.entry_for((args, kwargs))
    assert program.digest == entry.program.digest
    assert donated == entry.donate
    abstract = llama1b.abstract_model(llama1b.SCALES["cuda"])
    assert abstract.blocks.layers.self_attn.key.weight.shape == {
        "layer": 16, "embed": 2048, "head": 8, "dim": 64,
    }  # fmt: skip
