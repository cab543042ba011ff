"""Write the list of a peer library's test cases, the ledger `tests/peers/test_ledger.py` checks.

Each case is a test method (`Class.testName`) or a module-level test function (`test_name`) of
the peer's file, read with `ast` (nothing of the peer is imported); a parametrized case is one
case. A subclass that only re-runs its parent's cases under another setting adds none.

    python tools/list_peer_cases.py /path/to/jax tests/api_test.py --name jax-ml/jax \
        > tests/peers/cases/jax_api.txt

The first line names the repository path and commit it was read from.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path


def test_cases(source: str) -> list[str]:
    """The names of the test cases defined in `source`, in order."""
    cases = []
    for node in ast.parse(source).body:
        is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        if is_function and node.name.startswith("test"):
            cases.append(node.name)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                is_test = isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                if is_test and item.name.startswith("test"):
                    cases.append(f"{node.name}.{item.name}")
    return cases


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repository", type=Path, help="a checkout (or bare clone) of the peer")
    parser.add_argument("path", help="the test file, relative to the repository's root")
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--name", help="the repository's owner/name, for the first line")
    args = parser.parse_args(argv)
    git = ["git", "-C", str(args.repository)]
    commit = subprocess.run(
        [*git, "rev-parse", args.commit], check=True, capture_output=True, text=True
    ).stdout.strip()
    source = subprocess.run(
        [*git, "show", f"{commit}:{args.path}"], check=True, capture_output=True, text=True
    ).stdout
    sys.stdout.write(f"# {args.name or args.repository.name} {args.path} at {commit}\n")
    sys.stdout.write("".join(f"{case}\n" for case in test_cases(source)))


if __name__ == "__main__":
    main()
