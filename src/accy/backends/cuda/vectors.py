"""Vector loads and stores: each thread computes `width` adjacent elements of an elementwise
loop or of a reduction's chunk, loading and storing contiguous runs 64 or 128 bits at a time.

A kernel reaches HBM bandwidth only with enough bytes in flight per SM (Little's law: ~4.8 TB/s
times ~0.6 µs of latency, over 132 SMs, is ~20 KB per SM). One 2-byte load per thread and per
iteration keeps 4 KB in flight at full occupancy, a fifth of that; eight bf16 values in one
16-byte load per thread keep 32 KB. The index arithmetic (64-bit, divisions per axis) is also
paid once per vector instead of once per element.

`LaneBody` is the shared expression builder (`accy.codegen.c.expressions.Body`) asked for
`width` lanes in one body: lane k's index differs from lane 0's by k along one axis (or flat
position), named `<base>_<k>`. A stored value read at a lane's index along an axis of stride 1
becomes one vector load into a register array (`__align__(16)`), declared where lane 0 first
needs it; each lane reads its element from the array. Values that do not depend on the lane (a
row's max, a label, a bias column) are computed once per thread, not once per lane. Anything
else (strided or transposed reads, gathers along the lane axis, padding) stays a scalar load
inside the vector loop. A store at a lane's flat position goes into a register array and out in
one vector store after the last lane.

Alignment: a vector access needs its address to be a multiple of its chunk (16 bytes, or the
whole vector if smaller). Strides and view offsets are checked when the kernel is written; base
pointers (inputs and outputs move from call to call, views of them may be misaligned) are
checked by the kernel, which runs its scalar loop instead when one is not aligned.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from ...codegen.c.dialect import CUDA
from ...codegen.c.expressions import Body, Flat, Index, flat_position, offset_expression
from ...core.types import DType, bf16
from ...lower.views import StridedView

VECTOR_BYTES = 16  # the widest load a thread issues (LDG.128)
MAX_WIDTH = 8  # lanes per thread: 8 bf16 values fill 16 bytes
# The lanes' values of a thread's streams, in bytes, past which registers limit the kernel
# rather than bytes in flight: AdamW's update of two f32 parameters (12 f32 and 2 bf16
# streams) took 150 registers at 8 lanes (one block of 256 a multiprocessor) and 118 at 4.
LANE_BYTES = 192
# A body this many statements long (times its lanes) is not worth the code it would take.
MAX_VECTOR_LINES = 768
# Below this many elements a kernel is latency-bound: vectors would only cost code (the
# generated source, NVRTC's time) without making it faster.
MIN_VECTOR_ELEMENTS = 1 << 14

IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def lane_width(itemsizes, streams=()) -> int:
    """Lanes per thread for a loop that reads and writes values of `itemsizes` bytes: enough
    for 16 bytes of the narrowest, at most `MAX_WIDTH`; halved while the lanes of its
    `streams` (the itemsizes of the buffers it reads or writes at every element) would hold
    more than `LANE_BYTES` a thread, but never below 16 bytes of the widest.

    >>> lane_width([2, 4]), lane_width([4]), lane_width([8]), lane_width([1])
    (8, 4, 2, 8)
    >>> adamw = [4, 4, 4, 2, 4, 4, 4]  # reads p, m, v and a bf16 gradient; writes p, m, v
    >>> lane_width(adamw, adamw), lane_width([2, 2, 4], [2, 2])
    (4, 8)
    """
    narrowest = min(itemsizes, default=4)
    width = max(1, min(MAX_WIDTH, VECTOR_BYTES // narrowest))
    floor = max(1, VECTOR_BYTES // max(itemsizes, default=4))
    while width > floor and width * sum(streams) > LANE_BYTES:
        width //= 2
    return width


def chunk_bytes(width: int, itemsize: int) -> int:
    """Bytes moved by one load or store instruction of a vector of `width` values of
    `itemsize` bytes (also the alignment it needs).

    >>> chunk_bytes(8, 2), chunk_bytes(8, 4), chunk_bytes(2, 2)
    (16, 16, 4)
    """
    return min(VECTOR_BYTES, width * itemsize)


def lane_divisor(width: int, extent: int) -> int:
    """The most lanes (a power of two, at most `width`) that divide `extent`, so that vectors
    never straddle a row.

    >>> lane_divisor(8, 50304), lane_divisor(8, 768), lane_divisor(8, 6), lane_divisor(8, 7)
    (8, 8, 2, 1)
    """
    while width > 1 and extent % width:
        width //= 2
    return width


@dataclass
class _Vector:
    """A register array of `width` values of `storage`, from or to `pointer + offset`."""

    name: str
    pointer: str
    offset: str
    storage: str
    itemsize: int


def vector_type(vector: _Vector, width: int) -> str:
    """The C type of a vector: `accy_vector` (the CUDA prelude) of `width` values, aligned as
    its transfers need. A load or store of the whole struct is one instruction per 16 bytes
    (ld.global.v4); a 16-byte load into an array read element by element is split into
    scalar loads by the compiler."""
    return f"accy_vector<{vector.storage}, {width}>"


class LaneBody(Body):
    """A `Body` computing `width` lanes at once (see the module docstring): `lane(base, k)`
    names lane k of index or counter `base`; loads along a lane axis of stride 1 and stores at
    a lane's flat position become vector transfers (loads stay scalar without `vectors`)."""

    def __init__(self, unit, plan, pointers, width: int, vectors: bool = True):
        super().__init__(unit, plan, pointers)
        self.width = width
        self.vectors = vectors  # False: every load scalar (the fallback of a lane body)
        self.lanes: dict[str, tuple[str, int]] = {}  # lane name -> (base, k)
        self.dependent: set[str] = set()  # names whose value differs between lanes
        self.alignment: dict[str, int] = {}  # pointer -> bytes its address must be a multiple of
        self._loads: dict[tuple[str, str], _Vector] = {}
        self._stores: dict[tuple[str, str], _Vector] = {}
        self._index_names: dict[str, str] = {}
        self._loaded: dict[str, str] = {}
        self._retired_lanes: dict[str, tuple[str, int]] = {}  # lanes of branches left
        self._bf16_rounded: set[str] = set()  # temps already rounded to bf16

    def lane(self, base: str, k: int) -> str:
        """The name of lane `k` of index `base` (declared on first use)."""
        name = f"{base}_{k}"
        if name not in self.lanes:
            self.lanes[name] = (base, k)
            self.dependent.add(name)
            self.lines.append(f"const int64_t {name} = {base} + {k};")
        return name

    def variable(self, dtype: DType) -> str:
        # Set in a branch, from whatever the lane's piece computes: assume it differs by lane.
        name = super().variable(dtype)
        self.dependent.add(name)
        return name

    def scope(self) -> object:
        # Vector loads, loaded values, index names and lanes declared in a branch are
        # forgotten with the branch's values.
        caches = (self._index_names, self._loaded, self._loads, self.lanes)
        return super().scope(), tuple(dict(cache) for cache in caches)

    def restore(self, saved: object) -> None:
        lanes = self.lanes
        memo, (self._index_names, self._loaded, self._loads, self.lanes) = saved
        self._retired_lanes |= lanes
        super().restore(memo)

    def vector_lanes(self, index: Index) -> list[tuple[str, ...]] | None:
        # Only where every part is a lane (lane 0 of its base) or the same for every lane, so
        # that lane k's index is lane 0's with each lane's name for k.
        if isinstance(index, Flat) or not any(part in self.lanes for part in index):
            return None
        for part in index:
            if part in self.lanes and self.lanes[part][1] != 0:
                return None
            if part not in self.lanes and self._depends(part):
                return None
        return [
            tuple(self.lane(self.lanes[p][0], k) if p in self.lanes else p for p in index)
            for k in range(self.width)
        ]

    def shifted(self, component: str, start: int, whole_vector: bool = False) -> str:
        if component not in self.lanes:
            return super().shifted(component, start)
        if not whole_vector:
            # Other lanes may be in other pieces: a vector at this lane could reach past the
            # piece (or be misaligned), so the lane's index is no lane, its loads scalar.
            return self.index_temp(f"{component} - {start}")
        # Lane k of `base` becomes lane k of `base - start`: a load at it is still a vector.
        base, k = self.lanes[component]
        return self.lane(self.index_temp(f"{base} - {start}"), k) if start else component

    def _depends(self, expression: str) -> bool:
        return any(word in self.dependent for word in IDENTIFIER.findall(expression))

    def temp(self, dtype: DType, expression: str, rounded: bool = True) -> str:
        name = super().temp(dtype, expression, rounded)
        if self._depends(expression):
            self.dependent.add(name)
        if rounded and dtype == bf16:
            self._bf16_rounded.add(name)
        return name

    def _stored(self, dtype: DType, x: str) -> str:
        """The storage value of `x`: a bf16 temp already rounded is stored as its high half
        (`accy_bf16_bits`, the same bits), not converted a second time: a conversion issues at
        an eighth of the rate of a float operation, and a bf16 loop rounds every result it
        stores."""
        if dtype == bf16 and x in self._bf16_rounded:
            return f"accy_bf16_bits({x})"
        return CUDA.c_type(dtype).store.format(x=x)

    def index_temp(self, expression: str) -> str:
        # One name per expression, so that an index every lane computes alike (a clamped
        # gather row) is one name, and a load at it one vector rather than `width` scalars.
        if expression not in self._index_names:
            name = super().index_temp(expression)
            if self._depends(expression):
                self.dependent.add(name)
            self._index_names[expression] = name
        return self._index_names[expression]

    def element(self, v: int, view: StridedView, index: Index) -> str:
        scalar = super().element(v, view, index)
        if not self.vectors:
            return scalar
        itemsize = self.plan.program.type_of(v).dtype.itemsize
        if isinstance(index, Flat):
            pointer, offset = self.flat_pointer(view)
            if (
                index.var not in self.lanes
                or scalar != f"{pointer}[{flat_position(index.var, offset)}]"
            ):
                return scalar
            if view.offset * itemsize % chunk_bytes(self.width, itemsize):
                return scalar  # a vector at this offset would be misaligned
            base, k = self.lanes[index.var]
            return self._vector_element(v, pointer, flat_position(base, offset), k, itemsize)
        pointer = self.pointers[view.base]
        varying = [p for p, part in enumerate(index) if self._depends(part)]
        if len(varying) != 1 or index[varying[0]] not in self.lanes:
            return scalar
        p = varying[0]
        aligned = self._static_alignment(view.offset, view.strides, index, p, itemsize)
        if view.strides[p] != 1 or not aligned:
            return scalar
        base, k = self.lanes[index[p]]
        lane0 = index[:p] + (base,) + index[p + 1 :]
        offset = offset_expression(lane0, view.strides, view.offset)
        return self._vector_element(v, pointer, offset, k, itemsize)

    def _load(self, v: int, view: StridedView, index: Index) -> str:
        # A load every lane makes alike (a row's value broadcast along the lane axis) is made
        # once: stores in a lane body go to register arrays until the last lane, so no lane
        # writes memory that another lane's load reads.
        text = self.unit.c_type(self.plan.program.type_of(v).dtype).load.format(
            x=self.element(v, view, index)
        )
        if text not in self._loaded:
            self._loaded[text] = self.temp(self.plan.program.type_of(v).dtype, text, False)
        return self._loaded[text]

    def _static_alignment(self, offset: int, strides, index, p: int, itemsize: int) -> bool:
        chunk = chunk_bytes(self.width, itemsize)
        steps = [offset] + [s for q, s in enumerate(strides) if q != p and index[q] != "0"]
        return all(step * itemsize % chunk == 0 for step in steps)

    def _vector_element(self, v: int, pointer: str, offset: str, k: int, itemsize: int) -> str:
        key = (pointer, offset)
        if key not in self._loads:
            storage = CUDA.c_type(self.plan.program.type_of(v).dtype).storage
            vector = _Vector(self.unit.fresh("t"), pointer, offset, storage, itemsize)
            self._loads[key] = vector
            self.dependent.add(vector.name)
            self._require(pointer, chunk_bytes(self.width, itemsize))
            kind = vector_type(vector, self.width)
            self.lines.append(
                f"const {kind} {vector.name} = *(const {kind} *)({pointer} + {offset});"
            )
        return f"{self._loads[key].name}.v[{k}]"

    def _require(self, pointer: str, nbytes: int) -> None:
        self.alignment[pointer] = max(self.alignment.get(pointer, 1), nbytes)

    def store(self, dtype: DType, pointer: str, position: str, x: str) -> str:
        """The statement storing `x` at flat `position` of `pointer`: into a register array
        when `position` is a lane (`stores()` writes it out), else straight to memory."""
        value = self._stored(dtype, x)
        if position not in self.lanes:
            return f"{pointer}[{position}] = {value};"
        base, k = self.lanes[position]
        return self._into_vector(dtype, pointer, base, k, value)

    def store_element(self, dtype: DType, pointer: str, index, strides, x: str) -> str:
        """The statement storing `x` at `index` of a buffer of `strides` (a GEMM operand's
        packed layout): into a register array when only the lane axis varies and its stride is
        1 (every other step aligned to the vector), else straight to memory."""
        value = self._stored(dtype, x)
        scalar = f"{pointer}[{offset_expression(index, strides)}] = {value};"
        varying = [p for p, part in enumerate(index) if self._depends(part)]
        if not self.vectors or len(varying) != 1 or index[varying[0]] not in self.lanes:
            return scalar
        p = varying[0]
        if strides[p] != 1 or not self._static_alignment(0, strides, index, p, dtype.itemsize):
            return scalar
        base, k = self.lanes[index[p]]
        lane0 = offset_expression(index[:p] + (base,) + index[p + 1 :], strides)
        return self._into_vector(dtype, pointer, lane0, k, value)

    def _into_vector(self, dtype: DType, pointer: str, offset: str, k: int, value: str) -> str:
        key = (pointer, offset)
        if key not in self._stores:
            storage = CUDA.c_type(dtype).storage
            vector = _Vector(self.unit.fresh("t"), pointer, offset, storage, dtype.itemsize)
            self._stores[key] = vector
            self._require(pointer, chunk_bytes(self.width, dtype.itemsize))
            self.lines.append(f"{vector_type(vector, self.width)} {vector.name};")
        return f"{self._stores[key].name}.v[{k}] = {value};"

    def stores(self) -> list[str]:
        """The vector stores of every register array stored into (after the last lane)."""
        return [
            f"*({vector_type(v, self.width)} *)({v.pointer} + {v.offset}) = {v.name};"
            for v in self._stores.values()
        ]

    def pruned(self, lines: list[str]) -> list[str]:
        """`lines` without the declarations of lanes that nothing reads (every lane's load
        became an element of a vector)."""
        uses = Counter(IDENTIFIER.findall("\n".join(lines)))
        unused = {
            f"const int64_t {name} = {base} + {k};"
            for name, (base, k) in (self._retired_lanes | self.lanes).items()
            if uses[name] == 1
        }
        return [line for line in lines if line.strip() not in unused]  # in a branch: indented

    @property
    def vectorized(self) -> bool:
        """Whether any load or store became a vector transfer."""
        return bool(self._loads or self._stores)

    def aligned_condition(self) -> str:
        """C: whether every vector pointer is aligned as its transfers need."""
        tests = [f"((size_t){p} & {n - 1})" for p, n in self.alignment.items() if n > 1]
        return f"({' | '.join(tests)}) == 0" if tests else "true"
