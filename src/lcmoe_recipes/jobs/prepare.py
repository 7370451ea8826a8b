"""Prepare a job: a :class:`~lcmoe_recipes.core.request.TrainingRequest` becomes validated ConfigContainer YAMLs, one
per phase.

* :func:`configure` -- one :class:`~lcmoe_recipes.planner.resolve.Resolution` becomes its ConfigContainer (the source
  config retargeted, or the plan's), overridden (Hydra syntax, megatron-bridge's own parser) and checked again for the
  target (our checks, upstream ``validate()``, the known upstream bugs and megatron-core's Transformer Engine gates
  for the versions the job's image runs: :func:`validate_for_image`); nothing is written, and nothing calls back into
  the resolver: the resolution carries the weights, the source config and the named recipe's options.
* :func:`configure_phases` -- every phase resolved once and configured, each starting from the previous one's saves.
* :func:`prepare` -- those configs checked for the job too (a Slurm job's folder, paths and time limit; a Kubernetes
  job's volume) and written as YAML, with the command each node runs.

Running them is :mod:`lcmoe_recipes.jobs.submit`; the command line is :mod:`lcmoe_recipes.cli.launch`
(``python -m lcmoe_recipes.launch``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
from pathlib import Path

from ..catalog import get_hardware
from ..catalog.config_fields import override_key
from ..checks.known_issues import job_versions
from ..checks.weights import PRETRAINED, Weights, not_here
from ..core.plan import Plan, Reason, carry_reasons
from ..core.request import SAME_QUANTITY, TrainingRequest, seq_tag
from ..emit.paths import is_url
from ..emit.yaml_io import RESILIENCY_KEY
from ..errors import Finding, LcmoeError
from ..planner.resolve import Resolution, phase_requests, resolve
from .executors.common import nodes_for
from .executors.kubeflow import KubeflowSettings, kube_job_overrides
from .executors.slurm import SlurmSettings, job_dir_of, nodes_bin_dir, overlay_step
from .job_checks import JobCheck
from .start_gate import refuse_to_start
from .overlay import nearest_image


# a calibration run logs every step's time, TFLOP/s and memory (what lcmoe_recipes.calibration reads)
CALIBRATION_RUN_OVERRIDES = ["logger.log_interval=1", "logger.log_throughput=true"]


@dataclasses.dataclass
class Configured:
    """One config of a request: what the resolver answered (the plan asked for, the weights, the named recipe's
    options), the plan the config states (after overrides), the config, the overrides applied, warnings, and
    (``--from``) every field the retargeting changed; once :func:`prepare` wrote it, also where its YAML went, its
    header, the command each node runs and the job's checks."""

    resolution: Resolution
    shown: Plan
    cfg: object
    overrides: list
    warnings: list
    changes: list = dataclasses.field(default_factory=list)
    output: Path | None = None
    meta: dict = dataclasses.field(default_factory=dict)
    command: str = ""
    job: object = None

    @property
    def plan(self) -> Plan:
        """The plan asked for (before overrides)."""
        return self.resolution.plan

    @property
    def weights(self) -> Weights:
        """Where the run's weights come from (checked once, by the resolver)."""
        return self.resolution.weights


def torchrun_command(yaml_path: str | Path, world_size: int, gpus_per_node: int) -> str:
    """The command every node of the cluster runs (one torchrun per node; under Slurm: ``srun --ntasks-per-node 1``).

    Raises:
        LcmoeError: ``world_size`` is above one node and does not fill whole nodes.
    """
    # a job smaller than a node runs on one node with that many GPUs; a larger one fills whole nodes
    nodes, per_node = (1, world_size) if world_size < gpus_per_node else (nodes_for(world_size, gpus_per_node),
                                                                         gpus_per_node)
    return (f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend c10d "
            f"--rdzv-endpoint \"$MASTER_ADDR:${{MASTER_PORT:-29500}}\" -m lcmoe_recipes.train "
            f"--config {shlex.quote(str(yaml_path))}")


def _output(plan: Plan, overrides: list[str], output: str | Path | None, cfg=None, options: dict | None = None) -> Path:
    """Where the YAML goes: ``output``, else ``out/<plan>.yaml`` (``out/<plan>+<hash>.yaml`` with overrides or run
    ``options`` -- the header's ``options`` and ``weights``: ``--tokens-per-step``, ``--rope``, ``--from-hf`` -- the
    hash over both, so the plain recipe's file is never overwritten by another one). Where a resilient Slurm job
    added its sections to ``cfg`` (given only then), ``out/<plan>+<hash>.slurm.yaml``, the hash also over those
    sections' values (:data:`lcmoe_recipes.emit.yaml_io.RESILIENCY_FIELDS`: they follow the time limit), so neither
    a local dry run's file nor another time limit's is overwritten.

    Raises:
        LcmoeError: ``output`` is a directory.
    """
    if output is None:
        job = []
        if cfg is not None:
            from ..emit.settings import flat_fields
            from ..emit.yaml_io import RESILIENCY_FIELDS

            job = [f"{key}={value!r}" for key, value in sorted(flat_fields(cfg).items())
                   if any(key == f or key.startswith(f + ".") for f in RESILIENCY_FIELDS)]
        job += [f"{key}={value!r}" for key, value in sorted((options or {}).items())]
        digest = hashlib.sha1("\0".join([*overrides, *job]).encode()).hexdigest()[:8]
        suffix = ".slurm.yaml" if cfg is not None else ".yaml"
        output = Path(f"out/{plan.name}+{digest}{suffix}" if overrides or job else f"out/{plan.name}{suffix}")
    output = Path(output)
    if output.exists() and output.is_dir():
        raise LcmoeError(f"`output` {output} is a directory", f"give a file name, e.g. {output / (plan.name + '.yaml')}",
                         fields=("output",))
    return output


def configure(resolution: Resolution, overrides: list[str] = (), container_image: str | None = None,
              overlay: bool = True) -> Configured:
    """``resolution``'s ConfigContainer (``--from``: its source config retargeted), ``overrides`` applied with
    megatron-bridge's parser, then checked again for the target: our checks, upstream ``validate()``, the known
    upstream bugs and megatron-core's Transformer Engine gates for the versions a job on ``container_image`` runs
    (:func:`validate_for_image`, through an overlay of the pinned megatron unless ``overlay`` is False; default:
    installed). Nothing is written; the resolver is not called again.

    Raises:
        OverrideError: a bad override. InfeasibleConfig: the config breaks a rule or upstream refuses it.
    """
    from .. import emit

    plan = resolution.plan
    hw, world = plan.hardware_spec, plan.layout.world
    overrides = list(overrides)
    repeated = _repeated(overrides)  # the user's own, before the derived ones are added
    changes: list = []
    if resolution.source is not None:
        request = resolution.request
        cfg, changes = emit.retarget_config(resolution.source.cfg, plan,
                                            schedule=request.lr is not None or request.train_iters is not None)
    else:
        cfg = emit.config_from_plan(plan, validate=False)  # validated once, below, after the overrides
    shown, derived, unchanged = plan, [], []
    if overrides:
        emit.apply_overrides(cfg, overrides, unchanged)
        shown = emit.plan_from_config(cfg, hw, world, plan.name, plan.base_recipe)
        shown, derived = emit.follow_overrides(cfg, overrides, shown, plan, resolution.request.rope,
                                               lambda c: emit.plan_from_config(c, hw, world, plan.name, plan.base_recipe))
        overrides += [text for one in derived for text in one.overrides]  # the header's overrides rebuild this
        shown = shown.with_changes(reasons={**carry_reasons(plan, shown), **{d.key: d.reason for d in derived}})
    warnings = validate_for_image(cfg, hw, world, plan.name, container_image, overlay)
    warnings = [Finding("warning", "override/derived", f"{' '.join(d.overrides)}: {d.reason.why}", "override them too "
                        "to choose other values") for d in derived] + _replaced(resolution.request, overrides) + [
        Finding("warning", "override/no-op", f"{text}: the planned config has this value already; the override "
                "changes nothing",
                "drop it, or give another value") for text in unchanged] + repeated + warnings
    warnings += _benchmark_schedule(resolution, cfg)
    one = Configured(resolution, shown, cfg, overrides, warnings, changes)
    one.meta = _header(one)
    return one


def _repeated(overrides: list[str]) -> list[Finding]:
    """A warning (``override/repeated``) for each key set more than once: megatron-bridge's parser applies them in
    order, so the last one wins."""
    seen: dict[str, list[str]] = {}
    for text in overrides:
        seen.setdefault(override_key(text), []).append(text)
    return [Finding("warning", "override/repeated", f"{key} is given {len(texts)} times ({', '.join(texts)}): the "
                    f"last one, {texts[-1]}, is what runs", "give it once") for key, texts in seen.items()
            if len(texts) > 1]


def _replaced(request: TrainingRequest, overrides: list[str]) -> list[Finding]:
    """A warning (``override/replaces-request``) for each override that sets a quantity the request also asks for
    (:data:`~lcmoe_recipes.core.request.SAME_QUANTITY`) to another value: the override wins, under a name and a plan
    made for the request's value."""
    out = []
    for text in overrides:
        key, value = override_key(text), text.partition("=")[2]
        field = SAME_QUANTITY.get(key)
        asked = getattr(request, field) if field else None
        try:
            differs = asked is not None and float(value) != float(asked)
        except ValueError:
            differs = False
        if differs:
            out.append(Finding("warning", "override/replaces-request", f"{text} replaces the request's {field} "
                               f"{asked}: the config runs {key.rpartition('.')[2]} {value.strip()}, but its "
                               f"name and layout were chosen for {asked}",
                               f"to have them chosen for {value.strip()}, ask for it in the request ({field} "
                               f"{value.strip()}) and drop the override"))
    return out


def configure_phases(request: TrainingRequest, container_image: str | None = None,
                     before_config=None, overlay: bool = True) -> list[Configured]:
    """:func:`configure` for every phase of ``request`` (one without phases): each phase resolved once
    (:func:`lcmoe_recipes.planner.resolve.resolve`) and started from the previous phase's ``checkpoint.save``; its
    overrides are ``save_dir`` (``DIR/phaseN_<len>k`` per phase), the request's own, then its data.

    Args:
        before_config: called with each phase's Plan before its config is made (cheap checks that can refuse).

    Raises:
        LcmoeError: anything :func:`~lcmoe_recipes.planner.resolve.resolve` or :func:`configure` refuses.
    """
    from .. import emit

    phases = phase_requests(request)
    # real data with the weights of a Hugging Face folder: that folder's tokenizer, unless one is given
    tokenizer = request.tokenizer or (request.from_hf if request.data_path and request.from_hf else None)
    phased = len(phases) > 1
    out: list[Configured] = []
    for index, phase in enumerate(phases):
        if index:
            phase = phase.replace(pretrained_checkpoint=out[-1].cfg.checkpoint.save)
        resolution = resolve(phase)
        if before_config is not None:
            before_config(resolution.plan)
        save_dir = (f"{request.save_dir.rstrip('/')}/phase{index + 1}_{seq_tag(phase.seq_length)}"
                    if request.save_dir and phased else request.save_dir)
        overrides = (emit.save_overrides(save_dir) + (CALIBRATION_RUN_OVERRIDES if request.calibration_run else [])
                     + list(request.overrides) + emit.data_overrides(list(request.data_path) or None, tokenizer))
        out.append(configure(resolution, overrides, container_image, overlay))
    return out


def _header(one: Configured) -> dict:
    """The YAML header of ``one``: its target and overrides, where its weights come from, what a named recipe was
    configs with (so ``check`` compares like with like), or what it was retargeted from."""
    from .. import emit

    resolution = one.resolution
    meta = {**emit.target_meta(one.shown, one.overrides), **({"weights": one.weights.entry} if one.weights.entry else {})}
    if resolution.source is not None:
        meta["retargeted_from"] = str(resolution.source.name)
    elif resolution.options:
        meta["options"] = dict(resolution.options)
    return meta


def prepare(request: TrainingRequest, *, container_image: str | None = None, output: str | Path | None = None,
          settings: SlurmSettings | KubeflowSettings | None = None, smoke: bool = False, smoke_nodes: int = 1,
          budget_hours: float | None = None, overlay: bool | None = None, start: bool = False,
          mock_data: bool = False, from_scratch: bool = False, resiliency: bool = True) -> list[Configured]:
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
        start: the configs will train (not a dry run, not a smoke check): refused unless each has real data and a
            tokenizer, an extension has its pretrained weights, and a local run has its GPUs here
            (:func:`lcmoe_recipes.jobs.start_gate.start_blockers`); ``mock_data`` / ``from_scratch`` accept mock data /
            random initialisation on purpose.
        resiliency: a multi-node Slurm training job gets the FT launcher, in-job restart, straggler detection and
            a time-limit exit that leaves room for the final save (:mod:`lcmoe_recipes.jobs.resilience`); False
            (``launch --no-resiliency``) turns them off.

    Raises:
        LcmoeError: anything :func:`configure_phases` refuses; phases on Slurm without ``save_dir``; a job folder or
            path the job cannot use; with ``start``, every blocker of every phase in one error.
    """
    from .. import emit
    from ..cost.wallclock import DEFAULT_PHASE_BUDGET_HOURS
    from ..checks.wallclock import phase_findings

    phased = bool(request.phases and len(request.phases) > 1)
    if phased and isinstance(settings, SlurmSettings) and not request.save_dir:
        raise LcmoeError("`phases` on Slurm needs `save_dir`: each job runs in its own code folder, so the next "
                         "phase would not find the previous phase's checkpoints",
                         "add save_dir=/shared/folder (each phase saves under DIR/phaseN_<len>k)",
                         fields=("phases", "save_dir"))
    if container_image is None and settings is not None:
        container_image = settings.image if isinstance(settings, KubeflowSettings) else settings.container_image
    checks: list = []

    def job_folder(plan: Plan) -> None:  # before the config is made: the job's folder (Slurm) or volume (Kubernetes)
        if isinstance(settings, KubeflowSettings):
            checks.append(lambda cfg: JobCheck(*kube_job_overrides(cfg, settings, smoke)))
        else:
            checks.append(slurm_job_check(settings, {"world_size": plan.layout.world,
                                                     "hardware": plan.hardware_spec.key}, smoke, smoke_nodes))
            overlay_step(settings, plan.hardware_spec, install=False)  # an image that cannot take one: refused now

    overlay = getattr(settings, "overlay", True) if overlay is None else overlay
    configs = configure_phases(request, container_image, job_folder if settings is not None else None, overlay)
    for index, one in enumerate(configs):  # every check first: nothing is written for a request that is refused
        if settings is not None:
            one.job = checks[index](one.cfg)
            if isinstance(settings, SlurmSettings):
                job_resilience(one.cfg, one.shown, one.job, settings, smoke, resiliency)
                if one.job.resilience.enabled:  # the job's sections are in the YAML: its header and name say so
                    one.meta = {**one.meta, RESILIENCY_KEY: True}
            one.warnings = one.warnings + one.job.findings
        one.warnings = (one.warnings + list(one.weights.notes) + _overridden_weights_notes(one)
                        + time_findings(one.cfg, one.shown, one.job, settings, smoke, index < len(configs) - 1,
                                        one.plan.name)
                        + (phase_findings(one.shown, budget_hours or DEFAULT_PHASE_BUDGET_HOURS) if not smoke else []))
        one.output = _output(one.plan, one.overrides, _phase_output(output, one, index, len(configs), request),
                             one.cfg if one.meta.get(RESILIENCY_KEY) else None,
                             {key: one.meta[key] for key in ("options", "weights") if one.meta.get(key)
                              and not (key == "weights" and one.resolution.request.phase)})  # (a phase's: chained)
    if start:  # every phase runs on the same target: a local run needs its ranks' GPUs here
        refuse_to_start([one.cfg for one in configs], mock_data=mock_data, from_scratch=from_scratch,
                        local_ranks=configs[0].plan.layout.world if settings is None else None)
    for one in configs:  # the command first: a world it cannot run is refused before anything is written
        one.command = torchrun_command(one.output, one.plan.layout.world, one.plan.hardware_spec.gpus_per_node)
    for one in configs:
        emit.write_yaml(one.cfg, one.output, one.meta)
        write_ft_config(one.job, one.output)
    return configs


EXIT_OVERRIDE = "train.exit_duration_in_mins="


def job_exit(cfg, job: JobCheck | None) -> int | None:
    """Minutes after which the job's training exits: the ``train.exit_duration_in_mins`` override on its command line
    (the time limit's, or resiliency's), else the config's own (None: no exit set)."""
    return next((int(o[len(EXIT_OVERRIDE):]) for o in (job.overrides if job else ()) if o.startswith(EXIT_OVERRIDE)),
                getattr(cfg.train, "exit_duration_in_mins", None))


def _benchmark_schedule(resolution, cfg) -> list:
    """A warning (``real-training/benchmark-schedule``) when a retargeting keeps the schedule of one of
    megatron-bridge's perf recipes (a few dozen steps at a pretraining peak LR, written to time a step, not to train)
    because the request gave neither an LR nor a step count."""
    source, request = resolution.source, resolution.request
    if source is None or not source.meta.get("benchmark") or request.lr is not None or request.train_iters is not None:
        return []
    opt = cfg.optimizer
    return [Finding("warning", "real-training/benchmark-schedule",
                    f"the schedule is {source.name}'s, a benchmark's: {cfg.train.train_iters} steps at peak LR "
                    f"{opt.lr:g} ({cfg.scheduler.lr_decay_style} to {opt.min_lr:g}), a pretraining LR that an "
                    "extension of pretrained weights does not use",
                    "give the phase's --train-iters and --lr (e.g. the base model's final pretraining LR)")]


def startup_seconds(cfg, plan: Plan) -> float:
    """Seconds megatron-bridge's exit clock counts before the first step ends beyond a step's own time: the first
    step's extra (:data:`lcmoe_recipes.jobs.resilience.FIRST_STEP_EXTRA_SECONDS`) and, where ``cfg`` loads a
    checkpoint, its read (:func:`lcmoe_recipes.cost.wallclock.write_seconds`: a read as long as a write)."""
    from ..cost.wallclock import write_seconds
    from .resilience import FIRST_STEP_EXTRA_SECONDS

    checkpoint = cfg.checkpoint
    loads = bool(getattr(checkpoint, "load", None) or getattr(checkpoint, "pretrained_checkpoint", None))
    return FIRST_STEP_EXTRA_SECONDS + (write_seconds(plan) if loads else 0.0)


def job_resilience(cfg, plan: Plan, job: JobCheck, settings: SlurmSettings, smoke: bool, enabled: bool) -> None:
    """Plan the resiliency of the Slurm job that runs ``cfg`` (read back as ``plan``;
    :func:`lcmoe_recipes.jobs.resilience.plan_resilience`) into ``job``, set its megatron-bridge sections on ``cfg``
    (validated by megatron-bridge), bound the recovery saves by the time limit, and move the job's exit earlier when
    the final save needs more room. ``launch`` and the Python ``submit`` both plan a Slurm job's resiliency here."""
    from ..cost.wallclock import save_intervals
    from .job_checks import exit_duration, slurm_minutes
    from .resilience import apply_resilience, plan_resilience

    limit = slurm_minutes(settings.time) if settings.time and not smoke else None
    prefix = EXIT_OVERRIDE
    given = job_exit(cfg, job)
    res = plan_resilience(plan, nodes=nodes_for(plan.layout.world, plan.hardware_spec.gpus_per_node),
                          executor="slurm", smoke=smoke, enabled=enabled, time_limit_minutes=limit,
                          exit_minutes=given)
    job.resilience = res
    job.notes.extend(res.notes())
    if not enabled and (parts := [name for name in ("ft", "inprocess_restart", "nvrx_straggler")
                                  if getattr(cfg, name, None) is not None]):
        for name in parts:  # a YAML an earlier resilient job wrote: --no-resiliency means none of it runs
            setattr(cfg, name, None)
        job.notes.append(f"resiliency off: the config's {', '.join(parts)} section(s) removed from the job's config")
    if not res.enabled:
        return
    apply_resilience(cfg, res)
    if res.exit_duration_in_mins is not None:  # the sized exit replaces the job's (or the config's, or none at all)
        job.overrides = [o for o in job.overrides if not o.startswith(prefix)] + [
            f"{prefix}{res.exit_duration_in_mins}"]
        job.notes = [n for n in job.notes if not n.startswith(prefix)]
        job.findings = [f for f in job.findings if f.rule not in ("job/no-final-save", "job/exit-after-limit")]
    usable = res.exit_duration_in_mins or given or (exit_duration(limit) if limit else None)
    if usable and (training := usable * 60 - startup_seconds(cfg, plan)) > 0:  # the steps' share of the exit clock
        cadence = save_intervals(plan, time_limit_hours=training / 3600)
        ckpt = cfg.checkpoint
        if cadence.bound and cadence.non_persistent and cadence.non_persistent != ckpt.non_persistent_save_interval:
            ckpt.non_persistent_save_interval, ckpt.non_persistent_ckpt_type = cadence.non_persistent, "global"
            job.notes.append(f"checkpoint.non_persistent_save_interval={cadence.non_persistent}: {cadence.bound}")


def write_ft_config(job: JobCheck | None, output: Path) -> None:
    """Beside the YAML ``output``: the FT package's config file of ``job``'s resiliency where it is on
    (``<stem>.ft.yaml``, :func:`lcmoe_recipes.jobs.resilience.ft_config_text`), named in the job's notes."""
    if job is None or job.resilience is None or not job.resilience.enabled:
        return
    from .resilience import ft_config_text

    ft_file = output.with_name(output.stem + ".ft.yaml")
    ft_file.write_text(ft_config_text(job.resilience))
    job.notes.append(f"FT config file (the predicted section timeouts, for ft_launcher --fault-tol-cfg-path when "
                     f"you launch by hand; NeMo-Run's launcher passes only the heartbeat timeouts and restarts above, "
                     f"and megatron-bridge's ft.calc_ft_timeouts sizes the sections from what it observes): {ft_file}")


def _phase_output(output, one: Configured, index: int, phases: int, request: TrainingRequest) -> str | Path | None:
    """Where phase ``index`` of ``phases`` goes: ``output`` for one config; ``<stem>-phaseN<suffix>`` of it with
    phases; ``out/<plan>.yaml`` for a retargeted config; else None (:func:`_output`'s default)."""
    if output is not None:
        output = Path(output)
        return output if phases == 1 else output.with_name(f"{output.stem}-phase{index + 1}{output.suffix or '.yaml'}")
    return f"out/{one.plan.name}.yaml" if request.from_config else None


def slurm_job_check(settings: SlurmSettings, meta: dict, smoke: bool = False, smoke_nodes: int = 1):
    """Check the job folder for ``settings`` and the nodes ``meta`` plans for (``smoke_nodes`` for a smoke job) now
    (:func:`lcmoe_recipes.jobs.job_checks.job_folder_findings`: no config needed), and return the check of the ranks'
    ConfigContainer (:func:`lcmoe_recipes.jobs.job_checks.slurm_job`, the folder's warnings added).

    Raises:
        InfeasibleConfig: a node-local job folder for a multi-node job.
    """
    from ..checks import raise_for_errors
    from .job_checks import job_folder_findings, python_findings, slurm_job

    nodes = smoke_nodes if smoke else nodes_for(meta["world_size"], get_hardware(meta["hardware"]).gpus_per_node)
    job_dir = job_dir_of(settings)
    folder = job_folder_findings(job_dir, nodes, settings.tunnel == "local")
    raise_for_errors(folder, "the Slurm job")
    if not settings.container_image:  # the nodes run this Python (jobs.executors.slurm: setup_lines)
        folder += python_findings(str(nodes_bin_dir(settings)), nodes, settings.tunnel == "local")

    def check(cfg):
        job = slurm_job(cfg, settings, job_dir, smoke=smoke, nodes=nodes)
        job.findings = folder + job.findings
        return job

    return check


def time_findings(cfg, plan: Plan, job: JobCheck | None, settings, smoke: bool, chained: bool, name: str) -> list:
    """A Slurm or Kubernetes training job's predicted time against its time limit (:func:`lcmoe_recipes.jobs.job_checks.
    training_time_finding`): [] or one warning. ``cfg`` is the config the job runs, ``plan`` it read back, ``job``
    its job check. The exit it judges is the job's own (a resilient job's earlier one, read after
    :func:`job_resilience`), and the start-up megatron-bridge's exit clock counts (the first step's extra, and the
    checkpoint read where the job loads one) and the phase's evaluations are added to the steps. ``launch`` and the
    Python ``submit`` both judge a job's time here.

    Raises:
        InfeasibleConfig: a phase that would stop early while the next one waits on it (``afterok``).
    """
    if settings is None or smoke or not cfg.train.train_iters or not getattr(settings, "time", None):
        return []
    from ..checks import raise_for_errors
    from ..cost import estimate_step
    from ..cost.wallclock import phase_time
    from .job_checks import FINAL_SAVE_MARGIN_MIN, slurm_minutes, training_time_finding
    from .resilience import exit_margin_minutes

    checkpoint = cfg.checkpoint
    limit = slurm_minutes(settings.time)
    exit_at = job_exit(cfg, job)
    resilient = bool(job and job.resilience and job.resilience.enabled)
    margin = (limit - exit_at if exit_at and exit_at < limit else
              exit_margin_minutes(plan) if resilient else FINAL_SAVE_MARGIN_MIN)  # what a longer --time must leave
    startup = startup_seconds(cfg, plan)
    finding = training_time_finding(cfg.train.train_iters, estimate_step(plan).step_seconds, settings.time,
                                    chained, getattr(checkpoint, "save_interval", None),
                                    bool(getattr(checkpoint, "save", None)), margin, startup,
                                    phase_time(plan).evaluation)
    if finding is None:
        return []
    raise_for_errors([finding], name)
    return [finding]


def _overridden_weights_notes(one) -> list[Finding]:
    """``weights/not-here`` for weights an override (or the ``--from`` YAML) names instead of the request's, where
    this machine does not see them (where it does, validation checked them: rule ``weights/pretrained-model``)."""
    path = getattr(one.cfg.checkpoint, "pretrained_checkpoint", None)
    if not path or str(path) == str(one.weights.pretrained or "") or is_url(str(path)) or Path(path).exists():
        return []
    return [not_here(f"{PRETRAINED}={path}")]


def validate_for_image(cfg, hardware, world_size: int, name: str, image: str | None, overlay: bool = True) -> list:
    """:func:`lcmoe_recipes.emit.validate_config` for the versions a job on ``image`` runs (:func:`job_versions`;
    ``overlay`` False: the image's own megatron): the known issues judged for them, megatron-core's TE gates for the
    image's Transformer Engine.

    Returns:
        the warnings (the unlisted-image warning included).

    Raises:
        InfeasibleConfig: the config fails for that image; when it passes with the target's TE but not with the
            image's, the fix names the nearest listed image whose TE it passes with.
    """
    from ..catalog.known_issues import find_container
    from ..checks.known_issues import installed_versions
    from ..emit import config_findings, validate_config
    from ..errors import InfeasibleConfig

    versions, notes = job_versions(image, overlay)
    try:
        return validate_config(cfg, hardware, world_size, name, versions) + notes
    except InfeasibleConfig as exc:
        found = find_container(image) if image else None

        def passes(v) -> bool:
            return not any(f.severity == "error" for f in config_findings(cfg, hardware, world_size, name, v))

        if found is None or not passes(installed_versions()):
            raise
        near = nearest_image(found, lambda c: c.versions["transformer-engine"] is not None and
                             passes(job_versions(c.image, overlay)[0]))
        te = found.versions["transformer-engine"]
        fix = (f"use {near.image} ({near.release}, Transformer Engine {near.versions['transformer-engine']}), the "
               f"nearest listed image this config passes with; or {exc.fix}" if near else exc.fix)
        raise InfeasibleConfig(f"{exc.message} (with {image}'s Transformer Engine {te})", fix, exc.findings) from None
