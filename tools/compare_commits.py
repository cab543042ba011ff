"""Compare accy's step times at two source trees in one run, interleaved (A, B, A, B, ...).

    python tools/compare_commits.py OLD_TREE NEW_TREE --device cpu --workloads tiny,mlp --rounds 2

Each tree is a checkout (e.g. `git worktree add /tmp/old <commit>`); each round runs
`python -m bench --systems accy` from that tree with its own `src` on the path, so the harness
and accy are both the tree's own. Prints the median step of each workload per tree (the lower
of the rounds' medians) and the ratio new / old.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run_bench(tree: Path, device: str, workloads: str, quick: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "result.json"
        command = [sys.executable, "-m", "bench", "--systems", "accy", "--device", device]
        command += ["--workloads", workloads, "--json", str(result)] + (
            ["--quick"] if quick else []
        )
        # The tree's own sources first; what the caller's path adds (installed wheels) after.
        path = os.pathsep.join(filter(None, [str(tree / "src"), os.environ.get("PYTHONPATH")]))
        environment = {**os.environ, "PYTHONPATH": path}
        subprocess.run(command, cwd=tree, env=environment, check=False, capture_output=True)
        if not result.exists():
            return {}
        report = json.loads(result.read_text())
    steps = {}
    for workload in report["workloads"]:
        step = (workload["systems"].get("accy") or {}).get("step") or {}
        if "median_s" in step:
            steps[workload["name"]] = step["median_s"]
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workloads", default="tiny,mlp,attention,embedding,elementwise,block")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    best: dict[str, dict[str, float]] = {"old": {}, "new": {}}
    for _ in range(options.rounds):
        for label, tree in (("old", options.old), ("new", options.new)):
            steps = run_bench(tree.resolve(), options.device, options.workloads, options.quick)
            for name, seconds in steps.items():
                best[label][name] = min(seconds, best[label].get(name, float("inf")))
    print(f"{'workload':<12} {'old':>12} {'new':>12} {'new/old':>8}")
    for name in options.workloads.split(","):
        old, new = best["old"].get(name), best["new"].get(name)
        if old is None or new is None:
            print(
                f"{name:<12} {'failed' if old is None else f'{old * 1e6:10.1f}us':>12} "
                f"{'failed' if new is None else f'{new * 1e6:10.1f}us':>12}"
            )
            continue
        print(f"{name:<12} {old * 1e6:10.1f}us {new * 1e6:10.1f}us {new / old:8.2f}")


if __name__ == "__main__":
    main()
