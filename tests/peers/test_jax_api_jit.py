"""JAX's tests/api_test.py, classes JitTest and BufferDonationTest, case by case on `accy.jit`:
its caching and retracing rules, static arguments (named: `static_argnames`), donation,
wrapping (names, reprs, attributes, methods), bad inputs, devices and `lower`/`compile`. JAX's
own results are computed in the same run. Most cases run on the "reference" device (the NumPy
evaluator), so that they compile nothing; donation needs the CPU backend."""

import concurrent.futures
import copy
import enum
import functools
import gc
import operator
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import accy
from tests.peers.ledger import not_applicable_tests, translates

R = "reference"


def scalar(value, device=R):
    return accy.named(np.float32(value), (), device=device)


def vec(values, axes=("i",), device=R, dtype=np.float32):
    return accy.named(np.asarray(values, dtype), axes, device=device)


def my_function():
    return


@translates("JitTest.test_jit_repr")
def test_jit_repr():
    jitted = accy.jit(my_function)
    assert repr(jitted) == f"<accy.jit of {my_function!r}>"
    assert repr(jax.jit(my_function)) == f"<PjitFunction of {my_function!r}>"


@translates("JitTest.test_fun_name")
def test_fun_name():
    named_partial = functools.partial(my_function)
    named_partial.__name__ = "my_partial"
    cases = [
        (my_function, "my_function"),
        (functools.partial(my_function), "my_function"),
        (functools.partial(functools.partial(my_function)), "my_function"),
        (named_partial, "my_partial"),
        (lambda: my_function(), "<lambda>"),
    ]
    for fn, name in cases:
        assert accy.jit(fn).__name__ == name
        assert jax.jit(fn).__getstate__()["function_name"] == name


@translates("JitTest.test_jit_repr_errors")
def test_jit_repr_errors():
    class Callable:
        def __call__(self):
            pass

        def __repr__(self):
            raise ValueError("invalid repr")

    jitted = accy.jit(Callable())
    assert repr(jitted) == "<accy.jit>"  # the function's repr failed
    del jitted.__wrapped__
    assert repr(jitted) == "<accy.jit>"
    assert repr(jax.jit(Callable())) == "<PjitFunction>"


@translates("JitTest.test_jit_of_generator")
def test_jit_of_generator():
    def gen(x):
        yield x

    with pytest.raises(accy.AccyError, match="generator function 'gen'"):
        accy.jit(gen)
    with pytest.raises(TypeError, match="Expected a function, got a generator function"):
        jax.jit(gen)


@translates("JitTest.test_jit_device", "JitTest.test_explicit_backend")
@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_jit_device(device):
    x = accy.jit(lambda x: x + 1.0, device=device)(3.0)
    assert x.device is accy.device(device)
    assert x.item() == jax.jit(lambda x: x + 1.0)(3.0) == 4.0


@translates("JitTest.test_device_to_device_copy_between_backends")
def test_device_to_device_copy_between_backends():
    f = lambda x: x + 1  # noqa: E731
    on_reference = accy.jit(f, device=R)
    on_cpu = accy.jit(f, device="cpu")
    data = np.arange(30, dtype=np.int32).reshape(1, 10, 3)
    x = accy.named(data, ("a", "b", "c"), device=R)
    result = on_reference(x)
    result_cpu = on_cpu(result)  # device= moves its inputs
    result_2 = on_reference(result_cpu)
    result_cpu_2 = on_cpu(result_2)
    assert result_cpu.device is accy.device("cpu") and result_2.device is accy.device(R)
    np.testing.assert_array_equal(result_2.array, data + 3)
    np.testing.assert_array_equal(result_cpu_2.array, np.asarray(jax.jit(f)(data + 3)))


@translates("JitTest.test_jit_argnums_overflow_error")
def test_jit_argnums_overflow_error():
    # accy names its static arguments; its donate_argnums are checked against the call.
    def f(a, b, c):
        return a

    x = vec([1.0])
    with pytest.raises(accy.AccyError, match="donate_argnums=.*3.*3 positional arguments"):
        accy.jit(f, donate_argnums=(0, 1, 3), device=R)(x, x, x)
    with pytest.raises(accy.AccyError, match="donate_argnums"):
        accy.jit(f, donate_argnums=(0, 1, -4), device=R)(x, x, x)
    with pytest.raises(ValueError):
        jax.jit(f, donate_argnums=(0, 1, 3))


@translates("JitTest.test_jit_argnames_validation")
def test_jit_argnames_validation():
    def f(a, b, c):
        return a

    def g(a, b, **kwargs):
        return a

    def h(a, /, b, c, *args, **kwargs):
        return a

    accy.jit(f, static_argnames=("b", "c"))
    with pytest.raises(accy.StaticArgumentError, match="no parameter 'not_defined'"):
        accy.jit(f, static_argnames=("b", "c", "not_defined"))
    accy.jit(g, static_argnames=("a", "b", "not_defined"))  # **kwargs may take it
    accy.jit(h, static_argnames=("b", "c"))
    accy.jit(h, static_argnames=("b", "c", "not_defined"))
    for bad in [("a", "c"), ("args", "c")]:  # positional-only, var-positional
        with pytest.raises(accy.StaticArgumentError, match="positional-only or \\*args"):
            accy.jit(h, static_argnames=bad)
        with pytest.raises(ValueError):
            jax.jit(h, static_argnames=bad)


@pytest.mark.slow
@translates("JitTest.test_jit_with_many_args_works")
def test_jit_with_many_args_works():
    f = accy.jit(lambda args_list: sum(args_list), device=R)
    assert f(list(range(500))).item() == sum(range(500)) == jax.jit(sum)(list(range(500)))


# -- donation (the CPU backend: an output takes a donated argument's memory) ---------------------


@translates("JitTest.test_jit_donate_invalidates_input")
def test_jit_donate_invalidates_input():
    move = accy.jit(lambda x: x + x - x, donate_argnums=0)
    x = accy.named(np.ones(4, np.float32), ("n",))
    y = move(x)
    # JAX deletes x; accy writes the output into x's memory and returns it there.
    assert np.shares_memory(y.array, x.array)
    np.testing.assert_array_equal(y.array, np.ones(4))


@translates("JitTest.test_jit_donate_static_argnums")
def test_jit_donate_static_argnums():
    jit_fun = accy.jit(
        lambda a, b, c, d: ((a + b + c), (a + b + d)),
        static_argnames=("a", "b"),
        donate_argnums=(0, 1),
    )  # donate_argnums count the non-static arguments: c and d
    c = accy.named(np.array([2.0, 2.0], np.float32), ("n",))
    d = accy.named(np.array([1.0, 1.0, 1.0, 1.0], np.float32), ("m",))
    e, f = jit_fun(1.0, 2.0, c, d)
    np.testing.assert_allclose(e.array, [5.0, 5.0])
    np.testing.assert_allclose(f.array, [4.0, 4.0, 4.0, 4.0])
    assert np.shares_memory(e.array, c.array) and np.shares_memory(f.array, d.array)
    expected = jax.jit(lambda a, b, c, d: (a + b + c, a + b + d), static_argnums=(0, 1))(
        1.0, 2.0, jnp.array([2.0, 2.0]), jnp.ones(4)
    )
    np.testing.assert_allclose(e.array, expected[0])


def cpu(values, axis="n"):
    return accy.named(np.asarray(values, np.float32), (axis,))


@translates("JitTest.test_jit_donate_argnames_kwargs_static_argnums")
def test_jit_donate_argnames_kwargs_static_argnums():
    jit_fun = accy.jit(
        lambda a, b, c, d, e: ((a + b + c), (a + b + d), (a + b + e)),
        static_argnames=("a", "b"),
        donate_argnames=("d", "e"),
    )
    c, d, e = cpu([2.0, 2.0], "m"), cpu([1.0] * 4), cpu([3.0] * 4)
    f, g, h = jit_fun(1.0, 2.0, c, d=d, e=e)
    np.testing.assert_allclose(f.array, [5.0, 5.0])
    np.testing.assert_allclose(g.array, [4.0] * 4)
    np.testing.assert_allclose(h.array, [6.0] * 4)
    assert not np.shares_memory(f.array, c.array)  # c is not donated
    assert np.shares_memory(g.array, d.array) and np.shares_memory(h.array, e.array)


@translates(
    "JitTest.test_specify_donate_argnums_and_argnames", "JitTest.test_donate_argnames_with_args"
)
def test_specify_donate_argnums_and_argnames():
    @functools.partial(accy.jit, donate_argnums=0, donate_argnames=("inp2", "inp3"))
    def f(inp1, inp2, inp3):
        return inp1 * 2.0, inp2 * 2.0, inp3 * 2.0

    x, y, z = cpu([4.0] * 5), cpu([2.0] * 5), cpu([1.0] * 5)
    outs = f(x, inp2=y, inp3=z)
    for out, donated, value in zip(outs, (x, y, z), (8.0, 4.0, 2.0), strict=True):
        assert np.shares_memory(out.array, donated.array)
        np.testing.assert_allclose(out.array, value)
    g = accy.jit(lambda inp1: inp1 * 2.0, donate_argnames="inp1")
    w = cpu([4.0] * 5)
    assert np.shares_memory(g(w).array, w.array)  # named, passed by position


@translates("JitTest.test_donate_argnums_with_kwargs")
def test_donate_argnums_with_kwargs():
    f = accy.jit(lambda inp1: inp1 * 2.0, donate_argnums=0)
    x = cpu([4.0] * 5)
    out = f(inp1=x)  # donated by position, passed by keyword
    assert np.shares_memory(out.array, x.array)
    np.testing.assert_allclose(out.array, 8.0)


def test_donate_argnames_must_name_keyword_parameters():
    def h(a, /, b):
        return b

    for name in ("a", "nope"):
        with pytest.raises(accy.AccyError, match=f"names {name!r}, which 'h' cannot take"):
            accy.jit(h, donate_argnames=name)


@translates("JitTest.test_intersecting_static_and_donate_argnames")
def test_intersecting_static_and_donate_argnames():
    with pytest.raises(accy.AccyError, match="both static_argnames and donate_argnames"):
        accy.jit(lambda x: x, static_argnames="x", donate_argnames="x")
    with pytest.raises(ValueError, match="static_argnames and donate_argnames cannot intersect"):
        jax.jit(lambda x: x, static_argnames="x", donate_argnames="x")


@translates("JitTest.test_donate_argnames_signature_fail")
def test_donate_argnames_signature_fail():
    class NoSignature:
        @property
        def __signature__(self):
            raise TypeError("no signature")

        def __call__(self, *args, **kwargs):
            return None

    with pytest.raises(accy.AccyError, match="pass donate_argnums instead"):
        accy.jit(NoSignature(), donate_argnames="a")
    with pytest.raises(ValueError, match="Pass donate_argnums instead of donate_argnames"):
        jax.jit(NoSignature(), donate_argnames="a")(np.arange(4), np.arange(4))


@translates("JitTest.test_double_donation")
def test_double_donation():
    f = accy.jit(lambda x, y: x + y, donate_argnums=(0,))
    x = accy.named(np.zeros(10, np.float32), ("n",))
    with pytest.raises(accy.DonationError, match="also input 1's"):
        f(x, x)


@translates("JitTest.test_jnp_array_copy")
def test_jnp_array_copy():
    f = accy.jit(lambda array: array + 77.0, donate_argnums=(0,))
    x = accy.named(np.array([0.0, 1.0], np.float32), ("n",))
    x_copy = accy.named(x.array.copy(), ("n",))
    f(x)  # donation overwrites x
    np.testing.assert_array_equal(x_copy.array, [0.0, 1.0])  # the copy is its own memory


@translates("JitTest.test_jit_nested_donate_ignored")
def test_jit_nested_donate_ignored():
    jit_fun = accy.jit(lambda x: accy.jit(lambda y: y**2, donate_argnums=0)(x), device=R)
    assert jit_fun(vec([3.0])).array.tolist() == [9.0]  # the inner donation is ignored


# -- caching -------------------------------------------------------------------------------------


@translates("JitTest.test_jit_global_cache")
def test_jit_global_cache():
    executing = [True]

    def f(x):
        assert executing[0]
        return x

    accy.jit(f, device=R)(2.0)
    executing[0] = False
    assert accy.jit(f, device=R)(3.0).item() == 3.0  # the same jitted function: no retrace


@translates("JitTest.test_jit_cache_clear")
def test_jit_cache_clear():
    traced = []

    @accy.jit
    def f(x, y):
        traced.append(None)
        return x + y

    f(scalar(1.0), scalar(2.0))
    f(scalar(1.0), scalar(2.0))
    assert len(traced) == 1
    accy.clear_caches()  # JAX's f.clear_cache(): the traces and compiled programs go
    assert f(scalar(1.0), scalar(2.0)).item() == 3.0
    assert len(traced) == 2  # traced again


@translates("JitTest.test_cache_key_defaults")
def test_cache_key_defaults():
    f = accy.jit(lambda x: (x**2).sum())
    assert f.traces == 0
    x = vec(np.arange(5.0))
    for _ in range(3):
        f(x)
    assert f.traces == 1
    g = jax.jit(lambda x: (x**2).sum())
    for _ in range(3):
        g(jnp.arange(5.0))
    assert g._cache_size() == 1


@translates("JitTest.test_jit_shallow_copy", "JitTest.test_jit_deep_copy")
@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy])
def test_jit_copy(copier):
    out = accy.jit(lambda x: copier(x) * 2.0)(scalar(1.0))
    assert isinstance(out, accy.NamedArray) and out.item() == 2.0
    assert jax.jit(lambda x: copier(x) * 2.0)(1.0) == 2.0


@translates("JitTest.test_static_argnum_on_method")
def test_static_argnum_on_method():
    class A:
        @accy.jit
        def my_func_jit(self, x):
            return x + 2

    assert A().my_func_jit(scalar(3.0)).item() == 5.0


@translates("JitTest.test_static_argnum_on_static_method_is_not_supported")
def test_static_argnum_on_static_method_is_not_supported():
    with pytest.raises(accy.AccyError, match="needs a function"):

        class A:
            @accy.jit
            @classmethod
            def my_classmethod_jit(cls, x):
                return x + 2


@translates("JitTest.test_staticmethod_is_not_supported")
def test_staticmethod_is_not_supported():
    with pytest.raises(accy.AccyError, match="staticmethod is not supported"):

        class A:
            @accy.jit
            @staticmethod
            def my_staticmethod_jit(x):
                return x + 2

    with pytest.raises(TypeError, match="staticmethod arguments are not supported"):
        jax.jit(staticmethod(lambda x: x))


@translates("JitTest.test_concurrent_jit")
def test_concurrent_jit():
    f = accy.jit(lambda x: x + x - 3.0)
    rng = np.random.default_rng(0)
    xs = [vec(rng.standard_normal(i + 1)) for i in range(6)]
    with concurrent.futures.ThreadPoolExecutor(4) as executor:
        ys = list(executor.map(f, xs))
    for x, y in zip(xs, ys, strict=True):
        np.testing.assert_allclose(y.array, np.asarray(jax.jit(lambda x: x + x - 3.0)(x.array)))


@translates("JitTest.test_jit_bad_input")
def test_jit_bad_input():
    f = accy.jit(lambda x: x)
    with pytest.raises(accy.NonArrayLeaf, match="args\\[0\\] is str 'foo'"):
        f("foo")
    with pytest.raises(accy.NonArrayLeaf, match="args\\[0\\] is type"):
        f(np.int32)
    with pytest.raises(TypeError, match="at path x"):
        jax.jit(lambda x: x)("foo")


@translates("JitTest.test_jit_masked_array")
def test_jit_masked_array():
    x = np.ma.array([1, 2, 3], mask=[True, False, True])
    with pytest.raises(accy.AccyError, match="masked arrays are not supported"):
        accy.jit(lambda x: x)(accy.named(x, ("n",)))
    with pytest.raises(ValueError, match="numpy masked arrays are not supported"):
        jax.jit(lambda x: x)(x)


@translates("JitTest.test_jit_on_all_devices")
def test_jit_on_all_devices():
    data = np.random.default_rng(0).random(16).astype(np.float32)
    f = accy.jit(lambda x: -x)
    for device in accy.devices():
        if device.is_cuda:  # a GPU run belongs to the GPU suite
            continue
        out = f(accy.named(data, ("n",), device=device))
        assert out.device is device
        np.testing.assert_array_equal(out.array, np.asarray(jax.jit(jnp.negative)(data)))


@translates("JitTest.test_jit_reference_dropping")
def test_jit_reference_dropping():
    x = vec(np.ones(10))
    f = (lambda x: lambda: x)(x)  # a reference to x in f's closure
    g = accy.jit(f)
    x = weakref.ref(x)
    assert x() is not None
    f()
    g()
    g()
    del f
    assert x() is not None  # g keeps f, and so x, alive
    g()
    del g
    gc.collect()
    assert x() is None  # no jitted function holds x any more


@translates("JitTest.test_jit_of_nonweakreferenceable_function")
def test_jit_of_nonweakreferenceable_function():
    class CallableWithSlots:
        __slots__ = []

        def __call__(self, x):
            return x + 1

    c = CallableWithSlots()
    with pytest.raises(TypeError, match="cannot create weak reference"):
        weakref.ref(c)
    # JAX's call fails (its cache needs a weak reference); accy's jit runs it, unmemoized.
    assert accy.jit(c, device=R)(3).item() == 4
    with pytest.raises(TypeError, match="cannot create weak reference"):
        jax.jit(c)(3)


@translates("JitTest.test_jit_raises_on_first_invocation_on_non_hashable_static_argnum")
def test_jit_raises_on_first_invocation_on_non_hashable_static_argnum():
    jitted = accy.jit(lambda x, y: x + 3, static_argnames="y", device=R)
    with pytest.raises(accy.StaticArgumentError, match="unhashable"):
        jitted(1, np.asarray(1))
    with pytest.raises(ValueError, match="Non-hashable static arguments"):
        jax.jit(lambda x, y: x + 3, static_argnums=(1,))(1, np.asarray(1))


@translates("JitTest.test_cpp_jit_raises_on_non_hashable_static_argnum")
def test_cpp_jit_raises_on_non_hashable_static_argnum():
    jitted = accy.jit(lambda x, y: x + 3, static_argnames="y", device=R)
    jitted(1, 1)
    with pytest.raises(accy.StaticArgumentError, match="unhashable"):
        jitted(1, np.asarray(1))

    class HashableWithoutEq:
        def __hash__(self):
            return 1

        def __eq__(self, other):
            raise NotImplementedError("A Python error is as is, without stack trace")

    with pytest.raises(accy.StaticArgumentError, match="raised NotImplementedError"):
        jitted(1, HashableWithoutEq())  # the first call finds no key to compare with
        jitted(1, HashableWithoutEq())
    with pytest.raises(ValueError, match="comparable using __eq__"):
        f = jax.jit(lambda x, y: x + 3, static_argnums=(1,))
        f(1, HashableWithoutEq())
        f(1, HashableWithoutEq())


@translates("JitTest.test_cpp_jit_raises_other_exceptions_when_hashing_fails")
def test_cpp_jit_raises_other_exceptions_when_hashing_fails():
    class A:
        def __hash__(self):
            raise ValueError

    f = accy.jit(lambda x: x + 1, static_argnames="x", device=R)
    with pytest.raises(accy.StaticArgumentError, match="__hash__ raised ValueError") as error:
        f(A())
    assert isinstance(error.value.__cause__, ValueError)  # the user's exception, kept
    with pytest.raises(ValueError, match="^$"):
        jax.jit(lambda x: x + 1, static_argnums=(0,))(A())


@translates("JitTest.test_cpp_jitted_function_returns_PyBuffer")
def test_cpp_jitted_function_returns_pybuffer():
    jitted = accy.jit(lambda a: a + 1, device=R)
    jitted(1)
    assert isinstance(jitted(2), accy.NamedArray)


@translates("JitTest.test_mismatched_nested_backends")
def test_mismatched_nested_backends():
    # JAX refuses a cpu jit inside a gpu one; accy inlines a nested jit into the enclosing trace,
    # which runs where the outer function does.
    f = accy.jit(lambda x: accy.jit(lambda x: x + 1.0, device=R)(x), device="cpu")
    out = f(1.0)
    assert out.device is accy.device("cpu") and out.item() == 2.0


@translates("JitTest.test_omnistaging")
def test_omnistaging():
    keys = [accy.random.key(0)]

    def init():
        key, subkey = accy.random.split(keys[0])
        keys[0] = key
        return accy.random.normal(subkey, {})

    eager = init()
    keys[0] = accy.random.key(0)
    traced = accy.jit(init)()
    # JAX leaves a tracer in keys[0]; accy runs work on closed-over arrays alone eagerly while
    # tracing, so the key stays a concrete array and the draw is the eager one.
    assert isinstance(keys[0], accy.NamedArray)
    assert traced.item() == eager.item()


@translates("JitTest.test_jit_wrapped_attributes")
def test_jit_wrapped_attributes():
    def f(x: int) -> int:
        """docstring of f."""
        return x + 1

    f.some_value = 4
    for jf in (accy.jit(f), jax.jit(f)):
        for attr in ["doc", "name", "module", "qualname", "annotations"]:
            assert getattr(jf, f"__{attr}__") == getattr(f, f"__{attr}__")
        assert jf.some_value == 4


@translates("JitTest.test_jit_python_builtin")
def test_jit_python_builtin():
    x = vec([1, 2], dtype=np.int32)
    actual = accy.jit(operator.add)(x, 1)
    expected = jax.jit(operator.add, static_argnums=(1,))(jnp.array([1, 2]), 1)
    np.testing.assert_array_equal(actual.array, np.asarray(expected))


@translates("JitTest.test_jit_with_static_argnames")
def test_jit_with_static_argnames():
    def f(x):
        assert x == "foo"
        return 1

    f_names = accy.jit(f, static_argnames="x", device=R)
    assert f_names("foo").item() == 1 and f_names(x="foo").item() == 1
    assert jax.jit(f, static_argnums=0)("foo") == 1


@translates("JitTest.test_new_static_argnum_on_keyword_arguments")
def test_new_static_argnum_on_keyword_arguments():
    f = accy.jit(lambda x: x, static_argnames="x", device=R)
    assert f(x=4).item() == 4 == jax.jit(lambda x: x, static_argnums=0)(x=4)


@translates("JitTest.test_new_static_argnum_with_default_arguments")
def test_new_static_argnum_with_default_arguments():
    f = accy.jit(lambda x=4: x, static_argnames="x", device=R)
    assert f().item() == 4 == jax.jit(lambda x=4: x, static_argnums=0)()


@translates("JitTest.test_jit_with_mismatched_static_argnames")
def test_jit_with_mismatched_static_argnames():
    seen = {}

    def f(x, y):
        seen["x"], seen["y"] = isinstance(x, accy.core.Value), isinstance(y, accy.core.Value)
        return 1

    f_names = accy.jit(f, static_argnames="y", device=R)
    f_names(2, 3)
    assert seen == {"x": True, "y": False}  # y is static, passed by position
    f_names(1, y="foo")
    assert seen == {"x": True, "y": False}
    assert jax.jit(f, static_argnums=(), static_argnames="y")(1, y="foo") == 1


@translates("JitTest.test_jit_with_pruned_args")
@pytest.mark.parametrize("num_args", [2, 3, 4])
def test_jit_with_pruned_args(num_args):
    def f(*args):
        return args[1] + np.array(2)

    assert accy.jit(f, device=R)(*range(num_args)).item() == 3
    assert jax.jit(f)(*range(num_args)) == 3


@translates("JitTest.testBuffersAreFreedPromptly")
def test_buffers_are_freed_promptly():
    f = accy.jit(lambda x: x + 1.0)
    refs = []
    x = vec(np.ones(100))
    for _ in range(50):
        x = f(x)
        refs.append(weakref.ref(x))
        x = vec(np.asarray(x.array))
    assert len([ref for ref in refs if ref() is not None]) <= 2


# -- lower and compile -----------------------------------------------------------------------------


@translates("JitTest.test_jit_lower_duck_typing")
def test_jit_lower_duck_typing():
    lowered = accy.jit(lambda x: 2 * x, device=R).lower(accy.spec(accy.f32))  # no data
    compiled = lowered.compile()
    np.testing.assert_allclose(compiled(np.float32(1.0))[0], 2.0)
    jax_exe = jax.jit(lambda x: 2 * x).lower(jax.ShapeDtypeStruct((), "float32")).compile()
    assert float(jax_exe(jnp.float32(1.0))) == 2.0


@translates(
    "JitTest.test_jit_lower_compile_in_tree_mismatch",
    "JitTest.test_jit_lower_compile_trivial_in_tree_mismatch",
)
@pytest.mark.parametrize("trivial", [False, True])
def test_jit_lower_compile_in_tree_mismatch(trivial):
    f = (lambda x: x) if trivial else (lambda x: (x**2).sqrt() + 1.0)
    compiled = accy.jit(f, device=R).lower(1.0).compile()
    with pytest.raises(accy.AccyError, match="shape \\(1,\\) was given for f32\\[\\]"):
        compiled([1.0])


@translates("JitTest.test_jit_lower_compile_trivial")
def test_jit_lower_compile_trivial():
    out = accy.jit(lambda x: x, device=R).lower(1.0).compile()(np.float32(4.0))
    np.testing.assert_allclose(out[0], 4.0)
    assert jax.jit(lambda x: x).lower(1.0).compile()(4.0) == 4.0


@translates("JitTest.test_jit_lower_compile_arg_type_mismatch")
def test_jit_lower_compile_arg_type_mismatch():
    compiled = accy.jit(lambda x: (x**2).sqrt() + 1.0, device=R).lower(np.float32(1)).compile()
    with pytest.raises(accy.AccyError, match="argument 0: an array of dtype int32.*float32"):
        compiled(np.int32(1))


@translates(
    "JitTest.test_jit_lower_compile_multi_arg", "JitTest.test_jit_lower_compile_trivial_multi_arg"
)
@pytest.mark.parametrize("trivial", [False, True])
def test_jit_lower_compile_multi_arg(trivial):
    def f(*args):
        x, *_ = args
        return x if trivial else (x**2).sqrt() + 1.0

    compiled = accy.jit(f, device=R).lower(1.0, 1.0).compile()
    np.testing.assert_allclose(
        compiled(np.float32(1.0), np.float32(1.0))[0], 1.0 if trivial else 2.0
    )

    def jax_f(*args):
        x, *_ = args
        return x if trivial else jnp.sqrt(x**2) + 1.0

    assert float(jax.jit(jax_f).lower(1.0, 1.0).compile()(1.0, 1.0)) == (1.0 if trivial else 2.0)


@translates("JitTest.test_jit_lower_compile_vmap")
def test_jit_lower_compile_vmap():
    compiled = accy.jit(lambda x: x + 4.0, device=R).lower(1.0).compile()
    with pytest.raises(accy.AccyError, match="traced value"):
        accy.vmap(lambda x: compiled(x)[0] + 2.0, "i")(vec(np.ones(3)))


@translates(
    "JitTest.test_jit_lower_compiler_ir",
    "JitTest.test_jit_lower_trivial_compiler_ir",
    "JitTest.test_jit_lower_compile_as_text",
)
@pytest.mark.parametrize("trivial", [False, True])
def test_jit_lower_compiler_ir(trivial):
    lowered = accy.jit(lambda x: x if trivial else x + 4.0).lower(scalar(1.0, "cpu"))
    source = lowered.source()  # the generated C translation unit: accy's compiler IR
    assert isinstance(source, str) and "accy_run" in source
    assert isinstance(lowered.as_text(), str) and lowered.as_text().startswith("program")
    assert jax.jit(lambda x: x + 4.0).lower(1.0).compiler_ir() is not None


@translates(
    "JitTest.test_jit_lower_compile_compiler_ir",
    "JitTest.test_jit_lower_trivial_compile_compiler_ir",
    "JitTest.test_jit_lower_compile_executable",
)
@pytest.mark.parametrize("trivial", [False, True])
def test_jit_lower_compile_executable(trivial):
    compiled = accy.jit(lambda x: x if trivial else x + 4.0, device=R).lower(1.0).compile()
    assert compiled is not None
    np.testing.assert_allclose(compiled(np.float32(1.0))[0], 1.0 if trivial else 5.0)


@translates("JitTest.test_jit_lower_no_pruning")
def test_jit_lower_no_pruning():
    # accy keeps every argument as an input (JAX's keep_unused=True), used or not.
    for f in (lambda x, y: x + y, lambda x, y: x):
        lowered = accy.jit(f, device=R).lower(1.0, 2.0)
        assert len(lowered.program.parameters) == 2
        np.testing.assert_allclose(lowered.compile()(np.float32(1.0), np.float32(2.0))[0], f(1, 2))
    compiled = jax.jit(lambda x, y: x, keep_unused=True).lower(1.0, 2.0).compile()
    assert len(compiled._executable.in_avals) == 2


@translates("JitTest.test_jit_enum_as_dict_keys_fails")
def test_jit_enum_as_dict_keys_fails():
    class E(enum.Enum):
        A = 0
        B = 1

    # JAX cannot sort enum keys; accy's trees keep dicts in insertion order, so this works.
    f = accy.jit(lambda d: d[E.A], device=R)
    assert f({E.A: 1.0, E.B: 2.0}).item() == 1.0
    with pytest.raises((TypeError, ValueError)):
        jax.jit(lambda d: d[E.A])({E.A: 1.0, E.B: 2.0})


@translates("JitTest.test_caches_dont_depend_on_unnamed_axis_env")
def test_caches_dont_depend_on_unnamed_axis_env():
    one = scalar(1.0)
    f = accy.jit(lambda: one.sin())
    expected = f()
    ans = accy.vmap(f, "i", size=2, out_axes=None)()
    assert f.traces == 1  # the same trace under vmap
    np.testing.assert_allclose(ans.array, expected.array)


@translates("JitTest.test_sum_of_closed_over_bools")
def test_sum_of_closed_over_bools():
    mask = accy.named(np.ones(32, bool), ("n",), device=R)
    # accy never promotes dtypes: a sum of bools is an error, and counting converts first.
    with pytest.raises(accy.DTypeError, match="bool"):
        mask.sum()
    expected = jnp.sum(jnp.ones(32, jnp.bool_))
    assert mask.convert(accy.i32).sum().item() == expected == 32
    assert accy.jit(lambda m: m.convert(accy.i32).sum())(mask).item() == 32
    assert accy.jit(lambda: mask.convert(accy.i32).sum())().item() == 32


@translates("JitTest.test_disable_jit")
def test_disable_jit():
    def run_twice(jit, disable_jit):
        effects = []

        @jit
        def f(x):
            effects.append(1)
            return x

        with disable_jit():
            f(2)
            f(2)
        inside = len(effects)
        f(2)
        f(2)
        return inside, len(effects)

    assert run_twice(accy.jit, accy.disable_jit) == run_twice(jax.jit, jax.disable_jit) == (2, 3)


def test_disable_jit_runs_python_on_values_and_nests():
    @accy.jit
    def positive_part(x, scale):
        total = x.sum()
        print("total", total.item())  # a concrete value: only when run eagerly
        return total * scale if total.item() > 0 else total * 0.0

    @functools.partial(accy.jit, static_argnames="n")
    def outer(x, n):
        return positive_part(x, float(n))

    x = vec([1.0, 2.0])
    with accy.disable_jit():
        assert outer(x, n=3).item() == 9.0
        assert outer(-x, n=3).item() == 0.0
        # jit again inside: the branch on a traced value fails
        with accy.disable_jit(False), pytest.raises(accy.AccyError):
            outer(x, n=3)
        assert positive_part(x, 2.0).item() == 6.0
    assert positive_part.traces == 1  # the one try under disable_jit(False), inside outer's
    with pytest.raises(accy.AccyError):  # outside the block it is traced again
        positive_part(x, 2.0)


@translates("JitTest.test_jit_default_device")
def test_jit_default_device():
    system_default, test_device = accy.device("cpu"), accy.device("reference")
    f = accy.jit(lambda x: x + 1)
    assert f(1).device is system_default
    with accy.default_device(test_device):
        assert f(1).device is test_device
        assert accy.jit(lambda: vec([1.0], device=None) * 2.0)().device is test_device
    assert f(1).device is system_default
    with accy.default_device(test_device):
        # jit's device= wins over the default device
        assert accy.jit(f, device=system_default)(1).device is system_default
        # so does the device of an argument
        sticky = scalar(1.0, device=system_default)
        assert f(sticky).device is system_default
        with accy.default_device(system_default):  # blocks nest
            assert f(1).device is system_default
        assert f(1).device is test_device
    assert f(1).device is system_default
    assert f(1).item() == jax.jit(lambda x: x + 1)(1) == 2


@translates("JitTest.test_jit_default_platform")
def test_jit_default_platform():
    with accy.default_device("cpu"):  # a platform's name
        result = accy.jit(lambda x: x + 1)(1)
    assert result.device is accy.device("cpu") is accy.devices()[0]
    with jax.default_device(jax.devices("cpu")[0]):
        assert jax.jit(lambda x: x + 1)(1).device.platform == "cpu"
    with accy.default_device("reference"):
        assert accy.jit(lambda x: x + 1)(1).device is accy.device("reference")


def test_default_device_rejects_what_is_not_a_device():
    with pytest.raises(accy.AccyError, match="takes a device .* not int 3"):
        accy.default_device(3)
    with pytest.raises(accy.AccyError, match="unknown device 'tpu'"):
        accy.default_device("tpu")
    with accy.config.override(default_device="tpu"), pytest.raises(accy.AccyError, match="tpu"):
        accy.named(np.ones(1), "i")  # as ACCY_DEFAULT_DEVICE=tpu would
    assert accy.named(np.ones(1), "i").device is accy.device("cpu")


@translates("JitTest.test_no_tracing")
def test_no_tracing():
    def case(jit, no_tracing, x, y):
        f = jit(lambda x: x)
        f(x)  # no error
        with no_tracing():
            f(x)  # traced before: runs
            with pytest.raises(Exception, match="no_tracing") as raised:
                f(y)  # a new signature
        return raised.value

    error = case(accy.jit, accy.no_tracing, vec([0.0, 1.0, 2.0]), vec([0.0, 1.0, 2.0, 3.0]))
    assert isinstance(error, accy.TransformError)
    assert isinstance(case(jax.jit, jax.no_tracing, jnp.arange(3), jnp.arange(4)), RuntimeError)


@translates("JitTest.test_no_execution")
def test_no_execution():
    def case(jit, no_execution, ones):
        f = jit(lambda: ones(3))
        f()  # no error
        with no_execution(), pytest.raises(Exception, match="no_execution") as raised:
            f()
        return raised.value, f()

    error, after = case(accy.jit, accy.no_execution, lambda n: accy.named(np.ones(n), "n"))
    assert isinstance(error, accy.TransformError)
    error_jax, after_jax = case(jax.jit, jax.no_execution, jnp.ones)
    assert isinstance(error_jax, RuntimeError)
    np.testing.assert_array_equal(after.array, after_jax)


def test_no_execution_still_traces_and_inlines():
    inner = accy.jit(lambda x: x * 2.0)
    outer = accy.grad(lambda x: inner(x).sum())
    x = vec([1.0, 2.0])
    with accy.no_execution():
        program = accy.make_program(lambda x: inner(x) + 1.0)(x)  # traced, inlined: no run
        with pytest.raises(accy.TransformError, match="no_execution"):
            outer(x)
    assert program.count("mul") == 1
    assert outer(x).array.tolist() == [2.0, 2.0]


COMPILER_OPTIONS = "XLA compiler options (compiler_options=...): accy's compilers take none"
TOKENS = "JAX's ordered-effect tokens: accy has no tokens"
ARGS_INFO = "accy lacks Lowered.args_info (which inputs are donated)"

NOT_APPLICABLE = {
    "JitTest.test_complex_support": "complex dtypes: accy has none",
    "JitTest.test_jit_donate_warning_raised": (
        "accy lacks a warning for a donated array that no output can take"
    ),
    "JitTest.test_device_put_aliasing": "jax.device_put(may_alias=, donate=): accy lacks it",
    "JitTest.test_device_put_aliasing_with_diff_compatible_sharding": (
        "sharding objects and device_put: accy has neither"
    ),
    "JitTest.test_jit_donate_weak_type": "weak types: accy never promotes dtypes",
    "JitTest.test_resolve_argnums_signature_fail": "api_util.resolve_argnums: a JAX internal",
    "JitTest.test_infer_argnums_and_argnames": "api_util.infer_argnums_and_argnames (internal)",
    "JitTest.test_donate_args_info_aot": ARGS_INFO,
    "JitTest.test_dict_donation": ARGS_INFO,
    "JitTest.test_dict_donation_args_kwargs": ARGS_INFO,
    "JitTest.test_jit_lower_donate_argnums_available": (
        "accy lacks Lowered.donate_argnums (the donation is the jitted function's)"
    ),
    "JitTest.test_pe_close_jaxpr_identity": "pe.close_jaxpr on ClosedJaxprs: a JAX internal",
    "JitTest.test_trivial_computations": (
        "buffer identity (unsafe_buffer_pointer): accy returns an input passed straight through "
        "as the same immutable array, and refuses to donate aliased inputs"
    ),
    "JitTest.test_print_token_buffer_error": TOKENS,
    "JitTest.test_trivial_computations_with_tokens": TOKENS,
    "JitTest.test_jit_lower_compile_sharding_computation": (
        "with_sharding_constraint: accy has no sharding annotations"
    ),
    "JitTest.test_jit_replica_attributes": "StableHLO module attributes (mhlo.num_replicas)",
    "JitTest.test_jit_lower_cost_analysis": "accy lacks cost analysis of a lowering",
    "JitTest.test_jit_lower_compile_cost_analysis": "accy lacks cost analysis of a compilation",
    "JitTest.test_jit_lower_compile_memory_analysis": (
        "accy lacks memory analysis of a compiled program"
    ),
    "JitTest.test_jit_lower_compile_with_compiler_options": COMPILER_OPTIONS,
    "JitTest.test_compile_options_jit": COMPILER_OPTIONS,
    "JitTest.test_effort_level_compiler_option": COMPILER_OPTIONS,
    "JitTest.test_effort_level_as_strings_compiler_option": COMPILER_OPTIONS,
    "JitTest.test_jit_lower_compile_with_compiler_options_invalid": COMPILER_OPTIONS,
    "JitTest.test_jit_compile_with_compiler_options_multiple": COMPILER_OPTIONS,
    "JitTest.test_lower_compile_with_compiler_options_multiple": COMPILER_OPTIONS,
    "JitTest.test_caches_depend_on_axis_env": (
        "pmap axis environments for psum: accy has no named-axis environment outside vmap"
    ),
    "BufferDonationTest.test_pmap_donate_argnums_invalidates_input": "jax.pmap: accy has no pmap",
    "BufferDonationTest.test_pmap_nested_donate_ignored": "jax.pmap: accy has no pmap",
}

test_not_applicable = not_applicable_tests(NOT_APPLICABLE)
