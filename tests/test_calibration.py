"""Calibration from a user's own runs: log fixtures in the exact upstream formats (megatron-bridge 0.6.2 train_utils.py
training_log / report_memory; Megatron-LM training.py / common_utils.py), partial, garbled and mismatched logs (one
clear error each), the fit and its profile, the profile read back by the cost models, and the one-node calibration
run's plan. Fixtures: tests/fixtures/logs (numbers synthetic, consistent with the config's model FLOPs; each file's
first line says so)."""

from pathlib import Path

import pytest

from lcmoe_recipes import recipe_plan
from lcmoe_recipes.calibration import (CalibrationError, calibrate, calibration_run_plan, parse_log, read_log,
                                       read_profile, write_profile)
from lcmoe_recipes.cli.calibrate import main
from lcmoe_recipes.cost import estimate_memory, estimate_step
from lcmoe_recipes.cost.efficiency import FITTED
from lcmoe_recipes.cost.step import model_flops_per_token

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
BRIDGE, MEGATRON = LOGS / "bridge_qwen3_235b_128k_gb200.log", LOGS / "megatron_lm_qwen3_235b_128k_gb200.log"
PLAN = recipe_plan("qwen3_235b_128k_gb200")


def _flops(plan) -> float:
    return model_flops_per_token(plan) * plan.global_batch_size * plan.seq_length


def test_reads_the_megatron_bridge_format():
    log = read_log(BRIDGE)
    assert len(log.iterations) == 30 and log.iterations[0].iteration == 1 and log.iterations[-1].train_iters == 30
    assert log.steady[0].iteration == 7  # the first fifth (6 of 30) is warm-up
    assert log.global_batch_size == 64
    # the logged TFLOP/s times the step time and GPUs is the config's model FLOPs per step
    assert log.tflops_per_gpu * 1e12 * log.step_seconds * 128 == pytest.approx(_flops(PLAN), rel=2e-3)
    # peak allocated per model-parallel rank (GB = 1e9 bytes); the most loaded one
    assert sorted(log.peak_allocated) == [0, 32, 64, 96]
    assert log.max_allocated == pytest.approx(158.95e9) and log.peak_reserved[0] == pytest.approx(162.95e9)


def test_reads_the_megatron_lm_format():
    log = read_log(MEGATRON)  # launcher prefixes ('[default0]:'), memory in MB (2**20 bytes)
    assert len(log.iterations) == 20 and log.tflops_per_gpu == pytest.approx(950.0)
    assert log.max_allocated == pytest.approx(152538.38 * 2**20)


def test_partial_garbled_and_mismatched_logs_each_one_clear_error():
    with pytest.raises(CalibrationError, match=r"partial.log has 2 logged iterations, 0 past the warm-up: too few "
                                               r"to time a step \(a partial log: the run stopped at iteration 2 of 30\)"):
        read_log(LOGS / "partial.log")
    with pytest.raises(CalibrationError, match=r"garbled.log, line 13: a garbled iteration line \(no elapsed time "
                                               r"per iteration \(ms\), global batch size\)"):
        read_log(LOGS / "garbled.log")
    with pytest.raises(CalibrationError, match=r"mismatched.log: global batch size 128, but the config has 64"):
        calibrate([(PLAN, read_log(LOGS / "mismatched.log"), "qwen3_235b_128k_gb200")])
    other = recipe_plan("qwen3_next_64k_gb200")  # GBS 64 too: the FLOPs give it away
    assert other.global_batch_size == 64
    with pytest.raises(CalibrationError, match=r"FLOPs per step, but the config \(Qwen3-Next-80B-A3B, seq_length 65536, "
                                               r"GBS 64\) does .*: the log is from another model"):
        calibrate([(other, read_log(BRIDGE), "qwen3_next_64k_gb200")])
    with pytest.raises(CalibrationError, match="has no iteration line"):
        parse_log("NCCL INFO Bootstrap : Using eth0\n[Rank 0] nothing here\n", "stderr.log")
    with pytest.raises(CalibrationError, match=r"line 3: iteration 1/30 follows 2/30 \(line 2\): two runs in one log"):
        text = BRIDGE.read_text().splitlines()
        parse_log("\n".join([text[0], text[2], text[1]] + text[3:]), "two.log")
    with pytest.raises(CalibrationError, match="cannot read log 'nowhere.log'"):
        read_log("nowhere.log")
    with pytest.raises(CalibrationError, match="the runs mix GPU x precision: gb200 bf16, h100 fp8_blockwise"):
        calibrate([(PLAN, read_log(BRIDGE), "a"), (recipe_plan("dsv3_128k_h100"), read_log(BRIDGE), "b")])


def test_fit_profile_and_the_cost_models_read_it(tmp_path):
    """Two runs of Qwen3-235B 128K on 128 GB200 measured 1000 and 950 TFLOP/s: the profile's constants predict their
    median-ish throughput, with the leave-one-out spread of two runs; memory overhead from the most loaded rank."""
    runs = [(PLAN, read_log(BRIDGE), "qwen3_235b_128k_gb200"), (PLAN, read_log(MEGATRON), "qwen3_235b_128k_gb200")]
    profile = calibrate(runs, today="2026-12-02")
    assert (profile.hardware, profile.precision) == ("gb200", "bf16")
    assert set(profile.step_constants) == {("gb200", "bf16"), ("gb200", "attention")}  # attention: >30% of the step
    calibrated = estimate_step(PLAN, profile.step_table()).tflops_per_gpu
    assert 950 <= calibrated <= 1000 and abs(estimate_step(PLAN).tflops_per_gpu - 975) > abs(calibrated - 975)
    for key, (lo, hi) in profile.step_spread.items():
        assert lo <= profile.step_constants[key] * 1.01 and hi >= profile.step_constants[key] * 0.99
    base = estimate_memory(PLAN).total - 3.8e9  # the listed components, without the published overhead
    assert profile.memory_overhead_bytes == pytest.approx((158.95e9 + 152538.38 * 2**20) / 2 - base, rel=1e-6)
    path = write_profile(profile, tmp_path / "gb200.yaml")
    again = read_profile(path)
    assert again.step_table() == profile.step_table() and again.memory_constants() == profile.memory_constants()
    assert [r["log"] for r in again.runs] == [str(BRIDGE), str(MEGATRON)] and again.runs[0]["log_sha256"]
    assert again.runs[0]["predicted_tflops_published"] == pytest.approx(estimate_step(PLAN).tflops_per_gpu, abs=0.01)
    side = again.predictions(PLAN)  # published and calibrated side by side
    assert side["tflops_published"] == pytest.approx(estimate_step(PLAN).tflops_per_gpu)
    assert side["tflops_calibrated"] == pytest.approx(calibrated) and side["hbm_gib_calibrated"] > 0
    # another GPU's constants stay the published ones
    assert again.step_table()[("h100", "fp8_blockwise")] == FITTED[("h100", "fp8_blockwise")]


def test_bad_profiles_are_refused(tmp_path):
    (tmp_path / "x.yaml").write_text("kind: something-else\n")
    with pytest.raises(CalibrationError, match="is not a calibration profile"):
        read_profile(tmp_path / "x.yaml")
    (tmp_path / "y.yaml").write_text("kind: lcmoe_recipes/calibration-profile\nversion: 1\nstep_constants:\n"
                                     "- {gpu: a100, kind: bf16, value: 0.5}\n")
    with pytest.raises(CalibrationError, match="step constant .* is not a positive value for a GPU in"):
        read_profile(tmp_path / "y.yaml")


def test_command_writes_the_profile(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert main([str(BRIDGE), "--config", "qwen3_235b_128k_gb200", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"calibration profile for gb200 at bf16 from 1 run(s): {out}" in text and f"--calibration {out}" in text
    assert read_profile(out).runs[0]["tflops_per_gpu"] == pytest.approx(1000.0, abs=1)
    assert main([str(LOGS / "partial.log"), "--config", "qwen3_235b_128k_gb200"]) == 2
    assert "error: " in capsys.readouterr().err


def test_calibration_run_keeps_the_per_gpu_shapes():
    """DeepSeek-V3 128K on 256 H100 (TP1 CP32 EP32 PP8): one 8-GPU node keeps 4096 tokens per rank (CP 8 over 32K),
    8 experts per rank (EP8 over 64 experts), one dense and one MoE layer, no MTP, PP1, 30 steps."""
    target = recipe_plan("dsv3_128k_h100")
    run = calibration_run_plan(target)
    lay = run.layout
    assert (lay.world, lay.tp, lay.cp, lay.ep, lay.pp) == (8, 1, 8, 8, 1)
    assert run.seq_length // lay.cp == target.seq_length // target.layout.cp == 4096
    spec = run.model_spec
    assert spec.num_moe_experts // lay.ep == 256 // 32 == 8
    assert spec.num_layers == 2 and spec.moe_layers == (False, True) and run.mtp_num_layers == 0
    assert run.precision == target.precision and run.recompute_modules == target.recompute_modules
    assert run.schedule.train_iters == 30 <= 50 and run.global_batch_size == 8 * lay.dp
    assert "4096 tokens per rank" in run.reasons["layout"].why
    # Qwen3-Next keeps a gated-DeltaNet and a full-attention layer
    nxt = calibration_run_plan(recipe_plan("qwen3_next_64k_gb200"))
    assert nxt.model_spec.layer_attention == ("gdn", "full") and nxt.layout.world == 4


def test_replan_with_a_profile():
    """The search ranks and fits with the profile's constants: every candidate's step is estimate_step with them,
    and the bounds still never cut what the exhaustive search keeps."""
    from lcmoe_recipes.core.request import TrainingRequest
    from lcmoe_recipes.planner.search import search_layouts

    profile = calibrate([(PLAN, read_log(BRIDGE), "qwen3_235b_128k_gb200")])
    request = TrainingRequest(model="qwen3_235b", seq_length=131072, hardware="gb200", num_gpus=128)
    mine = search_layouts(request, step_table=profile.step_table(), memory_constants=profile.memory_constants())
    for c in mine.ranked:
        assert c.step.step_seconds == estimate_step(c.plan, profile.step_table()).step_seconds
        assert c.memory.total == estimate_memory(c.plan, profile.memory_constants()).total
    published = search_layouts(request)
    assert mine.best.step.step_seconds != published.best.step.step_seconds
    full = search_layouts(request, exhaustive=True, step_table=profile.step_table(),
                memory_constants=profile.memory_constants())
    assert [c.plan for c in full.ranked] == [c.plan for c in mine.ranked]
