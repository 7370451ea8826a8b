"""Write recipes/<name>.yaml for every named recipe (the ConfigContainer YAML ``launch --dry-run`` writes).

    python scripts/regen_recipes.py            # rewrite recipes/*.yaml
    python scripts/regen_recipes.py --check    # exit 1 if any file differs from what the code emits now

The files are the listable, copyable form of the named recipes (``tests/test_recipes_yaml.py`` checks they are
current; ``tests/test_full_env.py`` checks that the full environment, with Transformer Engine, emits the same).
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def emit_all(folder: Path) -> dict[str, Path]:
    """Write every named recipe's YAML into ``folder``; returns name -> path."""
    from lcmoe_recipes import NAMED_RECIPES, recipe_plan
    from lcmoe_recipes.emit import config_from_plan, target_meta, write_yaml

    out = {}
    for name in NAMED_RECIPES:
        plan = recipe_plan(name)
        cfg = config_from_plan(plan, quiet=True)
        out[name] = write_yaml(cfg, folder / f"{name}.yaml", target_meta(plan))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with recipes/ instead of writing")
    parser.add_argument("--dir", type=Path, default=ROOT / "recipes", help="folder of the YAML files")
    args = parser.parse_args(argv)
    if not args.check:
        for name, path in emit_all(args.dir).items():
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        return 0
    stale = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in emit_all(Path(tmp)).items():
            current = args.dir / path.name
            new = path.read_text().splitlines(keepends=True)
            old = current.read_text().splitlines(keepends=True) if current.exists() else []
            if new != old:
                stale += 1
                sys.stdout.writelines(difflib.unified_diff(old, new, str(current), f"emitted {name}", n=1))
    print(f"{stale} recipe file(s) differ" if stale else "recipes/ is current")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
