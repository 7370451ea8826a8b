"""The entry script every rank runs: target refusal, re-planning, smoke mode through a real torchrun (gloo)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lcmoe_recipes.cli.launch import main as launch_main
from lcmoe_recipes.cli.train import main
from lcmoe_recipes.errors import LcmoeError
from lcmoe_recipes.jobs.node import check_target, hardware_of_device

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
    from lcmoe_recipes.jobs.node import replan

    _, meta = read_yaml(next_yaml)
    cfg, new = replan(meta, 64, "gb200", ["train.train_iters=7"])
    assert new["world_size"] == 64 and new["hardware"] == "gb200" and new["model"] == "qwen3_next"
    assert new["recipe"] != "qwen3_next_8k_gb200" and cfg.train.train_iters == 7
    assert cfg.model.seq_length == 8192
    with pytest.raises(LcmoeError, match="does not name its model and seq_length"):
        replan({"world_size": 32, "hardware": "gb200"}, 64, "gb200", [])


@pytest.mark.slow
def test_real_torchrun_smoke_and_refusal(next_yaml, tmp_path, zygote):
    """Two ranks through torch.distributed.run: the smoke run passes (gloo all-reduce, same config digest on both);
    a training run with the same 2 ranks is refused on every rank before touching a GPU. The launcher is forked from
    the session's server (tests/zygote.py); it starts each rank as a fresh interpreter, as on a node."""
    def torchrun(*args, monitor: float = 0.1):
        return zygote.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--monitor-interval", str(monitor),
                           "-m", "lcmoe_recipes.train", "--config", str(next_yaml), *args],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)

    smoke = torchrun("--smoke")
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    for rank in (0, 1):
        assert f"smoke rank {rank}/2" in smoke.stdout
    assert smoke.stdout.count("all_reduce 3 (expected 3)") == 2 and "identical on every rank" in smoke.stdout
    assert "a training run would be refused (this job has 2 ranks" in smoke.stdout
    # the launcher stops the other ranks at its first check after one fails: checking every 10 s lets the slower
    # rank print its own refusal (a busy machine once killed it mid-import, 2026-12-04)
    refused = torchrun(monitor=10)
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
def test_a_failed_local_smoke_exits_as_the_entry_script_does(tmp_path, capsys, monkeypatch):
    """A node that lacks a path: the smoke run exits 2 (docs/launch.md), with the ranks' error and fix lines and
    without torchrun's own traceback and failure table (the log keeps them)."""
    monkeypatch.chdir(tmp_path)
    code = launch_main(["qwen3_next", "--seq", "8192", "--executor", "local", "--smoke", "--data-path",
                        "/nonexistent/web_text", "--tokenizer", "gpt2"])
    out = capsys.readouterr().out
    assert code == 2, out[-3000:]
    assert "error: on node " in out and "/nonexistent/web_text.bin and /nonexistent/web_text.idx not found" in out
    assert "  fix: make these paths exist on " in out and "local: FAILED, exit code 2" in out
    assert "Traceback" not in out and "ChildFailedError" not in out and "Root Cause" not in out
    (log,) = (tmp_path / "out" / "logs").glob("qwen3_next_8k_gb200-*.log")
    assert "ChildFailedError" in log.read_text()  # the launcher's report is kept where the log is


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


def test_check_versions():
    from lcmoe_recipes.jobs.node import check_versions

    here = {"megatron_core": "0.19.2", "megatron_bridge": "0.6.2"}
    assert check_versions({**META, **here}, here) is None
    assert check_versions(META, here).startswith("warning: this YAML's header does not record the megatron-core")
    with pytest.raises(LcmoeError) as caught:
        check_versions({**META, "megatron_core": "0.15.0", "megatron_bridge": "0.2.0"}, here)
    assert caught.value.message == ("this config was built and validated with megatron-core 0.15.0 and megatron-bridge "
                                    "0.2.0, but this job runs megatron-core 0.19.2 and megatron-bridge 0.6.2")
    assert caught.value.fix.startswith("run it where megatron-core 0.15.0 and megatron-bridge 0.2.0 are installed")
    with pytest.raises(LcmoeError, match="but this job runs megatron-core 0.19.2 and megatron-bridge \\(not installed\\)"):
        check_versions({**META, **here}, {**here, "megatron_bridge": None})


@pytest.mark.parametrize("smoke", [True, False])
def test_version_mismatch_refused_before_any_distributed_or_gpu_work(tmp_path, smoke):
    """A YAML whose header says it was built with megatron-core 0.15.0: every rank refuses at once (exit 2), before
    megatron-bridge, torch.distributed or CUDA is touched (checked in a fresh interpreter)."""
    import json
    from importlib.metadata import version
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "qwen3_next_8k_gb200.yaml"
    body = recipe.read_text().split("\n", 1)[1]
    header = {**META, "megatron_core": "0.15.0", "megatron_bridge": version("megatron-bridge")}
    yaml = tmp_path / "old.yaml"
    yaml.write_text("# lcmoe_recipes: " + json.dumps(header, sort_keys=True) + "\n" + body)
    probe = ("import sys; from lcmoe_recipes.cli.train import main; rc = main(sys.argv[1:]); "
             "print(rc, sorted(m for m in sys.modules if m.split('.')[0] in ('megatron', 'torch')))")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "RANK": "0", "WORLD_SIZE": "32",
           "LOCAL_RANK": "0"}
    out = subprocess.run([sys.executable, "-c", probe, "--config", str(yaml), *(["--smoke"] if smoke else [])],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "2 []", out.stdout + out.stderr  # refused; neither megatron nor torch was imported
    assert (f"error: this config was built and validated with megatron-core 0.15.0 and megatron-bridge "
            f"{version('megatron-bridge')}, but this job runs megatron-core {version('megatron-core')}") in out.stderr
    assert "fix: run it where megatron-core 0.15.0" in out.stderr
