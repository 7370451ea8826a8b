"""Where a plan's predicted numbers come from, as lines ``--explain`` prints: the whole HBM budget of its most loaded
rank (each part on its own line, the fragmentation margin and what is left), and the step model's constants it reads
-- each fitted on published rows of its own GPU and kind, or borrowed (saying from where and why) -- with the
attention kernel's source and the plan's error band."""

from __future__ import annotations

from ..catalog.kernels import kernel_source
from ..core.plan import Plan
from .bands import step_band_for
from .memory import MemoryConstants, estimate_memory
from .step import step_constants


def budget_lines(plan: Plan, margin: float, constants: MemoryConstants | None = None) -> list[str]:
    """The HBM budget of the plan's most loaded PP rank, one line per part, GiB (``margin``: the fragmentation
    margin, a fraction of HBM)."""
    mem = estimate_memory(plan, constants) if constants else estimate_memory(plan)
    hw = plan.hardware_spec
    lines = [f"HBM budget per GPU, PP rank {mem.pp_rank} (GiB of {hw.hbm_gib:.1f}):"]
    lines += [f"  {name:<22} {gib:8.2f}" for name, gib in mem.budget(hw.hbm_bytes, margin)]
    return lines


def constant_lines(plan: Plan, table: dict[tuple[str, str], float] | None = None) -> list[str]:
    """The step model's constants the plan reads, their origin, the attention kernel's source and the error band."""
    band, why = step_band_for(plan)
    lines = ["step model constants:"]
    for c in step_constants(plan, table):
        if c.key[1] == "gdn_step" and not plan.model_spec.gated_delta_net:
            continue
        origin = "fitted on published rows of this GPU" if c.anchored else f"borrowed -- {c.note}"
        lines.append(f"  {c.key[0]} {c.key[1]:<14} {c.value:<10g} {origin}")
    lines.append(f"  attention kernel: {kernel_source(plan.hardware_spec.key)}")
    lines.append(f"  error band {why}")
    return lines
