"""Devices as objects (`accy.devices()`, `accy.device(name)`): one registry, one object per
name, accepted wherever a device is asked for; a GPU's ordinal is carried to where its
executables run."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import accy
from accy.backends.devices import gpu_count

from ..executors import cuda_device_or_skip


def twice():
    return accy.trace.define("twice", [accy.spec(accy.f32, n=3)], lambda b, a: a[0] * 2.0)


def test_the_devices_are_the_cpu_each_gpu_and_the_reference():
    listed = accy.devices()
    assert [str(d) for d in listed] == (
        ["cpu"] + [f"cuda:{k}" for k in range(gpu_count())] + ["reference"]
    )
    assert all(accy.device(str(d)) is d for d in listed)
    assert [d.ordinal for d in listed if d.is_cuda] == list(range(gpu_count()))


def test_a_name_is_one_device_object():
    assert accy.device("cuda") is accy.device("cuda:0") is accy.device(accy.device("cuda:0"))
    assert accy.device("cuda:3").ordinal == 3 and accy.device("cuda:3").is_cuda
    cpu = accy.device("cpu")
    assert cpu.is_host and not cpu.is_cuda and cpu.takes_donations
    assert not accy.device("reference").takes_donations
    assert pickle.loads(pickle.dumps(cpu)) is cpu
    assert repr(accy.device("cuda:2")) == "Device('cuda:2')"


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "cuda:-1", "cpu:1", "", 0, None])
def test_an_unknown_device_is_a_clear_error(name):
    with pytest.raises(accy.AccyError, match=f"unknown device {name!r}; the devices are cpu"):
        accy.device(name)
    with pytest.raises(accy.AccyError, match="unknown device"):
        accy.compile(twice(), name)


def test_names_and_devices_reach_the_same_executable():
    program = twice()
    by_name = accy.compile(program, "reference")
    assert accy.compile(program, accy.device("reference")) is by_name
    assert by_name.device is accy.device("reference")
    x = accy.named(np.ones(3, np.float32), ("n",), device=accy.device("reference"))
    assert x.device is accy.device("reference") and (x + x).device is x.device
    assert x.to("cpu").device is accy.devices()[0]


def test_donation_asks_the_device():
    with pytest.raises(accy.DonationError, match="compile for 'reference' without donate"):
        accy.compile(twice(), "reference", donate=(0,))


def test_a_gpu_that_is_not_there_is_named():
    if gpu_count() == 0:
        with pytest.raises(accy.RuntimeUnavailable):
            accy.compile(twice(), "cuda:0")(np.ones(3, np.float32))
        return
    with pytest.raises(accy.RuntimeUnavailable, match=f"no CUDA device {gpu_count()}"):
        accy.compile(twice(), f"cuda:{gpu_count()}")


def test_an_array_for_a_gpu_that_is_not_there_is_a_clear_error():
    # Without CuPy the error says that it is missing; with it, how many GPUs there are.
    with pytest.raises(accy.RuntimeUnavailable, match="needs CuPy|no CUDA device 7"):
        accy.named(np.ones(2, np.float32), ("n",), device="cuda:7")


def test_an_executable_runs_on_its_own_gpu():
    cuda_device_or_skip()
    import cupy

    last = accy.device(f"cuda:{gpu_count() - 1}")
    compiled = accy.compile(twice(), last)
    assert compiled.device is last
    with cupy.cuda.Device(0):  # another GPU current (the same one where there is only one)
        (out,) = compiled(np.arange(3, dtype=np.float32))
    assert out.device.id == last.ordinal and out.get().tolist() == [0.0, 2.0, 4.0]
    x = accy.named(np.arange(3, dtype=np.float32), ("n",), device=last)
    assert x.array.device.id == last.ordinal and (x * 2.0).device is last
    assert x.to("cuda:0").array.device.id == 0
