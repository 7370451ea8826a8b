"""A Slurm job that survives the cluster: one rule for every --time spelling, the exit duration before the limit,
paths against the container's mounts, saves in the job folder, the job folder every node must see."""

from __future__ import annotations

import os

import pytest

from lcmoe_recipes.cli.common import as_flags
from lcmoe_recipes.errors import InfeasibleConfig, LcmoeError
from lcmoe_recipes.jobs.executors.slurm import SlurmSettings
from lcmoe_recipes.jobs.job_checks import (FINAL_SAVE_MARGIN_MIN, exit_duration, filesystem_of, job_folder_findings,
                                           parse_mounts, slurm_job, slurm_minutes)


@pytest.mark.parametrize("text, minutes", [
    ("04:00:00", 240), ("48:00:00", 2880), ("00:00:30", 1), ("1-00", 1440), ("1-12:30", 2190),
    ("2-00:00:00", 2880), ("0-01:00:00", 60), ("01:30:59", 91),
])
def test_slurm_times_with_hours(text, minutes):
    assert slurm_minutes(text) == minutes


@pytest.mark.parametrize("text, message", [
    ("4", "--time '4' is 4 minute(s) to Slurm (a bare number counts minutes); write the hours: --time 04:00:00 for "
          "4 hour(s), or --time 00:04:00 for 4 minute(s)"),
    ("240", "--time '240' is 240 minute(s) to Slurm (a bare number counts minutes); write the hours: --time "
            "240:00:00 for 240 hour(s), or --time 04:00:00 for 240 minute(s)"),
    ("04:00", "--time '04:00' is 4 minute(s) 0 second(s) to Slurm (MM:SS); write the hours: --time 04:00:00 for 4 "
              "hour(s) 0 minute(s), or --time 00:04:00 for 4 minute(s) 0 second(s)"),
    ("90:30", "--time '90:30' is 90 minute(s) 30 second(s) to Slurm (MM:SS); write the hours: --time 90:30:00 for "
              "90 hour(s) 30 minute(s), or --time 01:30:30 for 90 minute(s) 30 second(s)"),
    ("0", "--time '0' is no time limit at all (0 means no limit to Slurm); give the limit, e.g. --time 04:00:00"),
    ("00:00:00", "--time '00:00:00' is no time limit at all"),
    ("1:75:00", "--time '1:75:00' has minutes or seconds above 59"),
    ("1-25:00", "--time '1-25:00' has minutes or seconds above 59 (or hours above 23 after a day)"),
    ("4h", "--time '4h' is not a Slurm time limit; use HH:MM:SS or D-HH:MM:SS"),
    ("", "--time '' is not a Slurm time limit"),
])
def test_slurm_times_without_hours_are_refused(text, message):
    with pytest.raises(LcmoeError) as caught:
        slurm_minutes(text)
    assert str(caught.value).startswith("`time` ")  # the library names the field; the command line, its flag
    assert as_flags(str(caught.value), caught.value.fields).startswith(message)


def test_exit_duration_leaves_the_final_save_margin():
    assert FINAL_SAVE_MARGIN_MIN == 20
    assert exit_duration(240) == 220 and exit_duration(2880) == 2860 and exit_duration(21) == 1
    assert exit_duration(20) is None and exit_duration(5) is None


def test_parse_mounts():
    assert parse_mounts(["/lustre/data:/data", "/scratch", "/a/:/b:ro"]) == [
        ("/lustre/data", "/data"), ("/scratch", "/scratch"), ("/a", "/b")]
    with pytest.raises(LcmoeError) as caught:
        parse_mounts(["data:/data"])
    assert as_flags(caught.value.message, caught.value.fields) == ("--container-mounts entry 'data:/data' is not "
                                                                   "SRC:DST with absolute paths")


def test_job_folder_every_node_sees(tmp_path):
    refused = job_folder_findings("/tmp/me/nemorun", 8, local_tunnel=True)
    assert [(f.severity, f.rule) for f in refused] == [("error", "job/folder-node-local")]
    assert refused[0].message == ("the job folder /tmp/me/nemorun is node-local: the other 7 nodes of this 8-node job "
                                  "cannot read its script and code")
    assert refused[0].fix.startswith("use a job folder on a shared filesystem, the same path on every node: --job-dir")
    assert job_folder_findings("/dev/shm/x", 2, local_tunnel=False)[0].rule == "job/folder-node-local"
    assert job_folder_findings("/tmp/me/nemorun", 1, local_tunnel=True) == []  # one node: the node is the folder's
    mount, fstype = filesystem_of(str(tmp_path / "not" / "yet"))  # the nearest existing folder's filesystem
    assert mount == next(m for m in sorted(_mounts(), key=len, reverse=True) if str(tmp_path).startswith(m.rstrip("/")))
    home = os.path.expanduser("~/.nemo_run/experiments")
    found = filesystem_of(home)
    warned = job_folder_findings(home, 4, local_tunnel=True)
    if found[1] in ("ext4", "xfs", "overlay", "btrfs", "tmpfs", "zfs"):
        assert [f.rule for f in warned] == ["job/folder-local-fs"]
        assert warned[0].message == (f"the job folder {home} is on a local {found[1]} filesystem of this machine "
                                     f"(mounted at {found[0]}): the 4 nodes must see it too")
    else:  # a network filesystem: nothing to say
        assert warned == []
    assert job_folder_findings(home, 4, local_tunnel=False) == []  # ssh: the folder is on the cluster, not here


def test_the_nodes_python_must_be_on_shared_storage():
    """Without a container image the nodes run this virtualenv (NeMo-Run setup_lines: export PATH=BIN:$PATH): a
    venv under /tmp, as a fresh clone there gets, is only on this machine. Warned, not refused: a test cluster may run
    its jobs here."""
    from lcmoe_recipes.jobs.job_checks import python_findings

    warned = python_findings("/tmp/newuser/.venv/bin", 32, local_tunnel=True)
    assert [(f.severity, f.rule) for f in warned] == [("warning", "job/python-node-local")]
    assert warned[0].message == ("the Python environment /tmp/newuser/.venv/bin is node-local: the job's 32 nodes "
                                 "run its torchrun and python")
    assert warned[0].fix == ("use --container-image IMAGE (the image's Python runs), or --python "
                             "/shared/envs/ENV/bin/python on storage every node sees")
    assert python_findings("/tmp/newuser/.venv/bin", 1, local_tunnel=False)[0].rule == "job/python-node-local"
    home = os.path.expanduser("~/venv/bin")
    found = filesystem_of(home)
    local = python_findings(home, 4, local_tunnel=True)
    if found[1] in ("ext4", "xfs", "overlay", "btrfs", "tmpfs", "zfs"):
        assert [f.rule for f in local] == ["job/python-local-fs"]
    else:
        assert local == []
    assert python_findings(home, 4, local_tunnel=False) == []  # ssh: the path is the cluster's, not known here


def _mounts() -> list[str]:
    with open("/proc/mounts") as handle:
        return [line.split()[1] for line in handle]


# -- with a real ConfigContainer ------------------------------------------------------------------------------------

def _paths(cfg, blend=None, tokenizer=None, save=None, load=None, pretrained=None):
    if blend is not None:
        cfg.dataset.blend = [blend, None]
    if tokenizer is not None:
        cfg.tokenizer.tokenizer_type, cfg.tokenizer.tokenizer_model = "HuggingFaceTokenizer", tokenizer
    if save is not None:
        cfg.checkpoint.save = save
    cfg.checkpoint.load, cfg.checkpoint.pretrained_checkpoint = load, pretrained
    return cfg


@pytest.mark.slow
def test_paths_against_container_mounts(fresh_config, tmp_path):
    _, cfg = fresh_config("qwen3_next_8k_gb200")
    image = SlurmSettings(container_image="nvcr.io/nvidia/nemo:25.11", container_mounts=("/lustre/data:/data",))
    here = tmp_path / "tok"
    here.mkdir()

    # Everything inside a mount: no finding about paths.
    job = slurm_job(_paths(cfg, blend=["/data/web_text_document"], tokenizer="/data/tok", save="/data/ckpt"), image,
                    "/lustre/me/nemorun")
    assert [f.rule for f in job.findings] == []

    # A folder this machine has, outside every mount: refused, naming the mount to add.
    with pytest.raises(InfeasibleConfig) as caught:
        slurm_job(_paths(cfg, tokenizer=str(here)), image, "/lustre/me/nemorun")
    assert caught.value.message == (f"the Slurm job: tokenizer.tokenizer_model '{here}' is on this machine but not "
                                    "inside any --container-mounts destination: the container "
                                    "(nvcr.io/nvidia/nemo:25.11) will not see it")
    assert caught.value.fix == f"add a mount: --container-mounts /lustre/data:/data,{here}:{here}"

    # The host side of a mount: the container sees it elsewhere.
    with pytest.raises(InfeasibleConfig, match="dataset prefix '/lustre/data/web' is a path of this host, which the "
                                               "container mounts elsewhere: inside it, it is '/data/web'") as caught:
        slurm_job(_paths(cfg, blend=["/lustre/data/web"], tokenizer="/data/tok"), image, "/lustre/me/nemorun")
    assert caught.value.fix.startswith("use '/data/web' in the config, or add a mount: --container-mounts "
                                       "/lustre/data:/data,/lustre/data:/lustre/data")

    # Checkpoints written outside every mount: lost with the container.
    with pytest.raises(InfeasibleConfig, match="checkpoint.save '/ckpt/run1' is not inside any --container-mounts "
                                               "destination: the job would write it inside the container, lost when "
                                               "the job ends; add a mount: --container-mounts "
                                               "/lustre/data:/data,/ckpt/run1:/ckpt/run1"):
        slurm_job(_paths(cfg, blend=["/data/web"], tokenizer="/data/tok", save="/ckpt/run1"), image, "/j")

    # Several paths outside every mount: one fix that mounts their common parent, not each leaf folder.
    with pytest.raises(InfeasibleConfig) as caught:
        slurm_job(_paths(cfg, blend=["/data/web"], tokenizer=str(here), save=str(tmp_path / "run1" / "ckpt")),
                  image, "/j")
    assert caught.value.fix == f"add a mount: --container-mounts /lustre/data:/data,{tmp_path}:{tmp_path}"
    assert {f.rule for f in caught.value.findings} == {"job/unmounted-read", "job/unmounted-write"}
    assert {f.fix for f in caught.value.findings} == {caught.value.fix}

    # Not here, not mounted: it may be inside the image -- a warning.
    job = slurm_job(_paths(cfg, blend=["/data/web"], tokenizer="/opt/tokenizers/x", save="/data/ckpt"), image, "/j")
    assert [(f.severity, f.rule) for f in job.findings] == [("warning", "job/unmounted-read")]
    assert job.findings[0].message == ("tokenizer.tokenizer_model '/opt/tokenizers/x' is not inside any "
                                       "--container-mounts destination and not on this machine: it must be inside "
                                       "the image nvcr.io/nvidia/nemo:25.11")

    # Relative reads: the ranks run in the job's code folder.
    with pytest.raises(InfeasibleConfig, match="dataset prefix 'data/web' is relative: the ranks of a Slurm job run "
                                               "in the job's code folder, where it does not exist"):
        slurm_job(_paths(cfg, blend=["data/web"], save="/data/ckpt"), SlurmSettings(), "/j")

    # Without a container, no mount rules (the nodes' own filesystem; --smoke checks it there) ...
    job = slurm_job(_paths(cfg, blend=["/lustre/data/web"], tokenizer="/lustre/tok", save="/lustre/ckpt"),
                    SlurmSettings(), "/j")
    assert job.findings == []
    # ... but a path under this machine's /tmp is not the nodes' (a fresh user's relative --from-hf, made absolute
    # in a clone under /tmp): warned, with the field that names it
    job = slurm_job(_paths(cfg, blend=["/lustre/data/web"], tokenizer=str(here), save="/tmp/me/ckpt"),
                    SlurmSettings(), "/j", nodes=8)
    assert [(f.severity, f.rule) for f in job.findings] == [("warning", "job/path-node-local")] * 2
    messages = sorted(f.message for f in job.findings)
    assert messages == sorted([f"tokenizer.tokenizer_model {here} is node-local: the job's nodes look for it on their "
                               "own disks", "checkpoint.save /tmp/me/ckpt is node-local: each node writes it to its "
                               "own disk"])
    assert job.findings[0].fix == "use a folder on storage every node sees (the same path on each)"


@pytest.mark.slow
def test_exit_duration_and_saves_in_the_job_folder(fresh_config):
    plan, cfg = fresh_config("dsv3_128k_h100")
    assert cfg.checkpoint.save == "nemo_experiments/dsv3_128k_h100/checkpoints" and cfg.train.exit_duration_in_mins is None

    job = slurm_job(cfg, SlurmSettings(), "/home/me/.nemo_run/experiments")
    assert job.overrides == ["train.exit_duration_in_mins=220"]
    assert job.notes == [
        "job folder /home/me/.nemo_run/experiments: every node must see it (a shared filesystem)",
        "train.exit_duration_in_mins=220: megatron-bridge ends training after 220 min and then saves a checkpoint, "
        "20 min before --time 04:00:00 (240 min)"]
    assert [f.rule for f in job.findings] == ["job/saves-in-job-folder"]
    assert job.findings[0].message == (
        "checkpoint.save 'nemo_experiments/dsv3_128k_h100/checkpoints' is relative, so the ranks write it into the "
        "job's code folder (/home/me/.nemo_run/experiments/<experiment>/<run>/train/code/nemo_experiments/"
        "dsv3_128k_h100/checkpoints): every save of the model with its optimizer state (~14 bytes per parameter) "
        "lands there")
    assert job.findings[0].fix.startswith("pass --save-dir /shared/storage/RUN")

    cfg.checkpoint.save = cfg.checkpoint.load = "/lustre/me/run1/checkpoints"  # as --save-dir sets them
    job = slurm_job(cfg, SlurmSettings(time="2-00:00:00"), "/home/me/.nemo_run/experiments")
    assert job.overrides == ["train.exit_duration_in_mins=2860"] and job.findings == []
    cfg.checkpoint.save = cfg.checkpoint.load = "/home/me/.nemo_run/experiments/ckpt"
    assert [f.rule for f in slurm_job(cfg, SlurmSettings(), "/home/me/.nemo_run/experiments").findings] == [
        "job/saves-in-job-folder"]
    cfg.checkpoint.save = cfg.checkpoint.load = "/lustre/me/run1/checkpoints"

    job = slurm_job(cfg, SlurmSettings(time="00:15:00"), "/j")  # no room for the final save
    assert job.overrides == [] and [f.rule for f in job.findings] == ["job/no-final-save"]
    assert job.findings[0].message.startswith("--time 00:15:00 (15 min) leaves no room for the 20-minute")

    cfg.train.exit_duration_in_mins = 300  # the user's own value is kept, and said to be too late
    job = slurm_job(cfg, SlurmSettings(), "/j")
    assert job.overrides == [] and [f.rule for f in job.findings] == ["job/exit-after-limit"]
    assert job.notes[1] == "train.exit_duration_in_mins=300 kept from the config (--time 04:00:00 = 240 min)"
    cfg.train.exit_duration_in_mins = None

    smoke = slurm_job(cfg, SlurmSettings(), "/j", smoke=True)  # a smoke job trains nothing
    assert smoke.overrides == [] and smoke.notes == ["job folder /j: every node must see it (a shared filesystem)"]


def test_training_time_against_the_slurm_limit():
    from lcmoe_recipes.jobs.job_checks import training_time_finding

    assert training_time_finding(100, 60.0, "04:00:00", chained=True) is None  # 100 min of 220
    one = training_time_finding(1000, 279.0, "04:00:00", chained=False)
    assert one.severity == "warning" and one.rule == "job/time-short"
    assert one.message == ("1000 steps x 279 s predicted = 77.5 h, but --time 04:00:00 has the job exit after 220 min "
                           "(20 min before the limit, for the final save): the job saves and exits after about 47 steps")
    # 77.5 h of training + the 20-minute exit margin = 77 h 50 min: a limit the same check accepts
    assert one.fix == ("resubmit the same job until it finishes (it resumes from its saves), or give --time "
                       "3-05:50:00 or more (20 min for the final save included)")
    assert training_time_finding(1000, 279.0, "3-05:50:00", chained=True) is None
    from lcmoe_recipes.jobs.job_checks import suggested_time

    assert suggested_time(180) == "03:20:00"  # 3 h of training: 3:00:00 would leave only 2 h 40 min
    assert training_time_finding(180, 60.0, suggested_time(180), chained=True) is None
    assert training_time_finding(180, 60.0, "03:10:00", chained=True).severity == "error"
    # a resilient job exits earlier (its final save needs 41 min here), and megatron-bridge's exit clock counts the
    # start-up before the first step (10 min here): both shorten the training, and the suggested --time covers both
    late = training_time_finding(1000, 279.0, "04:00:00", chained=False, margin=41, startup_seconds=600)
    assert late.message == ("1000 steps x 279 s predicted + 10 min of start-up = 77.7 h, but --time 04:00:00 has the "
                            "job exit after 199 min (41 min before the limit, for the final save): the job saves and "
                            "exits after about 40 steps")
    assert late.fix.endswith("give --time 3-06:30:00 or more (41 min for the final save included)")
    assert training_time_finding(1000, 279.0, "3-06:30:00", chained=True, margin=41, startup_seconds=600) is None
    assert training_time_finding(1000, 279.0, "3-06:20:00", chained=True, margin=41, startup_seconds=600)
    # the phase's evaluations (18 min here) run before the job ends: a limit that covers only the steps is short
    assert training_time_finding(100, 60.0, "02:10:00", chained=True) is None  # 100 min of 110
    evals = training_time_finding(100, 60.0, "02:10:00", chained=True, eval_seconds=18 * 60)
    assert evals.message.startswith("100 steps x 60 s predicted + 18 min of evaluation = 2.0 h, but --time 02:10:00 "
                                    "has the job exit after 110 min")
    assert "give --time 02:20:00 or more" in evals.fix  # 118 min + 20 for the final save, in whole 10 minutes
    chained = training_time_finding(1000, 279.0, "04:00:00", chained=True)
    assert chained.severity == "error" and "the next phase (afterok) would start from that partly trained" in (
        chained.message)
    # a fresh user's --time 00:15:00: no room for the exit save (20 min margin), saves every 250 steps, about 20
    # steps reached: nothing is kept, so resubmitting is not advised (it was, beside job/no-final-save)
    short = training_time_finding(1000, 45.0, "00:15:00", chained=False, save_interval=250)
    assert short.message == ("1000 steps x 45 s predicted = 12.5 h, but --time 00:15:00 stops the job at 15 min: it "
                             "stops after about 20 steps having saved nothing (the limit leaves no room for the exit "
                             "save, and the first periodic save is at step 250): a resubmitted job would start again "
                             "from the same weights")
    assert short.fix == "give --time 12:50:00 or more (20 min for the final save included), or fewer --train-iters"
    kept = training_time_finding(1000, 45.0, "00:15:00", chained=False, save_interval=10)
    assert kept.message.endswith("Slurm stops the job after about 20 steps (the limit leaves no room for the exit "
                                 "save), the last periodic save at step 20")
    assert kept.fix.startswith("resubmit the same job until it finishes")
    unsaved = training_time_finding(1000, 279.0, "04:00:00", chained=False, save_interval=250, saves=False)
    assert "having saved nothing (checkpoint.save is unset)" in unsaved.message


def test_parent_mounts_cover_every_folder_with_one_mount_per_top_level_folder():
    from lcmoe_recipes.jobs.job_checks import parent_mounts

    assert parent_mounts(["/lustre/data/web", "/lustre/ckpt/run1", "/lustre/data/code"]) == ["/lustre:/lustre"]
    assert parent_mounts(["/lustre/me/ckpt", "/scratch/tok"]) == ["/lustre/me/ckpt:/lustre/me/ckpt",
                                                                   "/scratch/tok:/scratch/tok"]
    assert parent_mounts(["/lustre/me/a", "/lustre/me/b"]) == ["/lustre/me:/lustre/me"]


def test_a_te_config_is_refused_on_a_node_without_te(fresh_config):
    """Every recipe builds TE layers; on a node where TE cannot be imported the entry script says so before
    megatron-core fails inside its layer specs. A config switched to megatron-core's own modules runs there."""
    from lcmoe_recipes.emit.stack import te_installed
    from lcmoe_recipes.jobs.node import require_te

    _, cfg = fresh_config("qwen3_235b_128k_gb200")
    if te_installed():
        require_te(cfg)  # nothing to refuse
        return
    with pytest.raises(LcmoeError, match=r"builds Transformer Engine layers \(model.transformer_impl="
                                         r"transformer_engine\), but transformer_engine cannot be imported") as err:
        require_te(cfg)
    assert "NeMo containers" in err.value.fix
    cfg.model.transformer_impl = "local"
    require_te(cfg)
