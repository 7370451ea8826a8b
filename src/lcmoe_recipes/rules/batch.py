"""Batch: GBS = DP x MBS x gradient-accumulation; shrink GBS (raise GA) as DP falls; microbatches >= PP with VPP."""

from __future__ import annotations

from ..layout import ParallelLayout
from ..plan import Reason

SOURCE = "moe-long-context skill rule 6 'assume GBS will need to shrink'; megatron-core interleaved schedule"


def tokens_per_step(total_params: float) -> int:
    """2^23 tokens per step for models over 100B parameters, 2^22 below (our recipes' choice)."""
    return 2**23 if total_params > 100e9 else 2**22


def choose_batch(seq_length: int, layout: ParallelLayout, mbs: int, total_params: float,
                 wish: int | None) -> tuple[int, Reason]:
    step = mbs * layout.dp * (layout.pp if layout.vpp else 1)
    if wish:
        return wish, Reason(f"GBS {wish}, as requested", "your request")
    target = tokens_per_step(total_params)
    gbs = max(step, -(-max(1, target // seq_length) // step) * step)
    micro = gbs // (mbs * layout.dp)
    return gbs, Reason(f"GBS {gbs} ≈ {target / 1e6:.1f}M tokens / {seq_length} tokens, rounded to a multiple of "
                       f"MBS·DP{'·PP' if layout.vpp else ''} = {step}: {micro} microbatches per DP rank (DP={layout.dp})",
                       SOURCE)
