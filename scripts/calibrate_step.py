"""Fit the step model's efficiencies to the published throughput rows; print them and the leave-one-out check.

    python scripts/calibrate_step.py

Paste the printed table into src/lcmoe_recipes/cost/step.py (EFFICIENCY) when the model changes;
tests/test_comm_step.py fails while they differ. It also prints the error bands the search calls ties with
(src/lcmoe_recipes/cost/bands.py; tests/test_search.py fails while they differ).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from published import MEMORY_ROWS, THROUGHPUT_ROWS  # noqa: E402

from lcmoe_recipes.cost.bands import memory_band, step_band  # noqa: E402
from lcmoe_recipes.cost.calibrate import leave_one_out as memory_leave_one_out  # noqa: E402
from lcmoe_recipes.cost.calibrate_step import fit, leave_one_out  # noqa: E402
from lcmoe_recipes.cost.step import estimate_step  # noqa: E402

rows = {k: (plan, pub) for k, (plan, pub, _) in THROUGHPUT_ROWS.items()}
table = fit(list(rows.values()))
print("EFFICIENCY = {")
for key, value in table.items():
    print(f"    {key!r}: {value!r},")
print("}")
loo = leave_one_out(rows)
for row, (plan, pub) in rows.items():
    print(f"  {row}: predicted/published {estimate_step(plan, table).tflops_per_gpu / pub:.2f}, "
          f"leave-one-out {loo[row]:.2f}")
memory_rows = {k: (plan, pub) for k, (plan, pub, _) in MEMORY_ROWS.items()}
print(f"STEP_ERROR_BAND = {step_band(loo)}  (median |leave-one-out - 1| of the throughput rows)")
print(f"MEMORY_ERROR_BAND = {memory_band(memory_leave_one_out(memory_rows))}  (worst |leave-one-out - 1| of the memory rows)")
