"""Published attention-kernel throughput per GPU (``kernels.yaml``: the cuDNN fused attention Transformer Engine runs,
with its source), as a function of the call's shape.

:func:`attention_tflops` answers "how many TFLOP/s does the kernel reach for this call on this GPU": forward or
backward, causal or not, head dim, and the length of the call's inner loop (keys for the forward, queries for the
backward: the flash-attention kernels walk one operand tile by tile for each tile of the other, so the work per
launch grows with that length). Between tabulated points it interpolates linearly in log2(length) and in head dim;
outside them it holds the nearest point (longer than the benchmark's 16K: its last value; the curves are flat
there). What the tables lack is derived and stated here:

* backward with a causal mask (the benchmark's backward runs without one): the non-causal backward times the
  forward's causal / non-causal ratio at the same length;
* backward at a head dim above 128 (not benchmarked): the non-causal forward at that head dim times the head-dim-128
  backward / forward ratio at the same length;
* head dims that differ for queries/keys and values (MLA: 192 and 128): the table at their mean, since the kernel's
  two matmuls run over d_qk (QK^T) and d_v (PV).

No torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml


@dataclass(frozen=True)
class KernelTable:
    """One GPU generation's tables: ``forward``, ``forward_causal``, ``backward`` -> head dim -> TFLOP/s per ``seq``."""

    name: str
    gpus: tuple[str, ...]
    source: str
    seq: tuple[int, ...]
    tables: dict[str, dict[int, tuple[float, ...]]]
    factor: dict[str, float]  # GPU key -> multiplier on the tables (1 for measured GPUs)


@lru_cache(maxsize=1)
def kernel_tables() -> dict[str, KernelTable]:
    """GPU key -> its :class:`KernelTable` (``kernels.yaml``)."""
    raw = yaml.safe_load(resources.files(__package__).joinpath("kernels.yaml").read_text(encoding="utf-8"))
    gens = raw["generations"]
    out: dict[str, KernelTable] = {}
    for name, g in gens.items():
        base = gens[g["shape_of"]] if "shape_of" in g else g
        tables = {kind: {int(d): tuple(float(v) for v in vals) for d, vals in base[kind].items()}
                  for kind in ("forward", "forward_causal", "backward")}
        factor = {gpu: 1.0 for gpu in g["gpus"]}
        if "anchor" in g:
            a = g["anchor"]
            measured = tables[a["table"]][a["head_dim"]][list(base["seq"]).index(a["seq"])]
            from .hardware import get_hardware

            factor = {gpu: a["tflops"] / measured * get_hardware(gpu).peak_tflops["bf16"] / a["gpu_peak_bf16"]
                      for gpu in g["gpus"]}
        table = KernelTable(name, tuple(g["gpus"]), " ".join(str(g["source"]).split()), tuple(base["seq"]), tables,
                            factor)
        out.update({gpu: table for gpu in g["gpus"]})
    return out


def kernel_source(hw_key: str) -> str:
    """The published benchmark the attention throughput of GPU ``hw_key`` comes from."""
    return kernel_tables()[hw_key].source


def _along(seq: tuple[int, ...], values: tuple[float, ...], length: float) -> float:
    """``values`` at ``length``: linear in log2(length) between points, the end values outside them."""
    if length <= seq[0]:
        return values[0]
    if length >= seq[-1]:
        return values[-1]
    x = math.log2(length)
    for i in range(len(seq) - 1):
        lo, hi = math.log2(seq[i]), math.log2(seq[i + 1])
        if x <= hi:
            return values[i] + (values[i + 1] - values[i]) * (x - lo) / (hi - lo)
    return values[-1]


def _at(table: KernelTable, kind: str, head_dim: float, length: float) -> float:
    """Table ``kind`` at ``head_dim`` (linear between tabulated dims, clipped) and ``length``."""
    rows = table.tables[kind]
    dims = sorted(rows)
    if head_dim <= dims[0]:
        return _along(table.seq, rows[dims[0]], length)
    if head_dim >= dims[-1]:
        return _along(table.seq, rows[dims[-1]], length)
    for lo, hi in zip(dims, dims[1:]):
        if head_dim <= hi:
            a, b = _along(table.seq, rows[lo], length), _along(table.seq, rows[hi], length)
            return a + (b - a) * (head_dim - lo) / (hi - lo)
    return _along(table.seq, rows[dims[-1]], length)


@lru_cache(maxsize=65536)
def attention_tflops(hw_key: str, backward: bool, causal: bool, head_dim: float, length: float) -> float:
    """Published TFLOP/s of the fused attention kernel on GPU ``hw_key`` for one call.

    Args:
        backward: the backward kernel (else the forward).
        causal: the call applies a causal mask (the diagonal block of a causal sequence).
        head_dim: (d_qk + d_v) / 2.
        length: the call's inner-loop length in tokens -- keys per query tile (forward), queries per key tile
            (backward).

    Raises:
        KeyError: no table for ``hw_key`` (every catalogue GPU has one; ``tests/test_catalog.py`` checks).
    """
    table = kernel_tables()[hw_key]
    fwd = _at(table, "forward_causal" if causal else "forward", head_dim, length)
    if not backward:
        return fwd * table.factor[hw_key]
    bwd_dims = sorted(table.tables["backward"])
    if head_dim <= bwd_dims[-1]:
        bwd = _at(table, "backward", head_dim, length)
    else:
        top = bwd_dims[-1]
        bwd = (_at(table, "forward", head_dim, length) * _at(table, "backward", top, length)
               / _at(table, "forward", top, length))
    if causal:
        bwd *= fwd / _at(table, "forward", head_dim, length)
    return bwd * table.factor[hw_key]


@lru_cache(maxsize=256)
def best_attention_tflops(hw_key: str, head_dim: float) -> float:
    """The highest TFLOP/s the kernel reaches on ``hw_key`` at ``head_dim`` over every tabulated shape, forward or
    backward, causal or not: no call runs faster (a lower bound of attention time divides by it)."""
    table = kernel_tables()[hw_key]
    return max(attention_tflops(hw_key, b, c, head_dim, length)
               for b in (False, True) for c in (False, True) for length in table.seq)
