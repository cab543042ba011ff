"""Only `accy.config` reads the process environment: every other module asks it
(`accy.config.name` for accy's settings, `accy.config.environment(name)` for variables accy reads
but does not own), so that each setting has one name, one type, one default and one page
(docs/config.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import accy

PACKAGE_ROOT = Path(accy.__file__).parent
DOORS = {"config.py"}
ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_reads(path: Path) -> list[str]:
    """`line: text` of every use of os.environ/os.getenv & co in the file at `path`."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        used = None
        if isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT_NAMES:
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                used = f"os.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names = {alias.name for alias in node.names} & ENVIRONMENT_NAMES
            used = f"from os import {', '.join(sorted(names))}" if names else None
        if used is not None:
            found.append((node.lineno, used))
    return [f"{line}: {used}" for line, used in sorted(found)]


def test_only_config_reads_the_environment():
    offenders = {}
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        relative = path.relative_to(PACKAGE_ROOT).as_posix()
        if relative in DOORS:
            continue
        reads = environment_reads(path)
        if reads:
            offenders[relative] = reads
    assert not offenders, (
        "read the environment through accy.config (a Setting in SETTINGS, or "
        f"config.environment(name)): {offenders}"
    )


def test_the_check_sees_every_spelling(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\nfrom os import environ\nos.environ.get('A')\nos.getenv('B')\n"
        "os.environ['C'] = '1'\n"
    )
    assert environment_reads(sample) == [
        "2: from os import environ",
        "3: os.environ",
        "4: os.getenv",
        "5: os.environ",
    ]
