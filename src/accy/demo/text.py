"""Byte-level text from the Python standard library's source files, the corpus of
`accy demo --preset`: tokens are bytes (vocab 256), every Python ships the text.

The `*.py` files under the standard library's folder (`sysconfig.get_paths()["stdlib"]`,
site-packages excluded) are sorted by path; every tenth file (the 10th, 20th, ...) is held out,
so the held-out text is whole files the model never trains on, and the split is the same on
every run. A batch is `batch` random contiguous windows of one split's bytes.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import AccyError

VOCAB = 256
HELD_OUT_EVERY = 10


def stdlib_root() -> Path:
    """The standard library's folder of this Python."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list[Path]:
    """The `*.py` files under `root`, sorted by path, without installed packages."""
    skip = {"site-packages", "dist-packages", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


def split_files(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(training files, held-out files): every `HELD_OUT_EVERY`-th file is held out.

    >>> split_files([Path(str(i)) for i in range(20)])[1]
    [PosixPath('9'), PosixPath('19')]
    """
    held = [f for i, f in enumerate(files) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    return [f for i, f in enumerate(files) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1], held


@dataclass(frozen=True)
class ByteText:
    """The training and held-out bytes, each its files concatenated in order."""

    train: np.ndarray
    held_out: np.ndarray
    train_files: tuple[str, ...]
    held_out_files: tuple[str, ...]

    @classmethod
    def load(cls, root: Path | None = None, max_bytes: int | None = None) -> ByteText:
        """The corpus under `root` (default: the standard library); `max_bytes` caps each
        split (its first files), for quick runs."""
        root = stdlib_root() if root is None else Path(root)
        train, held = split_files(source_files(root))
        if not train or not held:
            raise AccyError(
                f"the text corpus under {root} has {len(train) + len(held)} *.py files; the "
                f"demo needs at least {HELD_OUT_EVERY} (one held out per {HELD_OUT_EVERY})"
            )
        return cls(
            _concatenate(train, max_bytes),
            _concatenate(held, max_bytes),
            tuple(str(p.relative_to(root)) for p in train),
            tuple(str(p.relative_to(root)) for p in held),
        )

    def batch(self, rng: np.random.Generator, size: int, tokens: int, held_out: bool = False):
        """(ids, targets), int32 {batch, token}: `size` random windows of `tokens` + 1 bytes
        of one split, the targets shifted by one."""
        data = self.held_out if held_out else self.train
        if len(data) <= tokens + 1:
            raise AccyError(
                f"the {'held-out' if held_out else 'training'} text has {len(data)} bytes, "
                f"fewer than one window of {tokens + 1}; use a shorter context or more text"
            )
        starts = rng.integers(0, len(data) - tokens - 1, size)
        windows = np.stack([data[s : s + tokens + 1] for s in starts]).astype(np.int32)
        return windows[:, :-1].copy(), windows[:, 1:].copy()


def _concatenate(files: list[Path], max_bytes: int | None) -> np.ndarray:
    chunks, total = [], 0
    for path in files:
        chunks.append(path.read_bytes())
        total += len(chunks[-1])
        if max_bytes is not None and total >= max_bytes:
            break
    data = np.frombuffer(b"".join(chunks), np.uint8)
    return data[:max_bytes] if max_bytes is not None else data
