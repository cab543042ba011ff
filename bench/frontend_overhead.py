"""The front end's fixed cost per call, on the `tiny` workload (sum_lane(x * y), four lanes).

Compares calling `accy.jit(f)` on NamedArrays (flatten the argument tree, look the signature up
in the cache, wrap the outputs) with calling the `accy.compile`d program on NumPy arrays, and
times one eager NamedArray operation. Medians of `timeit` repeats, in microseconds.

    PYTHONPATH=src python -m bench.frontend_overhead

With JAX installed (`.[bench]`), the same calls in JAX are timed in the same rounds.
"""

from __future__ import annotations

import statistics
import timeit

import numpy as np

import accy


def medians_us(calls: list, number: int = 2000, rounds: int = 25) -> list[float]:
    """Median time per call of each of `calls`, in microseconds. The calls are timed in
    interleaved rounds, so that a busy machine slows all of them alike."""
    for call in calls:
        call()  # compile and warm the caches first
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for call, collected in zip(calls, times, strict=True):
            collected.append(timeit.timeit(call, number=number) / number * 1e6)
    return [statistics.median(t) for t in times]


def jax_cases(x_np: np.ndarray, y_np: np.ndarray) -> list:
    """The same calls in JAX, when it is installed (timed in the same interleaved rounds)."""
    try:
        import jax
    except ImportError:
        return []
    x, y = jax.numpy.asarray(x_np), jax.numpy.asarray(y_np)

    def loss(x, y):
        return (x * y).sum()

    forward, vg = jax.jit(loss), jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    return [
        ("JAX: jax.jit(loss)(x, y)", lambda: forward(x, y).block_until_ready()),
        ("JAX: jax.jit(value_and_grad)", lambda: jax.block_until_ready(vg(x, y))),
        ("JAX: eager x * y", lambda: (x * y).block_until_ready()),
        ("JAX: eager x.sum()", lambda: x.sum().block_until_ready()),
    ]


def main() -> None:
    rng = np.random.default_rng(0)
    x_np, y_np = (rng.normal(size=4).astype(np.float32) for _ in range(2))
    x, y = accy.named(x_np, ("lane",)), accy.named(y_np, ("lane",))

    def loss(x, y):
        return (x * y).sum("lane")

    source = accy.trace.define(
        "tiny", [accy.spec(accy.f32, lane=4)] * 2, lambda b, a: loss(a[0], a[1])
    )
    compiled_forward = accy.compile(source)
    compiled_vg = accy.compile(accy.value_and_grad(source, wrt=(0, 1)))
    jit_forward = accy.jit(loss)
    jit_vg = accy.jit(accy.value_and_grad(loss, argnums=(0, 1)))
    cases = [
        ("forward: accy.compile(program)(x, y)", lambda: compiled_forward(x_np, y_np)),
        ("forward: accy.jit(loss)(x, y)", lambda: jit_forward(x, y)),
        ("value_and_grad: accy.compile(program)", lambda: compiled_vg(x_np, y_np)),
        ("value_and_grad: accy.jit(value_and_grad)", lambda: jit_vg(x, y)),
        ("eager x * y (NamedArray, cpu)", lambda: x * y),
        ("eager x.sum('lane')", lambda: x.sum("lane")),
    ]
    cases += jax_cases(x_np, y_np)
    rows = list(zip([name for name, _ in cases], medians_us([c for _, c in cases]), strict=True))
    for name, us in rows:
        print(f"{name:45s} {us:8.2f} us")
    print(f"jit / compile, forward:        {rows[1][1] / rows[0][1]:.2f}x")
    print(f"jit / compile, value_and_grad: {rows[3][1] / rows[2][1]:.2f}x")


if __name__ == "__main__":
    main()
