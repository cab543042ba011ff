"""The tree holds what a user or maintainer needs and speaks of the code, not of its history:
every tool and every stored result is described where it lives, nothing large is kept, and no
comment, test or document dates itself by a work session."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HISTORY = re.compile(
    "|".join(("sess" + r"ion [0-9]", "rou" + r"nd[0-9]", "iss" + r"ue [0-9]", "the se" + "ed's")),
    re.IGNORECASE,
)
LARGEST = 1 << 20  # bytes: data this size belongs outside the repository


def files_under(folder: str) -> list[Path]:
    return sorted(
        p
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def test_every_tool_has_a_line_in_the_tools_readme():
    readme = (ROOT / "tools" / "README.md").read_text()
    tools = [p for p in files_under("tools") if p.name != "README.md"]
    assert tools and not any(p.parent != ROOT / "tools" for p in tools), "tools/ is flat"
    missing = [p.name for p in tools if f"`{p.name}`" not in readme]
    assert not missing, f"tools without a line in tools/README.md: {missing}"


def test_every_stored_result_is_described_in_the_results_readme():
    readme = (ROOT / "bench" / "results" / "README.md").read_text()
    results = [p for p in files_under("bench/results") if p.name != "README.md"]
    assert results
    missing = [p.name for p in results if f"`{p.name}`" not in readme]
    assert not missing, f"results that bench/results/README.md does not describe: {missing}"


def test_no_large_file_or_wheel_is_kept():
    folders = ("src", "tests", "docs", "bench", "tools")
    kept = [p for folder in folders for p in files_under(folder)]
    kept += [p for p in ROOT.iterdir() if p.is_file()]
    large = [str(p.relative_to(ROOT)) for p in kept if p.stat().st_size > LARGEST]
    wheels = [str(p.relative_to(ROOT)) for p in kept if p.suffix == ".whl"]
    assert not large and not wheels, f"large files {large}, wheels {wheels}"


def test_nothing_dates_itself_by_a_work_session():
    texts = [p for folder in ("src", "tests", "docs") for p in files_under(folder)]
    texts = [p for p in texts + [ROOT / "README.md"] if p.suffix in (".py", ".md", ".sh", ".txt")]
    found = [
        f"{p.relative_to(ROOT)}:{number}: {line.strip()}"
        for p in texts
        for number, line in enumerate(p.read_text(errors="replace").splitlines(), start=1)
        if HISTORY.search(line)
    ]
    assert not found, "say what the code does instead:\n" + "\n".join(found)


def test_the_history_pattern_finds_what_it_is_for():
    assert HISTORY.search("measured in Sess" + "ion 4") and HISTORY.search("see iss" + "ue 21")
    assert not HISTORY.search("a session-scoped fixture; round(x, 2); the seed of the inputs")
