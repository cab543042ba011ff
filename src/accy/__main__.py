"""The `accy` command: `accy example` traces, prints, evaluates and differentiates a program."""

from __future__ import annotations

import argparse
import sys

import numpy as np

import accy
from accy import f32, nn, spec
from accy.errors import AccyError


def example() -> None:
    """Trace a causal-attention loss over named axes, print it, evaluate it, differentiate it."""
    tokens, channels = 4, 3

    def attention_loss(builder, args):
        queries, keys, values, mask = args
        scores = queries.contract(keys.rename("token", "key"), "channel") + mask
        mixed = nn.softmax(scores, "key").contract(values.rename("token", "key"), "key")
        return (mixed * mixed).sum(("token", "channel"))

    specs = [spec(f32, token=tokens, channel=channels)] * 3 + [spec(f32, token=tokens, key=tokens)]
    source = accy.trace.define("attention_loss", specs, attention_loss)
    print(source)

    rng = np.random.default_rng(0)
    qkv = [rng.standard_normal((tokens, channels)).astype(np.float32) for _ in range(3)]
    rows, cols = np.indices((tokens, tokens))
    mask = np.where(cols <= rows, 0.0, -30.0).astype(np.float32)
    (loss,) = accy.reference.run(source, [*qkv, mask])
    print(f"loss = {float(loss):.6f}")

    combined = accy.value_and_grad(source, wrt=(0, 1, 2))
    loss, *gradients = accy.reference.run(combined, [*qkv, mask])
    print(
        f"value_and_grad: {len(source.operations)} operations in the loss, "
        f"{len(combined.operations)} in loss + gradients"
    )
    for name, gradient in zip(("queries", "keys", "values"), gradients, strict=True):
        print(f"d loss / d {name} (token x channel):\n{np.array2string(gradient, precision=4)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="accy", description="accy: a named-axis tensor compiler with autodiff"
    )
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("example", help="trace, print, evaluate and differentiate a program")
    commands.add_parser(
        "demo", help="train a named-axis transformer (accy demo --help)", add_help=False
    )
    commands.add_parser(
        "launch",
        help="run a script in one process per GPU (accy launch --gpus N script.py)",
        add_help=False,
    )
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:
        from .demo.train import main as demo

        try:
            return demo(argv[1:])
        except AccyError as error:  # a missing extra, a damaged checkpoint: the message says all
            print(f"accy demo: {error}", file=sys.stderr)
            return 1
    if argv[:1] == ["launch"]:
        from .launch import main as launch

        return launch(argv[1:])
    arguments = parser.parse_args(argv)
    if arguments.command in (None, "example"):
        example()
    return 0


if __name__ == "__main__":
    sys.exit(main())
