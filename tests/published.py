"""Published measurements the cost model is tested against, each with its source (../shared/REFERENCE.md).

Memory rows: Megatron-Bridge repository skills/ folder, cards and SKILL.md files named per row, as summarised in
REFERENCE.md §10 (read 2026-11-30). "GB" = 1e9 bytes of torch peak allocated memory unless noted.
"""

from lcmoe_recipes.layout import ParallelLayout
from lcmoe_recipes.plan import Plan

GB, GIB = 1e9, 2**30


def _moonlight(recompute: tuple[str, ...]) -> Plan:
    # M1-M6: Moonlight-16B-A3B, 8 x H100, TP2 PP1 CP1 EP8 ETP1 (DP4), MBS1 GBS4, seq 4096, BF16,
    # precision-aware optimizer with bf16 grads and moments, alltoall, no CUDA graphs.
    return Plan(name="M", model="moonlight", hardware="h100", seq_length=4096,
                layout=ParallelLayout(world=8, tp=2, pp=1, cp=1, ep=8, etp=1), pipeline_model_parallel_layout=None,
                micro_batch_size=1, global_batch_size=4, precision="bf16", moe_token_dispatcher_type="alltoall",
                moe_flex_dispatcher_backend=None, recompute_granularity="selective" if recompute else None,
                recompute_modules=recompute, use_precision_aware_optimizer=True, grad_dtype="bf16",
                moment_dtype="bf16", sequence_parallel=True)


def _qwen3_30b(offload: float) -> Plan:
    # Q1-Q5: Qwen3-30B-A3B, 16 x H100 (2 nodes), TP2 PP2 EP4 (DP4), MBS1, GBS 8 (assumed), seq 4096, BF16 with
    # fp32 grads, alltoall, full recompute (the recipe of that time); optimizer CPU offload fraction 0..1
    # (offload requires the precision-aware optimizer: Adam moments in bf16).
    return Plan(name="Q", model="qwen3_30b", hardware="h100", seq_length=4096,
                layout=ParallelLayout(world=16, tp=2, pp=2, cp=1, ep=4, etp=1), pipeline_model_parallel_layout=None,
                micro_batch_size=1, global_batch_size=8, precision="bf16", moe_token_dispatcher_type="alltoall",
                moe_flex_dispatcher_backend=None, recompute_granularity="full", recompute_method="uniform",
                recompute_num_layers=1, optimizer_cpu_offload=offload > 0, optimizer_offload_fraction=offload,
                use_precision_aware_optimizer=True, grad_dtype="fp32", moment_dtype="bf16", sequence_parallel=True)


# Q6: Qwen3-30B-A3B, 16 x H100, TP1 PP1 CP1 EP16 ETP1 (DP16), MBS1 GBS1024, seq 4096, BF16 with bf16 grads,
# HybridEP (32 SMs), EP overlap, TE CUDA graphs moe_router + moe_preprocess, no recompute.
_Q6 = Plan(name="Q6", model="qwen3_30b", hardware="h100", seq_length=4096,
           layout=ParallelLayout(world=16, tp=1, pp=1, cp=1, ep=16, etp=1), pipeline_model_parallel_layout=None,
           micro_batch_size=1, global_batch_size=1024, precision="bf16", moe_token_dispatcher_type="flex",
           moe_flex_dispatcher_backend="hybridep", cuda_graph_impl="transformer_engine",
           cuda_graph_modules=("moe_router", "moe_preprocess"), grad_dtype="bf16", moe_ep_overlap=True)

# id: (plan, published bytes, source)
MEMORY_ROWS = {
    "M1": (_moonlight(()), 36.618 * GB, "activation-recompute SKILL.md + card.yaml: recompute []"),
    "M2": (_moonlight(("core_attn",)), 36.614 * GB, "activation-recompute SKILL.md: core_attn"),
    "M3": (_moonlight(("mla_up_proj",)), 35.902 * GB, "activation-recompute SKILL.md: mla_up_proj"),
    "M4": (_moonlight(("mla_up_proj", "mlp")), 35.917 * GB, "activation-recompute SKILL.md: mla_up_proj+mlp"),
    "M5": (_moonlight(("moe_act",)), 35.941 * GB, "activation-recompute SKILL.md: moe_act"),
    "M6": (_moonlight(("layernorm", "moe_act")), 35.949 * GB, "activation-recompute SKILL.md: layernorm+moe_act"),
    "Q1": (_qwen3_30b(0.0), 47.2 * GB, "cpu-offloading card.yaml: baseline"),
    "Q2": (_qwen3_30b(0.25), 43.4 * GB, "cpu-offloading card.yaml: 25% offload"),
    "Q3": (_qwen3_30b(0.5), 39.6 * GB, "cpu-offloading card.yaml: 50% offload"),
    "Q4": (_qwen3_30b(0.75), 35.6 * GB, "cpu-offloading card.yaml: 75% offload"),
    "Q5": (_qwen3_30b(1.0), 32.0 * GB, "cpu-offloading card.yaml: 100% offload"),
    "Q6": (_Q6, 62.166 * GIB, "moe-hardware-configs card: Qwen3-30B-A3B HybridEP final recipe, rank 0 (GiB)"),
}


def _named(name: str) -> Plan:
    from lcmoe_recipes import recipe_plan

    return recipe_plan(name)


# Reported, not asserted tightly: layouts unpublished (N1-N3: we assume our qwen3_next_*_gb200 layouts) or
# measurement method unknown (D1; "without optimization", possibly analytic).
def _report_rows():
    from lcmoe_recipes.plan import build_pipeline_layout

    d1 = Plan(name="D1", model="dsv3", hardware="gb200", seq_length=4096,
              layout=ParallelLayout(world=256, tp=1, pp=4, cp=1, ep=64, etp=1, vpp=4),
              pipeline_model_parallel_layout=build_pipeline_layout(61, 16, 1), micro_batch_size=1,
              global_batch_size=4096, precision="bf16", moe_token_dispatcher_type="flex",
              moe_flex_dispatcher_backend="hybridep", mtp_num_layers=1)
    return {
        "N1": (_named("qwen3_next_8k_gb200"), 150 * GB, "moe-long-context card.yaml: ~150 GB (rounded; TP/PP/EP unpublished)"),
        "N2": (_named("qwen3_next_32k_gb200"), 135 * GB, "moe-long-context card.yaml: ~135 GB"),
        "N3": (_named("qwen3_next_64k_gb200"), 160 * GB, "moe-long-context card.yaml: ~160 GB"),
        "D1": (d1, 199.5 * GB, "moe-optimization-workflow card: 199.5 GB/GPU unoptimized (method not stated)"),
    }


REPORT_ROWS = _report_rows()
