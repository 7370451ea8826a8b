"""Write tests/published_flops.py: for every published throughput row, the model FLOPs megatron-bridge counted when
the row was measured, over ours.

A published TFLOP/s is megatron-bridge's ``num_floating_point_operations`` over the measured step, computed by the
release that ran it. That formula changed between releases (v0.5.0 began to count sliding-window attention; before it,
an attention block whose heads x head dim differ from the hidden size was counted at the hidden size -- gpt-oss-120b's
64 x 64 = 4,096 against 2,880). To compare our predicted step with a published one, each row's value is brought to
our FLOP count: ``published / ratio`` (``tests/published.py``, ``Row.comparable``).

Which formula a row was counted with: a performance-summary row, that of the Megatron-Bridge release its NeMo
container ships (``src/lcmoe_recipes/catalog/containers.yaml``); a model-verification card row, that of the card's
``bridge_commit``; a skills-card row, that of the commit its value is read at (the tracker export), or for a card read
at the head, the commit that added the card.

    python scripts/flops_conventions.py --bridge-repo PATH   # a git clone of NVIDIA-NeMo/Megatron-Bridge

The installed megatron-bridge answers for the rows counted by its own release line; ``tests/test_comm_step.py`` checks
those rows against it, so CI (which has no clone) still tests part of this file.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import subprocess
import sys
import tempfile
import types
import warnings
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
OUT = ROOT / "tests" / "published_flops.py"
FLOPS_FILE = "src/megatron/bridge/training/utils/flop_utils.py"
# modules an older flop_utils.py imported that the installed release moved; only its LoRA / packed-data paths read
# them, which no published pretraining row takes
_MOVED = {"megatron.bridge.data.datasets.packing_utils": ("calculate_avg_seqlen",)}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _release_of_container(container: str) -> str:
    entries = yaml.safe_load((ROOT / "src/lcmoe_recipes/catalog/containers.yaml").read_text())["containers"]
    for c in entries:
        if c["image"].endswith(":" + container):
            return "v" + c["megatron-bridge"]
    raise SystemExit(f"container {container} is not in containers.yaml")


def convention_commit(repo: Path, row) -> str:
    """The tag or commit of megatron-bridge whose formula counted ``row`` (module doc)."""
    src = row.source
    if src.quality == "primary-table":
        return _release_of_container(src.where.split()[0])
    if "bridge_commit" in src.where:
        return _git(repo, "rev-parse", src.where.split("bridge_commit ")[1].rstrip(")"))
    from published import HEAD

    if src.commit != HEAD:
        return src.commit
    return _git(repo, "log", "--diff-filter=A", "--format=%H", "--", src.file).splitlines()[-1]


def _formula(repo: Path, commit: str, cache: dict):
    if commit not in cache:
        for name, attrs in _MOVED.items():
            module = sys.modules.setdefault(name, types.ModuleType(name))
            for attr in attrs:
                setattr(module, attr, getattr(module, attr, None))
        text = _git(repo, "show", f"{commit}:{FLOPS_FILE}")
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(text)
        spec = importlib.util.spec_from_file_location(f"flop_utils_{commit[:12]}", f.name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cache[commit] = module.num_floating_point_operations
    return cache[commit]


def upstream_flops_per_token(formula, plan) -> float:
    """``formula``'s model FLOPs per token (forward + backward) for ``plan``'s model, MTP and seq_length."""
    from published import _plan

    from lcmoe_recipes.emit import config_from_plan

    probe = _plan("flops", plan.model, plan.hardware, 8, plan.seq_length, "bf16", 8, mtp=plan.mtp_num_layers)
    cfg = config_from_plan(probe, validate=False, quiet=True)
    try:
        return formula(cfg, 1) / plan.seq_length
    except ValueError:
        # releases before the GDN-with-MTP fix (megatron-bridge 7d03e8cad) read linear_attention_freq as their
        # bridge wrote it, the period (qwen3_next_bridge.py: full_attention_interval), and fail on the per-layer
        # list a later bridge writes: give such a formula the period
        pattern = getattr(cfg.model, "linear_attention_freq", None)
        period = _period(pattern)
        if period is None:
            raise
        cfg.model.linear_attention_freq = period
        return formula(cfg, 1) / plan.seq_length


def _period(pattern) -> int | None:
    """p where ``pattern`` (1 = linear attention, 0 = full) is 0 exactly at every p-th layer, else None."""
    if not isinstance(pattern, list) or 0 not in pattern:
        return None
    p = pattern.index(0) + 1
    return p if all((v == 0) == ((i + 1) % p == 0) for i, v in enumerate(pattern)) else None


def build(repo: Path) -> str:
    from published import THROUGHPUT_ROWS

    from lcmoe_recipes.cost.step import model_flops_per_token
    from lcmoe_recipes.emit.stack import load_bridge

    load_bridge(quiet=True)  # megatron-bridge without Transformer Engine, before an old formula imports it
    cache: dict = {}
    lines = ['"""Generated by `python scripts/flops_conventions.py --bridge-repo PATH` (its doc says how each row\'s',
             "formula is chosen): per published throughput row, (the megatron-bridge tag or commit whose",
             "num_floating_point_operations counted it, that count over our model FLOPs for the row's model and",
             "seq_length); None where that formula raises on the configuration (no correction: the row is compared",
             'at our count)."""', "", "FLOPS_CONVENTION = {"]
    for key, row in THROUGHPUT_ROWS.items():
        commit = convention_commit(repo, row)
        try:
            flops = upstream_flops_per_token(_formula(repo, commit, cache), row.plan)
        except (ValueError, AssertionError) as exc:  # that release cannot count this configuration: no correction
            lines.append(f"    {key!r}: ({commit!r}, None),  # raises: {str(exc)[:60]}")
            continue
        lines.append(f"    {key!r}: ({commit!r}, {flops / model_flops_per_token(row.plan):.4f}),")
    return "\n".join(lines + ["}", ""])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bridge-repo", type=Path, required=True, help="a git clone of NVIDIA-NeMo/Megatron-Bridge")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    OUT.write_text(build(args.bridge_repo))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
