"""Named-recipe plans and the feasibility checks: pure Python, no torch / megatron."""

import dataclasses
import shlex
import subprocess
import sys

import pytest

from lcmoe_recipes import recipe_plan
from lcmoe_recipes.checks import check_plan
from lcmoe_recipes.core.layout import ParallelLayout
from lcmoe_recipes.core.pipeline import build_pipeline_layout
from lcmoe_recipes.errors import InfeasibleConfig, UnknownName
from lcmoe_recipes.planner.recipes import find_named_recipe

# The published table (Megatron-Bridge long-context skill, SKILL.md and card.yaml):
# name: (world, hardware, TP, CP, EP, PP, VPP, DP, EDP, precision, backend)
TABLE = {
    "dsv3_128k_h100": (256, "h100", 1, 32, 32, 8, 4, 1, 1, "fp8_blockwise", "deepep"),
    "dsv3_256k_h100": (512, "h100", 1, 64, 32, 8, 4, 1, 2, "fp8_blockwise", "deepep"),
    "qwen3_235b_128k_gb200": (128, "gb200", 4, 8, 32, 4, 12, 1, 1, "bf16", "hybridep"),
    "qwen3_next_8k_gb200": (32, "gb200", 1, 1, 16, 2, 4, 16, 1, "bf16", "hybridep"),
    "qwen3_next_32k_gb200": (32, "gb200", 1, 4, 16, 2, 4, 4, 1, "bf16", "hybridep"),
    "qwen3_next_64k_gb200": (32, "gb200", 1, 16, 16, 2, 4, 1, 1, "bf16", "hybridep"),
}


@pytest.mark.parametrize("name", list(TABLE))
def test_named_plan_layout(name):
    world, hw, tp, cp, ep, pp, vpp, dp, edp, precision, backend = TABLE[name]
    p = recipe_plan(name)
    lay = p.layout
    assert (lay.world, p.hardware, lay.tp, lay.cp, lay.ep, lay.pp, lay.vpp, lay.etp) == (world, hw, tp, cp, ep, pp, vpp, 1)
    assert (lay.dp, lay.edp) == (dp, edp)
    assert (p.precision, p.moe_token_dispatcher_type, p.moe_flex_dispatcher_backend) == (precision, "flex", backend)
    assert p.micro_batch_size == 1 and p.num_microbatches % pp == 0 and p.num_microbatches >= pp
    assert [f for f in check_plan(p) if f.severity == "error"] == []


def test_dsv3_knobs():
    for name, seq in (("dsv3_128k_h100", 131072), ("dsv3_256k_h100", 262144)):
        p = recipe_plan(name)
        assert p.seq_length == seq
        assert p.recompute_granularity == "selective"
        assert p.recompute_modules == ("mla_up_proj", "layernorm", "moe", "mlp")  # up_proj, norm, moe, mlp
        assert p.optimizer_cpu_offload and p.optimizer_offload_fraction == 1.0
        assert p.use_distributed_optimizer and p.use_precision_aware_optimizer
        assert p.mtp_num_layers == 1 and p.cuda_graph_impl == "none"
        assert p.pipeline_model_parallel_layout == "Et|(tt|)*6t|ttt|(tt|)*22mL"  # one layer off PP rank 7 (MTP + loss)


@pytest.mark.parametrize("name,old_free,new_free,step_s", [
    ("dsv3_128k_h100", 5.31, 7.37, 873.7),
    ("dsv3_256k_h100", 5.02, 7.08, 766.8),
])
def test_dsv3_pipeline_split_keeps_the_memory_error_band(name, old_free, new_free, step_s):
    """The DSV3 recipes move one decoder layer off PP rank 7 (MTP + output layer + MTP's embedding copy): the even split
    leaves less than MEMORY_ERROR_BAND of the limit free with FP32 gradients, the moved layer clears it at the same
    predicted step time, and full recompute (the next recompute rung) would cost > 20% more per step. The numbers
    are the ones the recipe's reason quotes (planner/recipes.py DSV3_H100_PIPELINE)."""
    from lcmoe_recipes.core.pipeline import stage_decoder_layers
    from lcmoe_recipes.core.plan import HBM_MARGIN
    from lcmoe_recipes.cost.bands import MEMORY_ERROR_BAND
    from lcmoe_recipes.cost.memory import estimate_memory
    from lcmoe_recipes.cost.step import estimate_step

    p = recipe_plan(name)
    stages = stage_decoder_layers(p)
    assert sum(stages) == 61 and len(stages) == 32
    per_rank = [sum(stages[r::8]) for r in range(8)]
    assert per_rank == [8, 8, 8, 8, 8, 8, 8, 5]  # rank 7 also holds the MTP layer and the loss
    limit = HBM_MARGIN * p.hardware_spec.hbm_bytes
    even = p.with_changes(pipeline_model_parallel_layout=build_pipeline_layout(61, 32, 1))
    free_even = (limit - estimate_memory(even).hbm_total) / 2**30
    free_new = (limit - estimate_memory(p).hbm_total) / 2**30
    assert free_even == pytest.approx(old_free, abs=0.01) and free_even < MEMORY_ERROR_BAND * limit / 2**30
    assert free_new == pytest.approx(new_free, abs=0.01) and free_new >= MEMORY_ERROR_BAND * limit / 2**30
    assert estimate_memory(even).pp_rank == 7 and estimate_memory(p).pp_rank == 0
    assert estimate_step(p).step_seconds == pytest.approx(step_s, abs=0.05)
    assert estimate_step(even).step_seconds == pytest.approx(step_s, abs=0.05)
    full = p.with_changes(recompute_granularity="full", recompute_modules=(), recompute_method="uniform",
                          recompute_num_layers=1)
    assert estimate_step(full).step_seconds > 1.2 * step_s
    assert not [f for f in check_plan(p) if f.rule == "memory/thin-headroom"]


def test_qwen3_235b_knobs():
    p = recipe_plan("qwen3_235b_128k_gb200")
    assert p.recompute_modules == ("moe_act",)  # megatron-core 0.19.2 runs no norm recompute here (transformer_layer.py)
    assert (p.cuda_graph_impl, p.cuda_graph_modules) == ("transformer_engine", ("attn", "moe_router", "moe_preprocess"))
    assert p.sequence_parallel and not p.optimizer_cpu_offload
    assert p.pipeline_model_parallel_layout == "Et|(tt|)*46tL"
    assert recipe_plan("qwen3_235b_128k_gb200", precision="mxfp8").precision == "mxfp8"


def test_qwen3_next_knobs():
    assert recipe_plan("qwen3_next_8k_gb200").recompute_modules == ("layernorm", "moe_act")
    for name, seq in (("qwen3_next_32k_gb200", 32768), ("qwen3_next_64k_gb200", 65536)):
        p = recipe_plan(name)
        assert p.seq_length == seq and p.recompute_modules == ("layernorm", "moe")
        # upstream's PP2·VPP4 layout (Bridge perf recipe qwen3_next_80b_a3b_pretrain_64gpu_gb200_bf16): the last
        # chunk carries one decoder layer beside MTP and the loss
        assert p.pipeline_model_parallel_layout == "Et*4|(t*7|)*5t*8|tmL"
        assert "upstream's layout for PP2·VPP4" in p.reasons["pipeline_model_parallel_layout"].why


@pytest.mark.parametrize("layers,stages,mtp,expected", [
    (61, 32, 1, "Et|(tt|)*30mL"),        # the Bridge DSV3 H100 perf recipe's split
    (94, 48, 0, "Et|(tt|)*46tL"),
    (48, 8, 1, "Et*5|(t*7|)*3(t*6|)*3t*4mL"),
    (61, 8, 1, "Et*7|(t*8|)*6t*6mL"),
    (32, 1, 0, None),
])
def test_pipeline_layout_strings(layers, stages, mtp, expected):
    assert build_pipeline_layout(layers, stages, mtp) == expected


def test_pipeline_layout_too_many_stages():
    with pytest.raises(InfeasibleConfig, match="cannot fill 64 pipeline stages"):
        build_pipeline_layout(20, 64, 0)


def _bad(name, **changes):
    plan = recipe_plan(name).with_changes(**changes)
    return {f.rule: f for f in check_plan(plan)}


def test_check_rank_folding():
    f = _bad("qwen3_235b_128k_gb200", layout=ParallelLayout(world=128, tp=4, pp=4, cp=48, ep=32, vpp=12))
    assert "CP=48" in f["rank-folding/dense"].message and f["rank-folding/dense"].fix == "use CP=8"
    # CP=4 also folds into 128 GPUs with TP4 PP4, but is over HBM by the memory model (172 of 165 GiB): not named
    assert f["divisibility/seq-cp"].fix == "use CP=8"
    # PP2 EP8 on 8 GPUs: EP is folded into the dense ranks, but ETP·EP·PP = 16 > 8
    f = _bad("qwen3_next_8k_gb200", layout=ParallelLayout(world=8, tp=1, pp=2, cp=1, ep=8, vpp=4),
             global_batch_size=64)
    assert f["rank-folding/expert"].message == "ETP=1 · EP=8 · PP=2 = 16 does not divide the world size 8"
    assert f["rank-folding/expert"].fix == "use EP=2 or 4"


def test_check_divisibility():
    f = _bad("qwen3_235b_128k_gb200", layout=ParallelLayout(world=96, tp=3, pp=4, cp=4, ep=8, vpp=12))
    assert "64 attention heads do not split over TP=3" in f["divisibility/heads-tp"].message
    f = _bad("qwen3_next_64k_gb200", layout=ParallelLayout(world=64, tp=2, pp=2, cp=16, ep=16, vpp=4))
    assert f["divisibility/linear-heads-tp-cp"].message.endswith("TP·CP = 2·16 = 32")
    assert f["divisibility/linear-heads-tp-cp"].fix == "use CP=4 or 8 at TP=2"
    f = _bad("qwen3_next_8k_gb200", layout=ParallelLayout(world=32, tp=1, pp=2, cp=1, ep=3, vpp=4))
    assert "512 experts do not split over EP=3" in f["divisibility/experts-ep"].message
    f = _bad("qwen3_235b_128k_gb200", seq_length=131076)
    assert f["divisibility/seq-cp"].message.startswith("CP=8 does not divide seq_length 131076 into 2·CP chunks")


def test_check_batch():
    # Qwen3-Next 8K at DP16: GBS must be a multiple of MBS·DP = 16; both neighbours are offered
    f = _bad("qwen3_next_8k_gb200", global_batch_size=500)
    assert f["batch/gbs-mbs-dp"].fix == "use GBS=480 or 512"
    # Qwen3-235B at DP1, PP4 with VPP12: microbatches must be a multiple of PP=4
    f = _bad("qwen3_235b_128k_gb200", global_batch_size=63)
    assert f["batch/microbatches-vpp"].fix == "use GBS=60 or 64"
    f = _bad("qwen3_235b_128k_gb200", global_batch_size=6)  # 6 microbatches: not a multiple of PP=4
    assert f["batch/microbatches-vpp"].fix == "use GBS=4 or 8"


def test_check_dispatcher_recompute_offload_graphs():
    f = _bad("qwen3_235b_128k_gb200", moe_flex_dispatcher_backend="deepep")
    assert f["dispatcher/deepep-hardware"].severity == "error"
    f = _bad("qwen3_235b_128k_gb200", recompute_modules=("mla_up_proj", "norm"))
    assert "['norm']" in f["recompute/module-name"].message and "norm -> layernorm" in f["recompute/module-name"].fix
    assert f["recompute/mla-up-proj"].severity == "error"
    f = _bad("qwen3_235b_128k_gb200", recompute_modules=("core_attn",))
    assert f["recompute/core-attn-long-context"].severity == "warning"
    f = _bad("dsv3_128k_h100", use_precision_aware_optimizer=False)
    assert f["offload/precision-aware"].severity == "error"
    f = _bad("qwen3_235b_128k_gb200", recompute_modules=("moe", "layernorm"))
    assert f["cuda-graphs/moe-recompute"].severity == "error"
    f = _bad("dsv3_128k_h100", precision="mxfp8")
    assert "MXFP8 needs Blackwell" in f["precision/hardware"].message


def test_find_named_recipe():
    assert find_named_recipe("qwen3_235b", 131072).name == "qwen3_235b_128k_gb200"
    assert find_named_recipe("deepseek-v3", 262144, 512, "h100").name == "dsv3_256k_h100"
    with pytest.raises(UnknownName) as err:
        find_named_recipe("dsv3", 131072, 512)
    assert "no named recipe for dsv3 at seq_length 131072 on 512" in err.value.message
    assert "seq_length=131072 num_gpus=256 hardware=h100" in err.value.fix  # fields; the CLI writes flags


def test_planning_imports_no_torch_or_megatron():
    code = ("import sys, lcmoe_recipes, lcmoe_recipes.launch\n"
            "from lcmoe_recipes import recipe_plan, NAMED_RECIPES, check_plan\n"
            "[check_plan(recipe_plan(n)) for n in NAMED_RECIPES]\n"
            "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', 'transformers')]\n"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_check_placement():
    f = _bad("qwen3_next_8k_gb200", layout=ParallelLayout(world=256, tp=1, pp=2, cp=1, ep=128, vpp=4),
             global_batch_size=512)
    assert f["placement/hybridep-ep-domain"].message.startswith(
        "HybridEP group of ETP·EP = 128 ranks spans 2 NVLink blocks of 64 GPUs on gb200")
    f = _bad("qwen3_235b_128k_gb200", hardware="h100", moe_flex_dispatcher_backend="deepep",
             layout=ParallelLayout(world=256, tp=16, pp=4, cp=4, ep=32, vpp=12))
    assert f["placement/tp-off-nvlink"].fix == "use TP <= 8"
    assert "placement/hybridep-ep-domain" not in _bad("qwen3_235b_128k_gb200")  # EP32 inside a 64-GPU block


def test_check_gdn_cp_version_etp_and_dynamic_graphs():
    plan = recipe_plan("qwen3_next_32k_gb200")
    found = {f.rule: f for f in check_plan(plan, megatron_core="0.17.0")}
    assert "rejects context parallelism for gated DeltaNet" in found["gdn/cp-support"].message
    assert "gdn/cp-support" not in {f.rule for f in check_plan(plan, megatron_core="0.18.0")}
    assert "gdn/cp-support" not in {f.rule for f in check_plan(recipe_plan("qwen3_next_8k_gb200"), megatron_core="0.16.0")}
    f = _bad("qwen3_235b_128k_gb200", etp_unset=True)
    assert "would use ETP=TP=4" in f["parallel/etp-unset"].message
    f = _bad("qwen3_235b_128k_gb200", variable_length=True)
    assert f["cuda-graphs/dynamic-shapes"].severity == "error"
    assert "cuda-graphs/dynamic-shapes" not in _bad("dsv3_128k_h100", variable_length=True)  # no graphs there


def test_check_remaining_kinds():
    f = _bad("qwen3_235b_128k_gb200", layout=ParallelLayout(world=96, tp=3, pp=4, cp=4, ep=8, vpp=12),
             global_batch_size=64)
    assert f["divisibility/query-groups-tp"].message == "4 query groups are neither a multiple nor a divisor of TP=3"
    f = _bad("qwen3_235b_128k_gb200", seq_length=131080)  # 131080/8 = 16385 does not split over TP=4
    assert f["divisibility/seq-tp-sp"].message.startswith("with sequence parallel, seq_length/CP = 131080/8")
    assert f["divisibility/seq-tp-sp"].fix == "use a seq_length divisible by CP·TP = 32, or TP=1"
    # CP=6 does not divide 131,072 at all: divisibility/seq-cp names the CPs; lowering TP (a fresh user's fix) cannot
    f = _bad("qwen3_235b_128k_gb200", layout=dataclasses.replace(recipe_plan("qwen3_235b_128k_gb200").layout, cp=6))
    assert "divisibility/seq-cp" in f and "divisibility/seq-tp-sp" not in f
    f = _bad("qwen3_235b_128k_gb200", pipeline_model_parallel_layout=None)  # 94 layers over PP4 x VPP12, no layout
    assert f["pipeline/even-split"].message == ("94 layers do not split evenly over PP=4·VPP=12 (23.5 per PP rank, "
                                                "1.96 per virtual stage)")
    # the fix names the layout string itself, quoted for Hydra and the shell (=null re-derives it only under launch)
    fix = f["pipeline/even-split"].fix
    assert fix.startswith("""set "model.pipeline_model_parallel_layout='Et|(tt|)*46tL'" (the even split over PP·VPP = 48""")
    from lcmoe_recipes.emit.overrides import _parse

    (override,) = _parse([shlex.split(fix)[1]])
    assert not [e for e in check_plan(recipe_plan("qwen3_235b_128k_gb200").with_changes(
        pipeline_model_parallel_layout=override.value())) if e.severity == "error"]
    f = _bad("dsv3_128k_h100", use_distributed_optimizer=False)
    assert f["offload/distributed-optimizer"].fix == "set use_distributed_optimizer=True"
    f = _bad("qwen3_next_8k_gb200", layout=ParallelLayout(world=32, tp=1, pp=1, cp=1, ep=16, vpp=4))
    assert f["pipeline/vpp-needs-pp"].fix == ("interleaving needs PP > 1: set model.virtual_pipeline_model_parallel_size="
                                              "null, or PP >= 2")  # the Hydra spelling the launch command takes
    # a layout string of 48 stages under PP2 x VPP12: the PPs that keep it exclude PP=1 (VPP needs PP > 1) and PP=8
    # (TP4 x PP8 x CP8 = 256 does not fold into 128 GPUs)
    plan = recipe_plan("qwen3_235b_128k_gb200")
    f = _bad("qwen3_235b_128k_gb200", layout=dataclasses.replace(plan.layout, pp=2))
    assert f["pipeline/layout-stages"].fix.startswith("keep PP·VPP = 48 (PP in [2, 4], VPP = 48/PP), or set")
    # a string with a layer missing and the wrong stage count: both said at once, and only the fix that mends both
    f = _bad("qwen3_235b_128k_gb200", pipeline_model_parallel_layout="Et|(tt|)*45tL")
    assert f["pipeline/layout-layers"].message.endswith("places 92 decoder and 0 MTP layers; the model has 94 and 0")
    assert f["pipeline/layout-stages"].fix == ("""set "model.pipeline_model_parallel_layout='Et|(tt|)*46tL'" (the even """
                                               "split over PP·VPP = 48 chunks that launch derives)")
