"""Every in-memory cache of accy, in one registry: each has a name, a bound, and is emptied by
`accy.clear_caches()`.

A cache's bound is an `accy.config` setting (read at each insertion, so changing it applies at
once), or None where the keys are few by nature (one entry per device, per dtype, per process)
or where entries live only as long as their keys (a table keyed by weak references).

- `Lru`: the `bound` most recently used entries (what the executables cache is: dropping an
  executable from it releases its native library, once nothing else holds it).
- `Table`: a `dict` whose lookups are plain dict lookups (the eager and jit fast paths cannot
  afford more) and whose insertions (`put`) drop the oldest entries past the bound. Tables
  that map to executables hold weak references to them, so the executables cache alone
  decides which stay alive.
- `Group`: the tables of many objects of one kind (one per jitted function), each bounded
  alike, emptied together.
- `memoized(name, bound)`: `functools.cache` with a name and a bound.
- `register(name, clear, size)`: a cache kept elsewhere (a weak-keyed table).

>>> import accy
>>> table = Table("example squares", bound=None)
>>> table.put(3, 9)
9
>>> "example squares" in accy.caches.statistics()
True
>>> accy.clear_caches(); len(table)
0
>>> unregister("example squares")
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from .config import config
from .errors import AccyError

T = TypeVar("T")
Bound = str | int | None
"""The name of an `accy.config` setting, a fixed number of entries, or None (unbounded)."""


@dataclass(frozen=True)
class Registered:
    """One cache in the registry: how to empty it and how many entries it holds."""

    name: str
    clear: Callable[[], None]
    size: Callable[[], int]
    bound: Bound


_REGISTRY: dict[str, Registered] = {}
_LOCK = threading.Lock()


def register(name: str, clear: Callable[[], None], size: Callable[[], int], bound: Bound = None):
    """Add a cache kept elsewhere to the registry under `name` (unique).

    >>> register("example", lambda: None, lambda: 0); unregister("example")
    """
    with _LOCK:
        if name in _REGISTRY:
            raise AccyError(f"a cache named {name!r} is registered already; names are unique")
        _REGISTRY[name] = Registered(name, clear, size, bound)


def unregister(name: str) -> None:
    """Take the cache `name` out of the registry (tests and short-lived caches)."""
    with _LOCK:
        _REGISTRY.pop(name, None)


def limit(bound: Bound) -> int | None:
    """The number of entries `bound` allows now (None: no limit).

    >>> import accy
    >>> limit("executables_max_entries") == accy.config.executables_max_entries, limit(3)
    (True, 3)
    """
    if bound is None or isinstance(bound, int):
        return bound
    return getattr(config, bound)


def clear_caches() -> None:
    """Empty every in-memory cache of accy (compiled executables, eager operations, traced
    signatures, interned types, memoized kernels); nothing is lost but time: each is filled
    again on use. Executables that nothing else holds are released, with their native
    libraries. The disk cache of compiled code stays (`ACCY_CACHE_DIR`).

    >>> import accy
    >>> accy.clear_caches()
    >>> accy.caches.statistics()["executables"][0]
    0
    """
    with _LOCK:
        registered = list(_REGISTRY.values())
    for cache in registered:
        cache.clear()


def statistics() -> dict[str, tuple[int, int | None]]:
    """Every registered cache's (entries, bound now) by name.

    >>> import accy
    >>> entries, bound = accy.caches.statistics()["executables"]
    >>> bound == accy.config.executables_max_entries
    True
    """
    with _LOCK:
        registered = list(_REGISTRY.values())
    return {cache.name: (cache.size(), limit(cache.bound)) for cache in registered}


class Lru:
    """The most recently used entries, at most `limit(bound)` of them (least recent out first);
    thread-safe."""

    def __init__(self, name: str | None, bound: Bound):
        self.bound = bound
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()
        # The keys dropped for the bound lately (not by `clear`): `dropped(key)` tells a
        # caller that a miss is one the bound made.
        self._dropped = Table(None, 4096)
        if name is not None:
            register(name, self.clear, self.__len__, bound)

    def get(self, key: Hashable) -> Any:
        """The entry of `key` (now the most recent), or None."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: Hashable, value: T) -> T:
        """Keep `value` under `key` as the most recent entry; drop the least recent past the
        bound. Returns `value`."""
        allowed = limit(self.bound)
        dropped = []  # released outside the lock: a finalizer may run
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while allowed is not None and len(self._entries) > max(allowed, 1):
                dropped.append(self._entries.popitem(last=False))
                self._dropped.put(dropped[-1][0], True)
        del dropped
        return value

    def dropped(self, key: Hashable) -> bool:
        """Whether `key`'s entry was dropped for the bound (and not asked for since)."""
        return self._dropped.pop(key, False)

    def values(self) -> list[Any]:
        with self._lock:
            return list(self._entries.values())

    def clear(self) -> None:
        with self._lock:
            dropped = list(self._entries.items())
            self._entries.clear()
        del dropped

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries


class Table(dict):
    """A dict with a bound on insertions: `put(key, value)` drops the oldest entries past
    `limit(bound)`. Reads are the dict's own (`get`, `[]`, `in`)."""

    def __init__(self, name: str | None, bound: Bound):
        super().__init__()
        self.bound = bound
        if name is not None:
            register(name, self.clear, self.__len__, bound)

    def put(self, key: Hashable, value: T) -> T:
        """`self[key] = value`, dropping the oldest entries past the bound; returns `value`.

        >>> table = Table(None, bound=2)
        >>> for k in "abc":
        ...     _ = table.put(k, k.upper())
        >>> sorted(table)
        ['b', 'c']
        """
        allowed = limit(self.bound)
        if allowed is not None:
            while self and len(self) >= max(allowed, 1) and key not in self:
                del self[next(iter(self))]
        self[key] = value
        return value

    __hash__ = object.__hash__  # weakly referenced by its Group
    __eq__ = object.__eq__


class Group:
    """The tables of many objects of one kind (each jitted function's signatures), each
    bounded by `bound`, registered as one cache: `clear` empties them all."""

    def __init__(self, name: str, bound: Bound):
        self.bound = bound
        self._tables: weakref.WeakSet[Table] = weakref.WeakSet()
        register(name, self.clear, self.size, bound)

    def table(self) -> Table:
        """A fresh table of this group."""
        table = Table(None, self.bound)
        self._tables.add(table)
        return table

    def tables(self) -> Iterator[Table]:
        return iter(list(self._tables))

    def clear(self) -> None:
        for table in self.tables():
            table.clear()

    def size(self) -> int:
        return sum(len(table) for table in self.tables())


def memoized(name: str, bound: Bound = None) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """`functools.cache` with a registered, bounded table (positional, hashable arguments).

    >>> @memoized("example doubles", bound=2)
    ... def double(x):
    ...     return 2 * x
    >>> double(4), len(statistics()) > 0
    (8, True)
    >>> double.cache_clear(); unregister("example doubles")
    """

    def decorate(function: Callable[..., T]) -> Callable[..., T]:
        table = Table(name, bound)
        missing = object()

        @functools.wraps(function)
        def wrapper(*arguments: Any) -> T:
            found = table.get(arguments, missing)
            if found is missing:
                found = table.put(arguments, function(*arguments))
            return found

        wrapper.cache_clear = table.clear  # type: ignore[attr-defined]
        wrapper.cache = table  # type: ignore[attr-defined]
        return wrapper

    return decorate


__all__ = [
    "Group",
    "Lru",
    "Registered",
    "Table",
    "clear_caches",
    "limit",
    "memoized",
    "register",
    "statistics",
    "unregister",
]
