"""The commands wire the library's features: Kubernetes and the overlay (issue 18), phases on the wall clock and on
Slurm, the calibration profile and the calibration run (issue 19) -- each through the one resolver."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from lcmoe_recipes.cli.check import main as check
from lcmoe_recipes.cli.launch import main as launch
from lcmoe_recipes.cli.plan import main as plan

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"


@pytest.fixture
def profile(tmp_path):
    """A calibration profile fitted from the upstream-format log fixture of qwen3_235b_128k_gb200."""
    from lcmoe_recipes.cli.calibrate import main as calibrate

    out = tmp_path / "gb200.yaml"
    assert calibrate([str(LOGS / "bridge_qwen3_235b_128k_gb200.log"), "--config", "qwen3_235b_128k_gb200",
                      "--out", str(out)]) == 0
    return out


def test_plan_with_a_calibration_profile_shows_both_fits(profile, capsys, tmp_path):
    capsys.readouterr()
    assert plan(["qwen3_235b", "--seq", "65536", "--gpus", "64", "--hardware", "gb200", "--top", "3",
                 "--calibration", str(profile), "--csv", str(tmp_path / "t.csv")]) == 0
    out = capsys.readouterr().out
    assert "step s (published)" in out and "TFLOP/s (published)" in out and "decided by:" in out
    header = (tmp_path / "t.csv").read_text().splitlines()[0].split(",")
    assert header[-3:] == ["step s (published)", "TFLOP/s (published)", "tie-break"] and "MBS" in header


def test_plan_searches_mbs_unless_given(capsys):
    assert plan(["qwen3_30b", "--seq", "8192", "--gpus", "16", "--hardware", "h100", "--top", "8", "--json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert {c["mbs"] for c in doc["candidates"]} - {1}, "MBS 2 or 4 priced where it fits"
    assert plan(["qwen3_30b", "--seq", "8192", "--gpus", "16", "--hardware", "h100", "--top", "8", "--json",
                 "--mbs", "1"]) == 0
    assert {c["mbs"] for c in json.loads(capsys.readouterr().out)["candidates"]} == {1}


def test_bad_profile_is_one_error(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("not: a profile\n")
    assert plan(["qwen3_235b", "--seq", "65536", "--gpus", "64", "--hardware", "gb200", "--calibration", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "fix: " in err and "Traceback" not in err


@pytest.mark.slow
def test_launch_calibration_run_and_profile(profile, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert launch(["qwen3_235b_128k_gb200", "--calibration-run", "--dry-run", "--output", "cal.yaml"]) == 0
    out = capsys.readouterr().out
    assert "qwen3_235b_128k_gb200_calibration: valid for 4 x gb200" in out
    cfg = yaml.safe_load((tmp_path / "cal.yaml").read_text().split("\n", 1)[1])
    assert cfg["logger"]["log_interval"] == 1 and cfg["train"]["train_iters"] <= 50
    assert cfg["model"]["pipeline_model_parallel_size"] == 1
    assert launch(["qwen3_235b_128k_gb200", "--dry-run", "--calibration", str(profile), "--output", "t.yaml"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"with {re.escape(str(profile))}: step [\d.]+ s \(published fit [\d.]+ s\)", out)
    assert check(["t.yaml", "--calibration", str(profile)]) == 0
    assert f"with {profile}: step" in capsys.readouterr().out


@pytest.mark.slow
def test_launch_kubeflow_dry_run_prints_the_validated_manifest(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["qwen3_next", "--seq", "8192", "--executor", "kubeflow", "--container-image", "nvcr.io/nvidia/nemo:26.06",
            "--pvc", "lcmoe-shared", "--pvc-mount", "/shared", "--save-dir", "/shared/runs/q8k", "--time", "04:00:00",
            "--dry-run"]
    assert launch(argv) == 0
    out = capsys.readouterr().out
    assert "stack of nvcr.io/nvidia/nemo:26.06 beside the target's:" in out and "overlay" in out
    assert "kind: TrainJob" in out and "numNodes: 8" in out and "lcmoe-shared" in out
    assert "train.exit_duration_in_mins=220" in out
    assert launch([a for a in argv if a not in ("--pvc", "lcmoe-shared")]) == 2
    assert "needs a shared volume" in capsys.readouterr().err
    assert launch(argv[:-1] + ["--save-dir", "/elsewhere/q8k", "--dry-run"]) == 2  # writes outside the volume
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.slow
def test_phases_on_slurm_chain_name_and_time(tmp_path, monkeypatch, capsys, nemorun_home):
    monkeypatch.chdir(tmp_path)
    assert launch(["qwen3_30b", "--phases", "32768,65536", "--gpus", "64", "--hardware", "h100", "--executor", "slurm",
                   "--save-dir", str(tmp_path / "runs"), "--job-dir", str(nemorun_home), "--time", "2-00:00:00",
                   "--output", "ext.yaml", "--budget-hours", "1", "--fs-gbps", "0.1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "ext-phase1.yaml").is_file() and (tmp_path / "ext-phase2.yaml").is_file()  # --output's stem
    # the second phase's job waits for the first (NeMo-Run quotes the value)
    assert "#SBATCH --dependency='afterok:<job id of qwen3_30b_32k_64xh100-phase1>'" in out
    assert out.count("  phase: 1000 steps x ") == 2 and "time/phase-long" in out  # each phase's wall clock, 1 h budget
    from lcmoe_recipes import TrainingRequest, phase_requests
    from lcmoe_recipes import resolve
    from lcmoe_recipes.cost.wallclock import save_intervals

    first = resolve(phase_requests(TrainingRequest(model="qwen3_30b", phases=(32768, 65536), num_gpus=64,
                                                   hardware="h100", fs_gbps=0.1))[0]).plan
    saved = yaml.safe_load((tmp_path / "ext-phase1.yaml").read_text().split("\n", 1)[1])["checkpoint"]
    # at 0.1 GB/s one save takes longer than 50 steps (upstream's interval): saves are one write apart
    assert first.fs_gbps == 0.1 and saved["save_interval"] == save_intervals(first).persistent > 50


@pytest.mark.slow
def test_a_resilient_slurm_dry_run_writes_its_own_yaml_that_check_accepts(tmp_path, monkeypatch, capsys, nemorun_home):
    """A fresh user's trial: the Slurm dry run wrote out/dsv3_128k_h100.yaml, the local dry run's name, with the
    job's resiliency sections in it, and `check` then called it an edited named recipe. The job's YAML is now
    out/<plan>+<hash>.slurm.yaml, its header marks the sections as the job's, and `check` reports no edit. The hash
    covers the sections' values, which follow --time: another limit's job (a second trial) overwrote the first's."""
    monkeypatch.chdir(tmp_path)
    assert launch(["dsv3", "--seq", "131072", "--executor", "slurm", "--time", "04:00:00", "--job-dir",
                   str(nemorun_home), "--dry-run"]) == 0
    out = capsys.readouterr().out
    (written,) = (tmp_path / "out").glob("dsv3_128k_h100+*.slurm.yaml")
    assert not (tmp_path / "out" / "dsv3_128k_h100.yaml").exists()
    assert '"slurm_resiliency": true' in written.read_text().splitlines()[0] and "enable_ft_package: true" in (
        written.read_text())
    assert f"--config {written.name}" in out
    # the summary's resume interval is the one written (lowered to the 4 h job's usable time), not the plan's 30
    from lcmoe_recipes.emit import read_yaml

    interval = read_yaml(written)[0].checkpoint.non_persistent_save_interval
    assert f"checkpoint.non_persistent_save_interval={interval}: lowered to the job's usable" in out
    assert f"  checkpoints: resume points every {interval} steps (" in out
    assert check([str(written)]) in (0, 1)
    assert "config/edited-named-recipe" not in capsys.readouterr().out
    first = written.read_text()
    assert launch(["dsv3", "--seq", "131072", "--executor", "slurm", "--time", "12:00:00", "--job-dir",
                   str(nemorun_home), "--dry-run"]) == 0
    assert written.read_text() == first and len(list((tmp_path / "out").glob("dsv3_128k_h100+*.slurm.yaml"))) == 2


@pytest.mark.slow
def test_run_options_do_not_overwrite_the_plain_recipes_yaml(tmp_path, monkeypatch, capsys):
    """A fresh user's --tokens-per-step wrote out/<recipe>.yaml (GBS 88 in it), which a plain launch then overwrote
    without a word: run options name the file by a hash, as overrides do."""
    monkeypatch.chdir(tmp_path)
    assert launch(["qwen3_235b", "--seq", "131072", "--tokens-per-step", "4194304", "--dry-run"]) == 0
    capsys.readouterr()
    (written,) = (tmp_path / "out").glob("qwen3_235b_128k_gb200+*.yaml")
    assert not (tmp_path / "out" / "qwen3_235b_128k_gb200.yaml").exists()
    assert '"options": {"tokens_per_step": 4194304}' in written.read_text().splitlines()[0]
