"""Every config-decided upstream assert is a rule with a failing config (issue 11 part 1; docs/checks.md).

Each case deep-copies a named recipe's ConfigContainer, changes a few fields, runs ``config_findings`` for the
recipe's target and asserts the rule id and the key part of the message. ``LATE`` covers the asserts megatron-core
raises after check time (lcmoe_recipes.checks.config_asserts); ``MAPPED`` covers upstream's check-time messages and
the rule ids they are mapped to (lcmoe_recipes.checks.upstream_messages); ``OVERRIDES`` the silent overrides.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class Lazy:
    """A value built when the case runs (needs torch / megatron-bridge loaded)."""

    def __init__(self, make):
        self.make = make


def _mixed(name: str, **fields) -> Lazy:
    def make():
        from megatron.bridge.training.mixed_precision import get_mixed_precision_config

        mp = get_mixed_precision_config(name)
        for key, value in fields.items():
            setattr(mp, key, value)
        return mp
    return Lazy(make)


def _dtype(name: str) -> Lazy:
    return Lazy(lambda: getattr(__import__("torch"), name))


def _torch_fn(name: str) -> Lazy:
    return Lazy(lambda: getattr(__import__("torch").nn.functional, name))


def _apply(cfg, changes: dict) -> None:
    for dotted, value in changes.items():
        *path, leaf = dotted.split(".")
        obj = cfg
        for part in path:
            obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
        value = value.make() if isinstance(value, Lazy) else value
        if isinstance(obj, dict):
            obj[leaf] = value
        else:
            setattr(obj, leaf, value)


def _findings(fresh_config, recipe: str, changes: dict, world: int | None = None):
    from lcmoe_recipes.emit import config_findings

    plan, cfg = fresh_config(recipe)
    _apply(cfg, changes)
    return config_findings(cfg, plan.hardware, world or plan.layout.world, recipe)


def _assert_rule(findings, rule: str, fragment: str, severity: str = "error") -> None:
    hits = [f for f in findings if f.rule == rule]
    assert hits, f"expected {rule}, got {[str(f) for f in findings]}"
    assert any(fragment in f.message and f.severity == severity for f in hits), [str(f) for f in hits]


DSV3, QWEN, NEXT, NEXT32 = "dsv3_128k_h100", "qwen3_235b_128k_gb200", "qwen3_next_8k_gb200", "qwen3_next_32k_gb200"
DSV3_256K = "dsv3_256k_h100"
FULL_RECOMPUTE = {"model.recompute_granularity": "full", "model.recompute_modules": None,
                  "model.recompute_method": "uniform", "model.recompute_num_layers": 1}

# (case id = rule id, recipe, field changes, rule, key part of the message)
LATE = [
    ("ddp/optimizer-instances", NEXT, {"ddp.num_distributed_optimizer_instances": 2},
     "ddp/optimizer-instances", "does not divide the expert data-parallel size EDP=1"),
    ("ddp/optimizer-instances-dpcp", QWEN, {"ddp.num_distributed_optimizer_instances": 3},
     "ddp/optimizer-instances", "does not divide DP·CP = 1·8 = 8"),
    ("ddp/optimizer-instances-distopt", NEXT, {"ddp.num_distributed_optimizer_instances": 2,
                                                "model.expert_model_parallel_size": 8,
                                                "ddp.use_distributed_optimizer": False,
                                                "optimizer.use_distributed_optimizer": False,
                                                "optimizer.use_precision_aware_optimizer": False},
     "ddp/optimizer-instances-distopt", "without the distributed optimizer"),
    ("ddp/optimizer-instances-rs-fp32", NEXT, {"ddp.num_distributed_optimizer_instances": 2,
                                               "model.expert_model_parallel_size": 8,
                                               "ddp.reduce_scatter_with_fp32_accumulation": True},
     "ddp/optimizer-instances-rs-fp32", "reduce_scatter_with_fp32_accumulation"),
    ("dist/sharp-group", QWEN, {"dist.sharp_enabled_group": "dp"}, "dist/sharp-group", "without dist.use_sharp"),
    ("dist/tp-pp-dp-mapping", DSV3_256K, {"dist.use_tp_pp_dp_mapping": True},  # DP1, EDP2
     "dist/tp-pp-dp-mapping", "dense DP=1 differs from expert DP=2"),
    ("pipeline/comm-backend", QWEN, {"model.pipeline_model_parallel_comm_backend": "gloo"},
     "pipeline/comm-backend", "pipeline_model_parallel_comm_backend='gloo'"),
    ("pipeline/comm-backend-ucc", DSV3, {"model.pipeline_model_parallel_comm_backend": "ucc"},
     "pipeline/comm-backend", "CUDA_DEVICE_MAX_CONNECTIONS=1"),
    ("cuda-graphs/te-rng-tracker", QWEN, {"model.use_te_rng_tracker": False, "rng.te_rng_tracker": False},
     "cuda-graphs/te-rng-tracker", "without Transformer Engine's RNG tracker"),
    ("moe/dispatcher-type", NEXT, {"model.moe_token_dispatcher_type": "alltoall_seq"},
     "moe/dispatcher-type", "moe_token_dispatcher_type='alltoall_seq'"),
    ("dispatcher/ncclep", QWEN, {"model.moe_flex_dispatcher_backend": "ncclep"},
     "dispatcher/ncclep", "needs moe_expert_rank_capacity_factor"),
    ("dispatcher/ncclep-static-shape", QWEN, {"model.moe_flex_dispatcher_backend": "ncclep",
                                              "model.moe_expert_rank_capacity_factor": 2.0,
                                              "model.moe_ncclep_zero_copy": True},
     "dispatcher/ncclep", "moe_ncclep_zero_copy without moe_ncclep_static_shape"),
    ("moe/latent-shared-overlap", DSV3, {"model.moe_latent_size": 1024, "model.moe_shared_expert_overlap": True},
     "moe/latent-shared-overlap", "MoE latent projections"),
    ("moe/quantile-balancing", NEXT, {"model.moe_router_load_balancing_type": "quantile_balancing",
                                      "model.moe_aux_loss_coeff": 0.001},
     "moe/quantile-balancing", "non-zero moe_aux_loss_coeff"),
    ("moe/sinkhorn-aux-loss", NEXT, {"model.moe_router_load_balancing_type": "sinkhorn", "model.moe_aux_loss_coeff": 0.001},
     "moe/sinkhorn-aux-loss", "sinkhorn routing"),
    ("moe/grouped-mlp-bias-fusion", QWEN, {"model.add_bias_linear": True, "model.bias_dropout_fusion": True},
     "moe/grouped-mlp-bias-fusion", "bias_dropout_fusion"),
    ("moe/op-fuser", QWEN, {"model.use_transformer_engine_op_fuser": True, "model.moe_apply_probs_on_input": True},
     "moe/op-fuser", "moe_apply_probs_on_input"),
    ("moe/probs-on-input-topk", QWEN, {"model.moe_apply_probs_on_input": True},
     "moe/probs-on-input-topk", "moe_router_topk=8"),
    ("moe/shared-expert-bias", DSV3, {"model.add_bias_linear": True}, "moe/shared-expert-bias", "add_bias_linear"),
    ("mla/rope-type", DSV3, {"model.rope_type": "longrope", "model.apply_rope_fusion": False},
     "mla/rope-type", "rope_type='longrope'"),
    ("mla/cache-latents-training", DSV3, {"model.cache_mla_latents": True, "model.apply_rope_fusion": False},
     "mla/cache-latents-training", "cache_mla_latents"),
    ("mla/down-proj-fusion", DSV3, {"model.mla_down_proj_fusion": True, "model.q_lora_rank": None},
     "mla/down-proj-fusion", "without q_lora_rank"),
    ("gdn/packed-sequences", NEXT, {"dataset.enable_in_batch_packing": True, "train.micro_batch_size": 2,
                                    "model.recompute_modules": ["layernorm", "moe"]},  # MBS 2 fits with more recompute
     "gdn/packed-sequences", "MBS=2"),
    ("mtp/full-recompute", DSV3, {**FULL_RECOMPUTE, "model.recompute_num_layers": 2},
     "mtp/full-recompute", "recompute_num_layers=2"),
    ("fp8/format", DSV3, {"mixed_precision": _mixed("bf16_with_fp8_subchannel_scaling_mixed", fp8="e5m2")},
     "fp8/format", "model.fp8='e5m2'"),
    ("fp8/gemm-shapes", NEXT, {"mixed_precision": "bf16_with_mxfp8_mixed", "model.moe_ffn_hidden_size": 520},
     "fp8/gemm-shapes", "experts linear_fc1 [1040, 2048]"),
    ("fp8/gdn-in-proj", NEXT, {"mixed_precision": "bf16_with_mxfp8_mixed", "model.linear_num_key_heads": 8,
                               "model.linear_num_value_heads": 8},
     "fp8/gdn-in-proj", "in_proj output dimension 4112 is not a multiple of 32"),
    ("pipeline/microbatch-group", QWEN, {"model.microbatch_group_size_per_vp_stage": 3},  # GBS 64 at DP1
     "pipeline/microbatch-group", "must lie in [PP=4, microbatches=64]"),
    ("pipeline/microbatch-group-remainder", QWEN, {"model.microbatch_group_size_per_vp_stage": 7},
     "pipeline/microbatch-group", "mod microbatch_group_size_per_vp_stage 7 = 1"),
    ("pipeline/p2p-overlap-and-batch", QWEN, {"comm_overlap.batch_p2p_comm": True},
     "pipeline/p2p-overlap-and-batch", "both set"),
    ("pipeline/p2p-overlap-needs-vpp", NEXT, {"model.pipeline_model_parallel_layout": None,
                                              "model.virtual_pipeline_model_parallel_size": None,
                                              "comm_overlap.overlap_p2p_comm": True},
     "pipeline/p2p-overlap-needs-vpp", "no interleaving"),
    ("ddp/per-token-loss-average", QWEN, {"model.calculate_per_token_loss": True, "ddp.average_in_collective": True},
     "ddp/per-token-loss-average", "average_in_collective"),
    ("offload/decoupled-weight-decay", DSV3, {"optimizer.decoupled_weight_decay": False},
     "offload/decoupled-weight-decay", "decoupled_weight_decay=false"),
    ("optimizer/distributed-needs-adam", QWEN, {"optimizer.optimizer": "sgd",
                                                "optimizer.use_precision_aware_optimizer": False},
     "optimizer/distributed-needs-adam", "optimizer='sgd'"),
    ("scheduler/lr-range", QWEN, {"optimizer.lr": 1e-6, "optimizer.min_lr": 1e-5}, "scheduler/lr-range",
     "optimizer.lr=1e-06 (the peak) is below optimizer.min_lr=1e-05"),
    ("scheduler/lr-negative", QWEN, {"optimizer.lr": -1e-5, "optimizer.min_lr": -1e-4}, "scheduler/lr-range",
     "optimizer.lr=-1e-05 (the peak) is negative: the scheduler asserts max_lr >= min_lr >= 0"),
    ("scheduler/lr-zero", QWEN, {"optimizer.lr": 0.0, "optimizer.min_lr": 0.0}, "scheduler/lr-range",
     "optimizer.lr=0.0 (the peak) is zero: every step leaves the weights as they are"),
    ("scheduler/lr-warmup-init-negative", QWEN, {"scheduler.lr_warmup_init": -1e-6}, "scheduler/lr-range",
     "scheduler.lr_warmup_init=-1e-06 is negative"),
    ("optimizer/adam-beta1", QWEN, {"optimizer.adam_beta1": 1.0}, "optimizer/adam-hyperparameters",
     "optimizer.adam_beta1=1.0 is outside [0, 1)"),
    ("optimizer/adam-weight-decay", QWEN, {"optimizer.weight_decay": -0.1}, "optimizer/adam-hyperparameters",
     "optimizer.weight_decay=-0.1 is negative"),
    ("scheduler/lr-min-negative", QWEN, {"optimizer.min_lr": -1e-5, "optimizer.lr": 1e-4}, "scheduler/lr-range",
     "optimizer.min_lr=-1e-05 is negative"),
    ("scheduler/lr-warmup-init", QWEN, {"scheduler.lr_warmup_init": 1.0}, "scheduler/lr-range",
     "scheduler.lr_warmup_init=1.0 is above optimizer.lr="),
    ("train/iters-positive", QWEN, {"train.train_iters": -5}, "train/iters-positive",
     "train.train_iters=-5: the training loop runs no step"),
    ("checkpoint/interval-negative", QWEN, {"checkpoint.save_interval": -1}, "checkpoint/interval-negative",
     "checkpoint.save_interval=-1: step % -1 is 0 at every step"),
    ("cuda-graphs/nccl-graph-register", QWEN, {"env_vars.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                                               "env_vars.NCCL_GRAPH_REGISTER": "1"},
     "cuda-graphs/nccl-graph-register", "NCCL_GRAPH_REGISTER"),
    ("data/vocab-size", NEXT, {"tokenizer.use_tokenizer_vocab_size": False, "tokenizer.vocab_size": 151937}, "data/vocab-size", "smaller than the NullTokenizer's"),
    # the recipe's own hierarchical CP (a2a+p2p, sizes [8, 4])
    ("dist/decentralized-pg-hcp", DSV3, {"dist.use_decentralized_pg": True, "dist.use_gloo_process_groups": False},
     "dist/decentralized-pg-hcp", "use_decentralized_pg with hierarchical_context_parallel_sizes"),
    ("rng/seed", QWEN, {"rng.seed": 0}, "rng/seed", "rng.seed=0"),
    ("moe/bias-activation-fusion", QWEN, {"model.activation_func": _torch_fn("gelu"), "model.bias_activation_fusion": True},
     "moe/bias-activation-fusion", "not gelu"),
    ("moe/fused-shared-expert", DSV3, {"model.use_grouped_gemm_for_shared_expert": True},
     "moe/fused-shared-expert", "moe_shared_expert_glu_interleave_size unset"),
    ("moe/router-options", QWEN, {"model.moe_router_score_function": "relu"}, "moe/router-options", "'relu'"),
    ("mla/hybrid-cp", DSV3, {"model.hybrid_context_parallel": True}, "mla/hybrid-cp", "multi-latent attention"),
    ("gdn/activation", NEXT, {"model.activation_func": _torch_fn("gelu")}, "gdn/activation", "activation gelu"),
    ("data/dataloader-type", NEXT, {"dataset.dataloader_type": "random"}, "data/dataloader-type", "'random'"),
    ("data/document-masking", QWEN, {"dataset.inter_document_masking": True}, "data/document-masking",
     "does not pad documents to a multiple of 2·CP"),  # CP>1 and graphed attention
]

# Upstream asserts whose condition a check of ours (checks/feasibility.py, emit/validate.py) catches first, under its
# own rule id: the same end-to-end test.
OURS_FIRST = [
    ("divisibility/fp8-tokens", NEXT, {"mixed_precision": "bf16_with_mxfp8_mixed", "model.seq_length": 8200,
                                       "dataset.seq_length": 8200},
     "divisibility/fp8-tokens", "(MBS·seq_length/CP = 1·8200/1) to be a multiple of 32"),
    ("recompute/granularity", QWEN, {"model.recompute_granularity": "partial"}, "recompute/granularity", "'partial'"),
    ("recompute/full-args", DSV3, {**FULL_RECOMPUTE, "model.recompute_method": None}, "recompute/full-args",
     "recompute_method"),
    ("recompute/selective-num-layers", QWEN, {"model.recompute_num_layers": 2}, "recompute/selective-num-layers",
     "recompute_num_layers set"),
    ("recompute/gdn-norm-out", QWEN, {"model.recompute_modules": ["moe_act", "layernorm", "gdn_norm_out"]},
     "recompute/gdn-norm-out", "gdn_norm_out"),
    ("cuda-graphs/moe-router", QWEN, {"model.cuda_graph_modules": ["attn", "moe", "moe_router"]},
     "cuda-graphs/moe-router", "moe and moe_router"),
    ("cuda-graphs/preprocess-needs-router", QWEN, {"model.cuda_graph_modules": ["attn", "moe_preprocess"]},
     "cuda-graphs/preprocess-needs-router", "without moe_router"),
    ("recompute/full-with-graphs", QWEN, FULL_RECOMPUTE, "recompute/full-with-graphs", "cuda_graph_impl=transformer_engine"),
    ("config/seq-length", NEXT, {"model.seq_length": 16384}, "config/seq-length", "16384 on the model but 8192"),
    ("dispatcher/flex-backend", QWEN, {"model.moe_flex_dispatcher_backend": "nixl"}, "dispatcher/flex-backend", "'nixl'"),
    ("batch/positive", NEXT, {"train.micro_batch_size": 0}, "batch/positive", "MBS=0"),
    ("parallel/sp-off", QWEN, {"model.sequence_parallel": False}, "parallel/sp-off", "refuses to train MoE layers"),
]

# Rules whose failing config cannot be reached from a named recipe at its own world size without first breaking
# a check that fires earlier (memory, rank folding): the rule runs on the recipe's resolved config at another size.
ON_RESOLVED = [
    ("cp/hybrid-even", NEXT, {"model.hybrid_context_parallel": True}, 6, "cp/hybrid-even", "odd DP·CP = 3"),
    ("dispatcher/flex-tp-ep", DSV3, {"model.expert_model_parallel_size": 1}, 256, "dispatcher/flex-tp-ep", "ETP·EP = 1"),
]

MAPPED = [
    ("pipeline/defer-embedding-wgrad", NEXT, {"comm_overlap.defer_embedding_wgrad_compute": True}, "Wgrad deferral limit"),
    ("pipeline/p2p-warmup-flush", QWEN, {"model.overlap_p2p_comm_warmup_flush": True, "comm_overlap.batch_p2p_comm": True},
     "overlapping in warmup and flush"),
    ("pipeline/layout", DSV3, {"model.account_for_loss_in_pipeline_split": True},
     "pipeline_model_parallel_layout cannot be set"),
    ("pipeline/uneven-split", NEXT, {"model.pipeline_model_parallel_layout": None,
                                     "model.num_layers_in_first_pipeline_stage": 0}, "must be larger than 0"),
    ("cp/comm-type", QWEN, {"model.cp_comm_type": "a2a+p2p"}, "hierarchical_context_parallel_sizes must be set"),
    ("batch/eval-gbs", NEXT, {"validation.eval_global_batch_size": 3}, "eval_global_batch_size (3)"),  # DP16
    ("gdn/config", NEXT, {"model.linear_num_value_heads": 24}, "must be a multiple of linear_num_key_heads"),
    ("moe/single-grouped-weight", QWEN, {"model.moe_single_grouped_weight": True}, "moe_single_grouped_weight"),
    ("dispatcher/backend-needs-flex", QWEN, {"model.moe_token_dispatcher_type": "alltoall",
                                             "model.moe_flex_dispatcher_backend": "ncclep"}, "requires moe_token_dispatcher_type='flex'"),
    ("dispatcher/deepep-pad-capacity", DSV3, {"model.moe_pad_expert_input_to_capacity": True,
                                              "model.moe_expert_capacity_factor": 1.0}, "does not support moe_pad_expert"),
    ("dispatcher/deepep-hardware", QWEN, {"model.moe_flex_dispatcher_backend": "deepep"}, "DeepEP"),
    ("dispatcher/rank-capacity-factor", QWEN, {"model.moe_expert_rank_capacity_factor": 2.0},
     "requires use_transformer_engine_op_fuser"),
    ("moe/num-sms", QWEN, {"model.moe_deepep_num_sms": 20, "model.moe_hybridep_num_sms": 24,
                           "model.moe_flex_dispatcher_num_sms": None}, "Conflicting deprecated SM-count knobs"),
    ("moe/shared-expert-size", DSV3, {"model.moe_shared_expert_intermediate_size": -1}, "moe_shared_expert_intermediate_size"),
    ("moe/shared-expert-overlap", DSV3, {"model.moe_token_dispatcher_type": "allgather",
                                        "model.moe_shared_expert_overlap": True}, "only works with alltoall or flex"),
    ("moe/aux-loss-coeff", QWEN, {"model.moe_router_load_balancing_type": ["aux_loss", "seq_aux_loss"],
                                  "model.moe_aux_loss_coeff": 0.001}, "moe_aux_loss_coeff must be a list"),
    ("moe/capacity-factor", QWEN, {"model.moe_pad_expert_input_to_capacity": True,
                                   "model.moe_expert_capacity_factor": None}, "must be set to use"),
    ("moe/paged-stash", QWEN, {"model.moe_paged_stash": True}, "moe_paged_stash"),
    ("moe/bias-etp", QWEN, {"model.add_bias_linear": True, "model.expert_tensor_parallel_size": 2,
                            "model.expert_model_parallel_size": 16}, "Bias in Moe is only supported when ETP==1"),
    ("moe/expert-bias-score", QWEN, {"model.moe_router_enable_expert_bias": True,
                                     "model.moe_router_score_function": "softmax"}, "Expert bias for aux-loss-free routing"),
    ("moe/router-padding", QWEN, {"model.moe_router_padding_for_quantization": True}, "fp8/fp4 must be specified"),
    ("moe/router-topk1", QWEN, {"model.moe_router_topk": 1, "model.moe_router_pre_softmax": False},
     "moe-router-pre-softmax when topk is 1"),
    ("moe/group-limited-routing", QWEN, {"model.moe_router_group_topk": 2, "model.moe_router_num_groups": None},
     "moe_router_num_groups must be specified"),
    ("moe/variable-seq-dispatcher", NEXT, {"model.moe_token_dispatcher_type": "allgather",
                                           "model.variable_seq_lengths": True}, "does not support variable sequence"),
    ("overlap/moe-ep", NEXT32, {"comm_overlap.overlap_moe_expert_parallel_comm": True},
     "disable moe in recompute_modules"),
    ("overlap/delay-wgrad", NEXT, {"comm_overlap.delay_wgrad_compute": True}, "delay_wgrad_compute"),
    ("recompute/distribute-saved-activations", QWEN, {"model.distribute_saved_activations": True},
     "distribute_saved_activations"),
    ("recompute/moe-act-grouped-gemm", QWEN, {"model.moe_grouped_gemm": False}, "moe_act in recompute_modules"),
    ("recompute/shared-experts-overlap", DSV3, {"model.recompute_modules": ["mla_up_proj", "layernorm", "moe", "mlp", "shared_experts"],
                                                "model.moe_shared_expert_overlap": True}, "shared_experts recompute"),
    ("recompute/moe-layer-recompute", DSV3, {**FULL_RECOMPUTE, "model.moe_layer_recompute": True},
     "Do not set --moe-layer-recompute"),
    ("offload/activation", NEXT, {"model.cpu_offloading": True}, "Pipeline parallelism with CPU offloading"),
    ("offload/fine-grained", NEXT, {"model.fine_grained_activation_offloading": True,
                                    "model.offload_modules": ["bogus"]}, "offload"),
    ("cuda-graphs/impl", QWEN, {"model.cuda_graph_impl": "local"}, "only for full-iteration CUDA graphs"),
    ("cuda-graphs/module-for-model", QWEN, {"model.cuda_graph_modules": ["mlp"]},
     "mlp cuda graph is only supported for dense layers"),
    ("cuda-graphs/recompute", QWEN, {"model.recompute_modules": ["core_attn", "moe_act", "layernorm"],
                                     "model.attention_dropout": 0.1},
     "attention dropout is not supported with graphed attention recomputation"),
    ("cuda-graphs/nan-check", NEXT, {"model.cuda_graph_impl": "full_iteration", "model.cuda_graph_modules": [],
                                     "model.use_te_rng_tracker": True}, "check_for_nan_in_loss must be disabled"),
    # bf16 gradient reduction, as the recipe's own (fp32 gradients would not fit beside its activations)
    ("precision/fp16-bf16", QWEN, {"mixed_precision": _mixed("bf16_mixed", fp16=True, grad_reduce_in_fp32=False)},
     "fp16"),
    ("precision/optimizer-dtype", QWEN, {"mixed_precision": None, "model.bf16": True, "optimizer.bf16": False,
                                         "optimizer.use_precision_aware_optimizer": True},
     "optimizer.bf16=True must be set"),
    ("fp8/bf16-layers", DSV3, {"mixed_precision": _mixed("bf16_with_fp8_subchannel_scaling_mixed", first_last_layers_bf16=True,
                                                         num_layers_at_start_in_bf16=20)}, "num_layers_at_start_in_bf16 (20)"),
    ("fp8/param", QWEN, {"mixed_precision": _mixed("bf16_mixed", fp8_param=True, grad_reduce_in_fp32=False)},
     "fp8_param must be used together"),
    ("fp8/mxfp8-param-gather", QWEN, {"mixed_precision": _mixed("bf16_with_mxfp8_mixed", grad_reduce_in_fp32=False,
                                                                reuse_grad_buf_for_mxfp8_param_ag=False)},
     "reuse_grad_buf_for_mxfp8_param_ag"),
    ("fp8/activation-input", QWEN, {"model.activation_func_fp8_input_store": True, "model.gated_linear_unit": False},
     "Storing activation input in FP8"),
    ("precision/name", QWEN, {"mixed_precision": "bf16_bogus_mixed"}, "bf16_bogus_mixed"),
    ("optimizer/precision-aware", QWEN, {"optimizer.use_precision_aware_optimizer": False,
                                         "optimizer.exp_avg_dtype": _dtype("bfloat16")}, "exp_avg_dtype can only be fp32"),
    # DP16: CommOverlapConfig sets ddp.bucket_size at DP > 1 (megatron-bridge 0.6.2 training/comm_overlap.py
    # _get_optimizer_overlap_cfgs; at DP1 it leaves it None)
    ("ddp/buckets", NEXT, {"ddp.num_buckets": 4}, "Cannot specify both num_buckets and bucket_size"),
    ("ddp/fsdp", QWEN, {"ddp.use_megatron_fsdp": True}, "fsdp"),
    ("train/length", QWEN, {"train.train_iters": None, "train.train_samples": None},
     "One of train_iters, train_samples, or num_epochs must be provided"),
    ("scheduler/fields", QWEN, {"scheduler.lr_warmup_fraction": 0.1, "scheduler.lr_warmup_iters": 100},
     "lr_warmup_fraction"),
    ("data/packing", NEXT, {"dataset.enable_offline_packing": True, "dataset.enable_in_batch_packing": True},
     "mutually exclusive"),
    ("data/blend", NEXT, {"dataset.blend_per_split": [(["a"], None)] * 3, "dataset.split": "1,1,1",
                          "tokenizer.tokenizer_type": "HuggingFaceTokenizer", "tokenizer.tokenizer_model": "Qwen/Qwen3-Next-80B-A3B-Instruct"},
     "split and blend_per_split are incompatible"),
    ("checkpoint/format", QWEN, {"checkpoint.async_save": True, "checkpoint.use_persistent_ckpt_worker": False},
     "async_save"),
    ("mla/rotary-interleaved", DSV3, {"model.rotary_interleaved": True}, "rotary_interleaved does not work with multi_latent_attention"),
    ("mla/rope-fusion", DSV3, {"model.rope_type": "rope", "model.apply_rope_fusion": True,  # at a length RoPE covers
                               "model.seq_length": 4096, "dataset.seq_length": 4096},
     "apply_rope_fusion for MLA only works with YARN"),
    ("mla/output-gate", DSV3, {"model.attention_output_gate": True}, "Output gate is not supported for MLA"),
]

OVERRIDES = [
    ("optimizer/weight-decay-not-scheduled", QWEN, {"optimizer.weight_decay": 0.1},
     "optimizer/weight-decay-not-scheduled", "optimizer.weight_decay=0.1 is not what the run applies: the scheduler "
     "sets every parameter group's weight decay from scheduler.start_weight_decay=0.033 to end_weight_decay=0.033"),
    ("scheduler/warmup-longer-than-run", QWEN, {"scheduler.lr_warmup_iters": 5000, "train.train_iters": 1000,
                                                "scheduler.lr_decay_iters": None},
     "scheduler/warmup-longer-than-run", "scheduler.lr_warmup_iters=5000 is not below the 1000 decay steps"),
    ("override/mixed-precision", QWEN, {"model.fp8": "hybrid"}, "override/mixed-precision",
     "model.fp8='hybrid' is overwritten by the mixed_precision config (MixedPrecisionConfig): the run uses None"),
    ("override/comm-overlap", NEXT, {"ddp.bucket_size": 1_000_000}, "override/comm-overlap",
     "ddp.bucket_size=1000000 is overwritten by CommOverlapConfig.setup: the run uses 134217728"),
    ("override/sequence-parallel", DSV3, {"model.sequence_parallel": True}, "override/sequence-parallel",
     "model.sequence_parallel=True becomes False: megatron-bridge turns sequence parallel off at TP=1"),
    ("override/finalize", QWEN, {"model.moe_expert_capacity_factor": -1.0}, "override/finalize",
     "model.moe_expert_capacity_factor=-1.0 becomes None"),
    ("ignored/flex-backend", QWEN, {"model.moe_token_dispatcher_type": "alltoall"}, "ignored/flex-backend",
     "moe_flex_dispatcher_backend='hybridep' is ignored: moe_token_dispatcher_type is 'alltoall'"),
    ("mtp/block-recompute-skipped", DSV3, {**FULL_RECOMPUTE, "model.recompute_method": "block"},
     "mtp/block-recompute-skipped", "the MTP layers are not recomputed"),
]


@pytest.mark.slow
@pytest.mark.parametrize("recipe,changes,rule,fragment", [c[1:] for c in LATE], ids=[c[0] for c in LATE])
def test_late_checks(fresh_config, recipe, changes, rule, fragment):
    findings = _findings(fresh_config, recipe, changes)
    _assert_rule(findings, rule, fragment)
    assert not [f for f in findings if f.rule == "upstream/validate"], "the config must pass upstream validation"


@pytest.mark.slow
def test_a_negative_peak_gets_one_finding_that_names_both_fields(fresh_config):
    """A negative lr beside a negative min_lr once got "set scheduler.lr_warmup_init <= -1e-05" (a fresh user's
    trial): the peak's own finding comes alone, and its fix names min_lr too."""
    hits = [f for f in _findings(fresh_config, QWEN, {"optimizer.lr": -1e-5, "optimizer.min_lr": -1e-4})
            if f.rule == "scheduler/lr-range"]
    assert [f.fix for f in hits] == ["set optimizer.lr to a positive peak learning rate (--lr), and optimizer.min_lr "
                                     "to 0 or a positive floor below it"]


@pytest.mark.slow
@pytest.mark.parametrize("recipe,changes,rule,fragment", [c[1:] for c in OURS_FIRST], ids=[c[0] for c in OURS_FIRST])
def test_our_rules_fire_first(fresh_config, recipe, changes, rule, fragment):
    _assert_rule(_findings(fresh_config, recipe, changes), rule, fragment)


@pytest.mark.slow
@pytest.mark.parametrize("recipe,changes,world,rule,fragment", [c[1:] for c in ON_RESOLVED], ids=[c[0] for c in ON_RESOLVED])
def test_late_checks_on_resolved(fresh_config, recipe, changes, world, rule, fragment):
    import copy

    from lcmoe_recipes.catalog import get_hardware
    from lcmoe_recipes.checks.config_asserts import RULES, Resolved

    plan, cfg = fresh_config(recipe)
    _apply(cfg, changes)
    resolved = Resolved(cfg, copy.deepcopy(cfg), get_hardware(plan.hardware), world)
    messages = [message for message, _ in RULES[rule].check(resolved)]
    assert any(fragment in m for m in messages), messages
    plan, good = fresh_config(recipe)  # the recipe as published passes the same rule
    assert not list(RULES[rule].check(Resolved(good, good, get_hardware(plan.hardware), plan.layout.world)))


@pytest.mark.slow
@pytest.mark.parametrize("recipe,changes,fragment", [c[1:] for c in MAPPED], ids=[c[0] for c in MAPPED])
def test_upstream_message_mapped(fresh_config, recipe, changes, fragment, request):
    rule = request.node.callspec.id
    findings = _findings(fresh_config, recipe, changes)
    _assert_rule(findings, rule, fragment)


@pytest.mark.slow
def test_unmapped_upstream_message_keeps_generic_rule(fresh_config):
    """A check-time message outside our table (here the profiler's) keeps rule upstream/validate, verbatim."""
    def profiling():
        from megatron.bridge.training.config import ProfilingConfig

        return ProfilingConfig(use_pytorch_profiler=True, profile_step_start=10, profile_step_end=5)

    findings = _findings(fresh_config, QWEN, {"profiling": Lazy(profiling)})
    _assert_rule(findings, "upstream/validate", "rejected the config for 128 x gb200: profile_step_end (5) must be >= "
                                                "profile_step_start (10)")


@pytest.mark.slow
@pytest.mark.parametrize("recipe,changes,rule,fragment", [c[1:] for c in OVERRIDES], ids=[c[0] for c in OVERRIDES])
def test_overrides_say_what_the_run_does(fresh_config, recipe, changes, rule, fragment):
    findings = _findings(fresh_config, recipe, changes)
    _assert_rule(findings, rule, fragment, severity="warning")
    assert not [f for f in findings if f.severity == "error"], [str(f) for f in findings]


@pytest.mark.slow
def test_named_recipes_raise_no_late_findings(configs):
    """The published layouts pass every late rule: none of them states a value runtime_config_update overwrites (the
    DP=1, EDP=2 DeepSeek-V3 256K recipe states its DDP overlaps off, as CommOverlapConfig.setup sets them)."""
    from lcmoe_recipes.catalog import get_hardware
    from lcmoe_recipes.checks.config_asserts import config_assert_findings
    from lcmoe_recipes.emit.target import target_environment
    from megatron.bridge.training.config import runtime_config_update
    import copy

    seen = {}
    for name, (plan, cfg) in configs.items():
        trial = copy.deepcopy(cfg)
        hw = get_hardware(plan.hardware)
        with target_environment(hw, plan.layout.world):
            runtime_config_update(trial)
        seen[name] = [f.rule for f in config_assert_findings(cfg, trial, hw, plan.layout.world)]
    assert all(rules == [] for rules in seen.values()), seen


def test_every_rule_and_message_entry_has_a_case():
    from lcmoe_recipes.checks.config_asserts import RULES
    from lcmoe_recipes.checks.upstream_messages import UPSTREAM_MESSAGES

    tested = {c[3] for c in LATE} | {c[4] for c in ON_RESOLVED} | {c[3] for c in OVERRIDES}
    assert set(RULES) <= tested, sorted(set(RULES) - tested)
    assert {e.rule for e in UPSTREAM_MESSAGES} == {c[0] for c in MAPPED}


def _checks_doc_rows() -> list[list[str]]:
    """Rows of the docs/checks.md tables whose last two columns are 'rule' and 'test'."""
    rows, in_table = [], False
    for line in (ROOT / "docs" / "checks.md").read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))] if line.startswith("|") else None
        if cells is None:
            in_table = False
        elif cells[-2:] == ["rule", "test"]:
            in_table = True
        elif in_table and not set(line) <= set("|-"):
            rows.append(cells)
    return rows


def _known_rule_ids() -> set[str]:
    from lcmoe_recipes.checks.config_asserts import OVERRIDE_RULES, RULES
    from lcmoe_recipes.checks.upstream_messages import UPSTREAM_MESSAGES, UPSTREAM_VALIDATE_RULE

    ours = set()
    for path in (ROOT / "src" / "lcmoe_recipes").rglob("*.py"):  # rule ids of feasibility, emit and cost checks
        ours |= set(re.findall(r'"([a-z0-9-]+/[a-z0-9-]+)"', path.read_text()))
    return ours | set(RULES) | set(OVERRIDE_RULES) | {e.rule for e in UPSTREAM_MESSAGES} | {UPSTREAM_VALIDATE_RULE}


def _known_tests() -> set[str]:
    names = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        names |= {f"{path.name}::{n}" for n in re.findall(r"^def (test_\w+)", path.read_text(), re.M)}
    cases = {"test_late_checks": LATE, "test_our_rules_fire_first": OURS_FIRST, "test_late_checks_on_resolved": ON_RESOLVED, "test_upstream_message_mapped": MAPPED,
             "test_overrides_say_what_the_run_does": OVERRIDES}
    for test, table in cases.items():
        names |= {f"test_config_asserts.py::{test}[{c[0]}]" for c in table}
    return names


def test_checks_doc_is_current():
    """docs/checks.md names only rule ids the code has and tests that exist (it cannot go stale)."""
    rows = _checks_doc_rows()
    assert len(rows) > 100
    rules, tests = _known_rule_ids(), _known_tests()
    for row in rows:
        rule, test = row[-2].strip("`"), row[-1].strip("`")
        if rule not in ("-", ""):
            for one in rule.replace("`", "").split(", "):
                assert one in rules, f"docs/checks.md names unknown rule {one!r}: {row}"
        if test not in ("-", ""):
            for one in test.replace("`", "").split(", "):
                assert one in tests, f"docs/checks.md names unknown test {one!r}: {row}"
