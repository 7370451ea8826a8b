"""ConfigContainer -> Plan: every field our checks and cost models read, taken from the config's own objects (ETP as
megatron-bridge and megatron-core default it) by :func:`plan_from_config`, so one set of checks serves any config --
ours, upstream's, a user's YAML, with overrides."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ..catalog import Hardware, MODELS, get_hardware
from ..catalog.registry import match_model
from ..core.layout import ParallelLayout
from ..core.plan import Plan, Positions, Schedule
from ..cost.overlap import tp_overlap_allowed
from ..errors import UnknownName
from .fields import dispatcher_num_sms, grad_reduce_in_fp32, layout_to_str, precision_of


def plan_from_config(cfg, hardware: str | Hardware, world_size: int, name: str = "config",
                     base_recipe: str | None = None) -> Plan:
    """Read a ConfigContainer (ours, upstream's or a user's) back into a Plan, so the same checks run on it.
    ``base_recipe``: the megatron-bridge recipe it started from, where that is known (a config does not say it; our
    YAML header records it).

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
    from megatron.bridge.models.transformer_config import _set_moe_expert_tensor_parallel_default

    # ETP as the run will have it: megatron-bridge's own default (1 when EP > 1 and ETP is unset), then
    # megatron-core's (ETP = TP when still unset).
    degrees = SimpleNamespace(expert_tensor_parallel_size=m.expert_tensor_parallel_size,
                              expert_model_parallel_size=m.expert_model_parallel_size)
    _set_moe_expert_tensor_parallel_default(degrees)
    etp = degrees.expert_tensor_parallel_size
    layout = ParallelLayout(world=world_size, tp=m.tensor_model_parallel_size, pp=m.pipeline_model_parallel_size,
                            cp=m.context_parallel_size, ep=m.expert_model_parallel_size,
                            etp=etp if etp is not None else m.tensor_model_parallel_size,
                            vpp=m.virtual_pipeline_model_parallel_size)
    modules = m.recompute_modules
    graphs = m.cuda_graph_modules if m.cuda_graph_scope is None else m.cuda_graph_scope
    if isinstance(graphs, str):  # deprecated spelling: "full" means the whole layer, i.e. []
        graphs = [] if graphs == "full" else [graphs]
    graphs = [getattr(g, "name", g) for g in graphs or ()]
    opt = cfg.optimizer
    precision_aware = bool(opt.use_precision_aware_optimizer)
    hcp = m.hierarchical_context_parallel_sizes
    return Plan(
        name=name, model=model_key, base_recipe=base_recipe, hardware=hw.key, seq_length=m.seq_length, layout=layout,
        pipeline_model_parallel_layout=layout_to_str(m.pipeline_model_parallel_layout),
        micro_batch_size=cfg.train.micro_batch_size, global_batch_size=cfg.train.global_batch_size,
        precision=precision_of(cfg.mixed_precision),
        moe_token_dispatcher_type=m.moe_token_dispatcher_type, moe_flex_dispatcher_backend=m.moe_flex_dispatcher_backend,
        recompute_granularity=m.recompute_granularity,
        recompute_modules=tuple(modules) if modules is not None else (("core_attn",) if m.recompute_granularity == "selective" else ()),
        recompute_method=m.recompute_method, recompute_num_layers=m.recompute_num_layers,
        optimizer_cpu_offload=bool(opt.optimizer_cpu_offload),
        optimizer_offload_fraction=float(opt.optimizer_offload_fraction or 0.0),
        use_distributed_optimizer=bool(opt.use_distributed_optimizer or cfg.ddp.use_distributed_optimizer),
        use_precision_aware_optimizer=precision_aware,
        cuda_graph_impl=m.cuda_graph_impl or "none", cuda_graph_modules=tuple(graphs),
        sequence_parallel=bool(m.sequence_parallel), mtp_num_layers=m.mtp_num_layers or 0,
        variable_length=_variable_length(cfg), etp_unset=m.expert_tensor_parallel_size is None,
        grad_dtype="fp32" if grad_reduce_in_fp32(cfg) else "bf16",
        moe_router_bias_update_rate=(float(m.moe_router_bias_update_rate)
                                     if getattr(m, "moe_router_enable_expert_bias", False) else None),
        # under CPU offload, HybridDeviceOptimizer keeps FP32 moments whatever exp_avg_dtype says (megatron-core
        # 0.19.2 optimizer/__init__.py _get_megatron_optimizer_based_on_param_groups)
        moment_dtype=("bf16" if precision_aware and not opt.optimizer_cpu_offload
                      and str(opt.exp_avg_dtype).endswith("bfloat16") else "fp32"),
        positions=_positions_of(m), cp_comm_type=_cp_comm_type(m.cp_comm_type),
        hierarchical_cp_sizes=tuple(hcp) if hcp else None, schedule=_schedule_of(cfg),
        pretrained_checkpoint=cfg.checkpoint.pretrained_checkpoint,
        create_attention_mask=bool(getattr(cfg.dataset, "create_attention_mask", False)),
        num_workers=int(getattr(cfg.dataset, "num_workers", 0) or 0), eval_iters=int(_eval_iters(cfg) or 0),
        eval_global_batch_size=getattr(cfg.validation, "eval_global_batch_size", None),
        pin_cpu_grads=bool(opt.pin_cpu_grads),
        moe_ep_overlap=bool(m.overlap_moe_expert_parallel_comm
                            or (cfg.comm_overlap is not None and cfg.comm_overlap.overlap_moe_expert_parallel_comm)),
        use_transformer_engine_op_fuser=bool(getattr(m, "use_transformer_engine_op_fuser", False)),
        moe_flex_dispatcher_num_sms=dispatcher_num_sms(m),
        # what CommOverlapConfig.setup leaves on: asked for on the model or the comm_overlap section, and TP >= 2 with
        # sequence parallelism (the node check requires TE for a TE config)
        tp_comm_overlap=bool(m.tp_comm_overlap or (cfg.comm_overlap is not None and cfg.comm_overlap.tp_comm_overlap))
        and tp_overlap_allowed(m.tensor_model_parallel_size, bool(m.sequence_parallel))[0],
    )


def _positions_of(m) -> Positions | None:
    """The RoPE setup a model provider describes (MLA: megatron-core's MLA fields; GPT: megatron-bridge's yarn_*);
    None for an MLA ``rope_type`` other than rope / yarn, which megatron-core refuses (rule mla/rope-type)."""
    base = float(m.rotary_base)
    if getattr(m, "multi_latent_attention", False):
        if getattr(m, "rope_type", "rope") not in ("rope", "yarn"):
            return None
        if getattr(m, "rope_type", "rope") == "yarn" and (m.rotary_scaling_factor or 1) > 1:
            return Positions(rotary_base=base, scaling="yarn", factor=float(m.rotary_scaling_factor),
                             original_max_position_embeddings=m.original_max_position_embeddings,
                             beta_fast=m.beta_fast, beta_slow=m.beta_slow, mscale=m.mscale, mscale_all_dim=m.mscale_all_dim)
        return Positions(rotary_base=base)
    if m.position_embedding_type == "yarn":
        return Positions(rotary_base=base, scaling="yarn", factor=m.yarn_rotary_scaling_factor,
                         original_max_position_embeddings=m.yarn_original_max_position_embeddings,
                         beta_fast=m.yarn_beta_fast, beta_slow=m.yarn_beta_slow, mscale=m.yarn_mscale,
                         mscale_all_dim=m.yarn_mscale_all_dim)
    return Positions(rotary_base=base)


def _schedule_of(cfg) -> Schedule | None:
    """The optimizer schedule of an iteration-based config (None for a sample-based one)."""
    if not cfg.train.train_iters:
        return None
    return Schedule(train_iters=cfg.train.train_iters, lr=cfg.optimizer.lr, min_lr=cfg.optimizer.min_lr,
                    lr_warmup_iters=cfg.scheduler.lr_warmup_iters or 0, lr_decay_style=cfg.scheduler.lr_decay_style)


def _eval_iters(cfg) -> int | None:
    """``validation.eval_iters``, or the deprecated ``train.eval_iters`` where set: megatron-bridge 0.6.2's
    ``ConfigContainer.validate()`` copies that over the validation one (upstream's perf recipes set it to 0)."""
    deprecated = getattr(cfg.train, "eval_iters", None)
    return deprecated if deprecated is not None else cfg.validation.eval_iters


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
