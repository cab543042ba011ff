"""Checks shared by every test folder.

`round_trip_every_built_program` (autouse) wraps `Builder.build` so that every Program any test
builds (tracing, transformations, re-emission, parsing) must survive print -> parse -> print
unchanged (each distinct text is parsed once per process). Failures are collected while the test
runs and fail it at teardown, naming the program and showing the first differing line.
"""

from __future__ import annotations

import contextlib
import difflib
import threading

import pytest

import accy
from accy.core.builder import Builder
from accy.core.kinds.control import CUSTOM_CALLS

_checking = threading.local()
_round_tripped: set[str] = set()
"""The digests (sha256 of the text) of the programs that printed back unchanged: parsing is a
function of the text alone, so a text built again (a function traced again, the same program
in another test) is not parsed again; a text that failed is checked each time it is built."""


def _round_trip_failure(program) -> str | None:
    """None if `program` prints, parses and prints back to the same text; else what went wrong."""
    if program.digest in _round_tripped:  # the digest is the program's, computed once
        return None
    text = str(program)
    try:
        again = str(accy.core.parse(text))
    except Exception as error:  # a ParseError, or a crash of the parser: both are failures
        kind = type(error).__name__
        return f"program {program.name!r} does not parse back ({kind}): {error}\n{text}"
    if again == text:
        _round_tripped.add(program.digest)
        return None
    diff = "\n".join(
        difflib.unified_diff(text.splitlines(), again.splitlines(), "printed", "reprinted", n=1)
    )
    return f"program {program.name!r} prints differently after parsing:\n{diff}"


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory):
    """Every test compiles into one fresh cache, never the user's ~/.cache/accy (the processes
    tests start too, through the variable)."""
    folder = str(tmp_path_factory.mktemp("accy-cache"))
    patch = pytest.MonkeyPatch()
    patch.setenv("ACCY_CACHE_DIR", folder)
    with accy.config.override(cache_dir=folder):
        yield
    patch.undo()


@pytest.fixture
def configure():
    """`configure(name=value, ...)` sets `accy.config` settings for the rest of one test; each
    comes back at its end."""
    with contextlib.ExitStack() as stack:
        yield lambda **values: stack.enter_context(accy.config.override(**values))


@pytest.fixture(autouse=True)
def restore_custom_call_table():
    """Every test leaves the process-wide custom-call table as it found it: records declared
    (or registered by nn.attention as it traces) in one test never leak into another."""
    saved = dict(CUSTOM_CALLS)
    yield
    CUSTOM_CALLS.clear()
    CUSTOM_CALLS.update(saved)


@pytest.fixture(autouse=True)
def round_trip_every_built_program(monkeypatch):
    failures: list[str] = []
    original_build = Builder.build

    def checked_build(self, outputs):
        __tracebackhide__ = True  # not the user's line in accy's "traced at" locations either
        program = original_build(self, outputs)
        # Parsing builds programs too; check only the outermost build, not the parser's own.
        if not getattr(_checking, "active", False):
            _checking.active = True
            try:
                failure = _round_trip_failure(program)
            finally:
                _checking.active = False
            if failure is not None:
                failures.append(failure)
        return program

    monkeypatch.setattr(Builder, "build", checked_build)
    yield failures
    if failures:
        pytest.fail(
            f"{len(failures)} built program(s) failed print -> parse -> print:\n\n"
            + "\n\n".join(failures[:3]),
            pytrace=False,
        )
