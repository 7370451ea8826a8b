"""CUDA graphs: only for static shapes (fixed seq_length and MBS, no variable-length batches), with scopes that
megatron-core allows together."""

from __future__ import annotations

from ..catalog import Hardware
from ..core.plan import Reason

SOURCE = ("Megatron-Bridge skill nemo-mbridge-perf-moe-long-context ('CUDA graphs need static shapes'; Qwen3-235B "
          "GB200 graphs attn + moe_router + moe_preprocess); megatron-core 0.19.2 CUDA-graph rules "
          "(transformer/transformer_config.py TransformerConfig.__post_init__; megatron-bridge 0.6.2 "
          "validate_cuda_graph_configuration)")


def choose_cuda_graphs(hw: Hardware, variable_length: bool, granularity: str | None,
                       modules: tuple[str, ...], backend: str | None,
                       is_moe: bool = True) -> tuple[tuple[str, tuple[str, ...]], Reason]:
    if not is_moe:
        return ("none", ()), Reason("no CUDA graphs: a dense model has no MoE router / dispatcher scopes to capture, "
                                    "and no published long-context config graphs one", SOURCE)
    if variable_length:
        return ("none", ()), Reason("no CUDA graphs: variable-length batches change shapes every step", SOURCE)
    if granularity == "full":
        return ("none", ()), Reason("no CUDA graphs: megatron-core forbids them with full recompute", SOURCE)
    if backend != "hybridep":
        return ("none", ()), Reason("no CUDA graphs: the published H100 / DeepEP configs run eagerly", SOURCE)
    if "moe" in modules:  # megatron-core: TE graphs with moe_router conflict with moe recompute
        return ("transformer_engine", ("attn",)), Reason("TE CUDA graphs on attn only: moe recompute excludes the "
                                                         "moe_router scope", SOURCE)
    if "layernorm" in modules:  # a graphed router under the flex dispatcher switches the pre-MLP norm recompute off
        return ("transformer_engine", ("attn",)), Reason(
            "TE CUDA graphs on attn only: with moe_router graphed under the flex dispatcher, megatron-core does not "
            "run the layernorm recompute the plan needs", "megatron-core 0.19.2 transformer/transformer_layer.py "
            "(can_recompute_pre_mlp_layernorm_for_cudagraph)")
    return ("transformer_engine", ("attn", "moe_router", "moe_preprocess")), Reason(
        "TE CUDA graphs on attn, moe_router, moe_preprocess: static shapes, as the published GB200 config", SOURCE)
