"""Optimizer CPU offload: only when the layout does not fit without it, with the smallest fraction that fits."""

from __future__ import annotations

from ..plan import Reason

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
SOURCE = ("moe-long-context skill ('all DSV3 long-context configs require optimizer CPU offload'); "
          "cpu-offloading card (fractions 0.25-1.0); offload needs distributed + precision-aware optimizer")


def offload_reason(fraction: float) -> Reason:
    if fraction == 0:
        return Reason("no optimizer offload: fits in HBM without it", SOURCE)
    return Reason(f"optimizer CPU offload {fraction:g}: the smallest fraction that fits", SOURCE)
