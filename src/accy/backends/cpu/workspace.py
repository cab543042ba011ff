"""A program's workspace: one aligned, zero-filled block of its intermediates' bytes.

A fresh block costs its first run the kernel's page faults (zeroing, and for NumPy's
huge-page blocks maybe a compaction): for block's 60 MiB workspace 0.04-0.1 s, a third of a
step. `Prefaulted` allocates and touches the block in a thread while the C compiler builds the
program, so that the first run starts on memory already mapped.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from ...lower.buffers import ALIGNMENT

PREFAULT_BYTES = 1 << 22
"""The smallest workspace faulted in ahead (smaller ones fault in within microseconds)."""


def aligned_workspace(nbytes: int, touched: bool = False) -> tuple[np.ndarray, int]:
    """A zero-filled block of `nbytes` bytes and its first `ALIGNMENT`-aligned address; with
    `touched`, every page is written (mapped now rather than at first use).

    >>> block, address = aligned_workspace(100, touched=True)
    >>> address % 64 == 0 and block.nbytes >= 100 and not block.any()
    True
    """
    raw = np.zeros(nbytes + ALIGNMENT, dtype=np.uint8)
    address = raw.__array_interface__["data"][0]
    if touched:
        # Through ctypes, which releases the GIL while the kernel maps the pages.
        ctypes.memset(address, 0, raw.nbytes)
    return raw, address + (-address % ALIGNMENT)


class Prefaulted:
    """A workspace of `nbytes` being allocated and touched in a daemon thread; `take()` waits
    for it and hands it out once (later callers allocate their own).

    >>> ahead = Prefaulted(1 << 20)
    >>> block, address = ahead.take()
    >>> block.nbytes >= 1 << 20, ahead.take() is None
    (True, True)
    """

    def __init__(self, nbytes: int) -> None:
        self._nbytes = nbytes
        self._block: tuple[np.ndarray, int] | None = None
        self._lock = threading.Lock()
        self._taken = False
        self._thread = threading.Thread(target=self._fill, name="accy-workspace", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        try:
            self._block = aligned_workspace(self._nbytes, touched=True)
        except MemoryError:  # the caller's own allocation reports it where it can be handled
            self._block = None

    def take(self) -> tuple[np.ndarray, int] | None:
        """The block, the first time (after the thread is done); None after that."""
        with self._lock:
            if self._taken:
                return None
            self._taken = True
        self._thread.join()
        block, self._block = self._block, None
        return block


def prefault(nbytes: int) -> Prefaulted | None:
    """A `Prefaulted` workspace of `nbytes`, or None where it is too small to be worth a thread.

    >>> prefault(64) is None, prefault(PREFAULT_BYTES) is not None
    (True, True)
    """
    return Prefaulted(nbytes) if nbytes >= PREFAULT_BYTES else None


__all__ = ["PREFAULT_BYTES", "Prefaulted", "aligned_workspace", "prefault"]
