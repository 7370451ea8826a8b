"""Fit the step model's constants (:data:`lcmoe_recipes.cost.step.EFFICIENCY`) to measured TFLOP/s rows.

Coordinate descent over a grid per constant, minimising the worst row's |log(predicted/published)| (the
tolerance is per row); only the constants that some row exercises move. Leave-one-out: refit without a row, predict it.
"""

from __future__ import annotations

import math

from ..plan import Plan
from .step import EFFICIENCY, _eff_key, estimate_step

GRIDS = {"fp8": [i / 100 for i in range(10, 81)], "bf16": [i / 100 for i in range(10, 81)],
         "attention": [i / 100 for i in range(10, 81)], "gdn_step": [i * 1e-6 for i in range(0, 41)]}


def used_constants(rows) -> set[tuple[str, str]]:
    """The EFFICIENCY keys some row exercises (its GPU family and precision, attention, gated-DeltaNet scan)."""
    keys = set()
    for plan, _ in rows:
        gemm = _eff_key(plan.hardware, plan.precision)
        keys |= {gemm, (gemm[0], "attention")}
        if plan.model_spec.gated_delta_net:
            keys.add((gemm[0], "gdn_step"))
    return keys


def error(rows, table) -> float:
    """Worst row's |log(predicted/published)|, plus a hundredth of the mean to break ties (minimax fit)."""
    errs = [abs(math.log(estimate_step(p, table).tflops_per_gpu / pub)) for p, pub in rows]
    return max(errs) + 0.01 * sum(errs) / len(errs)


def fit(rows: list[tuple[Plan, float]], rounds: int = 4) -> dict[tuple[str, str], float]:
    """A copy of EFFICIENCY with the constants used by ``rows`` fitted."""
    rows = list(rows)
    table = dict(EFFICIENCY)
    keys = sorted(used_constants(rows))
    for _ in range(rounds):
        for key in keys:
            best = min(GRIDS[key[1]], key=lambda v: error(rows, {**table, key: v}))
            table[key] = best
    return table


def leave_one_out_tables(rows: dict[str, tuple[Plan, float]]) -> dict[str, dict[tuple[str, str], float]]:
    """For each row: the efficiencies fitted on all the *other* rows (their spread is the constants' uncertainty)."""
    return {held: fit([v for k, v in rows.items() if k != held], rounds=2) for held in rows}


def leave_one_out(rows: dict[str, tuple[Plan, float]]) -> dict[str, float]:
    """For each row: predicted/published TFLOP/s with efficiencies fitted on all the *other* rows."""
    return {held: estimate_step(rows[held][0], table).tflops_per_gpu / rows[held][1]
            for held, table in leave_one_out_tables(rows).items()}
