"""Kernels as text: the module that collects them, their pointers, and thread indexing.

Every generated kernel has one signature,

    extern "C" __global__ void accy_kN(void *const *io, char *ws, char *scratch)

`io` is the plan's input/output table in the pointer pool (inputs, then outputs), `ws` the
plan's workspace and `scratch` the region where steps keep partial results. A kernel declares
only the pointers its statements use (`Pointers` records them), each `__restrict__`: a step
never writes a buffer it reads, except a result the plan writes in place of an input it reads
element for element (`Plan.in_place`), whose two pointers are plain.

Kernels are written once per distinct text. A *relocated* kernel (`Module.relocated`) reads
every buffer from a table of its own instead (`io[j]`: the j-th of the `LevelPointer`s its
launch lists), and its local names are numbered per kernel, so that the same computation on
other buffers (the next layer of a model) is the same text, declared once and launched with
another table: GPT-2's 12 layers make 79 kernels, not 801.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ...codegen.c.dialect import CUDA
from ...codegen.c.expressions import Unit, numbered_locally
from ...codegen.c.types import compute_values
from ...core.arrays import ConstantArray
from ...core.types import DType, TensorType
from ...lower.buffers import aligned
from ...lower.plan import Plan, Slot
from ...lower.views import row_major
from .schedule import Address

BLOCK = 256  # threads per block of every generated kernel
WARP = 32
MAX_BLOCKS = 132 * 32  # a grid-stride loop's grid: 32 blocks on each of the H200's 132 SMs
# Arrival counters of one-pass multi-block kernels (`Module.counters`): zero when uploaded, and
# left zero by every kernel that counts with them.
COUNTERS = 4096
SIGNATURE = "void *const *__restrict__ io, char *__restrict__ ws, char *__restrict__ scratch"
# A batched variant (`Module.batched`) gets the batch's table and the workspace's start instead.
BATCHED_SIGNATURE = (
    "const unsigned long long *__restrict__ accy_table, char *accy_workspace, "
    "char *__restrict__ scratch"
)
# Table: [n, first block of each member..., total, member tables..., member workspaces...].
BATCHED_PROLOGUE = """\
  const unsigned int accy_members = (unsigned int)accy_table[0];
  unsigned int accy_member = 0, accy_last = accy_members - 1;
  while (accy_member < accy_last) {
    const unsigned int accy_middle = (accy_member + accy_last + 1) / 2;
    if (accy_table[1 + accy_middle] <= blockIdx.x) accy_member = accy_middle;
    else accy_last = accy_middle - 1;
  }
  const unsigned int accy_first = (unsigned int)accy_table[1 + accy_member];
  const unsigned int accy_block = blockIdx.x - accy_first;
  const unsigned int accy_grid = (unsigned int)accy_table[2 + accy_member] - accy_first;
  void *const *__restrict__ io = (void *const *)accy_table[2 + accy_members + accy_member];
  char *__restrict__ ws = (char *)accy_table[2 + 2 * accy_members + accy_member];
  (void)accy_workspace;
"""


# The names a kernel's statements make for its own use: pointers `v<value>` and `o<n>`
# (`Pointers`) and temporaries `t<n>`, `j<n>` (`Unit.fresh`, numbered through the module).
# (Both patterns start with a character set rather than `\b` or an alternation, and say
# "not after a word character" with a lookbehind instead: then the regex engine skips to the
# candidate characters, 2-6x faster over the 4 MB of statements GPT-2's step renames.)
LOCAL_NAME = re.compile(r"([vtjo])(?<!\w[vtjo])(\d+)\b")
# A level-relative pointer in a kernel written for a plan: `((char *)io[k] + n)` (byte n of
# table entry k's buffer), `io[k]`, or `(ws + n)`.
LEVEL_POINTER = re.compile(
    r"[(i](?:(?<=\()\(char \*\)io\[(\d+)\] \+ (\d+)\)"
    r"|(?<=i)(?<!\wi)o\[(\d+)\]"
    r"|(?<=\()ws \+ (\d+)\))"
)


def _numbered_locally(body: str) -> str:
    """`body` with its local names numbered from 0 in order of first use, per family.

    >>> _numbered_locally("t12 = v40[i] + t9; v41[i] = t12;")
    't0 = v0[i] + t1; v1[i] = t0;'
    """
    return numbered_locally(body, LOCAL_NAME)


def _body(declaration: str) -> str:
    """The statements of a kernel's declaration (between its outer braces)."""
    return declaration[declaration.index("{\n") + 2 : declaration.rindex("}")]


class LevelPointer(NamedTuple):
    """One entry of a relocated kernel's table: entry `index` of the level's input/output table
    (`table`) and `offset` bytes into its buffer, or byte `index` of the level's workspace."""

    table: bool
    index: int
    offset: int = 0


@dataclass(frozen=True)
class Kernel:
    """A declared kernel and, when it is relocated, the pointers its launch's table lists, in
    order (None: it reads the level's own table, `io[k]`, and workspace, `ws`)."""

    name: str
    pointers: tuple[LevelPointer | Address, ...] | None = None


class Module(Unit):
    """The translation unit of one program: kernels, constants, and the scratch it needs.

    File-scope names start with `prefix`; programs with distinct prefixes can share one
    translation unit (the prelude is include-guarded).

    >>> module = Module()
    >>> module.kernel(["ws[0] = 1;"]).startswith("accy_k")
    True
    """

    def __init__(self, registry=None, prefix: str = "accy_"):
        super().__init__(CUDA, registry, prefix)
        self.kernel_names: list[str] = []
        self.kernel_comments: dict[str, str] = {}
        self.scratch_bytes = 0
        self.externals: dict[str, object] = {}
        self.plan_code: dict[int, Callable] = {}
        # Large constants, uploaded once into the workspace, just below the scratch region:
        # (bytes below scratch, elements in the compute type). `scratch` is the one pointer
        # every kernel has that does not move with the level it runs in (a scan body's `ws`
        # does), and counting down from it gives each constant its place as it is declared.
        self.constants: list[tuple[int, np.ndarray]] = []
        self.constant_bytes = 0
        # Copies of input views that library steps read at fixed addresses, made once per call
        # by the first step of the program's own plan that needs each (`stage_moving_buffers`):
        # (view base, element offset, elements, storage) -> bytes below scratch.
        self.staged_inputs: dict[tuple, int] = {}
        self._counters: str | None = None
        self.kernel_sources: dict[str, str] = {}  # name -> its declaration
        self._bodies: dict[str, str] = {}  # a kernel's body (locally numbered) -> its name
        self._batched: dict[str, str] = {}  # a kernel -> its batched variant's name

    def constant_data(self, name: str, values: ConstantArray) -> str:
        ctype = self.c_type(values.dtype)
        data = compute_values(values.array, ctype)
        self.constant_bytes += aligned(data.nbytes)
        self.constants.append((self.constant_bytes, data))
        return f"((const {ctype.compute} *)(scratch - {self.constant_bytes}))"

    def reserve_below_scratch(self, nbytes: int) -> int:
        """Reserve `nbytes` of the workspace below the scratch region, beside the constants
        but not filled when loaded; how many bytes below scratch they start.

        >>> module = Module()
        >>> module.reserve_below_scratch(10), module.reserve_below_scratch(300)
        (256, 768)
        """
        self.constant_bytes += aligned(nbytes)
        return self.constant_bytes

    def counters(self) -> str:
        """C: `COUNTERS` unsigned ints, zero when the workspace is set up, that a kernel whose
        blocks count their arrivals (the last one combines the others' partial values) uses
        and leaves zero again. One array for the module: such kernels also use the shared
        scratch region, so no two of them run at once (`schedule.batch_launches` orders them),
        and the address is the same text in every kernel (relocated kernels stay shared).

        >>> module = Module()
        >>> module.counters() == module.counters() == "((unsigned int *)(scratch - 16384))"
        True
        """
        if self._counters is None:
            data = np.zeros(COUNTERS, np.uint32)
            self.constant_bytes += aligned(data.nbytes)
            self.constants.append((self.constant_bytes, data))
            self._counters = f"((unsigned int *)(scratch - {self.constant_bytes}))"
        return self._counters

    def kernel(self, lines: list[str], comment: str = "") -> str:
        """Declare a kernel whose body is `lines` (unless one with the same body, up to the
        numbering of its local names, exists); return its name."""
        return self._declare("".join(f"  {line}\n" for line in lines), comment)

    def _declare(self, statements: str, comment: str) -> str:
        body = _numbered_locally(statements + "  (void)io;\n  (void)ws;\n  (void)scratch;\n")
        name = self._bodies.get(body)
        if name is not None:
            return name
        name = self._bodies[body] = self.fresh(f"{self.prefix}k")
        header = f"/* {comment} */\n" if comment else ""
        self.kernel_sources[name] = (
            f'{header}extern "C" __global__ void __launch_bounds__({BLOCK}) '
            f"{name}({SIGNATURE}) {{\n{body}}}"
        )
        self.kernel_names.append(name)
        self.kernel_comments[name] = comment
        return name

    def relocated(self, lines: list[str], comment: str = "") -> Kernel:
        """Declare a kernel whose body is `lines`, written for a plan's level (`io[k]`: entry
        k of the level's table, `(ws + n)`: byte n of its workspace), as one that reads each
        of those pointers from a table of its own; the kernel and the table's entries.

        >>> module = Module()
        >>> first = module.relocated(["float *v7 = (float *)(ws + 64); v7[0] = 1;"])
        >>> second = module.relocated(["float *v9 = (float *)((char *)io[2] + 16); v9[0] = 1;"])
        >>> first.name == second.name
        True
        >>> first.pointers
        (LevelPointer(table=False, index=64, offset=0),)
        >>> second.pointers
        (LevelPointer(table=True, index=2, offset=16),)
        """
        pointers: dict[LevelPointer, int] = {}

        def own_entry(match: re.Match) -> str:
            shifted, nbytes, entry, workspace = match.groups()
            if shifted is not None:
                pointer = LevelPointer(True, int(shifted), int(nbytes))
            elif entry is not None:
                pointer = LevelPointer(True, int(entry))
            else:
                pointer = LevelPointer(False, int(workspace))
            return f"((char *)io[{pointers.setdefault(pointer, len(pointers))}])"

        statements = LEVEL_POINTER.sub(own_entry, "".join(f"  {line}\n" for line in lines))
        return Kernel(self._declare(statements, comment), tuple(pointers))

    def batchable(self, name: str) -> bool:
        """Whether kernel `name` can have a batched variant (`batched`): it uses only the x
        dimension of its grid."""
        body = _body(self.kernel_sources[name])
        body = body.replace("blockIdx.x", "").replace("gridDim.x", "")
        return "blockIdx." not in body and "gridDim." not in body

    def batched(self, name: str) -> str:
        """Declare (once) the batched variant of kernel `name` (see `batchable`), for
        `schedule.Batched`; its name.

        The variant's prologue finds, from the block's index, the member launch the block
        belongs to in the batch's table (a binary search over the members' first blocks),
        and gives the kernel's unchanged body that member's table (`io`), workspace (`ws`),
        block index and grid size.

        >>> module = Module()
        >>> name = module.kernel(["for (int i = blockIdx.x; i < 9; i += gridDim.x) ws[i] = 1;"])
        >>> "accy_block" in module.kernel_sources[module.batched(name)]
        True
        """
        if name not in self._batched:
            body = _body(self.kernel_sources[name])
            body = body.replace("blockIdx.x", "accy_block").replace("gridDim.x", "accy_grid")
            variant = self._batched[name] = self.fresh(f"{name}_batch")
            comment = f"batched {self.kernel_comments.get(name, '')}".strip()
            self.kernel_sources[variant] = (
                f'/* {comment} */\nextern "C" __global__ void __launch_bounds__({BLOCK}) '
                f"{variant}({BATCHED_SIGNATURE}) {{\n{BATCHED_PROLOGUE}{body}}}"
            )
            self.kernel_names.append(variant)
            self.kernel_comments[variant] = comment
        return self._batched[name]

    @property
    def declarations_and_kernels(self) -> list[str]:
        """Every file-scope declaration, then every kernel, in the order declared."""
        return [*self.declarations, *self.kernel_sources.values()]

    def reserve_scratch(self, nbytes: int) -> None:
        """Make the scratch region at least `nbytes` (steps run one at a time and share it)."""
        self.scratch_bytes = max(self.scratch_bytes, nbytes)


class Pointers(dict):
    """Value -> C name of its pointer; remembers which names a kernel's statements used, and
    names pointers to an element of a stored value (`at`)."""

    def __init__(self, names: dict[int, str]):
        super().__init__(names)
        self.used: dict[int, None] = {}
        self.elements: dict[tuple[int, int], str] = {}  # (value, element offset) -> name

    def __getitem__(self, value: int) -> str:
        self.used[value] = None
        return super().__getitem__(value)

    def at(self, value: int, offset: int) -> str:
        """The name of a pointer to element `offset` of stored value `value`. Its address is
        worked out outside the kernel (a relocated kernel's table entry), so that kernels that
        differ only in where their views start are one kernel (a data-parallel optimizer's
        update of each parameter's slice of its gradient bucket)."""
        return self.elements.setdefault((value, offset), f"o{len(self.elements)}")


def slot_expression(plan: Plan, slot: Slot, nbytes: int = 0) -> str:
    """Where a slot's buffer starts (or byte `nbytes` of it), as a `char *`-compatible C
    expression in a kernel (`LEVEL_POINTER`'s forms)."""
    if slot.storage == "workspace":
        return f"(ws + {slot.index + nbytes})"
    entry = slot.index if slot.storage == "input" else len(plan.program.parameters) + slot.index
    return f"((char *)io[{entry}] + {nbytes})" if nbytes else f"(char *)io[{entry}]"


def pointer_declaration(plan: Plan, value: int, name: str, writable: bool, offset: int = 0) -> str:
    """The declaration of pointer `name` to `value`'s buffer (at element `offset`)."""
    storage = CUDA.c_type(plan.program.type_of(value).dtype).storage
    const = "" if writable else "const "
    restrict = "" if value in plan.in_place else "__restrict__ "
    nbytes = offset * plan.program.type_of(value).dtype.itemsize
    where = slot_expression(plan, plan.slots[value], nbytes)
    return f"{const}{storage} *{restrict}{name} = ({const}{storage} *){where};"


def indent(lines: list[str]) -> list[str]:
    """`lines` one level deeper (two spaces): the body of a loop or a branch."""
    return ["  " + line for line in lines]


def blocks_for(work_items: int, per_block: int = BLOCK) -> int:
    """Blocks for a grid-stride loop over `work_items` (at least one).

    >>> blocks_for(10), blocks_for(10**9)
    (1, 4224)
    """
    return max(1, min(math.ceil(work_items / per_block), MAX_BLOCKS))


def grid_stride(
    counter: str, count: int | str, per_block: int = BLOCK, lanes: int = 1, first: str = ""
) -> str:
    """The head of a grid-stride loop: `counter` runs over `count` items (a number, or a C
    expression), from item `first` (C; 0 by default), `per_block` items per block at a time (a
    group of `lanes` threads shares an item).

    >>> grid_stride("i", "n", per_block=1, first="s")
    'for (int64_t i = s + (int64_t)blockIdx.x * 1; i < n; i += (int64_t)gridDim.x * 1) {'
    """
    start = f"(int64_t)blockIdx.x * {per_block}"
    if per_block > 1:
        start += f" + threadIdx.x / {lanes}" if lanes > 1 else " + threadIdx.x"
    if first:
        start = f"{first} + {start}"
    stop = f"{count}LL" if isinstance(count, int) else count
    return (
        f"for (int64_t {counter} = {start}; {counter} < {stop}; "
        f"{counter} += (int64_t)gridDim.x * {per_block}) {{"
    )


def decompose(counter: str, extents: tuple[int, ...], names: tuple[str, ...]) -> list[str]:
    """Statements that split a row-major counter over `extents` into one index per axis.

    Axes of extent 1 have the literal name "0" and no statement. Below 2**31 elements the
    division is done in 32 bits (constant divisors become a multiply and a shift).

    >>> for line in decompose("o", (3, 1, 4), ("i0", "0", "i2")):
    ...     print(line)
    const unsigned int o_u = (unsigned int)o;
    const int64_t i0 = (int64_t)(o_u / 4u);
    const int64_t i2 = (int64_t)(o_u % 4u);
    """
    significant = [p for p, n in enumerate(extents) if n != 1]
    if not significant:
        return []
    wide = math.prod(extents) >= 2**31
    unsigned, suffix = ("uint64_t", "ull") if wide else ("unsigned int", "u")
    lines = [f"const {unsigned} {counter}_u = ({unsigned}){counter};"]
    strides = row_major(extents)
    for p in significant:
        part = f"{counter}_u"
        if strides[p] != 1:
            part = f"{part} / {strides[p]}{suffix}"
        if p != significant[0]:
            part = f"{part} % {extents[p]}{suffix}"
        lines.append(f"const int64_t {names[p]} = (int64_t)({part});")
    return lines


def axis_names(t: TensorType, prefix: str, positions=None) -> tuple[str, ...]:
    """Index names for the axes of `t` at `positions` (all by default); "0" for extent 1."""
    positions = range(t.rank) if positions is None else positions
    return tuple("0" if t.extents[p] == 1 else f"{prefix}{p}" for p in positions)


COMPUTE_BYTES = {"float": 4, "double": 8, "int32_t": 4, "int64_t": 8, "uint8_t": 1, "int": 4}


def compute_bytes(dtype: DType) -> int:
    """Bytes of one value of `dtype`'s compute type (partial results are kept in it)."""
    return COMPUTE_BYTES[CUDA.c_type(dtype).compute]
