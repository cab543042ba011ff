"""Kernels written by hand in the shared C dialect, bound to a custom call like a DSL kernel.

The kernel DSL cannot express every kernel (blocked loops with scratch arrays, several passes,
OpenMP): `c_kernel_call` takes a C function written in the `GCC` dialect (after its prelude:
`int64_t`, `INFINITY`, `expf`, `accy_bf16_load`, ... are there) and makes the same `KernelCall`
that `Program.create_kernel_call_artifact` makes, so the CPU backend links it through the one
contract (`call.py`): include `c_source` once, call `symbol(dst, operands...)`.

The author of such a kernel takes on what the DSL otherwise guarantees: it touches at most the
elements of each parameter given here (the backend checks the call's types against them), and
writes every element of `dst`. The source is checked by the C compiler when the call is made.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..codegen.c.dialect import GCC
from ..core.types import TensorType
from .call import KernelCall
from .errors import KernelError
from .ir import RESULT
from .toolchain import check_c_source


def c_kernel_call(
    *,
    target: str,
    version: int,
    symbol: str,
    parameters: Sequence[tuple[str, TensorType]],
    source: str,
) -> KernelCall:
    """A CPU `KernelCall` of custom call `(target, version)` from hand-written C `source`,
    which defines `void symbol(...)` taking one pointer per parameter, in order (`dst`, the
    result, first; `const` on the others), each of the storage type of its dtype.

    >>> import accy, numpy as np
    >>> lane = accy.spec(accy.f32, lane=4)
    >>> call = c_kernel_call(
    ...     target="doc.triple", version=1, symbol="doc_triple",
    ...     parameters=[("dst", lane), ("x", lane)],
    ...     source="void doc_triple(float *p_dst, const float *p_x) {"
    ...            " for (int i = 0; i < 4; ++i) p_dst[i] = 3 * p_x[i]; }")
    >>> call.run_on_cpu([np.arange(4, dtype=np.float32)]).tolist()
    [0.0, 3.0, 6.0, 9.0]
    """
    names = [name for name, _ in parameters]
    if not names or names[0] != RESULT or names.count(RESULT) != 1:
        raise KernelError(
            f"hand-written kernel {symbol!r} for {target!r}: its parameters must start with "
            f"{RESULT!r} (the result) and name it once, got {names}"
        )
    if f"{symbol}(" not in source:
        raise KernelError(f"hand-written kernel for {target!r}: its source defines no {symbol!r}")
    c_source = f"{GCC.prelude.strip()}\n\n{source.strip()}\n"
    check_c_source(c_source, f"hand-written kernel {symbol!r} for custom_call {target!r}")
    storage = ", ".join(
        f"{'' if name == RESULT else 'const '}{GCC.c_type(t.dtype).storage}* p_{name}"
        for name, t in parameters
    )
    return KernelCall(
        target=target,
        version=version,
        symbol=symbol,
        kernel_name=symbol,
        parameters=tuple((name, t.dtype) for name, t in parameters),
        written=(RESULT,),
        extents=tuple((name, t.size) for name, t in parameters),
        c_source=c_source,
        cuda_source="",
        format="cpu_object",
        c_signature=f"void {symbol}({storage})",
    )
