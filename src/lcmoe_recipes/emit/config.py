"""Plan -> megatron-bridge ``ConfigContainer``, ConfigContainer -> Plan, and validation for the target.

The ConfigContainer starts from megatron-bridge's own pre-training template (``recipes.common._pretrain_common``,
shared with every upstream recipe), gets its model provider from ``AutoBridge.from_hf_config`` on the offline
catalogue (no hub), and then every field the Plan decides. Field names are Megatron's.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from ..catalog import MODELS, Hardware, get_hardware
from ..catalog.models import match_model
from ..checks import Finding, check_plan, raise_for_errors
from ..errors import InfeasibleConfig, UnknownName
from ..layout import ParallelLayout
from ..plan import PRECISIONS, Plan, mixed_precision_name
from .stack import load_bridge, quiet_upstream
from .target import target_environment
from .yaml_io import TARGET_ATTR, target_meta

# Environment the dispatcher needs on the target (values as in megatron-bridge's perf recipes for these systems).
_DISPATCH_ENV = {
    8: {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NVLINK_DOMAIN_SIZE": "8", "USE_MNNVL": "0"},
    72: {"CUDA_DEVICE_MAX_CONNECTIONS": "32", "NVLINK_DOMAIN_SIZE": "72", "USE_MNNVL": "1"},
}
_LAYOUT_CHARS = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}


def build_config(plan: Plan, validate: bool = True, quiet: bool = False):
    """The megatron-bridge ``ConfigContainer`` for ``plan``.

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
    import torch
    from megatron.bridge import AutoBridge
    from megatron.bridge.recipes.common import _pretrain_common
    from megatron.bridge.training.comm_overlap import CommOverlapConfig

    spec, hw, lay = plan.model_spec, plan.hardware_spec, plan.layout
    cfg = _pretrain_common()
    with quiet_upstream():  # transformers' "torch_dtype is deprecated", Bridge's local-fusion notices
        cfg.model = AutoBridge.from_hf_config(spec.hf_config()).to_megatron_provider(load_weights=False)
    m = cfg.model
    _answer_local_probes_for_target(m)

    # Parallelism (DP and EDP are derived by Megatron from the world size).
    m.tensor_model_parallel_size = lay.tp
    m.pipeline_model_parallel_size = lay.pp
    m.virtual_pipeline_model_parallel_size = lay.vpp
    m.context_parallel_size = lay.cp
    m.expert_model_parallel_size = lay.ep
    m.expert_tensor_parallel_size = lay.etp
    m.sequence_parallel = plan.sequence_parallel
    m.pipeline_dtype = torch.bfloat16 if lay.pp > 1 else None
    m.pipeline_model_parallel_layout = plan.pipeline_model_parallel_layout
    m.account_for_embedding_in_pipeline_split = False
    m.account_for_loss_in_pipeline_split = False
    m.num_layers_in_first_pipeline_stage = None
    m.num_layers_in_last_pipeline_stage = None

    # Sequence length on both model and dataset (upstream validate() requires them equal).
    m.seq_length = plan.seq_length
    cfg.dataset.seq_length = plan.seq_length

    m.mtp_num_layers = plan.mtp_num_layers or None
    if plan.mtp_num_layers:
        m.mtp_loss_scaling_factor = 0.1  # DeepSeek-V3 paper §4.2 (lambda = 0.1 for the first 10T tokens)

    # MoE dispatcher (MoE models only); shared-expert overlap is incompatible with the flex dispatcher.
    if spec.is_moe:
        m.moe_token_dispatcher_type = plan.moe_token_dispatcher_type
        m.moe_flex_dispatcher_backend = plan.moe_flex_dispatcher_backend
        if plan.moe_token_dispatcher_type == "flex":
            m.moe_shared_expert_overlap = False
        m.moe_grouped_gemm = True
        m.moe_permute_fusion = True
    if lay.cp > 1 and plan.cp_comm_type != "p2p":  # None (megatron-core's default) is the p2p ring
        m.cp_comm_type = plan.cp_comm_type  # lcmoe_recipes.rules.cp.choose_cp_comm_type

    # Recompute.
    m.recompute_granularity = plan.recompute_granularity
    m.recompute_modules = list(plan.recompute_modules) if plan.recompute_granularity == "selective" else None
    m.recompute_method = plan.recompute_method
    m.recompute_num_layers = plan.recompute_num_layers

    # CUDA graphs (megatron-core 0.19.2 names); graphs need TE's RNG tracker.
    m.cuda_graph_impl = plan.cuda_graph_impl
    m.cuda_graph_modules = list(plan.cuda_graph_modules)
    if plan.cuda_graph_impl != "none":
        m.use_te_rng_tracker = True
        cfg.rng.te_rng_tracker = True

    cfg.mixed_precision = mixed_precision_name(plan.precision)

    # Optimizer: distributed (ZeRO-1 style sharding over DP/EDP), precision-aware, optional CPU offload.
    opt = cfg.optimizer
    opt.use_distributed_optimizer = plan.use_distributed_optimizer
    cfg.ddp.use_distributed_optimizer = plan.use_distributed_optimizer
    opt.use_precision_aware_optimizer = plan.use_precision_aware_optimizer
    opt.optimizer_cpu_offload = plan.optimizer_cpu_offload
    opt.optimizer_offload_fraction = plan.optimizer_offload_fraction if plan.optimizer_cpu_offload else 0.0
    opt.overlap_cpu_optimizer_d2h_h2d = plan.optimizer_cpu_offload

    cfg.train.micro_batch_size = plan.micro_batch_size
    cfg.train.global_batch_size = plan.global_batch_size
    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)

    # Mock data and a NullTokenizer sized to the model: nothing is downloaded.
    cfg.tokenizer.tokenizer_type = "NullTokenizer"
    cfg.tokenizer.tokenizer_model = None
    cfg.tokenizer.vocab_size = spec.vocab_size

    # Paths relative to the launch directory, not the machine that built the config.
    run_dir = f"nemo_experiments/{plan.name}"
    cfg.checkpoint.save = f"{run_dir}/checkpoints"
    cfg.checkpoint.load = None
    cfg.logger.tensorboard_dir = f"{run_dir}/tb_logs"

    env = dict(_DISPATCH_ENV.get(hw.nvlink_domain, {}))
    if plan.moe_flex_dispatcher_backend == "hybridep":
        env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] = str(lay.ep * lay.etp)
    cfg.env_vars = {**cfg.env_vars, **env}

    if validate:
        validate_config(cfg, hw, lay.world)
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


def _layout_to_str(value: Any) -> str | None:
    """A pipeline layout (str, list of lists, or megatron-core's PipelineParallelLayerLayout) as a layout string."""
    if value is None or isinstance(value, str):
        return value
    rows = getattr(value, "input_data", value)
    if isinstance(rows, str):
        return rows
    return "|".join("".join(_LAYOUT_CHARS.get(str(getattr(x, "value", x)), str(x)) for x in row) for row in rows)


def _precision_of(mixed_precision: Any) -> str:
    """Our precision key for a ConfigContainer's ``mixed_precision`` (name or MixedPrecisionConfig)."""
    if isinstance(mixed_precision, str):
        name = mixed_precision.replace("-", "_")
        for key, value in PRECISIONS.items():
            if value == name:
                return key
        return name
    if mixed_precision is None:
        return "bf16"
    recipe = getattr(mixed_precision, "fp8_recipe", None) if getattr(mixed_precision, "fp8", None) else None
    return {"blockwise": "fp8_blockwise", "mxfp8": "mxfp8", "tensorwise": "fp8_cs", None: "bf16"}.get(recipe, str(recipe))


def plan_from_config(cfg, hardware: str | Hardware, world_size: int, name: str = "config") -> Plan:
    """Read a ConfigContainer (ours, upstream's or a user's) back into a Plan, so the same checks run on it.

    Raises:
        UnknownName: the model is not in our catalogue, nor a registered config.json (matched by layer count,
            experts, hidden size, heads and vocabulary).
    """
    m = cfg.model
    hw = hardware if isinstance(hardware, Hardware) else get_hardware(hardware)
    spec = match_model(m.num_layers, m.num_moe_experts, m.hidden_size, m.num_attention_heads, m.vocab_size)
    if spec is None:
        raise UnknownName(f"the config's model (num_layers={m.num_layers}, num_moe_experts={m.num_moe_experts}, "
                          f"hidden_size={m.hidden_size}, vocab_size={m.vocab_size}) is not in the catalogue",
                          "give its config.json with --model-config PATH, or use one of: "
                          + ", ".join(s.display for s in MODELS.values()))
    model_key = spec.key
    etp = m.expert_tensor_parallel_size
    layout = ParallelLayout(world=world_size, tp=m.tensor_model_parallel_size, pp=m.pipeline_model_parallel_size,
                            cp=m.context_parallel_size, ep=m.expert_model_parallel_size,
                            etp=etp if etp is not None else m.tensor_model_parallel_size,
                            vpp=m.virtual_pipeline_model_parallel_size)
    modules = m.recompute_modules
    graphs = m.cuda_graph_modules
    if isinstance(graphs, str):  # deprecated spelling: "full" means the whole layer, i.e. []
        graphs = [] if graphs == "full" else [graphs]
    return Plan(
        name=name, model=model_key, hardware=hw.key, seq_length=m.seq_length, layout=layout,
        pipeline_model_parallel_layout=_layout_to_str(m.pipeline_model_parallel_layout),
        micro_batch_size=cfg.train.micro_batch_size, global_batch_size=cfg.train.global_batch_size,
        precision=_precision_of(cfg.mixed_precision),
        moe_token_dispatcher_type=m.moe_token_dispatcher_type, moe_flex_dispatcher_backend=m.moe_flex_dispatcher_backend,
        recompute_granularity=m.recompute_granularity,
        recompute_modules=tuple(modules) if modules is not None else (("core_attn",) if m.recompute_granularity == "selective" else ()),
        recompute_method=m.recompute_method, recompute_num_layers=m.recompute_num_layers,
        optimizer_cpu_offload=bool(cfg.optimizer.optimizer_cpu_offload),
        optimizer_offload_fraction=float(cfg.optimizer.optimizer_offload_fraction or 0.0),
        use_distributed_optimizer=bool(cfg.optimizer.use_distributed_optimizer or cfg.ddp.use_distributed_optimizer),
        use_precision_aware_optimizer=bool(cfg.optimizer.use_precision_aware_optimizer),
        cuda_graph_impl=m.cuda_graph_impl or "none", cuda_graph_modules=tuple(graphs or ()),
        sequence_parallel=bool(m.sequence_parallel), mtp_num_layers=m.mtp_num_layers or 0,
        variable_length=_variable_length(cfg), etp_unset=etp is None,
        cp_comm_type=_cp_comm_type(m.cp_comm_type),
    )


def _cp_comm_type(value: Any) -> str:
    """megatron-core's ``cp_comm_type`` (a string, or one per layer) as one string: the per-layer list's value when
    every layer agrees, else its first entry."""
    if value is None:
        return "p2p"
    if isinstance(value, str):
        return value
    values = list(value)
    return str(values[0]) if values else "p2p"


def _variable_length(cfg) -> bool:
    """True when batch shapes change step to step: packed (THD) sequences not padded to a static size, or
    ``variable_seq_lengths`` (megatron-bridge 0.6.2 ``validate()``'s packing fields)."""
    data = cfg.dataset
    specs = getattr(data, "offline_packing_specs", None)
    if getattr(data, "enable_in_batch_packing", False):
        return not getattr(data, "pad_to_max_length", False)
    if getattr(data, "enable_offline_packing", False):
        return not (getattr(data, "pad_to_max_length", False) and getattr(specs, "pad_cu_seqlens", False))
    return bool(getattr(cfg.model, "variable_seq_lengths", False))


def _check_pipeline_layout(cfg, name: str) -> None:
    """The pipeline layout against PP, VPP and the layer counts, with megatron-core's own parser."""
    m = cfg.model
    layout = m.pipeline_model_parallel_layout
    if layout is None:
        return
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    text = _layout_to_str(layout)
    try:
        stages = PipelineParallelLayerLayout.get_num_stages_from_str(text) if isinstance(layout, str) else len(layout)
        pp, vpp = m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size
        if stages % pp:
            raise InfeasibleConfig(f"{name}: pipeline_model_parallel_layout '{text}' has {stages} stages, not a multiple "
                                   f"of PP={pp}", f"use PP in {[d for d in range(1, stages + 1) if stages % d == 0]} or "
                                   "rebuild the layout (set model.pipeline_model_parallel_layout=null or a new string)")
        if (vpp or 1) != stages // pp:
            raise InfeasibleConfig(f"{name}: pipeline_model_parallel_layout '{text}' has {stages} stages = PP {pp} x VPP "
                                   f"{stages // pp}, but virtual_pipeline_model_parallel_size is {vpp}",
                                   f"set VPP={stages // pp}, or give a layout with PP·VPP = {pp * (vpp or 1)} stages")
        parsed = PipelineParallelLayerLayout(layout if not isinstance(layout, str) else text, pp)
        parsed.validate_layer_layout(num_layers=m.num_layers, mtp_num_layers=m.mtp_num_layers)
    except InfeasibleConfig:
        raise
    except (AssertionError, ValueError) as exc:
        raise InfeasibleConfig(f"{name}: pipeline_model_parallel_layout '{text}' is not valid for {m.num_layers} layers "
                               f"+ {m.mtp_num_layers or 0} MTP: {exc}",
                               "give a layout with every decoder layer once, MTP after the decoders, loss last") from None


def config_findings(cfg, hardware: str | Hardware, world_size: int, name: str = "config") -> list:
    """Every finding for a ConfigContainer on ``world_size`` GPUs of ``hardware``, errors first.

    1. model and dataset ``seq_length`` must agree (rule ``config/seq-length``);
    2. read back into a Plan and run :func:`lcmoe_recipes.checks.check_plan` (rank folding, divisibility,
       batch, placement, dispatcher-on-hardware, recompute, offload, CUDA-graph rules: what upstream ``validate()``
       leaves to run time), then the memory model against the target's HBM (:func:`lcmoe_recipes.cost.memory_findings`);
    3. if those pass: the pipeline layout with megatron-core's ``PipelineParallelLayerLayout`` (rule
       ``pipeline/layout``);
    4. if those pass: megatron-bridge's ``runtime_config_update`` (mixed-precision resolution, DP size, comm-overlap
       setup, ``validate()`` with every megatron-core post-init check) on a deep copy, inside
       :func:`lcmoe_recipes.emit.target.target_environment` so the world size, GPU and TE probes answer for the
       target (rule ``upstream/validate``). The copy is thrown away: ``cfg`` is never changed.

    Returns:
        list of :class:`lcmoe_recipes.checks.Finding`.
    """
    hw = hardware if isinstance(hardware, Hardware) else get_hardware(hardware)
    load_bridge(quiet=True)
    model_seq, data_seq = cfg.model.seq_length, getattr(cfg.dataset, "seq_length", cfg.model.seq_length)
    if model_seq != data_seq:
        return [Finding("error", "config/seq-length", f"'seq_length' is {model_seq} on the model but "
                        f"{data_seq} on the dataset", f"set both: model.seq_length={model_seq} dataset.seq_length={model_seq}")]
    from ..explain import all_findings  # the checks, then the predicted peak against the target's HBM

    findings = all_findings(plan_from_config(cfg, hw, world_size, name))
    if any(f.severity == "error" for f in findings):
        return findings
    try:
        _check_pipeline_layout(cfg, name)
    except InfeasibleConfig as exc:
        return [Finding("error", "pipeline/layout", exc.message.removeprefix(f"{name}: "), exc.fix)] + findings
    from megatron.bridge.training.config import runtime_config_update

    trial = copy.deepcopy(cfg)
    with target_environment(hw, world_size), quiet_upstream():
        try:
            runtime_config_update(trial)
        except (AssertionError, ValueError, RuntimeError, TypeError, AttributeError, KeyError) as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            findings.insert(0, Finding(
                "error", "upstream/validate",
                "megatron-bridge validation (runtime_config_update -> ConfigContainer.validate) rejected the "
                f"config for {world_size} x {hw.key}: {text}", "change the field it names (see docs/troubleshooting.md)"))
    return findings


def validate_config(cfg, hardware: str | Hardware, world_size: int, name: str = "config") -> list:
    """:func:`config_findings`, raising on the first error.

    Returns:
        the warnings (list of :class:`lcmoe_recipes.checks.Finding`).

    Raises:
        InfeasibleConfig: the first error, with its fix (all findings attached).
    """
    findings = config_findings(cfg, hardware, world_size, name)
    raise_for_errors(findings, name)
    return findings
