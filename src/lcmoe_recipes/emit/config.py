"""Plan -> megatron-bridge ``ConfigContainer``, ConfigContainer -> Plan, and validation for the target.

A ConfigContainer starts from megatron-bridge's own recipe for the model and GPU (``plan.base_recipe``, built offline
by :mod:`.upstream`: its kernels, fusions, optimizer settings and process environment), or, for an architecture with
no upstream recipe, from megatron-bridge's generic pre-training template (``recipes.common._pretrain_common``) with
the model provider from ``AutoBridge.from_hf_config``. Then :mod:`.settings` writes what the Plan decides, each
group with its reason. Field names are Megatron's.
"""

from __future__ import annotations

import functools

from ..checks import check_plan, raise_for_errors
from ..core.plan import Plan
from .settings import apply_settings
from .stack import load_bridge, quiet_upstream
from .validate import validate_config
from .yaml_io import TARGET_ATTR, target_meta


def base_config(plan: Plan):
    """The ConfigContainer ``plan`` starts from: upstream's recipe ``plan.base_recipe`` built offline with the plan's
    model, or megatron-bridge's pre-training template with the model's provider; the two provider fields
    megatron-bridge fills by probing the *building* machine are answered for the target."""
    spec = plan.model_spec
    if plan.base_recipe:
        from .upstream import upstream_config

        cfg = upstream_config(plan.base_recipe, spec)
    else:
        from megatron.bridge import AutoBridge
        from megatron.bridge.recipes.common import _pretrain_common

        cfg = _pretrain_common()
        with quiet_upstream():  # transformers' "torch_dtype is deprecated", Bridge's local-fusion notices
            cfg.model = AutoBridge.from_hf_config(spec.hf_config()).to_megatron_provider(load_weights=False)
        if spec.is_moe:
            cfg.model.moe_grouped_gemm = cfg.model.moe_permute_fusion = True
    _answer_local_probes_for_target(cfg.model)
    return cfg


def config_from_plan(plan: Plan, validate: bool = True, quiet: bool = False):
    """The megatron-bridge ``ConfigContainer`` for ``plan``: :func:`base_config`, then every setting of
    :mod:`lcmoe_recipes.emit.settings`.

    Args:
        plan: a Plan (from a named recipe or the planner).
        validate: also run :func:`validate_config` for the plan's hardware and world size (default True).
        quiet: no progress line while megatron-bridge loads.

    Returns:
        ``megatron.bridge.training.config.ConfigContainer``.

    Raises:
        InfeasibleConfig: the plan (or the resulting config) breaks one of our rules or upstream validation.
    """
    raise_for_errors(check_plan(plan), f"plan {plan.name}")
    load_bridge(quiet=quiet)
    cfg = base_config(plan)
    apply_settings(cfg, plan)
    if validate:
        validate_config(cfg, plan.hardware_spec, plan.layout.world, own=True)  # ours: it must state what runs
    setattr(cfg, TARGET_ATTR, target_meta(plan))  # read by launch.submit; not a dataclass field, so not in the YAML
    return cfg


def _answer_local_probes_for_target(model) -> None:
    """Replace the two provider fields megatron-bridge 0.6.2 fills by probing the *building* machine for TE.

    With ``transformer_impl="transformer_engine"`` the target (the cluster container) has TE, so:

    * ``transformer_layer_spec``: the DeepSeek-V2/V3 bridges (``deepseek_v3_bridge.py``) store
      ``partial(get_gpt_decoder_block_spec, use_transformer_engine=HAVE_TE)``; built without TE that would make the
      cluster build local (non-TE) layers. Target answer: True.
    * ``gradient_accumulation_fusion``: ``GPTModelProvider``'s default is ``fusions.can_enable_gradient_accumulation_fusion()``
      (True when TE or APEX's fused_weight_gradient_mlp_cuda imports). Target answer: True.

    A test checks that the YAML emitted without TE equals the one emitted with TE (tests/test_full_env.py).
    """
    if getattr(model, "transformer_impl", None) != "transformer_engine":
        return
    spec = getattr(model, "transformer_layer_spec", None)
    if isinstance(spec, functools.partial) and "use_transformer_engine" in spec.keywords:
        model.transformer_layer_spec = functools.partial(spec.func, *spec.args,
                                                         **{**spec.keywords, "use_transformer_engine": True})
    model.gradient_accumulation_fusion = True


