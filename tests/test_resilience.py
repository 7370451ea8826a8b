"""Resiliency of a long multi-node run (lcmoe_recipes.jobs.resilience): every timeout sized from the cost model's
predicted step, first step and save (never upstream's fixed numbers), on only where it applies, and megatron-bridge's
own config classes and validation accept the result."""

from __future__ import annotations

import pytest

from lcmoe_recipes import recipe_plan
from lcmoe_recipes.checks.timeouts import TIMEOUT_SAFETY
from lcmoe_recipes.cost import estimate_step
from lcmoe_recipes.cost.wallclock import RESTART_SECONDS, eval_seconds, write_seconds
from lcmoe_recipes.jobs import resilience as rs


@pytest.fixture(scope="module")
def dsv3():
    return recipe_plan("dsv3_256k_h100")


def test_timeouts_are_sized_from_the_predicted_step_and_save(dsv3):
    res = rs.plan_resilience(dsv3, nodes=64, executor="slurm", time_limit_minutes=2880, exit_minutes=2860)
    step, write = estimate_step(dsv3).step_seconds, write_seconds(dsv3)
    first = step + rs.FIRST_STEP_EXTRA_SECONDS
    k = TIMEOUT_SAFETY
    assert res.enabled and res.launcher["initial_rank_heartbeat_timeout"] == round(k * (RESTART_SECONDS + write + first))
    assert res.launcher["rank_heartbeat_timeout"] == round(k * max(step, eval_seconds(dsv3), write))
    assert res.section_timeouts["step"] == pytest.approx(k * step)  # 3 x 767 s, not upstream's 180
    assert res.section_timeouts["checkpointing"] == pytest.approx(k * write)
    # a report every 5 steps of ~15 min, not upstream's fixed 300 s
    assert res.nvrx_straggler["report_time_interval"] == pytest.approx(round(5 * step))
    assert res.inprocess_restart["soft_timeout"] == round(k * max(first, eval_seconds(dsv3), write)) > 60
    # 48 h on 512 GPUs at 99 h MTBF: 0.48 failures in the job, 2.5 in the 243 h phase -> 3 restarts, 4 requeues
    assert res.launcher["max_restarts"] == 3 and res.retries == 4
    # the exit leaves the step in flight + two writes + start-up: 767 + 2 x 470 + 600 s = 39 min, not 20 (a write
    # of 9.4 TB at 20 GB/s: FP32 Adam moments under optimizer offload)
    assert rs.exit_margin_minutes(dsv3) == -(-(step + 2 * write + RESTART_SECONDS) // 60) == 39
    assert res.exit_duration_in_mins == 2880 - 39
    assert any(i.key == "train.exit_duration_in_mins" for i in res.items)
    assert all(i.why for i in res.items) and f"predicted step {step:.0f} s" in res.notes()[0]
    text = rs.ft_config_text(res)
    assert text.startswith("fault_tolerance:\n") and f"    step: {k * step:.0f}\n" in text


def test_off_where_it_does_not_apply(dsv3):
    assert not rs.plan_resilience(dsv3, nodes=64, executor="slurm", enabled=False).enabled
    assert "smoke" in rs.plan_resilience(dsv3, nodes=64, executor="slurm", smoke=True).off_reason
    assert "one node" in rs.plan_resilience(dsv3, nodes=1, executor="slurm").off_reason
    assert "FT launcher" in rs.plan_resilience(dsv3, nodes=64, executor="kubeflow").off_reason
    assert rs.plan_resilience(dsv3, nodes=64, executor="slurm", enabled=False).notes() == [
        "resiliency off: --no-resiliency"]


def test_megatron_bridge_accepts_the_sections_and_the_job_checks_the_package(dsv3):
    pytest.importorskip("megatron.bridge.training.config")
    from types import SimpleNamespace

    res = rs.plan_resilience(dsv3, nodes=64, executor="slurm", time_limit_minutes=240)
    cfg = SimpleNamespace(ft=None, inprocess_restart=None, nvrx_straggler=None)
    rs.apply_resilience(cfg, res)  # megatron-bridge's own dataclasses; NVRxStragglerDetectionConfig.finalize()
    assert type(cfg.ft).__name__ == "FaultToleranceConfig" and cfg.ft.enable_ft_package and cfg.ft.calc_ft_timeouts
    assert cfg.inprocess_restart.enabled and cfg.inprocess_restart.hard_timeout > cfg.inprocess_restart.soft_timeout
    assert cfg.nvrx_straggler.enabled and cfg.nvrx_straggler.report_time_interval == res.nvrx_straggler[
        "report_time_interval"]
    assert rs.needs_package(cfg) == ["ft.enable_ft_package", "inprocess_restart.enabled", "nvrx_straggler.enabled"]
    missing = rs.missing_package()
    import importlib.util

    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        assert "pip install nvidia-resiliency-ext" in missing
    else:
        assert missing is None
    bad = rs.Resilience(True, nvrx_straggler={"enabled": True, "report_time_interval": 0.0})
    with pytest.raises(ValueError, match="report_time_interval must be positive"):
        rs.apply_resilience(SimpleNamespace(), bad)
