"""Fit the step model's constants (:data:`lcmoe_recipes.cost.efficiency.FITTED`) to measured TFLOP/s rows.

Which constants a set of rows fits: each row's GPU x precision GEMM efficiency; its GPU's attention scale when
softmax attention takes at least :data:`MIN_SHARE` of some row's predicted step on that GPU, and its GPU's
gated-DeltaNet scan constant likewise -- a constant a row barely exercises is left to its borrowed value rather
than fitted to noise. A row only fits constants of its own GPU (a B200 row that reads GB200's borrowed attention
scale does not move it).

The fit: least squares in log(predicted / published) over the rows, by coordinate descent with a golden-section
search per constant in log space (each constant enters the step time as 1/constant, monotone). Leave-one-out:
refit without a row (its GPU's constants), predict it; the spread of each constant over those refits is its
uncertainty. The same functions fit a user's own runs (:mod:`lcmoe_recipes.calibration.fit`).
"""

from __future__ import annotations

import math
from functools import lru_cache

from ..core.plan import Plan
from ..cost.efficiency import FITTED, constant
from ..cost.step import step_constants, step_terms

MIN_SHARE = 0.3
BOUNDS = {"attention": (0.1, 3.0), "gdn_step": (1e-7, 1e-3)}  # GEMM efficiencies: (0.02, 1.0)
ROUNDS, ITERATIONS = 6, 40
SIGNIFICANT = 3  # digits kept in the fitted table


def _bounds(kind: str) -> tuple[float, float]:
    return BOUNDS.get(kind, (0.02, 1.0))


@lru_cache(maxsize=4096)
def _terms(plan: Plan):
    return step_terms(plan)


def predicted_tflops(plan: Plan, table: dict[tuple[str, str], float]) -> float:
    """Predicted TFLOP/s per GPU of ``plan`` with the constants of ``table`` (borrowing where it has none)."""
    gemm, attn, gdn = step_constants(plan, table)
    terms = _terms(plan)
    step = terms.evaluate(gemm.value, attn.value, gdn.value)[0]
    return terms.flops / step / plan.layout.world / 1e12


def _shares(plan: Plan) -> tuple[float, float]:
    """(attention share, gated-DeltaNet share) of the predicted step at the fitted constants."""
    gemm, attn, gdn = step_constants(plan)
    terms = _terms(plan)
    step, t_mb, w, *_ = terms.evaluate(gemm.value, attn.value, gdn.value)
    softmax = sum(n * a / attn.value for a, _, n in w.attention) * (terms.micro + terms.bubble)
    scan = w.gdn_layers * terms.gdn_unit * gdn.value * (terms.micro + terms.bubble)
    return softmax / step, scan / step


def fitted_keys(rows) -> list[tuple[str, str]]:
    """The constants ``rows`` (``(plan, published TFLOP/s)``) fit (module doc), sorted."""
    keys = set()
    for plan, _ in rows:
        gpu = plan.hardware_spec.key
        keys.add((gpu, plan.precision))
        softmax, scan = _shares(plan)
        if softmax >= MIN_SHARE:
            keys.add((gpu, "attention"))
        if scan >= MIN_SHARE:
            keys.add((gpu, "gdn_step"))
    return sorted(keys)


def _error(rows, table) -> float:
    return sum(math.log(predicted_tflops(p, table) / pub) ** 2 for p, pub in rows)


def _golden(f, lo: float, hi: float) -> float:
    """The minimum of a unimodal ``f`` on [lo, hi] (log space)."""
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(ITERATIONS):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(math.exp(d))
    return math.exp((a + b) / 2)


def _round(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT}g}")


def fit(rows, start: dict[tuple[str, str], float] | None = None) -> dict[tuple[str, str], float]:
    """The constants ``rows`` (``(plan, published TFLOP/s)``) fit (:func:`fitted_keys`), fitted: a table holding
    exactly those keys (``start``'s others -- default :data:`FITTED` -- are only read while fitting, where a row
    borrows them)."""
    rows = list(rows)
    keys = fitted_keys(rows)
    table = dict(FITTED if start is None else start)
    for key in keys:  # a key fitted for the first time starts from what the rows read today
        table.setdefault(key, constant(*key, table).value)
    for _ in range(ROUNDS):
        before = dict(table)
        for key in keys:
            mine = [(p, pub) for p, pub in rows if p.hardware_spec.key == key[0]]
            table[key] = _golden(lambda v: _error(mine, {**table, key: v}), *_bounds(key[1]))
        if all(abs(math.log(table[k] / before[k])) < 1e-4 for k in keys):
            break
    return {k: _round(table[k]) for k in keys}


def leave_one_out_tables(rows: dict[str, tuple[Plan, float]]) -> dict[str, dict[tuple[str, str], float]]:
    """For each row: the constants fitted on all the *other* rows (only its GPU's are refitted; the rest keep the
    full fit). A constant no remaining row fits is absent (the row then reads its borrowed value)."""
    full = fit(rows.values())
    out = {}
    for held, (plan, _) in rows.items():
        gpu = plan.hardware_spec.key
        others = [v for k, v in rows.items() if k != held]
        mine = fit([v for v in others if v[0].hardware_spec.key == gpu], start=full)
        out[held] = {**{k: v for k, v in full.items() if k[0] != gpu}, **mine}
    return out


def leave_one_out(rows: dict[str, tuple[Plan, float]]) -> dict[str, float]:
    """For each row: predicted / published TFLOP/s with the constants fitted on all the *other* rows."""
    return {held: predicted_tflops(rows[held][0], table) / rows[held][1]
            for held, table in leave_one_out_tables(rows).items()}


def spread(tables: dict[str, dict[tuple[str, str], float]]) -> dict[tuple[str, str], tuple[float, float]]:
    """(min, max) of each constant over leave-one-out refits (constants absent from a refit are skipped)."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for table in tables.values():
        for k, v in table.items():
            lo, hi = out.get(k, (v, v))
            out[k] = (min(lo, v), max(hi, v))
    return out
