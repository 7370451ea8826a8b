"""Write docs/scaling.md and docs/scaling.png: predicted step time and per-GPU throughput from 64 to 16,384 GPUs at a
fixed number of tokens per step, where the exposed communication grows, which collective dominates, and where
adding GPUs stops paying.

    python scripts/scaling_report.py           # rewrite both files
    python scripts/scaling_report.py --check   # exit 1 if either is not what the code gives now

Everything in the page is computed here from the search (lcmoe_recipes.planner.search), the cost model and the batch rule
(lcmoe_recipes.rules.batch.tokens_per_step), so a change to any of them is one command away from a current page.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from _generated import write_or_check

from lcmoe_recipes.catalog import get_hardware, get_model
from lcmoe_recipes.cost.shapes import shapes
from lcmoe_recipes.errors import InfeasibleConfig
from lcmoe_recipes.core.request import TrainingRequest
from lcmoe_recipes.rules.batch import tokens_per_step
from lcmoe_recipes.planner.search import search_layouts

ROOT = Path(__file__).resolve().parent.parent
MD, PNG = ROOT / "docs" / "scaling.md", ROOT / "docs" / "scaling.png"
CASES = (("dsv3", 131072, "h100"), ("qwen3_235b", 131072, "gb200"))
GPUS = tuple(2**i for i in range(6, 15))  # 64 .. 16,384
PAYS = 0.10  # a doubling of the GPUs "pays" while it shortens the predicted step by at least this much
COMM = (("TP", "tp_exposed"), ("CP", "cp_exposed"), ("EP", "ep_exposed"), ("PP", "pp_exposed"), ("DP", "dp_exposed"))


def points(model: str, seq: int, hardware: str) -> tuple[int, list[tuple[int, object]]]:
    """(GBS, [(GPUs, the search's winner or the InfeasibleConfig)]) at the batch rule's tokens per step."""
    spec = get_model(model)
    gbs = max(1, tokens_per_step(spec, shapes(spec).total_params)[0] // seq)
    out = []
    for gpus in GPUS:
        try:
            out.append((gpus, search_layouts(TrainingRequest(model=model, seq_length=seq, hardware=hardware, num_gpus=gpus,
                                                   global_batch_size=gbs), top=1).best))
        except InfeasibleConfig as exc:
            out.append((gpus, exc))
    return gbs, out


def _exposed(parts: dict[str, float]) -> float:
    return sum(parts[key] for _, key in COMM)


def case_section(model: str, seq: int, hardware: str) -> tuple[list[str], tuple[str, list[tuple[int, dict, float]]]]:
    """The Markdown of one case, and its plot title and points."""
    gbs, found = points(model, seq, hardware)
    spec, hw = get_model(model), get_hardware(hardware)
    fits = [(g, b) for g, b in found if not isinstance(b, InfeasibleConfig)]
    title = f"{spec.display}, {seq // 1024}K, {hw.display}"
    lines = [f"## {title}", "",
             f"Fixed GBS {gbs} x {seq:,} tokens = {gbs * seq / 1e6:.1f}M tokens per step (MBS 1), "
             f"{fits[0][1].plan.precision if fits else 'default'} (the GPU's default precision); the planner's "
             "winner at each GPU count. Seconds are per step; `exposed` columns are communication not hidden "
             "behind compute; `speed-up` is against half the GPUs.", "",
             "| GPUs | layout | recompute, offload | step s | speed-up | tokens/s per GPU | TFLOP/s per GPU | MFU | "
             "compute s | TP s | CP s | EP s | PP s | DP s | bubble s | largest exposed collective |",
             "|" + "---|" * 16]
    previous = None
    for gpus, best in found:
        if isinstance(best, InfeasibleConfig):
            lines.append(f"| {gpus:,} | no layout fits: {best.message.split(': ', 1)[1]} |" + " |" * 14)
            previous = None
            continue
        p, step, parts = best.plan, best.step, best.step.parts
        lay = p.layout
        rec = "full" if p.recompute_granularity == "full" else ("+".join(p.recompute_modules) or "none")
        largest = max(COMM, key=lambda c: parts[c[1]])
        share = parts[largest[1]] / step.step_seconds
        lines.append(
            f"| {gpus:,} | TP{lay.tp} CP{lay.cp} EP{lay.ep} PP{lay.pp}{f' VPP{lay.vpp}' if lay.vpp else ''} DP{lay.dp} | "
            f"{rec}, {p.optimizer_offload_fraction:g} | {step.step_seconds:.2f} | "
            f"{'-' if previous is None else f'{previous / step.step_seconds:.2f}x'} | {step.tokens_per_s_per_gpu:,.0f} | "
            f"{step.tflops_per_gpu:.0f} | {step.mfu:.1%} | {parts['gemm'] + parts['attention']:.2f} | "
            + " | ".join(f"{parts[key]:.2f}" for _, key in COMM) + f" | {parts['bubble']:.2f} | "
            + (f"{largest[0]} ({share:.0%} of the step)" if parts[largest[1]] > 0 else "none") + " |")
        previous = step.step_seconds
    lines += ["", *_findings(fits, gbs), ""]
    short = f"{spec.display.split(' (')[0]}, {seq // 1024}K, {hw.key.upper()}"
    return lines, (short, [(g, b.step.parts, b.step.tokens_per_s_per_gpu) for g, b in fits])


def _findings(fits: list, gbs: int) -> list[str]:
    """Sentences computed from the points: exposed communication, the dominant collective, where DP stops growing,
    where doubling the GPUs stops paying."""
    if len(fits) < 2:
        return ["Too few GPU counts fit to say how it scales."]
    (g0, first), (g1, last) = fits[0], fits[-1]
    out = [(f"- **Exposed communication** rises from {_exposed(first.step.parts) / first.step.step_seconds:.0%} of "
            f"the step ({_exposed(first.step.parts):.2f} s) at {g0:,} GPUs to "
            f"{_exposed(last.step.parts) / last.step.step_seconds:.0%} ({_exposed(last.step.parts):.2f} s) at {g1:,}; "
            f"per-GPU throughput goes from {first.step.tokens_per_s_per_gpu:,.0f} to "
            f"{last.step.tokens_per_s_per_gpu:,.0f} tokens/s "
            f"({last.step.tokens_per_s_per_gpu / first.step.tokens_per_s_per_gpu:.0%} of the first).")]
    runs, current = [], None
    for gpus, best in fits:
        parts = best.step.parts
        name = max(COMM, key=lambda c: parts[c[1]])[0] if _exposed(parts) > 0 else "none"
        if name != current:
            runs.append((name, gpus))
            current = name
    out.append("- **Largest exposed collective**: " + "; ".join(
        f"{name} from {gpus:,} GPUs" for name, gpus in runs) + ".")
    capped = next((g for g, b in fits if b.plan.layout.dp * b.plan.micro_batch_size >= gbs), None)
    if capped:
        out.append(f"- **DP stops growing** at {capped:,} GPUs: DP·MBS reaches GBS {gbs}, so every further GPU goes "
                   "into TP, CP, EP or PP, which split one sequence finer instead of adding sequences.")
    stops = next(((a, b, sa / sb - 1) for (a, ba), (b, bb) in zip(fits, fits[1:])
                  for sa, sb in [(ba.step.step_seconds, bb.step.step_seconds)] if b == 2 * a and sa / sb - 1 < PAYS),
                 None)
    if stops:
        a, b, gain = stops
        out.append(f"- **Adding GPUs stops paying** at {a:,} -> {b:,}: the step shortens by {gain:.0%} for twice the "
                   f"GPUs (threshold here: {PAYS:.0%}).")
    else:
        out.append(f"- **Adding GPUs pays** up to {g1:,}: every doubling shortens the step by at least {PAYS:.0%}.")
    return out


def build() -> tuple[str, list]:
    lines = ["# Scaling: step time and throughput per GPU from 64 to 16,384 GPUs", "",
             "Generated by `python scripts/scaling_report.py` (docs/scaling.md and docs/scaling.png; a test fails "
             "when either is stale). Predictions of the cost model (docs/cost_model.md, docs/accuracy.md) for the "
             "planner's winner at each GPU count, at a fixed number of tokens per step: doubling the GPUs should "
             "halve the step, and the tables show where it does not. The model prices compute, the exposed TP, CP, "
             "EP, PP and DP collectives on NVLink and the scale-out network, and the pipeline bubble; it does not "
             "price network congestion, stragglers, failures or checkpointing, which grow with scale.", ""]
    plotted = []
    for model, seq, hardware in CASES:
        section, drawn = case_section(model, seq, hardware)
        lines += section
        plotted.append(drawn)
    lines += ["![share of the step by part, and tokens/s per GPU, against the GPU count](scaling.png)", ""]
    return "\n".join(lines), plotted


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    md, plotted = build()
    digest = "scaling data sha256:" + hashlib.sha256(md.encode()).hexdigest()[:16]
    code = write_or_check({MD: md}, args.check, ROOT, "python scripts/scaling_report.py")
    if args.check:
        from PIL import Image

        drawn = Image.open(PNG).text.get("Description") if PNG.exists() else None
        if drawn != digest:
            print(f"stale: docs/scaling.png (drawn from {drawn}, the data is {digest}) -- run "
                  "python scripts/scaling_report.py")
            return 1
        return code
    from lcmoe_recipes.report.plots import plot_scaling

    plot_scaling(plotted, PNG, digest)
    print(f"wrote {PNG.relative_to(ROOT)}")
    return code


if __name__ == "__main__":
    sys.exit(main())
