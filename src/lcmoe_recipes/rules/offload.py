"""Optimizer CPU offload: only when the layout does not fit without it, with the smallest fraction that fits."""

from __future__ import annotations

from ..core.plan import Reason

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
SOURCE = ("Megatron-Bridge cpu-offloading card (fractions 0.25-1.0); megatron-core 0.19.2 OptimizerConfig (offload "
          "needs the distributed, precision-aware optimizer); lcmoe_recipes cost model (docs/cost_model.md): the "
          "smallest fraction whose predicted peak fits the planning limit of HBM")
DSV3_SOURCE = ("Megatron-Bridge skill nemo-mbridge-perf-moe-long-context ('all DSV3 long-context configs require "
               "optimizer CPU offload'); " + SOURCE)
"""DeepSeek-V3's source adds the skill's sentence, which is about DeepSeek-V3 only (a fresh user saw it cited for
other models)."""
FIT_SOURCE = "lcmoe_recipes cost model (docs/cost_model.md): the predicted peak fits the planning limit of HBM"


OPTIMIZER_SOURCE = ("megatron-bridge 0.6.2 training/config.py OptimizerConfig checks ('--use-precision-aware-optimizer "
                    "only supported with adam'); megatron-core 0.19.2 optimizer/__init__.py (CPU offload runs through "
                    "the precision-aware HybridDeviceOptimizer)")


def offload_fractions(allowed: bool, optimizer: str | None) -> tuple[float, ...]:
    """The offload fractions the search may try: none but 0 when the request forbids offload or the base recipe's
    optimizer is not Adam (``optimizer``: megatron-bridge's ``OptimizerConfig.optimizer``, e.g. "dist_muon"; None
    for the pre-training template, which runs Adam): megatron-bridge refuses the precision-aware optimizer that CPU
    offload needs with any other optimizer."""
    return FRACTIONS if allowed and _offloads(optimizer) else (0.0,)


def _offloads(optimizer: str | None) -> bool:
    """Whether the base recipe's optimizer can run CPU offload: Adam (None: the template's, Adam)."""
    return optimizer in (None, "adam")


def offload_reason(fraction: float, optimizer: str | None = None, model_key: str | None = None) -> Reason:
    """Why a plan offloads ``fraction`` of its optimizer state; ``optimizer``: the base recipe's, when it is not Adam
    (offload was not an option); ``model_key``: the catalogue model (the skill's sentence is cited for ``dsv3``)."""
    if fraction == 0 and not _offloads(optimizer):
        return Reason(f"no optimizer offload: the base recipe's optimizer {optimizer} cannot run on the precision-aware "
                      "optimizer CPU offload needs", OPTIMIZER_SOURCE)
    if fraction == 0:
        return Reason("no optimizer offload: the layout fits in HBM without it", FIT_SOURCE)
    return Reason(f"optimizer CPU offload {fraction:g}: the smallest fraction that fits",
                  DSV3_SOURCE if model_key == "dsv3" else SOURCE)
