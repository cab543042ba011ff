"""Fixtures of the custom-call record tests: every test leaves the process-wide table as it
found it, so records declared by one test never leak into another (or into the seed's tests,
which rely on 'accy.custom.double' having no record)."""

from __future__ import annotations

import pytest

from accy.core.kinds.control import CUSTOM_CALLS


@pytest.fixture(autouse=True)
def restore_custom_call_table():
    saved = dict(CUSTOM_CALLS)
    yield
    CUSTOM_CALLS.clear()
    CUSTOM_CALLS.update(saved)


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory):
    """Compiled programs go to a fresh cache, never the user's ~/.cache/accy."""
    patch = pytest.MonkeyPatch()
    patch.setenv("ACCY_CACHE_DIR", str(tmp_path_factory.mktemp("accy-cache")))
    yield
    patch.undo()
