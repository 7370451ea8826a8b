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

What this leaves out, stated: occupancy (the benchmark had >= 2,048 thread blocks per call; a call with fewer than
the GPU's SMs would run slower than priced), the per-call launch latency, and the ring's own bookkeeping (the
partial softmax merge): the fitted per-GPU scale (the ``(gpu, "attention")`` constant of :data:`lcmoe_recipes.cost.efficiency.FITTED`) absorbs what
they cost on the measured rows.
"""

from __future__ import annotations

from functools import lru_cache

from ..catalog.kernels import attention_tflops
from .shapes import LayerShapes

BACKWARD_FLOPS = 2.5  # backward / forward FLOPs of flash attention (five matmuls to two)


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


def layer_attention_seconds(s: LayerShapes, layer: int, hw_key: str, seq_length: int, micro_batch_size: int, tp: int,
                            cp: int, cp_comm_type: str | None, hierarchical_cp_sizes: tuple[int, ...] | None,
                            recompute: bool) -> float:
    """Seconds one rank spends in softmax attention kernels for one microbatch of decoder layer ``layer``
    (forward + backward, plus the forward again when ``recompute``), at the published kernel throughput (the
    per-GPU fitted scale is applied by the caller). Gated-DeltaNet layers: 0 (priced by their scan)."""
    if not s.is_softmax(layer):
        return 0.0
    # hierarchical CP: (inner all-to-all, outer ring) sizes, as lcmoe_recipes.cost.comm reads them
    inner, ring = (hierarchical_cp_sizes if cp_comm_type == "a2a+p2p" and hierarchical_cp_sizes else (1, cp))
    heads = s.nq / tp / (cp if cp > 1 and cp_comm_type == "a2a" else inner)
    window = s.window if s.kind(layer) == "sliding" and s.window < seq_length else 0
    calls = _calls(seq_length, cp, cp_comm_type if cp > 1 else None, ring, window)
    pairs = seq_length * s.layer_keys_seen(layer, seq_length)  # causal (and windowed) query-key pairs per head
    seconds, _ = _seconds(hw_key, (s.d_qk + s.d_v) / 2, heads * (s.d_qk + s.d_v), pairs, calls,
                          2 if recompute else 1)
    return micro_batch_size * seconds
