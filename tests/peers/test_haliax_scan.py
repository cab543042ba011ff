"""Haliax's tests/test_scan.py (stanford-crfm/haliax), case by case, in accy.

Haliax's `Stacked` module is, in accy, a module whose array fields carry the stacked axis
("block") and which `accy.scan` folds over along it (the stacked module is the xs; its Python
fields reach every step unchanged); `BlockSeq` is a Python loop over the unstacked blocks.
The per-block random keys of the Haliax tests draw the same noise here
(`jax.random.normal` of `jax.random.split(PRNGKey(2), 4)`), passed to the blocks as part of
the xs. The expected values come from the oracle the Haliax assertions use (the other form of
the same model, and jax.numpy on the same arrays). Haliax itself does not import under this
JAX.

The *_via methods and `Stacked.vmap` are `accy.nn.Stacked.scan` (fold and scan) and
`accy.vmap` over the stacked axis of its layers; `BlockSeq` is a Python loop over `layer(i)`.

Haliax's 22 cases: 21 translated, each test tagged with `@translates`, 1 not applicable
(`NOT_APPLICABLE`); as 21 test functions, 26 tests once parametrized: 25 passing, 1 skipped.
test_checkpoint_carries is translated for its five policies that need no checkpoint names;
the ones that save values by name (internals, cos, sin, sin_offload) or nest (nested) wait for
checkpoint names in accy.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import accy
from tests.peers.ledger import not_applicable_tests, translates

R = "reference"
BLOCK, E = 4, 10


def draw(key, shape, axes, normal=False):
    sample = (jax.random.normal if normal else jax.random.uniform)(jax.random.PRNGKey(key), shape)
    return accy.named(np.asarray(sample, np.float32), axes, device=R)


def block_noise():
    """hax.random.normal(key, x.axes) for each key of jax.random.split(PRNGKey(2), Block)."""
    keys = jax.random.split(jax.random.PRNGKey(2), BLOCK)
    noise = np.stack([np.asarray(jax.random.normal(k, (E,)), np.float32) for k in keys])
    return accy.named(noise, ("block", "E"), device=R)


@dataclasses.dataclass
class Module:
    named: accy.NamedArray  # E (stacked: block, E)
    array: accy.NamedArray  # a scalar (stacked: block); Haliax's is a bare jax array
    static: int  # a Python value: the same in every block

    def __call__(self, x, noise):
        return x + self.array + float(self.static) + noise


@dataclasses.dataclass
class PairModule(Module):
    def __call__(self, x, noise):
        return x + self.array + float(self.static) + noise, x * 2.0


@dataclasses.dataclass
class AuxModule(Module):
    def __call__(self, x, y, noise):
        return x + self.array + float(self.static) + noise, x * 2.0 + y


def stacked(cls=Module):
    """Stacked.init(Block, Module)(named=..., array=ones(Block), static=1)."""
    named = draw(0, (BLOCK, E), ("block", "E"))
    return cls(named, accy.named(np.ones(BLOCK, np.float32), "block", R), 1)


def unstacked(m):
    """m.unstacked(): one module per block."""
    return [type(m)(m.named["block", i], m.array["block", i], m.static) for i in range(BLOCK)]


def fold(m, x, noise):
    """Stacked.fold: each block's output is the next block's input."""
    return accy.scan(lambda x, b: (b[0](x, b[1]), None), x, (m, noise), axis="block")[0]


def seq_fold(m, x, noise):
    """BlockSeq.fold: the same, block by block in Python."""
    for i, block in enumerate(unstacked(m)):
        x = block(x, noise["block", i])
    return x


@pytest.mark.slow
@translates("test_unstacked")
def test_unstacked():
    m = stacked()
    assert m.named.axes == ("block", "E") and m.array.axes == ("block",) and m.static == 1
    blocks = unstacked(m)
    assert len(blocks) == BLOCK
    for i, module in enumerate(blocks):
        assert module.named.axes == ("E",) and module.array.axes == () and module.static == 1
        np.testing.assert_array_equal(module.named.array, m.named.array[i])
        assert module.array.item() == m.array.array[i]


@translates("test_seq_and_stacked_give_same_results")
def test_seq_and_stacked_give_same_results():
    m, noise = stacked(), block_noise()
    x = draw(1, (E,), ("E",))
    y = accy.jit(lambda x, noise: fold(m, x, noise))(x, noise)  # jit would trace m.static
    np.testing.assert_allclose(y.array, seq_fold(m, x, noise).array, atol=1e-5)
    expected = x.array + m.array.array.sum() + BLOCK * m.static + noise.array.sum(0)
    np.testing.assert_allclose(y.array, expected, atol=1e-5)
    # scanning a module that returns no (carry, y) pair is an error (Haliax: ValueError)
    with pytest.raises(accy.TransformError, match=r"must return a pair \(carry, y\)"):
        accy.scan(lambda x, b: b[0](x, b[1]), x, (m, noise), axis="block")


@translates("test_using_scan")
def test_using_scan():
    m, noise = stacked(PairModule), block_noise()
    x = draw(1, (E,), ("E",))
    y, intermediates = accy.jit(
        lambda x, noise: accy.scan(lambda x, b: b[0](x, b[1]), x, (m, noise), axis="block")
    )(x, noise)
    assert y.axes == ("E",) and intermediates.axes == ("block", "E")
    inputs = [x.array]
    for i in range(BLOCK):
        inputs.append(inputs[-1] + 1.0 + 1.0 + noise.array[i])
    np.testing.assert_allclose(y.array, inputs[-1], atol=1e-5)
    np.testing.assert_allclose(intermediates.array, 2.0 * np.stack(inputs[:-1]), atol=1e-5)


@translates("test_scan_with_aux_named_args")
def test_scan_with_aux_named_args():
    m, noise = stacked(AuxModule), block_noise()
    x = draw(1, (E,), ("E",))
    initial_y = draw(1, (E,), ("E",))  # the same for every block: a closure
    z, z_scan = accy.scan(lambda x, b: b[0](x, initial_y, b[1]), x, (m, noise), axis="block")
    carry, outs = x, []
    for i, block in enumerate(unstacked(m)):
        carry, out = block(carry, initial_y, noise["block", i])
        outs.append(out.array)
    np.testing.assert_allclose(z.array, carry.array, atol=1e-5)
    np.testing.assert_allclose(z_scan.array, np.stack(outs), atol=1e-5)


def _forward_scan_shapes(remat: bool) -> list[tuple[int, ...]]:
    """The result shapes of the forward scan in the gradient program of a fold over a Stacked
    module `y = cos(sin(x + named) + x) + x` (Haliax's test_checkpoint_carries module)."""
    named = draw(0, (BLOCK, E), ("block", "E"))

    def loss(named, x):
        def block(x, n):
            y = (x + n).sin()
            y = (y + x).cos()
            return y + x, None

        return accy.scan(block, x, named, axis="block", remat=remat)[0].sum()

    grad = accy.grad(loss)
    grad(named, draw(1, (E,), ("E",)))
    (entry,) = grad.staged.cache.values()
    forward = next(op for op in entry.program.operations if op.kind == "scan")
    return [t.extents for t in forward.result_types]


# Haliax's policies that save or offload values by checkpoint name (internals, cos, sin,
# sin_offload) or nest the remat (nested) are not among these: accy's scan offers remat or not,
# and it has no checkpoint names yet.
CHECKPOINT_CASES = [
    # (Haliax's name, its policy, accy's remat, Haliax's expected scan shapes)
    ("disabled", "ScanCheckpointPolicy(disable=True)", False, [(E,), (BLOCK, E), (BLOCK, E)]),
    ("carry_true", "True", True, [(E,), (BLOCK, E)]),
    ("carry", "save_carries=True, save_block_internals=False", True, [(E,), (BLOCK, E)]),
    ("everything", "save carries, inputs, internals", False, [(E,), (BLOCK, E), (BLOCK, E)]),
    ("simple", "ScanCheckpointPolicy(simple=True)", True, [(E,), (BLOCK, E)]),
]


@translates("test_checkpoint_carries")
@pytest.mark.parametrize("name,policy,remat,expected", CHECKPOINT_CASES, ids=lambda v: str(v))
def test_checkpoint_carries(name, policy, remat, expected):
    """What the gradient's forward scan stores: with remat only the carries (the final one
    and each step's), without it the block's internals too."""
    assert _forward_scan_shapes(remat) == expected


# -- Stacked.vmap and the *_via methods ------------------------------------------------------------


class Weighted(accy.nn.Module):
    """Haliax's `Module` of the *_via tests: one stacked weight `w`."""

    w: accy.NamedArray

    def __call__(self, x):
        return x + self.w

    def transform(self, x, y=0.0, z=0.0, static1=None, *, static2=None):
        return x + self.w + y + z + (0.0 if static1 is None else static1)

    def intermediate(self, x, y=0.0, z=0.0, static1=None, *, static2=None):
        return x + 2.0 * self.w + y + z + (0.0 if static1 is None else float(static1))

    def with_output(self, x, y=0.0, z=0.0, static1=None, *, static2=None):
        out = x + self.w + y + z + (0.0 if static1 is None else float(static1))
        return out, 2.0 * self.w + y


def weighted(block, e):
    """Stacked.init(Block, Module)(named=hax.random.uniform(PRNGKey(0), (Block, E)))."""
    named = draw(0, (block, e), ("block", "E"))
    return accy.nn.Stacked(Weighted(named), axis="block"), named


def fold_via(m, method, *args, **kwargs):
    """Stacked.fold_via(method)(x, *args): each block's method output is the next's input."""
    return lambda x: m.scan(lambda layer, h: (method(layer, h, *args, **kwargs), ()), x)[0]


def scan_via(m, method, *args, **kwargs):
    """Stacked.scan_via(method)(x, *args): (final carry, the stacked second outputs)."""

    def step(layer, h):
        carry, out = method(layer, h, *args, **kwargs)
        return carry, (out,)

    def run(x):
        carry, (outs,) = m.scan(step, x)
        return carry, outs

    return run


def vmap_via(m, method, *args, **kwargs):
    """Stacked.vmap_via(method)(x, *args): the method of every block on the same x."""
    return lambda x: accy.vmap(lambda layer: method(layer, x, *args, **kwargs), m.axis)(m.layers)


def block_loop(named, x, step):
    """The reference Python loop of the Haliax tests, on the NumPy arrays."""
    carry, outs = x, []
    for i in range(named.shape[0]):
        carry, out = step(carry, named[i])
        outs.append(out)
    return carry, outs


@translates("test_vmap")
def test_vmap():
    m, weights = weighted(BLOCK, E)
    x = draw(1, (E,), ("E",))
    y = accy.vmap(lambda layer: layer(x), "block")(m.layers)
    assert y.axes == ("block", "E")
    np.testing.assert_array_equal(y.array, weights.array + x.array)


@translates("test_fold_via")
def test_fold_via():
    m, named = weighted(3, 5)
    x = draw(1, (5,), ("E",))
    result = accy.jit(fold_via(m, Weighted.intermediate))(x)
    np.testing.assert_allclose(result.array, x.array + 2.0 * named.array.sum(0), rtol=1e-6)


@pytest.mark.slow
@translates("test_scan_via")
def test_scan_via():
    m, named = weighted(4, 6)
    x = draw(1, (6,), ("E",))
    carry, outs = accy.jit(scan_via(m, Weighted.with_output))(x)
    np.testing.assert_allclose(carry.array, x.array + named.array.sum(0), rtol=1e-6)
    assert outs.axes == ("block", "E")
    np.testing.assert_allclose(outs.array, 2.0 * named.array, rtol=1e-6)


@translates("test_scan_via_multi_args")
def test_scan_via_multi_args():
    m, named = weighted(4, 6)
    x, y, z = draw(1, (6,), ("E",)), draw(2, (6,), ("E",)), 3.0

    def method(layer, h, y, z, *, static1, static2):
        assert static1 is True and static2 is False
        return Weighted.with_output(layer, h, y, z)

    carry, outs = accy.jit(scan_via(m, method, y, z, static1=True, static2=False))(x)
    expected, expected_outs = block_loop(
        named.array, x.array, lambda c, w: (c + w + y.array + z, 2.0 * w + y.array)
    )
    np.testing.assert_allclose(carry.array, expected, rtol=1e-6)
    np.testing.assert_allclose(outs.array, np.stack(expected_outs), rtol=1e-6)


@translates("test_scan_via_static_args")
def test_scan_via_static_args():
    m, named = weighted(4, 6)
    x = draw(1, (6,), ("E",))

    def method(layer, h, static1, *, static2):
        assert static1 == 1.0 and static2 is False
        out = h + layer.w + static1
        return out, 2.0 * layer.w

    carry, outs = scan_via(m, method, 1.0, static2=False)(x)  # eagerly: a loop over blocks
    expected, expected_outs = block_loop(named.array, x.array, lambda c, w: (c + w + 1.0, 2 * w))
    np.testing.assert_allclose(carry.array, expected, rtol=1e-6)
    np.testing.assert_allclose(outs.array, np.stack(expected_outs), rtol=1e-6)


@translates("test_scan_via_doesnt_scan_scalars")
def test_scan_via_doesnt_scan_scalars():
    m, named = weighted(4, 6)
    x, scalar = draw(1, (6,), ("E",)), 4.0

    def method(layer, h, scalar):
        return h + layer.w + scalar, h * scalar

    carry, outs = accy.jit(scan_via(m, method, scalar))(x)
    expected, expected_outs = block_loop(
        named.array, x.array, lambda c, w: (c + w + scalar, c * scalar)
    )
    np.testing.assert_allclose(carry.array, expected, rtol=1e-6)
    np.testing.assert_allclose(outs.array, np.stack(expected_outs), rtol=1e-6)


@translates("test_fold_via_multi_args")
def test_fold_via_multi_args():
    m, named = weighted(3, 5)
    x, y, z = draw(1, (5,), ("E",)), draw(2, (5,), ("E",)), 3.0

    def method(layer, h, y, z, *, static1, static2):
        assert static1 is True and static2 is False
        return Weighted.intermediate(layer, h, y, z)

    result = accy.jit(fold_via(m, method, y, z, static1=True, static2=False))(x)
    expected, _ = block_loop(named.array, x.array, lambda c, w: (c + 2 * w + y.array + z, None))
    np.testing.assert_allclose(result.array, expected, rtol=1e-6)


@translates("test_fold_via_static_args")
def test_fold_via_static_args():
    m, named = weighted(3, 5)
    x = draw(1, (5,), ("E",))

    def method(layer, h, static1, *, static2):
        assert static1 is True and static2 is False
        return h + 2.0 * layer.w + float(static1)

    result = accy.jit(fold_via(m, method, True, static2=False))(x)
    expected, _ = block_loop(named.array, x.array, lambda c, w: (c + 2 * w + 1.0, None))
    np.testing.assert_allclose(result.array, expected, rtol=1e-6)


@translates("test_fold_via_doesnt_reduce_scalars")
def test_fold_via_doesnt_reduce_scalars():
    m, named = weighted(3, 5)
    x, scalar = draw(1, (5,), ("E",)), 4.0
    result = fold_via(m, lambda layer, h, s: h + 2.0 * layer.w + s, scalar)(x)
    expected, _ = block_loop(named.array, x.array, lambda c, w: (c + 2 * w + scalar, None))
    np.testing.assert_allclose(result.array, expected, rtol=1e-6)


@translates("test_vmap_via")
def test_vmap_via():
    m, named = weighted(4, 6)
    x = draw(1, (6,), ("E",))
    outs = vmap_via(m, Weighted.transform)(x)
    np.testing.assert_allclose(outs.array, x.array + named.array, rtol=1e-6)


@translates("test_vmap_via_multi_args")
def test_vmap_via_multi_args():
    m, named = weighted(4, 6)
    x, y, z = draw(1, (6,), ("E",)), draw(2, (6,), ("E",)), 3.0

    def method(layer, h, y, z, *, static1, static2):
        assert static1 is True and static2 is False
        return Weighted.transform(layer, h, y, z)

    outs = vmap_via(m, method, y, z, static1=True, static2=False)(x)
    np.testing.assert_allclose(outs.array, x.array + named.array + y.array + z, rtol=1e-6)


@translates("test_vmap_via_static_args")
def test_vmap_via_static_args():
    m, named = weighted(4, 6)
    x = draw(1, (6,), ("E",))

    def method(layer, h, static1, *, static2):
        assert static1 == 1.0 and static2 is False
        return h + layer.w + static1

    outs = vmap_via(m, method, 1.0, static2=False)(x)
    np.testing.assert_allclose(outs.array, x.array + named.array + 1.0, rtol=1e-6)


@translates("test_vmap_via_doesnt_vmap_scalars")
def test_vmap_via_doesnt_vmap_scalars():
    m, named = weighted(4, 6)
    x, scalar = draw(1, (6,), ("E",)), 4.0
    outs = vmap_via(m, lambda layer, h, s: h + layer.w + s, scalar)(x)
    np.testing.assert_allclose(outs.array, x.array + named.array + scalar, rtol=1e-6)


def blockseq_vmap_via(m, method, *args, **kwargs):
    """BlockSeq.vmap_via: the method of each block in turn, the outputs stacked along block."""
    blocks = [m.layer(i) for i in range(m.count)]
    return lambda x: accy.named(
        np.stack([np.asarray(method(b, x, *args, **kwargs).array) for b in blocks]),
        ("block", "E"),
        device=R,
    )


@translates("test_vmap_via_blockseq")
def test_vmap_via_blockseq():
    m, named = weighted(4, 6)
    x = draw(1, (6,), ("E",))
    outs = blockseq_vmap_via(m, Weighted.transform)(x)
    np.testing.assert_allclose(outs.array, x.array + named.array, rtol=1e-6)
    np.testing.assert_allclose(outs.array, vmap_via(m, Weighted.transform)(x).array)


@translates("test_vmap_via_blockseq_multi_args")
def test_vmap_via_blockseq_multi_args():
    m, named = weighted(4, 6)
    x, y, z = draw(1, (6,), ("E",)), draw(2, (6,), ("E",)), 3.0

    def method(layer, h, y, z, *, static1, static2):
        assert static1 is True and static2 is False
        return Weighted.transform(layer, h, y, z)

    outs = blockseq_vmap_via(m, method, y, z, static1=True, static2=False)(x)
    np.testing.assert_allclose(outs.array, x.array + named.array + y.array + z, rtol=1e-6)


@translates("test_vmap_via_consistency")
def test_vmap_via_consistency():
    m, _ = weighted(4, 6)
    x = draw(1, (6,), ("E",))
    via = vmap_via(m, Weighted.transform)(x)
    direct = accy.vmap(lambda layer: layer(x), "block")(m.layers)
    np.testing.assert_allclose(via.array, direct.array)


NOT_APPLICABLE = {
    "test_stacked_to_state_dict": (
        "Haliax's state-dict layout of a Stacked module (serialization, not a loop); accy's "
        "checkpoints are tested in tests/frontend/test_checkpoints.py"
    ),
}
test_not_applicable = not_applicable_tests(NOT_APPLICABLE)
