"""Settings that are legal but wrong for a real long-context run, in any config (ours, upstream's, a user's YAML).

Each finding says what the run will do and names the fix; all are warnings (the run starts):

* ``data/attention-mask``: ``dataset.create_attention_mask`` at long sequence -- megatron-core's GPT dataset builds a
  dense s x s mask per sample in every data-loader worker (``datasets/gpt_dataset.py``: float32 ``tril(ones)``, then
  a bool copy), which the attention kernel never reads;
* ``model/init-differs-from-upstream``: ``init_method_std`` other than the one every megatron-bridge recipe of the
  same model uses (DeepSeek-V3: 0.006);
* ``numerics/te-cross-entropy``: Transformer Engine's cross-entropy fusion on a megatron-core that warns about its
  stability (its ``ModelParallelConfig.__post_init__`` says so);
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

from functools import lru_cache

from ..catalog import ModelSpec
from ..catalog.upstream import upstream_recipes
from .feasibility import Finding

MASK_WARN_TOKENS = 8192  # from 8K a worker's mask build exceeds 2 GiB (2 float32 copies of s^2)


@lru_cache(maxsize=1)
def _mcore_warns_about_te_cross_entropy() -> bool:
    """Whether the installed megatron-core's ModelParallelConfig warns about TE's cross-entropy fusion (source text,
    read without importing megatron)."""
    from importlib.util import find_spec

    spec = find_spec("megatron.core")
    if spec is None or not spec.submodule_search_locations:
        return False
    from pathlib import Path

    path = Path(list(spec.submodule_search_locations)[0]) / "model_parallel_config.py"
    return path.is_file() and "cross entropy loss fusion has known stability issues" in path.read_text(encoding="utf-8")


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
    if getattr(m, "cross_entropy_loss_fusion", False) and getattr(m, "cross_entropy_fusion_impl", None) == "te" \
            and _mcore_warns_about_te_cross_entropy():
        out.append(Finding("warning", "numerics/te-cross-entropy",
                           "cross_entropy_fusion_impl='te': the installed megatron-core warns that Transformer "
                           "Engine's cross-entropy fusion has known stability issues (Megatron-LM's argument "
                           "validation rejects it)", "set model.cross_entropy_fusion_impl=native"))
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
