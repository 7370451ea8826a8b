"""Time the planner's search (no torch / megatron import): one model and seq_length on up to 1,024 GPUs.

    python scripts/bench_planner.py
"""

import time

from lcmoe_recipes.planner import plan
from lcmoe_recipes.request import TrainingRequest

CASES = [("dsv3", 32768, "h100", 1024), ("dsv3", 131072, "h100", 1024), ("qwen3_235b", 65536, "gb200", 1024),
         ("qwen3_next", 131072, "h200", 1024), ("qwen3_235b", 131072, "gb200", 128), ("course_moe", 32768, "h200", 64)]

for model, seq, hw, gpus in CASES:
    request = TrainingRequest(model=model, seq_length=seq, hardware=hw, num_gpus=gpus)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        result = plan(request)
        times.append(time.perf_counter() - t0)
    print(f"{model:>11} {seq:>7} {gpus:>5} x {hw:<6} {result.considered:>5} layouts  best of 3: {min(times):.2f} s "
          f"(first {times[0]:.2f} s)  -> {result.best.plan.layout.describe()}")
