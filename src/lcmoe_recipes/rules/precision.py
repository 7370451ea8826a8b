"""Precision: FP8 blockwise class on Hopper, BF16 by default on Blackwell (MXFP8 on request)."""

from __future__ import annotations

from ..catalog import Hardware
from ..plan import Reason

SOURCE = "moe-long-context skill config families (DSV3 H100: FP8-class; Qwen3 GB200: BF16 or MXFP8)"


def choose_precision(hw: Hardware, wish: str | None) -> tuple[str, Reason]:
    if wish:
        return wish, Reason(f"{wish}, as requested", "your request")
    if hw.compute_capability[0] == 9:
        return "fp8_blockwise", Reason("FP8 blockwise on Hopper: the FP8 class of the published long-context H100 runs",
                                       SOURCE)
    return "bf16", Reason("BF16 on Blackwell by default; MXFP8 on request (--precision mxfp8)", SOURCE)
