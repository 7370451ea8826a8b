"""Build and run: a :class:`~lcmoe_recipes.request.TrainingRequest` becomes validated ConfigContainer YAMLs (one per
phase) and runs through torchrun here (``local``) or a Slurm job through NeMo-Run (``slurm``).

* :func:`build` -- the request resolved (:func:`lcmoe_recipes.resolve.resolve`, each phase of
  :func:`~lcmoe_recipes.resolve.phase_requests`), its ConfigContainer built, overridden (Hydra syntax, megatron-bridge's
  own parser), checked again for the target (our checks, upstream ``validate()``, the known upstream bugs for the
  versions the job runs), and written as YAML; a Slurm job's folder, paths and time limit checked too.
* :func:`run` -- one built config run (the torchrun command or the sbatch script with ``dry_run``).
* :func:`submit` -- any ConfigContainer (or a YAML ``build`` wrote) validated for its target and run.

The command line is :mod:`lcmoe_recipes.cli.launch` (``python -m lcmoe_recipes.launch``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
from pathlib import Path

from ..catalog import get_hardware
from ..errors import LcmoeError
from ..executors import (EXECUTORS, LaunchResult, SlurmSettings, check_settings, job_dir_of, nodes_for,
                         overlay_step, run_local, run_slurm, train_arguments)
from ..job_checks import JobCheck
from ..kubeflow import KubeflowSettings, check_kubeflow_settings, kube_job_overrides, run_kubeflow
from ..checks.known_issues import job_versions
from ..overlay import validate_for_image
from ..plan import Plan, carry_reasons
from ..recipes import NAMED_RECIPES
from ..request import TrainingRequest
from ..resolve import Weights, named_options, phase_requests, resolve, retarget_source, weights_of


# a calibration run logs every step's time, TFLOP/s and memory (what lcmoe_recipes.calibration reads)
CALIBRATION_RUN_OVERRIDES = ["logger.log_interval=1", "logger.log_throughput=true"]


@dataclasses.dataclass
class Built:
    """One config of a request: the plan asked for, the plan the config states (after overrides), the config, the
    overrides applied, warnings, where its weights come from, and (``--from``) every field the retargeting changed;
    once :func:`build` wrote it, also where its YAML went, its header, the command each node runs and the Slurm job
    checks."""

    plan: Plan
    shown: Plan
    cfg: object
    overrides: list
    warnings: list
    weights: Weights
    changes: list = dataclasses.field(default_factory=list)
    output: Path | None = None
    meta: dict = dataclasses.field(default_factory=dict)
    command: str = ""
    job: object = None


def torchrun_command(yaml_path: str | Path, world_size: int, gpus_per_node: int) -> str:
    """The command every node of the cluster runs (one torchrun per node; under Slurm: ``srun --ntasks-per-node 1``).

    Raises:
        LcmoeError: ``world_size`` does not fill whole nodes.
    """
    nodes = nodes_for(world_size, gpus_per_node)
    return (f"torchrun --nnodes {nodes} --nproc-per-node {gpus_per_node} --rdzv-backend c10d "
            f"--rdzv-endpoint \"$MASTER_ADDR:${{MASTER_PORT:-29500}}\" -m lcmoe_recipes.train "
            f"--config {shlex.quote(str(yaml_path))}")


def _output(plan: Plan, overrides: list[str], output: str | Path | None) -> Path:
    """Where the YAML goes: ``output``, else ``out/<plan>.yaml`` (``out/<plan>+<hash of the overrides>.yaml`` with
    overrides, so the plain recipe's file is never overwritten by an overridden one).

    Raises:
        LcmoeError: ``output`` is a directory.
    """
    if output is None:
        digest = hashlib.sha1("\0".join(overrides).encode()).hexdigest()[:8]
        output = Path(f"out/{plan.name}+{digest}.yaml" if overrides else f"out/{plan.name}.yaml")
    output = Path(output)
    if output.exists() and output.is_dir():
        raise LcmoeError(f"--output {output} is a directory", f"give a file name, e.g. {output / (plan.name + '.yaml')}")
    return output


def configure(plan: Plan, request: TrainingRequest, overrides: list[str] = (),
              container_image: str | None = None, overlay: bool = True) -> Built:
    """``plan``'s ConfigContainer (``--from``: the source config retargeted), ``overrides`` applied with
    megatron-bridge's parser, then checked again for the target: our checks, upstream ``validate()``, the known
    upstream bugs and megatron-core's Transformer Engine gates for the versions a job on ``container_image`` runs
    (:func:`lcmoe_recipes.overlay.validate_for_image`, through an overlay of the pinned megatron unless ``overlay``
    is False; default: installed). Nothing is written.

    Raises:
        OverrideError: a bad override. InfeasibleConfig: the config breaks a rule or upstream refuses it.
    """
    from .. import emit

    hw, world = plan.hardware_spec, plan.layout.world
    overrides = list(overrides)
    changes: list = []
    if request.from_config:
        cfg, changes = emit.retarget_config(retarget_source(request.from_config)[0], plan)
    else:
        cfg = emit.build_config(plan, validate=False)  # validated once, below, after the overrides
    shown = plan
    if overrides:
        emit.apply_overrides(cfg, overrides)
        shown = emit.plan_from_config(cfg, hw, world, plan.name)
        shown = shown.with_changes(reasons=carry_reasons(plan, shown))
    warnings = validate_for_image(cfg, hw, world, plan.name, container_image, overlay)
    return Built(plan, shown, cfg, overrides, warnings, weights_of(request, plan.model), changes)


def configure_phases(request: TrainingRequest, container_image: str | None = None,
                     before_build=None, overlay: bool = True) -> list[Built]:
    """:func:`configure` for every phase of ``request`` (one without phases): each phase resolved
    (:func:`lcmoe_recipes.resolve.resolve`) and started from the previous phase's ``checkpoint.save``; its overrides
    are ``save_dir`` (``DIR/phaseN_<len>k`` per phase), the request's own, then its data.

    Args:
        before_build: called with each phase's Plan before its config is built (cheap checks that can refuse).

    Raises:
        LcmoeError: anything :func:`~lcmoe_recipes.resolve.resolve` or :func:`configure` refuses.
    """
    from .. import emit

    phases = phase_requests(request)
    phased = len(phases) > 1
    out: list[Built] = []
    for index, phase in enumerate(phases):
        if index:
            phase = phase.replace(pretrained_checkpoint=out[-1].cfg.checkpoint.save)
        plan = resolve(phase)
        if before_build is not None:
            before_build(plan)
        save_dir = (f"{request.save_dir.rstrip('/')}/phase{index + 1}_{phase.seq_length // 1024}k"
                    if request.save_dir and phased else request.save_dir)
        overrides = (emit.save_overrides(save_dir) + (CALIBRATION_RUN_OVERRIDES if request.calibration_run else [])
                     + list(request.overrides) + emit.data_overrides(list(request.data_path) or None, request.tokenizer))
        one = configure(plan, phase, overrides, container_image, overlay)
        one.meta = _header(one, phase)
        out.append(one)
    return out


def _header(one: Built, request: TrainingRequest) -> dict:
    """The YAML header of ``one``: its target and overrides, where its weights come from, what a named recipe was
    built with (so ``check`` compares like with like), or what it was retargeted from."""
    from .. import emit

    plan = one.plan
    meta = {**emit.target_meta(one.shown, one.overrides), **({"weights": one.weights.entry} if one.weights.entry else {})}
    if request.from_config:
        meta["retargeted_from"] = str(request.from_config)
    elif plan.name in NAMED_RECIPES:
        options = {**named_options(request, NAMED_RECIPES[plan.name]), "pretrained_checkpoint": plan.pretrained_checkpoint}
        options = {k: v for k, v in options.items() if v is not None}
        if options:
            meta["options"] = options
    return meta


def build(request: TrainingRequest, *, container_image: str | None = None, output: str | Path | None = None,
          settings: SlurmSettings | KubeflowSettings | None = None, smoke: bool = False, smoke_nodes: int = 1,
          budget_hours: float | None = None, overlay: bool | None = None) -> list[Built]:
    """The validated configs of ``request``, one per phase (:func:`configure_phases`), each written as YAML.

    Args:
        container_image: the image the job runs: known upstream bugs and megatron-core's TE gates are judged for
            its versions (through an overlay of the pinned megatron where it needs one); default: the installed
            ones, or ``settings``' image.
        output: the YAML's path; with phases, its stem names each phase's (``<stem>-phaseN.yaml``).
        settings: a Slurm or Kubernetes job's settings: its folder or volume, the paths the config reads and writes,
            and the predicted time against its time limit are checked too (a chained phase that cannot finish is
            refused).
        smoke, smoke_nodes: the job is a smoke check on that many nodes (no time check).
        overlay: judge the image with an overlay of the pinned megatron where it needs one (default: ``settings``',
            else True); False: the image's own versions.
        budget_hours: warn about a phase predicted to run longer (default
            :data:`lcmoe_recipes.cost.wallclock.DEFAULT_PHASE_BUDGET_HOURS`), with the tokens per step that fit it.

    Raises:
        LcmoeError: anything :func:`configure_phases` refuses; phases on Slurm without ``save_dir``; a job folder or
            path the job cannot use.
    """
    from .. import emit
    from ..cost.wallclock import DEFAULT_PHASE_BUDGET_HOURS, phase_findings

    phased = bool(request.phases and len(request.phases) > 1)
    if phased and isinstance(settings, SlurmSettings) and not request.save_dir:
        raise LcmoeError("--phases on Slurm needs --save-dir: each job runs in its own code folder, so the next "
                         "phase would not find the previous phase's checkpoints",
                         "add --save-dir /shared/folder (each phase saves under DIR/phaseN_<len>k)")
    if container_image is None and settings is not None:
        container_image = settings.image if isinstance(settings, KubeflowSettings) else settings.container_image
    checks: list = []

    def job_folder(plan: Plan) -> None:  # before the heavy build: the job's folder (Slurm) or volume (Kubernetes)
        if isinstance(settings, KubeflowSettings):
            checks.append(lambda cfg: JobCheck(*kube_job_overrides(cfg, settings, smoke)))
        else:
            checks.append(slurm_job_check(settings, {"world_size": plan.layout.world,
                                                     "hardware": plan.hardware_spec.key}, smoke, smoke_nodes))
            overlay_step(settings, plan.hardware_spec, build=False)  # an image that cannot take one: refused now

    overlay = getattr(settings, "overlay", True) if overlay is None else overlay
    built = configure_phases(request, container_image, job_folder if settings is not None else None, overlay)
    for index, one in enumerate(built):  # every check first: nothing is written for a request that is refused
        if settings is not None:
            one.job = checks[index](one.cfg)
            one.warnings = one.warnings + one.job.findings
        one.warnings = (one.warnings + list(one.weights.notes)
                        + _time_findings(one, settings, smoke, chained=index < len(built) - 1)
                        + (phase_findings(one.shown, budget_hours or DEFAULT_PHASE_BUDGET_HOURS) if not smoke else []))
        one.output = _output(one.plan, one.overrides, _phase_output(output, one, index, len(built), request))
    for one in built:
        emit.write_yaml(one.cfg, one.output, one.meta)
        one.command = torchrun_command(one.output, one.plan.layout.world, one.plan.hardware_spec.gpus_per_node)
    return built


def _phase_output(output, one: Built, index: int, phases: int, request: TrainingRequest) -> str | Path | None:
    """Where phase ``index`` of ``phases`` goes: ``output`` for one config; ``<stem>-phaseN<suffix>`` of it with
    phases; ``out/<plan>.yaml`` for a retargeted config; else None (:func:`_output`'s default)."""
    if output is not None:
        output = Path(output)
        return output if phases == 1 else output.with_name(f"{output.stem}-phase{index + 1}{output.suffix or '.yaml'}")
    return f"out/{one.plan.name}.yaml" if request.from_config else None


def run(one: Built, executor: str = "local", settings: SlurmSettings | KubeflowSettings | None = None, *,
        smoke: bool = False, smoke_ranks: int = 2, smoke_nodes: int = 1, nproc_per_node: int | None = None,
        dry_run: bool = False, wait: bool = True, replan: bool = False, after_job: str | None = None,
        echo: bool = True) -> LaunchResult:
    """Run one built config: torchrun here (``local``), a Slurm job (``slurm``, with its ``settings``; a later phase
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
                     train_args=train_args, notes=one.job.notes if one.job else [])


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


def _materialize(cfg, meta: dict, output: str | Path | None, extra: list[str] = (), check_job=None, versions=None):
    """(YAML path, env_vars, what ``check_job`` returned) for ``cfg``: validated for its target ``meta`` with the
    ranks' ``extra`` overrides applied (to a copy; they travel on the ranks' command line; known upstream bugs judged
    for ``versions``, default the installed ones), then ``check_job(that config)``, and only then the YAML written
    (when ``cfg`` is a ConfigContainer or a YAML without our header)."""
    import copy

    from .. import emit

    path = Path(cfg) if isinstance(cfg, (str, os.PathLike)) else None
    loaded, found = emit.read_yaml(path) if path else (cfg, {})
    effective = emit.apply_overrides(copy.deepcopy(loaded), list(extra)) if extra else loaded
    emit.validate_config(effective, meta["hardware"], meta["world_size"], meta["recipe"], versions)
    job = check_job(effective) if check_job else None
    env_vars = dict(loaded.env_vars or {})
    if path:
        if found.get("world_size") and found.get("hardware") and output is None:
            return path, env_vars, job
        target = Path(output or f"out/{path.stem}.{meta['hardware']}x{meta['world_size']}.yaml")
        return emit.write_yaml(loaded, target, meta), env_vars, job
    if output is None:
        staged = emit.write_yaml(cfg, Path("out") / f".{meta['recipe']}.staged.yaml", meta)
        digest = hashlib.sha1(staged.read_bytes()).hexdigest()[:8]
        target = staged.with_name(f"{meta['recipe']}-{digest}.yaml")
        os.replace(staged, target)
    else:
        target = emit.write_yaml(cfg, output, meta)
    return target, env_vars, job


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


def slurm_job_check(settings: SlurmSettings, meta: dict, smoke: bool = False, smoke_nodes: int = 1):
    """Check the job folder for ``settings`` and the nodes ``meta`` plans for (``smoke_nodes`` for a smoke job) now
    (:func:`lcmoe_recipes.job_checks.job_folder_findings`: no config needed), and return the check of the ranks'
    ConfigContainer (:func:`lcmoe_recipes.job_checks.slurm_job`, the folder's warnings added).

    Raises:
        InfeasibleConfig: a node-local job folder for a multi-node job.
    """
    from ..checks import raise_for_errors
    from ..job_checks import job_folder_findings, slurm_job

    nodes = smoke_nodes if smoke else nodes_for(meta["world_size"], get_hardware(meta["hardware"]).gpus_per_node)
    job_dir = job_dir_of(settings)
    folder = job_folder_findings(job_dir, nodes, settings.tunnel == "local")
    raise_for_errors(folder, "the Slurm job")

    def check(cfg):
        job = slurm_job(cfg, settings, job_dir, smoke=smoke)
        job.findings = folder + job.findings
        return job

    return check


def submit(cfg, executor="local", *, smoke: bool = False, dry_run: bool = False, wait: bool = True,
           world_size: int | None = None, hardware: str | None = None, output: str | Path | None = None,
           nproc_per_node: int | None = None, smoke_ranks: int = 2, smoke_nodes: int = 1,
           data_path: list[str] | None = None,
           tokenizer: str | None = None, save_dir: str | None = None, replan: bool = False) -> LaunchResult:
    """Validate ``cfg`` for its target and run it with torchrun here, or as a Slurm or Kubeflow Trainer job through
    NeMo-Run.

    Args:
        cfg: a ConfigContainer from lcmoe_recipes (a factory such as ``dsv3_128k_h100()``, ``build_recipe``: it
            remembers its target; a ``copy.deepcopy`` of it does not), any other ConfigContainer (then give
            ``world_size`` and ``hardware``), or the path of a YAML written by ``launch``.
        executor: ``"local"``, ``"slurm"`` (settings from the environment: ``SBATCH_ACCOUNT``), a
            :class:`~lcmoe_recipes.executors.SlurmSettings`, a ready ``nemo_run.SlurmExecutor``, or a
            :class:`~lcmoe_recipes.kubeflow.KubeflowSettings` (a Kubeflow Trainer job; ``dry_run``: its manifest).
        smoke: CPU-only check with ``smoke_ranks`` ranks (gloo all-reduce, no training; no GPU needed); under Slurm
            on ``smoke_nodes`` nodes, each checking that the config's paths exist there.
        dry_run: build the torchrun command / sbatch script and return it without running anything.
        wait: Slurm: wait for the job and read its state and logs.
        output: where to write the YAML (default for a ConfigContainer: ``out/<recipe>-<first 8 hex of the YAML's
            SHA-1>.yaml``, so two different configs never share a file; for a YAML with our header: that file).
        nproc_per_node: local: ranks (default the planned world size).
        data_path, tokenizer: real data for the ranks (see :func:`lcmoe_recipes.emit.data_overrides`).
        save_dir: absolute folder for the run's checkpoints and logs (see :func:`lcmoe_recipes.emit.save_overrides`).
        replan: let the ranks plan again when they find another world size or GPU type.

    Returns:
        :class:`~lcmoe_recipes.executors.LaunchResult`: state, job id, log path, first error line, the command or
        sbatch script; for Slurm, ``notes`` (the exit duration from ``time``, the job folder rule, warnings about
        the job's paths).

    Raises:
        LcmoeError: the config fails validation for its target, its target is unknown, an unknown executor, a GPU
            count that does not fill whole nodes, a Slurm time without hours, a path the Slurm job cannot use
            (:func:`lcmoe_recipes.job_checks.slurm_job`).
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
    if executor == "local":
        yaml, env_vars, _ = _materialize(cfg, meta, output, extra, versions=versions)
        args = train_arguments(smoke=smoke, replan=replan, data_path=data_path, tokenizer=tokenizer, save_dir=save_dir)
        return run_local(yaml, meta, env_vars, smoke=smoke, smoke_ranks=smoke_ranks, nproc_per_node=nproc_per_node,
                         dry_run=dry_run, train_args=args)
    if kube is not None:
        yaml, env_vars, job = _materialize(cfg, meta, output, extra, lambda c: JobCheck(*kube_job_overrides(c, kube, smoke)),
                                           versions)
        args = train_arguments(smoke=smoke, replan=replan, data_path=data_path, tokenizer=tokenizer,
                               save_dir=save_dir, overrides=job.overrides)
        return run_kubeflow(yaml, meta, env_vars, kube, smoke=smoke, smoke_ranks=smoke_ranks, dry_run=dry_run,
                            train_args=args, notes=job.notes)[0]
    check = slurm_job_check(settings or _settings_of(executor), meta, smoke, smoke_nodes)
    yaml, env_vars, job = _materialize(cfg, meta, output, extra, check, versions)
    args = train_arguments(smoke=smoke, replan=replan, data_path=data_path, tokenizer=tokenizer, save_dir=save_dir,
                           overrides=job.overrides)
    return run_slurm(yaml, meta, env_vars, settings, smoke=smoke, smoke_ranks=smoke_ranks, smoke_nodes=smoke_nodes,
                     dry_run=dry_run, wait=wait,
                     train_args=args, executor=None if settings is not None else executor,
                     notes=job.notes + [f"{f.severity}: {f.rule}: {f.message}; fix: {f.fix}" for f in job.findings])


def _time_findings(one: Built, settings, smoke: bool, chained: bool) -> list:
    """A Slurm or Kubernetes training job's predicted time against its time limit (:func:`lcmoe_recipes.job_checks.
    training_time_finding`): [] or one warning.

    Raises:
        InfeasibleConfig: a phase that would stop early while the next one waits on it (``afterok``).
    """
    if settings is None or smoke or not one.cfg.train.train_iters or not settings.time:
        return []
    from ..checks import raise_for_errors
    from ..cost import estimate_step
    from ..job_checks import training_time_finding

    finding = training_time_finding(one.cfg.train.train_iters, estimate_step(one.shown).step_seconds, settings.time,
                                    chained)
    if finding is None:
        return []
    raise_for_errors([finding], one.plan.name)
    return [finding]
