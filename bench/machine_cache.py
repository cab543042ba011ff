"""What accy builds once per machine, kept in the bench's otherwise empty disk caches.

A cold first call starts from an empty `ACCY_CACHE_DIR`, so that every program of the workload
is generated and compiled. accy's AVX-512 GEMM library (`accy.backends.cpu.gemm`, the cache's
`gemm` folder) is not such a program: it depends on no program, is built once per machine and
cache (about 0.2 s of a core), and stands where an installed BLAS stands for the peers, whose
libraries are not built in their first calls either. The harness builds it once per run, in a
folder of its own, and copies that folder into each empty cache (`seed`).

>>> import tempfile
>>> from pathlib import Path
>>> cache = Path(tempfile.mkdtemp()) / "accy-cache"
>>> seed(cache)
>>> cache.is_dir()
True
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import accy

NAMESPACES = ("gemm",)
"""The cache folders that hold per-machine libraries rather than programs."""


@functools.cache
def machine_folder() -> Path | None:
    """A cache root holding the per-machine libraries, built once per harness process (None
    where accy builds none on this CPU); removed when the harness exits."""
    from accy.backends.cpu import gemm

    folder = Path(tempfile.mkdtemp(prefix="bench-accy-machine-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    with accy.config.override(cache_dir=str(folder)):
        try:
            built = gemm.prepare_library()
        except accy.AccyError:  # no compiler, or it failed: the workers report it themselves
            built = False
    return folder if built else None


def seed(cache: Path) -> None:
    """Make `cache` (a new, empty accy cache root) and copy the per-machine libraries into it."""
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    machine = machine_folder()
    for namespace in NAMESPACES if machine is not None else ():
        if (machine / namespace).is_dir():
            shutil.copytree(machine / namespace, cache / namespace, dirs_exist_ok=True)
