"""docs/frontend.md's example runs as written in both of its versions, accy and JAX (with
optax), the two train to the same parameters, and the accy version is no longer than the JAX
one (lines of code, blank lines and comment-only lines left out)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "frontend.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def code_lines(block: str) -> int:
    return sum(
        1 for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")
    )


@pytest.mark.slow
def test_the_accy_and_jax_versions_run_agree_and_accy_is_no_longer(capsys):
    accy_block, jax_block = python_blocks()[:2]
    assert "import accy" in accy_block and "import jax" in jax_block
    ours: dict = {}
    exec(compile(accy_block, f"{DOC}:accy", "exec"), ours)
    theirs: dict = {}
    exec(compile(jax_block, f"{DOC}:jax", "exec"), theirs)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == printed[3]  # "loss 0.067" from both
    for name in ("w", "b"):
        np.testing.assert_allclose(
            np.asarray(ours["params"][name]), np.asarray(theirs["params"][name]), rtol=1e-4
        )
    assert code_lines(accy_block) <= code_lines(jax_block)
    stated = re.search(r"the accy\s+version has (\d+) lines and the JAX one (\d+)", DOC.read_text())
    assert stated and tuple(map(int, stated.groups())) == (
        code_lines(accy_block),
        code_lines(jax_block),
    ), "the line counts docs/frontend.md states are out of date"
