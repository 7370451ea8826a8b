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


COMM_SOURCE = ("Transformer Engine attention/dot_product_attention/context_parallel.py, attn_forward_func_with_cp "
               "(sliding window only with a2a or all_gather; learnable softmax only with a2a) and "
               "AttnFuncWithCPAndQKVOA2A (a2a needs q and k/v heads divisible by CP); megatron-bridge 0.6.2 "
               "recipes/gpt_oss/h100/gpt_oss.py (cp_comm_type='a2a' for gpt-oss)")


def a2a_heads_fit(model, tp: int, cp: int) -> bool:
    """Whether the all-to-all CP exchange can split this TP rank's query and K/V heads over CP."""
    return (model.num_attention_heads // tp) % cp == 0 and max(1, model.num_query_groups // tp) % cp == 0


def choose_cp_comm_type(model, tp: int, cp: int) -> tuple[str, Reason]:
    """megatron-core's ``cp_comm_type`` for softmax attention: the ring (p2p, the default) unless a feature of the
    model needs another exchange. Gated-DeltaNet layers use their own all-to-all whatever this says."""
    if cp == 1:
        return "p2p", Reason("CP=1: no context-parallel exchange (p2p, the default)", COMM_SOURCE)
    if model.attention_sinks:
        return "a2a", Reason(f"a2a: {model.display} has learnable softmax offsets (attention sinks), which Transformer "
                             "Engine runs with context parallelism only over the all-to-all exchange", COMM_SOURCE)
    if model.sliding_window:
        if a2a_heads_fit(model, tp, cp):
            return "a2a", Reason(f"a2a: sliding-window layers (window {model.sliding_window}) cannot use the p2p ring; "
                                 "the all-to-all keeps K/V per rank at 1/CP of the heads", COMM_SOURCE)
        return "all_gather", Reason("all_gather: sliding-window layers cannot use the p2p ring and the heads do not "
                                    f"split over CP={cp} for a2a", COMM_SOURCE)
    return "p2p", Reason("p2p ring: each step overlaps the attention of the previous K/V chunk (megatron-core's "
                         "default)", "megatron-core 0.19.2 TransformerConfig.cp_comm_type")
