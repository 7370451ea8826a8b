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
from pathlib import Path

import pytest

from lcmoe_recipes.jobs.drill import DEFAULT_FAULTS, HEARTBEAT_TIMEOUT_S, judge
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


def _alive(job_ids):
    """Those of ``job_ids`` the controller still runs or holds."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %T", "-j", ",".join(job_ids)], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if line.strip()]


def _drill_processes(folder):
    """Processes whose command line names the drill's folder (its ranks, torchrun, srun, the ranks' forks)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and str(folder) in args:
            found.append(f"{proc.name} {args}")
    return found


@pytestmark_slow
def test_drill_survives_every_fault_on_real_slurm(slurm, tmp_path):  # noqa: F811
    """The CLI's drill: every fault survived, the truncated step-16 checkpoint skipped for its shard's length, each
    resume loading the newest complete iteration before the fault (4, 8, 12, 12), no corrupt load, the final weights
    equal to the reference's, no job or process left behind; and the time it takes (CI budget: 3 minutes)."""
    env = {**os.environ, "NEMORUN_HOME": str(tmp_path / "nemorun"), "HF_HUB_OFFLINE": "1"}
    env.pop("SBATCH_ACCOUNT", None)
    folder = tmp_path / "drill"
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "lcmoe_recipes.launch", "qwen3_next", "--seq", "8192",
                             "--executor", "slurm", "--time", "00:10:00", "--drill", str(folder), "--output",
                             "n.yaml"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=env)
    try:
        stdout, stderr = proc.communicate(timeout=700)  # the drill's own limit is 600 s for both jobs
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the driver cancels its jobs (jobs.drill.run_drill)
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(f"the drill did not end in 700 s: {stdout[-3000:]}{stderr[-2000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
        ids = list(json.loads((folder / "jobs.json").read_text()).values()) if (folder / "jobs.json").is_file() else []
        left = _alive(ids) if ids else []
        if left:
            subprocess.run(["scancel", *ids], capture_output=True)
    seconds = time.time() - start
    assert proc.returncode == 0, stdout[-4000:] + stderr[-3000:]
    assert not left, f"jobs left behind: {left}"
    assert len(ids) == 2
    end = time.time() + 30  # Slurm reaps a completed job's processes within a few seconds
    while _drill_processes(folder) and time.time() < end:
        time.sleep(0.5)
    assert not _drill_processes(folder), _drill_processes(folder)
    assert "faults injected 4, survived 4, steps lost 8, corrupt loads 0\n" in stdout, stdout[-3000:]
    events = [json.loads(line) for line in (folder / "faulted" / "events.jsonl").read_text().splitlines()]
    resumes = [e for e in events if e["event"] == "resume"]
    assert [e["iteration"] for e in resumes] == [4, 8, 12, 12] and all(e["corrupt"] is None for e in resumes)
    assert [e["attempt"] for e in resumes] == [1, 2, 3, 4]  # SLURM_RESTART_COUNT: one requeue per fault
    (skipped,) = resumes[3]["skipped"]
    assert skipped[0] == "iter_0000016" and skipped[1].startswith("shard __0_0.distcp truncated: ")
    fired = sorted(e["fault"] for e in events if e["event"] == "fault")
    assert fired == sorted(f.kind for f in DEFAULT_FAULTS)
    (timeout,) = [e for e in events if e["event"] == "heartbeat_timeout"]
    assert timeout["silent_rank"] == 0 and timeout["seconds"] >= HEARTBEAT_TIMEOUT_S
    ref = [json.loads(line) for line in (folder / "reference" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in ref] == list(range(1, 21)) and ref[-1]["loss"] < ref[0]["loss"] / 2  # it learns
    finished = next(e for e in events if e["event"] == "finished")
    assert finished["checksum"] == ref[-1]["checksum"]
    ckpt = folder / "faulted" / "checkpoints" / "iter_0000020"
    assert json.loads((ckpt / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    print(f"drill: {seconds:.0f} s end to end")
    assert seconds < 300, f"the drill took {seconds:.0f} s"
