"""Where does a training step's GPU time go? Builds the step of `bench.gpt2` (the GPU scale,
GPT-2 small, 8 x 1024) as `accy.jit` traces it, or with `--workload NAME` the value-and-grad
program of a `bench` workload at its GPU scale, compiles it for CUDA, times the whole step as
one graph, then each action of its schedule alone (`CudaFragment.profile`: each replayed as a
graph of its own): totals per category (GEMMs with their achieved TFLOP/s, generated kernels,
library steps such as cuDNN attention), then the slowest actions.

    PYTHONPATH=src python3 tools/gpt2_profile.py [--dtype bf16] [--attention fused] [--top 25]
    PYTHONPATH=src python3 tools/gpt2_profile.py --workload block --dtype bf16
    PYTHONPATH=src python3 tools/gpt2_profile.py --dtype bf16 --attention fused --scale cuda-b64
    PYTHONPATH=src python3 tools/gpt2_profile.py --workload llama1b --dtype bf16 [--fp8 mlp,head]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict

import cupy
import numpy as np

sys.path.insert(0, ".")
from accy.backends.base import backend_for, compile_artifact  # noqa: E402
from accy.backends.cuda.runtime import load  # noqa: E402
from bench.gpt2 import SCALES, accy_inputs, accy_step  # noqa: E402

GEMM = re.compile(r"gemm (\d+)x(\d+)x(\d+) batch (\d+)")


def traced_program(dtype: str, fused: bool, scale=None):
    """The step's program at `scale` (the GPU scale by default), as the first call of the
    jitted step builds it."""
    scale = scale or SCALES["cuda"]
    step = accy_step(scale, "cuda", dtype, fused)
    step(*accy_inputs(scale, "cuda", dtype=dtype))
    (staged,) = step._staged.values()
    (entry,) = staged.cache.values()
    return entry.program


def llama1b_program(dtype: str, fp8: tuple[str, ...] | None = None):
    """The llama1b workload's step program (`bench.llama1b`, its GPU scale; `fp8`: the GEMM
    groups in FP8), as the first call of the jitted step builds it."""
    import accy
    from bench import llama1b

    scale = llama1b.SCALES["cuda"]
    step, model, state = llama1b.accy_step(scale, "cuda", dtype, fp8)
    ids, targets = (accy.named(a, ("batch", "token"), device="cuda") for a in llama1b.batch(scale))
    step(model, state, ids, targets)
    (staged,) = step._staged.values()
    (entry,) = staged.cache.values()
    return entry.program


def workload_program(name: str, dtype: str):
    """The value-and-grad program `bench` compiles for workload `name` at its GPU scale."""
    from bench.workloads import WORKLOADS

    return WORKLOADS[name].value_and_grad("cuda", dtype)


def random_buffers(program, vocab: int = 1) -> list:
    """Random arguments and output buffers: floats ~ N(0, 0.02^2), integers (token ids and
    targets) uniform below `vocab`. Ids that are all one token make every row of every
    activation alike, and GEMMs on such operands draw less power and run faster than on a
    real batch (a bf16 8192^3 product: 788 TFLOP/s on random data, 894 on zeros)."""
    buffers = []
    for t in (*program.parameter_types, *program.output_types):
        dtype = t.dtype.numpy
        if np.issubdtype(dtype, np.integer):
            buffers.append(cupy.random.randint(0, vocab, t.extents).astype(dtype))
        else:
            buffers.append((cupy.random.standard_normal(t.extents) * 0.02).astype(dtype))
    return buffers


def category(what: str) -> str:
    if what.startswith("gemm"):
        return "gemm"
    if what.startswith("library"):
        return "library"
    return "kernel"


def whole_step_ms(fragment, addresses: list[int], repeats: int = 20) -> float:
    """Milliseconds per run of the whole step (its graph) on the current stream."""
    stream = cupy.cuda.get_current_stream()
    for _ in range(3):
        fragment.run(addresses, stream)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(repeats):
        fragment.run(addresses, stream)
    stop.record(stream)
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / repeats


def configure_cudnn(plan: str, min_blocks: int | None) -> None:
    """cuDNN attention's settings for the graphs built from now on."""
    import dataclasses

    from accy.attention.cuda import configure, settings

    changes = {"plan": plan} | ({} if min_blocks is None else {"min_blocks": min_blocks})
    configure(dataclasses.replace(settings(), **changes))


def dump(folder: str, fragment, actions) -> None:
    """Every action's median time in schedule order, and the source they were compiled from."""
    from pathlib import Path

    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    lines = [f"{index}\t{ms * 1e3:.1f}\t{what}" for index, (what, ms) in enumerate(actions)]
    (path / "actions.tsv").write_text("index\tus\twhat\n" + "\n".join(lines) + "\n")
    (path / "kernels.cu").write_text(fragment.compiled.source)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=("f32", "bf16"))
    parser.add_argument("--attention", default="composition", choices=("composition", "fused"))
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--workload",
        default="gpt2",
        help="gpt2, llama1b, attention-gpt2 (bench.flash_attention's preset), or a bench workload",
    )
    parser.add_argument(
        "--dump", metavar="DIR", help="write each action's time (actions.tsv) and the CUDA C"
    )
    parser.add_argument("--scale", default="cuda", choices=sorted(SCALES), help="gpt2's scale")
    parser.add_argument("--fp8", default=None, help="llama1b: GEMM groups in FP8 (mlp,head)")
    parser.add_argument("--cudnn-plan", choices=("heuristic", "fastest"), default="heuristic")
    parser.add_argument(
        "--cudnn-min-blocks", type=int, default=None, help="accy.attention.cuda.Settings"
    )
    args = parser.parse_args()
    configure_cudnn(args.cudnn_plan, args.cudnn_min_blocks)
    vocab = 1  # other workloads' integer arguments are indices of their own: zeros are valid
    if args.workload == "gpt2":
        scale = SCALES[args.scale]
        program, vocab = traced_program(args.dtype, args.attention == "fused", scale), scale.vocab
    elif args.workload == "llama1b":
        from bench.llama1b import SCALES as LLAMA_SCALES

        fp8 = tuple(args.fp8.split(",")) if args.fp8 else None
        program, vocab = llama1b_program(args.dtype, fp8), LLAMA_SCALES["cuda"].vocab
    elif args.workload == "attention-gpt2":  # bench.flash_attention --preset gpt2
        from bench.flash_attention import PRESETS, accy_program

        preset = argparse.Namespace(**{**PRESETS["gpt2"], "dtype": args.dtype})
        program = accy_program(preset, args.attention == "fused")
    else:
        program = workload_program(args.workload, args.dtype)
    start = time.perf_counter()
    # As `accy.compile` does: custom calls (fused attention) link to their records' kernels.
    fragment = load(compile_artifact(backend_for("cuda"), program, None))
    seconds = time.perf_counter() - start
    print(f"compile + load: {seconds:.1f} s; {len(program.operations)} operations")
    buffers = random_buffers(program, vocab)
    addresses = [b.data.ptr for b in buffers]
    print(f"the whole step as one graph: {whole_step_ms(fragment, addresses):.3f} ms")
    actions = fragment.profile(addresses, repeats=10)
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0.0])
    for what, ms in actions:
        total = totals[category(what)]
        total[0] += ms
        total[1] += 1
        match = GEMM.match(what)
        if match:
            m, n, k, b = map(int, match.groups())
            total[2] += 2.0 * m * n * k * b
    whole = sum(ms for _, ms in actions)
    print(f"== {args.workload} {args.dtype}, attention {args.attention}: {whole:.2f} ms")
    for name, (ms, count, flops) in sorted(totals.items(), key=lambda item: -item[1][0]):
        rate = f", {flops / ms / 1e9:.0f} TFLOP/s" if flops else ""
        print(f"  {name:8s} {ms:8.2f} ms in {count:4d} actions{rate}")
    if args.dump:
        dump(args.dump, fragment, actions)
    print("-- slowest actions")
    for what, ms in sorted(actions, key=lambda item: -item[1])[: args.top]:
        print(f"  {ms * 1e3:8.1f} us  {what[:150]}")


if __name__ == "__main__":
    main()
