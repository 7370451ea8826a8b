"""The named long-context MoE recipes: a Plan per published reference configuration.

Layouts, precision, dispatcher and recompute follow the published long-context runs (Megatron-Bridge skill
``nemo-mbridge-perf-moe-long-context``, SKILL.md + card.yaml, measured table in docs/recipes.md). Everything else --
the upstream recipe it starts from, positions, token budget and GBS, schedule, pipeline layout string, weights --
comes from the rules every run shares (:func:`lcmoe_recipes.rules.extension.extension_fields`). Where the published
configuration is silent (Qwen3-Next's TP/PP/EP), the choice and its reason are recorded in ``Plan.reasons``. Each public factory (``dsv3_128k_h100()``, ...) returns a validated megatron-bridge
``ConfigContainer``; ``recipe_plan(name)`` returns the Plan without importing megatron.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..catalog import get_hardware, get_model
from ..catalog.lookup import lookup
from ..checks import check_plan, raise_for_errors
from ..core.layout import ParallelLayout
from ..core.plan import Plan, Reason
from ..core.request import RUN_OPTIONS, TrainingRequest
from ..errors import UnknownName
from ..rules.extension import extension_fields, with_cp_comm, with_ep_overlap

SKILL = "Megatron-Bridge skill nemo-mbridge-perf-moe-long-context (SKILL.md, card.yaml)"


@dataclass(frozen=True)
class NamedRecipe:
    """A named recipe: what it is for and how its Plan is built."""

    name: str
    model: str
    seq_length: int
    hardware: str
    num_gpus: int
    summary: str
    make_plan: Callable[..., Plan]
    options: tuple[str, ...] = ()


def _named(name: str, model: str, hardware: str, seq_length: int, layout: ParallelLayout, precision: str,
           options: TrainingRequest, reasons: dict[str, Reason], **knobs) -> Plan:
    """A named recipe's Plan: its pinned layout and knobs (``knobs``, ``reasons``) plus the decisions every run takes
    for its layout (:func:`lcmoe_recipes.rules.extension.extension_fields`)."""
    spec, hw = get_model(model), get_hardware(hardware)
    common, why = extension_fields(spec, hw, seq_length, layout, precision, options)
    plan = Plan(name=name, model=model, hardware=hardware, seq_length=seq_length, layout=layout, precision=precision,
                mtp_num_layers=spec.mtp_num_layers, **{**common, **knobs}, reasons={**why, **reasons})
    return with_cp_comm(with_ep_overlap(plan))


# DeepSeek-V3's pipeline split over PP8 x VPP4 = 32 chunks. The even split (core.pipeline.pipeline_stage_layers,
# also megatron-bridge 0.6.2's DSV3 H100 perf recipes: "Et|(tt|)*30mL") gives PP rank 7 six decoder layers plus the
# MTP layer (a whole MoE layer), the output layer and MTP's copy of the embedding. With FP32 gradients
# (rules.base.GRAD_DTYPE), every selective recompute module but core_attn on and the whole optimizer offloaded, rank 7
# then uses 65.5 GiB of HBM (128K; 65.8 at 256K) of the 70.8 GiB limit: 7.5% (7.1%) free, under the memory model's
# worst error of 8% (cost.bands.MEMORY_ERROR_BAND). One decoder layer moves from rank 7's first chunk (chunk 7: "t")
# to rank 0's second chunk (chunk 8: "ttt"), a MoE layer whose experts are sharded over EP32. Ranks 0-6 then run 8
# decoder layers each, rank 7 five plus MTP and the loss; the peak is rank 0 at 63.4 GiB (128K; 63.7 at 256K):
# 10.4% / 10.0% free, and the predicted step stays 873.7 s / 766.8 s (no rank runs more than the 8 layers the middle
# ranks already run). Rank 0's first chunk keeps only layer 0: a second layer there would be dense DeepSeek-V3 layer
# 1 (first_k_dense_replace 3; its FFN is not sharded by EP), on the rank that holds the most in-flight microbatches:
# 65.7 GiB. Full recompute (uniform, 1 layer), the next rung, would also fit, at +20% / +23% step time.
DSV3_H100_PIPELINE = "Et|(tt|)*6t|ttt|(tt|)*22mL"


def _dsv3_h100(seq_length: int, num_gpus: int, cp: int, name: str, options: TrainingRequest) -> Plan:
    layout = ParallelLayout(world=num_gpus, tp=1, pp=8, vpp=4, cp=cp, ep=32, etp=1)
    return _named(
        name, "dsv3", "h100", seq_length, layout, "fp8_blockwise", options,
        pipeline_model_parallel_layout=DSV3_H100_PIPELINE,
        moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep",
        recompute_granularity="selective", recompute_modules=("mla_up_proj", "layernorm", "moe", "mlp"),
        optimizer_cpu_offload=True, optimizer_offload_fraction=1.0, use_distributed_optimizer=True,
        use_precision_aware_optimizer=True, moment_dtype="fp32", sequence_parallel=False,
        reasons={
            "layout": Reason(f"published DSV3 {seq_length // 1024}K H100 layout TP1 CP{cp} EP32 PP8 VPP4 "
                             f"(CP = seq_length/4096 = {seq_length // 4096}); one decoder layer moved off PP rank 7 "
                             "(see pipeline_model_parallel_layout)", SKILL),
            "precision": Reason("FP8 blockwise (128x128 weights, 1x128 activations): the published FP8 class, and the "
                                "precision DeepSeek-V3 was trained in (technical report arXiv 2412.19437 §3.3)", SKILL),
            "dispatcher": Reason("flex + DeepEP: H100 (SM90) is DeepEP's platform", SKILL),
            "recompute": Reason("selective up_proj (mla_up_proj), norm (layernorm), moe, mlp: the published set; "
                                "no core_attn recompute at long context", SKILL + "; megatron-core 0.19.2 "
                                "TransformerConfig.recompute_modules (mla_up_proj is MLA's up-projection)"),
            "optimizer_cpu_offload": Reason("'All DSV3 long-context configs require --optimizer-cpu-offload' "
                                            "(fraction 1.0; needs distributed + precision-aware optimizer)", SKILL),
            "sequence_parallel": Reason("TP=1: nothing to split", "megatron-bridge sets SP off when TP<=1"),
            "cuda_graphs": Reason("no CUDA graphs, as in the published DSV3 long-context runs and megatron-bridge's DSV3 "
                                  "H100 perf recipes", SKILL),
            "pipeline_model_parallel_layout": Reason(
                f"{DSV3_H100_PIPELINE}: one decoder layer moved from PP rank 7 (which also holds the MTP layer, the "
                "output layer and MTP's embedding copy) to rank 0's second chunk (a MoE layer, not dense layer 1), "
                "so ranks 0-6 run 8 decoder layers "
                "each and rank 7 five plus MTP and the loss. The even split (Et|(tt|)*30mL, as megatron-bridge's DSV3 "
                "H100 perf recipes) leaves 7.5% (128K) or 7.1% (256K) of the planning limit free on rank 7 with FP32 "
                "gradients, under the memory model's worst error (8%); the selective recompute set has every module "
                "but core_attn (not recomputed at long context) and the optimizer is wholly offloaded, so the next rung is "
                "full recompute, +20-23% step time. The moved layer leaves 10.4% free on the peak rank (PP rank 0) at 128K "
                "and 10.0% at 256K, at the same predicted step time (873.7 s at 128K, 766.8 s at 256K); the published "
                "layout TP1 CP EP32 PP8 VPP4 is kept",
                f"{SKILL} (rules 3-4: selective before full recompute, no SDPA recompute at long context); "
                "megatron-bridge 0.6.2 perf_recipes/deepseek/h100/deepseek_v3.py (the even split); megatron-core "
                "0.19.2 PipelineParallelLayerLayout; lcmoe_recipes.cost.memory, cost.step, cost.bands "
                "MEMORY_ERROR_BAND"),
        })


# The published Qwen3-235B 128K GB200 run (TP4 CP4 EP32 PP4 VPP12) recomputes "moe_act + norm". megatron-core 0.19.2
# runs neither norm recompute in this configuration: the input norm is fused into Transformer Engine's QKV linear
# (TELayerNormColumnParallelLinear: no separate norm to recompute), and the pre-MLP norm recompute is switched off,
# with a logged warning, under the flex dispatcher with moe_router / moe_preprocess CUDA graphs
# (transformer/transformer_layer.py). Without it, and with FP32 gradients (rules.base.GRAD_DTYPE), CP4 needs 169.3 GiB
# of its 164.6 GiB limit; CP8 (DP 2 -> 1, the same DP·CP = 8 optimizer sharding) halves the tokens per rank.
QWEN3_235B_CP = 8


def _qwen3_235b_gb200(options: TrainingRequest, precision: str = "bf16", seq_length: int = 131072, num_gpus: int = 128,
                      name: str = "qwen3_235b_128k_gb200") -> Plan:
    cp = QWEN3_235B_CP
    layout = ParallelLayout(world=num_gpus, tp=4, pp=4, vpp=12, cp=cp, ep=32, etp=1)
    norm_why = ("megatron-core 0.19.2 runs no norm recompute here: the input norm is fused into TE's QKV linear "
                "(TELayerNormColumnParallelLinear), and the pre-MLP norm recompute is switched off, with a warning, "
                "under the flex dispatcher with moe_router/moe_preprocess CUDA graphs")
    norm_source = "megatron-core 0.19.2 transformer/transformer_layer.py, models/gpt/gpt_layer_specs.py"
    return _named(
        name, "qwen3_235b", "gb200", seq_length, layout, precision, options,
        moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
        recompute_granularity="selective", recompute_modules=("moe_act",),
        cuda_graph_impl="transformer_engine", cuda_graph_modules=("attn", "moe_router", "moe_preprocess"),
        sequence_parallel=True,
        reasons={
            "layout": Reason(f"published Qwen3-235B 128K GB200 layout TP4 EP32 PP4 VPP12 (on NVL72, TP4 stands in for "
                             f"part of CP), with CP{cp} instead of the published CP4: the published run's norm "
                             "recompute is one megatron-core does not run here (see recompute), and with FP32 "
                             "gradient accumulation CP4 needs 169.3 GiB of the 164.6 GiB planning limit; CP8 halves "
                             "the tokens per rank (DP 2 -> 1, the optimizer still sharded over DP·CP = 8) and leaves "
                             "more than the memory model's worst error free",
                             f"{SKILL}; {norm_source}; lcmoe_recipes.cost.memory, cost.bands MEMORY_ERROR_BAND"),
            "precision": Reason(f"{precision} (BF16 published; MXFP8 selectable with precision='mxfp8')", SKILL),
            "dispatcher": Reason("flex + HybridEP: NVL72 GB200, EP32 inside one NVLink domain", SKILL),
            "recompute": Reason(f"selective moe_act: the published set is moe_act + norm (layernorm), but {norm_why}, so "
                                "layernorm is dropped (the YAML states the recompute that runs)",
                                f"{SKILL}; {norm_source}"),
            "cuda_graphs": Reason("TE CUDA graphs on attn, moe_router, moe_preprocess: shapes are static "
                                  "(fixed seq_length and MBS, no packed sequences)", SKILL),
            "sequence_parallel": Reason("TP=4 with EP>1 needs sequence parallel", "megatron-core TransformerConfig"),
        })


# Qwen3-Next on 32 GB200: only CP (1/4/16) is published. TP1 (CP16 needs TP·CP to divide the 16 linear key heads),
# PP2 VPP4 as in Megatron-Bridge's Qwen3-Next GB200 perf recipe, EP16 = 32/(ETP·PP) so EDP = 1.
_QWEN3_NEXT_RECOMPUTE = {
    8192: (("layernorm", "moe_act"), "DP16 shards the dense optimizer state 16 ways; norm + expert activation "
                                     "recompute is enough (published peak ~150 GB of 186)"),
    32768: (("layernorm", "moe"), "DP falls to 4 (4x larger optimizer shard) at the same 8K tokens per rank: "
                                  "recompute the whole MoE layer (published peak ~135 GB)"),
    65536: (("layernorm", "moe"), "DP falls to 1; 4K tokens per rank, but attention K/V all-gathered over CP16: "
                                  "recompute the whole MoE layer (published peak ~160 GB)"),
}


def _qwen3_next_gb200(seq_length: int, cp: int, name: str, options: TrainingRequest, num_gpus: int = 32) -> Plan:
    layout = ParallelLayout(world=num_gpus, tp=1, pp=2, vpp=4, cp=cp, ep=16, etp=1)
    modules, why = _QWEN3_NEXT_RECOMPUTE[seq_length]
    return _named(
        name, "qwen3_next", "gb200", seq_length, layout, "bf16", options,
        moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
        recompute_granularity="selective", recompute_modules=modules, sequence_parallel=False,
        reasons={
            "layout": Reason(f"published CP{cp} on 32 GB200; TP1 because gated DeltaNet needs its 16 linear key heads "
                             f"divisible by TP·CP; PP2 VPP4 and EP16 (EDP1) fill the 32 GPUs",
                             SKILL + "; megatron-core gated_delta_net rule; Bridge perf recipe qwen3_next_80b_a3b_pretrain_64gpu_gb200"),
            "precision": Reason("BF16, as published", SKILL),
            "dispatcher": Reason("flex + HybridEP on NVL72 GB200", SKILL),
            "recompute": Reason(why, SKILL),
            "cuda_graphs": Reason("no CUDA graphs: the published long-context runs state none, and megatron-core 0.19.2 "
                                  "forbids TE graphs of the moe_router scope with 'moe' recompute, which 32K/64K need",
                                  SKILL + "; megatron-core 0.19.2 TransformerConfig.__post_init__"),
        })


NAMED_RECIPES: dict[str, NamedRecipe] = {
    r.name: r
    for r in (
        NamedRecipe("dsv3_128k_h100", "dsv3", 131072, "h100", 256, "DeepSeek-V3 at 128K on 256 H100",
                    lambda options: _dsv3_h100(131072, 256, 32, "dsv3_128k_h100", options)),
        NamedRecipe("dsv3_256k_h100", "dsv3", 262144, "h100", 512, "DeepSeek-V3 at 256K on 512 H100",
                    lambda options: _dsv3_h100(262144, 512, 64, "dsv3_256k_h100", options)),
        NamedRecipe("qwen3_235b_128k_gb200", "qwen3_235b", 131072, "gb200", 128, "Qwen3-235B-A22B at 128K on 128 GB200",
                    lambda options, precision="bf16": _qwen3_235b_gb200(options, precision), options=("precision",)),
        NamedRecipe("qwen3_next_8k_gb200", "qwen3_next", 8192, "gb200", 32, "Qwen3-Next-80B-A3B at 8K on 32 GB200",
                    lambda options: _qwen3_next_gb200(8192, 1, "qwen3_next_8k_gb200", options)),
        NamedRecipe("qwen3_next_32k_gb200", "qwen3_next", 32768, "gb200", 32, "Qwen3-Next-80B-A3B at 32K on 32 GB200",
                    lambda options: _qwen3_next_gb200(32768, 4, "qwen3_next_32k_gb200", options)),
        NamedRecipe("qwen3_next_64k_gb200", "qwen3_next", 65536, "gb200", 32, "Qwen3-Next-80B-A3B at 64K on 32 GB200",
                    lambda options: _qwen3_next_gb200(65536, 16, "qwen3_next_64k_gb200", options)),
    )
}


def recipe_plan(name: str, **options) -> Plan:
    """The checked Plan of a named recipe (no megatron import).

    Args:
        options: the recipe's own options (``precision`` for qwen3_235b_128k_gb200) and any run option
            (:data:`lcmoe_recipes.core.request.RUN_OPTIONS`, fields of :class:`~lcmoe_recipes.core.request.
            TrainingRequest`: ``rope``, ``tokens_per_step``, ``global_batch_size``, ``lr``, ``train_iters``,
            ``pretrained_checkpoint``), checked as a request's are.

    Raises:
        UnknownName: the name is not a named recipe, or an unknown option.
        LcmoeError: a bad option value.
        InfeasibleConfig: the plan breaks a rule (a bug in the recipe unless an option caused it).
    """
    recipe = named_recipe(name)
    unknown = sorted(set(options) - set(recipe.options) - set(RUN_OPTIONS))
    if unknown:
        raise UnknownName(f"recipe {name} has no option {', '.join(repr(o) for o in unknown)}",
                          f"its options: {', '.join(recipe.options + RUN_OPTIONS)}")
    run = TrainingRequest.parse(recipe=name, **{k: v for k, v in options.items() if k in RUN_OPTIONS})
    plan = recipe.make_plan(run, **{k: v for k, v in options.items() if k in recipe.options})
    raise_for_errors(check_plan(plan), f"recipe {name}")
    return plan


def named_recipe(name: str) -> NamedRecipe:
    """The named recipe ``name`` (case-insensitive).

    Raises:
        UnknownName: "unknown recipe 'x'", with the closest name and every named recipe (:func:`lcmoe_recipes.
            catalog.lookup.lookup`).
    """
    return lookup(name, NAMED_RECIPES, {key: key for key in NAMED_RECIPES}, "recipe")


def find_named_recipe(model: str, seq_length: int, num_gpus: int | None = None, hardware: str | None = None) -> NamedRecipe:
    """The named recipe for (model, seq_length[, GPUs, hardware]).

    Raises:
        UnknownName: bad model/hardware name, or no named recipe matches (the message lists the ones that exist for
            that model, and what to change).
    """
    spec = get_model(model)
    hw = get_hardware(hardware).key if hardware else None
    for recipe in NAMED_RECIPES.values():
        if (recipe.model == spec.key and recipe.seq_length == seq_length
                and num_gpus in (None, recipe.num_gpus) and hw in (None, recipe.hardware)):
            return recipe
    same_model = [r for r in NAMED_RECIPES.values() if r.model == spec.key]
    listed = ", ".join(f"seq_length={r.seq_length} num_gpus={r.num_gpus} hardware={r.hardware}" for r in same_model)
    asked = (f"{spec.key} at seq_length {seq_length}" + (f" on {num_gpus}" if num_gpus else "")
             + (f" {hw}" if hw and num_gpus else f" on {hw}" if hw else ""))
    plan_it = ("give `hardware` too" if num_gpus and not hw else "give `num_gpus` too" if hw and not num_gpus
               else "give `num_gpus` and `hardware`")
    raise UnknownName(f"no named recipe for {asked}",
                      f"named recipes for {spec.key}: {listed or 'none'}; or {plan_it} to plan one",
                      fields=("seq_length", "num_gpus", "hardware"))
