"""Published measurements the cost model is tested against, each with its source.

Memory rows: Megatron-Bridge repository skills/ folder, cards and SKILL.md files named per row (read 2026-11-30). "GB" = 1e9 bytes of torch peak allocated memory unless noted.
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


# Throughput rows: Megatron-Bridge skill nemo-mbridge-perf-moe-long-context card.yaml (rounded values, read
# 2026-11-30). Unpublished details are assumptions, stated per row.
def _dsv3_h100(seq: int, cp: int, gpus: int) -> Plan:
    # DSV3 on H100: TP1 EP32 PP8 VPP4 with the card's CP (DP = GPUs/(8·CP) matches the card's DP column); FP8
    # blockwise, DeepEP, recompute up_proj/norm/moe/mlp and optimizer CPU offload as the 128K/256K families.
    # Assumed: MBS1 and 2^23 tokens per step (GBS rounded to a multiple of DP·PP), as our recipes.
    from lcmoe_recipes import recipe_plan

    base = recipe_plan("dsv3_128k_h100")
    lay = ParallelLayout(world=gpus, tp=1, pp=8, vpp=4, cp=cp, ep=32, etp=1)
    gbs = max(1, 2**23 // seq)
    gbs = -(-gbs // (lay.dp * 8)) * lay.dp * 8
    return base.with_changes(name=f"dsv3_{seq // 1024}k", seq_length=seq, layout=lay, global_batch_size=gbs)


def _qwen3_235b_4k() -> Plan:
    # Qwen3-235B 4K on 128 GB200: TP1 EP32 PP4 VPP12 MBS1 GBS1024 (moe-hardware-configs card), BF16, HybridEP;
    # assumed: no recompute, no CUDA graphs in the time model.
    from lcmoe_recipes import recipe_plan
    from lcmoe_recipes.plan import build_pipeline_layout

    base = recipe_plan("qwen3_235b_128k_gb200")
    return base.with_changes(name="qwen3_235b_4k", seq_length=4096,
                             layout=ParallelLayout(world=128, tp=1, pp=4, vpp=12, cp=1, ep=32, etp=1),
                             pipeline_model_parallel_layout=build_pipeline_layout(94, 48), global_batch_size=1024,
                             recompute_granularity=None, recompute_modules=(), sequence_parallel=False)


def _qwen3_next(name: str) -> Plan:
    # Qwen3-Next on 32 GB200: only CP is published. Assumed: our recipe's layout (TP1 PP2 VPP4 EP16) with an even
    # pipeline split, 2^22 tokens per step, and megatron-bridge's Qwen3-Next library recipe's recompute,
    # layernorm + moe + moe_act, for all three lengths.
    from lcmoe_recipes import recipe_plan
    from lcmoe_recipes.plan import build_pipeline_layout

    plan = recipe_plan(name)
    return plan.with_changes(recompute_modules=("layernorm", "moe", "moe_act"),
                             pipeline_model_parallel_layout=build_pipeline_layout(48, 8, 1),
                             global_batch_size=max(2**22 // plan.seq_length, 2 * plan.layout.dp))


def _throughput_rows():
    from lcmoe_recipes import recipe_plan

    return {
        "T1": (_dsv3_h100(4096, 1, 256), 300.0, "DSV3 256xH100 4K CP1 DP32: ~300 TFLOP/s/GPU"),
        "T2": (_dsv3_h100(16384, 4, 256), 320.0, "DSV3 16K CP4 DP8: ~320"),
        "T3": (_dsv3_h100(32768, 8, 256), 320.0, "DSV3 32K CP8 DP4: ~320"),
        "T4": (_dsv3_h100(65536, 16, 256), 310.0, "DSV3 64K CP16 DP2: ~310"),
        "T5": (_dsv3_h100(131072, 32, 256), 300.0, "DSV3 128K CP32 DP1: ~300"),
        "T6": (_dsv3_h100(262144, 64, 512), 300.0, "DSV3 512xH100 256K CP64: ~300"),
        "T7": (_qwen3_next("qwen3_next_8k_gb200"), 270.0, "Qwen3-Next 32xGB200 8K CP1: ~270 (layout assumed)"),
        "T8": (_qwen3_next("qwen3_next_32k_gb200"), 230.0, "Qwen3-Next 32K CP4: ~230 (layout assumed)"),
        "T9": (_qwen3_next("qwen3_next_64k_gb200"), 100.0, "Qwen3-Next 64K CP16: ~100 (layout assumed)"),
        "T10": (_qwen3_235b_4k(), 700.0, "Qwen3-235B 128xGB200 4K TP1: ~700"),
        "T11": (recipe_plan("qwen3_235b_128k_gb200").with_changes(global_batch_size=2**23 // 131072), 1100.0,
                "Qwen3-235B 128K TP4 CP4: ~1100 (assumed 2^23 tokens per step)"),
    }


THROUGHPUT_ROWS = _throughput_rows()
