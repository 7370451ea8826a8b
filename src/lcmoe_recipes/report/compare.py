"""``plan --compare h100,gb200`` / ``plan --gpus 256,512``: the search's winners for several targets side by side,
all at one precision (GPUs differ in their default precision, and FP8 doubles a GPU's peak: comparing an FP8 plan
with a BF16 one would compare precisions, not GPUs or GPU counts).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import Hardware, ModelSpec
from ..core.request import TrainingRequest
from ..errors import InfeasibleConfig
from ..planner.resolve import search
from ..planner.search import SearchResult
from ..rules.precision import choose_precision

COMMON = "bf16"


def common_precision(spec: ModelSpec, hardware: list[Hardware], wish: str | None) -> tuple[str, str]:
    """(precision, why) for comparing ``hardware``: the wish; else the precision :func:`choose_precision` picks for
    ``spec`` when it is the same on every GPU; else BF16.

    An unsupported wish is not refused here: each target's search refuses it with the precision check's fix.
    """
    if wish:
        return wish, f"{wish}, as requested (--precision)"
    defaults = {hw.key: choose_precision(spec, hw, None)[0] for hw in hardware}
    if len(set(defaults.values())) == 1:
        value = next(iter(defaults.values()))
        return value, f"{value}: the precision chosen for {spec.display} on every GPU compared"
    listed = ", ".join(f"{k} {v}" for k, v in defaults.items())
    return COMMON, (f"{COMMON}: the GPUs' defaults differ ({listed}); BF16 is the precision every GPU in the "
                    "catalogue runs, with the same numerics on each (the FP8 recipes differ by GPU generation: "
                    "blockwise on Hopper, MXFP8 on Blackwell); pass --precision to compare at another")


@dataclass(frozen=True)
class Column:
    """One target of the comparison: its request and the search's result, or why no layout fits."""

    request: TrainingRequest
    result: SearchResult | None
    error: InfeasibleConfig | None


def compare(requests: list[TrainingRequest], top: int = 1) -> list[Column]:
    """The search for each request (same model and seq_length, other GPUs / counts), through the resolver's one door
    (:func:`lcmoe_recipes.planner.resolve.search`: a request's calibration profile applies); an infeasible one is kept
    as a column that says why."""
    out = []
    for request in requests:
        try:
            out.append(Column(request, search(request, top=top), None))
        except InfeasibleConfig as exc:
            out.append(Column(request, None, exc))
    return out


ROWS = ("layout", "DP / EDP", "recompute", "offload", "GBS (tokens per step)", "memory GiB (limit)", "step s",
        "tokens/s per GPU", "tokens/s total", "TFLOP/s per GPU", "MFU", "compute s", "TP s", "CP s", "EP s", "PP s",
        "DP s", "bubble s", "tied layouts")


def column_record(column: Column) -> dict:
    """One column as numbers (seconds per step, GiB, TFLOP/s, MFU as a fraction) or ``{"error", "fix"}``."""
    request = column.request
    head = {"hardware": request.hardware, "gpus": request.num_gpus, "precision": request.precision}
    if column.result is None:
        return {**head, "error": column.error.message, "fix": column.error.fix}
    best = column.result.best
    lay, p, step, parts = best.plan.layout, best.plan, best.step, best.step.parts
    return {**head, "layout": {"tp": lay.tp, "cp": lay.cp, "ep": lay.ep, "etp": lay.etp, "pp": lay.pp,
                               "vpp": lay.vpp, "dp": lay.dp, "edp": lay.edp},
            "recompute": "full" if p.recompute_granularity == "full" else ("+".join(p.recompute_modules) or "none"),
            "offload": p.optimizer_offload_fraction, "global_batch_size": p.global_batch_size,
            "tokens_per_step": p.tokens_per_step, "memory_gib": best.memory.hbm_total / 2**30,
            "limit_gib": column.result.limit / 2**30, "step_seconds": step.step_seconds,
            "tokens_per_s_per_gpu": step.tokens_per_s_per_gpu,
            "tokens_per_s": step.tokens_per_s_per_gpu * lay.world, "tflops_per_gpu": step.tflops_per_gpu,
            "mfu": step.mfu, "parts_seconds": parts, "ties": column.result.ties, "why": column.result.why}


def format_columns(columns: list[Column]) -> tuple[list[str], list[tuple[str, ...]]]:
    """(header, rows) of the side-by-side table: one row per quantity of :data:`ROWS`, one column per target."""
    header = ["", *(f"{c.request.num_gpus} x {c.request.hardware}" for c in columns)]
    cells = []
    for column in columns:
        r = column_record(column)
        if "error" in r:
            cells.append({"layout": "no layout fits (below)"})
            continue
        lay, parts = r["layout"], r["parts_seconds"]
        cells.append({
            "layout": f"TP{lay['tp']} CP{lay['cp']} EP{lay['ep']} PP{lay['pp']}" + (f" VPP{lay['vpp']}" if lay["vpp"] else ""),
            "DP / EDP": f"{lay['dp']} / {lay['edp']}", "recompute": r["recompute"], "offload": f"{r['offload']:g}",
            "GBS (tokens per step)": f"{r['global_batch_size']} ({r['tokens_per_step'] / 1e6:.1f}M)",
            "memory GiB (limit)": f"{r['memory_gib']:.1f} ({r['limit_gib']:.0f})", "step s": f"{r['step_seconds']:.2f}",
            "tokens/s per GPU": f"{r['tokens_per_s_per_gpu']:,.0f}", "tokens/s total": f"{r['tokens_per_s']:,.0f}",
            "TFLOP/s per GPU": f"{r['tflops_per_gpu']:.0f}", "MFU": f"{r['mfu']:.1%}",
            "compute s": f"{parts['gemm'] + parts['attention']:.2f}", "TP s": f"{parts['tp_exposed']:.2f}",
            "CP s": f"{parts['cp_exposed']:.2f}", "EP s": f"{parts['ep_exposed']:.2f}",
            "PP s": f"{parts['pp_exposed']:.2f}", "DP s": f"{parts['dp_exposed']:.2f}",
            "bubble s": f"{parts['bubble']:.2f}", "tied layouts": str(r["ties"])})
    rows = [(name, *(c.get(name, "") for c in cells)) for name in ROWS]
    return header, rows
