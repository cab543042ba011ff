"""Where fused attention's time goes on one GPU, at GPT-2 small's shape by default (batch 8,
12 heads, 1024 tokens, dim 64, causal, bf16): forward, backward and both, of

- `torch`: PyTorch's `scaled_dot_product_attention` under each of its CUDA backends
  (`sdpa_kernel(FLASH_ATTENTION | CUDNN_ATTENTION | EFFICIENT_ATTENTION)`, and its default);
- `cudnn`: cuDNN's SDPA graphs built here directly with `nvidia-cudnn-frontend`, one variant
  per way JAX's, PyTorch's and accy's configurations differ (`VARIANTS`), each captured in a
  CUDA graph as accy runs it;
- `plans`: every plan (engine) cuDNN offers for accy's configuration, forward and backward;
- `accy`: `accy.nn.attention` compiled for cuda (its forward program, and value_and_grad of
  sum(f32(attention) * w)), under each of `ACCY_SETTINGS` (`accy.attention.cuda.Settings`),
  plus the per-action profile of the step under the first of them.

Times are CUDA-event medians of `--repeats` (at least 50) timed runs after warm-up, each run
`--inner` back-to-back calls (a captured CUDA graph where the row says so). TFLOP/s count
4·b·h·t²·d (forward) and 2.5 times that (backward), halved when causal, as
`bench.flash_attention` does. Errors are normwise against PyTorch's math backend in float32 on
the same rounded inputs. `build_s` is a graph's seconds from its first call to a built plan
(validate to build_plans), or one plan's build: with an empty cuDNN cache, its share of a cold
start. Everything runs in this one process; a part that cannot run (no GPU, no torch, no cudnn)
says why in its row.

    python -m bench.attention_probe                            # all sections, GPT-2's shape
    python -m bench.attention_probe --sections cudnn,plans --repeats 100 --json probe.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.flash_attention import flops

SECTIONS = ("torch", "cudnn", "plans", "accy")
TORCH_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "default")
MIN_REPEATS = 50
DTYPES = ("bf16", "f16")


@dataclass(frozen=True)
class Variant:
    """One configuration of cuDNN's SDPA graphs (forward and backward)."""

    name: str
    doc: str
    layout: str = "bhsd"  # memory order of q, k, v, O, dO, dQ, dK, dV: "bhsd" or "bshd"
    mask: str = "causal_mask"  # "causal_mask" or "band" (diagonal_band_right_bound=0)
    heuristics: tuple[str, ...] = ("A", "FALLBACK")
    replay_statement: bool = True  # pygraph(is_cuda_graph_replay_expected=True)
    deterministic: bool = False


VARIANTS = (
    Variant(
        "accy",
        "accy's configuration: BHSD, use_causal_mask, heuristics A then FALLBACK, "
        "is_cuda_graph_replay_expected",
    ),
    Variant("bshd", "BSHD memory order for every tensor (JAX's layout)", layout="bshd"),
    Variant("band", "causal as diagonal_band_right_bound=0, top-left", mask="band"),
    Variant("heur-a", "heuristics A only (PyTorch and XLA)", heuristics=("A",)),
    Variant("no-replay", "no is_cuda_graph_replay_expected", replay_statement=False),
    Variant("deterministic", "use_deterministic_algorithm in the backward", deterministic=True),
    Variant(
        "bshd-band-a",
        "BSHD, band mask, heuristics A: the three together",
        layout="bshd",
        mask="band",
        heuristics=("A",),
    ),
)
ACCY_SETTINGS = (
    ("heuristic", {}),
    ("fastest plan", {"plan": "fastest"}),
    ("band", {"mask": "band"}),
)


def flop_counts(batch: int, heads: int, tokens: int, dim: int, causal: bool) -> tuple[float, float]:
    """(forward, backward) FLOPs: 4·b·h·t²·d and 2.5 times that, halved when causal.

    >>> forward, backward = flop_counts(8, 12, 1024, 64, True)
    >>> round(forward / 1e9, 2), round(backward / 1e9, 2)
    (12.88, 32.21)
    """
    total = flops(batch, heads, tokens, dim, causal)
    return total / 3.5, total * 2.5 / 3.5


def tflops(count: float, ms: float | None) -> float | None:
    """`count` FLOPs in `ms` milliseconds, in TFLOP/s (None without a time).

    >>> tflops(2e12, 10.0)
    200.0
    """
    return None if not ms else round(count / (ms * 1e-3) / 1e12, 1)


def _names(given: str | None, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    if given is None:
        return known
    names = tuple(n.strip() for n in given.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(
            f"attention_probe: unknown {what} {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(known)}"
        )
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The probe's options (sections and variants checked against the known names).

    >>> a = parse_args(["--sections", "cudnn,accy", "--variants", "accy,bshd"])
    >>> a.sections, a.variants, a.tokens, a.causal
    (('cudnn', 'accy'), ('accy', 'bshd'), 1024, True)
    """
    parser = argparse.ArgumentParser(
        prog="python -m bench.attention_probe", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--dtype", default="bf16", choices=DTYPES)
    parser.add_argument("--repeats", type=int, default=100, help=f"timed runs (>= {MIN_REPEATS})")
    parser.add_argument("--inner", type=int, default=10, help="calls per timed run")
    parser.add_argument("--sections", help=f"comma-separated subset of {','.join(SECTIONS)}")
    names = ",".join(v.name for v in VARIANTS)
    parser.add_argument("--variants", help=f"cuDNN variants, a subset of {names}")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    a = parser.parse_args(argv)
    if a.repeats < MIN_REPEATS:
        parser.error(f"--repeats must be at least {MIN_REPEATS} (the median of that many runs)")
    if a.inner < 1 or min(a.batch, a.heads, a.tokens, a.dim) < 1:
        parser.error("--inner, --batch, --heads, --tokens and --dim must be positive")
    a.sections = _names(a.sections, SECTIONS, "section")
    a.variants = _names(a.variants, tuple(v.name for v in VARIANTS), "variant")
    return a


# -- timing -------------------------------------------------------------------------------------


def median_ms(run: Callable[[], Any], repeats: int, inner: int, stream: Any = None) -> float:
    """Median over `repeats` of the CUDA-event time of `inner` calls of `run`, per call, after a
    warm-up: events on torch's current stream, or on the CuPy `stream` that `run` uses."""
    import torch

    if stream is None:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        record = lambda event: event.record()  # noqa: E731
        elapsed = lambda: start.elapsed_time(stop)  # noqa: E731
    else:
        import cupy

        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        record = lambda event: event.record(stream)  # noqa: E731
        elapsed = lambda: cupy.cuda.get_elapsed_time(start, stop)  # noqa: E731
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        record(start)
        for _ in range(inner):
            run()
        record(stop)
        stop.synchronize()
        samples.append(elapsed() / inner)
    return statistics.median(samples)


def captured(run: Callable[[], Any]) -> Callable[[], Any]:
    """`run` captured once into a CUDA graph (after a warm-up run on a side stream): the
    returned function replays it, so host work is out of the timing, as in accy's step."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def normwise(got: Any, expected: Any) -> float:
    """‖got - expected‖ / ‖expected‖ in float64 (torch tensors)."""
    got, expected = got.double(), expected.double()
    return float((got - expected).norm() / expected.norm().clamp_min(1e-30))


# -- the inputs and the reference ---------------------------------------------------------------


class Inputs:
    """q, k, v, dO in (b, h, s, d) order, in the dtype, and PyTorch's math reference of O,
    dQ, dK, dV in float32 on the same rounded values."""

    def __init__(self, a: argparse.Namespace):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.a = a
        self.dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
        generator = torch.Generator(device="cuda").manual_seed(0)
        shape = (a.batch, a.heads, a.tokens, a.dim)
        self.q, self.k, self.v, self.do = (
            torch.randn(shape, device="cuda", generator=generator).to(self.dtype) for _ in range(4)
        )
        exact = [x.float().requires_grad_() for x in (self.q, self.k, self.v)]
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(*exact, is_causal=a.causal)
        grads = torch.autograd.grad(out, exact, self.do.float())
        self.expected = {"o": out.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2]}

    def errors(self, got: dict[str, Any]) -> float:
        """The largest normwise error of the outputs in `got` (O, dQ, dK, dV in (b, h, s, d))."""
        return max(normwise(got[name], self.expected[name]) for name in got)


# -- PyTorch ------------------------------------------------------------------------------------


def torch_rows(a: argparse.Namespace, inputs: Inputs) -> list[dict[str, Any]]:
    import contextlib

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for backend in TORCH_BACKENDS:
        row: dict[str, Any] = {"section": "torch", "variant": f"torch {backend}"}
        scope = (
            contextlib.nullcontext()
            if backend == "default"
            else sdpa_kernel(getattr(SDPBackend, backend))
        )
        try:
            with scope:
                q, k, v = (
                    x.detach().clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v)
                )

                def forward(q=q, k=k, v=v):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)

                out = forward()
                grads = torch.autograd.grad(out, (q, k, v), inputs.do, retain_graph=True)
                row["max_error"] = inputs.errors(
                    {"o": out, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
                )

                def backward(out=out, q=q, k=k, v=v):
                    return torch.autograd.grad(out, (q, k, v), inputs.do, retain_graph=True)

                def both(q=q, k=k, v=v):
                    return torch.autograd.grad(forward(), (q, k, v), inputs.do)

                row["fwd_ms"] = median_ms(forward, a.repeats, a.inner)
                row["bwd_ms"] = median_ms(backward, a.repeats, a.inner)
                row["both_ms"] = median_ms(both, a.repeats, a.inner)
                row["status"] = "ok (eager)"
        except Exception as error:  # a backend this build or GPU lacks
            row["status"] = f"unavailable: {type(error).__name__}: {str(error)[:160]}"
        rows.append(row)
    return rows


# -- cuDNN, built here --------------------------------------------------------------------------


def _strides(layout: str, b: int, h: int, s: int, d: int) -> list[int]:
    """Element strides of (b, h, s, d) dims in memory order `layout`.

    >>> _strides("bhsd", 2, 3, 4, 5), _strides("bshd", 2, 3, 4, 5)
    ([60, 20, 5, 1], [60, 5, 15, 1])
    """
    if layout == "bhsd":
        return [h * s * d, s * d, d, 1]
    return [s * h * d, d, h * d, 1]


def _in_layout(x: Any, layout: str) -> Any:
    """A (b, h, s, d) tensor with the same values whose memory order is `layout`."""
    return x.contiguous() if layout == "bhsd" else x.transpose(1, 2).contiguous().transpose(1, 2)


class CudnnCase:
    """The forward and backward graphs of one variant, with their buffers (torch tensors)."""

    def __init__(self, a: argparse.Namespace, variant: Variant, inputs: Inputs):
        import cudnn
        import torch

        self.cudnn, self.variant = cudnn, variant
        self.handle = cudnn.create_handle()
        dims = [a.batch, a.heads, a.tokens, a.dim]
        self.stride = _strides(variant.layout, *dims)
        io = {"bf16": cudnn.data_type.BFLOAT16, "f16": cudnn.data_type.HALF}[a.dtype]
        self.io, self.dims, self.a = io, dims, a
        self.data = {n: _in_layout(getattr(inputs, n), variant.layout) for n in ("q", "k", "v")}
        self.data["do"] = _in_layout(inputs.do, variant.layout)
        for name in ("o", "dq", "dk", "dv"):
            self.data[name] = _in_layout(torch.empty_like(inputs.q), variant.layout)
        self.data["stats"] = torch.empty(a.batch, a.heads, a.tokens, 1, device="cuda")
        self.build_s: dict[str, float] = {}  # seconds from the graph's first call to its plan
        self.forward, self.forward_tensors = self._graph("forward")
        self.backward, self.backward_tensors = self._graph("backward")
        self.workspace = {
            part: torch.empty(max(int(g.get_workspace_size()), 1), dtype=torch.uint8, device="cuda")
            for part, g in (("forward", self.forward), ("backward", self.backward))
        }

    def _pygraph(self) -> Any:
        cudnn = self.cudnn
        options = dict(
            io_data_type=self.io,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=self.handle,
        )
        if self.variant.replay_statement:
            return cudnn.pygraph(**options, is_cuda_graph_replay_expected=True)
        return cudnn.pygraph(**options)

    def _mask(self) -> dict[str, Any]:
        if not self.a.causal:
            return {}
        if self.variant.mask == "band":
            top_left = self.cudnn.diagonal_alignment.TOP_LEFT
            return dict(diagonal_alignment=top_left, diagonal_band_right_bound=0)
        return dict(use_causal_mask=True)

    def _graph(self, part: str) -> tuple[Any, dict[str, Any]]:
        start = time.perf_counter()
        built = self._built_graph(part)
        self.build_s[part] = round(time.perf_counter() - start, 4)
        return built

    def _built_graph(self, part: str) -> tuple[Any, dict[str, Any]]:
        cudnn, graph, dims = self.cudnn, self._pygraph(), self.dims
        stats_stride = [dims[1] * dims[2], dims[2], 1, 1]

        def tensor(name, data_type=None, stride=None, dim=None):
            return graph.tensor(
                name=name,
                dim=dim or dims,
                stride=stride or self.stride,
                data_type=data_type or self.io,
            )

        t = {n: tensor(n) for n in ("q", "k", "v")}
        common = dict(attn_scale=self.a.dim**-0.5, **self._mask())
        stats_dims = dims[:3] + [1]
        if part == "forward":
            o, stats = graph.sdpa(name="sdpa", **t, generate_stats=True, **common)
            o.set_output(True).set_dim(dims).set_stride(self.stride).set_data_type(self.io)
            stats.set_output(True).set_dim(stats_dims).set_stride(stats_stride)
            stats.set_data_type(cudnn.data_type.FLOAT)
            t |= {"o": o, "stats": stats}
        else:
            t["o"], t["do"] = tensor("o"), tensor("do")
            t["stats"] = tensor("stats", cudnn.data_type.FLOAT, stats_stride, stats_dims)
            if self.variant.deterministic:
                common["use_deterministic_algorithm"] = True
            grads = graph.sdpa_backward(
                name="sdpa_backward",
                q=t["q"],
                k=t["k"],
                v=t["v"],
                o=t["o"],
                dO=t["do"],
                stats=t["stats"],
                **common,
            )
            for name, g in zip(("dq", "dk", "dv"), grads, strict=True):
                g.set_output(True).set_dim(dims).set_stride(self.stride).set_data_type(self.io)
                t[name] = g
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([getattr(cudnn.heur_mode, m) for m in self.variant.heuristics])
        graph.check_support()
        graph.build_plans()
        return graph, t

    def run(self, part: str, index: int | None = None) -> None:
        """Execute `part` on torch's current stream (plan `index`, default the selected)."""
        import torch

        graph = self.forward if part == "forward" else self.backward
        tensors = self.forward_tensors if part == "forward" else self.backward_tensors
        self.cudnn.set_stream(self.handle, torch.cuda.current_stream().cuda_stream)
        pack = {int(t.uid): self.data[name].data_ptr() for name, t in tensors.items()}
        workspace = self.workspace[part].data_ptr()
        if index is None:
            graph.execute(pack, workspace, handle=self.handle)
        else:
            graph.execute_plan_at_index(pack, workspace, index, handle=self.handle)

    def outputs(self) -> dict[str, Any]:
        return {n: self.data[n] for n in ("o", "dq", "dk", "dv")}


def plan_of(graph: Any) -> str:
    from accy.attention.cuda import plan_name

    return plan_name(graph)


def cudnn_rows(a: argparse.Namespace, inputs: Inputs) -> list[dict[str, Any]]:
    rows = []
    for variant in (v for v in VARIANTS if v.name in a.variants):
        row: dict[str, Any] = {"section": "cudnn", "variant": f"cudnn {variant.name}"}
        row["doc"] = variant.doc
        try:
            case = CudnnCase(a, variant, inputs)
            row["plans"] = f"{plan_of(case.forward)} / {plan_of(case.backward)}"
            row["build_s"] = case.build_s
            case.run("forward")
            case.run("backward")
            row["max_error"] = inputs.errors(case.outputs())
            forward = captured(lambda case=case: case.run("forward"))
            backward = captured(lambda case=case: case.run("backward"))

            def both(case=case):
                case.run("forward")
                case.run("backward")

            row["fwd_ms"] = median_ms(forward, a.repeats, a.inner)
            row["bwd_ms"] = median_ms(backward, a.repeats, a.inner)
            row["both_ms"] = median_ms(captured(both), a.repeats, a.inner)
            row["status"] = "ok (CUDA graph)"
        except Exception as error:
            row["status"] = f"failed: {type(error).__name__}: {str(error)[:200]}"
            print(traceback.format_exc(), file=sys.stderr)
        rows.append(row)
    return rows


def plan_rows(a: argparse.Namespace, inputs: Inputs) -> list[dict[str, Any]]:
    """Every plan cuDNN offers for accy's configuration (the first variant), forward and
    backward, each timed on its own (plans that do not build or run say why)."""
    rows = []
    try:
        case = CudnnCase(a, VARIANTS[0], inputs)
    except Exception as error:
        return [{"section": "plans", "variant": "plans", "status": f"failed: {error}"}]
    for part in ("forward", "backward"):
        graph = case.forward if part == "forward" else case.backward
        for index in range(graph.get_execution_plan_count()):
            row: dict[str, Any] = {"section": "plans", "variant": f"{part} plan {index}"}
            try:
                row["plans"] = str(graph.get_plan_name_at_index(index))
                start = time.perf_counter()
                graph.build_plan_at_index(index)
                row["build_s"] = round(time.perf_counter() - start, 4)
                need = int(graph.get_workspace_size_plan_at_index(index))
                if need > case.workspace[part].numel():
                    import torch

                    case.workspace[part] = torch.empty(need, dtype=torch.uint8, device="cuda")
                case.run(part, index)
                names = ("o",) if part == "forward" else ("dq", "dk", "dv")
                row["max_error"] = inputs.errors({n: case.data[n] for n in names})
                ms = median_ms(captured(lambda p=part, i=index: case.run(p, i)), a.repeats, a.inner)
                row["fwd_ms" if part == "forward" else "bwd_ms"] = ms
                row["status"] = "ok (CUDA graph)"
            except Exception as error:
                row["status"] = f"failed: {type(error).__name__}: {str(error)[:160]}"
            rows.append(row)
    return rows


# -- accy ---------------------------------------------------------------------------------------


def _accy_programs(a: argparse.Namespace) -> tuple[Any, Any]:
    """(forward program, value_and_grad of sum(f32(attention) * w) wrt q, k, v)."""
    import accy
    from accy import nn

    dtype = {"bf16": accy.bf16, "f16": accy.f16}[a.dtype]
    q_spec = accy.spec(dtype, batch=a.batch, head=a.heads, token=a.tokens, dim=a.dim)
    k_spec = accy.spec(dtype, batch=a.batch, head=a.heads, key=a.tokens, dim=a.dim)

    def attend(b, args):
        return nn.attention(*args, causal=a.causal)

    def loss(b, args):
        return (nn.attention(*args[:3], causal=a.causal).convert(accy.f32) * args[3]).sum()

    forward = accy.trace.define("probe_forward", [q_spec, k_spec, k_spec], attend)
    step = accy.trace.define(
        "probe_step", [q_spec, k_spec, k_spec, q_spec.with_dtype(accy.f32)], loss
    )
    return forward, accy.value_and_grad(step, wrt=(0, 1, 2))


def _accy_runner(executable: Any, inputs: list[Any], stream: Any) -> tuple[Callable, list[int]]:
    """A function running `executable` on the torch tensors `inputs` and fresh output buffers,
    on the CuPy `stream`, and the buffers' addresses (inputs, then outputs)."""
    import cupy

    from accy.backends.cuda.executable import device_dtype

    outputs = [cupy.empty(t.extents, device_dtype(t)) for t in executable.program.output_types]
    addresses = [x.data_ptr() for x in inputs] + [o.data.ptr for o in outputs]
    run = lambda: executable.run(addresses, stream)  # noqa: E731
    run.outputs = outputs  # kept alive with the function
    return run, addresses


def accy_rows(a: argparse.Namespace, inputs: Inputs) -> list[dict[str, Any]]:
    import cupy
    import torch

    import accy
    from accy.attention import cuda as accy_cuda
    from accy.backends.base import CACHE

    w = torch.linspace(-1, 1, inputs.q.numel(), device="cuda").reshape(inputs.q.shape)
    tensors = [inputs.q.contiguous(), inputs.k.contiguous(), inputs.v.contiguous()]
    stream = cupy.cuda.Stream(non_blocking=True)
    rows, original = [], accy_cuda.settings()
    forward_program, step_program = _accy_programs(a)
    for label, changes in ACCY_SETTINGS:
        row: dict[str, Any] = {"section": "accy", "variant": f"accy nn.attention, {label}"}
        try:
            accy_cuda.configure(accy_cuda.Settings(**{**asdict(original), **changes}))
            CACHE.clear()  # compiled executables keep the settings they were built with
            forward = accy.compile(forward_program, device="cuda")
            step = accy.compile(step_program, device="cuda")
            run_forward, _ = _accy_runner(forward, tensors, stream)
            run_step, addresses = _accy_runner(step, [*tensors, w], stream)
            torch.cuda.synchronize()
            reasons = list(accy_cuda.decline_reasons().values())
            row["plans"] = _accy_plans(step) or f"declined: {reasons[-1:]}"
            row["fwd_ms"] = median_ms(run_forward, a.repeats, a.inner, stream)
            row["both_ms"] = median_ms(run_step, a.repeats, a.inner, stream)
            row["bwd_ms"] = row["both_ms"] - row["fwd_ms"]
            row["status"] = "ok (accy's CUDA graph; bwd = both - fwd, with the loss)"
            if label == ACCY_SETTINGS[0][0]:
                row["profile"] = _accy_profile(step, addresses)
        except Exception as error:
            row["status"] = f"failed: {type(error).__name__}: {str(error)[:200]}"
            print(traceback.format_exc(), file=sys.stderr)
        rows.append(row)
    accy_cuda.configure(original)
    CACHE.clear()
    return rows


def _accy_plans(executable: Any) -> str:
    """The cuDNN plans of the library steps of `executable` (names, in schedule order)."""
    from accy.attention.cuda import CudnnAttention, built, plan_name
    from accy.backends.cuda.schedule import Library

    names = []
    for action in executable.compiled.schedule.actions:
        if isinstance(action, Library):
            step = executable.compiled.externals[action.symbol].library
            if isinstance(step, CudnnAttention):
                names.append(f"{step.problem.part}: {plan_name(built(step.problem).graph)}")
    return "; ".join(names)


def _accy_profile(executable: Any, addresses: list[int]) -> list[list[Any]]:
    """The step's actions run one by one outside its graph (`CudaFragment.profile`): the ten
    slowest (what, ms), and the total."""
    actions = executable.fragment.profile(addresses, repeats=20)
    slowest = sorted(actions, key=lambda x: -x[1])[:10]
    return [[what[:90], round(ms, 4)] for what, ms in slowest] + [
        ["total of all actions", round(sum(ms for _, ms in actions), 4)]
    ]


# -- the report ---------------------------------------------------------------------------------


def finish(rows: list[dict[str, Any]], a: argparse.Namespace) -> list[dict[str, Any]]:
    """Each row with its TFLOP/s (forward + backward where it has both, else what it has)."""
    forward, backward = flop_counts(a.batch, a.heads, a.tokens, a.dim, a.causal)
    for row in rows:
        both = row.get("both_ms")
        if both is None and row.get("fwd_ms") is not None and row.get("bwd_ms") is not None:
            both = row["fwd_ms"] + row["bwd_ms"]
        if both is not None:
            row["tflops"] = tflops(forward + backward, both)
        elif row.get("bwd_ms") is not None:
            row["tflops"] = tflops(backward, row["bwd_ms"])
        elif row.get("fwd_ms") is not None:
            row["tflops"] = tflops(forward, row["fwd_ms"])
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as one text table (times in ms).

    >>> print(table([{"variant": "x", "fwd_ms": 0.1, "bwd_ms": 0.25, "tflops": 100.0,
    ...               "status": "ok"}]))
    variant | fwd ms | bwd ms | fwd+bwd ms | TFLOP/s | max error | plans | status
    x | 0.1 | 0.25 | - | 100 | - | - | ok
    """

    def cell(value: Any, digits: int = 4) -> str:
        if value is None:
            return "-"
        return f"{value:.{digits}g}" if isinstance(value, float) else str(value)

    lines = ["variant | fwd ms | bwd ms | fwd+bwd ms | TFLOP/s | max error | plans | status"]
    for r in rows:
        fields = [r["variant"], cell(r.get("fwd_ms")), cell(r.get("bwd_ms"))]
        fields += [cell(r.get("both_ms")), cell(r.get("tflops")), cell(r.get("max_error"), 2)]
        fields += [cell(r.get("plans")), r.get("status", "-")]
        lines.append(" | ".join(fields))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("accy.attention.cuda").setLevel(logging.INFO)  # plans built, timed, kept
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
    except Exception as error:
        print(f"attention_probe: needs PyTorch with a CUDA device ({error})")
        return 1
    inputs = Inputs(a)
    makers = {"torch": torch_rows, "cudnn": cudnn_rows, "plans": plan_rows, "accy": accy_rows}
    rows: list[dict[str, Any]] = []
    for section in a.sections:
        try:
            made = makers[section](a, inputs)
        except Exception as error:  # a section that cannot start (no cudnn, no cupy) says why
            made = [{"section": section, "variant": section, "status": f"failed: {error}"}]
        rows += finish(made, a)
        for row in made:
            print(json.dumps(row), flush=True)
        if a.json:  # after every section, so that a run stopped early keeps what it measured
            a.json.parent.mkdir(parents=True, exist_ok=True)
            report = {"args": {k: v for k, v in vars(a).items() if k != "json"}, "rows": rows}
            a.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    causal = "causal, " if a.causal else ""
    print(f"shape: batch {a.batch}, heads {a.heads}, tokens {a.tokens}, dim {a.dim}, {causal}")
    print(f"{a.dtype}; median of {a.repeats} runs of {a.inner} calls")
    print(table(rows))
    for row in rows:
        for what, ms in row.get("profile", []):
            print(f"  profile {row['variant']}: {ms} ms  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
