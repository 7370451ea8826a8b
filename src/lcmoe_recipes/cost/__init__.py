"""Cost models read a Plan and never change it: memory (per GPU), host memory (per node), communication (per
collective), step time -- predictions only (the findings they lead to are :mod:`lcmoe_recipes.checks.memory`).

``estimate_memory(plan)``, ``estimate_host_memory(plan)`` and ``estimate_step(plan)`` import neither torch nor
megatron.
"""

from .host import HOST_MARGIN, HostMemoryBreakdown, estimate_host_memory
from .memory import MemoryBreakdown, estimate_memory
from .step import StepEstimate, estimate_step

__all__ = ["MemoryBreakdown", "StepEstimate", "estimate_memory", "estimate_step", "HostMemoryBreakdown",
           "estimate_host_memory", "HOST_MARGIN"]
