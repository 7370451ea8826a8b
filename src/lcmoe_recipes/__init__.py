"""lcmoe_recipes: long-context Mixture-of-Experts training recipes for Megatron-Bridge.

Named recipes (each returns a validated ``megatron.bridge.training.config.ConfigContainer``)::

    from lcmoe_recipes import dsv3_128k_h100
    cfg = dsv3_128k_h100()

Planning and checking (``recipe_plan``, ``check_plan``) import neither torch nor megatron; the factories load
megatron-bridge on first use (~15-40 s) and say so on stderr.
"""

from __future__ import annotations

from .checks import Finding, check_plan
from .errors import InfeasibleConfig, LcmoeError, ModelConfigError, OverrideError, UnknownName
from .plan import Plan
from .recipes import NAMED_RECIPES, recipe_plan

__version__ = "0.1.0"


def build_config(plan: Plan, validate: bool = True):
    """The validated megatron-bridge ``ConfigContainer`` for ``plan`` (see :func:`lcmoe_recipes.emit.build_config`)."""
    from .emit import build_config as _build

    return _build(plan, validate=validate)


def build_recipe(request=None, validate: bool = True, **fields):
    """The validated ConfigContainer for any request: the search's best layout (:func:`lcmoe_recipes.search.plan`).

    Args:
        request: a :class:`lcmoe_recipes.request.TrainingRequest`, or a dict of its fields; or None and the fields
            as keywords, e.g. ``build_recipe(model_config="my/config.json", seq_length=32768, hardware="h100",
            num_gpus=64)``.

    Raises:
        pydantic.ValidationError: bad request fields. ModelConfigError: a bad model_config file.
        InfeasibleConfig: no legal layout fits (names the constraint).
    """
    from .search import plan
    from .request import TrainingRequest

    if request is None:
        request = TrainingRequest(**fields)
    elif not isinstance(request, TrainingRequest):
        request = TrainingRequest(**request, **fields)
    return build_config(plan(request).best.plan, validate=validate)


def build_phases(model: str, lengths: list[int], num_gpus: int, hardware: str, **options) -> list:
    """One validated ConfigContainer per context-extension phase (``launch --phases``), each planned for its length;
    every phase after the first starts from the previous phase's ``checkpoint.save``.

    Args:
        model: catalogue model or alias.
        lengths: increasing seq_lengths, e.g. ``[32768, 131072]`` (DeepSeek-V3's 4K -> 32K -> 128K).
        num_gpus, hardware: the target of every phase.
        options: run options of :class:`lcmoe_recipes.rules.extension.RunOptions` (``rope``, ``tokens_per_step``,
            ``lr``, ``train_iters``, ``pretrained_checkpoint`` for the first phase) and ``precision``.

    Raises:
        LcmoeError: bad lengths or options; InfeasibleConfig: a phase with no fitting layout.
    """
    import argparse

    from .errors import LcmoeError
    from .launch import resolve_plan

    if not lengths or any(n <= 0 for n in lengths) or list(lengths) != sorted(set(lengths)):
        raise LcmoeError(f"phases {lengths}: give increasing positive lengths", "e.g. [32768, 131072]")
    precision = options.pop("precision", None)
    pretrained = options.pop("pretrained_checkpoint", None)
    configs = []
    for index, length in enumerate(lengths):
        wishes = argparse.Namespace(gpus=num_gpus, hardware=hardware, precision=precision, gbs=None, mbs=1,
                                    dispatcher=None, tp=None, pp=None, cp=None, ep=None, no_offload=False,
                                    variable_length=False, rope=options.get("rope", "auto"),
                                    tokens_per_step=options.get("tokens_per_step"), lr=options.get("lr"),
                                    train_iters=options.get("train_iters"), pretrained_checkpoint=pretrained)
        plan = resolve_plan(model, length, num_gpus, hardware, precision, wishes)
        cfg = build_config(plan.with_changes(name=f"{plan.name}-phase{index + 1}"))
        configs.append(cfg)
        pretrained = cfg.checkpoint.save
    return configs


def _factory(name: str):
    recipe = NAMED_RECIPES[name]

    def factory(**options):
        return build_config(recipe_plan(name, **options))

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = (f"{recipe.summary}: a validated megatron-bridge ConfigContainer for {recipe.num_gpus} x "
                       f"{recipe.hardware}, seq_length {recipe.seq_length}.\n\nThe layout, knobs and the reason for "
                       f"each: ``lcmoe_recipes.recipe_plan('{name}')``.\n\nRaises:\n    InfeasibleConfig: if "
                       "validation fails (a bug: the named recipes are tested to pass).")
    return factory


dsv3_128k_h100 = _factory("dsv3_128k_h100")
dsv3_256k_h100 = _factory("dsv3_256k_h100")
qwen3_235b_128k_gb200 = _factory("qwen3_235b_128k_gb200")  # options: precision="bf16" | "mxfp8"
qwen3_next_8k_gb200 = _factory("qwen3_next_8k_gb200")
qwen3_next_32k_gb200 = _factory("qwen3_next_32k_gb200")
qwen3_next_64k_gb200 = _factory("qwen3_next_64k_gb200")

__all__ = [
    "dsv3_128k_h100", "dsv3_256k_h100", "qwen3_235b_128k_gb200",
    "qwen3_next_8k_gb200", "qwen3_next_32k_gb200", "qwen3_next_64k_gb200",
    "NAMED_RECIPES", "recipe_plan", "build_config", "build_recipe", "build_phases", "check_plan", "Plan", "Finding",
    "LcmoeError", "InfeasibleConfig", "ModelConfigError", "OverrideError", "UnknownName",
]
