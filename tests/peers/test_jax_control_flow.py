"""JAX's tests/lax_control_flow_test.py (jax-ml/jax), case by case, in accy.

Each test is named after the JAX case it translates and uses that case's inputs; the expected
values are JAX's own results on the same inputs, computed in this run with `jax.lax` (float64,
as the JAX suite runs with x64), or the plain-Python reference the JAX case compares with.
Positions become names: a leading axis to scan over is `axis="time"`, `in_axes=0` is a named
axis that the mapped arrays carry. accy promotes no dtype, so an int loop counter added to a
float is converted explicitly.

JAX's 161 cases here (test methods; a parametrized one counted once, its parameters a
representative subset): 137 translated, each test tagged with `@translates`, and 24 not
applicable (`NOT_APPLICABLE`, one skipped test each, with its reason). As 130 test functions (a
few JAX cases merged), 219 tests once parametrized: 159 passing in the default run, 36 more in
the slow run (the jit variants and batch-axis positions JAX also runs, more parameters of the
randomized cases, the longer RNN), 24 skipped.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np
import optree
import pytest
from jax import lax

import accy
from accy.frontend.tracing import NAMESPACE
from tests.peers.ledger import not_applicable_tests, translates

R = "reference"
jit = functools.partial(accy.jit, device=R)


@pytest.fixture(autouse=True)
def x64():
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


def f64(values, axes=()):
    return accy.named(np.asarray(values, np.float64), axes, device=R)


def i32(values, axes=()):
    return accy.named(np.asarray(values, np.int32), axes, device=R)


def value(x):
    """A NamedArray (or a tree of them) as NumPy, for comparisons."""
    return jax.tree.map(np.asarray, x, is_leaf=lambda v: isinstance(v, accy.NamedArray))


def program_of(transformed):
    """The one Program a transformed function (jit, vmap) built so far."""
    staged = getattr(transformed, "staged", None) or transformed._staged[()]
    (entry,) = staged.cache.values()
    return entry.program


# -- while_loop ----------------------------------------------------------------------------------


@translates("LaxControlFlowTest.testWhileWithTuple")
def test_while_with_tuple():
    limit = 10

    def loop(init):
        _, count = accy.while_loop(
            lambda s: s[0] < limit, lambda s: (s[0] + 1, s[1] + 1), (init, i32(0))
        )
        return count

    cloop = jit(loop)
    jax_loop = jax.jit(
        lambda init: lax.while_loop(
            lambda s: s[0] < limit, lambda s: (s[0] + 1, s[1] + 1), (init, 0)
        )
    )
    for init in (2, 3):
        expected = jax_loop(init)
        assert loop(i32(init)).item() == cloop(init).item() == int(expected[1]) == limit - init


@translates("LaxControlFlowTest.testWhileWithManyArgs")
def test_while_with_many_args():
    carry = tuple(
        jit(
            lambda: accy.while_loop(
                lambda s: s[0] < 2, lambda s: tuple(x + 1 for x in s), (0,) * 256
            )
        )()
    )
    assert len(carry) == 256 and all(c.item() == 2 for c in carry)


def _outer_loop(num):
    def inner_loop(i, count):
        _, _, count = accy.while_loop(
            lambda s: s[1] <= s[0], lambda s: (s[0], s[1] + 1, s[2] + 1), (i, 0, count)
        )
        return count

    _, i, count = accy.while_loop(
        lambda s: s[1] < s[0], lambda s: (s[0], s[1] + 1, inner_loop(s[1], s[2])), (num, 0, 0)
    )
    return i, count


@translates("LaxControlFlowTest.testNestedWhile")
def test_nested_while():
    cloop = jit(_outer_loop)
    assert tuple(v.item() for v in _outer_loop(i32(3))) == (3, 6)
    for num, expected in ((3, (3, 6)), (3, (3, 6)), (2, (2, 3)), (4, (4, 10))):
        assert tuple(v.item() for v in cloop(num)) == expected


@translates("LaxControlFlowTest.testWhileWithClosure", "LaxControlFlowTest.testWhileWithClosureJit")
@pytest.mark.parametrize("inner_jit", [False, True], ids=["closure", "closure_jit"])
def test_while_with_closure(inner_jit):
    effect = [False]

    def loop(init, local_limit, inc):
        def body(state):
            effect[0] = True
            pos, count = state
            step = lambda pos, inc: (pos + 1, count + inc)  # noqa: E731
            return jit(step)(pos, inc) if inner_jit else step(pos, inc)

        return accy.while_loop(lambda s: s[0] < local_limit, body, (init, 0))[1]

    cloop = jit(loop)
    limit = 10
    assert loop(i32(2), i32(limit), i32(1)).item() == limit - 2 and effect[0]
    effect[0] = False
    assert cloop(2, limit, 1).item() == limit - 2 and effect[0]
    effect[0] = False
    assert cloop(2, limit, 1).item() == limit - 2
    assert cloop(3, limit, 1).item() == limit - 3
    assert not effect[0]  # traced once per signature


@translates("LaxControlFlowTest.testWhileTypeErrors")
def test_while_type_errors():
    with pytest.raises(accy.TransformError, match="cond_fn must return a bool scalar, got a tree"):
        accy.while_loop(lambda c: (1.0, 1.0), lambda c: c, f64(0.0))
    with pytest.raises(
        accy.TransformError, match=r"cond_fn must return a bool scalar, got f32\[\]"
    ):
        accy.while_loop(lambda c: np.float32(1.0), lambda c: c, np.float32(0.0))
    with pytest.raises(accy.TransformError, match="must have its initial value's structure"):
        jit(lambda: accy.while_loop(lambda c: True, lambda c: (1.0, 1.0), 0.0))()
    with pytest.raises(accy.TransformError, match=r"the carry\[1\] has type bool\[\], but its"):
        jit(
            lambda: accy.while_loop(lambda c: c[0], lambda c: (True, True), (True, np.float32(0)))
        )()


@translates("LaxControlFlowTest.testWhileLoopBatched")
def test_while_loop_batched():
    def fun(x):
        return accy.while_loop(lambda x: x < 3, lambda x: x + 2, x)

    xs = np.array([0, 1, 2, 3], np.int32)
    expected = jax.vmap(lambda x: lax.while_loop(lambda x: x < 3, lambda x: x + 2, x))(xs)
    for f in (fun, jit(fun)):
        out = accy.vmap(f, "batch")(i32(xs, "batch"))
        np.testing.assert_array_equal(out.array, expected)
        np.testing.assert_array_equal(out.array, [4, 3, 4, 3])


@translates("LaxControlFlowTest.testWhileLoopBatchedWithConstBody")
def test_while_loop_batched_with_const_body():
    def f(x):
        return accy.while_loop(lambda _: False, lambda _: np.float64(0.0), x)

    x = np.arange(5.0)
    np.testing.assert_array_equal(accy.vmap(f, "batch")(f64(x, "batch")).array, x)


@translates("LaxControlFlowTest.testWhileLoopCondConstsBatched")
def test_while_loop_cond_consts_batched():
    def fun(x, y):
        return accy.while_loop(lambda x: x < y, lambda x: x + 2, x)

    expected = jax.vmap(
        lambda x, y: lax.while_loop(lambda x: x < y, lambda x: x + 2, x), in_axes=(None, 0)
    )(0, np.array([2, 3]))
    out = accy.vmap(fun, "batch", in_axes=(None, 0))(0, i32([2, 3], "batch"))
    np.testing.assert_array_equal(out.array, expected)


@translates("LaxControlFlowTest.testWhileLoopBodyConstsBatched")
def test_while_loop_body_consts_batched():
    def fun(x, y):
        return accy.while_loop(lambda x: x < 3, lambda x: x + y, x)

    expected = jax.vmap(
        lambda x, y: lax.while_loop(lambda x: x < 3, lambda x: x + y, x), in_axes=(None, 0)
    )(0, np.array([2, 3]))
    out = accy.vmap(fun, "batch", in_axes=(None, 0))(0, i32([2, 3], "batch"))
    np.testing.assert_array_equal(out.array, expected)


@translates("LaxControlFlowTest.testWhileLoopTupleBatched")
def test_while_loop_tuple_batched():
    def fun(x, y):
        return accy.while_loop(lambda c: c[0] + c[1] < 5, lambda c: (c[0] + 1, c[1]), (x, y))

    def jax_fun(x, y):
        return lax.while_loop(lambda c: c[0] + c[1] < 5, lambda c: (c[0] + 1, c[1]), (x, y))

    x, y = np.array([0, 0]), np.array([1, 2])
    expected = jax.vmap(jax_fun)(x, y)
    out = accy.vmap(fun, "batch")(i32(x, "batch"), i32(y, "batch"))
    for got, want in zip(out, expected, strict=True):
        np.testing.assert_array_equal(got.array, want)


@translates("LaxControlFlowTest.test_while_loop_fixed_point_with_batched_pred_and_consts")
def test_while_loop_fixed_point_with_batched_pred_and_consts():
    def f(i, x):
        return accy.while_loop(
            lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] + x), (i, f64(np.ones(3), "n"))
        )[1]

    def jax_f(i, x):
        return lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] + x), (i, jnp.ones(3)))[
            1
        ]

    expected = jax.vmap(jax_f, in_axes=(0, 1))(jnp.arange(4), jnp.ones((3, 4)))
    out = accy.vmap(f, "batch")(i32(np.arange(4), "batch"), f64(np.ones((3, 4)), ("n", "batch")))
    np.testing.assert_array_equal(out.array, expected)


@translates("LaxControlFlowTest.testWhileCondConstant")
def test_while_cond_constant():
    assert accy.while_loop(lambda _: False, lambda _: (), ()) == ()
    assert jit(lambda: accy.while_loop(lambda _: False, lambda _: (), ()))() == ()


def _while_loop_reference(cond, body, carry):
    while cond(carry):
        carry = body(carry)
    return carry


@translates("LaxControlFlowTest.testWhileJVP")
@pytest.mark.parametrize(
    "jit_loop,jit_body,jit_cond",
    [
        (a, b, c)
        if (a, b, c) in ((False, False, False), (True, False, True), (True, True, True))
        else pytest.param(a, b, c, marks=pytest.mark.slow)
        for a in (False, True)
        for b in (False, True)
        for c in (False, True)
    ],
)
def test_while_jvp(jit_loop, jit_body, jit_cond):
    cond = lambda x: x["r", 0, "c", 2] <= 8.0  # noqa: E731
    body = lambda x: x * x  # noqa: E731
    cond = jit(cond) if jit_cond else cond
    body = jit(body) if jit_body else body
    loop = functools.partial(accy.while_loop, cond, body)
    loop = jit(loop) if jit_loop else loop
    x = np.arange(9.0).reshape(3, 3)
    reference = functools.partial(_while_loop_reference, lambda x: x[0, 2] <= 8, lambda x: x * x)
    y_expected, dy_expected = jax.jvp(reference, (x,), (x,))
    y, dy = accy.jvp(loop, (f64(x, ("r", "c")),), (f64(x, ("r", "c")),))
    np.testing.assert_allclose(y.array, y_expected)
    np.testing.assert_allclose(dy.array, dy_expected)


@translates("LaxControlFlowTest.testWhileLinearize")
@pytest.mark.parametrize(
    "jit_loop,jit_body",
    [(False, False), (True, True)]
    + [pytest.param(*m, marks=pytest.mark.slow) for m in ((False, True), (True, False))],
)
def test_while_linearize(jit_loop, jit_body):
    body = jit(lambda x: x * x) if jit_body else (lambda x: x * x)
    loop = functools.partial(accy.while_loop, lambda x: x["r", 0, "c", 2] <= 8.0, body)
    loop = jit(loop) if jit_loop else loop
    x = np.arange(9.0).reshape(3, 3)
    reference = functools.partial(_while_loop_reference, lambda x: x[0, 2] <= 8, lambda x: x * x)
    y_expected, dy_expected = jax.jvp(reference, (x,), (x,))
    y, f_lin = accy.linearize(loop, f64(x, ("r", "c")))
    np.testing.assert_allclose(y.array, y_expected)
    np.testing.assert_allclose(f_lin(f64(x, ("r", "c"))).array, dy_expected)


@translates("LaxControlFlowTest.testWhileJVPViaForiLoop")
def test_while_jvp_via_fori_loop():
    f = lambda x: accy.fori_loop(0, 3, lambda i, x: x * 2.0, x)  # noqa: E731
    y, dy = accy.jvp(f, (f64(2.0),), (f64(1.0),))
    assert (y.item(), dy.item()) == (16.0, 8.0)
    expected = jax.jvp(lambda x: lax.fori_loop(0, 3, lambda i, x: x * 2, x), (2.0,), (1.0,))
    assert (y.item(), dy.item()) == tuple(map(float, expected))
    g = lambda x: accy.fori_loop(0, 3, lambda i, x: x * (i + 1).convert(accy.f64), x)  # noqa: E731
    y, dy = accy.jvp(g, (f64(2.0),), (f64(1.0),))
    assert (y.item(), dy.item()) == (12.0, 6.0)


# -- fori_loop -----------------------------------------------------------------------------------


@translates("LaxControlFlowTest.testForiLoopErrors")
def test_fori_loop_errors():
    with pytest.raises(accy.TransformError, match="lower .* and upper .* must have one dtype"):
        accy.fori_loop(
            i32(0), accy.named(np.int64(10), (), R), lambda i, c: c, accy.named(np.float32(7), ())
        )


@translates("LaxControlFlowTest.testForiLoopScalarLimits")
def test_fori_loop_scalar_limits():
    init = f64(10.0)
    assert accy.fori_loop(np.int16(0), 10, lambda i, c: c + 1.0, init).item() == 20.0
    assert accy.fori_loop(0, np.int16(10), lambda i, c: c + 1.0, init).item() == 20.0


@translates("LaxControlFlowTest.test_fori_loop_returns_init_with_nonpositive_length")
@pytest.mark.parametrize("use_jit", [False, True])
@pytest.mark.parametrize("upper", [0, -1])
def test_fori_loop_returns_init_with_nonpositive_length(use_jit, upper):
    loop = functools.partial(accy.fori_loop, 0, upper, lambda i, c: c + 1.0)
    loop = jit(loop) if use_jit else loop
    assert (
        loop(f64(10.0)).item() == 10.0 == float(lax.fori_loop(0, upper, lambda i, c: c + 1, 10.0))
    )


@translates("LaxControlFlowTest.testForiLoopBatched")
def test_fori_loop_batched():
    def fun(x):
        return accy.fori_loop(0, 10, lambda i, c: (c[0] + 1, c[1] + 2), (x, 0))

    expected = jax.vmap(lambda x: lax.fori_loop(0, 10, lambda i, c: (c[0] + 1, c[1] + 2), (x, 0)))(
        np.array([0, 1])
    )
    out = accy.vmap(fun, "batch")(i32([0, 1], "batch"))
    for got, want in zip(out, expected, strict=True):
        np.testing.assert_array_equal(got.array, want)


@translates("LaxControlFlowTest.testForiLoopBasic")
def test_fori_loop_basic():
    def count(num):
        return accy.fori_loop(0, num, lambda i, tot: tot + i, 0)

    for num, expected in ((2, 1), (3, 3), (4, 6)):
        assert count(num).item() == expected == int(lax.fori_loop(0, num, lambda i, t: t + i, 0))
        assert jit(count)(num).item() == expected  # traced bounds: a while_loop


@translates("LaxControlFlowTest.testForiLoopClosure")
def test_fori_loop_closure():
    def count(num):
        return accy.fori_loop(0, num, lambda i, tot: num + (tot + i), 0)

    for num in (2, 3, 4):
        assert count(num).item() == jit(count)(num).item() == num * (num - 1) // 2 + num**2


def _sum_first_n(arr, num, state_kind):
    def body(i, state):
        arr, total = (state["arr"], state["total"]) if state_kind == "dict" else state[:2]
        arr_i = arr.dynamic_slice({"n": i}, {"n": 1})["n", 0]
        if state_kind == "dict":
            return {"arr": arr, "total": total + arr_i}
        return (arr, total + arr_i) + (((),) if state_kind == "empty" else ())

    zero = np.float64(0)
    init = {"arr": arr, "total": zero} if state_kind == "dict" else (arr, zero)
    init = init + ((),) if state_kind == "empty" else init
    upper = min(arr.shape["n"], num) if isinstance(num, int) else num.min(arr.shape["n"])
    out = accy.fori_loop(0, upper, body, init)
    return out["total"] if state_kind == "dict" else out[1]


@translates(
    "LaxControlFlowTest.testForiLoopTupleState",
    "LaxControlFlowTest.testForiLoopDictState",
    "LaxControlFlowTest.testForiLoopEmptyTupleInState",
)
@pytest.mark.parametrize("state_kind", ["tuple", "dict", "empty"])
def test_fori_loop_tuple_dict_and_empty_tuple_state(state_kind):
    """testForiLoopTupleState, testForiLoopDictState, testForiLoopEmptyTupleInState."""
    x = np.random.default_rng(0).standard_normal(10)
    cfun = jit(functools.partial(_sum_first_n, state_kind=state_kind))
    jax_sum = jax.jit(
        lambda x, num: lax.fori_loop(0, jnp.minimum(10, num), lambda i, t: t + x[i], 0.0)
    )
    for num in (0, 5, 10, 15):
        expected = jax_sum(x, num)
        np.testing.assert_allclose(_sum_first_n(f64(x, "n"), num, state_kind).item(), expected)
        np.testing.assert_allclose(cfun(f64(x, "n"), num).item(), np.sum(x[:num]))


@translates("LaxControlFlowTest.testForiLoopIssue8152")
def test_fori_loop_issue8152():
    assert accy.fori_loop(lower=0, upper=0, body_fn=lambda i, x: x + i, init=1.0) == 1.0
    carry = jit(
        lambda: accy.scan(
            lambda c, x: (c + x, x), np.float64(0), f64(np.zeros(0), "time"), axis="time"
        )[0]
    )()
    assert carry.item() == 0.0


# -- cond and switch -----------------------------------------------------------------------------


def _python_fun(x):
    return (x, x) if x < 3 else (2 * x, 4 * x)


@translates("LaxControlFlowTest.testCond")
def test_cond():
    @jit
    def cfun(x):
        return accy.cond(x < 3, lambda x: (x, x), lambda x: (2 * x, 2 * (2 * x)), x)

    jax_cfun = jax.jit(lambda x: lax.cond(x < 3, lambda x: (x, x), lambda x: (2 * x, 4 * x), x))
    for x in range(5):
        expected = jax_cfun(x)
        got = tuple(v.item() for v in cfun(x))
        assert got == _python_fun(x) == tuple(map(int, expected))


@translates("LaxControlFlowTest.testCondPredIsNone")
def test_cond_pred_is_none():
    def f(pred, x):
        return accy.cond(pred, lambda x: x + 1.0, lambda x: x + 2.0, x)

    with pytest.raises(accy.AccyError, match="the predicate is NoneType None"):
        f(None, f64(1.0))


@translates("LaxControlFlowTest.testCondTwoOperands", "LaxControlFlowTest.testCondThreeOperands")
@pytest.mark.parametrize("operands", [2, 3])
def test_cond_two_and_three_operands(operands):
    add = lambda *xs: functools.reduce(lambda a, b: a + b, xs)  # noqa: E731
    mul = lambda *xs: functools.reduce(lambda a, b: a * b, xs)  # noqa: E731

    def cfun(x):
        return accy.cond(x.eq(0), add, mul, *([x] * operands))

    for x in (0, 1):
        expected = add(*[x] * operands) if x == 0 else mul(*[x] * operands)
        assert cfun(i32(x)).item() == jit(cfun)(x).item() == expected


@dataclasses.dataclass
class Foo:
    x: object

    def __call__(self, *xs):
        raise AssertionError("an operand is not called")


@translates("LaxControlFlowTest.testCondCallableOperands")
def test_cond_callable_operands():
    f_00 = lambda a, b: a + b  # noqa: E731
    f_01 = lambda a, b: a + b.x  # noqa: E731
    f_10 = lambda a, b: a.x + b  # noqa: E731
    f_11 = lambda a, b: a.x + b.x  # noqa: E731
    three, four = i32(3), i32(4)
    results = [
        accy.cond(True, f_00, f_00, three, four),
        accy.cond(i32(1).eq(1), f_01, f_01, three, Foo(four)),
        jit(lambda a, b: accy.cond(a.x.eq(3), f_10, f_10, a, b))(Foo(three), four),
        jit(lambda a, b: accy.cond(a.x.eq(3), f_11, f_11, a, b))(Foo(three), Foo(four)),
    ]
    assert [r.item() for r in results] == [7] * 4


_BRANCHES = [lambda x: (x, x), lambda x: (2 * x, 2 * (2 * x)), lambda x: (x, -x)]


@translates("LaxControlFlowTest.testSwitch")
def test_switch():
    def fun(x):
        return _BRANCHES[0 if x <= 0 else (1 if x == 1 else 2)](x)

    def cfun(x):
        return accy.switch(x, _BRANCHES, x)

    jax_cfun = jax.jit(lambda x: lax.switch(x, _BRANCHES, x))
    for x in (-1, 0, 1, 2, 3):
        expected = jax_cfun(x)
        assert tuple(v.item() for v in cfun(i32(x))) == fun(x) == tuple(map(int, expected))
        assert tuple(v.item() for v in jit(cfun)(x)) == fun(x)


@translates("LaxControlFlowTest.testSwitchMultiOperands")
def test_switch_multi_operands():
    branches = [lambda a, b: a + b, lambda a, b: a * b]
    jax_cfun = jax.jit(lambda x: lax.switch(x, [lax.add, lax.mul], x, x))
    for x in (-1, 0, 1, 2):
        expected = int(jax_cfun(x))
        assert accy.switch(i32(x), branches, i32(x), i32(x)).item() == expected
        assert jit(lambda x: accy.switch(x, branches, x, x))(x).item() == expected


@translates("LaxControlFlowTest.testOneBranchSwitch")
def test_one_branch_switch():
    f = lambda i, x: accy.switch(i, [lambda x: -x], x)  # noqa: E731
    for i in (-1, 0, 1):
        assert f(i, f64(7.0)).item() == jit(f)(i, f64(7.0)).item() == -7.0
        assert jit(f, static_argnames=("i",))(i, f64(7.0)).item() == -7.0


@translates("LaxControlFlowTest.testIssue1379")
def test_issue1379():
    def fun(pred):
        return accy.cond(pred, lambda x: (True, x), lambda x: (False, x), pred)

    for pred in (0, 0.0, 1, 1.0):
        expected = fun_jax = lax.cond(pred, lambda x: (True, x), lambda x: (False, x), pred)
        got = jit(fun)(pred)
        assert (got[0].item(), got[1].item()) == (bool(fun_jax[0]), pred)
        assert bool(expected[0]) == bool(pred)
    for pred in ("abc", [], [1, 2]):
        for f in (fun, jit(fun)):
            with pytest.raises(accy.AccyError):
                f(pred)


@translates("LaxControlFlowTest.testNestedCond")
def test_nested_cond():
    @jit
    def cfun(x):
        return accy.cond(
            x < 2,
            lambda x: 2 * x,
            lambda x: accy.cond(x < 5, lambda x, _: 3 * x, lambda _, y: y * x, x, 4),
            x,
        )

    for x, expected in ((1, 2), (3, 9), (6, 24)):
        assert cfun(x).item() == expected


@translates(
    "LaxControlFlowTest.testCondOneBranchConstant",
    "LaxControlFlowTest.testCondOneBranchConstantTuple",
)
def test_cond_one_branch_constant():
    cfun = jit(lambda x: accy.cond(x < 3, lambda x: 5, lambda x: x, x))
    assert cfun(0).item() == 5 and cfun(4).item() == 4
    ctuple = jit(lambda x: accy.cond(x < 3, lambda x: (1, 2.0, 3.0), lambda x: (x, 2.0, 4.0), x))
    assert tuple(v.item() for v in ctuple(0)) == (1, 2.0, 3.0)
    assert tuple(v.item() for v in ctuple(4)) == (4, 2.0, 4.0)


@translates("LaxControlFlowTest.testCondBatched")
def test_cond_batched():
    def fun(x, y, z):
        return accy.cond(x < 3, lambda y, _: y, lambda _, z: -z, y, z)

    def jax_fun(x, y, z):
        return lax.cond(x < 3, lambda y, _: y, lambda _, z: -z, y, z)

    y, z = np.array([1, 2]), np.array([3, 4])
    cases = [  # (x, z, in_axes, stays a cond)
        (2, z, (None, 0, 0), True),
        (4, z, (None, 0, 0), True),
        (4, 5, (None, 0, None), True),
        (np.array([2, 4]), 5, (0, 0, None), False),
        (np.array([2, 4]), z, (0, 0, 0), False),
    ]
    for x, z_, in_axes, stays in cases:
        expected = jax.vmap(jax_fun, in_axes)(x, y, z_)
        args = [
            i32(a, "batch") if ax == 0 else i32(a)
            for a, ax in zip((x, y, z_), in_axes, strict=True)
        ]
        mapped = accy.vmap(fun, "batch")
        np.testing.assert_array_equal(mapped(*args).array, expected)
        program = program_of(mapped)
        assert (program.count("cond"), program.count("select") > 0) == (int(stays), not stays)
        np.testing.assert_array_equal(accy.vmap(jit(fun), "batch")(*args).array, expected)


@translates("LaxControlFlowTest.testSwitchBatched")
def test_switch_batched():
    def fun(index, x, y, z):
        branches = [lambda t: t[0], lambda t: -t[1], lambda t: t[2].sign()]
        return accy.switch(index, branches, (x, y, z))

    def jax_fun(index, x, y, z):
        branches = [lambda t: t[0], lambda t: lax.neg(t[1]), lambda t: lax.sign(t[2])]
        return lax.switch(index, branches, (x, y, z))

    y, z, w = np.array([1, 2]), np.array([3, 4]), np.array(9)
    cases = [
        (0, y, z, w, (None, 0, 0, None), True),
        (1, y, z, w, (None, 0, 0, None), True),
        (1, y, 5, w, (None, 0, None, None), True),
        (np.array([0, 1]), y, 5, w, (0, 0, None, None), False),
        (np.array([0, 1]), y, z, np.array([9, 9]), (0, 0, 0, 0), False),
    ]
    for index, y_, z_, w_, in_axes, stays in cases:
        expected = jax.vmap(jax_fun, in_axes)(index, y_, z_, w_)
        args = [
            i32(a, "batch") if ax == 0 else i32(a)
            for a, ax in zip((index, y_, z_, w_), in_axes, strict=True)
        ]
        mapped = accy.vmap(fun, "batch")
        np.testing.assert_array_equal(mapped(*args).array, expected)
        program = program_of(mapped)
        assert (program.count("cond") > 0, program.count("select") > 0) == (stays, not stays)


def _cond_pair(x):
    return accy.cond(x < 3.0, lambda x: (x, x), lambda x: (2.0 * x, 2.0 * (2.0 * x)), x)


def _jax_cond_pair(x):
    return lax.cond(x < 3, lambda x: (x, x), lambda x: (2 * x, 2 * (2 * x)), x)


@translates("LaxControlFlowTest.testCondJVP")
def test_cond_jvp():
    for x in (3.14, 2.72):
        expected = jax.jvp(_jax_cond_pair, (x,), (x,))
        y, dy = accy.jvp(_cond_pair, (f64(x),), (f64(x),))
        np.testing.assert_allclose(value((y, dy)), expected)
        # check_grads(order=2, modes=["fwd"]): the second forward derivative, as JAX's
        second = jax.jvp(lambda x: jax.jvp(_jax_cond_pair, (x,), (1.0,))[1], (x,), (1.0,))[1]
        inner = lambda x: accy.jvp(_cond_pair, (x,), (f64(1.0),))[1]  # noqa: E731
        np.testing.assert_allclose(value(accy.jvp(inner, (f64(x),), (f64(1.0),))[1]), second)


_SWITCH_BRANCHES = [lambda x: (x, x), lambda x: (2.0 * x, 2.0 * (2.0 * x)), lambda x: (x, -x)]


def _switch_pair(x):
    return accy.switch((x // 1.0).convert(accy.i32), _SWITCH_BRANCHES, x)


@translates("LaxControlFlowTest.testSwitchJVP")
def test_switch_jvp():
    def jax_fun(x):
        return lax.switch(lax.convert_element_type(x // 1, np.int32), _SWITCH_BRANCHES, x)

    jax_jvp = jax.jit(lambda x: jax.jvp(jax_fun, (x,), (x,)))
    for x in (-0.7, 0.7, 1.7, 2.7, 3.7):
        expected = jax_jvp(x)
        np.testing.assert_allclose(value(accy.jvp(_switch_pair, (f64(x),), (f64(x),))), expected)


@translates("LaxControlFlowTest.testCondJVP2")
def test_cond_jvp2():
    def fun(x):
        return accy.cond(x < 3.0, lambda _: np.float64(2.0), lambda x: 2.0 * x, x)

    jax_jvp = jax.jit(
        lambda x: jax.jvp(
            lambda x: lax.cond(x < 3, lambda _: 2.0, lambda x: 2.0 * x, x), (x,), (x,)
        )
    )
    for x in (3.14, 2.72):
        expected = jax_jvp(x)
        y, dy = accy.jvp(fun, (f64(x),), (f64(x),))
        np.testing.assert_allclose([y.item(), dy.item()], expected, rtol=1e-14)


@translates("LaxControlFlowTest.testCondGrad")
def test_cond_grad():
    f = jit(lambda x: accy.cond(x < 2.0, lambda x: 3.0 * x, lambda x: x.sin(), x))

    def jax_f(x):
        return lax.cond(x < 2, lambda x: 3.0 * x, jnp.sin, x)

    jax_grad, jax_second = jax.jit(jax.grad(jax_f)), jax.jit(jax.grad(jax.grad(jax_f)))
    for x in (2.14, 1.72):
        assert accy.grad(f)(f64(x)).item() == pytest.approx(float(jax_grad(x)), rel=1e-12)
        second = accy.grad(accy.grad(f))(f64(x)).item()
        assert second == pytest.approx(float(jax_second(x)), rel=1e-12, abs=1e-12)


@translates("LaxControlFlowTest.testCondGradVmapNan")
def test_cond_grad_vmap_nan():
    eps = 1e-3

    def safe1(x):
        return accy.cond(x < eps, lambda: f64(eps), lambda: x.sqrt())

    out = accy.grad(lambda x: accy.vmap(safe1, "batch")(x).sum())(f64(np.zeros(10), "batch"))
    assert not np.isnan(out.array).any()
    expected = jax.grad(
        lambda x: jax.vmap(lambda x: lax.cond(x < eps, lambda _: eps, lambda _: jnp.sqrt(x), ()))(
            x
        ).sum()
    )(np.zeros(10))
    np.testing.assert_array_equal(out.array, expected)


@translates("LaxControlFlowTest.testSwitchGrad")
def test_switch_grad():
    branches = [lambda x: 3.0 * x, lambda x: x.sin(), lambda x: -x]
    jax_branches = [lambda x: 3.0 * x, jnp.sin, lambda x: -x]
    f = jit(lambda x: accy.switch((x // 1.0).convert(accy.i32), branches, x))

    def jax_f(x):
        return lax.switch(lax.convert_element_type(x // 1, np.int32), jax_branches, x)

    jax_grad = jax.jit(jax.grad(jax_f))
    for x in (-0.7, 0.7, 1.7, 2.7, 3.7):
        assert accy.grad(f)(f64(x)).item() == pytest.approx(float(jax_grad(x)), rel=1e-12)


@translates("LaxControlFlowTest.testCondJit", "LaxControlFlowTest.testSwitchJit")
def test_cond_and_switch_jit():
    """testCondJit and testSwitchJit."""
    f = lambda x: accy.cond(x < 2.0, lambda x: 3.0 * x, lambda x: x.sin(), x)  # noqa: E731
    jax_f = jax.jit(lambda x: lax.cond(x < 2, lambda x: 3 * x, jnp.sin, x))
    for x in (1.0, 4.0):
        assert jit(f)(f64(x)).item() == f(f64(x)).item()
        assert f(f64(x)).item() == pytest.approx(float(jax_f(x)))
    branches = [lambda x: 3.0 * x, lambda x: x.sin(), lambda x: -x]
    g = lambda x: accy.switch((x // 1.0).convert(accy.i32), branches, x)  # noqa: E731
    for x in (-1.0, 0.0, 1.0, 2.0, 3.0):
        assert jit(g)(f64(x)).item() == g(f64(x)).item()


@translates("LaxControlFlowTest.testCondWithConsts", "LaxControlFlowTest.testCondJitWithConsts")
@pytest.mark.parametrize("use_jit", [False, True], ids=["eager", "jit"])
def test_cond_with_consts(use_jit):
    """testCondWithConsts and testCondJitWithConsts: the branches close over constant arrays."""
    ones, threes = f64([1.0, 2.0], "two"), f64([3.0, 4.0], "two")

    def f(x):
        return accy.cond(x < 2.0, lambda x: ones * x, lambda x: threes * x.sin(), x)

    f = jit(f) if use_jit else f
    jax_f = jax.jit(
        lambda x: lax.cond(
            x < 2,
            lambda x: np.array([1.0, 2.0]) * x,
            lambda x: np.array([3.0, 4.0]) * jnp.sin(x),
            x,
        )
    )
    for x in (1.0, 4.0):
        expected = jax_f(x)
        np.testing.assert_allclose(f(f64(x)).array, expected, rtol=1e-14)


@translates("LaxControlFlowTest.testCondVmapGrad")
def test_cond_vmap_grad():
    def f(x):
        return accy.cond(x > 0.0, lambda x: x**2.0, lambda x: x**3.0, x)

    x = np.linspace(-1, 1, 20)
    expected = jax.vmap(jax.grad(lambda x: jnp.where(x > 0, x**2, x**3)))(x)
    np.testing.assert_allclose(accy.vmap(accy.grad(f), "batch")(f64(x, "batch")).array, expected)


@translates("LaxControlFlowTest.testIssue514")
def test_issue514():
    out = accy.cond(True, lambda x, _: (x[0], 0), lambda _, x: x, (0, 0), (1, 1))
    assert out == (0, 0)
    out = jit(lambda p: accy.cond(p, lambda x, _: (x[0], 0), lambda _, x: x, (0, 0), (1, 1)))(True)
    assert tuple(v.item() for v in out) == (0, 0)


@translates("LaxControlFlowTest.testIssue649")
def test_issue649():
    out = accy.while_loop(lambda x: x[1] < 10, lambda x: (7, x[1] + 1), (i32(33), i32(4)))
    assert (
        tuple(v.item() for v in out)
        == (7, 10)
        == tuple(map(int, lax.while_loop(lambda x: x[1] < 10, lambda x: (7, x[1] + 1), (33, 4))))
    )


@translates("LaxControlFlowTest.test_cond_casting")
def test_cond_casting():
    y = accy.cond(True, lambda x: x, lambda x: x, 1.0)
    assert y == 1.0
    y = jit(lambda p: accy.cond(p, lambda x: x, lambda x: x, 1.0))(True)
    assert isinstance(y, accy.NamedArray) and y.item() == 1.0


# -- scan ----------------------------------------------------------------------------------------

RNG = np.random.default_rng(0)
D = RNG.standard_normal(2)
AS = RNG.standard_normal((5, 3))
C = RNG.standard_normal(4)


def _scan_body(c, a):
    """The body of testScanImpl/JVP/Linearize: c has a "c" axis, a an "a" axis."""
    b = (a.sin().sum() + c.cos().sum() + f64(D, "d").sum()).cos()
    return (c * b).sin(), b


def _jax_scan_body(c, a):
    b = jnp.cos(jnp.sum(jnp.sin(a)) + jnp.sum(jnp.cos(c)) + jnp.sum(D))
    return jnp.sin(c * b), b


def _scan(f, c, as_, **options):
    return accy.scan(f, c, as_, axis="time", **options)


def _scanners(jit_scan, jit_f, body=_scan_body):
    f = jit(body) if jit_f else body
    scan = jit(_scan, static_argnames=("f",)) if jit_scan else _scan
    return functools.partial(scan, f)


# JAX runs each case with the scan and the body jitted or not; these two cover both kinds of
# nesting (the slow run adds the mixed ones).
MODES = [(False, False), (True, True)]
MIXED = [pytest.param(*m, marks=pytest.mark.slow) for m in ((False, True), (True, False))]


@translates("LaxControlFlowTest.testScanImpl")
@pytest.mark.parametrize("jit_scan,jit_f", MODES + MIXED)
def test_scan_impl(jit_scan, jit_f):
    scan = _scanners(jit_scan, jit_f)
    carry, ys = scan(f64(C, "c"), f64(AS, ("time", "a")))
    expected = lax.scan(_jax_scan_body, C, AS)
    np.testing.assert_allclose(carry.array, expected[0], rtol=1e-14)
    np.testing.assert_allclose(ys.array, expected[1], rtol=1e-14)


@translates("LaxControlFlowTest.testScanJVP")
@pytest.mark.parametrize("jit_scan,jit_f", MODES + MIXED)
def test_scan_jvp(jit_scan, jit_f):
    scan = _scanners(jit_scan, jit_f)
    c, as_ = f64(C, "c"), f64(AS, ("time", "a"))
    got = accy.jvp(scan, (c, as_), (c, as_))
    expected = jax.jvp(lambda c, as_: lax.scan(_jax_scan_body, c, as_), (C, AS), (C, AS))
    for g, e in zip(jax.tree.leaves(value(got)), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-12)


@translates("LaxControlFlowTest.testScanLinearize")
@pytest.mark.parametrize("jit_scan,jit_f", MODES + MIXED)
def test_scan_linearize(jit_scan, jit_f):
    scan = _scanners(jit_scan, jit_f)
    c, as_ = f64(C, "c"), f64(AS, ("time", "a"))
    _, f_jvp = accy.linearize(scan, c, as_)
    expected = jax.linearize(lambda c, as_: lax.scan(_jax_scan_body, c, as_), C, AS)[1](C, AS)
    for g, e in zip(jax.tree.leaves(value(f_jvp(c, as_))), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-12)


def _grad_body(c, a):
    b = a.sin().sum() + c.sin().sum() + f64(D, "d").sin().sum()
    return (c * b).sin(), b


def _jax_grad_body(c, a):
    b = jnp.sum(jnp.sin(a)) + jnp.sum(jnp.sin(c)) + jnp.sum(jnp.sin(D))
    return jnp.sin(c * b), b


@translates("LaxControlFlowTest.testScanGrad")
@pytest.mark.parametrize(
    "jit_scan,jit_f", [MODES[0], pytest.param(*MODES[1], marks=pytest.mark.slow), *MIXED]
)
def test_scan_grad(jit_scan, jit_f):
    scan = _scanners(jit_scan, jit_f, _grad_body)
    c, as_ = f64(C, "c"), f64(AS, ("time", "a"))
    got = accy.grad(lambda c, as_: scan(c, as_)[0].sum(), argnums=(0, 1))(c, as_)
    expected = jax.grad(lambda c, as_: lax.scan(_jax_grad_body, c, as_)[0].sum(), (0, 1))(C, AS)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g.array, e, rtol=1e-12)
    if jit_scan or jit_f:  # the second order once: jit changes nothing in it
        return
    # check_grads(order=2, modes=["rev"]): the gradient of one entry of the gradient
    second = accy.grad(lambda c: accy.grad(lambda c: scan(c, as_)[0].sum())(c)["c", 0])(c)
    jax_second = jax.grad(
        lambda c: jax.grad(lambda c: lax.scan(_jax_grad_body, c, AS)[0].sum())(c)[0]
    )(C)
    np.testing.assert_allclose(second.array, jax_second, rtol=1e-10)


@translates("LaxControlFlowTest.testScanRnn")
@pytest.mark.slow
def test_scan_rnn():
    r = np.random.default_rng(1)
    n_in, n_hid, n_out, length = 4, 2, 1, 3
    w_trans = r.standard_normal((n_hid, n_hid + n_in))
    w_out = r.standard_normal((n_out, n_hid + n_in))
    inputs = r.standard_normal((length, n_in))
    targets = r.standard_normal((length, n_out))

    def jax_loss(params, inputs, targets):
        def step(state, x):
            stacked = jnp.concatenate([state, x])
            return jnp.tanh(params[0] @ stacked), jnp.tanh(params[1] @ stacked)

        _, outputs = lax.scan(step, jnp.zeros(n_hid), inputs)
        return jnp.sum((outputs - targets) ** 2)

    # jnp.concatenate([state, input]) then a matmul is, by name, one contraction per part
    def split(w, out):
        return {
            "state": f64(w[:, :n_hid], (out, "hid")),
            "input": f64(w[:, n_hid:], (out, "in")),
        }

    params = {"trans": split(w_trans, "next"), "out": split(w_out, "out")}

    @jit
    def loss(params, inputs, targets):
        def step(state, x):
            def affine(w):
                return state.contract(w["state"], "hid") + x.contract(w["input"], "in")

            next_state = affine(params["trans"]).tanh().rename("next", "hid")
            return next_state, affine(params["out"]).tanh()

        _, outputs = accy.scan(step, f64(np.zeros(n_hid), "hid"), inputs, axis="time")
        return ((outputs - targets) ** 2.0).sum()

    x, t = f64(inputs, ("time", "in")), f64(targets, ("time", "out"))
    jax_params = (w_trans, w_out)
    np.testing.assert_allclose(loss(params, x, t).item(), jax_loss(jax_params, inputs, targets))
    _, dy = accy.jvp(lambda p: loss(p, x, t), (params,), (params,))
    _, jax_dy = jax.jvp(lambda p: jax_loss(p, inputs, targets), (jax_params,), (jax_params,))
    np.testing.assert_allclose(dy.item(), jax_dy, rtol=1e-12)
    _, f_jvp = accy.linearize(loss, params, x, t)
    _, expected = jax.jvp(jax_loss, (jax_params, inputs, targets), (jax_params, inputs, targets))
    np.testing.assert_allclose(f_jvp(params, x, t).item(), expected, rtol=1e-12)
    grads = accy.grad(loss)(params, x, t)
    jax_grads = jax.grad(jax_loss)(jax_params, inputs, targets)
    for got, want in ((grads["trans"], jax_grads[0]), (grads["out"], jax_grads[1])):
        np.testing.assert_allclose(got["state"].array, want[:, :n_hid], rtol=1e-10)
        np.testing.assert_allclose(got["input"].array, want[:, n_hid:], rtol=1e-10)
    batch_size = 7
    batched_inputs = r.standard_normal((batch_size, length, n_in))
    batched_targets = r.standard_normal((batch_size, length, n_out))
    losses = accy.vmap(lambda x, y: loss(params, x, y), "batch")(
        f64(batched_inputs, ("batch", "time", "in")),
        f64(batched_targets, ("batch", "time", "out")),
    )
    expected = jax.vmap(lambda x, y: jax_loss(jax_params, x, y))(batched_inputs, batched_targets)
    np.testing.assert_allclose(losses.array, expected, rtol=1e-12)


@translates("LaxControlFlowTest.testIssue711")
def test_issue711():
    def minimize_structure(test_params):
        def energy(conf):
            return (conf * test_params).sum()

        def apply_carry(carry, _):
            i, x = carry
            return (i + 1, x - 0.1 * accy.grad(energy)(x)), None

        (_, x_final), _ = accy.scan(
            apply_carry, (0, f64([1.0, 2.0, 3.0], "n")), length=75, axis="time"
        )
        return x_final

    def jax_minimize_structure(test_params):
        def apply_carry(carry, _):
            i, x = carry
            return (i + 1, x - 0.1 * jax.grad(lambda c: jnp.sum(c * test_params))(x)), None

        (_, x_final), _ = lax.scan(apply_carry, (0, jnp.array([1.0, 2.0, 3.0])), None, length=75)
        return x_final

    np.testing.assert_allclose(minimize_structure(f64(0.5)).array, jax_minimize_structure(0.5))
    grad = accy.grad(lambda p: (1.0 - minimize_structure(p)).sin().sum())(f64(0.25))
    expected = jax.grad(lambda p: jnp.sum(jnp.sin(1.0 - jax_minimize_structure(p))))(0.25)
    np.testing.assert_allclose(grad.item(), expected, rtol=1e-12)


@translates("LaxControlFlowTest.testIssue744")
def test_issue744():
    point = {"x": i32(1), "y": i32(2)}
    # Python ints in xs reach every step unchanged (as accy.vmap passes them), so nothing
    # is left to scan along: the error says so
    with pytest.raises(accy.TransformError, match="xs holds no array to scan along"):
        accy.scan(
            lambda p, i: ({"x": p["x"] + 1, "y": p["y"] + 1}, i),
            point,
            list(range(5)),
            axis="time",
        )


@translates("LaxControlFlowTest.testScanBodyOutputError")
def test_scan_body_output_error():
    with pytest.raises(accy.TransformError, match=r"must return a pair \(carry, y\), got a"):
        accy.scan(lambda c, x: np.float32(0.0), 0, f64(np.arange(5.0), "time"), axis="time")


@translates("LaxControlFlowTest.testScanLengthError")
def test_scan_length_error():
    with pytest.raises(accy.AxisError, match=r"disagree: xs: 10, length=5"):
        accy.scan(lambda c, x: (c, x), 0, f64(np.arange(10), "time"), axis="time", length=5)


@translates("LaxControlFlowTest.testScanInvalidUnrollRaises")
def test_scan_invalid_unroll_raises():
    with pytest.raises(accy.TransformError, match="unroll must be"):
        accy.scan(lambda x, _: (x, x), 0, f64(np.arange(5), "time"), axis="time", unroll=-1)


@pytest.mark.slow
@translates("LaxControlFlowTest.testScanHigherOrderDifferentiation")
def test_scan_higher_order_differentiation():
    d = 0.75

    def f(c, a):
        b = (c * (d * a).cos().sum()).sin()
        return 0.9 * (d * (c * a).sin().sum()).cos(), b

    def jax_f(c, a):
        return 0.9 * jnp.cos(d * jnp.sum(jnp.sin(c * a))), jnp.sin(c * jnp.sum(jnp.cos(d * a)))

    as_ = np.arange(6.0).reshape(3, 2)

    def loss(c):
        carry, ys = accy.scan(f, c, f64(as_, ("time", "a")), axis="time")
        return carry + ys.sum()

    def jax_loss(c):
        carry, ys = lax.scan(jax_f, c, as_)
        return carry + ys.sum()

    assert accy.grad(loss)(f64(1.0)).item() == pytest.approx(float(jax.grad(jax_loss)(1.0)))
    second = accy.grad(accy.grad(loss))(f64(1.0)).item()
    assert second == pytest.approx(float(jax.grad(jax.grad(jax_loss))(1.0)), rel=1e-10)


IN_AXES = [(c, a) for c in (None, 0, 1) for a in (None, 0, 1, 2) if (c, a) != (None, None)]
FAST_IN_AXES = [(None, 1), (1, 2)]  # the others: in the slow run


@translates("LaxControlFlowTest.testScanVmap")
@pytest.mark.parametrize(
    "in_axes",
    [a if a in FAST_IN_AXES else pytest.param(a, marks=pytest.mark.slow) for a in IN_AXES],
    ids=str,
)
def test_scan_vmap(in_axes):
    """The batch axis of 7 sits at each layout position of the carry and of the xs."""
    c_bdim, as_bdim = in_axes
    r = np.random.default_rng(2)
    c_axes, as_axes = ["c"], ["time", "a"]
    c_shape, as_shape = [4], [5, 3]
    if c_bdim is not None:
        c_axes.insert(c_bdim, "batch")
        c_shape.insert(c_bdim, 7)
    if as_bdim is not None:
        as_axes.insert(as_bdim, "batch")
        as_shape.insert(as_bdim, 7)
    c, as_ = r.standard_normal(c_shape), r.standard_normal(as_shape)
    got = accy.vmap(lambda c, as_: _scan(_scan_body, c, as_), "batch")(
        f64(c, tuple(c_axes)), f64(as_, tuple(as_axes))
    )
    expected = jax.vmap(lambda c, as_: lax.scan(_jax_scan_body, c, as_), in_axes)(c, as_)
    np.testing.assert_allclose(got[0].array, expected[0], rtol=1e-12)
    np.testing.assert_allclose(got[1].array, expected[1], rtol=1e-12)


@translates("LaxControlFlowTest.testScanVmapTuples")
def test_scan_vmap_tuples():
    def f(c, a):
        (a1, a2), (c1, c2) = a, c
        b = a1.cos().sum() * (c2 * a2).sum()
        return (c1 * (a1 * a2).sum().sin(), c2 * a1.sum().cos()), b

    def jax_f(c, a):
        (a1, a2), (c1, c2) = a, c
        b = jnp.sum(jnp.cos(a1)) * jnp.sum(c2 * a2)
        return (c1 * jnp.sin(jnp.sum(a1 * a2)), c2 * jnp.cos(jnp.sum(a1))), b

    r = np.random.default_rng(3)
    as_ = (r.standard_normal((3, 7)), r.standard_normal((3, 4, 7)))
    c = (r.standard_normal((7, 2)), r.standard_normal(7))
    expected = jax.vmap(lambda c, as_: lax.scan(jax_f, c, as_), (0, (1, 2)))(c, as_)
    got = accy.vmap(lambda c, as_: accy.scan(f, c, as_, axis="time"), "batch")(
        (f64(c[0], ("batch", "two")), f64(c[1], "batch")),
        (f64(as_[0], ("time", "batch")), f64(as_[1], ("time", "four", "batch"))),
    )
    for g, e in zip(jax.tree.leaves(value(got)), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-12)


@translates("LaxControlFlowTest.testScanVmapFixpoint")
def test_scan_vmap_fixpoint():
    def f(carry_init):
        def body(c, x):
            return (c[1], c[2], c[3], np.float64(0)), None

        start = tuple(np.float64(v) for v in (0, 1, 2))
        return accy.scan(body, (*start, carry_init), f64(np.zeros(2), "time"), axis="time")

    carry_init = np.array([3.0, 4.0, 5.0])
    carry_out, _ = accy.vmap(f, "batch")(f64(carry_init, "batch"))
    expected, _ = jax.vmap(
        lambda ci: lax.scan(
            lambda c, x: ((c[1], c[2], c[3], 0.0), None), (0.0, 1.0, 2.0, ci), jnp.zeros(2)
        )
    )(carry_init)
    for got, want in zip(carry_out, expected, strict=True):
        np.testing.assert_array_equal(got.array, want)
    np.testing.assert_array_equal(carry_out[1].array, carry_init)


@translates("LaxControlFlowTest.testIssue757")
def test_issue757():
    def loop(val):
        def apply_carry(x, i):
            return accy.grad(lambda a: a.cos())(x), i

        final, _ = accy.scan(apply_carry, val, i32(np.arange(10), "time"), axis="time")
        return final

    def jax_loop(val):
        return lax.scan(lambda x, i: (jax.grad(jnp.cos)(x), i), val, jnp.arange(10))[0]

    y, dy = jit(lambda v: accy.jvp(loop, (v,), (f64(1.0),)))(f64(0.5))  # jacfwd of a scalar
    expected = jax.jvp(jax_loop, (0.5,), (1.0,))
    np.testing.assert_allclose([y.item(), dy.item()], expected, rtol=1e-12)


@translates("LaxControlFlowTest.testIssue1361")
def test_issue1361():
    @jit
    def jit_run_scan(x):
        (x, _), _ = accy.scan(
            lambda c, _: ((2.0 * c[0], 0.0), None), (x, 0.0), i32(np.arange(3), "time"), axis="time"
        )
        return x

    assert accy.grad(jit_run_scan)(accy.named(np.float32(0.0), (), R)).item() == 8.0


@translates("LaxControlFlowTest.testMap")
def test_map():
    xs = np.arange(10)
    np.testing.assert_array_equal(
        accy.map(lambda x: x * x, i32(xs, "i"), axis="i").array, lax.map(lambda x: x**2, xs)
    )


@translates("LaxControlFlowTest.testMapEmpty")
def test_map_empty():
    out = accy.map(lambda x: x * x, f64(np.zeros(0), "i"), axis="i")
    assert out.shape == {"i": 0}
    assert lax.map(lambda x: x * x, jnp.array([])).shape == (0,)


@translates("LaxControlFlowTest.testScanLengthArg")
def test_scan_length_arg():
    def arange(n):
        return accy.scan(lambda c, _: (c + 1, c), 0, None, length=n, axis="i")[1]

    np.testing.assert_array_equal(arange(10).array, np.arange(10))
    np.testing.assert_array_equal(
        arange(10).array, lax.scan(lambda c, _: (c + 1, c), 0, None, length=10)[1]
    )


@translates("LaxControlFlowTest.test_scan_reverse")
def test_scan_reverse():
    def cumsum(x, reverse):
        return accy.scan(lambda c, x: (c + x, c + x), 0, x, axis="i", reverse=reverse)[1]

    x = np.array([3, 1, 4, 1, 5, 9], np.int32)
    for reverse in (False, True):
        expected = lax.scan(lambda c, x: (c + x, c + x), 0, x, reverse=reverse)[1]
        np.testing.assert_array_equal(
            jit(cumsum, static_argnames=("reverse",))(i32(x, "i"), reverse).array, expected
        )
        np.testing.assert_array_equal(cumsum(i32(x, "i"), reverse).array, expected)  # eager
    np.testing.assert_array_equal(cumsum(i32(x, "i"), True).array, np.cumsum(x[::-1])[::-1])


@pytest.mark.slow
@translates("LaxControlFlowTest.test_scan_unroll")
def test_scan_unroll():
    d = np.ones(2)

    def f(c, a):
        b = (a.sin().sum() + c.cos().sum() + f64(d, "d").sum()).cos()
        return (c * b).sin(), b

    xs, c = f64(np.ones((20, 3)), ("time", "a")), f64(np.ones(4), "c")
    programs = {}
    for unroll in (1, 2, True):  # keyed by name below: True == 1 as a dict key
        run = jit(lambda c, xs, u=unroll: accy.scan(f, c, xs, axis="time", unroll=u))
        out = run(c, xs)
        expected = lax.scan(
            lambda c, a: (
                jnp.sin(c * jnp.cos(jnp.sum(jnp.sin(a)) + jnp.sum(jnp.cos(c)) + 2.0)),
                jnp.cos(jnp.sum(jnp.sin(a)) + jnp.sum(jnp.cos(c)) + 2.0),
            ),
            np.ones(4),
            np.ones((20, 3)),
            unroll=unroll,
        )
        np.testing.assert_allclose(out[0].array, expected[0], rtol=1e-13)
        np.testing.assert_allclose(out[1].array, expected[1], rtol=1e-13)
        programs[repr(unroll)] = program_of(run)

    def size(program):  # operations, those of scan bodies included
        return sum(
            1 + (size(op.attrs["body"]) if op.kind == "scan" else 0) for op in program.operations
        )

    assert size(programs["1"]) < size(programs["2"]) < size(programs["True"])
    assert programs["1"].count("scan") == programs["2"].count("scan") == 1
    assert programs["True"].count("scan") == 0


@translates("LaxControlFlowTest.test_scan_xs_none")
def test_scan_xs_none():
    h, _ = accy.scan(lambda h, _: (h + 1, None), 0, length=20, axis="i")
    assert h.item() == 20 == int(lax.scan(lambda h, _: (h + 1, None), 0, length=20)[0])


@translates("LaxControlFlowTest.test_disable_jit_cond_with_vmap")
def test_disable_jit_cond_with_vmap():
    fn = accy.vmap(lambda t: accy.cond(t > 0, lambda x, _: 0, lambda _, x: 1, 0, 0), "batch")
    assert fn(i32([1], "batch")).array.tolist() == [0]


@translates("LaxControlFlowTest.test_disable_jit_while_loop_with_vmap")
def test_disable_jit_while_loop_with_vmap():
    out = accy.vmap(lambda y: accy.while_loop(lambda x: x < 10.0, lambda x: x + 1.0, y), "batch")(
        f64([3.0, 4.0], "batch")
    )
    assert out.array.tolist() == [10.0, 10.0]


@translates("LaxControlFlowTest.test_vmaps_of_while_loop")
def test_vmaps_of_while_loop():
    def f(x, n):
        return accy.fori_loop(0, n, lambda _, x: x + 1, x)

    x, n = np.arange(3), np.arange(4)
    out = accy.vmap(accy.vmap(f, "j"), "i")(i32(x, "i"), i32(n, "j"))
    expected = jax.vmap(
        jax.vmap(lambda x, n: lax.fori_loop(0, n, lambda _, x: x + 1, x), (None, 0)), (0, None)
    )(x, n)
    np.testing.assert_array_equal(out.array, expected)


# -- errors ----------------------------------------------------------------------------------------


@translates("LaxControlFlowTest.testCallableErrors")
def test_callable_errors():
    not_callable = 42
    calls = {
        "fori_loop: body_fn": lambda: accy.fori_loop(0, 1, not_callable, 0),
        "while_loop: cond_fn": lambda: accy.while_loop(not_callable, not_callable, 0),
        r"switch: branches\[0\]": lambda: accy.switch(0, [not_callable]),
        "cond: true_fn": lambda: accy.cond(0, not_callable, not_callable),
        "scan: f": lambda: accy.scan(not_callable, 0, 1, axis="time"),
        "associative_scan: fn": lambda: accy.associative_scan(not_callable, 0, axis="time"),
    }
    for where, call in calls.items():
        with pytest.raises(accy.TransformError, match=f"accy.{where} must be a function, got int"):
            call()


@translates("LaxControlFlowTest.testCondTypeErrors")
def test_cond_type_errors():
    for pred, shown in ((lambda x: True, "function"), ("foo", "str 'foo'"), ((1.0, 1.0), "tuple")):
        with pytest.raises(accy.AccyError, match=f"accy.cond: the predicate is {shown}"):
            accy.cond(pred, lambda top: 2.0, lambda fop: 3.0, 1.0)
    # a concrete Python predicate runs one branch eagerly; a traced one checks both
    with pytest.raises(
        accy.TransformError,
        match=r"false branch's output must have the true branch's structure: expected "
        r"PyTreeSpec\({'a': \*}\), got PyTreeSpec\({'a': \(\*, \*\)}\)",
    ):
        jit(lambda p: accy.cond(p, lambda top: dict(a=2.0), lambda fop: dict(a=(3.0, 3.0)), 1.0))(
            True
        )
    with pytest.raises(
        accy.TransformError,
        match=r"the false branch's output has type f32\[\], but the true branch's is f32\[n=1\]",
    ):
        jit(
            lambda p: accy.cond(
                p,
                lambda top: accy.named(np.array([1.0], np.float32), "n"),
                lambda fop: np.float32(1.0),
                1.0,
            )
        )(True)


@translates("LaxControlFlowTest.testSwitchErrors")
def test_switch_errors():
    two = [lambda _: 2.0, lambda _: 3.0]
    for index, shown in ((lambda x: True, "function"), ("foo", "str 'foo'"), ((1.0, 1.0), "tuple")):
        with pytest.raises(accy.AccyError, match=f"accy.switch: the index is {shown}"):
            accy.switch(index, two, 1.0)
    with pytest.raises(accy.TransformError, match=r"the index must be an integer scalar, got f64"):
        accy.switch(f64(1.0), two, 1.0)
    with pytest.raises(accy.TransformError, match="branches must be a non-empty sequence"):
        accy.switch(0, [], 1.0)
    with pytest.raises(accy.TransformError, match=r"output must have the true branch's structure"):
        jit(lambda i: accy.switch(i, [lambda _: dict(a=2.0), lambda _: dict(a=(3.0, 3.0))], 1.0))(1)
    with pytest.raises(accy.TransformError, match=r"output\['a'\] has type f32\[\], but the true"):
        jit(
            lambda i: accy.switch(
                i,
                [
                    lambda _: dict(a=accy.named(np.array([1.0], np.float32), "n")),
                    lambda _: dict(a=np.float32(1.0)),
                ],
                1.0,
            )
        )(1)


@translates("LaxControlFlowTest.testScanMetadataError")
def test_scan_metadata_error():
    with pytest.raises(
        accy.TransformError,
        match=r"accy.fori_loop: body_fn's carry must have its initial value's structure: "
        r"expected PyTreeSpec\({'t': \*}\), got PyTreeSpec\({'T': \*}\)",
    ):
        accy.fori_loop(0, 1, lambda i, x: {"T": f64([0.5], "n")}, {"t": f64([1.0], "n")})


@translates("LaxControlFlowTest.testScanBodyCarryPytreeMismatchErrors")
def test_scan_body_carry_pytree_mismatch_errors():
    zero = accy.named(np.int32(0), (), R)
    cases = [
        (
            lambda c, x: ((0, 0, 0), x),
            (1, (2, 3)),
            f64(np.arange(5.0), "time"),
            r"\(\*, \(\*, \*\)\)",
        ),
        (lambda x, _: ((x[0].convert(accy.f32),), None), (zero,) * 2, None, r"\(\*, \*\)"),
        (lambda x, _: ([x[0].convert(accy.f32)] * 2, None), (zero,) * 2, None, r"\(\*, \*\)"),
        (lambda x, _: ({"a": x["a"], "b": x["a"]}, None), {"a": zero}, None, r"{'a': \*}"),
        (
            lambda x, _: (({"a": x[0]["a"], "b": x[0]["a"]},) * 2, None),
            ({"a": zero},) * 2,
            None,
            r"\({'a': \*}, {'a': \*}\)",
        ),
    ]
    for body, init, xs, expected in cases:
        with pytest.raises(
            accy.TransformError,
            match=f"accy.scan: the carry must have its initial value's structure: expected "
            f"PyTreeSpec\\({expected}\\), got",
        ):
            jit(lambda init, xs, f=body: accy.scan(f, init, xs, axis="time", length=5))(init, xs)


@translates("LaxControlFlowTest.testScanBodyCarryTypeMismatchErrors")
def test_scan_body_carry_type_mismatch_errors():
    zero = accy.named(np.int32(0), (), R)
    cases = [
        (lambda x, _: (x.convert(accy.f32), None), zero, r"the carry has type f32\[\], but"),
        (
            lambda x, _: ((x[0], x[1].convert(accy.f32)), None),
            (zero,) * 2,
            r"the carry\[1\] has type f32\[\], but its initial value's is i32\[\]",
        ),
        (
            lambda x, _: (
                (
                    x[0].convert(accy.f32),
                    x[1].convert(accy.f32).broadcast_to(accy.spec(accy.f32, a=1, b=1)),
                    x[2],
                ),
                None,
            ),
            (zero,) * 3,
            r"the carry\[0\] has type f32\[\], but its initial value's is i32\[\]",
        ),
    ]
    for body, init, expected in cases:
        with pytest.raises(accy.TransformError, match=expected):
            jit(lambda init, f=body: accy.scan(f, init, None, axis="time", length=1))(init)


def _reemitted(program, kind, **changes):
    """Emit `program`'s first operation of `kind` again, on parameters of its operand types,
    with its attributes changed: accy checks an operation's attributes as it is built (JAX's
    test corrupts a jaxpr's params and runs its type checker)."""
    op = next(op for op in program.operations if op.kind == kind)
    b = accy.Builder("corrupted")
    operands = [b.parameter(t) for t in op.operand_types]
    return b.emit(kind, operands, op.attrs.replace(**changes))


@translates("LaxControlFlowTest.test_scan_typecheck_param")
def test_scan_typecheck_param():
    program = accy.make_program(lambda c, xs: _scan(_scan_body, c, xs))(
        f64(np.ones(4), "c"), f64(np.ones((5, 3)), ("time", "a"))
    )
    with pytest.raises(accy.TypeRuleError, match="'reverse' must be true or false, got 4"):
        _reemitted(program, "scan", reverse=4)
    with pytest.raises(accy.TypeRuleError, match="'num_consts' must be an int >= 0, got -3"):
        _reemitted(program, "scan", num_consts=-3)


@translates("LaxControlFlowTest.test_cond_typecheck_param")
def test_cond_typecheck_param():
    program = accy.make_program(
        lambda i, x: accy.switch(i, [lambda x: x.sin(), lambda x: x.cos()], x)
    )(i32(0), f64(1.0))
    with pytest.raises(accy.TypeRuleError, match=r"'true_body' must be a program, got \(4, 2\)"):
        _reemitted(program, "cond", true_body=(4, 2))


@translates("LaxControlFlowTest.test_scan_length_concrete_error")
def test_scan_length_concrete_error():
    f = jit(lambda n, x: accy.scan(lambda c, z: (c, z), x, (), length=n, axis="time"))
    with pytest.raises(accy.TransformError, match=r"length must be a Python int known when the"):
        f(3, 1.0)


@translates("LaxControlFlowTest.test_scan_unroll_concrete_error")
def test_scan_unroll_concrete_error():
    f = jit(lambda n, x: accy.scan(lambda c, z: (c, z), x, (), length=10, unroll=n, axis="time"))
    for n in (3, True):
        with pytest.raises(accy.TransformError, match=r"unroll must be a Python int known when"):
            f(n, 1.0)


# -- while_loop and fori_loop, more ----------------------------------------------------------------


class Node:
    def __init__(self, x, y):
        self.x, self.y = x, y


optree.register_pytree_node(
    Node, lambda o: ((o.x, o.y), None, ("x", "y")), lambda _, xy: Node(*xy), namespace=NAMESPACE
)


@translates("LaxControlFlowTest.testWhileLoopCustomPytreeDiffAuxData")
def test_while_loop_custom_pytree_diff_aux_data():
    out = accy.while_loop(lambda o: o.x > 0.0, lambda c: Node(0.0, 0.0), Node(1.0, 1.0))
    jax_out = lax.while_loop(lambda o: o[0] > 0.0, lambda c: (0.0, 0.0), (1.0, 1.0))
    assert (float(out.x), float(out.y)) == tuple(map(float, jax_out)) == (0.0, 0.0)
    out = jit(lambda n: accy.while_loop(lambda o: o.x > 0.0, lambda c: Node(c.x * 0.0, c.y), n))(
        Node(f64(1.0), f64(2.0))
    )
    assert (out.x.item(), out.y.item()) == (0.0, 2.0)


@translates("LaxControlFlowTest.testNestedWhileWithDynamicUpdateSlice")
def test_nested_while_with_dynamic_update_slice():
    num = 5

    def update_entry(arr, val, i, j):
        return arr.dynamic_update_slice(
            val.broadcast_to(accy.spec(accy.f64, r=1, c=1)), {"r": i, "c": j}
        )

    def inner_loop(i, arr, out):
        def body_fun(state):
            i, j, arr, out = state
            arr_i_j = arr.dynamic_slice({"r": i, "c": j}, {"r": 1, "c": 1})["r", 0, "c", 0]
            return (i, j + 1, arr, update_entry(out, arr_i_j, i, j))

        return accy.while_loop(lambda s: s[1] <= s[0], body_fun, (i, 0, arr, out))[3]

    def outer_loop(arr):
        def body_fun(state):
            i, num, arr, out = state
            return (i + 1, num, arr, inner_loop(i, arr, out))

        out = arr * 0.0
        return accy.while_loop(lambda s: s[0] < s[1], body_fun, (0, num, arr, out))[3]

    arr = np.random.default_rng(4).standard_normal((5, 5))
    x = f64(arr, ("r", "c"))
    np.testing.assert_allclose(outer_loop(x).array, np.tril(arr))
    cloop = jit(outer_loop)
    np.testing.assert_allclose(cloop(x).array, np.tril(arr))
    np.testing.assert_allclose(cloop(x).array, np.tril(arr))


@translates("LaxControlFlowTest.testLoopWithConjunctionCondition")
def test_loop_with_conjunction_condition():
    def sum_first_n(arr, num):
        def cond_fun(state):
            arr, num, i, _ = state
            return (i < num) & (i < arr.shape["n"])

        def body_fun(state):
            arr, num, i, total = state
            return (arr, num, i + 1, total + arr.dynamic_slice({"n": i}, {"n": 1})["n", 0])

        return accy.while_loop(cond_fun, body_fun, (arr, num, 0, np.float64(0.0)))[3]

    x = np.random.default_rng(5).standard_normal(10)
    cfun = jit(sum_first_n)
    for num in (0, 5, 10, 15):
        expected = np.sum(x[:num])
        np.testing.assert_allclose(sum_first_n(f64(x, "n"), i32(num)).item(), expected)
        np.testing.assert_allclose(cfun(f64(x, "n"), num).item(), expected)


@translates("LaxControlFlowTest.test_issue_3204")
def test_issue_3204():
    def nested(a, b):
        def bodyfun_1(inp):
            val, i, j = inp

            def bodyfun_2(inp):
                val, i, j = inp
                return (val + i + j, i, j + 1)

            val = accy.while_loop(lambda inp: inp[2] < b + 1, bodyfun_2, (val, i, 0))[0]
            return (val, i + 1, 0)

        return accy.while_loop(lambda inp: inp[1] < a + 1, bodyfun_1, (0, 0, 0))[0]

    def jax_nested(a, b):
        def bodyfun_1(inp):
            val, i, j = inp

            def bodyfun_2(inp):
                val, i, j = inp
                return (val + i + j, i, j + 1)

            val = lax.while_loop(lambda inp: inp[2] < b + 1, bodyfun_2, (val, i, 0))[0]
            return (val, i + 1, 0)

        return lax.while_loop(lambda inp: inp[1] < a + 1, bodyfun_1, (0, 0, 0))[0]

    arr = np.arange(5)
    expected = jax.vmap(jax_nested)(arr, arr)
    out = accy.vmap(nested, "batch")(i32(arr, "batch"), i32(arr, "batch"))
    np.testing.assert_array_equal(out.array, expected)


@translates("LaxControlFlowTest.test_fori_loop_supports_unrolling")
def test_fori_loop_supports_unrolling():
    init = accy.named(np.float32(10), ())
    for lower, upper, unroll in ((np.int16(0), 10, 3), (0, np.int16(10), 2)):
        result = accy.fori_loop(lower, upper, lambda i, c: c + 1.0, init, unroll=unroll)
        expected = lax.fori_loop(lower, upper, lambda i, c: c + 1, np.float32(10), unroll=unroll)
        assert result.item() == float(expected) == 20.0
        traced = jit(lambda c, u=unroll: accy.fori_loop(0, 10, lambda i, c: c + 1.0, c, unroll=u))
        assert traced(init).item() == 20.0


@translates("LaxControlFlowTest.test_fori_loop_supports_unrolling_with_bool")
def test_fori_loop_supports_unrolling_with_bool():
    init = accy.named(np.float32(10), ())
    for lower, upper, unroll in ((np.int16(0), 10, True), (0, np.int16(10), False)):
        result = jit(
            lambda c, lo=lower, up=upper, u=unroll: accy.fori_loop(
                lo, up, lambda i, c: c + 1.0, c, unroll=u
            )
        )(init)
        expected = lax.fori_loop(lower, upper, lambda i, c: c + 1, np.float32(10), unroll=unroll)
        assert result.item() == float(expected) == 20.0


@translates("LaxControlFlowTest.test_fori_loop_with_dynamic_indices_cannot_unroll")
def test_fori_loop_with_dynamic_indices_cannot_unroll():
    @jit
    def f(upper):
        return accy.fori_loop(np.int16(0), upper, lambda i, c: c + 1.0, np.float32(10), unroll=3)

    with pytest.raises(accy.TransformError, match=r"unroll=3 needs Python int bounds"):
        f(10)


@translates("LaxControlFlowTest.testForiLoopBatchedIssue1190")
def test_fori_loop_batched_issue1190():
    """The loop counter, which no example changes, stays unbatched in the vmapped loop (the
    predicate is then one for all examples, and the loop is not masked)."""

    def f(x):
        return accy.while_loop(lambda c: c[0] < 4, lambda c: (c[0] + 1, c[1] + 1), (0, x))

    mapped = accy.vmap(f, "batch")
    out = mapped(i32(np.arange(3), "batch"))
    expected = jax.vmap(
        lambda x: lax.while_loop(lambda c: c[0] < 4, lambda c: (c[0] + 1, c[1] + 1), (0, x))
    )(jnp.arange(3))
    np.testing.assert_array_equal(out[1].array, expected[1])
    np.testing.assert_array_equal(out[0].array, expected[0])
    (loop,) = [op for op in program_of(mapped).operations if op.kind == "while_loop"]
    counter = loop.attrs["cond_body"].parameter_types[loop.attrs["num_consts"]]
    assert counter.rank == 0
    assert loop.attrs["cond_body"].count("reduce") == 0  # no "any example" reduction


@translates("LaxControlFlowTest.testCaching")
def test_caching():
    """accy runs a loop outside any trace eagerly (JAX's disable_jit); inside accy.jit its
    functions are traced once per signature."""
    executing = [True]

    def cond(x):
        assert executing[0]
        return x < 5

    def body(x):
        assert executing[0]
        return x + 2

    loop = jit(lambda x: accy.while_loop(cond, body, x))
    assert loop(0).item() == 6 == int(lax.while_loop(lambda x: x < 5, lambda x: x + 2, 0))
    executing[0] = False
    assert loop(0).item() == 6


@translates("LaxControlFlowTest.testWhileJVPWithGrowingNonzeroTangents")
def test_while_jvp_with_growing_nonzero_tangents():
    rng = np.random.default_rng(6)
    y, z, x = rng.standard_normal(2), rng.standard_normal(2), rng.standard_normal(2)

    def body(state):
        i, x, y, z = state
        y = x * x
        return i + 1, x, y, y * y

    def loop(x):
        return accy.while_loop(lambda s: s[0] < 2, body, (0, x, f64(y, "n"), f64(z, "n")))[1]

    def reference(x):
        return _while_loop_reference(lambda s: s[0] < 2, body, (0, x, y, z))[1]

    got = accy.jvp(loop, (f64(x, "n"),), (f64(x, "n"),))
    expected = jax.jvp(reference, (x,), (x,))
    np.testing.assert_allclose(value(got), expected)
    # check_grads(order=2, modes=["fwd"])
    second = accy.jvp(lambda x: accy.jvp(loop, (x,), (x,))[1], (f64(x, "n"),), (f64(x, "n"),))
    jax_second = jax.jvp(lambda x: jax.jvp(reference, (x,), (x,))[1], (x,), (x,))
    np.testing.assert_allclose(value(second), jax_second)


@translates("LaxControlFlowTest.testStaticForiGrad")
def test_static_fori_grad():
    """JAX runs float loop bounds as a float counter; accy's counter is an integer, and a float
    bound is refused with an error that says so (an int loop gives the same result)."""
    func = lambda x: accy.fori_loop(x, x + 2.0, lambda i, c: c, x)  # noqa: E731
    with pytest.raises(accy.TransformError, match=r"fori_loop: lower must be an integer scalar"):
        accy.grad(func)(f64(1.0))
    assert jax.grad(lambda x: lax.fori_loop(x, x + 2.0, lambda i, c: c, x))(1.0) == 1.0
    assert accy.grad(lambda x: accy.fori_loop(0, 2, lambda i, c: c, x))(f64(1.0)).item() == 1.0


@translates("LaxControlFlowTest.testWhileGradError")
def test_while_grad_error():
    func = lambda x: accy.while_loop(lambda i: i < 5.0, lambda i: i + 1.0, x)  # noqa: E731
    with pytest.raises(
        accy.NotDifferentiable, match="while_loop cannot be differentiated in reverse mode"
    ):
        accy.grad(func)(f64(1.0))
    y, f_jvp = accy.linearize(func, f64(1.0))  # linearization works
    jax_y, jax_f_jvp = jax.linearize(
        lambda x: lax.while_loop(lambda i: i < 5.0, lambda i: i + 1.0, x), 1.0
    )
    assert (y.item(), f_jvp(f64(1.0)).item()) == (float(jax_y), float(jax_f_jvp(1.0)))


@translates("LaxControlFlowTest.test_disable_jit_while_loop_with_mutation")
def test_disable_jit_while_loop_with_mutation():
    def body_fun(carry):
        x, y = carry
        x += 1
        return x, y + x

    def f():
        val = np.array(1.0)  # mutable, were it used in place
        return accy.while_loop(lambda c: c[0] < 10, body_fun, (val, val))[1]

    expected = jax.lax.while_loop(lambda c: c[0] < 10, body_fun, (np.array(1.0),) * 2)[1]
    assert f().item() == jit(f)().item() == float(expected)


@translates("LaxControlFlowTest.test_grad_remat_while_fixpoint")
def test_grad_remat_while_fixpoint():
    @accy.checkpoint
    def f(x, y):
        x, y = accy.while_loop(lambda _: False, lambda c: (c[1], c[0]), (x, y))
        return x + y

    y, f_jvp = accy.linearize(f, f64(1.0), f64(2.0))
    assert (y.item(), f_jvp(f64(1.0), f64(1.0)).item()) == (3.0, 2.0)


@translates("LaxControlFlowTest.test_while_readonly_carry_optimization")
def test_while_readonly_carry_optimization():
    def foo(w, x, c_max):
        def while_body(val):
            c, x, w = val
            return c + 1, x.contract(w, "i").rename("j", "i"), w

        _, x, w = accy.while_loop(lambda v: v[0] < c_max, while_body, (0, x, w))
        return w, x

    w, xs, c_maxs = np.ones((2, 2)), np.ones((4, 2)), np.arange(4)
    w_, x_ = accy.vmap(foo, "batch", in_axes=(None, 0, 0), out_axes=(None, 0))(
        f64(w, ("i", "j")), f64(xs, ("batch", "i")), i32(c_maxs, "batch")
    )
    jax_w, jax_x = jax.vmap(
        lambda w, x, c: lax.while_loop(
            lambda v: v[0] < c, lambda v: (v[0] + 1, v[1] @ v[2], v[2]), (0, x, w)
        )[1:][::-1],
        in_axes=(None, 0, 0),
        out_axes=(None, 0),
    )(w, xs, c_maxs)
    np.testing.assert_array_equal(w_.array, jax_w)
    np.testing.assert_array_equal(x_.array, jax_x)


def _split_list(items, sizes):
    parts, start = [], 0
    for size in sizes:
        parts.append(items[start : start + size])
        start += size
    return [*parts, items[start:]]


@translates("LaxControlFlowTest.test_while_constification_correctness")
@pytest.mark.parametrize(
    "seed,body_consts,uses,doesnt_use,noninplace",
    [(0, 0, 0, 0, 0), (1, 2, 1, 2, 1), (2, 1, 2, 0, 2)],
)
def test_while_constification_correctness(seed, body_consts, uses, doesnt_use, noninplace):
    num_carry = uses + doesnt_use + noninplace + 4
    rng = np.random.RandomState(seed)
    perm = rng.permutation(num_carry)
    iperm = np.argsort(perm)
    consts = [rng.randn(3) for _ in range(body_consts)]
    init_vals = list(rng.uniform(size=num_carry))

    def make(sin, total, convert, zero):
        def cond_fun(c):
            i, c = c
            c = [c[k] for k in iperm]
            used = c[:uses]
            return (i < 2) | convert(0.0 * sum(used, zero))

        def body_fun(c):
            i, c = c
            c = [c[k] for k in iperm]
            inplace, noninplace_fwds, dont = _split_list(c, [uses + doesnt_use, noninplace])
            dont = [sin(x) * sum((total(k) for k in consts), zero) for x in dont]
            new_c = [*inplace, *dont, *noninplace_fwds]
            return (i + 1, [new_c[k] for k in perm])

        return cond_fun, body_fun

    cond_fun, body_fun = make(
        lambda x: x.sin(), lambda k: f64(k, "k").sum(), lambda v: v.convert(accy.bool_), f64(0.0)
    )
    i, outs = accy.while_loop(cond_fun, body_fun, (0, [f64(v) for v in init_vals]))
    jax_cond, jax_body = make(jnp.sin, jnp.sum, lambda v: jnp.asarray(v).astype(bool), 0.0)
    jax_i, jax_outs = lax.while_loop(jax_cond, jax_body, (0, init_vals))
    assert i.item() == int(jax_i) == 2
    np.testing.assert_allclose([o.item() for o in outs], jax_outs)
    traced_i, traced = jit(lambda init: accy.while_loop(cond_fun, body_fun, (0, init)))(
        [f64(v) for v in init_vals]
    )
    np.testing.assert_allclose([o.item() for o in traced], jax_outs)


@translates("LaxControlFlowTest.test_while_constification_correctness_manually")
def test_while_constification_correctness_manually():
    def body_fun(c):
        for _ in range(2):
            f64(np.zeros(3), "n").sin()
        return 0.0, 1.0, c[0]

    init = (5.0, 0.0, 3.14)  # f32, as the floats the body returns
    for run in (accy.while_loop, jit(accy.while_loop, static_argnames=("cond_fn", "body_fn"))):
        outs = run(cond_fn=lambda c: c[1] == 0, body_fn=body_fun, init=init)
        assert tuple(o.item() for o in outs) == (0.0, 1.0, 5.0)


# -- cond and switch, more -------------------------------------------------------------------------


@translates("LaxControlFlowTest.testSwitchGradWithForwarding")
@pytest.mark.parametrize(
    "seed,num_input_fwd,num_output_fwd",
    [(1, 1, 2)]
    + [pytest.param(*p, marks=pytest.mark.slow) for p in ((0, 0, 0), (2, 3, 1), (3, 2, 3))],
)
def test_switch_grad_with_forwarding(seed, num_input_fwd, num_output_fwd):
    num_args, num_branches = 3, 4
    rng = np.random.RandomState(seed)
    in_perm, out_perm = rng.permutation(num_args), rng.permutation(num_args)

    def make(exp, sin, pick):
        def branch(s, inputs):
            inputs = [pick(inputs, i) for i in in_perm]
            outputs = inputs[:num_input_fwd] + [
                s * exp(inputs[i]) if i < num_output_fwd else sin(inputs[i])
                for i in range(num_args - num_input_fwd)
            ]
            return [outputs[i] for i in out_perm]

        return [functools.partial(branch, float(i)) for i in range(num_branches)]

    branches = make(lambda x: x.exp(), lambda x: x.sin(), lambda v, i: v["n", int(i)])
    jax_branches = make(jnp.exp, jnp.sin, lambda v, i: v[i])
    x = np.arange(float(num_args))
    # the index is traced, as in JAX's jitted f_: one program for every branch taken
    f = jit(lambda idx, inputs: accy.switch(idx, branches, inputs))
    for idx in range(num_branches):
        jax_f = jax.jit(lambda inputs, idx=idx: lax.switch(idx, jax_branches, inputs))
        out, tangent = accy.jvp(f, (i32(idx), f64(x, "n")), (i32(0), f64(x + 1.0, "n")))
        jax_out, jax_tangent = jax.jvp(jax_f, (x,), (x + 1.0,))
        np.testing.assert_allclose(value(out), jax_out)
        np.testing.assert_allclose(value(tangent), jax_tangent)
        cotangent = [f64(c) for c in (1.0, 2.0, 3.0)]
        _, got = accy.vjp(f, i32(idx), f64(x, "n"))[1](cotangent)
        (expected,) = jax.vjp(jax_f, x)[1]([1.0, 2.0, 3.0])
        np.testing.assert_allclose(got.array, expected)


@translates("LaxControlFlowTest.testSwitchGradWithWeakTypeMismatch")
def test_switch_grad_with_weak_type_mismatch():
    branches = [lambda x: x, lambda x: x + np.float64(1.0)]

    def f(x):
        return accy.switch(x.convert(accy.i32), branches, x)

    for x in (0.0, 1.0):
        expected = jax.grad(
            lambda x: lax.switch(x.astype(jnp.int32), [lambda x: x, lambda x: x + 1.0], x)
        )(x)
        assert accy.grad(f)(f64(x)).item() == float(expected) == 1.0


# accy.cond, and (in the slow run) accy.cond inside accy.checkpoint
COND_IMPLS = ["cond", pytest.param("checkpointed_cond", marks=pytest.mark.slow)]


def _cond_impl(kind):
    """accy.cond, or accy.cond inside accy.checkpoint (JAX's cond_with_new_checkpoint)."""
    if kind == "cond":
        return accy.cond
    return lambda pred, *rest: accy.checkpoint(lambda pred: accy.cond(pred, *rest))(pred)


@pytest.mark.slow
@translates("LaxControlFlowTest.testCondGrad2")
@pytest.mark.parametrize("kind", COND_IMPLS)
def test_cond_grad2(kind):
    cond = _cond_impl(kind)

    def _f(x):
        return cond(x["n", 0] < 2.0, lambda x: f64([1.0, 2.0], "n") * x, lambda x: x.sin(), x)

    f = lambda x: jit(_f)(x).sum()  # noqa: E731

    def jax_f(x):
        return lax.cond(x[0] < 2, lambda x: jnp.array([1.0, 2.0]) * x, jnp.sin, x).sum()

    for x in (2.14 * np.ones(2), 1.72 * np.ones(2)):
        np.testing.assert_allclose(accy.grad(f)(f64(x, "n")).array, jax.grad(jax_f)(x))
        # check_grads(order=2): the Hessian, by forward over reverse
        hessian = accy.jacfwd(lambda x: accy.grad(f)(x).rename("n", "n_out"))(f64(x, "n"))
        np.testing.assert_allclose(hessian.array, jax.hessian(jax_f)(x), atol=1e-12)


@translates("LaxControlFlowTest.testCondGrad3")
@pytest.mark.parametrize("kind", COND_IMPLS)
def test_cond_grad3(kind):
    cond = _cond_impl(kind)

    def fun(x):
        return cond(x < 3.0, lambda _: np.float64(2.0), lambda x: 2.0 * x, x)

    def jax_fun(x):
        return lax.cond(x < 3, lambda _: 2.0, lambda x: 2.0 * x, x)

    for x in (3.14, 2.72):
        assert accy.grad(fun)(f64(x)).item() == float(jax.grad(jax_fun)(x))
        assert accy.grad(accy.grad(fun))(f64(x)).item() == float(jax.grad(jax.grad(jax_fun))(x))


@pytest.mark.slow
@translates("LaxControlFlowTest.testCondGrad4")
@pytest.mark.parametrize("kind", COND_IMPLS)
def test_cond_grad4(kind):
    cond = _cond_impl(kind)

    @jit
    def fun(x, y):
        return cond(x < 3.0, lambda _: 2.0 * y.sin(), lambda x: 2.0 * x, x)

    def jax_fun(x, y):
        return lax.cond(x < 3, lambda _: 2.0 * jnp.sin(y), lambda x: 2.0 * x, x)

    y = 5.8
    for x in (3.14, 2.72):
        got = accy.grad(fun, argnums=(0, 1))(f64(x), f64(y))
        expected = jax.grad(jax_fun, (0, 1))(x, y)
        np.testing.assert_allclose([g.item() for g in got], expected)
        second = accy.grad(lambda x, y: accy.grad(fun, argnums=1)(x, y), argnums=1)(f64(x), f64(y))
        jax_second = jax.grad(jax.grad(jax_fun, 1), 1)(x, y)
        np.testing.assert_allclose(second.item(), jax_second)


@translates("LaxControlFlowTest.testCondLinearize")
def test_cond_linearize():
    def f(x):
        return accy.cond(x < 2.0, lambda x: 3.0 * x, lambda x: x.sin(), x)

    def jax_f(x):
        return lax.cond(x < 2, lambda x: 3.0 * x, jnp.sin, x)

    for x in (1.0, 4.0):
        y, f_lin = accy.linearize(f, f64(x))
        jax_y, jax_f_lin = jax.linearize(jax_f, x)
        assert y.item() == pytest.approx(float(jax_y))
        assert f_lin(f64(2.0)).item() == pytest.approx(float(jax_f_lin(2.0)))
    assert accy.linearize(f, f64(1.0))[1](f64(2.0)).item() == 6.0


@pytest.mark.slow
@translates("LaxControlFlowTest.testSwitchLinearize")
def test_switch_linearize():
    jax_branches = [lambda x: 3.0 * x, jnp.sin, lambda x: -x]

    def jax_f(x):
        return lax.switch(lax.convert_element_type(x // 1, np.int32), jax_branches, x)

    for x in (-1.0, 0.0, 1.0, 2.0, 3.0):
        y, f_lin = accy.linearize(_switch_grad_f, f64(x))
        jax_y, jax_f_lin = jax.linearize(jax_f, x)
        assert y.item() == pytest.approx(float(jax_y))
        assert f_lin(f64(2.0)).item() == pytest.approx(float(jax_f_lin(2.0)))


def _switch_grad_f(x):
    branches = [lambda x: 3.0 * x, lambda x: x.sin(), lambda x: -x]
    return accy.switch((x // 1.0).convert(accy.i32), branches, x)


@translates("LaxControlFlowTest.testCondLinearize2")
@pytest.mark.parametrize("kind", COND_IMPLS)
def test_cond_linearize2(kind):
    cond = _cond_impl(kind)

    def f(x):
        return cond(
            x["n", 0] < 2.0, lambda x: f64([1.0, 2.0], "n") * x, lambda x: x.sin().cos(), x
        ).sum()

    def f_ref(x):
        z = jnp.array([1.0, 2.0]) * x if x[0] < 2 else jnp.cos(jnp.sin(x))
        return z.sum()

    for fun, x in ((f, 2.14 * np.ones(2)), (f, -2.14 * np.ones(2)), (jit(f), 2.14 * np.ones(2))):
        y, f_lin = accy.linearize(fun, f64(x, "n"))
        y_ref, f_lin_ref = jax.linearize(f_ref, x)
        np.testing.assert_allclose(y.item(), y_ref)
        np.testing.assert_allclose(f_lin(f64(x, "n")).item(), f_lin_ref(x))


@translates("LaxControlFlowTest.testCondJitDisabled")
@pytest.mark.parametrize("kind", COND_IMPLS)
def test_cond_jit_disabled(kind):
    """accy runs control flow eagerly outside a trace, as JAX does under jax.disable_jit()."""
    cond = _cond_impl(kind)

    def f(x):
        return cond(x < 2.0, lambda x: 3.0 * x, lambda x: x.sin(), x)

    with jax.disable_jit():
        expected = lax.cond(1.0 < 2, lambda x: 3.0 * x, jnp.sin, 1.0)
    assert f(f64(1.0)).item() == float(expected) == 3.0
    assert jit(f)(f64(1.0)).item() == f(f64(1.0)).item()


@pytest.mark.slow
@translates("LaxControlFlowTest.testIssue1263")
def test_issue1263():
    def f(rng, x):
        pred = accy.random.bernoulli(rng, 0.5, {})
        return accy.cond(pred, lambda x, _: x, lambda _, x: x, x, x.abs() - 1.0)

    def body_fn(i, state):
        rng, x = state
        key, subkey = accy.random.split(rng)
        return key, f(subkey, x)

    def g(rng, x):
        return accy.fori_loop(0, 10, body_fn, (rng, x))

    keys = accy.random.split_along(accy.random.key(0, device=R), "batch", 3)
    xs = f64(np.ones((3, 4)), ("batch", "n"))
    out_keys, out = accy.vmap(g, "batch")(keys, xs)
    for b in range(3):  # each example as the same program run on it alone
        key_b, out_b = jit(g)(keys["batch", b], xs["batch", b])
        np.testing.assert_array_equal(out["batch", b].array, out_b.array)
        np.testing.assert_array_equal(out_keys["batch", b].array, key_b.array)


@translates("LaxControlFlowTest.test_cond_transformation_rule_with_consts")
def test_cond_transformation_rule_with_consts():
    @accy.custom_jvp
    def f(x):
        return x

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (xdot,) = primals, tangents
        const = f64(np.arange(3.0), "n")
        return x * const, xdot * const

    @jax.custom_jvp
    def jax_f(x):
        return x

    @jax_f.defjvp
    def jax_f_jvp(primals, tangents):
        (x,), (xdot,) = primals, tangents
        return x * np.arange(3.0), xdot * np.arange(3.0)

    x = np.arange(3.0)
    got = accy.jvp(lambda x: accy.cond(True, f, lambda x: x, x), (f64(x, "n"),), (f64(x, "n"),))
    traced = accy.jvp(
        lambda x: accy.cond(x["n", 0] < 1.0, f, lambda x: x, x), (f64(x, "n"),), (f64(x, "n"),)
    )
    expected = jax.jvp(lambda x: lax.cond(True, jax_f, lambda x: x, x), (x,), (x,))
    np.testing.assert_allclose(value(got[1]), expected[1])
    np.testing.assert_allclose(value(traced[1]), expected[1])
    # the primal output is f's own (JAX returns the rule's, which should be the same)
    np.testing.assert_allclose(value(got[0]), x)


@translates("LaxControlFlowTest.test_cond_excessive_compilation")
def test_cond_excessive_compilation():
    """An eager cond on a concrete predicate runs the taken branch alone, building no program."""
    calls = []

    def f(x):
        calls.append("f")
        return x + 1

    def g(x):
        calls.append("g")
        return x + 2

    compiled = (
        accy.caches.stats()["compiled programs"]["entries"]
        if hasattr(accy.caches, "stats")
        else None
    )
    results = [accy.cond(x, f, g, i32(x)).item() for x in range(10)]
    assert results == [int(lax.cond(x, lambda x: x + 1, lambda x: x + 2, x)) for x in range(10)]
    assert calls == ["g"] + ["f"] * 9
    if compiled is not None:
        assert accy.caches.stats()["compiled programs"]["entries"] == compiled


@translates("LaxControlFlowTest.test_cond_ad_batched_unit")
def test_cond_ad_batched_unit():
    def cond_id(x):
        return accy.cond(x < 0.0, lambda x: x, lambda x: x, x)

    def jax_cond_id(x):
        return lax.cond(x < 0.0, lambda x: x, lambda x: x, x)

    got = accy.vmap(accy.jacrev(lambda x: cond_id(cond_id(x))), "batch")(f64(np.ones(1), "batch"))
    expected = jax.vmap(jax.jacrev(lambda x: jax_cond_id(jax_cond_id(x))))(jnp.ones(1))
    np.testing.assert_array_equal(got.array, expected)


@pytest.mark.slow
@translates("LaxControlFlowTest.test_custom_jvp_tangent_cond_transpose")
def test_custom_jvp_tangent_cond_transpose():
    """A custom_jvp rule that switches on its tangents: reverse mode transposes that cond."""

    def mask_fun(arr, choice):
        return (1.0 - choice) * arr.sum() + choice * (1.0 - arr.sum())

    def switch_fun(arr, choice):
        index = choice.floor().convert(accy.i32)
        return accy.switch(index, [lambda x: x.sum(), lambda x: 1.0 - x.sum()], arr)

    def jax_mask_fun(arr, choice):
        return (1 - choice) * arr.sum() + choice * (1 - arr.sum())

    def jax_switch_fun(arr, choice):
        choice = jnp.floor(choice).astype(jnp.int32)
        return lax.switch(choice, [lambda x: x.sum(), lambda x: 1 - x.sum()], arr)

    def custom(fun, rule_fun):
        wrapped = accy.custom_jvp(fun)

        @wrapped.defjvp
        def _(primals, tangents):
            (arr, choice), (arr_dot, _) = primals, tangents
            return fun(arr, choice), rule_fun(arr_dot, choice)

        return wrapped

    arr = f64(np.arange(3.0), "n")
    for choice in (0.0, 1.0):
        expected = jax.grad(jax_mask_fun)(np.arange(3.0), choice)
        np.testing.assert_array_equal(jax.grad(jax_switch_fun)(np.arange(3.0), choice), expected)
        for fun in (
            mask_fun,
            switch_fun,
            custom(switch_fun, mask_fun),
            custom(switch_fun, switch_fun),
        ):
            np.testing.assert_allclose(accy.grad(fun)(arr, f64(choice)).array, expected)
    # the transpose of a function linear in x through a cond, against JAX's
    for pred in (True, False):
        linear = lambda x, p=pred: accy.cond(  # noqa: E731
            f64(1.0) > (0.0 if p else 2.0), lambda x: 2.0 * x, lambda x: -x.cumsum("n"), x
        )
        jax_linear = lambda x, p=pred: lax.cond(  # noqa: E731
            p, lambda x: 2.0 * x, lambda x: -jnp.cumsum(x), x
        )
        (got,) = accy.linear_transpose(linear, arr)(f64([1.0, 2.0, 3.0], "n"))
        (want,) = jax.linear_transpose(jax_linear, np.zeros(3))(np.array([1.0, 2.0, 3.0]))
        np.testing.assert_allclose(got.array, want)


@translates("LaxControlFlowTest.test_cond_vmap_forwarding_doesnt_promote")
def test_cond_vmap_forwarding_doesnt_promote():
    def f(x, y):
        return accy.cond(x < 3, lambda x, y: (x * 2, y), lambda x, y: (x * 3, y), x, y)

    x2, y2 = accy.vmap(f, "batch", in_axes=(0, None), out_axes=(0, None))(
        i32(np.arange(3), "batch"), f64(3.0)
    )
    expected = jax.vmap(
        lambda x, y: lax.cond(x < 3, lambda x, y: (x * 2, y), lambda x, y: (x * 3, y), x, y),
        in_axes=(0, None),
        out_axes=(0, None),
    )(jnp.arange(3), jnp.array(3.0))
    np.testing.assert_array_equal(x2.array, expected[0])
    assert y2.ty == f64(3.0).ty and y2.item() == float(expected[1]) == 3.0


@translates("LaxControlFlowTest.test_cond_basic_vjp3")
def test_cond_basic_vjp3():
    for other in (lambda x: x, lambda x: np.float64(1.0)):
        _, f_vjp = accy.vjp(lambda x, o=other: accy.cond(True, lambda x: x.sin(), o, x), f64(1.0))
        (g,) = f_vjp(f64(1.0))
        traced = accy.vjp(lambda x, o=other: accy.cond(x > 0.0, lambda x: x.sin(), o, x), f64(1.0))
        (h,) = traced[1](f64(1.0))
        assert g.item() == h.item() == pytest.approx(float(jnp.cos(1.0)), rel=1e-15)


# -- scan, more ------------------------------------------------------------------------------------


@translates("LaxControlFlowTest.testIssue1316")
def test_issue1316():
    def f(carry, _):
        c, key = carry
        key, _ = accy.random.split(key)
        return (c, key), ()

    key = accy.random.key(0, device=R)
    grad = accy.grad(lambda c: accy.scan(f, (c, key), f64(np.ones(3), "time"), axis="time")[0][0])(
        f64(0.0)
    )
    assert (
        grad.item()
        == 1.0
        == float(jax.grad(lambda c: lax.scan(lambda c, _: (c, ()), c, np.ones(3))[0])(0.0))
    )


@translates("LaxControlFlowTest.test_xla_cpu_gpu_loop_cond_bug")
def test_xla_cpu_gpu_loop_cond_bug():
    def deriv(f):
        return lambda x, *args: accy.linearize(lambda x: f(x, *args), x)[1](f64(1.0))

    def _while_loop(cond_fun, body_fun, init_val, max_iter):
        def _iter(val):
            return body_fun(val), True

        def _fun(tup, _):
            val, pred = tup
            return accy.cond(pred, _iter, lambda x: (x, False), val), None

        init = (init_val, cond_fun(init_val))
        return accy.scan(_fun, init, None, length=max_iter, axis="time")[0][0]

    def my_pow(x, y):
        return _while_loop(lambda val: True, lambda val: val * x, f64(1.0), y)

    assert deriv(my_pow)(f64(3.0), 1).item() == 1.0


@translates("LaxControlFlowTest.test_scan_hoisting_consts")
@pytest.mark.parametrize("remat", [False, True], ids=["scan", "remat_scan"])
def test_scan_hoisting_consts(remat):
    a = np.arange(4.0).reshape(2, 2)
    b = a + 1.0

    def f(x):
        big_a, big_b = f64(a, ("i", "j")), f64(b, ("i", "j"))

        def dot(m, c):
            return m.contract(c.rename("i", "j"), "j")

        def body(c, _):
            c1, c2, c3 = c
            return (dot(big_a, c1), dot(big_b, c2), dot(big_b.sin(), c3)), None

        ones = f64(np.ones(2), "i")
        init = (x * ones, x * ones, x * ones)
        (c1, c2, c3), _ = accy.scan(body, init, None, length=3, axis="time", remat=remat)
        return c1.sum() + c2.sum() + c3.sum()

    def jax_f(x):
        def body(c, _):
            c1, c2, c3 = c
            return (jnp.dot(a, c1), jnp.dot(b, c2), jnp.dot(jnp.sin(b), c3)), None

        init = (x * jnp.ones(2),) * 3
        (c1, c2, c3), _ = lax.scan(body, init, None, length=3)
        return jnp.sum(c1) + jnp.sum(c2) + jnp.sum(c3)

    np.testing.assert_allclose(accy.grad(f)(f64(1.0)).item(), jax.grad(jax_f)(1.0))


@translates("LaxControlFlowTest.test_scan_readonly_carry_optimization")
def test_scan_readonly_carry_optimization():
    def f(x, y):
        def g(_, y):
            return accy.scan(lambda y, _: (y, None), y, None, length=1, axis="time")[0]

        return accy.cond(x < 0.0, g, g, x, y)

    out = accy.vmap(f, "batch", in_axes=(0, None), out_axes=None)(
        f64(np.arange(3.0), "batch"), f64(3.0)
    )
    assert out.item() == 3.0


@translates("LaxControlFlowTest.test_scan_constification_correctness")
@pytest.mark.parametrize(
    "seed,body_consts,inplace,noninplace", [(0, 0, 0, 0), (1, 2, 1, 2), (2, 1, 2, 1)]
)
def test_scan_constification_correctness(seed, body_consts, inplace, noninplace):
    num_carry, num_xs, num_ys = inplace + noninplace + 4, 2, 3
    rng = np.random.RandomState(seed)
    perm = rng.permutation(num_carry)
    iperm = np.argsort(perm)
    consts = [rng.randn(3) for _ in range(body_consts)]
    init_vals = list(rng.uniform(size=num_carry))

    def make(sin, total, zero):
        def body_fun(c, _):
            c = [c[k] for k in iperm]
            fwd, nonfwd, dont = _split_list(c, [inplace, noninplace])
            dont = [sin(x) * sum((total(k) for k in consts), zero) for x in dont]
            new_c = [*fwd, *dont, *nonfwd]
            return [new_c[k] for k in perm], [zero * 0.0 for _ in range(num_ys)]

        return body_fun

    body = make(lambda x: x.sin(), lambda k: f64(k, "k").sum(), f64(0.0))
    xs = [f64(np.arange(2.0), "time") for _ in range(num_xs)]
    outs = accy.scan(body, [f64(v) for v in init_vals], xs, axis="time")[0]
    jax_outs = lax.scan(make(jnp.sin, jnp.sum, 0.0), init_vals, [jnp.arange(2.0)] * num_xs)[0]
    np.testing.assert_allclose([o.item() for o in outs], jax_outs)
    traced = jit(lambda init, xs: accy.scan(body, init, xs, axis="time")[0])(
        [f64(v) for v in init_vals], xs
    )
    np.testing.assert_allclose([o.item() for o in traced], jax_outs)


@translates("LaxControlFlowTest.test_scan_forwarding_correctness")
@pytest.mark.parametrize(
    "seed,body_consts,const_fwds,input_fwds", [(0, 0, 0, 0), (1, 2, 1, 2), (2, 1, 2, 1)]
)
def test_scan_forwarding_correctness(seed, body_consts, const_fwds, input_fwds):
    num_carry, num_xs = const_fwds + 4, input_fwds + 2
    num_ys = num_xs + 1
    rng = np.random.RandomState(seed)
    carry_perm = rng.permutation(num_carry)
    carry_iperm = np.argsort(carry_perm)
    xs_perm, ys_perm = rng.permutation(num_xs), rng.permutation(num_ys)
    consts = [rng.randn(3) for _ in range(body_consts)]
    init_vals = list(rng.uniform(size=num_carry))
    xs = list(rng.uniform(size=(num_xs, 2)))

    def make(sin, cos, total, zero):
        def body_fun(c, x):
            c = [c[k] for k in carry_iperm]
            fwds, dont = _split_list(c, [const_fwds])[:2]
            dont = [sin(v) * sum((total(k) for k in consts), zero) for v in dont]
            new_c = [*fwds, *dont]
            x = [x[k] for k in xs_perm]
            x_fwd, x_dont = _split_list(x, [input_fwds])[:2]
            x_dont = [cos(v) * sum((total(k) for k in consts), zero) for v in x_dont]
            y = [*x_fwd, *x_dont, zero * 0.0]
            return [new_c[k] for k in carry_perm], [y[k] for k in ys_perm]

        return body_fun

    body = make(lambda v: v.sin(), lambda v: v.cos(), lambda k: f64(k, "k").sum(), f64(0.0))
    final, outs = jit(lambda init, xs: accy.scan(body, init, xs, axis="time"))(
        [f64(v) for v in init_vals], [f64(x, "time") for x in xs]
    )
    jax_final, jax_outs = lax.scan(make(jnp.sin, jnp.cos, jnp.sum, 0.0), init_vals, xs)
    np.testing.assert_allclose([v.item() for v in final], jax_final)
    for got, want in zip(outs, jax_outs, strict=True):
        np.testing.assert_allclose(got.array, want)


@pytest.mark.slow
@translates("LaxControlFlowTest.test_scan_vjp_forwarding_correctness")
@pytest.mark.parametrize(
    "seed,rule_consts,const_fwds,carry_fwds,input_fwds",
    [(0, 0, 0, 0, 0), (1, 2, 1, 2, 1), (3, 1, 2, 1, 2)],
)
def test_scan_vjp_forwarding_correctness(seed, rule_consts, const_fwds, carry_fwds, input_fwds):
    coeff = 1.0 if not rule_consts else float(np.prod(np.ones(3) / rule_consts * rule_consts))

    @accy.custom_jvp
    def foo(x):
        return 3.0 * x

    @foo.defjvp
    def _(primals, tangents):
        (x,), (x_dot,) = primals, tangents
        return foo(x), coeff * x_dot

    @jax.custom_jvp
    def jax_foo(x):
        return 3.0 * x

    @jax_foo.defjvp
    def _(primals, tangents):
        (x,), (x_dot,) = primals, tangents
        return jax_foo(x), coeff * x_dot

    num_const, num_carry, num_xs = const_fwds + 2, carry_fwds + 4, input_fwds + 2
    rng = np.random.RandomState(seed)
    carry_perm = rng.permutation(num_carry)
    carry_iperm = np.argsort(carry_perm)
    xs_perm, ys_perm = rng.permutation(num_xs), rng.permutation(num_xs + 1)
    consts = [rng.randn(3) for _ in range(num_const)]
    init_vals = list(rng.uniform(size=(num_carry, 3)))
    xs = list(rng.uniform(size=(num_xs, 2)))

    def make(as_array, sin, cos, total, foo, zero):
        body_consts = [as_array(k) for k in consts]

        def body_fun(c, x):
            c = [c[k] for k in carry_iperm]
            const_fwd, const_dont = _split_list(body_consts, [const_fwds])[:2]
            z = sum(const_dont[1:], const_dont[0])
            fwds, dont = _split_list(c, [const_fwds])[:2]
            fwds = [functools.reduce(lambda a, b: a * b, [v, v, *const_fwd, z]) for v in fwds]
            dont = [sin(v) * sum((total(k) for k in body_consts), zero) for v in dont]
            new_c = [(fwds + dont)[k] for k in carry_perm]
            new_c = [foo(new_c[0]), *new_c[1:]]
            x = [x[k] for k in xs_perm]
            x_fwd, x_dont = _split_list(x, [input_fwds])[:2]
            x_fwd = [v * v for v in x_fwd]
            x_dont = [cos(v) * sum((total(k) for k in body_consts), zero) for v in x_dont]
            y = [*x_fwd, *x_dont, zero * 0.0]
            return new_c, [y[k] for k in ys_perm]

        return body_fun

    body = make(
        lambda k: f64(k, "k"),
        lambda v: v.sin(),
        lambda v: v.cos(),
        lambda k: k.sum(),
        foo,
        f64(0.0),
    )
    jax_body = make(jnp.asarray, jnp.sin, jnp.cos, jnp.sum, jax_foo, 0.0)
    scan = jit(lambda init, xs: accy.scan(body, init, xs, axis="time"))
    primals = ([f64(v, "k") for v in init_vals], [f64(x, "time") for x in xs])
    (final, outs), back = accy.vjp(scan, *primals)
    (jax_final, jax_outs), jax_back = jax.vjp(functools.partial(lax.scan, jax_body), init_vals, xs)
    np.testing.assert_allclose([v.array for v in final], jax_final, rtol=1e-12)
    init_bar, xs_bar = back((final, outs))
    jax_init_bar, jax_xs_bar = jax_back((jax_final, jax_outs))
    np.testing.assert_allclose([v.array for v in init_bar], jax_init_bar, rtol=1e-10)
    np.testing.assert_allclose([v.array for v in xs_bar], jax_xs_bar, rtol=1e-10)


@translates("LaxControlFlowTest.test_scan_input_to_output_forwarding")
def test_scan_input_to_output_forwarding():
    """A y that is the x slice unchanged is the x itself: the scan's body returns the carry
    alone."""

    def g(x):
        return accy.scan(lambda c, x: (c + 1.0, x), np.float64(0.0), x, axis="time")

    program = accy.make_program(g)(f64(np.arange(3.0), "time"))
    (scan,) = [op for op in program.operations if op.kind == "scan"]
    assert len(scan.attrs["body"].outputs) == 1
    carry, ys = jit(g)(f64(np.arange(3.0), "time"))
    expected = lax.scan(lambda c, x: (c + 1, x), 0.0, jnp.arange(3.0))
    assert carry.item() == float(expected[0]) == 3.0
    np.testing.assert_array_equal(ys.array, expected[1])


@translates("LaxControlFlowTest.test_scan_fixpoint_instantiate")
def test_scan_fixpoint_instantiate():
    def f(x):
        c, _ = accy.scan(
            lambda c, _: ((np.float64(0.0), np.float64(0.0)), ()),
            (x, np.float64(0.0)),
            (),
            length=5,
            axis="time",
        )
        return c[0] + c[1]

    def jax_f(x):
        c, () = lax.scan(lambda c, _: ((0.0, 0.0), ()), (x, 0.0), (), length=5)
        return sum(c)

    assert accy.grad(f)(f64(1.0)).item() == float(jax.grad(jax_f)(1.0)) == 0.0


@translates("LaxControlFlowTest.test_scan_diff_of_print")
def test_scan_diff_of_print(capsys):
    """The print in the scan's body stays in the differentiated program: it prints at each
    step of the forward pass, as JAX's."""

    def f(c, _):
        accy.debug_print("c = {c:.1f}", c=c)
        return c + 1.0, None

    def jax_f(c, _):
        jax.debug.print("c = {c:.1f}", c=c, ordered=True)
        return c + 1.0, None

    jax.value_and_grad(lambda x: lax.scan(jax_f, x, length=2)[0])(1.0)
    jax.effects_barrier()
    expected = capsys.readouterr().out
    grad = accy.value_and_grad(lambda x: accy.scan(f, x, None, length=2, axis="time")[0])
    value_, gradient = grad(f64(1.0))
    assert capsys.readouterr().out == expected == "c = 1.0\nc = 2.0\n"
    assert (value_.item(), gradient.item()) == (3.0, 1.0)


# -- associative_scan ------------------------------------------------------------------------------


@translates("LaxControlFlowTest.testAssociativeScanUnstructured")
@pytest.mark.parametrize(
    "shape,axis",
    [
        ([0], -1),
        ([1], -1),
        ([5], -1),
        pytest.param([1000], -1, marks=pytest.mark.slow),
        ([2, 3], -2),
        ([2, 3], -1),
        ([5, 6, 7], -2),
        ([5, 6, 7], 0),
    ],
)
def test_associative_scan_unstructured(shape, axis):
    data = np.arange(np.prod(shape)).reshape(shape) + 7
    expected = np.cumsum(data, axis=axis)
    names = tuple(f"a{i}" for i in range(len(shape)))
    result = accy.associative_scan(operator.add, i32(data, names), axis=names[axis])
    np.testing.assert_array_equal(result.array, expected)
    np.testing.assert_array_equal(result.array, lax.associative_scan(operator.add, data, axis=axis))


@translates("LaxControlFlowTest.testAssociativeScanUnstructured1000Reverse")
def test_associative_scan_unstructured1000_reverse():
    data = np.arange(1000) + 32
    expected = np.cumsum(data[::-1])[::-1]
    for run in (
        accy.associative_scan,
        jit(accy.associative_scan, static_argnames=("fn", "axis", "reverse")),
    ):
        result = run(fn=operator.add, elems=i32(data, "t"), axis="t", reverse=True)
        np.testing.assert_array_equal(result.array, expected)


@translates("LaxControlFlowTest.testAssociativeScanStructured3")
def test_associative_scan_structured3():
    pair = collections.namedtuple("pair", ("first", "second"))
    data = pair(first=f64([0.0, 1.0, 2.0], "t"), second=f64([0.0, 10.0, 20.0], "t"))

    def fn(a, b):
        return pair(first=a.first + b.first, second=a.second + b.second)

    result = accy.associative_scan(fn, data, axis="t")
    np.testing.assert_array_equal(result.first.array, [0.0, 1.0, 3.0])
    np.testing.assert_array_equal(result.second.array, [0.0, 10.0, 30.0])


@pytest.mark.slow
@translates("LaxControlFlowTest.testAssociativeScanOfBools")
def test_associative_scan_of_bools():
    x = np.array([False, True, True, True, False, True])
    expected = lax.associative_scan(lax.bitwise_xor, x)
    y = accy.associative_scan(operator.xor, accy.named(x, "t", device=R), axis="t")
    np.testing.assert_array_equal(y.array, expected)
    np.testing.assert_array_equal(y.array, [False, True, False, True, True, False])


@translates("LaxControlFlowTest.testAssociativeScanSolvingRegressionTest")
@pytest.mark.parametrize("length", [2, pytest.param(43, marks=pytest.mark.slow)])
def test_associative_scan_solving_regression_test(length):
    """fn is vmapped over the scanned axis and solves 2x2 systems (by Cramer's rule: accy has
    no linalg.solve), a function that needs the batch to be laid out right."""
    ms = f64(np.repeat(np.eye(2).reshape(1, 2, 2), length, axis=0), ("t", "r", "c"))
    vs = f64(np.ones((length, 2)), ("t", "c"))

    def solve(m, v):
        a, b, c, d = m["r", 0, "c", 0], m["r", 0, "c", 1], m["r", 1, "c", 0], m["r", 1, "c", 1]
        det = a * d - b * c
        x0 = (v["c", 0] * d - b * v["c", 1]) / det
        x1 = (a * v["c", 1] - c * v["c", 0]) / det
        return accy.named(np.zeros(2), "c", device=R) + (
            x0 * f64([1.0, 0.0], "c") + x1 * f64([0.0, 1.0], "c")
        )

    def fn(a, b):
        (m1, v1), (m2, v2) = a, b
        return m1 + m2, solve(m1, v2) + solve(m2, v1)

    m_out, v_out = accy.associative_scan(accy.vmap(fn, "t"), (ms, vs), axis="t")
    jax_fn = jax.vmap(
        lambda a, b: (a[0] + b[0], jnp.linalg.solve(a[0], b[1]) + jnp.linalg.solve(b[0], a[1]))
    )
    jax_m, jax_v = lax.associative_scan(jax_fn, (np.asarray(ms.array), np.asarray(vs.array)))
    np.testing.assert_allclose(m_out.array, jax_m)  # a sum: associative
    # the solving half is not associative: only the first combination is the same for any
    # order of combining
    np.testing.assert_allclose(v_out.array[:2], jax_v[:2], rtol=1e-12)


# -- not applicable --------------------------------------------------------------------------------

_PLATFORM = (
    "lax.platform_dependent: accy chooses kernels per device inside its backends, and a user "
    "program has no per-platform branches"
)
NOT_APPLICABLE = {
    "LaxControlFlowTest.testWhileLoopAxisIndexBatched": (
        "lax.axis_index of vmap's positional axis_name: accy's vmap maps a named axis, and "
        "its axis_index is a mesh collective"
    ),
    "LaxControlFlowTest.testSwitchResidualsMerge": (
        "counts the residual slots of JAX's linearized cond jaxprs; accy's reverse mode inlines "
        "a cond into both branches and a select, so it has no per-branch residuals to merge"
    ),
    "LaxControlFlowTest.test_scan_init_weak_type": (
        "weak types: accy has no weakly typed values (Python scalars are f32/i32)"
    ),
    "LaxControlFlowTest.test_while_loop_init_weak_type": (
        "weak types: accy has no weakly typed values (Python scalars are f32/i32)"
    ),
    "LaxControlFlowTest.testCaching2": (
        "JAX skips it as not implemented (a trace cache keyed by a function's code rather "
        "than its identity)"
    ),
    "LaxControlFlowTest.testIssue804": "jax.pmap with lax.psum: accy has no pmap",
    "LaxControlFlowTest.test_while_loop_of_pmap": "jax.pmap inside a loop: accy has no pmap",
    "LaxControlFlowTest.test_while_loop_of_pmap_error_message": (
        "jax.pmap's device-count error: accy has no pmap"
    ),
    "LaxControlFlowTest.test_caches_depend_on_axis_env": (
        "lax.axis_size of vmap's axis_name: accy's vmap has no axis environment (the mapped "
        "axis is a named axis of the arguments)"
    ),
    "LaxControlFlowTest.test_scan_vmap_collectives": (
        "lax.psum over vmap's axis_name: accy's collectives run over mesh axes, not vmap's"
    ),
    "LaxControlFlowTest.testIssue810": "counts dynamic-update-slice ops in XLA's HLO text",
    "LaxControlFlowTest.test_scan_lowering_doesnt_introduce_singleton": (
        "inspects XLA's HLO text for a reshape"
    ),
    "LaxControlFlowTest.test_scan_vjp_forwards_extensive_residuals": (
        "checks the identity of JAX's vjp residual objects (vjp_fun.args_res)"
    ),
    "LaxControlFlowTest.test_cond_memory_leak": (
        "counts jax.live_arrays() device buffers after jit's clear_cache"
    ),
    "LaxControlFlowTest.test_platform_dependent": _PLATFORM,
    "LaxControlFlowTest.test_platform_dependent_no_args": _PLATFORM,
    "LaxControlFlowTest.test_platform_dependent_lowering": _PLATFORM,
    "LaxControlFlowTest.test_platform_dependent_with_non_existent_custom_call": _PLATFORM,
    "LaxControlFlowTest.test_platform_dependent_with_primitive_with_lowering_error": _PLATFORM,
    "LaxControlFlowTest.test_platform_dependent_multiple_identical_branches": _PLATFORM,
    "LaxControlFlowTest.test_platform_dependent_no_default": _PLATFORM,
    "LaxControlFlowTest.test_platform_dependent_batched": _PLATFORM,
    "LaxControlFlowTest.test_platform_dependent_grad": _PLATFORM,
    "LaxControlFlowTest.test_issue_29329": _PLATFORM + " (with jax.linear_transpose of it)",
}
test_not_applicable = not_applicable_tests(NOT_APPLICABLE)
