"""One argument rule on every device: the same values accepted, the same refused with the same
`InvalidInput` (type and message), and no lossy conversion anywhere."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import accy
from accy import bool_, f32, i32, spec, u8


def host(values) -> list[np.ndarray]:
    return [v.get() if hasattr(v, "get") else np.asarray(v) for v in values]


def mixed():
    """f32[n=2], i32[n=2], u8[] -> (x * 2, k + 1, b)"""
    types = [spec(f32, n=2), spec(i32, n=2), spec(u8)]
    return accy.trace.define("mixed", types, lambda b, a: (a[0] * 2.0, a[1] + 1, a[2]))


GOOD = (np.array([1.5, -2.0], np.float32), np.array([3, 4], np.int32), np.array(7, np.uint8))

# Name -> (the position to replace in GOOD, the value put there, what the message must say).
BAD = {
    "float64 array for f32": (
        0,
        np.array([1.5, -2.0]),
        r"argument 0: an array of dtype float64 was given for f32\[n=2\], which needs float32; "
        r"convert it with \.astype\(numpy\.float32\)",
    ),
    "int64 array for i32": (1, np.array([3, 4]), r"dtype int64 .*\.astype\(numpy\.int32\)"),
    "wrong shape": (0, np.zeros(3, np.float32), r"shape \(3,\) .* has shape \(2,\)"),
    "Python float for i32": (1, [1.5, 2.0], r"argument 1: a Python float was given for i32"),
    "integral Python float for i32": (1, [1.0, 2.0], r"a Python float was given for i32"),
    "int out of i32 range": (1, [2**31, 0], r"does not hold exactly .* -2147483648 to 2147483647"),
    "int too large for int64": (1, [2**70, 0], r"cannot be converted to i32"),
    "negative int for u8": (2, -1, r"argument 2: -1 has an int that u8\[\] does not hold"),
    "int not exact in f32": (0, [2**24 + 1, 0], r"f32\[n=2\] does not hold exactly"),
    "float overflowing f32": (0, [1e39, 0.0], r"a float that overflows f32\[n=2\]"),
    "None for f32": (0, [None, 1.0], r"list \[None, 1\.0\] cannot be converted to f32"),
    "bool for f32": (0, [True, False], r"a Python bool was given for f32\[n=2\]"),
    "string for f32": (0, "ab", r"str 'ab' cannot be converted"),
    "ragged list": (0, [[1.0], [2.0, 3.0]], r"cannot be converted to f32"),
    "list of the wrong length": (0, [1.0, 2.0, 3.0], r"shape \(3,\) .* has shape \(2,\)"),
}


@pytest.mark.parametrize("case", BAD, ids=str)
def test_a_bad_argument_is_refused_alike_on_every_device(device, case):
    position, value, message = BAD[case]
    arguments = list(GOOD)
    arguments[position] = value
    program = mixed()
    with pytest.raises(accy.InvalidInput, match=message) as on_reference:
        accy.compile(program, "reference")(*arguments)
    with pytest.raises(accy.InvalidInput) as here:
        accy.compile(program, device)(*arguments)
    assert type(here.value) is type(on_reference.value)
    assert str(here.value) == str(on_reference.value)


def test_the_wrong_number_of_arrays_is_refused_alike(device):
    with pytest.raises(accy.InvalidInput) as on_reference:
        accy.compile(mixed(), "reference")(*GOOD[:2])
    with pytest.raises(accy.InvalidInput) as here:
        accy.compile(mixed(), device)(*GOOD[:2])
    assert "takes 3 arrays (f32[n=2], i32[n=2], u8[]), got 2" in str(here.value)
    assert str(here.value) == str(on_reference.value)


def test_lossless_python_values_and_copies_are_accepted(device):
    compiled = accy.compile(mixed(), device)
    strided = np.array([1.5, 0.0, -2.0, 0.0], np.float32)[::2]  # not contiguous: copied
    for first, second, third in [
        (strided, [3, 4], 7),
        ([1.5, -2], (3, 4), np.uint8(7)),
        (GOOD[0].tolist(), np.array([3, 4], np.int32), 7),
    ]:
        doubled, incremented, same = host(compiled(first, second, third))
        assert doubled.tolist() == [3.0, -4.0] and doubled.dtype == np.float32
        assert incremented.tolist() == [4, 5] and incremented.dtype == np.int32
        assert same.item() == 7 and same.dtype == np.uint8


def test_python_floats_are_rounded_to_the_parameters_precision(device):
    (doubled, _, _) = host(accy.compile(mixed(), device)([0.1, 1 / 3], [0, 0], 0))
    assert doubled.tolist() == (np.array([0.1, 1 / 3], np.float32) * 2).tolist()


def test_bools_only_for_bool_parameters(device):
    program = accy.trace.define("flags", [spec(bool_, n=2)], lambda b, a: a[0])
    compiled = accy.compile(program, device)
    assert host(compiled([True, False]))[0].tolist() == [True, False]
    with pytest.raises(accy.InvalidInput, match=r"a Python int was given for bool\[n=2\]; it"):
        compiled([1, 0])


def test_bf16_takes_ml_dtypes_arrays_and_exact_python_values(device):
    program = accy.trace.define("bf", [spec(accy.bf16, n=2)], lambda b, a: a[0] * 2.0)
    compiled = accy.compile(program, device)
    (doubled,) = host(compiled(np.array([1.5, 256], ml_dtypes.bfloat16)))
    assert doubled.dtype == ml_dtypes.bfloat16 and doubled.tolist() == [3.0, 512.0]
    assert host(compiled([1.5, 256]))[0].tolist() == [3.0, 512.0]
    with pytest.raises(accy.InvalidInput, match=r"does not hold exactly .* 2\*\*8"):
        compiled([257, 0])
    with pytest.raises(
        accy.InvalidInput,
        match=r"dtype float32 was given for bf16\[n=2\], which needs bfloat16; convert it with "
        r"\.astype\(ml_dtypes\.bfloat16\)",
    ):
        compiled(np.ones(2, np.float32))


def test_f16_takes_and_gives_numpy_float16(device):
    program = accy.trace.define("half", [spec(accy.f16, n=2)], lambda b, a: a[0] * 2.0)
    compiled = accy.compile(program, device)
    (doubled,) = host(compiled(np.array([1.5, 1000], np.float16)))
    assert doubled.dtype == np.float16 and doubled.tolist() == [3.0, 2000.0]
    with pytest.raises(accy.InvalidInput, match=r"\.astype\(numpy\.float16\)"):
        compiled(np.ones(2, np.float32))
