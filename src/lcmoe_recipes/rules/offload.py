"""Optimizer CPU offload: only when the layout does not fit without it, with the smallest fraction that fits."""

from __future__ import annotations

from ..plan import Reason

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
SOURCE = ("Megatron-Bridge skill nemo-mbridge-perf-moe-long-context ('all DSV3 long-context configs require "
          "optimizer CPU offload'); Megatron-Bridge cpu-offloading card (fractions 0.25-1.0); megatron-core 0.19.2 OptimizerConfig (offload needs the "
          "distributed, precision-aware optimizer)")
FIT_SOURCE = "lcmoe_recipes cost model (docs/cost_model.md): the predicted peak fits the planning limit of HBM"


def offload_reason(fraction: float) -> Reason:
    if fraction == 0:
        return Reason("no optimizer offload: the layout fits in HBM without it", FIT_SOURCE)
    return Reason(f"optimizer CPU offload {fraction:g}: the smallest fraction that fits", SOURCE)
