"""The CUDA schedules of the two GPT-2 training steps of `bench.gpt2`, compiled without a GPU:
accy's unrolled model (`accy.demo.gpt2`, traced on CPU arrays: `tools/gpt2_chains.py`) and
`accy-layers` (`accy.models.gpt2`, its layers under a scan, traced on abstract weights). For
each: actions by kind, kernel launches by plan-step kind, GEMMs by shape and epilogue, and the
plan steps of each scan body by kind, so that what the scanned step schedules beyond the
unrolled one is visible. Without a GPU cuDNN declines, and both steps compile attention as the
composition.

    PYTHONPATH=src:. python tools/gpt2_layers_schedule.py [--dtype bf16] [--scale cuda]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

sys.path.insert(0, ".")
import accy  # noqa: E402
from accy.backends.base import backend_for, compile_artifact  # noqa: E402
from accy.backends.cuda.schedule import Gemm  # noqa: E402
from accy.core.types import i32  # noqa: E402
from accy.frontend.lowered import abstract_inputs  # noqa: E402
from accy.frontend.tracing import Staged, flatten  # noqa: E402
from bench import gpt2  # noqa: E402
from tools.gpt2_chains import step_program  # noqa: E402
from tools.gpt2_dp_schedule import describe as launches  # noqa: E402


def layers_program(s: gpt2.Scale, dtype: str):
    """The scanned step's program at scale `s`, traced on abstract weights for CUDA."""
    model = gpt2.abstract_layers_model(s)
    step, optimizer = gpt2.accy_layers_training_step(model, "cuda", dtype)
    state = accy.eval_shape(optimizer.init, flatten(model)[0])
    ids = accy.spec(i32, batch=s.batch, token=s.tokens)
    leaves, treedef = flatten(((model, *abstract_inputs((state, ids, ids))), {}))
    staged = Staged(lambda leaves, treedef: step._build((), leaves, treedef), "cuda")
    return staged.entry(leaves, treedef, ("signature",)).program


def describe(name: str, artifact) -> None:
    """`gpt2_dp_schedule.describe` (actions and launches by kind), then GEMMs by shape and by
    epilogue (cuBLASLt's bias, GELU, GELU's derivative; without a GPU every one the plan fuses
    is taken), and the plan's steps."""
    launches(name, artifact)
    gemms: Counter[tuple[int, int, int]] = Counter()
    epilogues: Counter[str] = Counter()
    for action in artifact.schedule.actions:
        if isinstance(action, Gemm):
            gemms[(action.m, action.n, action.k)] += action.batch
            epilogues[action.epilogue or "none"] += action.batch
    print(f"  GEMMs by (m, n, k), cuBLAS's terms: {dict(gemms.most_common())}")
    print(f"  GEMMs by cuBLASLt epilogue: {dict(epilogues.most_common())}")
    _plan_steps(artifact.plan, "  ")


def _plan_steps(plan, indent: str) -> None:
    """The plan's steps by (kind, operation), then each scan body's, one level deeper."""
    kinds: Counter[str] = Counter()
    for step in plan.steps:
        op = step.op
        what = "-" if op is None else op.attrs.get("op", op.kind) if op.kind == "unary" else op.kind
        kinds[f"{step.kind}/{what}"] += 1
    print(f"{indent}{len(plan.steps)} plan steps: {dict(kinds.most_common())}")
    for step in plan.steps:
        body = getattr(step, "body", None)
        if body is not None and hasattr(body, "steps"):
            _plan_steps(body, indent + "  scan body: ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=("f32", "bf16"))
    parser.add_argument("--scale", default="cuda", choices=sorted(gpt2.SCALES))
    args = parser.parse_args()
    s = gpt2.SCALES[args.scale]
    backend = backend_for("cuda")
    for name, program in (
        ("unrolled (accy)", step_program(args.dtype, True, args.scale)),
        ("scanned (accy-layers)", layers_program(s, args.dtype)),
    ):
        describe(name, compile_artifact(backend, program, None))


if __name__ == "__main__":
    main()
