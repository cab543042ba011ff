"""Front-end semantics: IEEE-exact simplification, -0.0, static arguments, the jit cache per
function, methods, comparisons, bool(), closures, dataclass fields, and the array functions
(`where`, `arange`, `clip`, `var`, `allclose`), each against NumPy or JAX."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import accy
from accy.frontend.tracing import static_key


def scalar(value, device="reference"):
    return accy.named(np.float32(value), (), device=device)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_times_zero_is_not_folded(value):
    got = accy.jit(lambda x: 1 + x * 0)(scalar(value)).item()
    assert math.isnan(got) and math.isnan(jax.jit(lambda x: 1 + x * 0)(jnp.float32(value)))


def test_negative_zero_is_kept_by_jit_on_cpu_and_eagerly():
    one = scalar(1.0, "cpu")
    assert accy.jit(lambda x: x / -0.0)(one).item() == -np.inf
    assert accy.jit(lambda x: (x / 0.0, x / -0.0))(one)[0].item() == np.inf
    assert (one / 0.0).item() == np.inf and (one / -0.0).item() == -np.inf  # eager cache
    zero = scalar(0.0)
    assert math.copysign(1, accy.jit(lambda x: 0.0 - x)(zero).item()) == 1.0  # not -(0.0)


def test_negative_zero_gradient_sign():
    g = accy.grad(lambda x: (x * -0.0 + x).exp())(scalar(0.0))
    assert g.item() == 1.0
    dx = accy.grad(lambda x: 1.0 / (x + -0.0))  # d/dx 1/x at -0.0 is -inf
    assert dx(scalar(-0.0)).item() == -np.inf


def test_static_arguments_key_by_type_and_sign():
    f = accy.jit(lambda x, n: x + 100.0 if isinstance(n, bool) else x * n, static_argnames="n")
    two = scalar(2.0)
    assert f(two, 1).item() == 2.0
    assert f(two, True).item() == 102.0
    assert f(two, 0.0).item() == 0.0
    assert math.copysign(1, f(two, -0.0).item()) == -1.0
    assert static_key(1) != static_key(1.0) and static_key(float("nan")) == static_key(np.nan)


def test_jit_of_the_same_function_shares_its_traces():
    def double(x):
        return x * 2.0

    first, second = accy.jit(double), accy.jit(double)
    first(scalar(1.0))
    second(scalar(3.0))
    assert first is second and first.traces == 1
    assert accy.jit(double, static_argnames=()) is first


def test_jit_on_a_method_binds_self():
    class Scaler:
        def __init__(self, w):
            self.w = w

        @accy.jit
        def apply(self, x):
            return x * self.w

    assert Scaler(3.0).apply(scalar(2.0)).item() == 6.0
    assert Scaler(5.0).apply(scalar(2.0)).item() == 10.0

    @dataclasses.dataclass
    class Layer:
        w: accy.NamedArray

        @accy.jit
        def apply(self, x):
            return x * self.w

    assert Layer(scalar(4.0)).apply(scalar(2.0)).item() == 8.0
    assert Layer(scalar(5.0)).apply(scalar(2.0)).item() == 10.0  # an input, not a constant
    assert Layer.apply.traces == 1


def test_grad_of_a_python_int_is_an_error():
    with pytest.raises(accy.TransformError, match=r"Python int 3.*pass 3\.0"):
        accy.grad(lambda x: x**2.0)(3)
    assert accy.grad(lambda x: x**2.0)(3.0).item() == 6.0


def test_comparisons_are_elementwise():
    x = accy.named(np.array([0.0, 1.0], np.float32), "n", device="reference")
    assert (x == 0).array.tolist() == [True, False]
    assert (x != 0).array.tolist() == [False, True]
    assert bool(scalar(0.0) == 0) and not bool(scalar(0.0) != 0)
    got = accy.jit(lambda x: (x == 1.0, x != 1.0, x < 1.0))(x)
    assert [g.array.tolist() for g in got] == [[False, True], [True, False], [True, False]]
    with pytest.raises(TypeError, match="unhashable"):
        hash(x)


def test_bool_of_a_traced_value_names_it_and_suggests_where():
    pattern = r"(?s)traced value bool\[\] .*accy\.where.*accy\.cond.*test_semantics"
    with pytest.raises(accy.AccyError, match=pattern):
        accy.jit(lambda x: x if x > 0 else -x)(scalar(1.0))
    x = accy.named(np.ones(2, np.float32), "n")
    with pytest.raises(accy.AxisError, match="ambiguous"):
        bool(x)


def test_python_bools_and_scalars_where_arrays_go():
    x = accy.named(np.array([1.0, -2.0], np.float32), "n", device="reference")
    assert accy.jit(lambda x: x.builder.select(True, x, x * 2.0))(x).array.tolist() == [1, -2]
    assert accy.where(False, x, 0.0).array.tolist() == [0.0, 0.0]
    assert accy.jit(lambda x: accy.where(x > 0, 1.0, x))(x).array.tolist() == [1.0, -2.0]
    with pytest.raises(accy.DTypeError, match="must be bool"):
        accy.where(x, x, x)


@pytest.mark.parametrize("size", [4, 100])
def test_closed_over_arrays_are_captured_when_traced(size):
    buffer = np.ones(size, np.float32)
    closed = accy.named(buffer, "n", device="reference")
    f = accy.jit(lambda x: (x * closed).sum())
    x = accy.named(np.ones(size, np.float32), "n", device="reference")
    before = f(x).item()
    buffer[:] = 2.0  # JAX's rule: a closed-over array is a constant of the trace
    assert before == f(x).item() == size


def test_dataclass_fields_not_in_init_survive_jit_and_grad():
    @dataclasses.dataclass
    class Params:
        w: accy.NamedArray
        scale: float = dataclasses.field(init=False, default=0.0)

    p = Params(accy.named(np.ones(2, np.float32), "n", device="reference"))
    p.scale = 5.0
    assert accy.jit(lambda p: p)(p).scale.item() == 5.0
    g = accy.grad(lambda p: (p.w * p.scale).sum())(p)
    assert g.w.array.tolist() == [5.0, 5.0] and g.scale.item() == 2.0


def test_array_functions_against_numpy():
    rng = np.random.default_rng(0)
    data = rng.normal(size=(3, 4)).astype(np.float32)
    x = accy.named(data, ("row", "col"), device="reference")
    np.testing.assert_allclose(accy.var(x, "col").array, data.var(1), rtol=1e-5)
    np.testing.assert_allclose(accy.var(x, ddof=1).item(), data.var(ddof=1), rtol=1e-5)
    np.testing.assert_array_equal(accy.clip(x, -0.5, 0.5).array, np.clip(data, -0.5, 0.5))
    np.testing.assert_array_equal(accy.clip(x, upper=0.0).array, np.minimum(data, 0.0))
    np.testing.assert_array_equal(accy.where(x > 0, x, -x).array, np.abs(data))
    assert accy.arange("t", 2, 11, 3).array.tolist() == np.arange(2, 11, 3).tolist()
    expected = np.asarray(jnp.arange(0.0, 1.0, 0.3))
    np.testing.assert_array_equal(accy.arange("t", 0.0, 1.0, 0.3).array, expected)
    assert accy.arange("t", 3).dtype == accy.i32
    a = np.array([1.0, np.inf, np.nan, 2.0], np.float32)
    b = np.array([1.0 + 1e-7, np.inf, np.nan, 2.1], np.float32)
    na, nb = (accy.named(v, "n", device="reference") for v in (a, b))
    for equal_nan in (False, True):
        expected = np.isclose(a, b, equal_nan=equal_nan)
        assert accy.isclose(na, nb, equal_nan=equal_nan).array.tolist() == expected.tolist()
    assert bool(accy.allclose(na["n", :2], nb["n", :2])) == np.allclose(a[:2], b[:2])
    assert not bool(accy.allclose(na, nb))
    traced = accy.jit(lambda x: (accy.var(x, "row"), accy.allclose(x, x)))(x)
    np.testing.assert_allclose(traced[0].array, data.var(0), rtol=1e-5)
    assert bool(traced[1])


def test_array_function_misuse():
    x = accy.named(np.ones(3, np.float32), "n")
    with pytest.raises(accy.AxisError, match="names the new axis"):
        accy.arange(3)
    with pytest.raises(accy.AccyError, match="step must not be 0"):
        accy.arange("n", 0, 3, 0)
    with pytest.raises(accy.AxisError, match="'row' is not on"):
        accy.var(x, "row")
    with pytest.raises(accy.AccyError, match="no degrees of freedom"):
        accy.var(x, ddof=3)
    with pytest.raises(accy.AccyError, match="lower bound, an upper bound"):
        accy.clip(x)


def test_shard_of_a_function_closing_over_a_small_array_with_a_mapped_axis():
    mesh = accy.Mesh(range(2), "data")
    w = accy.named(np.arange(32, dtype=np.float32), "dim3", device="reference")  # a constant
    scaled = accy.shard(lambda x: x * w, mesh, {"dim3": "data"}, device="reference")
    got = scaled(accy.named(np.full(32, 2.0, np.float32), "dim3", device="reference"))
    np.testing.assert_array_equal(got.array, 2.0 * np.arange(32))
