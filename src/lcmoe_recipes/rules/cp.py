"""CP sizing: start at seq_length / 4096 rounded to a power of two, then let the planner adjust."""

from __future__ import annotations

import math

from ..plan import Reason

SHARD_TOKENS = 4096
SOURCE = "Megatron-Bridge skill nemo-mbridge-perf-moe-long-context, rule 1 'start from a 4K shard target'"


def cp_first_guess(seq_length: int) -> tuple[int, Reason]:
    """seq_length/4096 rounded to the nearest power of two (at least 1)."""
    raw = max(1.0, seq_length / SHARD_TOKENS)
    guess = 2 ** round(math.log2(raw))
    return guess, Reason(f"CP ≈ seq_length/4096 = {raw:g} -> {guess} (power of two)", SOURCE)


def cp_candidates(seq_length: int, world: int) -> list[int]:
    """Powers of two from 1 up to 4x the first guess that split seq_length into 2·CP chunks and divide world."""
    guess, _ = cp_first_guess(seq_length)
    out = []
    cp = 1
    while cp <= min(world, 4 * guess):
        if seq_length % (2 * cp) == 0 and world % cp == 0:
            out.append(cp)
        cp *= 2
    return out
