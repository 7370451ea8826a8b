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


HIERARCHICAL_SOURCE = ("megatron-core 0.19.2 TransformerConfig.cp_comm_type ('a2a+p2p': all-to-all inside "
                       "hierarchical_context_parallel_sizes[0] consecutive CP ranks, a p2p ring across the groups) and "
                       "parallel_state (hierarchical CP groups); Transformer Engine needs the heads divisible by the "
                       "all-to-all size; lcmoe_recipes cost model (docs/cost_model.md)")


def hierarchical_split(plan) -> tuple[int, int] | None:
    """(a2a size, p2p size) for hierarchical CP: the a2a groups are the CP ranks that share one NVLink block
    (megatron-core places CP ranks TP apart, so a = block / TP of them), when that is more than 1 and less than CP and
    every TP shard's heads split over a; None otherwise."""
    lay, spec, hw = plan.layout, plan.model_spec, plan.hardware_spec
    inner = 1
    while inner * 2 <= lay.cp and inner * 2 * lay.tp <= hw.job_block and lay.cp % (inner * 2) == 0:
        inner *= 2
    heads, groups = spec.num_attention_heads // lay.tp, max(1, spec.num_query_groups // lay.tp)
    if not 1 < inner < lay.cp or heads % inner or (not spec.multi_latent_attention and groups % inner):
        return None
    return inner, lay.cp // inner


def choose_cp_comm(plan):
    """(cp_comm_type, hierarchical_cp_sizes, Reason): the ring ("p2p", megatron-core's default) or hierarchical
    "a2a+p2p", whichever the cost model predicts faster for ``plan`` (its step time with each)."""
    from ..cost.step import estimate_step

    if plan.layout.cp == 1:
        return None, None, Reason("CP=1: no context-parallel communication", HIERARCHICAL_SOURCE)
    split = hierarchical_split(plan)
    ring = estimate_step(plan.with_changes(cp_comm_type="p2p", hierarchical_cp_sizes=None))
    if split is None:
        return "p2p", None, Reason(f"p2p ring over CP={plan.layout.cp} (hierarchical a2a+p2p needs a CP group that "
                                   "leaves the NVLink block in parts whose heads split evenly: not this layout)",
                                   HIERARCHICAL_SOURCE)
    hier = estimate_step(plan.with_changes(cp_comm_type="a2a+p2p", hierarchical_cp_sizes=split))
    a, p = split
    numbers = (f"exposed CP {ring.parts['cp_exposed']:.1f} s per step with the ring vs "
               f"{hier.parts['cp_exposed']:.1f} s with a2a over {a} NVLink-local ranks + a ring of {p}")
    if hier.step_seconds < ring.step_seconds:
        return "a2a+p2p", split, Reason(f"hierarchical a2a+p2p [{a}, {p}]: {numbers}", HIERARCHICAL_SOURCE)
    return "p2p", None, Reason(f"p2p ring: {numbers}", HIERARCHICAL_SOURCE)
