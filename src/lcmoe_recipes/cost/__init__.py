"""Cost models read a Plan and never change it: memory (per GPU), host memory (per node), communication (per
collective), step time.

``estimate_memory(plan)``, ``estimate_host_memory(plan)``, ``estimate_step(plan)``, ``memory_findings(plan)`` and
``host_findings(plan)`` import neither torch nor megatron.
"""

from ..errors import Finding
from ..plan import Plan
from .bands import MEMORY_ERROR_BAND
from .host import HOST_MARGIN, HostMemoryBreakdown, estimate_host_memory, host_findings
from .memory import GDN_MEASURED_RATIOS, MemoryBreakdown, estimate_memory
from .step import StepEstimate, estimate_step

# Plan the whole HBM budget -- the caching allocator's peak plus what lives outside it (the flex dispatcher's buffers,
# the CUDA context, NCCL's communicator buffers: MemoryBreakdown.outside, each priced) -- to at most 95% of HBM: the
# remaining 5% is the fragmentation margin (the allocator's reserved-but-unallocated memory; cost/memory.py module doc,
# docs/accuracy.md "The HBM budget").
HBM_MARGIN = 0.95


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
                    "raise CP or PP, recompute more (selective modules, then full), or offload optimizer state "
                    "(optimizer.optimizer_cpu_offload)")] + out


__all__ = ["MemoryBreakdown", "StepEstimate", "estimate_memory", "estimate_step", "memory_findings", "HBM_MARGIN",
           "HostMemoryBreakdown", "estimate_host_memory", "host_findings", "HOST_MARGIN"]
