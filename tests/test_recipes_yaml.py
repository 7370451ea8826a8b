"""recipes/*.yaml are what the code emits now, and each loads back and validates for its target."""

from pathlib import Path

import pytest
from scripts_loader import load_script

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def _regen():
    module = load_script("regen_recipes")
    return module


def test_recipe_files_are_current(tmp_path):
    emitted = _regen().emit_all(tmp_path)
    assert sorted(p.name for p in (ROOT / "recipes").glob("*.yaml")) == sorted(p.name for p in emitted.values())
    for name, path in emitted.items():
        assert path.read_text() == (ROOT / "recipes" / path.name).read_text(), (
            f"recipes/{path.name} is stale: run python scripts/regen_recipes.py")


def test_recipe_files_load_and_validate():
    from lcmoe_recipes.emit import read_yaml, validate_config

    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        cfg, meta = read_yaml(path)
        assert meta["recipe"] == path.stem
        validate_config(cfg, meta["hardware"], meta["world_size"], meta["recipe"])
