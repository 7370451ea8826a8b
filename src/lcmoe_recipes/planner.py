"""The mesh planner: every legal layout for a TrainingRequest, the rules for each knob, the checks and the cost model;
the fastest layout that fits wins.

Search (no torch / megatron import):

1. layouts: TP in {1, 2, 4, 8} (heads and query groups split, TP inside one node or NVLink block), CP from
   :func:`rules.cp.cp_candidates` (powers of two around seq_length/4096), PP in {1, 2, 4, 8, 16}, VPP the finest
   interleave that keeps two layers per chunk (the bubble is (PP-1)/VPP microbatches), EP a power of two dividing the
   experts with ETP = 1; Megatron's folding rules (world % TP·PP·CP, world % ETP·EP·PP) and any fixed wish;
2. per layout: dispatcher, precision, batch (rules), then the least recompute and the smallest optimizer offload
   that fit in HBM_MARGIN of HBM (rules.recompute ladder, rules.offload fractions), then CUDA graphs (rules);
3. the checks (:func:`lcmoe_recipes.checks.check_plan`) drop what Megatron would reject;
4. rank by predicted step time; among layouts within KEEP_DP_SLACK of the fastest, prefer the largest DP
   (the skill's "keep DP alive").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .catalog import get_hardware, get_model
from .checks import check_plan
from .cost import HBM_MARGIN, estimate_memory, estimate_step
from .cost.memory import MemoryBreakdown
from .cost.shapes import shapes
from .cost.step import StepEstimate
from .errors import InfeasibleConfig
from .layout import ParallelLayout
from .plan import Plan, Reason, build_pipeline_layout
from .request import TrainingRequest
from .rules.batch import choose_batch
from .rules.cp import cp_candidates, cp_first_guess
from .rules.cuda_graphs import choose_cuda_graphs
from .rules.dispatcher import choose_dispatcher
from .rules.offload import FRACTIONS, offload_reason
from .rules.precision import choose_precision
from .rules.recompute import recompute_ladder, recompute_reason

KEEP_DP_SLACK = 0.05   # prefer more DP among layouts within 5% of the fastest
VPP_CHOICES = (16, 12, 8, 6, 4, 3, 2)


@dataclass(frozen=True)
class Candidate:
    """One fitting layout with its knobs, predicted memory and step."""

    plan: Plan
    memory: MemoryBreakdown
    step: StepEstimate


@dataclass(frozen=True)
class PlanResult:
    """The planner's answer: the winner, the ranked fitting candidates, and what was rejected and why."""

    request: TrainingRequest
    best: Candidate
    ranked: list[Candidate]
    considered: int
    rejected: dict[str, int] = field(default_factory=dict)
    why: str = ""


def _vpp(num_layers: int, pp: int) -> int | None:
    if pp == 1:
        return None
    for v in VPP_CHOICES:
        if num_layers >= 2 * pp * v:
            return v
    return None


def enumerate_layouts(request: TrainingRequest) -> list[ParallelLayout]:
    """Every layout Megatron can fold for the request (before memory and the finer checks)."""
    model, hw = get_model(request.model), get_hardware(request.hardware)
    world, seq = request.num_gpus, request.seq_length
    heads, groups = model.num_attention_heads, model.num_query_groups
    tps = [t for t in (1, 2, 4, 8) if heads % t == 0 and (groups % t == 0 or t % groups == 0)
           and t <= hw.gpus_per_node * (1 if hw.nvlink_domain <= 8 else 2)]
    cps = cp_candidates(seq, world)
    pps = [p for p in (1, 2, 4, 8, 16) if 2 * p <= model.num_layers]
    eps = [e for e in (1, 2, 4, 8, 16, 32, 64, 128, 256) if model.num_moe_experts % e == 0]
    out = []
    for tp in [request.tp] if request.tp else tps:
        for cp in [request.cp] if request.cp else cps:
            if model.gated_delta_net and any(h % (tp * cp) for h in model.linear_num_heads):
                continue
            for pp in [request.pp] if request.pp else pps:
                if world % (tp * pp * cp):
                    continue
                for ep in [request.ep] if request.ep else eps:
                    if world % (ep * pp) or ep > world // pp:
                        continue
                    out.append(ParallelLayout(world=world, tp=tp, pp=pp, cp=cp, ep=ep, etp=1,
                                              vpp=_vpp(model.num_layers, pp)))
    return out


def _plan_for(request: TrainingRequest, layout: ParallelLayout, reject: dict[str, int]) -> Candidate | None:
    model, hw = get_model(request.model), get_hardware(request.hardware)
    try:
        pipeline = build_pipeline_layout(model.num_layers, layout.num_pipeline_stages, model.mtp_num_layers)
    except InfeasibleConfig:
        reject["pipeline/too-many-stages"] = reject.get("pipeline/too-many-stages", 0) + 1
        return None
    (dispatcher, backend), why_dispatch = choose_dispatcher(hw, layout, request.dispatcher)
    precision, why_precision = choose_precision(hw, request.precision)
    gbs, why_batch = choose_batch(request.seq_length, layout, request.micro_batch_size,
                                  shapes(model).total_params, request.global_batch_size)
    guess, why_cp = cp_first_guess(request.seq_length)
    base = Plan(
        name="planned", model=model.key, hardware=hw.key, seq_length=request.seq_length, layout=layout,
        pipeline_model_parallel_layout=pipeline, micro_batch_size=request.micro_batch_size, global_batch_size=gbs,
        precision=precision, moe_token_dispatcher_type=dispatcher, moe_flex_dispatcher_backend=backend,
        sequence_parallel=layout.tp > 1, mtp_num_layers=model.mtp_num_layers, variable_length=request.variable_length,
        use_precision_aware_optimizer=True)
    errors = [f for f in check_plan(base) if f.severity == "error"]
    if errors:
        reject[errors[0].rule] = reject.get(errors[0].rule, 0) + 1
        return None
    limit = HBM_MARGIN * hw.hbm_bytes
    ladder = recompute_ladder(model)
    fractions = FRACTIONS if request.allow_cpu_offload else (0.0,)
    worst = _with_knobs(base, ladder[-1], fractions[-1], hw, request)
    if estimate_memory(worst).total > limit:
        reject["memory/exceeds-hbm"] = reject.get("memory/exceeds-hbm", 0) + 1
        return None
    for level, fraction in _fitting_knobs(base, ladder, fractions, limit, hw, request):
        granularity, modules = ladder[level]
        plan = _with_knobs(base, ladder[level], fraction, hw, request)
        memory = estimate_memory(plan)
        if memory.total <= limit:
            if any(f.severity == "error" for f in check_plan(plan)):
                continue
            reasons = {
                "layout": Reason(f"the fastest fitting layout the model predicts (first CP guess {guess})", why_cp.source),
                "cp": why_cp, "dispatcher": why_dispatch, "precision": why_precision, "global_batch_size": why_batch,
                "recompute": recompute_reason(level, len(ladder), granularity, modules),
                "optimizer_cpu_offload": offload_reason(fraction),
                "cuda_graphs": choose_cuda_graphs(hw, request.variable_length, granularity, modules, backend)[1],
            }
            plan = plan.with_changes(reasons=reasons)
            return Candidate(plan, memory, estimate_step(plan))
    reject["memory/exceeds-hbm"] = reject.get("memory/exceeds-hbm", 0) + 1
    return None


def _fitting_knobs(base: Plan, ladder, fractions, limit: float, hw, request):
    """(recompute level, offload fraction) pairs to try, cheapest first: every selective level without offload;
    then, level by level, the smallest offload fraction that fits (the optimizer state on the GPU falls linearly
    with the fraction, so one estimate at fraction 1 gives it); then full recompute the same way."""
    selective = [i for i, (g, _) in enumerate(ladder) if g != "full"]
    full = [i for i, (g, _) in enumerate(ladder) if g == "full"]
    for level in selective:
        yield level, 0.0
    if len(fractions) == 1:
        yield from ((level, 0.0) for level in full)
        return
    for level in selective + full:
        at_one = estimate_memory(_with_knobs(base, ladder[level], 1.0, hw, request))
        if at_one.total > limit:
            continue
        state = at_one.detail["optimizer_shard_params"] * (4 + 2 * (4 if base.moment_dtype == "fp32" else 2))
        need = next((f for f in fractions[1:] if at_one.total + state * (1 - f) <= limit), 1.0)
        yield level, need
        if level in full:
            return
    yield from ((level, 0.0) for level in full)


def _with_knobs(base: Plan, recompute: tuple, fraction: float, hw, request: TrainingRequest) -> Plan:
    granularity, modules = recompute
    (impl, graphs), _ = choose_cuda_graphs(hw, request.variable_length, granularity, modules,
                                           base.moe_flex_dispatcher_backend)
    return base.with_changes(
        recompute_granularity=granularity, recompute_modules=tuple(modules),
        recompute_method="uniform" if granularity == "full" else None,
        recompute_num_layers=1 if granularity == "full" else None,
        optimizer_cpu_offload=fraction > 0, optimizer_offload_fraction=fraction,
        cuda_graph_impl=impl, cuda_graph_modules=graphs)


def plan(request: TrainingRequest, top: int = 5) -> PlanResult:
    """Search the request's layouts; return the winner and the ``top`` fastest fitting ones.

    Raises:
        InfeasibleConfig: no layout is legal and fits, naming the constraint that rejected most of them.
    """
    layouts = enumerate_layouts(request)
    rejected: dict[str, int] = {}
    fits = [c for c in (_plan_for(request, lay, rejected) for lay in layouts) if c is not None]
    if not fits:
        main = max(rejected, key=rejected.get) if rejected else "rank-folding"
        raise InfeasibleConfig(
            f"no layout for {request.model} at seq_length {request.seq_length} on {request.num_gpus} x "
            f"{request.hardware}: {len(layouts)} layouts considered, most rejected by {main} "
            f"({', '.join(f'{k}: {v}' for k, v in sorted(rejected.items(), key=lambda kv: -kv[1]))})",
            "use more GPUs, a shorter seq_length, or a GPU with more HBM" if main == "memory/exceeds-hbm"
            else "loosen the fixed TP/PP/CP/EP wishes, or change the GPU count")
    fits.sort(key=lambda c: c.step.step_seconds)
    fastest = fits[0].step.step_seconds
    near = [c for c in fits if c.step.step_seconds <= fastest * (1 + KEEP_DP_SLACK)]
    best = max(near, key=lambda c: (c.plan.layout.dp, -c.step.step_seconds))
    dp_note = (f"; DP={best.plan.layout.dp} kept alive over a {fits[0].plan.layout.dp}-DP layout within "
               f"{KEEP_DP_SLACK:.0%}" if best is not fits[0] else "")
    squeeze = "; CP, EP, TP and PP squeeze DP to 1" if best.plan.layout.dp == 1 else ""
    why = (f"{best.plan.layout.describe()}: fastest predicted step ({best.step.step_seconds:.2f} s, "
           f"{best.step.tflops_per_gpu:.0f} TFLOP/s/GPU) among {len(fits)} fitting layouts of {len(layouts)}"
           f"{dp_note}{squeeze}")
    reasons = {**best.plan.reasons, "layout": Reason(why, "lcmoe_recipes planner: checks + cost model")}
    best = Candidate(best.plan.with_changes(reasons=reasons), best.memory, best.step)
    ranked = [best] + [c for c in fits if c.plan.layout != best.plan.layout][: max(0, top - 1)]
    return PlanResult(request, best, ranked, len(layouts), rejected, why)
