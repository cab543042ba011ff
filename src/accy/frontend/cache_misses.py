"""Why a transformed function was traced again: with `accy.config.explain_cache_misses` on (JAX's
`jax_explain_cache_misses`), each trace of a jitted function logs a warning on the
`accy.compile` logger that names the function and what differs from the closest earlier
signature: a never-seen function (and whether another function defined on the same line was
seen, as a lambda made anew in a loop is), the input tree structure, the input types at which
leaves, or the static arguments' values.

The explanations are built only where a trace happens (the slow path), never on a cached call.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Sequence
from typing import Any

from ..caches import register

COMPILE_LOG = logging.getLogger("accy.compile")

# The source lines (file, line) of the functions whose first trace was explained: a function
# never seen, defined where another one was, is one made anew on each pass of a loop.
_SEEN_LINES: set[tuple[str, int]] = set()
_LOCK = threading.Lock()
register("cache-miss explanation lines", _SEEN_LINES.clear, _SEEN_LINES.__len__)


def source_line(fn: Any) -> tuple[str, int] | None:
    """Where `fn` is defined, (file, first line), or None (a builtin, a callable object).

    >>> source_line(len) is None, source_line(source_line)[1] > 0
    (True, True)
    """
    try:
        code = inspect.unwrap(fn).__code__
    except (AttributeError, ValueError):
        return None
    return code.co_filename, code.co_firstlineno


def describe_function(name: str, line: tuple[str, int] | None) -> str:
    """`name` with where it is defined, for the messages.

    >>> describe_function("f", ("model.py", 3)), describe_function("add", None)
    ('f (model.py:3)', 'add')
    """
    return name if line is None else f"{name} ({line[0]}:{line[1]})"


def _warn(function: str, reason: str) -> None:
    COMPILE_LOG.warning("accy: TRACING CACHE MISS of %s: %s", function, reason)


def explain_first_trace(name: str, line: tuple[str, int] | None) -> None:
    """Log the first trace of a function."""
    with _LOCK:
        again = line is not None and line in _SEEN_LINES
        if line is not None:
            _SEEN_LINES.add(line)
    reason = "never seen function"
    if again:
        reason += (
            "; another function defined on the same line was traced before (a lambda or a "
            "function made anew on each pass of a loop is a new function, traced again): "
            "define it once, outside the loop"
        )
    _warn(describe_function(name, line), reason)


class _NotPassed:
    def __repr__(self) -> str:
        return "(not passed)"


_NOT_PASSED = _NotPassed()


def explain_static_miss(function: str, now: Sequence[tuple], before: Sequence[Sequence]) -> None:
    """Log a trace for static arguments `now` ((name, cache key, value) triples) that differ
    from each of `before`'s; the closest (the most equal values) is named."""
    closest = max(before, key=lambda earlier: len(set(_keyed(now)) & set(_keyed(earlier))))
    earlier_keys = dict((name, key) for name, key, _ in closest)
    earlier_values = dict((name, value) for name, _, value in closest)
    changed = [
        (name, value, earlier_values.get(name, _NOT_PASSED))
        for name, key, value in now
        if earlier_keys.get(name, _NOT_PASSED) != key
    ]
    shown_now = ", ".join(f"{name}: {value!r}" for name, value, _ in changed)
    shown_before = ", ".join(f"{name}: {earlier!r}" for name, _, earlier in changed)
    _warn(
        function,
        f"different value of static arguments: now {{{shown_now}}} and before {{{shown_before}}}",
    )


def _keyed(statics: Sequence[tuple]) -> list[tuple]:
    return [(name, key) for name, key, _ in statics]


def explain_signature_miss(
    function: str, key: tuple, before: Sequence[tuple], paths: Sequence[str]
) -> None:
    """Log a trace for the signature `key` ((argument tree structure, one type or static
    value per leaf), whose leaves are at `paths`) that none of the earlier signatures `before`
    equals: by tree structure if none has `key`'s, else by the leaves whose types differ
    from the closest one's."""
    treedef, leaves = key
    same_tree = [earlier for earlier in before if earlier[0] == treedef]
    if not same_tree:
        _warn(function, _tree_difference(treedef, before[-1][0]))
        return
    closest = max(same_tree, key=lambda e: sum(map(_likeness, leaves, e[1])))
    differences = [
        f"at {path}, now {_shown(now)} and before {_shown(earlier)}"
        for path, now, earlier in zip(paths, leaves, closest[1], strict=True)
        if now != earlier
    ]
    _warn(function, "different input types: " + "; ".join(differences))


def _tree_difference(now: Any, before: Any) -> str:
    now_args, now_kwargs = now.children()
    before_args, before_kwargs = before.children()
    if now.num_leaves == before.num_leaves and (
        now_args.num_children != before_args.num_children
        or now_kwargs.entries() != before_kwargs.entries()
    ):
        return (
            "different input tree structure, with as many leaves: the arguments passed by "
            f"position and by keyword differ (now {now_args.num_children} positional and "
            f"keywords {list(now_kwargs.entries())}, before {before_args.num_children} "
            f"positional and keywords {list(before_kwargs.entries())})"
        )
    return f"different input tree structure: now {now_args} and before {before_args}"


def _likeness(now: Any, before: Any) -> int:
    """How alike two leaves' key parts are: for types, the count of shared dtype, rank and
    (axis, extent) pairs, so that the closest signature is the one with the fewest changes.

    >>> import accy
    >>> _likeness(accy.spec(accy.f32, a=10, b=2), accy.spec(accy.f32, a=10, b=20))
    3
    """
    if now == before:
        return 1 << 16
    extents = getattr(now, "named_extents", None)
    earlier = getattr(before, "named_extents", None)
    if extents is None or earlier is None:
        return 0
    shared = sum(pair in earlier for pair in extents)
    return shared + (now.dtype == before.dtype) + (len(extents) == len(earlier))


def _shown(part: Any) -> str:
    """A key's part for a leaf as the user knows it: a type, or a static value."""
    if isinstance(part, tuple) and len(part) == 2 and isinstance(part[0], type):
        return repr(part[1])  # a static value keyed by (type, value)
    return str(part)
