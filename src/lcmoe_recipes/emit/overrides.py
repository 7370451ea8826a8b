"""Hydra overrides on a ConfigContainer, with megatron-bridge's own override utilities.

Grammar (Hydra's): ``model.tensor_model_parallel_size=8`` changes a field, ``+env_vars.NCCL_DEBUG=INFO`` adds a
key, ``~model.recompute_modules`` deletes one. The flow is megatron-bridge's (``training/utils/omegaconf_utils.py``):
``create_omegaconf_dict_config`` -> ``parse_hydra_overrides`` -> ``OmegaConf.to_container`` -> ``apply_overrides``.

Two gaps of that flow are closed here, never silently:
* ``apply_overrides`` skips (with a log line) a key that is not a field of the target dataclass, so ``+model.foo=1``
  would vanish; we refuse it, naming the closest field;
* deleting a dataclass field (``~model.x``) leaves the old value in place upstream; we reset it to the field's
  dataclass default, which is what "delete" means for a dataclass.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from ..catalog.config_fields import closest
from ..errors import OverrideError
from .stack import load_bridge
from .yaml_io import scalar_type_error


def _parse(overrides: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(overrides=overrides)
    except Exception as exc:  # hydra raises OverrideParseException with a caret diagram
        first = str(exc).strip().splitlines()[0]
        raise OverrideError(f"cannot parse override(s) {overrides}: {first}",
                            "use Hydra syntax: key=value, +key=value (add), ~key (delete), e.g. "
                            "model.tensor_model_parallel_size=4") from None


def _fields(obj: Any) -> list[str]:
    if dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj)]
    return list(obj.keys()) if isinstance(obj, dict) else []


def _resolve_parent(cfg: Any, key: str, text: str):
    """(parent object, last key) for a dotted key, or OverrideError naming the first unknown part."""
    parts = key.split(".")
    obj = cfg
    for depth, part in enumerate(parts[:-1]):
        nxt = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, _MISSING)
        if nxt is _MISSING or nxt is None:
            _unknown(obj, part, ".".join(parts[: depth + 1]), text)
        obj = nxt
    return obj, parts[-1]


_MISSING = object()


def _unknown(obj: Any, part: str, path: str, text: str) -> None:
    names = _fields(obj)
    close = closest(part, names)
    owner = type(obj).__name__
    raise OverrideError(f"override '{text}': '{path}' is not a field of {owner}",
                        f"did you mean '{path.rsplit('.', 1)[0] + '.' if '.' in path else ''}{close}'?" if close
                        else f"fields of {owner} include: {', '.join(names[:12])} ...")


def _check_type(parent: Any, name: str, override) -> None:
    """OverrideError when ``override`` gives field ``name`` of dataclass ``parent``, which takes only numbers or
    booleans, a value of another type (megatron-bridge's flow keeps a string as written, and the run fails on it
    much later, or a report here fails on it first)."""
    value = override.value()
    wanted = scalar_type_error(parent, name, value)
    if wanted:
        current = getattr(parent, name, None)
        article = "an" if wanted[0] in "aeiou" else "a"
        example = f" (e.g. {override.key_or_group}=" + (
            f"{str(current).lower() if isinstance(current, bool) else current})" if current is not None else "")
        raise OverrideError(f"override '{override.input_line}': {override.key_or_group} expects {wanted}, got "
                            f"{value!r}", f"write {article} {wanted} value" + (example if current is not None else ""))


def apply_overrides(cfg, overrides: list[str], unchanged: list[str] | None = None):
    """Apply Hydra overrides to ``cfg`` in place and return it. ``unchanged``: a list that receives each override
    that left its field as it was (it set the value the config had).

    Raises:
        OverrideError: bad syntax, an unknown key (with the closest field name), or a value of the wrong type.
    """
    if not overrides:
        return cfg
    load_bridge(quiet=True)
    from omegaconf import OmegaConf
    from megatron.bridge.training.utils.omegaconf_utils import (
        OverridesError,
        apply_overrides as bridge_apply_overrides,
        create_omegaconf_dict_config,
        parse_hydra_overrides,
    )

    parsed = _parse(overrides)
    before = []  # (override, its field's value before any override), for ``unchanged``
    # Check every key against the real objects before anything changes (nothing half-applied).
    for override in parsed:
        key = override.key_or_group
        parent, last = _resolve_parent(cfg, key, override.input_line)
        present = (last in parent) if isinstance(parent, dict) else hasattr(parent, last)
        if present and unchanged is not None:
            value = parent.get(last) if isinstance(parent, dict) else getattr(parent, last)
            before.append((override, copy.deepcopy(value)))
        if not present and not (isinstance(parent, dict) and override.is_add()):
            _unknown(parent, last, key, override.input_line)
        if dataclasses.is_dataclass(parent) and not override.is_delete():
            _check_type(parent, last, override)

    omega, excluded = create_omegaconf_dict_config(cfg)
    try:
        omega = parse_hydra_overrides(omega, overrides)
    except OverridesError as exc:
        message = str(exc).replace("Failed to parse Hydra overrides: ", "").strip().splitlines()[0]
        raise OverrideError(f"override(s) {overrides} rejected: {message}",
                            "check the key and the value's type (e.g. integers for parallel sizes)") from None
    bridge_apply_overrides(cfg, OmegaConf.to_container(omega, resolve=True), excluded)

    for override in parsed:
        if override.is_delete():
            parent, last = _resolve_parent(cfg, override.key_or_group, override.input_line)
            if dataclasses.is_dataclass(parent):
                field = {f.name: f for f in dataclasses.fields(parent)}[last]
                if field.default is not dataclasses.MISSING:
                    default = field.default
                elif field.default_factory is not dataclasses.MISSING:
                    default = field.default_factory()
                else:
                    raise OverrideError(f"override '{override.input_line}': {last} has no default to reset to",
                                        f"set it instead: {override.key_or_group}=VALUE")
                setattr(parent, last, default)
    for override, value in before:
        parent, last = _resolve_parent(cfg, override.key_or_group, override.input_line)
        if (parent.get(last) if isinstance(parent, dict) else getattr(parent, last, _MISSING)) == value:
            unchanged.append(override.input_line)
    return cfg


def _hydra_string(text: str) -> str:
    if "'" in text or "\\" in text:
        raise OverrideError(f"path or name {text!r} contains a quote or backslash",
                            "rename it or use a symlink without those characters")
    return f"'{text}'"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def data_overrides(data_path: list[str] | None = None, tokenizer: str | None = None) -> list[str]:
    """Hydra overrides that switch a recipe from mock data to real data and a Hugging Face tokenizer.

    Args:
        data_path: Megatron's ``--data-path`` form, read with megatron-core's ``get_blend_from_list``: prefixes of
            ``.bin``/``.idx`` files (``["/data/a_text_document"]``), or weight-prefix pairs
            (``["0.7", "/data/a", "0.3", "/data/b"]``). The paths are read on the cluster, not here.
        tokenizer: a Hugging Face tokenizer name or folder (``tokenizer_type=HuggingFaceTokenizer``).

    Returns:
        Override strings for :func:`apply_overrides` (``dataset.blend=...``, ``tokenizer.*``); [] when both are None.

    Raises:
        OverrideError: a list that mixes weights and unweighted prefixes (megatron-core would read the weights as
        prefixes), or a path with a quote.
    """
    overrides = []
    if data_path:
        load_bridge(quiet=True)
        from megatron.core.datasets.utils import get_blend_from_list

        prefixes, weights = get_blend_from_list(list(data_path))
        if weights is None and any(_is_number(p) for p in prefixes):
            raise OverrideError(f"`data_path` {' '.join(data_path)} mixes weights and unweighted prefixes",
                                "give prefixes only (data_path=/data/a /data/b), or a weight before every prefix "
                                "(data_path=0.7 /data/a 0.3 /data/b)", fields=("data_path",))
        listed = ",".join(_hydra_string(p) for p in prefixes)
        weighted = "null" if weights is None else "[" + ",".join(repr(float(w)) for w in weights) + "]"
        overrides += [f"dataset.blend=[[{listed}],{weighted}]", "dataset.mock=false"]
    if tokenizer:
        overrides += ["tokenizer.tokenizer_type=HuggingFaceTokenizer",
                      f"tokenizer.tokenizer_model={_hydra_string(tokenizer)}"]
    return overrides


def save_overrides(save_dir: str | None = None) -> list[str]:
    """Hydra overrides that put a run's checkpoints and logs under ``save_dir`` (``--save-dir``).

    ``checkpoint.save`` and ``checkpoint.load`` = ``DIR/checkpoints`` (megatron-bridge resumes from the latest
    checkpoint there and starts afresh, or from ``checkpoint.pretrained_checkpoint``, while there is none: a job
    resubmitted after its time limit continues), ``logger.tensorboard_dir`` = ``DIR/tensorboard``,
    ``logger.wandb_save_dir`` = ``DIR/wandb``. Put them before the user's overrides so an explicit
    ``checkpoint.load=...`` wins.

    Raises:
        OverrideError: a relative ``save_dir`` (the ranks of a Slurm job run in the job's code folder), or one with a
            quote.
    """
    if not save_dir:
        return []
    if not save_dir.startswith("/"):
        raise OverrideError(f"`save_dir` {save_dir!r} is relative; the ranks of a Slurm job run in the job's code "
                            "folder, so checkpoints would land there",
                            "give an absolute folder on storage every node sees, e.g. save_dir=/lustre/$USER/run1",
                            fields=("save_dir",))
    folder = save_dir.rstrip("/")
    checkpoints = _hydra_string(f"{folder}/checkpoints")
    return [f"checkpoint.save={checkpoints}", f"checkpoint.load={checkpoints}",
            f"logger.tensorboard_dir={_hydra_string(folder + '/tensorboard')}",
            f"logger.wandb_save_dir={_hydra_string(folder + '/wandb')}"]
