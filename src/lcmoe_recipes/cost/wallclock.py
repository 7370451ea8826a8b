"""How long a training phase takes, and the long-run settings priced by it: evaluation, checkpoints.

A phase's wall clock (:func:`phase_time`) is its ``train_iters`` steps at the step model's predicted time
(:func:`lcmoe_recipes.cost.estimate_step`), plus its evaluations and the part of its checkpoint saves that blocks
training. Everything here is modelled from the Plan (no measurement): the step model's assumptions, and the
constants below, each with where it comes from.

* **Evaluation.** megatron-bridge 0.6.2 evaluates ``validation.eval_iters`` batches of
  ``validation.eval_global_batch_size`` sequences (default: the training GBS) every ``eval_interval`` steps, and
  once more on the validation and once on the test split after training (``training/pretrain.py``; the loaders
  exist when ``eval_iters > 0``, ``data/loaders.py``). Its pre-training template evaluates 32 batches of 32 x 4,096
  tokens (``recipes/common.py`` ``_pretrain_common``): 4.2M tokens. At 128K with the training GBS a single
  evaluation batch is 63M tokens (DeepSeek-V3), so the evaluation batch is sized instead
  (:func:`lcmoe_recipes.rules.batch.choose_eval_batch`, the plan's ``eval_global_batch_size``): the same tokens per
  evaluation as upstream, in the fewest sequences megatron-core's batch rules allow. An evaluation iteration runs the forward pass only: :data:`FORWARD_SHARE` of a training microbatch.
* **Checkpoints.** A full save holds, per parameter, its bf16 weight and the optimizer's master weight and two Adam
  moments (:func:`checkpoint_bytes`: 14 bytes with fp32 moments; DeepSeek-V3: 9.4 TB). Saves are asynchronous and
  fully parallel (megatron-bridge's checkpointing guide, https://docs.nvidia.com/nemo/megatron-bridge/0.6.0/training/
  checkpointing.html: asynchronous saving "allows training to continue while checkpoint data is persisted to disk in
  the background"; ``fully_parallel_save`` spreads the
  write over the data-parallel ranks): a rank copies its share to host memory (megatron-core 0.19.2
  ``dist_checkpointing/strategies/filesystem_async.py``, ``preload_tensors``) and a background process writes it
  at the filesystem's bandwidth (``fs_gbps``, default :data:`DEFAULT_FS_GBPS`). The next save waits for the
  previous write, so saves are at least one write apart (:func:`save_intervals`).
* **Failures.** The overwritten (recovery) saves come at Young/Daly's optimum interval sqrt(2 x C x MTBF)
  (J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974; J. T. Daly, "A
  higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3), 2006): C is one save's
  predicted write, MTBF the job's mean time between failures -- the per-GPU rate Meta published for Llama 3
  pre-training (:data:`LLAMA3_INTERRUPTIONS` unexpected interruptions in :data:`LLAMA3_DAYS` days on
  :data:`LLAMA3_GPUS` H100; arXiv 2407.21783 section 3.3.4) scaled to the job's GPUs (:func:`job_mtbf_hours`), or the
  one given (``mtbf_hours``, ``launch --mtbf-hours``). :func:`failure_cost` prices the result in GPU-hours a day.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.plan import Plan, Reason
from .memory import BF16, FP32, master_weight_bytes, optimizer_shard_params
from .shapes import shapes
from .step import estimate_step, microbatch_seconds

FORWARD_SHARE = 1 / 3
"""An evaluation microbatch runs the forward pass only: one third of a training microbatch's forward + backward
FLOPs (backward = 2 x forward; the step model's convention), communication scaled alike (modelled)."""
DEFAULT_FS_GBPS = 20.0
"""Aggregate write bandwidth of the shared filesystem the checkpoints go to, GB/s (1e9 bytes/s): our default, a
modest parallel filesystem (the same figure as the 20-minute exit margin's, lcmoe_recipes.jobs.job_checks); give your
cluster's (``fs_gbps``)."""
LLAMA3_INTERRUPTIONS = 419
"""Unexpected interruptions during Llama 3 405B pre-training (Dubey et al., "The Llama 3 Herd of Models",
arXiv 2407.21783, section 3.3.4 and Table 5: 466 job interruptions in a 54-day snapshot, 47 planned, 419
unexpected; 78% of these hardware: GPUs, HBM, hosts, network)."""
LLAMA3_DAYS = 54
"""Days of that snapshot (arXiv 2407.21783 section 3.3.4)."""
LLAMA3_GPUS = 16384
"""H100 GPUs of that job (arXiv 2407.21783 section 3.3.1)."""
GPU_MTBF_HOURS = LLAMA3_DAYS * 24 * LLAMA3_GPUS / LLAMA3_INTERRUPTIONS
"""Mean time between unexpected interruptions per GPU, hours: 54 d x 24 h x 16,384 GPUs / 419 = 50,677 GPU-hours
(5.8 years per GPU); a job on N GPUs fails every GPU_MTBF_HOURS / N hours (failures independent, each stopping the
whole synchronous job), e.g. 99 h (4.1 days) on 512 GPUs."""
PERSISTENT_SAVES_PER_PHASE = 4
"""Checkpoints kept from a phase (for evaluation and roll-back), evenly spaced; the last one is the phase's end."""
DEFAULT_PHASE_BUDGET_HOURS = 48.0
"""A phase predicted to run longer than this (two days) is warned about, with the tokens per step that fit it."""


def _bandwidth(plan: Plan, fs_gbps: float | None) -> float:
    """The filesystem bandwidth to price with: the one given, else the plan's, else :data:`DEFAULT_FS_GBPS`."""
    return fs_gbps if fs_gbps is not None else plan.fs_gbps if plan.fs_gbps is not None else DEFAULT_FS_GBPS


def checkpoint_bytes(plan: Plan) -> float:
    """Bytes of one full save of ``plan``'s model with its optimizer state: per parameter the bf16 weight, the
    optimizer's fp32 master weight and two Adam moments (fp32, or bf16 with the precision-aware optimizer; fp32
    under optimizer CPU offload whatever exp_avg_dtype says: :attr:`lcmoe_recipes.core.plan.Plan.effective_moment_dtype`),
    as megatron-core's distributed optimizer saves them."""
    moments = 2 * (FP32 if plan.effective_moment_dtype == "fp32" else BF16)
    return shapes(plan.model_spec).total_params * (BF16 + FP32 + moments)


def rank_save_bytes(plan: Plan, pp_rank: int) -> float:
    """Bytes of one save that a rank on pipeline rank ``pp_rank`` writes with fully parallel saving: its
    distributed-optimizer shard (master weight and moments) and the same share of the model weights (the replicas
    split the write); with asynchronous saving, held in host memory until written. Offloaded optimizer state is on
    the host already (no copy)."""
    shard = optimizer_shard_params(plan, pp_rank)
    on_gpu = 1.0 - (plan.optimizer_offload_fraction if plan.optimizer_cpu_offload else 0.0)
    state = master_weight_bytes(plan) + 2 * (FP32 if plan.effective_moment_dtype == "fp32" else BF16)
    return shard * (BF16 + state * on_gpu)


def write_seconds(plan: Plan, fs_gbps: float | None = None) -> float:
    """Seconds to write one full save at ``fs_gbps`` GB/s (default: the plan's, else :data:`DEFAULT_FS_GBPS`)."""
    return checkpoint_bytes(plan) / (_bandwidth(plan, fs_gbps) * 1e9)


def eval_seconds(plan: Plan) -> float:
    """Seconds of one evaluation: ``eval_iters`` forward-only batches of ``eval_global_batch_size`` sequences (the
    training GBS where unset), each (microbatches + pipeline bubble) x :data:`FORWARD_SHARE` of a training
    microbatch."""
    if plan.eval_iters <= 0:
        return 0.0
    gbs = plan.eval_global_batch_size or plan.global_batch_size
    lay = plan.layout
    micro = gbs // (plan.micro_batch_size * lay.dp)
    bubble = (lay.pp - 1) / (lay.vpp or 1)
    return plan.eval_iters * (micro + bubble) * FORWARD_SHARE * microbatch_seconds(plan)


def job_mtbf_hours(gpus: int, mtbf_hours: float | None = None) -> float:
    """The job's mean time between failures, hours: ``mtbf_hours`` when given, else :data:`GPU_MTBF_HOURS` / ``gpus``
    (Llama 3's published per-GPU rate scaled to the job: any GPU's failure stops a synchronous job).

    Raises:
        ValueError: ``gpus`` < 1 or ``mtbf_hours`` not positive.
    """
    if mtbf_hours is not None:
        if not mtbf_hours > 0:
            raise ValueError(f"mtbf_hours {mtbf_hours:g} is not positive (hours between failures of the job)")
        return float(mtbf_hours)
    if gpus < 1:
        raise ValueError(f"{gpus} GPUs: a job has at least one")
    return GPU_MTBF_HOURS / gpus


def young_daly_seconds(save_seconds: float, mtbf_seconds: float) -> float:
    """Young/Daly's optimum time between checkpoints, seconds: sqrt(2 x C x M) for a save costing ``save_seconds``
    (C) and a mean time between failures of ``mtbf_seconds`` (M) (Young 1974; Daly 2006 shows it is within a few
    percent of the optimum while C << M)."""
    return math.sqrt(2.0 * save_seconds * mtbf_seconds)


@dataclass(frozen=True)
class SaveIntervals:
    """Checkpoint cadence of a phase, in steps.

    Attributes:
        persistent: ``checkpoint.save_interval``: the saves kept.
        non_persistent: ``checkpoint.non_persistent_save_interval`` (overwritten saves for recovery), or None when
            the persistent ones are frequent enough.
        write_seconds: one save's background write (C); step_seconds: the predicted step.
        mtbf_hours: the job's mean time between failures; mtbf_source: where it comes from.
        optimum_seconds: Young/Daly's sqrt(2 C MTBF); bound: what moved the interval off it (None: nothing).
    """

    persistent: int
    non_persistent: int | None
    write_seconds: float
    step_seconds: float
    reason: Reason
    mtbf_hours: float = 0.0
    mtbf_source: str = ""
    optimum_seconds: float = 0.0
    bound: str | None = None

    @property
    def recovery(self) -> int:
        """Steps between the saves a restart resumes from (the overwritten ones where set, else the kept ones)."""
        return min(self.persistent, self.non_persistent or self.persistent)

    def short(self) -> str:
        """One line for a plan's summary (``reason.why`` has the derivation): the resume interval, one save's write
        time, the job's MTBF and Young/Daly's optimum."""
        return (f"resume points every {self.recovery} steps ({self.recovery * self.step_seconds / 3600:.1f} h; "
                f"{self.write_seconds / 60:.1f} min per save; Young/Daly {self.optimum_seconds / 3600:.1f} h at MTBF "
                f"{self.mtbf_hours:.0f} h)")


def save_intervals(plan: Plan, fs_gbps: float | None = None, base_interval: int | None = None,
                   mtbf_hours: float | None = None, time_limit_hours: float | None = None) -> SaveIntervals:
    """The checkpoint cadence of ``plan``: :data:`PERSISTENT_SAVES_PER_PHASE` kept saves (never rarer than
    ``base_interval``, upstream's), and overwritten ones at Young/Daly's optimum sqrt(2 x C x MTBF)
    (:func:`young_daly_seconds`) from the predicted write C (:func:`write_seconds`) and the job's MTBF
    (:func:`job_mtbf_hours`: ``mtbf_hours``, else the plan's, else Llama 3's per-GPU rate over the plan's GPUs).
    Bounded by the file system -- no two saves closer than one background write (the next save would wait for it)
    -- and by the job's time limit (``time_limit_hours``: usable hours before the job's own exit; a save at least
    once per job, so a failure never costs more than one job's work).

    Raises:
        ValueError: ``fs_gbps``, ``mtbf_hours`` or ``time_limit_hours`` not positive.
    """
    fs_gbps = _bandwidth(plan, fs_gbps)
    if fs_gbps <= 0:
        raise ValueError(f"filesystem bandwidth {fs_gbps} GB/s is not positive")
    if time_limit_hours is not None and not time_limit_hours > 0:
        raise ValueError(f"time limit {time_limit_hours:g} h is not positive")
    given = mtbf_hours if mtbf_hours is not None else plan.mtbf_hours
    mtbf = job_mtbf_hours(plan.layout.world, given)
    source = (f"given ({mtbf:g} h)" if given is not None else
              f"{GPU_MTBF_HOURS:,.0f} GPU-hours per failure (Llama 3: {LLAMA3_INTERRUPTIONS} unexpected interruptions "
              f"in {LLAMA3_DAYS} days on {LLAMA3_GPUS:,} H100, arXiv 2407.21783 section 3.3.4) / {plan.layout.world} "
              f"GPUs = {mtbf:.0f} h")
    step = estimate_step(plan).step_seconds
    iters = plan.schedule.train_iters if plan.schedule else (base_interval or 1000) * PERSISTENT_SAVES_PER_PHASE
    write = write_seconds(plan, fs_gbps)
    floor = max(1, math.ceil(write / step))
    persistent = max(floor, min(base_interval or iters, max(1, iters // PERSISTENT_SAVES_PER_PHASE)))
    optimum = young_daly_seconds(write, mtbf * 3600)
    interval, bound = max(1, round(optimum / step)), None
    if interval < floor:
        interval, bound = floor, f"raised to one write apart ({floor} steps)"
    if time_limit_hours is not None:
        cap = max(1, int(time_limit_hours * 3600 // step))
        if interval > cap:
            interval, bound = max(floor, cap), f"lowered to the job's usable {time_limit_hours:.1f} h ({cap} steps)"
    recovery = interval if interval < persistent else None
    size = checkpoint_bytes(plan)
    text = (f"a save is {size / 1e12:.2f} TB ({shapes(plan.model_spec).total_params / 1e9:.0f}B parameters x "
            f"{size / shapes(plan.model_spec).total_params:.0f} bytes), {write / 60:.1f} min at {fs_gbps:g} GB/s, "
            f"written asynchronously and in parallel by every rank; kept saves every {persistent} steps "
            f"({persistent * step / 3600:.1f} h, {math.ceil(iters / persistent)} per phase); the job's MTBF is "
            f"{source}; Young/Daly's optimum sqrt(2 x {write:.0f} s x {mtbf:.0f} h) = {optimum / 3600:.2f} h = "
            f"{optimum / step:.0f} steps of {step:.0f} s")
    if bound:
        text += f", {bound}"
    if recovery:
        text += (f"; overwritten saves (the two newest kept) every {recovery} steps, so a failure loses at most "
                 f"{recovery * step / 3600:.2f} h")
    else:
        text += f"; no overwritten saves (the kept ones, every {persistent} steps, are as frequent)"
    return SaveIntervals(persistent, recovery, write, step, Reason(
        text, "megatron-bridge's checkpointing guide https://docs.nvidia.com/nemo/megatron-bridge/0.6.0/training/"
              "checkpointing.html (async_save, fully_parallel_save, non_persistent_ckpt_type 'global'); megatron-bridge "
              "0.6.2 training/checkpointing.py (the two newest non-persistent saves kept); Young, CACM 17(9) 1974 and "
              "Daly, FGCS 22(3) 2006 (the optimum interval); arXiv 2407.21783 section 3.3.4 (the failure rate); "
              "lcmoe_recipes.cost.wallclock (size, bandwidth default, cadence)"),
        mtbf, source, optimum, bound)


@dataclass(frozen=True)
class FailureCost:
    """Expected GPU-hours a day that failures and checkpointing cost a job (modelled).

    Attributes:
        failures_per_day: 24 / MTBF hours.
        lost_per_failure_hours: wall hours a failure costs: on average half a recovery interval of work redone, the
            save being written when it struck (its predecessor is the one loaded), and the restart (the checkpoint
            read back at the file system's bandwidth, and ``restart_seconds`` of start-up).
        failure_gpu_hours, saving_gpu_hours: GPU-hours a day lost to failures and to saving (every save's write
            counted as lost: the upper bound; asynchronous saving hides most of it).
    """

    gpus: int
    failures_per_day: float
    lost_per_failure_hours: float
    failure_gpu_hours: float
    saving_gpu_hours: float
    saves_per_day: float

    @property
    def share(self) -> float:
        """Fraction of the job's GPU-hours lost to failures and saving together."""
        return (self.failure_gpu_hours + self.saving_gpu_hours) / (24 * self.gpus)

    def short(self) -> str:
        """A clause for a plan's summary: GPU-hours a day lost to failures and saving, and their share of the job."""
        return (f"failures and saves cost {self.failure_gpu_hours + self.saving_gpu_hours:,.0f} GPU-h/day "
                f"({self.share:.1%}, modelled)")

    def text(self) -> str:
        """One line for the plan: ``failures ~0.24/day x 2.7 h = 330 GPU-h/day lost; saving ... GPU-h/day``."""
        return (f"expected losses on {self.gpus} GPUs: {self.failures_per_day:.2f} failures/day x "
                f"{self.lost_per_failure_hours:.2f} h each = {self.failure_gpu_hours:,.0f} GPU-h/day to failures; "
                f"{self.saves_per_day:.1f} saves/day = at most {self.saving_gpu_hours:,.0f} GPU-h/day to saving "
                f"({self.share:.1%} of the job), modelled")


RESTART_SECONDS = 600.0
"""Seconds a restart spends before training again, beside reading the checkpoint: a new allocation's or process's
start, imports, the model build and the first step's setup (our estimate; Llama 3's team reports automated
restarts handling most of its 419 interruptions, arXiv 2407.21783 section 3.3.4)."""


def failure_cost(plan: Plan, cadence: SaveIntervals | None = None, restart_seconds: float = RESTART_SECONDS,
                 fs_gbps: float | None = None) -> FailureCost:
    """Expected GPU-hours a day lost to failures and to saving with ``cadence`` (default :func:`save_intervals`):
    failures/day x (half a recovery interval + one write + the checkpoint read back + ``restart_seconds``), and
    saves/day x one write, each x the plan's GPUs."""
    cadence = cadence or save_intervals(plan, fs_gbps)
    gpus = plan.layout.world
    per_day = 24.0 / cadence.mtbf_hours
    interval = cadence.recovery * cadence.step_seconds
    read = write_seconds(plan, fs_gbps)
    lost = (interval / 2 + cadence.write_seconds + read + restart_seconds) / 3600
    saves = 86400.0 / max(interval, cadence.write_seconds)
    return FailureCost(gpus, per_day, lost, per_day * lost * gpus, saves * cadence.write_seconds / 3600 * gpus, saves)


@dataclass(frozen=True)
class PhaseTime:
    """Predicted wall clock of one training phase (seconds), by part.

    Attributes:
        train: ``train_iters`` x the step; evaluation: every evaluation (``evaluations`` of them); saves: how many
            (kept + overwritten). Saves add no time here: they are asynchronous and one write apart
            (:func:`save_intervals`), and the copy to host memory that blocks a step is not modelled.
    """

    steps: int
    step_seconds: float
    train: float
    evaluation: float
    evaluations: int
    saves: int

    @property
    def total(self) -> float:
        return self.train + self.evaluation

    def text(self) -> str:
        """``1000 steps x 279 s = 77.5 h training + 0.4 h evaluation (6 evaluations) = 77.9 h (3.2 days)``."""
        days = f" ({self.total / 86400:.1f} days)" if self.total > 86400 else ""
        return (f"{self.steps} steps x {self.step_seconds:.0f} s = {self.train / 3600:.1f} h training + "
                f"{self.evaluation / 3600:.1f} h evaluation ({self.evaluations} evaluations) = "
                f"{self.total / 3600:.1f} h{days}, modelled; {self.saves} asynchronous saves")


def phase_time(plan: Plan, eval_interval: int | None = None, fs_gbps: float | None = None) -> PhaseTime:
    """Predicted wall clock of ``plan``'s phase: its steps, its evaluations every ``eval_interval`` steps (default:
    with every kept save) and after training (validation and test), its saves (:func:`save_intervals`)."""
    saves = save_intervals(plan, fs_gbps)
    steps = plan.schedule.train_iters if plan.schedule else saves.persistent * PERSISTENT_SAVES_PER_PHASE
    interval = eval_interval or saves.persistent
    evaluations = (steps // interval + 2) if plan.eval_iters > 0 else 0
    count = steps // saves.persistent + (steps // saves.non_persistent if saves.non_persistent else 0)
    return PhaseTime(steps, saves.step_seconds, steps * saves.step_seconds, evaluations * eval_seconds(plan),
                     evaluations, count)


def tokens_per_step_for(plan: Plan, budget_seconds: float) -> int | None:
    """The largest tokens per step (a GBS the layout can run: :func:`lcmoe_recipes.rules.batch.choose_batch`) whose
    phase fits ``budget_seconds``, or None when not even the smallest batch fits."""
    lay, mbs, seq = plan.layout, plan.micro_batch_size, plan.seq_length
    unit = mbs * lay.dp * (lay.pp if lay.vpp else 1)
    floor = mbs * lay.dp * lay.pp
    best = None
    gbs = max(floor, -(-floor // unit) * unit)
    while gbs <= plan.global_batch_size:
        if phase_time(plan.with_changes(global_batch_size=gbs)).total > budget_seconds:
            break
        best = gbs * seq
        gbs += unit if gbs < 16 * unit else max(unit, (gbs // 8) // unit * unit)
    return best


