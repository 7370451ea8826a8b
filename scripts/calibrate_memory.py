"""Fit the memory model's two constants to the fit subset of the memory rows; print them with the leave-one-out check.

    python scripts/calibrate_memory.py

Paste the printed MemoryConstants into src/lcmoe_recipes/cost/memory.py (CALIBRATED) when the model changes;
tests/test_memory_accuracy.py fails while they differ.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from published import MEMORY_ROWS  # noqa: E402

from lcmoe_recipes.calibration.fit_memory import fit, leave_one_out, mean_error  # noqa: E402

rows = {k: (r.plan, r.value) for k, r in MEMORY_ROWS.items() if r.fit}
constants = fit(rows.values())
print(f"CALIBRATED = {constants}")
print(f"mean |predicted/published - 1| = {mean_error(rows.values(), constants):.4f}")
for row, ratio in leave_one_out(rows).items():
    print(f"  leave-one-out {row}: {ratio:.3f}")
