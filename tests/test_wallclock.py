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
    # upstream's DSV3 recipe: precision-aware optimizer with bf16 moments -> bf16 weight 2 + fp32 master 4 + 2 x 2
    assert plan.moment_dtype == "bf16" and wc.checkpoint_bytes(plan) == shapes(plan.model_spec).total_params * 10
    assert wc.checkpoint_bytes(plan) == pytest.approx(6.71e12, rel=0.01)
    assert wc.write_seconds(plan) == pytest.approx(6.71e12 / 20e9, rel=0.01)  # default 20 GB/s: 5.6 min
    step = estimate_step(plan).step_seconds
    cadence = wc.save_intervals(plan, base_interval=2000)
    assert cadence.persistent == 250  # four kept saves in 1,000 steps (upstream's 2,000 would keep none)
    assert cadence.non_persistent * step <= wc.MAX_HOURS_BETWEEN_SAVES * 3600  # a failure loses under 2 h
    assert cadence.non_persistent * step >= cadence.write_seconds  # one write apart
    slow = wc.save_intervals(plan, fs_gbps=0.5, base_interval=2000)  # 3.7 h per write: no closer than one write
    assert slow.non_persistent == -(-slow.write_seconds // step) > cadence.non_persistent
    assert "no closer than 14 steps, one write apart" in slow.reason.why  # 13,421 s per write / 968 s per step
    assert wc.save_intervals(plan, fs_gbps=0.1).persistent * step >= wc.write_seconds(plan, 0.1)
    with pytest.raises(ValueError, match="bandwidth 0 GB/s is not positive"):
        wc.save_intervals(plan, fs_gbps=0)


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
    """The issue's example: DeepSeek-V3 at 64K on 128 H100 keeps its 63M tokens per step (~12 days for 1,000
    steps)."""
    plan = search(TrainingRequest(model="dsv3", seq_length=65536, hardware="h100", num_gpus=128)).best.plan
    assert plan.tokens_per_step == 960 * 65536 and plan.schedule.train_iters == 1000
    time = wc.phase_time(plan)
    assert 10 * 86400 < time.total < 14 * 86400
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
