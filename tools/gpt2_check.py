"""Do the GPT-2 step's gradients agree across ways of computing them? At a scale of
`bench.gpt2` (default: the GPU scale, GPT-2 small, 8 x 1024), the loss and gradients in bf16 with
fused attention (`nn.attention`) and with the composition, each against the f32 composition:
the loss difference and, per parameter, the normwise error ||g - g_f32|| / ||g_f32||; the
largest are printed. A fused-attention error far above the composition's is a bug; both at a
few bf16 roundoffs (~1e-2) is what bf16 costs.

    PYTHONPATH=src python3 tools/gpt2_check.py [--device cuda] [--scale cuda]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

sys.path.insert(0, ".")
import accy  # noqa: E402
from accy.demo.gpt2 import initial_values, loss, parameter_shapes, policy_for  # noqa: E402
from bench.gpt2 import SCALES, batch  # noqa: E402


def gradients(scale, device: str, dtype: str, fused: bool) -> tuple[float, dict]:
    policy = policy_for(dtype)
    shapes = parameter_shapes(scale)
    params = {
        name: accy.named(value, tuple(a for a, _ in shapes[name]), device=device)
        for name, value in initial_values(scale).items()
    }
    ids, targets = (accy.named(a, ("batch", "token"), device=device) for a in batch(scale))

    def loss_of(p, ids, targets):
        compute = policy.cast_to_compute(p) if policy is not None else p
        return loss(compute, ids, targets, scale, policy, fused)

    value, grads = accy.value_and_grad(loss_of)(params, ids, targets)
    host = {name: np.asarray(g.to("cpu").array, np.float64) for name, g in grads.items()}
    return float(value.item()), host


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--scale", default="cuda", choices=sorted(SCALES))
    parser.add_argument("--top", type=int, default=6)
    args = parser.parse_args()
    scale = SCALES[args.scale]
    reference_loss, reference = gradients(scale, args.device, "f32", False)
    print(f"f32 composition: loss {reference_loss:.6f}")
    for fused in (False, True):
        value, grads = gradients(scale, args.device, "bf16", fused)
        errors = {
            name: float(
                np.linalg.norm(grads[name] - reference[name])
                / max(np.linalg.norm(reference[name]), 1e-30)
            )
            for name in reference
        }
        worst = sorted(errors.items(), key=lambda item: -item[1])[: args.top]
        what = "fused attention" if fused else "composition"
        print(
            f"bf16 {what}: loss {value:.6f} (diff {value - reference_loss:+.2e}); "
            f"median error {np.median(list(errors.values())):.2e}; worst "
            + ", ".join(f"{name} {e:.2e}" for name, e in worst)
        )


if __name__ == "__main__":
    main()
