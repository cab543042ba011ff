"""One measurement of one system on one workload, in a fresh process.

The harness (`bench.runner`) starts `python -m bench.worker ...` once per phase, so that a
first call is a first call (nothing traced, compiled or cached in memory yet), the systems do
not share a process (their thread pools and allocators do not interfere), and peak memory is
that process's own. The worker writes `result.json` (and for the check phase the outputs, as
`.npz`) into `--out`.

Phases:
- `check`: first call (build + first step, timed) at the workload's scale, then the outputs at
  that scale and at the small check scale, for the harness to compare;
- `first-call`: only the timed first call (accy with a warm disk cache);
- `time`: first call, then warm-up and the median of repeated steps;
- `memory`: first call, then the peak memory of two more steps (host RSS, or on a GPU the
  system's device allocator).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from bench import measure
from bench.systems import load
from bench.workloads import DTYPES, SCALES, WORKLOADS, Workload

PHASES = ("check", "first-call", "time", "memory")
MEMORY_STEPS = 2


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.worker", description=__doc__)
    parser.add_argument("--system", required=True)
    parser.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    parser.add_argument("--phase", required=True, choices=PHASES)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--scale", default=None, choices=SCALES, help="default: the device's")
    parser.add_argument("--dtype", default="f32", choices=DTYPES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timed steps")
    parser.add_argument("--repeat", type=int, default=None, help="timed steps (default: budget)")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


class Session:
    """One system, one workload, one device and precision, with its inputs already resident
    there. `scale` defaults to the device's ("cpu" or "cuda" of WORKLOADS.md)."""

    def __init__(
        self,
        system: ModuleType,
        workload: Workload,
        device: str,
        seed: int,
        dtype: str = "f32",
        scale: str | None = None,
    ):
        self.system, self.workload, self.device, self.seed = system, workload, device, seed
        self.dtype = dtype
        self.scale = scale or device
        self.args = self.resident_inputs(self.scale)

    def resident_inputs(self, scale: str) -> list[Any]:
        arrays = self.workload.make_inputs(scale, self.seed, self.dtype)
        return self.system.device_inputs(self.workload, arrays, self.device)

    def build(self, scale: str) -> Callable[..., list[Any]]:
        return self.system.build(self.workload, scale, self.device, self.dtype)

    def first_call(self) -> tuple[Callable[[], list[Any]], dict[str, float]]:
        """Build the step and run it once, timing both: what a user's first call costs."""
        start = time.perf_counter()
        step = self.build(self.scale)
        built = time.perf_counter()
        step(*self.args)
        done = time.perf_counter()
        seconds = {
            "first_call_s": done - start,
            "build_s": built - start,
            "first_run_s": done - built,
        }
        return (lambda: step(*self.args)), seconds

    def outputs_at(self, scale: str) -> list[np.ndarray]:
        step = self.build(scale)
        return self.system.to_numpy(step(*self.resident_inputs(scale)))


def save_outputs(path: Path, outputs: Sequence[np.ndarray]) -> None:
    """Save as .npz, 16-bit floats as float32 (exact; NumPy cannot load bfloat16 back)."""
    np.savez(path, *[_savable(np.asarray(a)) for a in outputs])


def _savable(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float32) if array.dtype.name in ("bfloat16", "float16") else array


def check(session: Session, out: Path) -> dict[str, Any]:
    run, result = session.first_call()
    outputs = session.system.to_numpy(run())
    save_outputs(out / "outputs.npz", outputs)
    save_outputs(out / "check_outputs.npz", session.outputs_at("check"))
    return result | {"output_dtypes": [np.asarray(a).dtype.name for a in outputs]}


def timing(session: Session, budget_s: float, repeat: int | None) -> dict[str, Any]:
    run, _ = session.first_call()
    return {"step": asdict(measure.time_steps(run, budget_s, repeat))}


def memory(session: Session) -> dict[str, Any]:
    """Memory held after the first call (compiled code, caches, buffers kept between steps),
    then the peak of steady steps above that."""
    on_gpu = session.device == "cuda"
    meter = session.system.device_memory() if on_gpu else measure.PeakResident()
    if meter is None:
        return {"memory_method": "not available"}
    gc.collect()
    before = meter.in_use_bytes()
    run, _ = session.first_call()
    gc.collect()
    held = meter.in_use_bytes() - before
    meter.reset()
    for _ in range(MEMORY_STEPS):
        run()
    return {
        "peak_memory_bytes": meter.peak_bytes(),
        "held_memory_bytes": held,
        "memory_method": meter.method,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    system = load(args.system)
    workload = WORKLOADS[args.workload]
    session = Session(system, workload, args.device, args.seed, args.dtype, args.scale)
    result: dict[str, Any] = {"backend": system.backend(args.device, args.dtype)}
    if args.phase == "check":
        result |= check(session, args.out)
    elif args.phase == "first-call":
        result |= session.first_call()[1]
    elif args.phase == "time":
        result |= timing(session, args.budget, args.repeat)
    else:
        result |= memory(session)
    (args.out / "result.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
