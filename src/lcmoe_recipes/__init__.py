"""lcmoe_recipes: long-context Mixture-of-Experts training recipes for Megatron-Bridge.

Named recipes (each returns a validated ``megatron.bridge.training.config.ConfigContainer``)::

    from lcmoe_recipes import dsv3_128k_h100
    cfg = dsv3_128k_h100()                                  # 256 x H100, seq_length 131072
    cfg = dsv3_128k_h100(tokens_per_step=2**23, overrides=["train.train_iters=200"])

Any request -- a model, a sequence length, a GPU type and count, wishes and run options -- goes through one resolver::

    from lcmoe_recipes import TrainingRequest, resolve, build_recipe
    plan = resolve(TrainingRequest(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=64)).plan
    cfg = build_recipe(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=64)

Planning and checking (``resolve``, ``recipe_plan``, ``check_plan``) import neither torch nor megatron; building a
ConfigContainer loads megatron-bridge on first use (~15-40 s) and says so on stderr.
"""

from __future__ import annotations

import inspect
from typing import Sequence

from .checks import Finding, check_plan
from .core.plan import Plan
from .core.request import RUN_OPTIONS, TrainingRequest
from .errors import InfeasibleConfig, LcmoeError, ModelConfigError, OverrideError, UnknownName
from .planner.recipes import NAMED_RECIPES, recipe_plan
from .planner.resolve import Resolution, phase_requests, resolve

__version__ = "0.1.0"


def config_from_plan(plan: Plan, validate: bool = True):
    """The validated megatron-bridge ``ConfigContainer`` for ``plan`` (see :func:`lcmoe_recipes.emit.config_from_plan`)."""
    from .emit import config_from_plan as _config

    return _config(plan, validate=validate)


def _request(request: TrainingRequest | dict | None, fields: dict) -> TrainingRequest:
    if request is None:
        return TrainingRequest.parse(**fields)
    if isinstance(request, TrainingRequest):
        return request.replace(**fields) if fields else request
    return TrainingRequest.parse(**request, **fields)


def build_recipe(request: TrainingRequest | dict | None = None, overrides: Sequence[str] = (), **fields):
    """The validated ConfigContainer answering any request (:func:`lcmoe_recipes.planner.resolve.resolve`: a named recipe,
    the search's best layout, or a retargeted config), with Hydra ``overrides`` applied and checked again.

    Args:
        request: a :class:`~lcmoe_recipes.core.request.TrainingRequest`, a dict of its fields, or None and the fields as
            keywords, e.g. ``build_recipe(model_config="my/config.json", seq_length=32768, hardware="h100",
            num_gpus=64)``.
        overrides: Hydra overrides on megatron-bridge field names (added to the request's own), e.g.
            ``["train.train_iters=200"]``.

    Raises:
        LcmoeError: bad request fields (every one named, with its fix); ModelConfigError: a bad model_config file;
        OverrideError: a bad override; InfeasibleConfig: no legal layout fits, or the config breaks a rule.
    """
    from .jobs.prepare import configure

    request = _request(request, fields)
    if overrides:
        request = request.replace(overrides=tuple(request.overrides) + tuple(overrides))
    return configure(resolve(request), request.overrides).cfg


def build_phases(model: str, lengths: Sequence[int], num_gpus: int, hardware: str, **options) -> list:
    """One validated ConfigContainer per context-extension phase (``launch --phases``), each planned for its length;
    every phase after the first starts from the previous phase's ``checkpoint.save``.

    Args:
        model: catalogue model or alias.
        lengths: increasing seq_lengths, e.g. ``[32768, 131072]`` (DeepSeek-V3's 4K -> 32K -> 128K).
        num_gpus, hardware: the target of every phase.
        options: any other :class:`~lcmoe_recipes.core.request.TrainingRequest` field (``precision``, ``rope``,
            ``tokens_per_step``, ``lr``, ``train_iters``, ``from_hf``, ``pretrained_checkpoint`` for the first
            phase, ``overrides``, ``save_dir``, ...).

    Raises:
        LcmoeError: bad lengths or options; InfeasibleConfig: a phase with no fitting layout.
    """
    from .jobs.prepare import configure_phases

    request = TrainingRequest.parse(model=model, phases=tuple(lengths), num_gpus=num_gpus, hardware=hardware,
                                    **options)
    return [one.cfg for one in configure_phases(request)]


def examine(config: str, gpus: int | None = None, hardware: str | None = None, container_image: str | None = None):
    """Examine a ConfigContainer YAML or a named recipe for a target, as ``python -m lcmoe_recipes.check`` does
    (:func:`lcmoe_recipes.planner.examine.examine`): returns an :class:`~lcmoe_recipes.planner.examine.Examination`
    (plan, findings, scope, data). Not named ``check``: importing the command module ``lcmoe_recipes.check`` would
    replace a facade function of that name."""
    from .planner.examine import examine as _examine

    return _examine(config, gpus, hardware, container_image)


def build_ranks(config, gpus: int | None = None, hardware: str | None = None):
    """Build every pipeline stage of a config at its full world size on the CPU (megatron-core's own model, fake
    process groups, meta device) and compare its parameter and gradient bytes with our memory model, stage by stage
    (docs/build.md). ``config``: a ConfigContainer, a ConfigContainer YAML or a named recipe.

    Returns:
        :class:`lcmoe_recipes.emit.probe.build.BuildReport` (``.table()``, ``.stages``, ``.findings``, ``.ok``).
    """
    from .planner.examine import build_ranks as _build_ranks

    return _build_ranks(config, gpus, hardware)


# the keywords every named recipe's factory takes: precision and the run options (TrainingRequest's own fields, with
# its defaults and descriptions), then overrides
FACTORY_OPTIONS = ("precision",) + tuple(o for o in RUN_OPTIONS if o != "micro_batch_size")


def _named_factory(name: str):
    recipe = NAMED_RECIPES[name]
    fields = TrainingRequest.model_fields
    signature = inspect.Signature(
        [inspect.Parameter(o, inspect.Parameter.KEYWORD_ONLY, default=fields[o].default) for o in FACTORY_OPTIONS]
        + [inspect.Parameter("overrides", inspect.Parameter.KEYWORD_ONLY, default=())])

    def factory(*args, **kwargs):
        try:
            options = signature.bind(*args, **kwargs).arguments
        except TypeError as exc:  # a positional or unknown argument: say which keywords there are, and where to go
            raise TypeError(
                f"{name}() {exc}: it takes keywords only ({', '.join(FACTORY_OPTIONS)}, overrides); its layout and "
                f"GPU count are the recipe's ({recipe.num_gpus} x {recipe.hardware}). For another target plan one: "
                f"build_recipe(TrainingRequest(model='{recipe.model}', seq_length={recipe.seq_length}, num_gpus=N, "
                f"hardware='{recipe.hardware}'))") from None
        overrides = options.pop("overrides", ())
        return build_recipe(TrainingRequest.parse(recipe=name, **options), overrides)

    factory.__name__ = factory.__qualname__ = name
    factory.__signature__ = signature
    args = "".join(f"    {o}: {fields[o].description}.\n" for o in FACTORY_OPTIONS)
    factory.__doc__ = (
        f"{recipe.summary}: a validated megatron-bridge ConfigContainer for {recipe.num_gpus} x {recipe.hardware}, "
        f"seq_length {recipe.seq_length}.\n\nArgs:\n{args}"
        "    overrides: Hydra overrides on megatron-bridge field names, applied and checked again.\n\n"
        f"The layout, knobs and the reason for each: ``lcmoe_recipes.recipe_plan('{name}')``.\n\nRaises:\n"
        "    LcmoeError: a bad option (named, with its fix); OverrideError: a bad override; InfeasibleConfig: an "
        "option or override that breaks a rule.")
    return factory


dsv3_128k_h100 = _named_factory("dsv3_128k_h100")
dsv3_256k_h100 = _named_factory("dsv3_256k_h100")
qwen3_235b_128k_gb200 = _named_factory("qwen3_235b_128k_gb200")  # precision="mxfp8" for the MXFP8 variant
qwen3_next_8k_gb200 = _named_factory("qwen3_next_8k_gb200")
qwen3_next_32k_gb200 = _named_factory("qwen3_next_32k_gb200")
qwen3_next_64k_gb200 = _named_factory("qwen3_next_64k_gb200")

__all__ = [
    "dsv3_128k_h100", "dsv3_256k_h100", "qwen3_235b_128k_gb200",
    "qwen3_next_8k_gb200", "qwen3_next_32k_gb200", "qwen3_next_64k_gb200",
    "TrainingRequest", "resolve", "Resolution", "phase_requests", "NAMED_RECIPES", "recipe_plan", "config_from_plan",
    "build_recipe",
    "build_phases", "build_ranks", "examine", "check_plan", "Plan", "Finding",
    "LcmoeError", "InfeasibleConfig", "ModelConfigError", "OverrideError", "UnknownName",
]
