"""The summary of tools/bench_cuda_half.sh: its JSON files in OUT (the first argument) as
short tables, at most about 40 lines.

    python3 tools/bench_cuda_half_summary.py "$OUT"
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GPT2_FILES = ("gpt2-bf16.json", "gpt2-f32.json", "gpt2-bf16-accy-fused.json")


def load(out: Path, name: str) -> dict[str, Any] | None:
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        print(f"{name}: missing")
        return None


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def tf(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def bench_cell(name: str, result: dict[str, Any] | None) -> str:
    if result is None:
        return f"{name} -"
    if result["error"]:
        return f"{name} error"
    step = (result["step"] or {}).get("median_s")
    return f"{name} {ms(step)} / {tf(result['tflops_per_s'])}"


def print_bench(bench: dict[str, Any]) -> None:
    print(f"== bench {bench['dtype']} ({bench['device']}): median step ms / TFLOP/s; worst error")
    for w in bench["workloads"]:
        cells = [bench_cell(name, w["systems"].get(name)) for name in ("accy", "jax", "torch")]
        worst = max((a["error"] for a in w["agreements"]), default=None)
        worst_text = "-" if worst is None else f"{worst:.1e}"
        print(f"  {w['name']:9} {w['status']:8} " + " | ".join(cells) + f" | err {worst_text}")
        for r in w["systems"].values():
            if r["error"]:
                print(f"    {r['system']}: {r['error'].strip().splitlines()[-1][:110]}")
        if w["status"] == "mismatch":
            print("    " + w["message"].splitlines()[1][:120])


def print_attention(attention: dict[str, Any]) -> None:
    shape = attention["shape"]
    print(
        f"== attention {shape['batch']}x{shape['heads']}x{shape['tokens']}x{shape['dim']} "
        f"{attention['dtype']} causal={attention['causal']} fwd+bwd: ms, TFLOP/s"
    )
    for r in attention["rows"]:
        error = f"err {r['max_error']:.1e} vs {r['error_vs']}" if "max_error" in r else ""
        status = r["status"] if r.get("agrees", True) else "MISMATCH"
        print(
            f"  {r['system']:16} {r.get('step_ms', '-'):>8} {r.get('tflops', '-'):>7} "
            f"{error} {status[:60]}"
        )


def print_gpt2(name: str, gpt2: dict[str, Any]) -> None:
    print(f"== {name}: step ms, tokens/s, MFU, cold 1st s, warm 1st s, peak GB, loss")
    for r in gpt2["results"]:
        if "error" in r:
            print(f"  {r['system']:6} error: {' '.join(r['error'])[:100]}")
            continue
        peak = r.get("peak_device_bytes") or r["peak_host_rss_bytes"]
        warm = r.get("warm_first_step_s")
        print(
            f"  {r['system']:6} {r['step_ms']:8.1f} {r['tokens_per_s']:>9,.0f} "
            f"{(r['mfu'] or 0) * 100:5.1f}% {r['first_step_s']:6.2f} "
            f"{'-' if warm is None else f'{warm:.2f}':>5} {peak / 1e9:6.2f} "
            f"{r['loss_first']:.3f}->{r['loss_last']:.3f}"
        )


def main(out: Path) -> None:
    bench = load(out, "bench-cuda-bf16.json")
    if bench:
        print_bench(bench)
    attention = load(out, "attention-gpt2.json")
    if attention:
        print_attention(attention)
    for name in GPT2_FILES:
        gpt2 = load(out, name)
        if gpt2:
            print_gpt2(name, gpt2)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
