"""How far the cost models can be trusted: the error bands the search uses to call two layouts a tie.

* :data:`STEP_ERROR_BAND` -- the median |predicted / published - 1| of the throughput rows the fit did *not* use
  (held out), within the step model's scope: trusted sources only (:data:`TRUSTED`: not the disputed row nor the
  functional sanity runs) and steps of at least :data:`MIN_STEP_SECONDS` (the model prices no per-step fixed cost:
  the optimizer update and the host's per-step work, tenths of a second, dominate shorter steps). Half the
  published runs the model never saw are predicted closer than this. Two layouts whose predicted step times differ
  by less are a tie: the model cannot tell which is faster.
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

STEP_ERROR_BAND = 0.242    # median |held-out - 1| within scope; fitted 2026-12-01
BORROWED_WIDENING = 0.469   # median |stand-in / own - 1| over borrowings with both ends fitted; 2026-12-01
MEMORY_ERROR_BAND = 0.080  # worst of the memory rows' leave-one-out; fitted 2026-12-02

TRUSTED = ("primary-table", "primary-card", "secondary-exact")  # source qualities the band is measured on
MIN_STEP_SECONDS = 1.0


def held_out_ratios(rows, predict) -> dict[str, float]:
    """predicted / published (at our FLOP count: ``Row.comparable``) of every row of ``rows`` (``tests/published.py``
    :class:`Row` s) the fit did not use, whose source quality is in :data:`TRUSTED` and whose predicted step is at
    least :data:`MIN_STEP_SECONDS`;
    ``predict(plan)`` gives the predicted TFLOP/s per GPU."""
    from .step import estimate_step

    return {k: predict(r.plan) / r.comparable for k, r in rows.items()
            if not r.fit and r.source.quality in TRUSTED and estimate_step(r.plan).step_seconds >= MIN_STEP_SECONDS}


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
    """(step error band, why) of plans on GPU ``gpu`` at ``precision``: :data:`STEP_ERROR_BAND`, plus
    :data:`BORROWED_WIDENING` when a constant such a plan exercises (its GEMM efficiency, its attention scale, the
    gated-DeltaNet scan where the model has one) is borrowed -- the reason names each borrowing."""
    kinds = [precision, "attention"] + (["gdn_step"] if gated_delta_net else [])
    borrowed = [c for c in (constant(gpu, k, table) for k in kinds) if not c.anchored]
    if not borrowed:
        return STEP_ERROR_BAND, (f"±{STEP_ERROR_BAND:.1%}: the median error of the published rows the fit held out, "
                                 f"every constant of {gpu} at {precision} fitted to rows of its own")
    band = round(STEP_ERROR_BAND + BORROWED_WIDENING, 3)
    names = "; ".join(f"{c.key[0]} {c.key[1]}: {c.note}" for c in borrowed)
    return band, (f"±{band:.1%}: the held-out median ±{STEP_ERROR_BAND:.1%} widened by ±{BORROWED_WIDENING:.1%} "
                  f"(how far a stand-in constant sits from a measured one) -- no measurement of its own for {names}")
