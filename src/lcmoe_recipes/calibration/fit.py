"""Fit a cluster's own constants from its runs: the step model's GEMM efficiency (and attention scale, gated-DeltaNet
scan, where the runs exercise them) for that GPU x precision, and the memory model's overhead.

Each run is a training log (:mod:`lcmoe_recipes.calibration.logs`) and the Plan of the config it ran. The step
constants are fitted as the published ones are (:func:`lcmoe_recipes.calibration.fit_step.fit`: least squares in
log(predicted / measured) TFLOP/s, a constant fitted only where some run exercises it); their spread is the range
over leave-one-out refits (a single run has none: the profile says so with a zero-width range). The memory overhead
is what the most loaded rank's measured peak allocated memory holds beyond the model's listed components, the median
over the runs that logged memory (range: min - max).
"""

from __future__ import annotations

from datetime import date
from hashlib import sha256
from pathlib import Path
from statistics import median

from ..core.plan import Plan
from ..cost.efficiency import FITTED
from ..cost.memory import CALIBRATED, MemoryConstants, estimate_memory
from ..cost.step import model_flops_per_token
from .fit_step import fit, predicted_tflops
from .logs import CalibrationError, RunLog, check_against
from .profile import CalibrationProfile


def measured_tflops(plan: Plan, log: RunLog) -> float:
    """The run's TFLOP/s per GPU: logged, else the plan's model FLOPs per step over the logged step time."""
    if log.tflops_per_gpu is not None:
        return log.tflops_per_gpu
    flops = model_flops_per_token(plan) * plan.global_batch_size * plan.seq_length
    return flops / log.step_seconds / plan.layout.world / 1e12


def calibrate(runs: list[tuple[Plan, RunLog, str]], today: str | None = None) -> CalibrationProfile:
    """A :class:`CalibrationProfile` from ``runs``: (the config's Plan, its log, where the config came from).

    Raises:
        CalibrationError: no run; runs on several GPUs or precisions (one profile per GPU x precision); a log that
            is not a run of its config (:func:`lcmoe_recipes.calibration.logs.check_against`).
    """
    if not runs:
        raise CalibrationError("no run to calibrate from", "give one or more training logs")
    targets = {(p.hardware_spec.key, p.precision) for p, _, _ in runs}
    if len(targets) > 1:
        raise CalibrationError(f"the runs mix GPU x precision: {', '.join(f'{h} {p}' for h, p in sorted(targets))}",
                               "calibrate one GPU and precision per profile (one command per target)")
    hardware, precision = targets.pop()
    rows = []
    for plan, log, _ in runs:
        check_against(log, plan, model_flops_per_token(plan) * plan.global_batch_size * plan.seq_length)
        rows.append((plan, measured_tflops(plan, log)))
    table = fit(rows, start=FITTED)
    spread: dict[tuple[str, str], tuple[float, float]] = {}
    if len(rows) > 1:
        for i in range(len(rows)):
            for key, value in fit(rows[:i] + rows[i + 1:], start=FITTED).items():
                lo, hi = spread.get(key, (value, value))
                spread[key] = (min(lo, value), max(hi, value))
    overheads = []
    for plan, log, _ in runs:
        if log.max_allocated is not None:
            base = estimate_memory(plan, MemoryConstants(0.0, CALIBRATED.activation_scale)).total
            overheads.append(log.max_allocated - base)
    step_table = {**FITTED, **table}
    memory = MemoryConstants(median(overheads), CALIBRATED.activation_scale) if overheads else CALIBRATED
    records = []
    for (plan, log, config), (_, measured) in zip(runs, rows):
        records.append({
            "log": log.path, "log_sha256": _sha256(log.path), "config": config, "model": plan.model,
            "hardware": plan.hardware, "gpus": plan.layout.world, "layout": plan.layout.describe(),
            "seq_length": plan.seq_length, "micro_batch_size": plan.micro_batch_size,
            "global_batch_size": plan.global_batch_size, "precision": plan.precision,
            "iterations": [log.steady[0].iteration, log.steady[-1].iteration],
            "step_seconds": round(log.step_seconds, 4), "tflops_per_gpu": round(measured, 2),
            "predicted_tflops_published": round(predicted_tflops(plan, FITTED), 2),
            "predicted_tflops_calibrated": round(predicted_tflops(plan, step_table), 2),
            "peak_allocated_gb": None if log.max_allocated is None else round(log.max_allocated / 1e9, 3),
            "predicted_peak_gb_published": round(estimate_memory(plan).total / 1e9, 3),
            "predicted_peak_gb_calibrated": round(estimate_memory(plan, memory).total / 1e9, 3),
        })
    return CalibrationProfile(hardware, precision, today or date.today().isoformat(), table, spread,
                              memory.overhead_bytes if overheads else None,
                              (min(overheads), max(overheads)) if overheads else None, tuple(records))


def _sha256(path: str) -> str | None:
    try:
        return sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None
