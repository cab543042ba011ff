"""A function given to `accy.jit`, `grad`, `value_and_grad`, `jvp`, `vjp`, `linearize`, `jacrev`,
`jacfwd` or `hessian` lives as long as its caller keeps it (or the transformed function): once
both are gone, it and what it closes over are freed, as a training loop that makes a closure per
step over its batch needs."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import accy

R = "reference"


def lane(values) -> accy.NamedArray:
    return accy.named(np.asarray(values, np.float32), ("lane",), device=R)


def closure_over_a_batch():
    """A loss closing over a 1 MiB batch, and weak references to both."""
    batch = np.full(2**18, 0.5, np.float32)
    first = accy.named(batch[:2].copy(), ("lane",), device=R)

    def loss(w):
        return (w * first).sum() + float(batch.sum())

    return loss, weakref.ref(loss), weakref.ref(batch)


TRANSFORMS = {
    "jit": lambda loss, w: accy.jit(loss)(w),
    "grad": lambda loss, w: accy.grad(loss)(w),
    "value_and_grad": lambda loss, w: accy.value_and_grad(loss)(w),
    "jvp": lambda loss, w: accy.jvp(loss, (w,), (w,)),
    "vjp": lambda loss, w: accy.vjp(loss, w)[1](accy.named(np.float32(1.0), (), device=R)),
    "linearize": lambda loss, w: accy.linearize(loss, w)[1](w),
    "jacrev": lambda loss, w: accy.jacrev(loss)(w),
    "jacfwd": lambda loss, w: accy.jacfwd(loss)(w),
    "hessian": lambda loss, w: accy.hessian(loss)(w),
}


@pytest.mark.slow
@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_a_transformed_closure_and_what_it_closes_over_are_freed(transform):
    loss, loss_alive, batch_alive = closure_over_a_batch()
    TRANSFORMS[transform](loss, lane([1.0, 2.0]))
    del loss
    gc.collect()
    assert loss_alive() is None, f"accy.{transform} kept the function"
    assert batch_alive() is None, f"accy.{transform} kept what the function closes over"


def test_a_transformed_function_keeps_its_function_and_its_compiled_programs():
    loss, loss_alive, _ = closure_over_a_batch()
    gradient = accy.grad(loss)
    del loss
    gc.collect()
    assert loss_alive() is not None  # the transformed function still needs it
    w = lane([1.0, 2.0])
    np.testing.assert_allclose(gradient(w).array, [0.5, 0.5])
    again = accy.grad(loss_alive())
    assert again is gradient and "accy.grad of <function" in repr(gradient)
    gradient(lane([3.0, 4.0]))
    assert gradient.staged.traces == 1
    del gradient, again
    gc.collect()
    assert loss_alive() is None


def test_a_jitted_function_is_its_wrapper_holding_the_function_and_sharing_its_programs():
    loss, loss_alive, _ = closure_over_a_batch()
    jitted = accy.jit(loss)
    assert isinstance(jitted, accy.frontend.functions.Jitted) and jitted.fn is loss
    w = lane([1.0, 2.0])
    first = jitted(w).item()
    assert jitted(w).item() == first and jitted.traces == 1
    del jitted
    gc.collect()
    again = accy.jit(loss)  # another wrapper for the caller, the same traced programs
    assert again(w).item() == first and again.traces == 1
    del loss, again
    gc.collect()
    assert loss_alive() is None


class Cycle:
    """An object that refers to itself: only the cyclic collector frees it."""

    def __init__(self):
        self.me = self


def cycle_made_while_building():
    from accy.frontend.tracing import without_collection

    with without_collection():
        garbage = Cycle()
        alive = weakref.ref(garbage)
        del garbage
    return alive


def test_garbage_of_builds_is_collected_once_its_bound_is_passed(monkeypatch):
    from accy.frontend import tracing

    monkeypatch.setattr(tracing, "UNWALKED_OBJECTS_BEFORE_COLLECTING", 0)
    monkeypatch.setitem(tracing._COLLECTION, "tracked after the last full collection", 0)
    monkeypatch.setitem(tracing._COLLECTION, "unwalked", 0)
    tracing._COLLECTION["frozen as left"] = gc.get_freeze_count()  # the state as it is
    assert cycle_made_while_building()() is None
    assert gc.isenabled()


def test_garbage_of_a_build_below_the_bound_waits_for_a_full_collection(monkeypatch):
    from accy.frontend import tracing

    monkeypatch.setattr(tracing, "UNWALKED_OBJECTS_BEFORE_COLLECTING", 10**12)
    tracing._COLLECTION["frozen as left"] = gc.get_freeze_count()  # the state as it is
    alive = cycle_made_while_building()
    assert alive() is not None and gc.isenabled() and gc.get_freeze_count() == 0
    gc.collect()
    assert alive() is None


def test_objects_the_caller_froze_stay_frozen():
    from accy.frontend import tracing

    tracing._COLLECTION["frozen as left"] = gc.get_freeze_count()  # the state as it is
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        cycle_made_while_building()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


@pytest.mark.slow
def test_building_a_program_leaves_no_cyclic_garbage():
    # Tracing, differentiating and simplifying free what they made by reference counting: a
    # build of GPT-2's step once left ~127k objects that only a full collection freed.
    def loss(w, x):
        hidden = (x * w).tanh()
        return (hidden * hidden).sum()

    def step(w, x):
        value, grad = accy.value_and_grad(loss)(w, x)
        return value, w - 0.1 * grad

    vector = accy.spec(accy.f32, n=8)
    gc.collect()
    gc.disable()
    try:
        program = accy.make_program(step)(vector, vector)
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert len(program.outputs) == 2 and program.count("unary") >= 1
    assert unreachable < 40, f"the build left {unreachable} objects in reference cycles"
