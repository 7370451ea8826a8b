"""Every finding on a Plan in one list: the feasibility checks, then -- where the layout is legal -- the GPU and host
memory findings, errors first (what ``check``, ``--explain`` and the config validation show)."""

from __future__ import annotations

from ..core.plan import Plan
from ..errors import Finding
from .feasibility import check_plan, layout_is_legal
from .memory import host_findings, memory_findings


def all_findings(plan: Plan) -> list[Finding]:
    """The checks' findings plus, where the layout is legal, the memory models' (GPU memory per rank, host memory per
    node), errors first."""
    found = check_plan(plan)
    if layout_is_legal(found):
        found = memory_findings(plan) + host_findings(plan) + found
    return sorted(found, key=lambda f: f.severity != "error")
