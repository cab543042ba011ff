"""accy.nn's layers against PyTorch's (torch.nn.functional) and NumPy, on the reference
evaluator (the models tests run the CPU backend); Stacked's scan against its eager loop, with
gradients; the errors of misnamed inputs."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import nn
from accy.models.base import to_host

torch = pytest.importorskip("torch")
F = torch.nn.functional
KEY = accy.random.key(0)
rng = np.random.default_rng(0)


def named(values, axes):
    return accy.named(np.asarray(values, np.float32), axes, device="reference")


def host(x, axes):
    return to_host(x, axes)


def t(x):
    return torch.tensor(np.asarray(x))


def test_linear_embedding_and_norms_equal_torch():
    lin = nn.Linear.init(KEY, {"embed": 5}, {"hidden": 3}, device="reference")
    x = rng.normal(size=(4, 5)).astype(np.float32)
    want = F.linear(t(x), t(host(lin.weight, ("hidden", "embed"))), t(host(lin.bias, ("hidden",))))
    np.testing.assert_allclose(
        host(lin(named(x, ("batch", "embed"))), ("batch", "hidden")), want, atol=1e-6
    )
    bound = 1 / np.sqrt(5)
    assert np.abs(np.asarray(lin.weight)).max() <= bound and not np.asarray(lin.bias).any()

    emb = nn.Embedding.init(KEY, {"vocab": 7}, {"embed": 5}, device="reference")
    ids = np.array([[0, 6, 2]], np.int32)
    table = host(emb.weight, ("vocab", "embed"))
    got = emb(accy.named(ids, ("batch", "token"), device="reference"))
    np.testing.assert_array_equal(
        host(got, ("batch", "token", "embed")), F.embedding(t(ids), t(table))
    )
    np.testing.assert_allclose(
        host(emb.unembed(named(x, ("batch", "embed"))), ("batch", "vocab")), x @ table.T, atol=1e-5
    )

    ln = nn.LayerNorm.init({"embed": 5}, eps=1e-5, device="reference").replace(
        weight=named(rng.normal(size=5), "embed"), bias=named(rng.normal(size=5), "embed")
    )
    want = F.layer_norm(t(x), (5,), t(np.asarray(ln.weight)), t(np.asarray(ln.bias)), 1e-5)
    np.testing.assert_allclose(
        host(ln(named(x, ("batch", "embed"))), ("batch", "embed")), want, atol=1e-5
    )

    rms = nn.RMSNorm.init({"embed": 5}, eps=1e-6, device="reference").replace(
        weight=named(rng.normal(size=5), "embed")
    )
    want = F.rms_norm(t(x), (5,), t(np.asarray(rms.weight)), 1e-6)
    np.testing.assert_allclose(
        host(rms(named(x, ("batch", "embed"))), ("batch", "embed")), want, atol=1e-5
    )


def test_conv_equals_torch_conv2d():
    conv = nn.Conv.init(
        KEY, {"h": 3, "w": 3}, {"channel": 2}, {"feature": 4}, padding="same", device="reference"
    )
    conv = conv.replace(bias=named(rng.normal(size=4), "feature"))
    x = rng.normal(size=(1, 2, 6, 5)).astype(np.float32)
    kernel = host(conv.weight, ("feature", "channel", "h", "w"))
    want = F.conv2d(t(x), t(kernel), t(np.asarray(conv.bias)), padding="same")
    got = conv(named(x, ("batch", "channel", "h", "w")))
    np.testing.assert_allclose(host(got, ("batch", "feature", "h", "w")), want, atol=1e-5)


def torch_attention(x, mha, heads, kv_heads, positions=None, theta=None):
    """The same attention written with torch: projections, RoPE (rotate_half), repeat_kv,
    scaled_dot_product_attention (causal)."""
    e = x.shape[-1]
    group = heads // kv_heads
    q_axes = ("head", "group", "dim") if group > 1 else ("head", "dim")
    q = t(x) @ t(host(mha.query.weight, ("embed", *q_axes)).reshape(e, -1))
    k = t(x) @ t(host(mha.key.weight, ("embed", "head", "dim")).reshape(e, -1))
    v = t(x) @ t(host(mha.value.weight, ("embed", "head", "dim")).reshape(e, -1))
    batch, tokens = x.shape[:2]
    q = q.reshape(batch, tokens, heads, -1).transpose(1, 2)
    k = k.reshape(batch, tokens, kv_heads, -1).transpose(1, 2)
    v = v.reshape(batch, tokens, kv_heads, -1).transpose(1, 2)
    if theta is not None:
        d = q.shape[-1]
        inverse = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
        angles = torch.tensor(positions).float()[:, None] * inverse[None]
        cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

        def rotate_half(z):
            return torch.cat([-z[..., d // 2 :], z[..., : d // 2]], -1)

        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mixed = mixed.transpose(1, 2).reshape(batch, tokens, -1)
    return (mixed @ t(host(mha.output.weight, (*q_axes, "embed")).reshape(-1, e))).numpy()


@pytest.mark.parametrize("heads, kv_heads, theta", [(2, 2, None), (4, 2, 10000.0)])
def test_attention_with_grouped_heads_and_rope_equals_torch(heads, kv_heads, theta):
    mha = nn.MultiHeadAttention.init(
        KEY,
        {"embed": 8},
        heads,
        4,
        kv_heads=kv_heads,
        rope_theta=theta,
        use_bias=False,
        device="reference",
    )
    x = rng.normal(size=(2, 5, 8)).astype(np.float32)
    got = host(mha(named(x, ("batch", "token", "embed"))), ("batch", "token", "embed"))
    want = torch_attention(x, mha, heads, kv_heads, np.arange(5), theta)
    np.testing.assert_allclose(got, want, atol=1e-5)
    # a mask that keeps everything changes nothing; the cached path gives the same rows
    keep = accy.named(np.ones((5, 5), bool), ("token", "key"), device="reference")
    masked = mha(named(x, ("batch", "token", "embed")), mask=keep)
    np.testing.assert_allclose(host(masked, ("batch", "token", "embed")), want, atol=1e-5)
    cache = tuple(
        accy.named(
            np.zeros((2, 9, kv_heads, 4), np.float32),
            ("batch", "key", "head", "dim"),
            device="reference",
        )
        for _ in range(2)
    )
    positions = accy.named(np.arange(5, dtype=np.int32), "token", device="reference")
    out, (k, _) = mha(named(x, ("batch", "token", "embed")), positions=positions, cache=cache)
    np.testing.assert_allclose(host(out, ("batch", "token", "embed")), want, atol=1e-5)
    assert not host(k, ("batch", "key", "head", "dim"))[:, 5:].any()


def test_mlp_swiglu_and_dropout():
    x = rng.normal(size=(3, 4)).astype(np.float32)
    mlp = nn.SwiGLU.init(KEY, {"embed": 4}, {"hidden": 6}, device="reference")
    gate, up = (host(getattr(mlp, n).weight, ("embed", "hidden")) for n in ("gate", "up"))
    down = host(mlp.down.weight, ("hidden", "embed"))
    want = (F.silu(t(x @ gate)) * t(x @ up)).numpy() @ down
    np.testing.assert_allclose(
        host(mlp(named(x, ("batch", "embed"))), ("batch", "embed")), want, atol=1e-5
    )
    gelu = nn.MLP.init(KEY, {"embed": 4}, {"hidden": 6}, device="reference")
    w1, w2 = host(gelu.up.weight, ("embed", "hidden")), host(gelu.down.weight, ("hidden", "embed"))
    np.testing.assert_allclose(
        host(gelu(named(x, ("batch", "embed"))), ("batch", "embed")),
        F.gelu(t(x @ w1)).numpy() @ w2,
        atol=1e-5,
    )
    drop = nn.Dropout(0.5)
    ones = named(np.ones(1000), "n")
    assert drop(ones) is ones
    kept = np.asarray(drop(ones, key=accy.random.key(1)))
    assert set(np.unique(kept)) == {0.0, 2.0} and 0.4 < (kept == 0).mean() < 0.6


def test_stacked_scan_equals_its_loop_with_gradients():
    """The scan (with and without remat) and the unrolled loop under a trace give the eager
    loop's values, and gradients equal to finite differences."""

    def make(k):
        return nn.Linear.init(k, {"embed": 4}, {"out": 4}, device="reference").replace(
            outputs=("embed",)
        )

    for remat, unroll in ((False, False), (True, False), (False, True)):
        stacked = nn.Stacked.init(3, make, KEY, remat=remat).replace(unroll=unroll)
        x = named(rng.normal(size=(2, 4)), ("batch", "embed"))
        w = [host(stacked.layer(i).weight, ("embed", "out")) for i in range(3)]
        b = [np.asarray(stacked.layer(i).bias) for i in range(3)]
        want = np.asarray(x)
        for wi, bi in zip(w, b, strict=True):
            want = np.tanh(want @ wi + bi)

        def loss(s, x):
            return s.scan(lambda layer, h: (layer(h).rename("out", "embed").tanh(), ()), x)[0].sum()

        eager, _ = stacked.scan(lambda layer, h: (layer(h).rename("out", "embed").tanh(), ()), x)
        np.testing.assert_allclose(host(eager, ("batch", "embed")), want, atol=1e-5)
        value, grads = accy.jit(accy.value_and_grad(loss))(stacked, x)
        assert value.item() == pytest.approx(want.sum(), abs=1e-4)

        # the gradient of the first layer's bias, by finite differences in float64 NumPy
        def numpy_loss(bias0, x=x, w=w, b=b):
            h = np.asarray(x, np.float64)
            for i, (wi, bi) in enumerate(zip(w, b, strict=True)):
                h = np.tanh(h @ wi + (bias0 if i == 0 else bi))
            return h.sum()

        step = 1e-4
        numeric = [
            (numpy_loss(b[0] + step * e) - numpy_loss(b[0] - step * e)) / (2 * step)
            for e in np.eye(4)
        ]
        got = host(grads.layers.bias, ("layer", "out"))[0]
        np.testing.assert_allclose(got, numeric, atol=1e-4)


def test_layers_name_the_axes_they_miss():
    lin = nn.Linear.init(KEY, {"embed": 4}, {"hidden": 3}, device="reference")
    with pytest.raises(accy.AxisError, match="no input axis 'embed'.*rename"):
        lin(named(np.ones(4), "channel"))
    with pytest.raises(accy.AxisError, match="different names"):
        nn.Linear.init(KEY, {"a": 2}, {"a": 3})
    with pytest.raises(accy.AxisError, match="kv_heads \\(3\\) must divide heads \\(4\\)"):
        nn.MultiHeadAttention.init(KEY, {"embed": 8}, 4, 2, kv_heads=3)
    with pytest.raises(accy.AccyError, match="ids must be integers"):
        nn.Embedding.init(KEY, {"vocab": 3}, {"embed": 2})(named([1.0], "token"))
    with pytest.raises(accy.AccyError, match="at least one layer"):
        nn.Stacked.stack([])
