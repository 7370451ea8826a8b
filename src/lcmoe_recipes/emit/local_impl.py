"""A megatron-bridge model provider switched to megatron-core's own ("local") modules, for a machine without
Transformer Engine (TE).

The switch picks kernels, never weights: the model has the same parameters with or without TE. It serves the
Hugging Face converter where TE is absent (:mod:`lcmoe_recipes.emit.convert`), the GPU proof and the one-GPU rank
measurement on a machine that has PyTorch but no TE (``scripts/gpu_proof.py``, ``python -m lcmoe_recipes.train
--as-rank``), and the CPU build (:mod:`lcmoe_recipes.emit.probe.build`). Our recipes for clusters keep TE.

megatron-core 0.19.2's local modules cannot *run* some settings TE runs; each is handled here, by data
(:data:`LOCAL_LIMITS`):

* changed, with the reason printed (the run then differs from the TE run in memory, not in weights):

  - ``recompute_modules`` loses ``layernorm``: ``tensor_parallel/random.py:740``, ``CheckpointWithoutOutput.__init__``
    sets ``self.fp8 = fp8 is not None``, so the default ``fp8=False`` is taken for FP8 and the forward calls TE's
    ``FP8GlobalStateManager`` (a NameError without TE; ``transformer_layer.py:633`` / ``:766`` build it with the
    default);
  - ``recompute_modules`` loses ``moe_act``: only TE's ``TEGroupedMLP`` recomputes the expert activation
    (``transformer/moe/experts.py:268``); the local backend builds ``SequentialMLP`` whatever ``moe_grouped_gemm``
    says, and ``TransformerConfig.__post_init__`` refuses ``moe_act`` without grouped GEMM
    (``transformer/transformer_config.py:1784``);
  - ``moe_router_fusion`` off: the fused top-k / aux-loss kernels are TE's (``transformer/moe/moe_utils.py:773``,
    "Please install TE >= 2.6.0");
  - ``masked_softmax_fusion`` off where the compiled ``scaled_masked_softmax_cuda`` extension is absent (a pip
    installation): the local attention's fused softmax imports it for keys of 16-4096 tokens
    (``fusions/fused_softmax.py:357``, a ModuleNotFoundError mid-forward);
  - ``cuda_graph_impl`` "transformer_engine" -> "none": TE's ``make_graphed_callables`` captures them.

* refused (:class:`NeedsTransformerEngine`, with the fix):

  - multi-token prediction: ``megatron/bridge/models/gpt_provider.py:376``, ``mtp_block_spec``, asks megatron-core
    for the MTP block with ``use_transformer_engine=True`` whatever the layer spec (only ``drop_mtp=True`` builds the
    model, without its MTP layers);
  - gated DeltaNet (Qwen3-Next): ``models/gpt/experimental_attention_variant_module_specs.py``,
    ``_get_backend_spec_provider``, asserts ``transformer_impl == "transformer_engine"``;
  - multi-latent attention (DeepSeek-V3): ``transformer/multi_latent_attention.py:214`` passes ``k_channels`` and
    ``v_channels`` to its core attention, and the local ``DotProductAttention.__init__``
    (``transformer/dot_product_attention.py:42``) takes neither (a TypeError at construction);
  - context parallelism (CP > 1): the local ``DotProductAttention.__init__`` asserts ``context_parallel_size == 1``
    (``transformer/dot_product_attention.py:57``).

The CPU build (:mod:`lcmoe_recipes.emit.probe.build`) constructs but never runs the model: it applies the switch
(:func:`switch_to_local`, not :func:`run_without_te`) and answers the MTP and MLA construction gaps with named build-only stand-ins instead
(:mod:`lcmoe_recipes.emit.probe.substitutions`); gated DeltaNet stays "not built: needs Transformer Engine".
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

from ..errors import LcmoeError

# Fields whose True value names a TE (or Apex) kernel, with megatron-core's own path when False.
_TE_KERNELS = ("moe_grouped_gemm", "moe_permute_fusion", "gradient_accumulation_fusion", "persist_layer_norm",
               "cross_entropy_loss_fusion", "apply_rope_fusion")


class NeedsTransformerEngine(LcmoeError):
    """The model has a part that megatron-bridge 0.6.2 / megatron-core 0.19.2 build or run only with Transformer
    Engine."""


@dataclass(frozen=True)
class RecomputeLimit:
    """A selective-recompute module megatron-core's local modules cannot run, and why (upstream file:line)."""

    module: str
    why: str


LOCAL_LIMITS: tuple[RecomputeLimit, ...] = (
    RecomputeLimit("layernorm", "megatron-core 0.19.2 tensor_parallel/random.py:740 CheckpointWithoutOutput() takes "
                   "fp8=False for FP8 ('fp8 is not None') and calls TE's FP8GlobalStateManager, undefined without TE; "
                   "the norm outputs stay in memory"),
    RecomputeLimit("moe_act", "only TE's TEGroupedMLP recomputes the expert activation (megatron-core 0.19.2 "
                   "transformer/moe/experts.py:268); the local SequentialMLP keeps it, and TransformerConfig refuses "
                   "moe_act without grouped GEMM (transformer_config.py:1784)"),
)

_REFUSALS = (
    # (provider field that triggers it, message, fix)
    ("experimental_attention_variant",
     "this model's '{value}' layers are built only with Transformer Engine (megatron-core 0.19.2 "
     "experimental_attention_variant_module_specs._get_backend_spec_provider asserts transformer_impl="
     "'transformer_engine')",
     "run this step where Transformer Engine is installed (the cluster container, or scripts/setup.sh --with-te)"),
    ("mtp_num_layers",
     "this model has {value} multi-token-prediction layer(s), which megatron-bridge 0.6.2 builds only with Transformer "
     "Engine (models/gpt_provider.py:376 mtp_block_spec passes use_transformer_engine=True)",
     "run this step where Transformer Engine is installed, or pass --drop-mtp to leave the MTP layers out (then train "
     "with model.mtp_num_layers=null)"),
    ("multi_latent_attention",
     "multi-latent attention runs only with Transformer Engine in megatron-core 0.19.2: multi_latent_attention.py:214 "
     "passes k_channels/v_channels to its core attention, which the local DotProductAttention "
     "(dot_product_attention.py:42) does not take",
     "run this step where Transformer Engine is installed (the cluster container, or scripts/setup.sh --with-te)"),
    ("context_parallel_size",
     "context parallelism ({value} ranks) runs only with Transformer Engine's attention in megatron-core 0.19.2: the "
     "local DotProductAttention asserts context_parallel_size == 1 (transformer/dot_product_attention.py:57)",
     "run this step where Transformer Engine is installed, or with model.context_parallel_size=1"),
)
_REFUSED_WHEN = {"context_parallel_size": lambda value: (value or 1) > 1}  # default: any truthy value


def local_refusals(model, drop_mtp: bool = False) -> list[NeedsTransformerEngine]:
    """What megatron-core's local modules cannot build or run for ``model`` (a provider), one error each, in the
    order of :data:`_REFUSALS` ([] when none); MTP layers are not refused with ``drop_mtp``."""
    out = []
    for field, message, fix in _REFUSALS:
        value = getattr(model, field, None)
        if _REFUSED_WHEN.get(field, bool)(value) and not (field == "mtp_num_layers" and drop_mtp):
            out.append(NeedsTransformerEngine(message.format(value=value), fix))
    return out


def _changer(model, changes: list[str]):
    def change(field: str, value, why: str = "") -> None:
        old = getattr(model, field)
        if old != value:
            setattr(model, field, value)
            changes.append(f"{field}: {old!r} -> {value!r}" + (f" -- {why}" if why else ""))

    return change


def switch_to_local(model) -> list[str]:
    """Switch ``model`` (a megatron-bridge GPT provider) to megatron-core's local modules in place: the layer spec,
    ``transformer_impl`` and the TE kernel flags -- what picks the modules, never a weight.

    Returns:
        the changes made, one ``field: old -> new`` line each.
    """
    spec = model.transformer_layer_spec
    changes: list[str] = []
    change = _changer(model, changes)
    from megatron.bridge.models.gpt_provider import default_layer_spec, local_layer_spec, transformer_engine_layer_spec

    if isinstance(spec, functools.partial) and spec.keywords.get("use_transformer_engine"):
        # DeepSeek-V2/V3 bridges: partial(get_gpt_decoder_block_spec, use_transformer_engine=...)
        model.transformer_layer_spec = functools.partial(spec.func, *spec.args,
                                                         **{**spec.keywords, "use_transformer_engine": False})
        changes.append(f"transformer_layer_spec: {spec.func.__name__}(use_transformer_engine=False)")
    elif spec in (default_layer_spec, transformer_engine_layer_spec):
        model.transformer_layer_spec = local_layer_spec
        changes.append(f"transformer_layer_spec: {spec.__name__} -> local_layer_spec")
    change("transformer_impl", "local")
    for field in _TE_KERNELS:
        if hasattr(model, field):
            change(field, False)
    return changes


def run_without_te(model) -> list[str]:
    """Turn off, in place, what only Transformer Engine *runs* (the model still builds with it on): the TE-only
    recompute modules of :data:`LOCAL_LIMITS`, the fused router, TE's CUDA graphs; and the local attention's fused
    softmax where its compiled extension is absent.

    Returns:
        the changes made, one ``field: old -> new -- reason`` line each (the run's memory differs from the TE run's).
    """
    changes: list[str] = []
    change = _changer(model, changes)
    if getattr(model, "moe_router_fusion", False):
        change("moe_router_fusion", False, "the fused top-k and aux-loss kernels are TE's (megatron-core 0.19.2 "
               "transformer/moe/moe_utils.py:773)")
    if getattr(model, "masked_softmax_fusion", False) and not importlib.util.find_spec("scaled_masked_softmax_cuda"):
        change("masked_softmax_fusion", False, "the fused softmax of megatron-core's local attention is the compiled "
               "scaled_masked_softmax_cuda extension (megatron-core 0.19.2 fusions/fused_softmax.py:357, built from "
               "Megatron-LM's or Apex's source), not in this installation: torch's softmax runs instead")
    if getattr(model, "cuda_graph_impl", "none") == "transformer_engine":
        change("cuda_graph_impl", "none", "TE captures these CUDA graphs (make_graphed_callables); the graph buffers "
               "are left out of the run")
    modules = list(model.recompute_modules or ()) if model.recompute_granularity == "selective" else []
    for limit in LOCAL_LIMITS:
        if limit.module in modules:
            modules.remove(limit.module)
            change("recompute_modules", list(modules), f"'{limit.module}' dropped: {limit.why}")
    if model.recompute_granularity == "selective" and not modules and model.recompute_modules is not None:
        change("recompute_granularity", None, "no selective-recompute module left")
    return changes


def optimizer_without_te(optimizer) -> list[str]:
    """Turn off, in place, the precision-aware optimizer of ``optimizer`` (a megatron-core ``OptimizerConfig``, e.g.
    ``cfg.optimizer``) where it would run on the GPU: megatron-core 0.19.2 builds it only on TE's ``FusedAdam``
    (``OptimizerConfig.__post_init__`` raises "--use-precision-aware-optimizer requires FusedAdam from
    TransformerEngine" at construction; CPU offload's ``HybridDeviceOptimizer`` is exempt). Without it the fp32
    master weights are kept whole: 4 bytes a parameter instead of ``store_param_remainders``' 2
    (:func:`lcmoe_recipes.cost.memory.master_weight_bytes`), so read the plan back from the changed config.

    Returns:
        the change made, as one ``field: old -> new -- reason`` line ([] when nothing changed).

    Raises:
        NeedsTransformerEngine: optimizer moments, main gradients or master weights in a dtype other than fp32,
        which only the precision-aware optimizer keeps.
    """
    import torch

    if not optimizer.use_precision_aware_optimizer or optimizer.optimizer_cpu_offload:
        return []
    kept = [f"{field}={getattr(optimizer, field)}" for field in ("main_params_dtype", "main_grads_dtype",
                                                                  "exp_avg_dtype", "exp_avg_sq_dtype")
            if getattr(optimizer, field) != torch.float32]
    if kept:
        raise NeedsTransformerEngine(f"the optimizer keeps {', '.join(kept)}, which only the precision-aware "
                                     "optimizer (TE's FusedAdam in megatron-core 0.19.2) keeps",
                                     "run this step where Transformer Engine is installed, or set those dtypes to "
                                     "fp32")
    changes: list[str] = []
    _changer(optimizer, changes)("use_precision_aware_optimizer", False,
                                 "megatron-core 0.19.2 builds it only on TE's FusedAdam (optimizer_config.py, "
                                 "OptimizerConfig.__post_init__); torch's AdamW keeps whole fp32 master weights")
    return changes


def use_local_implementation(model, drop_mtp: bool = False) -> list[str]:
    """Switch ``model`` (a megatron-bridge GPT provider, e.g. ``cfg.model``) to megatron-core's local modules, in place,
    after refusing what they cannot build or run (see the module doc).

    Args:
        model: the provider (``AutoBridge...to_megatron_provider()`` or a ConfigContainer's ``model``).
        drop_mtp: build the model without its multi-token-prediction layers (they need TE).

    Returns:
        the changes made, one ``field: old -> new`` line each (with the reason where the run's memory differs).

    Raises:
        NeedsTransformerEngine: gated DeltaNet, MTP layers without ``drop_mtp``, multi-latent attention, or CP > 1.
    """
    refusals = local_refusals(model, drop_mtp)
    if refusals:
        raise refusals[0]
    changes = switch_to_local(model) + run_without_te(model)
    if drop_mtp and model.mtp_num_layers:
        changes.append(f"mtp_num_layers: {model.mtp_num_layers!r} -> None")
        model.mtp_num_layers = None
    return changes
