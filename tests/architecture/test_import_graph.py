"""The package's import graph has no cycle at all, and the core imports nothing above it.

Every import counts: at module level, deferred into function bodies (a deferred import is still
a dependency), and annotation-only ones under `if TYPE_CHECKING:` (a cycle there is a cycle of
the design, whatever the interpreter does). Cycles inside a folder count as much as those
across packages. A package's `__init__` importing its own submodules is how packages re-export;
a submodule importing a name from its package's `__init__` closes a cycle and is counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import accy

PACKAGE_ROOT = Path(accy.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_in(source: str, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The accy modules that the code `source` of module `name` imports anywhere in it
    (resolved to modules: `from pkg import module` is the module, `from module import x` the
    module)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "accy")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            if origin.split(".")[0] != "accy":
                continue
            for alias in node.names:
                candidate = f"{origin}.{alias.name}"
                found.add(candidate if candidate in modules else origin)
    found.discard(name)
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE_ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {
        module_name(p): imports_in(p.read_text(), module_name(p), p.name == "__init__.py", modules)
        for p in paths
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that import one another in a cycle (the strongly connected
    components of more than one module, or of one importing itself), each sorted."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = lowest[root] = len(index)
        stack.append(root)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is None:
                work.pop()
                if work:
                    lowest[work[-1][0]] = min(lowest[work[-1][0]], lowest[node])
                if lowest[node] == index[node]:
                    group = stack[stack.index(node) :]
                    del stack[stack.index(node) :]
                    if len(group) > 1 or node in graph[node]:
                        found.append(sorted(group))
            elif successor not in index:
                index[successor] = lowest[successor] = len(index)
                stack.append(successor)
                work.append((successor, iter(sorted(graph[successor]))))
            elif successor in stack:
                lowest[node] = min(lowest[node], index[successor])
    return found


def test_the_cycle_finder_finds_every_cycle_and_accepts_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    two = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "e"}, "e": set()}
    assert cycles(two) == [["a", "b"], ["c", "d"]]
    assert cycles({"a": {"a"}}) == [["a"]]


def test_annotation_and_function_level_imports_count():
    modules = {"accy.x", "accy.x.a", "accy.x.b", "accy.x.c", "accy.y"}
    source = """
from __future__ import annotations
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from .b import B
def f():
    from . import c
    import accy.y
"""
    assert imports_in(source, "accy.x.a", False, modules) == {"accy.x.b", "accy.x.c", "accy.y"}
    assert imports_in("from . import a", "accy.x", True, modules) == {"accy.x.a"}
    assert imports_in("from .. import y", "accy.x.a", False, modules) == {"accy.y"}


def test_relative_imports_resolve_to_modules():
    graph = import_graph()
    assert "accy.core.types" in graph["accy.core.ir"]
    assert "accy.errors" in graph["accy.core.types"]


def test_the_package_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles (each group imports itself around): " + "; ".join(
        " <-> ".join(group) for group in found
    )


def test_the_core_imports_nothing_above_it():
    allowed = ("accy.core", "accy.errors")
    for module, imports in import_graph().items():
        if module.startswith("accy.core"):
            above = sorted(m for m in imports if not m.startswith(allowed))
            assert not above, f"{module} imports {above}, which sit above the core"


def test_nothing_but_the_compat_package_imports_it():
    importers = sorted(
        module
        for module, imports in import_graph().items()
        if not module.startswith("accy.compat")
        and any(m.startswith("accy.compat") for m in imports)
    )
    assert not importers, f"{importers} import accy.compat (the fragment API lives only there)"
