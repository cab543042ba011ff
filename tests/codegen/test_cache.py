"""The disk cache of built libraries (accy.codegen.cache), with stand-in builds that write known
bytes: trust (owners, modes, entries bound to their keys), fallbacks where the cache folder cannot
be written or loaded from, clean-up of temporaries, and the size bound."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

import pytest

import accy
from accy.codegen import cache
from accy.config import Config
from accy.errors import CacheWarning


@pytest.fixture
def root(tmp_path, configure) -> Path:
    """A fresh cache root, as $ACCY_CACHE_DIR."""
    folder = tmp_path / "cache"
    configure(cache_dir=str(folder))
    return folder


def writes(data: bytes, log: list | None = None):
    """A stand-in compile step that writes `data` (and records that it ran)."""

    def compile(output: Path) -> None:
        if log is not None:
            log.append(output)
        output.write_bytes(data)

    return compile


def leftovers(folder: Path) -> list[str]:
    """Temporary files and folders anywhere under `folder`."""
    return [name for _, dirs, files in os.walk(folder) for name in dirs + files if ".tmp" in name]


def test_a_hit_builds_nothing_and_a_miss_builds_once(root):
    store, log = cache.Cache("t"), []
    first = store.build(cache.key("a"), writes(b"A", log))
    second = store.build(cache.key("a"), writes(b"other", log))
    assert first == second and first.read_bytes() == b"A" and len(log) == 1
    assert root / "t" in first.parents
    digest = hashlib.sha256(cache.key("a").encode() + b"\0" + b"A").hexdigest()
    assert first.with_suffix(".sha256").read_text() == digest


def test_an_entry_copied_from_another_key_is_rebuilt(root):
    store = cache.Cache("t")
    a = store.build(cache.key("a"), writes(b"library of a"))
    b = store.build(cache.key("b"), writes(b"library of b"))
    shutil.copyfile(a, b)
    shutil.copyfile(a.with_suffix(".sha256"), b.with_suffix(".sha256"))
    assert not cache.is_valid(b)
    assert store.build(cache.key("b"), writes(b"library of b")).read_bytes() == b"library of b"


def test_a_cache_folder_others_can_write_is_refused(root):
    root.mkdir(mode=0o700)
    root.chmod(0o777)  # as a folder made by anyone in /tmp could be
    with pytest.warns(CacheWarning, match="can be written by its group or by others"):
        library = cache.Cache("t").build(cache.key("a"), writes(b"A"))
    assert root not in library.parents and library.read_bytes() == b"A"
    assert not (root / "t").exists()  # nothing was made in it


def test_a_cache_folder_of_another_user_is_refused(tmp_path, configure):
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o755)
        os.chown(foreign, 65534, 65534)  # nobody's
    else:
        foreign = Path("/")  # root's
    configure(cache_dir=str(foreign))
    with pytest.warns(CacheWarning, match=f"is owned by user id {foreign.stat().st_uid}"):
        library = cache.Cache("t").build(cache.key("a"), writes(b"A"))
    assert foreign not in library.parents and library.read_bytes() == b"A"


def test_folders_accy_creates_are_private_whatever_the_umask(tmp_path, configure):
    configure(cache_dir=str(tmp_path / "made" / "by" / "accy"))
    previous = os.umask(0)
    try:
        library = cache.Cache("t").build(cache.key("a"), writes(b"A"))
    finally:
        os.umask(previous)
    made = [tmp_path / "made", tmp_path / "made/by", tmp_path / "made/by/accy", library.parent]
    assert [stat.S_IMODE(folder.stat().st_mode) for folder in made] == [0o700] * 4


def test_an_unwritable_home_falls_back_to_a_private_temporary_folder(
    tmp_path, monkeypatch, configure
):
    home = tmp_path / "home"
    home.write_text("a file where the home folder should be")
    configure(cache_dir="")  # unset: ~/.cache/accy
    monkeypatch.setenv("HOME", str(home))
    with pytest.warns(CacheWarning, match="cannot use the compile cache folder"):
        library = cache.Cache("t").build(cache.key("a"), writes(b"A"))
    private = library.parents[1]  # <private>/<key[:2]>/<key>.so
    info = private.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.getuid(), 0o700)
    assert f"accy-{os.getuid()}" not in str(library)  # not a predictable shared name


@pytest.mark.parametrize("failure", [accy.CompileError("bad code"), KeyboardInterrupt()])
def test_a_failed_or_interrupted_build_leaves_no_temporaries(root, failure):
    def compile(output: Path) -> None:
        output.write_bytes(b"half a library")
        (output.parent / "source.c").write_text("int x;")
        raise failure

    store = cache.Cache("t")
    with pytest.raises(type(failure)):
        store.build(cache.key("a"), compile)
    assert leftovers(root) == []
    assert not list(root.rglob("*.so"))
    assert store.build(cache.key("a"), writes(b"A")).read_bytes() == b"A"


def test_a_full_disk_falls_back_to_a_private_folder(root, monkeypatch):
    real_write = os.write

    def full_disk(handle, data):
        if os.readlink(f"/proc/self/fd/{handle}").startswith(str(root)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(handle, data)

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.warns(CacheWarning, match="No space left on device"):
        library = cache.Cache("t").build(cache.key("a"), writes(b"A"))
    assert root not in library.parents and library.read_bytes() == b"A"
    assert leftovers(root) == [] and not list(root.rglob("*.so"))


def test_a_disk_full_everywhere_is_an_error_that_says_what_to_do(root, monkeypatch):
    real_write = os.write
    private_prefix = os.path.join(tempfile.gettempdir(), "accy-t-")

    def full_disk(handle, data):
        if os.readlink(f"/proc/self/fd/{handle}").startswith((str(root), private_prefix)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(handle, data)

    monkeypatch.setattr(os, "write", full_disk)
    with (
        pytest.warns(CacheWarning, match="No space left on device"),
        pytest.raises(accy.RuntimeUnavailable, match="set ACCY_CACHE_DIR to a folder"),
    ):
        cache.Cache("t").build(cache.key("a"), writes(b"A"))


def read_only(monkeypatch, folder: Path) -> None:
    """Make `folder` read-only: its mode, and (since root ignores modes) every call that would
    change it failing as on a read-only file system."""
    for path in [folder, *folder.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)

    def refuse(function, writes_only=False):
        def refusing(path, *args, **kwargs):
            flags = args[0] if args else kwargs.get("flags", 0)
            writing = not writes_only or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            if writing and str(path).startswith(str(folder)):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return function(path, *args, **kwargs)

        return refusing

    for name in ("mkdir", "replace", "rename", "unlink", "rmdir", "utime"):
        monkeypatch.setattr(os, name, refuse(getattr(os, name)))
    monkeypatch.setattr(os, "open", refuse(os.open, writes_only=True))


def test_a_read_only_cache_with_a_corrupt_entry_builds_privately(root, monkeypatch):
    store = cache.Cache("t")
    entry = store.build(cache.key("a"), writes(b"A"))
    entry.write_bytes(b"corrupt")
    read_only(monkeypatch, root)
    with pytest.warns(CacheWarning, match="cannot write into the compile cache folder"):
        library = cache.Cache("t").build(cache.key("a"), writes(b"A"))
    assert root not in library.parents and library.read_bytes() == b"A"
    monkeypatch.undo()
    assert entry.read_bytes() == b"corrupt"  # left alone, and never used


def test_a_read_only_cache_still_serves_its_valid_entries(root, monkeypatch):
    entry = cache.Cache("t").build(cache.key("a"), writes(b"A"))
    read_only(monkeypatch, root)
    log = []
    assert cache.Cache("t").build(cache.key("a"), writes(b"A", log)) == entry and log == []


def test_a_library_the_cache_folder_cannot_load_is_loaded_from_a_private_folder(root):
    def open_library(path: Path) -> bytes:
        if root in path.parents:  # as on a file system mounted noexec
            raise OSError(f"{path}: failed to map segment from shared object")
        return path.read_bytes()

    store = cache.Cache("t")
    with pytest.warns(CacheWarning, match="failed to map segment"):
        assert store.load(cache.key("a"), writes(b"A"), open_library) == b"A"
    # The cache folder's libraries do not load: later builds go straight to the private folder.
    log = []
    assert store.load(cache.key("b"), writes(b"B", log), open_library) == b"B"
    assert len(log) == 1 and root not in log[0].parents


def test_a_library_lacking_a_symbol_is_built_again_privately(root):
    def open_library(path: Path) -> bytes:
        if path.read_bytes() == b"no entry point":
            raise AttributeError("undefined symbol: accy_run")
        return path.read_bytes()

    store = cache.Cache("t")
    entry = store.build(cache.key("a"), writes(b"no entry point"))
    with pytest.warns(CacheWarning, match="undefined symbol: accy_run"):
        assert store.load(cache.key("a"), writes(b"A"), open_library) == b"A"
    assert not entry.exists()  # the bad entry is gone: the next process builds it again


def test_a_library_that_never_loads_raises_errors_that_say_what_to_do(root):
    def unloadable(path: Path):
        raise OSError("failed to map segment from shared object")

    def symbol_missing(path: Path):
        raise AttributeError("undefined symbol: accy_run")

    store = cache.Cache("t")
    with pytest.warns(CacheWarning), pytest.raises(accy.RuntimeUnavailable, match="ACCY_CACHE_DIR"):
        store.load(cache.key("a"), writes(b"A"), unloadable)
    with pytest.warns(CacheWarning), pytest.raises(accy.CompileError, match="lacks a symbol"):
        store.load(cache.key("b"), writes(b"B"), symbol_missing)


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_opening_the_cache_removes_stale_temporaries_and_locks(root):
    folder = cache.Cache("t").build(cache.key("a"), writes(b"A")).parent
    old_build = folder / "k.abc.tmp"
    old_build.mkdir()
    (old_build / "k.so").write_bytes(b"half")
    old_file, fresh_file = folder / "k.sha256.x.tmp", folder / "k.sha256.y.tmp"
    old_lock, held_lock = folder / "k.lock", folder / "h.lock"
    for path in (old_file, fresh_file, old_lock, held_lock):
        path.write_bytes(b"")
    for path in (old_build, old_file, old_lock, held_lock):
        _age(path, 2 * cache.STALE_SECONDS)
    with open(held_lock) as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        cache.Cache("t").build(cache.key("b"), writes(b"B"))  # opens the folder afresh
    assert not old_build.exists() and not old_file.exists() and not old_lock.exists()
    assert fresh_file.exists() and held_lock.exists()


def test_the_least_recently_used_entries_are_evicted(root, configure):
    configure(cache_max_bytes=2200)  # two entries of 1000 + 64 bytes
    store = cache.Cache("t")
    a = store.build(cache.key("a"), writes(b"a" * 1000))
    b = store.build(cache.key("b"), writes(b"b" * 1000))
    _age(a, 300)
    _age(b, 200)
    store.build(cache.key("a"), writes(b"a" * 1000))  # a hit: `a` is now the most recent use
    c = store.build(cache.key("c"), writes(b"c" * 1000))
    assert (a.exists(), b.exists(), c.exists()) == (True, False, True)
    assert not b.with_suffix(".sha256").exists()


def test_eviction_spares_the_entry_just_built_and_entries_being_built(root, configure):
    configure(cache_max_bytes=500)  # less than one entry
    store = cache.Cache("t")
    a = store.build(cache.key("a"), writes(b"a" * 1000))
    with open(a.with_suffix(".lock")) as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another process is building `a`
        b = store.build(cache.key("b"), writes(b"b" * 1000))
        assert a.exists() and b.exists()
    c = store.build(cache.key("c"), writes(b"c" * 1000))
    assert (a.exists(), b.exists(), c.exists()) == (False, False, True)


def test_a_bad_size_bound_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("ACCY_CACHE_MAX_BYTES", "2GB")
    with pytest.raises(
        accy.errors.ConfigurationError,
        match="ACCY_CACHE_MAX_BYTES='2GB' .*cache_max_bytes: expected a whole number",
    ):
        _ = Config().cache_max_bytes
