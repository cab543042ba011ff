"""Artifacts of `compile_fragment` loaded as executables (`Fragment`) and run on raw buffers:
`load_fragment`, `invoke`, `prepare_invocation`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backends.base import Bindings, Executable, native_backend_for
from ..errors import AccyError

Fragment = Executable
"""A loaded program (the fragment API's name for an executable)."""


def load_fragment(handle: Any, compiled: Any, options: Any = None) -> Executable:
    """Load an artifact of `accy.compat.lower.compile_fragment`; a "cuda_c" one on the GPU of
    `handle` (`accy.compat.gpu.cuda.State`). `options`, the compiler's, is taken as the fragment
    API takes it: the artifact already says its format.

    >>> import accy
    >>> from accy.compat.gpu.cpu import State
    >>> from accy.compat.lower import compile_fragment
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> handle = State().handle()
    >>> load_fragment(handle, compile_fragment(handle, p)).output_count()
    1
    >>> load_fragment(handle, p)
    Traceback (most recent call last):
    accy.errors.AccyError: load_fragment: Program is not a CPU or CUDA artifact; ...
    """
    artifact_format = getattr(compiled, "artifact_format", None)
    if artifact_format is None:
        raise AccyError(
            f"load_fragment: {type(compiled).__name__} is not a CPU or CUDA artifact; compile "
            f"it with FragmentCompilerOptions(artifact_format='cpu_object' or 'cuda_c')"
        )
    return native_backend_for(artifact_format).load(compiled, getattr(handle, "ordinal", 0))


def invoke(fragment: Executable, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    """Check the buffers, then run the program once, writing every output.

    >>> import accy, numpy as np
    >>> from accy.compat.lower import compile_fragment
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> fragment = load_fragment(None, compile_fragment(None, p))
    >>> out = np.zeros(2, np.float32)
    >>> invoke(fragment, [np.array([1, 2], np.float32)], [out])
    >>> out.tolist()
    [2.0, 4.0]
    """
    fragment.run_buffers(inputs, outputs)


def prepare_invocation(fragment: Executable, inputs: Sequence[Any]) -> Bindings:
    """Check and bind `inputs`; the returned bindings `launch()` and `read_output(i, buffer)`.

    >>> import accy, numpy as np
    >>> from accy.compat.lower import compile_fragment
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> fragment = load_fragment(None, compile_fragment(None, p))
    >>> bindings = prepare_invocation(fragment, [np.ones(2, np.float32)])
    >>> bindings.launch()
    >>> out = bytearray(8)
    >>> bindings.read_output(0, out)
    >>> np.frombuffer(out, np.float32).tolist()
    [2.0, 2.0]
    """
    return fragment.bind(inputs)


__all__ = ["Bindings", "Fragment", "invoke", "load_fragment", "prepare_invocation"]
