"""Which megatron-bridge recipe a run starts from, and what of it the plan inherits.

The base is upstream's own recipe for the model and GPU (:func:`lcmoe_recipes.catalog.upstream.base_recipe` says how
it is picked); the plan inherits from it the choices our rules do not make -- optimizer precision and Adam moment
dtypes -- so that the cost model prices what the run will really keep in memory. The gradient-reduction dtype is not
inherited: upstream's perf recipes reduce in BF16 for benchmarking, a training run reduces and accumulates in FP32
(:data:`GRAD_DTYPE`).
"""

from __future__ import annotations

from ..catalog import Hardware, ModelSpec
from ..catalog.upstream import base_recipe, upstream_versions
from ..core.plan import Reason

# Main-gradient buffer (accumulation over the microbatches of a step) and data-parallel reduction dtype of every run:
# FP32. megatron-bridge 0.6.2's training template reduces in FP32 (recipes/common.py _pretrain_common:
# ddp.grad_reduce_in_fp32=True) and only its benchmark helper turns it off, "prioritiz[ing] throughput measurement over
# convergence" (perf_recipes/_common.py _benchmark_common); DeepSeek-V3 trained in FP8 but kept FP32 accumulation of
# gradients (technical report arXiv 2412.19437 §3.3). Priced by the memory model at 4 bytes per parameter
# (cost/memory.py); a plan that cannot afford it changes its layout, it never falls back to BF16.
GRAD_DTYPE = "fp32"
GRAD_DTYPE_REASON = Reason(
    "gradients accumulated over the step's microbatches and reduced across data-parallel ranks in FP32 "
    "(ddp.grad_reduce_in_fp32 and mixed_precision.grad_reduce_in_fp32 true), as megatron-bridge's training template; "
    "upstream's perf recipe turns it off to benchmark throughput. The FP32 main-gradient buffer (4 bytes per "
    "parameter instead of 2) is priced and the layout chosen to fit it",
    "megatron-bridge 0.6.2 recipes/common.py _pretrain_common (grad_reduce_in_fp32=True) and perf_recipes/_common.py "
    "_benchmark_common (False, 'prioritize throughput measurement over convergence'); DeepSeek-V3 technical report "
    "arXiv 2412.19437 §3.3 (FP32 accumulation kept under FP8 training)")
TEMPLATE_NUM_WORKERS = 2  # megatron-bridge 0.6.2 recipes/common.py _pretrain_common dataset.num_workers
SOURCE = "megatron-bridge {version} perf_recipes/ and recipes/ (the model's own recipe for this GPU)"


def choose_base(spec: ModelSpec, hw: Hardware, precision: str, num_gpus: int) -> tuple[dict, Reason]:
    """(Plan fields inherited from the base recipe, reason). The fields: ``base_recipe`` ("module:function" or None
    for megatron-bridge's pre-training template), ``grad_dtype`` (always :data:`GRAD_DTYPE`), ``moment_dtype``, ``use_precision_aware_optimizer``,
    ``num_workers`` (data-loader workers per rank), ``moe_ep_overlap`` (the EP all-to-all overlap the recipe asks
    for; :func:`lcmoe_recipes.rules.extension.with_ep_overlap` keeps it where megatron-core allows it, and the
    search turns it on wherever megatron-core allows it and it pays), ``tp_comm_overlap`` (the TP overlap the
    recipe asks for; :func:`lcmoe_recipes.rules.extension.extension_fields` keeps it where megatron-bridge does),
    ``use_transformer_engine_op_fuser`` (the routed experts through Transformer Engine's op fuser, as the recipe runs
    them; the step model prices what each path runs outside its kernels, :mod:`lcmoe_recipes.cost.elementwise`),
    ``moe_flex_dispatcher_num_sms`` (the SMs its flex dispatcher holds; the step model's
    :func:`lcmoe_recipes.cost.overlap.dispatcher_sm_share`)."""
    recipe, how = base_recipe(spec, hw, precision, num_gpus)
    source = SOURCE.format(version=upstream_versions()["megatron-bridge"])
    if recipe is None:
        return {"base_recipe": None, "grad_dtype": GRAD_DTYPE, "moment_dtype": "fp32", "use_precision_aware_optimizer": False,
                "num_workers": TEMPLATE_NUM_WORKERS, "moe_ep_overlap": False, "tp_comm_overlap": False,
                "use_transformer_engine_op_fuser": False, "moe_flex_dispatcher_num_sms": None}, Reason(how, source)
    fields = {"base_recipe": recipe.function, "grad_dtype": GRAD_DTYPE, "moment_dtype": recipe.moment_dtype,
              "use_precision_aware_optimizer": recipe.use_precision_aware_optimizer, "num_workers": recipe.num_workers,
              "moe_ep_overlap": recipe.record.get("moe_ep_overlap", False),
              "tp_comm_overlap": recipe.record.get("tp_comm_overlap", False),
              "use_transformer_engine_op_fuser": recipe.record.get("use_transformer_engine_op_fuser", False),
              "moe_flex_dispatcher_num_sms": recipe.record.get("moe_flex_dispatcher_num_sms")}
    return fields, Reason(f"{how}; our rules then change only what long context needs (docs/parity.md lists every "
                          "field that differs, with its reason)", source)


def base_layout(spec: ModelSpec, hw: Hardware, precision: str, num_gpus: int, pp: int, vpp: int | None) -> str | None:
    """Upstream's pipeline layout string for this model when its base recipe was written for the same PP·VPP."""
    recipe, _ = base_recipe(spec, hw, precision, num_gpus)
    if recipe is None or recipe.hf_id != spec.published_id:
        return None
    return recipe.layout_for(pp, vpp)
