"""Fixtures for the core tests."""

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    """A generator seeded the same way in every test, so that every run sees the same values."""
    return np.random.default_rng(20261130)
