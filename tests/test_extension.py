"""Context extension: positions (RoPE / YaRN / ABF), token budget and schedule, weights, phases, retargeting a user's
config, hierarchical CP, and the checks that catch what would train wrong.

Published numbers used here: DeepSeek-V3 technical report (arXiv 2412.19437) §4.2-4.3 (YaRN factor 40 over 4,096;
batch 15,360 x 4K in pre-training, 1,920 x 32K and 480 x 128K in the two 1,000-step extension phases, LR 7.3e-6);
Qwen3-235B-A22B model card (32,768 native, YaRN factor 4.0 over 32,768 for 131,072).
"""

import json
import math
import random

import pytest

from lcmoe_recipes import NAMED_RECIPES, emit, recipe_plan
from lcmoe_recipes.catalog import get_model
from lcmoe_recipes.checks import check_plan
from lcmoe_recipes.errors import LcmoeError
from lcmoe_recipes.rules.positions import choose_positions, coverage, rotary_dim
from lcmoe_recipes.rules.schedule import choose_schedule


# --- positions ------------------------------------------------------------------------------------------------

def test_yarn_covers_the_named_recipes_that_need_it():
    dsv3_256k = recipe_plan("dsv3_256k_h100").positions  # 262,144 / 4,096 = 64 (trained with 40: 163,840)
    assert (dsv3_256k.scaling, dsv3_256k.factor, dsv3_256k.original_max_position_embeddings) == ("yarn", 64.0, 4096)
    assert (dsv3_256k.beta_fast, dsv3_256k.beta_slow, dsv3_256k.mscale, dsv3_256k.mscale_all_dim) == (32, 1, 1.0, 1.0)
    qwen = recipe_plan("qwen3_235b_128k_gb200").positions  # model card: factor 4 over 32,768
    assert (qwen.scaling, qwen.factor, qwen.original_max_position_embeddings) == ("yarn", 4.0, 32768)
    assert (qwen.beta_fast, qwen.beta_slow, qwen.mscale, qwen.mscale_all_dim) == (32.0, 1.0, 1.0, 0.0)
    assert recipe_plan("dsv3_128k_h100").positions.factor == 40  # 163,840 already covers 131,072: kept


@pytest.mark.parametrize("name", list(NAMED_RECIPES))
def test_every_named_recipe_covers_its_seq_length(name):
    plan = recipe_plan(name)
    assert coverage(plan.model_spec, plan.positions) >= plan.seq_length
    assert not [f for f in check_plan(plan) if f.rule.startswith("positions/")]


def test_planned_recipes_cover_their_seq_length():
    from lcmoe_recipes.planner.search import search_layouts
    from lcmoe_recipes.core.request import TrainingRequest

    rng = random.Random(7)
    for _ in range(6):
        model = rng.choice(["qwen3_30b", "moonlight", "qwen3_235b", "course_moe"])
        seq = rng.choice([16384, 65536, 131072])
        best = search_layouts(TrainingRequest(model=model, seq_length=seq, hardware="gb200", num_gpus=128)).best.plan
        assert coverage(best.model_spec, best.positions) >= seq, (model, seq, best.positions)


def test_abf_raises_the_base_by_the_ntk_relation():
    spec = get_model("qwen3_235b")
    p, why = choose_positions(spec, 131072, "abf")
    d = rotary_dim(spec)  # head_dim 128
    assert d == 128 and p.scaling == "none"
    assert p.rotary_base == math.ceil(1e6 * 4 ** (128 / 126))  # s = 131,072 / 32,768
    assert coverage(spec, p) >= 131072 and "ABF" in why.why and "2309.16039" in why.source
    assert rotary_dim(get_model("qwen3_next")) == 64  # head_dim 256 x partial_rotary_factor 0.25
    with pytest.raises(LcmoeError, match="trained with YaRN"):
        choose_positions(get_model("dsv3"), 262144, "abf")


def test_keep_beyond_the_range_is_refused_by_the_check():
    from lcmoe_recipes.errors import InfeasibleConfig

    with pytest.raises(InfeasibleConfig) as err:
        recipe_plan("qwen3_235b_128k_gb200", rope="keep")
    found = {f.rule: f for f in err.value.findings if f.severity == "error"}
    assert "seq_length 131,072 exceeds the positions RoPE covers" in found["positions/not-covered"].message
    assert "YaRN factor 4 over 32,768 covers it" in found["positions/not-covered"].fix


def test_incomplete_yarn_is_refused_with_complete_values():
    from dataclasses import replace

    plan = recipe_plan("qwen3_235b_128k_gb200")
    partial = plan.with_changes(positions=replace(plan.positions, beta_fast=None, mscale=None, mscale_all_dim=None))
    found = {f.rule: f for f in check_plan(partial)}
    f = found["positions/yarn-incomplete"]
    assert "model.yarn_beta_fast, model.yarn_mscale, model.yarn_mscale_all_dim are unset" in f.message
    assert "model.yarn_rotary_scaling_factor=4 model.yarn_original_max_position_embeddings=32768 model.yarn_beta_fast=32" in f.fix


@pytest.mark.slow
def test_partial_yarn_override_is_refused_before_megatron_fails(fresh_config):
    """The issue's case: three overrides leave yarn_beta_* / yarn_mscale* null (megatron-core's YaRN correction
    range would raise a TypeError when the model is built)."""
    from lcmoe_recipes.emit import apply_overrides, config_findings

    _, cfg = fresh_config("qwen3_next_32k_gb200")
    apply_overrides(cfg, ["model.position_embedding_type=yarn", "model.yarn_rotary_scaling_factor=2.0",
                          "model.yarn_original_max_position_embeddings=32768"])
    rules = [f.rule for f in config_findings(cfg, "gb200", 32) if f.severity == "error"]
    assert rules[0] == "positions/yarn-incomplete"


@pytest.mark.slow
def test_yarn_fields_reach_the_config(configs):
    _, dsv3 = configs["dsv3_256k_h100"]  # MLA: megatron-core's own fields
    m = dsv3.model
    assert (m.rope_type, m.rotary_scaling_factor, m.original_max_position_embeddings) == ("yarn", 64.0, 4096)
    _, qwen = configs["qwen3_235b_128k_gb200"]  # GPT: megatron-bridge's yarn_* fields
    m = qwen.model
    assert (m.position_embedding_type, m.yarn_rotary_scaling_factor, m.yarn_beta_fast, m.yarn_mscale_all_dim,
            m.yarn_correction_range_round_to_int) == ("yarn", 4.0, 32.0, 0.0, True)


# --- token budget, schedule, precision ---------------------------------------------------------------------------

def test_token_budget_follows_deepseek_v3_phases():
    # ~63M tokens per step at every length: 480 x 128K, 240 x 256K (DeepSeek-V3 §4.3: 480 x 128K)
    assert recipe_plan("dsv3_128k_h100").global_batch_size == 480
    assert recipe_plan("dsv3_256k_h100").global_batch_size == 240
    plan = recipe_plan("dsv3_128k_h100", tokens_per_step=2**23)
    assert plan.global_batch_size == 64 and "8.4M tokens per step, as requested" in plan.reasons["global_batch_size"].why
    with pytest.raises(LcmoeError, match="tokens_per_step 0 must be greater than 0; use e.g. 8388608"):
        recipe_plan("dsv3_128k_h100", tokens_per_step=0)  # a named recipe's options are a request's, checked alike


def test_extension_schedule_defaults_and_wishes():
    s = recipe_plan("dsv3_128k_h100").schedule
    assert (s.lr, s.min_lr, s.train_iters, s.lr_warmup_iters, s.lr_decay_style) == (7.3e-6, 7.3e-6, 1000, 20, "constant")
    s, why = choose_schedule(get_model("qwen3_235b"), 3e-5)
    assert s.lr == 3e-5 and "Qwen3-235B-A22B's own is not published" in why.why
    s, why = choose_schedule(get_model("dsv3"), None, lr=1e-5, train_iters=500)
    assert (s.lr, s.train_iters, s.lr_warmup_iters) == (1e-5, 500, 10) and "your --lr" in why.why


def test_planned_extension_keeps_the_base_models_precision():
    from lcmoe_recipes.planner.search import search_layouts
    from lcmoe_recipes.core.request import TrainingRequest

    best = search_layouts(TrainingRequest(model="qwen3_30b", seq_length=65536, hardware="h100", num_gpus=64)).best.plan
    assert best.precision == "bf16" and "publishes no low-precision training" in best.reasons["precision"].why
    assert best.schedule.lr == 3e-5 and best.positions.factor == 2.0  # YaRN 2 over 32,768 (model card's native)
    # MFU is counted against the peak of the precision used (BF16: 989 TFLOP/s on H100)
    from lcmoe_recipes.cost import estimate_step

    step = estimate_step(best)
    assert step.mfu == pytest.approx(step.tflops_per_gpu / 989.4)


# --- weights --------------------------------------------------------------------------------------------------

def _hf_folder(tmp_path, model="dsv3"):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(get_model(model).config))
    (folder / "model.safetensors").write_bytes(b"\0" * 8)
    return folder


@pytest.mark.slow
def test_launch_from_hf_sets_the_weights_and_refuses_another_model(tmp_path, monkeypatch, capsys):
    from lcmoe_recipes.emit import read_meta
    from lcmoe_recipes.cli.launch import main

    hf = _hf_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["dsv3", "--seq", "131072", "--from-hf", str(hf), "--dry-run", "--output", "x.yaml"]) == 0
    out = capsys.readouterr().out
    assert f"weights            from {hf}" in out
    assert f"pretrained_checkpoint: {hf}" in (tmp_path / "x.yaml").read_text()
    assert read_meta(tmp_path / "x.yaml")["weights"] == {"from_hf": str(hf)}
    assert main(["qwen3_235b", "--seq", "131072", "--from-hf", str(hf), "--dry-run", "--output", "y.yaml"]) == 2
    err = capsys.readouterr().err
    assert "is not Qwen3-235B-A22B: model_type is 'deepseek_v3' there but 'qwen3_moe'" in err
    assert "It matches catalogue model 'dsv3'" in err and not (tmp_path / "y.yaml").exists()


def test_entry_script_checks_the_weights_on_the_node(tmp_path):
    from lcmoe_recipes.jobs.node import weights_problems

    hf = _hf_folder(tmp_path)
    assert weights_problems({"from_hf": str(hf)}, "dsv3") == []
    assert "is not Qwen3-235B-A22B" in weights_problems({"from_hf": str(hf)}, "qwen3_235b")[0]
    assert "does not exist" in weights_problems({"from_hf": str(tmp_path / "none")}, "dsv3")[0]
    assert weights_problems({"from_checkpoint": str(tmp_path / "phase1")}, "dsv3") == []  # written by phase 1 later


# --- phases and retargeting ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_phases_chain_their_checkpoints(tmp_path, monkeypatch, capsys):
    from lcmoe_recipes.emit import read_yaml
    from lcmoe_recipes.cli.launch import main

    monkeypatch.chdir(tmp_path)
    assert main(["qwen3_30b", "--phases", "32768,65536", "--gpus", "64", "--hardware", "h100", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "qwen3_30b_32k_64xh100-phase1: valid" in out and "qwen3_30b_64k_64xh100-phase2: valid" in out
    first, _ = read_yaml(tmp_path / "out" / "qwen3_30b_32k_64xh100-phase1.yaml")
    second, meta = read_yaml(tmp_path / "out" / "qwen3_30b_64k_64xh100-phase2.yaml")
    assert second.checkpoint.pretrained_checkpoint == first.checkpoint.save
    assert meta["weights"] == {"from_checkpoint": first.checkpoint.save}
    assert (first.model.position_embedding_type, second.model.position_embedding_type) == ("rope", "yarn")
    assert main(["qwen3_30b", "--phases", "65536,32768", "--gpus", "64", "--hardware", "h100", "--dry-run"]) == 2
    assert "give increasing positive lengths" in capsys.readouterr().err
    assert main(["qwen3_30b", "--phases", "32768,65536", "--gpus", "64", "--hardware", "h100", "--executor", "slurm",
                 "--dry-run"]) == 2
    assert "--phases on Slurm needs --save-dir" in capsys.readouterr().err


@pytest.mark.slow
def test_build_phases_from_python():
    from lcmoe_recipes import build_phases

    first, second = build_phases("qwen3_30b", [32768, 65536], 64, "h100", lr=1e-5)
    assert second.checkpoint.pretrained_checkpoint == first.checkpoint.save
    assert first.optimizer.lr == second.optimizer.lr == 1e-5 and second.model.yarn_rotary_scaling_factor == 2.0


@pytest.mark.slow
@pytest.mark.parametrize("function,model,gpus,hardware,expect", [
    ("megatron.bridge.perf_recipes.deepseek.h100.deepseek_v3:deepseek_v3_pretrain_1024gpu_h100_fp8sc_config", "dsv3",
     256, "h100", {"model.context_parallel_size": (1, 16), "model.seq_length": (4096, 131072)}),  # the planner's CP
    ("megatron.bridge.perf_recipes.qwen.gb200.qwen3_moe:qwen3_235b_a22b_pretrain_64gpu_gb200_bf16_config",
     "qwen3_235b", 128, "gb200", {"model.seq_length": (4096, 131072), "model.position_embedding_type": ("rope", "yarn")}),
])
def test_retarget_an_upstream_4k_recipe_to_128k(tmp_path, monkeypatch, capsys, function, model, gpus, hardware, expect):
    from lcmoe_recipes.emit import config_findings, read_yaml
    from lcmoe_recipes.emit.upstream import upstream_config
    from lcmoe_recipes.cli.launch import main

    upstream_config(function, get_model(model)).to_yaml(str(tmp_path / "mine.yaml"))
    monkeypatch.chdir(tmp_path)
    assert main(["--from", "mine.yaml", "--seq", "131072", "--gpus", str(gpus), "--hardware", hardware, "--dry-run",
                 "--output", "long.yaml", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    changes = {c["field"]: c for c in doc["changes"]}
    for field, (before, after) in expect.items():
        assert (changes[field]["before"], changes[field]["after"]) == (before, after), field
        assert changes[field]["reason"]
    assert changes["dataset.create_attention_mask"]["after"] is False
    assert "optimizer.lr" not in changes  # the user's own stay
    # but the run saves and resumes in a folder of its own (the config's would resume from the shorter run's saves)
    assert changes["checkpoint.save"]["after"] == changes["checkpoint.load"]["after"] == "nemo_experiments/mine-128k/checkpoints"
    cfg, meta = read_yaml(tmp_path / "long.yaml")
    assert meta["retargeted_from"] == "mine.yaml" and cfg.model.seq_length == 131072
    assert not [f for f in config_findings(cfg, hardware, gpus) if f.severity == "error"]


# --- hierarchical CP --------------------------------------------------------------------------------------------

def test_hierarchical_cp_is_priced_and_chosen_by_step_time():
    from lcmoe_recipes.cost import estimate_step
    from lcmoe_recipes.rules.cp import choose_cp_comm, hierarchical_split

    plan = recipe_plan("dsv3_128k_h100")
    assert hierarchical_split(plan) == (8, 4)  # a2a over the 8 CP ranks of a node, a ring of 4 nodes
    ring = estimate_step(plan.with_changes(cp_comm_type="p2p", hierarchical_cp_sizes=None))
    hier = estimate_step(plan.with_changes(cp_comm_type="a2a+p2p", hierarchical_cp_sizes=(8, 4)))
    assert hier.comm_bytes["CP"] != ring.comm_bytes["CP"]
    kind, sizes, why = choose_cp_comm(plan)
    faster = "a2a+p2p" if hier.step_seconds < ring.step_seconds else "p2p"
    assert kind == faster and plan.cp_comm_type == faster and "exposed CP" in why.why
    chosen = hier if kind == "a2a+p2p" else ring
    # the chosen exchange's step is quoted first: a reason cut to one line shows what this plan runs
    assert f"predicted step {chosen.step_seconds:.1f} s with " in why.why.split(" vs ")[0]
    assert hierarchical_split(recipe_plan("qwen3_235b_128k_gb200")) is None  # CP4 x TP4 within one NVLink block


@pytest.mark.slow
def test_hierarchical_cp_config_validates(fresh_config):
    from lcmoe_recipes.emit import apply_overrides, validate_config

    _, cfg = fresh_config("dsv3_128k_h100")
    apply_overrides(cfg, ["model.cp_comm_type=a2a+p2p", "model.hierarchical_context_parallel_sizes=[8,4]"])
    validate_config(cfg, "h100", 256)


# --- hygiene of user configs ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_user_yaml_hygiene_warnings(fresh_config):
    from lcmoe_recipes.emit import apply_overrides, config_findings

    _, cfg = fresh_config("dsv3_128k_h100")
    apply_overrides(cfg, ["dataset.create_attention_mask=true", "model.init_method_std=0.02",
                          "model.cross_entropy_fusion_impl=te", "model.moe_router_force_load_balancing=true"])
    found = {f.rule: f for f in config_findings(cfg, "h100", 256)}
    assert "every data-loader worker builds a dense 131,072 x 131,072 mask per sample (128 GiB" in \
        found["data/attention-mask"].message
    assert found["model/init-differs-from-upstream"].fix == "set model.init_method_std=0.006"
    # TE's fused cross-entropy is judged for the TE the run uses (known issue, fixed in TE 2.18), not flagged here
    assert not any(rule.startswith("numerics/") for rule in found)
    assert "round-robin" in found["real-training/benchmark-setting"].message
    _, cfg = fresh_config("qwen3_next_32k_gb200")
    apply_overrides(cfg, ["dataset.inter_document_masking=true"])
    found = {f.rule: f for f in config_findings(cfg, "gb200", 32)}
    assert found["data/document-masking-layout"].severity == "error"


def test_small_token_budget_and_request_errors_name_one_fix(capsys):
    from lcmoe_recipes.cli.launch import main

    assert main(["dsv3", "--seq", "131072", "--tokens-per-step", "1000", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--tokens-per-step 1,000 is less than one sequence of seq_length 131,072" in err
    assert main(["qwen3_30b", "--seq", "32768", "--gpus", "3", "--hardware", "h100", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "error: invalid request: 3 GPUs do not fill whole h100 nodes of 8 (nor divide one)\n  fix: use 2 or 4" in err
    with pytest.raises(SystemExit) as exit_:
        main(["dsv3", "--seq", "131072", "--rope", "bogus"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: argument --rope: invalid choice: 'bogus'") and "usage:" not in err
    assert err.rstrip().endswith("fix: see python -m lcmoe_recipes.launch --help")


@pytest.mark.slow
def test_retarget_an_upstream_recipe_by_name(tmp_path, monkeypatch, capsys):
    from lcmoe_recipes.cli.launch import main

    monkeypatch.chdir(tmp_path)
    name = "qwen3_30b_a3b_pretrain_64gpu_h100_bf16_config"
    assert main(["--from", name, "--seq", "65536", "--dry-run", "--json", "--output", "q.yaml"]) == 0
    doc = json.loads(capsys.readouterr().out)
    changes = {c["field"]: c for c in doc["changes"]}
    assert changes["model.seq_length"]["before"] == 4096 and changes["model.seq_length"]["after"] == 65536
    precision = next(d for d in doc["decisions"] if d["knob"] == "precision")
    assert precision["reason"].startswith("bf16: the config's own")
    # a perf recipe's schedule is a benchmark's: kept, but said (a fresh user's extension ran it unawares)
    bench = next(f for f in doc["findings"] if f["rule"] == "real-training/benchmark-schedule")
    assert bench["message"].startswith(f"the schedule is {name}'s, a benchmark's: ")
    assert bench["fix"] == "give the phase's --train-iters and --lr (e.g. the base model's final pretraining LR)"
    # --lr and --train-iters change the config's schedule (they were silently ignored: a fresh user's extension
    # from a pretraining recipe kept its peak LR 3e-4 and its 50 benchmark steps)
    assert main(["--from", name, "--seq", "65536", "--dry-run", "--json", "--output", "q2.yaml", "--lr", "7.3e-6",
                 "--train-iters", "1000"]) == 0
    doc = json.loads(capsys.readouterr().out)
    changes = {c["field"]: c["after"] for c in doc["changes"]}
    assert (changes["optimizer.lr"], changes["optimizer.min_lr"], changes["train.train_iters"],
            changes["scheduler.lr_decay_iters"]) == (7.3e-6, 7.3e-6, 1000, 1000)
    written = emit.read_yaml(tmp_path / "q2.yaml")[0]
    assert (written.optimizer.lr, written.train.train_iters) == (7.3e-6, 1000)
    assert not [f for f in doc["findings"] if f["rule"] == "real-training/benchmark-schedule"]
    schedule = next(d for d in doc["decisions"] if d["knob"] == "schedule")
    assert schedule["reason"].startswith("the config's own schedule with peak LR 7.3e-06 (--lr) and 1000 steps")
    # the refusal of --from-hf beside --from names the flags, not the request's fields
    assert main(["--from", name, "--seq", "65536", "--dry-run", "--from-hf", "/models/q"]) == 2
    assert capsys.readouterr().err.startswith("error: invalid request: --from keeps the checkpoint settings of the "
                                              "config it retargets\n  fix: use the override checkpoint.pretrained_"
                                              "checkpoint=DIR (a Megatron checkpoint) instead of --from-hf / "
                                              "--from-checkpoint")
    assert main(["--from", "qwen3_30b_a3b_pretrain_64gpu_h100", "--seq", "65536", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "is neither a file nor a megatron-bridge recipe this catalogue records" in err and name in err


@pytest.mark.slow
def test_check_of_launch_output_with_run_options_is_not_an_edit(tmp_path, monkeypatch, capsys):
    from lcmoe_recipes.cli.check import main as check
    from lcmoe_recipes.cli.launch import main

    monkeypatch.chdir(tmp_path)
    assert main(["qwen3_next", "--seq", "8192", "--from-hf", "/models/Qwen3-Next-80B-A3B", "--lr", "1e-5",
                 "--dry-run", "--output", "n.yaml"]) == 0
    capsys.readouterr()
    assert check(["n.yaml"]) == 0
    assert "edited" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_retarget_keeps_the_configs_ep_overlap_off_and_says_what_it_costs(tmp_path, monkeypatch, capsys):
    """A fresh user's qwen3_235b_128k_gb200 YAML (EP overlap off, as upstream's recipe) retargeted to 256K: the search
    ranks the layout with the overlap on, the config's own 'off' is kept (the YAML says false), and the reason says
    so with the price and the overrides that take it (it explained the overlap as on while the YAML had it off)."""
    from lcmoe_recipes.cli.launch import main

    monkeypatch.chdir(tmp_path)
    assert main(["qwen3_235b", "--seq", "131072", "--dry-run", "--output", "q.yaml"]) == 0
    capsys.readouterr()
    assert main(["--from", "q.yaml", "--seq", "262144", "--dry-run", "--json", "--output", "q256.yaml"]) == 0
    doc = json.loads(capsys.readouterr().out)
    why = next(d for d in doc["decisions"] if d["knob"] == "moe_ep_overlap")["reason"]
    assert why.startswith("EP all-to-all overlap off: the config's own setting, kept (overlap_moe_expert_parallel_comm"
                          "); megatron-core allows it here and the step model prices the step ")
    assert why.endswith("set comm_overlap.overlap_moe_expert_parallel_comm=true comm_overlap.delay_wgrad_compute=true "
                        "to take it")
    assert not emit.read_yaml(tmp_path / "q256.yaml")[0].comm_overlap.overlap_moe_expert_parallel_comm
