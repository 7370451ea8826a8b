"""Executors without a cluster: sbatch scripts (NeMo-Run dry run), node counts, refusals, error lines, submit()."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import pytest

from lcmoe_recipes import emit
from lcmoe_recipes.catalog import get_hardware
from lcmoe_recipes.cli.launch import main
from lcmoe_recipes.errors import LcmoeError, OverrideError
from lcmoe_recipes.jobs.executors.common import LaunchResult, first_error_line, hint_for, nodes_for
from lcmoe_recipes.jobs.executors.slurm import SlurmSettings, nvl72_segment
from lcmoe_recipes.jobs.submit import submit


def sbatch_lines(script: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", script, flags=re.M))


def test_nodes_for():
    assert nodes_for(256, 8) == 32 and nodes_for(128, 4) == 32
    with pytest.raises(LcmoeError, match="100 GPUs do not fill whole nodes of 8; use 96 or 104 GPUs"):
        nodes_for(100, 8)
    with pytest.raises(LcmoeError, match="use 4 or 8 GPUs"):
        nodes_for(6, 4)


def test_nvl72_segment():
    gb200, h100 = get_hardware("gb200"), get_hardware("h100")
    assert nvl72_segment(gb200, 32) == 16   # 128 GPUs: two 64-GPU blocks (--segment=16 trays)
    assert nvl72_segment(gb200, 8) == 8     # 32 GPUs: one block
    assert nvl72_segment(gb200, 1) is None
    assert nvl72_segment(h100, 32) is None  # HGX: the NVLink domain is the node


@pytest.mark.parametrize("text, line", [
    ("[default0]:ok\n[default1]:error: this job has 2 ranks but the config was planned for 32\n  fix: x\n",
     "error: this job has 2 ranks but the config was planned for 32"),
    ("Traceback (most recent call last):\n  File \"x\"\n[rank3]:torch.OutOfMemoryError: CUDA out of memory\n",
     "torch.OutOfMemoryError: CUDA out of memory"),
    ("+ srun hostname\nsrun: error: node1: task 0: Exited with exit code 2\n",
     "srun: error: node1: task 0: Exited with exit code 2"),
    ("+ srun --container-image x\nsrun: unrecognized option '--container-image'\n",
     "srun: unrecognized option '--container-image'"),
    ("all fine\n", None),
])
def test_first_error_line(text, line):
    assert first_error_line(text) == line


def test_failure_summary_names_the_fix():
    result = LaunchResult("slurm", "FAILED", "sbatch", Path("x.yaml"), job_id="12", exit_code=255,
                          log_path=Path("/j/log-x_12_0.out"),
                          first_error="srun: unrecognized option '--container-image'")
    assert result.summary().splitlines()[:4] == [
        "slurm: FAILED (Slurm job 12), exit code 255", "  log: /j/log-x_12_0.out",
        "  first error: srun: unrecognized option '--container-image'",
        "  fix: this cluster's srun has no Pyxis/enroot: drop --container-image and run this virtualenv from a shared "
        "filesystem, or use a cluster with Pyxis"]
    assert hint_for("torch.OutOfMemoryError: CUDA out of memory").startswith("the ranks ran out of GPU memory")
    assert hint_for("ValueError: something else") is None


@pytest.mark.slow
def test_sbatch_script_dsv3_h100(configs, nemorun_home, tmp_path):
    _, cfg = configs["dsv3_128k_h100"]
    settings = SlurmSettings(account="llm", partition="batch", time="02:00:00", container_image="nvcr.io/nvidia/nemo:26.06",
                             container_mounts=("/lustre/data:/data",), env={"NCCL_DEBUG": "INFO"})
    result = submit(cfg, settings, dry_run=True, output=tmp_path / "dsv3.yaml")
    assert result.state == "DRY_RUN" and result.command == "sbatch --requeue --parsable"
    flags = sbatch_lines(result.script)
    assert flags["nodes"] == "32" and flags["gpus-per-node"] == "8" and flags["ntasks-per-node"] == "1"
    assert flags["account"] == "llm" and flags["partition"] == "batch" and flags["time"] == "02:00:00"
    assert flags["job-name"] == "lcmoe-dsv3_128k_h100-train" and "exclusive" in result.script
    assert "segment" not in flags
    for env in ("CUDA_DEVICE_MAX_CONNECTIONS=1", "TORCH_NCCL_AVOID_RECORD_STREAMS=1", "NCCL_NVLS_ENABLE=0", "NCCL_DEBUG=INFO"):
        assert f"export {env}\n" in result.script
    assert "NVLINK_DOMAIN_SIZE" not in result.script  # HybridEP's variables: not with DeepEP
    command = next(line for line in result.script.splitlines() if line.startswith("srun --output"))
    assert "--container-image nvcr.io/nvidia/nemo:26.06" in command and "/lustre/data:/data" in command
    # nemo:26.06 holds megatron-core 0.18.0 / megatron-bridge 0.5.0: the overlay's mount and variable, not built
    key = re.search(r"lcmoe-overlays/([0-9a-f]{12}):/lcmoe_overlay:ro", command).group(1)
    assert f"{nemorun_home}/experiments/lcmoe-overlays/{key}:/lcmoe_overlay:ro" in command
    assert "export LCMOE_OVERLAY=/lcmoe_overlay\n" in result.script
    assert not (nemorun_home / "experiments" / "lcmoe-overlays").exists()  # a dry run builds nothing
    overlay_note = next(n for n in result.notes if n.startswith("overlay: "))
    assert overlay_note.startswith("overlay: nvcr.io/nvidia/nemo:26.06, NeMo Framework 26.06 holds megatron-core "
                                   "0.18.0 / megatron-bridge 0.5.0; to be built on this machine (login node) into "
                                   f"{nemorun_home}/experiments/lcmoe-overlays/{key} (~")
    assert ("MiB as installed here: megatron-core 0.19.2, megatron-bridge 0.6.2, hydra-core 1.3.8, multi-storage-client "
            "1.3.1, opentelemetry-api 1.45.2), mounted at /lcmoe_overlay, first on the job's import path") in overlay_note
    # the Python API plans the job's resiliency as launch does (jobs.prepare.job_resilience): the FT launcher, and an
    # exit moved from --time 02:00:00 minus 20 min (100) to 79 min, leaving room for DeepSeek-V3's final save
    assert re.search(r"ft_launcher .*--max-restarts 3 .*--nnodes 32 --nproc-per-node 8 .*-m lcmoe_recipes\.train "
                     r"--config dsv3\.yaml train\.exit_duration_in_mins=79$", command), command
    assert "train.exit_duration_in_mins=100" not in result.summary()
    # and judges the time as launch does: against that earlier exit, with the start-up the exit clock counts; the
    # config's own warnings come with it (they were dropped)
    short = next(n for n in result.notes if n.startswith("warning: job/time-short: "))
    # in the Python API's words (SlurmSettings.time), not launch's --time
    assert "predicted + 13 min of start-up + " in short
    assert " SlurmSettings.time=02:00:00 has the job exit after 79 min" in short
    assert "--time" not in short and "or give SlurmSettings.time=" in short
    assert short.endswith("(41 min for the final save included)")  # 120 - 79: the suggested --time keeps that exit
    # the recovery saves come at least once in the job's steps: 79 min less the 13 min of start-up, over ~874 s steps
    assert "note: checkpoint.non_persistent_save_interval=4: lowered to the job's usable 1.1 h (4 steps)" in (
        result.summary())
    assert any(n.startswith("warning: time/phase-long: ") for n in result.notes)
    written = emit.read_yaml(tmp_path / "dsv3.yaml")[0]
    assert written.ft.enable_ft_package and written.inprocess_restart.enabled and written.nvrx_straggler.enabled
    assert cfg.ft is None and cfg.inprocess_restart is None  # the caller's ConfigContainer is left as it was
    assert (tmp_path / "dsv3.ft.yaml").read_text().startswith("fault_tolerance:")
    plain = submit(cfg, settings, dry_run=True, output=tmp_path / "plain.yaml", resiliency=False)
    line = next(line for line in plain.script.splitlines() if line.startswith("srun --output"))
    assert re.search(r"torchrun .*--nnodes 32 --nproc-per-node 8 .*-m lcmoe_recipes\.train --config plain\.yaml "
                     r"train\.exit_duration_in_mins=100$", line), line  # --time 02:00:00 minus 20 min
    assert "note: train.exit_duration_in_mins=100: megatron-bridge ends training after 100 min and then saves a " \
           "checkpoint, 20 min before SlurmSettings.time=02:00:00 (120 min)" in plain.summary()
    assert emit.read_yaml(tmp_path / "plain.yaml")[0].ft is None and not (tmp_path / "plain.ft.yaml").exists()
    assert f"note: job folder {nemorun_home}/experiments: every node must see it (a shared filesystem)" in result.summary()
    assert "export PATH=" not in result.script  # in a container, the image's torchrun
    header = (tmp_path / "dsv3.yaml").read_text().splitlines()[0]
    assert header.startswith('# lcmoe_recipes: {"base_recipe": "megatron.bridge.') and '"hardware": "h100"' in header


@pytest.mark.slow
def test_sbatch_script_qwen3_gb200_nvl72(configs, nemorun_home, tmp_path):
    _, cfg = configs["qwen3_235b_128k_gb200"]
    result = submit(cfg, SlurmSettings(account="llm"), dry_run=True, output=tmp_path / "q.yaml",
                    data_path=["0.7", "/data/a", "0.3", "/data/b"], tokenizer="Qwen/Qwen3-235B-A22B")
    flags = sbatch_lines(result.script)
    assert flags["nodes"] == "32" and flags["gpus-per-node"] == "4" and flags["segment"] == "16"
    for env in ("NVLINK_DOMAIN_SIZE=72", "USE_MNNVL=1", "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=32",
                "CUDA_DEVICE_MAX_CONNECTIONS=32"):
        assert f"export {env}\n" in result.script
    assert "--nnodes 32 --nproc-per-node 4" in result.script
    assert ("-m lcmoe_recipes.train --config q.yaml --data-path 0.7 /data/a 0.3 /data/b "
            "--tokenizer Qwen/Qwen3-235B-A22B train.exit_duration_in_mins=220") in result.script
    assert f"export PATH={os.path.dirname(os.sys.executable)}:$PATH" in result.script  # no image: this venv


@pytest.mark.slow
def test_smoke_script_is_one_cpu_node(configs, nemorun_home, tmp_path):
    _, cfg = configs["qwen3_next_8k_gb200"]
    result = submit(cfg, SlurmSettings(account="llm"), smoke=True, smoke_ranks=2, dry_run=True,
                    output=tmp_path / "n.yaml")
    flags = sbatch_lines(result.script)
    assert flags["nodes"] == "1" and "gpus-per-node" not in flags and "exclusive" not in result.script
    assert "--nnodes 1 --nproc-per-node 2" in result.script and result.script.rstrip().endswith("fi")
    assert result.script.splitlines()[-13].endswith("lcmoe_recipes.train --config n.yaml --smoke")  # no exit duration
    two = submit(cfg, SlurmSettings(account="llm"), smoke=True, smoke_nodes=2, dry_run=True, output=tmp_path / "n.yaml")
    assert sbatch_lines(two.script)["nodes"] == "2" and "--nnodes 2 --nproc-per-node 2" in two.script


@pytest.mark.slow
def test_submit_refusals(configs, nemorun_home, tmp_path, monkeypatch):
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    monkeypatch.delenv("SLURM_ACCOUNT", raising=False)
    _, cfg = configs["dsv3_128k_h100"]
    out = tmp_path / "d.yaml"
    for time in ("4", "04:00", "4h"):  # one rule for every spelling: the hours must be there
        with pytest.raises(LcmoeError, match=f"`time` '{time}' is "):
            submit(cfg, SlurmSettings(time=time), dry_run=True, output=out)
        assert not out.exists()
    with pytest.raises(LcmoeError, match="the other 31 nodes of this 32-node job cannot read its script and code"):
        submit(cfg, SlurmSettings(job_dir="/tmp/me/nemorun"), dry_run=True, output=out)
    with pytest.raises(LcmoeError, match="`save_dir` 'ckpt' is relative"):
        submit(cfg, "slurm", save_dir="ckpt", dry_run=True, output=out)
    # in the Python API's words: SlurmSettings.container_mounts, not launch's --container-mounts
    with pytest.raises(LcmoeError, match="checkpoint.save ./ckpt/run1/checkpoints. is not inside any "
                                         "SlurmSettings.container_mounts "
                                         "destination") as err:
        submit(cfg, SlurmSettings(container_image="img", container_mounts=("/lustre:/lustre",)), save_dir="/ckpt/run1",
               dry_run=True, output=out)
    assert err.value.fix == "add a mount: SlurmSettings.container_mounts=/lustre:/lustre,/ckpt/run1:/ckpt/run1"
    assert not out.exists()
    with pytest.raises(LcmoeError, match="`tunnel` ssh needs `host`, `user`, `job_dir`"):
        submit(cfg, SlurmSettings(account="a", tunnel="ssh"), dry_run=True, output=out)
    with pytest.raises(LcmoeError, match="contains '/nemo_run', which NeMo-Run rewrites"):
        submit(cfg, SlurmSettings(account="a", job_dir="/home/me/nemo_run/experiments"), dry_run=True, output=out)
    with pytest.raises(LcmoeError, match="unknown executor 'k8s'; use one of local, slurm"):
        submit(cfg, "k8s")
    with pytest.raises(LcmoeError) as caught:  # a run that trains: every blocker at once, nothing written
        submit(cfg, "local", output=out)
    assert caught.value.message == (
        "this launch would not train as asked: (1) the config names no dataset (`dataset.blend` is null): megatron-core "
        "would train on its mock dataset of synthetic tokens; (2) the config extends the model's positions (a RoPE/YaRN "
        "scaling factor above 1) but starts from random weights (`checkpoint.pretrained_checkpoint` is null); (3) this "
        "machine has 0 GPU(s); the config needs 256")
    assert caught.value.fix.startswith("(1) give data_path=PREFIX (Megatron .bin/.idx prefixes) with tokenizer=NAME, "
                                       "or set `mock_data` to train on mock data on purpose; (2) give from_hf=DIR")
    assert not out.exists()
    with pytest.raises(LcmoeError, match=r"as asked: \(1\) this machine has 0 GPU\(s\); the config needs 256; \(1\) run it on the cluster"):
        submit(cfg, "local", output=out, mock_data=True, from_scratch=True)  # accepted on purpose: the GPUs remain
    with pytest.raises(LcmoeError, match="planned for 256 ranks and a local run is one node"):
        submit(cfg, "local", nproc_per_node=8, output=out, mock_data=True, from_scratch=True)
    with pytest.raises(LcmoeError, match="was planned for world_size=256, not 128"):
        submit(cfg, "local", world_size=128, dry_run=True, output=out)
    with pytest.raises(OverrideError, match="mixes weights and unweighted prefixes"):
        submit(cfg, "local", data_path=["0.5", "/a", "/b"], dry_run=True)
    bare = copy.deepcopy(cfg)  # megatron's ConfigContainer deep copy keeps only its fields: the target is gone
    assert not hasattr(bare, "lcmoe_target")
    with pytest.raises(LcmoeError, match="does not say which cluster it is for \\(world_size and hardware unknown\\)"):
        submit(bare, "local", dry_run=True, output=out)
    assert submit(bare, "local", dry_run=True, output=out, world_size=256, hardware="h100").state == "DRY_RUN"
    with pytest.raises(LcmoeError, match="100 GPUs do not fill whole nodes of 8; use 96 or 104 GPUs"):
        submit(bare, "local", dry_run=True, output=tmp_path / "c.yaml", world_size=100, hardware="h100")
    assert not (tmp_path / "c.yaml").exists()  # refused before anything is written
    broken = copy.deepcopy(cfg)
    broken.model.context_parallel_size = 48
    with pytest.raises(LcmoeError, match="CP=48"):
        submit(broken, "local", dry_run=True, output=tmp_path / "b.yaml", world_size=256, hardware="h100")
    assert not (tmp_path / "b.yaml").exists()


@pytest.mark.slow
def test_given_nemo_run_executor_must_match_the_plan(configs, nemorun_home, tmp_path):
    import nemo_run as run

    _, cfg = configs["qwen3_next_8k_gb200"]
    executor = run.SlurmExecutor(account="a", nodes=4, gpus_per_node=4,
                                tunnel=run.LocalTunnel(job_dir=str(nemorun_home)))
    with pytest.raises(LcmoeError, match="4 node\\(s\\) x 4 GPUs = 16 ranks; the config was planned for 32"):
        submit(cfg, executor, dry_run=True, output=tmp_path / "n.yaml")
    executor.nodes = 8
    result = submit(cfg, executor, dry_run=True, output=tmp_path / "n.yaml")
    assert sbatch_lines(result.script)["nodes"] == "8"


@pytest.mark.slow
def test_cli_slurm_dry_run_prints_the_script(capsys, tmp_path, nemorun_home, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["qwen3_next", "--seq", "32768", "--executor", "slurm", "--account", "llm", "--partition", "gb200",
                 "--env", "NCCL_DEBUG=WARN", "--sbatch", "reservation=r1", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "#SBATCH --nodes=8\n" in out and "#SBATCH --gpus-per-node=4\n" in out and "#SBATCH --segment=8\n" in out
    assert "#SBATCH --reservation=r1\n" in out and "export NCCL_DEBUG=WARN\n" in out
    assert "slurm: DRY_RUN" in out
    code = main(["qwen3_next", "--seq", "32768", "--executor", "slurm", "--account", "llm", "--env", "NOEQUALS",
                 "--dry-run"])
    assert code == 2 and "--env 'NOEQUALS' is not KEY=VALUE" in capsys.readouterr().err
    code = main(["qwen3_next", "--seq", "8192", "--executor", "slurm", "--time", "4", "--output", "x.yaml"])
    assert code == 2 and "--time '4' is 4 minute(s) to Slurm" in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()  # bad input writes nothing


@pytest.mark.slow
def test_no_account_no_account_line(capsys, tmp_path, nemorun_home, monkeypatch, configs):
    """Many clusters have no accounts: without --account (and $SBATCH_ACCOUNT) the script has no account line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    monkeypatch.delenv("SLURM_ACCOUNT", raising=False)
    assert main(["qwen3_next", "--seq", "8192", "--executor", "slurm", "--dry-run", "--output", "x.yaml"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --nodes=8\n" in out and "--account" not in out and "#SBATCH --job-name=lcmoe-qwen3_next_8k" in out
    _, cfg = configs["qwen3_next_8k_gb200"]
    assert "--account" not in submit(cfg, "slurm", dry_run=True, output=tmp_path / "y.yaml").script
    monkeypatch.setenv("SBATCH_ACCOUNT", "llm")
    assert sbatch_lines(submit(cfg, "slurm", dry_run=True, output=tmp_path / "y.yaml").script)["account"] == "llm"


@pytest.mark.slow
def test_save_dir(capsys, tmp_path, nemorun_home, monkeypatch, configs):
    """--save-dir puts checkpoints (save and load: a resubmitted job resumes) and logs under one folder; without it
    the saves land in the job folder, and the summary says so."""
    from lcmoe_recipes.emit import read_yaml

    monkeypatch.chdir(tmp_path)
    assert main(["qwen3_next", "--seq", "8192", "--executor", "slurm", "--dry-run", "--output", "a.yaml"]) == 0
    assert "job/saves-in-job-folder: checkpoint.save 'nemo_experiments/qwen3_next_8k_gb200/checkpoints' is " \
           "relative" in capsys.readouterr().out
    assert main(["qwen3_next", "--seq", "8192", "--executor", "slurm", "--save-dir", "/lustre/me/run1", "--dry-run",
                 "--output", "b.yaml"]) == 0
    out = capsys.readouterr().out
    assert "saves-in-job-folder" not in out and "train.exit_duration_in_mins=220" in out
    cfg, meta = read_yaml(tmp_path / "b.yaml")
    assert (cfg.checkpoint.save, cfg.checkpoint.load) == ("/lustre/me/run1/checkpoints",) * 2
    assert cfg.logger.tensorboard_dir == "/lustre/me/run1/tensorboard" and cfg.logger.wandb_save_dir == "/lustre/me/run1/wandb"
    assert meta["overrides"][:2] == ["checkpoint.save='/lustre/me/run1/checkpoints'",
                                     "checkpoint.load='/lustre/me/run1/checkpoints'"]
    assert main(["qwen3_next", "--seq", "8192", "--save-dir", "run1", "--dry-run", "--output", "c.yaml"]) == 2
    assert "--save-dir 'run1' is relative" in capsys.readouterr().err and not (tmp_path / "c.yaml").exists()
    _, built = configs["qwen3_next_8k_gb200"]
    script = submit(built, "slurm", save_dir="/lustre/me/run2", dry_run=True, output=tmp_path / "d.yaml").script
    assert "--config d.yaml --save-dir /lustre/me/run2 train.exit_duration_in_mins=220\n" in script


@pytest.mark.slow
def test_submit_a_written_yaml_to_slurm_adds_the_jobs_resiliency_beside_it(configs, nemorun_home, tmp_path):
    """A YAML with our header, written for a local run, submitted to Slurm: the job's resiliency sections go into
    <stem>.slurm.yaml beside it (the file given is not rewritten), which the job runs; that file, submitted again,
    is run as it is."""
    _, cfg = configs["dsv3_128k_h100"]
    local = submit(cfg, "local", dry_run=True, output=tmp_path / "d.yaml")
    assert local.state == "DRY_RUN" and emit.read_yaml(tmp_path / "d.yaml")[0].ft is None
    before = (tmp_path / "d.yaml").read_text()
    settings = SlurmSettings(account="llm", time="02:00:00", container_image="nvcr.io/nvidia/nemo:26.06")
    first = submit(tmp_path / "d.yaml", settings, dry_run=True)
    assert (tmp_path / "d.yaml").read_text() == before
    assert "--config d.slurm.yaml train.exit_duration_in_mins=79" in first.script and "ft_launcher" in first.script
    assert emit.read_yaml(tmp_path / "d.slurm.yaml")[0].ft.enable_ft_package
    again = submit(tmp_path / "d.slurm.yaml", settings, dry_run=True)
    assert "--config d.slurm.yaml " in again.script and not (tmp_path / "d.slurm.slurm.yaml").exists()
    plain = submit(tmp_path / "d.yaml", settings, dry_run=True, resiliency=False)  # runs d.yaml as it is
    assert "--config d.yaml " in plain.script and (tmp_path / "d.slurm.yaml").exists()  # the other file kept
    # the resilient job's own YAML with resiliency off: its sections are removed from the config the job runs
    off = submit(tmp_path / "d.slurm.yaml", settings, dry_run=True, resiliency=False)
    assert "--config d.slurm.slurm.yaml " in off.script and "ft_launcher" not in off.script
    written = emit.read_yaml(tmp_path / "d.slurm.slurm.yaml")[0]
    assert (written.ft, written.inprocess_restart, written.nvrx_straggler) == (None, None, None)
    assert ("resiliency off: the config's ft, inprocess_restart, nvrx_straggler section(s) removed from the job's "
            "config") in off.notes
    assert not list(tmp_path.glob(".*staged*"))
