"""The resolver: one :class:`~lcmoe_recipes.core.request.TrainingRequest` in, one :class:`Resolution` out; and the one
door to the search (:func:`search`).

Every command and the Python API come here. A request is answered by, in this order:

1. ``from_config``: the user's ConfigContainer YAML (or a megatron-bridge recipe by function name) retargeted to
   ``seq_length`` (:mod:`lcmoe_recipes.planner.retarget`);
2. a named recipe -- ``recipe`` by name, or the one whose (model, seq_length[, GPUs, hardware]) matches -- with the run
   options it takes (:func:`lcmoe_recipes.planner.recipes.recipe_plan`); a ``precision`` it does not pin is applied and
   checked; layout wishes (``tp``/``pp``/``cp``/``ep``/``dispatcher``/MBS/offload/variable length) plan the recipe's
   target with the search instead, since the recipe pins what they change;
3. the search for any other model, length and target.

Every search goes through :func:`search` -- the decision table of ``plan``, the comparison of targets
(:mod:`lcmoe_recipes.report.compare`), a retargeting, the sweep of lengths -- so a request's calibration profile
(``calibration``) ranks and fits every one of them.

Then the weights the run starts from (``from_hf``/``from_checkpoint``/``convert_to``, a previous phase's checkpoints)
are checked where this machine sees them and recorded with their reason. The :class:`Resolution` carries all of it --
the plan, the weights, the source config of a retargeting, the named recipe and the options it was built with -- so
what configures the run (:func:`lcmoe_recipes.jobs.prepare.configure`) and the commands read it and never call back.
A phased request (``phases``) is one request per phase: :func:`phase_requests`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

from ..catalog import MODELS, get_model
from ..checks import check_plan, raise_for_errors
from ..checks.weights import Weights, weights_of
from ..core.plan import Plan, Reason, carry_reasons
from ..core.request import RUN_OPTIONS, TrainingRequest, seq_tag
from ..errors import InfeasibleConfig, LcmoeError, UnknownName
from .recipes import NAMED_RECIPES, NamedRecipe, find_named_recipe, named_recipe, recipe_plan
from .retarget import retarget_plan, retarget_request
from .search import SearchResult, search_layouts

SWEEP_LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072, 262144)


@dataclass(frozen=True)
class Source:
    """The config a retargeting (``from_config``) starts from, read once.

    Attributes:
        name: what ``from_config`` named (a YAML path or a megatron-bridge recipe function).
        cfg: its ConfigContainer; read-only (:func:`lcmoe_recipes.emit.settings.retarget_config` works on a copy).
        meta: its YAML header (target, overrides), or the target a megatron-bridge recipe's name states (and
            ``benchmark``: whether it is one of megatron-bridge's perf recipes, whose schedule is a benchmark's).
    """

    name: str
    cfg: object
    meta: dict


@dataclass(frozen=True)
class Resolution:
    """What the resolver learned answering one request.

    Attributes:
        request: the request as resolved (``pretrained_checkpoint`` set to the weights it starts from).
        plan: the checked Plan.
        weights: where the run's weights come from (:class:`lcmoe_recipes.checks.weights.Weights`), checked once.
        recipe: the named recipe that answered (None: searched or retargeted).
        options: the named recipe's options the request gave (what a YAML header records, so ``check`` rebuilds the
            same recipe); {} otherwise.
        source: the config a retargeting started from (None without ``from_config``).
    """

    request: TrainingRequest
    plan: Plan
    weights: Weights
    recipe: NamedRecipe | None = None
    options: dict = field(default_factory=dict)
    source: Source | None = None


def _model_key(request: TrainingRequest) -> str | None:
    return named_recipe(request.recipe).model if request.recipe else request.model


def _matching_recipe(request: TrainingRequest) -> NamedRecipe | None:
    """The named recipe answering ``request`` (None: plan it with the search).

    Raises:
        LcmoeError: no seq_length for a model; no named recipe matches and the target is incomplete.
    """
    seq, gpus, hw = request.seq_length, request.num_gpus, request.hardware
    if request.recipe:
        recipe = named_recipe(request.recipe)
        if all(v in (None, own) for v, own in ((seq, recipe.seq_length), (gpus, recipe.num_gpus), (hw, recipe.hardware))):
            return recipe
        try:
            return find_named_recipe(recipe.model, seq or recipe.seq_length, gpus or recipe.num_gpus, hw or recipe.hardware)
        except UnknownName:  # no named recipe for that target: resolve plans the recipe's model there
            return recipe
    if seq is None:
        raise LcmoeError(f"`seq_length` is required with model '{request.model}'",
                         "e.g. seq_length=131072 (a named recipe sets its own)", fields=("seq_length",))
    try:
        return find_named_recipe(request.model, seq, gpus, hw)
    except UnknownName as exc:
        if gpus is None or hw is None or "no named recipe" not in exc.message:
            raise
        return None


def covering_recipe(request: TrainingRequest) -> NamedRecipe | None:
    """The named recipe :func:`resolve` answers ``request`` with (launch uses it; the search alone may pick another
    layout, see docs/planner.md), or None: the request names a recipe or a YAML, has layout wishes, or no named
    recipe covers its (model, seq_length, GPUs, hardware)."""
    if request.recipe or request.from_config or request.phases or request.layout_wishes() or not request.model:
        return None
    try:
        return _matching_recipe(_named_hardware(request))
    except LcmoeError:  # an incomplete target: resolve itself says what is missing
        return None


def _named_hardware(request: TrainingRequest) -> TrainingRequest:
    """``request`` with the hardware of the model's named recipes at its seq_length when it gives a GPU count but no
    hardware and those recipes agree on one (``--hardware`` defaults to the named recipe's); unchanged otherwise."""
    if request.recipe or request.hardware or not (request.num_gpus and request.model and request.seq_length):
        return request
    key = get_model(request.model).key
    kinds = {r.hardware for r in NAMED_RECIPES.values() if r.model == key and r.seq_length == request.seq_length}
    return request.replace(hardware=kinds.pop()) if len(kinds) == 1 else request


def _profile(request: TrainingRequest):
    """The request's calibration profile (:func:`lcmoe_recipes.calibration.read_profile`), or None.

    Raises:
        CalibrationError: a profile that cannot be read (names the file and the fix).
    """
    if not request.calibration:
        return None
    from ..calibration import read_profile

    return read_profile(request.calibration)


def search(request: TrainingRequest, top: int = 5) -> SearchResult:
    """The search's decision table for ``request`` (:func:`lcmoe_recipes.planner.search.search_layouts`), ranked and
    fitted with its calibration profile's constants where it names one: the one door to the search.

    Raises:
        InfeasibleConfig: no legal layout fits (naming the constraint and the fix). CalibrationError: a bad profile.
    """
    profile = _profile(request)
    if profile is None:
        return search_layouts(request, top=top)
    return search_layouts(request, top=top, step_table=profile.step_table(),
                          memory_constants=profile.memory_constants())


def seq_sweep(request: TrainingRequest, seq_lengths: tuple[int, ...] = SWEEP_LENGTHS) -> list[tuple[int, object]]:
    """(seq_length, the search's winning candidate) for ``request`` at each of ``seq_lengths`` where a layout fits."""
    out = []
    for seq in seq_lengths:
        try:
            out.append((seq, search(request.replace(seq_length=seq), top=1).best))
        except InfeasibleConfig:
            continue
    return out


def _elsewhere(recipe: NamedRecipe, request: TrainingRequest) -> list[str]:
    """What of the named recipe's target (seq_length, GPUs, hardware) the request asks to change: a named recipe
    with GPUs or hardware of its own (``dsv3_128k_h100 --gpus 512``) is its model planned there."""
    return [f"{name} {asked}" for name, asked, own in (("seq_length", request.seq_length, recipe.seq_length),
                                                        ("num_gpus", request.num_gpus, recipe.num_gpus),
                                                        ("hardware", request.hardware, recipe.hardware))
            if asked is not None and asked != own]


def _recipe_target(recipe: NamedRecipe, request: TrainingRequest) -> Plan:
    """The named recipe's model searched on the target the request asks for (the recipe's own, with the request's
    seq_length / GPUs / hardware where given) with the request's layout wishes: the recipe pins what they change."""
    target = request.replace(recipe=None, model=recipe.model, model_config=None,
                             seq_length=request.seq_length or recipe.seq_length,
                             num_gpus=request.num_gpus or recipe.num_gpus, hardware=request.hardware or recipe.hardware)
    best = search(target).best.plan
    moved = _elsewhere(recipe, request)
    wishes = (f"the wishes {', '.join(request.layout_wishes())} ask for what {recipe.name} pins"
              if request.layout_wishes() else "")
    if moved:
        note = (f"planned for {target.num_gpus} x {target.hardware} at seq_length {target.seq_length}: the request "
                f"asks for {', '.join(moved)} (the named recipe {recipe.name} is {recipe.num_gpus} x "
                f"{recipe.hardware} at {recipe.seq_length}, and no named recipe is for this target)"
                + (f", and {wishes}" if wishes else "") + "; ")
    else:
        note = f"planned for the named recipe's target ({recipe.num_gpus} x {recipe.hardware}) because {wishes}; "
    return best.with_changes(reasons={**best.reasons, "layout": Reason(note + best.reasons["layout"].why,
                                                                       best.reasons["layout"].source)})


def named_plan(recipe: NamedRecipe, request: TrainingRequest) -> Plan:
    """The named recipe with the request's run options and precision (one it does not pin: applied and checked):
    what :func:`resolve` launches for a request that ``recipe`` covers."""
    plan = recipe_plan(recipe.name, **named_options(request, recipe))
    if request.precision and request.precision != plan.precision:
        changed = plan.with_changes(precision=request.precision)
        plan = changed.with_changes(reasons={**carry_reasons(plan, changed), "precision": Reason(
            f"{request.precision}, chosen with precision={request.precision}", "your request")})
        raise_for_errors(check_plan(plan), f"recipe {recipe.name} with precision {request.precision}")
    return plan


def named_options(request: TrainingRequest, recipe: NamedRecipe) -> dict:
    """The options of ``recipe`` (:func:`lcmoe_recipes.planner.recipes.recipe_plan`'s keywords) that ``request``
    gives: its run options (:data:`lcmoe_recipes.core.request.RUN_OPTIONS`) that differ from the defaults, and its
    precision where the recipe takes one."""
    defaults = type(request).model_fields
    options = {k: getattr(request, k) for k in RUN_OPTIONS if getattr(request, k) != defaults[k].default}
    if request.precision and "precision" in recipe.options:
        options["precision"] = request.precision
    return options


def read_source(name: str) -> Source:
    """The config ``from_config`` names: a YAML file, else a megatron-bridge recipe by function name (built offline
    from the catalogue's config.json; its target is the one its name states).

    Raises:
        LcmoeError: neither a file nor a recorded upstream recipe (with the closest recipe names), or a bad YAML.
    """
    from .. import emit
    from ..catalog.upstream import find_upstream_recipe, upstream_recipes

    if Path(name).is_file():
        return Source(name, emit.read_yaml(name)[0], emit.read_meta(name))
    recipe = find_upstream_recipe(name)
    if recipe is None:
        close = difflib.get_close_matches(name, sorted(r.name for r in upstream_recipes()), n=3, cutoff=0.5)
        raise LcmoeError(f"`from_config` '{name}' is neither a file nor a megatron-bridge recipe this catalogue records",
                         "give a ConfigContainer YAML, or a recipe name" + (f", e.g. {', '.join(close)}" if close else
                                                                            " (see src/lcmoe_recipes/catalog/"
                                                                            "upstream_recipes.json)"),
                         fields=("from_config",))
    from ..catalog import models_by_hf_id
    from ..emit.upstream import upstream_config

    return Source(name, upstream_config(recipe.function, models_by_hf_id()[recipe.hf_id]),
                  {"world_size": recipe.gpus, "hardware": recipe.hardware,
                   "benchmark": ".perf_recipes." in recipe.function})  # a perf recipe: its schedule is a benchmark's


def retarget_name(request: TrainingRequest) -> str:
    """The plan name of a retargeted config: ``<source stem>-<seq_length / 1024>k``."""
    return f"{Path(request.from_config).stem}-{seq_tag(request.seq_length)}"


def _retargeted(request: TrainingRequest) -> tuple[Plan, Source]:
    """The plan of ``request.from_config`` retargeted to ``request.seq_length`` (the search through :func:`search`),
    and the source it read."""
    from .. import emit

    source = read_source(request.from_config)
    gpus, hardware = request.num_gpus or source.meta.get("world_size"), request.hardware or source.meta.get("hardware")
    missing = [name for name, value in (("num_gpus", gpus), ("hardware", hardware)) if not value]
    if missing:
        raise LcmoeError(f"'{request.from_config}' does not record its target",
                         "give " + " and ".join(f"`{name}`" for name in missing),
                         fields=tuple(missing))
    name = retarget_name(request)
    before = emit.plan_from_config(source.cfg, hardware, gpus, name, source.meta.get("base_recipe"))
    target = request.replace(num_gpus=gpus, hardware=hardware)
    best = search(retarget_request(before, target)).best.plan
    return retarget_plan(before, best, name, keep_precision=not request.precision, lr=request.lr,
                         train_iters=request.train_iters), source


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


def resolve(request: TrainingRequest) -> Resolution:
    """The :class:`Resolution` answering one request (see the module doc for the order).

    Raises:
        LcmoeError: a request that names no model, a phased request (use :func:`phase_requests` and resolve each),
            no named recipe and no target to plan for, a bad weights folder. UnknownName: a bad recipe name.
            InfeasibleConfig: no legal layout fits, or a wish breaks a recipe's rule (naming the constraint and fix).
    """
    if request.phases is not None:
        raise LcmoeError("a request with phases has one plan per phase", "resolve each of phase_requests(request), "
                         "or use lcmoe_recipes.build_phases")
    recipe, options, source = None, {}, None
    if request.from_config:
        plan, source = _retargeted(request)
        weights = Weights(request.pretrained_checkpoint)
    else:
        weights = weights_of(request, _model_key(request))
        if weights.pretrained != request.pretrained_checkpoint:
            request = request.replace(pretrained_checkpoint=weights.pretrained)
        request = _named_hardware(request)
        recipe = _matching_recipe(request)
        if recipe is None:
            plan = search(request).best.plan
        elif request.layout_wishes() or _elsewhere(recipe, request):  # the recipe pins what these change: its model
            plan, recipe = _recipe_target(recipe, request), None  # is searched on the target asked for instead
        else:
            plan, options = named_plan(recipe, request), named_options(request, recipe)
        if weights.reason is not None:
            plan = plan.with_changes(reasons={**plan.reasons, "pretrained_checkpoint": weights.reason})
    if (why := _model_reason(request, plan)) is not None:
        plan = plan.with_changes(reasons={"model": why, **plan.reasons})
    if request.phase:
        plan = plan.with_changes(name=f"{plan.name}-phase{request.phase}")
    if request.fs_gbps is not None:
        plan = plan.with_changes(fs_gbps=request.fs_gbps)
    if request.mtbf_hours is not None:
        plan = plan.with_changes(mtbf_hours=request.mtbf_hours)
    if request.calibration_run:
        from ..calibration import calibration_run_plan

        plan = calibration_run_plan(plan)
    return Resolution(request, plan, weights, recipe, options, source)


def phase_requests(request: TrainingRequest) -> list[TrainingRequest]:
    """One request per phase of ``request.phases`` (or ``[request]`` without phases), every phase on the same target:
    the one given, else the target of a named recipe that covers one of the lengths (that phase then names the recipe,
    so it is not looked up again). Phase ``i`` > 1 starts from phase ``i - 1``'s checkpoints: set its
    ``pretrained_checkpoint`` (the previous config's ``checkpoint.save``) before resolving it.

    Raises:
        LcmoeError: no target given and no named recipe covers any of the lengths.
    """
    if request.phases is None:
        return [request]
    lengths = list(request.phases)
    model = _model_key(request)
    gpus, hardware, found = request.num_gpus, request.hardware, None
    if not (gpus and hardware):
        for length in reversed(lengths):
            try:
                found = find_named_recipe(model, length, gpus, hardware)
            except UnknownName:
                continue
            gpus, hardware = found.num_gpus, found.hardware
            break
        else:
            raise LcmoeError(f"phases {','.join(map(str, lengths))}: no named recipe gives the target of these phases",
                             "give `num_gpus` and `hardware` (every phase runs on them)", fields=("phases", "num_gpus",
                                                                                              "hardware"))
    first = request.replace(phases=None, recipe=None, model=model, num_gpus=gpus, hardware=hardware)
    return [first.replace(seq_length=length, phase=index + 1,
                          **({"recipe": found.name} if found is not None and length == found.seq_length else {}))
            for index, length in enumerate(lengths)]
