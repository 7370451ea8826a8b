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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.plan import Plan, Reason
from .memory import BF16, FP32, master_weight_bytes, rank_memory
from .shapes import shapes
from .step import estimate_step, microbatch_seconds

FORWARD_SHARE = 1 / 3
"""An evaluation microbatch runs the forward pass only: one third of a training microbatch's forward + backward
FLOPs (backward = 2 x forward; the step model's convention), communication scaled alike (modelled)."""
DEFAULT_FS_GBPS = 20.0
"""Aggregate write bandwidth of the shared filesystem the checkpoints go to, GB/s (1e9 bytes/s): our default, a
modest parallel filesystem (the same figure as the 20-minute exit margin's, lcmoe_recipes.jobs.job_checks); give your
cluster's (``fs_gbps``)."""
MAX_HOURS_BETWEEN_SAVES = 2.0
"""A failure loses at most this much training: the non-persistent (overwritten) saves come at least this often
(our choice; megatron-bridge keeps the two newest, ``training/checkpointing.py``)."""
PERSISTENT_SAVES_PER_PHASE = 4
"""Checkpoints kept from a phase (for evaluation and roll-back), evenly spaced; the last one is the phase's end."""
DEFAULT_PHASE_BUDGET_HOURS = 48.0
"""A phase predicted to run longer than this (two days) is warned about, with the tokens per step that fit it."""


def _bandwidth(plan: Plan, fs_gbps: float | None) -> float:
    """The filesystem bandwidth to price with: the one given, else the plan's, else :data:`DEFAULT_FS_GBPS`."""
    return fs_gbps if fs_gbps is not None else plan.fs_gbps if plan.fs_gbps is not None else DEFAULT_FS_GBPS


def checkpoint_bytes(plan: Plan) -> float:
    """Bytes of one full save of ``plan``'s model with its optimizer state: per parameter the bf16 weight, the
    optimizer's fp32 master weight and two Adam moments (fp32, or bf16 with the precision-aware optimizer), as
    megatron-core's distributed optimizer saves them."""
    moments = 2 * (FP32 if plan.moment_dtype == "fp32" else BF16)
    return shapes(plan.model_spec).total_params * (BF16 + FP32 + moments)


def rank_save_bytes(plan: Plan, pp_rank: int) -> float:
    """Bytes of one save that a rank on pipeline rank ``pp_rank`` writes with fully parallel saving: its
    distributed-optimizer shard (master weight and moments) and the same share of the model weights (the replicas
    split the write); with asynchronous saving, held in host memory until written. Offloaded optimizer state is on
    the host already (no copy)."""
    shard = rank_memory(plan, pp_rank).detail["optimizer_shard_params"]
    on_gpu = 1.0 - (plan.optimizer_offload_fraction if plan.optimizer_cpu_offload else 0.0)
    state = master_weight_bytes(plan) + 2 * (FP32 if plan.moment_dtype == "fp32" else BF16)
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


@dataclass(frozen=True)
class SaveIntervals:
    """Checkpoint cadence of a phase, in steps.

    Attributes:
        persistent: ``checkpoint.save_interval``: the saves kept.
        non_persistent: ``checkpoint.non_persistent_save_interval`` (overwritten saves for recovery), or None when
            the persistent ones are frequent enough.
        write_seconds: one save's background write; step_seconds: the predicted step.
    """

    persistent: int
    non_persistent: int | None
    write_seconds: float
    step_seconds: float
    reason: Reason


def save_intervals(plan: Plan, fs_gbps: float | None = None, base_interval: int | None = None) -> SaveIntervals:
    """The checkpoint cadence of ``plan`` from its checkpoint size, the filesystem bandwidth and the time budget:
    :data:`PERSISTENT_SAVES_PER_PHASE` kept saves (never rarer than ``base_interval``, upstream's), and overwritten
    ones so that a failure loses at most :data:`MAX_HOURS_BETWEEN_SAVES` of training; no two saves closer than one
    background write (the next save would wait for it).

    Raises:
        ValueError: ``fs_gbps`` is not positive.
    """
    fs_gbps = _bandwidth(plan, fs_gbps)
    if fs_gbps <= 0:
        raise ValueError(f"filesystem bandwidth {fs_gbps} GB/s is not positive")
    step = estimate_step(plan).step_seconds
    iters = plan.schedule.train_iters if plan.schedule else (base_interval or 1000) * PERSISTENT_SAVES_PER_PHASE
    write = write_seconds(plan, fs_gbps)
    floor = max(1, math.ceil(write / step))
    persistent = max(floor, min(base_interval or iters, max(1, iters // PERSISTENT_SAVES_PER_PHASE)))
    budget = max(floor, int(MAX_HOURS_BETWEEN_SAVES * 3600 // step))
    recovery = budget if budget < persistent else None
    size = checkpoint_bytes(plan)
    text = (f"a save is {size / 1e12:.2f} TB ({shapes(plan.model_spec).total_params / 1e9:.0f}B parameters x "
            f"{size / shapes(plan.model_spec).total_params:.0f} bytes), {write / 60:.1f} min at {fs_gbps:g} GB/s, "
            f"written asynchronously and in parallel by every rank; kept saves every {persistent} steps "
            f"({persistent * step / 3600:.1f} h, {math.ceil(iters / persistent)} per phase)")
    if recovery:
        text += (f", and overwritten saves (the two newest kept) every {recovery} steps, so a failure loses at most "
                 f"{recovery * step / 3600:.1f} h")
    if floor > 1:
        text += f"; no closer than {floor} steps, one write apart"
    return SaveIntervals(persistent, recovery, write, step, Reason(
        text, "megatron-bridge's checkpointing guide https://docs.nvidia.com/nemo/megatron-bridge/0.6.0/training/"
              "checkpointing.html (async_save, fully_parallel_save, non_persistent_ckpt_type 'global'); megatron-bridge "
              "0.6.2 training/checkpointing.py (the two newest non-persistent saves kept); lcmoe_recipes.cost.wallclock "
              "(size, bandwidth default, cadence)"))


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


