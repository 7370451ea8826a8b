"""A user's own config.json as a catalogue entry: read, check, and register it before anything else sees it.

``--model-config PATH`` (plan, launch, check), ``TrainingRequest(model_config=PATH)`` and a path given in place of a
model name all come here. The file is refused cleanly -- :class:`~lcmoe_recipes.errors.ModelConfigError`, naming the
file, the bad key and the fix -- when it is missing, is not JSON, is not an object, lacks a key the model needs, or
names an architecture the installed megatron-bridge cannot build (the message lists those it can:
:func:`lcmoe_recipes.catalog.architectures.supported_architectures`).

The entry's key is ``user_<name>_<first 8 hex of the SHA-1 of the values>`` (the name from ``_name_or_path`` or
``model_type``): the same values always give the same key, wherever the file lies, and two different files never
share one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from ..errors import ModelConfigError
from .architectures import supported_architectures
from .models import MODELS, ModelSpec

# Keys every decoder needs, and what each is.
_REQUIRED = {"hidden_size": "the model width", "num_hidden_layers": "the decoder layer count",
             "num_attention_heads": "the attention heads", "vocab_size": "the vocabulary size"}
_MLA = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_GDN = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
# config.json keys that name or package a model without changing it (transformers writes them on save)
_NOT_ARCHITECTURE = frozenset({"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache",
                               "auto_map"})

USER_MODELS: dict[str, ModelSpec] = {}  # user config.json entries, by key (filled by register)


def register(spec: ModelSpec) -> ModelSpec:
    """Add a user entry to the catalogue (idempotent: the key hashes the values) and return it."""
    return USER_MODELS.setdefault(spec.key, spec)


def same_catalogue_model(values: dict[str, Any]) -> str | None:
    """The key of the shipped model whose published config.json has exactly these values (keys that only name or
    package a model, such as ``_name_or_path`` or ``torch_dtype``, aside), else None. Such a file is that model:
    its published training facts (native context, precision, batch, base recipe) apply to it."""
    mine = {k: v for k, v in values.items() if k not in _NOT_ARCHITECTURE}
    for spec in MODELS.values():
        if spec.config_file and {k: v for k, v in spec.config.items() if k not in _NOT_ARCHITECTURE} == mine:
            return spec.key
    return None


def looks_like_path(name: str) -> bool:
    """True when ``name`` is meant as a file: it exists, ends in .json, or contains a path separator."""
    return name.endswith(".json") or os.sep in name or "/" in name or Path(name).exists()


def _file_of(path: str | os.PathLike) -> Path:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file() and p.suffix in (".yaml", ".yml"):
        raise ModelConfigError(f"'{path}' does not exist (and a YAML is a ConfigContainer, not a model)",
                               "give a model (a name, or a Hugging Face config.json); a ConfigContainer YAML that "
                               "exists runs with lcmoe_recipes.launch.submit or re-plans with launch --from")
    if not p.is_file():
        raise ModelConfigError(f"model config '{path}' does not exist" + (" (no config.json in that folder)"
                                                                           if Path(path).is_dir() else ""),
                               "give the path of a Hugging Face config.json, or of the folder holding one")
    return p


def read_config_json(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON object in a config.json (or a folder's config.json).

    Raises:
        ModelConfigError: missing file, bad JSON, or not a JSON object.
    """
    file = _file_of(path)
    if file.suffix in (".yaml", ".yml"):  # a fresh user's `launch out/x.yaml`: a ConfigContainer, not a model
        raise ModelConfigError(
            f"'{path}' is a YAML file (a ConfigContainer): the first argument is a model, a name or a Hugging Face "
            "config.json",
            f"to run a ConfigContainer YAML as written: lcmoe_recipes.launch.submit('{path}', executor) in Python, or "
            f"torchrun ... -m lcmoe_recipes.train --config {path}; to re-plan it for another length: python -m "
            f"lcmoe_recipes.launch --from {path} --seq N; to check it: python -m lcmoe_recipes.check {path}")
    try:
        values = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"'{file}' is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                               "fix the file (a Hugging Face config.json is one JSON object)") from None
    except UnicodeDecodeError:
        raise ModelConfigError(f"'{file}' is not a text file", "give the model's config.json") from None
    if not isinstance(values, dict):
        raise ModelConfigError(f"'{file}' holds a JSON {type(values).__name__}, not an object",
                               "a Hugging Face config.json is one JSON object ({\"architectures\": [...], ...})")
    return values


def _positive_int(values: dict, key: str, where: str, what: str) -> None:
    value = values.get(key)
    if value is None:
        raise ModelConfigError(f"{where} has no '{key}' ({what})", f"add \"{key}\": <int> as in the model's "
                               "published config.json")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelConfigError(f"{where}: '{key}' is {value!r}, not a positive integer ({what})",
                               f"set \"{key}\" to the model's value")


def check_values(values: dict[str, Any], where: str) -> None:
    """Refuse a config.json the library cannot plan: an architecture megatron-bridge cannot build, or a missing or
    non-integer size.

    Raises:
        ModelConfigError: naming ``where``, the bad key and the fix.
    """
    supported = supported_architectures()
    archs = values.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise ModelConfigError(f"{where} has no 'architectures' list (megatron-bridge picks its bridge by it)",
                               "add \"architectures\": [\"<Name>ForCausalLM\"], one of: " + ", ".join(sorted(supported)))
    if archs[0] not in supported:
        raise ModelConfigError(
            f"{where}: megatron-bridge cannot build architecture '{archs[0]}' as a decoder language model"
            + ("" if supported else " (megatron-bridge is not installed)"),
            "megatron-bridge builds: " + ", ".join(sorted(supported)) if supported else
            "install megatron-bridge 0.6.2 (scripts/setup.sh)")
    for key, what in _REQUIRED.items():
        _positive_int(values, key, where, what)
    experts_key = next((k for k in ("n_routed_experts", "num_experts", "num_local_experts") if values.get(k)), None)
    experts = values.get(experts_key) if experts_key else None
    if experts:
        _positive_int(values, experts_key, where, "the routed experts")
        topk_key = "num_experts_per_tok" if values.get("num_experts_per_tok") else "experts_per_token"
        if not values.get(topk_key):
            raise ModelConfigError(f"{where} has {experts} experts but no 'num_experts_per_tok' (experts per token)",
                                   "add \"num_experts_per_tok\": <int>")
        _positive_int(values, topk_key, where, "experts per token")
        if values[topk_key] > experts:
            raise ModelConfigError(f"{where}: '{topk_key}' is {values[topk_key]}, more than the {experts} routed "
                                   f"experts ('{experts_key}'): a token cannot go to more experts than there are",
                                   f"set \"{topk_key}\" to the model's value (at most {experts})")
        if not (values.get("moe_intermediate_size") or values.get("intermediate_size")):
            raise ModelConfigError(f"{where} has no 'moe_intermediate_size' (the width of one routed expert)",
                                   "add \"moe_intermediate_size\": <int>")
    else:
        _positive_int(values, "intermediate_size", where, "the MLP width")
    for keys, kind in ((_MLA, "multi-latent attention"), (_GDN, "gated DeltaNet")):
        if keys[0] in values:
            for key in keys:
                _positive_int(values, key, where, f"needed with {kind}")
    heads = values["num_attention_heads"]
    kv = values.get("num_key_value_heads") or heads
    if isinstance(kv, int) and heads % kv:
        raise ModelConfigError(f"{where}: {heads} attention heads are not a multiple of num_key_value_heads={kv}",
                               "fix num_attention_heads / num_key_value_heads")


def _slug(values: dict[str, Any]) -> str:
    """A readable name from the values alone (so the key does not depend on where the file lies)."""
    name = str(values.get("_name_or_path") or values.get("model_type") or "model")
    return re.sub(r"[^a-z0-9]+", "_", name.rsplit("/", 1)[-1].lower()).strip("_")[:40] or "model"


def spec_from_values(values: dict[str, Any], where: str = "the model config", file: Path | None = None) -> ModelSpec:
    """The registered catalogue entry for a config.json's values (checked first).

    Raises:
        ModelConfigError: see :func:`check_values`.
    """
    check_values(values, where)
    digest = hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:8]
    slug = _slug(values)
    key = f"user_{slug}_{digest}"
    same = same_catalogue_model(values)
    origin = file or "config values"
    display = (f"{MODELS[same].display} (your {origin}: its published config.json values)" if same
               else f"{slug} ({values['architectures'][0]}, {origin})")
    return register(ModelSpec(key, display, str(file or "(user config)"), values=dict(values), same_as=same))


def load_model_config(path: str | os.PathLike) -> ModelSpec:
    """The catalogue entry for a config.json (or a folder holding one), loaded, checked and registered.

    Raises:
        ModelConfigError: missing file, bad JSON, not an object, a missing key or an unsupported architecture.
    """
    file = _file_of(path)
    return spec_from_values(read_config_json(file), f"'{file}'", file.resolve())
