"""The results as tables (with `rich` when it is installed) and as JSON."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.runner import REPO_ROOT, Options, WorkloadResult

Row = list[str]

STEP_HEADER = [
    "workload", "accy step", "JAX step", "PyTorch step", "accy TFLOP/s", "JAX TFLOP/s",
    "PyTorch TFLOP/s", "accy/JAX", "accy/PyTorch", "accy 1st (cold)", "accy 1st (warm)",
    "JAX 1st", "PyTorch 1st",
]  # fmt: skip
MEMORY_HEADER = [
    "workload", "accy step peak", "accy held", "JAX step peak", "JAX held",
    "PyTorch step peak", "PyTorch held", "worst check error",
]  # fmt: skip


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"


def format_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}×"


def format_tflops(tflops: float | None) -> str:
    if tflops is None:
        return "-"
    return f"{tflops:.1f}" if tflops >= 10 else f"{tflops:.3g}"


def format_bytes(count: int | None) -> str:
    return "-" if count is None else f"{count / 2**20:.1f} MiB"


def _system_cell(result: WorkloadResult, system: str, value: str) -> str:
    measured = result.systems.get(system)
    if measured is None:
        return "not run"
    if measured.error is not None:
        return "error"
    if result.status != "ok":
        return result.status
    return value


def step_row(result: WorkloadResult) -> Row:
    """Median steps, ratios to accy, first calls (a step or a ratio is "-" if not measured)."""
    systems = result.systems

    def step(system: str) -> str:
        measured = systems.get(system)
        text = format_seconds(measured.median_s) if measured else "-"
        if system == "accy" and measured and measured.backend not in (None, "native"):
            text += f" ({measured.backend})"
        return _system_cell(result, system, text)

    def tflops(system: str) -> str:
        return _system_cell(result, system, format_tflops(result.tflops(system)))

    def first(system: str, warm: bool = False) -> str:
        measured = systems.get(system)
        if measured is None or measured.error is not None:
            return "-"
        return format_seconds(measured.first_call_warm_cache_s if warm else measured.first_call_s)

    return [
        result.name, step("accy"), step("jax"), step("torch"),
        tflops("accy"), tflops("jax"), tflops("torch"),
        format_ratio(result.ratio("accy", "jax")), format_ratio(result.ratio("accy", "torch")),
        first("accy"), first("accy", warm=True), first("jax"), first("torch"),
    ]  # fmt: skip


def memory_row(result: WorkloadResult) -> Row:
    """Per system: the peak of a step above what it holds, and what it holds between steps."""

    def memory(system: str) -> list[str]:
        measured = result.systems.get(system)
        peak, held = (
            (measured.peak_memory_bytes, measured.held_memory_bytes) if measured else (None, None)
        )
        return [_system_cell(result, system, format_bytes(b)) for b in (peak, held)]

    errors = [a["error"] for a in result.agreements]
    worst = f"{max(errors):.1e}" if errors else "-"
    return [result.name, *memory("accy"), *memory("jax"), *memory("torch"), worst]


def print_tables(results: Sequence[WorkloadResult], options: Options) -> None:
    """Print the step table, the memory table, then every error and mismatch message."""
    scale = "" if options.scale in (None, options.device) else f", {options.scale} scale"
    title = f"median step, TFLOP/s, first call ({options.device}, {options.dtype}{scale})"
    memory_title = "memory: peak of a step, held between steps; agreement between systems"
    _print_table(title, STEP_HEADER, [step_row(r) for r in results])
    _print_table(memory_title, MEMORY_HEADER, [memory_row(r) for r in results])
    for message in problems(results):
        print(message)


def problems(results: Sequence[WorkloadResult]) -> list[str]:
    messages = [r.message for r in results if r.message]
    for result in results:
        messages += [f"{result.name}: {s.error}" for s in result.systems.values() if s.error]
    return messages


def _print_table(title: str, header: Row, rows: Sequence[Row]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        _print_plain(title, header, rows)
        return
    table = Table(title=title)
    for index, name in enumerate(header):
        table.add_column(name, justify="left" if index == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=max(160, len(" ".join(header)) + 40)).print(table)


def _print_plain(title: str, header: Row, rows: Sequence[Row]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    print(title)
    for row in [header, *rows]:
        print(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    print()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _commit() -> str | None:
    """The commit the run measured, with "-dirty" when the working tree had changes."""
    try:
        completed = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return completed.stdout.strip()


def machine() -> dict[str, Any]:
    """Where and with what the run happened."""
    packages = ("accy", "numpy", "jax", "jaxlib", "torch", "cupy-cuda12x", "cupy-cuda13x")
    return {
        "cpu": _cpu_model(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in packages},
        "commit": _commit(),
    }


def to_json(
    results: Sequence[WorkloadResult], options: Options, load_average: tuple[float, float]
) -> dict[str, Any]:
    """The same results as the tables, with every measured detail."""
    return {
        "schema": 1,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": options.device,
        "dtype": options.dtype,
        "machine": machine(),
        "load_average_1min": {"before": load_average[0], "after": load_average[1]},
        "settings": asdict(options),
        "workloads": [workload_json(r) for r in results],
    }


def workload_json(result: WorkloadResult) -> dict[str, Any]:
    return {
        "name": result.name,
        "extents": result.extents,
        "dtype": result.dtype,
        "status": result.status,
        "message": result.message,
        "flops_per_step": result.flops_per_step,
        "flops_formula": result.flops_formula,
        "ratios": {
            "accy/jax": result.ratio("accy", "jax"),
            "accy/torch": result.ratio("accy", "torch"),
        },
        "systems": {
            name: asdict(s) | {"tflops_per_s": result.tflops(name)}
            for name, s in result.systems.items()
        },
        "agreements": result.agreements,
    }


def write_json(
    path: Path,
    results: Sequence[WorkloadResult],
    options: Options,
    load_average: tuple[float, float],
) -> None:
    """Write `to_json` to `path` (its folder is created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(results, options, load_average), indent=2) + "\n")
