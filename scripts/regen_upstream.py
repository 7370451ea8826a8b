"""Write src/lcmoe_recipes/catalog/upstream_recipes.json: megatron-bridge's own pretrain recipes that the offline
catalogue can build, with the settings the planner reads (see lcmoe_recipes.catalog.upstream).

    python scripts/regen_upstream.py            # rewrite the file from the installed megatron-bridge
    python scripts/regen_upstream.py --check    # exit 1 if the file differs from what upstream gives now

Run it after changing the pinned megatron-bridge / megatron-core or adding a catalogue model.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from _generated import generated_main  # noqa: E402
TARGET = ROOT / "src" / "lcmoe_recipes" / "catalog" / "upstream_recipes.json"


def generate() -> str:
    """The JSON text: versions and one record per recipe, sorted by function path."""
    from lcmoe_recipes.emit.upstream import discover, summarize

    records = [r for r in (summarize(path, hub_id, cfg) for path, hub_id, cfg in discover()) if r is not None]
    doc = {"versions": {"megatron-bridge": version("megatron-bridge"), "megatron-core": version("megatron-core")},
           "recipes": sorted(records, key=lambda r: r["function"])}
    return json.dumps(doc, indent=1, sort_keys=True, default=repr) + "\n"


def main(argv: list[str] | None = None) -> int:
    return generated_main(__doc__.splitlines()[0], lambda: {TARGET: generate()}, ROOT,
                          "python scripts/regen_upstream.py", argv)


if __name__ == "__main__":
    sys.exit(main())
