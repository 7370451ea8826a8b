"""Upstream's messages at check time, mapped to our rule ids and fixes (data).

``config_findings`` runs megatron-bridge 0.6.2's ``runtime_config_update`` on the target; whatever it raises
(``ConfigContainer.validate``, the sub-configs' ``finalize``, ``CommOverlapConfig.setup``, megatron-core 0.19.2's
``ModelParallelConfig`` / ``TransformerConfig`` / ``MLATransformerConfig`` / ``DistributedDataParallelConfig`` /
``OptimizerConfig`` / ``BlendedMegatronDatasetConfig`` post-inits) is matched here, first entry first, by a regular
expression over upstream's message. The finding then reads ``rule X: <upstream message>; fix: ...``. A message no
entry matches keeps the generic rule :data:`UPSTREAM_VALIDATE_RULE`. Checks of ours that fire earlier on the same
condition (checks/feasibility.py) are not repeated here; docs/checks.md lists both.
"""

from __future__ import annotations

from typing import NamedTuple

UPSTREAM_VALIDATE_RULE = "upstream/validate"


class UpstreamMessage(NamedTuple):
    """rule: our rule id; pattern: regular expression searched in upstream's message; fix: what to change."""

    rule: str
    pattern: str
    fix: str


UPSTREAM_MESSAGES: tuple[UpstreamMessage, ...] = (
    # --- parallelism and pipeline layout (model_parallel_config.py, transformer_config.py, bridge validate) ---
    UpstreamMessage("pipeline/defer-embedding-wgrad", r"Cannot defer embedding wgrad compute|Wgrad deferral limit",
                    "set comm_overlap.defer_embedding_wgrad_compute=false (it needs PP > 1 and gradient accumulation "
                    "fusion), or a wgrad_deferral_limit >= 0"),
    UpstreamMessage("pipeline/p2p-warmup-flush", r"overlapping in warmup and flush is only compatible",
                    "set model.overlap_p2p_comm_warmup_flush=false, or use overlap_p2p_comm instead of batch_p2p_comm"),
    UpstreamMessage("pipeline/layout", r"pipeline_model_parallel_layout cannot be set|virtual_pipeline_model_parallel_size "
                    r"conflicts with|pipeline_model_parallel_layout must be|must be embedding|must be loss|"
                    r"specified exactly once|must match num_layers|mtp layers in layout|placed before MTP|"
                    r"restrict that the MTP|MTP layers must be in the same|not a valid LayerType|Invalid layer character",
                    "give a layout with PP·VPP stages, every decoder layer once, MTP in the last stage, loss last, and "
                    "unset num_layers_in_first/last_pipeline_stage and account_for_*_in_pipeline_split"),
    UpstreamMessage("pipeline/uneven-split", r"num_layers_in_(first|last)_pipeline_stage|number of layers at (first|last) "
                    r"stage|middle (layers|PP stages|pipeline)|account_for_embedding_in_pipeline_split|"
                    r"number of layers on each (middle )?pipeline rank",
                    "make the first/last stage layer counts and the remaining layers split evenly over the middle "
                    "stages (and over VPP), or set pipeline_model_parallel_layout instead"),
    UpstreamMessage("cp/comm-type", r"cp_comm_type|hierarchical_context_parallel_sizes|communication type for context "
                    r"parallelism", "give one cp_comm_type (or one per layer); 'a2a+p2p' needs "
                    "hierarchical_context_parallel_sizes whose product is CP"),
    UpstreamMessage("batch/eval-gbs", r"eval_global_batch_size|eval model parallel size",
                    "set validation.eval_global_batch_size to a multiple of eval_micro_batch_size × eval DP"),
    # --- gated DeltaNet ---
    UpstreamMessage("gdn/config", r"must be set for (linear )?gated[ _]delta[ _]net|must be a multiple of "
                    r"linear_num_key_heads", "set every linear_* field of the gated-DeltaNet layers (value heads a "
                    "multiple of key heads), as in the model's config.json"),
    # --- MoE ---
    UpstreamMessage("moe/single-grouped-weight", r"moe_single_grouped_(weight|bias)",
                    "set model.moe_single_grouped_weight=false (it needs moe_grouped_gemm, the TE op fuser, and BF16 / "
                    "MXFP8 / NVFP4 weights)"),
    UpstreamMessage("dispatcher/backend-needs-flex", r"DeepEP backend is only supported with flex|Only one backend is "
                    r"supported for flex|'ncclep' requires moe_token_dispatcher_type='flex'",
                    "set model.moe_token_dispatcher_type=flex with exactly one moe_flex_dispatcher_backend"),
    UpstreamMessage("dispatcher/deepep-pad-capacity", r"deepep backend does not support moe_pad_expert_input_to_capacity",
                    "set model.moe_pad_expert_input_to_capacity=false, or the alltoall dispatcher for drop-and-pad"),
    UpstreamMessage("dispatcher/deepep-hardware", r"DeepEP is supported for", "use moe_flex_dispatcher_backend=hybridep "
                    "on GB200/GB300, or moe_token_dispatcher_type=alltoall"),
    UpstreamMessage("moe/paged-stash", r"moe_paged_stash", "set model.moe_paged_stash=false (it needs "
                    "moe_expert_rank_capacity_factor and no CPU / expert activation offloading)"),
    UpstreamMessage("dispatcher/rank-capacity-factor", r"moe_expert_rank_capacity_factor",
                    "use moe_expert_rank_capacity_factor only with the hybridep (plus use_transformer_engine_op_fuser) "
                    "or ncclep backend"),
    UpstreamMessage("moe/num-sms", r"Conflicting deprecated SM-count knobs", "set one model.moe_flex_dispatcher_num_sms "
                    "and unset moe_deepep_num_sms / moe_hybridep_num_sms"),
    UpstreamMessage("moe/shared-expert-size", r"moe_shared_expert_intermediate_size must be",
                    "set moe_shared_expert_intermediate_size = shared experts × their FFN size"),
    UpstreamMessage("moe/shared-expert-overlap", r"moe_shared_expert_overlap only works with",
                    "set model.moe_shared_expert_overlap=false, or use the alltoall / flex dispatcher"),
    UpstreamMessage("moe/aux-loss-coeff", r"moe_aux_loss_coeff must be a list",
                    "give one moe_aux_loss_coeff per moe_router_load_balancing_type"),
    UpstreamMessage("moe/capacity-factor", r"moe_expert_capacity_factor (only works|must be set)",
                    "use a capacity factor with aux_loss / seq_aux_loss / global_aux_loss / none balancing, and set it "
                    "when padding to capacity"),
    UpstreamMessage("moe/bias-etp", r"Bias in Moe is only supported when ETP==1",
                    "set model.expert_tensor_parallel_size=1, or add_bias_linear=false"),
    UpstreamMessage("moe/expert-bias-score", r"Expert bias for aux-loss-free routing only supports",
                    "set model.moe_router_score_function=sigmoid, or moe_router_enable_expert_bias=false"),
    UpstreamMessage("moe/router-padding", r"moe_router_padding_for_quantization",
                    "set model.moe_router_padding_for_quantization=false (it needs FP8/FP4 and the alltoall or flex "
                    "dispatcher)"),
    UpstreamMessage("moe/router-topk1", r"moe-router-pre-softmax when topk is 1", "set model.moe_router_pre_softmax=true"),
    UpstreamMessage("moe/group-limited-routing", r"moe_router_topk_limited_devices|moe_router_num_groups",
                    "set moe_router_num_groups to a divisor of num_moe_experts and moe_router_group_topk <= it"),
    UpstreamMessage("moe/variable-seq-dispatcher", r"does not support variable sequence length",
                    "use moe_token_dispatcher_type=alltoall with variable-length sequences"),
    # --- expert-parallel communication overlap (transformer_config.py; comm_overlap.py) ---
    UpstreamMessage("overlap/delay-wgrad", r"delay_wgrad_compute|overlap_dispatch_backward_with_experts_wgrad|"
                    r"ep_overlap_early_attn_memory_release", "set comm_overlap.delay_wgrad_compute=false, or enable "
                    "overlap_moe_expert_parallel_comm with it (and gradient_accumulation_fusion with graphed attention)"),
    # --- recompute (the rest is in checks/feasibility.py) ---
    UpstreamMessage("overlap/moe-ep", r"overlap_moe_expert_parallel_comm|If enabling EP A2A overlap|A2A Overlap",
                    "set comm_overlap.overlap_moe_expert_parallel_comm=false, or meet its needs: EP > 1, alltoall/flex, "
                    "bf16/fp16, VPP when PP > 1, no full / method / num_layers / 'moe' recompute, no shared-expert "
                    "overlap, at most one MTP layer, no moe/mlp CUDA graphs"),
    UpstreamMessage("recompute/distribute-saved-activations", r"distribute_saved_activations",
                    "set model.distribute_saved_activations=false with sequence parallel"),
    UpstreamMessage("recompute/moe-act-grouped-gemm", r"moe_act in recompute_modules is only supported with moe_grouped_gemm",
                    "set model.moe_grouped_gemm=true, or drop moe_act"),
    UpstreamMessage("recompute/shared-experts-overlap", r"shared_experts recompute cannot work",
                    "drop shared_experts from recompute_modules, or set moe_shared_expert_overlap=false"),
    UpstreamMessage("recompute/moe-layer-recompute", r"moe-layer-recompute", "unset moe_layer_recompute (use "
                    "recompute_modules=[moe] with selective recompute)"),
    # --- activation CPU offloading (transformer_config.py; bridge validate) ---
    UpstreamMessage("offload/activation", r"CPU offloading can be done only|Pipeline parallelism with CPU offloading|"
                    r"CPU offloading does not work when activation recomputation|CUDA graphs not supported with CPU "
                    r"offloading", "set model.cpu_offloading=false (it needs PP=1, no recompute, no CUDA graphs and "
                    "fewer offloaded layers than layers)"),
    UpstreamMessage("offload/fine-grained", r"offload_modules|[Ff]ine-grained activation offloading|"
                    r"fine_grained_activation_offloading|offloaded_tensor_size|activation_offload_fraction|"
                    r"delta_offload_bytes|fused_group_mlp|NVTE_CPU_OFFLOAD_V1|inflight_offloads|while recomputing the "
                    r"entire MoE layer|Token-drop MoE is temporarily not supported with activation offloading|"
                    r"cuda_graph_warmup_steps must be greater than 0",
                    "set model.fine_grained_activation_offloading=false, or meet its needs (TE implementation, "
                    "env_vars NVTE_CPU_OFFLOAD_V1=1, valid offload_modules, TE or partial local CUDA graphs)"),
    # --- CUDA graphs (the rest is in checks/feasibility.py) ---
    UpstreamMessage("cuda-graphs/impl", r"[Ii]nvalid cuda graph implementation|cuda_graph_impl=\"local\" only|"
                    r"enable_cuda_graph|external_cuda_graph|cuda_graph_scope and cuda_graph_modules|must be empty when "
                    r"cuda_graph_impl=\"full_iteration\"|inference CUDA graph scope|must be a list of CudaGraphModule",
                    "use cuda_graph_impl=transformer_engine with cuda_graph_modules, or full_iteration with no modules"),
    UpstreamMessage("cuda-graphs/module-for-model", r"moe cuda graph is only supported|mlp cuda graph is only supported|"
                    r"moe_preprocess cuda graph is not supported when", "graph only modules the model has: moe / "
                    "moe_router for MoE layers (moe needs drop-and-pad), mlp for dense layers"),
    UpstreamMessage("cuda-graphs/recompute", r"graphed attention recomputation|graphed moe recomputation|"
                    r"hidden_dropout|GTP \+ local CUDA graphs", "drop the graphed module from recompute_modules, or set "
                    "its dropout / jitter to 0"),
    UpstreamMessage("cuda-graphs/nan-check", r"check_for_nan_in_loss must be disabled",
                    "set rerun_state_machine.check_for_nan_in_loss=false"),
    UpstreamMessage("precision/fp16-bf16", r"Only one of self\.fp16|cannot have both bf16=True and fp16=True",
                    "choose one of bf16 and fp16 (through cfg.mixed_precision)"),
    UpstreamMessage("precision/optimizer-dtype", r"optimizer\.(bf16|fp16)", "let cfg.mixed_precision set the "
                    "optimizer's bf16/fp16 to match the model's (precision-aware optimizer)"),
    UpstreamMessage("fp8/bf16-layers", r"first / last layer in BF16|num_layers_at_(start|end)_in_bf16",
                    "use a current-scaling / blockwise / MXFP8 recipe for first/last BF16 layers, with counts within the "
                    "layers per pipeline stage"),
    UpstreamMessage("fp8/param", r"fp8_param must be used|fp8_output_proj|fp8_quantizer_factory|fp4_param must be used|"
                    r"fp4 and fp8 cannot be used|fp4_quantizer_factory|fp4 requires",
                    "set FP8/FP4 through one cfg.mixed_precision recipe (fp8_param only with fp8)"),
    UpstreamMessage("fp8/mxfp8-param-gather", r"reuse_grad_buf_for_mxfp8_param_ag|Reuse grad buffer only when",
                    "with MXFP8 and fp8_param_gather set reuse_grad_buf_for_mxfp8_param_ag=true (the "
                    "bf16_with_mxfp8_mixed recipe does), and no overlap_param_gather_with_optimizer_step"),
    UpstreamMessage("fp8/activation-input", r"Storing activation input in FP8", "set model.activation_func_fp8_input_store"
                    "=false unless the activation is SwiGLU"),
    UpstreamMessage("precision/name", r"Unknown mixed-precision recipe", "use a registered name, e.g. bf16_mixed, "
                    "bf16_with_fp8_subchannel_scaling_mixed, bf16_with_mxfp8_mixed"),
    # --- optimizer and DDP configs ---
    UpstreamMessage("optimizer/precision-aware", r"use-precision-aware-optimizer only supported|can only be fp32 when not "
                    r"using precision-aware", "use the precision-aware optimizer with adam and the distributed optimizer; "
                    "without it keep the main_grads / main_params / exp_avg / exp_avg_sq dtypes fp32"),
    UpstreamMessage("ddp/buckets", r"num_buckets|explicitly specify param_name patterns for FP32",
                    "set one of ddp.bucket_size and ddp.num_buckets (> 0)"),
    UpstreamMessage("ddp/fsdp", r"Megatron-FSDP|FSDP requires|use_megatron_fsdp and use_torch_fsdp2|fsdp_manual_registration|"
                    r"not supported with Megatron FSDP|check_weight_hash_across_dp_replicas_interval",
                    "with Megatron-FSDP use ckpt_format=fsdp_dtensor and CUDA_DEVICE_MAX_CONNECTIONS > 1"),
    # --- training length, scheduler, data, checkpoint (bridge sub-config finalize) ---
    UpstreamMessage("train/length", r"train_iters, train_samples, or num_epochs|train_samples must be positive|"
                    r"global_batch_size must be set when using|Batch size rampup not supported|num_epochs",
                    "give exactly one of train.train_iters / train_samples / num_epochs (with a global batch size)"),
    UpstreamMessage("scheduler/fields", r"scheduler|lr_warmup|lr_decay|weight_decay|use-checkpoint",
                    "use either iteration-based or sample-based scheduler fields, matching the training length"),
    UpstreamMessage("data/packing", r"packing|packed sequence|offline_packing_specs",
                    "offline packing: MBS=1 and pad_to_max_length; in-batch packing: MBS > 1; not both"),
    UpstreamMessage("data/blend", r"blend|split must be provided|data-cache-path|dataloader-fast-cache-load",
                    "give either dataset.blend with split, or blend_per_split without split"),
    UpstreamMessage("checkpoint/format", r"async_save|ckpt_format|load_main_params_from_ckpt|ckpt_step=|"
                    r"also_save_hf_checkpoint|distrib_optim_fully_reshardable_mem_efficient|Pretrained checkpoint|PEFT "
                    r"requires a pretrained", "use checkpoint.ckpt_format=torch_dist (async_save and the distributed "
                    "optimizer need it) and set the paths the options need"),
    # --- MLA ---
    UpstreamMessage("mla/rotary-interleaved", r"rotary_interleaved does not work with multi_latent_attention",
                    "set model.rotary_interleaved=false"),
    UpstreamMessage("mla/rope-fusion", r"apply_rope_fusion for MLA only works with YARN|Rope Fusion is not compatible "
                    r"with caching latents", "set model.apply_rope_fusion=false (MLA fuses RoPE only with YaRN)"),
    UpstreamMessage("mla/output-gate", r"Output gate is not supported for MLA",
                    "set model.attention_output_gate=false for MLA"),
)
