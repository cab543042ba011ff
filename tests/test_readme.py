"""The README's code runs as written, and everything it names exists: each `ACCY_*` variable,
each `accy.x.y` name, each file, and each command (with the options it gives them)."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import re
import sys
from pathlib import Path

import pytest

import accy
from accy.__main__ import main as accy_main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SOURCE = ROOT / "src" / "accy"


def readme() -> str:
    return README.read_text()


def variables_accy_reads() -> set[str]:
    """The `ACCY_*` variables of accy's settings, and any spelled as a string in its source."""
    found = {s.variable for s in getattr(sys.modules["accy.config"], "SETTINGS", ())}
    for path in SOURCE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and re.fullmatch(r"ACCY_[A-Z0-9_]+", value):
                found.add(value)
    return found


def resolves(dotted: str) -> bool:
    """Whether `accy.a.b.c` names something: attributes, or modules imported on the way."""
    parts = dotted.split(".")
    target = accy
    for depth, part in enumerate(parts[1:], start=2):
        if hasattr(target, part):
            target = getattr(target, part)
            continue
        try:
            target = importlib.import_module(".".join(parts[:depth]))
        except ModuleNotFoundError:
            return False
    return True


def test_the_readme_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", readme(), re.S)
    assert blocks, "the README has no Python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})
    assert "program loss" in capsys.readouterr().out


def test_every_accy_variable_the_readme_names_is_one_accy_reads():
    named = set(re.findall(r"\bACCY_[A-Z0-9_]+", readme()))
    assert named, "the README names no ACCY_ variable"
    missing = sorted(named - variables_accy_reads())
    assert not missing, f"the README names variables accy never reads: {missing}"


@pytest.mark.slow
def test_the_variable_check_refuses_a_variable_nothing_reads():
    assert "ACCY_CACHE_DIR" in variables_accy_reads()
    assert "ACCY_NO_SUCH_SETTING" not in variables_accy_reads()


def test_every_accy_name_the_readme_uses_exists():
    named = {m.rstrip(".") for m in re.findall(r"\baccy(?:\.[A-Za-z_]\w*)+", readme())}
    assert "accy.trace.define" in named
    missing = sorted(name for name in named if not resolves(name))
    assert not missing, f"the README names what accy does not have: {missing}"


def test_the_name_check_refuses_a_name_that_is_not_there():
    assert resolves("accy.compat.execute.run_cpu") and resolves("accy.optim.Adam")
    assert not resolves("accy.execute") and not resolves("accy.trace.no_such_name")


def test_every_file_and_folder_the_readme_cites_exists():
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", readme(), flags=re.S))
    paths = {
        span
        for span in spans
        if "/" in span
        and re.fullmatch(r"\.?[\w-]+(/[\w.-]+)*/?", span)
        and not span.startswith("out/")  # what the demo writes
    }
    assert "bench/results/workloads-h200-f32.json" in paths and "accy/core/" in paths
    assert ".ci/run" in paths
    missing = sorted(
        p for p in paths if not any((base / p).exists() for base in (ROOT, SOURCE.parent))
    )
    assert not missing, f"the README cites files that are not in the tree: {missing}"


def help_of(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        accy_main(argv)
    assert exited.value.code == 0, f"accy {' '.join(argv)} exited with {exited.value.code}"
    return out.getvalue()


def test_every_accy_command_and_demo_option_the_readme_names_exists():
    text = readme()
    commands = set(re.findall(r"\baccy (demo|example|launch|[a-z]+)\b(?!\.)", text))
    commands &= {c for c in commands if f"`accy {c}" in text or f"bin/accy {c}" in text}
    assert {"demo", "example", "launch"} <= commands
    for command in sorted(commands - {"example"}):
        help_of([command, "--help"])  # each a subcommand with its own options
    demo_help = help_of(["demo", "--help"])
    section = text[text.index("## The main job") : text.index("## Speed")]
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", section))
    assert {"--device", "--dtype", "--resume", "--steps", "--seed"} <= options
    missing = sorted(o for o in options if o not in demo_help)
    assert not missing, f"the README gives `accy demo` options it does not take: {missing}"
    assert "--gpus" in help_of(["launch", "--help"])


def test_the_top_commands_are_what_ci_runs():
    first, second = re.findall(r"```bash\n(.*?)\n(.*?)\n```", readme(), re.S)[0]
    assert first.endswith(".venv/bin/accy demo")
    ci = (ROOT / ".ci" / "run").read_text()
    assert second in ci.splitlines(), ".ci/run must run the README's second command as written"
    assert (ROOT / "bench" / "__main__.py").exists()  # `python -m bench`
