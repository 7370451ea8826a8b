"""What we change on megatron-bridge's recipe, and why: the settings a Plan writes onto its upstream base.

Every config of ours starts from megatron-bridge's own recipe for the model and GPU (:mod:`.upstream`). Each
:class:`Setting` below owns a set of ConfigContainer fields (glob patterns over the dotted paths of
``ConfigContainer.to_dict()``), writes them from the Plan, and gives the reason. :func:`parity` applies them one by
one onto the base and attributes every changed field to the setting that changed it; a setting that changes a field
it does not own is an error, so no difference from upstream can appear without a reason (tests/test_parity.py;
docs/parity.md is generated from it by ``scripts/parity_report.py``).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Callable

from ..core.plan import Plan, Reason, mixed_precision_name
from ..cost.overlap import ep_overlap
from ..cost.wallclock import phase_time, save_intervals
from ..rules.batch import choose_eval_batch
from .fields import dispatcher_num_sms, precision_of

# Process environment by NVLink domain (megatron-bridge 0.6.2 perf recipes: CUDA_DEVICE_MAX_CONNECTIONS 1 on HGX
# with DeepEP-class dispatch, 32 on NVL72; HybridEP's NVLINK_DOMAIN_SIZE / USE_MNNVL for the system).
HARDWARE_ENV = {
    8: {"CUDA_DEVICE_MAX_CONNECTIONS": 1, "NVLINK_DOMAIN_SIZE": 8, "USE_MNNVL": 0},
    72: {"CUDA_DEVICE_MAX_CONNECTIONS": 32, "NVLINK_DOMAIN_SIZE": 72, "USE_MNNVL": 1},
}
# HybridEP's tuning variables: inert for any other backend; megatron-bridge's perf recipes drop them there
# (perf_recipes/environment.py HYBRID_EP_ENV_NAMES).
HYBRID_EP_ENV = ("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API", "NVLINK_DOMAIN_SIZE",
                 "USE_MNNVL")
UPSTREAM = "megatron-bridge 0.6.2"


@dataclass(frozen=True)
class Setting:
    """One group of fields we set, with its reason.

    Attributes:
        key: the Plan's reason key (``plan.reasons[key]``), or a fixed name.
        fields: glob patterns over ``ConfigContainer.to_dict()`` paths (``model.recompute_*``).
        apply: writes the fields: ``apply(cfg, plan, base_recipe_record_or_None)``.
        reason: the reason when the Plan has none under ``key``.
    """

    key: str
    fields: tuple[str, ...]
    apply: Callable[[Any, Plan], None]
    reason: Callable[[Plan], Reason] | None = None

    def why(self, plan: Plan) -> Reason:
        if self.key in plan.reasons:
            return plan.reasons[self.key]
        if self.reason is not None:
            return self.reason(plan)
        return Reason(f"set from the plan ({self.key})", "lcmoe_recipes plan")

    def owns(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, pattern) for pattern in self.fields)


def _layout(cfg, plan: Plan) -> None:
    import torch

    m, lay = cfg.model, plan.layout
    m.tensor_model_parallel_size, m.pipeline_model_parallel_size = lay.tp, lay.pp
    m.virtual_pipeline_model_parallel_size, m.context_parallel_size = lay.vpp, lay.cp
    m.expert_model_parallel_size, m.expert_tensor_parallel_size = lay.ep, lay.etp
    m.pipeline_dtype = torch.bfloat16 if lay.pp > 1 else None


def _sequence_parallel(cfg, plan: Plan) -> None:
    cfg.model.sequence_parallel = plan.sequence_parallel


def _pipeline(cfg, plan: Plan) -> None:
    m = cfg.model
    m.pipeline_model_parallel_layout = plan.pipeline_model_parallel_layout
    if plan.pipeline_model_parallel_layout is not None:  # a layout string excludes the other split knobs
        m.account_for_embedding_in_pipeline_split = m.account_for_loss_in_pipeline_split = False
        m.num_layers_in_first_pipeline_stage = m.num_layers_in_last_pipeline_stage = None


def _seq_length(cfg, plan: Plan) -> None:
    cfg.model.seq_length = cfg.dataset.seq_length = plan.seq_length


def _positions(cfg, plan: Plan) -> None:
    p, m = plan.positions, cfg.model
    if p is None:
        return
    m.rotary_base = p.rotary_base
    yarn = p.scaling == "yarn"
    if plan.model_spec.multi_latent_attention:  # MLA providers: megatron-core MLATransformerConfig fields
        m.rope_type = "yarn"  # factor 1 = plain RoPE; MLA's rope fusion needs the yarn path (mcore 0.19.2)
        m.rotary_scaling_factor = p.factor if yarn else 1.0
        if yarn:
            m.original_max_position_embeddings = p.original_max_position_embeddings
            m.beta_fast, m.beta_slow, m.mscale, m.mscale_all_dim = p.beta_fast, p.beta_slow, p.mscale, p.mscale_all_dim
        return
    m.position_embedding_type = "yarn" if yarn else "rope"  # GPT providers: megatron-bridge's yarn_* fields
    values = ((p.factor, p.original_max_position_embeddings, p.beta_fast, p.beta_slow, p.mscale, p.mscale_all_dim, True)
              if yarn else (None,) * 7)
    (m.yarn_rotary_scaling_factor, m.yarn_original_max_position_embeddings, m.yarn_beta_fast, m.yarn_beta_slow,
     m.yarn_mscale, m.yarn_mscale_all_dim, m.yarn_correction_range_round_to_int) = values


def _cp_comm(cfg, plan: Plan) -> None:
    if plan.cp_comm_type == "p2p" and cfg.model.cp_comm_type in (None, "p2p"):
        return  # megatron-core's default ring either way
    cfg.model.cp_comm_type = plan.cp_comm_type
    cfg.model.hierarchical_context_parallel_sizes = list(plan.hierarchical_cp_sizes) if plan.hierarchical_cp_sizes else None


def _mtp(cfg, plan: Plan) -> None:
    cfg.model.mtp_num_layers = plan.mtp_num_layers or None


def _dispatcher(cfg, plan: Plan) -> None:
    m = cfg.model
    if not plan.model_spec.is_moe:
        return  # dense decoder: no dispatcher
    m.moe_token_dispatcher_type = plan.moe_token_dispatcher_type
    m.moe_flex_dispatcher_backend = plan.moe_flex_dispatcher_backend
    if plan.moe_token_dispatcher_type == "flex":
        m.moe_shared_expert_overlap = False  # megatron-core: shared-expert overlap is incompatible with flex
    if not (plan.moe_token_dispatcher_type == "flex" and plan.moe_flex_dispatcher_backend in ("hybridep", "ncclep")):
        # a base recipe's per-rank expert capacity (and the paged stash built on it) is HybridEP's / NCCL-EP's only:
        # megatron-core 0.19.2 TransformerConfig refuses it with any other dispatcher
        if getattr(m, "moe_expert_rank_capacity_factor", None) is not None:
            m.moe_expert_rank_capacity_factor = None
            m.moe_paged_stash = False
    env = dict(cfg.env_vars or {})
    if plan.moe_flex_dispatcher_backend == "hybridep" and plan.moe_token_dispatcher_type == "flex":
        env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] = plan.layout.ep * plan.layout.etp
    else:
        for name in HYBRID_EP_ENV:
            env.pop(name, None)
    cfg.env_vars = env


def _hardware_env(cfg, plan: Plan) -> None:
    env = dict(cfg.env_vars or {})
    hybridep = plan.moe_flex_dispatcher_backend == "hybridep" and plan.moe_token_dispatcher_type == "flex"
    for name, value in HARDWARE_ENV.get(plan.hardware_spec.nvlink_domain, {}).items():
        if name == "CUDA_DEVICE_MAX_CONNECTIONS" or hybridep:  # the other two are HybridEP's
            env[name] = value
    cfg.env_vars = env


def _recompute(cfg, plan: Plan) -> None:
    m = cfg.model
    m.recompute_granularity = plan.recompute_granularity
    m.recompute_modules = list(plan.recompute_modules) if plan.recompute_granularity == "selective" else None
    m.recompute_method, m.recompute_num_layers = plan.recompute_method, plan.recompute_num_layers


def _cuda_graphs(cfg, plan: Plan) -> None:
    m = cfg.model
    if plan.cuda_graph_impl == "none" and (m.cuda_graph_impl or "none") == "none":
        return  # no graphs, as upstream: leave its (unused) module spelling alone
    m.cuda_graph_impl = plan.cuda_graph_impl
    m.cuda_graph_scope = None  # deprecated alias in megatron-core 0.19.2; cannot be set with cuda_graph_modules
    m.cuda_graph_modules = list(plan.cuda_graph_modules)
    if plan.cuda_graph_impl != "none":  # CUDA graphs need TE's RNG tracker (megatron-core)
        m.use_te_rng_tracker = cfg.rng.te_rng_tracker = True


def _precision(cfg, plan: Plan) -> None:
    if precision_of(cfg.mixed_precision) == plan.precision:
        return  # upstream's own mixed-precision object for this precision (its tuned fields included)
    if plan.precision == "bf16" and getattr(cfg.model, "moe_router_padding_for_quantization", False):
        cfg.model.moe_router_padding_for_quantization = False  # pads routed tokens for FP8/FP4 GEMMs only
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    grad_fp32 = getattr(cfg.mixed_precision, "grad_reduce_in_fp32", None)
    mixed = get_mixed_precision_config(mixed_precision_name(plan.precision))
    if grad_fp32 is not None:
        mixed.grad_reduce_in_fp32 = grad_fp32
    cfg.mixed_precision = mixed


def _grad_dtype(cfg, plan: Plan) -> None:
    """Gradient accumulation and reduction dtype: both fields, since megatron-bridge's ``MixedPrecisionConfig.setup``
    overwrites the DDP field with its own (a precision given by name is made an object to carry it)."""
    fp32 = plan.grad_dtype == "fp32"
    if isinstance(cfg.mixed_precision, str):
        from megatron.bridge.training.mixed_precision import get_mixed_precision_config

        cfg.mixed_precision = get_mixed_precision_config(cfg.mixed_precision)
    if cfg.mixed_precision is not None and cfg.mixed_precision.grad_reduce_in_fp32 != fp32:
        cfg.mixed_precision.grad_reduce_in_fp32 = fp32
    cfg.ddp.grad_reduce_in_fp32 = fp32


def _optimizer(cfg, plan: Plan) -> None:
    opt = cfg.optimizer
    opt.use_distributed_optimizer = cfg.ddp.use_distributed_optimizer = plan.use_distributed_optimizer
    opt.use_precision_aware_optimizer = plan.use_precision_aware_optimizer
    opt.optimizer_cpu_offload = plan.optimizer_cpu_offload
    opt.optimizer_offload_fraction = plan.optimizer_offload_fraction if plan.optimizer_cpu_offload else 0.0
    opt.overlap_cpu_optimizer_d2h_h2d = plan.optimizer_cpu_offload


def _batch(cfg, plan: Plan) -> None:
    cfg.train.micro_batch_size, cfg.train.global_batch_size = plan.micro_batch_size, plan.global_batch_size


def _schedule(cfg, plan: Plan) -> None:
    s = plan.schedule
    if s is None:
        return
    cfg.train.train_iters = s.train_iters
    cfg.optimizer.lr, cfg.optimizer.min_lr = s.lr, s.min_lr
    cfg.scheduler.lr_warmup_iters, cfg.scheduler.lr_decay_style = s.lr_warmup_iters, s.lr_decay_style
    cfg.scheduler.lr_decay_iters = s.train_iters


def _attention_mask(cfg, plan: Plan) -> None:
    cfg.dataset.create_attention_mask = plan.create_attention_mask


def _vocabulary(cfg, plan: Plan) -> None:
    cfg.model.vocab_size = plan.model_spec.vocab_size


def _data(cfg, plan: Plan) -> None:
    cfg.dataset.num_workers = plan.num_workers
    if getattr(cfg.dataset, "path_to_cache", None) is None:  # the cached index loads need a cache folder
        for flag in ("fast_cache_load", "defer_npy_index_mmap"):
            if getattr(cfg.dataset, flag, False):
                setattr(cfg.dataset, flag, False)
    tok = cfg.tokenizer
    if getattr(cfg.dataset, "blend", None) is None:  # mock data: nothing to download
        tok.tokenizer_type, tok.tokenizer_model, tok.vocab_size = "NullTokenizer", None, plan.model_spec.vocab_size


def _checkpoint(cfg, plan: Plan) -> None:
    run_dir = f"nemo_experiments/{plan.name}"
    ckpt = cfg.checkpoint
    ckpt.save = ckpt.load = f"{run_dir}/checkpoints"  # a restarted job resumes from its saves
    ckpt.pretrained_checkpoint = plan.pretrained_checkpoint
    cfg.logger.tensorboard_dir = f"{run_dir}/tb_logs"
    ckpt.async_save = ckpt.fully_parallel_save = True
    cadence = save_intervals(plan, base_interval=ckpt.save_interval)
    ckpt.save_interval = cadence.persistent
    if cadence.non_persistent:  # overwritten saves under <save>/non_persistent; megatron-bridge keeps the two newest
        ckpt.non_persistent_save_interval, ckpt.non_persistent_ckpt_type = cadence.non_persistent, "global"


def _evaluation(cfg, plan: Plan) -> None:
    if plan.eval_iters <= 0 or plan.eval_global_batch_size is None:
        return
    cfg.validation.eval_global_batch_size = plan.eval_global_batch_size
    cfg.validation.eval_interval = cfg.checkpoint.save_interval  # after "checkpoint": a validation loss per kept save


def _eval_reason(plan: Plan) -> Reason:
    return choose_eval_batch(plan.seq_length, plan.layout, plan.micro_batch_size, plan.eval_iters,
                             plan.global_batch_size)[1]


def _logging(cfg, plan: Plan) -> None:
    log = cfg.logger
    log.log_throughput = log.log_throughput_to_tensorboard = log.log_memory_to_tensorboard = True


def _real_training(cfg, plan: Plan) -> None:
    """Undo what megatron-bridge's perf recipes set for benchmarking only."""
    cfg.model.moe_router_force_load_balancing = False
    cfg.ddp.check_for_nan_in_grad = True
    cfg.rerun_state_machine.check_for_nan_in_loss = plan.cuda_graph_impl != "full_iteration"
    cfg.train.eval_iters = None  # deprecated field _benchmark_common sets to 0; validate() copies it over
    cfg.validation.eval_iters = plan.eval_iters


def _documents(cfg, plan: Plan) -> None:
    if hasattr(cfg.dataset, "inter_document_masking"):
        cfg.dataset.inter_document_masking = False


DOCUMENTS_REASON = Reason(
    "no inter-document masking: documents packed into one sequence attend across their boundaries (causal over the "
    "whole sample, as megatron-bridge's pre-training template). megatron-core 0.19.2 can restrict attention to each "
    "document (dataset.inter_document_masking=true: cu_seqlens per sample, THD attention), but its GPTDataset does not "
    "pad documents to a multiple of 2·CP, which Transformer Engine's THD context parallelism needs for every document, "
    "and per-sample cu_seqlens change every step, which attention CUDA graphs cannot replay; where CP=1 and attention "
    "is not graphed it may be turned on (Llama 3 found document masking important in continued pre-training on very "
    "long sequences)",
    "megatron-core 0.19.2 datasets/gpt_dataset.py (GPTDatasetConfig.inter_document_masking; context_parallel_size "
    "declared but unused); megatron-bridge 0.6.2 training/gpt_step.py (cu_seqlens batches -> PackedSeqParams, THD); "
    "Llama 3 (arXiv 2407.21783) §3.2")


def _expert_bias(cfg, plan: Plan) -> None:
    if plan.moe_router_bias_update_rate is not None and getattr(cfg.model, "moe_router_enable_expert_bias", False):
        cfg.model.moe_router_bias_update_rate = plan.moe_router_bias_update_rate


def _what_runs(cfg, plan: Plan) -> None:
    """State the values megatron derives at run time instead of values it replaces (:mod:`lcmoe_recipes.emit.effective`
    reads them back and refuses a difference in our own configs)."""
    import torch
    from megatron.bridge.utils import fusions

    from .stack import quiet_upstream

    m = cfg.model
    with quiet_upstream():  # its notice says what we do here
        if m.apply_rope_fusion and not fusions.validate_rope_fusion_compatibility(m):
            m.apply_rope_fusion = False  # GPTModelProvider.provide turns it off (e.g. YaRN positions)
    sch = cfg.scheduler
    if sch.start_weight_decay is not None:  # the scheduler's decay replaces optimizer.weight_decay from step 1
        cfg.optimizer.weight_decay = sch.start_weight_decay
    if plan.optimizer_cpu_offload:  # HybridDeviceOptimizer keeps FP32 Adam states whatever exp_avg_dtype says
        cfg.optimizer.exp_avg_dtype = cfg.optimizer.exp_avg_sq_dtype = torch.float32
    data = cfg.dataset
    if hasattr(data, "mock") and getattr(data, "blend", None) is None and getattr(data, "blend_per_split", None) is None:
        data.mock = True  # megatron-core trains on mock data without a blend, whatever mock says


WHAT_RUNS_REASON = Reason(
    "the values megatron derives at run time, stated: apply_rope_fusion off where megatron-bridge's provider turns it "
    "off (YaRN positions); optimizer.weight_decay equal to the scheduler's start_weight_decay, which replaces it from "
    "step 1; FP32 Adam moments under optimizer CPU offload (HybridDeviceOptimizer is built without exp_avg_dtype); "
    "dataset.mock true while no blend is given (--data-path gives one)",
    "megatron-bridge 0.6.2 models/gpt_provider.py GPTModelProvider.provide and utils/fusions.py "
    "validate_rope_fusion_compatibility; training/optim.py; megatron-core 0.19.2 optimizer_param_scheduler.py, "
    "optimizer/__init__.py _get_megatron_optimizer_based_on_param_groups, datasets/blended_megatron_dataset_config.py; "
    "docs/checks.md (effective settings)")


def _numerics(cfg, plan: Plan) -> None:
    m = cfg.model
    if (m.num_moe_experts or 0) >= 32 and not m.moe_router_dtype:
        m.moe_router_dtype = "fp32"


def _loss(cfg, plan: Plan) -> None:
    if plan.layout.cp > 1:
        cfg.model.calculate_per_token_loss = True
        cfg.ddp.average_in_collective = False  # megatron-core DDP asserts it off with per-token loss


def _tp_overlap(cfg, plan: Plan) -> None:
    overlap = cfg.comm_overlap
    if plan.tp_comm_overlap:
        if overlap is None:
            from megatron.bridge.training.comm_overlap import CommOverlapConfig

            cfg.comm_overlap = overlap = CommOverlapConfig(tp_comm_overlap=True)
        overlap.tp_comm_overlap = True
    elif overlap is not None and overlap.tp_comm_overlap:
        overlap.tp_comm_overlap = False  # the plan's layout has no TP overlap (TP 1): say so instead of a no-op


def _ep_overlap(cfg, plan: Plan) -> None:
    overlap = cfg.comm_overlap
    if plan.moe_ep_overlap:
        if overlap is None:
            from megatron.bridge.training.comm_overlap import CommOverlapConfig

            cfg.comm_overlap = overlap = CommOverlapConfig(tp_comm_overlap=False)
        if not overlap.overlap_moe_expert_parallel_comm:  # the planner's, not the base recipe's: delayed weight
            # gradients with it, as megatron-bridge's recipes set them together and the step model prices it
            overlap.delay_wgrad_compute = ep_overlap(plan)[1]
        overlap.overlap_moe_expert_parallel_comm = True
        cfg.model.moe_shared_expert_overlap = False  # megatron-core asserts it off with the EP overlap
        graphed_attention = "attn" in plan.cuda_graph_modules and plan.cuda_graph_impl != "none"
        if overlap.delay_wgrad_compute and graphed_attention and (cfg.model.add_bias_linear or cfg.model.add_qkv_bias):
            overlap.delay_wgrad_compute = False  # megatron-bridge: no attention bias in graphs with delayed wgrad
    elif overlap is not None:  # off: clear what the base set (megatron-bridge asserts delay_wgrad_compute needs it)
        if overlap.overlap_moe_expert_parallel_comm:
            overlap.overlap_moe_expert_parallel_comm = False
        if overlap.delay_wgrad_compute:
            overlap.delay_wgrad_compute = False
    if cfg.comm_overlap is not None and plan.layout.dp == 1:
        # CommOverlapConfig.setup turns the DDP overlaps off when the (dense) data-parallel size is 1, whatever EDP
        # is, unless comm_overlap itself sets them: state what the run does instead of a value setup overwrites
        for name in DP_OVERLAP_FIELDS:
            if getattr(cfg.comm_overlap, name, None) is None and getattr(cfg.ddp, name, False):
                setattr(cfg.ddp, name, False)


DP_OVERLAP_FIELDS = ("overlap_grad_reduce", "overlap_param_gather", "align_param_gather")


def _op_fuser(cfg, plan: Plan) -> None:
    if plan.use_transformer_engine_op_fuser:  # on where the plan asks; a base recipe that sets it keeps it
        cfg.model.use_transformer_engine_op_fuser = True


def _dispatcher_sms(cfg, plan: Plan) -> None:
    if plan.moe_flex_dispatcher_num_sms is not None and dispatcher_num_sms(cfg.model) != plan.moe_flex_dispatcher_num_sms:
        cfg.model.moe_flex_dispatcher_num_sms = plan.moe_flex_dispatcher_num_sms


def _answer(text: str, source: str) -> Callable[[Plan], Reason]:
    return lambda plan: Reason(text, source)


SETTINGS: tuple[Setting, ...] = (
    Setting("layout", ("model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
                       "model.virtual_pipeline_model_parallel_size", "model.context_parallel_size",
                       "model.expert_model_parallel_size", "model.expert_tensor_parallel_size", "model.pipeline_dtype"),
            _layout),
    Setting("sequence_parallel", ("model.sequence_parallel",), _sequence_parallel),
    Setting("pipeline_model_parallel_layout", ("model.pipeline_model_parallel_layout*", "model.account_for_*",
                                               "model.num_layers_in_*_pipeline_stage"), _pipeline),
    Setting("seq_length", ("model.seq_length", "dataset.seq_length"), _seq_length,
            lambda plan: Reason(f"seq_length {plan.seq_length:,}: the length this run trains at (model and dataset, "
                                "which megatron-bridge requires equal)", "your request")),
    Setting("positions", ("model.rotary_base", "model.position_embedding_type", "model.yarn_*", "model.rope_type",
                          "model.rotary_scaling_factor", "model.original_max_position_embeddings", "model.beta_*",
                          "model.mscale*"), _positions),
    Setting("cp_comm_type", ("model.cp_comm_type", "model.hierarchical_context_parallel_sizes*"), _cp_comm),
    Setting("mtp", ("model.mtp_num_layers",), _mtp,
            _answer("multi-token prediction as the model was trained", "the model's config.json / model card")),
    Setting("dispatcher", ("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend",
                           "model.moe_shared_expert_overlap", *(f"env_vars.{n}" for n in HYBRID_EP_ENV)), _dispatcher),
    Setting("hardware_env", tuple(f"env_vars.{n}" for n in HARDWARE_ENV[8]), _hardware_env,
            _answer("process environment of the target system (values of megatron-bridge's perf recipes for HGX "
                    "(NVLink domain 8) and NVL72 (72) systems)", f"{UPSTREAM} perf_recipes/<model>/<gpu>/*.py env_vars")),
    Setting("recompute", ("model.recompute_granularity", "model.recompute_modules*", "model.recompute_method",
                          "model.recompute_num_layers"), _recompute),
    Setting("cuda_graphs", ("model.cuda_graph_impl", "model.cuda_graph_scope*", "model.cuda_graph_modules*",
                            "model.use_te_rng_tracker", "rng.te_rng_tracker"), _cuda_graphs),
    Setting("precision", ("mixed_precision", "mixed_precision.*", "model.moe_router_padding_for_quantization"),
            _precision),
    Setting("grad_dtype", ("ddp.grad_reduce_in_fp32", "mixed_precision", "mixed_precision.*"), _grad_dtype),
    Setting("optimizer_cpu_offload", ("optimizer.use_distributed_optimizer", "ddp.use_distributed_optimizer",
                                      "optimizer.use_precision_aware_optimizer", "optimizer.optimizer_cpu_offload",
                                      "optimizer.optimizer_offload_fraction", "optimizer.overlap_cpu_optimizer_d2h_h2d"),
            _optimizer),
    Setting("global_batch_size", ("train.global_batch_size", "train.micro_batch_size"), _batch),
    Setting("schedule", ("train.train_iters", "optimizer.lr", "optimizer.min_lr", "scheduler.lr_warmup_iters",
                         "scheduler.lr_decay_style", "scheduler.lr_decay_iters"), _schedule),
    Setting("attention_mask", ("dataset.create_attention_mask",), _attention_mask,
            _answer("no dense seq_length x seq_length attention mask per sample: megatron-core's GPT dataset builds one "
                    "in every data-loader worker when create_attention_mask is true (float32, then bool: 128 GiB at "
                    "peak per worker at 128K), the attention kernel builds the causal mask itself, and megatron-bridge's "
                    "gpt_step never reads the dataset's (its gpt_oss perf recipe also sets it false)",
                    "megatron-core 0.19.2 datasets/gpt_dataset.py _get_ltor_masks_and_position_ids; megatron-bridge "
                    "0.6.2 perf_recipes/gpt_oss/common.py; docs/cost_model.md (host memory)")),
    Setting("vocabulary", ("model.vocab_size",), _vocabulary,
            _answer("the model's own vocabulary (its config.json vocab_size), so its released weights load: upstream's "
                    "gpt-oss perf recipes benchmark with Llama 3's 128,256 instead",
                    f"{UPSTREAM} perf_recipes/gpt_oss/common.py; the model's config.json")),
    Setting("data", ("dataset.num_workers", "dataset.fast_cache_load", "dataset.defer_npy_index_mmap",
                     "tokenizer.tokenizer_type", "tokenizer.tokenizer_model",
                     "tokenizer.vocab_size"), _data,
            _answer("mock data with a NullTokenizer sized to the model's vocabulary until --data-path/--tokenizer give "
                    "real ones (nothing is downloaded); the cached-index loads upstream's perf recipes turn on need "
                    "dataset.path_to_cache, so they stay off until one is given (megatron-core asserts it)",
                    "lcmoe_recipes docs/guide.md (real data); megatron-core 0.19.2 "
                    "datasets/blended_megatron_dataset_config.py")),
    Setting("checkpoint", ("checkpoint.save", "checkpoint.load", "checkpoint.pretrained_checkpoint",
                           "checkpoint.save_interval", "logger.tensorboard_dir", "checkpoint.async_save",
                           "checkpoint.fully_parallel_save", "checkpoint.non_persistent_save_interval",
                           "checkpoint.non_persistent_ckpt_type"), _checkpoint,
            lambda plan: Reason(
                "a real run saves, and a restarted job resumes from its saves (checkpoint.load = checkpoint.save; "
                "megatron-bridge reads checkpoint.pretrained_checkpoint only when no saved checkpoint exists yet); "
                "checkpoints and TensorBoard under nemo_experiments/<recipe>/ of the launch folder (launch --save-dir "
                "moves them); " + save_intervals(plan).reason.why,
                f"{UPSTREAM} perf_recipes/_common.py _benchmark_common turns saving off for benchmarks; "
                + save_intervals(plan).reason.source)),
    Setting("evaluation", ("validation.eval_global_batch_size", "validation.eval_interval"), _evaluation,
            lambda plan: Reason(
                f"{_eval_reason(plan).why}; one evaluation with every kept save, and the validation and test "
                f"evaluations after training: {phase_time(plan).evaluation / 3600:.1f} h of the phase "
                f"({phase_time(plan).text()})" if plan.eval_iters > 0 else "no evaluation (eval_iters 0)",
                _eval_reason(plan).source)),
    Setting("logging", ("logger.log_throughput", "logger.log_throughput_to_tensorboard",
                        "logger.log_memory_to_tensorboard"), _logging,
            _answer("throughput and memory logged, so a run's log calibrates the cost model: TFLOP/s per GPU on every "
                    "log line (what scripts/calibrate_step.py fits), throughput and per-pipeline-stage peak memory in "
                    "TensorBoard; megatron-bridge prints its memory report after the first steps either way",
                    f"{UPSTREAM} training/utils/train_utils.py training_log (log_throughput, "
                    "log_throughput_to_tensorboard, log_memory_to_tensorboard -> report_memory)")),
    Setting("real_training", ("model.moe_router_force_load_balancing", "ddp.check_for_nan_in_grad",
                              "rerun_state_machine.check_for_nan_in_loss", "validation.eval_iters", "train.eval_iters"),
            _real_training,
            _answer("real training, not a benchmark: routing follows the learned router (forced load balancing is a "
                    "benchmark-only setting), NaN checks on gradients and loss stay on, validation runs",
                    f"{UPSTREAM} perf_recipes/_common.py _benchmark_common and the model's perf common.py "
                    "(moe_router_force_load_balancing); recipes/common.py _pretrain_common for the training values")),
    Setting("document_masking", ("dataset.inter_document_masking",), _documents, lambda plan: DOCUMENTS_REASON),
    Setting("moe_router_bias_update_rate", ("model.moe_router_bias_update_rate",), _expert_bias),
    Setting("numerics", ("model.moe_router_dtype",), _numerics,
            _answer("fp32 routing for 32+ experts (megatron-core warns without it)",
                    "megatron-core 0.19.2 transformer/transformer_config.py __post_init__ warning")),
    Setting("loss", ("model.calculate_per_token_loss", "ddp.average_in_collective"), _loss,
            _answer("per-token loss with context parallelism: each CP rank's loss is summed over its tokens and divided "
                    "by the global count of unmasked tokens, so masked tokens spread unevenly over the CP ranks do not "
                    "rescale the gradients (megatron-core's DDP requires average_in_collective off with it)",
                    "Megatron-LM issue #7452 / PR #7513; megatron-core 0.19.2 distributed/distributed_data_parallel.py; "
                    "docs/known_issues.md cp-masked-loss-normalization")),
    Setting("tp_comm_overlap", ("comm_overlap.tp_comm_overlap",), _tp_overlap,
            _answer("as the plan has it: on with TP >= 2 and sequence parallelism where the base recipe or the "
                    "planner asks for it, off elsewhere (megatron-bridge turns it off below TP 2 and without "
                    "sequence parallelism)", f"{UPSTREAM} training/comm_overlap.py CommOverlapConfig")),
    Setting("moe_ep_overlap", ("comm_overlap.overlap_moe_expert_parallel_comm", "comm_overlap.delay_wgrad_compute",
                               "model.moe_shared_expert_overlap", *(f"ddp.{n}" for n in DP_OVERLAP_FIELDS)),
            _ep_overlap, _answer("EP all-to-all overlap wherever megatron-core allows it and the step model prices it "
                                 "faster (see moe_ep_overlap); delayed weight gradients with it (as the base recipe "
                                 "sets them where it sets the overlap), and not with graphed "
                                 "attention that has biases (megatron-bridge asserts both); at DP=1 with a "
                                 "comm_overlap section, the DDP overlaps off, as CommOverlapConfig.setup sets them",
                                 f"{UPSTREAM} training/comm_overlap.py CommOverlapConfig.setup")),
    Setting("op_fuser", ("model.use_transformer_engine_op_fuser",), _op_fuser,
            _answer("routed experts through Transformer Engine's op fuser where the plan asks for it, and where the "
                    "base recipe sets it (megatron-core's default is off: it needs Transformer Engine >= 2.14, "
                    "Blackwell and NVTE_CUTEDSL_FUSED_GROUPED_MLP=1); the step model prices the passes either path "
                    "runs outside its kernels", "megatron-core 0.19.2 transformer/moe/experts.py TEGroupedMLP "
                    "(_is_fused_impl_supported, _apply_bias)")),
    Setting("dispatcher_num_sms", ("model.moe_flex_dispatcher_num_sms",), _dispatcher_sms,
            _answer("the flex dispatcher's SMs as the base recipe gives them (megatron-bridge's performance settings "
                    "give HybridEP 32), written only where the plan asks for another count; the step model prices the "
                    "share of the SMs they hold beside overlapped compute", "megatron-core 0.19.2 "
                    "transformer/transformer_config.py (moe_flex_dispatcher_num_sms; the deprecated "
                    "moe_hybridep_num_sms routed into it)")),
    Setting("what_runs", ("model.apply_rope_fusion", "optimizer.weight_decay", "optimizer.exp_avg_dtype",
                          "optimizer.exp_avg_sq_dtype", "dataset.mock"), _what_runs, lambda plan: WHAT_RUNS_REASON),
)


def apply_settings(cfg, plan: Plan) -> None:
    """Write every :data:`SETTINGS` group of ``plan`` onto ``cfg`` (the upstream base), in order."""
    for setting in SETTINGS:
        setting.apply(cfg, plan)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out if out or not prefix else {prefix: {}}
    return {prefix: tree}


def flat_fields(cfg) -> dict[str, Any]:
    """``cfg.to_dict()`` as dotted path -> value (lists and scalars are leaves)."""
    return _flatten(cfg.to_dict())


@dataclass(frozen=True)
class Difference:
    """One field whose value differs from upstream's recipe."""

    path: str
    upstream: Any
    ours: Any
    setting: str
    reason: Reason


def parity(base, plan: Plan, settings: tuple[Setting, ...] = SETTINGS) -> list[Difference]:
    """Apply ``settings`` (default :data:`SETTINGS`) to ``base`` (changed in place) one at a time and attribute
    every changed field.

    Raises:
        AssertionError: a setting changed a field it does not own (a difference without a reason).
    """
    before = flat_fields(base)
    upstream = dict(before)
    out: list[Difference] = []
    for setting in settings:
        setting.apply(base, plan)
        after = flat_fields(base)
        for path in sorted(set(before) | set(after)):
            if before.get(path, _ABSENT) == after.get(path, _ABSENT):
                continue
            if not setting.owns(path):
                raise AssertionError(f"setting '{setting.key}' changed {path}, which it does not own: add it to its "
                                     "fields (with a reason that covers it) or stop changing it")
            out = [d for d in out if d.path != path]
            if upstream.get(path, _ABSENT) != after.get(path, _ABSENT):
                out.append(Difference(path, upstream.get(path, _ABSENT), after.get(path, _ABSENT), setting.key,
                                      setting.why(plan)))
        before = after
    return out


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()


# The settings groups a retarget writes onto a user's config (the rest of the config stays the user's).
# "checkpoint": the retargeted run saves and resumes in a folder of its own, at a cadence for its step time (kept, the
# config's folder would resume from the shorter run's saves, whose iteration may already be the new run's last);
# "precision": a no-op unless --precision asked for another (the plan keeps the config's own otherwise)
RETARGET_SETTINGS = ("precision", "layout", "sequence_parallel", "pipeline_model_parallel_layout", "seq_length",
                     "positions", "cp_comm_type", "dispatcher", "hardware_env", "recompute", "cuda_graphs",
                     "optimizer_cpu_offload", "global_batch_size", "loss", "attention_mask", "tp_comm_overlap",
                     "moe_ep_overlap", "checkpoint")


def retarget_config(cfg, plan: Plan, schedule: bool = False) -> tuple[object, list[Difference]]:
    """(a copy of ``cfg`` with :data:`RETARGET_SETTINGS` written for ``plan``, every field changed with its setting
    and reason) -- ``launch --from`` (:func:`lcmoe_recipes.planner.retarget.retarget_plan` makes the plan);
    ``schedule``: the plan's schedule too (the request gave an LR or a step count)."""
    import copy

    out = copy.deepcopy(cfg)
    keys = RETARGET_SETTINGS + (("schedule",) if schedule else ())
    return out, parity(out, plan, tuple(s for s in SETTINGS if s.key in keys))

