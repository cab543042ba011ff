"""Gradient programs on the native CPU: for every differentiable kind and the usual
compositions, value_and_grad (and, for a few, forward-over-reverse second derivatives) computed
natively matches the reference evaluator. Kinds share programs to keep compiles few."""

from __future__ import annotations

import numpy as np

import accy
from accy import f32, f64, i32, nn, spec
from accy.core.kinds.elementwise import UNARY

from .conftest import assert_matches_reference

RNG = np.random.default_rng(99)
# trigamma's own derivative is not implemented (it is digamma's derivative).
SMOOTH_UNARY = [
    op for op in UNARY if op not in ("not", "sign", "floor", "ceil", "round", "trigamma")
]
POSITIVE_ONLY = {"log", "log1p", "sqrt", "rsqrt"}


def away_from_zero(*shape):
    return (RNG.uniform(0.3, 1.3, shape) * RNG.choice([-1.0, 1.0], shape)).astype(np.float32)


def positive(*shape):
    return RNG.uniform(0.5, 2.0, shape).astype(np.float32)


def check_gradients(program, inputs, wrt, rtol=2e-5, atol=1e-5):
    combined = accy.value_and_grad(program, wrt=wrt)
    assert_matches_reference(combined, inputs, rtol=rtol, atol=atol)


def test_gradients_of_every_unary_kind(native_cpu):
    def body(b, args):
        x, p = args
        terms = [b.unary(op, p if op in POSITIVE_ONLY else x) for op in SMOOTH_UNARY]
        terms[SMOOTH_UNARY.index("acosh")] = (p + 1.0).acosh()  # defined from 1 on
        terms += [b.unary(op, x) for op in ("sign", "floor", "round")]  # zero derivatives
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total.sum(("a", "b"))

    program = accy.trace.define("unary_grads", [spec(f32, a=2, b=3)] * 2, body)
    check_gradients(program, [away_from_zero(2, 3) * 0.7, positive(2, 3)], wrt=(0, 1))


def test_gradients_of_binary_select_convert_and_layout_kinds(native_cpu):
    def body(b, args):
        x, y, fill = args  # x: [a, b]; y: [b]; fill: scalar
        arithmetic = (x + y) * (x - y) / (y * y + 1.0) + x.pow(y * y) + x.max(y) - x.min(y)
        chosen = b.select(x > y, x * 2.0, y * 3.0)
        widened = (x.convert(f64) * 3.0).convert(f32)
        merged = x.transpose("b", "a").merge(("b", "a"), "ab")
        padded = merged.slice("ab", 1, 6, 2).pad("ab", 2, 1, value=fill, interior=1)
        joined = b.concatenate([padded, merged], "ab")
        return (arithmetic + chosen + widened).sum(("a", "b")) + (joined * joined).sum("ab")

    types = [spec(f32, a=2, b=3), spec(f32, b=3), spec(f32)]
    program = accy.trace.define("elementwise_grads", types, body)
    inputs = [positive(2, 3), away_from_zero(3), np.array(0.7, np.float32)]
    check_gradients(program, inputs, wrt=(0, 1, 2))


def test_gradients_of_reductions_with_init_parameters(native_cpu):
    def body(b, args):
        x, init = args
        ops = ("sum", "max", "min", "prod")
        total = x.reduce(init, ops[0], "b")
        for op in ops[1:]:
            total = total + x.reduce(init, op, "b")
        return total.sum("a") + x.reduce(init * 10.0, "max", ("a", "b"))  # the init wins here

    program = accy.trace.define("reduce_grads", [spec(f32, a=3, b=4), spec(f32)], body)
    values = (RNG.permutation(12) * 0.1 - 0.3).reshape(3, 4).astype(np.float32)
    check_gradients(program, [values, np.array(0.9, np.float32)], wrt=(0, 1))


def test_gradients_of_contractions(native_cpu):
    def body(b, args):
        x, y, u, v = args  # x: [b, m, k]; y: [k, b, n]; u: [k, m]; v: [k, n]
        batched = x.contract(y, "k").sum(("b", "m", "n"))
        noncanonical = b.dot_general(u, v, [0], [0], [], []).sum(("m", "n"))
        two_axes = x.contract(x.rename("m", "r"), ("b", "k")).sum(("m", "r"))
        return batched + noncanonical + two_axes

    types = [
        spec(f32, b=2, m=2, k=3),
        spec(f32, k=3, b=2, n=2),
        spec(f32, k=3, m=2),
        spec(f32, k=3, n=2),
    ]
    program = accy.trace.define("dot_grads", types, body)
    check_gradients(program, [away_from_zero(*t.extents) for t in types], wrt=(0, 1, 2, 3))


def test_gradients_of_gather_scatter_and_scan(native_cpu):
    def step(_, values):
        weight, carry, x = values
        new = (carry * weight + x).tanh()
        return new, new * new

    def body(b, args):
        table, ids, updates, weight, h0, xs = args
        gathered = table.gather(ids, "vocab")
        scattered = table.scatter_add(ids, updates * gathered, "vocab")
        (final,), (ys,) = b.scan(step, consts=[weight], carries=[h0], xs=[xs], axis="time")
        return (
            (scattered * scattered).sum(("vocab", "channel"))
            + final.sum("h")
            + ys.sum(("time", "h"))
        )

    types = [
        spec(f32, vocab=5, channel=2),
        spec(i32, token=4),
        spec(f32, token=4, channel=2),
        spec(f32, h=3),
        spec(f32, h=3),
        spec(f32, time=4, h=3),
    ]
    program = accy.trace.define("indexing_scan_grads", types, body)
    inputs = [away_from_zero(*t.extents) for t in types]
    inputs[1] = np.array([1, 3, 1, 9], np.int32)  # 9 is clamped to the last row
    check_gradients(program, inputs, wrt=(0, 2, 3, 4, 5))


def test_gradients_of_compositions(native_cpu):
    def body(b, args):
        x, q, k, v, mask = args
        compositions = (nn.softmax(x, "c") * nn.layer_norm(x, "c")).sum(("r", "c"))
        compositions = compositions + nn.logsumexp(nn.gelu_tanh(x), "c").sum("r")
        scores = q.contract(k.rename("token", "key"), "channel") + mask
        mixed = nn.softmax(scores, "key").contract(v.rename("token", "key"), "key")
        return compositions + (mixed * mixed).sum(("token", "channel"))

    types = [spec(f32, r=2, c=5)] + [spec(f32, token=4, channel=3)] * 3
    types.append(spec(f32, token=4, key=4))
    program = accy.trace.define("composition_grads", types, body)
    rows, cols = np.indices((4, 4))
    mask = np.where(cols <= rows, 0.0, -30.0).astype(np.float32)
    inputs = [away_from_zero(*t.extents) for t in types[:4]] + [mask]
    check_gradients(program, inputs, wrt=(0, 1, 2, 3))


def test_second_derivatives_of_an_mlp(native_cpu):
    def mlp_loss(b, args):
        x, w1, w2, y = args
        logits = x.contract(w1, "inp").tanh().contract(w2, "hidden")
        return nn.cross_entropy(logits, y, "out").sum("batch")

    types = [
        spec(f64, batch=3, inp=4),
        spec(f64, inp=4, hidden=5),
        spec(f64, hidden=5, out=2),
        spec(f64, batch=3, out=2),
    ]
    program = accy.trace.define("mlp", types, mlp_loss)
    hessian_vector = accy.jvp(accy.grad(program, wrt=(1,)), wrt=(1,))  # forward over reverse
    inputs = [RNG.standard_normal(t.extents) for t in types[:3]] + [np.eye(2)[[0, 1, 1]]]
    inputs.append(RNG.standard_normal((4, 5)))
    assert_matches_reference(hessian_vector, inputs, rtol=1e-9, atol=1e-12)
