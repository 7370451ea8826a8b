"""Which communication megatron-core overlaps with compute for a Plan, and how much of it stays exposed.

Every overlap is priced the same way: exposed = max(0, communication - the compute it hides behind), per the unit
in which megatron-core schedules it. Which settings turn each one on or forbid it is read from megatron-bridge 0.6.2
``training/comm_overlap.py`` (``CommOverlapConfig._get_model_comm_overlap_cfgs`` / ``_get_optimizer_overlap_cfgs``
and the asserts of ``setup``) and megatron-core 0.19.2 (``transformer/transformer_config.py``,
``distributed/distributed_data_parallel.py``):

* **EP all-to-all** (``overlap_moe_expert_parallel_comm``): megatron-core's combined 1F1B schedule
  (``pipeline_parallel/combined_1f1b.py``, ``models/common/model_chunk_schedule_plan.py``) runs the forward of one
  microbatch and the backward of another layer by layer on two streams, each communication beside one compute
  block of the other stream: the forward dispatch beside the backward's routed-expert GEMMs, the forward combine
  beside the backward's attention side (attention kernel, projections, shared experts, router), the backward's
  combine all-to-all beside the forward's attention side, the backward's dispatch all-to-all beside the forward's
  routed-expert GEMMs. Each is a quarter of the layer's EP traffic and exposed = max(0, it - its block). Needs EP > 1, the alltoall or flex dispatcher, BF16,
  no full recompute (nor method / layer count), no 'moe' in the recompute modules, VPP when PP > 1, at most one
  MTP layer, no Transformer Engine CUDA graphs over the moe / mlp scope (the planner runs it wherever these hold
  and it pays: :func:`lcmoe_recipes.rules.extension.ep_overlap_blockers`, :mod:`lcmoe_recipes.planner.search`). With
  ``delay_wgrad_compute`` (megatron-bridge sets it with the overlap; it needs the overlap, and graphed attention
  forbids it when the model has attention or linear biases) the experts' weight-gradient GEMMs are held back to run
  beside the backward's dispatch all-to-all; without it they run with the backward's expert dgrad. The first
  microbatch's forward and the last one's backward have no partner: one microbatch's EP traffic stays exposed per
  step. Without the overlap, all of it is exposed.
* **TP** (``tp_comm_overlap``): needs TP >= 2, sequence parallelism and Transformer Engine (megatron-bridge turns
  it off otherwise, ``_get_model_comm_overlap_cfgs``). Transformer Engine 2.x's userbuffers
  (``pytorch/module/base.py`` ``initialize_ub``) run each sequence-parallel all-gather and reduce-scatter of the
  TP-split linears (qkv, proj, fc1, fc2: attention, the shared experts, dense MLPs) beside a GEMM of the same layer:
  the forward's all-gathers inside the qkv / fc1 GEMMs by ring exchange on the copy engines, the forward's
  reduce-scatters pipelined with the proj / fc2 GEMMs, the backward's as bulk transfers beside the dgrad / wgrad
  GEMMs. The pipelined and bulk ones keep ``TP_BULK_SMS`` SMs for the transfer and run their GEMM on the rest
  (TE's defaults: ``num_sm`` 16, ``set_sm_margin`` on for every method but ring exchange), about half of the
  layer's TP-split GEMM time. Priced per layer, with ``d`` the layer's GEMMs outside the routed experts and ``c``
  its TP traffic: exposed = max(c - d, d / 2 x TP_BULK_SMS / (SMs - TP_BULK_SMS)) (:func:`tp_overlap_exposed`): the
  traffic the GEMMs cannot cover, or what the SMs they give up cost them. Off, every TP collective is exposed.
  megatron-bridge's Qwen3 MoE recipes ask for it; the planner turns it on wherever megatron-bridge keeps it and it
  pays (its buffers cost memory: :func:`lcmoe_recipes.cost.memory.userbuffer_bytes`).
* **DP / EDP** (``overlap_grad_reduce``, ``overlap_param_gather``): megatron-bridge turns both on when the
  data-parallel size is above 1 and off when it is 1, whatever the expert data-parallel or CP size is (then the
  gradient reduce-scatter over DP x CP or EDP and the parameter all-gather run after the backward, exposed). On:
  the reduce-scatter of each gradient bucket runs behind the rest of the last microbatch's backward, the
  all-gather of each parameter bucket behind the next step's first forward; the last bucket to reduce (and the
  first to gather) has nothing left to hide behind. Buckets hold max(40,000,000, 1,000,000 x DP) parameters
  (``DistributedDataParallel.__init__``).
* **CP ring** (``cp_comm_type`` p2p, and the ring of a2a+p2p): each ring step's K/V exchange runs behind the
  attention of the chunk before it: exposed = max(0, ring - attention) per layer. The all-to-all (a2a, the inner
  one of a2a+p2p, gated DeltaNet's) and all-gather exchanges are exposed: their output is needed before the
  attention starts.
* **PP send / receive**: with VPP, megatron-bridge sets ``overlap_p2p_comm`` and the transfers run behind the
  other chunks' compute (hidden); without VPP it sets ``batch_p2p_comm``, and they are exposed.

**The SMs an overlapped all-to-all holds.** The flex dispatcher's kernels (DeepEP, HybridEP) run on a fixed number
of SMs while the compute beside them runs on the rest (megatron-core 0.19.2 ``TransformerConfig``:
``moe_flex_dispatcher_num_sms``, None = each backend's default, DeepEP's historical 20, which HybridEP also uses):
a compute block of ``b`` seconds beside a transfer of ``c`` seconds runs at (SMs - k) / SMs while the transfer lasts,
so the pair takes max(c, b + c k / SMs) and the exposed part is max(c - b, c k / SMs) (:func:`contended`). The
alltoall dispatcher's NCCL kernels take channels NCCL sizes from the topology, not a megatron setting: not priced.

What this leaves out, stated: the CUDA-graph launch savings, and the SM counts a recipe sets above the default
(megatron-bridge v0.6.0's MXFP8 perf recipes give HybridEP 32); the fitted GEMM efficiencies absorb them on the
measured rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.plan import Plan

COMM_OVERLAP_SOURCE = ("megatron-bridge 0.6.2 training/comm_overlap.py (CommOverlapConfig); megatron-core 0.19.2 "
                       "transformer/transformer_config.py, distributed/distributed_data_parallel.py")


@dataclass(frozen=True)
class Overlap:
    """One kind of communication of a step, whether megatron-core overlaps it, and what stays exposed.

    Attributes:
        name: "EP all-to-all", "TP", "DP/EDP reduce-scatter", "DP/EDP all-gather", "CP ring", "PP send/receive".
        on: megatron-core overlaps it with compute in this plan.
        why: the setting and condition that decided (megatron's field names).
        communication: its seconds per step on the slowest rank.
        exposed: the seconds of it the step waits for.
    """

    name: str
    on: bool
    why: str
    communication: float
    exposed: float

    def describe(self) -> str:
        state = "on" if self.on else "off"
        return (f"{self.name}: {state} -- {self.communication:.3f} s, {self.exposed:.3f} s exposed "
                f"({self.why})")


def ep_overlap(plan: Plan) -> tuple[bool, bool, str]:
    """(EP all-to-all overlapped, expert weight gradients delayed, why) for ``plan``: the overlap as the plan has it
    (``moe_ep_overlap``, which the planner keeps only where megatron-core allows it); ``delay_wgrad_compute`` with
    it, as megatron-bridge's comm_overlap sets them together, except with graphed attention on a model with
    biases (megatron-bridge: no attention bias in graphs with delayed weight gradients)."""
    if not plan.moe_ep_overlap or plan.layout.ep == 1:
        why = "EP=1" if plan.layout.ep == 1 else "overlap_moe_expert_parallel_comm off"
        return False, False, why
    spec = plan.model_spec
    graphed_attention = plan.cuda_graph_impl != "none" and "attn" in plan.cuda_graph_modules
    if graphed_attention and (spec.linear_bias or spec.attention_bias):
        return True, False, ("overlap_moe_expert_parallel_comm on; delay_wgrad_compute off (graphed attention "
                             "with biases)")
    return True, True, "overlap_moe_expert_parallel_comm and delay_wgrad_compute on"


TP_BULK_SMS = 16  # Transformer Engine 2.x initialize_ub: num_sm of the bulk / pipeline methods (ring exchange: 1)


def tp_overlap_allowed(tp: int, sequence_parallel: bool) -> tuple[bool, str]:
    """(megatron-bridge keeps ``tp_comm_overlap`` on for this layout, why not): it needs TP >= 2 and sequence
    parallelism (megatron-bridge 0.6.2 ``CommOverlapConfig._get_model_comm_overlap_cfgs``; Transformer Engine, which
    every TE config has, is its third condition)."""
    if tp < 2:
        return False, "megatron-bridge turns tp_comm_overlap off at TP < 2"
    if not sequence_parallel:
        return False, "megatron-bridge turns tp_comm_overlap off without sequence parallelism"
    return True, ""


def tp_overlap(plan: Plan) -> tuple[bool, str]:
    """(TP collectives overlapped with the GEMMs beside them, why) for ``plan`` (module doc, **TP**)."""
    allowed, why = tp_overlap_allowed(plan.layout.tp, plan.sequence_parallel)
    if not plan.tp_comm_overlap:
        return False, "tp_comm_overlap off"
    if not allowed:
        return False, why
    return True, (f"tp_comm_overlap on: Transformer Engine userbuffers run the TP all-gathers / reduce-scatters "
                  f"beside the layer's GEMMs (bulk transfers on {TP_BULK_SMS} SMs)")


def tp_sm_share(plan: Plan) -> float:
    """What running the pipelined and bulk overlaps' GEMMs (about half of a layer's TP-split GEMM time) on
    SMs - :data:`TP_BULK_SMS` SMs adds to that GEMM time, as a share of it (module doc, **TP**)."""
    sms = plan.hardware_spec.sm_count
    return 0.5 * TP_BULK_SMS / (sms - TP_BULK_SMS)


def tp_overlap_exposed(communication: float, gemm: float, margin_share: float) -> float:
    """Exposed seconds of a layer's overlapped TP traffic (``communication``) beside its TP-split GEMMs (``gemm``
    seconds at full speed) whose SM margin costs ``margin_share`` of them (:func:`tp_sm_share`): max(c - d, d x
    share) -- the traffic they cannot cover, or the time they lose to the SMs they give up."""
    return max(communication - gemm, gemm * margin_share)


def dp_overlap(plan: Plan) -> tuple[bool, str]:
    """(gradient reduce-scatter and parameter all-gather overlapped, why): on exactly when the dense data-parallel
    size is above 1 (megatron-bridge CommOverlapConfig)."""
    if plan.layout.dp > 1:
        return True, f"overlap_grad_reduce / overlap_param_gather on (DP={plan.layout.dp})"
    return False, "overlap_grad_reduce / overlap_param_gather off: megatron-bridge turns them off at DP=1"


def bucket_share(plan: Plan, params: float) -> float:
    """Share of a rank's ``params`` parameters in its one gradient bucket that reduces last (megatron-core's
    default bucket: max(40,000,000, 1,000,000 x DP) parameters), at most 1."""
    if params <= 0:
        return 1.0
    return min(1.0, max(40_000_000, 1_000_000 * plan.layout.dp) / params)


def exposed(communication: float, hidden_behind: float) -> float:
    """max(0, communication - the compute it hides behind), in seconds."""
    return max(0.0, communication - hidden_behind)


FLEX_DISPATCHER_SMS = 20  # megatron-core 0.19.2 transformer_config.py: DeepEP's default SM count (HybridEP's too)


def dispatcher_sm_share(plan: Plan) -> float:
    """Share of a GPU's SMs the EP all-to-all holds while it runs beside compute: the plan's
    ``moe_flex_dispatcher_num_sms`` (None: FLEX_DISPATCHER_SMS, megatron-core's default) over the GPU's SMs
    (``Hardware.sm_count``) for the flex dispatcher (DeepEP, HybridEP), 0 for alltoall (NCCL's channels are not a
    megatron setting)."""
    if plan.moe_token_dispatcher_type != "flex":
        return 0.0
    return (plan.moe_flex_dispatcher_num_sms or FLEX_DISPATCHER_SMS) / plan.hardware_spec.sm_count


def contended(communication: float, hidden_behind: float, sm_share: float) -> float:
    """Exposed seconds of ``communication`` overlapped with ``hidden_behind`` seconds of compute when the
    communication's kernels hold ``sm_share`` of the SMs while they run: max(communication - hidden_behind,
    communication x sm_share) -- the compute runs at 1 - sm_share of its speed until the transfer ends (module
    doc); ``sm_share`` 0 gives :func:`exposed`."""
    return max(exposed(communication, hidden_behind), communication * sm_share)
