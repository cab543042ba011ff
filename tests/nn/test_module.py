"""accy.nn.Module as a tree (static fields, init=False fields, replace), partition/combine,
and the initialisers' distributions (checked against their closed forms with NumPy)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import accy
from accy import nn


def arr(values, axes, device="reference"):
    return accy.named(np.asarray(values, np.float32), axes, device=device)


class Affine(nn.Module):
    weight: accy.NamedArray
    bias: accy.NamedArray | None
    axis: str = "feature"  # a string: static
    power: int = 2  # a number: static (a hyper-parameter), not a traced scalar
    scale: float = nn.field(static=True, default=1.0)
    label: str = nn.field(static=True, default="affine", init=False)

    def __call__(self, x):
        y = (x * self.weight) ** self.power * self.scale
        return y if self.bias is None else y + self.bias


def test_module_fields_split_into_children_and_static_structure():
    m = Affine(arr([1.0, 2.0], "feature"), arr([0.5, 0.5], "feature"), power=3, scale=2.0)
    x = arr([1.0, 1.0], "feature")
    seen = []

    @accy.jit
    def loss(m, x):
        seen.append((m.axis, m.power, m.scale, m.label))
        return m(x).sum()

    assert loss(m, x).item() == pytest.approx(2 * (1 + 8) + 1)
    assert seen == [("feature", 3, 2.0, "affine")]  # Python values inside the trace
    g = accy.grad(lambda m: m(x).sum())(m)
    assert isinstance(g, Affine) and (g.power, g.scale, g.label) == (3, 2.0, "affine")
    np.testing.assert_allclose(g.weight.array, 2.0 * 3 * np.array([1.0, 4.0]))  # 3 w^2 x^3 s
    np.testing.assert_allclose(g.bias.array, [1.0, 1.0])
    loss(m.replace(power=2), x)  # another static value is another signature
    assert loss.traces == 2


def test_replace_keeps_fields_and_rejects_unknown_names():
    m = Affine(arr([1.0], "feature"), None)
    assert m.replace(scale=3.0).scale == 3.0 and m.replace(scale=3.0).label == "affine"
    with pytest.raises(accy.AccyError, match="no field 'wieght'.*fields are"):
        m.replace(wieght=None)
    with pytest.raises(AttributeError):
        m.scale = 2.0  # frozen


def test_partition_and_combine_split_trainable_from_frozen():
    model = {
        "proj": nn.Linear.init(accy.random.key(0), {"a": 3}, {"b": 2}, device="reference"),
        "norm": nn.LayerNorm.init({"b": 2}, device="reference"),
    }
    decay, rest = nn.partition(model, nn.is_matrix)
    assert decay["proj"].weight is model["proj"].weight and decay["proj"].bias is None
    assert rest["norm"].weight is model["norm"].weight and rest["proj"].weight is None
    frozen, trainable = nn.partition(model, lambda path, leaf: "'norm'" in path, paths=True)
    assert frozen["proj"].weight is None and trainable["norm"].bias is None
    x = arr(np.ones(3), "a")

    def loss(trainable, frozen):
        m = nn.combine(trainable, frozen)
        return m["norm"](m["proj"](x)).sum(), m

    grads = accy.grad(lambda t: loss(t, frozen)[0])(trainable)
    assert grads["norm"].weight is None and grads["proj"].weight.shape == {"a": 3, "b": 2}
    back = nn.combine(trainable, frozen)
    assert back["proj"].weight is model["proj"].weight
    assert nn.parameter_count(model) == 3 * 2 + 2 + 2 + 2
    with pytest.raises(accy.AccyError, match="another structure"):
        nn.combine(trainable, {"x": 1})


@pytest.mark.slow
def test_initialisers_follow_their_distributions():
    key = accy.random.key(3)
    shape = {"fan_in": 200, "fan_out": 300}
    xavier = nn.init.xavier_uniform(key, shape, "fan_in", "fan_out").array
    bound = math.sqrt(6.0 / 500)
    assert np.abs(xavier).max() <= bound and np.abs(xavier).max() > 0.99 * bound
    assert xavier.std() == pytest.approx(bound / math.sqrt(3.0), rel=0.02)
    he = nn.init.he_normal(key, shape, "fan_in").array
    assert he.std() == pytest.approx(math.sqrt(2.0 / 200), rel=0.02)
    assert nn.init.xavier_normal(key, shape, "fan_in", "fan_out").array.std() == pytest.approx(
        math.sqrt(2.0 / 500), rel=0.02
    )
    assert np.abs(nn.init.he_uniform(key, shape, "fan_in").array).max() <= math.sqrt(6 / 200)
    truncated = nn.init.truncated_normal(key, shape, std=0.5, lower=-1.0, upper=1.0).array
    assert np.abs(truncated).max() <= 0.5
    # the standard deviation of a normal truncated to one standard deviation each side
    phi = math.exp(-0.5) / math.sqrt(2 * math.pi)
    expected = 0.5 * math.sqrt(1 - 2 * phi / math.erf(1 / math.sqrt(2)))
    assert truncated.std() == pytest.approx(expected, rel=0.02)
    uniform = nn.init.uniform(key, {"n": 1000}, -2.0, 3.0).array
    assert uniform.min() >= -2.0 and uniform.max() < 3.0
    # the same key draws the same numbers; another key others
    np.testing.assert_array_equal(
        nn.init.normal(key, {"n": 8}).array, nn.init.normal(key, {"n": 8}).array
    )
    first, second = nn.init.split(key)
    assert not np.array_equal(
        nn.init.normal(first, {"n": 8}).array, nn.init.normal(second, {"n": 8}).array
    )


def test_initialisers_name_what_is_wrong():
    key = accy.random.key(0)
    with pytest.raises(accy.AxisError, match="fan_in names the axis 'embd'.*embed"):
        nn.init.he_normal(key, {"embed": 4, "hidden": 2}, "embd")
    with pytest.raises(accy.AccyError, match="two 32-bit words"):
        nn.init.normal(np.zeros(3, np.float32), {"n": 2})
    with pytest.raises(accy.AxisError, match="dict from axis name to extent"):
        nn.init.normal(key, (4, 2))
    with pytest.raises(accy.AccyError, match="upper"):
        nn.init.truncated_normal(key, {"n": 2}, lower=1.0, upper=-1.0)


def test_initialisers_record_into_a_trace_given_a_traced_key():
    @accy.jit
    def draw(key):
        return nn.init.normal(key, {"n": 6}, std=2.0)

    key = accy.named(accy.random.key(5), "key")
    np.testing.assert_allclose(
        draw(key).array, nn.init.normal(accy.random.key(5), {"n": 6}, 2.0).array, rtol=1e-6
    )


def test_decay_mask_judges_stacked_layers_as_one_layer_holds_them():
    # nanoGPT decays every parameter of rank >= 2: the matrices and embeddings, not the
    # LayerNorm gains or the biases. A Stacked model's gains are {layer, embed}: rank 2 by
    # count, a gain by what one layer holds.
    def block(key):
        return {
            "norm": nn.LayerNorm.init({"embed": 4}),
            "proj": nn.Linear.init(key, {"embed": 4}, {"out": 2}),
        }

    model = {
        "blocks": nn.Stacked.init(3, block, accy.random.key(0)),
        "outer": nn.Stacked.stack(
            [nn.Stacked.init(2, block, accy.random.key(1))] * 2, axis="stage"
        ),
        "head": nn.Linear.init(accy.random.key(2), {"embed": 4}, {"vocab": 5}),
    }
    leaves = accy.frontend.tracing.flatten(model)[0]
    paths = accy.frontend.tracing.leaf_paths(model)
    # The oracle: the rank each leaf has in one unstacked layer, as PyTorch's p.dim() sees it.
    stacked_rank = {"blocks": 1, "outer": 2, "head": 0}
    expected = [
        leaf.ty.rank - stacked_rank[path.split("'")[1]] >= 2 and not path.endswith("['bias']")
        for path, leaf in zip(paths, leaves, strict=True)
    ]
    assert accy.nn.decay_mask(model) == expected
    assert expected.count(True) == 3  # the two stacks' proj weights and the head's
    # Counting every axis, as `decayed` alone does, would decay the stacked gains.
    assert [nn.decayed(p, leaf) for p, leaf in zip(paths, leaves, strict=True)] != expected
