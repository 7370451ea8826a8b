"""Per-GPU memory of a Plan on its most loaded pipeline rank: a breakdown in bytes (GiB in the report).

What is counted, for every PP rank (the largest total is reported):

* **parameters** -- bf16 (2 bytes). Dense parts (attention, norms, router, shared / dense MLP, embedding on the
  first stage, output layer on the last, MTP layers on the last) are split by TP; routed experts by EP·ETP.
  Layers per rank come from the pipeline split (:func:`lcmoe_recipes.plan.pipeline_stage_layers`).
* **gradients** -- one main-gradient buffer per parameter, fp32 (``grad_reduce_in_fp32``) or bf16. The
  distributed optimizer does not shard it.
* **optimizer state** -- fp32 master weights plus two Adam moments (fp32, or bf16 with the precision-aware
  optimizer), sharded by the distributed optimizer over DP·CP (dense) and EDP (experts); the CPU-offloaded fraction
  ``optimizer_offload_fraction`` leaves the GPU.
* **activations** -- the tensors each layer keeps for its backward pass, listed by name in :func:`layer_activations`
  (bytes per layer per microbatch) with the recompute module that drops each one; times the microbatch-chunks in
  flight on that rank (1F1B: PP - rank; interleaved: megatron-core's warm-up count, ``schedules.py``); plus the
  loss logits on the last stage. Tokens per rank: MBS·seq_length/CP; tensors in the sequence-sharded regions are
  also divided by TP (sequence parallel), the rest by TP through the heads / hidden split.
* **transient** -- the largest extra live at the peak: the fp32 logit gradient on the last stage, or one layer's
  activations being recomputed / its gradients in flight.
* **overhead** -- a constant: workspaces (cuBLAS, TE), dispatcher buffers, allocator slack.

Two constants are calibrated (:data:`CALIBRATED`, fitted by :mod:`lcmoe_recipes.cost.calibrate` to the documented
rows M1-M6, Q1-Q6 of ``../shared/REFERENCE.md`` §10 and checked leave-one-out in ``tests/test_memory_accuracy.py``):
the overhead, and one scale on the listed activation tensors (below 1: the list over-counts what Megatron keeps --
some tensors are views, freed early or fused away). Everything else is derived from the model, the layout and
Megatron's rules. The loss keeps :data:`LOGIT_COPIES` fp32 logit-sized tensors alive at its peak (the softmax and
its gradient), not fitted.

Units: bytes; "GB" in the published measurements is 1e9 bytes (torch peak allocated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ..plan import Plan, pipeline_stage_layers
from .shapes import LayerShapes, shapes

BF16, FP32 = 2, 4
LOGIT_COPIES = 2  # fp32 logit-sized tensors alive at the loss peak: the softmax and its gradient


@dataclass(frozen=True)
class MemoryConstants:
    """The two calibrated constants of the memory model.

    Attributes:
        overhead_bytes: fixed per-GPU bytes (workspaces, dispatcher buffers, allocator slack).
        activation_scale: multiplier on the listed activation tensors.
    """

    overhead_bytes: float
    activation_scale: float


# Fitted 2026-11-30 by `python scripts/calibrate_memory.py` (least mean |predicted/published - 1| over M1-M6, Q1-Q6).
CALIBRATED = MemoryConstants(overhead_bytes=4.0e9, activation_scale=0.66)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per component on one pipeline rank; ``total`` is their sum."""

    pp_rank: int
    parameters: float
    gradients: float
    optimizer: float
    activations: float
    transient: float
    overhead: float
    detail: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.transient + self.overhead

    def gib(self) -> dict[str, float]:
        """Components in GiB (2**30 bytes)."""
        names = ("parameters", "gradients", "optimizer", "activations", "transient", "overhead", "total")
        return {n: getattr(self, n) / 2**30 for n in names}


def layer_activations(s: LayerShapes, layer: int, plan: Plan) -> dict[str, tuple[float, tuple[str, ...]]]:
    """Tensors layer ``layer`` keeps for backward, per microbatch: name -> (bytes, recompute modules that drop it).

    Full attention uses flash attention (TE): it keeps q, k, v, its output and the fp32 log-sum-exp, never the
    s x s scores; ``core_attn`` recompute therefore frees only the log-sum-exp. With CP the ring / all-to-all
    exchange keeps only this rank's 1/CP of the sequence.
    """
    lay = plan.layout
    tp, etp = lay.tp, lay.etp
    n = plan.micro_batch_size * plan.seq_length / lay.cp          # tokens on this rank
    nsp = n / tp if plan.sequence_parallel else n                 # tokens in sequence-sharded regions
    h = s.h
    out: dict[str, tuple[float, tuple[str, ...]]] = {
        "layer_input": (nsp * h * BF16, ()),
        "input_norm_out": (nsp * h * BF16, ("layernorm",)),
    }
    if s.is_softmax(layer):
        if s.mla:
            if s.q_lora:
                out["q_down_out"] = (n * s.q_lora * BF16 * 2, ())
            out["kv_down_out"] = (n * (s.kv_lora + s.d_rope) * BF16 * 2, ())
            out["mla_up_proj_out"] = (n * s.nq * (s.d_qk + s.d_qk + s.d_v) * BF16 / tp, ("mla_up_proj",))
            out["qkv_rope"] = (n * s.nq * (2 * s.d_qk + s.d_v) * BF16 / tp, ("mla_up_proj",))
        else:
            # q, k, v; Qwen3's q/k RMSNorm keeps q and k both before and after the norm
            out["qkv"] = (n * (2 * s.nq + 3 * s.nkv) * s.d_qk * BF16 / tp, ())
            if s.out_gate:  # Qwen3-Next full attention: sigmoid output gate
                out["attn_gate"] = (n * s.nq * s.d_v * BF16 / tp, ())
        out["attn_out"] = (n * s.nq * s.d_v * BF16 / tp, ())
        out["softmax_lse"] = (n * s.nq * FP32 / tp, ("core_attn",))
    else:  # gated DeltaNet
        width = 2 * s.lin_nk * s.lin_dk + 2 * s.lin_nv * s.lin_dv
        out["gdn_in_proj_out"] = (n * width * BF16 / tp, ())
        out["gdn_conv_out"] = (n * (2 * s.lin_nk * s.lin_dk + s.lin_nv * s.lin_dv) * BF16 / tp, ())
        out["gdn_core_out"] = (n * s.lin_nv * s.lin_dv * BF16 / tp, ())
        out["gdn_norm_out"] = (n * s.lin_nv * s.lin_dv * BF16 / tp, ("gdn_norm_out",))
    out["pre_mlp_input"] = (nsp * h * BF16, ())
    out["pre_mlp_norm_out"] = (nsp * h * BF16, ("layernorm",))
    if s.is_moe(layer):
        routed = nsp * s.topk                                   # token copies this rank's experts process
        moe = ("moe",)
        out["router_probs"] = (nsp * s.num_experts * FP32 * 2, moe)
        out["expert_fc1_in"] = (routed * h * BF16, moe)
        out["expert_fc1_out"] = (routed * 2 * s.f_expert * BF16 / etp, moe)
        out["expert_act_out"] = (routed * s.f_expert * BF16 / etp, moe + ("moe_act",))
        out["expert_fc2_out"] = (routed * h * BF16, moe)
        if s.f_shared:
            shared = ("moe", "shared_experts")
            out["shared_fc1_out"] = (n * 2 * s.f_shared * BF16 / tp, shared)
            out["shared_act_out"] = (n * s.f_shared * BF16 / tp, shared)
    else:
        out["mlp_fc1_out"] = (n * 2 * s.f_dense * BF16 / tp, ("mlp",))
        out["mlp_act_out"] = (n * s.f_dense * BF16 / tp, ("mlp",))
    return out


def master_weight_bytes(plan: Plan) -> int:
    """Bytes per fp32 master weight the optimizer keeps on the GPU.

    With the precision-aware optimizer on GPU (TE FusedAdam) and bf16 params, megatron-core's default
    ``store_param_remainders=True`` keeps only the low 16 bits of each fp32 master weight (the bf16 param holds the
    high 16): 2 bytes. CPU offload (HybridDeviceOptimizer) keeps full fp32 masters: 4 bytes.
    Source: megatron-core 0.19.2 ``OptimizerConfig.store_param_remainders``.
    """
    if plan.use_precision_aware_optimizer and not plan.optimizer_cpu_offload:
        return BF16
    return FP32


def _kept(tensors: dict[str, tuple[float, tuple[str, ...]]], plan: Plan) -> float:
    if plan.recompute_granularity == "full":
        return tensors["layer_input"][0]
    dropped = set(plan.recompute_modules) if plan.recompute_granularity == "selective" else set()
    return sum(b for b, by in tensors.values() if not dropped.intersection(by))


def _chunks_in_flight(plan: Plan, pp_rank: int) -> list[int]:
    """How many microbatches of each of this rank's model chunks are alive at the peak (megatron-core schedules)."""
    lay = plan.layout
    pp, vpp = lay.pp, lay.vpp or 1
    micro = max(1, plan.num_microbatches)
    if vpp == 1:
        return [min(pp - pp_rank, micro)]
    warmup = min((pp - pp_rank - 1) * 2 + (vpp - 1) * pp, micro * vpp)
    alive = warmup + 1
    counts = [0] * vpp
    chunk = 0
    while alive > 0:  # microbatches go through chunk 0 in groups of PP, then chunk 1, ...
        take = min(pp, alive)
        counts[chunk % vpp] += take
        alive -= take
        chunk += 1
    return [min(c, micro) for c in counts]


@dataclass(frozen=True)
class _RankStatic:
    """What a pipeline rank holds, independent of TP/EP and the knobs: parameter counts (before the TP and EP
    splits), its layers by kind per model chunk, and whether it has the first / last stage."""

    dense: float
    experts: float
    chunk_kinds: tuple[tuple[tuple[tuple[bool, str], int], ...], ...]
    representative: tuple[int, ...]
    first: bool
    last: bool


@lru_cache(maxsize=4096)
def _rank_static(model_key: str, pp: int, vpp: int, mtp: int, pp_rank: int) -> _RankStatic:
    from ..catalog import get_model

    s = shapes(get_model(model_key))
    stages = pipeline_stage_layers(s.num_layers, pp * vpp, mtp) if pp * vpp > 1 else [s.num_layers]
    starts = [sum(stages[:i]) for i in range(len(stages))]
    chunks = [pp_rank + v * pp for v in range(vpp)]
    layers = [list(range(starts[c], starts[c] + stages[c])) for c in chunks]
    first, last = 0 in chunks, (pp * vpp - 1) in chunks
    dense = float(sum(s.layer_dense_params(i) for ch in layers for i in ch))
    experts = float(sum(s.layer_expert_params(i) for ch in layers for i in ch))
    if first:
        dense += s.embedding
    if last:
        mtp_layer = s.num_layers - 1  # an MTP layer is a full MoE transformer layer plus a 2h x h projection
        # the output layer; tied to the embedding, the last stage still holds its own copy when it is not also the
        # first (megatron-core LanguageModule.setup_embeddings_and_output_layer)
        out = s.embedding if (not s.tied or not first) else 0
        dense += out + s.h + mtp * (s.layer_dense_params(mtp_layer) + 2 * s.h * s.h)
        experts += mtp * s.layer_expert_params(mtp_layer)
    kinds, reps = [], {}
    for ch in layers:
        counts: dict[tuple[bool, str], int] = {}
        for i in ch:
            kind = (s.is_moe(i), s.kind(i))
            counts[kind] = counts.get(kind, 0) + 1
            reps.setdefault(kind, i)
        kinds.append(tuple(counts.items()))
    if last and mtp:
        reps.setdefault((s.is_moe(s.num_layers - 1), s.kind(s.num_layers - 1)), s.num_layers - 1)
    return _RankStatic(dense, experts, tuple(kinds), tuple(reps.values()), first, last)


def estimate_memory(plan: Plan, constants: MemoryConstants = CALIBRATED) -> MemoryBreakdown:
    """Memory breakdown of the most loaded pipeline rank of ``plan`` (see the module doc)."""
    return max((rank_memory(plan, r, constants) for r in range(plan.layout.pp)), key=lambda m: m.total)


def rank_memory(plan: Plan, pp_rank: int, constants: MemoryConstants = CALIBRATED) -> MemoryBreakdown:
    """Memory breakdown of pipeline rank ``pp_rank``."""
    spec = plan.model_spec
    s = shapes(spec)
    lay = plan.layout
    static = _rank_static(spec.key, lay.pp, lay.vpp or 1, plan.mtp_num_layers, pp_rank)
    last = static.last
    dense = static.dense / lay.tp
    experts = static.experts / (lay.ep * lay.etp)
    params = dense + experts
    grad_bytes = FP32 if plan.grad_dtype == "fp32" else BF16
    state_bytes = master_weight_bytes(plan) + 2 * (FP32 if plan.moment_dtype == "fp32" else BF16)
    shard = dense / (lay.dp * lay.cp) + experts / lay.edp
    on_gpu = 1.0 - (plan.optimizer_offload_fraction if plan.optimizer_cpu_offload else 0.0)

    by_kind = {}  # layers of one kind (MoE or dense, full or linear attention) keep the same tensors
    for layer in static.representative:
        tensors = layer_activations(s, layer, plan)
        by_kind[(s.is_moe(layer), s.kind(layer))] = (_kept(tensors, plan), sum(b for b, _ in tensors.values()))
    per_chunk = [sum(n * by_kind[kind][0] for kind, n in chunk) for chunk in static.chunk_kinds]
    largest_layer = max((by_kind[kind][1] for chunk in static.chunk_kinds for kind, _ in chunk), default=0.0)
    n = plan.micro_batch_size * plan.seq_length / lay.cp
    logits = n * s.vocab * FP32 / lay.tp if last else 0.0
    if last and plan.mtp_num_layers:
        mtp_tensors = layer_activations(s, s.num_layers - 1, plan)
        per_chunk[-1] += plan.mtp_num_layers * (_kept(mtp_tensors, plan) + logits)
    in_flight = _chunks_in_flight(plan, pp_rank)
    scale = constants.activation_scale
    listed = sum(k * c for k, c in zip(per_chunk, in_flight))
    activations = scale * listed + logits
    transient = max(LOGIT_COPIES * logits, scale * largest_layer)
    return MemoryBreakdown(
        pp_rank=pp_rank, parameters=params * BF16, gradients=params * grad_bytes,
        optimizer=shard * state_bytes * on_gpu, activations=activations, transient=transient,
        overhead=constants.overhead_bytes,
        detail={"listed_activations": listed, "largest_layer": largest_layer, "dense_params": dense, "expert_params": experts, "optimizer_shard_params": shard,
                "chunks_in_flight": float(sum(in_flight)), "logits_bytes": logits},
    )
