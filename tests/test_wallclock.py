"""A phase's wall clock, and the long-run settings priced by it (lcmoe_recipes.cost.wallclock): checkpoint size and
cadence, evaluation sized for long context, the warning for a phase that runs for days."""

from __future__ import annotations

import pytest

from lcmoe_recipes import recipe_plan
from lcmoe_recipes.checks.wallclock import phase_findings
from lcmoe_recipes.core.request import TrainingRequest
from lcmoe_recipes.cost import estimate_step, wallclock as wc
from lcmoe_recipes.cost.shapes import shapes
from lcmoe_recipes.planner.search import search_layouts as search


def test_checkpoint_size_and_cadence_for_deepseek_v3():
    plan = recipe_plan("dsv3_128k_h100")
    # upstream's DSV3 recipe asks the precision-aware optimizer for bf16 moments, but under optimizer CPU offload
    # HybridDeviceOptimizer keeps FP32 Adam states (megatron-core 0.19.2 optimizer/__init__.py), and the plan states
    # what runs: bf16 weight 2 + fp32 master 4 + 2 x 4 bytes per parameter
    assert plan.moment_dtype == "fp32" and plan.effective_moment_dtype == "fp32"
    assert wc.checkpoint_bytes(plan) == shapes(plan.model_spec).total_params * 14
    assert wc.checkpoint_bytes(plan) == pytest.approx(9.39e12, rel=0.01)
    assert wc.write_seconds(plan) == pytest.approx(9.39e12 / 20e9, rel=0.01)  # default 20 GB/s: 7.8 min
    step = estimate_step(plan).step_seconds
    cadence = wc.save_intervals(plan, base_interval=2000)
    assert cadence.persistent == 250  # four kept saves in 1,000 steps (upstream's 2,000 would keep none)
    # Young/Daly: sqrt(2 x 470 s x 198 h) = 7.2 h between recovery saves on 256 GPUs (Llama 3's rate)
    assert cadence.mtbf_hours == pytest.approx(54 * 24 * 16384 / 419 / 256)
    assert cadence.optimum_seconds == pytest.approx((2 * cadence.write_seconds * cadence.mtbf_hours * 3600) ** 0.5)
    assert cadence.non_persistent == round(cadence.optimum_seconds / step) and cadence.bound is None
    assert cadence.non_persistent * step >= cadence.write_seconds  # one write apart
    # 5.2 h per write and a failure an hour: the optimum (3.2 h) is closer than one write, so one write apart
    slow = wc.save_intervals(plan, fs_gbps=0.5, base_interval=2000, mtbf_hours=1.0)
    assert slow.optimum_seconds < slow.write_seconds
    assert slow.non_persistent == -(-slow.write_seconds // step) == 22  # 18,789 s per write / 874 s per step
    assert "raised to one write apart (22 steps)" in slow.reason.why
    assert wc.save_intervals(plan, fs_gbps=0.1).persistent * step >= wc.write_seconds(plan, 0.1)
    with pytest.raises(ValueError, match="bandwidth 0 GB/s is not positive"):
        wc.save_intervals(plan, fs_gbps=0)


def test_young_daly_interval_from_the_llama3_failure_rate():
    """The recovery saves' interval is Young/Daly's sqrt(2 C MTBF) (Young, CACM 1974; Daly, FGCS 2006), MTBF from the
    unexpected interruptions Meta published for Llama 3 (419 in 54 days on 16,384 H100, arXiv 2407.21783 section
    3.3.4): 50,677 GPU-hours per failure, 99 h on the 512 GPUs of dsv3_256k_h100 -- "about once every four days"."""
    assert wc.GPU_MTBF_HOURS == pytest.approx(50677.0, abs=1)
    assert wc.job_mtbf_hours(512) == pytest.approx(98.98, abs=0.01)
    assert wc.job_mtbf_hours(512, 24.0) == 24.0
    with pytest.raises(ValueError, match="not positive"):
        wc.job_mtbf_hours(512, 0)
    plan = recipe_plan("dsv3_256k_h100")
    step = estimate_step(plan).step_seconds
    base = wc.save_intervals(plan)
    assert base.mtbf_hours == pytest.approx(98.98, abs=0.01) and "arXiv 2407.21783" in base.mtbf_source
    # four times the failures: half the interval (sqrt), within a step's rounding
    often = wc.save_intervals(plan, mtbf_hours=base.mtbf_hours / 4)
    assert often.optimum_seconds == pytest.approx(base.optimum_seconds / 2)
    assert abs(often.non_persistent - base.optimum_seconds / 2 / step) <= 0.5
    # a plan's own MTBF (launch --mtbf-hours) is used when no argument is given
    assert wc.save_intervals(plan.with_changes(mtbf_hours=base.mtbf_hours / 4)).non_persistent == often.non_persistent
    # bounded by the time limit: a 2-hour job saves at least every 2 h
    short = wc.save_intervals(plan, time_limit_hours=2.0)
    assert short.non_persistent == int(2 * 3600 // step) < base.non_persistent and "usable 2.0 h" in short.bound
    # the plan's price: failures/day x (half an interval + write + read back + restart) x GPUs
    cost = wc.failure_cost(plan, base)
    assert cost.failures_per_day == pytest.approx(24 / base.mtbf_hours)
    lost = (base.non_persistent * step / 2 + 2 * base.write_seconds + wc.RESTART_SECONDS) / 3600
    assert cost.failure_gpu_hours == pytest.approx(cost.failures_per_day * lost * 512)
    assert cost.saving_gpu_hours == pytest.approx(86400 / (base.non_persistent * step) * base.write_seconds / 3600 * 512)
    assert "GPU-h/day to failures" in cost.text() and "GPU-h/day to saving" in cost.text()


def eval_batch(plan):
    """The plan's evaluation batch as the rule decides it (the plan carries the number)."""
    from lcmoe_recipes.rules.batch import choose_eval_batch

    gbs, why = choose_eval_batch(plan.seq_length, plan.layout, plan.micro_batch_size, plan.eval_iters,
                                 plan.global_batch_size)
    assert plan.eval_global_batch_size == gbs
    return gbs, why


def test_evaluation_sized_for_long_context():
    plan = recipe_plan("dsv3_128k_h100")  # GBS 480 x 128K: one training batch is 63M tokens
    gbs, why = eval_batch(plan)
    assert gbs == 8  # MBS 1 x DP 1 x PP 8: the fewest sequences that keep every pipeline stage busy
    assert "8 sequences x 32 batches = 33.6M tokens per evaluation" in why.why and "2.0B" in why.why
    one = wc.eval_seconds(plan)
    micro = estimate_step(plan).microbatch_seconds
    assert one == pytest.approx(32 * (8 + 7 / 4) * micro / 3)  # 32 forward-only batches of 8 + the bubble
    time = wc.phase_time(plan)
    assert time.evaluations == 1000 // 250 + 2 and time.evaluation == pytest.approx(6 * one)
    assert time.evaluation < 0.01 * time.train
    assert wc.eval_seconds(plan.with_changes(eval_iters=0)) == 0.0
    short = recipe_plan("qwen3_next_8k_gb200")  # at 8K upstream's 4.2M tokens are 16 sequences per batch
    assert eval_batch(short)[0] == 32  # rounded up to MBS x DP x PP = 1 x 16 x 2


def test_a_phase_that_runs_for_days_is_warned_about_with_the_batch_that_fits():
    """The issue's example: DeepSeek-V3 at 64K on 128 H100 keeps its 63M tokens per step (~15 days for 1,000
    steps: with FP32 gradients only full recompute fits on 128 GPUs; ~12 days when upstream's bf16 gradients did)."""
    plan = search(TrainingRequest(model="dsv3", seq_length=65536, hardware="h100", num_gpus=128)).best.plan
    assert plan.tokens_per_step == 960 * 65536 and plan.schedule.train_iters == 1000
    time = wc.phase_time(plan)
    assert plan.recompute_granularity == "full"
    assert 13 * 86400 < time.total < 16 * 86400  # 14.6 days at TP2 CP8 EP16 PP8 VPP4 when this was written
    (finding,) = phase_findings(plan, budget_hours=48)
    assert finding.rule == "time/phase-long" and finding.severity == "warning"
    assert "days), modelled" in finding.message and "over a budget of 48 h at 62.9M tokens per step" in finding.message
    tokens = wc.tokens_per_step_for(plan, 48 * 3600)
    assert finding.fix.startswith(f"--tokens-per-step {tokens} (")
    fits = plan.with_changes(global_batch_size=tokens // 65536)
    assert wc.phase_time(fits).total <= 48 * 3600
    step = plan.layout.dp * (plan.layout.pp if plan.layout.vpp else 1)
    assert wc.phase_time(fits.with_changes(global_batch_size=fits.global_batch_size + step)).total > 48 * 3600 or \
        tokens // 65536 >= 16 * step  # the next batch up no longer fits (finer steps below 16 units)
    assert phase_findings(plan, budget_hours=24 * 30) == []
