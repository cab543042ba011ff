"""Fixtures of the nn tests: `device`, each device in turn (the backend tests' own)."""

from ..backends.conftest import device  # noqa: F401
