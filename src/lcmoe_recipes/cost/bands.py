"""How far the cost models can be trusted: the error bands the search uses to call two layouts a tie.

* :data:`HELD_OUT_BANDS` -- per GPU x precision, the median |predicted / published - 1| of the throughput rows of
  that GPU and precision the fit did *not* use (held out), within the step model's scope: trusted sources only
  (:data:`TRUSTED`: not the disputed row nor the functional sanity runs) and steps of at least
  :data:`MIN_STEP_SECONDS` (the model prices no per-step fixed cost: the optimizer update and the host's per-step
  work, tenths of a second, dominate shorter steps). Half the published runs of that GPU and precision the model
  never saw are predicted closer than this. Two layouts whose predicted step times differ by less are a tie: the
  model cannot tell which is faster. A GPU x precision with fewer than :data:`MIN_BAND_ROWS` such rows, or rows of
  fewer than :data:`MIN_BAND_MODELS` models (a median of one model's rows says little about another's), has no
  band of its own: it is widened to :data:`STEP_ERROR_BAND` or to the worst of its own rows, whichever is wider,
  and the reason says so.
* :data:`STEP_ERROR_BAND` -- the same median over every held-out row in scope, all GPUs and precisions pooled.
* :data:`BORROWED_WIDENING` -- added to the band of a plan that reads a borrowed constant (a GPU x precision, or a
  GPU's attention scale, with no fitted row of its own: :data:`lcmoe_recipes.cost.efficiency.BORROWED`): the median
  |a / b - 1| over the borrowings whose both ends *are* fitted -- how far a stand-in typically sits from the
  constant it stands in for, where both are measured.
* :data:`MEMORY_ERROR_BAND` -- the *worst* |leave-one-out predicted / published - 1| of the memory rows: a layout
  whose predicted peak is closer than this to the limit may run out of memory for real (an out-of-memory error
  costs a job, a few % of speed does not, hence the worst row rather than the median).

``tests/test_search.py`` recomputes all three from ``tests/published.py`` and fails while a constant differs from what
the rows give (after a refit: ``python scripts/calibrate_step.py`` prints them).
"""

from __future__ import annotations

from statistics import median

from .efficiency import BORROWED, FITTED, constant

STEP_ERROR_BAND = 0.128    # median |held-out - 1| within scope, all GPUs pooled; fitted 2026-12-04
BORROWED_WIDENING = 0.449   # median |stand-in / own - 1| over borrowings with both ends fitted; 2026-12-04
MEMORY_ERROR_BAND = 0.080  # worst of the memory rows' leave-one-out; fitted 2026-12-02

TRUSTED = ("primary-table", "primary-card", "secondary-exact")  # source qualities the band is measured on
MIN_STEP_SECONDS = 1.0
MIN_BAND_ROWS = 3    # held-out rows a GPU x precision needs for a band of its own
MIN_BAND_MODELS = 2  # ... of at least this many models

# (gpu, precision) -> (held-out rows in scope, models among them, median |held-out - 1|, worst |held-out - 1|):
# :func:`group_bands` of tests/published.py's rows at the fitted constants (python scripts/calibrate_step.py prints
# it; tests/test_search.py fails while it differs). 2026-12-04.
HELD_OUT_BANDS: dict[tuple[str, str], tuple[int, int, float, float]] = {  # rows, models, median, worst
    ('b200', 'bf16'): (1, 1, 0.423, 0.423),
    ('b200', 'mxfp8'): (2, 1, 0.4, 0.45),
    ('gb200', 'bf16'): (5, 3, 0.107, 0.267),
    ('gb200', 'mxfp8'): (5, 4, 0.111, 0.246),
    ('gb300', 'bf16'): (2, 1, 0.329, 0.332),
    ('gb300', 'mxfp8'): (5, 5, 0.153, 0.338),
    ('h100', 'bf16'): (4, 3, 0.192, 0.272),
    ('h100', 'fp8_blockwise'): (4, 1, 0.032, 0.087),
    ('h100', 'fp8_cs'): (1, 1, 0.004, 0.004),
}


def held_out_ratios(rows, predict) -> dict[str, float]:
    """predicted / published (at our FLOP count: ``Row.comparable``) of every row of ``rows`` (``tests/published.py``
    :class:`Row` s) the fit did not use, whose source quality is in :data:`TRUSTED` and whose predicted step is at
    least :data:`MIN_STEP_SECONDS`;
    ``predict(plan)`` gives the predicted TFLOP/s per GPU."""
    from .step import estimate_step

    return {k: predict(r.plan) / r.comparable for k, r in rows.items()
            if not r.fit and r.source.quality in TRUSTED and estimate_step(r.plan).step_seconds >= MIN_STEP_SECONDS}


def group_bands(rows, ratios: dict[str, float]) -> dict[tuple[str, str], tuple[int, int, float, float]]:
    """:data:`HELD_OUT_BANDS` from held-out ratios (:func:`held_out_ratios`) of ``rows`` (name -> ``Row``): per GPU x
    precision, (rows, models, median |r - 1|, worst |r - 1|), to 3 places, sorted by key."""
    groups: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for name, ratio in ratios.items():
        plan = rows[name].plan
        groups.setdefault((plan.hardware_spec.key, plan.precision), []).append((plan.model, abs(ratio - 1)))
    return {key: (len(v), len({m for m, _ in v}), round(median(e for _, e in v), 3), round(max(e for _, e in v), 3))
            for key, v in sorted(groups.items())}


def step_band(ratios: dict[str, float]) -> float:
    """:data:`STEP_ERROR_BAND` from held-out ratios (predicted / published), to 3 places."""
    return round(median(abs(r - 1) for r in ratios.values()), 3)


def borrowed_widening(table: dict[tuple[str, str], float] | None = None) -> float:
    """:data:`BORROWED_WIDENING` from a fitted table (default :data:`FITTED`), to 3 places."""
    table = FITTED if table is None else table
    gaps = [abs(table[key] / table[to] - 1) for key, (to, _) in BORROWED.items() if key in table and to in table]
    return round(median(gaps), 3) if gaps else 0.0


def memory_band(leave_one_out_ratios: dict[str, float]) -> float:
    """:data:`MEMORY_ERROR_BAND` from the memory rows' leave-one-out ratios (predicted / published), to 3 places."""
    return round(max(abs(r - 1) for r in leave_one_out_ratios.values()), 3)


def step_band_for(plan) -> tuple[float, str]:
    """(the step error band of ``plan``, why): :func:`band_for` its GPU, precision and model."""
    return band_for(plan.hardware_spec.key, plan.precision, plan.model_spec.gated_delta_net)


def band_for(gpu: str, precision: str, gated_delta_net: bool,
             table: dict[tuple[str, str], float] | None = None) -> tuple[float, str]:
    """(step error band, why) of plans on GPU ``gpu`` at ``precision``.

    With :data:`MIN_BAND_ROWS` held-out rows of :data:`MIN_BAND_MODELS` models or more (:data:`HELD_OUT_BANDS`):
    their median error. With fewer -- too few to measure this GPU x precision -- widened: the pooled median
    :data:`STEP_ERROR_BAND`, or the worst of its own rows if that is wider. Either way, plus
    :data:`BORROWED_WIDENING` when a constant such a plan exercises (its GEMM efficiency, its attention scale, the
    gated-DeltaNet scan where the model has one) is borrowed (for a widened band: the wider of its own worst row and
    the widened pooled median); the reason names the rows and each borrowing."""
    rows, models, med, worst = HELD_OUT_BANDS.get((gpu, precision), (0, 0, 0.0, 0.0))
    kinds = [precision, "attention"] + (["gdn_step"] if gated_delta_net else [])
    borrowed = [c for c in (constant(gpu, k, table) for k in kinds) if not c.anchored]
    widening = BORROWED_WIDENING if borrowed else 0.0
    names = "; ".join(f"{c.key[0]} {c.key[1]}: {c.note}" for c in borrowed)
    stand_in = (f"widened by ±{BORROWED_WIDENING:.1%} (how far a stand-in constant sits from a measured one): no "
                f"measurement of its own for {names}") if borrowed else (
                f"every constant of {gpu} at {precision} fitted to rows of its own")
    if rows >= MIN_BAND_ROWS and models >= MIN_BAND_MODELS:
        band = round(med + widening, 3)
        return band, (f"±{band:.1%}: the median error of the {rows} published {gpu} {precision} rows the fit held "
                      f"out ({models} models)" + (f", ±{med:.1%}" if borrowed else "") + f"; {stand_in}")
    need = f"(a band of its own needs {MIN_BAND_ROWS} rows of {MIN_BAND_MODELS}+ models)"
    few = (f"only {rows} held-out {gpu} {precision} row{'' if rows == 1 else 's'}, of {models} "
           f"model{'' if models == 1 else 's'} {need}" if rows else f"no held-out {gpu} {precision} row {need}")
    pooled = round(STEP_ERROR_BAND + widening, 3)
    if rows and worst > pooled:
        return worst, (f"±{worst:.1%}: widened to the worst of its own rows -- {few}"
                       + (f"; {stand_in}" if borrowed else ""))
    return pooled, (f"±{pooled:.1%}: widened to the median error of all held-out rows, ±{STEP_ERROR_BAND:.1%} -- "
                    f"{few}; {stand_in}")
