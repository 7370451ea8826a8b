"""Run a config: :func:`run` runs one config :func:`lcmoe_recipes.jobs.prepare.prepare` wrote (torchrun here, a Slurm
job, a Kubeflow Trainer job); :func:`submit` takes any ConfigContainer (or a YAML ``launch`` wrote), validates it for
its target, writes it and runs it -- the Python API (``lcmoe_recipes.launch.submit``)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
from pathlib import Path

from ..catalog import get_hardware
from ..checks.known_issues import job_versions
from ..errors import LcmoeError
from .executors.common import EXECUTORS, LaunchResult, nodes_for, train_arguments
from .executors.kubeflow import KubeflowSettings, check_kubeflow_settings, kube_job_overrides, run_kubeflow
from .executors.local import run_local
from .executors.slurm import SlurmSettings, check_settings, run_slurm
from .job_checks import JobCheck
from ..emit.yaml_io import RESILIENCY_KEY
from .prepare import Configured, job_resilience, slurm_job_check, time_findings, write_ft_config
from .start_gate import refuse_to_start


def run(one: Configured, executor: str = "local", settings: SlurmSettings | KubeflowSettings | None = None, *,
        smoke: bool = False, smoke_ranks: int = 2, smoke_nodes: int = 1, nproc_per_node: int | None = None,
        dry_run: bool = False, wait: bool = True, replan: bool = False, after_job: str | None = None,
        echo: bool = True) -> LaunchResult:
    """Run one prepared config (:func:`lcmoe_recipes.jobs.prepare.prepare` wrote it): torchrun here (``local``), a Slurm job (``slurm``, with its ``settings``; a later phase
    waits for ``after_job``: ``afterok``), or a Kubeflow Trainer job (``kubeflow``; ``dry_run`` gives its manifest).

    Raises:
        LaunchError: too few GPUs here, or sbatch / Kubernetes refused the job.
    """
    # data and save folders are in the YAML already; the job's exit duration goes on the ranks' command line
    train_args = train_arguments(smoke=smoke, replan=replan, overrides=one.job.overrides if one.job else ())
    if executor == "local":
        return run_local(one.output, one.meta, dict(one.cfg.env_vars or {}), smoke=smoke, smoke_ranks=smoke_ranks,
                         nproc_per_node=nproc_per_node, dry_run=dry_run, train_args=train_args, echo=echo)
    if executor == "kubeflow":
        return run_kubeflow(one.output, one.meta, dict(one.cfg.env_vars or {}), settings, smoke=smoke,
                            smoke_ranks=smoke_ranks, dry_run=dry_run, train_args=train_args,
                            notes=one.job.notes if one.job else [])[0]
    if after_job:
        settings = dataclasses.replace(settings, sbatch={**settings.sbatch, "dependency": f"afterok:{after_job}"})
    return run_slurm(one.output, one.meta, dict(one.cfg.env_vars or {}), settings, smoke=smoke,
                     smoke_ranks=smoke_ranks, smoke_nodes=smoke_nodes, dry_run=dry_run, wait=wait,
                     train_args=train_args, notes=one.job.notes if one.job else [],
                     resilience=one.job.resilience if one.job else None)


def _target(found: dict, world_size: int | None, hardware: str | None, where: str) -> dict:
    meta = dict(found)
    for key, given in (("world_size", world_size), ("hardware", hardware)):
        if given is None:
            continue
        if meta.get(key) not in (None, given):
            raise LcmoeError(f"{where} was planned for {key}={meta[key]}, not {given}",
                             "plan it again for that target: python -m lcmoe_recipes.launch MODEL --seq N --gpus N "
                             "--hardware H --dry-run")
        meta[key] = given
    missing = [key for key in ("world_size", "hardware") if not meta.get(key)]
    if missing:
        raise LcmoeError(f"{where} does not say which cluster it is for ({' and '.join(missing)} unknown)",
                         "pass world_size= and hardware=, or build it with lcmoe_recipes (a factory, build_recipe, "
                         "or launch --dry-run)")
    meta.setdefault("recipe", "config")
    from ..emit.stack import installed_stack

    for key, version in installed_stack().items():  # validated here, with these versions
        meta.setdefault(key, version)
    return meta


def _materialize(cfg, meta: dict, output: str | Path | None, extra: list[str] = (), check_job=None, versions=None,
                 gate=None, amend=None, judge=None):
    """(YAML path, env_vars, what ``check_job`` returned, warnings) for ``cfg``: validated for its target ``meta``
    with the ranks' ``extra`` overrides applied (to a copy; they travel on the ranks' command line; known upstream bugs
    judged for ``versions``, default the installed ones), then ``gate(that config)`` (raises to refuse the run) and
    ``check_job(that config)``, then ``amend(a copy of cfg, that config, the job check)`` (what the job sets on the
    config it runs: a Slurm job's resiliency; the caller's ``cfg`` is left as it was), then ``judge(that config, the
    job check)`` (more warnings: the job's time), and only then the YAML written (when ``cfg`` is a ConfigContainer
    or a YAML without our header; a YAML with our header that the amendment changes is written beside it as
    ``<stem>.slurm.yaml``). The warnings are the validation's (known upstream bugs, settings upstream overrides, ...)
    and the judge's: what ``launch`` prints."""
    import copy

    from .. import emit

    path = Path(cfg) if isinstance(cfg, (str, os.PathLike)) else None
    loaded, found = emit.read_yaml(path) if path else (cfg, {})
    effective = emit.apply_overrides(copy.deepcopy(loaded), list(extra)) if extra else loaded
    warnings = emit.validate_config(effective, meta["hardware"], meta["world_size"], meta["recipe"], versions)
    if gate is not None:
        gate(effective)
    job = check_job(effective) if check_job else None
    if amend is not None:
        loaded = copy.deepcopy(loaded)
        amend(loaded, effective, job)
    if judge is not None:
        warnings = warnings + judge(effective, job)
    env_vars = dict(loaded.env_vars or {})
    if path:
        if found.get("world_size") and found.get("hardware") and output is None:
            if amend is None:
                return path, env_vars, job, warnings
            staged = emit.write_yaml(loaded, path.with_name(f".{path.stem}.slurm.staged.yaml"), meta)
            if staged.read_text() == path.read_text():
                staged.unlink()  # the job changes nothing: run the file as it is
                return path, env_vars, job, warnings
            beside = path.with_name(f"{path.stem}.slurm.yaml")
            os.replace(staged, beside)
            return beside, env_vars, job, warnings
        target = Path(output or f"out/{path.stem}.{meta['hardware']}x{meta['world_size']}.yaml")
        return emit.write_yaml(loaded, target, meta), env_vars, job, warnings
    if output is None:
        staged = emit.write_yaml(loaded, Path("out") / f".{meta['recipe']}.staged.yaml", meta)
        digest = hashlib.sha1(staged.read_bytes()).hexdigest()[:8]
        target = staged.with_name(f"{meta['recipe']}+{digest}.yaml")  # launch's separator
        os.replace(staged, target)
    else:
        target = emit.write_yaml(loaded, output, meta)
    return target, env_vars, job, warnings


def _finding_notes(findings) -> list[str]:
    """Findings as the result's note lines (``warning: rule: message; fix: ...``)."""
    return [f"{f.severity}: {f.rule}: {f.message}; fix: {f.fix}" for f in findings]


def _settings_of(executor) -> SlurmSettings:
    """The settings a ready ``nemo_run.SlurmExecutor`` stands for (time, container, mounts, tunnel, job folder), for
    the same checks as ours."""
    import nemo_run as run

    tunnel = executor.tunnel
    return SlurmSettings(account=executor.account, time=executor.time, container_image=executor.container_image,
                         container_mounts=tuple(executor.container_mounts or ()),
                         tunnel="local" if tunnel is None or isinstance(tunnel, run.LocalTunnel) else "ssh",
                         host=getattr(tunnel, "host", None), user=getattr(tunnel, "user", None),
                         job_dir=tunnel.job_dir if tunnel is not None else executor.job_dir)


PYTHON_TERMS = {"--time": "SlurmSettings.time", "--container-image": "container_image",
                "--container-mounts": "SlurmSettings.container_mounts", "--job-dir": "SlurmSettings.job_dir",
                "--save-dir": "save_dir", "--python": "SlurmSettings.python", "--account": "SlurmSettings.account",
                "--partition": "SlurmSettings.partition", "--qos": "SlurmSettings.qos",
                "--train-iters": "cfg.train.train_iters",
                "--data-path": "data_path", "--tokenizer": "tokenizer", "--nproc-per-node": "nproc_per_node",
                "--no-resiliency": "resiliency=False", "--no-segment": "SlurmSettings.segment=False",
                "--smoke": "smoke=True", "--mock-data": "mock_data=True",
                "--from-scratch": "from_scratch=True"}
"""``launch``'s flags as the Python API names them (:class:`SlurmSettings` fields, :func:`submit` arguments): the
checks behind both speak in flags; :func:`python_terms` rewrites what :func:`submit` raises and notes."""
# a flag, and a space before its value where one follows: a path, a number, a placeholder in capitals, or a token
# with punctuation inside it (not a word that ends a clause, as "destination:")
_FLAG = re.compile(r"(?<![\w-])(" + "|".join(sorted(map(re.escape, PYTHON_TERMS), key=len, reverse=True))
                   + r")(?![\w-])( (?=[/\d$'\"A-Z~]|\S*[:.,/=]\S))?")


def python_terms(text: str) -> str:
    """``text`` with each of :data:`PYTHON_TERMS`' flags in Python's words: ``--time 04:00:00`` ->
    ``SlurmSettings.time=04:00:00`` (a setting, not an argument of :func:`submit`), a bare ``--no-resiliency`` ->
    ``resiliency=False`` (a flag followed by a value becomes ``name=value``; one followed by prose, its name)."""
    def term(match: re.Match) -> str:
        name = PYTHON_TERMS[match.group(1)]
        return f"{name}=" if match.group(2) and "=" not in name else name + (match.group(2) or "")

    return _FLAG.sub(term, text)


def _in_python_terms(run):
    """``run`` (:func:`submit`) with its errors and notes in the Python API's words (:func:`python_terms`:
    ``SlurmSettings.time=04:00:00``, not launch's ``--time 04:00:00``); its signature and docstring kept."""
    @functools.wraps(run)
    def wrapper(*args, **kwargs) -> LaunchResult:
        try:
            result = run(*args, **kwargs)
        except LcmoeError as exc:
            exc.message, exc.fix = python_terms(exc.message), python_terms(exc.fix)
            exc.args = (f"{exc.message}{'; ' + exc.fix if exc.fix else ''}",)
            raise
        result.notes = [python_terms(note) for note in result.notes]
        return result

    return wrapper


@_in_python_terms
def submit(cfg, executor="local", *, smoke: bool = False, dry_run: bool = False, wait: bool = True,
           world_size: int | None = None, hardware: str | None = None, output: str | Path | None = None,
           nproc_per_node: int | None = None, smoke_ranks: int = 2, smoke_nodes: int = 1,
           data_path: list[str] | None = None,
           tokenizer: str | None = None, save_dir: str | None = None, replan: bool = False,
           mock_data: bool = False, from_scratch: bool = False, resiliency: bool = True) -> LaunchResult:
    """Validate ``cfg`` for its target and run it with torchrun here, or as a Slurm or Kubeflow Trainer job through
    NeMo-Run.

    Args:
        cfg: a ConfigContainer from lcmoe_recipes (a factory such as ``dsv3_128k_h100()``, ``build_recipe``: it
            remembers its target; a ``copy.deepcopy`` of it does not), any other ConfigContainer (then give
            ``world_size`` and ``hardware``), or the path of a YAML written by ``launch``.
        executor: ``"local"``, ``"slurm"`` (settings from the environment: ``SBATCH_ACCOUNT``), a
            :class:`~lcmoe_recipes.jobs.executors.slurm.SlurmSettings`, a ready ``nemo_run.SlurmExecutor``, or a
            :class:`~lcmoe_recipes.jobs.executors.kubeflow.KubeflowSettings` (a Kubeflow Trainer job; ``dry_run``: its manifest).
        smoke: CPU-only check with ``smoke_ranks`` ranks (gloo all-reduce, no training; no GPU needed); under Slurm
            on ``smoke_nodes`` nodes, each checking that the config's paths exist there.
        dry_run: build the torchrun command / sbatch script and return it without running anything.
        wait: Slurm: wait for the job and read its state and logs.
        output: where to write the YAML (default for a ConfigContainer: ``out/<recipe>+<first 8 hex of the YAML's
            SHA-1>.yaml``, so two different configs never share a file; for a YAML with our header: that file, or
            ``<stem>.slurm.yaml`` beside it when the Slurm job's resiliency changes it).
        nproc_per_node: local: ranks (default the planned world size).
        data_path, tokenizer: real data for the ranks (see :func:`lcmoe_recipes.emit.data_overrides`).
        save_dir: absolute folder for the run's checkpoints and logs (see :func:`lcmoe_recipes.emit.save_overrides`).
        replan: let the ranks plan again when they find another world size or GPU type.
        mock_data, from_scratch: a run that trains (not ``smoke``, not ``dry_run``) is refused without real data
            and a tokenizer, or for a context extension without pretrained weights, unless these accept mock data /
            random initialisation on purpose (:func:`lcmoe_recipes.jobs.start_gate.start_blockers`).
        resiliency: a multi-node Slurm training job built from :class:`SlurmSettings` (or ``"slurm"``) gets what
            ``launch`` gives it (:func:`lcmoe_recipes.jobs.prepare.job_resilience`): the FT launcher, in-job restart,
            straggler detection and a time-limit exit that leaves room for the final save; False turns them off
            (``launch --no-resiliency``). A ready ``nemo_run.SlurmExecutor`` keeps its own launcher (a note says so).

    Returns:
        :class:`~lcmoe_recipes.jobs.executors.common.LaunchResult`: state, job id, log path, first error line, the command or
        sbatch script; ``notes``: the config's warnings as ``launch`` prints them (known upstream bugs, settings
        upstream overrides, ...), and for Slurm the exit duration from ``time``, the job folder rule and warnings
        about the job's paths; for Slurm and Kubernetes also the job's predicted time against its limit
        (``job/time-short``) and the phase's wall clock (``time/phase-long``).

    Raises:
        LcmoeError: the config fails validation for its target, its target is unknown, an unknown executor, a GPU
            count that does not fill whole nodes, a Slurm time without hours, a path the Slurm job cannot use
            (:func:`lcmoe_recipes.jobs.job_checks.slurm_job`), a run that trains without data, tokenizer or the
            weights of its extension (every blocker in one error; nothing written).
        LaunchError: too few GPUs here for a local run, or sbatch refused the job. (A job that runs and fails is
            not raised: ``result.ok`` is False and ``result.first_error`` says why.)
    """
    from .. import emit

    if isinstance(executor, str) and executor not in EXECUTORS:
        raise LcmoeError(f"unknown executor '{executor}'", f"use one of {', '.join(EXECUTORS)}")
    # Everything that can be refused without building is refused before the YAML is written.
    extra = emit.save_overrides(save_dir) + emit.data_overrides(data_path, tokenizer)  # bad input fails here
    kube = executor if isinstance(executor, KubeflowSettings) else None
    settings = executor if isinstance(executor, SlurmSettings) else SlurmSettings() if executor == "slurm" else None
    if settings is not None:
        check_settings(settings)
    if kube is not None:
        check_kubeflow_settings(kube)
    if isinstance(cfg, (str, os.PathLike)):
        meta = _target(emit.read_meta(cfg), world_size, hardware, f"'{cfg}'")
    else:
        meta = _target(emit.target_of(cfg), world_size, hardware, "this ConfigContainer")
    nodes_for(meta["world_size"], get_hardware(meta["hardware"]).gpus_per_node)
    image = (kube.image if kube is not None else settings.container_image if settings is not None
             else getattr(executor, "container_image", None))
    versions = job_versions(image)[0]  # the container's versions if listed (the pinned ones through an overlay)
    gate = None
    if not (smoke or dry_run):  # a run that trains: refused, before anything is written, for what it lacks
        # here: the planned ranks' GPUs (another --nproc-per-node is refused by the local executor itself)
        local = executor == "local" and nproc_per_node in (None, meta["world_size"])
        gate = lambda c: refuse_to_start([c], mock_data=mock_data, from_scratch=from_scratch,  # noqa: E731
                                         local_ranks=meta["world_size"] if local else None)
    if executor == "local":
        yaml, env_vars, _, warnings = _materialize(cfg, meta, output, extra, versions=versions, gate=gate)
        args = train_arguments(smoke=smoke, replan=replan, data_path=data_path, tokenizer=tokenizer, save_dir=save_dir)
        result = run_local(yaml, meta, env_vars, smoke=smoke, smoke_ranks=smoke_ranks, nproc_per_node=nproc_per_node,
                           dry_run=dry_run, train_args=args)
        result.notes = _finding_notes(warnings) + result.notes
        return result

    def judge(effective, job: JobCheck) -> list:  # what launch also says of a job: its time, each phase's wall clock
        from ..checks.wallclock import phase_findings
        from ..cost.wallclock import DEFAULT_PHASE_BUDGET_HOURS

        plan = emit.plan_from_config(effective, meta["hardware"], meta["world_size"], meta["recipe"])
        return (time_findings(effective, plan, job, kube or settings or _settings_of(executor), smoke, False,
                              meta["recipe"])
                + (phase_findings(plan, DEFAULT_PHASE_BUDGET_HOURS) if not smoke else []))

    if kube is not None:
        yaml, env_vars, job, warnings = _materialize(
            cfg, meta, output, extra, lambda c: JobCheck(*kube_job_overrides(c, kube, smoke)), versions, gate,
            judge=judge)
        args = train_arguments(smoke=smoke, replan=replan, data_path=data_path, tokenizer=tokenizer,
                               save_dir=save_dir, overrides=job.overrides)
        return run_kubeflow(yaml, meta, env_vars, kube, smoke=smoke, smoke_ranks=smoke_ranks, dry_run=dry_run,
                            train_args=args, notes=job.notes + _finding_notes(warnings))[0]
    check = slurm_job_check(settings or _settings_of(executor), meta, smoke, smoke_nodes)
    amend = None
    if settings is not None:  # a job we build: its resiliency, as launch plans it (a ready executor keeps its launcher)
        def amend(written, effective, job: JobCheck) -> None:
            plan = emit.plan_from_config(effective, meta["hardware"], meta["world_size"], meta["recipe"])
            job_resilience(written, plan, job, settings, smoke, resiliency)
            if job.resilience.enabled:  # the header says the job's sections are in the YAML (check reads it)
                meta[RESILIENCY_KEY] = True
            else:
                meta.pop(RESILIENCY_KEY, None)

    yaml, env_vars, job, warnings = _materialize(cfg, meta, output, extra, check, versions, gate, amend, judge)
    if settings is None:
        job.notes.append("resiliency not planned: the given nemo_run.SlurmExecutor keeps its own launcher and "
                         "retries (pass SlurmSettings to get the FT launcher, in-job restart and the sized exit)")
    write_ft_config(job, Path(yaml))
    args = train_arguments(smoke=smoke, replan=replan, data_path=data_path, tokenizer=tokenizer, save_dir=save_dir,
                           overrides=job.overrides)
    return run_slurm(yaml, meta, env_vars, settings, smoke=smoke, smoke_ranks=smoke_ranks, smoke_nodes=smoke_nodes,
                     dry_run=dry_run, wait=wait,
                     train_args=args, executor=None if settings is not None else executor,
                     notes=job.notes + _finding_notes(job.findings + warnings),
                     resilience=job.resilience)
