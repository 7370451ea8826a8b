"""TrainingRequest, the rules, the planner, its CLI, agreement with the named recipes, and random requests."""

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from lcmoe_recipes import NAMED_RECIPES, recipe_plan
from lcmoe_recipes.catalog import get_hardware, get_model
from lcmoe_recipes.checks import check_plan
from lcmoe_recipes.cli.plan import main
from lcmoe_recipes.core.layout import ParallelLayout
from lcmoe_recipes.core.plan import HBM_MARGIN
from lcmoe_recipes.core.request import TrainingRequest
from lcmoe_recipes.cost import estimate_memory, estimate_step
from lcmoe_recipes.cost.bands import MEMORY_ERROR_BAND
from lcmoe_recipes.errors import InfeasibleConfig, LcmoeError
from lcmoe_recipes.planner.search import search_layouts
from lcmoe_recipes.rules.batch import choose_batch, tokens_per_step
from lcmoe_recipes.rules.cp import cp_first_guess
from lcmoe_recipes.rules.dispatcher import choose_dispatcher
from lcmoe_recipes.rules.precision import choose_precision
from lcmoe_recipes.rules.recompute import recompute_ladder

ROOT = Path(__file__).resolve().parent.parent


def test_request_validation():
    r = TrainingRequest(model="deepseek-v3", seq_length=131072, hardware="H100", num_gpus=256)
    assert (r.model, r.hardware) == ("dsv3", "h100")
    with pytest.raises(ValidationError, match="unknown model 'gpt5'"):
        TrainingRequest(model="gpt5", seq_length=4096, hardware="h100", num_gpus=8)
    with pytest.raises(ValidationError, match="valid: bf16, fp8_blockwise, fp8_cs, mxfp8"):
        TrainingRequest(model="dsv3", seq_length=4096, hardware="h100", num_gpus=8, precision="fp6")
    with pytest.raises(ValidationError, match=r"fixed TP·PP·CP = 24 does not divide the 64 GPUs \(`num_gpus`\); use cp=2 or cp=4"):
        TrainingRequest(model="dsv3", seq_length=4096, hardware="h100", num_gpus=64, tp=2, pp=4, cp=3)
    with pytest.raises(ValidationError, match="greater than 0"):
        TrainingRequest(model="dsv3", seq_length=0, hardware="h100", num_gpus=8)


def test_rules():
    assert cp_first_guess(131072)[0] == 32 and cp_first_guess(262144)[0] == 64 and cp_first_guess(4096)[0] == 1
    # an extension keeps the base model's training precision (DeepSeek-V3: FP8 blockwise, technical report §3.3)
    assert choose_precision(get_model("dsv3"), get_hardware("h100"), None)[0] == "fp8_blockwise"
    assert choose_precision(get_model("dsv3"), get_hardware("gb200"), None)[0] == "mxfp8"
    precision, why = choose_precision(get_model("qwen3_235b"), get_hardware("h100"), None)
    assert precision == "bf16" and "publishes no low-precision training" in why.why
    lay = ParallelLayout(world=128, tp=4, pp=4, cp=4, ep=32, vpp=12)
    assert choose_dispatcher(get_hardware("gb200"), lay, None)[0] == ("flex", "hybridep")
    assert choose_dispatcher(get_hardware("h100"), lay, None)[0] == ("flex", "deepep")
    wide = ParallelLayout(world=256, tp=1, pp=2, cp=1, ep=128, vpp=4)
    (kind, why) = choose_dispatcher(get_hardware("gb200"), wide, None)
    assert kind == ("alltoall", None) and "leaves the 64-GPU NVLink block" in why.why
    gbs, why = choose_batch(131072, lay, 1, 2**23)
    assert gbs == 64 and "32 microbatches of MBS 1 per DP rank (DP=2, PP=4, VPP=12)" in why.why
    # never fewer microbatches than pipeline stages: 2^23 tokens at 1M would be 8 samples on DP=2, PP=8
    starved = ParallelLayout(world=128, tp=1, pp=8, cp=8, ep=16)
    gbs, why = choose_batch(2**20, starved, 1, 2**23)
    assert gbs == 16 and "raised from 8 so that each of the PP=8 stages has a microbatch in flight" in why.why
    assert tokens_per_step(get_model("dsv3"), 671e9)[0] == 15360 * 4096  # DeepSeek-V3 §4.2/§4.3: ~63M tokens
    ladder = recompute_ladder(get_model("dsv3"))
    assert ladder[0] == (None, ()) and ladder[-1] == ("full", ())
    assert ("selective", ("layernorm", "moe_act", "mla_up_proj", "mlp")) in ladder
    assert all("mla_up_proj" not in m for _, m in recompute_ladder(get_model("qwen3_235b")))
    assert all("core_attn" not in m for _, m in ladder)


@pytest.mark.parametrize("name", list(NAMED_RECIPES))
def test_planner_agrees_with_named_recipes(name):
    """The planner reproduces the published layout, or finds one it predicts at least as fast, or one the step model
    cannot tell from it (within the error band) -- the published runs' own knobs (pipeline layout, recompute) are
    not all in the search space, and the winner of a tie keeps the memory band free (rule 'headroom')."""
    named = recipe_plan(name)
    request = TrainingRequest(model=named.model, seq_length=named.seq_length, hardware=named.hardware,
                              num_gpus=named.layout.world)
    result = search_layouts(request)
    best = result.best
    named_step = estimate_step(named).step_seconds
    print(f"{name}: published {named.layout.describe()} {named_step:.1f} s; planner {best.plan.layout.describe()} "
          f"{best.step.step_seconds:.1f} s")
    assert best.memory.hbm_total <= HBM_MARGIN * get_hardware(named.hardware).hbm_bytes
    if best.plan.layout == named.layout or best.step.step_seconds <= named_step * 1.0001:
        return
    assert best.step.step_seconds <= named_step * (1 + result.band)
    if result.rule != "fastest":  # a faster tie was passed over for memory headroom the winner keeps
        assert result.limit - best.memory.hbm_total >= MEMORY_ERROR_BAND * result.limit or result.rule == "most headroom"


def test_tie_rule_and_reasons():
    result = search_layouts(TrainingRequest(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=64), top=200)
    best, fastest = result.best, result.fastest
    assert best.step.step_seconds <= fastest.step.step_seconds * (1 + result.band)
    safe = MEMORY_ERROR_BAND * result.limit
    if result.rule == "fastest":
        assert best.step.step_seconds == fastest.step.step_seconds
    else:  # every faster tie leaves less than the band free, or keeps it with DP1 (the winner has DP > 1)
        assert all(result.limit - c.memory.hbm_total < safe or (c.plan.layout.dp == 1 < best.plan.layout.dp)
                   for c in result.ranked if c.step.step_seconds < best.step.step_seconds)
    assert result.rule == "headroom" and best.plan.layout.dp >= 2
    assert f"rule '{result.rule}'" in best.plan.reasons["layout"].why
    assert set(best.plan.reasons) >= {"layout", "cp", "dispatcher", "precision", "global_batch_size", "recompute",
                                      "optimizer_cpu_offload", "cuda_graphs"}
    assert best.plan.name == "qwen3_235b_64k_64xgb200"


def test_infeasible_request_names_the_constraint():
    with pytest.raises(InfeasibleConfig) as err:
        search_layouts(TrainingRequest(model="dsv3", seq_length=131072, hardware="h100", num_gpus=8))
    assert "195 candidates considered, all rejected by memory/exceeds-hbm" in err.value.message
    assert err.value.fix.startswith("use 128 GPUs (the smallest count above 8 tried at which a layout fits; of the counts "
                                    "tried, 16, 24, 32, 40 and 64 do not), a shorter seq_length")  # nothing below one node
    with pytest.raises(InfeasibleConfig) as err:  # a fresh user's 72 H100 were told 1152: powers of two are tried
        search_layouts(TrainingRequest(model="dsv3", seq_length=131072, hardware="h100", num_gpus=72))
    assert err.value.fix.startswith("use 128 GPUs (the smallest count above 72 tried at which a layout fits; of the counts "
                                    "tried, 80, 88, 96, 104 and 112 do not), ")
    with pytest.raises(InfeasibleConfig) as err:  # 60 GPUs fold 128 experts into EP 4 at most; 64 fold EP 64
        search_layouts(TrainingRequest(model="qwen3_235b", seq_length=131072, hardware="gb200", num_gpus=60))
    assert err.value.fix.startswith("use 48 GPUs (fewer, but a layout fits there: the layouts 60 GPUs fold into do "
                                    "not) or 64 GPUs (the smallest count above 60 tried at which a layout fits), ")
    with pytest.raises(InfeasibleConfig) as err:  # a fresh user's case: 100 = 25 nodes of 4 folds TP x CP x PP <= 4
        search_layouts(TrainingRequest(model="qwen3_235b", seq_length=131072, hardware="gb200", num_gpus=100))
    assert "all rejected by memory/exceeds-hbm" in err.value.message
    assert err.value.fix.startswith("use 96 GPUs (fewer, but a layout fits there: the layouts 100 GPUs fold into do "
                                    "not) or 112 GPUs (the smallest count above 100 tried at which a layout fits; "
                                    "of the counts tried, 104 and 108 do not), a shorter seq_length, or a GPU with more HBM")
    search_layouts(TrainingRequest(model="qwen3_235b", seq_length=131072, hardware="gb200", num_gpus=96))  # it fits
    with pytest.raises(InfeasibleConfig) as err:  # no layout can be enumerated: the forced one is explained
        search_layouts(TrainingRequest(model="qwen3_next", seq_length=65536, hardware="gb200", num_gpus=32, tp=2, cp=16))
    assert "gated DeltaNet linear heads" in err.value.message and "(divisibility/linear-heads-tp-cp)" in err.value.message
    # a dispatcher wish the hardware lacks is refused with the request, naming the request's own values (it was
    # refused after 1,170 candidates, with the fix in megatron's field names)
    with pytest.raises(ValidationError, match=r"dispatcher 'deepep' does not run on GB200 NVL72; use "
                                              r"dispatcher=hybridep or dispatcher=alltoall"):
        TrainingRequest(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=64, dispatcher="deepep")
    with pytest.raises(ValidationError, match=r"100 GPUs do not fill whole h100 nodes of 8 \(nor divide one\); use 96 or 104"):
        TrainingRequest(model="dsv3", seq_length=4096, hardware="h100", num_gpus=100)


def test_plan_cli(capsys, tmp_path):
    csv_path = tmp_path / "t.csv"
    assert main(["qwen3_next", "--seq", "32768", "--gpus", "32", "--hardware", "gb200", "--top", "3",
                 "--csv", str(csv_path)]) == 0
    out = capsys.readouterr().out
    assert "winner: TP" in out and "rank  TP  CP  EP  PP" in out
    # the lowered limit of a gated DeltaNet model says why (a fresh user asked where 128.4 of 173 GiB came from)
    assert re.search(r"of the 128\.4 GiB limit \(74% of HBM: the memory model predicts 0\.45-0\.78 of gated DeltaNet "
                     r"models' published peaks, so the search plans them as if their memory were 1\.28x", out)
    assert csv_path.read_text().splitlines()[0].startswith("rank,TP,CP,EP,PP,VPP,DP,EDP,recompute,offload")
    assert len(csv_path.read_text().splitlines()) == 4
    # the CSV says what the tie-break made of each row (rank 1 is the winner, not always the fastest): the README's
    # plan example, where the fastest tie leaves less than the memory band free
    assert main(["qwen3_235b", "--seq", "65536", "--gpus", "64", "--hardware", "gb200", "--csv", str(csv_path)]) == 0
    rows = [line.split(",") for line in csv_path.read_text().splitlines()]
    assert rows[0][-1] == "tie-break" and rows[1][-1] == "winner (rule headroom)"
    assert rows[2][-1] == "passed over (headroom)" and float(rows[2][-4]) < float(rows[1][-4])  # faster, passed over
    assert {r[-1] for r in rows[3:]} == {"tie"}
    assert main(["qwen3_next", "--seq", "32768", "--gpus", "32", "--hardware", "gb201"]) == 2
    assert "did you mean 'gb200'?" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # argparse: --gpus and --hardware are required
        main(["qwen3_next", "--seq", "32768"])
    assert exit_.value.code == 2


def test_planning_is_light_and_module_runs():
    out = subprocess.run([sys.executable, "-m", "lcmoe_recipes.plan", "dsv3", "--seq", "32768", "--gpus", "128",
                          "--hardware", "h100", "--top", "2"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "winner:" in out.stdout and "RuntimeWarning" not in out.stderr
    code = ("import sys; from lcmoe_recipes.planner.search import search_layouts; from lcmoe_recipes.core.request import TrainingRequest;"
            "search_layouts(TrainingRequest(model='dsv3', seq_length=32768, hardware='h100', num_gpus=128));"
            "print(any(m.split('.')[0] in ('torch', 'megatron') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_decision_table_is_current():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "decision_table.py"), "--check"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def _random_requests(n, seed=20261130):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        model = rng.choice(["dsv3", "qwen3_235b", "qwen3_next", "qwen3_30b", "moonlight"])
        hardware = rng.choice(["h100", "h200", "b200", "gb200", "gb300"])
        per = get_hardware(hardware).gpus_per_node
        out.append(TrainingRequest(model=model, hardware=hardware, seq_length=rng.choice([4096, 8192, 32768, 65536, 131072]),
                                   num_gpus=per * rng.choice([2, 4, 8, 16, 32, 64])))
    return out


@pytest.mark.slow
def test_random_requests_emit_valid_configs_or_clear_errors():
    """Every planned ConfigContainer passes our checks and megatron-bridge's validation for its world size;
    every infeasible request is an InfeasibleConfig naming the constraint, never a traceback."""
    from lcmoe_recipes.emit import config_from_plan

    built = refused = 0
    for request in _random_requests(24):
        try:
            best = search_layouts(request).best
        except InfeasibleConfig as exc:
            assert re.search(r"(all|most) rejected by", exc.message) and exc.fix
            refused += 1
            continue
        assert not [f for f in check_plan(best.plan) if f.severity == "error"]
        assert estimate_memory(best.plan).hbm_total <= HBM_MARGIN * get_hardware(request.hardware).hbm_bytes
        cfg = config_from_plan(best.plan, quiet=True)  # runs our checks + upstream validate() for the target
        assert cfg.model.seq_length == cfg.dataset.seq_length == request.seq_length
        built += 1
    print(f"{built} built, {refused} refused")
    assert built >= 8 and refused >= 1


@pytest.mark.slow
def test_launch_plans_unnamed_requests(capsys, tmp_path):
    from lcmoe_recipes.cli.launch import main as launch

    import os
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code = launch(["qwen3_235b", "--seq", "65536", "--gpus", "64", "--hardware", "gb200", "--dry-run"])
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert code == 0 and "qwen3_235b_64k_64xgb200: valid for 64 x gb200" in out
    assert (tmp_path / "out" / "qwen3_235b_64k_64xgb200.yaml").is_file()
    with pytest.raises(LcmoeError):
        from lcmoe_recipes import TrainingRequest
        from lcmoe_recipes import resolve
        resolve(TrainingRequest(model="qwen3_235b", seq_length=65536))


def test_no_offload_where_the_base_optimizer_is_not_adam():
    """Kimi-K2's megatron-bridge recipes run dist_muon, and megatron-bridge refuses the precision-aware optimizer CPU
    offload needs with it ('--use-precision-aware-optimizer only supported with adam'): the planner never offers
    offload for it, says why, and the winner validates."""
    from lcmoe_recipes.emit import config_from_plan

    with pytest.raises(InfeasibleConfig) as err:  # fits only with offload at 256 H100
        search_layouts(TrainingRequest(model="kimi_k2", seq_length=65536, hardware="h100", num_gpus=256))
    assert err.value.fix.startswith("use 512 GPUs")
    best = search_layouts(TrainingRequest(model="kimi_k2", seq_length=65536, hardware="h100", num_gpus=512), top=1).best.plan
    assert not best.optimizer_cpu_offload and not best.use_precision_aware_optimizer
    assert "optimizer dist_muon cannot run on the precision-aware" in best.reasons["optimizer_cpu_offload"].why
    assert config_from_plan(best, quiet=True).optimizer.optimizer == "dist_muon"  # megatron-bridge validates it


def test_a_length_that_is_not_whole_k_keeps_its_number_in_the_name():
    """A fresh user asked for --seq 100000 and got a plan named '..._97k_...': the name rounded the length."""
    from lcmoe_recipes.core.request import seq_tag

    assert (seq_tag(131072), seq_tag(100000), seq_tag(4096)) == ("128k", "100000", "4k")
    result = search_layouts(TrainingRequest(model="qwen3_235b", seq_length=100000, hardware="gb200", num_gpus=128))
    assert result.best.plan.name == "qwen3_235b_100000_128xgb200" and result.best.plan.seq_length == 100000


def test_plot_labels_tell_the_mbs_apart():
    """--plot showed one layout at MBS 1 and 2 under the same label (a fresh user's two bars 'TP4 CP8 EP64 PP1 DP2')."""
    from lcmoe_recipes.report.plots import _label

    result = search_layouts(TrainingRequest(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=64), top=8)
    labels = [_label(c.plan) for c in result.ranked]
    assert len(set(labels)) == len(labels) and "DP2 MBS1\nno recompute" in labels[0]
    # a fresh user's memory bars stopped at the allocator's peak: each bar is the HBM use the table and the fit use
    from lcmoe_recipes.report.plots import memory_parts

    for c in result.ranked:
        parts = memory_parts(c.memory)
        assert parts["nccl"] > 0 and sum(parts.values()) == pytest.approx(c.memory.hbm_total / 2**30)


def test_the_offload_reason_cites_the_skill_only_for_deepseek_v3():
    """The skill's 'all DSV3 long-context configs require optimizer CPU offload' was cited for every model's offload
    (a fresh user's Qwen3-235B plan): it is DeepSeek-V3's source only; the others cite the offload card and the fit."""
    from lcmoe_recipes.rules.offload import offload_reason

    assert "all DSV3 long-context configs" in offload_reason(0.5, None, "dsv3").source
    other = offload_reason(0.5, None, "qwen3_235b").source
    assert "DSV3" not in other and other.startswith("Megatron-Bridge cpu-offloading card (fractions 0.25-1.0)")
    best = search_layouts(TrainingRequest(model="dsv3", seq_length=131072, hardware="h100", num_gpus=128), top=1).best
    assert best.plan.optimizer_cpu_offload and "all DSV3" in best.plan.reasons["optimizer_cpu_offload"].source
