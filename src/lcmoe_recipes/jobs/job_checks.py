"""A Slurm job that survives the cluster: its time limit, the final checkpoint before it, and the paths it uses.

Checked before anything is submitted or written (``launch --executor slurm``, ``launch.submit``):

* ``--time`` must state its hours (:func:`slurm_minutes`): Slurm reads ``4`` and ``04:00`` as four minutes.
* The run stops itself :data:`FINAL_SAVE_MARGIN_MIN` minutes before the limit and saves a checkpoint
  (:func:`exit_duration`: megatron-bridge's ``train.exit_duration_in_mins``).
* With ``--container-image``, every absolute path the config uses must be inside a ``--container-mounts``
  destination (:func:`slurm_job`): a path the job *writes* outside every mount is refused (it would be written into
  the container and lost with it); a path it *reads* is refused when it exists on this machine (a host path the
  container will not see), and warned about otherwise (it may be inside the image).
* Relative paths the job reads are refused: the ranks run in the job's code folder, where they do not exist.
  Checkpoints written to a relative path land in that code folder, under the job folder: warned about.
* Without a container image, a path the config uses under ``/tmp``, ``/var/tmp``, ``/dev/shm`` or ``/run`` is warned
  about: the nodes look for it on their own disks (and for the Python environment they run: :func:`python_findings`).
* The job folder (NeMo-Run's experiments folder, holding the script, the code archive and the logs) must be on a
  filesystem every node sees: under ``/tmp``, ``/var/tmp``, ``/dev/shm`` or ``/run`` it is refused for a multi-node
  job; on a filesystem of this machine that is not a network filesystem (``/proc/mounts``) it is warned about.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from ..checks import Finding
from ..emit.paths import JobPath, is_url, job_paths
from ..errors import LcmoeError

FINAL_SAVE_MARGIN_MIN = 20
"""Minutes between megatron-bridge's own exit (``train.exit_duration_in_mins``) and the Slurm limit. They cover what
that clock does not count or cannot stop: the start before ``pretrain`` (srun, the container, imports: a few
minutes; megatron-bridge starts its clock in ``GlobalState``), the step running when the limit passes (checked after
each step, ``train.py: checkpoint_and_decide_exit``), and the blocking save of the full checkpoint with optimizer
state (about 14 bytes per parameter with the distributed Adam optimizer: ~9.4 TB for a 671B model, 8 minutes at
20 GB/s). megatron-bridge 0.6.2's DeepSeek-V3 GB200/GB300 perf recipes exit at 220 minutes, 20 short of our
default 4-hour limit."""

NODE_LOCAL_PREFIXES = ("/tmp", "/var/tmp", "/dev/shm", "/run")
_LOCAL_FS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "tmpfs", "ramfs", "overlay", "devtmpfs", "f2fs"}
_TIME = re.compile(r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?|(?P<h>\d+):(?P<m>\d+):(?P<s>\d+))$")


def slurm_minutes(text: str) -> int:
    """Minutes of a Slurm time limit written with its hours: ``HH:MM:SS``, ``D-HH``, ``D-HH:MM`` or ``D-HH:MM:SS``
    (hours may exceed 23 in ``HH:MM:SS``; seconds round up to a minute, as Slurm does).

    Slurm also reads ``MM`` and ``MM:SS`` (``sbatch --time``), but ``--time 4`` and ``--time 04:00`` are then four
    minutes, which is rarely what was meant: both are refused with the two spellings the user may have meant.

    Raises:
        LcmoeError: bare minutes, ``MM:SS``, minutes or seconds above 59, a zero limit (``0`` is no limit to
            Slurm), or anything else Slurm would not read; the fix spells the value out.
    """
    text = (text or "").strip()
    if re.fullmatch(r"0+", text):
        raise LcmoeError(f"`time` {text!r} is no time limit at all (0 means no limit to Slurm)",
                         "give the limit, e.g. time=04:00:00", fields=("time",))
    if text.isdigit():
        n = int(text)
        raise LcmoeError(f"`time` {text!r} is {n} minute(s) to Slurm (a bare number counts minutes)",
                         f"write the hours: time={n:02d}:00:00 for {n} hour(s), or time="
                         f"{n // 60:02d}:{n % 60:02d}:00 for {n} minute(s)", fields=("time",))
    if re.fullmatch(r"\d+:\d+", text):
        a, b = (int(x) for x in text.split(":"))
        raise LcmoeError(f"`time` {text!r} is {a} minute(s) {b} second(s) to Slurm (MM:SS)",
                         f"write the hours: time={a:02d}:{b:02d}:00 for {a} hour(s) {b} minute(s), or time="
                         f"{a // 60:02d}:{a % 60:02d}:{b:02d} for {a} minute(s) {b} second(s)", fields=("time",))
    found = _TIME.match(text)
    if not found:
        raise LcmoeError(f"`time` {text!r} is not a Slurm time limit",
                         "use HH:MM:SS or D-HH:MM:SS, e.g. time=04:00:00 or time=2-00:00:00", fields=("time",))
    g = {k: int(v) if v else 0 for k, v in found.groupdict().items()}
    if max(g["m"], g["s"], g["dm"], g["ds"]) > 59 or (found.group("d") and g["dh"] > 23):
        raise LcmoeError(f"`time` {text!r} has minutes or seconds above 59 (or hours above 23 after a day)",
                         "e.g. time=01:30:00 for an hour and a half, time=1-12:00:00 for a day and a half",
                         fields=("time",))
    minutes = (g["d"] * 24 + g["dh"] + g["h"]) * 60 + g["dm"] + g["m"] + (1 if (g["ds"] or g["s"]) else 0)
    if minutes == 0:
        raise LcmoeError(f"`time` {text!r} is no time limit at all (0 means no limit to Slurm)",
                         "give the limit, e.g. time=04:00:00", fields=("time",))
    return minutes


def exit_duration(limit_minutes: int, margin: int = FINAL_SAVE_MARGIN_MIN) -> int | None:
    """``train.exit_duration_in_mins`` for a job of ``limit_minutes``: the limit minus the exit ``margin`` (default
    :data:`FINAL_SAVE_MARGIN_MIN`; a resilient Slurm job's is :func:`lcmoe_recipes.jobs.resilience.exit_margin_minutes`),
    or None when the limit is not longer than the margin."""
    return limit_minutes - margin if limit_minutes > margin else None


def suggested_time(training_minutes: float, margin: int = FINAL_SAVE_MARGIN_MIN) -> str:
    """The shortest ``--time``, in whole 10 minutes, that leaves ``training_minutes`` of training after the exit
    ``margin`` (``3:20:00`` for 3 hours of training at the default :data:`FINAL_SAVE_MARGIN_MIN`); ``D-HH:MM:SS`` from
    a day on. :func:`training_time_finding` accepts it."""
    total = math.ceil((math.ceil(training_minutes) + margin) / 10) * 10
    days, rest = divmod(total, 24 * 60)
    hours, minutes = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:00" if days else f"{hours:02d}:{minutes:02d}:00"


def parse_mounts(mounts) -> list[tuple[str, str]]:
    """(source, destination) of Pyxis ``--container-mounts`` entries ``SRC[:DST[:FLAGS]]`` (DST defaults to SRC).

    Raises:
        LcmoeError: an entry whose source or destination is not an absolute path.
    """
    out = []
    for entry in mounts:
        parts = entry.split(":")
        src, dst = parts[0], (parts[1] if len(parts) > 1 and parts[1] else parts[0])
        if not (src.startswith("/") and dst.startswith("/")):
            raise LcmoeError(f"`container_mounts` entry {entry!r} is not SRC:DST with absolute paths",
                             "e.g. container_mounts=/lustre/data:/data,/lustre/ckpt:/lustre/ckpt",
                             fields=("container_mounts",))
        out.append((src.rstrip("/") or "/", dst.rstrip("/") or "/"))
    return out


def _under(path: str, folder: str) -> bool:
    return folder == "/" or path == folder or path.startswith(folder + "/")


def _folder_of(item: JobPath) -> str:
    """The folder to mount for ``item``: a dataset prefix's folder, else the path itself."""
    return os.path.dirname(item.path) if item.files else item.path.rstrip("/")


def parent_mounts(folders: list[str]) -> list[str]:
    """One ``SRC:DST`` mount per top-level folder that covers every folder of ``folders`` under it: their deepest
    common parent (``/lustre/data/web`` and ``/lustre/ckpt/run1`` -> ``/lustre:/lustre``), never ``/`` itself."""
    groups: dict[str, list[str]] = {}
    for folder in folders:
        groups.setdefault(folder.strip("/").split("/")[0], []).append(folder)
    return [f"{p}:{p}" for p in (os.path.commonpath(g) for g in groups.values())]


def _mount_findings(items: list[JobPath], mounts: list[tuple[str, str]], image: str, given: tuple[str, ...]) -> list:
    findings = []
    outside = [item for item in items if not (is_url(item.path) or not item.path.startswith("/")
                                              or any(_under(item.path, dst) for _, dst in mounts))]

    def seen_inside(item: JobPath) -> str | None:
        return next((dst + item.path[len(src):] for src, dst in mounts if _under(item.path, src)), None)

    # One fix for every path that must be mounted: the fewest parent mounts covering them all. A path that may be
    # inside the image (not on this machine, only read) is added only to its own warning's fix.
    needed = [_folder_of(i) for i in outside if seen_inside(i) or i.writes or os.path.exists(i.path)]
    for item in outside:
        seen_as = seen_inside(item)
        folders = needed if _folder_of(item) in needed else [*needed, _folder_of(item)]
        fix = f"add a mount: --container-mounts {','.join([*given, *parent_mounts(folders)])}"
        if seen_as:
            findings.append(Finding("error", "job/host-path", f"{item.what} is a path of this host, which the "
                                    f"container mounts elsewhere: inside it, it is '{seen_as}'",
                                    f"use '{seen_as}' in the config, or {fix}"))
        elif item.writes:
            findings.append(Finding("error", "job/unmounted-write", f"{item.what} is not inside any --container-mounts "
                                    "destination: the job would write it inside the container, lost when the job ends",
                                    fix))
        elif os.path.exists(item.path):
            findings.append(Finding("error", "job/unmounted-read", f"{item.what} is on this machine but not inside any "
                                    f"--container-mounts destination: the container ({image}) will not see it", fix))
        else:
            findings.append(Finding("warning", "job/unmounted-read", f"{item.what} is not inside any --container-mounts "
                                    f"destination and not on this machine: it must be inside the image {image}",
                                    f"if it is on the cluster's filesystem, {fix}"))
    return findings


def filesystem_of(path: str) -> tuple[str, str] | None:
    """(mount point, filesystem type) holding ``path`` on this machine (its nearest existing folder), from
    ``/proc/mounts``; None where that cannot be read."""
    try:
        with open("/proc/mounts", encoding="utf-8") as handle:
            table = [line.split()[1:3] for line in handle if len(line.split()) >= 3]
    except OSError:
        return None
    real = os.path.realpath(path)
    while not os.path.exists(real) and real != "/":
        real = os.path.dirname(real)
    best = max((m for m in table if _under(real, m[0].replace("\\040", " "))), key=lambda m: len(m[0]), default=None)
    return (best[0], best[1]) if best else None


def training_time_finding(train_iters: int, step_seconds: float, time_text: str, chained: bool,
                          save_interval: int | None = None, saves: bool = True, margin: int = FINAL_SAVE_MARGIN_MIN,
                          startup_seconds: float = 0.0, eval_seconds: float = 0.0):
    """The job's predicted training time against Slurm's ``--time``: None when it fits; else rule ``job/time-short``
    -- a warning for one job (it saves and exits at the limit, and resumes from its saves when resubmitted), an
    error when phases are chained with ``afterok`` (the next phase would start from a phase that stopped early).
    Where the limit leaves no room for the exit save (:func:`exit_duration` None) only the periodic saves keep
    progress: when none falls before the limit, a resubmitted job would start again from the same weights, and the
    warning says so instead of advising it.

    Args:
        train_iters: optimizer steps of the job; step_seconds: the cost model's predicted seconds per step.
        save_interval: ``checkpoint.save_interval`` (steps between periodic saves; None: none);
        saves: whether the job saves at all (``checkpoint.save`` set).
        margin: minutes between the job's exit (``train.exit_duration_in_mins``) and the limit: the default
            :data:`FINAL_SAVE_MARGIN_MIN`, or the larger one a resilient Slurm job plans for its final save.
        startup_seconds: what megatron-bridge's exit clock counts before the first step (it starts when the
            training state is made, before the model is built and the checkpoint read; the first step's extra).
        eval_seconds: the phase's evaluations (:func:`lcmoe_recipes.cost.wallclock.phase_time`): those during
            training run on the exit clock, and the validation and test after it before the job ends.
    """
    limit = slurm_minutes(time_text)
    usable = exit_duration(limit, margin) or limit
    needed = (train_iters * step_seconds + startup_seconds + eval_seconds) / 60
    if needed <= usable:
        return None
    steps = max(0, int((usable * 60 - startup_seconds) // step_seconds))  # (evaluations are far apart: not here)
    hours = needed / 60
    enough = suggested_time(needed, margin)  # the exit margin included: this limit passes this check
    room = exit_duration(limit, margin) is not None
    kept = 0 if not saves else steps if room else (steps // save_interval * save_interval if save_interval else 0)
    if saves and room:
        ending = f"the job saves and exits after about {steps} steps"
    elif kept:
        ending = (f"Slurm stops the job after about {steps} steps (the limit leaves no room for the exit save), the "
                  f"last periodic save at step {kept}")
    else:
        why = ("checkpoint.save is unset" if not saves else
               f"the limit leaves no room for the exit save, and the first periodic save is at step {save_interval}"
               if save_interval else "the limit leaves no room for the exit save, and no periodic save is set")
        ending = (f"it stops after about {steps} steps having saved nothing ({why}): a resubmitted job would start "
                  "again from the same weights")
    told = (f"{train_iters} steps x {step_seconds:.0f} s predicted" + (
        f" + {startup_seconds / 60:.0f} min of start-up" if startup_seconds else "") + (
        f" + {eval_seconds / 60:.0f} min of evaluation" if eval_seconds else "")
        + f" = {hours:.1f} h, but --time {time_text} " + (
            f"has the job exit after {usable} min ({limit - usable} min before the limit, for the final save)"
            if room else f"stops the job at {usable} min") + f": {ending}")
    if chained:
        return Finding("error", "job/time-short", f"{told}, and the next phase (afterok) would start from that "
                       "partly trained checkpoint", f"give --time {enough} or more ({margin} min for the "
                       "final save included; the cluster allowing), fewer --train-iters, or launch the phases one at a "
                       "time (a resubmitted job resumes from its own saves)")
    if not kept:
        return Finding("warning", "job/time-short", told, f"give --time {enough} or more ({margin} min "
                       "for the final save included), or fewer --train-iters")
    return Finding("warning", "job/time-short", told, f"resubmit the same job until it finishes (it resumes from its "
                   f"saves), or give --time {enough} or more ({margin} min for the final save included)")


def job_folder_findings(job_dir: str, nodes: int, local_tunnel: bool) -> list:
    """The job folder must be on a filesystem every node sees (the nodes read the script, the code archive and the
    YAML from it, and write their logs there). Rules ``job/folder-node-local`` (error, multi-node job under
    :data:`NODE_LOCAL_PREFIXES`) and ``job/folder-local-fs`` (warning, multi-node job submitted from this machine
    whose job folder is on a local filesystem type here). Needs no config: checked before one is built."""
    if nodes <= 1:
        return []
    fix = ("a job folder on a shared filesystem, the same path on every node: --job-dir /lustre/$USER/nemorun "
           "(or set NEMORUN_HOME)")
    return _shared_path_findings(job_dir, "the job folder", "job/folder", "error",
                                 f"the other {nodes - 1} nodes of this {nodes}-node job cannot read its script and "
                                 "code", nodes, local_tunnel, fix)


def python_findings(bin_dir: str, nodes: int, local_tunnel: bool) -> list:
    """Without a container image the nodes run the torchrun and python of ``bin_dir`` (this virtualenv's, or
    ``--python``'s: NeMo-Run's ``setup_lines`` put it first on their PATH), so it must be on a filesystem the nodes
    see. Rules ``job/python-node-local`` and ``job/python-local-fs``, warnings both (a test cluster may run its jobs
    on this very machine; on a real one the job fails at its first line): the folder is under
    :data:`NODE_LOCAL_PREFIXES`, or on a local filesystem type of this machine (submitted from it). Any job: its
    nodes are the cluster's, not this one."""
    fix = ("--container-image IMAGE (the image's Python runs), or --python /shared/envs/ENV/bin/python on storage "
           "every node sees")
    return _shared_path_findings(bin_dir, "the Python environment", "job/python", "warning",
                                 f"the job's {_nodes(nodes)} run its torchrun and python", nodes, local_tunnel, fix)


def _nodes(n: int) -> str:
    return f"{n} node" + ("s" if n != 1 else "")


def _shared_path_findings(path: str, what: str, rule: str, local_severity: str, consequence: str, nodes: int,
                          local_tunnel: bool, fix: str) -> list:
    """[finding] when ``path`` cannot be seen by a job's nodes: ``{rule}-node-local`` (``local_severity``) under
    :data:`NODE_LOCAL_PREFIXES`, ``{rule}-local-fs`` (warning) on a local filesystem type of this machine (only
    known when the job is submitted from it: ``local_tunnel``); [] otherwise."""
    real = os.path.normpath(path)
    if any(_under(real, p) for p in NODE_LOCAL_PREFIXES):
        return [Finding(local_severity, f"{rule}-node-local", f"{what} {path} is node-local: {consequence}",
                        f"use {fix}")]
    found = filesystem_of(path) if local_tunnel else None
    if found and (found[1] in _LOCAL_FS):
        return [Finding("warning", f"{rule}-local-fs", f"{what} {path} is on a local {found[1]} filesystem of this "
                        f"machine (mounted at {found[0]}): the {_nodes(nodes)} must see it too",
                        f"unless {found[0]} is exported to the nodes, use {fix}")]
    return []


@dataclass
class JobCheck:
    """What the job adds to the config, and what it was told.

    Attributes:
        overrides: Hydra overrides for the ranks' command line (``train.exit_duration_in_mins=N``).
        findings: warnings about the job's paths and folder (errors are raised instead).
        notes: lines for the summary (the exit duration and why, the job folder rule).
        resilience: the job's :class:`lcmoe_recipes.jobs.resilience.Resilience` (None: not planned).
    """

    overrides: list[str] = field(default_factory=list)
    findings: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    resilience: object = None


def slurm_job(cfg, settings, job_dir: str, smoke: bool = False, nodes: int = 1) -> JobCheck:
    """Check the job ``cfg`` would run as under ``settings`` (:class:`lcmoe_recipes.jobs.executors.slurm.SlurmSettings`), with
    NeMo-Run's job folder ``job_dir``; see the module doc for every rule (the job folder's own:
    :func:`job_folder_findings`).

    Args:
        cfg: the ConfigContainer as the ranks will run it (data, tokenizer and save overrides applied).
        nodes: the job's nodes (for the warnings' wording). Without a container image, a path the config uses under
            :data:`NODE_LOCAL_PREFIXES` is warned about (``job/path-node-local``): the nodes look for it on their own
            disks.

    Returns:
        :class:`JobCheck`: the exit-duration override (a training job), warnings, notes.

    Raises:
        InfeasibleConfig: a relative path the job reads, a path outside the container's mounts that cannot be
            right (first error named, all attached).
    """
    from ..checks import raise_for_errors

    job = JobCheck()
    items = job_paths(cfg)
    findings = []
    for item in items:
        if not item.writes and not is_url(item.path) and not item.path.startswith("/"):
            findings.append(Finding("error", "job/relative-read", f"{item.what} is relative: the ranks of a Slurm job "
                                    "run in the job's code folder, where it does not exist", "give an absolute path "
                                    f"on a filesystem the nodes see, e.g. {os.path.abspath(item.path)}"))
    if settings.container_image:
        findings += _mount_findings(items, parse_mounts(settings.container_mounts), settings.container_image,
                                    tuple(settings.container_mounts))
    else:  # the nodes see the paths as written: one under this machine's /tmp is not theirs
        for item in items:
            if item.path.startswith("/") and not is_url(item.path):
                findings += _shared_path_findings(
                    item.path, "dataset prefix" if item.files else item.field, "job/path", "warning",
                    "each node writes it to its own disk" if item.writes else
                    "the job's nodes look for it on their own disks", nodes, False,
                    "a folder on storage every node sees (the same path on each)")
    save = getattr(cfg.checkpoint, "save", None)
    if not smoke and save and (not str(save).startswith("/") or _under(str(save), os.path.normpath(job_dir))) \
            and not is_url(str(save)):
        where = (f"relative, so the ranks write it into the job's code folder ({job_dir}/<experiment>/<run>/train/"
                 f"code/{save})" if not str(save).startswith("/") else f"inside the job folder {job_dir}")
        findings.append(Finding("warning", "job/saves-in-job-folder", f"checkpoint.save '{save}' is {where}: every "
                                "save of the model with its optimizer state (~14 bytes per parameter) lands there",
                                "pass --save-dir /shared/storage/RUN (sets checkpoint.save and .load and the log "
                                "folders under it)"))
    raise_for_errors(findings, "the Slurm job")
    job.findings = findings
    job.notes.append(f"job folder {job_dir}: every node must see it (a shared filesystem)")
    if smoke:
        return job
    limit = slurm_minutes(settings.time)
    mine = getattr(cfg.train, "exit_duration_in_mins", None)
    if mine:
        job.notes.append(f"train.exit_duration_in_mins={mine} kept from the config (--time {settings.time} = "
                         f"{limit} min)")
        if mine >= limit:
            job.findings.append(Finding("warning", "job/exit-after-limit", f"train.exit_duration_in_mins={mine} is not "
                                        f"before the Slurm limit of {limit} min: Slurm kills the job before its "
                                        "final checkpoint", f"drop it (launch then sets the limit minus "
                                        f"{FINAL_SAVE_MARGIN_MIN} min), or set it below {limit}"))
        return job
    minutes = exit_duration(limit)
    if minutes is None:
        job.findings.append(Finding("warning", "job/no-final-save", f"--time {settings.time} ({limit} min) leaves no "
                                    f"room for the {FINAL_SAVE_MARGIN_MIN}-minute final-checkpoint margin: no exit "
                                    "duration is set, Slurm stops the run wherever it is",
                                    f"give more than {FINAL_SAVE_MARGIN_MIN} minutes, e.g. --time 04:00:00"))
        return job
    job.overrides.append(f"train.exit_duration_in_mins={minutes}")
    saving = "then saves a checkpoint" if save else "then stops (checkpoint.save is unset: nothing is saved)"
    job.notes.append(f"train.exit_duration_in_mins={minutes}: megatron-bridge ends training after {minutes} min and "
                     f"{saving}, {FINAL_SAVE_MARGIN_MIN} min before --time {settings.time} ({limit} min)")
    return job
