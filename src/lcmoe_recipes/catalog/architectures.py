"""What megatron-bridge can build from a Hugging Face config.json, and what it adds that config.json does not say.

* :func:`supported_architectures` reads the installed megatron-bridge's own bridge registry -- every
  ``@MegatronModelBridge.register_bridge(source=..., target=GPTModel, ...)`` declaration under
  ``megatron/bridge/models/`` (megatron-bridge 0.6.2 ``models/conversion/model_bridge.py``,
  ``MegatronModelBridge.register_bridge``; the same registry ``AutoBridge.list_supported_models`` reads) -- from the
  package's source files, without importing it (importing megatron-bridge takes 25-40 s; planning must not). Only
  bridges whose target is megatron-core's ``GPTModel`` count: they are the decoder-only language models a
  ``ConfigContainer`` of ours can hold (vision-language, audio and Mamba-hybrid bridges target other classes).
* :data:`ARCHITECTURE_FACTS`: per architecture, what its megatron-bridge bridge sets on the Megatron model that
  config.json does not state (q/k layer norm, attention sinks, output gates, linear-layer biases), each with the
  bridge file that sets it. Data, read by :class:`lcmoe_recipes.catalog.ModelSpec`'s feature properties.
* :data:`UNMODELLED_KEYS`: config.json keys that announce a feature the cost model does not price; a model
  carrying one gets a ``model/feature-not-modelled`` warning saying what is assumed instead.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import lru_cache
from pathlib import Path

_BRIDGES = "megatron-bridge 0.6.2 models/{}"

# architecture -> {feature: value}, from each bridge's ``provider_bridge`` (megatron-bridge 0.6.2).
ARCHITECTURE_FACTS: dict[str, dict[str, object]] = {
    # qk_layernorm = True regardless of config.json (no use_qk_norm key in the Qwen3 configs).
    "Qwen3MoeForCausalLM": {"qk_layernorm": True, "source": _BRIDGES.format("qwen/qwen3_moe_bridge.py")},
    "Qwen3ForCausalLM": {"qk_layernorm": True, "source": _BRIDGES.format("qwen/qwen3_bridge.py")},
    # gated attention output (attention_output_gate), gated shared expert (moe_shared_expert_gate), q/k norm.
    "Qwen3NextForCausalLM": {"qk_layernorm": True, "attention_output_gate": True, "shared_expert_gate": True,
                             "source": _BRIDGES.format("qwen/qwen3_next_bridge.py")},
    # learnable softmax offsets (softmax_type="learnable": one sink per head), biases on every linear layer
    # (add_bias_linear=True), experts sized by intermediate_size.
    "GptOssForCausalLM": {"attention_sinks": True, "linear_bias": True,
                          "source": _BRIDGES.format("gpt_oss/gpt_oss_bridge.py")},
    # full-dimension q/k RMSNorm (qk_layernorm=True with its own layer spec); its MTP modules are not mapped.
    "MiniMaxM2ForCausalLM": {"qk_layernorm": True, "source": _BRIDGES.format("minimax_m2/minimax_m2_bridge.py")},
}

# config.json key -> (what it is, what the cost model assumes instead). Any truthy value triggers it.
UNMODELLED_KEYS: dict[str, tuple[str, str]] = {
    "index_topk": ("DeepSeek sparse attention (a lightning indexer picks index_topk keys per query)",
                   "dense causal attention over the whole sequence (an upper bound on its FLOPs and K/V traffic)"),
    "num_mtp_modules": ("multi-token-prediction modules megatron-bridge does not map for this architecture",
                        "no MTP layers (the model trains without them)"),
    "attn_logit_softcapping": ("attention logit soft-capping", "plain softmax attention (same memory and FLOPs)"),
    "final_logit_softcapping": ("output logit soft-capping", "plain logits (same memory)"),
}


def _package_models_dirs() -> list[Path]:
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) / "bridge" / "models" for p in spec.submodule_search_locations if (Path(p) / "bridge").is_dir()]


def _name(node: ast.AST | None, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


@lru_cache(maxsize=1)
def supported_architectures() -> dict[str, str]:
    """{Hugging Face architecture name: bridge file} for every bridge of the installed megatron-bridge whose
    target is megatron-core's ``GPTModel``; {} when megatron-bridge is not installed.

    Read from the source files (``ast``), not by importing megatron-bridge: ~0.2 s.
    """
    out: dict[str, str] = {}
    for root in _package_models_dirs():
        for path in sorted(root.rglob("*.py")):
            if path.parent.name == "conversion":
                continue
            text = path.read_text(encoding="utf-8")
            if "register_bridge" not in text:
                continue
            tree = ast.parse(text)
            constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                         and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                         for t in n.targets if isinstance(t, ast.Name)}
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and _name(node.func, {}) in
                        ("register_bridge", "register_bridge_implementation")):
                    continue
                kw = {k.arg: k.value for k in node.keywords}
                source, target = _name(kw.get("source"), constants), _name(kw.get("target"), {})
                if source and target == "GPTModel":
                    out[source] = str(path.relative_to(root.parent.parent))
    return out


def facts(architecture: str) -> dict[str, object]:
    """:data:`ARCHITECTURE_FACTS` for one architecture ({} for the others)."""
    return ARCHITECTURE_FACTS.get(architecture, {})
