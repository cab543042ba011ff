"""The raw-buffer call (`accy.compat.execute.Cpu(program).launch(inputs, outputs)`) checks each
distinct layout of buffers once, as the array path checks each signature once: later calls of a
checked layout only read the buffers' addresses (from the objects themselves where CPython's
layout is recognized) and check that no output overlaps another buffer. Every buffer kind
reads right, and bad buffers are still refused."""

from __future__ import annotations

import numpy as np
import pytest

import accy
import accy.compat
from accy import f32, spec
from accy.backends.buffers import Layout

X = np.array([1, 2, 3, 4], np.float32)
Y = np.array([10, 20, 30, 40], np.float32)


@pytest.fixture
def executor(native_cpu):
    program = accy.trace.define(
        "two_outputs", [spec(f32, lane=4)] * 2, lambda b, a: (a[0] * a[1], a[0] + a[1])
    )
    return accy.compat.execute.Cpu(program)


@pytest.fixture
def checks(monkeypatch):
    """How many times the full checks of a call's buffers ran."""
    calls = []
    checked = Layout.buffers

    def counting(self, inputs, outputs):
        calls.append(len(inputs) + len(outputs))
        return checked(self, inputs, outputs)

    monkeypatch.setattr(Layout, "buffers", counting)
    return calls


def results(outputs) -> list[list[float]]:
    return [np.frombuffer(o, np.float32).tolist() for o in outputs]


EXPECTED = [(X * Y).tolist(), (X + Y).tolist()]


def test_a_checked_layout_is_not_checked_again(executor, checks):
    for _ in range(5):
        outputs = [bytearray(16), memoryview(bytearray(16))]
        executor.launch([X.tobytes(), memoryview(Y.tobytes())], outputs)
        assert results(outputs) == EXPECTED
    assert len(checks) == 1
    outputs = [bytearray(16), bytearray(16)]  # another layout: checked once more
    executor.launch([X.tobytes(), memoryview(Y.tobytes())], outputs)
    assert results(outputs) == EXPECTED and len(checks) == 2


def read_only(array: np.ndarray) -> np.ndarray:
    array = array.copy()
    array.flags.writeable = False
    return array


BUFFER_KINDS = {
    "bytes": lambda a: a.tobytes(),
    "bytearray": lambda a: bytearray(a.tobytes()),
    "memoryview of bytes, sliced": lambda a: memoryview(b"pad" + a.tobytes() + b"pad")[3:-3],
    "memoryview of an array, sliced": lambda a: memoryview(
        np.concatenate([np.zeros(4, np.float32), a]).view(np.uint8)
    )[16:],
    "read-only memoryview": lambda a: memoryview(bytearray(a.tobytes())).toreadonly(),
    "read-only array": read_only,
    "array of raw bytes": lambda a: a.view(np.uint8).copy(),
}


@pytest.mark.parametrize("kind", BUFFER_KINDS)
def test_every_kind_of_buffer_reads_right_on_every_call(executor, kind):
    make = BUFFER_KINDS[kind]
    for scale in (1.0, 2.0, 3.0):  # new buffers each call, at new addresses
        x, y = X * scale, Y * scale
        outputs = [memoryview(bytearray(b"\xff" * 24))[4:20], np.zeros(4, np.float32)]
        executor.launch([make(x), make(y)], outputs)
        assert results(outputs) == [(x * y).tolist(), (x + y).tolist()], kind


def test_bad_buffers_are_refused_after_their_layout_kind_was_checked(executor):
    executor.launch([X.tobytes(), Y.tobytes()], [bytearray(16), bytearray(16)])
    with pytest.raises(accy.InvalidInput, match="input 1: the buffer has 12 bytes"):
        executor.launch([X.tobytes(), Y.tobytes()[:12]], [bytearray(16), bytearray(16)])
    with pytest.raises(accy.InvalidInput, match="output 1: the buffer is read-only"):
        executor.launch([X.tobytes(), Y.tobytes()], [bytearray(16), memoryview(bytes(16))])
    with pytest.raises(accy.InvalidInput, match="input 0: list is not a buffer"):
        executor.launch([[1.0] * 4, Y.tobytes()], [bytearray(16), bytearray(16)])
    shared = bytearray(32)
    for _ in range(2):  # a checked layout of memoryviews; overlapping outputs, every call
        outputs = [memoryview(shared)[:16], memoryview(shared)[8:24]]
        with pytest.raises(accy.InvalidInput, match="output 1 overlaps output 0"):
            executor.launch([X.tobytes(), Y.tobytes()], outputs)
    assert shared == bytearray(32)  # nothing ran
    both = bytearray(X.tobytes())
    with pytest.raises(accy.InvalidInput, match="output 0 overlaps input 0"):
        executor.launch([memoryview(both), Y.tobytes()], [memoryview(both), bytearray(16)])


def test_empty_buffers_pass_on_every_call(native_cpu):
    program = accy.trace.define(
        "with_empty", [spec(f32, n=0), spec(f32, m=2)], lambda b, a: (a[0] * 2.0, a[1] + 1.0)
    )
    launcher = accy.compat.execute.Cpu(program)
    for value in (1.0, 2.0):
        outputs = [bytearray(0), memoryview(bytearray(8))]
        launcher.launch([b"", np.full(2, value, np.float32).tobytes()], outputs)
        assert np.frombuffer(outputs[1], np.float32).tolist() == [value + 1.0] * 2
