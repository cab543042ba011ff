"""Two profiles of the same step side by side: the `actions.tsv` files that
`tools/gpt2_profile.py --dump DIR` writes (each action's time alone, in schedule order) at an
older and a newer tree whose schedules have the same actions. Prints the totals, then the
actions that changed most, by kernel comment.

    python3 tools/gpu_actions_diff.py OLD/actions.tsv NEW/actions.tsv [--top 20]
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

KERNEL_NAME = re.compile(r"^accy_k\d+(_batch\d+)? ")


def actions(path: Path) -> list[tuple[float, str]]:
    """(microseconds, what) per action, in schedule order."""
    rows = path.read_text().splitlines()[1:]
    return [(float(us), what) for _, us, what in (row.split("\t", 2) for row in rows)]


def comment(what: str) -> str:
    """An action's description without its kernel's name (which differs between trees)."""
    return KERNEL_NAME.sub("", what)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    old, new = actions(args.old), actions(args.new)
    if [comment(w) for _, w in old] != [comment(w) for _, w in new]:
        raise SystemExit("the two schedules differ: compare their actions.tsv by hand")
    kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (a, what), (b, _) in zip(old, new, strict=True):
        kind = "gemm" if what.startswith("gemm") else "library" if "library" in what else "kernel"
        kinds[kind][0] += a
        kinds[kind][1] += b
    for kind, (a, b) in kinds.items():
        print(f"{kind:8s} {a:9.1f} -> {b:9.1f} us ({b - a:+.1f})")
    total_old, total_new = sum(a for a, _ in old), sum(b for b, _ in new)
    print(f"{'all':8s} {total_old:9.1f} -> {total_new:9.1f} us ({total_new - total_old:+.1f})")
    by_what: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for (a, what), (b, _) in zip(old, new, strict=True):
        entry = by_what[comment(what)]
        entry[0] += a
        entry[1] += b
        entry[2] += 1
    print("-- most changed (summed over the actions of one description)")
    ranked = sorted(by_what.items(), key=lambda item: -abs(item[1][1] - item[1][0]))
    for what, (a, b, count) in ranked[: args.top]:
        print(f"  {a:8.1f} -> {b:8.1f} us ({b - a:+7.1f}) x{count:<3d} {what[:100]}")


if __name__ == "__main__":
    main()
