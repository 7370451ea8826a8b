"""Positions: does RoPE, as the base model was trained, cover seq_length -- and if not, YaRN or ABF to make it.

Facts used:

* A model with plain RoPE was trained on positions up to its context length: config.json's
  ``max_position_embeddings``, or the shorter native length its model card states (Qwen3: 32,768, see
  :mod:`lcmoe_recipes.catalog.history`). With YaRN (``rope_scaling`` type yarn) it covers factor s x the original
  length L (DeepSeek-V3: 40 x 4,096 = 163,840).
* YaRN (Peng et al., arXiv 2309.00071): to reach S positions from L, interpolate the RoPE frequencies by s = S / L,
  with the correction range beta_fast = 32, beta_slow = 1 (the paper's alpha = 1, beta = 32) and attention temperature
  sqrt(1/t) = 0.1 ln s + 1. In megatron-core 0.19.2 that temperature is
  ``yarn_get_mscale(s, mscale) / yarn_get_mscale(s, mscale_all_dim)``
  (models/common/embeddings/yarn_rotary_pos_embedding.py), so mscale = 1, mscale_all_dim = 0 reproduce the paper;
  a model that already uses YaRN keeps its own beta and mscale values (DeepSeek-V3: beta 32/1, mscale 1/1, as its
  technical report arXiv 2412.19437 §4.3 and config.json give) and only its factor grows.
* ABF, "adjusted base frequency" (Xiong et al., arXiv 2309.16039): raise the RoPE base instead. The base that
  stretches RoPE over s times the positions is b' = b * s^(d/(d-2)) for rotary dimension d (the NTK-aware relation,
  YaRN paper §3.1); inversely a base b' covers L * (b'/b)^((d-2)/d).

The rule only decides; the emitter writes megatron's fields (GPT providers: ``position_embedding_type="yarn"`` and the
``yarn_*`` fields; MLA providers: ``rope_type``, ``rotary_scaling_factor``, ``original_max_position_embeddings``,
``beta_*``, ``mscale*``), and ``check`` refuses a seq_length beyond the range (rule ``positions/not-covered``).
"""

from __future__ import annotations

import math

from ..catalog import ModelSpec
from ..catalog.history import history_of
from ..core.plan import Positions, Reason
from ..core.request import ROPE_CHOICES
from ..errors import LcmoeError

YARN_SOURCE = "YaRN, arXiv 2309.00071 (factor = target / original length, beta 32/1, temperature 0.1 ln s + 1)"
ABF_SOURCE = "ABF, arXiv 2309.16039 (raise the RoPE base); NTK-aware base b*s^(d/(d-2)), arXiv 2309.00071 §3.1"


def rotary_dim(spec: ModelSpec) -> int:
    """Dimensions RoPE rotates per head: MLA's decoupled ``qk_rope_head_dim``, else the head dimension times
    ``partial_rotary_factor`` (Qwen3-Next: 256 x 0.25 = 64)."""
    c = spec.config
    if "qk_rope_head_dim" in c:
        return int(c["qk_rope_head_dim"])
    head = int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    return int(head * float(c.get("partial_rotary_factor", 1.0)))


def trained_range(spec: ModelSpec) -> tuple[int, str]:
    """(positions plain RoPE was trained on, where that number comes from)."""
    history = history_of(spec.published_id)
    if history.native_context:
        return history.native_context, history.source
    return int(spec.config["max_position_embeddings"]), f"{spec.config_source} max_position_embeddings"


def trained_positions(spec: ModelSpec) -> Positions:
    """The model's RoPE as published in its config.json."""
    c = spec.config
    base = float(c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta") or 10000.0)
    scaling = c.get("rope_scaling") or {}
    if (scaling.get("type") or scaling.get("rope_type")) == "yarn":
        return Positions(rotary_base=base, scaling="yarn", factor=float(scaling["factor"]),
                         original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
                         beta_fast=float(scaling.get("beta_fast", 32)), beta_slow=float(scaling.get("beta_slow", 1)),
                         mscale=float(scaling.get("mscale", 1.0)), mscale_all_dim=float(scaling.get("mscale_all_dim", 0.0)))
    return Positions(rotary_base=base)


def coverage(spec: ModelSpec, positions: Positions) -> int:
    """Positions ``positions`` covers for model ``spec`` (tokens)."""
    if positions.scaling == "yarn" and positions.factor > 1:
        return int(positions.factor * positions.original_max_position_embeddings)
    trained = trained_positions(spec)
    if trained.scaling == "yarn":  # scaling removed from a YaRN-trained model: its original length
        return trained.original_max_position_embeddings
    length, _ = trained_range(spec)
    d = rotary_dim(spec)
    return round(length * (positions.rotary_base / trained.rotary_base) ** ((d - 2) / d))


def _factor(seq_length: int, original: int) -> float:
    """s = seq_length / original, rounded up to two decimals (4.000122 -> 4.01) so the range still covers it."""
    return math.ceil(seq_length / original * 100 - 1e-9) / 100


def choose_positions(spec: ModelSpec, seq_length: int, wish: str = "auto") -> tuple[Positions, Reason]:
    """The RoPE setup for training ``spec`` at ``seq_length``.

    Args:
        wish: "auto" (keep when seq_length fits the trained range, else YaRN), "yarn", "abf" or "keep".

    Raises:
        LcmoeError: an unknown wish, or ABF asked of a model already trained with YaRN.
    """
    if wish not in ROPE_CHOICES:
        raise LcmoeError(f"unknown `rope` '{wish}'", f"use one of {', '.join(ROPE_CHOICES)}", fields=("rope",))
    trained = trained_positions(spec)
    covered = coverage(spec, trained)
    where = (f"{spec.config_source} rope_scaling" if trained.scaling == "yarn" else trained_range(spec)[1])
    if wish == "keep" or (wish == "auto" and seq_length <= covered):
        verdict = "fits" if seq_length <= covered else "does NOT fit (check refuses it)"
        return trained, Reason(f"kept as trained: {trained.describe()} covers {covered:,} positions; seq_length "
                               f"{seq_length:,} {verdict}", where)
    if wish == "abf":
        if trained.scaling == "yarn":
            raise LcmoeError(f"--rope abf: {spec.display} was trained with YaRN ({trained.describe()}); raising the "
                             "base of a YaRN model is not ABF", "use --rope yarn (or auto)")
        length, _ = trained_range(spec)
        s = max(1.0, seq_length / length)
        d = rotary_dim(spec)
        base = float(math.ceil(trained.rotary_base * s ** (d / (d - 2))))
        chosen = Positions(rotary_base=base)
        return chosen, Reason(f"ABF: RoPE base {trained.rotary_base:g} -> {base:g} (x s^(d/(d-2)), s = {s:g}, "
                              f"rotary dim d = {d}) covers {coverage(spec, chosen):,} positions for seq_length "
                              f"{seq_length:,}", ABF_SOURCE)
    if trained.scaling == "yarn":
        original = trained.original_max_position_embeddings
        chosen = Positions(rotary_base=trained.rotary_base, scaling="yarn",
                           factor=max(trained.factor, _factor(seq_length, original)), original_max_position_embeddings=original,
                           beta_fast=trained.beta_fast, beta_slow=trained.beta_slow, mscale=trained.mscale,
                           mscale_all_dim=trained.mscale_all_dim)
        why = (f"YaRN factor {trained.factor:g} -> {chosen.factor:g} over the original {original:,} positions: "
               f"covers {coverage(spec, chosen):,} >= seq_length {seq_length:,} (trained range {covered:,}); beta and "
               "mscale kept as the model was trained")
    else:
        original, _ = trained_range(spec)
        chosen = Positions(rotary_base=trained.rotary_base, scaling="yarn", factor=max(1.0, _factor(seq_length, original)),
                           original_max_position_embeddings=original, beta_fast=32.0, beta_slow=1.0, mscale=1.0,
                           mscale_all_dim=0.0)
        why = (f"YaRN factor {chosen.factor:g} over the trained {original:,} positions covers seq_length "
               f"{seq_length:,} (plain RoPE covers {covered:,}); beta 32/1 and temperature 0.1 ln s + 1 as in the paper")
    history = history_of(spec.published_id).source
    return chosen, Reason(why, "; ".join(dict.fromkeys(s for s in (YARN_SOURCE, where, history) if s)))
