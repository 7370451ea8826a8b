"""Predicted step time, tokens/s/GPU, TFLOP/s/GPU and MFU of a Plan, with where the time goes.

FLOPs (model FLOPs, Megatron's convention: recompute not counted; forward + backward = 3 x forward):

* linear layers: 6 x the parameters a token multiplies with (dense parts, its top-k routed experts, the output
  layer) per token;
* softmax attention, causal: 6 x nq·(d_qk + d_v) x keys seen per token per layer (QK^T and AV: 2·2·keys·nq·d
  forward), keys seen = seq_length/2 on average -- it grows with seq_length, so at long context it dominates; a
  sliding-window layer sees at most the window (:meth:`LayerShapes.keys_seen`);
* gated DeltaNet (chunked, chunk 64): 3 x 2·nv·(2·dk·dv + 64·(dk + dv)) per token per layer (linear in seq_length);
  its *time* is the longer of those FLOPs and the sequential chunk scan (:func:`_gdn_seconds`).

Each GPU does 1/(TP·CP) of its pipeline stage's work for a microbatch. GEMM time = GEMM FLOPs / (the GPU's dense
peak at the recipe's precision x that GPU x precision's GEMM efficiency). Softmax attention time comes from the
kernel calls megatron-core makes and the kernel's published throughput at their shapes (:mod:`lcmoe_recipes.cost.
attention`), times the GPU's fitted attention scale; gated DeltaNet by its sequential scan. The constants, one per
GPU x precision (GEMM) and per GPU (attention, scan), and where each comes from -- fitted to published rows, or
borrowed from a stated sibling -- are :mod:`lcmoe_recipes.cost.efficiency`. Recompute adds the forward work of the
recomputed modules to the time. Memory-bound kernels are their bytes at the datasheet HBM bandwidth
(:mod:`lcmoe_recipes.cost.elementwise`): the ones every layer runs between its GEMMs and its attention kernel (norms,
residual adds, router scores, token permutation, SwiGLU, the CP ring's merges; ``parts["memory_bound"]``), the FP8
cast kernels with their scales under an FP8 recipe (``parts["fp8_quantize"]``), and the passes some model features
run outside megatron-core's fused kernels (clamped GLU, linear biases, RoPE unfused under YaRN) with the recomputed
modules without FLOPs (``layernorm``, ``moe_act``) (``parts["elementwise"]``).

Overlap: every overlap megatron-core implements, each exposed = max(0, communication - the compute it hides behind),
with the settings that enable or forbid it (:mod:`lcmoe_recipes.cost.overlap`, which says where each condition is
read): EP all-to-all behind the other microbatch's layer compute (``overlap_moe_expert_parallel_comm``, with or
without ``delay_wgrad_compute``; the flex dispatcher's kernels hold 20 SMs while they run, so at least that share of
the transfer stays exposed: ``overlap.contended``), one microbatch's EP traffic exposed per step; TP collectives
exposed without ``tp_comm_overlap``, with it each layer's behind its GEMMs outside the routed experts, which lose
the SMs the transfers hold; DP / EDP gradient reduce-scatter behind the last microbatch's backward and parameter
all-gather behind the first forward, the last bucket exposed, all of it exposed at DP=1; CP ring steps behind the
attention they feed (per layer), all-to-all and all-gather exchanges exposed; PP send/receive hidden with VPP
(``overlap_p2p_comm``), exposed without. :attr:`StepEstimate.overlaps` lists each with its seconds.

* pipeline bubble: (PP - 1) / VPP microbatches;
* optimizer CPU offload: the host's CPU Adam over the offloaded elements and their GPU <-> host copies, from the
  elements each node holds and its host memory and link bandwidths (:func:`lcmoe_recipes.cost.offload.
  offload_step_seconds`: 28 bytes of host memory traffic per element for the fused CPU AdamW, 4 each way for the
  copies), after the backward and not hidden behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from ..catalog import get_hardware
from ..core.pipeline import stage_decoder_layers
from ..core.plan import Plan
from .attention import layer_attention_seconds
from .comm import cp_groups, data_parallel_transfers, layer_transfers, pipeline_transfer, rank_layers
from .efficiency import Constant, constant
from .elementwise import common_bytes, features as elementwise_features, per_token_bytes as elementwise_bytes
from .elementwise import cp_ring_bytes, quantize_bytes, recompute_bytes
from .memory import applied_recompute_modules, pre_mlp_norm_recomputed
from .offload import offload_step_seconds
from .attention import BACKWARD_FLOPS as ATTENTION_BACKWARD
from .overlap import (Overlap, bucket_share, dispatcher_sm_share, dp_overlap, ep_overlap, exposed, tp_overlap,
                      tp_overlap_exposed, tp_sm_share)
from .shapes import GDN, LayerShapes, shapes

GDN_CHUNK = 64
BACKWARD_SHARE = 2 / 3  # backward = 2x forward FLOPs: 2/3 of a microbatch's forward + backward (no recompute)


def step_constants(plan: Plan, table: dict[tuple[str, str], float] | None = None) -> tuple[Constant, Constant, Constant]:
    """(GEMM efficiency at the plan's precision, attention scale, gated-DeltaNet chunk seconds) for its GPU, each with
    where it comes from (:func:`lcmoe_recipes.cost.efficiency.constant`; ``table`` default: the fitted one)."""
    if table is None:
        return _fitted_constants(plan.hardware, plan.precision)
    hw = plan.hardware_spec.key
    return constant(hw, plan.precision, table), constant(hw, "attention", table), constant(hw, "gdn_step", table)


@lru_cache(maxsize=64)
def _fitted_constants(hardware: str, precision: str) -> tuple[Constant, Constant, Constant]:
    """:func:`step_constants` at the fitted constants (a module-level table nothing changes), once per GPU x
    precision: the search asks for them thousands of times."""
    hw = get_hardware(hardware).key
    return constant(hw, precision), constant(hw, "attention"), constant(hw, "gdn_step")


def _layer_flops(s: LayerShapes, layer: int, seq: int) -> tuple[float, float]:
    """(linear, attention) model FLOPs per token of one layer, forward + backward."""
    linear = 6 * (s.layer_dense_params(layer) + (s.topk * s.expert if s.is_moe(layer) else 0))
    if s.is_softmax(layer):
        attention = 6 * s.nq * (s.d_qk + s.d_v) * s.layer_keys_seen(layer, seq)
    else:
        attention = 3 * 2 * s.lin_nv * (2 * s.lin_dk * s.lin_dv + GDN_CHUNK * (s.lin_dk + s.lin_dv))
    return linear, attention


def _gdn_seconds(micro_batch_size: int, seq_length: int, step_seconds: float) -> float:
    """Time of one gated-DeltaNet layer's chunked scan for one microbatch, forward + backward (3 passes).

    The scan carries a (dk x dv) state per head from chunk to chunk: seq_length/64 sequential steps whatever CP is
    (CP's all-to-all hands each rank the whole sequence for 1/CP of the heads, so fewer heads run in parallel but
    the chain of steps is as long). ``step_seconds`` is the calibrated time of one step.
    """
    return 3 * micro_batch_size * (seq_length / GDN_CHUNK) * step_seconds


def model_flops_per_token(plan: Plan) -> float:
    """Model FLOPs per token (forward + backward, no recompute), all layers, MTP and output layer included."""
    return _model_flops(plan.model, plan.seq_length, plan.mtp_num_layers)


@lru_cache(maxsize=1024)
def _model_flops(model_key: str, seq_length: int, mtp_num_layers: int) -> float:
    from ..catalog import get_model

    s = shapes(get_model(model_key))
    total = 6 * s.embedding  # output layer (the logits GEMM runs whether or not it is tied)
    for i in range(s.num_layers):
        total += sum(_layer_flops(s, i, seq_length))
    mtp = sum(_layer_flops(s, s.num_layers - 1, seq_length)) + 6 * (2 * s.h * s.h + s.embedding)
    return total + mtp_num_layers * mtp


def _recompute_flops(s: LayerShapes, layer: int, plan: Plan) -> tuple[float, float]:
    """Extra forward FLOPs per token that recompute adds to layer ``layer``: (GEMM part, attention part); time only."""
    linear, attention = _layer_flops(s, layer, plan.seq_length)
    if plan.recompute_granularity == "full":
        return linear / 3, attention / 3
    if plan.recompute_granularity != "selective":
        return 0.0, 0.0
    mods, extra = set(plan.recompute_modules), 0.0
    if s.is_moe(layer) and "moe" in mods:
        extra += 2 * (s.topk * s.expert + s.shared + s.router)
    if not s.is_moe(layer) and "mlp" in mods:
        extra += 2 * s.dense_mlp
    if "mla_up_proj" in mods and s.mla:
        extra += 2 * s.nq * ((s.d_qk * (s.q_lora or s.h)) + s.kv_lora * (s.d_qk - s.d_rope + s.d_v))
    return extra, (attention / 3 if "core_attn" in mods else 0.0)


@dataclass(frozen=True)
class StepEstimate:
    """Predicted step time (s) and its parts, for the slowest pipeline rank."""

    step_seconds: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float
    microbatch_seconds: float
    parts: dict[str, float] = field(default_factory=dict)     # seconds per step, by cause
    comm_bytes: dict[str, float] = field(default_factory=dict)  # bytes per GPU per step, by collective
    overlaps: tuple[Overlap, ...] = ()                          # each communication, overlapped or not


@dataclass(frozen=True)
class _RankWork:
    """What one pipeline rank does per microbatch, independent of the fitted constants."""

    rank: int
    gemm_flops: float                               # this GPU, recompute included
    attention: tuple[tuple[float, float, int], ...]  # (attention s at the published kernel rate, CP ring s, layers)
    gdn_layers: int
    exposed_cp_seconds: float
    tp_seconds: float
    ep_seconds: float
    pp_seconds: float
    bytes_by: tuple[tuple[str, float], ...]
    attention_seconds: float = 0.0                  # sum of n x attention s over ``attention``
    # per MoE layer kind: (EP s, the layer's GEMM FLOPs on this GPU outside the routed experts, the routed experts'
    # GEMM FLOPs, its attention s at the published rate, layers); forward + backward, recompute included
    ep_layers: tuple[tuple[float, float, float, float, int], ...] = ()
    pp_transfer_seconds: float = 0.0                # the PP transfer, hidden or not
    elementwise_seconds: float = 0.0                # memory-bound passes outside fused kernels (cost.elementwise)
    # per layer kind: (TP s, the layer's GEMM FLOPs on this GPU outside the routed experts, layers); forward +
    # backward, recompute included: what tp_comm_overlap hides the TP collectives behind
    tp_layers: tuple[tuple[float, float, int], ...] = ()
    common_seconds: float = 0.0                     # every layer's memory-bound kernels (cost.elementwise.common_bytes)
    quantize_seconds: float = 0.0                   # FP8 cast kernels (cost.elementwise.quantize_bytes)


def rank_kinds(plan: Plan, pp_rank: int) -> tuple[tuple[tuple[bool, str], int, int], ...]:
    """The decoder layers of pipeline rank ``pp_rank`` by kind: ((is MoE, attention kind), a layer of that kind,
    how many), in the order the kinds first appear. Layers of one kind cost the same."""
    lay = plan.layout
    return _rank_kinds(plan.model, stage_decoder_layers(plan), lay.pp, lay.vpp or 1, pp_rank)


@lru_cache(maxsize=4096)
def _rank_kinds(model_key: str, stages: tuple[int, ...], pp: int, vpp: int, pp_rank: int):
    from ..catalog import get_model

    s = shapes(get_model(model_key))
    counts: dict[tuple[bool, str], list[int]] = {}
    for i in rank_layers(stages, pp, vpp, pp_rank):
        kind = (s.is_moe(i), s.kind(i))
        counts.setdefault(kind, [i, 0])[1] += 1
    return tuple((kind, layer, n) for kind, (layer, n) in counts.items())


@lru_cache(maxsize=4096)
def _layer_ranks(model_key: str, stages: tuple[int, ...], pp: int, vpp: int) -> tuple[int, ...]:
    """The first PP rank of each distinct set of decoder layers (kinds and counts; the last rank, which also runs the
    output layer and MTP, apart): a rank that holds the same layers as a lower one does the same work."""
    seen: dict[tuple, int] = {}
    for r in range(pp):
        held = (tuple((kind, count) for kind, _, count in _rank_kinds(model_key, stages, pp, vpp, r)), r == pp - 1)
        seen.setdefault(held, r)
    return tuple(seen.values())


def _work(plan: Plan) -> tuple[_RankWork, ...]:
    """Per PP rank, what one microbatch costs (independent of the calibrated constants), each rank whose work equals
    a lower rank's left out (its microbatch takes as long, and the slowest rank is the first on a tie). It reads
    neither the offload fields nor the batch size, and of the CUDA-graph fields only whether a layernorm recompute
    reaches the pre-MLP norm (:func:`~lcmoe_recipes.cost.memory.pre_mlp_norm_recomputed`), so it is cached without
    them: the search prices many plans that differ only there."""
    norm = plan.recompute_granularity != "selective" or "layernorm" not in plan.recompute_modules or \
        pre_mlp_norm_recomputed(plan)
    return _cached_work(plan.with_changes(cuda_graph_impl="none", cuda_graph_modules=(), optimizer_cpu_offload=False,
                                          optimizer_offload_fraction=0.0, global_batch_size=0, name="",
                                          tp_comm_overlap=False), norm)


@lru_cache(maxsize=4096)
def _cached_work(plan: Plan, pre_mlp_norm: bool) -> tuple[_RankWork, ...]:
    s, lay, hw = shapes(plan.model_spec), plan.layout, plan.hardware_spec.key
    flags = elementwise_features(plan)
    selective = applied_recompute_modules(plan) if plan.recompute_granularity == "selective" else ()
    hbm = plan.hardware_spec.hbm_gbps * 1e9
    tokens = plan.micro_batch_size * plan.seq_length
    share = 1.0 / (lay.tp * lay.cp)
    pp_t = pipeline_transfer(plan)
    # the ring a CP exchange merges over (cost.elementwise.cp_ring_bytes): all of CP for p2p, the outer ring of a2a+p2p
    ring = cp_groups(plan.cp_comm_type, plan.hierarchical_cp_sizes, lay.cp)[1] if plan.cp_comm_type in (
        "p2p", "a2a+p2p") else 1
    per_kind: dict = {}  # layers of one kind cost the same, on every rank: priced once
    distinct: dict[tuple, _RankWork] = {}  # the first rank of each kind of work, keyed by its work
    for r in _layer_ranks(plan.model, stage_decoder_layers(plan), lay.pp, lay.vpp or 1):
        kinds = rank_kinds(plan, r)
        gemm = tp = ep = exposed_cp = moved = common = quantized = 0.0
        attention: dict[tuple[float, float], int] = {}
        gdn = 0
        bytes_by: dict[str, float] = {"PP": pp_t.nvlink_bytes + pp_t.scaleout_bytes}
        ep_layers, tp_layers = [], []
        for kind, i, count in kinds:
            one = per_kind.get(kind)
            if one is None:
                (linear, _), (recompute, recompute_attn) = (_layer_flops(s, i, plan.seq_length),
                                                            _recompute_flops(s, i, plan))
                one = per_kind[kind] = (
                    linear, recompute, layer_transfers(plan, i), sum(elementwise_bytes(s, i, flags)),
                    sum(common_bytes(s, i)) + cp_ring_bytes(s, i, ring), sum(quantize_bytes(s, i, plan.precision)),
                    recompute_bytes(s, i, tokens / lay.cp, lay.tp, lay.etp, plan.sequence_parallel, selective,
                                    pre_mlp_norm) if selective else 0.0,
                    layer_attention_seconds(s, i, hw, plan.seq_length, plan.micro_batch_size, lay.tp, lay.cp,
                                            plan.cp_comm_type, plan.hierarchical_cp_sizes, recompute_attn > 0,
                                            plan.variable_length))
            linear, recompute, transfers, elementwise, common_one, quantize_one, recomputed, attn = one
            gemm += count * (linear + recompute) * tokens * share
            moved += count * elementwise * tokens * share
            common += count * common_one * tokens * share
            quantized += count * quantize_one * tokens * share
            if selective:
                moved += count * recomputed
            layer_ep = layer_tp = 0.0
            cp = a2a = 0.0
            for t in transfers:
                kind_ = "CP" if t.kind == "CP-a2a" else t.kind
                bytes_by[kind_] = bytes_by.get(kind_, 0.0) + count * (t.nvlink_bytes + t.scaleout_bytes)
                if t.kind == "TP":
                    tp += count * t.seconds
                    layer_tp += t.seconds
                elif t.kind == "EP":
                    ep += count * t.seconds
                    layer_ep = t.seconds
                elif t.kind == "CP-a2a":
                    a2a = t.seconds  # hierarchical CP's all-to-all: not overlapped
                else:
                    cp = t.seconds
            exposed_cp += count * a2a
            experts = 6 * s.topk * s.expert * tokens * share if s.is_moe(i) else 0.0
            if layer_ep:
                ep_layers.append((layer_ep, (linear + recompute) * tokens * share - experts, experts, attn, count))
            if layer_tp:
                tp_layers.append((layer_tp, (linear + recompute) * tokens * share - experts, count))
            if kind[1] != GDN and plan.cp_comm_type not in (None, "p2p", "a2a+p2p"):
                key = (attn, 0.0)  # a2a / all_gather: the exchange is not overlapped: exposed
                attention[key] = attention.get(key, 0) + count
                exposed_cp += count * cp
            elif kind[1] != GDN:
                key = (attn, cp)
                attention[key] = attention.get(key, 0) + count
            else:  # gated DeltaNet: timed by its scan (_gdn_seconds)
                gdn += count
                exposed_cp += count * cp
        if r == lay.pp - 1:  # output layer and MTP on the last stage
            gemm += (6 * s.embedding + plan.mtp_num_layers * (sum(_layer_flops(s, s.num_layers - 1, plan.seq_length))
                                                              + 6 * (2 * s.h * s.h + s.embedding))) * tokens * share
        work = (gemm, tuple((f, c, n) for (f, c), n in attention.items() if n), gdn, exposed_cp, tp, ep,
                0.0 if (lay.vpp or 1) > 1 else pp_t.seconds, tuple(bytes_by.items()),
                sum(n * f for (f, _), n in attention.items()), tuple(ep_layers), pp_t.seconds,
                moved / hbm if moved else 0.0, tuple(tp_layers), common / hbm, quantized / hbm)
        if work not in distinct:
            distinct[work] = _RankWork(r, *work)
    return tuple(distinct.values())


@dataclass(frozen=True)
class StepTerms:
    """Everything :func:`estimate_step` needs but the fitted constants: per PP rank its work
    (:class:`_RankWork`, attention at the published kernel rate) and its GEMM seconds at efficiency 1; the batch's
    microbatches and bubble; the offload time and the model FLOPs. :meth:`evaluate` prices it for any constants in
    microseconds (the fit evaluates every published row many times)."""

    plan: Plan
    ranks: tuple[_RankWork, ...]  # the PP ranks of distinct work (_work)
    gemm_unit: tuple[float, ...]  # per rank: GEMM FLOPs / the dense peak at the plan's precision (s)
    gdn_unit: float               # seconds per gated-DeltaNet layer per microbatch at 1 s per chunk step
    peak: float                   # the dense peak at the plan's precision, FLOP/s
    ep_on: bool                   # EP all-to-all overlapped (cost.overlap.ep_overlap)
    delay_wgrad: bool             # ... with the experts' weight gradients delayed behind it
    ep_sm_share: float            # ... the SMs its kernels hold meanwhile (cost.overlap.dispatcher_sm_share)
    dp_on: bool                   # DP / EDP reduce-scatter and all-gather overlapped (cost.overlap.dp_overlap)
    tp_on: bool                   # TP collectives overlapped with the GEMMs beside them (cost.overlap.tp_overlap)
    tp_sm_share: float            # ... what the SMs its transfers hold cost its GEMMs (cost.overlap.tp_sm_share)
    micro: int
    bubble: float
    offload: float
    flops: float                  # model FLOPs of one step, all GPUs

    def _ep_exposed(self, w: _RankWork, gemm_eff: float, attn_scale: float) -> float:
        """Exposed EP seconds of one microbatch of rank ``w`` (cost.overlap: each layer's all-to-all behind the
        other microbatch's compute of that layer, less the experts' weight gradients unless they are delayed; the SMs
        a flex dispatcher holds slow the compute beside it: cost.overlap.contended)."""
        if not self.ep_on:
            return w.ep_seconds
        out = 0.0
        rate, share, delay = self.peak * gemm_eff, self.ep_sm_share, self.delay_wgrad
        for ep, dense, experts, attn, n in w.ep_layers:
            f_attn = dense / 3 / rate + attn / attn_scale / (1 + ATTENTION_BACKWARD)  # forward, attention side
            b_attn = 2 * dense / 3 / rate + attn / attn_scale * ATTENTION_BACKWARD / (1 + ATTENTION_BACKWARD)
            f_mlp = dgrad = experts / 3 / rate  # routed experts: forward, dgrad, wgrad
            b_mlp, late = (dgrad, dgrad) if delay else (2 * dgrad, 0.0)
            c = ep / 4  # dispatch and combine, forward and backward
            floor = c * share  # contended(c, block, share) for each block, inlined (the search's hot path)
            total = 0.0
            for block in (b_mlp, b_attn, f_attn, f_mlp + late):
                x = c - block
                total += x if x > floor else floor
            out += n * total
        return out

    def tp_exposed(self, w: _RankWork, gemm_eff: float) -> float:
        """Exposed TP seconds of one microbatch of rank ``w``: all of it without ``tp_comm_overlap``; with it, per
        layer max(TP - its GEMMs outside the routed experts, what the SMs those GEMMs give up to the transfers cost
        them) (cost.overlap.tp_overlap_exposed)."""
        if not self.tp_on:
            return w.tp_seconds
        rate, share = self.peak * gemm_eff, self.tp_sm_share
        return sum(n * tp_overlap_exposed(c, dense / rate, share) for c, dense, n in w.tp_layers)

    def dp_exposed(self, rank: int, t_mb: float) -> tuple[float, float, float]:
        """(reduce-scatter s, all-gather s, exposed s) of rank ``rank``'s DP and EDP traffic per step, its
        microbatch taking ``t_mb`` s (cost.overlap: the reduce-scatter behind the last backward, the all-gather
        behind the first forward, each bucket's last one exposed; all exposed when the overlap is off)."""
        rs = ag = out = 0.0
        for t, grad_share, bucket in _dp_terms(self.plan, rank):
            r, g = t.seconds * grad_share, t.seconds * (1 - grad_share)
            rs, ag = rs + r, ag + g
            if self.dp_on:
                out += max(r * bucket, r - BACKWARD_SHARE * t_mb) + max(g * bucket, g - (1 - BACKWARD_SHARE) * t_mb)
            else:
                out += r + g
        return rs, ag, out

    def evaluate(self, gemm_eff: float, attn_scale: float, gdn_step: float):
        """(step s, slowest rank's work, its microbatch s, GEMM s, attention s, exposed CP s, exposed EP s, exposed
        DP s, EP s exposed once per step for the unpaired microbatch) for the given constants."""
        worst = self.slowest(gemm_eff, attn_scale, gdn_step)
        t_mb, w = worst[0], worst[1]
        exposed_dp = self.dp_exposed(w.rank, t_mb)[2]
        unpaired = w.ep_seconds - worst[5]  # the first forward's and the last backward's all-to-all: no partner
        return ((self.micro + self.bubble) * t_mb + exposed_dp + unpaired + self.offload, *worst, exposed_dp, unpaired)

    def slowest(self, gemm_eff: float, attn_scale: float, gdn_step: float):
        """(microbatch s, work, GEMM s, attention s, exposed CP s, exposed EP s) of the slowest PP rank, the first
        on a tie, for the given constants: :meth:`evaluate` without the once-per-step terms."""
        worst = None
        for w, unit in zip(self.ranks, self.gemm_unit):
            gemm = unit / gemm_eff
            attn = w.attention_seconds / attn_scale + w.gdn_layers * self.gdn_unit * gdn_step
            cp = w.exposed_cp_seconds
            for a, c, n in w.attention:
                cp += n * exposed(c, a / attn_scale)  # the ring behind the attention it feeds
            ep = self._ep_exposed(w, gemm_eff, attn_scale)
            t_mb = (gemm + attn + self.tp_exposed(w, gemm_eff) + cp + ep + w.pp_seconds + w.elementwise_seconds
                    + w.common_seconds + w.quantize_seconds)
            if worst is None or t_mb > worst[0]:
                worst = (t_mb, w, gemm, attn, cp, ep)
        return worst


@lru_cache(maxsize=8192)
def _dp_transfers(plan: Plan, rank: int):
    from .memory import rank_memory  # parameter counts of that rank

    detail = rank_memory(plan, rank).detail
    return tuple(data_parallel_transfers(plan, detail["dense_params"], detail["expert_params"]))


@lru_cache(maxsize=8192)
def _dp_terms(plan: Plan, rank: int):
    """Per DP / EDP transfer of rank ``rank``: (transfer, share of its time that is the gradient reduce-scatter,
    share of its parameters in one bucket)."""
    from .memory import rank_memory

    detail = rank_memory(plan, rank).detail
    grad = 4 if plan.grad_dtype == "fp32" else 2
    params = {"DP": detail["dense_params"], "EDP": detail["expert_params"]}
    return tuple((t, grad / (grad + 2), bucket_share(plan, params[t.kind])) for t in _dp_transfers(plan, rank))


def step_terms(plan: Plan) -> StepTerms:
    """The :class:`StepTerms` of ``plan``."""
    lay = plan.layout
    peak = plan.hardware_spec.peak(plan.precision) * 1e12
    work = _work(plan)
    ep_on, delay_wgrad, _ = ep_overlap(plan)
    return StepTerms(plan, work, tuple(w.gemm_flops / peak for w in work),
                     _gdn_seconds(plan.micro_batch_size, plan.seq_length, 1.0), peak, ep_on, delay_wgrad,
                     dispatcher_sm_share(plan), dp_overlap(plan)[0], tp_overlap(plan)[0], tp_sm_share(plan),
                     plan.num_microbatches, (lay.pp - 1) / (lay.vpp or 1),
                     offload_step_seconds(plan).seconds,
                     model_flops_per_token(plan) * plan.global_batch_size * plan.seq_length)


def microbatch_seconds(plan: Plan, table: dict[tuple[str, str], float] | None = None,
                       terms: StepTerms | None = None) -> float:
    """Predicted seconds of one microbatch on the slowest pipeline rank (compute and exposed TP / CP / EP / PP
    communication; what :func:`estimate_step` multiplies by microbatches plus the bubble); ``table``: constants in
    place of the fitted ones (a calibration profile's); ``terms``: ``step_terms(plan)`` where the caller has them."""
    gemm, attn, gdn = step_constants(plan, table)
    return (terms or step_terms(plan)).slowest(gemm.value, attn.value, gdn.value)[0]


def with_cp_exchange(terms: StepTerms, plan: Plan) -> StepTerms:
    """``step_terms(plan)`` for a ``plan`` that differs from ``terms.plan`` only in its CP exchange (``cp_comm_type``,
    ``hierarchical_cp_sizes``): the once-per-step terms (overlaps, offload, model FLOPs, bubble) read neither, so only
    the ranks' work is priced again."""
    work = _work(plan)
    return replace(terms, plan=plan, ranks=work, gemm_unit=tuple(w.gemm_flops / terms.peak for w in work))


def step_and_cp_exposed(plan: Plan, terms: StepTerms | None = None) -> tuple[float, float, StepTerms]:
    """(predicted step s, its exposed CP s, the :class:`StepTerms` that priced them) of ``plan`` at the fitted
    constants: what :func:`estimate_step` reports as ``step_seconds`` and ``parts["cp_exposed"]``, without the rest of
    its breakdown (a choice between CP exchanges compares only these; pass the terms of the one it keeps to
    :func:`estimate_step`). ``terms``: ``step_terms(plan)`` where the caller has them."""
    terms = terms or step_terms(plan)
    gemm, attn, gdn = step_constants(plan)
    out = terms.evaluate(gemm.value, attn.value, gdn.value)
    return out[0], terms.micro * out[5], terms


def ep_overlap_steps(plan: Plan, terms: StepTerms | None = None, step: float | None = None) -> tuple[float, float]:
    """(predicted step s of ``plan``, the same with the EP all-to-all overlap off) at the fitted constants: what the
    overlap gains, priced from one set of terms (the overlap changes only how each layer's all-to-all is exposed:
    :meth:`StepTerms._ep_exposed`). Equal when ``plan`` does not overlap it. ``terms``: ``step_terms(plan)`` where
    the caller has them; ``step``: the first of the two, where the caller has it."""
    terms = terms or step_terms(plan)
    gemm, attn, gdn = step_constants(plan)
    on = terms.evaluate(gemm.value, attn.value, gdn.value)[0] if step is None else step
    if not terms.ep_on:
        return on, on
    return on, replace(terms, ep_on=False, delay_wgrad=False).evaluate(gemm.value, attn.value, gdn.value)[0]


def tp_overlap_steps(plan: Plan, terms: StepTerms | None = None, step: float | None = None) -> tuple[float, float]:
    """(predicted step s of ``plan``, the same with ``tp_comm_overlap`` off) at the fitted constants, from one set of
    terms (the overlap changes only how each layer's TP traffic is exposed: :meth:`StepTerms.tp_exposed`). Equal
    when ``plan`` does not overlap it. ``terms``, ``step``: as :func:`ep_overlap_steps` takes them."""
    terms = terms or step_terms(plan)
    gemm, attn, gdn = step_constants(plan)
    on = terms.evaluate(gemm.value, attn.value, gdn.value)[0] if step is None else step
    if not terms.tp_on:
        return on, on
    return on, replace(terms, tp_on=False).evaluate(gemm.value, attn.value, gdn.value)[0]


def estimate_step(plan: Plan, efficiencies: dict[tuple[str, str], float] | None = None,
                  terms: StepTerms | None = None) -> StepEstimate:
    """Predicted step of ``plan`` (see the module doc for every assumption); ``efficiencies`` replaces the fitted
    constants (:data:`lcmoe_recipes.cost.efficiency.FITTED`: the fit and a user's calibration profile); ``terms``:
    ``step_terms(plan)`` where the caller already has them."""
    lay, hw = plan.layout, plan.hardware_spec
    terms = terms or step_terms(plan)
    gemm_c, attn_c, gdn_c = step_constants(plan, efficiencies)
    step, t_mb, w, gemm, attn, cp, ep, exposed_dp, unpaired = terms.evaluate(gemm_c.value, attn_c.value,
                                                                              gdn_c.value)
    micro, bubble = terms.micro, terms.bubble
    tflops = terms.flops / step / lay.world / 1e12
    parts = {"gemm": micro * gemm, "attention": micro * attn, "elementwise": micro * w.elementwise_seconds,
             "memory_bound": micro * w.common_seconds, "fp8_quantize": micro * w.quantize_seconds,
             "tp_exposed": micro * terms.tp_exposed(w, gemm_c.value),
             "cp_exposed": micro * cp, "ep_exposed": micro * ep + unpaired, "pp_exposed": micro * w.pp_seconds,
             "bubble": bubble * t_mb, "dp_exposed": exposed_dp,
             "optimizer_offload": terms.offload}
    comm = {k: v * micro for k, v in w.bytes_by}
    for t in _dp_transfers(plan, w.rank):
        comm[t.kind] = t.nvlink_bytes + t.scaleout_bytes
    return StepEstimate(step, plan.global_batch_size * plan.seq_length / step / lay.world, tflops,
                        tflops / hw.peak(plan.precision), t_mb, parts, comm,
                        _overlaps(plan, terms, w, t_mb, parts, attn_c.value))


def _overlaps(plan: Plan, terms: StepTerms, w: _RankWork, t_mb: float, parts: dict[str, float],
              attn_scale: float) -> tuple[Overlap, ...]:
    """Each communication of the slowest rank per step, overlapped or not (cost.overlap)."""
    lay, micro, out = plan.layout, terms.micro, []
    if w.ep_seconds:
        on, delayed, why = ep_overlap(plan)
        out.append(Overlap("EP all-to-all", on, why, micro * w.ep_seconds, parts["ep_exposed"]))
    if w.tp_seconds:
        on, why = tp_overlap(plan)
        out.append(Overlap("TP", on, why, micro * w.tp_seconds, parts["tp_exposed"]))
    ring = sum(n * c for _, c, n in w.attention)
    if lay.cp > 1:
        kind = plan.cp_comm_type
        why = ("ring steps behind the attention they feed" if kind in ("p2p", "a2a+p2p") else
               f"cp_comm_type {kind}: the exchange precedes the attention")
        out.append(Overlap("CP", kind in ("p2p", "a2a+p2p"), why, micro * (ring + w.exposed_cp_seconds),
                           parts["cp_exposed"]))
    if lay.pp > 1:
        vpp = (lay.vpp or 1) > 1
        why = "overlap_p2p_comm (VPP > 1)" if vpp else "batch_p2p_comm without VPP: not overlapped"
        out.append(Overlap("PP send/receive", vpp, why, micro * w.pp_transfer_seconds, parts["pp_exposed"]))
    rs, ag, dp_exp = terms.dp_exposed(w.rank, t_mb)
    if rs or ag:
        on, why = dp_overlap(plan)
        out.append(Overlap("DP/EDP reduce-scatter + all-gather", on, why, rs + ag, dp_exp))
    return tuple(out)


@dataclass(frozen=True)
class Waits:
    """The longest times a rank of ``plan`` blocks in one communication call, predicted (s).

    Attributes:
        collective: (kind, seconds) of the longest single collective: an upper bound -- a decoder layer's whole
            forward + backward traffic of one kind for one microbatch (TP, CP, EP), a microbatch's pipeline transfer
            (PP), or a step's whole gradient reduce-scatter plus parameter all-gather (DP, EDP), as if each were one
            call (:mod:`lcmoe_recipes.cost.comm`).
        pipeline: the first pipeline stage's wait for its first gradient: after its warm-up forwards it receives
            nothing until that microbatch's backward has passed the PP - 1 later stages, (PP - 1) / VPP backward
            times of the slowest stage, a backward being 2/3 of a microbatch's time (twice the forward's FLOPs, the
            3x convention above). The longest single pipeline wait: the last stage waits (PP - 1) / VPP forwards
            for its first activation, and the whole bubble, (PP - 1) / VPP microbatch times, is spread over both.
        dispatch: (backend, seconds) of one MoE dispatch or combine (a quarter of a layer's forward + backward EP
            traffic), or None without EP.
    """

    collective: tuple[str, float]
    pipeline: float
    dispatch: tuple[str, float] | None

    @property
    def longest(self) -> tuple[str, float]:
        """(what, seconds) of the longest wait of all."""
        return max([self.collective, ("pipeline wait", self.pipeline)], key=lambda kv: kv[1])


def longest_waits(plan: Plan) -> Waits:
    """The :class:`Waits` of ``plan`` (same model and constants as :func:`estimate_step`)."""
    lay = plan.layout
    gemm, attn, gdn = step_constants(plan)
    t_mb, w = step_terms(plan).slowest(gemm.value, attn.value, gdn.value)[:2]  # the slowest rank's microbatch
    transfers = [t for r in range(lay.pp) for _, i, _ in rank_kinds(plan, r) for t in layer_transfers(plan, i)]
    transfers.append(pipeline_transfer(plan))
    transfers += _dp_transfers(plan, w.rank)
    longest = max(transfers, key=lambda t: t.seconds)
    ep = [t.seconds / 4 for t in transfers if t.kind == "EP"]
    backend = plan.moe_flex_dispatcher_backend or plan.moe_token_dispatcher_type
    return Waits((longest.kind, longest.seconds), (lay.pp - 1) / (lay.vpp or 1) * BACKWARD_SHARE * t_mb,
                 (backend, max(ep)) if ep else None)
