"""Fit the memory model's two constants to measured rows (least mean relative error), and leave-one-out checks.

The published peaks are torch peak *allocated* memory, so predictions compare :attr:`MemoryBreakdown.total` (the
caching allocator's peak; the dispatcher buffers outside it are not included). The fit is a grid search over
(overhead, activation scale): both enter linearly except through the transient term, so each grid point
re-evaluates the model exactly (:func:`lcmoe_recipes.cost.memory.estimate_memory`).
"""

from __future__ import annotations

from typing import Iterable

from ..core.plan import Plan
from ..cost.memory import MemoryConstants, estimate_memory

OVERHEAD_GRID = [i * 0.1e9 for i in range(0, 81)]      # 0 .. 8 GB
SCALE_GRID = [0.40 + i * 0.02 for i in range(0, 41)]   # 0.40 .. 1.20


def mean_error(rows: Iterable[tuple[Plan, float]], constants: MemoryConstants) -> float:
    """Mean |predicted / published - 1| over (plan, published bytes) rows."""
    rows = list(rows)
    return sum(abs(estimate_memory(p, constants).total / pub - 1) for p, pub in rows) / len(rows)


def fit(rows: Iterable[tuple[Plan, float]]) -> MemoryConstants:
    """The grid point with the least mean relative error. Two constants, whatever the number of rows."""
    rows = list(rows)
    # Split each row's total into a part independent of the constants and the listed activations, once.
    base = []
    for plan, pub in rows:
        unit = estimate_memory(plan, MemoryConstants(0.0, 1.0))
        fixed = (unit.parameters + unit.weight_cache + unit.gradients + unit.optimizer + unit.cuda_graphs
                 + unit.workspace + unit.detail["logits_bytes"])
        base.append((fixed, unit.detail["listed_activations"], unit.detail["largest_layer"],
                     2 * unit.detail["logits_bytes"], pub))
    best = None
    for scale in SCALE_GRID:
        for overhead in OVERHEAD_GRID:
            err = sum(abs((f + overhead + scale * a + max(lg, scale * big)) / pub - 1)
                      for f, a, big, lg, pub in base) / len(base)
            if best is None or err < best[0]:
                best = (err, MemoryConstants(overhead, round(scale, 4)))
    return best[1]


def leave_one_out_constants(rows: dict[str, tuple[Plan, float]]) -> dict[str, MemoryConstants]:
    """For each row: the constants fitted on all the *other* rows (their spread is the constants' uncertainty)."""
    return {held: fit(v for k, v in rows.items() if k != held) for held in rows}


def leave_one_out(rows: dict[str, tuple[Plan, float]]) -> dict[str, float]:
    """For each row: predicted/published with constants fitted on all the *other* rows."""
    return {held: estimate_memory(rows[held][0], c).total / rows[held][1]
            for held, c in leave_one_out_constants(rows).items()}
