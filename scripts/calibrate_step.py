"""Fit the step model's efficiencies to the published throughput rows; print them and the leave-one-out check.

    python scripts/calibrate_step.py

Paste the printed table into src/lcmoe_recipes/cost/step.py (EFFICIENCY) when the model changes;
tests/test_comm_step.py fails while they differ.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from published import THROUGHPUT_ROWS  # noqa: E402

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
