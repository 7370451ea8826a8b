"""Settings that are legal but wrong for a real long-context run, in any config (ours, upstream's, a user's YAML).

Each finding says what the run will do and names the fix; all are warnings (the run starts):

* ``data/attention-mask``: ``dataset.create_attention_mask`` at long sequence -- megatron-core's GPT dataset builds a
  dense s x s mask per sample in every data-loader worker (``datasets/gpt_dataset.py``: float32 ``tril(ones)``, then
  a bool copy), which the attention kernel never reads;
* ``model/init-differs-from-upstream``: ``init_method_std`` other than the one every megatron-bridge recipe of the
  same model uses (DeepSeek-V3: 0.006);
* ``real-training/benchmark-setting``: megatron-bridge's benchmark-only settings left on
  (``moe_router_force_load_balancing`` routes tokens round-robin, ignoring the learned router).

And one error: ``data/document-masking-layout``, megatron-core's per-document attention for pretraining data
(``dataset.inter_document_masking``, GPTDataset) with CP > 1 or PP > 1. megatron-core pads each sample's ``cu_seqlens``
with ``seq_length`` entries (``datasets/gpt_dataset.py``), while megatron-bridge 0.6.2's forward step trims padding
for context parallelism only at negative sentinels (``training/gpt_step.py`` ``_trim_padded_cu_seqlens_for_cp``) and
hands packed metadata to middle pipeline stages only for its SFT packing modes (``_middle_pp_stage_needs_batch``):
the documents' boundaries would reach the attention wrongly or not at all.

The checks read attributes only; nothing here imports megatron.
"""

from __future__ import annotations

from ..catalog import ModelSpec
from ..catalog.upstream import upstream_recipes
from .feasibility import Finding

MASK_WARN_TOKENS = 8192  # from 8K a worker's mask build exceeds 2 GiB (2 float32 copies of s^2)


def upstream_init(spec: ModelSpec) -> float | None:
    """The ``init_method_std`` every recorded megatron-bridge recipe of ``spec`` uses (None when they disagree or none
    exists)."""
    values = {r.init_method_std for r in upstream_recipes() if r.hf_id == spec.published_id}
    return values.pop() if len(values) == 1 else None


def hygiene_findings(cfg, spec: ModelSpec) -> list[Finding]:
    """The warnings of this module for a ConfigContainer ``cfg`` of model ``spec``."""
    out = []
    m, seq = cfg.model, cfg.model.seq_length
    if getattr(cfg.dataset, "create_attention_mask", False) and seq >= MASK_WARN_TOKENS:
        peak = 2 * 4 * seq * seq / 2**30
        out.append(Finding("warning", "data/attention-mask",
                           f"dataset.create_attention_mask at seq_length {seq:,}: every data-loader worker builds a "
                           f"dense {seq:,} x {seq:,} mask per sample ({peak:,.0f} GiB at its peak) that flash attention "
                           "never reads", "set dataset.create_attention_mask=false"))
    init = upstream_init(spec)
    if init is not None and m.init_method_std is not None and abs(m.init_method_std - init) > 1e-12:
        out.append(Finding("warning", "model/init-differs-from-upstream",
                           f"init_method_std={m.init_method_std:g}, but megatron-bridge's recipes of {spec.display} use "
                           f"{init:g}: layers initialised here (e.g. new ones, or all of them without pretrained "
                           "weights) start at another scale", f"set model.init_method_std={init:g}"))
    cp, pp = m.context_parallel_size or 1, m.pipeline_model_parallel_size or 1
    if getattr(cfg.dataset, "inter_document_masking", False) and (cp > 1 or pp > 1):
        out.append(Finding("error", "data/document-masking-layout",
                           f"dataset.inter_document_masking with CP={cp}, PP={pp}: megatron-bridge 0.6.2's forward step "
                           "does not trim megatron-core's cu_seqlens padding for context parallelism and gives middle "
                           "pipeline stages no document boundaries", "set dataset.inter_document_masking=false (documents "
                           "then attend across their boundaries within a sample, as in standard pretraining), or use "
                           "CP=1 and PP=1"))
    if getattr(m, "moe_router_force_load_balancing", False):
        out.append(Finding("warning", "real-training/benchmark-setting",
                           "moe_router_force_load_balancing=true: tokens are routed round-robin, ignoring the learned "
                           "router (a benchmark-only setting of megatron-bridge's perf recipes)",
                           "set model.moe_router_force_load_balancing=false"))
    return out
