"""Checks on raw buffers (`Executable.run_buffers`), made before any native code runs.

A buffer is any object with the buffer protocol (bytes, bytearray, memoryview, NumPy arrays). It
must be contiguous and hold exactly the parameter's bytes; an output must also be writable, and
no output may overlap an input or another output. A NumPy array must have the parameter's dtype
(bf16: `ml_dtypes.bfloat16`, or its uint16 bit patterns), or be uint8 (raw bytes). Every
failure is an `InvalidInput` that names the program, the buffer and what was expected.

`Layout` holds what the checks compare against, worked out once per executable, so that a
call costs a few comparisons per buffer. It also remembers the layouts of raw buffers (each
buffer's type, byte size, contiguity and writability: `buffer_signature`) that passed the
checks: a later call of one of those layouts only reads each buffer's address, from the object
itself where CPython's layout of bytes, memoryviews and arrays was recognized, and checks that
no output overlaps another buffer.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..caches import memoized
from ..core.types import DType, TensorType, bf16
from ..errors import AccyError, DonationError, InvalidInput

RAW_BYTES = np.dtype(np.uint8)
CHECKED_LAYOUTS = 64
"""How many distinct layouts of buffers one program remembers as checked (then it starts over)."""
BF16_BIT_PATTERNS = (np.dtype(np.uint16), np.dtype(np.int16))


def raw_dtypes(dtype: DType) -> tuple[np.dtype, ...]:
    """NumPy dtypes whose arrays hold raw elements of `dtype`, raw bytes (uint8) included.

    >>> from accy import bf16
    >>> raw_dtypes(bf16)
    (dtype(bfloat16), dtype('uint16'), dtype('int16'), dtype('uint8'))
    """
    held = _element_dtypes(dtype)
    return (*held, RAW_BYTES) if RAW_BYTES not in held else held


def _element_dtypes(dtype: DType) -> tuple[np.dtype, ...]:
    bits = BF16_BIT_PATTERNS if dtype == bf16 else ()
    return (np.dtype(dtype.numpy), *bits)


def address_of(array: np.ndarray) -> int:
    """The address of a contiguous array's first byte."""
    try:
        # The fast way (a third of a microsecond); it needs a writable, non-empty buffer.
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError):
        return array.ctypes.data


def addresses_of(arrays: Sequence[np.ndarray]) -> list[int]:
    """The addresses of contiguous arrays' first bytes (`address_of` of each, with the common
    case, writable and non-empty arrays, in one comprehension)."""
    addressof, from_buffer = ctypes.addressof, ctypes.c_char.from_buffer
    try:
        return [addressof(from_buffer(a)) for a in arrays]
    except (TypeError, ValueError):
        return [address_of(a) for a in arrays]


@memoized("numpy data offset")
def numpy_data_offset() -> int | None:
    """Where an ndarray object keeps its data pointer, in bytes from the object's start (NumPy's
    `PyArrayObject.data`, 16 on 64-bit CPython), or None if this NumPy does not look like that.

    Native code can then read an array's address itself: `ctypes` and `__array_interface__`
    take a microsecond per array, longer than a small program runs.

    >>> numpy_data_offset() in (16, None)
    True
    """
    probes = [np.empty(2), np.zeros(3, np.int8)[1:], np.ones((2, 2), np.float32).T]
    for offset in range(ctypes.sizeof(ctypes.c_void_p), 8 * ctypes.sizeof(ctypes.c_void_p), 8):
        if all(ctypes.c_void_p.from_address(id(a) + offset).value == a.ctypes.data for a in probes):
            return offset
    return None


@functools.cache
def bytes_data_offset() -> int | None:
    """Where a bytes object keeps its first byte, in bytes from the object's start (CPython's
    `PyBytesObject.ob_sval`), or None if these bytes do not look like that.

    >>> bytes_data_offset() in (32, None)
    True
    """
    offset = sys.getsizeof(b"") - 1  # the header; the one more byte is the closing NUL
    probes = [bytes(range(256)), b"accy" * 64]
    if all(ctypes.string_at(id(b) + offset, len(b)) == b for b in probes):
        return offset
    return None


@functools.cache
def memoryview_data_offset() -> int | None:
    """Where a memoryview object keeps the address of its first byte (CPython's
    `PyMemoryViewObject.view.buf`), or None if this Python does not look like that.

    >>> memoryview_data_offset() is None or memoryview_data_offset() % 8 == 0
    True
    """
    base = np.arange(64, dtype=np.uint8)
    probes = [memoryview(base), memoryview(base)[8:], memoryview(base.tobytes())[3:]]
    expected = [np.frombuffer(m, np.uint8).ctypes.data for m in probes]
    word = ctypes.sizeof(ctypes.c_void_p)
    for offset in range(word, sys.getsizeof(probes[0]) - word + 1, word):
        read = [ctypes.c_void_p.from_address(id(m) + offset).value for m in probes]
        if read == expected:
            return offset
    return None


Probe = Callable[[Any], tuple[tuple, int | None]]


@functools.cache
def _probes() -> dict[type, Probe]:
    """For each kind of buffer whose layout CPython's objects reveal: a function giving a buffer's
    `buffer_signature` and its first byte's address (None where it cannot tell quickly)."""
    addressof, from_buffer = ctypes.addressof, ctypes.c_char.from_buffer
    pointer_at = ctypes.c_void_p.from_address
    bytes_offset, view_offset = bytes_data_offset(), memoryview_data_offset()
    array_offset = numpy_data_offset()

    def of_bytes(v: bytes) -> tuple[tuple, int | None]:
        return (bytes, len(v)), None if bytes_offset is None else id(v) + bytes_offset

    def of_bytearray(v: bytearray) -> tuple[tuple, int | None]:
        try:
            return (bytearray, len(v)), addressof(from_buffer(v))
        except ValueError:  # empty: no address to take
            return (bytearray, 0), None

    def of_memoryview(v: memoryview) -> tuple[tuple, int | None]:
        try:
            signature = (memoryview, v.nbytes, v.readonly, v.c_contiguous)
        except ValueError:  # released: the checks say so
            return (memoryview, None), None
        return signature, None if view_offset is None else pointer_at(id(v) + view_offset).value

    def of_array(v: np.ndarray) -> tuple[tuple, int | None]:
        flags = v.flags
        signature = (np.ndarray, v.dtype, v.nbytes, flags.c_contiguous, flags.writeable)
        return signature, None if array_offset is None else pointer_at(id(v) + array_offset).value

    return {
        bytes: of_bytes,
        bytearray: of_bytearray,
        memoryview: of_memoryview,
        np.ndarray: of_array,
    }


def _probe_other(value: Any) -> tuple[tuple, None]:
    kind = type(value)
    try:
        view = memoryview(value)
        return (kind, view.nbytes, view.readonly, view.c_contiguous), None
    except (TypeError, ValueError):  # not a buffer: the checks say so
        return (kind, None), None


def buffer_signature(value: Any) -> tuple:
    """What the checks of a raw buffer depend on, apart from its contents and address: two
    buffers of one signature pass or fail them alike.

    >>> buffer_signature(b"abcd")
    (<class 'bytes'>, 4)
    """
    return _probes().get(type(value), _probe_other)(value)[0]


def as_bytes(value: Any, at: str) -> np.ndarray:
    """A contiguous NumPy view of buffer `value` (itself, if it is a NumPy array)."""
    if isinstance(value, np.ndarray):
        if not value.flags.c_contiguous:
            raise InvalidInput(
                f"{at}: the array is not contiguous (strides {value.strides}); pass "
                f"numpy.ascontiguousarray(x)"
            )
        return value
    try:
        return np.frombuffer(value, dtype=np.uint8)
    except TypeError:
        raise InvalidInput(
            f"{at}: {type(value).__name__} is not a buffer (bytes, bytearray, memoryview or "
            f"a NumPy array)"
        ) from None
    except (ValueError, BufferError):
        raise InvalidInput(f"{at}: the buffer is not contiguous; copy it first") from None


def check_raw(array: Any, t: TensorType, at: str) -> None:
    """Refuse a buffer (host or device array) of the wrong dtype or byte size for `t`."""
    if array.dtype not in raw_dtypes(t.dtype):
        wanted = " or ".join(str(d) for d in _element_dtypes(t.dtype))
        raise InvalidInput(
            f"{at}: an array of dtype {array.dtype} was given for {t}, which needs "
            f"{wanted} (or raw bytes as uint8)"
        )
    if array.nbytes != t.nbytes:
        raise InvalidInput(
            f"{at}: the buffer has {array.nbytes} bytes, but {t} takes "
            f"{t.nbytes} ({t.size} elements of {t.dtype.itemsize} bytes)"
        )


def check_buffer_count(kind: str, values: Sequence[Any], types, program: str) -> None:
    """Refuse a call with the wrong number of input or output buffers."""
    if len(values) != len(types):
        listed = ", ".join(map(str, types)) or "none"
        raise InvalidInput(
            f"program {program!r} takes {len(types)} {kind}s ({listed}), got {len(values)}"
        )


def check_readable(launched: bool, index: int, outputs: int) -> None:
    """The checks of `read_output`: a launch has run; output `index` is one of the `outputs`."""
    if not launched:
        raise AccyError("read_output: call launch() first; nothing has run yet")
    if not 0 <= index < outputs:
        raise InvalidInput(
            f"read_output: output {index} does not exist; the program has {outputs} outputs"
        )


def check_no_overlap(program: str, inputs, input_sizes, outputs, output_sizes) -> None:
    """Refuse an output (address, byte size) that shares memory with an input or another
    output."""
    spans = [
        (address, address + size, f"input {i}")
        for i, (address, size) in enumerate(zip(inputs, input_sizes, strict=True))
        if size
    ]
    for j, (address, size) in enumerate(zip(outputs, output_sizes, strict=True)):
        if size == 0:
            continue
        end = address + size
        for start, stop, name in spans:
            if start < end and address < stop:
                raise InvalidInput(
                    f"program {program!r}: output {j} overlaps {name}; outputs must be "
                    f"separate memory"
                )
        spans.append((address, end, f"output {j}"))


def donated_positions(program: str, donate: Sequence[int], count: int) -> tuple[int, ...]:
    """The inputs `donate` names (`accy.compile(..., donate=)`), sorted and each once; an
    index that is not one of the program's `count` inputs is a `DonationError`.

    >>> donated_positions("step", (2, 0, 2), 3)
    (0, 2)
    """
    for i in donate:
        if not isinstance(i, int) or not 0 <= i < count:
            raise DonationError(
                f"program {program!r}: donate={tuple(donate)} names input {i!r}, but its "
                f"inputs are 0..{count - 1}"
            )
    return tuple(sorted(set(donate)))


def check_donated_apart(
    program: str, addresses: Sequence[int], sizes: Sequence[int], donated: Sequence[int]
) -> None:
    """Refuse a call where a donated input's memory is also another input's (the same array
    passed twice, or a view of it): the outputs written into it would change what the other
    argument reads. `addresses` and `sizes` are every input's, in order.

    >>> check_donated_apart("step", [0, 64, 0], [64, 64, 64], [1])  # inputs 0 and 2 may share
    >>> try:
    ...     check_donated_apart("step", [0, 64, 64], [64, 64, 64], [1])
    ... except DonationError as error:
    ...     print(str(error)[:62])
    program 'step': input 1 is donated, but its memory is also inp
    """
    spans = sorted(
        (address, address + size, i)
        for i, (address, size) in enumerate(zip(addresses, sizes, strict=True))
        if size
    )
    donated = set(donated)
    # The sweep keeps the earlier span that reaches furthest, and the donated one that does:
    # a span overlaps an earlier one exactly when it starts before the first's end.
    furthest = furthest_donated = (0, -1)  # (end, input)
    for start, end, i in spans:
        earlier = furthest if i in donated else furthest_donated
        if start < earlier[0]:
            pair = sorted((i, earlier[1]))  # name a donated input, the first if both are
            named, other = pair if pair[0] in donated else pair[::-1]
            raise DonationError(
                f"program {program!r}: input {named} is donated, but its memory is also "
                f"input {other}'s; donate an array that no other argument uses (pass a copy)"
            )
        furthest = max(furthest, (end, i))
        if i in donated:
            furthest_donated = max(furthest_donated, (end, i))


class Layout:
    """The buffers of one program, worked out once: byte sizes and accepted dtypes."""

    def __init__(self, name: str, inputs: tuple[TensorType, ...], outputs: tuple[TensorType, ...]):
        self.name = name
        self.input_types, self.output_types = inputs, outputs
        self.input_sizes = [t.nbytes for t in inputs]
        self.output_sizes = [t.nbytes for t in outputs]
        self._sizes = self.input_sizes + self.output_sizes
        # (byte size, accepted dtypes, must be writable) of every buffer, inputs first.
        self._expected = [(t.nbytes, raw_dtypes(t.dtype), False) for t in inputs] + [
            (t.nbytes, raw_dtypes(t.dtype), True) for t in outputs
        ]
        # The signatures (`buffer_signature` of every buffer) of calls whose buffers passed
        # the checks: a call of a checked layout costs a signature and an address per buffer,
        # and the overlap check.
        self._checked_layouts: set[tuple] = set()

    def checked_addresses(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> Sequence[int]:
        """The addresses of checked buffers, inputs first, outputs checked not to overlap
        another buffer. The checks of `buffers` run once per distinct layout of buffers
        (`buffer_signature`); later calls of that layout only find the addresses.

        >>> from accy import f32, spec
        >>> layout = Layout("f", (spec(f32, n=2),), (spec(f32, n=2),))
        >>> len(layout.checked_addresses([bytes(8)], [bytearray(8)]))
        2
        """
        values = [*inputs, *outputs]
        probes, other = _probes(), _probe_other
        probed = [probes.get(type(v), other)(v) for v in values]
        key, addresses = zip(*probed, strict=True) if probed else ((), ())
        if key not in self._checked_layouts:
            self.buffers(inputs, outputs)  # raises InvalidInput for a bad buffer
            if len(self._checked_layouts) >= CHECKED_LAYOUTS:
                self._checked_layouts.clear()
            self._checked_layouts.add(key)
        if None in addresses:  # an empty buffer, or a kind whose layout was not recognized
            addresses = [
                address_of(as_bytes(v, "")) if a is None else a
                for v, a in zip(values, addresses, strict=True)
            ]
        self.check_disjoint(addresses)
        return addresses

    def buffers(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> list[np.ndarray]:
        """Checked input and output buffers, inputs first, as NumPy arrays (views, not copies)."""
        if len(inputs) != len(self.input_types) or len(outputs) != len(self.output_types):
            check_buffer_count("input", inputs, self.input_types, self.name)
            check_buffer_count("output", outputs, self.output_types, self.name)
        values = [*inputs, *outputs]
        if self._all_fit(values, owning=False):
            return values
        return self.inputs(inputs) + self.outputs(outputs)

    def separate_arrays(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> list | None:
        """The buffers, inputs first, if each is a NumPy array that passes the checks and owns
        its memory, and no output is passed twice or also as an input; else None.

        Arrays that own their memory are separate allocations, so such buffers cannot
        overlap: they need no addresses to be checked, and native code can read those itself.
        """
        if len(inputs) != len(self.input_types) or len(outputs) != len(self.output_types):
            return None
        values = [*inputs, *outputs]
        if not self._all_fit(values, owning=True):
            return None
        written = set(map(id, outputs))
        if len(written) != len(outputs) or not written.isdisjoint(map(id, inputs)):
            return None
        return values

    def _all_fit(self, values: list[Any], owning: bool) -> bool:
        """The common case, in a few comparisons per buffer: contiguous NumPy arrays of an
        accepted dtype and the right size, writable if they are outputs (owning their
        memory, if asked)."""
        ndarray = np.ndarray
        for value, (nbytes, dtypes, writable) in zip(values, self._expected, strict=True):
            if type(value) is not ndarray:
                return False
            flags = value.flags
            if not (
                flags.c_contiguous
                and (flags.writeable or not writable)
                and (flags.owndata or not owning)
                and value.nbytes == nbytes
                and value.dtype in dtypes
            ):
                return False
        return True

    def inputs(self, values: Sequence[Any]) -> list[np.ndarray]:
        """Checked input buffers, as NumPy arrays (views, not copies)."""
        check_buffer_count("input", values, self.input_types, self.name)
        return [
            self._checked(value, position, "input", self.input_types)
            for position, value in enumerate(values)
        ]

    def outputs(self, values: Sequence[Any]) -> list[np.ndarray]:
        """Checked, writable output buffers, as NumPy arrays (views, not copies)."""
        check_buffer_count("output", values, self.output_types, self.name)
        arrays = []
        for position, value in enumerate(values):
            array = self._checked(value, position, "output", self.output_types)
            if not array.flags.writeable:
                raise InvalidInput(
                    f"program {self.name!r}, output {position}: the buffer is read-only; "
                    f"outputs must be writable"
                )
            arrays.append(array)
        return arrays

    def _checked(self, value: Any, position: int, kind: str, types) -> np.ndarray:
        at = f"program {self.name!r}, {kind} {position}"
        array = as_bytes(value, at)
        check_raw(array, types[position], at)
        return array

    def check_disjoint(self, addresses: Sequence[int]) -> None:
        """Refuse outputs that overlap an input or each other, given every buffer's address
        (inputs first)."""
        # Quick: no two buffers overlap at all (the spans, sorted, each end before the next).
        end = 0
        # As many addresses as buffers (the caller's): strict=True would only add its check.
        for start, size in sorted(zip(addresses, self._sizes, strict=False)):
            if size:
                if start < end:
                    break
                end = start + size
        else:
            return
        # Two buffers overlap; that is allowed only between inputs.
        count = len(self.input_sizes)
        check_no_overlap(
            self.name, addresses[:count], self.input_sizes, addresses[count:], self.output_sizes
        )


__all__ = [
    "Layout",
    "address_of",
    "addresses_of",
    "as_bytes",
    "buffer_signature",
    "bytes_data_offset",
    "check_buffer_count",
    "check_donated_apart",
    "check_no_overlap",
    "check_raw",
    "check_readable",
    "donated_positions",
    "memoryview_data_offset",
    "numpy_data_offset",
    "raw_dtypes",
]
