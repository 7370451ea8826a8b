"""Bytes each GPU sends per collective, and the link that carries them.

Notation: n = MBS·seq_length/CP tokens of one microbatch on a rank; h hidden size; activations bf16 (2 bytes);
G the group size. A ring all-gather or reduce-scatter of a tensor of S bytes (the *full*, gathered size) makes each
GPU send (G-1)/G·S bytes; an all-reduce 2·(G-1)/G·S; an all-to-all of S bytes held per GPU sends (G-1)/G·S.
(The formulas that circulate in tutorials drop the bytes per element or the (G-1)/G factor in places; every count
here is in bytes, per GPU, per microbatch unless marked per step. tests/test_comm_step.py checks them by hand.)

Per layer and microbatch, forward + backward:

* **TP** with sequence parallel: an all-gather before and a reduce-scatter after each TP-split block (attention;
  dense MLP or shared experts), mirrored in backward: 4 per block, S = n·h·2. (Without SP the same volume moves as
  all-reduces.) Routed experts with ETP = 1 take their tokens from the sequence shard: no TP traffic.
* **CP**: ring (``cp_comm_type="p2p"``, Megatron's default): each of CP-1 steps passes this rank's K and V,
  n·(K+V width)·2/TP bytes, forward; backward passes K, V and dK, dV: 3·(CP-1)·kv in all. K+V width is 2·nkv·d for
  GQA and nq·(d_qk+d_v) for MLA (up-projected per head). ``a2a`` (sequence <-> heads): q, k, v in and the output
  back, forward and backward, 2·(CP-1)/CP of them; ``all_gather``: K and V gathered forward, their gradients
  reduce-scattered backward, 2·(CP-1)·kv. Gated DeltaNet layers always use all-to-all: q,k,v,gate in and the output
  back, forward and backward.
* **EP**: dispatch and combine each move the n/TP local tokens' k copies, n/TP·k·h·2 bytes, of which (EP-1)/EP
  leave the GPU (uniform routing), forward and backward: 4 transfers. With the alltoall dispatcher (NCCL) every copy
  bound for another NVLink block crosses the scale-out network. The flex dispatcher's backends send a token once
  per destination block and fan it out to that block's experts over NVLink (DeepEP's internode kernels: "RDMA
  then NVLink forwarding", ``deep_ep/buffer.py`` ``internode_dispatch``; HybridEP likewise per NVLink domain):
  over scale-out go E[remote blocks a token's k experts fall in] copies, uniform routing over the experts --
  (B - 1)·(1 - C(E - E_b, k) / C(E, k)) for B blocks of E_b experts -- and the other copies over NVLink.
* **PP**: each model chunk sends its output activation (n/TP·h·2 with SP) forward and receives a gradient of the
  same size backward: 2 per chunk per microbatch.

Per step: **DP** (dense, over the DP·CP group that shards the distributed optimizer) and **EDP** (experts):
gradient reduce-scatter (grad dtype) and parameter all-gather (bf16) of this rank's parameters.

Link: a group whose ranks sit in one NVLink block (:attr:`Hardware.job_block`) uses NVLink
(:attr:`Hardware.nvlink_gbps`); otherwise the transfer is limited by the per-GPU scale-out NIC
(:attr:`Hardware.scaleout_gbps`) -- for EP, only the share of peers outside the block goes over it. A CP ring is the
exception: only the ranks at block boundaries send across, one flow per boundary, which NCCL spreads over every
NIC of the node (PXN): min(NVLink, gpus_per_node x NIC) for that flow. (Held to 2 NICs -- NCCL's default
NCCL_NCHANNELS_PER_NET_PEER -- the model predicts DSV3 at 64K-256K on H100 at 0.67-0.77 of its published
throughput, which stays flat from 4K to 256K: the measurements say the ring is hidden.)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..catalog import get_hardware
from ..core.layout import ParallelLayout
from ..core.plan import Plan
from ..core.ranks import max_inside_own_block, max_span, ring_exits
from .shapes import shapes

BF16 = 2


def cp_groups(cp_comm_type: str | None, hierarchical_cp_sizes: tuple[int, ...] | None, cp: int) -> tuple[int, int]:
    """(inner all-to-all size, ring size) of a CP exchange: megatron-core's ``hierarchical_context_parallel_sizes``
    under ``a2a+p2p``, else (1, CP) -- the ring the p2p exchange runs (other exchanges run no ring)."""
    return tuple(hierarchical_cp_sizes) if cp_comm_type == "a2a+p2p" and hierarchical_cp_sizes else (1, cp)


@dataclass(frozen=True)
class Transfer:
    """One collective's traffic: bytes per GPU over NVLink and over scale-out, and the time they take (s)."""

    kind: str
    nvlink_bytes: float
    scaleout_bytes: float
    seconds: float


def _link_time(hw, nvlink_bytes: float, scaleout_bytes: float) -> float:
    # both links work at once (DeepEP/HybridEP, hierarchical NCCL): the slower one sets the time
    return max(nvlink_bytes / (hw.nvlink_gbps * 1e9), scaleout_bytes / (hw.scaleout_gbps * 1e9))


def _on_nvlink(layout: ParallelLayout, grid: str, token: str, block: int) -> bool:
    return max_span(layout, grid, token, block) == 1


@dataclass(frozen=True)
class Links:
    """Where each group of a layout sits (computed once per layout and GPU type)."""

    tp_nvlink: bool
    cp_nvlink: bool
    cp_ring_rate: float   # bytes/s of a CP ring step that crosses blocks (PXN over the node's NICs)
    ep_far: float         # share of a rank's EP peers outside its NVLink block
    ep_inside: int        # EP ranks inside one NVLink block (of the rank's own group)
    pp_nvlink: bool
    dp_nvlink: bool
    edp_nvlink: bool


@lru_cache(maxsize=256)
def links(layout: ParallelLayout, hw_key: str) -> Links:
    """The :class:`Links` of ``layout`` on GPU type ``hw_key`` (megatron-core rank order, :mod:`lcmoe_recipes.core.ranks`)."""
    hw = get_hardware(hw_key)
    block = hw.job_block
    senders = ring_exits(layout, "cp", block)  # CP ring flows leaving the first block
    inside = max_inside_own_block(layout, "expert", "ep", block)
    return Links(
        tp_nvlink=_on_nvlink(layout, "dense", "tp", block), cp_nvlink=_on_nvlink(layout, "dense", "cp", block),
        cp_ring_rate=min(hw.nvlink_gbps, hw.scaleout_gbps * hw.gpus_per_node / max(senders, 1)) * 1e9,
        ep_far=(layout.ep - inside) / max(layout.ep - 1, 1), ep_inside=inside,
        pp_nvlink=_on_nvlink(layout, "dense", "pp", block),
        dp_nvlink=_on_nvlink(layout, "dense", "dp-cp", block),
        edp_nvlink=_on_nvlink(layout, "expert", "dp", block))


def _transfer(kind: str, hw, total: float, nvlink: bool) -> Transfer:
    nv, so = (total, 0.0) if nvlink else (0.0, total)
    return Transfer(kind, nv, so, _link_time(hw, nv, so))


def layer_transfers(plan: Plan, layer: int) -> list[Transfer]:
    """TP, CP and EP traffic of decoder layer ``layer`` for one microbatch (forward + backward)."""
    s, lay, hw = shapes(plan.model_spec), plan.layout, plan.hardware_spec
    where = links(lay, hw.key)
    n = plan.micro_batch_size * plan.seq_length / lay.cp
    tp, cp, ep = lay.tp, lay.cp, lay.ep
    out = []
    if tp > 1:
        blocks = 1 + (0 if s.is_moe(layer) and not s.f_shared else 1)  # attention; dense MLP or shared experts
        total = 4 * blocks * (tp - 1) / tp * n * s.h * BF16
        out.append(_transfer("TP", hw, total, where.tp_nvlink))
    if cp > 1:
        if s.is_softmax(layer) and plan.cp_comm_type == "a2a":
            # all-to-all (sequence <-> heads) of q, k, v in and the output back, forward and backward
            width = s.nq * (2 * s.d_qk + s.d_v) if s.mla else (s.nq + 2 * s.nkv) * s.d_qk + s.nq * s.d_v
            total = 2 * (cp - 1) / cp * n * width * BF16 / tp
            out.append(_transfer("CP", hw, total, where.cp_nvlink))
        elif s.is_softmax(layer) and plan.cp_comm_type == "all_gather":
            # K and V all-gathered forward, their gradients reduce-scattered backward
            width = s.nq * (s.d_qk + s.d_v) if s.mla else 2 * s.nkv * s.d_qk
            total = 2 * (cp - 1) * n * width * BF16 / tp
            out.append(_transfer("CP", hw, total, where.cp_nvlink))
        elif s.is_softmax(layer):
            width = s.nq * (s.d_qk + s.d_v) if s.mla else 2 * s.nkv * s.d_qk
            inner, ring = cp_groups(plan.cp_comm_type, plan.hierarchical_cp_sizes, cp)
            if inner > 1:
                # hierarchical (megatron-core cp_comm_type "a2a+p2p"): an all-to-all inside groups of `inner`
                # consecutive CP ranks swaps sequence for heads (q, k, v in, the output back; dq, dk, dv and the
                # output's gradient in backward), exposed; then a ring over the ring = CP/inner groups
                qkvo = (2 * s.nq * s.d_qk + 2 * s.nq * s.d_v) if s.mla else (2 * s.nq + 2 * s.nkv) * s.d_qk
                out.append(_transfer("CP-a2a", hw, 2 * (inner - 1) / inner * n * qkvo * BF16 / tp, True))
            total = 3 * (ring - 1) * n * width * BF16 / tp
            if ring == 1:
                pass
            elif where.cp_nvlink:
                out.append(_transfer("CP", hw, total, True))
            else:
                # A ring crosses a block boundary at one rank per block per step; NCCL sends that flow through all
                # the node's NICs (PXN), so it gets min(NVLink, gpus_per_node x NIC) bandwidth.
                out.append(Transfer("CP", 0.0, total, total / where.cp_ring_rate))
        else:  # gated DeltaNet: all-to-all of q, k, v, gate in and the output back, forward and backward
            width = 2 * s.lin_nk * s.lin_dk + 2 * s.lin_nv * s.lin_dv + s.lin_nv * s.lin_dv
            total = 2 * (cp - 1) / cp * n * width * BF16 / tp
            out.append(_transfer("CP", hw, total, where.cp_nvlink))
    if ep > 1 and s.is_moe(layer):
        local = n / tp if plan.sequence_parallel or tp == 1 else n
        copies = s.topk * (ep - 1) / ep  # copies per token leaving the GPU
        far = copies * where.ep_far
        if plan.moe_token_dispatcher_type == "flex" and where.ep_far > 0:
            far = remote_blocks(s.num_experts, s.topk, ep // max(where.ep_inside, 1))
        nv, so = 4 * local * s.h * BF16 * (copies - far), 4 * local * s.h * BF16 * far
        out.append(Transfer("EP", nv, so, _link_time(hw, nv, so)))
    return out


@lru_cache(maxsize=1024)
def remote_blocks(experts: int, topk: int, blocks: int) -> float:
    """Expected number of other NVLink blocks a token's ``topk`` experts fall in, routing uniform over ``experts``
    spread evenly over ``blocks`` blocks: (B - 1)·(1 - C(E - E/B, k) / C(E, k))."""
    if blocks <= 1:
        return 0.0
    from math import comb

    return (blocks - 1) * (1 - comb(experts - experts // blocks, topk) / comb(experts, topk))


def pipeline_transfer(plan: Plan) -> Transfer:
    """PP point-to-point traffic of one microbatch on one rank (all its chunks, forward + backward)."""
    s, lay, hw = shapes(plan.model_spec), plan.layout, plan.hardware_spec
    if lay.pp == 1:
        return Transfer("PP", 0.0, 0.0, 0.0)
    n = plan.micro_batch_size * plan.seq_length / lay.cp
    local = n / lay.tp if plan.sequence_parallel else n
    total = 2 * (lay.vpp or 1) * local * s.h * BF16
    return _transfer("PP", hw, total, links(lay, hw.key).pp_nvlink)


def data_parallel_transfers(plan: Plan, dense_params: float, expert_params: float) -> list[Transfer]:
    """DP (dense, over DP·CP) and EDP (experts) traffic per step: gradient reduce-scatter + parameter all-gather."""
    lay, hw = plan.layout, plan.hardware_spec
    where = links(lay, hw.key)
    grad = 4 if plan.grad_dtype == "fp32" else 2
    out = []
    g = lay.dp * lay.cp
    if g > 1:
        out.append(_transfer("DP", hw, (g - 1) / g * dense_params * (grad + BF16), where.dp_nvlink))
    if lay.edp > 1:
        out.append(_transfer("EDP", hw, (lay.edp - 1) / lay.edp * expert_params * (grad + BF16), where.edp_nvlink))
    return out


@lru_cache(maxsize=4096)
def rank_layers(stages: tuple[int, ...], pp: int, vpp: int, pp_rank: int) -> tuple[int, ...]:
    """Decoder layers held by pipeline rank ``pp_rank`` (all its chunks) when the PP·VPP chunks hold ``stages``
    decoder layers each (:func:`lcmoe_recipes.core.pipeline.stage_decoder_layers`)."""
    starts = [sum(stages[:i]) for i in range(len(stages))]
    return tuple(i for v in range(vpp) for i in range(starts[pp_rank + v * pp], starts[pp_rank + v * pp] + stages[pp_rank + v * pp]))
