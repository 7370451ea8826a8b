"""The fault drill (lcmoe_recipes.jobs.drill) on the one-node Slurm of scripts/slurm_local.sh, through the launch path:
``launch --executor slurm --drill`` submits an uninterrupted reference job and a faulted one (NeMo-Run's
SlurmExecutor, torchrun, 2 CPU ranks on gloo, megatron-core torch_dist checkpoints); the faulted one survives a
SIGKILLed rank, a hung rank, a cancel-and-requeue and a truncated checkpoint, and ends bit-identical to the reference.

Skips without Slurm, except under ``LCMOE_REQUIRE_SLURM=1`` (``.ci/run``), where a missing cluster fails. The
verdict's arithmetic is tested without Slurm (:func:`test_judge_refuses_a_resume_that_differs_or_loses_too_much`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from lcmoe_recipes.jobs.drill import DEFAULT_FAULTS, judge
from test_slurm_live import slurm  # noqa: F401 -- the module's cluster fixture


def _write(folder, metrics, events):
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_judge_refuses_a_resume_that_differs_or_loses_too_much(tmp_path):
    ref = [{"attempt": 0, "step": s, "loss": 5.0 - s / 10, "checksum": f"c{s}"} for s in range(1, 13)]
    _write(tmp_path / "ref", ref, [{"event": "start", "attempt": 0}])
    run = [dict(m) for m in ref if m["step"] <= 6]
    run += [{**m, "attempt": 1} for m in ref if m["step"] >= 5]
    events = [{"event": "start", "attempt": 0},
              {"event": "fault", "fault": "kill", "step": 7, "rank": 1, "attempt": 0, "last_step": 6},
              {"event": "resume", "attempt": 1, "iteration": 4, "corrupt": None, "skipped": []},
              {"event": "finished", "attempt": 1, "checksum": "c12"}]
    _write(tmp_path / "good", run, events)
    verdict = judge(tmp_path / "ref", tmp_path / "good", interval=4, iters=12)
    assert verdict.ok and verdict.line() == "faults injected 1, survived 1, steps lost 2, corrupt loads 0"

    bad = [dict(m) for m in run]
    bad[6]["checksum"] = "other"  # attempt 1's step 5: the weights after the resume differ
    _write(tmp_path / "differs", bad, events)
    verdict = judge(tmp_path / "ref", tmp_path / "differs", interval=4, iters=12)
    assert not verdict.ok and verdict.survived == 0
    assert verdict.outcomes[0].why == "step 5 after the resume differs from the reference"

    far = [{**e, "iteration": 0} if e["event"] == "resume" else e for e in events]
    _write(tmp_path / "far", [dict(m) for m in ref if m["step"] <= 6] + [{**m, "attempt": 1} for m in ref], far)
    verdict = judge(tmp_path / "ref", tmp_path / "far", interval=4, iters=12)
    assert verdict.outcomes[0].lost == 6 and not verdict.outcomes[0].survived
    assert verdict.outcomes[0].why == "6 steps lost, more than the save interval 4"


pytestmark_slow = pytest.mark.slow


@pytestmark_slow
def test_drill_survives_every_fault_on_real_slurm(slurm, tmp_path):  # noqa: F811
    """The CLI's drill: every fault survived, the truncated step-16 checkpoint skipped for its shard's length, each
    resume loading the newest complete iteration before the fault (4, 8, 12, 12), no corrupt load, the final weights
    equal to the reference's; and the time it takes (CI budget: 3 minutes)."""
    env = {**os.environ, "NEMORUN_HOME": str(tmp_path / "nemorun"), "HF_HUB_OFFLINE": "1"}
    env.pop("SBATCH_ACCOUNT", None)
    start = time.time()
    out = subprocess.run([sys.executable, "-m", "lcmoe_recipes.launch", "qwen3_next", "--seq", "8192", "--executor",
                          "slurm", "--time", "00:10:00", "--drill", str(tmp_path / "drill"), "--output", "n.yaml"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    seconds = time.time() - start
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    assert "faults injected 4, survived 4, steps lost 8, corrupt loads 0\n" in out.stdout, out.stdout[-3000:]
    events = [json.loads(line) for line in (tmp_path / "drill" / "faulted" / "events.jsonl").read_text().splitlines()]
    resumes = [e for e in events if e["event"] == "resume"]
    assert [e["iteration"] for e in resumes] == [4, 8, 12, 12] and all(e["corrupt"] is None for e in resumes)
    assert [e["attempt"] for e in resumes] == [1, 2, 3, 4]  # SLURM_RESTART_COUNT: one requeue per fault
    (skipped,) = resumes[3]["skipped"]
    assert skipped[0] == "iter_0000016" and skipped[1].startswith("shard __0_0.distcp truncated: ")
    fired = sorted(e["fault"] for e in events if e["event"] == "fault")
    assert fired == sorted(f.kind for f in DEFAULT_FAULTS)
    assert any(e["event"] == "heartbeat_timeout" and e["silent_rank"] == 0 for e in events)
    ref = [json.loads(line) for line in (tmp_path / "drill" / "reference" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in ref] == list(range(1, 21)) and ref[-1]["loss"] < ref[0]["loss"] / 2  # it learns
    finished = next(e for e in events if e["event"] == "finished")
    assert finished["checksum"] == ref[-1]["checksum"]
    ckpt = tmp_path / "drill" / "faulted" / "checkpoints" / "iter_0000020"
    assert json.loads((ckpt / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    print(f"drill: {seconds:.0f} s end to end")
    assert seconds < 300, f"the drill took {seconds:.0f} s"
