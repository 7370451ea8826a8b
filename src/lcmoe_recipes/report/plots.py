"""--plot DIR: PNGs of the per-GPU memory breakdown against HBM, the step-time breakdown (compute and exposed
communication per collective), for one plan or several side by side, and a seq_length sweep (memory and predicted
TFLOP/s from 4K to 256K with the CP the search picks). matplotlib with the Agg backend: no display needed.

Pictures only: this module draws what it is given and never calls the search (the command lines that ask for a
plot run the search and pass the results in; :func:`lcmoe_recipes.cli.common.write_plot_files`).
"""

from __future__ import annotations

from pathlib import Path

from ..cost import estimate_memory, estimate_step
from ..cost.memory import COMPONENTS, OUTSIDE
from ..core.plan import Plan

MEMORY_PARTS = COMPONENTS + OUTSIDE  # the allocator-peak components, then the HBM outside the allocator, in order
TIME_PARTS = ("gemm", "attention", "tp_exposed", "cp_exposed", "ep_exposed", "pp_exposed", "dp_exposed", "bubble",
              "optimizer_offload", "elementwise", "memory_bound", "fp8_quantize")
# one fixed colour per component, the same in every file
COLOURS = {**dict(zip(MEMORY_PARTS, ["#4c72b0", "#a6c8e8", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#da8bc3",
                                     "#8c8c8c", "#937860", "#d9d9d9", "#ffd92f", "#a65628", "#e5c494"])),
           **dict(zip(TIME_PARTS, ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#da8bc3", "#8c8c8c",
                                   "#ccb974", "#64b5cd", "#b07aa1", "#ff9da7", "#9c755f"]))}


def _pyplot():
    try:
        import matplotlib
    except ModuleNotFoundError:
        from ..errors import LcmoeError

        raise LcmoeError("the plots need matplotlib, which is not installed in this environment",
                         "run bash scripts/setup.sh (it installs requirements/light.txt), or pip install matplotlib") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(plan: Plan) -> str:
    lay = plan.layout
    rec = ("full" if plan.recompute_granularity == "full" else "+".join(plan.recompute_modules) or "no recompute")
    off = f", offload {plan.optimizer_offload_fraction:g}" if plan.optimizer_cpu_offload else ""
    return (f"TP{lay.tp} CP{lay.cp} EP{lay.ep}\nPP{lay.pp}" + (f" VPP{lay.vpp}" if lay.vpp else "") + f" DP{lay.dp}"
            f" MBS{plan.micro_batch_size}\n{rec}{off}")  # MBS: a layout is shown at each MBS the search kept


def _stacked_bars(plans: list[Plan], series: list[dict[str, float]], parts: tuple[str, ...], ylabel: str, title: str,
                  labels: dict[str, str] | None = None):
    """A figure of one stacked bar per plan (``series[i][part]`` per segment, in the legend as ``labels[part]`` or
    the part's name); returns (plt, fig, ax, bar tops)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(plans) + 3), 5))
    tops = [0.0] * len(plans)
    for part in parts:
        values = [values_of.get(part, 0.0) for values_of in series]
        if any(values):
            ax.bar(range(len(plans)), values, bottom=tops, label=(labels or {}).get(part, part), color=COLOURS[part])
            tops = [x + y for x, y in zip(tops, values)]
    ax.set_xticks(range(len(plans)), [_label(p) for p in plans], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return plt, fig, ax, tops


def _save(plt, fig, ax, path: Path) -> Path:
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def memory_parts(mem) -> dict[str, float]:
    """GiB per :data:`MEMORY_PARTS` of a ``MemoryBreakdown``: its bar sums to ``hbm_total``, not to the allocator's
    peak alone."""
    return {n: getattr(mem, n) / 2**30 for n in MEMORY_PARTS}


def plot_memory(plans: list[Plan], path: Path, limit: float, title: str = "") -> Path:
    """Stacked bars of each plan's predicted HBM use (GiB, most loaded rank: the allocator's components, then the
    buffers outside the allocator -- the ``hbm_total`` the table shows and the planning limit judges) with the HBM
    line and the planning limit (``limit``, bytes)."""
    hw = plans[0].hardware_spec
    plt, fig, ax, _ = _stacked_bars(
        plans, [memory_parts(estimate_memory(p)) for p in plans], MEMORY_PARTS,
        "GiB of HBM per GPU (most loaded pipeline rank)",
        title or f"{plans[0].model_spec.display}, seq {plans[0].seq_length}, {plans[0].layout.world} x {hw.key}",
        {n: f"{n} (outside the allocator)" for n in OUTSIDE})
    ax.axhline(hw.hbm_gib, color="black", linestyle="-", linewidth=1.2, label=f"HBM {hw.hbm_gib:.0f} GiB")
    ax.axhline(limit / 2**30, color="red", linestyle="--", linewidth=1,
               label=f"planning limit {limit / 2**30:.0f} GiB ({limit / hw.hbm_bytes:.0%} of HBM)")
    return _save(plt, fig, ax, path)


def plot_time(plans: list[Plan], path: Path, title: str = "") -> Path:
    """Stacked bars of each plan's predicted step time: compute, exposed communication per collective, bubble."""
    steps = [estimate_step(p) for p in plans]
    plt, fig, ax, tops = _stacked_bars(
        plans, [s.parts for s in steps], TIME_PARTS, "seconds per step",
        title or f"predicted step time, {plans[0].model_spec.display}, seq {plans[0].seq_length}, "
                 f"{plans[0].layout.world} x {plans[0].hardware}")
    for i, s in enumerate(steps):
        ax.annotate(f"{s.tflops_per_gpu:.0f} TF/s\nMFU {s.mfu:.0%}", (i, tops[i]), ha="center", va="bottom", fontsize=7,
                    xytext=(0, 2), textcoords="offset points")
    ax.set_ylim(0, max(tops) * 1.22)
    return _save(plt, fig, ax, path)


def plot_sweep(points: list[tuple[int, float, float, int]], path: Path, title: str, hbm_gib: float,
               mark: int | None = None, limit: float | None = None) -> Path:
    """HBM use per GPU and predicted TFLOP/s/GPU of the search's pick at each seq_length, CP annotated.

    Args:
        points: (seq_length, predicted HBM use in bytes -- the allocator's peak and the buffers outside it, as the
            decision table and the planning limit count it --, TFLOP/s per GPU, CP) per seq_length where a layout fits.
        hbm_gib: the GPU's HBM (drawn as a line).
        mark: a seq_length to mark (the one asked for).
        limit: the planning limit in bytes (a dash-dot line on the memory axis), if given.
    """
    plt = _pyplot()
    xs = [p[0] for p in points]
    mem = [p[1] / 2**30 for p in points]
    tf = [p[2] for p in points]
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot(xs, mem, "o-", color="tab:blue", label="HBM use per GPU (GiB)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{x // 1024}K\nCP{p[3]}" for x, p in zip(xs, points)])
    ax.set_xlabel("seq_length (and the CP the search picks)")
    ax.set_ylabel("GiB per GPU", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(xs, tf, "s--", color="tab:red", label="TFLOP/s/GPU")
    ax2.set_ylabel("predicted TFLOP/s per GPU", color="tab:red")
    if mark:
        ax.axvline(mark, color="grey", linestyle=":", linewidth=1, label=f"requested seq_length {mark}")
    ax.axhline(hbm_gib, color="black", linewidth=1, label=f"HBM {hbm_gib:.0f} GiB")
    if limit is not None:
        ax.axhline(limit / 2**30, color="tab:blue", linestyle="-.", linewidth=1,
                   label=f"planning limit {limit / 2**30:.0f} GiB")
    ax.set_ylim(0, hbm_gib * 1.12)
    ax2.set_ylim(0, max(tf, default=1) * 1.15)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(plans: list[Plan], folder: str | Path, limit: float,
                sweep: list[tuple[int, float, float, int]]) -> list[Path]:
    """memory.png and time.png for ``plans`` side by side, and sweep.png (:func:`plot_sweep` of ``sweep``, the first
    plan's seq_length marked), into ``folder`` (created).

    Args:
        limit: the planning limit in bytes (a line on memory.png and sweep.png).

    Raises:
        LcmoeError: matplotlib is missing.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    first = plans[0]
    title = (f"{first.model_spec.display} on {first.layout.world} x {first.hardware}: the search's pick per "
             "seq_length")
    return [plot_memory(plans, folder / "memory.png", limit), plot_time(plans, folder / "time.png"),
            plot_sweep(sweep, folder / "sweep.png", title, first.hardware_spec.hbm_gib, mark=first.seq_length,
                       limit=limit)]


def plot_scaling(cases: list[tuple[str, list[tuple[int, dict[str, float], float]]]], path: Path,
                 description: str = "") -> Path:
    """One row per case: where each step's time goes (share of the step by part, per GPU count), and the predicted
    tokens/s per GPU with the step time.

    Args:
        cases: (title, points) with points = (GPUs, step-time parts in seconds as in ``StepEstimate.parts``,
            tokens/s per GPU), GPU counts ascending (those where a layout fits).
        description: stored in the PNG's Description text field (what the picture was drawn from).
    """
    plt = _pyplot()
    fig, axes = plt.subplots(len(cases), 2, figsize=(13, 4.2 * len(cases)), squeeze=False)
    for (title, points), (share_ax, rate_ax) in zip(cases, axes):
        xs = list(range(len(points)))
        labels = [f"{g:,}" for g, _, _ in points]
        bottoms = [0.0] * len(points)
        for part in TIME_PARTS:
            shares = [100 * parts.get(part, 0.0) / sum(parts.values()) for _, parts, _ in points]
            if any(s > 0.05 for s in shares):
                share_ax.bar(xs, shares, bottom=bottoms, label=part, color=COLOURS[part])
                bottoms = [b + s for b, s in zip(bottoms, shares)]
        share_ax.set_xticks(xs, labels, fontsize=8)
        share_ax.set_xlabel("GPUs")
        share_ax.set_ylabel("% of the predicted step")
        share_ax.set_ylim(0, 100)
        share_ax.set_title(f"{title}: where the step goes", fontsize=10)
        share_ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        rate_ax.plot(xs, [r for _, _, r in points], "o-", color="tab:red")
        rate_ax.set_xticks(xs, labels, fontsize=8)
        rate_ax.set_xlabel("GPUs")
        rate_ax.set_ylabel("predicted tokens/s per GPU", color="tab:red")
        rate_ax.set_ylim(0, max(r for _, _, r in points) * 1.15)
        step_ax = rate_ax.twinx()
        step_ax.plot(xs, [sum(parts.values()) for _, parts, _ in points], "s--", color="tab:blue")
        step_ax.set_yscale("log")
        step_ax.set_ylabel("predicted step s (log)", color="tab:blue")
        rate_ax.set_title(f"{title}: tokens/s per GPU and step time", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Description": description})
    plt.close(fig)
    return path
