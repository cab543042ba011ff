"""DLPack both ways between NamedArrays, JAX and PyTorch, bfloat16 included."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import accy

torch = pytest.importorskip("torch")

DATA = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5


def test_a_named_array_is_a_dlpack_producer_without_a_copy():
    x = accy.named(DATA.copy(), ("row", "col"))
    t = torch.from_dlpack(x)
    assert t.dtype == torch.float32 and tuple(t.shape) == (2, 3)
    t[0, 0] = 42.0  # the same memory
    assert x.array[0, 0] == 42.0
    np.testing.assert_array_equal(np.asarray(jnp.from_dlpack(x)), x.array)
    assert x.__dlpack_device__() == (1, 0)


def test_bfloat16_crosses_to_torch_and_jax():
    x = accy.named(DATA.astype(ml_dtypes.bfloat16), ("row", "col"))
    t = torch.from_dlpack(x)
    assert t.dtype == torch.bfloat16
    np.testing.assert_array_equal(t.float().numpy(), DATA)
    j = jnp.from_dlpack(x)
    assert j.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(j, np.float32), DATA)


def test_from_dlpack_reads_torch_and_jax_bfloat16_and_floats():
    for source in (torch.tensor(DATA).bfloat16(), jnp.asarray(DATA, jnp.bfloat16)):
        x = accy.from_dlpack(source, ("row", "col"))
        assert x.dtype == accy.bf16 and x.shape == {"row": 2, "col": 3}
        np.testing.assert_array_equal(np.asarray(x.array, np.float32), DATA)
        y = accy.named(source, ("row", "col"))  # named reads any producer the same way
        np.testing.assert_array_equal(np.asarray(y.array, np.float32), DATA)
    t = torch.tensor(DATA)
    x = accy.from_dlpack(t, ("row", "col"))
    t[1, 1] = 7.0  # without a copy
    assert x.array[1, 1] == 7.0
    doubled = accy.jit(lambda x: x * 2.0)(accy.from_dlpack(jnp.asarray(DATA), ("row", "col")))
    np.testing.assert_array_equal(torch.from_dlpack(doubled).numpy(), DATA * 2)


def test_from_dlpack_misuse():
    with pytest.raises(accy.InvalidInput, match="not a DLPack producer"):
        accy.from_dlpack([1.0, 2.0], ("n",))
    with pytest.raises(accy.AxisError, match="1 axis"):
        accy.from_dlpack(torch.ones(3), ("a", "b"))
