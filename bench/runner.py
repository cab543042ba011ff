"""The harness side: runs the worker phases of each system on a workload, checks that the
systems agree before anything is timed, and collects the results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import accy
from bench.compare import Agreement, agreements
from bench.machine_cache import seed
from bench.systems import LABELS, SYSTEMS, missing
from bench.workloads import Workload

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKER_TIMEOUT_S = 900
# For the memory phase only: glibc returns freed blocks to the system at once, so that memory
# a warm-up step freed and kept cached does not hide the next step's peak.
MALLOC_RELEASE = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


@dataclass(frozen=True)
class Options:
    """How to run: device, seed, time budget per system and workload, fixed repeat count,
    precision ("f32" or "bf16"), scale (None: the device's), seconds a worker may take."""

    device: str = "cpu"
    seed: int = 0
    budget_s: float = 1.0
    repeat: int | None = None
    quick: bool = False
    dtype: str = "f32"
    scale: str | None = None
    worker_timeout_s: float = WORKER_TIMEOUT_S

    @property
    def workload_scale(self) -> str:
        return self.scale or self.device


@dataclass
class SystemResult:
    """What one system measured on one workload (None: not measured)."""

    system: str
    backend: str | None = None
    error: str | None = None
    first_call_s: float | None = None
    build_s: float | None = None
    first_run_s: float | None = None
    first_call_warm_cache_s: float | None = None
    warm_cache_build_s: float | None = None
    step: dict[str, Any] | None = None
    peak_memory_bytes: int | None = None
    held_memory_bytes: int | None = None
    memory_method: str | None = None
    output_dtypes: list[str] | None = None

    @property
    def label(self) -> str:
        return LABELS[self.system]

    @property
    def median_s(self) -> float | None:
        return self.step["median_s"] if self.step else None

    def tflops(self, flops_per_step: float | None) -> float | None:
        """Achieved TFLOP/s: `flops_per_step` over the median step (None if either is)."""
        if flops_per_step is None or not self.median_s:
            return None
        return flops_per_step / self.median_s / 1e12


@dataclass
class WorkloadResult:
    """One workload: "ok", "mismatch" (nothing timed) or "error" (no system ran)."""

    name: str
    extents: dict[str, int]
    status: str = "ok"
    message: str | None = None
    agreements: list[dict[str, Any]] = field(default_factory=list)
    systems: dict[str, SystemResult] = field(default_factory=dict)
    dtype: str = "f32"
    flops_per_step: float | None = None
    flops_formula: str | None = None

    def tflops(self, system: str) -> float | None:
        """The TFLOP/s `system` achieved, when it was timed and the FLOPs are counted."""
        measured = self.systems.get(system)
        return None if measured is None else measured.tflops(self.flops_per_step)

    def ratio(self, numerator: str, denominator: str) -> float | None:
        """Median step of `numerator` over that of `denominator`, when both were timed."""
        a, b = self.systems.get(numerator), self.systems.get(denominator)
        if a is None or b is None or a.median_s is None or b.median_s is None:
            return None
        return a.median_s / b.median_s

    def ran(self) -> list[SystemResult]:
        return [r for r in self.systems.values() if r.error is None]


class WorkerFailed(Exception):
    """A worker process exited with an error; the message ends with its stderr."""


def run_worker(
    system: str, workload: str, phase: str, out: Path, options: Options, env: dict[str, str]
) -> dict[str, Any]:
    """Run one worker phase in a fresh process and return its result.json."""
    command = [
        sys.executable, "-m", "bench.worker", "--system", system, "--workload", workload,
        "--phase", phase, "--device", options.device, "--seed", str(options.seed),
        "--budget", str(options.budget_s), "--out", str(out), "--dtype", options.dtype,
        "--scale", options.workload_scale,
    ]  # fmt: skip
    if options.repeat:
        command += ["--repeat", str(options.repeat)]
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    completed = subprocess.run(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": pythonpath, **env},
        capture_output=True,
        text=True,
        timeout=options.worker_timeout_s,
    )
    if completed.returncode != 0:
        tail = "\n".join(completed.stderr.strip().splitlines()[-12:])
        raise WorkerFailed(f"{LABELS[system]} {phase} phase failed on {workload}:\n{tail}")
    return json.loads((out / "result.json").read_text())


def load_outputs(path: Path) -> list[np.ndarray]:
    with np.load(path) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


class WorkloadRun:
    """Runs every phase of every available system on one workload."""

    def __init__(
        self,
        workload: Workload,
        systems: Sequence[str],
        options: Options,
        scratch: Path | None = None,
    ):
        self.workload, self.options = workload, options
        workload.check_dtype(options.dtype)
        scale = options.workload_scale
        self.result = WorkloadResult(
            workload.name,
            workload.extents(scale),
            dtype=options.dtype,
            flops_per_step=workload.flops_per_step(scale),
            flops_formula=workload.flops_formula,
        )
        self.systems = [s for s in SYSTEMS if s in systems]
        # Worker outputs and accy's disk cache; removed when the run ends.
        self.scratch = scratch or Path(tempfile.mkdtemp(prefix=f"bench-{workload.name}-"))
        # accy's disk cache: empty for the first (cold) call, then warm for the other phases.
        self.accy_env = {"ACCY_CACHE_DIR": str(self.scratch / "accy-cache")}

    def env_for(self, system: str) -> dict[str, str]:
        return self.accy_env if system == "accy" else {}

    def phase(self, system: str, phase: str, env: dict[str, str] | None = None) -> dict | None:
        """Run `phase` of `system`; on failure record the error on the system and return None."""
        out = self.scratch / system / phase
        try:
            return run_worker(
                system, self.workload.name, phase, out, self.options,
                {**self.env_for(system), **(env or {})},
            )  # fmt: skip
        except WorkerFailed as failure:
            self.result.systems[system].error = str(failure)
            return None
        except subprocess.TimeoutExpired:
            self.result.systems[system].error = (
                f"{LABELS[system]} {phase} phase on {self.workload.name} took more than "
                f"{self.options.worker_timeout_s:g} s (--worker-timeout) and was stopped"
            )
            return None

    def run(self) -> WorkloadResult:
        """Check, then (if the systems agree) time and measure memory."""
        try:
            return self.run_phases()
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def run_phases(self) -> WorkloadResult:
        self.start_systems()
        if "accy" in self.systems and self.options.device == "cpu":
            seed(Path(self.accy_env["ACCY_CACHE_DIR"]))  # empty but for per-machine libraries
        for system in self.running():
            self.record(system, self.phase(system, "check"))
        if not self.running():
            return self.fail("error", "no system ran; see each system's error")
        if not self.systems_agree():
            return self.result
        self.measure_accy_warm_first_call()
        for system in self.running():
            self.record(system, self.phase(system, "time"))
        if not self.options.quick:
            for system in self.running():
                self.record(system, self.phase(system, "memory", MALLOC_RELEASE))
        return self.result

    def start_systems(self) -> None:
        for system in self.systems:
            self.result.systems[system] = SystemResult(system, error=missing(system))

    def running(self) -> list[str]:
        return [s for s in self.systems if self.result.systems[s].error is None]

    def record(self, system: str, measured: dict | None) -> None:
        """Keep what a phase measured; a backend other than the check phase's is an error."""
        result = self.result.systems[system]
        backend = (measured or {}).get("backend", result.backend)
        if result.backend is not None and backend != result.backend:
            result.error = (
                f"{result.label} ran on backend {backend!r} after checking on {result.backend!r} "
                "(was accy changed during the run?)"
            )
            return
        for key, value in (measured or {}).items():
            setattr(result, key, value)

    def fail(self, status: str, message: str) -> WorkloadResult:
        self.result.status, self.result.message = status, message
        return self.result

    def measure_accy_warm_first_call(self) -> None:
        accy_result = self.result.systems.get("accy")
        if self.options.quick or accy_result is None or accy_result.backend != "native":
            return  # the reference evaluator has no disk cache
        if "accy" in self.running():
            warm = self.phase("accy", "first-call") or {}
            accy_result.first_call_warm_cache_s = warm.get("first_call_s")
            accy_result.warm_cache_build_s = warm.get("build_s")

    def systems_agree(self) -> bool:
        """Compare every pair of systems at full scale and each one with accy's reference
        evaluator at the check scale; on any disagreement, record a mismatch."""
        found = self.full_scale_agreements() + self.check_scale_agreements()
        self.result.agreements = [{**vars(a), "ok": a.ok} for a in found]
        wrong = [a for a in found if not a.ok]
        if wrong:
            lines = "\n".join(f"  {a.describe()}" for a in wrong)
            self.fail(
                "mismatch", f"{self.workload.name}: the systems disagree, not timed:\n{lines}"
            )
        return not wrong

    def named_outputs(self, system: str, file: str) -> tuple[str, list[np.ndarray]]:
        result = self.result.systems[system]
        name = f"{result.label} ({result.backend})" if system == "accy" else result.label
        return name, load_outputs(self.scratch / system / "check" / file)

    def full_scale_agreements(self) -> list[Agreement]:
        outputs = [self.named_outputs(s, "outputs.npz") for s in self.running()]
        found = []
        for i, actual in enumerate(outputs):
            for expected in outputs[i + 1 :]:
                found += agreements(
                    actual, expected, self.workload.output_names, self.options.dtype
                )
        return found

    def check_scale_agreements(self) -> list[Agreement]:
        dtype = self.options.dtype
        program = self.workload.value_and_grad("check", dtype)
        inputs = self.workload.make_inputs("check", self.options.seed, dtype)
        reference = ("accy reference (check scale)", accy.reference.run(program, inputs))
        found = []
        for system in self.running():
            name, outputs = self.named_outputs(system, "check_outputs.npz")
            found += agreements(
                (f"{name} (check scale)", outputs), reference, self.workload.output_names, dtype
            )
        return found
