"""Registers per thread of the GPT-2 training step's CUDA kernels, compiled without a GPU:
the step is traced (not run) on CPU arrays of the GPU scale (as `tools/gpt2_chains.py` does),
compiled for CUDA (`compile_artifact`), and its source built with `nvcc -cubin -Xptxas -v`
for sm_90. Prints the kernels by register count with their comments and how many blocks of 256
threads fit on a multiprocessor (65,536 registers), most registers first.

    PYTHONPATH=src python tools/gpu_registers.py --dtype bf16 --match AdamW
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, ".")
from accy.backends.base import backend_for, compile_artifact  # noqa: E402
from tools.gpt2_chains import step_program  # noqa: E402

REGISTERS_PER_SM = 65536
THREADS = 256
USAGE = re.compile(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", re.S)
SPILLS = re.compile(r"Compiling entry function '(\w+)'.*?(\d+) bytes spill stores", re.S)


def register_counts(source: str) -> dict[str, tuple[int, int]]:
    """{kernel: (registers, spilled bytes)} from ptxas's report on `source` built for sm_90."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "step.cu"
        path.write_text(source)
        done = subprocess.run(
            [
                "nvcc",
                "-arch=sm_90",
                "-cubin",
                "-Xptxas",
                "-v",
                "-o",
                str(path.with_suffix(".cubin")),
                str(path),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    report = done.stderr.split("ptxas info    : Compiling entry function")
    counts = {}
    for part in report[1:]:
        text = "Compiling entry function" + part
        name = re.match(r"Compiling entry function '(\w+)'", text).group(1)
        registers = re.search(r"Used (\d+) registers", text)
        spills = re.search(r"(\d+) bytes spill stores", text)
        counts[name] = (
            int(registers.group(1)) if registers else 0,
            int(spills.group(1)) if spills else 0,
        )
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=["f32", "bf16"])
    parser.add_argument("--match", default="", help="only kernels whose comment holds this")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--source", help="also write the step's CUDA C here")
    args = parser.parse_args()
    artifact = compile_artifact(backend_for("cuda"), step_program(args.dtype, True), None)
    if args.source:
        Path(args.source).write_text(artifact.source)
    counts = register_counts(artifact.source)
    rows = []
    for name, (registers, spilled) in counts.items():
        comment = artifact.kernel_comments.get(name.removesuffix("_batched"), "?")
        if args.match in comment:
            rows.append((registers, spilled, name, comment))
    print("registers | spilled | blocks/SM | kernel | comment")
    for registers, spilled, name, comment in sorted(rows, reverse=True)[: args.top]:
        blocks = REGISTERS_PER_SM // (THREADS * max(registers, 1))
        print(f"{registers:>9} | {spilled:>7} | {blocks:>9} | {name} | {comment[:90]}")


if __name__ == "__main__":
    main()
