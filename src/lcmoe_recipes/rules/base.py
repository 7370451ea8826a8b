"""Which megatron-bridge recipe a run starts from, and what of it the plan inherits.

The base is upstream's own recipe for the model and GPU (:func:`lcmoe_recipes.catalog.upstream.base_recipe` says how
it is picked); the plan inherits from it the choices our rules do not make -- gradient-reduction dtype, optimizer
precision and Adam moment dtypes -- so that the cost model prices what the run will really keep in memory.
"""

from __future__ import annotations

from ..catalog import Hardware, ModelSpec
from ..catalog.upstream import base_recipe, upstream_versions
from ..core.plan import Reason

TEMPLATE_NUM_WORKERS = 2  # megatron-bridge 0.6.2 recipes/common.py _pretrain_common dataset.num_workers
SOURCE = "megatron-bridge {version} perf_recipes/ and recipes/ (the model's own recipe for this GPU)"


def choose_base(spec: ModelSpec, hw: Hardware, precision: str, num_gpus: int) -> tuple[dict, Reason]:
    """(Plan fields inherited from the base recipe, reason). The fields: ``base_recipe`` ("module:function" or None
    for megatron-bridge's pre-training template), ``grad_dtype``, ``moment_dtype``, ``use_precision_aware_optimizer``,
    ``num_workers`` (data-loader workers per rank), ``moe_ep_overlap`` (the EP all-to-all overlap the recipe asks
    for; :func:`lcmoe_recipes.rules.extension.with_ep_overlap` keeps it where megatron-core allows it)."""
    recipe, how = base_recipe(spec, hw, precision, num_gpus)
    source = SOURCE.format(version=upstream_versions()["megatron-bridge"])
    if recipe is None:
        return {"base_recipe": None, "grad_dtype": "fp32", "moment_dtype": "fp32", "use_precision_aware_optimizer": False,
                "num_workers": TEMPLATE_NUM_WORKERS, "moe_ep_overlap": False}, Reason(how, source)
    fields = {"base_recipe": recipe.function, "grad_dtype": recipe.grad_dtype, "moment_dtype": recipe.moment_dtype,
              "use_precision_aware_optimizer": recipe.use_precision_aware_optimizer, "num_workers": recipe.num_workers,
              "moe_ep_overlap": recipe.record.get("moe_ep_overlap", False)}
    return fields, Reason(f"{how}; our rules then change only what long context needs (docs/parity.md lists every "
                          "field that differs, with its reason)", source)


def base_layout(spec: ModelSpec, hw: Hardware, precision: str, num_gpus: int, pp: int, vpp: int | None) -> str | None:
    """Upstream's pipeline layout string for this model when its base recipe was written for the same PP·VPP."""
    recipe, _ = base_recipe(spec, hw, precision, num_gpus)
    if recipe is None or recipe.hf_id != spec.published_id:
        return None
    return recipe.layout_for(pp, vpp)
