"""megatron-bridge's ConfigContainer field names (``config_fields.json``, written by ``scripts/regen_config_fields.py``
from the installed megatron-bridge), for refusing an override that names no field at all before megatron-bridge
loads. Only what no config of a section can have is refused here; the built config checks the rest
(:func:`lcmoe_recipes.emit.apply_overrides`)."""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def _document() -> dict:
    return json.loads(resources.files(__package__).joinpath("config_fields.json").read_text(encoding="utf-8"))


def closest(word: str, names: list[str]) -> str | None:
    """The name of ``names`` closest to ``word`` (difflib, ratio 0.6 or more), or None."""
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    return close[0] if close else None


def override_key(text: str) -> str:
    """The dotted key a Hydra override ``text`` sets or removes: ``model.tensor_model_parallel_size`` for
    ``model.tensor_model_parallel_size=4``, ``+key=value`` and ``~key``."""
    return text.strip().lstrip("+~").partition("=")[0].strip()


def unknown_override(text: str, following: str | None = None) -> tuple[str, str] | None:
    """(what is wrong, the fix) when the Hydra override ``text`` (``key=value``, ``+key=value``, ``~key``) sets
    nothing (no ``=``), names a ConfigContainer section that does not exist (the fix names the section(s) that have
    such a field, where one does: ``tensor_model_parallel_size=4`` -> ``model.tensor_model_parallel_size=4``), or a
    field no config of that section has; None otherwise (also for what only Hydra's parser can judge: it runs
    later). ``following``: the override after it on the command line (``key value`` typed with a space is two)."""
    key = override_key(text)
    if not key:
        return None
    stripped = text.strip()
    if "=" not in stripped and not stripped.startswith("~"):
        joined = f"{stripped}={following.strip()}" if following and "=" not in following else f"{stripped}=VALUE"
        return (f"override '{text}' sets nothing: a Hydra override is key=value (or ~key to delete one)",
                f"write '{joined}' as one argument, without spaces around '='")
    parts = key.split(".")
    doc = _document()
    if parts[0] not in doc["top_level"]:
        owners = sorted((name for name, fields in doc["sections"].items() if parts[0] in fields),
                        key=lambda name: name != "model")  # the model's field first: what a layout override means
        rest = stripped[stripped.index(parts[0]) + len(parts[0]):]
        lead = stripped[:stripped.index(parts[0])]
        if owners:
            return (f"override '{text}': '{parts[0]}' is not a section of megatron-bridge's ConfigContainer but a "
                    f"field of {' and '.join(owners)}",
                    " or ".join(f"'{lead}{owner}.{parts[0]}{rest}'" for owner in owners) + " (section.field=value)")
        close = closest(parts[0], doc["top_level"])
        return (f"override '{text}': '{parts[0]}' is not a section of megatron-bridge's ConfigContainer",
                f"use '{close}{key[len(parts[0]):]}'" if close else
                f"use one of the sections {', '.join(doc['top_level'])}")
    names = doc["sections"].get(parts[0])
    if len(parts) < 2 or names is None or parts[1] in names:
        return None
    close = closest(parts[1], names)
    where = f"{parts[0]}.{parts[1]}"
    return (f"override '{text}': '{where}' is not a field of any megatron-bridge {parts[0]} config",
            f"use '{parts[0]}.{close}{key[len(where):]}'" if close else
            f"fields of {parts[0]} include: {', '.join([n for n in names if not n.startswith('_')][:12])} ...")
