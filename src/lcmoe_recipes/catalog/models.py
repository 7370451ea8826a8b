"""Model catalogue: each model is its Hugging Face config.json, and every feature the rest of the library asks about is
read from it here, in one place (:class:`ModelSpec`'s properties).

The config.json values of the shipped models live inside the package (``hf_configs/*.json``, sources in
``hf_configs/SOURCES.md``), so nothing contacts a model hub at run time. A user's own config.json becomes a catalogue
entry too (:func:`lcmoe_recipes.catalog.user.load_model_config`) before anything else sees it; its key is stable (a
name plus a hash of the values), so a Plan, a YAML header or a cache can name it like any other model.
:meth:`ModelSpec.hf_config` turns the values into the ``transformers`` config object from which megatron-bridge's
``AutoBridge.from_hf_config`` builds the Megatron model provider (``lcmoe_recipes.emit``).

Features (see each property for the config.json keys it reads and its source): layer kinds (MoE or dense MLP per
layer: ``first_k_dense_replace``, ``moe_layer_freq``, ``decoder_sparse_step``, ``mlp_only_layers``,
``mlp_layer_types``), attention kind per layer (MLA; softmax GQA; sliding window from ``layer_types`` /
``sliding_window``; gated DeltaNet from ``linear_num_key_heads`` and ``full_attention_interval`` / ``layer_types``),
expert, shared-expert and dense FFN sizes, MTP layers, tied embeddings, vocabulary, and what the architecture's
megatron-bridge bridge adds (:data:`lcmoe_recipes.catalog.architectures.ARCHITECTURE_FACTS`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from typing import Any

from .architectures import UNMODELLED_KEYS, facts

# Layer-kind names used everywhere (shapes, memory, step, comm).
MLA, FULL, SLIDING, GDN = "mla", "full", "sliding", "gdn"


@dataclass(frozen=True)
class ModelSpec:
    """One model: its config.json values plus the training-time choices the catalogue adds.

    Attributes:
        key: short name used everywhere (``dsv3``, ``qwen3_235b``, ``user_my_moe_1a2b3c4d``).
        display: human name.
        hf_id: the Hugging Face repository the values come from (never contacted), or the user's file.
        config_file: JSON file under ``hf_configs/`` (catalogue entries), or None with ``values`` (user entries).
        mtp: multi-token-prediction layers trained with the model; None reads config.json
            (``num_nextn_predict_layers`` / ``mtp_num_hidden_layers``, the keys megatron-bridge 0.6.2 maps to
            ``mtp_num_layers``: ``model_bridge.py`` CONFIG_MAPPING). Qwen3-Next: 1, from its model card and
            megatron-bridge's library recipe.
        hf_config_class: ``transformers`` config class; None derives it from ``model_type`` (or the architecture).
        aliases: other accepted spellings.
        values: the config.json dict of a user entry (None for catalogue entries, read from ``config_file``).
        same_as: for a user entry whose values are a shipped model's published config.json, that model's key (its
            published training facts apply: :attr:`published_id`).
    """

    key: str
    display: str
    hf_id: str
    config_file: str | None = None
    mtp: int | None = None
    hf_config_class: str | None = None
    aliases: tuple[str, ...] = field(default=())
    values: dict[str, Any] | None = field(default=None, compare=False, hash=False, repr=False)
    same_as: str | None = None

    @property
    def published_id(self) -> str:
        """The Hugging Face repository whose published facts (model card, technical report, upstream recipes) apply:
        this model's, or for a user file that is a shipped model's config.json, that model's."""
        return MODELS[self.same_as].hf_id if self.same_as else self.hf_id

    @property
    def config_source(self) -> str:
        """Where the config.json values come from, as a reason cites it: the published file, or the user's."""
        return f"your config.json ({self.hf_id})" if self.is_user_config else f"{self.display} config.json"

    @property
    def card_source(self) -> str:
        """Where facts beyond config.json would be published: the model card, or (a user's model) the user's file."""
        if self.same_as:
            return f"{MODELS[self.same_as].display} model card"
        return self.config_source if self.is_user_config else f"{self.display} model card"

    @cached_property
    def config(self) -> dict[str, Any]:
        """The config.json values (callers must not mutate them)."""
        if self.values is not None:
            return self.values
        text = resources.files(__package__).joinpath("hf_configs", self.config_file).read_text(encoding="utf-8")
        return json.loads(text)

    @property
    def is_user_config(self) -> bool:
        """True for a user's config.json (not shipped in the package): YAML headers then carry its values."""
        return self.values is not None

    def hf_config(self):
        """The ``transformers`` config object for this model, built offline from the values.

        ``auto_map`` (remote code, never run here) and ``quantization_config`` (the checkpoint's storage format, not
        the architecture) are dropped; megatron-bridge then dispatches on ``architectures``.
        """
        import transformers  # heavy: only the emitter calls this

        values = {k: v for k, v in self.config.items()
                  if k not in ("auto_map", "quantization_config", "model_type", "_name_or_path")}
        return getattr(transformers, self.hf_config_class or _transformers_config_class(self.config))(**values)

    # --- identity ---------------------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        """The Hugging Face architecture (``architectures[0]``) megatron-bridge dispatches on."""
        return str(self.config["architectures"][0])

    def _fact(self, name: str, default=False):
        return facts(self.architecture).get(name, default)

    # --- sizes (names follow Megatron's) -------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        """Decoder layers (MTP layers not included)."""
        return int(self.config["num_hidden_layers"])

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def num_attention_heads(self) -> int:
        return int(self.config["num_attention_heads"])

    @property
    def num_query_groups(self) -> int:
        """K/V heads (``num_key_value_heads``; MLA and plain multi-head attention: the attention heads)."""
        return int(self.config.get("num_key_value_heads") or self.num_attention_heads)

    @property
    def kv_channels(self) -> int:
        """Head dimension of softmax attention: ``head_dim``, else hidden_size / heads (megatron-core's default)."""
        return int(self.config.get("head_dim") or self.hidden_size // self.num_attention_heads)

    @property
    def tie_word_embeddings(self) -> bool:
        """Embedding and output layer share one matrix (``tie_word_embeddings``; megatron-bridge maps it to
        ``share_embeddings_and_output_weights``)."""
        return bool(self.config.get("tie_word_embeddings", False))

    # --- MoE ----------------------------------------------------------------------------------------------
    @property
    def num_moe_experts(self) -> int:
        """Routed experts per MoE layer (``n_routed_experts`` / ``num_experts`` / ``num_local_experts``); 0 for a
        dense model."""
        c = self.config
        return int(c.get("n_routed_experts") or c.get("num_experts") or c.get("num_local_experts") or 0)

    @property
    def is_moe(self) -> bool:
        return self.num_moe_experts > 0

    @property
    def moe_router_topk(self) -> int:
        """Experts per token (``num_experts_per_tok`` / ``experts_per_token``); 0 for a dense model."""
        if not self.is_moe:
            return 0
        return int(self.config.get("num_experts_per_tok") or self.config["experts_per_token"])

    @property
    def moe_ffn_hidden_size(self) -> int:
        """Routed expert width: ``moe_intermediate_size``, else ``intermediate_size`` (gpt-oss, MiniMax-M2: their
        bridges leave ``moe_ffn_hidden_size`` to megatron-core's default, ``ffn_hidden_size``); 0 when dense."""
        if not self.is_moe:
            return 0
        return int(self.config.get("moe_intermediate_size") or self.config["intermediate_size"])

    @property
    def ffn_hidden_size(self) -> int:
        """Width of the dense (non-MoE) layers' MLP (``intermediate_size``); 0 when every layer is MoE."""
        return int(self.config.get("intermediate_size") or 0) if self.num_dense_layers else 0

    @property
    def shared_expert_ffn_hidden_size(self) -> int:
        """Shared-expert width of one MoE layer: ``n_shared_experts`` x ``moe_intermediate_size`` (DeepSeek, GLM,
        Kimi; megatron-bridge's deepseek/glm bridges), or ``shared_expert_intermediate_size`` (Qwen) /
        ``shared_intermediate_size`` (MiniMax); 0 when there is none."""
        c = self.config
        if c.get("n_shared_experts"):
            return int(c["n_shared_experts"]) * self.moe_ffn_hidden_size
        return int(c.get("shared_expert_intermediate_size") or c.get("shared_intermediate_size") or 0)

    @cached_property
    def moe_layers(self) -> tuple[bool, ...]:
        """For each decoder layer, whether its MLP is MoE (True) or dense (False).

        ``mlp_layer_types`` ("dense"/"sparse") when given; else DeepSeek/GLM/Kimi's ``first_k_dense_replace`` leading
        dense layers and ``moe_layer_freq``; else Qwen's ``decoder_sparse_step`` and ``mlp_only_layers``. All False
        for a dense model.
        """
        c, n = self.config, self.num_layers
        if not self.is_moe:
            return (False,) * n
        if c.get("mlp_layer_types"):
            return tuple(t != "dense" for t in c["mlp_layer_types"][:n])
        freq = c.get("moe_layer_freq") or 1
        if isinstance(freq, list):  # megatron-style per-layer pattern (1 = MoE)
            return tuple(bool(f) for f in freq[:n])
        first_dense = int(c.get("first_k_dense_replace") or 0)
        step = int(c.get("decoder_sparse_step") or 1)
        only_mlp = set(c.get("mlp_only_layers") or ())
        return tuple(i >= first_dense and i % int(freq) == 0 and (i + 1) % step == 0 and i not in only_mlp
                     for i in range(n))

    @property
    def num_dense_layers(self) -> int:
        """Decoder layers with a dense MLP (DeepSeek-V3: the 3 leading ones); the ``mlp`` recompute module only
        touches these."""
        return self.moe_layers.count(False)

    # --- attention ------------------------------------------------------------------------------------------
    @property
    def multi_latent_attention(self) -> bool:
        """MLA (DeepSeek-V3, Kimi-K2, Moonlight): ``kv_lora_rank`` in config.json; the ``mla_up_proj`` recompute
        module exists only for these."""
        return "kv_lora_rank" in self.config

    @property
    def gated_delta_net(self) -> bool:
        """Gated DeltaNet linear attention in some layers (Qwen3-Next): ``linear_num_key_heads`` in config.json."""
        return "linear_num_key_heads" in self.config

    @property
    def linear_num_heads(self) -> tuple[int, int]:
        """(linear_num_key_heads, linear_num_value_heads); megatron-core needs both divisible by TP·CP."""
        return int(self.config["linear_num_key_heads"]), int(self.config["linear_num_value_heads"])

    @property
    def sliding_window(self) -> int | None:
        """Tokens a sliding-window layer attends to (``sliding_window``), None without sliding-window layers."""
        return int(self.config["sliding_window"]) if SLIDING in self.layer_attention else None

    @cached_property
    def layer_attention(self) -> tuple[str, ...]:
        """Attention kind of each decoder layer: "mla", "full" (softmax over all earlier tokens), "sliding"
        (softmax over the last ``sliding_window`` tokens) or "gdn" (gated DeltaNet).

        ``layer_types`` ("full_attention", "sliding_attention", "linear_attention") when given; gated DeltaNet models
        without it: full attention every ``full_attention_interval`` layers (megatron-bridge 0.6.2
        ``transformers_compat.full_attention_interval_from_hf``); a ``sliding_window`` without ``layer_types`` (and
        not switched off by ``use_sliding_window: false``): every layer.
        """
        c, n = self.config, self.num_layers
        if self.multi_latent_attention:
            return (MLA,) * n
        kinds = {"full_attention": FULL, "sliding_attention": SLIDING, "linear_attention": GDN}
        if c.get("layer_types"):
            return tuple(kinds.get(t, t) for t in c["layer_types"][:n])
        if self.gated_delta_net:
            every = int(c.get("full_attention_interval") or 4)
            return tuple(FULL if (i + 1) % every == 0 else GDN for i in range(n))
        if c.get("sliding_window") and c.get("use_sliding_window", True):
            return (SLIDING,) * n
        return (FULL,) * n

    @property
    def attention_kind(self) -> str:
        """Summary: 'mla', 'gqa', 'gqa+sliding-window', 'gated_deltanet+gqa' (a GQA model with as many K/V heads as
        query heads is plain multi-head attention; it is still called 'gqa')."""
        kinds = set(self.layer_attention)
        if MLA in kinds:
            return "mla"
        if GDN in kinds:
            return "gated_deltanet+gqa"
        return "gqa+sliding-window" if SLIDING in kinds else "gqa"

    @property
    def qk_layernorm(self) -> bool:
        """RMSNorm on queries and keys: ``use_qk_norm`` when config.json says, else what the bridge sets
        (:data:`~lcmoe_recipes.catalog.architectures.ARCHITECTURE_FACTS`); MLA always normalises its latent q and
        k/v (the DeepSeek bridges set ``qk_layernorm=True``)."""
        if self.multi_latent_attention:
            return True
        if "use_qk_norm" in self.config:
            return bool(self.config["use_qk_norm"])
        return bool(self._fact("qk_layernorm"))

    @property
    def attention_output_gate(self) -> bool:
        """Sigmoid gate on the softmax-attention output (Qwen3-Next): ``attn_output_gate``, else the bridge's."""
        return bool(self.config.get("attn_output_gate", self._fact("attention_output_gate")))

    @property
    def shared_expert_gate(self) -> bool:
        """A scalar gate on the shared expert's output (Qwen3-Next; ``moe_shared_expert_gate``)."""
        return bool(self._fact("shared_expert_gate")) and self.shared_expert_ffn_hidden_size > 0

    @property
    def attention_sinks(self) -> bool:
        """Learnable softmax offsets, one per head (gpt-oss: ``softmax_type="learnable"``). With CP > 1, Transformer
        Engine runs them only with ``cp_comm_type="a2a"``."""
        return bool(self._fact("attention_sinks"))

    @property
    def attention_bias(self) -> bool:
        """Biases on the q/k/v projections (``attention_bias``; GLM-4.5, gpt-oss)."""
        return bool(self.config.get("attention_bias", False))

    @property
    def expert_bias(self) -> bool:
        """The router's per-expert bias of auxiliary-loss-free load balancing (``topk_method: noaux_tc``, the
        ``e_score_correction_bias`` of DeepSeek-V3 and Kimi K2; megatron-core ``moe_router_enable_expert_bias``)."""
        return self.config.get("topk_method") == "noaux_tc"

    @property
    def linear_bias(self) -> bool:
        """Biases on every linear layer, experts included (gpt-oss: ``add_bias_linear=True``)."""
        return bool(self._fact("linear_bias"))

    # --- multi-token prediction -----------------------------------------------------------------------------
    @property
    def mtp_num_layers(self) -> int:
        """MTP layers: the catalogue's choice, else ``num_nextn_predict_layers`` / ``mtp_num_hidden_layers``."""
        if self.mtp is not None:
            return self.mtp
        c = self.config
        return int(c.get("num_nextn_predict_layers") or c.get("mtp_num_hidden_layers") or 0)

    # --- what the cost model does not price -------------------------------------------------------------------
    @property
    def unmodelled_features(self) -> tuple[tuple[str, str, str], ...]:
        """(config.json key, the feature, what is assumed instead) for every feature the cost model does not price
        (:data:`~lcmoe_recipes.catalog.architectures.UNMODELLED_KEYS`, and layer types other than full, sliding and
        gated-DeltaNet attention)."""
        out = [(k, what, assumed) for k, (what, assumed) in UNMODELLED_KEYS.items() if self.config.get(k)]
        odd = sorted(set(self.layer_attention) - {MLA, FULL, SLIDING, GDN})
        if odd:
            out.append(("layer_types", f"layer type(s) {', '.join(odd)}", "softmax attention over the whole sequence"))
        if GDN in self.layer_attention and not self.gated_delta_net:
            out.append(("layer_types", "linear-attention layers other than gated DeltaNet",
                        "gated DeltaNet costs with the softmax attention's head sizes"))
        return tuple(out)


def _transformers_config_class(config: dict[str, Any]) -> str:
    """The ``transformers`` config class name for a config.json: the one registered for its ``model_type``
    (``CONFIG_MAPPING_NAMES``), else the config class of its architecture (Kimi-K2's ``kimi_k2`` is not a
    transformers model type; its architecture is ``DeepseekV3ForCausalLM``).

    Raises:
        ModelConfigError: neither is known to the installed transformers.
    """
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from ..errors import ModelConfigError

    name = CONFIG_MAPPING_NAMES.get(str(config.get("model_type")))
    if name:
        return name
    for arch in config.get("architectures") or ():
        cls = getattr(transformers, str(arch), None)
        if cls is not None and getattr(cls, "config_class", None) is not None:
            return cls.config_class.__name__
    raise ModelConfigError(f"transformers {transformers.__version__} knows neither model_type "
                           f"{config.get('model_type')!r} nor architecture {config.get('architectures')!r}",
                           "set model_type to the transformers model type of the architecture (e.g. deepseek_v3)")


MODELS: dict[str, ModelSpec] = {
    m.key: m
    for m in (
        ModelSpec("dsv3", "DeepSeek-V3 (671B, 37B active)", "deepseek-ai/DeepSeek-V3", "deepseek_v3.json",
                  aliases=("deepseek_v3", "deepseek-v3", "dsv3_671b")),
        ModelSpec("qwen3_235b", "Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B", "qwen3_235b_a22b.json",
                  aliases=("qwen3-235b", "qwen3_235b_a22b", "qwen3-235b-a22b")),
        ModelSpec("qwen3_next", "Qwen3-Next-80B-A3B", "Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen3_next_80b_a3b.json",
                  mtp=1, aliases=("qwen3-next", "qwen3_next_80b", "qwen3-next-80b-a3b", "qwen3_next_80b_a3b")),
        ModelSpec("kimi_k2", "Kimi-K2 (1T, 32B active)", "moonshotai/Kimi-K2-Instruct", "kimi_k2_instruct.json",
                  aliases=("kimi-k2", "kimi_k2_instruct", "kimi-k2-instruct")),
        ModelSpec("glm45", "GLM-4.5 (355B, 32B active)", "zai-org/GLM-4.5", "glm_4_5.json",
                  aliases=("glm-4.5", "glm4.5", "glm_4_5")),
        ModelSpec("glm45_air", "GLM-4.5-Air (106B, 12B active)", "zai-org/GLM-4.5-Air", "glm_4_5_air.json",
                  aliases=("glm-4.5-air", "glm4.5-air", "glm_4_5_air")),
        ModelSpec("gpt_oss_120b", "gpt-oss-120b (117B, 5.1B active)", "openai/gpt-oss-120b", "gpt_oss_120b.json",
                  aliases=("gpt-oss-120b",)),
        ModelSpec("gpt_oss_20b", "gpt-oss-20b (21B, 3.6B active)", "openai/gpt-oss-20b", "gpt_oss_20b.json",
                  aliases=("gpt-oss-20b",)),
        ModelSpec("qwen3_coder_480b", "Qwen3-Coder-480B-A35B", "Qwen/Qwen3-Coder-480B-A35B-Instruct",
                  "qwen3_coder_480b_a35b.json", aliases=("qwen3-coder-480b", "qwen3-coder-480b-a35b")),
        ModelSpec("minimax_m2", "MiniMax-M2 (230B, 10B active)", "MiniMaxAI/MiniMax-M2", "minimax_m2.json",
                  aliases=("minimax-m2",)),
        # Smaller relatives whose measured peak memory calibrates and tests the memory model (tests/published.py).
        ModelSpec("moonlight", "Moonlight-16B-A3B", "moonshotai/Moonlight-16B-A3B", "moonlight_16b_a3b.json",
                  aliases=("moonlight_16b", "moonlight-16b-a3b")),
        ModelSpec("qwen3_30b", "Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B", "qwen3_30b_a3b.json",
                  aliases=("qwen3-30b-a3b", "qwen3_30b_a3b")),
        # The course module's decision-table exercise (synthetic; see hf_configs/SOURCES.md).
        ModelSpec("course_moe", "Course MoE 64x7B (top-2)", "(synthetic)", "course_moe_64e.json",
                  aliases=("course-moe", "moe_64e_top2")),
        # One-GPU proxies of the three families for scripts/gpu_proof.sh (synthetic; see hf_configs/SOURCES.md).
        ModelSpec("proxy_dsv3", "DeepSeek-V3 proxy (6 layers, 16 experts)", "(synthetic proxy_dsv3)",
                  "proxy_dsv3.json", mtp=1),
        ModelSpec("proxy_qwen3_moe", "Qwen3-MoE proxy (8 layers, 32 experts)", "(synthetic proxy_qwen3_moe)",
                  "proxy_qwen3_moe.json", mtp=0),
        ModelSpec("proxy_qwen3_next", "Qwen3-Next proxy (8 layers, 32 experts)", "(synthetic proxy_qwen3_next)",
                  "proxy_qwen3_next.json", mtp=1),
    )
}

_ALIASES = {alias: m.key for m in MODELS.values() for alias in (m.key, *m.aliases)}
