"""Finding a model: catalogue keys and aliases, registered user entries, and config.json paths, in one lookup.

The shipped models are :data:`lcmoe_recipes.catalog.models.MODELS`; a user's config.json is read and registered by
:mod:`lcmoe_recipes.catalog.user`. This module sits above both, so neither imports the other back.
"""

from __future__ import annotations

from .lookup import lookup
from .models import MODELS, ModelSpec, _ALIASES
from .user import USER_MODELS, load_model_config, looks_like_path


def models_by_hf_id() -> dict[str, ModelSpec]:
    """Catalogue models by the Hugging Face repository their config.json values come from."""
    return {m.hf_id: m for m in MODELS.values()}


def get_model(name: str) -> ModelSpec:
    """The catalogue entry for ``name``: a key or alias (case-insensitive), a registered user entry's key, or the
    path of a config.json (or of a folder holding one), which is loaded and registered first.

    Raises:
        UnknownName: naming the valid models (and the closest spelling).
        ModelConfigError: a path whose config.json is missing, malformed or of an unsupported architecture.
    """
    spec = USER_MODELS.get(name) or MODELS.get(name)  # a key: the common case (every Plan.model_spec)
    if spec is not None:
        return spec
    key = _ALIASES.get(name.strip().lower().replace(" ", "_"))
    if key is not None:
        return MODELS[key]
    if looks_like_path(name):
        return load_model_config(name)
    return lookup(name, MODELS, _ALIASES, "model")


def match_model(num_layers: int, num_moe_experts: int | None, hidden_size: int, num_attention_heads: int,
                vocab_size: int) -> ModelSpec | None:
    """The catalogue entry (shipped or registered user entry) with these architecture numbers -- how a
    ConfigContainer, which does not name its model, is read back (:func:`lcmoe_recipes.emit.plan_from_config`).
    None when no entry matches. ``vocab_size`` may be padded by Megatron (a multiple of 128·TP): it matches
    when it is the entry's vocabulary rounded up."""
    for spec in (*MODELS.values(), *USER_MODELS.values()):
        if ((spec.num_layers, spec.num_moe_experts, spec.hidden_size, spec.num_attention_heads)
                == (num_layers, num_moe_experts or 0, hidden_size, num_attention_heads)
                and spec.vocab_size <= vocab_size < spec.vocab_size + 128 * 64):
            return spec
    return None
