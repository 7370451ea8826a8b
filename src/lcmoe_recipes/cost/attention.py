"""Softmax attention time on one GPU, from the kernel calls megatron-core makes and the kernel's published throughput.

Per decoder layer and microbatch, one rank runs its share of the causal attention as a few fused-attention kernel
calls; their shapes follow from the model's heads and head dims, TP, CP and the CP exchange (Transformer Engine
0.19.2-era ``context_parallel.py``, which megatron-core calls through ``TEDotProductAttention``):

* **no CP**: one causal call over the whole sequence (queries = keys = seq_length);
* **p2p ring** (``cp_comm_type="p2p"``, load-balanced: each rank holds chunks r and 2·CP-1-r of the 2·CP
  chunks; ``AttnFuncWithCPAndKVP2P``): CP steps over a local query block of n = seq_length/CP tokens -- step 0
  is a causal call on the diagonal (n x n), each of the other CP-1 steps a call without mask over half of
  either side (n queries x n/2 keys on the ranks whose kv chunk lies before, n/2 x n after); every step does
  n²/2 query-key pairs, 1/CP of the causal total between them;
* **hierarchical** (``a2a+p2p``, inner all-to-all of ``a`` ranks, then a ring of CP/a): heads / a, and the ring
  above over chunks of seq_length·a/CP;
* **all-to-all** (``a2a``, Ulysses): heads / CP, one causal call over the whole sequence;
* **all-gather** (``all_gather``): the rank's two query chunks (n/2 each) against the keys before them, without
  a mask but for their diagonal: priced as calls of n queries over seq_length/2 keys, 1/CP of the pairs.

Heads: the rank's query heads (nq / TP, / CP or / a as above); GQA shares each key/value head over nq/nkv query
heads and the kernel does the same work per query head, so FLOPs count query heads. FLOPs per call, as the kernel
benchmarks count them: forward 2·heads·(d_qk + d_v)·pairs, backward 2.5 x forward; its time is FLOPs over the
published TFLOP/s of the kernel at that call's shape (:func:`lcmoe_recipes.catalog.kernels.attention_tflops`:
forward by its keys per query, backward by its queries per key). A sliding window caps the keys a query sees and
the loop length at the window. Recomputing the attention (``core_attn``, full recompute) runs the forward calls
again.

**Which kernel** (:func:`select_backend`): Transformer Engine picks one of three backends per call, by its own rules
(``transformer_engine/pytorch/attention/dot_product_attention/utils.py`` ``get_attention_backend`` and, for the
cuDNN kernel's support, ``transformer_engine/common/fused_attn/fused_attn.cpp`` ``nvte_get_fused_attn_backend``;
read at TransformerEngine 2.20.0.dev0, commit d0067d0): FlashAttention, cuDNN FusedAttention, or the unfused
PyTorch path (``UnfusedDotProductAttention``). The rules that apply to a training step of our models, in TE's
order, are those of :func:`select_backend`; where both flash and fused are allowed on SM >= 90, TE prefers fused
("for performance reasons"). Prices:

* **FusedAttention** and **FlashAttention**: the published cuDNN throughput at each call's shape
  (:mod:`lcmoe_recipes.catalog.kernels`). FlashAttention (3 on SM90, 4 on SM100, 2 elsewhere, whichever the
  container installed) has no table of its own here: it is priced at the cuDNN table and the explanation says so;
* **UnfusedDotProductAttention**: batched GEMMs over the whole q x k score matrix (no causal or window skipping: a
  window becomes an "arbitrary" mask) and the element-wise passes over it, each op at the roofline of the GPU's
  dense BF16 peak and HBM bandwidth (:func:`_unfused_seconds`);
* a sliding window in the fused kernel: the kernel walks key tiles of :data:`KEY_TILE` tokens, so a query tile
  touches ceil(window / tile) + 1 of them: the work done is that many tiles, the useful work the window (the
  masked part of the edge tiles is computed and discarded).

What this leaves out, stated: occupancy (the benchmark had >= 2,048 thread blocks per call; a call with fewer than
the GPU's SMs would run slower than priced), the per-call launch latency, and the ring's own bookkeeping (the
partial softmax merge): the fitted per-GPU scale (the ``(gpu, "attention")`` constant of :data:`lcmoe_recipes.cost.efficiency.FITTED`) absorbs what
they cost on the measured rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ..catalog import get_hardware
from ..catalog.kernels import attention_tflops
from ..catalog.models import SLIDING
from .comm import cp_groups
from .shapes import LayerShapes

BACKWARD_FLOPS = 2.5  # backward / forward FLOPs of flash attention (five matmuls to two)
KEY_TILE = 128  # key tokens per tile of the fused kernels (FlashAttention-3 / cuDNN SM90 forward: 128 x 128 tiles)

FUSED, FLASH, UNFUSED = "FusedAttention", "FlashAttention", "UnfusedDotProductAttention"
TE_SOURCE = ("TransformerEngine 2.20.0.dev0 (d0067d0) transformer_engine/pytorch/attention/dot_product_attention/"
             "utils.py get_attention_backend; transformer_engine/common/fused_attn/fused_attn.cpp "
             "nvte_get_fused_attn_backend")


@dataclass(frozen=True)
class Backend:
    """The attention backend Transformer Engine selects for one layer, and why.

    Attributes:
        name: :data:`FUSED`, :data:`FLASH` or :data:`UNFUSED`.
        why: the rules that decided, in the order TE applies them (each a short sentence).
        cudnn: the cuDNN version (major, minor, patch) the rules were read at.
    """

    name: str
    why: tuple[str, ...]
    cudnn: tuple[int, int, int]

    def describe(self) -> str:
        """``FusedAttention (cuDNN 9.21.1): ...`` -- the backend and its reasons, one line."""
        return f"{self.name} (cuDNN {'.'.join(map(str, self.cudnn))}): {'; '.join(self.why)}"


@lru_cache(maxsize=1)
def target_cudnn() -> tuple[tuple[int, int, int], str]:
    """(cuDNN version, image) the step model assumes a run gets: the newest container of
    ``catalog/containers.yaml`` that states its cuDNN (newer images are listed without it)."""
    from ..catalog.known_issues import containers

    for c in containers()[0]:
        version = c.image_stack.get("cudnn")
        if version:
            parts = [int(x) for x in version.split(".")[:3]]
            return tuple((parts + [0, 0, 0])[:3]), c.image  # type: ignore[return-value]
    raise ValueError("containers.yaml lists no image with a cuDNN version: the attention backend cannot be chosen")


def _fused_supported(s: LayerShapes, cc: tuple[int, int], window: bool, sinks: bool, thd: bool,
                     cudnn: tuple[int, int, int]) -> str | None:
    """Why cuDNN's BF16 fused attention (``NVTE_F16_arbitrary_seqlen``) cannot run this training call, or None
    (``nvte_get_fused_attn_backend``: the clauses that can fail for a causal self-attention without bias or
    dropout)."""
    sm = 10 * cc[0] + cc[1]
    v = cudnn
    dqk, dv = s.d_qk, s.d_v
    if sm >= 100 and v < (9, 7, 0):
        return f"cuDNN {v[0]}.{v[1]} < 9.7 has no SM100 fused attention"
    dims_ok = ((dqk <= 128 and dv <= 128)
               or (dqk <= 256 and dv <= 256 and sm == 90 and v >= (9, 5, 0))
               or (dqk == 192 and dv == 128 and sm >= 100 and v >= (9, 11, 0))
               or (dqk == dv == 256 and 100 <= sm < 110 and not sinks
                   and v >= ((9, 25, 0) if thd else (9, 23, 0))))
    if not dims_ok:
        return (f"head dims {dqk}/{dv} are not supported for training on sm{sm} with cuDNN "
                f"{v[0]}.{v[1]} (d = 256 on SM100 needs cuDNN 9.23)")
    if (v >= (9, 11, 0) and sm == 90 and dqk >= 128 and dv >= 128 and (dqk, dv) != (192, 128) and dqk != dv):
        return f"head dims {dqk}/{dv}: cuDNN >= 9.11's Hopper MLA backward bug (only 192/128 is allowed)"
    if v[:2] == (9, 10) and v[2] <= 1:
        return "cuDNN 9.10.0/9.10.1: known fused-attention bugs"
    if sinks and v < (9, 13, 1):
        return f"learnable softmax (sinks) needs cuDNN >= 9.13.1, the image has {'.'.join(map(str, v))}"
    if window and v < (9, 2, 0):
        return "a sliding window needs cuDNN >= 9.2"
    if thd and not (sm >= 90 and (v >= (9, 6, 0) or (v >= (9, 1, 0) and s.nq == s.nkv))):
        return "THD (packed) sequences need SM90+ and cuDNN 9.6 (9.1 without GQA)"
    return None


def select_backend(s: LayerShapes, layer: int, cc: tuple[int, int], cp: int, cp_comm_type: str | None,
                   thd: bool = False, fp8_dpa: str | None = None,
                   cudnn: tuple[int, int, int] | None = None) -> Backend:
    """The backend TE 2.x selects for the softmax attention of decoder layer ``layer`` in training (module doc).

    Args:
        cc: the GPU's compute capability.
        cp, cp_comm_type: context parallelism (the comm type matters only with ``cp > 1``).
        thd: packed variable-length sequences (``qkv_format="thd"``: the plan's ``variable_length``).
        fp8_dpa: the FP8 recipe of FP8 attention (``fp8_dot_product_attention``: "fp8_cs", "mxfp8",
            "fp8_blockwise", "delayed"), or None for BF16 attention -- megatron-bridge 0.6.2's default, which our
            recipes keep.
        cudnn: the container's cuDNN; None: :func:`target_cudnn`.

    Raises:
        ValueError: no backend supports the call (TE raises too); the message names the rules.
    """
    v = cudnn or target_cudnn()[0]
    sinks = s.sinks
    window = s.kind(layer) == SLIDING and s.window > 0
    sm = 10 * cc[0] + cc[1]
    flash, fused, unfused, why = True, True, True, []
    if fp8_dpa:  # "Filter: FP8": TE's FP8 attention rules for training
        flash = False
        why.append("FlashAttention off: FP8 attention in training (FA3 runs FP8 only for inference)")
        unfused = False
        if fp8_dpa == "fp8_cs" and (sm < 100 or v < (9, 14, 0)):
            fused = False
            why.append("FusedAttention off: FP8 current scaling needs SM100 and cuDNN 9.14")
        elif fp8_dpa == "mxfp8" and (sm < 100 or v < (9, 21, 0) or v[:2] == (9, 23) or thd):
            fused = False
            why.append("FusedAttention off: MXFP8 attention needs SM100, cuDNN 9.21 (not 9.23.0/1) and no THD")
        elif fp8_dpa == "fp8_blockwise":
            fused = False
            why.append("FusedAttention off: no FP8 block-scaling attention kernel")
    if sinks:  # "Filter: Softmax type"
        flash = False
        why.append("FlashAttention off: learnable softmax (gpt-oss sinks) is not vanilla")
        if thd and v < (9, 18, 0):
            fused = False
            why.append("FusedAttention off: sinks with THD need cuDNN >= 9.18")
        if cp > 1 and cp_comm_type != "a2a":
            fused = False
            why.append(f"FusedAttention off: sinks with CP need cp_comm_type a2a (is {cp_comm_type})")
    if cp > 1:  # "Filter: Context parallelism"
        if unfused:
            unfused = False
            why.append(f"unfused off: it does not support context parallelism (CP={cp})")
        if fused and window and cp_comm_type in ("p2p", "a2a+p2p"):
            fused = False
            why.append(f"FusedAttention off: sliding window with cp_comm_type {cp_comm_type}")
        elif fused and cp_comm_type in ("a2a", "a2a+p2p") and (s.nq % 2 or s.nkv % 2):
            fused = False
            why.append("FusedAttention off: a2a CP needs even head counts")
    if fused:
        reason = _fused_supported(s, cc, window, sinks, thd, v)
        if reason:
            fused = False
            why.append(f"FusedAttention off: {reason}")
    if flash and fused and sm >= 90:
        return Backend(FUSED, (*why, "FusedAttention preferred over FlashAttention on Hopper+ (TE: for "
                                      "performance)"), v)
    if fused:
        return Backend(FUSED, (*why, "FusedAttention: the only fused kernel allowed"), v)
    if flash:
        which = {90: "3"}.get(sm, "4" if sm >= 100 else "2")
        return Backend(FLASH, (*why, f"FlashAttention ({which} where the image installs it, else 2): priced at "
                                     "the cuDNN table (no FlashAttention table is catalogued)"), v)
    if unfused:
        return Backend(UNFUSED, (*why, "UnfusedDotProductAttention: the score matrix in HBM"), v)
    raise ValueError(f"no attention backend of Transformer Engine supports layer {layer}: {'; '.join(why)}; "
                     "change cp_comm_type (a2a), the FP8 attention recipe, or the container")


def _calls(seq: int, cp: int, comm: str | None, ring: int, window: int) -> tuple[tuple[bool, float, float, float], ...]:
    """(causal, forward loop length, backward loop length, share of one sequence's query-key pairs) of each kernel
    call one rank makes for one head group (module doc); a sliding window caps both lengths."""
    if window:  # each query sees at most `window` keys: the kernel loops over at most that many
        share = 1.0 if cp == 1 or comm == "a2a" else 1 / cp
        return ((True, float(min(window, seq)), float(min(window, seq)), share),)
    if cp == 1 or comm == "a2a":
        return ((True, float(seq), float(seq), 1.0),)
    if comm == "all_gather":
        return ((False, seq / 2, seq / cp, 1 / cp),)
    if ring == 1:
        return ((True, float(seq), float(seq), 1.0),)
    n, step = seq / ring, 1 / ring**2  # every ring step does n²/2 of the seq²/2 pairs
    half = (ring - 1) / 2  # steps whose kv chunk lies before (n x n/2) and after (n/2 x n), averaged over the ranks
    return ((True, n, n, step), (False, n / 2, n, half * step), (False, n, n / 2, half * step))


@lru_cache(maxsize=65536)
def _seconds(hw_key: str, head_dim: float, width: float, pairs: float, calls: tuple, forward_runs: int
             ) -> tuple[float, float]:
    """(seconds at the published throughput, forward FLOPs) of ``calls`` for ``width`` = heads·(d_qk+d_v) and
    ``pairs`` query-key pairs per head in the whole causal sequence; the forward runs ``forward_runs`` times (2 with
    attention recompute)."""
    seconds = flops_total = 0.0
    for causal, fwd_len, bwd_len, share in calls:
        fwd = 2 * width * pairs * share
        seconds += forward_runs * fwd / (attention_tflops(hw_key, False, causal, head_dim, fwd_len) * 1e12)
        seconds += BACKWARD_FLOPS * fwd / (attention_tflops(hw_key, True, causal, head_dim, bwd_len) * 1e12)
        flops_total += fwd
    return seconds, flops_total


# Bytes per score element each pass of the unfused path moves through HBM (BF16, 2 bytes per read or write), read
# from TE's UnfusedDotProductAttention.forward (backends.py) and the autograd of its ops:
# forward: QK^T writes S (2), the fused scale-mask-softmax reads S and writes P (4), PV reads P (2);
# backward: dP = dO V^T writes (2), dV = P^T dO reads P (2), the softmax backward reads P and dP and writes dS (6),
# dQ = dS K and dK = dS^T Q read dS (4).
UNFUSED_BYTES = {"qk": 2, "softmax": 4, "pv": 2, "dp": 2, "dv": 2, "softmax_bwd": 6, "dq": 2, "dk": 2}
# learnable sinks (and any window, which becomes an "arbitrary" mask): the concat of the sink column (4), the masked
# fill with its boolean mask (5) and the slice copy after the softmax (4), and their gradients (8)
UNFUSED_SINK_BYTES = 21


def _unfused_seconds(hw_key: str, heads: float, queries: float, keys: float, d_qk: int, d_v: int, masked: bool,
                     forward_runs: int) -> float:
    """Seconds of the unfused path for ``heads`` heads of ``queries`` x ``keys`` scores (one sample): each op at
    the roofline max(FLOPs / dense BF16 peak, bytes / HBM bandwidth) of the GPU; the forward ops run
    ``forward_runs`` times."""
    hw = get_hardware(hw_key)
    peak, bw = hw.peak("bf16") * 1e12, hw.hbm_gbps * 1e9
    e = heads * queries * keys  # score elements
    flops = {"qk": 2 * d_qk, "pv": 2 * d_v, "dp": 2 * d_v, "dv": 2 * d_v, "dq": 2 * d_qk, "dk": 2 * d_qk}
    forward, total = ("qk", "softmax", "pv"), 0.0
    for op, b in UNFUSED_BYTES.items():
        t = max(flops.get(op, 0) * e / peak, b * e / bw)
        total += t * (forward_runs if op in forward else 1)
    if masked:
        total += UNFUSED_SINK_BYTES * e / bw
    return total


@lru_cache(maxsize=16384)  # a pure function of its arguments: layouts that differ outside TP, CP and MBS share it
def layer_attention_seconds(s: LayerShapes, layer: int, hw_key: str, seq_length: int, micro_batch_size: int, tp: int,
                            cp: int, cp_comm_type: str | None, hierarchical_cp_sizes: tuple[int, ...] | None,
                            recompute: bool, thd: bool = False, cudnn: tuple[int, int, int] | None = None) -> float:
    """Seconds one rank spends in softmax attention kernels for one microbatch of decoder layer ``layer``
    (forward + backward, plus the forward again when ``recompute``), for the backend TE selects
    (:func:`select_backend`; ``thd``: packed sequences, ``cudnn``: the container's, default :func:`target_cudnn`)
    at its price (module doc; the per-GPU fitted scale is applied by the caller). Gated-DeltaNet layers: 0 (priced
    by their scan).

    Raises:
        ValueError: no TE backend supports the layer (:func:`select_backend`)."""
    if not s.is_softmax(layer):
        return 0.0
    backend = select_backend(s, layer, get_hardware(hw_key).compute_capability, cp, cp_comm_type, thd, None, cudnn)
    if backend.name == UNFUSED:  # TE runs it without CP only (select_backend): the whole sequence, heads / TP
        masked = s.sinks or (s.kind(layer) == SLIDING and 0 < s.window < seq_length)
        return micro_batch_size * _unfused_seconds(hw_key, s.nq / tp, seq_length, seq_length, s.d_qk, s.d_v,
                                                   masked, 2 if recompute else 1)
    inner, ring = cp_groups(cp_comm_type, hierarchical_cp_sizes, cp)  # hierarchical CP: (inner all-to-all, ring)
    heads = s.nq / tp / (cp if cp > 1 and cp_comm_type == "a2a" else inner)
    window = s.window if s.kind(layer) == SLIDING and s.window < seq_length else 0
    calls = _calls(seq_length, cp, cp_comm_type if cp > 1 else None, ring, window)
    pairs = seq_length * s.layer_keys_seen(layer, seq_length)  # causal (and windowed) query-key pairs per head
    seconds, _ = _seconds(hw_key, (s.d_qk + s.d_v) / 2, heads * (s.d_qk + s.d_v), pairs, calls,
                          2 if recompute else 1)
    return micro_batch_size * seconds * (window_waste(window) if window else 1.0)


def window_waste(window: int) -> float:
    """Work the fused kernel does over the useful work for a sliding window of ``window`` keys: a query tile
    touches ceil(window / :data:`KEY_TILE`) + 1 key tiles (module doc)."""
    return (math.ceil(window / KEY_TILE) + 1) * KEY_TILE / window


def attention_backends(plan) -> tuple[tuple[str, Backend], ...]:
    """(attention kind, :class:`Backend`) of each softmax-attention kind of ``plan``'s model ("mla", "full",
    "sliding"), in layer order, as the step model prices them (BF16 attention, the target image's cuDNN)."""
    from .shapes import shapes

    s = shapes(plan.model_spec)
    cc = plan.hardware_spec.compute_capability
    out: dict[str, Backend] = {}
    for i in range(s.num_layers):
        if s.is_softmax(i) and s.kind(i) not in out:
            out[s.kind(i)] = select_backend(s, i, cc, plan.layout.cp, plan.cp_comm_type, plan.variable_length)
    return tuple(out.items())
