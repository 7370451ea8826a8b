"""Run a validated config: torchrun on this node (``local``) or a Slurm batch job through NeMo-Run (``slurm``).

Both run :mod:`lcmoe_recipes.train` on every rank. ``local`` starts ``python -m torch.distributed.run --standalone``
here and tees its output into ``out/logs/``. ``slurm`` builds a NeMo-Run ``SlurmExecutor`` (nodes = GPUs /
GPUs-per-node, one torchrun per node, the recipe's ``env_vars`` exported, ``--segment`` for NVL72 racks) and submits
through a ``LocalTunnel`` (on a login node) or an ``SSHTunnel``; the YAML and this package travel with the job in
NeMo-Run's code archive, so the cluster needs only megatron-bridge (a container image or the same virtualenv).

GPUs per node always come from the hardware catalogue (8 on HGX H100/H200/B200, 4 per GB200/GB300 tray): the plan's
placement checks and the dispatcher's NVLink-domain settings assume them.

Public entry point: :func:`lcmoe_recipes.jobs.submit.submit`. Everything that imports nemo_run is inside functions:
``import lcmoe_recipes.launch`` stays light.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ...catalog import Hardware, get_hardware
from ...errors import LaunchError, LcmoeError
from .common import (LaunchResult, PACKAGE_DIR, QUIET_ENV, _nemo_run_session, first_error_line, nodes_for,
                     train_arguments)


@dataclass(frozen=True)
class SlurmSettings:
    """Where and how a Slurm job runs (everything the recipe does not decide).

    Attributes:
        account: Slurm account (``--account``); default ``$SBATCH_ACCOUNT`` or ``$SLURM_ACCOUNT``; with none, the
            batch script has no account line (the cluster's default account, where it has one).
        partition: Slurm partition; None = the cluster's default.
        time: wall-clock limit with its hours: ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``
            (:func:`lcmoe_recipes.jobs.job_checks.slurm_minutes`; ``4`` and ``04:00``, minutes to Slurm, are refused).
            A training job stops itself 20 minutes before it and saves a checkpoint
            (:data:`lcmoe_recipes.jobs.job_checks.FINAL_SAVE_MARGIN_MIN`).
        qos: quality of service, or None.
        container_image: Pyxis/enroot image with megatron-bridge 0.6.2 (e.g. an NGC NeMo image); None runs this
            virtualenv's ``torchrun`` on the nodes (the path must exist there: a shared filesystem).
        container_mounts: ``src:dst`` mounts for the container (datasets, checkpoints): every absolute path the
            config reads or writes must be inside one (:func:`lcmoe_recipes.jobs.job_checks.slurm_job`).
        env: extra environment variables; they win over the recipe's ``env_vars``.
        tunnel: ``local`` (this machine can run sbatch) or ``ssh`` (submit on ``host`` as ``user``).
        host, user, identity: the SSH login (``identity``: private key file), for ``tunnel="ssh"``.
        job_dir: folder for NeMo-Run's experiments (scripts, code archive, logs); on the cluster for ``ssh``
            (required there); default ``$NEMORUN_HOME/experiments`` for ``local``. Every node must see it (a
            shared filesystem): a multi-node job with it under ``/tmp`` is refused.
        sbatch: extra ``#SBATCH`` flags, NeMo-Run's ``additional_parameters`` (``{"reservation": "r1"}``).
        exclusive: ``--exclusive`` for GPU jobs (whole nodes, the layouts assume them).
        segment: ``--segment`` on NVL72 racks (see :func:`nvl72_segment`); needs Slurm 24.05+ with topology/block.
            False for an older Slurm (then make sure the nodes share racks some other way).
        python: without ``container_image``: the Python the nodes run (a path on storage they share, e.g. a
            cluster-wide environment); default this virtualenv's. Its packages are read by running it here.
        overlay: when the image's (or ``python``'s) megatron-core / megatron-bridge differ from the pinned ones,
            build an overlay of the pinned wheels into the job folder and put it first on the job's import path
            (:mod:`lcmoe_recipes.jobs.overlay`); False runs the image as it is (the entry script then refuses the
            other versions).
    """

    account: str | None = None
    partition: str | None = None
    time: str = "04:00:00"
    qos: str | None = None
    container_image: str | None = None
    container_mounts: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    tunnel: str = "local"
    host: str | None = None
    user: str | None = None
    identity: str | None = None
    job_dir: str | None = None
    sbatch: dict[str, str] = field(default_factory=dict)
    exclusive: bool = True
    segment: bool = True
    python: str | None = None
    overlay: bool = True


def nvl72_segment(hw: Hardware, nodes: int) -> int | None:
    """Slurm ``--segment`` (nodes kept inside one NVLink domain) for racks whose NVLink spans nodes (NVL72), None
    where the NVLink domain is the node (HGX).

    The placement check assumes job blocks of ``hw.job_block`` GPUs inside one NVLink domain (64 on NVL72: NVIDIA's
    GB200 Slurm guidance of ``--segment=16`` trays of 4 GPUs); a job smaller than a block stays in one segment.
    """
    if hw.nvlink_domain <= hw.gpus_per_node or nodes <= 1:
        return None
    block = max(1, hw.job_block // hw.gpus_per_node)
    segment = min(nodes, block)
    return segment if nodes % segment == 0 else None


def _account(settings: SlurmSettings) -> str | None:
    """The account, or None: then NeMo-Run writes no ``#SBATCH --account`` line (it drops None-valued flags)."""
    return settings.account or os.environ.get("SBATCH_ACCOUNT") or os.environ.get("SLURM_ACCOUNT") or None


def job_dir_of(settings: SlurmSettings) -> str:
    """NeMo-Run's experiments folder for ``settings``: ``job_dir``, else ``$NEMORUN_HOME/experiments``."""
    if settings.job_dir:
        return settings.job_dir
    from nemo_run.config import get_nemorun_home

    return os.path.join(get_nemorun_home(), "experiments")


def check_settings(settings: SlurmSettings) -> None:
    """Refuse Slurm settings sbatch would refuse or misread later: a ``--time`` without its hours
    (:func:`lcmoe_recipes.jobs.job_checks.slurm_minutes`), bad ``--container-mounts``, an incomplete SSH tunnel, a
    ``python`` beside a container image or not absolute, a job folder NeMo-Run would rewrite.

    Raises:
        LcmoeError: naming the setting and a valid form.
    """
    from ..job_checks import parse_mounts, slurm_minutes

    slurm_minutes(settings.time)
    parse_mounts(settings.container_mounts)
    if settings.python and (settings.container_image or not os.path.isabs(settings.python)):
        raise LcmoeError(f"`python` {settings.python}: " + ("a container job runs the image's Python"
                         if settings.container_image else "give the absolute path the nodes share"),
                         "give either `container_image` or an absolute `python`, e.g. /shared/envs/nemo/bin/python",
                         fields=("python", "container_image"))
    if settings.tunnel == "ssh":
        missing = [name for name in ("host", "user", "job_dir") if not getattr(settings, name)]
        if missing:
            raise LcmoeError("`tunnel` ssh needs " + ", ".join(f"`{m}`" for m in missing),
                             "e.g. tunnel=ssh host=login.cluster user=me job_dir=/lustre/me/nemorun",
                             fields=("tunnel", "host", "user", "job_dir"))
    elif settings.tunnel != "local":
        raise LcmoeError(f"unknown `tunnel` '{settings.tunnel}'", "use tunnel=local or tunnel=ssh", fields=("tunnel",))
    if not settings.container_image and "/nemo_run" in (job_dir := job_dir_of(settings)):
        # NeMo-Run 0.11.1 maps its in-container folder /nemo_run to the job folder by replacing every "/nemo_run"
        # in the sbatch script of a job without a container, so such a path would be mangled.
        raise LcmoeError(f"the NeMo-Run job folder {job_dir} contains '/nemo_run', which NeMo-Run rewrites "
                         "in jobs without a container image",
                         "use another `job_dir` (or NEMORUN_HOME), e.g. job_dir=~/.nemo_run/experiments",
                         fields=("job_dir",))


def _tunnel(settings: SlurmSettings):
    import nemo_run as run

    check_settings(settings)
    if settings.tunnel == "local":
        return run.LocalTunnel(job_dir=job_dir_of(settings))
    return run.SSHTunnel(host=settings.host, user=settings.user, job_dir=settings.job_dir, identity=settings.identity)


def _quoted(env: dict) -> dict[str, str]:
    """Values shell-quoted: NeMo-Run writes ``export KEY=VALUE`` lines verbatim."""
    return {key: shlex.quote(str(value)) for key, value in env.items()}


def _packager(yaml: Path):
    """NeMo-Run packager that ships the YAML and this package into the job's ``code/`` folder (the ranks' cwd)."""
    import nemo_run as run

    return run.PatternPackager(include_pattern=[str(yaml.resolve()), str(PACKAGE_DIR)],
                               relative_path=[str(yaml.resolve().parent), str(PACKAGE_DIR.parent)])


@dataclass(frozen=True)
class OverlayStep:
    """The overlay a Slurm job gets (:mod:`lcmoe_recipes.jobs.overlay`).

    Attributes:
        overlay: what it holds and why.
        folder: where it lies on the cluster's shared storage (``<job dir>/lcmoe-overlays/<key>``).
        seen_as: the folder as the job sees it (:data:`lcmoe_recipes.jobs.overlay.MOUNT_POINT` in a container).
        bytes: its size: measured once built, else as the same versions are installed here.
        built: whether it was built (False for a dry run).
    """

    overlay: object
    folder: str
    seen_as: str
    bytes: int
    built: bool

    def note(self) -> str:
        """One line for the launch summary."""
        stack = self.overlay.stack
        size = f"{self.bytes / 2**20:.0f} MiB" if self.built else f"~{self.bytes / 2**20:.0f} MiB as installed here"
        verb = "built on this machine into" if self.built else "to be built on this machine (login node) into"
        where = f", mounted at {self.seen_as}" if self.seen_as != self.folder else ""
        lines = [f"overlay: {stack.where} holds megatron-core {stack.versions.get('megatron-core') or 'unknown'} / "
                 f"megatron-bridge {stack.versions.get('megatron-bridge') or 'unknown'}; {verb} {self.folder} "
                 f"({size}: {self.overlay.summary()}){where}, first on the job's import path ($LCMOE_OVERLAY) before "
                 "the entry script's version check"]
        return "; ".join(lines + [f"warning: {w}" for w in self.overlay.warnings])


def job_stack(settings: SlurmSettings, hw: Hardware):
    """The Python stack the job runs (:class:`lcmoe_recipes.jobs.overlay.JobStack`), or None where it is this
    virtualenv's (the pinned versions) or an image the catalogue does not list (its versions are unknown: warned
    about by :func:`lcmoe_recipes.checks.known_issues.stack_versions`, checked by the entry script)."""
    from ...catalog.known_issues import find_container
    from ..overlay import container_stack, probe_stack

    if settings.container_image:
        found = find_container(settings.container_image)
        return container_stack(found, hw.cpu_arch) if found else None
    return probe_stack(settings.python) if settings.python else None


def overlay_step(settings: SlurmSettings, hw: Hardware, *, install: bool, tunnel=None) -> OverlayStep | None:
    """Plan (and with ``install``, install and place) the overlay the job needs, or None.

    Raises:
        OverlayRefused: the image cannot take one (the reason and the nearest listed image that can).
        LcmoeError: the package registry cannot be read, or a wheel cannot be fetched.
    """
    from .. import overlay as ov

    stack = job_stack(settings, hw) if settings.overlay else None
    plan = ov.plan_overlay(stack) if stack else None
    if plan is None:
        return None
    tunnel = tunnel or _tunnel(settings)
    folder = f"{tunnel.job_dir.rstrip('/')}/lcmoe-overlays/{plan.key}"
    seen_as = ov.MOUNT_POINT if settings.container_image else folder
    if not install:
        return OverlayStep(plan, folder, seen_as, plan.estimated_bytes(), False)
    if settings.tunnel == "local":
        built = ov.install(plan, os.path.dirname(folder))
        return OverlayStep(plan, folder, seen_as, built.bytes, True)
    import tarfile
    import tempfile

    from ..overlay import MANIFEST

    if tunnel.run(f"test -f {shlex.quote(folder)}/{MANIFEST}", warn=True).return_code == 0:
        return OverlayStep(plan, folder, seen_as, plan.estimated_bytes(), True)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lcmoe_recipes" / "overlays"
    built = ov.install(plan, cache)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / f"{plan.key}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(built.path, arcname=plan.key)
        remote = f"{os.path.dirname(folder)}/{plan.key}.tar.gz"
        tunnel.run(f"mkdir -p {shlex.quote(os.path.dirname(folder))}")
        tunnel.put(str(archive), remote)
        tunnel.run(f"tar -xzf {shlex.quote(remote)} -C {shlex.quote(os.path.dirname(folder))} && rm -f "
                   f"{shlex.quote(remote)}")
    return OverlayStep(plan, folder, seen_as, built.bytes, True)


def slurm_executor(meta: dict, env_vars: dict[str, str], settings: SlurmSettings, yaml: Path, *,
                   smoke: bool = False, smoke_ranks: int = 2, smoke_nodes: int = 1,
                   overlay: OverlayStep | None = None, resilience=None, retries: int | None = None):
    """The NeMo-Run ``SlurmExecutor`` for a config's target.

    GPU run: nodes = world_size / GPUs-per-node, one torchrun per node with one rank per GPU, ``--gpus-per-node``,
    ``--exclusive``, ``--segment`` on NVL72. Smoke run: ``smoke_nodes`` nodes (default one) of ``smoke_ranks`` CPU
    ranks each, no GPUs; every node checks the config's paths. With ``overlay`` (:func:`overlay_step`): its folder
    mounted read-only into the container and named by ``$LCMOE_OVERLAY``. With ``resilience``
    (:class:`lcmoe_recipes.jobs.resilience.Resilience`, enabled): NeMo-Run's ``FaultTolerance`` launcher
    (``ft_launcher``) with its sized heartbeat timeouts and restart budget, and ``retries`` requeues on failure.
    ``retries``: requeues on failure without the FT launcher (NeMo-Run's batch script runs ``scontrol requeue`` while
    ``SLURM_RESTART_COUNT`` is under it; the fault drill's, :mod:`lcmoe_recipes.jobs.drill`).

    Raises:
        LcmoeError: a GPU count that does not fill whole nodes, an incomplete SSH tunnel.
    """
    import nemo_run as run

    hw = get_hardware(meta.get("hardware", "h100"))
    gpn = hw.gpus_per_node
    nodes = nodes_for(meta.get("world_size") or gpn, gpn)
    options = dict(
        account=_account(settings), partition=settings.partition, time=settings.time, qos=settings.qos,
        job_name_prefix=f"lcmoe-{meta.get('recipe', 'config')}-", tunnel=_tunnel(settings), packager=_packager(yaml),
        launcher="torchrun", env_vars=_quoted({**QUIET_ENV, **env_vars, **settings.env}),
        container_image=settings.container_image, container_mounts=list(settings.container_mounts),
        additional_parameters=dict(settings.sbatch) or None,
    )
    if smoke:
        options.update(nodes=smoke_nodes, ntasks_per_node=smoke_ranks)
    else:
        options.update(nodes=nodes, ntasks_per_node=gpn, gpus_per_node=gpn,
                       exclusive=True if settings.exclusive else None,
                       segment=nvl72_segment(hw, nodes) if settings.segment else None)
    if not settings.container_image:  # run this virtualenv's (or the given) torchrun and python on the nodes
        bin_dir = nodes_bin_dir(settings)
        options["setup_lines"] = f"export PATH={shlex.quote(str(bin_dir))}:$PATH"
    if overlay is not None:
        from ..overlay import ENV_VAR

        options["env_vars"][ENV_VAR] = shlex.quote(overlay.seen_as)
        if settings.container_image:
            options["container_mounts"].append(f"{overlay.folder}:{overlay.seen_as}:ro")
    if resilience is not None and resilience.enabled and not smoke:
        options["launcher"] = run.FaultTolerance(**resilience.launcher)
        options["retries"] = resilience.retries
    if retries is not None:
        options["retries"] = retries
    executor = run.SlurmExecutor(**options)
    executor.torchrun_nproc_per_node = options["ntasks_per_node"]
    return executor


def _job_logs(local_dir: Path, job_id: str) -> tuple[Path | None, Path | None]:
    ranks = sorted(local_dir.glob(f"log-*_{job_id}_*.out"))
    batch = sorted(local_dir.glob(f"sbatch_*_{job_id}.out"))
    return (ranks[-1] if ranks else None), (batch[-1] if batch else None)


def run_slurm(yaml: Path, meta: dict, env_vars: dict[str, str], settings: SlurmSettings | None = None, *,
              smoke: bool = False, smoke_ranks: int = 2, smoke_nodes: int = 1, dry_run: bool = False, wait: bool = True,
              train_args: list[str] | None = None, executor=None, notes: list[str] = (),
              resilience=None, retries: int | None = None) -> LaunchResult:
    """Submit through NeMo-Run's ``SlurmExecutor`` (see :func:`slurm_executor`), or print the sbatch script.

    Args:
        executor: a ready ``nemo_run.SlurmExecutor`` to use instead of one built from ``settings``: its nodes times
            GPUs per node must equal the planned world size; its packager is replaced (the YAML and this package
            must travel with the job) and the recipe's ``env_vars`` are added under its own. It gets no overlay
            (:func:`overlay_step`; the entry script checks the versions it finds).
        wait: wait for the job to end and read its state and logs (else return once submitted).
        notes: lines for the result's summary (:attr:`LaunchResult.notes`); the overlay step's line is added.
        resilience: the job's resiliency (:func:`lcmoe_recipes.jobs.resilience.plan_resilience`): the FT launcher.
        retries: requeues on failure (see :func:`slurm_executor`).

    Raises:
        LcmoeError: see :func:`slurm_executor`; a given executor whose size differs from the plan; see
            :func:`overlay_step` (an image that cannot take an overlay is refused before anything is submitted).
        LaunchError: sbatch refused the job (its message, the script's path).
    """
    import nemo_run as run
    from invoke.exceptions import UnexpectedExit

    notes = list(notes)
    if executor is None:
        settings = settings or SlurmSettings()
        step = overlay_step(settings, get_hardware(meta.get("hardware", "h100")), install=not dry_run)
        if step is not None:
            notes.append(step.note())
        executor = slurm_executor(meta, env_vars, settings, yaml, smoke=smoke, smoke_ranks=smoke_ranks,
                                  smoke_nodes=smoke_nodes, overlay=step, resilience=resilience, retries=retries)
    else:
        per_node = executor.gpus_per_node or executor.torchrun_nproc_per_node or executor.ntasks_per_node
        if not smoke and executor.nodes * per_node != meta.get("world_size"):
            raise LcmoeError(f"the given SlurmExecutor has {executor.nodes} node(s) x {per_node} GPUs = "
                             f"{executor.nodes * per_node} ranks; the config was planned for {meta.get('world_size')}",
                             "set nodes and gpus_per_node to match, or plan for that count")
        executor.packager = _packager(yaml)
        executor.env_vars = {**_quoted(env_vars), **executor.env_vars}
    args = ["--config", yaml.name, *(train_arguments(smoke=smoke) if train_args is None else train_args)]
    task = run.Script(path="lcmoe_recipes.train", args=args, entrypoint="python", m=True)
    name = "smoke" if smoke else "train"
    title = f"lcmoe-{meta.get('recipe', 'config')}{'-smoke' if smoke else ''}"
    with _nemo_run_session():
        with run.Experiment(title, executor=executor, log_level="ERROR") as exp:
            exp.add(task, name=name)
            if dry_run:
                exp.dryrun(log=False)  # deletes the experiment's folder, not its (now maybe empty) parent
                with contextlib.suppress(OSError):
                    Path(exp._exp_dir).parent.rmdir()
                request = exp.jobs[0]._dryrun_info.request
                return LaunchResult("slurm", "DRY_RUN", " ".join(request.launch_cmd), yaml,
                                    script=request.materialize(), notes=notes)
            try:
                exp.run(sequential=True, detach=not wait)
            except UnexpectedExit as exc:
                message = (exc.result.stderr or exc.result.stdout or "").strip().splitlines()
                first = message[0] if message else f"exit code {exc.result.exited}"
                if "segment" in first:
                    fix = ("this Slurm has no --segment (Slurm 24.05+, topology/block): pass --no-segment and keep "
                           "the job inside NVL72 racks another way")
                elif "account" in first.lower():
                    fix = "this cluster wants a Slurm account: pass --account NAME (or set SBATCH_ACCOUNT)"
                elif "gres" in first.lower() or "node configuration is not available" in first:
                    fix = ("the partition has no nodes with those GPUs: choose a GPU partition (--partition), or "
                           "rehearse on CPUs with --smoke")
                else:
                    fix = "check --account/--partition/--time/--qos"
                raise LaunchError(f"sbatch refused the job: {first}", f"{fix}; the script is in {exp._exp_dir}") from None
            exp_id, exp_dir = exp._id, Path(exp._exp_dir)
        status = exp.status(return_dict=True) if wait else None  # sacct through the tunnel: inside the session
    job = exp.jobs[0]
    job_id = str(job.handle).rsplit("/", 1)[-1] if getattr(job, "handle", None) else None
    if status:
        entry = next(iter(status.values()))
        job_id = str(entry.get("job_id") or job_id)
        state = str(entry.get("status")).split(" ")[0].split(".")[-1]
    else:
        state = "SUBMITTED"
    rank_log, batch_log = _job_logs(exp_dir / name, job_id) if job_id and wait else (None, None)
    exit_code, first_error = None, None
    if batch_log:
        found = re.search(r"job exited with code (\d+)", batch_log.read_text(errors="replace"))
        exit_code = int(found.group(1)) if found else None
    if state != "SUCCEEDED" and state != "SUBMITTED":
        for log in (rank_log, batch_log):
            if log and (first_error := first_error_line(log.read_text(errors="replace"))):
                break
    return LaunchResult("slurm", state, "sbatch --requeue --parsable", yaml, job_id=job_id, exit_code=exit_code,
                        log_path=rank_log or batch_log or exp_dir / name, first_error=first_error,
                        experiment_id=exp_id, notes=notes)


def nodes_bin_dir(settings: SlurmSettings) -> Path:
    """The folder whose torchrun and python a job without a container image runs on its nodes: ``settings.python``'s,
    else this virtualenv's (NeMo-Run ``setup_lines`` put it first on their PATH)."""
    return Path(settings.python).parent if settings.python else Path(sys.executable).parent

