"""Devices are objects (`accy.backends.devices`): outside the backends no code compares a
device with a string (`device == "cuda"`, `device in ("cpu", "reference")`); it asks the device
(`device.is_cuda`, `device.put(array)`, `device.donating(...)`) or compares Device objects.
User-facing names are converted once, where a device is asked for (`accy.device(name)`)."""

from __future__ import annotations

import ast
from pathlib import Path

import accy

PACKAGE_ROOT = Path(accy.__file__).parent
DEVICE_NAMES = {"cpu", "cuda", "reference"}


def _is_device_name(node: ast.AST, tables: set[str]) -> bool:
    """A string constant naming a device ("cuda", "cuda:1"), a tuple/list/set holding one, or
    a module-level name bound to such a tuple (`SIMULATED = ("cpu", "reference")`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.partition(":")[0] in DEVICE_NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_device_name(element, set()) for element in node.elts)
    return isinstance(node, ast.Name) and node.id in tables


def _tables_of_names(tree: ast.Module) -> set[str]:
    """The module-level names bound to a tuple, list or set of device names."""
    found = set()
    for statement in tree.body:
        targets = statement.targets if isinstance(statement, ast.Assign) else []
        if isinstance(statement, ast.AnnAssign):
            targets = [statement.target]
        value = getattr(statement, "value", None)
        if isinstance(value, ast.Tuple | ast.List | ast.Set) and _is_device_name(value, set()):
            found.update(t.id for t in targets if isinstance(t, ast.Name))
    return found


def device_string_comparisons(path: Path) -> list[str]:
    """`line: text` of every comparison in the file at `path` with a device name."""
    tree = ast.parse(path.read_text(), str(path))
    tables = _tables_of_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_device_name(operand, tables) for operand in operands):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Match):
            patterns = [case.pattern for case in node.cases]
            if any(
                isinstance(p, ast.MatchValue) and _is_device_name(p.value, tables) for p in patterns
            ):
                found.append((node.lineno, ast.unparse(node.subject)))
    return [f"{line}: {text}" for line, text in sorted(found)]


def test_no_device_is_compared_with_a_string_outside_the_backends():
    offenders = {}
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        relative = path.relative_to(PACKAGE_ROOT).as_posix()
        if relative.startswith("backends/"):
            continue
        found = device_string_comparisons(path)
        if found:
            offenders[relative] = found
    assert not offenders, (
        "compare devices as objects (accy.device(name) at the door, then device.is_cuda, "
        f"device is CPU, ...), not with strings: {offenders}"
    )


def test_the_check_sees_every_spelling(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "a = device == 'cuda'\n"
        "b = device in ('cpu', 'reference')\n"
        "c = 'cuda:1' != device\n"
        "SIMULATED = ('reference', 'cpu')\n"
        "d = device not in SIMULATED\n"
        "e = kind == 'forward'\n"
        "f = device is CPU\n"
    )
    assert device_string_comparisons(sample) == [
        "1: device == 'cuda'",
        "2: device in ('cpu', 'reference')",
        "3: 'cuda:1' != device",
        "5: device not in SIMULATED",
    ]
