"""Fixtures of the attention tests: each test leaves the process-wide custom-call table as it
found it (attention registers its records as it traces)."""

from __future__ import annotations

import pytest

from accy.core.kinds.control import CUSTOM_CALLS


@pytest.fixture(autouse=True)
def restore_custom_call_table():
    saved = dict(CUSTOM_CALLS)
    yield
    CUSTOM_CALLS.clear()
    CUSTOM_CALLS.update(saved)


@pytest.fixture(autouse=True)
def kernels_on_small_shapes(monkeypatch):
    """The fused records run on the tests' small shapes (normally the composition does)."""
    import accy.attention.signature

    monkeypatch.setattr(accy.attention.signature, "FUSED_MIN_SCORES", 0)
    monkeypatch.setattr(accy.attention.signature, "FULL_PRECISION_FUSED_MIN_SCORES", 0)
