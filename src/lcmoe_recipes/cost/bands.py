"""How far the cost models can be trusted: the error bands the search uses to call two layouts a tie.

Both come from the leave-one-out check against the published measurements (docs/accuracy.md): each row predicted
with the constants fitted on all the other rows, so the spread says how well the model predicts a run it was not
fitted to.

* :data:`STEP_ERROR_BAND` -- the median |leave-one-out predicted / published - 1| of the throughput rows: half the
  published runs are predicted closer than this. Two layouts whose predicted step times differ by less are a tie:
  the model cannot tell which is faster.
* :data:`MEMORY_ERROR_BAND` -- the *worst* |leave-one-out predicted / published - 1| of the memory rows: a layout
  whose predicted peak is closer than this to the limit may run out of memory for real (an out-of-memory error
  costs a job, a few % of speed does not, hence the worst row rather than the median).

``tests/test_search.py`` recomputes both from ``tests/published.py`` and fails while a constant differs from what
the rows give (after a refit of either model: ``python scripts/calibrate_step.py`` prints both).
"""

from __future__ import annotations

from statistics import median

STEP_ERROR_BAND = 0.076    # median of T1-T11 (T10: 0.924); fitted 2026-12-01
MEMORY_ERROR_BAND = 0.080  # worst of M1-M6, Q1-Q6 (Q1: 0.920); fitted 2026-12-01


def step_band(leave_one_out_ratios: dict[str, float]) -> float:
    """:data:`STEP_ERROR_BAND` from the throughput rows' leave-one-out ratios (predicted / published), to 3 places."""
    return round(median(abs(r - 1) for r in leave_one_out_ratios.values()), 3)


def memory_band(leave_one_out_ratios: dict[str, float]) -> float:
    """:data:`MEMORY_ERROR_BAND` from the memory rows' leave-one-out ratios (predicted / published), to 3 places."""
    return round(max(abs(r - 1) for r in leave_one_out_ratios.values()), 3)
