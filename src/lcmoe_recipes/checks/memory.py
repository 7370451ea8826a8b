"""Memory findings: the predicted HBM use of the most loaded rank against the planning limit
(:data:`lcmoe_recipes.core.plan.HBM_MARGIN` of HBM), thin headroom, uncalibrated or unpriced model features, and each
node's host memory and CPU cores against what its ranks need (:mod:`lcmoe_recipes.cost.memory`,
:mod:`lcmoe_recipes.cost.host`)."""

from __future__ import annotations

from ..core.plan import HBM_MARGIN, Plan
from ..cost.bands import MEMORY_ERROR_BAND
from ..cost.host import HOST_MARGIN, estimate_host_memory
from ..cost.memory import GDN_MEASURED_RATIOS, estimate_memory
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
                    f"{gib['total']:.1f} + {mem.outside / 2**30:.1f} outside it: dispatcher, CUDA context, NCCL) exceeds "
                    f"{HBM_MARGIN:.0%} of {hw.display}'s {hw.hbm_gib:.0f} GiB (largest part: {top} {gib[top]:.1f} GiB)",
                    _hbm_fixes(plan))] + out


def _hbm_fixes(plan: Plan) -> str:
    """The ways to free HBM that ``plan`` has not taken yet (a fix already applied is not offered again)."""
    fixes = ["raise CP or PP"]
    if plan.recompute_granularity != "full":
        fixes.append("recompute more (more selective modules, then full)" if plan.recompute_granularity == "selective"
                     else "recompute (selective modules, then full)")
    if not plan.optimizer_cpu_offload:
        fixes.append("offload optimizer state (optimizer.optimizer_cpu_offload)")
    elif plan.optimizer_offload_fraction < 1:
        fixes.append(f"offload more optimizer state (optimizer.optimizer_offload_fraction, now "
                     f"{plan.optimizer_offload_fraction:g})")
    return ", ".join(fixes[:-1]) + f", or {fixes[-1]}" if len(fixes) > 1 else fixes[0]


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
