"""The real round trip: submit through NeMo-Run's SlurmExecutor to a one-node Slurm on this machine, then read the
job's state (sacct, through slurmdbd) and its logs.

The cluster comes from ``scripts/slurm_local.sh`` (Debian's slurm-wlm, slurmdbd, mariadb, munge). The module starts it
when it is installed but not running (as root) and stops what it started. Without Slurm the tests skip -- except
under ``LCMOE_REQUIRE_SLURM=1`` (set by ``.ci/run``), where a missing cluster is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lcmoe_recipes.errors import LaunchError
from lcmoe_recipes.jobs.executors.slurm import SlurmSettings, run_slurm
from lcmoe_recipes.jobs.submit import submit

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm_local.sh"
pytestmark = pytest.mark.slow


def _unavailable(reason: str):
    if os.environ.get("LCMOE_REQUIRE_SLURM") == "1":
        pytest.fail(f"LCMOE_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


def _up() -> bool:
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and any(s.strip() in ("idle", "mix", "alloc") for s in out.stdout.splitlines())


@pytest.fixture(scope="module")
def slurm():
    if shutil.which("sbatch") is None or shutil.which("slurmctld") is None:
        _unavailable("Slurm is not installed (as root: bash scripts/slurm_local.sh install)")
    started = False
    if not _up():
        if os.geteuid() != 0:
            _unavailable("no Slurm cluster answers and starting one needs root (bash scripts/slurm_local.sh start)")
        out = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=180)
        if out.returncode != 0:
            _unavailable(f"scripts/slurm_local.sh start failed: {out.stderr[-2000:]}")
        started = True
    yield
    if started:
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=120)


def sacct_state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-j", job_id, "-n", "-X", "-P", "-o", "State,ExitCode"], capture_output=True,
                         text=True, timeout=30)
    return out.stdout.strip()


def test_cli_smoke_job_on_real_slurm(slurm, tmp_path):
    """launch --executor slurm --smoke --no-wait, without an account (no account line in the script): sbatch through
    NeMo-Run returns the job id at once; the job (2 ranks under torchrun inside the allocation) then completes, as
    sacct and its log show."""
    env = {**os.environ, "NEMORUN_HOME": str(tmp_path / "nemorun"), "HF_HUB_OFFLINE": "1"}
    env.pop("SBATCH_ACCOUNT", None)
    env.pop("SLURM_ACCOUNT", None)
    out = subprocess.run([sys.executable, "-m", "lcmoe_recipes.launch", "qwen3_next", "--seq", "8192", "--executor",
                          "slurm", "--time", "00:10:00", "--smoke", "--no-wait",
                          "--output", "n.yaml"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    found = re.search(r"slurm: SUBMITTED \(Slurm job (\d+)\)\n  logs \(once it runs\): (\S+)/\n", out.stdout)
    assert found, out.stdout[-2000:]
    job_id = found.group(1)
    deadline = time.time() + 600
    while (state := sacct_state(job_id)).split("|")[0] in ("", "PENDING", "RUNNING") and time.time() < deadline:
        time.sleep(2)
    assert state == "COMPLETED|0:0"
    logs = list((tmp_path / "nemorun" / "experiments").glob(f"*-smoke/*/smoke/log-lcmoe-*-smoke_{job_id}_0.out"))
    assert len(logs) == 1 and logs[0].parent == Path(found.group(2))
    text = logs[0].read_text()
    assert "[default0]:smoke rank 0/2" in text and "[default1]:smoke rank 1/2" in text
    assert text.count("all_reduce 3 (expected 3)") == 2 and "DIFFERS" not in text
    code = logs[0].parent / "code"  # what NeMo-Run shipped: the YAML and this package
    assert (code / "n.yaml").is_file() and (code / "lcmoe_recipes" / "train.py").is_file()
    script = (logs[0].parent.parent / "smoke_sbatch.sh").read_text()  # the batch script sbatch ran
    assert "#SBATCH --account" not in script and "#SBATCH --time=00:10:00" in script


def test_python_submit_and_a_failing_job(slurm, configs, nemorun_home, tmp_path):
    """launch.submit(cfg, SlurmSettings(...)) from Python; then a job that fails inside the allocation reports its
    job id, log and first error line; then a smoke job whose data prefix the node lacks names the node and the path."""
    _, cfg = configs["qwen3_next_8k_gb200"]
    result = submit(cfg, SlurmSettings(account="lcmoe", time="00:10:00"), smoke=True, output=tmp_path / "n.yaml")
    assert result.state == "SUCCEEDED" and result.exit_code == 0 and result.job_id, result.summary()
    assert sacct_state(result.job_id) == "COMPLETED|0:0"
    assert result.log_path.read_text().count("all_reduce 3 (expected 3)") == 2

    failed = run_slurm(tmp_path / "n.yaml", {"recipe": "broken", "world_size": 32, "hardware": "gb200"}, {},
                       SlurmSettings(account="lcmoe", time="00:10:00"), smoke=True,
                       train_args=["--smoke", "model.no_such_field=1"])
    assert failed.state == "FAILED" and not failed.ok
    assert failed.job_id and failed.job_id != result.job_id
    assert sacct_state(failed.job_id).startswith("FAILED|")
    assert failed.exit_code not in (None, 0)
    assert failed.first_error and "no_such_field" in failed.first_error, failed.summary()
    assert failed.log_path.is_file()
    summary = failed.summary()
    assert f"Slurm job {failed.job_id}" in summary and str(failed.log_path) in summary and "first error:" in summary

    missing = submit(cfg, SlurmSettings(time="00:10:00"), smoke=True, output=tmp_path / "m.yaml",
                     data_path=["/nonexistent/web_text_document"], tokenizer="Qwen/Qwen3-Next-80B-A3B")
    assert missing.state == "FAILED" and missing.exit_code not in (None, 0), missing.summary()
    assert missing.first_error == (f"error: on node {os.uname().nodename}: dataset prefix '/nonexistent/"
                                   "web_text_document': /nonexistent/web_text_document.bin and /nonexistent/"
                                   "web_text_document.idx not found (give the prefix of an existing .bin/.idx pair)")


def test_sbatch_refusals_are_reported(slurm, configs, nemorun_home, tmp_path):
    """GPU jobs on this CPU-only Slurm 22.05 node: sbatch itself refuses them; the user gets sbatch's own message
    and a fix."""
    _, cfg = configs["dsv3_128k_h100"]
    with pytest.raises(LaunchError, match="sbatch refused the job: sbatch: error: .*") as caught:
        submit(cfg, SlurmSettings(account="lcmoe", time="00:10:00"), output=tmp_path / "d.yaml", mock_data=True,
               from_scratch=True)
    assert caught.value.exit_code == 1 and "gres" in caught.value.message.lower()
    # in the Python API's words (submit names its settings and arguments, launch its flags)
    assert caught.value.fix.startswith("the partition has no nodes with those GPUs: choose a GPU partition "
                                       "(SlurmSettings.partition), or rehearse on CPUs with smoke=True")
    _, cfg = configs["qwen3_next_8k_gb200"]  # NVL72: --segment=8, which Slurm 22.05 does not know
    with pytest.raises(LaunchError, match="sbatch: unrecognized option '--segment=8'") as caught:
        submit(cfg, SlurmSettings(account="lcmoe", time="00:10:00"), output=tmp_path / "n.yaml", mock_data=True)
    assert caught.value.fix.startswith("this Slurm has no --segment (Slurm 24.05+, topology/block): pass "
                                       "SlurmSettings.segment=False")


def test_smoke_job_through_an_overlay(slurm, nemorun_home, tmp_path):
    """A job whose Python holds nemo:26.06's megatron-core 0.18.0 / megatron-bridge 0.5.0 (tests/image_env.py; this
    Slurm has no Pyxis, so the 'image' is a Python environment the node runs): launch probes it, builds the overlay of
    the pinned wheels into the job folder on this machine, and the smoke job passes the entry script's version check
    through it and completes."""
    import image_env

    from lcmoe_recipes.jobs.overlay import MANIFEST

    python = image_env.build(tmp_path / "nemo_26_06")
    result = submit(ROOT / "recipes" / "qwen3_next_8k_gb200.yaml", SlurmSettings(time="00:10:00", python=str(python)),
                    smoke=True)
    assert result.state == "SUCCEEDED" and result.exit_code == 0, result.summary()
    (note,) = [n for n in result.notes if n.startswith("overlay: ")]
    assert note.startswith(f"overlay: {python} holds megatron-core 0.18.0 / megatron-bridge 0.5.0; built on this "
                           f"machine into {nemorun_home}/experiments/lcmoe-overlays/")
    (overlay,) = (nemorun_home / "experiments" / "lcmoe-overlays").iterdir()
    assert (overlay / MANIFEST).is_file() and (overlay / "megatron_core-0.19.2.dist-info").is_dir()
    log = result.log_path.read_text()
    assert f"overlay {overlay}: megatron-core and megatron-bridge import from it" in log
    assert log.count("all_reduce 3 (expected 3)") == 2
