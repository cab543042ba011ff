"""docs/from-equinox-optax-transformers.md: its accy blocks run, in order, as one script, and
print what the page says they compute."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "from-equinox-optax-transformers.md"


def accy_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    return [b for b in blocks if "eqx" not in b]  # the Equinox block is for reading only


@pytest.mark.slow  # every eager operation of the page compiles its own small program
def test_the_accy_blocks_run_and_print_what_they_claim(capsys):
    scope: dict = {}
    for number, block in enumerate(accy_blocks()):
        exec(compile(block, f"{DOC}:block{number}", "exec"), scope)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "{'embed': 4} 2"
    assert printed[1].startswith("{'batch': 2, 'token': 5, 'head': 2, 'dim': 3}")
    assert printed[2] == "True {'head': 2, 'dim': 3}"
    assert float(printed[3]) < 4.0  # the loss (m(x)^2 with weight 2 starts at 4) went down
    assert printed[4] == "{'batch': 1, 'token': 4, 'vocab': 32} True"
    assert printed[5] == "{'batch': 1, 'token': 12} {'batch': 1, 'token': 12}"
    assert scope["sampled"].dtype == scope["accy"].i32
