"""Compare accy's step times at two source trees in one run, interleaved (A, B, A, B, ...).

    python tools/compare_commits.py OLD_TREE NEW_TREE --device cpu --workloads tiny,mlp --rounds 2
    python tools/compare_commits.py OLD_TREE NEW_TREE --frontend-overhead --rounds 30

Each tree is a checkout (e.g. `git worktree add /tmp/old <commit>`); each round runs
`python -m bench --systems accy` from that tree with its own `src` on the path, so the harness
and accy are both the tree's own. Prints the median step of each workload per tree (the lower
of the rounds' medians) and the ratio new / old.

With `--frontend-overhead`, the calls of `bench.frontend_overhead` (accy.compile, accy.jit,
eager operations) are compared instead: one long-lived process per tree builds the tree's own
cases once, then the two processes time one round each in turn (which of them goes first
alternates), so that a busy machine slows both alike; per call, the best round of each tree
(and its median round) and the ratio new / old of the best rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def tree_environment(tree: Path) -> dict[str, str]:
    """The environment that runs `tree`'s own accy and harness: its sources first, then what the
    caller's path adds (installed wheels)."""
    path = os.pathsep.join(filter(None, [str(tree / "src"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def run_bench(tree: Path, device: str, workloads: str, quick: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "result.json"
        command = [sys.executable, "-m", "bench", "--systems", "accy", "--device", device]
        command += ["--workloads", workloads, "--json", str(result)] + (
            ["--quick"] if quick else []
        )
        subprocess.run(
            command, cwd=tree, env=tree_environment(tree), check=False, capture_output=True
        )
        if not result.exists():
            return {}
        report = json.loads(result.read_text())
    steps = {}
    for workload in report["workloads"]:
        step = (workload["systems"].get("accy") or {}).get("step") or {}
        if "median_s" in step:
            steps[workload["name"]] = step["median_s"]
    return steps


# Run in each tree: builds that tree's bench.frontend_overhead cases once, prints their names,
# then for each line read (a number of calls) times one round of every case and prints the
# microseconds per call.
OVERHEAD_WORKER = """
import json, sys, timeit
import numpy as np
from bench import frontend_overhead as bench
from bench.workloads.tiny import WORKLOAD
x, y = WORKLOAD.inputs(WORKLOAD.cpu_extents, np.random.default_rng(0))
cases = bench.accy_cases(sys.argv[1], x, y)
for _, call in cases:
    call(), call()
print(json.dumps([name for name, _ in cases]), flush=True)
for line in sys.stdin:
    number = int(line)
    times = [timeit.timeit(call, number=number) / number * 1e6 for _, call in cases]
    print(json.dumps(times), flush=True)
"""


class OverheadWorker:
    """A process that times `bench.frontend_overhead`'s accy calls at one tree, a round a
    request."""

    def __init__(self, tree: Path, device: str):
        self.process = subprocess.Popen(
            [sys.executable, "-c", OVERHEAD_WORKER, device],
            cwd=tree,
            env=tree_environment(tree),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.names: list[str] = self._reply(f"{tree}: the cases could not be built")

    def _reply(self, failure: str) -> list:
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"{failure} (the worker exited with {self.process.wait()})")
        return json.loads(line)

    def round(self, number: int) -> list[float]:
        self.process.stdin.write(f"{number}\n")
        self.process.stdin.flush()
        return self._reply("a timed round failed")

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def compare_overhead(old: Path, new: Path, device: str, rounds: int, number: int) -> None:
    """Time the front end's calls at both trees in alternating rounds; print best and median."""
    workers = {"old": OverheadWorker(old, device), "new": OverheadWorker(new, device)}
    names = workers["new"].names
    if workers["old"].names != names:
        raise SystemExit(f"the trees time different cases: {workers['old'].names} vs {names}")
    times: dict[str, list[list[float]]] = {label: [] for label in workers}
    load = os.getloadavg()[0]
    for r in range(rounds):
        for label in ("old", "new") if r % 2 == 0 else ("new", "old"):
            times[label].append(workers[label].round(number))
    for worker in workers.values():
        worker.close()
    print(
        f"device {device}, {rounds} rounds x {number} calls per tree, alternating; load average "
        f"{load:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(f"old {old}\nnew {new}")
    columns = ("old best", "new best", "new/old", "old med", "new med")
    print(f"  {'call (microseconds per call)':45s} " + " ".join(f"{c:>9s}" for c in columns))
    for k, name in enumerate(names):
        old_k = [round_[k] for round_ in times["old"]]
        new_k = [round_[k] for round_ in times["new"]]
        print(
            f"  {name:45s} {min(old_k):9.2f} {min(new_k):9.2f} {min(new_k) / min(old_k):9.2f} "
            f"{statistics.median(old_k):9.2f} {statistics.median(new_k):9.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workloads", default="tiny,mlp,attention,embedding,elementwise,block")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--frontend-overhead",
        action="store_true",
        help="compare bench.frontend_overhead's accy calls instead of the workloads' steps",
    )
    parser.add_argument("--number", type=int, default=2000, help="calls per round (overhead)")
    options = parser.parse_args()
    if options.frontend_overhead:
        compare_overhead(
            options.old.resolve(),
            options.new.resolve(),
            options.device,
            options.rounds,
            options.number,
        )
        return
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
