"""The resolver: one :class:`~lcmoe_recipes.core.request.TrainingRequest` in, one :class:`~lcmoe_recipes.core.plan.Plan` out.

Every command and the Python API come here. A request is answered by, in this order:

1. ``from_config``: the user's ConfigContainer YAML (or a megatron-bridge recipe by function name) retargeted to
   ``seq_length`` (:mod:`lcmoe_recipes.planner.retarget`);
2. a named recipe -- ``recipe`` by name, or the one whose (model, seq_length[, GPUs, hardware]) matches -- with the run
   options it takes (:func:`lcmoe_recipes.planner.recipes.recipe_plan`); a ``precision`` it does not pin is applied and
   checked; layout wishes (``tp``/``pp``/``cp``/``ep``/``dispatcher``/MBS/offload/variable length) plan the recipe's
   target with the search instead, since the recipe pins what they change;
3. the search (:func:`lcmoe_recipes.planner.search.plan`) for any other model, length and target.

Then the weights the run starts from (``from_hf``/``from_checkpoint``/``convert_to``, a previous phase's checkpoints)
are checked where this machine sees them and recorded with their reason. A phased request (``phases``) is one request
per phase: :func:`phase_requests`.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path

from ..catalog import MODELS
from ..checks import check_plan, raise_for_errors
from ..checks.weights import weights_of
from ..core.plan import Plan, Reason, carry_reasons
from ..core.request import TrainingRequest
from ..errors import LcmoeError, UnknownName
from .recipes import NAMED_RECIPES, NamedRecipe, find_named_recipe, recipe_plan


def _model_key(request: TrainingRequest) -> str | None:
    if request.recipe:
        return named_recipe(request.recipe).model
    return request.model


def named_recipe(name: str) -> NamedRecipe:
    """The named recipe ``name``.

    Raises:
        UnknownName: with the closest name and the list.
    """
    recipe = NAMED_RECIPES.get(name)
    if recipe is None:
        close = difflib.get_close_matches(name, list(NAMED_RECIPES), n=1)
        raise UnknownName(f"unknown recipe '{name}'", (f"did you mean '{close[0]}'? " if close else "")
                          + f"named recipes: {', '.join(NAMED_RECIPES)}")
    return recipe


def _matching_recipe(request: TrainingRequest) -> NamedRecipe | None:
    """The named recipe answering ``request`` (None: plan it with the search).

    Raises:
        LcmoeError: no seq_length for a model; no named recipe matches and the target is incomplete.
    """
    seq, gpus, hw = request.seq_length, request.num_gpus, request.hardware
    if request.recipe:
        recipe = named_recipe(request.recipe)
        if (seq, gpus, hw) == (None, None, None):
            return recipe
        try:
            return find_named_recipe(recipe.model, seq or recipe.seq_length, gpus or recipe.num_gpus, hw or recipe.hardware)
        except UnknownName as exc:  # the recipe's name cannot be planned: its model can
            raise LcmoeError(exc.message, exc.fix.replace("give --gpus and --hardware", f"give the model "
                             f"({recipe.model}) with --seq, --gpus and --hardware")) from None
    if seq is None:
        raise LcmoeError(f"--seq is required with model '{request.model}'",
                         "e.g. --seq 131072 (or --list for named recipes)")
    try:
        return find_named_recipe(request.model, seq, gpus, hw)
    except UnknownName as exc:
        if gpus is None or hw is None or "no named recipe" not in exc.message:
            raise
        return None


def profile_of(request: TrainingRequest):
    """The request's calibration profile (:func:`lcmoe_recipes.calibration.read_profile`), or None.

    Raises:
        CalibrationError: a profile that cannot be read (names the file and the fix).
    """
    if not request.calibration:
        return None
    from ..calibration import read_profile

    return read_profile(request.calibration)


def search(request: TrainingRequest, top: int = 5):
    """:func:`lcmoe_recipes.planner.search.plan` for ``request``, with its calibration profile's constants where it gives one."""
    from .search import plan

    profile = profile_of(request)
    if profile is None:
        return plan(request, top=top)
    return plan(request, top=top, step_table=profile.step_table(), memory_constants=profile.memory_constants())


def _search(request: TrainingRequest) -> Plan:
    return search(request).best.plan


def _named_plan(recipe: NamedRecipe, request: TrainingRequest) -> Plan:
    """The named recipe with the request's run options and precision; or, with layout wishes, its target planned."""
    asked = request.layout_wishes()
    if asked:  # the recipe pins what these wishes change: plan its target with them instead
        target = request.replace(recipe=None, model=recipe.model, model_config=None, seq_length=recipe.seq_length,
                                 num_gpus=recipe.num_gpus, hardware=recipe.hardware)
        best = _search(target)
        flags = ", ".join(_flag(a) for a in asked)
        note = (f"planned for the named recipe's target ({recipe.num_gpus} x {recipe.hardware}) because {flags} "
                f"ask(s) for what {recipe.name} pins; ")
        return best.with_changes(reasons={**best.reasons, "layout": Reason(note + best.reasons["layout"].why,
                                                                           best.reasons["layout"].source)})
    plan = recipe_plan(recipe.name, **named_options(request, recipe))
    if request.precision and request.precision != plan.precision:
        changed = plan.with_changes(precision=request.precision)
        plan = changed.with_changes(reasons={**carry_reasons(plan, changed), "precision": Reason(
            f"{request.precision}, chosen with --precision", "your --precision")})
        raise_for_errors(check_plan(plan), f"recipe {recipe.name} with precision {request.precision}")
    return plan


def named_options(request: TrainingRequest, recipe: NamedRecipe) -> dict:
    """The options of ``recipe`` (:func:`lcmoe_recipes.planner.recipes.recipe_plan`'s keywords) that ``request`` gives: its run
    options that differ from the defaults, and its precision where the recipe takes one."""
    options = {k: v for k, v in vars(request.run_options()).items()
               if v is not None and not (k == "rope" and v == "auto") and not (k == "micro_batch_size" and v == 1)}
    if request.precision and "precision" in recipe.options:
        options["precision"] = request.precision
    return options


def _flag(wish: str) -> str:
    """The command-line flag of a layout wish (:data:`lcmoe_recipes.core.request.LAYOUT_WISHES`)."""
    return {"micro_batch_size": "--mbs", "allow_cpu_offload": "--no-offload"}.get(wish, "--" + wish.replace("_", "-"))


def retarget_source(source: str):
    """(ConfigContainer, header) of ``from_config``: a YAML file, else a megatron-bridge recipe by function name
    (built offline from the catalogue's config.json; its target is the one its name states). Cached per file
    version (the resolver and the builder both read it): treat it as read-only
    (:func:`lcmoe_recipes.emit.settings.retarget_config` works on a copy).

    Raises:
        LcmoeError: neither a file nor a recorded upstream recipe (with the closest recipe names), or a bad YAML.
    """
    path = Path(source)
    stamp = (str(path.resolve()), path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else None
    return _source(source, stamp)


@lru_cache(maxsize=8)
def _source(source: str, stamp: tuple | None):
    from .. import emit
    from ..catalog.upstream import find_upstream_recipe, upstream_recipes

    if stamp is not None:
        meta = emit.read_meta(source)
        cfg, _ = emit.read_yaml(source)
        return cfg, meta
    recipe = find_upstream_recipe(source)
    if recipe is None:
        close = difflib.get_close_matches(source, sorted(r.name for r in upstream_recipes()), n=3, cutoff=0.5)
        raise LcmoeError(f"--from '{source}' is neither a file nor a megatron-bridge recipe this catalogue records",
                         "give a ConfigContainer YAML, or a recipe name" + (f", e.g. {', '.join(close)}" if close else
                                                                            " (see src/lcmoe_recipes/catalog/"
                                                                            "upstream_recipes.json)"))
    from ..catalog import models_by_hf_id
    from ..emit.upstream import upstream_config

    return upstream_config(recipe.function, models_by_hf_id()[recipe.hf_id]), {"world_size": recipe.gpus,
                                                                             "hardware": recipe.hardware}


def retarget_name(request: TrainingRequest) -> str:
    """The plan name of a retargeted config: ``<source stem>-<seq_length / 1024>k``."""
    return f"{Path(request.from_config).stem}-{request.seq_length // 1024}k"


def _retargeted(request: TrainingRequest) -> Plan:
    from .. import emit
    from .retarget import retarget_plan

    cfg, meta = retarget_source(request.from_config)
    gpus, hardware = request.num_gpus or meta.get("world_size"), request.hardware or meta.get("hardware")
    missing = [flag for flag, value in (("--gpus N", gpus), ("--hardware NAME", hardware)) if not value]
    if missing:
        raise LcmoeError(f"'{request.from_config}' does not record its target", f"give {' and '.join(missing)}")
    name = retarget_name(request)
    before = emit.plan_from_config(cfg, hardware, gpus, name)
    return retarget_plan(before, request.replace(num_gpus=gpus, hardware=hardware), name)


def _model_reason(request: TrainingRequest, plan: Plan) -> Reason | None:
    """For a user's config.json: whose published facts apply (the file's own, or the shipped model it equals)."""
    spec = plan.model_spec
    if not spec.is_user_config:
        return None
    if spec.same_as:
        return Reason(f"your config.json has exactly the values of {MODELS[spec.same_as].display}'s published "
                      f"config.json, so that model's published facts apply (native context, training precision and "
                      "batch, upstream base recipe)", f"{spec.config_source}; {spec.card_source}")
    return Reason("your config.json: every architecture number and feature is read from it; no published training "
                  "facts are known for it, so the rules' stated defaults apply", spec.config_source)


def resolve(request: TrainingRequest) -> Plan:
    """The checked Plan answering one request (see the module doc for the order).

    Raises:
        LcmoeError: a request that names no model, a phased request (use :func:`phase_requests` and resolve each),
            no named recipe and no target to plan for, a bad weights folder. UnknownName: a bad recipe name.
            InfeasibleConfig: no legal layout fits, or a wish breaks a recipe's rule (naming the constraint and fix).
    """
    if request.phases is not None:
        raise LcmoeError("a request with phases has one plan per phase", "resolve each of phase_requests(request), "
                         "or use lcmoe_recipes.build_phases")
    if request.from_config:
        plan = _retargeted(request)
    else:
        weights = weights_of(request, _model_key(request))
        if weights.pretrained != request.pretrained_checkpoint:
            request = request.replace(pretrained_checkpoint=weights.pretrained)
        recipe = _matching_recipe(request)
        plan = _search(request) if recipe is None else _named_plan(recipe, request)
        if weights.reason is not None:
            plan = plan.with_changes(reasons={**plan.reasons, "pretrained_checkpoint": weights.reason})
    if (why := _model_reason(request, plan)) is not None:
        plan = plan.with_changes(reasons={"model": why, **plan.reasons})
    if request.phase:
        plan = plan.with_changes(name=f"{plan.name}-phase{request.phase}")
    if request.fs_gbps is not None:
        plan = plan.with_changes(fs_gbps=request.fs_gbps)
    if request.calibration_run:
        from ..calibration import calibration_run_plan

        plan = calibration_run_plan(plan)
    return plan


def phase_requests(request: TrainingRequest) -> list[TrainingRequest]:
    """One request per phase of ``request.phases`` (or ``[request]`` without phases), every phase on the same target:
    the one given, else the target of a named recipe that covers one of the lengths. Phase ``i`` > 1 starts from
    phase ``i - 1``'s checkpoints: set its ``pretrained_checkpoint`` (the previous config's ``checkpoint.save``)
    before resolving it.

    Raises:
        LcmoeError: no target given and no named recipe covers any of the lengths.
    """
    if request.phases is None:
        return [request]
    lengths = list(request.phases)
    model = _model_key(request)
    gpus, hardware = request.num_gpus, request.hardware
    if not (gpus and hardware):
        for length in reversed(lengths):
            try:
                recipe = find_named_recipe(model, length, gpus, hardware)
            except UnknownName:
                continue
            gpus, hardware = recipe.num_gpus, recipe.hardware
            break
        else:
            raise LcmoeError(f"--phases {','.join(map(str, lengths))}: no named recipe gives the target of these "
                             "phases", "give --gpus N and --hardware NAME (every phase runs on them)")
    first = request.replace(phases=None, recipe=None, model=model, num_gpus=gpus, hardware=hardware)
    return [first.replace(seq_length=length, phase=index + 1) for index, length in enumerate(lengths)]
