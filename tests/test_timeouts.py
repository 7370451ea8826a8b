"""Distributed timeouts against the predicted longest waits (checks/timeouts.py, cost/step.py longest_waits)."""

import math

import pytest

from lcmoe_recipes.checks import timeouts
from lcmoe_recipes.checks.known_issues import config_view
from lcmoe_recipes.checks.timeouts import TIMEOUT_SAFETY, timeout_findings
from lcmoe_recipes.core.layout import ParallelLayout
from lcmoe_recipes.cost.comm import data_parallel_transfers, layer_transfers, pipeline_transfer
from lcmoe_recipes.cost.memory import rank_memory
from lcmoe_recipes.cost.step import longest_waits, microbatch_seconds
from lcmoe_recipes.planner.recipes import NAMED_RECIPES, recipe_plan


def findings(plan, dist: dict | None = None):
    config = {"dist": dist} if dist is not None else {}
    return timeout_findings(config_view(config, plan.hardware_spec, plan.layout.world), plan)


def dsv3_1m(pp: int, cp: int, vpp: int | None):
    """DeepSeek-V3 at 1M tokens on 512 H100s, a layout for timing only (memory not checked)."""
    plan = recipe_plan("dsv3_256k_h100")
    return plan.with_changes(seq_length=1048576, pipeline_model_parallel_layout=None,
                             layout=ParallelLayout(world=512, tp=1, pp=pp, cp=cp, ep=32, etp=1, vpp=vpp))


def test_waits_follow_the_step_model():
    plan = dsv3_1m(pp=16, cp=32, vpp=None)
    waits = longest_waits(plan)
    # the first stage waits (PP - 1) backward passes of 2/3 of a microbatch for its first gradient
    assert waits.pipeline == pytest.approx(15 * 2 / 3 * microbatch_seconds(plan))
    # the longest collective is the longest of the per-layer, pipeline and per-step data-parallel transfers
    detail = rank_memory(plan, 0).detail
    candidates = [t.seconds for i in range(plan.model_spec.num_layers) for t in layer_transfers(plan, i)]
    candidates += [pipeline_transfer(plan).seconds]
    candidates += [t.seconds for t in data_parallel_transfers(plan, detail["dense_params"], detail["expert_params"])]
    assert waits.collective[1] <= max(candidates) + 1e-12 and waits.collective[1] >= max(candidates[:-2])
    assert waits.longest == ("pipeline wait", waits.pipeline)
    assert waits.dispatch[0] == "deepep" and 0 < waits.dispatch[1] < 1  # a quarter of a layer's EP traffic


@pytest.mark.parametrize("name", list(NAMED_RECIPES))
def test_named_recipes_fit_the_default_timeout(name):
    plan = recipe_plan(name)
    assert findings(plan, {"distributed_timeout_minutes": 10}) == []
    assert TIMEOUT_SAFETY * longest_waits(plan).longest[1] < 60  # seconds: a minute of timeout would do


def test_a_long_pipeline_wait_needs_a_longer_timeout():
    plan = dsv3_1m(pp=16, cp=32, vpp=None)  # 1M tokens, 16 stages, no interleaving
    wait = longest_waits(plan).pipeline
    assert 230 < wait < 250  # ~23.6 s per microbatch on a stage, 15 backward passes of ~15.7 s
    need = math.ceil(TIMEOUT_SAFETY * wait / 60)
    (finding,) = findings(plan)  # no dist section: megatron-bridge's default of 10 minutes
    assert finding.rule == "timeout/distributed" and finding.severity == "warning"
    assert finding.message.startswith(f"dist.distributed_timeout_minutes=10 (600 s) is shorter than "
                                      f"{TIMEOUT_SAFETY * wait:.0f} s: the predicted longest wait is the pipeline wait")
    # 15 x 2/3 x 23.6 s = 236 s; 3x = 707 s = 11.8 minutes
    assert finding.fix == f"set dist.distributed_timeout_minutes={need}" and need == 12
    assert findings(plan, {"distributed_timeout_minutes": need}) == []
    # interleaving (VPP 4 over 8 stages) shortens the wait below what 10 minutes covers
    assert findings(dsv3_1m(pp=8, cp=64, vpp=4), {"distributed_timeout_minutes": 10}) == []


def test_timeout_after_init_is_checked_in_seconds():
    plan = recipe_plan("dsv3_256k_h100")
    wait = longest_waits(plan).longest[1]
    (finding,) = findings(plan, {"distributed_timeout_minutes": 10, "distributed_timeout_seconds_after_init": 5})
    assert finding.rule == "timeout/after-init"
    assert finding.fix == f"set dist.distributed_timeout_seconds_after_init={math.ceil(TIMEOUT_SAFETY * wait)}"
    assert findings(plan, {"distributed_timeout_seconds_after_init": math.ceil(TIMEOUT_SAFETY * wait)}) == []


def test_deepep_dispatch_against_its_compiled_timeout(monkeypatch):
    plan = recipe_plan("dsv3_128k_h100")  # DeepEP, EP 32
    assert [f.rule for f in findings(plan)] == []  # a dispatch of milliseconds
    dispatch = longest_waits(plan).dispatch[1]
    monkeypatch.setattr(timeouts, "DEEPEP_TIMEOUT_SECONDS", TIMEOUT_SAFETY * dispatch / 2)  # a timeout it would pass
    (finding,) = findings(plan)
    assert finding.rule == "timeout/deepep" and f"predicted at {dispatch:.1f} s" in finding.message
    assert findings(recipe_plan("qwen3_next_8k_gb200")) == []  # HybridEP: no compiled timeout to compare
