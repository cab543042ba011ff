"""Fixtures of the attention tests (the custom-call table is restored after each test by the
root conftest)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def kernels_on_small_shapes(monkeypatch):
    """The fused records run on the tests' small shapes (normally the composition does)."""
    import accy.attention.signature

    monkeypatch.setattr(accy.attention.signature, "FUSED_MIN_SCORES", 0)
    monkeypatch.setattr(accy.attention.signature, "FULL_PRECISION_FUSED_MIN_SCORES", 0)
