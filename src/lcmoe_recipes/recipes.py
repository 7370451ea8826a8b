"""The named long-context MoE recipes: a Plan per published reference configuration.

Layouts, precision, dispatcher and recompute follow the published long-context runs (Megatron-Bridge skill
``nemo-mbridge-perf-moe-long-context``, SKILL.md + card.yaml; ``../shared/REFERENCE.md`` §9). Where the published
configuration is silent (batch sizes, Qwen3-Next's TP/PP/EP), the choice and its reason are recorded in
``Plan.reasons``. Each public factory (``dsv3_128k_h100()``, ...) returns a validated megatron-bridge
``ConfigContainer``; ``recipe_plan(name)`` returns the Plan without importing megatron.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

from .catalog import get_hardware, get_model
from .checks import check_plan, raise_for_errors
from .errors import UnknownName
from .layout import ParallelLayout
from .plan import Plan, Reason, build_pipeline_layout

SKILL = "Megatron-Bridge skill nemo-mbridge-perf-moe-long-context (SKILL.md, card.yaml); REFERENCE.md §9"
TOKENS_PER_STEP = 2**23  # 8.4M tokens per step for DeepSeek-V3 / Qwen3-235B, 2**22 for Qwen3-Next


@dataclass(frozen=True)
class NamedRecipe:
    """A named recipe: what it is for and how its Plan is built."""

    name: str
    model: str
    seq_length: int
    hardware: str
    num_gpus: int
    summary: str
    build: Callable[..., Plan]
    options: tuple[str, ...] = ()


def _batch(seq_length: int, tokens_per_step: int, dp: int, pp: int) -> tuple[int, Reason]:
    """GBS holding ``tokens_per_step`` constant, rounded up to a multiple of DP·PP (interleaving needs
    microbatches per DP rank to be a multiple of PP)."""
    gbs = max(1, tokens_per_step // seq_length)
    step = dp * pp
    gbs = -(-gbs // step) * step
    return gbs, Reason(
        f"GBS {gbs} x {seq_length} tokens = {gbs * seq_length / 1e6:.1f}M tokens per step; at DP={dp} that is "
        f"{gbs // dp} microbatches per rank (a multiple of PP={pp}): GBS shrinks as seq_length grows and DP falls",
        "seed rule 'assume GBS will need to shrink' (moe-long-context skill); Megatron interleaved-schedule rule",
    )


def _dsv3_h100(seq_length: int, num_gpus: int, cp: int, name: str) -> Plan:
    model = get_model("dsv3")
    layout = ParallelLayout(world=num_gpus, tp=1, pp=8, vpp=4, cp=cp, ep=32, etp=1)
    gbs, gbs_reason = _batch(seq_length, TOKENS_PER_STEP, layout.dp, layout.pp)
    return Plan(
        name=name, model="dsv3", hardware="h100", seq_length=seq_length, layout=layout,
        pipeline_model_parallel_layout=build_pipeline_layout(model.num_layers, layout.num_pipeline_stages, model.mtp_num_layers),
        micro_batch_size=1, global_batch_size=gbs, precision="fp8_blockwise",
        moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep",
        recompute_granularity="selective", recompute_modules=("mla_up_proj", "layernorm", "moe", "mlp"),
        optimizer_cpu_offload=True, optimizer_offload_fraction=1.0,
        use_distributed_optimizer=True, use_precision_aware_optimizer=True,
        sequence_parallel=False, mtp_num_layers=model.mtp_num_layers,
        reasons={
            "layout": Reason(f"published DSV3 {seq_length // 1024}K H100 layout TP1 CP{cp} EP32 PP8 VPP4 "
                             f"(CP = seq_length/4096 = {seq_length // 4096})", SKILL),
            "pipeline_model_parallel_layout": Reason(
                "61 decoder layers + 1 MTP over PP8·VPP4 = 32 chunks: embedding with 1 layer first, MTP + loss last",
                "same split as Megatron-Bridge perf recipe deepseek_v3_pretrain_1024gpu_h100 (Et|(tt|)*30mL)"),
            "precision": Reason("FP8 blockwise (128x128 weights, 1x128 activations), the FP8 class DSV3 was trained in", SKILL),
            "dispatcher": Reason("flex + DeepEP: H100 (SM90) is DeepEP's platform", SKILL),
            "recompute": Reason("selective up_proj (mla_up_proj), norm (layernorm), moe, mlp: the published set; "
                                "no core_attn recompute at long context", SKILL + "; REFERENCE.md §3 name mapping"),
            "optimizer_cpu_offload": Reason("'All DSV3 long-context configs require --optimizer-cpu-offload' "
                                            "(fraction 1.0; needs distributed + precision-aware optimizer)", SKILL),
            "global_batch_size": gbs_reason,
            "sequence_parallel": Reason("TP=1: nothing to split", "megatron-bridge sets SP off when TP<=1"),
        },
    )


def _qwen3_235b_gb200(seq_length: int = 131072, num_gpus: int = 128, precision: str = "bf16",
                      name: str = "qwen3_235b_128k_gb200") -> Plan:
    model = get_model("qwen3_235b")
    layout = ParallelLayout(world=num_gpus, tp=4, pp=4, vpp=12, cp=4, ep=32, etp=1)
    gbs, gbs_reason = _batch(seq_length, TOKENS_PER_STEP, layout.dp, layout.pp)
    return Plan(
        name=name, model="qwen3_235b", hardware="gb200", seq_length=seq_length, layout=layout,
        pipeline_model_parallel_layout=build_pipeline_layout(model.num_layers, layout.num_pipeline_stages),
        micro_batch_size=1, global_batch_size=gbs, precision=precision,
        moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
        recompute_granularity="selective", recompute_modules=("moe_act", "layernorm"),
        cuda_graph_impl="transformer_engine", cuda_graph_modules=("attn", "moe_router", "moe_preprocess"),
        sequence_parallel=True, mtp_num_layers=0,
        reasons={
            "layout": Reason("published Qwen3-235B 128K GB200 layout TP4 CP4 EP32 PP4 VPP12: on NVL72, TP4 "
                             "stands in for part of CP (CP4 instead of seq/4096 = 32)", SKILL),
            "pipeline_model_parallel_layout": Reason("94 layers over PP4·VPP12 = 48 chunks of 2 (embedding and loss "
                                                     "each take one slot)", "megatron-core pipeline layout grammar"),
            "precision": Reason(f"{precision} (BF16 published; MXFP8 selectable with precision='mxfp8')", SKILL),
            "dispatcher": Reason("flex + HybridEP: NVL72 GB200, EP32 inside one NVLink domain", SKILL),
            "recompute": Reason("selective moe_act + norm (layernorm), the published set", SKILL),
            "cuda_graphs": Reason("TE CUDA graphs on attn, moe_router, moe_preprocess: shapes are static "
                                  "(fixed seq_length and MBS, no packed sequences)", SKILL),
            "global_batch_size": gbs_reason,
            "sequence_parallel": Reason("TP=4 with EP>1 needs sequence parallel", "megatron-core TransformerConfig"),
        },
    )


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


def _qwen3_next_gb200(seq_length: int, cp: int, name: str, num_gpus: int = 32) -> Plan:
    model = get_model("qwen3_next")
    layout = ParallelLayout(world=num_gpus, tp=1, pp=2, vpp=4, cp=cp, ep=16, etp=1)
    gbs, gbs_reason = _batch(seq_length, TOKENS_PER_STEP // 2, layout.dp, layout.pp)
    modules, why = _QWEN3_NEXT_RECOMPUTE[seq_length]
    return Plan(
        name=name, model="qwen3_next", hardware="gb200", seq_length=seq_length, layout=layout,
        pipeline_model_parallel_layout=build_pipeline_layout(model.num_layers, layout.num_pipeline_stages, model.mtp_num_layers),
        micro_batch_size=1, global_batch_size=gbs, precision="bf16",
        moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
        recompute_granularity="selective", recompute_modules=modules,
        sequence_parallel=False, mtp_num_layers=model.mtp_num_layers,
        reasons={
            "layout": Reason(f"published CP{cp} on 32 GB200; TP1 because gated DeltaNet needs its 16 linear key heads "
                             f"divisible by TP·CP; PP2 VPP4 and EP16 (EDP1) fill the 32 GPUs",
                             SKILL + "; megatron-core gated_delta_net rule; Bridge perf recipe qwen3_next_80b_a3b_pretrain_64gpu_gb200"),
            "pipeline_model_parallel_layout": Reason("48 layers + 1 MTP over PP2·VPP4 = 8 chunks, spare layers to the middle",
                                                     "megatron-core pipeline layout grammar"),
            "precision": Reason("BF16, as published", SKILL),
            "dispatcher": Reason("flex + HybridEP on NVL72 GB200", SKILL),
            "recompute": Reason(why, SKILL),
            "global_batch_size": gbs_reason,
        },
    )


NAMED_RECIPES: dict[str, NamedRecipe] = {
    r.name: r
    for r in (
        NamedRecipe("dsv3_128k_h100", "dsv3", 131072, "h100", 256, "DeepSeek-V3 at 128K on 256 H100",
                    lambda: _dsv3_h100(131072, 256, 32, "dsv3_128k_h100")),
        NamedRecipe("dsv3_256k_h100", "dsv3", 262144, "h100", 512, "DeepSeek-V3 at 256K on 512 H100",
                    lambda: _dsv3_h100(262144, 512, 64, "dsv3_256k_h100")),
        NamedRecipe("qwen3_235b_128k_gb200", "qwen3_235b", 131072, "gb200", 128, "Qwen3-235B-A22B at 128K on 128 GB200",
                    lambda precision="bf16": _qwen3_235b_gb200(precision=precision), options=("precision",)),
        NamedRecipe("qwen3_next_8k_gb200", "qwen3_next", 8192, "gb200", 32, "Qwen3-Next-80B-A3B at 8K on 32 GB200",
                    lambda: _qwen3_next_gb200(8192, 1, "qwen3_next_8k_gb200")),
        NamedRecipe("qwen3_next_32k_gb200", "qwen3_next", 32768, "gb200", 32, "Qwen3-Next-80B-A3B at 32K on 32 GB200",
                    lambda: _qwen3_next_gb200(32768, 4, "qwen3_next_32k_gb200")),
        NamedRecipe("qwen3_next_64k_gb200", "qwen3_next", 65536, "gb200", 32, "Qwen3-Next-80B-A3B at 64K on 32 GB200",
                    lambda: _qwen3_next_gb200(65536, 16, "qwen3_next_64k_gb200")),
    )
}


def recipe_plan(name: str, **options) -> Plan:
    """The checked Plan of a named recipe (no megatron import). ``options``: ``precision`` for qwen3_235b_128k_gb200.

    Raises:
        UnknownName: the name is not a named recipe.
        InfeasibleConfig: the plan breaks a rule (a bug in the recipe; tested not to happen).
    """
    recipe = NAMED_RECIPES.get(name)
    if recipe is None:
        close = difflib.get_close_matches(name, list(NAMED_RECIPES), n=1)
        raise UnknownName(f"unknown recipe '{name}'",
                          (f"did you mean '{close[0]}'? " if close else "") + f"named recipes: {', '.join(NAMED_RECIPES)}")
    unknown = sorted(set(options) - set(recipe.options))
    if unknown:
        raise UnknownName(f"recipe {name} has no option {', '.join(repr(o) for o in unknown)}",
                          f"its options: {', '.join(recipe.options)}" if recipe.options else "it takes no options")
    plan = recipe.build(**options)
    raise_for_errors(check_plan(plan), f"recipe {name}")
    return plan


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
    listed = ", ".join(f"--seq {r.seq_length} --gpus {r.num_gpus} --hardware {r.hardware}" for r in same_model)
    asked = (f"{spec.key} at seq_length {seq_length}" + (f" on {num_gpus}" if num_gpus else "")
             + (f" {hw}" if hw and num_gpus else f" on {hw}" if hw else ""))
    raise UnknownName(f"no named recipe for {asked}",
                      f"named recipes for {spec.key}: {listed or 'none'} (planning other model / length / GPU "
                      "combinations is not available yet)")
