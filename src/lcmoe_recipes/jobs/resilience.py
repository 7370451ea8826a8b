"""Resiliency for a long multi-node run: hang and crash detection, restarts, stragglers, and the save before the stop.

A ten-day phase on 512 GPUs meets a failure every few days (:func:`lcmoe_recipes.cost.wallclock.job_mtbf_hours`:
Llama 3's published rate). :func:`plan_resilience` sizes every part from the cost model's predictions for the plan --
the step (:func:`lcmoe_recipes.cost.estimate_step`), the first step, the checkpoint write and read
(:func:`lcmoe_recipes.cost.wallclock.write_seconds`) -- with :data:`lcmoe_recipes.checks.timeouts.TIMEOUT_SAFETY`
(3x) headroom, never with fixed numbers:

* **The FT launcher** (nvidia-resiliency-ext's ``ft_launcher``, through NeMo-Run 0.11.1's ``FaultTolerance``
  launcher for Slurm, as megatron-bridge 0.6.2's own ``recipes/run_plugins.py`` ``FaultTolerancePlugin`` wires it):
  ``initial_rank_heartbeat_timeout`` covers the start and the first step, ``rank_heartbeat_timeout`` the longest
  quiet stretch afterwards (a step, an evaluation, a blocking save); ``max_restarts`` in-job restarts and
  ``retries`` Slurm requeues (the restart budget, from the expected failures). The ranks run megatron-bridge's FT
  integration (``ft.enable_ft_package``; ``training/fault_tolerance.py``: sections ``setup``, ``step``,
  ``checkpointing``), with ``ft.calc_ft_timeouts`` so it refines the section timeouts from observed intervals
  (stored in ``<save>/ft_state.json``); our predicted section timeouts are written beside the config as the FT
  package's own config file (``fault_tolerance:`` section, :func:`ft_config_text`).
* **In-job restart** (megatron-bridge ``InProcessRestartConfig``, ``training/inprocess_restart.py``): on where
  megatron-bridge supports it for the run -- a training run (``pretrain`` wraps itself; it refuses a process group
  initialised before it, which the entry script never does) on GPUs (its NCCL backend is forced on CUDA) -- with its
  progress timeouts sized from the step (upstream's 60 s soft / 90 s hard would kill a 15-minute step).
* **Straggler detection** (``NVRxStragglerDetectionConfig``): a report every :data:`STRAGGLER_REPORT_STEPS` steps
  (at least upstream's 300 s), validated by its own ``finalize()``.
* **The final save before the stop**: ``train.exit_duration_in_mins`` leaves room for the step in flight, the
  asynchronous write in flight and the final save (:func:`exit_margin_minutes`).

On by default for a multi-node Slurm training job; off for a smoke check, one node, ``local`` and Kubernetes (no FT
launcher there), and with ``launch --no-resiliency``. Every setting carries its reason (``--dry-run`` prints them).
nvidia-resiliency-ext is not part of this virtualenv: NVIDIA's NeMo images ship it; elsewhere ``pip install
nvidia-resiliency-ext`` in the job's image (the entry script refuses a config that needs it where it is missing:
:func:`missing_package`).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field

from ..checks.timeouts import TIMEOUT_SAFETY
from ..core.plan import Plan
from ..cost import estimate_step
from ..cost.wallclock import (RESTART_SECONDS, eval_seconds, phase_time, save_intervals, write_seconds)

FIRST_STEP_EXTRA_SECONDS = 300.0
"""What the first step adds to a step: NCCL communicators built on first use, CUDA graphs captured, allocator warm-up
(our estimate; not predicted by the step model, see :mod:`lcmoe_recipes.checks.timeouts`)."""
STRAGGLER_REPORT_STEPS = 5
"""Steps per straggler report: enough steps that one slow step does not decide it (our choice)."""
UPSTREAM_REPORT_SECONDS = 300.0
"""megatron-bridge 0.6.2 ``NVRxStragglerDetectionConfig.report_time_interval`` default (``training/config.py``)."""
MIN_IN_JOB_RESTARTS = 3
"""megatron-bridge 0.6.2 ``FaultTolerancePlugin.num_in_job_restarts`` default (``recipes/run_plugins.py``)."""
MIN_JOB_RETRIES = 2
"""megatron-bridge 0.6.2 ``FaultTolerancePlugin.num_job_retries_on_failure`` default."""
PACKAGE = "nvidia_resiliency_ext"
INSTALL_HINT = ("nvidia-resiliency-ext provides ft_launcher and the in-process restart: NVIDIA's NeMo images ship "
                "it; in another image or virtualenv: pip install nvidia-resiliency-ext")


@dataclass(frozen=True)
class Item:
    """One resiliency setting: ``key`` (a config field or a launcher option), its ``value`` and why."""

    key: str
    value: object
    why: str

    def line(self) -> str:
        return f"{self.key}={self.value}: {self.why}"


@dataclass
class Resilience:
    """What a job gets for resiliency (:func:`plan_resilience`).

    Attributes:
        enabled: whether any part is on; off_reason: why not, when off.
        launcher: keyword arguments of NeMo-Run's ``FaultTolerance`` launcher (None: torchrun).
        retries: Slurm requeues on failure (NeMo-Run ``SlurmExecutor.retries``).
        ft, inprocess_restart, nvrx_straggler: the megatron-bridge sections' fields (None: left unset).
        section_timeouts: seconds per FT section (``setup``, ``step``, ``checkpointing``) and ``out_of_section``.
        exit_duration_in_mins: the exit that leaves room for the final save (None: the job's own stands).
        items: every setting with its reason.
        sized_from: the predictions every number comes from, in words.
    """

    enabled: bool
    off_reason: str = ""
    launcher: dict | None = None
    retries: int = 0
    ft: dict | None = None
    inprocess_restart: dict | None = None
    nvrx_straggler: dict | None = None
    section_timeouts: dict = field(default_factory=dict)
    exit_duration_in_mins: int | None = None
    items: list = field(default_factory=list)
    sized_from: str = ""

    def notes(self) -> list[str]:
        """Lines for the launch summary: what was sized from what, then every setting and why."""
        if not self.enabled:
            return [f"resiliency off: {self.off_reason}"]
        return [f"resiliency (sized from {self.sized_from}):"] + ["  " + item.line() for item in self.items]


def first_step_seconds(plan: Plan) -> float:
    """The first training step, seconds: the predicted step plus :data:`FIRST_STEP_EXTRA_SECONDS` (modelled)."""
    return estimate_step(plan).step_seconds + FIRST_STEP_EXTRA_SECONDS


def exit_margin_minutes(plan: Plan, fs_gbps: float | None = None) -> int:
    """Minutes the run needs between its own exit and the time limit so that the last save is complete: the step
    running when the exit is due (checked after each step), an asynchronous write still in flight (the next save
    waits for it) and the final save's own write, plus :data:`RESTART_SECONDS` for the start megatron-bridge's clock
    does not count (imports, the model build)."""
    seconds = estimate_step(plan).step_seconds + 2 * write_seconds(plan, fs_gbps) + RESTART_SECONDS
    return math.ceil(seconds / 60)


def missing_package() -> str | None:
    """None when nvidia-resiliency-ext imports here, else the sentence that says how to install it."""
    return None if importlib.util.find_spec(PACKAGE) is not None else f"{PACKAGE} is not installed: {INSTALL_HINT}"


def ft_config_text(res: Resilience) -> str:
    """The FT package's config file (nvidia-resiliency-ext's ``fault_tolerance:`` section: section timeouts, the
    out-of-section timeout, the heartbeat timeouts), for ``ft_launcher --fault-tol-cfg-path``."""
    t = res.section_timeouts
    lines = ["fault_tolerance:",
             f"  initial_rank_heartbeat_timeout: {res.launcher['initial_rank_heartbeat_timeout']:.0f}",
             f"  rank_heartbeat_timeout: {res.launcher['rank_heartbeat_timeout']:.0f}",
             "  rank_section_timeouts:"]
    lines += [f"    {name}: {t[name]:.0f}" for name in ("setup", "step", "checkpointing")]
    lines.append(f"  rank_out_of_section_timeout: {t['out_of_section']:.0f}")
    return "\n".join(lines) + "\n"


def plan_resilience(plan: Plan, *, nodes: int, executor: str, smoke: bool = False, enabled: bool = True,
                    time_limit_minutes: int | None = None, exit_minutes: int | None = None,
                    fs_gbps: float | None = None) -> Resilience:
    """The resiliency settings of ``plan``'s job on ``nodes`` nodes under ``executor`` (see the module doc).

    Args:
        time_limit_minutes: the job's limit (Slurm ``--time``); exit_minutes: the ``train.exit_duration_in_mins``
            the job was given (moved earlier when the final save needs more room, :func:`exit_margin_minutes`).
        enabled: False for ``--no-resiliency``.
    """
    if not enabled:
        return Resilience(False, "--no-resiliency")
    if smoke:
        return Resilience(False, "a smoke check trains nothing")
    if executor != "slurm":
        return Resilience(False, f"the {executor} executor has no FT launcher here (NeMo-Run's FaultTolerance "
                          "launcher is used on Slurm)")
    if nodes <= 1:
        return Resilience(False, "one node: a failure takes the whole job, Slurm's requeue restarts it")
    step = estimate_step(plan).step_seconds
    first = first_step_seconds(plan)
    write = write_seconds(plan, fs_gbps)
    read = write  # read back at the file system's bandwidth (modelled alike)
    evaluation = eval_seconds(plan)
    cadence = save_intervals(plan, fs_gbps)
    k = TIMEOUT_SAFETY
    setup = RESTART_SECONDS + read
    quiet = max(step, evaluation, write)
    sized = (f"predicted step {step:.0f} s, first step {first:.0f} s, save {write:.0f} s (written; read back alike), "
             f"start-up {RESTART_SECONDS:.0f} s, evaluation {evaluation:.0f} s; x{k:g} headroom "
             "(lcmoe_recipes.checks.timeouts.TIMEOUT_SAFETY)")
    res = Resilience(True, sized_from=sized)
    res.section_timeouts = {"setup": k * setup, "step": k * step, "checkpointing": k * write,
                            "out_of_section": k * max(first, evaluation)}
    limit_h = (time_limit_minutes or 0) / 60
    failures_in_job = limit_h / cadence.mtbf_hours if limit_h else 0.0
    restarts = max(MIN_IN_JOB_RESTARTS, math.ceil(3 * failures_in_job))
    phase_h = phase_time(plan).total / 3600
    retries = max(MIN_JOB_RETRIES, math.ceil(phase_h / cadence.mtbf_hours) + 1)
    res.launcher = {"initial_rank_heartbeat_timeout": round(k * (setup + first)),
                    "rank_heartbeat_timeout": round(k * quiet), "max_restarts": restarts}
    res.retries = retries
    items = res.items
    items.append(Item("launcher", "FaultTolerance (ft_launcher)", "NeMo-Run's FT launcher for Slurm: a rank that "
                      "dies or stops reporting is detected and the workers restarted in the job (megatron-bridge "
                      "0.6.2 recipes/run_plugins.py FaultTolerancePlugin wires it so)"))
    items.append(Item("initial_rank_heartbeat_timeout", res.launcher["initial_rank_heartbeat_timeout"],
                      f"{k:g} x (start-up {RESTART_SECONDS:.0f} s + checkpoint read {read:.0f} s + first step "
                      f"{first:.0f} s)"))
    items.append(Item("rank_heartbeat_timeout", res.launcher["rank_heartbeat_timeout"],
                      f"{k:g} x the longest quiet stretch: max(step {step:.0f} s, evaluation {evaluation:.0f} s, "
                      f"save {write:.0f} s)"))
    items.append(Item("max_restarts", restarts, f"in-job restarts: at least {MIN_IN_JOB_RESTARTS} (megatron-bridge's "
                      f"default), 3 x the {failures_in_job:.2f} failures expected in the job's "
                      f"{limit_h:.1f} h at an MTBF of {cadence.mtbf_hours:.0f} h"))
    items.append(Item("retries", retries, f"Slurm requeues on failure: at least {MIN_JOB_RETRIES} (megatron-bridge's "
                      f"default), the {phase_h / cadence.mtbf_hours:.1f} failures expected in the {phase_h:.0f} h "
                      "phase + 1"))
    res.ft = {"enable_ft_package": True, "calc_ft_timeouts": True}
    items.append(Item("ft.enable_ft_package", True, "megatron-bridge's FT integration: sections setup / step / "
                      "checkpointing reported to the launcher's rank monitor (training/fault_tolerance.py)"))
    items.append(Item("ft.calc_ft_timeouts", True, "megatron-bridge refines the section timeouts from the intervals "
                      "it observes, after each save (kept in <save>/ft_state.json)"))
    t = res.section_timeouts
    items.append(Item("rank_section_timeouts", ",".join(f"{n}:{t[n]:.0f}" for n in ("setup", "step",
                                                                                     "checkpointing")),
                      f"until calculated: setup {k:g} x (start-up + read), step {k:g} x {step:.0f} s, checkpointing "
                      f"{k:g} x the {write:.0f} s write (asynchronous finalisation can wait for it); FT config file"))
    items.append(Item("rank_out_of_section_timeout", round(t["out_of_section"]), f"{k:g} x max(first step "
                      f"{first:.0f} s, evaluation {evaluation:.0f} s): the warm-up steps and evaluation run outside "
                      "the step section"))
    if plan.hardware_spec.gpus_per_node > 0:
        soft = k * max(first, evaluation, write)
        hard = soft + k * step
        res.inprocess_restart = {
            "enabled": True, "max_iterations": restarts, "soft_timeout": round(soft), "hard_timeout": round(hard),
            "barrier_timeout": round(max(120.0, k * setup)), "completion_timeout": round(max(120.0, k * write)),
            "granularity": "node"}
        items.append(Item("inprocess_restart.enabled", True, "restart inside the running processes (no new "
                          "allocation, no re-import): megatron-bridge wraps pretrain when the process group is its "
                          "own, as in our entry script; NCCL on GPUs (training/inprocess_restart.py, initialize.py)"))
        items.append(Item("inprocess_restart.soft_timeout", round(soft), f"{k:g} x the longest stretch without an "
                          f"iteration: max(first step {first:.0f} s, evaluation {evaluation:.0f} s, save {write:.0f} s) "
                          "(upstream's 60 s would restart a healthy run)"))
        items.append(Item("inprocess_restart.hard_timeout", round(hard), f"soft + {k:g} x step {step:.0f} s"))
        items.append(Item("inprocess_restart.barrier_timeout", res.inprocess_restart["barrier_timeout"],
                          f"max(upstream's 120 s, {k:g} x start-up and read)"))
        items.append(Item("inprocess_restart.completion_timeout", res.inprocess_restart["completion_timeout"],
                          f"max(upstream's 120 s, {k:g} x the final save's write)"))
        items.append(Item("inprocess_restart.max_iterations", restarts, "the same restart budget as the launcher"))
    interval = max(UPSTREAM_REPORT_SECONDS, STRAGGLER_REPORT_STEPS * step)
    res.nvrx_straggler = {"enabled": True, "report_time_interval": float(round(interval)), "stop_if_detected": False}
    items.append(Item("nvrx_straggler.report_time_interval", round(interval), f"a report every "
                      f"{interval / step:.1f} steps of {step:.0f} s (at least {STRAGGLER_REPORT_STEPS} steps and "
                      f"upstream's {UPSTREAM_REPORT_SECONDS:.0f} s); stragglers are logged, the run goes on"))
    if time_limit_minutes:
        need = exit_margin_minutes(plan, fs_gbps)
        latest = time_limit_minutes - need
        if latest < 1:  # the limit is shorter than the final save needs: no exit can leave room for it
            items.append(Item("train.exit_duration_in_mins", exit_minutes or "not set",
                              f"the {time_limit_minutes}-min limit is shorter than the {need} min the final save "
                              "needs after the exit: " + ("the final save may not finish before Slurm stops the job"
                                                           if exit_minutes else "Slurm stops the run wherever it is")
                              + " (give a longer --time)"))
        elif exit_minutes is None or exit_minutes > latest:
            res.exit_duration_in_mins = latest
            items.append(Item("train.exit_duration_in_mins", res.exit_duration_in_mins, f"the final save completes "
                              f"before the {time_limit_minutes}-min limit: {need} min = the step in flight "
                              f"{step:.0f} s + the asynchronous write in flight and the final save (2 x {write:.0f} "
                              f"s) + start-up {RESTART_SECONDS:.0f} s"))
    return res


def apply_resilience(cfg, res: Resilience) -> None:
    """Set ``res``'s megatron-bridge sections on ``cfg`` (its own dataclasses) and run their validation
    (``NVRxStragglerDetectionConfig.finalize``).

    Raises:
        ValueError: megatron-bridge refuses a value.
    """
    if not res.enabled:
        return
    from megatron.bridge.training.config import (FaultToleranceConfig, InProcessRestartConfig,
                                                 NVRxStragglerDetectionConfig)

    if res.ft:
        cfg.ft = FaultToleranceConfig(**res.ft)
    if res.inprocess_restart:
        cfg.inprocess_restart = InProcessRestartConfig(**res.inprocess_restart)
    if res.nvrx_straggler:
        cfg.nvrx_straggler = NVRxStragglerDetectionConfig(**res.nvrx_straggler)
        cfg.nvrx_straggler.finalize()


def needs_package(cfg) -> list[str]:
    """The resiliency parts ``cfg`` turns on that need nvidia-resiliency-ext (for the entry script's check)."""
    parts = []
    if getattr(cfg, "ft", None) is not None and cfg.ft.enable_ft_package:
        parts.append("ft.enable_ft_package")
    if getattr(cfg, "inprocess_restart", None) is not None and cfg.inprocess_restart.enabled:
        parts.append("inprocess_restart.enabled")
    if getattr(cfg, "nvrx_straggler", None) is not None and cfg.nvrx_straggler.enabled:
        parts.append("nvrx_straggler.enabled")
    return parts
