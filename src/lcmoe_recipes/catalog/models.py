"""Offline model catalogue: the architecture of each supported model, from its public Hugging Face config.json.

The config.json values ship inside the package (``hf_configs/*.json``, sources in ``hf_configs/SOURCES.md``) so
that nothing contacts a model hub at run time. :meth:`ModelSpec.hf_config` turns them into the matching
``transformers`` config object, from which megatron-bridge's ``AutoBridge.from_hf_config`` builds the Megatron
model provider (see ``lcmoe_recipes.emit``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from typing import Any

from .lookup import lookup


@dataclass(frozen=True)
class ModelSpec:
    """One model's architecture (numbers from config.json) plus the training-time choices the catalogue adds.

    Attributes:
        key: short name used everywhere (``dsv3``, ``qwen3_235b``, ``qwen3_next``).
        display: human name.
        hf_id: the Hugging Face repository the values come from (never contacted).
        hf_config_class: name of the ``transformers`` config class for ``model_type``.
        config_file: JSON file under ``hf_configs/``.
        mtp_num_layers: multi-token-prediction layers trained with the model (``num_nextn_predict_layers`` where
            config.json has it; Qwen3-Next: 1, per its model card and megatron-bridge's library recipe).
        aliases: other accepted spellings.
    """

    key: str
    display: str
    hf_id: str
    hf_config_class: str
    config_file: str
    mtp_num_layers: int
    aliases: tuple[str, ...] = field(default=())

    @cached_property
    def config(self) -> dict[str, Any]:
        """The published config.json values (a fresh dict each call site must not mutate)."""
        text = resources.files(__package__).joinpath("hf_configs", self.config_file).read_text(encoding="utf-8")
        return json.loads(text)

    def hf_config(self):
        """The ``transformers`` config object for this model, built offline from the shipped values."""
        import transformers  # heavy: only the emitter calls this

        return getattr(transformers, self.hf_config_class)(**self.config)

    # --- derived sizes (names follow Megatron's) ---------------------------------------------------------
    @property
    def num_layers(self) -> int:
        """Decoder layers (MTP layers not included)."""
        return int(self.config["num_hidden_layers"])

    @property
    def num_moe_experts(self) -> int:
        c = self.config
        return int(c.get("n_routed_experts") or c["num_experts"])

    @property
    def moe_router_topk(self) -> int:
        return int(self.config["num_experts_per_tok"])

    @property
    def num_attention_heads(self) -> int:
        return int(self.config["num_attention_heads"])

    @property
    def num_query_groups(self) -> int:
        return int(self.config["num_key_value_heads"])

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def multi_latent_attention(self) -> bool:
        """MLA (DeepSeek-V3): the ``mla_up_proj`` recompute module exists only for these models."""
        return "kv_lora_rank" in self.config

    @property
    def gated_delta_net(self) -> bool:
        """Qwen3-Next's hybrid: gated DeltaNet linear attention in 3 of every ``full_attention_interval`` layers."""
        return "linear_num_key_heads" in self.config

    @property
    def linear_num_heads(self) -> tuple[int, int]:
        """(linear_num_key_heads, linear_num_value_heads); megatron-core needs both divisible by TP·CP."""
        return int(self.config["linear_num_key_heads"]), int(self.config["linear_num_value_heads"])

    @property
    def num_dense_layers(self) -> int:
        """Leading dense (non-MoE) layers: DeepSeek-V3's ``first_k_dense_replace`` (3); the ``mlp`` recompute
        module only touches these."""
        return int(self.config.get("first_k_dense_replace", 0))

    @property
    def attention_kind(self) -> str:
        """'mla', 'gqa', or 'gated_deltanet+gqa'."""
        if self.multi_latent_attention:
            return "mla"
        return "gated_deltanet+gqa" if self.gated_delta_net else "gqa"


MODELS: dict[str, ModelSpec] = {
    m.key: m
    for m in (
        ModelSpec("dsv3", "DeepSeek-V3 (671B, 37B active)", "deepseek-ai/DeepSeek-V3", "DeepseekV3Config",
                  "deepseek_v3.json", mtp_num_layers=1, aliases=("deepseek_v3", "deepseek-v3", "dsv3_671b")),
        ModelSpec("qwen3_235b", "Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B", "Qwen3MoeConfig",
                  "qwen3_235b_a22b.json", mtp_num_layers=0, aliases=("qwen3-235b", "qwen3_235b_a22b", "qwen3-235b-a22b")),
        ModelSpec("qwen3_next", "Qwen3-Next-80B-A3B", "Qwen/Qwen3-Next-80B-A3B-Instruct", "Qwen3NextConfig",
                  "qwen3_next_80b_a3b.json", mtp_num_layers=1,
                  aliases=("qwen3-next", "qwen3_next_80b", "qwen3-next-80b-a3b", "qwen3_next_80b_a3b")),
        # Smaller relatives whose measured peak memory calibrates and tests the memory model (REFERENCE.md §10).
        ModelSpec("moonlight", "Moonlight-16B-A3B", "moonshotai/Moonlight-16B-A3B", "DeepseekV3Config",
                  "moonlight_16b_a3b.json", mtp_num_layers=0, aliases=("moonlight_16b", "moonlight-16b-a3b")),
        ModelSpec("qwen3_30b", "Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B", "Qwen3MoeConfig",
                  "qwen3_30b_a3b.json", mtp_num_layers=0, aliases=("qwen3-30b-a3b", "qwen3_30b_a3b")),
        # The course module's decision-table exercise (synthetic; see hf_configs/SOURCES.md).
        ModelSpec("course_moe", "Course MoE 64x7B (top-2)", "(synthetic)", "Qwen3MoeConfig", "course_moe_64e.json",
                  mtp_num_layers=0, aliases=("course-moe", "moe_64e_top2")),
        # One-GPU proxies of the three families for scripts/gpu_proof.sh (synthetic; see hf_configs/SOURCES.md).
        ModelSpec("proxy_dsv3", "DeepSeek-V3 proxy (6 layers, 16 experts)", "(synthetic)", "DeepseekV3Config",
                  "proxy_dsv3.json", mtp_num_layers=1),
        ModelSpec("proxy_qwen3_moe", "Qwen3-MoE proxy (8 layers, 32 experts)", "(synthetic)", "Qwen3MoeConfig",
                  "proxy_qwen3_moe.json", mtp_num_layers=0),
        ModelSpec("proxy_qwen3_next", "Qwen3-Next proxy (8 layers, 32 experts)", "(synthetic)", "Qwen3NextConfig",
                  "proxy_qwen3_next.json", mtp_num_layers=1),
    )
}

_ALIASES = {alias: m.key for m in MODELS.values() for alias in (m.key, *m.aliases)}


def models_by_hf_id() -> dict[str, ModelSpec]:
    """Catalogue models by the Hugging Face repository their config.json values come from."""
    return {m.hf_id: m for m in MODELS.values()}


def get_model(name: str) -> ModelSpec:
    """The catalogue entry for ``name`` (key or alias, case-insensitive).

    Raises:
        UnknownName: naming the valid models (and the closest spelling).
    """
    return lookup(name, MODELS, _ALIASES, "model")
