"""ConfigContainer YAML files with the target they were planned for.

The body is megatron-bridge's own ``ConfigContainer.to_yaml`` output (``_target_`` entries, loadable with
``ConfigContainer.from_yaml``). One comment line on top records what the YAML alone cannot say -- the world size,
hardware, model, seq_length and recipe it was validated for, and the megatron-core / megatron-bridge versions it
was built and validated with -- so that the entry script can refuse (or re-plan for) a mismatching cluster, and
refuse a container with other versions:

    # lcmoe_recipes: {"hardware": "h100", "megatron_bridge": "0.6.2", "megatron_core": "0.19.2", "model": "dsv3", ...}

A ConfigContainer built by :func:`lcmoe_recipes.emit.config_from_plan` carries the same dict as the attribute
``lcmoe_target`` (see :func:`target_of`), so ``launch.submit(cfg)`` knows its target without a YAML.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import LcmoeError
from .stack import installed_stack, load_bridge, quiet_upstream

_MARK = "# lcmoe_recipes: "
TARGET_ATTR = "lcmoe_target"
RESILIENCY_KEY = "slurm_resiliency"
"""The header's mark of a YAML that carries a Slurm job's resiliency (``lcmoe_recipes.jobs.prepare.job_resilience``):
the fields :data:`RESILIENCY_FIELDS` then hold what the job set, not edits of the named recipe."""
RESILIENCY_FIELDS = ("ft", "inprocess_restart", "nvrx_straggler", "checkpoint.non_persistent_save_interval",
                     "checkpoint.non_persistent_ckpt_type")


def target_meta(plan, overrides=()) -> dict[str, Any]:
    """The target a config was planned and validated for: recipe, model, seq_length, world_size, hardware, the
    megatron-bridge recipe it started from (``base_recipe``, None: the pre-training template), overrides, and the
    megatron-core / megatron-bridge versions here (``megatron_core``, ``megatron_bridge``: the entry script
    refuses to run under others, see :func:`lcmoe_recipes.jobs.node.check_versions`).

    Args:
        plan: the :class:`lcmoe_recipes.core.plan.Plan` the config was built from.
        overrides: the Hydra overrides applied after building (strings, in order).
    """
    meta = {"recipe": plan.name, "model": plan.model, "seq_length": plan.seq_length, "world_size": plan.layout.world,
            "hardware": plan.hardware_spec.key, "base_recipe": plan.base_recipe, "overrides": list(overrides),
            **installed_stack()}
    if plan.model_spec.is_user_config:  # a user's config.json travels with the YAML (the cluster may lack the file)
        meta["model_config"] = plan.model_spec.config
    return meta


def target_of(cfg) -> dict[str, Any]:
    """The target dict :func:`lcmoe_recipes.emit.config_from_plan` attached to ``cfg`` ({} for any other ConfigContainer)."""
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


_WRITE_IT = "write one with `python -m lcmoe_recipes.launch ... --dry-run --output FILE` (or ConfigContainer.to_yaml)"


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The header of a YAML written by :func:`write_yaml` ({} for a YAML without one, e.g. upstream's).

    Raises:
        LcmoeError: the file does not exist, is not UTF-8 text, or its header line is not JSON.
    """
    if not Path(path).is_file():
        raise LcmoeError(f"config file '{path}' does not exist", "give the YAML written by `launch --dry-run --output`")
    try:
        with open(path, encoding="utf-8") as handle:
            first = handle.readline()
    except UnicodeDecodeError:
        raise LcmoeError(f"'{path}' is not a UTF-8 text file, so not a ConfigContainer YAML", _WRITE_IT) from None
    if not first.startswith(_MARK):
        return {}
    try:
        meta = json.loads(first[len(_MARK):])
    except json.JSONDecodeError:
        meta = None
    if not isinstance(meta, dict):
        raise LcmoeError(f"'{path}': the '{_MARK.strip()}' header line is not a JSON object",
                         "delete that line (then give --gpus and --hardware), or write the file again with launch")
    if isinstance(meta.get("model_config"), dict):  # a user's config.json: register it under the header's key
        from ..catalog.user import spec_from_values

        meta["model"] = spec_from_values(meta["model_config"], f"the header of '{path}'").key
    return meta


def read_tree(path: str | os.PathLike) -> dict:
    """The YAML document as plain data, checked to be a ConfigContainer at the top.

    Raises:
        LcmoeError: not UTF-8 text, not valid YAML (naming the line and column), or not a ConfigContainer.
    """
    import yaml

    try:
        tree = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise LcmoeError(f"'{path}' is not a UTF-8 text file, so not a ConfigContainer YAML", _WRITE_IT) from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        fix = (f"correct the YAML syntax at line {mark.line + 1}, or write a config afresh: " if mark is not None
               else "write a config afresh: ") + _WRITE_IT.removeprefix("write one with ")
        raise LcmoeError(f"'{path}' is not valid YAML{where}: {problem}", fix) from None
    target = tree.get("_target_") if isinstance(tree, dict) else None
    if not str(target or "").endswith("ConfigContainer"):
        raise LcmoeError(f"'{path}' is not a ConfigContainer YAML: its top level has no "
                         "'_target_: megatron.bridge.training.config.ConfigContainer'", _WRITE_IT)
    return tree


def unknown_keys(tree: dict, where: str = "") -> list[str]:
    """Keys of ``tree`` that are not fields of the dataclass their ``_target_`` names, as 'path (did you mean
    'x'?)'. megatron-bridge's loader drops such keys with a log line; a misspelt field would silently keep its
    default."""
    import dataclasses
    import difflib
    import importlib

    out: list[str] = []
    target = tree.get("_target_")
    fields = None
    if isinstance(target, str) and "." in target:
        module, _, name = target.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            cls = None
        if cls is not None and dataclasses.is_dataclass(cls):
            fields = {f.name for f in dataclasses.fields(cls)}
    for key, value in tree.items():
        path = f"{where}.{key}" if where else str(key)
        if fields is not None and not str(key).startswith("_") and key not in fields:
            close = difflib.get_close_matches(str(key), sorted(fields), n=1, cutoff=0.6)
            out.append(f"{path}" + (f" (did you mean '{where + '.' if where else ''}{close[0]}'?)" if close else ""))
        if isinstance(value, dict) and "_target_" in value:
            out += unknown_keys(value, path)
    return out


def read_yaml(path: str | os.PathLike):
    """(ConfigContainer, meta) from a YAML file.

    Raises:
        LcmoeError: the file does not exist, is not UTF-8 YAML, is not a ConfigContainer, holds a key that is not a
            field of its section (with the closest field name), has a section without ``_target_``, or does not
            load.
    """
    meta = read_meta(path)  # also: the file exists
    tree = read_tree(path)
    load_bridge(quiet=True)
    from megatron.bridge.training.config import ConfigContainer

    unknown = unknown_keys(tree)
    if unknown:
        raise LcmoeError(f"'{path}' has {len(unknown)} key(s) that are not fields of their section: "
                         f"{'; '.join(unknown)}", "correct or delete them (megatron-bridge would drop them silently)")
    import dataclasses

    required = [f.name for f in dataclasses.fields(ConfigContainer) if f.init and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in tree]
    if missing:
        raise LcmoeError(f"'{path}' has no {', '.join(repr(m) for m in missing)} section"
                         f"{'s' if len(missing) > 1 else ''}: megatron-bridge's ConfigContainer requires "
                         f"{'them' if len(missing) > 1 else 'it'}", "restore it from the YAML `launch --dry-run "
                         "--output` writes for this recipe (each section with its _target_ line)")
    try:
        with quiet_upstream():  # its notices describe loading here ("could not determine rank", the deprecation of a
            cfg = ConfigContainer.from_yaml(str(path))  # field every config carries), not the config
    except Exception as exc:  # omegaconf / instantiate errors of many types
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        # hydra's instantiate error is "Error in call to target '...':" with the cause on the next line
        text = " ".join(lines[:2]) if lines and lines[0].endswith(":") else (lines[0] if lines else type(exc).__name__)
        raise LcmoeError(f"'{path}' is not a loadable ConfigContainer YAML: {text}", _WRITE_IT) from None

    data, stated = getattr(cfg, "dataset", None), tree.get("dataset")
    if isinstance(stated, dict) and "mock" in stated and hasattr(data, "mock"):
        # megatron-core 0.19.2 BlendedMegatronDatasetConfig.mock is field(init=False), so from_yaml drops it (it is
        # derived at finalize): keep what the YAML says, as for every other field
        data.mock = bool(stated["mock"])
    plain = [f.name for f in dataclasses.fields(cfg) if "dict" not in str(f.type).lower()  # env_vars is a dict
             and isinstance(getattr(cfg, f.name, None), dict) and isinstance(tree.get(f.name), dict)
             and "_target_" not in tree[f.name]]
    if plain:  # without _target_ a section loads as a plain dict, which nothing downstream can read
        raise LcmoeError(f"'{path}': section(s) {', '.join(plain)} have no _target_, so megatron-bridge loads them as "
                         "plain dicts, not config objects", "restore each section's _target_ line (as in the YAML "
                         "that `launch --dry-run --output` writes)")
    wrong = wrong_types(cfg)
    if wrong:
        raise LcmoeError(f"'{path}' has {len(wrong)} value(s) of the wrong type: {'; '.join(wrong[:5])}"
                         + (" ..." if len(wrong) > 5 else ""), "write a number (or true/false) where the field "
                         "takes one; the loader keeps what the YAML says, and the run would fail on it later")
    return cfg, meta


def wrong_types(cfg) -> list[str]:
    """'section.field: expects T, got 'text'' for each number or boolean field of ``cfg``'s sections that holds a
    string (what a typo in a YAML gives: omegaconf keeps it as written, megatron fails on it much later)."""
    import dataclasses

    out = []
    for section in dataclasses.fields(cfg):
        obj = getattr(cfg, section.name, None)
        if not dataclasses.is_dataclass(obj):
            continue
        for field in dataclasses.fields(obj):
            value = getattr(obj, field.name, None)
            wanted = scalar_type_error(obj, field.name, value) if isinstance(value, str) else None
            if wanted:
                out.append(f"{section.name}.{field.name}: expects {wanted}, got {value!r}")
    return out


def scalar_type_error(obj, name: str, value) -> str | None:
    """The type field ``name`` of dataclass ``obj`` expects ("int", "float or int", "bool"), when it takes only
    numbers or booleans (None aside) and ``value`` is not one of them -- a string, or a float where only an int will
    do (megatron-core sizes and counts: ``range`` and divisibility fail on 4.0) -- else None. None too where the
    field's annotation cannot be resolved (nothing to compare against)."""
    import types
    import typing

    try:
        hint = typing.get_type_hints(type(obj)).get(name)
    except Exception:  # unresolvable forward references upstream
        return None
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = set(typing.get_args(hint)) - {type(None)} if union else {hint}
    if not options or not options <= {int, float, bool} or value is None:
        return None
    wanted = " or ".join(sorted(t.__name__ for t in options))
    if isinstance(value, str) or (isinstance(value, float) and float not in options):
        return wanted
    return None
