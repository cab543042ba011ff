"""Step timing (warm-up, then the median of repeated steps) and peak resident memory."""

from __future__ import annotations

import gc
import resource
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIN_REPEATS = 5
MAX_REPEATS = 20000
MIN_WARMUP_STEPS = 2
WARMUP_FRACTION = 0.2  # of the time budget, spent on warm-up steps before timing


@dataclass(frozen=True)
class Timing:
    """Seconds per step over `repeats` timed steps."""

    median_s: float
    min_s: float
    q1_s: float
    q3_s: float
    repeats: int
    warmup_steps: int


def run_captured(
    command: list[str], timeout_s: float | None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run a bench script's worker process, its output captured as text. One that outruns
    `timeout_s` is stopped and comes back with return code -1 and "took more than N s (--timeout)"
    as its stderr, so that callers handle one kind of failure.

    >>> import sys
    >>> run_captured([sys.executable, "-c", "print(6 * 7)"], 60).stdout.strip()
    '42'
    """
    try:
        return subprocess.run(
            command, capture_output=True, text=True, env=env, check=False, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(
            command, -1, "", f"took more than {timeout_s:g} s (--timeout)"
        )


def repeats_for(step_s: float, budget_s: float) -> int:
    """How many steps of `step_s` seconds fit in `budget_s`, within [MIN_REPEATS, MAX_REPEATS]."""
    if step_s <= 0:
        return MAX_REPEATS
    return max(MIN_REPEATS, min(MAX_REPEATS, int(budget_s / step_s)))


def _timed(step: Callable[[], Any]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def warm_up(step: Callable[[], Any], budget_s: float) -> list[float]:
    """Run `step` at least MIN_WARMUP_STEPS times and for WARMUP_FRACTION of the budget."""
    times = [_timed(step)]
    while len(times) < MIN_WARMUP_STEPS or sum(times) < WARMUP_FRACTION * budget_s:
        times.append(_timed(step))
    return times


def time_steps(step: Callable[[], Any], budget_s: float, repeat: int | None = None) -> Timing:
    """Warm up, then time `repeat` steps (by default as many as fit in `budget_s`).

    `step` must return only once its outputs are ready. The garbage collector is paused while
    the steps are timed, so that a collection does not land inside one step.
    """
    warmup = warm_up(step, budget_s)
    repeats = repeat or repeats_for(min(warmup[1:]), budget_s)
    gc.collect()
    gc.disable()
    try:
        times = [_timed(step) for _ in range(repeats)]
    finally:
        gc.enable()
    q1, _, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else (times[0],) * 3
    return Timing(statistics.median(times), min(times), q1, q3, repeats, len(warmup))


def _status_kib(field: str) -> int | None:
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return None


class PeakResident:
    """Peak resident memory (RSS) of this process since `reset()`, above the RSS at `reset()`.

    On Linux `reset()` clears the kernel's high-water mark (VmHWM, by writing 5 to
    /proc/self/clear_refs), so the peak is that of the steps measured after it. Elsewhere the
    peak is `getrusage`'s max RSS since the process started (`exact` is then False).
    """

    def __init__(self) -> None:
        self.baseline = 0
        self.exact = False

    @property
    def method(self) -> str:
        return "RSS high-water mark (VmHWM)" if self.exact else "max RSS since start (getrusage)"

    def reset(self) -> None:
        gc.collect()
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.exact = _status_kib("VmHWM") is not None
        except OSError:
            self.exact = False
        self.baseline = self.in_use_bytes()

    def in_use_bytes(self) -> int:
        """The resident set size now."""
        kib = _status_kib("VmRSS")
        return 1024 * kib if kib is not None else 0

    def peak_bytes(self) -> int:
        kib = _status_kib("VmHWM") if self.exact else None
        if kib is None:
            kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return max(0, 1024 * kib - self.baseline)
