"""A megatron-bridge model provider switched to megatron-core's own ("local") modules, for a machine without
Transformer Engine (TE).

Every field changed here picks a kernel, never a weight: the model has the same parameters with or without TE. It
serves two places: converting a Hugging Face checkpoint where TE is absent (:mod:`lcmoe_recipes.emit.weights`) and
the GPU proof on a machine that has PyTorch but no TE (``scripts/gpu_proof.py``). Our recipes for clusters keep TE.

What megatron-bridge 0.6.2 / megatron-core 0.19.2 cannot build without TE is refused, not worked around:

* multi-token prediction: ``megatron/bridge/models/gpt_provider.py``, ``mtp_block_spec``, asks megatron-core for
  the MTP block with ``use_transformer_engine=True`` whatever the layer spec (only ``drop_mtp=True`` builds the model,
  without its MTP layers);
* gated DeltaNet (Qwen3-Next): megatron-core's ``models/gpt/experimental_attention_variant_module_specs.py``,
  ``_get_backend_spec_provider``, asserts ``transformer_impl == "transformer_engine"``.
"""

from __future__ import annotations

import functools

from ..errors import LcmoeError

# Fields whose True value names a TE (or Apex) kernel, with megatron-core's own path when False.
_TE_KERNELS = ("moe_grouped_gemm", "moe_permute_fusion", "gradient_accumulation_fusion", "persist_layer_norm",
               "cross_entropy_loss_fusion", "apply_rope_fusion")


class NeedsTransformerEngine(LcmoeError):
    """The model has a part that megatron-bridge 0.6.2 / megatron-core 0.19.2 build only with Transformer Engine."""


def use_local_implementation(model, drop_mtp: bool = False) -> list[str]:
    """Switch ``model`` (a megatron-bridge GPT provider, e.g. ``cfg.model``) to megatron-core's local modules, in place.

    Args:
        model: the provider (``AutoBridge...to_megatron_provider()`` or a ConfigContainer's ``model``).
        drop_mtp: build the model without its multi-token-prediction layers (they need TE; see the module doc).

    Returns:
        the changes made, one ``field: old -> new`` line each (for the caller's log).

    Raises:
        NeedsTransformerEngine: gated DeltaNet layers, or MTP layers without ``drop_mtp``.
    """
    spec = model.transformer_layer_spec
    if getattr(model, "experimental_attention_variant", None):
        raise NeedsTransformerEngine(
            f"this model's '{model.experimental_attention_variant}' layers are built only with Transformer Engine "
            "(megatron-core 0.19.2 experimental_attention_variant_module_specs._get_backend_spec_provider asserts "
            "transformer_impl='transformer_engine')",
            "run this step where Transformer Engine is installed (the cluster container, or scripts/setup.sh --with-te)")
    if model.mtp_num_layers and not drop_mtp:
        raise NeedsTransformerEngine(
            f"this model has {model.mtp_num_layers} multi-token-prediction layer(s), which megatron-bridge 0.6.2 builds "
            "only with Transformer Engine (models/gpt_provider.py mtp_block_spec passes use_transformer_engine=True)",
            "run this step where Transformer Engine is installed, or pass --drop-mtp to leave the MTP layers out "
            "(then train with model.mtp_num_layers=null)")
    changes = []

    def change(field: str, value) -> None:
        old = getattr(model, field)
        if old != value:
            setattr(model, field, value)
            changes.append(f"{field}: {old!r} -> {value!r}")

    from megatron.bridge.models.gpt_provider import default_layer_spec, local_layer_spec, transformer_engine_layer_spec

    if isinstance(spec, functools.partial) and spec.keywords.get("use_transformer_engine"):
        # DeepSeek-V2/V3 bridges: partial(get_gpt_decoder_block_spec, use_transformer_engine=...)
        model.transformer_layer_spec = functools.partial(spec.func, *spec.args,
                                                         **{**spec.keywords, "use_transformer_engine": False})
        changes.append(f"transformer_layer_spec: {spec.func.__name__}(use_transformer_engine=False)")
    elif spec in (default_layer_spec, transformer_engine_layer_spec):
        change("transformer_layer_spec", local_layer_spec)
    change("transformer_impl", "local")
    for field in _TE_KERNELS:
        if hasattr(model, field):
            change(field, False)
    if drop_mtp:
        change("mtp_num_layers", None)
    return changes
