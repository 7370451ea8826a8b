"""Fit the step model's constants to the fit subset of the published throughput rows; print them, the leave-one-out
check and the error bands.

    python scripts/calibrate_step.py

Paste the printed table into src/lcmoe_recipes/cost/efficiency.py (FITTED) when the model changes;
tests/test_comm_step.py fails while they differ. It also prints the error bands the search calls ties with
(src/lcmoe_recipes/cost/bands.py; tests/test_search.py fails while they differ).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from published import MEMORY_ROWS, THROUGHPUT_ROWS  # noqa: E402

from lcmoe_recipes.cost.bands import group_bands, held_out_ratios, memory_band, step_band  # noqa: E402
from lcmoe_recipes.calibration.fit_memory import leave_one_out as memory_leave_one_out  # noqa: E402
from lcmoe_recipes.calibration.fit_step import fit, leave_one_out, predicted_tflops  # noqa: E402

fit_rows = {k: (r.plan, r.comparable) for k, r in THROUGHPUT_ROWS.items() if r.fit}
table = fit(fit_rows.values())
print("FITTED: dict[tuple[str, str], float] = {")
for key, value in table.items():
    print(f"    {key!r}: {value!r},")
print("}")
for row, ratio in leave_one_out(fit_rows).items():
    print(f"  {row}: fitted {predicted_tflops(fit_rows[row][0], table) / fit_rows[row][1]:.2f}, leave-one-out {ratio:.2f}")
held = held_out_ratios(THROUGHPUT_ROWS, lambda p: predicted_tflops(p, table))
print(f"STEP_ERROR_BAND = {step_band(held)}  (median |held-out - 1|, primary and exact secondary rows)")
print("HELD_OUT_BANDS: dict[tuple[str, str], tuple[int, int, float, float]] = {  # rows, models, median, worst")
for key, value in group_bands(THROUGHPUT_ROWS, held).items():
    print(f"    {key!r}: {value!r},")
print("}")
memory_rows = {k: (r.plan, r.value) for k, r in MEMORY_ROWS.items()}
print(f"MEMORY_ERROR_BAND = {memory_band(memory_leave_one_out(memory_rows))}  (worst |leave-one-out - 1| of the memory rows)")
