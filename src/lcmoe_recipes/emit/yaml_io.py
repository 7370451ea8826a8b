"""ConfigContainer YAML files with the target they were planned for.

The body is megatron-bridge's own ``ConfigContainer.to_yaml`` output (``_target_`` entries, loadable with
``ConfigContainer.from_yaml``). One comment line on top records what the YAML alone cannot say -- the world size,
hardware, model, seq_length and recipe it was validated for, and the megatron-core / megatron-bridge versions it
was built and validated with -- so that the entry script can refuse (or re-plan for) a mismatching cluster, and
refuse a container with other versions:

    # lcmoe_recipes: {"hardware": "h100", "megatron_bridge": "0.6.2", "megatron_core": "0.19.2", "model": "dsv3", ...}

A ConfigContainer built by :func:`lcmoe_recipes.emit.build_config` carries the same dict as the attribute
``lcmoe_target`` (see :func:`target_of`), so ``launch.submit(cfg)`` knows its target without a YAML.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import LcmoeError
from .stack import load_bridge, stack_versions

_MARK = "# lcmoe_recipes: "
TARGET_ATTR = "lcmoe_target"


def target_meta(plan, overrides=()) -> dict[str, Any]:
    """The target a config was planned and validated for: recipe, model, seq_length, world_size, hardware, overrides,
    and the megatron-core / megatron-bridge versions here (``megatron_core``, ``megatron_bridge``: the entry script
    refuses to run under others, see :func:`lcmoe_recipes.train.check_versions`).

    Args:
        plan: the :class:`lcmoe_recipes.plan.Plan` the config was built from.
        overrides: the Hydra overrides applied after building (strings, in order).
    """
    return {"recipe": plan.name, "model": plan.model, "seq_length": plan.seq_length, "world_size": plan.layout.world,
            "hardware": plan.hardware_spec.key, "overrides": list(overrides), **stack_versions()}


def target_of(cfg) -> dict[str, Any]:
    """The target dict :func:`lcmoe_recipes.emit.build_config` attached to ``cfg`` ({} for any other ConfigContainer)."""
    return dict(getattr(cfg, TARGET_ATTR, None) or {})


def write_yaml(cfg, path: str | os.PathLike, meta: dict[str, Any]) -> Path:
    """Write ``cfg`` as YAML with the ``meta`` header line; atomic (a temp file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        cfg.to_yaml(tmp)
        body = Path(tmp).read_text(encoding="utf-8")
        Path(tmp).write_text(_MARK + json.dumps(meta, sort_keys=True) + "\n" + body, encoding="utf-8")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a config is meant to be shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The header of a YAML written by :func:`write_yaml` ({} for a YAML without one, e.g. upstream's).

    Raises:
        LcmoeError: the file does not exist.
    """
    if not Path(path).is_file():
        raise LcmoeError(f"config file '{path}' does not exist", "give the YAML written by `launch --dry-run --output`")
    with open(path, encoding="utf-8") as handle:
        first = handle.readline()
    return json.loads(first[len(_MARK):]) if first.startswith(_MARK) else {}


def read_yaml(path: str | os.PathLike):
    """(ConfigContainer, meta) from a YAML file.

    Raises:
        LcmoeError: the file does not exist or is not a ConfigContainer YAML.
    """
    meta = read_meta(path)  # also: the file exists
    load_bridge(quiet=True)
    from megatron.bridge.training.config import ConfigContainer

    try:
        cfg = ConfigContainer.from_yaml(str(path))
    except Exception as exc:  # omegaconf / instantiate errors of many types
        raise LcmoeError(f"'{path}' is not a loadable ConfigContainer YAML: {str(exc).splitlines()[0]}",
                         "write it with `python -m lcmoe_recipes.launch ... --dry-run --output FILE`") from None
    return cfg, meta
