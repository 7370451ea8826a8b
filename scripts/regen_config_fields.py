"""Write src/lcmoe_recipes/catalog/config_fields.json: the field names of megatron-bridge's ConfigContainer, per
section, so that an override naming no field at all is refused before megatron-bridge loads (10-40 s).

    python scripts/regen_config_fields.py            # rewrite the file from the installed megatron-bridge
    python scripts/regen_config_fields.py --check    # exit 1 if the file differs from what upstream gives now

Per section: the union of the fields of the dataclasses its annotation names and of every loaded dataclass subclass
of them (``model``: every model provider megatron-bridge defines, all TransformerConfig subclasses), so a name valid
for any config of that section passes; the real check against the built config follows
(:func:`lcmoe_recipes.emit.apply_overrides`). Sections whose annotation is not a dataclass are left out (not checked).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from _generated import generated_main  # noqa: E402

TARGET = ROOT / "src" / "lcmoe_recipes" / "catalog" / "config_fields.json"


def _subclasses(cls: type) -> set[type]:
    """Every subclass megatron defines (not a test's or our own stand-in), at any depth."""
    out = set()
    for sub in cls.__subclasses__():
        out |= ({sub} if sub.__module__.startswith("megatron.") else set()) | _subclasses(sub)
    return out


def _dataclasses_of(annotation) -> set[type]:
    args = typing.get_args(annotation)
    if args:
        return set().union(*(_dataclasses_of(a) for a in args))
    return {annotation} if isinstance(annotation, type) and dataclasses.is_dataclass(annotation) else set()


def generate() -> str:
    from lcmoe_recipes.emit.stack import load_bridge

    load_bridge(quiet=True)
    import importlib

    # every module that defines a ConfigContainer section class (model providers, diffusion providers and dataset
    # configs, PEFT methods), so the union does not depend on what else happens to be imported
    for name in ("megatron.bridge", "megatron.bridge.models", "megatron.bridge.diffusion.models", "megatron.bridge.peft",
                 "megatron.bridge.peft.lora", "megatron.bridge.peft.dora", "megatron.bridge.peft.canonical_lora"):
        importlib.import_module(name)
    from megatron.bridge.training.config import ConfigContainer
    from megatron.core.transformer.transformer_config import TransformerConfig

    hints = typing.get_type_hints(ConfigContainer)
    sections = {}
    for field in dataclasses.fields(ConfigContainer):
        if field.name.startswith("_"):
            continue
        classes = _dataclasses_of(hints[field.name])
        classes |= set().union(*(_subclasses(c) for c in classes)) if classes else set()
        if field.name == "model":  # and every provider megatron-bridge defines, whatever it derives from
            classes |= {c for c in _subclasses(TransformerConfig) if dataclasses.is_dataclass(c)}
        if classes:
            names = set().union(*({f.name for f in dataclasses.fields(c)} for c in classes))
            sections[field.name] = sorted(names)
    doc = {"versions": {"megatron-bridge": version("megatron-bridge"), "megatron-core": version("megatron-core")},
           "top_level": sorted(f.name for f in dataclasses.fields(ConfigContainer) if not f.name.startswith("_")),
           "sections": sections}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    return generated_main(__doc__.splitlines()[0], lambda: {TARGET: generate()}, ROOT,
                          "python scripts/regen_config_fields.py", argv)


if __name__ == "__main__":
    sys.exit(main())
