"""The disk cache of built shared libraries: one implementation for every backend.

A `Cache` has a namespace (`"cpu"`, `"kernel"`) and keeps the entry of a key at
`<root>/<namespace>/<key[:2]>/<key><suffix>`, beside `<key>.sha256`. The root is
`$ACCY_CACHE_DIR`, or `~/.cache/accy`. The key is a sha256 (`key()`) of everything the library
depends on; the caller chooses what that is.

Trust. An entry is used only when `<key>.sha256` holds the sha256 of the key, a zero byte and the
library's bytes (`entry_digest`): an entry copied from another key (library and digest together),
truncated or altered is rebuilt, never loaded. Library and digest are read only when they are
regular files (opened with `O_NOFOLLOW` and without blocking) of bounded size
(`MAX_ENTRY_BYTES`): a link to /dev/zero, a FIFO or a huge file is no entry, rebuilt unread. The
root, the namespace folder and every folder
accy creates for the cache must be folders owned by the current user that neither its group nor
others can write. Where they are not, or cannot be created, libraries are built into a private
folder from `tempfile.mkdtemp` (removed when the process exits) and a `CacheWarning` says so.

Writing. A build runs in a temporary folder beside its entry, removed whatever happens (a
compiler error or `KeyboardInterrupt` included), and its library is moved into place with
`os.replace`; a lock file per key makes a second process wait for the first one's build rather
than repeat it. A cache folder that cannot be written (read-only, disk full) or whose libraries
cannot be loaded (mounted noexec) gives the same fallback to a private folder, with a warning;
so does a compiler that runs out of space (its "No space left on device" is that, not a bug). An
entry that another process evicts between its check and its opening is built again in the cache.

Housekeeping. The first time a process uses a cache folder it removes lock files and temporaries
older than `STALE_SECONDS` (left by a process that was killed). The folder is kept under
`$ACCY_CACHE_MAX_BYTES` bytes (default 2 GiB) by deleting the least recently used entries after
a build. Each hit sets its library's modification time, which is what "recently used" means
here (access times are often not recorded). Deleting an entry that another process has loaded
is safe (Linux keeps a loaded library mapped); the entry just built, and any entry whose lock is
held (being built), is never deleted.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from ..config import config
from ..errors import CacheWarning, CompileError, RuntimeUnavailable

T = TypeVar("T")

STALE_SECONDS = 3600.0
DIGEST_SUFFIX = ".sha256"
LOCK_SUFFIX = ".lock"
TEMPORARY_SUFFIX = ".tmp"
MAX_ENTRY_BYTES = 1024**3
"""The largest library an entry may hold: a larger file is not an entry (it is rebuilt)."""
DIGEST_BYTES = 256
EVICTED_RETRIES = 3
"""How many times `load` builds an entry again that another process deleted before it opened."""
ADVICE = (
    "set ACCY_CACHE_DIR to a folder that you own and only you can write, with free space, on a "
    "file system that allows executing programs (not mounted noexec)"
)


def cache_root() -> Path:
    """The folder under which every namespace keeps its entries: `accy.config.cache_dir`
    (`$ACCY_CACHE_DIR`), or `~/.cache/accy`.

    >>> import accy
    >>> with accy.config.override(cache_dir="/tmp/accy-example"):
    ...     cache_root()
    PosixPath('/tmp/accy-example')
    """
    configured = config.cache_dir
    return Path(configured or os.path.join(os.path.expanduser("~"), ".cache", "accy"))


def max_bytes() -> int:
    """The size bound of a cache folder: `accy.config.cache_max_bytes`
    (`$ACCY_CACHE_MAX_BYTES`, 2 GiB by default).

    >>> import accy
    >>> max_bytes() == accy.config.cache_max_bytes
    True
    """
    return config.cache_max_bytes


def key(*parts: str | bytes) -> str:
    """The sha256 (hex) of `parts`, each followed by a zero byte: the name of a cache entry.

    >>> key("a", "bc") != key("ab", "c")
    True
    >>> len(key("int x;"))
    64
    """
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()


def file_identity(path: str) -> str:
    """An identity of the file at `path` that changes when the file does: its resolved path,
    size and modification time (learnt without starting a process).

    >>> import sys
    >>> file_identity(sys.executable).startswith(os.path.realpath(sys.executable) + ":")
    True
    """
    real = os.path.realpath(path)
    info = os.stat(real)
    return f"{real}:{info.st_size}:{info.st_mtime_ns}"


def entry_digest(entry_key: str, library: bytes) -> str:
    """What `<key>.sha256` holds: the sha256 of the key, a zero byte and the library's bytes,
    which binds an entry to its key.

    >>> import hashlib
    >>> entry_digest("k", b"lib") == hashlib.sha256(b"k\\0lib").hexdigest()
    True
    """
    digest = hashlib.sha256(entry_key.encode())
    digest.update(b"\0")
    digest.update(library)
    return digest.hexdigest()


def _key_of(library: Path) -> str:
    # Keys are hex digits: everything before the first dot of the file's name.
    return library.name.split(".", 1)[0]


def read_entry_file(path: Path, limit: int) -> bytes | None:
    """The bytes of `path` when it is a regular file of at most `limit` bytes, else None: a
    link (not followed: `O_NOFOLLOW`, so a link to /dev/zero cannot exhaust memory), a FIFO
    (opened without blocking, so it cannot hang), a device, a folder, a file too large or one
    that cannot be read.

    >>> read_entry_file(Path("/dev/zero"), 1024) is None
    True
    """
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        chunks, left = [], info.st_size
        while left > 0:  # at most the size fstat gave: a file growing meanwhile stays bounded
            chunk = os.read(handle, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(handle)


def is_valid(library: Path) -> bool:
    """Whether `library` is a complete entry whose digest matches its key and bytes (both
    regular files, neither larger than an entry may be: `read_entry_file`).

    >>> is_valid(Path("/nonexistent/0123.so"))
    False
    """
    entry_key = _key_of(library)
    recorded = read_entry_file(library.with_name(entry_key + DIGEST_SUFFIX), DIGEST_BYTES)
    if recorded is None:
        return False
    data = read_entry_file(library, MAX_ENTRY_BYTES)
    if data is None:
        return False
    return recorded.decode("ascii", "replace").strip() == entry_digest(entry_key, data)


def out_of_space(message: str) -> bool:
    """Whether a tool's error `message` says that the disk (or the user's quota) is full: the
    compiler's way of reporting ENOSPC, which is a folder that cannot be written, not a bug.

    >>> out_of_space("/usr/bin/ld: final link failed: No space left on device")
    True
    """
    return any(os.strerror(code) in message for code in (errno.ENOSPC, errno.EDQUOT))


def discard(library: Path) -> None:
    """Remove the entry of `library` (library and digest), so that the next build replaces it;
    a folder that cannot be written is left as it is.

    >>> discard(Path("/nonexistent/0123.so"))
    """
    for path in (library, library.with_name(_key_of(library) + DIGEST_SUFFIX)):
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def write_file(path: Path, data: bytes) -> None:
    """Write `data` to `path` under a temporary name beside it, then rename it into place; the
    temporary file is removed if anything fails.

    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "example"
    >>> write_file(target, b"hello")
    >>> target.read_bytes()
    b'hello'
    """
    handle, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=path.name + ".", suffix=TEMPORARY_SUFFIX
    )
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(handle, view) :]
        finally:
            os.close(handle)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


class _UnsafeFolder(OSError):
    """A cache folder that another user could write into."""


def _check_private(folder: Path) -> None:
    info = os.stat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise _UnsafeFolder(f"{folder} is not a folder")
    if info.st_uid != os.getuid():
        raise _UnsafeFolder(
            f"{folder} is owned by user id {info.st_uid}, not by this user ({os.getuid()})"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _UnsafeFolder(
            f"{folder} can be written by its group or by others (mode {info.st_mode & 0o777:o})"
        )


def _make_private_folder(folder: Path, checked_from: Path) -> None:
    """Create `folder` and its missing parents (mode 0700); check that each folder created, and
    each from `checked_from` down to `folder`, is the user's own and only the user's to write.
    Raises `_UnsafeFolder` (an OSError) for one that is not, before anything is made in it."""
    above = []  # missing parents of `checked_from`: accy creates them, so they are checked too
    current = checked_from.parent
    while not os.path.lexists(current) and current != current.parent:
        above.append(current)
        current = current.parent
    chain = [*reversed(above), checked_from]
    for part in folder.relative_to(checked_from).parts:
        chain.append(chain[-1] / part)
    for each in chain:
        if not os.path.lexists(each):
            with contextlib.suppress(FileExistsError):  # another process made it first: checked
                os.mkdir(each, 0o700)
        _check_private(each)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # releases the lock


def _is_locked(lock: Path) -> bool:
    """Whether another open file holds `lock` (an entry being built); False if it is absent."""
    try:
        handle = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(handle)
    return False


def _entry_folders(folder: Path) -> Iterator[Path]:
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if len(entry.name) == 2 and entry.is_dir(follow_symlinks=False):
                yield Path(entry.path)


def _clean(folder: Path) -> int:
    """Remove temporaries and unheld lock files older than `STALE_SECONDS` under `folder`;
    return the bytes its entries take."""
    total = 0
    now = time.time()
    for entry_folder in _entry_folders(folder):
        with contextlib.suppress(OSError), os.scandir(entry_folder) as entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                stale = now - info.st_mtime > STALE_SECONDS
                path = Path(entry.path)
                if entry.name.endswith(TEMPORARY_SUFFIX):
                    if stale:
                        _remove(path)
                elif entry.name.endswith(LOCK_SUFFIX):
                    # A process that waits on a lock removed here makes a new one and may build
                    # at the same time as another: both results are complete, either is kept.
                    if stale and not _is_locked(path):
                        _remove(path)
                else:
                    total += info.st_size
    return total


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _evict(folder: Path, limit: int, keep: Path) -> int:
    """Delete least recently used entries under `folder` until they take at most `limit` bytes,
    never `keep` nor an entry whose lock is held; return the bytes left."""
    entries: dict[Path, list] = {}  # a key's path stem -> [last use, bytes, files]
    for entry_folder in _entry_folders(folder):
        with contextlib.suppress(OSError), os.scandir(entry_folder) as listing:
            for entry in listing:
                if entry.name.endswith((TEMPORARY_SUFFIX, LOCK_SUFFIX)):
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                stem = Path(entry_folder, _key_of(Path(entry.name)))
                record = entries.setdefault(stem, [0.0, 0, []])
                if not entry.name.endswith(DIGEST_SUFFIX):  # the library's time is the use
                    record[0] = info.st_mtime
                record[1] += info.st_size
                record[2].append(Path(entry.path))
    total = sum(size for _, size, _ in entries.values())
    for stem, (_, size, files) in sorted(entries.items(), key=lambda item: item[1][0]):
        if total <= limit:
            break
        if keep in files or _is_locked(stem.with_name(stem.name + LOCK_SUFFIX)):
            continue
        for path in files:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        total -= size
    return total


class _Folder:
    """A folder of entries: a namespace's folder in the cache, or a private one."""

    def __init__(self, path: Path, private: bool, used_bytes: int = 0):
        self.path = path
        self.private = private
        self.used_bytes = used_bytes  # what this process knows of; other processes add more
        self.warned = False

    def entry_folder(self, entry_key: str) -> Path:
        folder = self.path / entry_key[:2]
        _make_private_folder(folder, self.path)
        return folder


class Cache:
    """The built libraries of one namespace, in the disk cache (see the module's docstring),
    under `root`, or `cache_root()` (read at each use) when `root` is None.

    `compile(output)` builds a library at `output` (a path in a temporary folder of its own,
    which it may use for other files, such as its source) and raises `CompileError` if it
    cannot.

    >>> import tempfile
    >>> cache = Cache("example", root=Path(tempfile.mkdtemp()))
    >>> def compile(output):
    ...     output.write_bytes(b"a library")
    >>> library = cache.build(key("example source"), compile)
    >>> library.read_bytes(), is_valid(library), library.parents[1] == cache.folder()
    (b'a library', True, True)
    """

    def __init__(self, namespace: str, suffix: str = ".so", root: Path | None = None):
        self.namespace = namespace
        self.suffix = suffix
        self.root = root
        self._lock = threading.RLock()
        self._folders: dict[Path, _Folder] = {}  # by root: $ACCY_CACHE_DIR may change
        self._private: _Folder | None = None
        self._unloadable: set[Path] = set()  # folders whose libraries could not be loaded

    def folder(self) -> Path:
        """The folder where new entries go: `<root>/<namespace>`, or a private temporary
        folder where that one cannot be used.

        >>> import tempfile
        >>> Cache("example", root=Path(tempfile.mkdtemp())).folder().name
        'example'
        """
        return self._current().path

    def build(self, entry_key: str, compile: Callable[[Path], None]) -> Path:
        """The path of the library of `entry_key`: a valid entry of the cache, else one built
        by `compile` (into a private folder, with a `CacheWarning`, where the cache cannot be
        written)."""
        folder = self._current()
        try:
            return self._build_in(folder, entry_key, compile)
        except OSError as error:
            if folder.private:
                raise self._cannot_store(folder, error) from error
            if not folder.warned:
                folder.warned = True
                self._warn(
                    f"cannot write into the compile cache folder {folder.path} ({error}); "
                    f"building into a private temporary folder instead. To keep built "
                    f"libraries between runs, {ADVICE}"
                )
        private = self._private_folder()
        try:
            return self._build_in(private, entry_key, compile)
        except OSError as error:
            raise self._cannot_store(private, error) from error

    def load(
        self, entry_key: str, compile: Callable[[Path], None], open_library: Callable[[Path], T]
    ) -> T:
        """`open_library` of the library of `entry_key` (from `build`). An entry that another
        process deleted (evicted) before it could be opened is built again in the cache. A
        library that cannot be opened (OSError: not loadable there; AttributeError: a symbol is
        missing) is built
        again into a fresh private folder, with a `CacheWarning`, and opened from there: a
        loaded library is never replaced under its own path, where the loader would return the
        one it has."""
        library = self.build(entry_key, compile)
        for rebuilds_left in range(EVICTED_RETRIES, -1, -1):
            try:
                return open_library(library)
            except (OSError, AttributeError) as error:
                failure = error
            if not rebuilds_left or isinstance(failure, AttributeError):
                break
            if os.path.lexists(library):
                break
            # Another process evicted the entry between its check and its opening: build that
            # one entry again, in the cache, which stays in use.
            library = self.build(entry_key, compile)
        discard(library)
        with self._lock:
            if isinstance(failure, OSError):
                self._unloadable.add(library.parent.parent)
            private = self._private_folder()
        self._warn(
            f"cannot load {library} ({failure}); building it again in a private temporary "
            f"folder, under {private.path}. If this repeats, {ADVICE}"
        )
        try:
            fresh = _Folder(Path(tempfile.mkdtemp(dir=private.path)), private=True)
            library = self._build_in(fresh, entry_key, compile)
        except OSError as error:
            raise self._cannot_store(private, error) from error
        try:
            return open_library(library)
        except AttributeError as error:
            raise CompileError(
                f"the library built at {library} lacks a symbol accy calls ({error}): this is "
                f"a bug in accy's code generation"
            ) from error
        except OSError as error:
            raise RuntimeUnavailable(
                f"cannot load the library built at {library} ({error}); {ADVICE}"
            ) from error

    def _current(self) -> _Folder:
        root = self.root or cache_root()
        with self._lock:
            folder = self._folders.get(root)
            if folder is None:
                folder = self._folders[root] = self._open(root)
            if folder.path in self._unloadable:
                return self._private_folder()
            return folder

    def _open(self, root: Path) -> _Folder:
        path = root / self.namespace
        try:
            _make_private_folder(path, root)
        except OSError as error:
            self._warn(
                f"cannot use the compile cache folder {path} ({error}); building into a private "
                f"temporary folder instead. To keep built libraries between runs, {ADVICE}"
            )
            return self._private_folder()
        return _Folder(path, private=False, used_bytes=_clean(path))

    def _private_folder(self) -> _Folder:
        with self._lock:
            if self._private is None:
                try:
                    path = Path(tempfile.mkdtemp(prefix=f"accy-{self.namespace}-"))
                except OSError as error:
                    raise RuntimeUnavailable(
                        f"cannot make a private temporary folder for built libraries "
                        f"({error}); {ADVICE}"
                    ) from error
                atexit.register(shutil.rmtree, path, True)
                self._private = _Folder(path, private=True)
            return self._private

    def _build_in(self, folder: _Folder, entry_key: str, compile: Callable[[Path], None]) -> Path:
        entry_folder = folder.entry_folder(entry_key)
        library = entry_folder / f"{entry_key}{self.suffix}"
        if self._hit(library):
            return library
        with _locked(entry_folder / f"{entry_key}{LOCK_SUFFIX}"):
            if self._hit(library):
                return library
            with tempfile.TemporaryDirectory(
                dir=entry_folder,
                prefix=f"{entry_key}.",
                suffix=TEMPORARY_SUFFIX,
                ignore_cleanup_errors=True,
            ) as scratch:
                output = Path(scratch) / library.name
                compile(output)
                data = output.read_bytes()
                os.replace(output, library)
                try:
                    write_file(
                        library.with_name(entry_key + DIGEST_SUFFIX),
                        entry_digest(entry_key, data).encode(),
                    )
                except BaseException:
                    discard(library)
                    raise
        folder.used_bytes += len(data) + 64
        if not folder.private:
            limit = max_bytes()
            if folder.used_bytes > limit:
                folder.used_bytes = _evict(folder.path, limit, keep=library)
        return library

    @staticmethod
    def _hit(library: Path) -> bool:
        if not is_valid(library):
            return False
        with contextlib.suppress(OSError):  # a read-only cache is still used
            os.utime(library)  # the time of last use, for eviction
        return True

    @staticmethod
    def _warn(message: str) -> None:
        warnings.warn(CacheWarning(f"accy: {message}"), stacklevel=4)

    @staticmethod
    def _cannot_store(folder: _Folder, error: OSError) -> RuntimeUnavailable:
        return RuntimeUnavailable(
            f"cannot store a built library in {folder.path} ({error}); {ADVICE}"
        )
