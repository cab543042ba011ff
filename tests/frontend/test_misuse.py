"""Every misuse of the front end a user is likely to make raises a clear `accy.AccyError`: the
error's class, and a message that says what was wrong, where, and what would be right."""

from __future__ import annotations

import numpy as np
import pytest

import accy

R = "reference"


def a(values, axes, dtype=np.float64):
    return accy.named(np.asarray(values, dtype), axes, device=R)


x = a([1.0, 2.0], ("lane",))
x32 = a([1.0, 2.0], ("lane",), np.float32)
ones = lambda x: x.sum()  # noqa: E731

MISUSES = {
    # leaves that are not arrays
    "a string leaf under jit": (
        lambda: accy.jit(lambda p: p["w"])({"w": x, "name": "hello"}),
        accy.NonArrayLeaf,
        r"args\[0\]\['name'\] is str 'hello', which is not an array.*static_argnames",
    ),
    "a NumPy array without names": (
        lambda: accy.jit(ones)(np.ones((2, 3))),
        accy.NonArrayLeaf,
        r"args\[0\] is a NumPy array of shape \(2, 3\).*accy.named\(array, \('axis0', 'axis1'\)\)",
    ),
    "a string in the argument differentiated": (
        lambda: accy.grad(lambda x, s: x.sum(), argnums=1)(x, "s"),
        accy.NonArrayLeaf,
        r"accy.grad: args\[1\] \(in argnums=1\) is str 's'",
    ),
    "an unhashable object outside argnums": (
        lambda: accy.grad(lambda x, s: x.sum())(x, {1, 2}),
        accy.NonArrayLeaf,
        r"args\[1\] is set \{1, 2\}, which is not an array",
    ),
    "a string returned by a jitted function": (
        lambda: accy.jit(lambda x: (x, "done"))(x),
        accy.NonArrayLeaf,
        r"the output\[1\] is str 'done'.*plain Python function around it",
    ),
    # axis names
    "a missing axis in a reduction": (
        lambda: accy.jit(lambda x: x.sum("lnae"))(x),
        accy.AxisError,
        r"axis 'lnae' is not on the operand f64\[lane=2\]; its axes are lane"
        r"\n  \(traced at .*test_misuse.py",  # the user's line
    ),
    "a missing axis in an eager contraction": (
        lambda: x.contract(x, "feature"),
        accy.AxisError,
        r"contract: axis 'feature' must be on both operands",
    ),
    "a missing axis in a slice": (
        lambda: x["token", 1:],
        accy.AxisError,
        r"index: axis 'token' is not on f64\[lane=2\]; its axes are lane",
    ),
    "a vmap axis no argument has": (
        lambda: accy.vmap(ones, "batch")(x),
        accy.TransformError,
        r"no argument has an axis 'batch' to map over",
    ),
    "in_axes naming an axis the argument lacks": (
        lambda: accy.vmap(lambda x: x * 2.0, "batch", in_axes=("example",))(x),
        accy.AxisError,
        r"in_axes maps args\[0\] along 'example', but it has no axis 'example'; its axes are lane",
    ),
    "too few names for an array": (
        lambda: accy.named(np.ones((2, 3)), ("row",)),
        accy.AxisError,
        r"the array has 2 axes \(shape \(2, 3\)\) but 1 name was given",
    ),
    # static arguments
    "an unhashable static argument": (
        lambda: accy.jit(lambda x, sizes: x, static_argnames="sizes")(x, [1, 2]),
        accy.StaticArgumentError,
        r"static argument 'sizes' is list \[1, 2\], which is unhashable.*a tuple rather",
    ),
    "static_argnames naming no parameter": (
        lambda: accy.jit(lambda x, n: x, static_argnames="m"),
        accy.StaticArgumentError,
        r"no parameter 'm'; its parameters are x, n",
    ),
    # argnums and has_aux
    "argnums out of range": (
        lambda: accy.grad(ones, argnums=2)(x),
        accy.TransformError,
        r"argnums=2, but the function was called with 1 positional argument",
    ),
    "argnums that is not an int": (
        lambda: accy.grad(ones, argnums="x"),
        accy.TransformError,
        r"argnums='x'; give the position of an argument \(an int\) or a tuple of positions",
    ),
    "a gradient with respect to integers": (
        lambda: accy.grad(lambda i: i.convert(accy.f64).sum())(a([1, 2], ("lane",), np.int32)),
        accy.TransformError,
        r"args\[0\] \(i32\[lane=2\]\) does not exist: it is not floating-point",
    ),
    "grad of a non-scalar": (
        lambda: accy.grad(lambda x: x * x)(x),
        accy.GradientRequiresScalarOutput,
        r"must return a scalar \(rank 0\), but it returned f64\[lane=2\]; reduce it",
    ),
    "grad of a tree output": (
        lambda: accy.grad(lambda x: {"loss": x.sum()})(x),
        accy.TransformError,
        r"must return one scalar array \(with has_aux=True, return \(value, aux\)\), got dict",
    ),
    "has_aux without a pair (grad)": (
        lambda: accy.grad(ones, has_aux=True)(x),
        accy.TransformError,
        r"accy.grad\(..., has_aux=True\): the function must return a pair",
    ),
    "has_aux with a triple (value_and_grad)": (
        lambda: accy.value_and_grad(lambda x: (x.sum(), x, x), has_aux=True)(x),
        accy.TransformError,
        r"must return a pair \(value, aux\), got a tuple of length 3",
    ),
    "has_aux without a pair (jvp)": (
        lambda: accy.jvp(lambda x: x, (x,), (x,), has_aux=True),
        accy.TransformError,
        r"accy.jvp\(..., has_aux=True\): the function must return a pair \(output, aux\)",
    ),
    "has_aux without a pair (vjp)": (
        lambda: accy.vjp(lambda x: x * 2.0, x, has_aux=True),
        accy.TransformError,
        r"accy.vjp\(..., has_aux=True\): the function must return a pair \(output, aux\)",
    ),
    "has_aux with a list of three (linearize)": (
        lambda: accy.linearize(lambda x: [x, x, x], x, has_aux=True),
        accy.TransformError,
        r"accy.linearize\(..., has_aux=True\).*got a list of length 3",
    ),
    "wrt= on a function": (
        lambda: accy.grad(ones, wrt=(0,)),
        accy.TransformError,
        r"takes argnums= and has_aux= only.*wrt= is for Programs",
    ),
    "a transform of something not callable": (
        lambda: accy.jit(3),
        accy.TransformError,
        r"accy.jit needs a function \(or a Program\), got int 3",
    ),
    # jvp and vjp arguments
    "primals not a tuple": (
        lambda: accy.jvp(ones, x, x),
        accy.TransformError,
        r"primals and tangents are tuples of arguments, got NamedArray and NamedArray",
    ),
    "tangents of another structure": (
        lambda: accy.jvp(lambda x: x, (x,), ([x],)),
        accy.TransformError,
        r"the tangents must have the structure of the primals",
    ),
    "a tangent of another dtype": (
        lambda: accy.jvp(lambda x: x, (x,), (x32,)),
        accy.TransformError,
        r"tangents leaf 0 has type f32\[lane=2\], but the primals have f64\[lane=2\] there",
    ),
    "a cotangent of another type": (
        lambda: accy.vjp(lambda x: x * 2.0, x)[1](a([1.0, 2.0, 3.0], ("lane",))),
        accy.TransformError,
        r"cotangents leaf 0 has type f64\[lane=3\], but the function's outputs have f64\[lane=2\]",
    ),
    # vmap's in_axes and out_axes
    "in_axes with the wrong number of entries": (
        lambda: accy.vmap(lambda x, y: x * y, "lane", in_axes=(True,))(x, x),
        accy.TransformError,
        r"in_axes has 1 entries but the function was called with 2 positional arguments",
    ),
    "in_axes that is not a prefix of the argument": (
        lambda: accy.vmap(lambda p: p["w"] * 2.0, "lane", in_axes=({"v": True},))({"w": x}),
        accy.TransformError,
        r"in_axes\[0\] must be a tree prefix of argument 0.*missing key\(s\): \['v'\]",
    ),
    "in_axes as a dict for all arguments": (
        lambda: accy.vmap(lambda p: p["w"], "lane", in_axes={"w": True})({"w": x}),
        accy.TransformError,
        r"give one entry per positional argument in a tuple",
    ),
    "an in_axes position out of range": (
        lambda: accy.vmap(lambda x: x * 2.0, "batch", in_axes=(1,))(x),
        accy.AxisError,
        r"along its axis at position 1, but it has 1 \(lane\)",
    ),
    "an in_axes entry of another kind": (
        lambda: accy.vmap(lambda x: x * 2.0, "batch", in_axes=(2.5,))(x),
        accy.TransformError,
        r"the in_axes entry for args\[0\] is 2.5; each entry is True or an axis name",
    ),
    "out_axes None for a mapped output": (
        lambda: accy.vmap(lambda x: x * 2.0, "lane", out_axes=None)(x),
        accy.TransformError,
        r"out_axes is None for the output, but it depends on the mapped arguments",
    ),
    "out_axes given as an axis name": (
        lambda: accy.vmap(lambda x: x * 2.0, "lane", out_axes="lane")(x),
        accy.TransformError,
        r"the out_axes entry for the output is 'lane'; each entry is an int",
    ),
    "an out_axes position out of range": (
        lambda: accy.vmap(lambda x: x * 2.0, "lane", out_axes=3)(x),
        accy.TransformError,
        r"out_axes=3 is out of range for an output with axes \('lane',\)",
    ),
    "a vmap axis that is not a name": (
        lambda: accy.vmap(ones, 0),
        accy.TransformError,
        r"axis must be an axis name, got 0",
    ),
    # dtypes, devices, traced values
    "mixed dtypes": (
        lambda: accy.jit(lambda a, b: a + b)(x, x32),
        accy.DTypeError,
        r"different dtypes \(left f64\[lane=2\], right f32\[lane=2\]\).*convert one",
    ),
    "arrays on different devices": (
        lambda: accy.jit(lambda a, b: a + b)(x, x.to("cpu")),
        accy.DeviceMismatch,
        r"args\[0\] on 'reference', args\[1\] on 'cpu'.*\.to\(device\)",
    ),
    "Python control flow on a traced value": (
        lambda: accy.jit(lambda x: x if x.sum() > 0 else -x)(x),
        accy.AccyError,
        r"no truth value",
    ),
    "a traced value turned into NumPy": (
        lambda: accy.jit(lambda x: np.asarray(x))(x),
        accy.AccyError,
        r"cannot turn a traced value into a NumPy array",
    ),
    "an unknown device": (
        lambda: x.to("tpu"),
        accy.AccyError,
        r"unknown device 'tpu'; the devices are cpu, cuda, cuda:N \(a GPU's ordinal\), reference",
    ),
}


@pytest.mark.parametrize("misuse", list(MISUSES))
def test_misuse_raises_a_clear_error(misuse):
    call, error, message = MISUSES[misuse]
    with pytest.raises(error, match=message) as raised:
        call()
    assert isinstance(raised.value, accy.AccyError)


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 2**40])
def test_a_python_int_outside_i32_names_the_argument_its_value_and_the_range(value):
    x = accy.named(np.ones(2, np.int32), ("n",))
    scaled = accy.jit(lambda a, k: a * k)
    with pytest.raises(accy.InvalidInput, match=rf"args\[1\]: {value} has an int that i32"):
        scaled(x, value)
    with pytest.raises(accy.InvalidInput, match="range is -2147483648 to 2147483647"):
        accy.jit(lambda a: (a, value))(x)
    assert scaled(x, 2**31 - 1).array.tolist() == [2**31 - 1] * 2  # the edge itself fits
