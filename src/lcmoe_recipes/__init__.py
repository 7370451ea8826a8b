"""lcmoe_recipes: long-context Mixture-of-Experts training recipes for Megatron-Bridge.

Named recipes (each returns a validated ``megatron.bridge.training.config.ConfigContainer``)::

    from lcmoe_recipes import dsv3_128k_h100
    cfg = dsv3_128k_h100()

Planning and checking (``recipe_plan``, ``check_plan``) import neither torch nor megatron; the factories load
megatron-bridge on first use (~15-40 s) and say so on stderr.
"""

from __future__ import annotations

from .checks import Finding, check_plan
from .errors import InfeasibleConfig, LcmoeError, OverrideError, UnknownName
from .plan import Plan
from .recipes import NAMED_RECIPES, recipe_plan

__version__ = "0.1.0"


def build_config(plan: Plan, validate: bool = True):
    """The validated megatron-bridge ``ConfigContainer`` for ``plan`` (see :func:`lcmoe_recipes.emit.build_config`)."""
    from .emit import build_config as _build

    return _build(plan, validate=validate)


def build_recipe(request, validate: bool = True):
    """The validated ConfigContainer for any request: the search's best layout (:func:`lcmoe_recipes.search.plan`).

    Args:
        request: a :class:`lcmoe_recipes.request.TrainingRequest`, or a dict of its fields.

    Raises:
        pydantic.ValidationError: bad request fields. InfeasibleConfig: no legal layout fits (names the constraint).
    """
    from .search import plan
    from .request import TrainingRequest

    if not isinstance(request, TrainingRequest):
        request = TrainingRequest(**request)
    return build_config(plan(request).best.plan, validate=validate)


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
    "NAMED_RECIPES", "recipe_plan", "build_config", "build_recipe", "check_plan", "Plan", "Finding",
    "LcmoeError", "InfeasibleConfig", "OverrideError", "UnknownName",
]
