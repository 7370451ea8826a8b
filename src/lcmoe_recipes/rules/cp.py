"""CP sizing: start at seq_length / 4096 rounded to a power of two, then let the planner adjust."""

from __future__ import annotations

import math

from ..core.plan import Reason

SHARD_TOKENS = 4096
SOURCE = "Megatron-Bridge skill nemo-mbridge-perf-moe-long-context, rule 1 'start from a 4K shard target'"


def cp_split_limit(seq_length: int) -> int:
    """The largest CP (a power of two) whose 2·CP chunks split ``seq_length`` evenly (1 for an odd length)."""
    cp = 1
    while seq_length % (4 * cp) == 0:
        cp *= 2
    return cp


def cp_first_guess(seq_length: int) -> tuple[int, Reason]:
    """seq_length/4096 rounded to the nearest power of two (at least 1)."""
    raw = max(1.0, seq_length / SHARD_TOKENS)
    guess = 2 ** round(math.log2(raw))
    return guess, Reason(f"CP ≈ seq_length/4096 = {raw:g} -> {guess} (power of two)", SOURCE)


def cp_candidates(seq_length: int, world: int) -> list[int]:
    """Powers of two from 1 up to 4x the first guess that divide world and, above 1, split seq_length into 2·CP
    chunks (megatron-core's load-balanced CP split; CP=1 splits nothing)."""
    guess, _ = cp_first_guess(seq_length)
    out = []
    cp = 1
    while cp <= min(world, 4 * guess):
        if (cp == 1 or seq_length % (2 * cp) == 0) and world % cp == 0:
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
    """(cp_comm_type, hierarchical_cp_sizes, Reason): what a feature of the model requires
    (:func:`choose_cp_comm_type`), else the ring ("p2p", megatron-core's default) or hierarchical "a2a+p2p", whichever
    the cost model predicts faster for ``plan`` (its step time with each)."""
    return priced_cp_comm(plan)[:3]


def priced_cp_comm(plan):
    """:func:`choose_cp_comm`'s answer, then the ``StepEstimate`` (fitted constants) and the ``StepTerms`` of ``plan``
    with the exchange it chose, where choosing priced them (None, None where a feature of the model decided): the
    search reuses them."""
    from ..cost.step import estimate_step, step_and_cp_exposed, step_terms, with_cp_exchange

    lay = plan.layout
    required, why = choose_cp_comm_type(plan.model_spec, lay.tp, lay.cp)
    if lay.cp == 1 or required != "p2p":  # CP=1, or a feature of the model decides the exchange
        return required, None, why, None, None
    split = hierarchical_split(plan)
    ring_plan = plan.with_changes(cp_comm_type="p2p", hierarchical_cp_sizes=None)
    if split is None:
        terms = step_terms(ring_plan)
        return "p2p", None, Reason(f"p2p ring over CP={plan.layout.cp} (hierarchical a2a+p2p needs a CP group that "
                                   "leaves the NVLink block in parts whose heads split evenly: not this layout)",
                                   HIERARCHICAL_SOURCE), estimate_step(ring_plan, terms=terms), terms
    hier_plan = plan.with_changes(cp_comm_type="a2a+p2p", hierarchical_cp_sizes=split)
    ring, ring_cp, ring_terms = step_and_cp_exposed(ring_plan)
    hier, hier_cp, hier_terms = step_and_cp_exposed(hier_plan, with_cp_exchange(ring_terms, hier_plan))
    a, p = split
    # the chosen exchange's step first: a reason cut to one line still quotes the step this plan runs
    with_ring = f"with the ring of {lay.cp} (exposed CP {ring_cp:.1f} s)"
    with_hier = f"with a2a over {a} NVLink-local ranks + a ring of {p} (exposed CP {hier_cp:.1f} s)"
    why_not = "; the ring's merges grow with its size, the attention calls with the a2a's sequence"
    if hier < ring:
        return "a2a+p2p", split, Reason(f"hierarchical a2a+p2p, sizes {a} x {p}: predicted step {hier:.1f} s "
                                        f"{with_hier} vs {ring:.1f} s {with_ring}{why_not}", HIERARCHICAL_SOURCE), \
            estimate_step(hier_plan, terms=hier_terms), hier_terms
    why = Reason(f"p2p ring: predicted step {ring:.1f} s {with_ring} vs {hier:.1f} s {with_hier}{why_not}",
                 HIERARCHICAL_SOURCE)
    return "p2p", None, why, estimate_step(ring_plan, terms=ring_terms), ring_terms
