"""The package's import graph has no cycles, and the core imports nothing above it.

Every import counts, including those deferred into function bodies (a deferred import is still a
dependency); only imports under `if TYPE_CHECKING:` are left out, as they never run.
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


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The accy modules that the file at `path` imports (resolved to modules, not names)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _is_type_checking_block(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "accy")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "accy":
                return
            for alias in node.names:
                # `from pkg import module` imports the module; `from module import name` the module.
                candidate = f"{source}.{alias.name}"
                found.add(candidate if candidate in modules else source)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    found.discard(name)
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE_ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imported_modules(p, modules) for p in paths}
    # Importing a module runs its package's __init__ first; that edge is implied, not a cycle
    # of its own, so packages are left out as *sources* of the implicit edge only.
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a list of modules, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for root in graph:
        if state.get(root):
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            successor = next(stack[-1], None)
            if successor is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(successor) == 1:
                return path[path.index(successor) :] + [successor]
            elif not state.get(successor):
                state[successor] = 1
                path.append(successor)
                stack.append(iter(sorted(graph[successor])))
    return None


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_chain():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_relative_imports_resolve_to_modules(tmp_path):
    graph = import_graph()
    assert "accy.core.types" in graph["accy.core.ir"]
    assert "accy.errors" in graph["accy.core.types"]


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    # A package's __init__ importing its own submodules is how packages re-export; a submodule
    # importing a name from its package's __init__ would close a cycle and is counted.
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_core_imports_nothing_above_it():
    allowed = ("accy.core", "accy.errors")
    for module, imports in import_graph().items():
        if module.startswith("accy.core"):
            above = sorted(m for m in imports if not m.startswith(allowed))
            assert not above, f"{module} imports {above}, which sit above the core"
