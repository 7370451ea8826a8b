"""Upstream asserts that the config alone decides but that fire only after ``check`` time, and what the run will
really do where upstream silently overrides a setting.

``lcmoe_recipes.emit.validate.config_findings`` runs megatron-bridge's ``runtime_config_update`` (which calls
``ConfigContainer.validate()`` and every megatron-core ``__post_init__``) on a deep copy of the config, answered for
the target (:mod:`lcmoe_recipes.emit.target`). This module reads that *resolved* copy and adds:

1. the asserts megatron-core 0.19.2 / megatron-bridge 0.6.2 raise later -- in ``parallel_state.initialize_model_parallel``,
   while the model, MoE layer, router and token dispatcher are built, in the pipeline schedules, when DDP and the
   (distributed) optimizer are built, when CUDA graphs are captured, and when the data loader starts -- as rules over
   the resolved fields (:data:`RULES`, each citing the upstream file, function and version);
2. when ``runtime_config_update`` itself raised: upstream's message mapped to our rule id and a fix
   (:data:`lcmoe_recipes.checks.upstream_messages.UPSTREAM_MESSAGES`);
3. warnings where a setting in the config is overwritten or ignored upstream (mixed-precision recipe, comm-overlap
   setup, megatron-bridge's finalize, a flex backend with a non-flex dispatcher), saying what the run will do.

It reads attributes only (``getattr``): no torch or megatron import. The table of every assert read, with its rule
id and test, is docs/checks.md.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..catalog import Hardware
from .feasibility import Finding, _divisors
from .upstream_messages import UPSTREAM_MESSAGES, UPSTREAM_VALIDATE_RULE

MCORE = "megatron-core 0.19.2"
BRIDGE = "megatron-bridge 0.6.2"
TE_UTILS = ("Transformer Engine transformer_engine/pytorch/utils.py, assert_dim_for_fp8_exec (called by te.Linear, "
            "LayerNormLinear and LayerNormMLP under every FP8 recipe); MXFP8: transformer_engine/pytorch/csrc/"
            "quantizer.cpp, MXFP8Quantizer::create_tensor (MXFP8_BLOCK_SIZE = 32)")


@dataclass(frozen=True)
class Resolved:
    """The config after ``runtime_config_update``, with the derived parallel sizes megatron-core will use.

    Attributes:
        cfg: the resolved ``ConfigContainer`` (a deep copy; never the user's object).
        before: the config as written (before ``runtime_config_update``).
        hardware: the target GPU.
        world: number of GPUs.
    """

    cfg: Any
    before: Any
    hardware: Hardware
    world: int

    @property
    def m(self) -> Any:
        return self.cfg.model

    def get(self, name: str, default: Any = None) -> Any:
        """A model field (``default`` when absent or None)."""
        value = getattr(self.m, name, None)
        return default if value is None else value

    @property
    def tp(self) -> int:
        return self.get("tensor_model_parallel_size", 1)

    @property
    def pp(self) -> int:
        return self.get("pipeline_model_parallel_size", 1)

    @property
    def cp(self) -> int:
        return self.get("context_parallel_size", 1)

    @property
    def ep(self) -> int:
        return self.get("expert_model_parallel_size", 1)

    @property
    def etp(self) -> int:
        return self.get("expert_tensor_parallel_size", self.tp)

    @property
    def vpp(self) -> int | None:
        return self.get("virtual_pipeline_model_parallel_size")

    @property
    def dp(self) -> int:
        """world / (TP·PP·CP) (megatron-core ``initialize_model_parallel``)."""
        return max(1, self.world // (self.tp * self.pp * self.cp))

    @property
    def edp(self) -> int:
        """world / (ETP·EP·PP): the expert data-parallel size."""
        return max(1, self.world // (self.etp * self.ep * self.pp))

    @property
    def is_moe(self) -> bool:
        return bool(self.get("num_moe_experts", 0))

    @property
    def gbs(self) -> int | None:
        return getattr(self.cfg.train, "global_batch_size", None)

    @property
    def mbs(self) -> int:
        return getattr(self.cfg.train, "micro_batch_size", 1) or 1

    @property
    def variable_length(self) -> bool:
        """Packed (THD) or variable-length batches: shapes change step to step."""
        data = self.cfg.dataset
        return bool(getattr(data, "enable_offline_packing", False) or getattr(data, "enable_in_batch_packing", False)
                    or self.get("variable_seq_lengths", False))


@dataclass(frozen=True)
class Rule:
    """One config-decided upstream assert (or silent override) we check.

    Attributes:
        id: rule id, e.g. ``ddp/optimizer-instances``.
        severity: "error" or "warning".
        source: the upstream file, function and version that asserts it.
        check: ``Resolved -> iterator of (message, fix)``; one pair per violation.
    """

    id: str
    severity: str
    source: str
    check: Callable[[Resolved], Iterator[tuple[str, str]]]


RULES: dict[str, Rule] = {}


def _rule(rule_id: str, source: str, severity: str = "error"):
    def register(fn):
        RULES[rule_id] = Rule(rule_id, severity, source, fn)
        return fn
    return register


def _names(value: Any) -> list[str]:
    """Enum members / strings / None as a list of names."""
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else [value]
    return [getattr(x, "name", None) or str(x) for x in items]


# --- parallel_state.initialize_model_parallel ---------------------------------------------------------------------
_PS = f"{MCORE} parallel_state.py, initialize_model_parallel"


@_rule("ddp/optimizer-instances", _PS + " (DP·CP and EDP each divisible by num_distributed_optimizer_instances)")
def _optimizer_instances(r: Resolved):
    n = getattr(r.cfg.ddp, "num_distributed_optimizer_instances", 1) or 1
    if n <= 1:
        return
    fix = f"use num_distributed_optimizer_instances in {_divisors(math.gcd(r.dp * r.cp, r.edp))}"
    if (r.dp * r.cp) % n:
        yield (f"ddp.num_distributed_optimizer_instances={n} does not divide DP·CP = {r.dp}·{r.cp} = {r.dp * r.cp}", fix)
    if r.edp % n:
        yield f"ddp.num_distributed_optimizer_instances={n} does not divide the expert data-parallel size EDP={r.edp}", fix


@_rule("ddp/optimizer-instances-distopt", f"{MCORE} distributed/distributed_data_parallel.py, "
       "DistributedDataParallel.__init__ ('Partial DistOpt cannot be used without DistOpt')")
def _instances_need_distopt(r: Resolved):
    n = getattr(r.cfg.ddp, "num_distributed_optimizer_instances", 1) or 1
    if n > 1 and not getattr(r.cfg.ddp, "use_distributed_optimizer", False):
        yield (f"ddp.num_distributed_optimizer_instances={n} without the distributed optimizer",
               "set ddp.use_distributed_optimizer=true (and optimizer.use_distributed_optimizer), or use 1 instance")


@_rule("ddp/optimizer-instances-rs-fp32", f"{MCORE} distributed/param_and_grad_buffer.py, "
       "_ParamAndGradBucketGroup.__init__")
def _instances_rs_fp32(r: Resolved):
    n = getattr(r.cfg.ddp, "num_distributed_optimizer_instances", 1) or 1
    if n > 1 and getattr(r.cfg.ddp, "reduce_scatter_with_fp32_accumulation", False):
        yield (f"ddp.reduce_scatter_with_fp32_accumulation with num_distributed_optimizer_instances={n}",
               "set ddp.reduce_scatter_with_fp32_accumulation=false, or use 1 optimizer instance")


@_rule("dist/sharp-group", _PS + " (sharp_enabled_group)")
def _sharp_group(r: Resolved):
    group = getattr(r.cfg.dist, "sharp_enabled_group", None)
    if group is None:
        return
    n = getattr(r.cfg.ddp, "num_distributed_optimizer_instances", 1) or 1
    if not getattr(r.cfg.dist, "use_sharp", False):
        yield f"dist.sharp_enabled_group={group!r} without dist.use_sharp", "set dist.use_sharp=true or unset sharp_enabled_group"
    elif group not in ("dp", "dp_replica"):
        yield f"dist.sharp_enabled_group={group!r}", "use 'dp' or 'dp_replica'"
    elif group == "dp_replica" and n <= 1:
        yield ("dist.sharp_enabled_group='dp_replica' needs ddp.num_distributed_optimizer_instances > 1",
               "use sharp_enabled_group='dp', or more than one optimizer instance")


@_rule("dist/tp-pp-dp-mapping", _PS + " (order tp-cp-ep-pp-dp needs equal dense and expert DP)")
def _tp_pp_dp(r: Resolved):
    if getattr(r.cfg.dist, "use_tp_pp_dp_mapping", False) and r.pp > 1 and r.dp != r.edp:
        yield (f"dist.use_tp_pp_dp_mapping with PP={r.pp}: dense DP={r.dp} differs from expert DP={r.edp}",
               "set dist.use_tp_pp_dp_mapping=false, or choose TP·CP = ETP·EP so that DP = EDP")


@_rule("cp/hybrid-even", _PS + " (hybrid context parallel needs an even DP·CP group)")
def _hybrid_cp(r: Resolved):
    if r.get("hybrid_context_parallel", False) and (r.dp * r.cp) % 2:
        yield f"hybrid_context_parallel with an odd DP·CP = {r.dp * r.cp}", "use an even DP·CP, or hybrid_context_parallel=false"


@_rule("pipeline/comm-backend", _PS + " (pipeline_model_parallel_comm_backend; UCC needs CUDA_DEVICE_MAX_CONNECTIONS > 1)")
def _pp_backend(r: Resolved):
    backend = r.get("pipeline_model_parallel_comm_backend")
    if backend not in (None, "nccl", "ucc"):
        yield f"pipeline_model_parallel_comm_backend={backend!r}", "use 'nccl' (default) or 'ucc'"
    elif backend == "ucc" and str((getattr(r.cfg, "env_vars", None) or {}).get("CUDA_DEVICE_MAX_CONNECTIONS")) == "1":
        yield ("pipeline_model_parallel_comm_backend='ucc' with env_vars CUDA_DEVICE_MAX_CONNECTIONS=1",
               "use the nccl backend, or set CUDA_DEVICE_MAX_CONNECTIONS > 1")


_INIT = f"{BRIDGE} training/initialize.py"


@_rule("dist/decentralized-pg-hcp", _INIT + ", _create_pg_collection")
def _decentralized_hcp(r: Resolved):
    if getattr(r.cfg.dist, "use_decentralized_pg", False) and r.get("hierarchical_context_parallel_sizes"):
        yield ("dist.use_decentralized_pg with hierarchical_context_parallel_sizes",
               "set dist.use_decentralized_pg=false, or use cp_comm_type 'a2a' / 'p2p' without hierarchical sizes")


@_rule("rng/seed", _INIT + ", _set_random_seed")
def _seed(r: Resolved):
    seed = getattr(r.cfg.rng, "seed", 1234)
    if seed is None or seed <= 0:
        yield f"rng.seed={seed}", "use a positive integer seed"


# --- model construction: GPTModelProvider.provide, MoE layer, router, dispatchers, MLA, GDN, MTP ---------------------
@_rule("cuda-graphs/te-rng-tracker", f"{BRIDGE} models/gpt_provider.py, GPTModelProvider.provide")
def _te_rng(r: Resolved):
    impl = r.get("cuda_graph_impl", "none")
    if impl != "none" and not r.get("use_te_rng_tracker", False):
        yield (f"cuda_graph_impl={impl!r} without Transformer Engine's RNG tracker",
               "set model.use_te_rng_tracker=true (or rng.te_rng_tracker=true)")


@_rule("moe/dispatcher-type", f"{MCORE} transformer/moe/moe_layer.py, MoELayer.__init__")
def _dispatcher_type(r: Resolved):
    kind = r.get("moe_token_dispatcher_type", "allgather")
    if r.is_moe and kind not in ("allgather", "alltoall", "flex"):
        yield f"moe_token_dispatcher_type={kind!r}", "use 'alltoall', 'flex' (with a backend) or 'allgather'"


@_rule("dispatcher/flex-tp-ep", f"{MCORE} transformer/moe/token_dispatcher.py, MoEFlexTokenDispatcher.__init__")
def _flex_tp_ep(r: Resolved):
    backend = r.get("moe_flex_dispatcher_backend")
    if r.is_moe and r.get("moe_token_dispatcher_type") == "flex" and backend in ("deepep", "ncclep") and r.etp * r.ep == 1:
        yield (f"flex dispatcher with backend {backend!r} at ETP·EP = 1 (nothing to dispatch across)",
               "use moe_token_dispatcher_type=alltoall for EP=1, or EP > 1")


@_rule("dispatcher/ncclep", f"{MCORE} transformer/moe/token_dispatcher.py, _NCCLEPManager.__init__")
def _ncclep(r: Resolved):
    if not (r.is_moe and r.get("moe_token_dispatcher_type") == "flex" and r.get("moe_flex_dispatcher_backend") == "ncclep"):
        return
    static = r.get("moe_ncclep_static_shape", False)
    if r.get("moe_ncclep_zero_copy", False) and not static:
        yield "moe_ncclep_zero_copy without moe_ncclep_static_shape", "set model.moe_ncclep_static_shape=true"
    if static and not (r.get("use_transformer_engine_op_fuser", False) and r.get("moe_grouped_gemm", False)):
        yield ("moe_ncclep_static_shape needs use_transformer_engine_op_fuser and moe_grouped_gemm",
               "set both to true, or moe_ncclep_static_shape=false")
    if static and (r.get("fp8") or r.get("fp4")):
        if r.hardware.compute_capability[0] < 10:
            yield (f"moe_ncclep_static_shape with FP8/FP4 needs SM 10.x (Blackwell); {r.hardware.display} is SM "
                   f"{r.hardware.compute_capability[0]}.{r.hardware.compute_capability[1]}", "set moe_ncclep_static_shape=false")
        elif str((getattr(r.cfg, "env_vars", None) or {}).get("NVTE_CUTEDSL_FUSED_GROUPED_MLP")) != "1":
            yield ("moe_ncclep_static_shape with FP8/FP4 needs the CuTe DSL grouped GEMM",
                   "add env_vars NVTE_CUTEDSL_FUSED_GROUPED_MLP=1")
    if r.get("moe_expert_rank_capacity_factor") is None:
        yield ("the ncclep backend needs moe_expert_rank_capacity_factor (it sizes the per-rank receive buffer)",
               "set model.moe_expert_rank_capacity_factor generously (e.g. 2.0)")


@_rule("moe/latent-shared-overlap", f"{MCORE} transformer/moe/moe_layer.py, MoELayer.preprocess")
def _latent_overlap(r: Resolved):
    if r.is_moe and r.get("moe_latent_size") and r.get("moe_shared_expert_overlap", False):
        yield ("moe_shared_expert_overlap with MoE latent projections (moe_latent_size) during training",
               "set model.moe_shared_expert_overlap=false")


@_rule("moe/quantile-balancing", f"{MCORE} transformer/moe/router.py, TopKRouter.__init__ / quantile_balancing; "
       "moe_utils.py, qb_dual_update")
def _quantile(r: Resolved):
    if not r.is_moe or "quantile_balancing" not in _names(r.get("moe_router_load_balancing_type")):
        return
    coeff = r.get("moe_aux_loss_coeff", 0)
    if any(c for c in (coeff if isinstance(coeff, (list, tuple)) else [coeff])):
        yield "quantile-balancing routing with a non-zero moe_aux_loss_coeff", "set model.moe_aux_loss_coeff=0"
    if r.get("moe_router_fusion", False):
        yield "quantile-balancing routing with moe_router_fusion", "set model.moe_router_fusion=false"
    if r.get("moe_router_num_groups") is not None or r.get("moe_router_group_topk") is not None:
        yield "quantile-balancing routing with group-limited routing", "unset moe_router_num_groups and moe_router_group_topk"
    tokens = r.mbs * r.cfg.model.seq_length // r.cp // (r.tp if r.get("sequence_parallel", False) else 1)
    experts, k = r.get("num_moe_experts"), r.get("moe_router_topk", 2)
    if not r.variable_length and (tokens * k) % experts:
        yield (f"quantile balancing needs tokens per router call × top-k = {tokens}·{k} divisible by {experts} experts",
               "choose seq_length / MBS so the routed assignments split evenly over the experts")


@_rule("moe/sinkhorn-aux-loss", f"{MCORE} transformer/moe/router.py, TopKRouter.sinkhorn_load_balancing")
def _sinkhorn(r: Resolved):
    if r.is_moe and "sinkhorn" in _names(r.get("moe_router_load_balancing_type")) and r.get("moe_aux_loss_coeff", 0):
        yield "sinkhorn routing with a non-zero moe_aux_loss_coeff", "set model.moe_aux_loss_coeff=0"


@_rule("moe/grouped-mlp-bias-fusion", f"{MCORE} transformer/moe/experts.py, TEGroupedMLP.__init__")
def _grouped_bias(r: Resolved):
    if r.is_moe and r.get("moe_grouped_gemm", False) and r.get("add_bias_linear", False) and r.get("bias_dropout_fusion", False):
        yield "grouped-GEMM experts with add_bias_linear and bias_dropout_fusion", "set model.bias_dropout_fusion=false"


@_rule("moe/op-fuser", f"{MCORE} transformer/moe/experts.py, TEGroupedMLP.__init__ / _is_fused_impl_supported "
       "(the configuration part; its TE >= 2.14 requirement is the environment's)")
def _op_fuser(r: Resolved):
    if not (r.is_moe and r.get("use_transformer_engine_op_fuser", False) and r.get("moe_grouped_gemm", False)):
        return
    reasons = []
    if r.etp > 1:
        reasons.append(f"expert tensor parallelism ETP={r.etp}")
    if r.get("moe_apply_probs_on_input", False):
        reasons.append("moe_apply_probs_on_input")
    if r.get("fine_grained_activation_offloading", False) and {"expert_fc1", "moe_act"} & set(r.get("offload_modules", [])):
        reasons.append("offloading expert_fc1 / moe_act")
    if reasons:
        yield f"use_transformer_engine_op_fuser for the experts with {', '.join(reasons)}", \
            "set model.use_transformer_engine_op_fuser=false, or drop what the fused grouped MLP does not support"


@_rule("moe/probs-on-input-topk", f"{MCORE} transformer/moe/experts.py, TEGroupedMLP.forward / SequentialMLP.forward")
def _probs_on_input(r: Resolved):
    if r.is_moe and r.get("moe_apply_probs_on_input", False) and r.get("moe_router_topk", 2) != 1:
        yield f"moe_apply_probs_on_input with moe_router_topk={r.get('moe_router_topk')}", "it needs top-1 routing: unset it"


@_rule("moe/shared-expert-bias", f"{MCORE} transformer/moe/shared_experts.py, SharedExpertMLP.__init__")
def _shared_bias(r: Resolved):
    if r.is_moe and r.get("moe_shared_expert_intermediate_size") and r.get("add_bias_linear", False):
        yield "shared experts with add_bias_linear", "set model.add_bias_linear=false"


def _activation(r: Resolved) -> str:
    fn = r.get("activation_func")
    return getattr(fn, "__name__", str(fn))


@_rule("moe/bias-activation-fusion", f"{MCORE} transformer/moe/experts.py, TEGroupedMLP.forward; "
       "shared_experts.py, SharedExpertMLP.linear_fc1_forward_and_act")
def _bias_act_fusion(r: Resolved):
    if not (r.is_moe and r.get("bias_activation_fusion", False)):
        return
    act, glu = _activation(r), r.get("gated_linear_unit", False)
    if r.get("moe_grouped_gemm", False) and not r.get("moe_mlp_glu_interleave_size") and not (
            glu and act in ("silu", "quick_gelu")):
        yield (f"grouped-GEMM experts fuse bias+activation only for SwiGLU or quick-GeGLU, not {act} "
               f"(gated_linear_unit={glu})", "set model.bias_activation_fusion=false")
    if r.get("moe_shared_expert_intermediate_size") and not (act == "gelu" or (act == "silu" and glu)):
        yield f"shared experts fuse bias+activation only for GeLU or SwiGLU, not {act}", \
            "set model.bias_activation_fusion=false"


@_rule("moe/fused-shared-expert", f"{MCORE} transformer/moe/shared_experts.py, FusedSharedExpertMLP "
       "(_validate_fused_grouped_swiglu, _get_fused_grouped_swiglu_recipe; its TE >= 2.14 need is the environment's)")
def _fused_shared(r: Resolved):
    if not (r.is_moe and r.get("moe_shared_expert_intermediate_size") and r.get("use_grouped_gemm_for_shared_expert", False)):
        return
    problems = []
    if r.get("add_bias_linear", False):
        problems.append("add_bias_linear")
    if not (r.get("gated_linear_unit", False) and _activation(r) == "silu"):
        problems.append(f"activation {_activation(r)} (needs SwiGLU)")
    if r.get("moe_shared_expert_glu_interleave_size") is None:
        problems.append("moe_shared_expert_glu_interleave_size unset")
    recipe = _fp8_recipe(r)
    if recipe != "mxfp8" and not (r.get("fp4") and getattr(r.get("fp4_recipe"), "value", r.get("fp4_recipe")) == "nvfp4"):
        problems.append(f"precision {recipe or 'bf16'} (needs MXFP8 or NVFP4)")
    if problems:
        yield (f"use_grouped_gemm_for_shared_expert with {', '.join(problems)}",
               "set model.use_grouped_gemm_for_shared_expert=false, or meet the fused kernel's needs")


@_rule("moe/router-options", f"{MCORE} transformer/moe/moe_utils.py, topk_routing_with_score_function / "
       "compute_routing_scores_for_aux_loss / apply_router_token_dropping")
def _router_options(r: Resolved):
    if not r.is_moe:
        return
    score = r.get("moe_router_score_function", "softmax")
    if score not in ("softmax", "sigmoid", "sqrtsoftplus"):
        yield f"moe_router_score_function={score!r}", "use 'softmax', 'sigmoid' or 'sqrtsoftplus'"
    policy = r.get("moe_token_drop_policy", "probs")
    if r.get("moe_expert_capacity_factor") is not None and policy not in ("probs", "position"):
        yield f"moe_token_drop_policy={policy!r}", "use 'probs' or 'position'"


@_rule("mla/rope-type", f"{MCORE} transformer/multi_latent_attention.py, MultiLatentAttention.__init__")
def _mla_rope(r: Resolved):
    if r.get("multi_latent_attention", False) and r.get("rope_type", "yarn") not in ("rope", "yarn"):
        yield f"MLA with rope_type={r.get('rope_type')!r}", "use 'rope' or 'yarn'"


@_rule("mla/cache-latents-training", f"{MCORE} transformer/multi_latent_attention.py, MultiLatentAttention.forward")
def _mla_cache(r: Resolved):
    if r.get("multi_latent_attention", False) and r.get("cache_mla_latents", False):
        yield "cache_mla_latents during training (an inference option)", "set model.cache_mla_latents=false"


@_rule("mla/hybrid-cp", f"{MCORE} transformer/multi_latent_attention.py, MLASelfAttention.get_query_key_value_tensors")
def _mla_hybrid_cp(r: Resolved):
    if r.get("multi_latent_attention", False) and r.get("hybrid_context_parallel", False):
        yield "hybrid_context_parallel with multi-latent attention", "set model.hybrid_context_parallel=false"


@_rule("mla/down-proj-fusion", f"{MCORE} transformer/multi_latent_attention.py, FusedMLASelfAttention.__init__ / "
       "_qkv_down_projection")
def _mla_fusion(r: Resolved):
    if not (r.get("multi_latent_attention", False) and r.get("mla_down_proj_fusion", False)):
        return
    q, kv, rope = r.get("q_lora_rank"), r.get("kv_lora_rank", 0), r.get("qk_pos_emb_head_dim", 0)
    if q is None:
        yield "mla_down_proj_fusion without q_lora_rank", "set model.mla_down_proj_fusion=false"
        return
    if q % r.tp or (kv + rope) % r.tp:
        yield (f"mla_down_proj_fusion needs q_lora_rank={q} and kv_lora_rank + qk_pos_emb_head_dim = {kv + rope} "
               f"divisible by TP={r.tp}", "set model.mla_down_proj_fusion=false, or a TP that divides both")


_GDN = f"{MCORE} ssm/gated_delta_net/gdn.py, GatedDeltaNet.forward"


def _is_gdn(r: Resolved) -> bool:
    return r.get("experimental_attention_variant") == "gated_delta_net" or bool(r.get("linear_attention_freq"))


@_rule("gdn/packed-sequences", _GDN + " (packed THD sequences)")
def _gdn_packed(r: Resolved):
    if _is_gdn(r) and r.variable_length:
        if r.mbs != 1:
            yield f"gated DeltaNet on packed sequences with MBS={r.mbs}", "use train.micro_batch_size=1 with packing"
        if r.get("deterministic_mode", False):
            yield "gated DeltaNet on packed sequences with deterministic_mode", "set model.deterministic_mode=false"


@_rule("gdn/activation", _GDN)
def _gdn_activation(r: Resolved):
    if _is_gdn(r) and _activation(r) not in ("silu", "swish"):
        yield f"gated DeltaNet with activation {_activation(r)}", "gated DeltaNet layers need silu (swish)"


@_rule("mtp/full-recompute", f"{MCORE} transformer/multi_token_prediction.py, MultiTokenPredictionLayer._checkpointed_forward")
def _mtp_recompute(r: Resolved):
    if r.get("mtp_num_layers") and r.get("recompute_granularity") == "full" and r.get("recompute_method") == "uniform" \
            and r.get("recompute_num_layers") != 1:
        yield (f"full recompute (uniform, recompute_num_layers={r.get('recompute_num_layers')}) with MTP layers",
               "MTP recompute needs recompute_num_layers=1 with the uniform method")


@_rule("mtp/block-recompute-skipped", f"{MCORE} transformer/multi_token_prediction.py, "
       "MultiTokenPredictionLayer._checkpointed_forward", severity="warning")
def _mtp_block(r: Resolved):
    if r.get("mtp_num_layers") and r.get("recompute_granularity") == "full" and r.get("recompute_method") == "block":
        yield ("full recompute with recompute_method=block: the MTP layers are not recomputed (megatron-core skips them "
               "with a warning), so they keep their activations", "use recompute_method=uniform with recompute_num_layers=1 "
               "to recompute MTP too, or budget MTP activation memory")


# --- FP8 / MXFP8: what each recipe needs of tensor shapes -----------------------------------------------------------
def _fp8_recipe(r: Resolved) -> str | None:
    if not r.get("fp8"):
        return None
    return getattr(r.get("fp8_recipe"), "value", r.get("fp8_recipe"))


@_rule("fp8/format", f"{MCORE} fp8_utils.py, get_fp8_recipe")
def _fp8_format(r: Resolved):
    fmt = r.get("fp8")
    if fmt and fmt not in ("e4m3", "hybrid"):
        yield f"model.fp8={fmt!r}", "use 'hybrid' (E4M3 forward, E5M2 gradients) or 'e4m3'"


def _gemms(r: Resolved) -> list[tuple[str, int, int]]:
    """(name, out_features, in_features) per rank of every TE linear layer the config builds (FP8 GEMMs)."""
    h, tp, etp, glu = r.get("hidden_size"), r.tp, r.etp, 2 if r.get("gated_linear_unit", False) else 1
    heads = r.get("num_attention_heads")
    out: list[tuple[str, int, int]] = []
    if r.get("multi_latent_attention", False):
        qk, rope, v = r.get("qk_head_dim"), r.get("qk_pos_emb_head_dim"), r.get("v_head_dim")
        q_rank, kv_rank = r.get("q_lora_rank"), r.get("kv_lora_rank")
        if q_rank:
            out += [("linear_q_down_proj", q_rank, h), ("linear_q_up_proj", heads * (qk + rope) // tp, q_rank)]
        else:
            out.append(("linear_q_proj", heads * (qk + rope) // tp, h))
        out += [("linear_kv_down_proj", kv_rank + rope, h), ("linear_kv_up_proj", heads * (qk + v) // tp, kv_rank),
                ("linear_proj", h, heads * v // tp)]
    else:
        kv = r.get("kv_channels") or h // heads
        groups = r.get("num_query_groups") or heads
        q_mult = 2 if r.get("attention_output_gate", False) else 1
        out += [("linear_qkv", (q_mult * heads + 2 * groups) * kv // tp, h), ("linear_proj", h, heads * kv // tp)]
    if _is_gdn(r):
        k_dim = r.get("linear_key_head_dim") * r.get("linear_num_key_heads")
        v_dim = r.get("linear_value_head_dim") * r.get("linear_num_value_heads")
        out += [("gdn in_proj", (2 * k_dim + 2 * v_dim + 2 * r.get("linear_num_value_heads")) // tp, h),
                ("gdn out_proj", h, v_dim // tp)]
    ffn = r.get("ffn_hidden_size")
    freq = r.get("moe_layer_freq", 1)
    has_dense = not r.is_moe or (isinstance(freq, (list, tuple)) and 0 in freq) or (isinstance(freq, int) and freq > 1)
    if has_dense and ffn:
        out += [("mlp linear_fc1", glu * ffn // tp, h), ("mlp linear_fc2", h, ffn // tp)]
    if r.is_moe:
        moe_ffn = r.get("moe_ffn_hidden_size") or ffn
        out += [("experts linear_fc1", glu * moe_ffn // etp, h), ("experts linear_fc2", h, moe_ffn // etp)]
        shared = r.get("moe_shared_expert_intermediate_size")
        if shared:
            out += [("shared_experts linear_fc1", glu * shared // tp, h), ("shared_experts linear_fc2", h, shared // tp)]
    return out


@_rule("fp8/gemm-shapes", TE_UTILS)
def _fp8_shapes(r: Resolved):
    recipe = _fp8_recipe(r)
    if recipe is None:
        return
    mx = recipe == "mxfp8"
    lead, last = (32, 32) if mx else (8, 16)
    what = "MXFP8 needs both dimensions of every quantized tensor divisible by 32" if mx else \
        f"FP8 ({recipe}) needs weights [out, in] with out divisible by 8 and in by 16"
    bad = [f"{name} [{o}, {i}]" for name, o, i in _gemms(r) if o % lead or i % last]
    if bad:
        yield (f"{what}; per-rank weights: {', '.join(bad)}",
               "choose TP/ETP so the sharded dimensions keep the alignment, or use a different precision")
    # the tokens per GEMM input (MBS·seq_length/CP): checks.feasibility rule divisibility/fp8-tokens, on the plan


@_rule("fp8/gdn-in-proj", f"{MCORE} ssm/gated_delta_net/common.py, _GDNBase.__init__ (fp8_utils.get_fp8_align_size: "
       "32 for MXFP8, else 16)")
def _fp8_gdn(r: Resolved):
    recipe = _fp8_recipe(r)
    if recipe is None or not _is_gdn(r):
        return
    align = 32 if recipe == "mxfp8" else 16
    k_dim = r.get("linear_key_head_dim") * r.get("linear_num_key_heads")
    v_dim = r.get("linear_value_head_dim") * r.get("linear_num_value_heads")
    dim = 2 * k_dim + 2 * v_dim + 2 * r.get("linear_num_value_heads")
    if dim % align:
        yield f"gated DeltaNet in_proj output dimension {dim} is not a multiple of {align} under FP8", "use bf16"


@_rule("data/document-masking", f"{MCORE} datasets/gpt_dataset.py (inter_document_masking: cu_seqlens per sample; "
       "documents not padded to 2·CP); Transformer Engine attention/dot_product_attention/context_parallel.py (THD with "
       "CP: every sequence of cu_seqlens divisible by 2·CP); megatron-bridge 0.6.2 training/config.py (packed attention "
       "CUDA graphs need padded cu_seqlens); {MCORE} ssm/gated_delta_net (per-document CP split)")
def _document_masking(r: Resolved):
    if not getattr(r.cfg.dataset, "inter_document_masking", False):
        return
    if r.cp > 1:
        what = ("gated DeltaNet splits every document over CP" if _is_gdn(r) else
                "Transformer Engine's THD attention with CP needs every document's length divisible by 2·CP")
        yield (f"dataset.inter_document_masking=true with CP={r.cp}: {what}, and megatron-core's GPTDataset does not "
               f"pad documents to a multiple of 2·CP={2 * r.cp}",
               "set dataset.inter_document_masking=false, or train at CP=1 to mask per document")
    graphs = _names(r.get("cuda_graph_modules")) or _names(r.get("cuda_graph_scope"))
    if r.get("cuda_graph_impl", "none") != "none" and (not graphs or "attn" in graphs):
        yield ("dataset.inter_document_masking=true with attention in CUDA graphs: cu_seqlens change every sample, "
               "and a graph replays the shapes it captured",
               "set model.cuda_graph_modules without attn (or cuda_graph_impl=none), or inter_document_masking=false")


# --- pipeline schedules -------------------------------------------------------------------------------------------
_SCHED = f"{MCORE} pipeline_parallel/schedules.py"


@_rule("pipeline/microbatch-group", _SCHED + ", forward_backward_pipelining_with_interleaving")
def _microbatch_group(r: Resolved):
    if not (r.vpp and r.vpp > 1 and r.pp > 1) or not r.gbs:
        return
    group = r.get("microbatch_group_size_per_vp_stage", r.pp)
    micro = r.gbs // (r.mbs * r.dp)
    if group > micro or group < r.pp:
        yield (f"microbatch_group_size_per_vp_stage={group} must lie in [PP={r.pp}, microbatches={micro}]",
               f"set model.microbatch_group_size_per_vp_stage to a value in [{r.pp}, {max(r.pp, micro)}] or raise GBS")
    elif 0 < micro % group < r.pp:
        yield (f"microbatches {micro} mod microbatch_group_size_per_vp_stage {group} = {micro % group}, below PP={r.pp}",
               f"make the microbatches a multiple of {group} (GBS={-(-micro // group) * group * r.mbs * r.dp})")


@_rule("pipeline/p2p-overlap-and-batch", _SCHED + ", forward_backward_pipelining_with_interleaving")
def _p2p_both(r: Resolved):
    if r.pp > 1 and r.vpp and r.vpp > 1 and r.get("overlap_p2p_comm", False) and r.get("batch_p2p_comm", False):
        yield "overlap_p2p_comm and batch_p2p_comm both set", "set comm_overlap.batch_p2p_comm=false"


@_rule("pipeline/p2p-overlap-needs-vpp", _SCHED + ", forward_backward_pipelining_without_interleaving")
def _p2p_overlap(r: Resolved):
    if r.pp > 1 and not (r.vpp and r.vpp > 1) and r.get("overlap_p2p_comm", False):
        yield (f"overlap_p2p_comm with PP={r.pp} and no interleaving (VPP unset)",
               "set comm_overlap.overlap_p2p_comm=false, or use VPP > 1")


# --- DDP and the (distributed) optimizer ------------------------------------------------------------------------------
@_rule("ddp/per-token-loss-average", f"{MCORE} distributed/distributed_data_parallel.py, DistributedDataParallel.__init__")
def _per_token(r: Resolved):
    if r.get("calculate_per_token_loss", False) and getattr(r.cfg.ddp, "average_in_collective", False):
        yield "calculate_per_token_loss with ddp.average_in_collective", "set ddp.average_in_collective=false"


@_rule("offload/decoupled-weight-decay", f"{MCORE} optimizer/__init__.py, _get_megatron_optimizer_based_on_param_groups")
def _offload_wd(r: Resolved):
    opt = r.cfg.optimizer
    if getattr(opt, "optimizer_cpu_offload", False) and not getattr(opt, "decoupled_weight_decay", True):
        yield "optimizer CPU offload with decoupled_weight_decay=false", "set optimizer.decoupled_weight_decay=true (AdamW)"


@_rule("optimizer/distributed-needs-adam", f"{MCORE} optimizer/distrib_optimizer.py, DistributedOptimizer.__init__")
def _distopt_adam(r: Resolved):
    opt = r.cfg.optimizer
    if getattr(opt, "use_distributed_optimizer", False) and getattr(opt, "optimizer", "adam") == "sgd":
        yield "the distributed optimizer with optimizer='sgd' (it shards Adam state only)", \
            "use optimizer='adam', or use_distributed_optimizer=false"


# --- the learning-rate schedule and the training length ---------------------------------------------------------------
@_rule("scheduler/lr-range", f"{MCORE} optimizer_param_scheduler.py, OptimizerParamScheduler.__init__ (built by "
                             f"{BRIDGE} training/optim.py, _get_scheduler: max_lr=optimizer.lr, "
                             "min_lr=optimizer.min_lr, init_lr=scheduler.lr_warmup_init)")
def _lr_range(r: Resolved):
    opt, sch = r.cfg.optimizer, r.cfg.scheduler
    lr, low, init = opt.lr, opt.min_lr, getattr(sch, "lr_warmup_init", 0.0) or 0.0
    if lr is not None and lr <= 0:  # zero passes upstream's asserts, and trains nothing
        yield (f"optimizer.lr={lr} (the peak) is " + ("negative: the scheduler asserts max_lr >= min_lr >= 0" if lr < 0
                                                        else "zero: every step leaves the weights as they are"),
               "set optimizer.lr to a positive peak learning rate (--lr)"
               + (f", and optimizer.min_lr to 0 or a positive floor below it" if low is not None and low < 0 else ""))
        return
    if low is not None and low < 0:
        yield f"optimizer.min_lr={low} is negative", "set optimizer.min_lr >= 0 (0 decays to zero)"
    if init < 0:
        yield (f"scheduler.lr_warmup_init={init} is negative: the warm-up's first steps would step up the gradient",
               "set scheduler.lr_warmup_init >= 0 (0 starts the warm-up from zero)")
    if lr is not None and low is not None and lr < low:
        yield (f"optimizer.lr={lr} (the peak) is below optimizer.min_lr={low}",
               f"set optimizer.lr to a peak learning rate of at least {low}, or optimizer.min_lr below {lr} (an "
               "extension phase's constant schedule sets min_lr to the LR, and --lr sets both)")
    elif lr is not None and init > lr:
        yield (f"scheduler.lr_warmup_init={init} is above optimizer.lr={lr} (the warm-up would ramp down)",
               f"set scheduler.lr_warmup_init <= {lr} (0 starts the warm-up from zero)")


@_rule("optimizer/adam-hyperparameters", "torch 2.x torch/optim/adam.py, Adam.__init__ (ValueError unless 0 <= "
                                         "beta1, beta2 < 1, eps >= 0, weight_decay >= 0): megatron-core 0.19.2 "
                                         "optimizer/__init__.py builds torch's AdamW for the CPU part under "
                                         "optimizer CPU offload, and torch's Adam/AdamW where neither Transformer "
                                         "Engine nor Apex is installed; at beta1 = 1 Adam's bias correction "
                                         "1 - beta1^t is 0")
def _adam_hyperparameters(r: Resolved):
    opt = r.cfg.optimizer
    if getattr(opt, "optimizer", "adam") != "adam":
        return
    for name in ("adam_beta1", "adam_beta2"):
        value = getattr(opt, name, None)
        if value is not None and not 0.0 <= value < 1.0:
            yield (f"optimizer.{name}={value} is outside [0, 1)", f"set optimizer.{name} in [0, 1) (0.9 and 0.95 are "
                   "the usual beta1 and beta2 of LLM pretraining)")
    eps = getattr(opt, "adam_eps", None)
    if eps is not None and eps < 0:
        yield f"optimizer.adam_eps={eps} is negative", "set optimizer.adam_eps > 0 (1e-8 is Adam's default)"
    decay = getattr(opt, "weight_decay", None)
    if decay is not None and decay < 0:
        yield (f"optimizer.weight_decay={decay} is negative (it would grow the weights)",
               "set optimizer.weight_decay >= 0, and scheduler.start_weight_decay / end_weight_decay, which are what "
               "the run applies")


@_rule("optimizer/weight-decay-not-scheduled", f"{MCORE} optimizer_param_scheduler.py, OptimizerParamScheduler.step "
                                               "(called with 0 by __init__: every group's weight_decay is set from "
                                               f"start_wd/end_wd); {BRIDGE} training/optim.py, _get_scheduler "
                                               "(start_wd=scheduler.start_weight_decay)", severity="warning")
def _weight_decay_not_scheduled(r: Resolved):
    decay = getattr(r.cfg.optimizer, "weight_decay", None)
    start = getattr(r.cfg.scheduler, "start_weight_decay", None)
    end = getattr(r.cfg.scheduler, "end_weight_decay", None)
    if decay is None or start is None or decay < 0:  # a negative one is refused above
        return
    if not math.isclose(decay, start) or (end is not None and not math.isclose(decay, end)):
        yield (f"optimizer.weight_decay={decay} is not what the run applies: the scheduler sets every parameter "
               f"group's weight decay from scheduler.start_weight_decay={start} to end_weight_decay={end}, from the "
               "first step on", f"set scheduler.start_weight_decay={decay} scheduler.end_weight_decay={decay} (or "
               f"optimizer.weight_decay={start} to say what runs)")


@_rule("train/iters-positive", f"{BRIDGE} training/train.py, train (the loop runs while train_state.step < "
                               "train_iters; TrainingConfig.finalize asserts train_samples > 0 and num_epochs > 0, not "
                               "train_iters)")
def _iters_positive(r: Resolved):
    iters = getattr(r.cfg.train, "train_iters", None)
    if iters is not None and iters <= 0:
        yield (f"train.train_iters={iters}: the training loop runs no step, and the job ends having trained nothing",
               "set train.train_iters to the phase's optimizer steps (1 or more)")


@_rule("checkpoint/interval-negative", f"{BRIDGE} training/train.py, train (a save when save_interval and step % "
                                       "save_interval == 0; the same for non_persistent_save_interval)")
def _interval_negative(r: Resolved):
    ckpt = r.cfg.checkpoint
    for name in ("save_interval", "non_persistent_save_interval"):
        value = getattr(ckpt, name, None)
        if value is not None and value < 0:
            yield (f"checkpoint.{name}={value}: step % {value} is 0 at every step, so the run saves a checkpoint "
                   "after every step", f"set checkpoint.{name} to the steps between saves (0 or null: none)")


@_rule("scheduler/warmup-longer-than-run", f"{BRIDGE} training/config.py, ConfigContainer.validate (lr_warmup_steps "
                                           ">= lr_decay_steps is capped to lr_decay_steps - 1, with a UserWarning)",
       severity="warning")
def _warmup_too_long(r: Resolved):
    sch, iters = r.before.scheduler, getattr(r.before.train, "train_iters", None)
    warmup = getattr(sch, "lr_warmup_iters", 0) or 0
    decay = getattr(sch, "lr_decay_iters", None) or iters
    if decay and warmup >= decay > 0:
        yield (f"scheduler.lr_warmup_iters={warmup} is not below the {decay} decay steps: megatron-bridge cuts the "
               f"warm-up to {decay - 1} steps (its samples), so the peak learning rate is reached only at the end",
               f"set scheduler.lr_warmup_iters below {decay} (e.g. {max(1, decay // 50)})")


# --- CUDA graphs ----------------------------------------------------------------------------------------------------
@_rule("cuda-graphs/nccl-graph-register", f"{MCORE} transformer/cuda_graphs.py, TECudaGraphHelper.__init__")
def _graph_register(r: Resolved):
    env = getattr(r.cfg, "env_vars", None) or {}
    if r.get("cuda_graph_impl") == "transformer_engine" and "expandable_segments:True" in str(
            env.get("PYTORCH_CUDA_ALLOC_CONF", "")) and str(env.get("NCCL_GRAPH_REGISTER", "")) != "0":
        yield ("TE CUDA graphs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and NCCL_GRAPH_REGISTER not 0 "
               "(illegal memory access)", "add env_vars NCCL_GRAPH_REGISTER=0")


# --- tokenizer and data loader ----------------------------------------------------------------------------------------
@_rule("data/vocab-size", f"{BRIDGE} training/setup.py, _validate_and_set_vocab_size")
def _vocab(r: Resolved):
    tok = r.cfg.tokenizer
    if getattr(tok, "tokenizer_type", None) != "NullTokenizer" or getattr(tok, "use_tokenizer_vocab_size", False):
        return  # a real tokenizer's size is read from its files on the cluster
    model_vocab, tok_vocab = r.get("vocab_size"), getattr(tok, "vocab_size", None)
    if model_vocab is not None and tok_vocab is not None and model_vocab < tok_vocab:
        yield (f"model.vocab_size={model_vocab} is smaller than the NullTokenizer's vocab_size={tok_vocab}",
               f"set tokenizer.vocab_size={model_vocab} (or model.vocab_size >= {tok_vocab})")


@_rule("data/dataloader-type", f"{BRIDGE} data/loaders.py, build_train_valid_test_data_iterators; data/samplers.py, "
       "build_pretraining_data_loader")
def _dataloader(r: Resolved):
    kind = getattr(r.cfg.dataset, "dataloader_type", "single")
    if kind not in ("single", "cyclic", "batch", "external", None):
        yield f"dataset.dataloader_type={kind!r}", "use 'single' (pretraining), 'cyclic', 'batch' or 'external'"


# --- silent overrides: what the run will actually do --------------------------------------------------------------------
@_rule("ignored/flex-backend", f"{MCORE} transformer/moe/moe_layer.py, MoELayer.__init__ (the backend is read by the "
       "flex dispatcher only)", severity="warning")
def _flex_ignored(r: Resolved):
    kind, backend = r.get("moe_token_dispatcher_type"), r.get("moe_flex_dispatcher_backend")
    if r.is_moe and kind != "flex" and backend in ("deepep", "hybridep"):
        yield (f"moe_flex_dispatcher_backend={backend!r} is ignored: moe_token_dispatcher_type is {kind!r}, so the run "
               f"uses the {kind} dispatcher, not {backend}", f"set model.moe_token_dispatcher_type=flex to use {backend}, "
               "or moe_flex_dispatcher_backend=null")


_SECTIONS = ("model", "ddp", "optimizer")
# Fields with no effect in some layouts: a changed value there changes nothing the run does.
_NO_EFFECT: dict[str, Callable[[Resolved], bool]] = {
    **{f"ddp.{f}": (lambda r: r.dp == 1 and r.edp == 1) for f in (
        "overlap_grad_reduce", "overlap_param_gather", "align_param_gather", "bucket_size")},
    **{f"optimizer.{f}": (lambda r: r.dp == 1 and r.edp == 1) for f in (
        "overlap_param_gather", "overlap_param_gather_with_optimizer_step")},
    **{f"model.{f}": (lambda r: r.pp == 1) for f in ("overlap_p2p_comm", "batch_p2p_comm")},
    "model.fp8_recipe": lambda r: not r.get("fp8"),
}
# What megatron-bridge's finalize does on its own (models/transformer_config.py, TransformerConfig.finalize).
_FINALIZE_REASON = {
    "sequence_parallel": ("override/sequence-parallel", "megatron-bridge turns sequence parallel off at TP=1",
                          "drop sequence_parallel (nothing to split at TP=1), or raise TP"),
}


def _plain(value: Any) -> Any:
    """A value as comparable plain data: enum members by name, functions by name, torch dtypes as "bfloat16"."""
    if isinstance(value, enum.Enum):
        return value.name
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    text = str(value)
    return text.removeprefix("torch.")


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _overrides(r: Resolved) -> Iterator[Finding]:
    """Settings the config states that ``runtime_config_update`` overwrote: warn with what the run will use."""
    mp = r.cfg.mixed_precision
    mp_fields = {f.name for f in dataclasses.fields(mp)} if dataclasses.is_dataclass(mp) else set()
    mp_name = (repr(r.before.mixed_precision) if isinstance(r.before.mixed_precision, str)
               else f"config ({type(mp).__name__})")
    co = r.cfg.comm_overlap
    co_fields = {f.name for f in dataclasses.fields(co)} if dataclasses.is_dataclass(co) else set()
    for section in _SECTIONS:
        before, after = getattr(r.before, section, None), getattr(r.cfg, section, None)
        if not (dataclasses.is_dataclass(before) and dataclasses.is_dataclass(after)):
            continue
        for field in dataclasses.fields(before):
            old, new = _plain(getattr(before, field.name, None)), _plain(getattr(after, field.name, None))
            default = _default(field)
            written = getattr(before, field.name, None)
            if old == new or default is dataclasses.MISSING or old == _plain(default) or not (
                    isinstance(written, (bool, int, float, str, enum.Enum)) or type(written).__name__ == "dtype"):
                continue
            key = f"{section}.{field.name}"
            if key in _NO_EFFECT and _NO_EFFECT[key](r):
                continue
            if field.name in mp_fields:
                yield Finding("warning", "override/mixed-precision",
                              f"{key}={old!r} is overwritten by the mixed_precision {mp_name}: the run uses {new!r} "
                              f"({BRIDGE} training/mixed_precision.py, update_config_with_precision_overrides)",
                              f"set {field.name} through cfg.mixed_precision (a MixedPrecisionConfig with "
                              f"{field.name}={old!r}), or drop it from {section}")
            elif field.name in co_fields:
                yield Finding("warning", "override/comm-overlap",
                              f"{key}={old!r} is overwritten by CommOverlapConfig.setup: the run uses {new!r} "
                              f"(DP={r.dp}, PP={r.pp}, VPP={r.vpp}; {BRIDGE} training/comm_overlap.py)",
                              f"set comm_overlap.{field.name}={old!r} (values set on comm_overlap win)")
            elif field.name in _FINALIZE_REASON:
                rule, why, fix = _FINALIZE_REASON[field.name]
                yield Finding("warning", rule, f"{key}={old!r} becomes {new!r}: {why}", fix)
            else:
                yield Finding("warning", "override/finalize",
                              f"{key}={old!r} becomes {new!r} when megatron-bridge / megatron-core finalize the config",
                              f"set {key}={new!r} to say what the run does")


OVERRIDE_RULES = ("override/mixed-precision", "override/comm-overlap", "override/sequence-parallel", "override/finalize")


def upstream_finding(error: BaseException, hardware: Hardware, world_size: int) -> Finding:
    """The finding for an exception raised by ``runtime_config_update`` on the target: our rule id and fix where
    :data:`UPSTREAM_MESSAGES` knows the message, else the generic ``upstream/validate``."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    message = ("megatron-bridge validation (runtime_config_update -> ConfigContainer.validate) rejected the config "
               f"for {world_size} x {hardware.key}: {first}")
    for entry in UPSTREAM_MESSAGES:
        if re.search(entry.pattern, text):
            return Finding("error", entry.rule, message, entry.fix)
    return Finding("error", UPSTREAM_VALIDATE_RULE, message, "change the field it names (see docs/troubleshooting.md)")


def config_assert_findings(before, after, hardware: Hardware, world_size: int,
                           upstream_error: BaseException | None = None) -> list[Finding]:
    """Findings for the asserts that fire after ``check`` time, on the config ``runtime_config_update`` resolved.

    Args:
        before: the ConfigContainer as written (never changed).
        after: its deep copy after ``runtime_config_update`` on the target (partly resolved if that raised).
        hardware: the target GPU.
        world_size: number of GPUs.
        upstream_error: what ``runtime_config_update`` raised, if anything; then only its mapped finding is returned
            (the later asserts need a config that validates).

    Returns:
        list of :class:`Finding`, errors first.
    """
    if upstream_error is not None:
        return [upstream_finding(upstream_error, hardware, world_size)]
    resolved = Resolved(after, before, hardware, world_size)
    findings = [Finding(rule.severity, rule.id, message, fix)
                for rule in RULES.values() for message, fix in (rule.check(resolved) or ())]
    findings += list(_overrides(resolved))
    findings.sort(key=lambda f: f.severity != "error")
    return findings
