"""Host time of a step: what optimizer CPU offload adds -- the CPU Adam update of the offloaded elements and their
gradient / parameter copies between GPU and host -- from the elements each node holds and its host memory and link
bandwidths (``Hardware.host_memory_gbps``, ``Hardware.host_link_gbps``; sources in :mod:`lcmoe_recipes.catalog.
hardware`). :func:`offload_step_seconds`; the step model adds it (:mod:`lcmoe_recipes.cost.step`), the host memory
model reuses the node grouping (:mod:`lcmoe_recipes.cost.host`). Imports neither torch nor megatron.

Per offloaded element, per step (megatron-core 0.19.2
``optimizer/cpu_offloading/hybrid_optimizer.py``, ``torch.optim.AdamW(fused=True)``: one pass of torch's fused
CPU kernel over fp32 tensors):

* CPU Adam: reads the fp32 master weight, gradient and both moments (4 x 4 bytes) and writes the weight and both
  moments (3 x 4): :data:`CPU_ADAM_BYTES` = 28 bytes of host memory traffic;
* the gradient's copy into its fp32 host buffer (``_set_sub_optimizer_grads``, D2H) writes 4 bytes and the
  updated weight's copy back (``param_copy_back_gpu_hook``, H2D) reads 4 -- :data:`CPU_COPY_BYTES` each over the
  GPU's host link and through host memory.

Every rank of a node updates its own elements at once, so a node's host memory carries
``elements x (28 + 4 + 4)`` bytes per step, while each GPU's link carries its own 4 bytes per element each way.
Our configs set ``overlap_cpu_optimizer_d2h_h2d`` whenever they offload (:mod:`lcmoe_recipes.emit.settings`):
megatron then builds one CPU optimizer per parameter and copies on side streams, so the copies pipeline behind
the updates and the step pays the longest of the three (host memory, D2H link, H2D link); the next step waits
for the slowest node. Assumed: the CPU reaches the datasheet's peak memory bandwidth (the kernel is
bandwidth-bound: a handful of FLOPs per 28 bytes); torchrun and our launcher start each rank with
``OMP_NUM_THREADS=1``, and one thread per rank may not reach it -- a lower bound on the time, stated.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..core.plan import Plan
from .memory import optimizer_shard_params

# One fused torch AdamW step over fp32 tensors: read param, grad, exp_avg, exp_avg_sq; write param, exp_avg,
# exp_avg_sq (torch 2.14 aten/src/ATen/native/cpu/FusedAdamKernel.cpp, called by torch.optim.AdamW(fused=True)).
CPU_ADAM_BYTES = 4 * 4 + 3 * 4
CPU_COPY_BYTES = 4     # per element and direction: the fp32 gradient down (D2H), the fp32 weight back up (H2D)


def node_stages(world: int, pp: int, per_node: int) -> dict[int, list[int]]:
    """One node of each distinct kind: node index -> the pipeline stage of each of its ranks (megatron-core's rank
    order puts PP outermost: global rank r is on stage r * pp // world; nodes are ``per_node`` consecutive ranks).
    Nodes holding the same stages are the same, so one of them stands for all."""
    stage = world // pp
    if stage % per_node == 0:  # every node inside one pipeline stage: one node per stage tells all
        return {p * stage // per_node: [p] * per_node for p in range(pp)}
    nodes: dict[tuple[int, ...], int] = {}
    for n in range((world + per_node - 1) // per_node):
        ranks = range(n * per_node, min(world, (n + 1) * per_node))
        nodes.setdefault(tuple(r * pp // world for r in ranks), n)
    return {n: list(stages) for stages, n in nodes.items()}


@dataclass(frozen=True)
class OffloadTime:
    """What optimizer CPU offload adds to one step on the slowest node (module doc), seconds.

    Attributes:
        seconds: the step's cost: the longest of ``host_memory``, ``d2h`` and ``h2d`` (they overlap).
        host_memory: the node's CPU Adam and copy traffic over its host memory bandwidth.
        d2h: the busiest GPU's gradient copy over its host link.
        h2d: the busiest GPU's weight copy back.
        node_elements: offloaded optimizer elements the node holds (its ranks together).
        rank_elements: the most any of its ranks holds.
        node: index of that node.
    """

    seconds: float
    host_memory: float
    d2h: float
    h2d: float
    node_elements: float
    rank_elements: float
    node: int


def offload_elements(plan: Plan, pp_rank: int) -> float:
    """Optimizer elements one rank on pipeline rank ``pp_rank`` updates on the CPU: ``optimizer_offload_fraction``
    of its distributed-optimizer shard (megatron-core 0.19.2 ``HybridDeviceOptimizer._get_sub_optimizer_param_groups``
    moves parameters until that fraction of the shard's elements is reached); 0 without offload."""
    if not plan.optimizer_cpu_offload or plan.optimizer_offload_fraction <= 0:
        return 0.0
    return plan.optimizer_offload_fraction * optimizer_shard_params(plan, pp_rank)


def offload_step_seconds(plan: Plan) -> OffloadTime:
    """The host time optimizer CPU offload adds to a step of ``plan`` (module doc); all zero without offload.

    Raises:
        ValueError: the plan's hardware has no host memory or link bandwidth in the catalogue.
    """
    if not plan.optimizer_cpu_offload or plan.optimizer_offload_fraction <= 0:
        return OffloadTime(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    return _offload_step_seconds(plan)


@lru_cache(maxsize=4096)
def _offload_step_seconds(plan: Plan) -> OffloadTime:
    hw, lay = plan.hardware_spec, plan.layout
    if hw.host_memory_gbps <= 0 or hw.host_link_gbps <= 0:
        raise ValueError(f"hardware {hw.key} has no host memory / link bandwidth: add host_memory_gbps and "
                         "host_link_gbps to its catalog entry (lcmoe_recipes.catalog.hardware) to price CPU offload")
    per_stage = [offload_elements(plan, p) for p in range(lay.pp)]
    worst = None
    for n, stages in node_stages(lay.world, lay.pp, hw.gpus_per_node).items():
        node = sum(per_stage[p] for p in stages)
        rank = max(per_stage[p] for p in stages)
        memory = node * (CPU_ADAM_BYTES + 2 * CPU_COPY_BYTES) / (hw.host_memory_gbps * 1e9)
        link = rank * CPU_COPY_BYTES / (hw.host_link_gbps * 1e9)
        out = OffloadTime(max(memory, link), memory, link, link, node, rank, n)
        if worst is None or out.seconds > worst.seconds:
            worst = out
    return worst
