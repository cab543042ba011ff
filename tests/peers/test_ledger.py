"""Every case of each translated peer file is translated or marked not applicable, exactly once.

The case lists in `tests/peers/cases/` are written by `tools/list_peer_cases.py` from the peer's
source; each list's modules are the test files that translate it.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

CASES = Path(__file__).parent / "cases"

TRANSLATIONS = {
    "jax_api.txt": ["test_jax_api", "test_jax_api_jit", "test_jax_api_remat"],
    "jax_custom.txt": ["test_jax_custom"],
    "jax_control_flow.txt": ["test_jax_control_flow"],
    "haliax_hof.txt": ["test_haliax_hof"],
    "haliax_scan.txt": ["test_haliax_scan"],
    "haliax_axis.txt": ["test_haliax_axis"],
    "haliax_ops.txt": ["test_haliax_ops"],
}


def listed_cases(name: str) -> list[str]:
    lines = (CASES / name).read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def covered_cases(module_names: list[str]) -> list[str]:
    """Each case the modules translate or mark not applicable, once per mention."""
    covered = []
    for module_name in module_names:
        try:
            module = importlib.import_module(f"tests.peers.{module_name}")
        except ModuleNotFoundError:
            continue
        for _, test in inspect.getmembers(module, callable):
            if getattr(test, "__module__", None) == module.__name__:
                covered.extend(getattr(test, "__peer_cases__", ()))
        covered.extend(getattr(module, "NOT_APPLICABLE", {}))
    return covered


@pytest.mark.parametrize("case_list", sorted(TRANSLATIONS))
def test_every_peer_case_is_translated_or_not_applicable_once(case_list):
    listed = listed_cases(case_list)
    covered = covered_cases(TRANSLATIONS[case_list])
    missing = sorted(set(listed) - set(covered))
    unknown = sorted(set(covered) - set(listed))
    twice = sorted({case for case in covered if covered.count(case) > 1})
    assert not missing, f"{case_list}: {len(missing)} cases neither translated nor n/a: {missing}"
    assert not unknown, f"{case_list}: cases the peer's file does not have: {unknown}"
    assert not twice, f"{case_list}: cases covered more than once: {twice}"
