"""The ledger of translated peer cases: which of a peer's test cases each accy test translates,
and which are not applicable, with the reason.

A translation names the cases it covers with `@translates("Class.testName", ...)`. A module's
cases that cannot be written in accy go in its `NOT_APPLICABLE` table (case -> one-line reason),
and `not_applicable_tests(NOT_APPLICABLE)` turns the table into one skipped test per case, so
that every reason shows in pytest's report. `tests/peers/test_ledger.py` checks that, for each
peer file listed in `tests/peers/cases/`, every case is covered exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def translates(*cases: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a test as the translation of the peer's `cases` (`Class.testName` or `test_name`)."""

    def mark(test: Callable[..., Any]) -> Callable[..., Any]:
        test.__peer_cases__ = (*getattr(test, "__peer_cases__", ()), *cases)
        return test

    return mark


def not_applicable_tests(reasons: dict[str, str]) -> Callable[..., None]:
    """One skipped test per not-applicable case, its reason as the skip's message."""

    @pytest.mark.parametrize("case", sorted(reasons))
    def test_not_applicable(case: str) -> None:
        pytest.skip(f"not applicable: {reasons[case]}")

    return test_not_applicable
