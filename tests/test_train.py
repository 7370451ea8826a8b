"""The entry script every rank runs: target refusal, re-planning, smoke mode through a real torchrun (gloo)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lcmoe_recipes.errors import LcmoeError
from lcmoe_recipes.launch import main as launch_main
from lcmoe_recipes.train import check_target, hardware_of_device, main

META = {"recipe": "qwen3_next_8k_gb200", "model": "qwen3_next", "seq_length": 8192, "world_size": 32,
        "hardware": "gb200", "overrides": []}


def test_check_target():
    check_target(META, 32, "NVIDIA GB200")
    check_target(META, None, None)  # nothing found, nothing to compare
    with pytest.raises(LcmoeError, match="this job has 16 ranks but the config was planned and validated for 32; "
                                         "launch 32 ranks, or pass --replan to plan again for 16"):
        check_target(META, 16, "NVIDIA GB200")
    with pytest.raises(LcmoeError, match="runs on 'NVIDIA H100 80GB HBM3' but the config was planned for gb200"):
        check_target(META, 32, "NVIDIA H100 80GB HBM3")


def test_hardware_of_device():
    assert hardware_of_device("NVIDIA H100 80GB HBM3") == "h100"
    assert hardware_of_device("NVIDIA GB200") == "gb200"
    assert hardware_of_device("NVIDIA A100-SXM4-80GB") is None and hardware_of_device(None) is None


@pytest.fixture(scope="module")
def next_yaml(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train")
    assert launch_main(["qwen3_next_8k_gb200", "--dry-run", "--output", str(folder / "n.yaml")]) == 0
    return folder / "n.yaml"


@pytest.mark.slow
def test_refuses_another_world_size(next_yaml, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert main(["--config", str(next_yaml)]) == 2
    err = capsys.readouterr().err
    assert "error: this job has 8 ranks but the config was planned and validated for 32" in err


@pytest.mark.slow
def test_smoke_outside_torchrun_names_the_fix(next_yaml, capsys, monkeypatch):
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert main(["--config", str(next_yaml), "--smoke"]) == 2
    assert "not started by torchrun: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK not set" in \
        capsys.readouterr().err


@pytest.mark.slow
def test_replan_for_what_the_job_finds(next_yaml):
    from lcmoe_recipes.emit import read_yaml
    from lcmoe_recipes.train import replan

    _, meta = read_yaml(next_yaml)
    cfg, new = replan(meta, 64, "gb200", ["train.train_iters=7"])
    assert new["world_size"] == 64 and new["hardware"] == "gb200" and new["model"] == "qwen3_next"
    assert new["recipe"] != "qwen3_next_8k_gb200" and cfg.train.train_iters == 7
    assert cfg.model.seq_length == 8192
    with pytest.raises(LcmoeError, match="does not name its model and seq_length"):
        replan({"world_size": 32, "hardware": "gb200"}, 64, "gb200", [])


@pytest.mark.slow
def test_real_torchrun_smoke_and_refusal(next_yaml, tmp_path):
    """Two ranks through torch.distributed.run: the smoke run passes (gloo all-reduce, same config digest on both);
    a training run with the same 2 ranks is refused on every rank before touching a GPU."""
    def torchrun(*args):
        return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               "-m", "lcmoe_recipes.train", "--config", str(next_yaml), *args],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)

    smoke = torchrun("--smoke")
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    for rank in (0, 1):
        assert f"smoke rank {rank}/2" in smoke.stdout
    assert smoke.stdout.count("all_reduce 3 (expected 3)") == 2 and "identical on every rank" in smoke.stdout
    assert "a training run would be refused (this job has 2 ranks" in smoke.stdout
    refused = torchrun()
    assert refused.returncode != 0
    assert refused.stderr.count("error: this job has 2 ranks but the config was planned and validated for 32") == 2


@pytest.mark.slow
def test_launch_local_smoke_writes_a_log(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert launch_main(["qwen3_next", "--seq", "8192", "--executor", "local", "--smoke"]) == 0
    out = capsys.readouterr().out
    assert "local: SUCCEEDED, exit code 0" in out
    logs = list((tmp_path / "out" / "logs").glob("qwen3_next_8k_gb200-*.log"))
    assert len(logs) == 1 and logs[0].read_text().count("all_reduce 3 (expected 3)") == 2


@pytest.mark.slow
def test_replan_in_the_entry_script(next_yaml, capsys, monkeypatch):
    """--replan on a 64-rank job: the rank plans again for 64 x GB200 instead of refusing, then stops at the first
    thing this CPU machine lacks (the GPU)."""
    monkeypatch.setenv("WORLD_SIZE", "64")
    monkeypatch.setenv("RANK", "0")
    assert main(["--config", str(next_yaml), "--replan"]) == 2
    out, err = capsys.readouterr()
    assert "re-planned qwen3_next seq_length 8192 for 64 x gb200" in out
    assert "planned and validated for" not in err and "error: no GPU on this rank" in err
