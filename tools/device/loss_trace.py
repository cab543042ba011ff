"""The bf16 GPT-2 step's losses, step by step, in accy (as compiled now, and with CUDA rounding
every 16-bit operation as the reference does) and in JAX: where does accy's training diverge?

    PYTHONPATH=src python3 tools/device/loss_trace.py [--steps 10]
"""

from __future__ import annotations

import argparse
import sys

sys.path.insert(0, ".")
from bench.gpt2 import SCALES, run_accy, run_jax  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--variant", default="as-is", choices=("as-is", "round-each", "jax"))
    args = parser.parse_args()
    scale = SCALES["cuda"]
    if args.variant == "jax":
        result = run_jax(scale, "cuda", args.steps, "bf16", True)
    else:
        if args.variant == "round-each":
            from accy.codegen.c.dialect import CUDA

            object.__setattr__(CUDA, "rounds_each_half_operation", True)
        result = run_accy(scale, "cuda", args.steps, "bf16", True)
    print(args.variant, " ".join(f"{x:.4f}" for x in result["losses"]))


if __name__ == "__main__":
    main()
