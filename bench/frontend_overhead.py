"""The front end's fixed cost per call, on the `tiny` workload (sum_lane(x * y), four lanes).

In one run, timed in interleaved rounds (so that a busy machine slows every call alike):

- the forward function and its `value_and_grad`, called three ways: the `accy.compile`d
  Program on raw arrays, `accy.jit(f)` on NamedArrays (which adds flattening the argument
  tree, the cache lookup and wrapping the outputs), and `jax.jit(f)` on JAX arrays;
- one eager NamedArray operation (`x * y`, `x.sum("lane")`) against the same in JAX's eager
  dispatch.

Then it checks the issue's targets and prints whether each holds: `accy.jit` within 2x of
`accy.compile` and below `jax.jit`, and an eager operation at most JAX's eager dispatch.
Each call's best round (as `timeit` advises: the other rounds measure the machine's other
work too) and its median round, in microseconds; the claims are judged on the best rounds,
which a busy machine disturbs least. Every call waits for its outputs (JAX's
`block_until_ready`, a stream synchronize for CuPy), so no side measures only a launch.

    PYTHONPATH=src python -m bench.frontend_overhead                  # cpu
    PYTHONPATH=src python -m bench.frontend_overhead --quick          # a short smoke run
    PYTHONPATH=src python -m bench.frontend_overhead --device cuda --json out.json

JAX comes with `.[bench]` (or `.[test]`); without it the JAX rows and checks are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np

import accy

from .workloads.tiny import WORKLOAD

Case = tuple[str, Callable[[], Any]]


def times_us(calls: list[Callable[[], Any]], number: int, rounds: int) -> list[list[float]]:
    """The time per call of each of `calls` in each round, in microseconds. The calls are timed
    in interleaved rounds, so that a busy machine slows all of them alike."""
    for call in calls:
        call()  # compile and warm the caches first
        call()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for call, collected in zip(calls, times, strict=True):
            collected.append(timeit.timeit(call, number=number) / number * 1e6)
    return times


def _waiter(device: str) -> Callable[[], None]:
    """What makes a call on `device` wait for its results (nothing to do on the cpu)."""
    if device != "cuda":
        return lambda: None
    import cupy

    return lambda: cupy.cuda.get_current_stream().synchronize()


def accy_cases(device: str, x_np: np.ndarray, y_np: np.ndarray) -> list[Case]:
    """accy.compile vs accy.jit (forward, value_and_grad) and two eager operations."""
    x = accy.named(x_np, ("lane",), device=device)
    y = accy.named(y_np, ("lane",), device=device)
    raw_x, raw_y = x.array, y.array
    wait = _waiter(device)
    source = accy.trace.define("tiny", WORKLOAD.specs(WORKLOAD.cpu_extents), WORKLOAD.loss)

    def loss(x, y):  # the workload's loss, as a function of NamedArrays
        return WORKLOAD.loss(None, [x, y])

    compiled = accy.compile(source, device)
    compiled_vg = accy.compile(accy.value_and_grad(source, wrt=(0, 1)), device)
    jitted = accy.jit(loss)
    jitted_vg = accy.jit(accy.value_and_grad(loss, argnums=(0, 1)))

    def timed(call: Callable[[], Any]) -> Callable[[], Any]:
        if device == "cpu":
            return call

        def waited():
            call()
            wait()

        return waited

    return [
        ("forward: accy.compile(program)(x, y)", timed(lambda: compiled(raw_x, raw_y))),
        ("forward: accy.jit(loss)(x, y)", timed(lambda: jitted(x, y))),
        ("value_and_grad: accy.compile(program)", timed(lambda: compiled_vg(raw_x, raw_y))),
        ("value_and_grad: accy.jit(value_and_grad)", timed(lambda: jitted_vg(x, y))),
        ("eager x * y (accy)", timed(lambda: x * y)),
        ("eager x.sum('lane') (accy)", timed(lambda: x.sum("lane"))),
    ]


def jax_cases(device: str, x_np: np.ndarray, y_np: np.ndarray) -> list[Case]:
    """The same calls in JAX on `device`, when JAX is installed."""
    try:
        import jax
    except ImportError:
        return []
    platform = "gpu" if device == "cuda" else "cpu"
    try:
        target = jax.devices(platform)[0]
    except RuntimeError:
        print(f"JAX has no {platform} device here: its rows are left out")
        return []
    x, y = jax.device_put(x_np, target), jax.device_put(y_np, target)

    def loss(x, y):
        return (x * y).sum()

    forward, vg = jax.jit(loss), jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    return [
        ("forward: jax.jit(loss)(x, y)", lambda: forward(x, y).block_until_ready()),
        ("value_and_grad: jax.jit(value_and_grad)", lambda: jax.block_until_ready(vg(x, y))),
        ("eager x * y (JAX)", lambda: (x * y).block_until_ready()),
        ("eager x.sum() (JAX)", lambda: x.sum().block_until_ready()),
    ]


# (description, our call, the call it is held to, allowed ratio): a claim holds when
# t(ours) <= ratio * t(theirs)
CLAIMS = [
    (
        "forward: accy.jit within 2x of accy.compile",
        "forward: accy.jit(loss)(x, y)",
        "forward: accy.compile(program)(x, y)",
        2.0,
    ),
    (
        "forward: accy.jit below jax.jit",
        "forward: accy.jit(loss)(x, y)",
        "forward: jax.jit(loss)(x, y)",
        1.0,
    ),
    (
        "value_and_grad: accy.jit within 2x of accy.compile",
        "value_and_grad: accy.jit(value_and_grad)",
        "value_and_grad: accy.compile(program)",
        2.0,
    ),
    (
        "value_and_grad: accy.jit below jax.jit",
        "value_and_grad: accy.jit(value_and_grad)",
        "value_and_grad: jax.jit(value_and_grad)",
        1.0,
    ),
    ("eager x * y: accy at most JAX", "eager x * y (accy)", "eager x * y (JAX)", 1.0),
    ("eager sum: accy at most JAX", "eager x.sum('lane') (accy)", "eager x.sum() (JAX)", 1.0),
]


def check_claims(times: dict[str, float]) -> list[dict[str, Any]]:
    """Each claim of CLAIMS that both its calls were timed for, with its ratio and verdict."""
    results = []
    for description, ours, theirs, allowed in CLAIMS:
        if ours not in times or theirs not in times:
            continue
        ratio = times[ours] / times[theirs]
        results.append(
            {"claim": description, "ratio": ratio, "allowed": allowed, "holds": ratio <= allowed}
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--number", type=int, default=2000, help="calls per timed round")
    parser.add_argument("--rounds", type=int, default=25, help="interleaved rounds")
    parser.add_argument("--quick", action="store_true", help="200 calls x 7 rounds")
    parser.add_argument("--json", help="also write the medians and verdicts here")
    options = parser.parse_args(argv)
    number, rounds = (200, 7) if options.quick else (options.number, options.rounds)

    rng = np.random.default_rng(0)
    x_np, y_np = WORKLOAD.inputs(WORKLOAD.cpu_extents, rng)
    cases = accy_cases(options.device, x_np, y_np) + jax_cases(options.device, x_np, y_np)
    load = os.getloadavg()[0]
    rounds_us = times_us([call for _, call in cases], number, rounds)
    names = [name for name, _ in cases]
    best = {name: min(t) for name, t in zip(names, rounds_us, strict=True)}
    medians = {name: statistics.median(t) for name, t in zip(names, rounds_us, strict=True)}
    print(f"device {options.device}, {rounds} rounds x {number} calls, load average {load:.2f}")
    print(f"  {'call (best round, median round)':45s} {'best':>8s}    {'median':>8s}")
    for name in names:
        print(f"  {name:45s} {best[name]:8.2f} us {medians[name]:8.2f} us")
    claims = check_claims(best)
    for claim in claims:
        verdict = "holds" if claim["holds"] else "does NOT hold"
        print(f"  {claim['claim']:52s} {claim['ratio']:5.2f}x (<= {claim['allowed']:g}x) {verdict}")
    if options.json:
        with open(options.json, "w") as f:
            json.dump(
                {
                    "device": options.device,
                    "load": load,
                    "number": number,
                    "rounds": rounds,
                    "best_us": best,
                    "median_us": medians,
                    "claims": claims,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
