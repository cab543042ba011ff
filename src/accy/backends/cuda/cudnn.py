"""What every cuDNN library step shares (fused attention, convolution): the lazy import of the
frontend, the process's handle per GPU, cuDNN's warnings logged rather than raised in the caller,
and a cache of built graphs with the reasons cuDNN declined a problem.

A step that cannot run on cuDNN raises `Decline`; its custom call then runs as its composition,
and the reason is kept for `Graphs.reasons()`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import warnings
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...caches import Group
from ...codegen.cache import cache_root
from ...config import config

log = logging.getLogger("accy.cudnn")

ALIGN = 256  # bytes: every buffer a cuDNN step places in its scratch starts at such a boundary


class Decline(Exception):
    """This call cannot run on cuDNN; the message says why (the composition runs instead)."""


@contextlib.contextmanager
def warnings_logged(what: str) -> Iterator[None]:
    """cuDNN's own warnings (deprecations, ...) are logged, not raised in the caller.

    >>> with warnings_logged("a doctest"):
    ...     warnings.warn("deprecated", DeprecationWarning)
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for warning in caught:
        log.info("%s: warning from cuDNN: %s", what, warning.message)


def module() -> Any:
    """The `cudnn` frontend module, or `Decline` saying how to install it."""
    try:
        with warnings_logged("import cudnn"):
            import cudnn
    except Exception as error:  # ImportError, or a libcudnn that fails to load
        raise Decline(
            f"cannot import cudnn (pip install nvidia-cudnn-frontend nvidia-cudnn-cu13): {error}"
        ) from None
    compiled_kernels_in_accys_cache(cudnn)
    return cudnn


COMPILED_CACHE_VARIABLE = "CUDNN_FRONTEND_COMPILED_CACHE"


def compiled_kernels_in_accys_cache(cudnn: Any) -> Path | None:
    """Keep the kernels the cuDNN frontend compiles itself (its FROST engines, compiled with
    the CuTe DSL: about 2 s for GPT-2's attention forward and backward on an H200, a few
    milliseconds to load once stored) in the "cudnn" folder of accy's disk cache, unless
    `$CUDNN_FRONTEND_COMPILED_CACHE` chooses a folder: one cache to clear or move, and a start
    with an empty `$ACCY_CACHE_DIR` is cold for cuDNN too. The folder, or None where the
    variable is set or the frontend has no such cache.

    >>> import types
    >>> seen = []
    >>> fake = types.SimpleNamespace(frost=types.SimpleNamespace(
    ...     compiled_cache=types.SimpleNamespace(set_cache_dir=seen.append)))
    >>> import accy
    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> with accy.config.override(cache_dir=root):
    ...     folder = compiled_kernels_in_accys_cache(fake)
    >>> seen == [folder] and str(folder) == root + "/cudnn" and folder.is_dir()
    True
    """
    if config.environment(COMPILED_CACHE_VARIABLE):
        return None
    setter = getattr(
        getattr(getattr(cudnn, "frost", None), "compiled_cache", None), "set_cache_dir", None
    )
    if setter is None:
        try:  # the frontend imports its FROST package lazily
            from cudnn.frost import compiled_cache  # type: ignore[import-not-found]

            setter = compiled_cache.set_cache_dir
        except Exception:  # an older frontend, without FROST engines: nothing to point
            return None
    folder = cache_root() / "cudnn"
    try:
        folder.mkdir(parents=True, exist_ok=True)  # (the frontend expects its folder to exist)
        setter(folder)
    except Exception as error:  # its own default then: never a reason to decline
        log.info("cuDNN's compiled-kernel cache stays at its default: %s", error)
        return None
    return folder


@functools.cache  # not a cache: the one handle per GPU, which built graphs keep using
def handle(ordinal: int = 0) -> Any:
    """The process's cuDNN handle on GPU `ordinal` (made on first use)."""
    cudnn = module()
    try:
        import cupy
    except ImportError as error:
        raise Decline(f"cannot import cupy: {error}") from None
    with cupy.cuda.Device(ordinal):
        made = cudnn.create_handle()
    log.info("cuDNN handle made on GPU %d; cuDNN backend %s", ordinal, cudnn.backend_version())
    return made


def bind(stream: int, ordinal: int = 0) -> None:
    """Direct the handle's following work to `stream` (before any capture begins)."""
    module().set_stream(handle(ordinal), int(stream))


@dataclass
class Built:
    """A built cuDNN graph, its tensors by name, and its workspace size in bytes."""

    graph: Any
    tensors: dict[str, Any]
    workspace: int


# Every Graphs' built graphs, by problem (accy.clear_caches() empties them).
BUILT = Group("cudnn graphs", "kernels_max_entries")


class Graphs:
    """The graphs of one kind of cuDNN step (`what`: "attention", "conv"), built by
    `build(problem)` on first use and cached per problem, and the reasons cuDNN declined.

    >>> graphs = Graphs("demo", lambda problem: Built(None, {}, problem))
    >>> first = graphs.built(64, "a problem")
    >>> first.workspace, graphs.built(64, "the same problem") is first
    (64, True)
    >>> graphs.decline("a call", "too large"); graphs.reasons()
    {'a call': 'too large'}
    """

    def __init__(self, what: str, build: Callable[[Any], Built]):
        self.what, self.build = what, build
        self._lock = threading.Lock()
        self._built = BUILT.table()
        self._reasons: dict[str, str] = {}

    def built(self, problem: Hashable, summary: str) -> Built:
        """The built graph of `problem` (built on first use, then cached), or `Decline` with
        cuDNN's reason when it does not support it."""
        with self._lock:
            done = self._built.get(problem)
        if done is None:
            with warnings_logged(f"cuDNN {self.what} {summary}"):
                done = self.build(problem)
            with self._lock:
                self._built.put(problem, done)
        return done

    def decline(self, where: str, reason: str) -> None:
        """Remember that cuDNN declined the call at `where`, and why."""
        log.info("cuDNN %s declines %s: %s", self.what, where, reason)
        with self._lock:
            self._reasons[where] = reason

    def reasons(self) -> dict[str, str]:
        """Why cuDNN declined, per call, since the process started."""
        with self._lock:
            return dict(self._reasons)
