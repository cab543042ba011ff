"""The GPT-2 training step's CUDA schedule on one GPU and data-parallel on two, compiled
without a GPU: launches by kind, so that what the sharded step adds is visible. The step is
traced (not run) on CPU arrays of the GPU scale, as `tools/gpt2_chains.py` does; the sharded
program is `accy.mesh.shard_program` of it over {"batch": "data"}, planned for rank 0 with its
NCCL buckets (`accy.mesh.graph.compile_for_cuda`).

    PYTHONPATH=src python tools/gpt2_dp_schedule.py --dtype bf16
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

sys.path.insert(0, ".")
from accy.backends.base import backend_for, compile_artifact  # noqa: E402
from accy.backends.cuda.schedule import Batched, Launch  # noqa: E402
from accy.mesh import Mesh, shard_program  # noqa: E402
from accy.mesh.graph import compile_for_cuda  # noqa: E402
from tools.gpt2_chains import step_program  # noqa: E402


def describe(name: str, artifact) -> None:
    actions = artifact.schedule.actions
    kinds = Counter(type(a).__name__ for a in actions)
    steps = Counter()
    for action in actions:
        if isinstance(action, Launch | Batched):
            comment = artifact.kernel_comments.get(action.kernel, "?")
            steps[comment.split(": ", 1)[-1].split(" (")[0]] += 1
    print(f"{name}: {len(actions)} actions {dict(kinds)}")
    print(f"  kernels by step kind: {dict(steps.most_common())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=["f32", "bf16"])
    parser.add_argument("--gpus", type=int, default=2)
    args = parser.parse_args()
    program = step_program(args.dtype, True)
    describe("one GPU", compile_artifact(backend_for("cuda"), program, None))
    sharded = shard_program(program, Mesh(range(args.gpus), "data"), {"batch": "data"})
    plan, artifact = compile_for_cuda(sharded.program, {"data": 0}, group=1)
    describe(f"data-parallel on {args.gpus} ({len(plan.buckets)} buckets)", artifact)


if __name__ == "__main__":
    main()
