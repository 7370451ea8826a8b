"""How a base model was trained, where its authors published it: the defaults of a context-extension phase.

A long-context run usually *extends* a pretrained model, so its natural defaults are the base model's own: its
training precision, its final learning rate, its batch in tokens, and the context length it was trained at. Where a
model's authors published these numbers they are recorded here with the source; for any other model (a user's
config.json included) :func:`history_of` returns an empty record and the rules fall back to stated defaults.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingHistory:
    """Published facts about one base model's training (None: not published).

    Attributes:
        precision: the precision class it was trained in (one of lcmoe_recipes' precision keys).
        final_lr: learning rate at the end of pre-training (what an extension phase continues at).
        tokens_per_step: pre-training batch in tokens (samples x sequence length).
        native_context: the context length the released weights were trained at, when config.json's
            ``max_position_embeddings`` states something else (e.g. headroom for generation).
        extension_steps: optimizer steps of each published context-extension phase.
        source: where these numbers are published.
    """

    precision: str | None = None
    final_lr: float | None = None
    tokens_per_step: int | None = None
    native_context: int | None = None
    extension_steps: int | None = None
    source: str = ""


_DSV3 = "DeepSeek-V3 technical report (arXiv 2412.19437)"
HISTORY: dict[str, TrainingHistory] = {
    "deepseek-ai/DeepSeek-V3": TrainingHistory(
        precision="fp8_blockwise", final_lr=7.3e-6, tokens_per_step=15360 * 4096, extension_steps=1000,
        source=f"{_DSV3}: §3.3 FP8 training with 1x128 activation tiles and 128x128 weight blocks; §4.2 batch "
               "ramped to 15,360 sequences of 4K, LR 7.3e-6 at the end; §4.3 two 1,000-step YaRN extension phases "
               "(32K at batch 1,920, 128K at batch 480: the same ~63M tokens per step) at LR 7.3e-6"),
    "Qwen/Qwen3-235B-A22B": TrainingHistory(
        native_context=32768,
        source="Qwen3-235B-A22B model card: 32,768 tokens natively, 131,072 with YaRN factor 4.0 over 32,768"),
    "Qwen/Qwen3-30B-A3B": TrainingHistory(
        native_context=32768,
        source="Qwen3-30B-A3B model card: 32,768 tokens natively, 131,072 with YaRN factor 4.0 over 32,768"),
}


def history_of(hf_id: str) -> TrainingHistory:
    """The published training facts of the model from Hugging Face repository ``hf_id`` (empty if none)."""
    return HISTORY.get(hf_id, TrainingHistory())
