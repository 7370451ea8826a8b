"""Memory findings: the predicted HBM use of the most loaded rank against the planning limit
(:data:`lcmoe_recipes.core.plan.HBM_MARGIN` of HBM), thin headroom, uncalibrated or unpriced model features, and each
node's host memory and CPU cores against what its ranks need (:mod:`lcmoe_recipes.cost.memory`,
:mod:`lcmoe_recipes.cost.host`)."""

from __future__ import annotations

from ..core.plan import HBM_MARGIN, Plan
from ..cost.bands import MEMORY_ERROR_BAND
from ..cost.host import HOST_MARGIN, estimate_host_memory
from ..cost.memory import GDN_MEASURED_RATIOS, OUTSIDE, estimate_memory
from ..errors import Finding


def memory_findings(plan: Plan) -> list[Finding]:
    """An error when the predicted HBM use of the most loaded rank -- the allocator's peak plus the buffers outside
    it (``MemoryBreakdown.hbm_total``) -- exceeds HBM_MARGIN of the GPU's HBM; a warning when it leaves less than the
    memory model's worst error (``MEMORY_ERROR_BAND`` of the limit) free, one for models whose memory the model is
    known to under-predict (gated DeltaNet: Qwen3-Next), and one per model
    feature the cost model does not price (``model/feature-not-modelled``, saying what it assumes instead)."""
    mem = estimate_memory(plan)
    hw = plan.hardware_spec
    limit = HBM_MARGIN * hw.hbm_bytes
    out = [Finding("warning", "model/feature-not-modelled",
                   f"{plan.model_spec.display}: {what} (config.json '{key}') is not priced by the cost model",
                   f"it assumes {assumed}; measure a short run before trusting the memory and step predictions")
           for key, what, assumed in plan.model_spec.unmodelled_features]
    if plan.model_spec.gated_delta_net:
        out.append(Finding("warning", "memory/uncalibrated",
                           f"the memory model is not calibrated for {plan.model_spec.display}'s gated DeltaNet layers: "
                           f"it predicts {GDN_MEASURED_RATIOS[0]:.2f}-{GDN_MEASURED_RATIOS[1]:.2f} of the published "
                           "Qwen3-Next peaks, whose layouts and measurement method are unpublished (docs/accuracy.md, "
                           "N1-N3)",
                           "keep more headroom than the prediction suggests, or measure a short run first"))
    if mem.hbm_total <= limit:
        free, band = limit - mem.hbm_total, MEMORY_ERROR_BAND * limit
        if free < band:
            out.append(Finding("warning", "memory/thin-headroom",
                               f"{free / 2**30:.1f} GiB of the {limit / 2**30:.1f} GiB limit left free, under the memory "
                               f"model's worst error ({MEMORY_ERROR_BAND:.0%}, {band / 2**30:.1f} GiB): it may run out of "
                               "memory", f"measure a short run's peak, or recompute / offload more until "
                               f"{band / 2**30:.1f} GiB is free"))
        return out
    gib = mem.gib()
    top = max((k for k in gib if k != "total"), key=gib.get)
    return [Finding("error", "memory/exceeds-hbm",
                    f"predicted HBM use {mem.hbm_total / 2**30:.1f} GiB on PP rank {mem.pp_rank} (allocator peak "
                    f"{gib['total']:.1f} + {mem.outside / 2**30:.1f} outside it: {_outside_names(mem)}) exceeds "
                    f"{HBM_MARGIN:.0%} of {hw.display}'s {hw.hbm_gib:.0f} GiB (largest part: {top} {gib[top]:.1f} GiB)",
                    _hbm_fixes(plan))] + out


OUTSIDE_NAMES = {"dispatcher": "dispatcher", "cuda_context": "CUDA context", "nccl": "NCCL",
                 "userbuffers": "TE userbuffers"}


def _outside_names(mem) -> str:
    """The buffers outside the allocator that ``mem`` holds, named (:data:`lcmoe_recipes.cost.memory.OUTSIDE`)."""
    return ", ".join(OUTSIDE_NAMES[n] for n in OUTSIDE if getattr(mem, n) or n != "userbuffers")


def _hbm_fixes(plan: Plan) -> str:
    """The ways to free HBM that ``plan`` has not taken yet, each re-checked before it is offered: the next CP, the
    next PP (PP x VPP kept where VPP allows), the next rung of the recompute ladder
    (:func:`lcmoe_recipes.rules.recompute.recompute_ladder`) and the whole optimizer state offloaded, each priced by the
    memory model and judged by the layout rules (:func:`lcmoe_recipes.checks.feasibility.check_plan`) at the same GPU
    count. A fix already applied is not offered; one that does not fit alone says what it leaves; when none fits alone,
    all of them together are priced too."""
    from .feasibility import check_plan

    limit = HBM_MARGIN * plan.hardware_spec.hbm_bytes
    tried = [(label, override, candidate) for label, override, candidate in _candidates(plan)]
    if not tried:
        return "use more GPUs per model replica (this plan has no further CP, PP, recompute or offload step)"
    own = {f.rule for f in check_plan(plan) if f.severity == "error"}  # the plan's own: said on their own, not here
    parts, fitting = [], 0
    for label, override, candidate in tried:
        verdict, fits = _verdict(candidate, limit, own)
        fitting += fits
        parts.append(f"{label} ({override}): {verdict}")
    text = "; ".join(parts)
    if not fitting and len(tried) > 1:
        together = plan
        for _, _, candidate in tried:
            together = together.with_changes(**{name: getattr(candidate, name) for name in _CHANGED
                                                if getattr(candidate, name) != getattr(plan, name)})
        verdict, fitting = _verdict(together, limit, own)
        text += f"; all of them together: {verdict}"
    if not fitting:
        text += (f"; nothing fits on {plan.layout.world} GPUs: use more GPUs (room for a larger CP or PP, and more "
                 "data-parallel ranks to shard the optimizer state over)")
    return "re-checked at the same GPU count: " + text


_CHANGED = ("layout", "pipeline_model_parallel_layout", "recompute_granularity", "recompute_modules", "cuda_graph_impl",
            "cuda_graph_modules",
            "recompute_method", "recompute_num_layers", "optimizer_cpu_offload", "optimizer_offload_fraction",
            "use_precision_aware_optimizer")


def _verdict(candidate: Plan, limit: float, own: set[str] = frozenset()) -> tuple[str, bool]:
    """'X GiB, fits' / 'X GiB, still over the Y GiB limit', and what the layout rules refuse of the fix itself: an
    error whose rule the plan breaks already (``own``: a position limit, say) is its own finding, not the fix's."""
    from .feasibility import check_plan

    total = estimate_memory(candidate).hbm_total
    fits = total <= limit
    text = f"{total / 2**30:.1f} GiB, " + ("fits" if fits else f"still over the {limit / 2**30:.1f} GiB limit")
    errors = [f for f in check_plan(candidate) if f.severity == "error" and f.rule not in own]
    if errors:
        text += f", but then {errors[0].message} ({errors[0].fix})"
    return text, fits and not errors


def _candidates(plan: Plan):
    """(label, the override that applies it, the Plan with it) for each HBM fix ``plan`` has not taken."""
    from ..core.layout import ParallelLayout
    from ..core.pipeline import build_pipeline_layout
    from ..errors import LcmoeError
    from ..rules.cp import cp_candidates
    from ..rules.cuda_graphs import choose_cuda_graphs
    from ..rules.recompute import recompute_ladder

    lay = plan.layout
    grow = dict(world=lay.world, tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=lay.ep, etp=lay.etp, vpp=lay.vpp)
    higher = [c for c in cp_candidates(plan.seq_length, lay.world) if c > lay.cp]
    for cp in higher:
        try:
            layout = ParallelLayout(**{**grow, "cp": cp})
            layout.dp, layout.edp  # noqa: B018 (raise when the GPUs do not fold into the new layout)
        except LcmoeError:
            continue
        yield f"CP={cp}", f"model.context_parallel_size={cp}", plan.with_changes(layout=layout)
        break
    pp = lay.pp * 2
    vpp = lay.vpp // 2 if lay.vpp and lay.vpp % 2 == 0 and lay.vpp >= 4 else (None if lay.vpp == 2 else lay.vpp)
    try:
        layout = ParallelLayout(**{**grow, "pp": pp, "vpp": vpp})
        layout.dp, layout.edp  # noqa: B018
        text = (build_pipeline_layout(plan.model_spec.num_layers, pp * (vpp or 1), plan.mtp_num_layers)
                if plan.pipeline_model_parallel_layout else None)
        override = f"model.pipeline_model_parallel_size={pp}" + (
            f" model.virtual_pipeline_model_parallel_size={vpp or 'null'}" if vpp != lay.vpp else "")
        yield (f"PP={pp}" + (f" x VPP={vpp}" if vpp else ""), override,
               plan.with_changes(layout=layout, pipeline_model_parallel_layout=text))
    except LcmoeError:
        pass
    ladder = recompute_ladder(plan.model_spec)
    now = set(plan.recompute_modules) if plan.recompute_granularity == "selective" else set()
    more = [(g, m) for g, m in ladder if plan.recompute_granularity != "full" and (
        g == "full" or (g == "selective" and set(m) > now))]  # the next rung that recomputes more than now
    if more:
        granularity, modules = more[0]
        changes = dict(recompute_granularity=granularity, recompute_modules=modules)
        if granularity == "full":
            changes.update(recompute_method="uniform", recompute_num_layers=1)
            label, override = "full recompute", ("model.recompute_granularity=full model.recompute_method=uniform "
                                                 "model.recompute_num_layers=1")
        else:
            label = f"selective recompute of {', '.join(modules)}"
            override = (("" if plan.recompute_granularity == "selective" else "model.recompute_granularity=selective ")
                        + f"model.recompute_modules=[{','.join(modules)}]")  # a value already set is no override
        candidate = plan.with_changes(**changes)
        if plan.cuda_graph_impl != "none":  # derived again with the recompute, as an override would have it
            (impl, graphs), _ = choose_cuda_graphs(plan.hardware_spec, plan.variable_length, granularity, modules,
                                                   plan.moe_flex_dispatcher_backend, plan.model_spec.is_moe)
            if (impl, tuple(graphs)) != (plan.cuda_graph_impl, tuple(plan.cuda_graph_modules)):
                candidate = candidate.with_changes(cuda_graph_impl=impl, cuda_graph_modules=tuple(graphs))
                label += " (CUDA graphs " + (f"on {', '.join(graphs)} only" if impl != "none" else "off") + ", derived)"
        yield label, override, candidate
    if not plan.optimizer_cpu_offload or plan.optimizer_offload_fraction < 1:
        label = ("offload the whole optimizer state" if not plan.optimizer_cpu_offload else
                 f"offload the whole optimizer state (now {plan.optimizer_offload_fraction:g})")
        yield label, ("optimizer.optimizer_cpu_offload=true optimizer.optimizer_offload_fraction=1.0 "
                      "optimizer.use_precision_aware_optimizer=true"), plan.with_changes(
            optimizer_cpu_offload=True, optimizer_offload_fraction=1.0, use_precision_aware_optimizer=True)


def host_findings(plan: Plan) -> list[Finding]:
    """An error when the most loaded node's predicted host memory exceeds :data:`HOST_MARGIN` of its RAM, naming the
    largest terms and their fixes; a warning when a node runs more busy processes (ranks and their training
    data-loader workers) than it has CPU cores. The validation and test loaders' workers are counted for memory (they
    stay alive) but not for CPU: they wait while training runs."""
    hw = plan.hardware_spec
    host = estimate_host_memory(plan)
    out = []
    processes = host.ranks * (1 + plan.num_workers)
    if processes > hw.cpu_cores:
        fitting = max(0, hw.cpu_cores // host.ranks - 1)
        out.append(Finding("warning", "host/cpu-oversubscribed",
                           f"{host.ranks} ranks x (1 + {plan.num_workers} training data-loader workers) = "
                           f"{processes} busy processes per node on {hw.display}'s {hw.cpu_cores} CPU cores",
                           f"lower dataset.num_workers to {fitting}"))
    limit = HOST_MARGIN * hw.host_memory_bytes
    if host.total <= limit:
        return out
    gib = host.gib()
    parts = sorted((k for k in gib if k != "total"), key=gib.get, reverse=True)
    fixes = {
        "data_loader": ("set dataset.create_attention_mask=false (the attention kernel builds the causal mask; "
                        "megatron-bridge's gpt_step discards the dataset's), " if plan.create_attention_mask else "")
                       + "use fewer data-loader workers (dataset.num_workers)",
        "optimizer": "offload less optimizer state (a smaller optimizer.optimizer_offload_fraction) or use more "
                     "nodes (a larger DP/EDP shards it thinner)",
        "processes": "use a system with more host memory per GPU",
        "checkpoint": "save synchronously (checkpoint.async_save=false: training waits for each write) or use more "
                      "nodes (each rank's share of a save is smaller)",
    }
    fixes["pinned"] = fixes["optimizer"]
    fix = "; ".join(dict.fromkeys(fixes[p] for p in parts if gib[p] >= 0.05 * gib["total"]))
    return [Finding("error", "host-memory/exceeds-ram",
                    f"predicted host memory {gib['total']:.0f} GiB on node {host.node} ({host.ranks} ranks) exceeds "
                    f"{HOST_MARGIN:.0%} of {hw.display}'s {hw.host_memory_gib:.0f} GiB per node ("
                    + ", ".join(f"{p.replace('_', ' ')} {gib[p]:.0f}" for p in parts) + " GiB)", fix)] + out
