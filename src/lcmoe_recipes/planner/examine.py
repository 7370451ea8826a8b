"""Examining a config before it is queued -- ours, upstream's or a user's YAML, or a named recipe -- for a target:
the plan it states, every finding (our checks, the cost model, megatron-bridge ``validate()``, the known upstream bugs
for the versions it will run with), and what was checked. The command line is :mod:`lcmoe_recipes.cli.check`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..catalog import get_hardware, load_model_config
from ..checks import Finding
from ..checks.findings import all_findings
from ..checks.known_issues import job_versions
from ..core.plan import BASE_NOT_RECORDED, Plan
from ..core.request import TrainingRequest
from ..errors import LcmoeError, UnknownName
from .recipes import NAMED_RECIPES, named_recipe, recipe_plan


@dataclasses.dataclass(frozen=True)
class Examination:
    """What :func:`examine` found.

    Attributes:
        plan: the plan the config states, for the target examined.
        findings: every finding, errors first where the checks sort them.
        scope: what was checked, in words.
        data: the data and tokenizer the config trains on, in words (:func:`lcmoe_recipes.emit.paths.data_text`).
        cfg: the ConfigContainer examined (a named recipe's own), for the effective settings read back from it.
    """

    plan: Plan
    findings: list[Finding]
    scope: str
    data: str = ""
    cfg: object = None

    @property
    def errors(self) -> int:
        """The number of error findings (the command exits 1 when there is any)."""
        return sum(f.severity == "error" for f in self.findings)


def edits_of_named_recipe(cfg, meta: dict) -> list[tuple[str, object, object]]:
    """(field path, the named recipe's value, this config's) for every field of ``cfg`` that differs from the named
    recipe its header names, built with the header's options and with its overrides applied ([] for a YAML of no
    named recipe). A header that marks a Slurm job's resiliency (``slurm_resiliency``) leaves out the fields the job
    set."""
    name = meta.get("recipe")
    if name not in NAMED_RECIPES or meta.get("retargeted_from"):
        return []
    from .. import emit
    from ..emit.settings import flat_fields
    from ..emit.yaml_io import RESILIENCY_FIELDS, RESILIENCY_KEY

    try:
        reference = emit.config_from_plan(recipe_plan(name, **meta.get("options", {})), validate=False)
    except LcmoeError:  # options this version does not know: nothing to compare against
        return []
    if meta.get("overrides"):
        emit.apply_overrides(reference, list(meta["overrides"]))
    ours, theirs = flat_fields(cfg), flat_fields(reference)
    missing = "(absent)"
    job = RESILIENCY_FIELDS if meta.get(RESILIENCY_KEY) else ()  # what a Slurm job set: not an edit
    return [(path, theirs.get(path, missing), ours.get(path, missing)) for path in sorted(set(ours) | set(theirs))
            if str(ours.get(path, missing)) != str(theirs.get(path, missing))
            and not any(path == f or path.startswith(f + ".") for f in job)]


def _not_found(config: str) -> LcmoeError:
    """The error for a CONFIG that names no file: a missing YAML, or a name that is no named recipe (with the closest
    one, as :func:`lcmoe_recipes.planner.recipes.named_recipe` words it)."""
    if Path(config).suffix in (".yaml", ".yml") or "/" in config:
        return LcmoeError(f"config file '{config}' does not exist", "give the path of a ConfigContainer YAML, e.g. the "
                          "out/<recipe>.yaml that launch --dry-run writes")
    try:
        named_recipe(config)
    except UnknownName as exc:
        return LcmoeError(f"'{config}' is neither a file nor a named recipe", f"{exc.fix}; or give a ConfigContainer "
                          "YAML")
    return LcmoeError(f"'{config}' is not a named recipe as written", f"write it as {named_recipe(config).name}")


def read_config(config: str, gpus: int | None = None, hardware: str | None = None):
    """(ConfigContainer, YAML header, Hardware, world size) of a ConfigContainer YAML, for ``gpus`` x ``hardware``
    or, where not given, the target its header records.

    Raises:
        LcmoeError: a missing file or a name that is neither a file nor a named recipe (with the closest one), a
            target the YAML does not record; UnknownName: unknown hardware.
    """
    if not Path(config).is_file():
        raise _not_found(config)
    from .. import emit

    meta = emit.read_meta(config)
    gpus, hw_key = gpus or meta.get("world_size"), hardware or meta.get("hardware")
    missing = [flag for flag, value in (("--gpus N", gpus), ("--hardware NAME", hw_key)) if not value]
    if missing:
        emit.read_tree(config)  # a file that is no ConfigContainer YAML says so first
        raise LcmoeError(f"'{config}' does not record its target", f"give {' and '.join(missing)}")
    cfg, _ = emit.read_yaml(config)
    return cfg, meta, get_hardware(hw_key), gpus


def _read_back(cfg, meta: dict, hw, gpus: int, name: str) -> Plan:
    """The Plan a YAML's config states, with the megatron-bridge recipe its header says it started from (or the
    reason that says no header records one)."""
    from .. import emit

    plan = emit.plan_from_config(cfg, hw, gpus, name, meta.get("base_recipe"))
    if "base_recipe" in meta:
        return plan
    return plan.with_changes(reasons={**plan.reasons, "base_recipe": BASE_NOT_RECORDED})


def config_plan(config: str, gpus: int | None = None, hardware: str | None = None) -> Plan:
    """The Plan a named recipe or a ConfigContainer YAML (:func:`read_config`) states.

    Raises:
        LcmoeError: see :func:`read_config`.
    """
    if config in NAMED_RECIPES and not Path(config).exists():
        return recipe_plan(config)
    cfg, meta, hw, gpus = read_config(config, gpus, hardware)
    return _read_back(cfg, meta, hw, gpus, meta.get("recipe") or Path(config).stem)


def examine(config: str, gpus: int | None = None, hardware: str | None = None, container_image: str | None = None,
            model_config: str | None = None, overlay: bool = True) -> Examination:
    """Examine ``config`` (a ConfigContainer YAML path or a named recipe) for ``gpus`` x ``hardware`` (default: the
    YAML header's or the recipe's target).

    Args:
        container_image: judge known upstream bugs for the versions a job on this image runs (default: installed):
            through an overlay of the pinned megatron where it needs one, unless ``overlay`` is False.
        model_config: the config.json of the YAML's model when it is not in the catalogue and the YAML has no
            lcmoe_recipes header carrying it.

    Raises:
        LcmoeError: a missing file or unknown recipe (with the closest name), a target the YAML does not record, a GPU
            count that does not fill whole nodes (with the counts that do); ModelConfigError: a bad ``model_config``; UnknownName: unknown hardware.
    """
    hw_arg = get_hardware(hardware) if hardware else None  # fail fast, before any heavy import
    if gpus is not None and gpus < 1:
        raise LcmoeError(f"`gpus` {gpus} is not a positive GPU count", "e.g. gpus=256", fields=("gpus",))
    if model_config:
        load_model_config(model_config)  # a catalogue entry before the YAML is read back (bad file: exit 2)
    if config in NAMED_RECIPES and not Path(config).exists():
        plan = recipe_plan(config)
        if gpus or hw_arg:  # the same recipe on another target: whole nodes first
            TrainingRequest.parse(model=plan.model, hardware=(hw_arg or plan.hardware_spec).key,
                                  num_gpus=gpus or plan.layout.world)
            plan = plan.with_changes(layout=dataclasses.replace(plan.layout, world=gpus or plan.layout.world),
                                     hardware=(hw_arg or plan.hardware_spec).key)
        from .. import emit

        # the recipe's own ConfigContainer, judged as its YAML is: upstream validate() and the known upstream bugs
        # read its fields, not the plan's
        cfg = emit.config_from_plan(plan, validate=False, quiet=True)
        versions, findings = job_versions(container_image, overlay)
        findings = emit.config_findings(cfg, plan.hardware_spec, plan.layout.world, config, versions, own=True) \
            + findings  # our own recipe: a setting megatron does not run as stated is an error
        return _examined(plan, findings, versions, cfg)
    from .. import emit

    cfg, meta, hw, gpus = read_config(config, gpus, hw_arg.key if hw_arg else None)
    name = meta.get("recipe") or Path(config).stem
    edited = edits_of_named_recipe(cfg, meta)
    if edited:
        name = f"{name} (edited)"
    plan = _read_back(cfg, meta, hw, gpus, name)
    versions, findings = job_versions(container_image, overlay)  # unlisted image: a warning; overlay: the pinned
    findings = emit.config_findings(cfg, hw, gpus, name, versions, own=False) + findings  # a user's: warnings
    if edited:
        shown = "; ".join(f"{path}: {before!r} -> {after!r}" for path, before, after in edited[:8])
        findings.append(Finding(
            "warning", "config/edited-named-recipe",
            f"'{config}' is labelled {meta['recipe']} but differs from that recipe (with the overrides its header "
            f"lists) in {len(edited)} field(s): {shown}" + (" ..." if len(edited) > 8 else ""),
            "intended edits need nothing more; the reasons shown for the recipe do not cover them"))
    if meta and (gpus, hw.key) != (meta.get("world_size"), meta.get("hardware")):
        counts, why = [gpus], ""
        try:  # a count the planner refuses (not whole nodes) gets the whole-node counts beside it
            TrainingRequest.parse(model=plan.model, hardware=hw.key, num_gpus=gpus)
        except LcmoeError:
            lower = gpus - gpus % hw.gpus_per_node
            counts = [n for n in (lower + hw.gpus_per_node, lower) if n]  # more GPUs first: more likely to fit
            why = f" ({gpus} does not fill whole nodes of {hw.gpus_per_node}" + (
                f"; or --gpus {counts[1]})" if len(counts) > 1 else ")")
        findings.append(Finding(
            "warning", "target/differs-from-header",
            f"checking for {gpus} x {hw.key}, but the YAML was written for {meta.get('world_size')} x "
            f"{meta.get('hardware')}: lcmoe_recipes.train refuses to start on a target other than the header's",
            f"re-plan it for this target: python -m lcmoe_recipes.launch --from {config} --seq {cfg.model.seq_length} "
            f"--gpus {counts[0]} --hardware {hw.key} --dry-run{why}"))
    return _examined(plan, findings, versions, cfg)


def _examined(plan: Plan, findings: list, versions, cfg) -> Examination:
    """The Examination of a ConfigContainer (a YAML's, or a named recipe's own): what was checked, and its data."""
    from ..emit.paths import data_text

    return Examination(plan, findings, f"our checks, the cost model, megatron-bridge validate() for the target and the "
                       f"known upstream bugs for {versions.describe()}", data_text(cfg), cfg)


def build_ranks(config, gpus: int | None = None, hardware: str | None = None, name: str | None = None):
    """The real-model build of every pipeline stage (:func:`lcmoe_recipes.emit.probe.build.build_ranks`, docs/build.md) of
    ``config``: a ConfigContainer (its target the one :func:`lcmoe_recipes.config_from_plan` recorded, else ``gpus`` x
    ``hardware``), a ConfigContainer YAML (its header's target) or a named recipe.

    Returns:
        :class:`lcmoe_recipes.emit.probe.build.BuildReport`.

    Raises:
        LcmoeError: a missing file, an unknown recipe, or a target neither recorded nor given.
    """
    from .. import emit
    from ..emit.probe import build as probe

    if isinstance(config, str):
        if config in NAMED_RECIPES and not Path(config).exists():
            plan = recipe_plan(config)
            cfg, meta = emit.config_from_plan(plan, validate=False, quiet=True), emit.target_meta(plan)
        elif Path(config).is_file():
            cfg, meta = emit.read_yaml(config)
        else:
            raise _not_found(config)
        name = name or meta.get("recipe") or Path(config).stem
    else:
        cfg, meta = config, emit.target_of(config)
    world, hw = gpus or meta.get("world_size"), hardware or meta.get("hardware")
    if not world or not hw:
        raise LcmoeError("the config does not record the target it was planned for", "give the GPU count and type")
    return probe.build_ranks(cfg, get_hardware(hw), world, name or meta.get("recipe") or "config")
