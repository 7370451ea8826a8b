"""The search: every legal layout for a TrainingRequest, the rules for each knob, the checks and the cost model;
the fastest layout that fits wins; among layouts the step model cannot tell apart, the fastest still wins unless it
leaves too little memory headroom. (The Plan it returns is :class:`lcmoe_recipes.core.plan.Plan`; its command line is
``python -m lcmoe_recipes.plan``, :mod:`lcmoe_recipes.cli.plan`.)

No torch / megatron import.

1. layouts: TP in {1, 2, 4, 8} (heads and query groups split, TP inside one node or NVLink block) and no wider than
   the model's width supports (:func:`tp_width_limit`: hidden / TP >= :data:`MIN_TP_WIDTH`) unless no narrower
   layout fits, CP from
   :func:`rules.cp.cp_candidates` (powers of two around seq_length/4096), PP in {1, 2, 4, 8, 16}, VPP the finest
   interleave that keeps two layers per chunk (the bubble is (PP-1)/VPP microbatches), EP a power of two dividing the
   experts with ETP = 1; Megatron's folding rules (world % TP·PP·CP, world % ETP·EP·PP) and any fixed wish; MBS in
   {1, 2, 4} unless the request fixes it (:func:`mbs_choices`), each (layout, MBS) a candidate;
2. per layout: dispatcher and precision (rules), the decisions every run takes for its layout -- upstream base,
   positions, token budget and GBS, schedule, pipeline layout (:func:`lcmoe_recipes.rules.extension.extension_fields`)
   -- then the least recompute and the smallest optimizer offload that fit in the memory limit (HBM less
   ``request.memory_margin``; rules.recompute ladder, rules.offload fractions), then CUDA graphs and the CP exchange
   (rules); the checks (:func:`lcmoe_recipes.checks.check_plan`) drop what Megatron would reject, and
   :func:`lcmoe_recipes.checks.memory.host_findings` what a node's RAM cannot hold;
3. rank by predicted step time. Candidates within the step error band of the fastest are a tie (the band of the
   request's GPU and precision, :func:`lcmoe_recipes.cost.bands.band_for`: the median error of the held-out rows
   of that GPU and precision, widened where it has too few or a constant is borrowed). The tie-break applies its
   rules in order (:func:`_tie_break`): **hazard** -- keep the ties that walk into the fewest open hazards
   (catalogued upstream bugs with no fixed release, on the pinned stack: :mod:`lcmoe_recipes.planner.hazards`);
   **headroom** -- of those, keep the ones that leave at least :data:`~lcmoe_recipes.cost.bands.MEMORY_ERROR_BAND`
   of the limit free; **data parallel** -- of those, keep the ones with DP > 1 if any ("keep DP alive",
   Megatron-Bridge's long-context MoE skill); the fastest kept tie wins; **most headroom** -- when no tie keeps the
   memory band free, the one with the most headroom wins. Memory safety comes before DP: an out-of-memory error
   costs the job. The rule that decided (:attr:`SearchResult.rule`) is the last one that passed over a tie faster
   than the winner, **fastest** when none did; every tie, with the rule that passed it over, is in
   :attr:`SearchResult.tie_break`. Every open hazard the winner still walks into is named in its reason with why
   it cannot be avoided (:attr:`SearchResult.hazards`); where an upstream recipe changed a setting to avoid one,
   the planner makes the same change before pricing. Memory is the whole HBM budget: the allocator's peak plus the
   buffers outside it (``MemoryBreakdown.hbm_total``: flex dispatcher, CUDA context, NCCL) against HBM less the
   request's ``memory_margin`` (the fragmentation margin).

Bounds, not shortcuts: every layout the rules allow is enumerated, then visited best-first on a lower bound of its
step: first keyed by a compute-time bound (:func:`lcmoe_recipes.cost.bounds.compute_lower_bound`, no plan needed);
when one comes out first its plan is built and checked and it goes back in keyed by the exact no-recompute bound
(:func:`~lcmoe_recipes.cost.bounds.step_lower_bound`, communication included); when it comes out first again its
memory rung is found (the least recompute, then the smallest offload, that fits: memory only) and it goes back in
keyed by the same bound at that rung's recompute (:func:`_rung_bound`), to have its CP exchange, overlaps and step
priced when it comes out first a third time -- so the likely fastest are priced first and the cut falls fast, and a
layout that needs much recompute to fit is not priced unless even its recompute leaves it inside the cut. A layout
is skipped only when its bound is slower than the *cut*: the slower of the fastest fitting step found so far times
(1 + the band) and the ``top``-th fastest found. Such a layout can be neither the winner, nor a tie, nor one of the
``top`` shown; the memory ladder starts with its lower bound (full recompute and full offload). A larger MBS of a
layout is visited only once its half's memory rung is known: where the half did not fit (or was skipped on its bound
without recompute), neither does it; a half skipped on its rung bound does not skip it (the larger MBS may fit on a
lighter rung, with more offload, and be faster). ``plan(request, exhaustive=True)`` evaluates every layout;
``tests/test_search.py`` checks that both give the same winner and ranking.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import NamedTuple

from ..catalog import Hardware, ModelSpec, get_hardware, get_model
from ..catalog.upstream import base_recipe
from ..checks import check_plan, knob_findings
from ..checks.memory import host_findings
from ..core.layout import ParallelLayout
from ..core.plan import Plan, Reason
from ..core.request import DEFAULT_MEMORY_MARGIN, TrainingRequest, seq_tag
from ..cost import estimate_step
from ..cost.bands import MEMORY_ERROR_BAND, band_for
from ..cost.bounds import compute_lower_bound, memory_lower_bound, step_lower_bound
from ..cost.memory import (GDN_MEASURED_RATIOS, MemoryBreakdown, MemoryConstants, applied_modules,
                           ep_overlap_warmup, memory_key, peak_ranks, rank_memory)
from ..cost.overlap import COMM_OVERLAP_SOURCE, tp_overlap_allowed
from ..cost.shapes import shapes
from ..cost.step import StepEstimate, ep_overlap_steps, step_terms, tp_overlap_steps
from ..errors import InfeasibleConfig
from ..rules.base import GRAD_DTYPE
from ..rules.batch import batch_size, tokens_per_step
from ..rules.cp import (a2a_heads_fit, choose_cp_comm_type, cp_candidates, cp_first_guess, cp_split_limit,
                        hierarchical_split)
from ..rules.cuda_graphs import choose_cuda_graphs
from ..rules.dispatcher import choose_dispatcher
from ..rules.extension import (extension_fields, layout_blocks_ep_overlap, recompute_or_graphs_block_ep_overlap,
                               with_ep_overlap, with_priced_cp_comm)
from ..rules.offload import offload_fractions, offload_reason
from ..rules.precision import choose_precision
from ..rules.recompute import recompute_ladder, recompute_reason
from .hazards import describe as describe_hazard
from .hazards import follow_recipe_choices, hazard_weight, open_hazards

VPP_CHOICES = (16, 12, 8, 6, 4, 3, 2)
MBS_CHOICES = (1, 2, 4)
# A TP-split GEMM over a 4K-token microbatch keeps one wave of 128x256 output tiles on an H100's 132 SMs while each
# rank's share of the hidden size is at least 1024 columns ((4096/128) x (1024/256) = 128 tiles); narrower shares
# leave SMs idle and add TP traffic for nothing (with tp_comm_overlap the traffic hides behind GEMMs too small to
# cover it).
MIN_TP_WIDTH = 1024
SOURCE = "lcmoe_recipes.planner.search: checks + cost model; error bands lcmoe_recipes.cost.bands (docs/planner.md)"


@dataclass(frozen=True)
class Candidate:
    """One fitting layout with its knobs, predicted memory and step."""

    plan: Plan
    memory: MemoryBreakdown
    step: StepEstimate


class Tie(NamedTuple):
    """One candidate within the step error band of the fastest, as the tie-break saw it."""

    layout: str         # ParallelLayout.describe()
    mbs: int
    step: float         # predicted step, s
    headroom: float     # HBM left under the limit, bytes
    safe: bool          # keeps the memory model's worst error (MEMORY_ERROR_BAND of the limit) free
    winner: bool
    dp: int             # data-parallel size
    passed_over: str    # the rule that passed it over (TIE_RULES), "" for the winner and slower kept ties


@dataclass(frozen=True)
class SearchResult:
    """The search's answer.

    Attributes:
        best: the winner (its ``plan.reasons["layout"]`` says why).
        ranked: the winner, then the fastest other fitting layouts (``top`` in all).
        considered: layouts enumerated (every one the rules allow).
        rejected: rule -> layouts it rejected, among those evaluated.
        why: the winner's reason.
        evaluated: layouts whose knobs, checks and memory were worked out (all with ``exhaustive=True``).
        pruned: layouts skipped because a lower bound of their step time is slower than the cut.
        limit: bytes a rank's HBM use may reach (HBM less the memory margin: the fragmentation margin).
        fastest: the fastest fitting candidate (the winner unless its memory headroom said otherwise).
        ties: fitting candidates within the step error band of the fastest, the winner among them.
        band: the step error band the ties were called with (fraction), and ``band_reason`` why.
        rule: the rule that decided: "fastest", "hazard", "headroom", "data parallel" or "most headroom" (module
            doc; :func:`_tie_break`): the last that passed over a tie faster than the winner; :attr:`rules` names
            every one that did.
        tie_break: every tie, fastest first (:class:`Tie`: layout, MBS, step s, HBM headroom bytes, keeps the memory
            band free, is the winner, DP, the rule that passed it over).
        tp_note: why TP exceeds the width limit ("" when it does not).
        hazards: the planner's answer to each open hazard (catalog/known_issues.yaml, no fixed release) the fastest
            tie or the winner walks into: (hazard id, confidence, answer) with answer ``avoided: ...`` (an
            equal-cost tie without it won), ``recipe: ...`` (the upstream recipe's setting, made) or
            ``cannot avoid: ...`` (every tie walks into it; ``decided by the request`` when every fitting candidate
            does). :mod:`lcmoe_recipes.planner.hazards`.
    """

    request: TrainingRequest
    best: Candidate
    ranked: list[Candidate]
    considered: int
    rejected: dict[str, int] = field(default_factory=dict)
    why: str = ""
    evaluated: int = 0
    pruned: int = 0
    limit: float = 0.0
    fastest: Candidate | None = None
    ties: int = 1
    band: float = 0.0
    band_reason: str = ""
    rule: str = "fastest"
    tie_break: tuple[Tie, ...] = ()
    tp_note: str = ""
    hazards: tuple[tuple[str, str, str], ...] = ()

    @property
    def rules(self) -> tuple[str, ...]:
        """Every rule that passed over a tie faster than the winner, in the tie-break's order (:func:`rules_applied`)."""
        return rules_applied(self.tie_break)


def _vpp(num_layers: int, mtp: int, pp: int) -> int | None:
    """The finest interleave whose chunks still hold two slots each (decoder layers + embedding + MTP + loss)."""
    if pp == 1:
        return None
    slots = num_layers + 2 + mtp
    for v in VPP_CHOICES:
        if slots >= 2 * pp * v:
            return v
    return None


def tp_width_limit(model: ModelSpec) -> int:
    """The widest TP the model's hidden size supports: the largest power of two with hidden / TP >= MIN_TP_WIDTH
    (module constant; at least 1)."""
    tp = 1
    while model.hidden_size // (2 * tp) >= MIN_TP_WIDTH:
        tp *= 2
    return tp


def mbs_choices(request: TrainingRequest) -> tuple[int, ...]:
    """MBS values the search prices: the request's when it sets one (or packs variable-length sequences, which
    takes MBS 1 per packed sequence), else :data:`MBS_CHOICES`."""
    if "micro_batch_size" in request.model_fields_set or request.variable_length:
        return (request.micro_batch_size,)
    return MBS_CHOICES


def enumerate_layouts(request: TrainingRequest, max_tp: int | None = None) -> list[ParallelLayout]:
    """Every layout Megatron can fold for the request (before memory and the finer checks), with TP at most
    ``max_tp`` unless the request fixes TP."""
    model, hw = get_model(request.model), get_hardware(request.hardware)
    world, seq = request.num_gpus, request.seq_length
    heads, groups = model.num_attention_heads, model.num_query_groups
    tps = [t for t in (1, 2, 4, 8) if heads % t == 0 and (groups % t == 0 or t % groups == 0)
           and t <= hw.gpus_per_node * (1 if hw.nvlink_domain <= 8 else 2) and (max_tp is None or t <= max_tp)]
    cps = cp_candidates(seq, world)
    # variable-length batches with PP > 1 deadlock or swap shapes (Megatron-LM #5100, docs/known_issues.md)
    pps = [1] if request.variable_length else [p for p in (1, 2, 4, 8, 16) if 2 * p <= model.num_layers]
    eps = [e for e in (1, 2, 4, 8, 16, 32, 64, 128, 256) if model.num_moe_experts % e == 0] if model.is_moe else [1]
    out = []
    for tp in [request.tp] if request.tp else tps:
        for cp in [request.cp] if request.cp else cps:
            if model.gated_delta_net and any(h % (tp * cp) for h in model.linear_num_heads):
                continue
            if model.attention_sinks and cp > 1 and not a2a_heads_fit(model, tp, cp):
                continue  # sinks need the a2a CP exchange, which splits heads over CP
            for pp in [request.pp] if request.pp else pps:
                if world % (tp * pp * cp):
                    continue
                for ep in [request.ep] if request.ep else eps:
                    if world % (ep * pp) or ep > world // pp:
                        continue
                    out.append(ParallelLayout(world=world, tp=tp, pp=pp, cp=cp, ep=ep, etp=1,
                                              vpp=_vpp(model.num_layers, model.mtp_num_layers, pp)))
    return out


@dataclass(frozen=True)
class _Request:
    """What every layout of one request shares: the request, its model and GPU, the memory limit, the recompute
    ladder, the offload fractions allowed, and the rules that do not depend on the layout."""

    request: TrainingRequest
    model: ModelSpec
    hw: Hardware
    limit: float
    ladder: list[tuple[str | None, tuple[str, ...]]]
    fractions: tuple[float, ...]
    precision: tuple[str, Reason]
    cp_guess: tuple[int, Reason]
    tokens: int
    band: tuple[float, str]
    table: dict | None = None                 # step constants in place of the fitted ones (a calibration profile's)
    memory_constants: MemoryConstants | None = None
    optimizer: str | None = None              # the base recipe's optimizer (None: the template's Adam)
    memo: dict = field(default_factory=dict)  # memory priced for this request: per (plan, PP rank), per split
    at_mbs: dict = field(default_factory=dict)  # MBS -> the request with that micro_batch_size (its run options)

    def options(self, mbs: int) -> TrainingRequest:
        """The request's run options at micro batch size ``mbs`` (one copy per MBS, not per layout)."""
        if mbs not in self.at_mbs:
            self.at_mbs[mbs] = self.request.model_copy(update={"micro_batch_size": mbs})
        return self.at_mbs[mbs]

    @property
    def table_key(self):
        """``table`` as sorted (key, value) pairs: hashable, for the cached bounds."""
        return tuple(sorted(self.table.items())) if self.table else None


def _context(request: TrainingRequest, step_table: dict | None = None,
             memory_constants: MemoryConstants | None = None) -> _Request:
    model, hw = get_model(request.model), get_hardware(request.hardware)
    precision = choose_precision(model, hw, request.precision)
    recipe, _ = base_recipe(model, hw, precision[0], request.num_gpus)
    optimizer = recipe.record.get("optimizer") if recipe is not None else None
    return _Request(request, model, hw, memory_limit(model, hw, request.memory_margin), recompute_ladder(model),
                    offload_fractions(request.allow_cpu_offload, optimizer), precision,
                    cp_first_guess(request.seq_length),
                    tokens_per_step(model, shapes(model).total_params, request.tokens_per_step)[0],
                    band_for(hw.key, precision[0], model.gated_delta_net, step_table), step_table, memory_constants,
                    optimizer=optimizer)


def _base(ctx: _Request, layout: ParallelLayout, mbs: int, reject: dict) -> tuple[Plan, tuple[Reason, dict]] | None:
    """The layout's plan before recompute / offload / CUDA graphs, with the reasons of its dispatcher and of the
    decisions every run takes (:func:`~lcmoe_recipes.rules.extension.extension_fields`); None (rejected) when the
    model cannot fill its pipeline stages."""
    request, model, hw = ctx.request, ctx.model, ctx.hw
    try:
        common, why_common = extension_fields(model, hw, request.seq_length, layout, ctx.precision[0],
                                              ctx.options(mbs))
    except InfeasibleConfig as exc:
        _reject(reject, "pipeline/too-many-stages", exc.fix)
        return None
    (dispatcher, backend), why_dispatch = choose_dispatcher(hw, layout, request.dispatcher, model.is_moe)
    exchange, _ = choose_cp_comm_type(model, layout.tp, layout.cp)  # what the model's features require (ring or
    # hierarchical is decided once the plan fits: with_priced_cp_comm)
    # the EP all-to-all overlap wherever megatron-core allows it with this layout (a rung that forbids it turns it
    # off: _rung; an upstream recipe that turned it off on this hardware is followed before the ladder: _fit)
    recipe_on = common["moe_ep_overlap"]
    overlap = model.is_moe and not layout_blocks_ep_overlap(layout.ep, dispatcher, layout.pp, layout.vpp,
                                                            model.mtp_num_layers)
    base = Plan(
        name="planned", model=model.key, hardware=hw.key, seq_length=request.seq_length, layout=layout,
        precision=ctx.precision[0], moe_token_dispatcher_type=dispatcher, moe_flex_dispatcher_backend=backend,
        sequence_parallel=layout.tp > 1, mtp_num_layers=model.mtp_num_layers, variable_length=request.variable_length,
        cp_comm_type=exchange, **{**common, "moe_ep_overlap": overlap, "tp_comm_overlap": layout.tp > 1})
    return base, (why_dispatch, why_common, recipe_on)


def _reasons(ctx: _Request, plan: Plan, rules: tuple[Reason, Reason], level: int, fraction: float) -> dict[str, Reason]:
    """Every knob's reason for a fitting plan (built only for the layouts that fit)."""
    (guess, why_cp), layout = ctx.cp_guess, plan.layout
    granularity, modules = plan.recompute_granularity, tuple(plan.recompute_modules)  # the rung, as the plan runs it
    why_dispatch, why_common, _ = rules
    return {
        **why_common,
        "layout": Reason(f"the fastest fitting layout the model predicts (first CP guess {guess})", why_cp.source),
        "cp": Reason(f"CP={layout.cp}" + (f": the first guess, {why_cp.why}" if layout.cp == guess else
                                          f", not the first guess {guess} ({why_cp.why}): the search priced every CP "
                                          "candidate (see layout)"), why_cp.source),
        "sequence_parallel": Reason("on: TP>1 (MoE with TP>1 needs it)" if layout.tp > 1 else "off: TP=1",
                                    "megatron-core TransformerConfig"),
        "tp_comm_overlap": Reason(
            f"on: megatron-bridge keeps it at TP{layout.tp} with sequence parallelism: each TP all-gather / "
            "reduce-scatter runs beside a GEMM of its layer (its userbuffers are in the memory budget)"
            if plan.tp_comm_overlap else tp_overlap_allowed(layout.tp, plan.sequence_parallel)[1] or "off",
            COMM_OVERLAP_SOURCE),
        "dispatcher": why_dispatch, "precision": ctx.precision[1],
        "recompute": recompute_reason(level, len(ctx.ladder), granularity, modules),
        "optimizer_cpu_offload": offload_reason(fraction, ctx.optimizer, ctx.model.key),
        "cuda_graphs": choose_cuda_graphs(ctx.hw, ctx.request.variable_length, granularity, modules,
                                          plan.moe_flex_dispatcher_backend, ctx.model.is_moe)[1],
        # an upstream recipe's hazard choice made on the base before the ladder (the EP overlap off on B200: _fit)
        **{k: v for k, v in plan.reasons.items() if k == "moe_ep_overlap"},
    }


def _checked(base: Plan, reject: dict) -> bool:
    errors = [f for f in check_plan(base) if f.severity == "error"]
    if errors:
        _reject(reject, errors[0].rule, errors[0].fix)
    return not errors


def _fits_at_all(ctx: _Request, base: Plan, reject: dict) -> bool:
    """The memory lower bound: False (rejected) when ``base`` cannot fit even with the most recompute and offload
    there is. Only the first and last PP ranks are priced: a layout that passes may still not fit, which its
    ladder (ending with that most-recompute, most-offload choice) then finds."""
    worst = _with_knobs(base, ctx.ladder[-1], ctx.fractions[-1], ctx.hw, ctx.request)
    pp = base.layout.pp
    if any(_rank_peak(ctx, worst, r).hbm_total > ctx.limit for r in dict.fromkeys((0, pp - 1))):
        _reject(reject, "memory/exceeds-hbm", MEMORY_FIX)
        return False
    return True


def _parameters_exceed(ctx: _Request, base: Plan) -> bool:
    """Whether the memory lower bound of parameters and gradients alone exceeds the limit (priced once per split)."""
    key = _parameters_key(base.layout, base.mtp_num_layers, base.grad_dtype)
    if key not in ctx.memo:
        ctx.memo[key] = memory_lower_bound(base)
    return ctx.memo[key] > ctx.limit


def _parameters_key(lay: ParallelLayout, mtp_num_layers: int, grad_dtype: str) -> tuple:
    """What :func:`~lcmoe_recipes.cost.bounds.memory_lower_bound` reads of a plan: its TP / EP / ETP / PP / VPP split,
    MTP layers and gradient dtype."""
    return "parameters", lay.tp, lay.ep, lay.etp, lay.pp, lay.vpp, mtp_num_layers, grad_dtype


def _known_too_big(ctx: _Request, lay: ParallelLayout) -> bool:
    """Whether a layout of a split already priced by :func:`_parameters_exceed` cannot hold its parameters and
    gradients: it is rejected before its plan is built and checked (the planned gradient dtype is
    :data:`~lcmoe_recipes.rules.base.GRAD_DTYPE` for every base)."""
    return ctx.memo.get(_parameters_key(lay, ctx.model.mtp_num_layers, GRAD_DTYPE), 0.0) > ctx.limit


def _rank_peak(ctx: _Request, plan: Plan, pp_rank: int) -> MemoryBreakdown:
    """:func:`~lcmoe_recipes.cost.memory.rank_memory`, priced once per request."""
    memory = ctx.memo.get((plan, pp_rank))
    if memory is None:
        memory = ctx.memo[(plan, pp_rank)] = (rank_memory(plan, pp_rank, ctx.memory_constants)
                                              if ctx.memory_constants else rank_memory(plan, pp_rank))
    return memory


def _rank_peaks(ctx: _Request, plan: Plan):
    """The memory of each PP rank that can be the most loaded (:func:`~lcmoe_recipes.cost.memory.peak_ranks`): the
    first rank (most microbatches in flight) and the last (logits) first."""
    ranks = peak_ranks(plan)
    return (_rank_peak(ctx, plan, r) for r in dict.fromkeys((ranks[0], ranks[-1], *ranks[1:-1])))


def _exceeds(ctx: _Request, plan: Plan) -> bool:
    """Whether the HBM use of the most loaded rank (``hbm_total``: the allocator's peak and what lives outside it)
    exceeds the limit; the first rank over it answers, without pricing the others."""
    return _over(ctx, plan) is not None


def _over(ctx: _Request, plan: Plan) -> MemoryBreakdown | None:
    """The first rank :func:`_exceeds` finds over the limit, None when every rank fits."""
    return next((m for m in _rank_peaks(ctx, plan) if m.hbm_total > ctx.limit), None)


def _peak(ctx: _Request, plan: Plan) -> MemoryBreakdown:
    """``estimate_memory(plan)`` (the most loaded rank; the lowest rank on a tie), from the ranks priced once."""
    return max(sorted(_rank_peaks(ctx, plan), key=lambda m: m.pp_rank), key=lambda m: m.total)


class _Rung(NamedTuple):
    """Where a layout fits (:func:`_find_rung`): the first rung of the memory ladder that fits with the EP overlap
    the rung allows (``plan``, its ladder ``level`` and offload ``fraction``; None when none does before ``fallback``
    is taken), and ``fallback``: with VPP, the first rung that fits only with the EP overlap off ((plan, level,
    fraction) or None). ``wanted``: the base's EP overlap, before any rung."""

    plan: Plan | None
    level: int
    fraction: float
    fallback: tuple[Plan, int, float] | None
    wanted: bool


def _fit(ctx: _Request, base: Plan, rules: tuple[Reason, dict, bool], reject: dict) -> Candidate | None:
    """The least recompute, then the smallest offload, that fits ``base`` in the memory limit, with its predicted
    step; None (rejected) when the checks refuse every fitting choice (:func:`_find_rung`, then :func:`_priced`)."""
    rung = _find_rung(ctx, base, reject)
    return None if rung is None else _priced(ctx, rung, rules)


def _find_rung(ctx: _Request, base: Plan, reject: dict) -> _Rung | None:
    """The memory half of :func:`_fit`: the first rung that fits and that the checks pass (memory only, no step
    priced); None (rejected) when there is none. With VPP the EP all-to-all overlap keeps one more model chunk in
    flight (:func:`~lcmoe_recipes.cost.memory.ep_overlap_warmup`): the first rung that fits only with it off is kept
    aside (``fallback``) to be priced against the first that fits with it on (:func:`_priced`)."""
    over: dict[int, MemoryBreakdown] = {}  # per recompute level: a rank over the limit without offload
    fallback = None  # (plan, level, fraction): the first rung that fits with the EP overlap off but not on
    if base.moe_ep_overlap:  # an upstream recipe's choice against an open hazard (the overlap off on B200), before
        # memory is priced (the bounds the unit passed hold either way: the overlap only hides EP time)
        base = follow_recipe_choices(base)
    # with VPP each rung is priced without the overlap first: every rank keeps less there, so a rung over the limit
    # without it is over with it, and most rungs that do not fit are answered at that price
    lean = base.with_changes(moe_ep_overlap=False) if ep_overlap_warmup(base) else None
    for level, fraction in _fitting_knobs(ctx, base, over, lean):
        plan = _with_knobs(base, ctx.ladder[level], fraction, ctx.hw, ctx.request)
        off = plan.with_changes(moe_ep_overlap=False) if lean is not None and plan.moe_ep_overlap else None
        if off is not None:
            low = _over(ctx, off)
            if low is not None:
                if not fraction:
                    over[level] = low
                continue
        high = _over(ctx, plan)
        if high is not None and not fraction and off is None:
            over[level] = high
        if high is not None:
            if fallback is None and off is not None and not _refused(off):
                fallback = (off, level, fraction)
            continue
        if _refused(plan):
            continue
        return _Rung(plan, level, fraction, fallback, base.moe_ep_overlap)
    if fallback is not None:
        return _Rung(None, 0, 0.0, fallback, base.moe_ep_overlap)
    _reject(reject, "memory/exceeds-hbm", MEMORY_FIX)
    return None


def _rung_bound(ctx: _Request, rung: _Rung, known: float) -> float:
    """A lower bound of the step :func:`_priced` gives ``rung``: :func:`~lcmoe_recipes.cost.bounds.step_lower_bound`
    at the rung's own recompute (what :func:`_priced` may still change -- the CP exchange, the EP and TP overlaps, an
    upstream recipe's hazard choice -- priced at its fastest: either exchange, the TP overlap on or off, the EP overlap
    on wherever the base wanted it), the smaller of the rung and its fallback. ``known``: the layout's bound without
    recompute, returned as it is for a rung without recompute or fallback (pricing it again would give no more)."""
    if rung.fallback is None and rung.plan.recompute_granularity is None:
        return known
    out = float("inf")
    for plan in (rung.plan, rung.fallback[0] if rung.fallback else None):
        if plan is not None:
            if rung.wanted and not plan.moe_ep_overlap:
                plan = plan.with_changes(moe_ep_overlap=True)  # only hides EP time: a bound of on and off
            out = min(out, _step_bound(plan, ctx.table, keep_recompute=True))
    return out


def _priced(ctx: _Request, rung: _Rung, rules: tuple[Reason, dict, bool]) -> Candidate:
    """The pricing half of :func:`_fit`: the candidate of ``rung`` (:func:`_finish`); where a fallback rung fits
    only with the EP overlap off, the faster of the two, the reason saying why."""
    wanted = rung.wanted
    if rung.plan is None:
        return _finish(ctx, rung.fallback[0], rules, *rung.fallback[1:], False, ())
    level, fraction = rung.level, rung.fraction
    found = _finish(ctx, rung.plan, rules, level, fraction, wanted)
    if rung.fallback is None:
        return found
    alt, alt_level, alt_fraction = rung.fallback
    on = found.plan.moe_ep_overlap  # False: this rung forbids the overlap (or an upstream recipe turned it off)
    other = _finish(ctx, alt, rules, alt_level, alt_fraction, False,
                    (_knobs_text(ctx, level, fraction), found.step.step_seconds) if on else ())
    if other.step.step_seconds < found.step.step_seconds or not on:
        return other
    return _with_reason(found, "moe_ep_overlap", (
        f"; with it off this layout would fit with {_knobs_text(ctx, alt_level, alt_fraction)} instead of "
        f"{_knobs_text(ctx, level, fraction)}, which the step model prices slower: "
        f"{other.step.step_seconds:.2f} s against {found.step.step_seconds:.2f} s"))


def _refused(plan: Plan) -> bool:
    """Whether the checks of the knobs a rung set refuse ``plan`` (the rest passed on its base:
    checks.knob_findings), or a node's RAM does."""
    return any(f.severity == "error" for f in knob_findings(plan) + host_findings(plan))


def _knobs_text(ctx: _Request, level: int, fraction: float) -> str:
    """A rung of the memory ladder in words."""
    granularity, modules = ctx.ladder[level]
    what = "no recompute" if granularity is None else (
        "full recompute" if granularity == "full" else "recompute of " + "+".join(modules))
    return what + (f" and {fraction:.0%} of the optimizer offloaded" if fraction else "")


def _with_reason(c: Candidate, key: str, more: str) -> Candidate:
    """``c`` with ``more`` added to its plan's reason ``key``."""
    reasons = dict(c.plan.reasons)
    reasons[key] = Reason(reasons[key].why + more, reasons[key].source)
    return Candidate(c.plan.with_changes(reasons=reasons), c.memory, c.step)


def _finish(ctx: _Request, plan: Plan, rules: tuple[Reason, dict, bool], level: int, fraction: float,
            wanted: bool, only_off: tuple | None = None) -> Candidate:
    """The candidate of a fitting rung ``plan``: its reasons, EP overlap, CP exchange, the recipes' hazard choices,
    its predicted step and memory. ``wanted``: the base's EP overlap, before the rung (a rung that forbids it turned
    it off; the reason says why). An EP overlap the planner turned on (not the base recipe's) must pay: off where
    the step model prices it no faster. ``only_off``: for a rung that fits only with the EP overlap off, the first
    rung that fits with it on (its knobs in words, its step s), or () when none does."""
    recipe_on = rules[2]
    ask = plan.with_changes(reasons=_reasons(ctx, plan, rules, level, fraction))
    if wanted and not plan.moe_ep_overlap and only_off is None:
        ask = ask.with_changes(moe_ep_overlap=True)  # turned off by the rung: with_ep_overlap says why
    chosen, step, terms = with_priced_cp_comm(with_ep_overlap(ask, recipe_on))
    if only_off is None and chosen.moe_ep_overlap and not recipe_on:
        chosen, step, terms = _kept_where_it_pays(
            chosen, "moe_ep_overlap", ep_overlap_steps, step, terms, SOURCE,
            lambda on, off: ("EP all-to-all overlap off: megatron-core allows it here, but the step model prices it "
                             f"no faster ({on:.2f} s with it, {off:.2f} s without)"))
    if chosen.tp_comm_overlap:  # on wherever megatron-bridge keeps it (_base); kept only where it pays
        chosen, step, terms = _kept_where_it_pays(
            chosen, "tp_comm_overlap", tp_overlap_steps, step, terms, COMM_OVERLAP_SOURCE,
            lambda on, off: (f"off: megatron-bridge keeps it at TP{chosen.layout.tp}, but the step model prices it no "
                             f"faster ({on:.2f} s with it, {off:.2f} s without: its GEMMs lose more to the SMs the "
                             "transfers hold than the transfers take)"))
    fitted, plan = plan, follow_recipe_choices(chosen)  # the recipe's setting that avoids an open hazard
    if plan is not chosen:
        step = terms = None
    if step is None or ctx.table is not None:  # the CP choice priced the fitted constants, or nothing
        step = estimate_step(plan, ctx.table, terms=terms)
    if only_off is not None:
        why = ("EP all-to-all overlap off: with it on, VPP keeps one more model chunk of activations in flight "
               "(megatron-core's extra warm-up microbatch) and this layout fits only with " +
               (f"{only_off[0]}, which the step model prices slower: {only_off[1]:.2f} s against "
                f"{step.step_seconds:.2f} s" if only_off else "recompute that megatron-core forbids beside it, or not at "
                "all"))
        plan = plan.with_changes(reasons={**plan.reasons, "moe_ep_overlap": Reason(why, SOURCE)})
    # the rung's memory, priced already, unless the CP exchange or the EP overlap changed what memory reads
    same = memory_key(plan) == memory_key(fitted)
    return Candidate(plan, _peak(ctx, fitted if same else plan), step)


def _kept_where_it_pays(plan: Plan, field: str, steps, step, terms, source: str, off_why):
    """(plan, step, terms) with the overlap ``field`` (a Plan bool) kept where the step model prices the step faster
    with it -- its reason then gives both times -- or turned off, with ``off_why(on s, off s)`` as the reason (the
    step and terms then None: the plan changed). ``steps``: the step model's (on, off) pricing of that overlap
    (:func:`~lcmoe_recipes.cost.step.ep_overlap_steps`, :func:`~lcmoe_recipes.cost.step.tp_overlap_steps`)."""
    terms = terms or step_terms(plan)
    on, off = steps(plan, terms, step.step_seconds if step is not None else None)
    if off <= on:
        reasons = {**plan.reasons, field: Reason(off_why(on, off), source)}
        return plan.with_changes(**{field: False}, reasons=reasons), None, None
    why = plan.reasons[field]
    return plan.with_changes(reasons={**plan.reasons, field: Reason(
        f"{why.why}; the step model prices the step {off - on:.2f} s faster with it ({off:.2f} s -> {on:.2f} s)",
        why.source)}), step, terms


MEMORY_FIX_OTHERS = "a shorter seq_length, or a GPU with more HBM"
MEMORY_FIX = "use more GPUs, " + MEMORY_FIX_OTHERS
# gated DeltaNet (Qwen3-Next): with gated DeltaNet priced from megatron-core's implementation the memory model predicts
# 0.45-0.78 of the published peaks (docs/accuracy.md N1-N3, layouts and method unpublished); plan such models as if the
# prediction were at its most optimistic measured ratio.
UNCALIBRATED_FACTOR = GDN_MEASURED_RATIOS[1]


def memory_limit(model, hw, memory_margin: float = DEFAULT_MEMORY_MARGIN) -> float:
    """Bytes the search lets a rank's HBM use reach (``MemoryBreakdown.hbm_total``: the allocator's peak plus the
    dispatcher buffers, CUDA context and NCCL buffers outside it): HBM less ``memory_margin`` of it -- the
    fragmentation margin, default 5% (the 95% the memory check allows) -- times UNCALIBRATED_FACTOR for models whose
    memory the model under-predicts."""
    return (1 - memory_margin) * hw.hbm_bytes * (UNCALIBRATED_FACTOR if model.gated_delta_net else 1.0)


def _reject(reject: dict, rule: str, fix: str) -> None:
    count, first_fix = reject.get(rule, (0, fix))
    reject[rule] = (count + 1, first_fix)


def _fitting_knobs(ctx: _Request, base: Plan, over: dict[int, MemoryBreakdown], lean: Plan | None = None):
    """(recompute level, offload fraction) pairs to try, cheapest first: every selective level without offload;
    then, level by level, the smallest offload fraction that fits (the optimizer state on the GPU falls linearly
    with the fraction, so one estimate at fraction 1 gives it); then full recompute the same way. ``over``: per
    level, a rank the caller found over the limit without offload (filled as the pairs are tried); offload changes
    nothing of a rank's memory but its optimizer state, so a level whose rank stays over the limit with all of that
    state offloaded is not priced at fraction 1. ``lean``: ``base`` without the EP overlap, where with VPP it keeps
    more in flight (the fraction then is the one that fits without it; the caller tries it with it first)."""
    ladder, fractions, limit, hw, request = ctx.ladder, ctx.fractions, ctx.limit, ctx.hw, ctx.request
    selective = [i for i, (g, _) in enumerate(ladder) if g != "full"]
    full = [i for i, (g, _) in enumerate(ladder) if g == "full"]
    for level in selective:
        yield level, 0.0
    if len(fractions) == 1:
        yield from ((level, 0.0) for level in full)
        return
    for level in selective + full:
        high = over.get(level)
        if high is not None and high.hbm_total - high.optimizer > limit * (1 + 1e-9):  # (rounding kept out)
            continue
        at_one_plan = _with_knobs(lean or base, ladder[level], 1.0, hw, request)
        if _exceeds(ctx, at_one_plan):
            continue
        at_one = _peak(ctx, at_one_plan)
        # the part left on the GPU under offload: FP32 master weight and moments (Plan.effective_moment_dtype)
        state = at_one.detail["optimizer_shard_params"] * (4 + 2 * 4)
        need = next((f for f in fractions[1:] if at_one.hbm_total + state * (1 - f) <= limit), 1.0)
        yield level, need
        if level in full:
            return
    yield from ((level, 0.0) for level in full)


def _with_knobs(base: Plan, recompute: tuple, fraction: float, hw, request: TrainingRequest) -> Plan:
    """``base`` on one rung of the ladder: recompute, offload, and the CUDA graphs the rule allows with them. Under
    the op fuser the rung leaves out moe_act, which megatron-core would not apply
    (:func:`~lcmoe_recipes.cost.memory.applied_modules`): the plan lists what runs."""
    return base.with_changes(**dict(_rung((recompute[0], tuple(recompute[1])), fraction, hw.key,
                                          request.variable_length, base.moe_flex_dispatcher_backend,
                                          base.model_spec.is_moe, base.use_precision_aware_optimizer,
                                          base.moment_dtype, base.use_transformer_engine_op_fuser,
                                          base.moe_ep_overlap)))


@lru_cache(maxsize=1024)
def _rung(recompute: tuple, fraction: float, hw_key: str, variable_length: bool, backend: str | None, is_moe: bool,
          precision_aware: bool, moment_dtype: str, op_fuser: bool = False,
          ep_overlap: bool = False) -> tuple[tuple[str, object], ...]:
    granularity, modules = recompute[0], applied_modules(recompute[1], op_fuser)
    (impl, graphs), _ = choose_cuda_graphs(get_hardware(hw_key), variable_length, granularity, modules, backend, is_moe)
    full = granularity == "full"
    # the base's EP overlap, off where this rung's recompute or graphs forbid it (priced as the plan runs)
    overlap = ep_overlap and recompute_or_graphs_block_ep_overlap(granularity, modules, "uniform" if full else None,
                                                                  1 if full else None, impl, graphs) is None
    return (("moe_ep_overlap", overlap), ("recompute_granularity", granularity), ("recompute_modules", modules),
            ("recompute_method", "uniform" if granularity == "full" else None),
            ("recompute_num_layers", 1 if granularity == "full" else None),
            ("optimizer_cpu_offload", fraction > 0), ("optimizer_offload_fraction", fraction),
            # CPU offload runs through the precision-aware optimizer (megatron-core HybridDeviceOptimizer)
            ("use_precision_aware_optimizer", precision_aware or fraction > 0),
            # and keeps FP32 moments whatever exp_avg_dtype says: the plan states what runs (Plan.moment_dtype)
            ("moment_dtype", "fp32" if fraction > 0 else moment_dtype),
            ("cuda_graph_impl", impl), ("cuda_graph_modules", graphs))


def _seq_split_note(request: TrainingRequest, guess: int) -> tuple[str, str | None]:
    """('; why', fix) when seq_length itself keeps CP below the first guess (2·CP equal chunks), else ('', None)."""
    seq, limit = request.seq_length, cp_split_limit(request.seq_length)
    if request.cp or limit >= guess:
        return "", None
    step = 2 * guess
    longer = -(-seq // step) * step
    return (f"; seq_length {seq:,} splits into 2·CP equal chunks only for CP <= {limit} (CP={guess}, the first guess "
            f"for this length, needs a multiple of {step})",
            f"use a seq_length divisible by {step}, e.g. {longer} (or {longer - step})" if longer - step > 0 else
            f"use a seq_length divisible by {step}, e.g. {longer}")


def _why_no_layout(request: TrainingRequest):
    """The first error of the checks on the layout the fixed wishes force (when no layout could be enumerated)."""
    from ..checks import Finding

    model = get_model(request.model)
    tp, pp, cp, ep = request.tp or 1, request.pp or 1, request.cp or 1, request.ep or 1
    world = request.num_gpus
    lay = ParallelLayout(world=world, tp=tp, pp=pp, cp=cp, ep=ep, etp=1)
    probe = Plan(name="probe", model=model.key, hardware=request.hardware, seq_length=request.seq_length, layout=lay,
                 pipeline_model_parallel_layout=None, micro_batch_size=1, global_batch_size=world,
                 precision="bf16", moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_backend=None,
                 sequence_parallel=tp > 1)
    errors = [f for f in check_plan(probe) if f.severity == "error" and not f.rule.startswith(("batch/", "pipeline/"))]
    fixed = [f"--{k} {getattr(request, k)}" for k in ("tp", "pp", "cp", "ep") if getattr(request, k)]
    return errors[0] if errors else Finding(
        "error", "rank-folding", f"no TP/PP/CP/EP combination folds into {world} GPUs for this model",
        "change the GPU count" + (f", or drop {' / '.join(fixed)}" if fixed else ""))


def _step_bound(base: Plan, table: dict | None = None, keep_recompute: bool = False) -> float:
    """:func:`~lcmoe_recipes.cost.bounds.step_lower_bound` of ``base`` under either CP exchange :func:`_fit` may
    choose (the ring, or hierarchical a2a+p2p where the layout allows it): the smaller of the two.
    ``keep_recompute``: priced at ``base``'s own recompute (a rung's), not without any."""
    split = hierarchical_split(base) if base.layout.cp > 1 and base.cp_comm_type == "p2p" else None
    return step_lower_bound(base, table, None if split is None else ("a2a+p2p", split), keep_recompute)


def search_layouts(request: TrainingRequest, top: int = 5, exhaustive: bool = False, step_table: dict | None = None,
         memory_constants: MemoryConstants | None = None) -> SearchResult:
    """Search the request's layouts and MBS values; return the winner and the ``top`` fastest fitting candidates
    (see the module doc).

    Args:
        top: candidates in ``ranked`` (the winner first).
        exhaustive: evaluate every candidate instead of skipping those a step-time lower bound rules out (same
            winner and ranking, slower; for tests and the benchmark).
        step_table, memory_constants: a calibration profile's constants (``CalibrationProfile.step_table()``,
            ``.memory_constants()``) in place of the published fit: the search ranks and fits with them (the CP
            exchange rule -- ring or hierarchical -- still compares with the published constants).

    Raises:
        InfeasibleConfig: no layout is legal and fits, naming the constraint that rejected most of them.
    """
    ctx = _context(request, step_table, memory_constants)
    limit_tp = None if request.tp else tp_width_limit(ctx.model)
    result = _search(ctx, enumerate_layouts(request, limit_tp), top, exhaustive)
    if isinstance(result, SearchResult) or limit_tp is None or limit_tp >= 8:
        return _result_or_raise(ctx, result)
    wide = _search(ctx, enumerate_layouts(request), top, exhaustive)  # nothing narrower fits: allow wider TP
    if isinstance(wide, SearchResult):
        note = (f"TP={wide.best.plan.layout.tp} is wider than {ctx.model.display}'s hidden size "
                f"{ctx.model.hidden_size} supports at {MIN_TP_WIDTH} columns per rank (TP <= {limit_tp}): no layout "
                f"with TP <= {limit_tp} fits")
        reasons = {**wide.best.plan.reasons,
                   "layout": Reason(wide.why + "; " + note, SOURCE)}
        best = Candidate(wide.best.plan.with_changes(reasons=reasons), wide.best.memory, wide.best.step)
        return replace(wide, best=best, ranked=[best] + wide.ranked[1:], why=wide.why + "; " + note, tp_note=note)
    return _result_or_raise(ctx, wide)


def _search(ctx: _Request, layouts: list[ParallelLayout], top: int, exhaustive: bool):
    """The search over ``layouts`` x :func:`mbs_choices`: a SearchResult, or (candidates considered, rejections) when
    nothing fits."""
    request = ctx.request
    units = [(lay, mbs) for lay in layouts for mbs in mbs_choices(request)]
    index = {unit: i for i, unit in enumerate(units)}
    rejected: dict[str, tuple[int, str]] = {}
    fits: list[tuple[float, int, Candidate]] = []
    steps: list[float] = []  # sorted step times of the fits
    band = ctx.band[0]
    # per unit: "fit", "pruned", "rejected", "pending" (its step bound known), "rung" (its memory rung known, its step
    # not yet priced) or "bounded" (skipped on its rung bound). A larger MBS waits for its half only until the half's
    # rung is known: it may land on a lighter rung -- less recompute, more offload -- and be faster, so it is neither
    # skipped with a half skipped on its rung bound nor kept waiting behind a half queued on it.
    outcome: dict[tuple[ParallelLayout, int], str] = {}
    cause: dict[tuple[ParallelLayout, int], tuple[str, str]] = {}  # per rejected unit: the (rule, fix) that did it
    last: list = []  # the unit evaluated last and the rejection counts before it
    # The queue, lowest key first: (key, unit index, stage, its base plan and rules at stage 1, with its rung at
    # stage 2). Exhaustive: every unit in order at stage 0, evaluated whole. Else best-first on lower bounds of the
    # step: stage 0 is keyed by the compute bound; there the unit's plan is built, checked and given its exact
    # no-recompute bound (:func:`_step_bound`), with which it goes back in as stage 1; there its memory rung is found
    # (:func:`_find_rung`) and it goes back in as stage 2 keyed by the bound at that rung (:func:`_rung_bound`), to be
    # priced (:func:`_priced`) when it comes out first. The fits thus come in order of the tightest bound, so the cut
    # falls fast; once the lowest key left is above the cut, so is every other, and the rest are skipped.
    queue: list[tuple] = []
    queued: set[int] = set()  # units ever put in the queue (a larger MBS is released once, by its half)

    def enqueue(i: int) -> None:
        if i not in queued:
            queued.add(i)
            heapq.heappush(queue, (i if exhaustive else _compute_bound(ctx, *units[i]), i, 0, None))

    def resolve(unit, state: str) -> None:  # a unit's outcome; its twice-larger MBS may now be evaluated
        outcome[unit] = state
        bigger = index.get((unit[0], 2 * unit[1]))
        if bigger is not None:
            enqueue(bigger)

    def settle() -> None:  # the rule that rejected the unit evaluated last, for its larger MBS to inherit
        if last and outcome.get(last[0]) == "rejected":
            grown = [rule for rule, (count, _) in rejected.items() if count > last[1].get(rule, 0)]
            if grown:
                cause[last[0]] = (grown[0], rejected[grown[0]][1])
        last.clear()

    for i, (lay, mbs) in enumerate(units):  # a larger MBS waits for its half (inherits its outcome unless it fit)
        if (lay, mbs // 2) not in index:
            enqueue(i)
    while queue:
        settle()
        key, i, stage, made = heapq.heappop(queue)
        unit = units[i]
        if not exhaustive and key > _cut(steps, top, band):  # every key left is at least this one: all out
            break
        last[:] = [unit, {rule: count for rule, (count, _) in rejected.items()}]
        if stage == 0:
            lay, mbs = unit
            smaller = outcome.get((lay, mbs // 2), "fit") if mbs > 1 else "fit"
            if smaller not in ("fit", "rung", "bounded"):  # twice the activations of a unit that did not fit (or
                # whose bound without recompute was slower than the cut)
                if smaller == "rejected":  # refused by the rule that refused the smaller MBS (its own, or memory)
                    cause[unit] = cause.get((lay, mbs // 2), ("memory/exceeds-hbm", MEMORY_FIX))
                    _reject(rejected, *cause[unit])
                resolve(unit, smaller)
                continue
            outcome[unit] = "rejected"
            if not exhaustive and _known_too_big(ctx, lay):  # a split that cannot hold its parameters: no plan built
                _reject(rejected, "memory/exceeds-hbm", MEMORY_FIX)
                resolve(unit, "rejected")
                continue
            made = _base(ctx, *unit, rejected)
            if made is None or not _checked(made[0], rejected):
                resolve(unit, "rejected")
                continue
            if not exhaustive:
                if _parameters_exceed(ctx, made[0]):
                    _reject(rejected, "memory/exceeds-hbm", MEMORY_FIX)
                    resolve(unit, "rejected")
                    continue
                bound = _step_bound(made[0], ctx.table)
                if bound > _cut(steps, top, band):
                    resolve(unit, "pruned")
                    continue
                outcome[unit] = "pending"
                heapq.heappush(queue, (max(key, bound), i, 1, made))
                continue
        if stage < 2:
            outcome[unit] = "rejected"
            if not _fits_at_all(ctx, made[0], rejected):
                resolve(unit, "rejected")
                continue
            rung = _find_rung(ctx, made[0], rejected)
            if rung is None:
                resolve(unit, "rejected")
                continue
            if not exhaustive:
                bound = _rung_bound(ctx, rung, key)
                if bound > _cut(steps, top, band):
                    resolve(unit, "bounded")
                    continue
                heapq.heappush(queue, (max(key, bound), i, 2, (made, rung)))
                resolve(unit, "rung")  # priced when it comes out again; its larger MBS need not wait for that
                continue
            made = (made, rung)
        (_, rules), rung = made
        candidate = _priced(ctx, rung, rules)
        fits.append((candidate.step.step_seconds, i, candidate))
        bisect.insort(steps, candidate.step.step_seconds)
        resolve(unit, "fit")
    settle()
    pruned = sum(outcome.get(unit) in (None, "pending", "pruned", "bounded", "rung") for unit in units)
    if not fits:
        return len(units), rejected
    fits.sort(key=lambda f: f[:2])
    ranked_fits = [c for _, _, c in fits]
    fastest = ranked_fits[0]
    ties = [c for c in ranked_fits if c.step.step_seconds <= fastest.step.step_seconds * (1 + band)]
    safe = MEMORY_ERROR_BAND * ctx.limit

    def headroom(c: Candidate) -> float:
        return ctx.limit - c.memory.hbm_total

    hazards = {id(c): open_hazards(c.plan) for c in ties}
    best, rule, passed = _tie_break(ties, hazards, headroom, safe)
    answers = _hazard_answers(best, fastest, ties, ranked_fits, hazards)
    tie_break = tuple(Tie(c.plan.layout.describe(), c.plan.micro_batch_size, c.step.step_seconds, headroom(c),
                          headroom(c) >= safe, c is best, c.plan.layout.dp, passed.get(id(c), ""))
                      for c in ties)
    why = _why(best, fastest, ties, ctx.limit, safe, rule, ctx.band, passed) + _hazard_text(answers) + (
        f"; {len(units)} candidates (layout x MBS) considered, {len(fits)} fitting ones priced"
        + (f" ({pruned} skipped: a lower bound of their step time is slower than every candidate kept)"
           if pruned else ""))
    reasons = {**best.plan.reasons, "layout": Reason(why, SOURCE)}
    name = f"{request.model}_{seq_tag(request.seq_length)}_{request.num_gpus}x{request.hardware}"
    winner = Candidate(best.plan.with_changes(reasons=reasons, name=name), best.memory, best.step)
    ranked = [winner] + [c for c in ranked_fits if c is not best][: max(0, top - 1)]
    return SearchResult(request, winner, ranked, len(units), {k: v[0] for k, v in rejected.items()}, why,
                      len(units) - pruned, pruned, ctx.limit, fastest, len(ties), band, ctx.band[1], rule, tie_break,
                      hazards=answers)


TIE_RULES = ("hazard", "headroom", "data parallel", "most headroom")  # the order the tie-break applies them


def _tie_break(ties: list[Candidate], hazards: dict[int, tuple[str, ...]], headroom, safe: float):
    """(winner, the rule that decided, {id(tie): the rule that passed it over}) among ``ties`` (fastest first).

    The rules, in order (module doc, step 3): **hazard** keeps the ties walking into the fewest open hazards;
    **headroom** keeps those that leave :data:`~lcmoe_recipes.cost.bands.MEMORY_ERROR_BAND` of the limit free;
    **data parallel** keeps, among those, the ones with DP > 1 where there are any (Megatron-Bridge's
    ``skills/nemo-mbridge-perf-moe-long-context/SKILL.md``, CP sizing rule 2: "keep DP alive if possible":
    long-context scaling becomes brittle once CP, EP, TP and PP squeeze DP to the floor); the fastest kept tie wins.
    When no tie keeps the memory band free, **most headroom**: the one with the most wins. The rule that decided is
    the last one that passed over a tie faster than the winner ("fastest" when none did)."""
    passed: dict[int, str] = {}
    weight = {id(c): hazard_weight(hazards[id(c)]) for c in ties}
    fewest = min(weight.values())
    pool = []
    for c in ties:  # equal cost: the ties with the fewest open hazards
        if weight[id(c)] == fewest:
            pool.append(c)
        else:
            passed[id(c)] = "hazard"
    kept = [c for c in pool if headroom(c) >= safe]
    if kept:
        for c in pool:
            if headroom(c) < safe:
                passed[id(c)] = "headroom"
        wide = [c for c in kept if c.plan.layout.dp > 1]
        if wide:
            for c in kept:
                if c.plan.layout.dp == 1:
                    passed[id(c)] = "data parallel"
            kept = wide
        best = kept[0]
    else:
        best = max(pool, key=headroom)
        for c in pool:
            if c is not best:
                passed[id(c)] = "most headroom"
    faster = [passed[id(c)] for c in ties[:next(i for i, c in enumerate(ties) if c is best)]]  # fastest first
    rule = max(faster, key=TIE_RULES.index) if faster else "fastest"
    return best, rule, passed


def rules_applied(tie_break) -> tuple[str, ...]:
    """Every rule that passed over a tie faster than the winner, in the order the tie-break applies them (the last
    is :attr:`SearchResult.rule`); () when the fastest won."""
    faster = []
    for t in tie_break:
        if t.winner:
            break
        faster.append(t.passed_over)
    return tuple(r for r in TIE_RULES if r in faster)


def _hazard_answers(best: Candidate, fastest: Candidate, ties: list[Candidate], fits: list[Candidate],
                    hazards: dict[int, tuple[str, ...]]) -> tuple[tuple[str, str, str], ...]:
    """(hazard id, confidence, answer) for every open hazard the fastest tie or the winner walks into, and for every
    one whose recipe choice the winner carries (:mod:`lcmoe_recipes.planner.hazards`)."""
    from .hazards import RECIPE_CHOICES, confidence, decides

    won, first = hazards[id(best)], hazards[id(fastest)]
    out = []
    for issue_id in dict.fromkeys((*first, *won)):
        if issue_id in won and not decides(issue_id):
            out.append((issue_id, confidence(issue_id), "not avoided: low confidence -- it does not decide among "
                        "equal-cost ties, so no predicted step time is given up for it"))
            continue
        if issue_id not in won:
            how = (f"avoided: {best.plan.layout.describe()}, MBS {best.plan.micro_batch_size} does not walk into it "
                   f"and is within the step error band of the fastest ({fastest.plan.layout.describe()}, MBS "
                   f"{fastest.plan.micro_batch_size}), which does")
        elif all(issue_id in hazards[id(c)] for c in ties):
            every = all(open_hazards(c.plan, (issue_id,)) for c in fits)
            how = ("cannot avoid: " + ("decided by the request: every fitting candidate priced walks into it"
                                        if every else "every candidate within the step error band walks into it; "
                                        "a layout without it is slower than the band allows"))
        else:
            how = "cannot avoid: the ties without it walk into more open hazards (or into an error one)"
        out.append((issue_id, confidence(issue_id), how))
    for issue_id, choice in RECIPE_CHOICES.items():
        reason = best.plan.reasons.get(choice.field)
        if reason is not None and reason.why == choice.why and issue_id not in won:
            out.append((issue_id, confidence(issue_id), f"recipe: {choice.why}"))
    return tuple(out)


def _hazard_text(answers: tuple[tuple[str, str, str], ...]) -> str:
    """The winner's reason, continued: the answer to each open hazard (empty when there is none)."""
    if not answers:
        return ""
    return "; open hazards: " + "; ".join(f"{describe_hazard(i)} -- {how}" for i, _, how in answers)


def _result_or_raise(ctx: _Request, result) -> SearchResult:
    """``result`` when it is a SearchResult; else the InfeasibleConfig naming what rejected most candidates."""
    if isinstance(result, SearchResult):
        return result
    considered, rejected = result
    request = ctx.request
    asked = f"{request.model} at seq_length {request.seq_length} on {request.num_gpus} x {request.hardware}"
    if not considered:
        finding = _why_no_layout(request)
        split, fix = _seq_split_note(request, ctx.cp_guess[0])
        raise InfeasibleConfig(f"no layout for {asked}: {finding.message} ({finding.rule}){split}", fix or finding.fix)
    main = max(rejected, key=lambda k: rejected[k][0])
    split, fix = _seq_split_note(request, ctx.cp_guess[0])
    if fix is None and main == "memory/exceeds-hbm":
        fix = _memory_fix(ctx)
    if fix is None and main == "divisibility/seq-cp" and request.cp:
        fix = _cp_wish_fix(ctx)
    raise InfeasibleConfig(
        f"no layout for {asked}: {considered} candidates considered, "
        f"{'all' if rejected[main][0] >= considered else 'most'} rejected by {main} "
        f"({', '.join(f'{k}: {v[0]}' for k, v in sorted(rejected.items(), key=lambda kv: -kv[1][0]))}){split}",
        fix or rejected[main][1])


def _cp_wish_fix(ctx: _Request) -> str | None:
    """The fix for a CP wish that does not split seq_length into 2·CP chunks: the nearest CPs that do, each searched
    with the request's other wishes (the search derives GBS, recompute and the rest for it, so a re-check of one
    candidate's fixed GBS would add a needless condition); None where none of the nearest four finds a layout."""
    request = ctx.request
    ok = sorted((c for c in (2**i for i in range(12)) if request.seq_length % (2 * c) == 0 and c != request.cp),
                key=lambda c: (abs(c - request.cp), c))[:4]
    found = [c for c in ok if isinstance(_search(_context(request.replace(cp=c), ctx.table, ctx.memory_constants),
                                                 enumerate_layouts(request.replace(cp=c)), 1, False), SearchResult)]
    if not found:
        return None
    return (f"use CP={' or '.join(str(c) for c in sorted(found[:2]))} (a CP whose 2·CP chunks split seq_length "
            f"{request.seq_length:,}; a layout was found with it)")


NEXT_COUNTS, SCALED_COUNTS = 4, (1.25, 1.5, 2, 3, 4, 8, 16, 32)  # GPU counts the memory fix tries (below)


def _counts_to_try(n: int, node: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(whole-node GPU counts above ``n`` to try, ascending: the next :data:`NEXT_COUNTS` nodes' worth, then ``n``
    scaled by :data:`SCALED_COUNTS` rounded up to whole nodes, and every power of two in that range that fills whole
    nodes -- the sizes clusters are allocated in, and the ones expert and context parallelism divide best (a fresh
    user's 72 H100 were told 1,152 when 128 fits); the :data:`NEXT_COUNTS` whole-node counts below ``n``, descending,
    where ``n`` fills whole nodes)."""
    first = n // node + 1
    near = [(first + i) * node for i in range(NEXT_COUNTS)]
    far = {-(-int(n * f) // node) * node for f in SCALED_COUNTS}
    top = max(far)
    far |= {1 << k for k in range(top.bit_length() + 1) if n < 1 << k <= top and (1 << k) % node == 0}
    below = tuple(c for c in ((n // node - i) * node for i in range(1, NEXT_COUNTS + 1)) if c > 0) \
        if n % node == 0 else ()
    return tuple(sorted(set(near) | {c for c in far if c > near[-1]})), below


def _fits_with(ctx: _Request, count: int) -> bool:
    """Whether the search finds a layout for the request on ``count`` GPUs, its other wishes kept."""
    wider = ctx.request.replace(num_gpus=count)
    return isinstance(_search(_context(wider, ctx.table, ctx.memory_constants), enumerate_layouts(wider), 1, False),
                      SearchResult)


def _memory_fix(ctx: _Request) -> str:
    """The fix when memory rejected most layouts: the nearest GPU counts at which a layout fits (the
    :func:`_counts_to_try`): above the request, the smallest, with the counts tried on the way that do not; below it,
    the largest of the next few whole-node counts, where one fits -- a count whose nodes fold into few layouts (100
    GB200 = 25 nodes of 4: TP x CP x PP at most 4) can fail where a smaller one fits."""
    request = ctx.request
    n, node = request.num_gpus, ctx.hw.gpus_per_node
    above, below = _counts_to_try(n, node)
    failed, up = [], None
    for count in above:
        if _fits_with(ctx, count):
            up = count
            break
        failed.append(count)
    down = next((count for count in below if _fits_with(ctx, count)), None)
    options = []
    if down:
        options.append(f"{down} GPUs (fewer, but a layout fits there: the layouts {n} GPUs fold into do not)")
    if up:
        skipped = (f"; of the counts tried, {', '.join(map(str, failed[:-1]))} and {failed[-1]} do not"
                   if len(failed) > 1 else f"; {failed[0]}, also tried, does not" if failed else "")
        options.append(f"{up} GPUs (the smallest count above {n} tried at which a layout fits{skipped})")
    if options:
        return "use " + " or ".join(options) + ", " + MEMORY_FIX_OTHERS
    return f"use more than {above[-1]} GPUs (none of the counts tried up to {above[-1]} fits), " + MEMORY_FIX_OTHERS


def _compute_bound(ctx: _Request, layout: ParallelLayout, mbs: int) -> float:
    """:func:`~lcmoe_recipes.cost.bounds.compute_lower_bound` of ``layout`` at MBS ``mbs`` for the request. It reads
    TP·CP, PP and VPP and, through the GBS, DP: layouts that differ only in EP share it (priced once per request)."""
    key = ("compute bound", layout.tp, layout.cp, layout.pp, layout.vpp, mbs)
    bound = ctx.memo.get(key)
    if bound is None:
        request = ctx.request
        gbs = batch_size(request.seq_length, layout, mbs, ctx.tokens, request.global_batch_size)
        bound = ctx.memo[key] = compute_lower_bound(ctx.model.key, ctx.hw.key, ctx.precision[0], request.seq_length,
                                                    ctx.model.mtp_num_layers, mbs, layout,
                                                    max(1, gbs // (mbs * layout.dp)), ctx.table_key)
    return bound


def _cut(steps: list[float], top: int, band: float) -> float:
    """Step time above which a candidate can be neither a tie with the fastest nor among the ``top`` fastest."""
    if len(steps) < top:
        return float("inf")
    return max(steps[0] * (1 + band), steps[top - 1])


def _why(best: Candidate, fastest: Candidate, ties: list[Candidate], limit: float, safe: float, rule: str,
         band: tuple[float, str], passed: dict[int, str] | None = None) -> str:
    """The winner's reason: its prediction, the band, and the rule that decided among the ties (with every other
    rule that passed over a faster tie)."""
    lay, step, gib = best.plan.layout, best.step, 2**30
    free = (limit - best.memory.hbm_total) / gib
    text = (f"{lay.describe()}, MBS {best.plan.micro_batch_size}: predicted {step.step_seconds:.2f} s per step "
            f"({step.tflops_per_gpu:.0f} TFLOP/s/GPU), HBM {best.memory.hbm_total / gib:.1f} of the "
            f"{limit / gib:.1f} GiB limit" + (
                f" ({limit / best.plan.hardware_spec.hbm_bytes:.0%} of HBM: the memory model predicts "
                f"{GDN_MEASURED_RATIOS[0]:.2f}-{UNCALIBRATED_FACTOR:.2f} of gated DeltaNet models' published peaks, "
                f"so the search plans them as if their memory were {1 / UNCALIBRATED_FACTOR:.2f}x the prediction; "
                "docs/accuracy.md N1-N3)" if best.plan.model_spec.gated_delta_net else ""))
    band_text = f"the step model's error band {band[1]}"
    if len(ties) == 1:
        return text + f"; the fastest fitting candidate, and no other within {band_text}"
    memory_note = f"the memory model's {MEMORY_ERROR_BAND:.1%} worst error ({safe / gib:.1f} GiB)"
    if rule == "fastest":
        dp = "" if lay.dp > 1 else ", and no tie that keeps it has DP > 1"
        return (text + f"; rule 'fastest': the fastest of {len(ties)} candidates within {band_text}, and it keeps "
                f"{memory_note} free ({free:.1f} GiB free){dp}")
    passed = passed or {}
    faster = [c for c in ties[:ties.index(best)]]
    counts = {r: sum(passed.get(id(c)) == r for c in faster) for r in TIE_RULES}
    also = [f"'{r}' passed over {n}" for r, n in counts.items() if n and r != rule]
    lead = (f"; rule '{rule}': {step.step_seconds / fastest.step.step_seconds - 1:+.1%} on the fastest "
            f"({fastest.plan.layout.describe()}, MBS {fastest.plan.micro_batch_size}, "
            f"{fastest.step.step_seconds:.2f} s), within {band_text}")
    tail = (f" (of the {len(faster)} faster ties, " + ", ".join(also) + ")") if also else ""
    if rule == "hazard":
        return text + lead + f"; it walks into fewer open hazards than the faster ties ({free:.1f} GiB free)" + tail
    if rule == "headroom":
        return (text + lead + f"; every faster tie leaves less than {memory_note} free; this is the fastest of the "
                f"{len(ties)} ties that keeps it ({free:.1f} GiB free)" + tail)
    if rule == "data parallel":
        return (text + lead + f"; the faster ties that keep {memory_note} free have DP1, and among equal-cost "
                f"layouts the planner keeps DP alive (Megatron-Bridge long-context MoE skill): this is the fastest "
                f"with DP > 1 that keeps it (DP{lay.dp}, {free:.1f} GiB free)" + tail)
    return (text + f"; rule 'most headroom': none of the {len(ties)} candidates within {band_text} keeps "
            f"{memory_note} free; this one keeps the most ({free:.1f} GiB)" + tail)
