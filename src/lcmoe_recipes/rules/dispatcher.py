"""MoE dispatcher: DeepEP on H100/H200/B200, HybridEP on NVL72 when the EP group stays in one NVLink block,
alltoall otherwise. A requested backend the hardware cannot run is refused by the checks, never downgraded."""

from __future__ import annotations

from ..catalog import Hardware
from ..core.layout import ParallelLayout
from ..core.plan import Reason
from ..core.ranks import max_span

SOURCE = "Megatron-Bridge skill nemo-mbridge-perf-moe-long-context; megatron-bridge 0.6.2 flex_dispatcher_backend.py (DeepEP: SM 8/9, B200/B300)"


def choose_dispatcher(hw: Hardware, layout: ParallelLayout, wish: str | None,
                      is_moe: bool = True) -> tuple[tuple[str, str | None], Reason]:
    """((moe_token_dispatcher_type, moe_flex_dispatcher_backend), reason). A dense model (no experts) has no token
    dispatcher: megatron-core's default, alltoall, stays set and unused."""
    if not is_moe:
        return ("alltoall", None), Reason("dense model: no experts, so no token dispatcher (EP=1)", SOURCE)
    if layout.ep == 1 and not wish:
        return ("alltoall", None), Reason("alltoall: EP=1, every expert is local and no token leaves the GPU", SOURCE)
    if wish == "alltoall":
        return ("alltoall", None), Reason("alltoall, as requested", "your request")
    if wish:
        return ("flex", wish), Reason(f"flex + {wish}, as requested", "your request")
    if hw.nvlink_domain > 8:
        inside = max_span(layout, "expert", "tp-ep", hw.job_block) == 1
        if inside:
            return ("flex", "hybridep"), Reason(
                f"HybridEP: NVL72, and every EP group sits inside one {hw.job_block}-GPU NVLink block", SOURCE)
        return ("alltoall", None), Reason(
            f"alltoall: an EP group of {layout.ep * layout.etp} ranks leaves the {hw.job_block}-GPU NVLink block, "
            "where HybridEP's intra-domain path does not apply", SOURCE)
    if hw.supports_deepep:
        return ("flex", "deepep"), Reason(f"DeepEP on {hw.display} (intra-node NVLink + inter-node RDMA kernels)", SOURCE)
    return ("alltoall", None), Reason(f"alltoall: neither DeepEP nor HybridEP runs on {hw.display}", SOURCE)
