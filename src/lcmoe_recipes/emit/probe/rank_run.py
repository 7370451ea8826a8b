"""One rank of a full-size job, measured on one GPU: ``python -m lcmoe_recipes.train --config X.yaml --as-rank R``.

The job's config is built as it is, for its full world size; this process is global rank ``R`` of it on torch's
process-group API with the ``mirror`` backend (:mod:`lcmoe_recipes.emit.probe.fake_world`: every other rank is a copy of
this one, no communication), as Megatron-LM's ``--fake-process-group`` runs one rank for memory profiling. It runs a
few training steps through megatron-bridge's own ``pretrain`` and reports torch's peak allocated and reserved bytes,
a memory snapshot (``torch.cuda.memory._dump_snapshot``, for https://pytorch.org/memory_viz), and our prediction for
the same rank (:func:`lcmoe_recipes.cost.memory.rank_memory`) beside it.

What the fake collectives mean, and the changes they need (each printed with the run):

* MoE routing is forced balanced (``moe_router_force_load_balancing``: random router logits, megatron-core 0.19.2
  ``transformer/moe/router.py:856``, what Megatron-LM's fake-process-group profiling recommends). With the mirror
  backend every EP peer then sends this rank what it routes to its own experts: each expert receives the balanced
  share, which is what our activation table assumes (``topk`` copies of the rank's tokens). Real routing is not
  balanced; an imbalanced step keeps more expert activations than this measures.
* The flex dispatcher (DeepEP, HybridEP) communicates outside torch.distributed: the all-to-all dispatcher moves the
  same tokens. DeepEP/HybridEP buffers live outside torch's allocator and are not measured (our ``dispatcher``
  component, reported apart from the allocator peak).
* Pipeline stages receive zeros from their neighbours (activations and gradients of the right shapes); reductions keep
  this rank's values. Losses and gradients are therefore not the real job's; the shapes and the schedule are.
* No gloo groups (they need a real rendezvous); no checkpoint is saved or loaded; no evaluation.
* NCCL's own buffers and the CUDA context are not in torch's counters (nor in our allocator peak).
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...core.plan import Plan
from ...errors import LcmoeError

SNAPSHOT_ENTRIES = 200_000  # torch.cuda.memory._record_memory_history(max_entries=...)


@dataclass
class RankRun:
    """A config prepared to run as one rank of its job.

    Attributes:
        cfg: the ConfigContainer to run (a changed copy of the job's).
        plan: its Plan (read back from ``cfg``: what our prediction prices).
        rank, pp_rank: the global rank and its pipeline rank.
        world_size, hardware: the job's target.
        changes: what differs from the job's config, one line each with the reason.
    """

    cfg: object
    plan: Plan
    rank: int
    pp_rank: int
    world_size: int
    hardware: str
    changes: list[str] = field(default_factory=list)


def most_loaded_rank(plan: Plan) -> int:
    """The first global rank (TP = CP = EP = DP rank 0) of the pipeline stage our memory model loads most."""
    from ...cost.memory import estimate_memory
    from ...core.ranks import dense_groups

    stage = estimate_memory(plan).pp_rank
    return min(group[stage] for group in dense_groups(plan.layout, "pp"))


def pipeline_rank(plan: Plan, rank: int) -> int:
    """Pipeline rank of global rank ``rank`` (megatron-core's rank order, :mod:`lcmoe_recipes.core.ranks`).

    Raises:
        LcmoeError: ``rank`` is not a rank of the job.
    """
    from ...core.ranks import dense_groups

    if not 0 <= rank < plan.layout.world:
        raise LcmoeError(f"`as_rank` {rank} is not a rank of this {plan.layout.world}-GPU job",
                         f"give a rank in 0..{plan.layout.world - 1} (the most loaded: {most_loaded_rank(plan)})",
                         fields=("as_rank",))
    return next(group.index(rank) for group in dense_groups(plan.layout, "pp") if rank in group)


def prepare(cfg, meta: dict, rank: int, steps: int) -> RankRun:
    """The job's config changed to run ``steps`` steps as global rank ``rank`` on one GPU (module doc).

    Raises:
        LcmoeError: the header lacks the target, the rank is out of range, or (without Transformer Engine) a part of
            the model or its precision needs TE.
    """
    from ..readback import plan_from_config
    from ..local_impl import optimizer_without_te, use_local_implementation
    from ..stack import te_installed

    world, hardware = meta.get("world_size"), meta.get("hardware")
    if not world or not hardware:
        raise LcmoeError("this YAML's header does not record the world size and GPU it was planned for",
                         "write it with python -m lcmoe_recipes.launch ... --dry-run")
    plan = plan_from_config(cfg, hardware, world, meta.get("recipe", "config"))
    pp_rank = pipeline_rank(plan, rank)
    run = copy.deepcopy(cfg)
    changes = []

    def change(path: str, value, why: str) -> None:
        *owners, leaf = path.split(".")
        owner = run
        for part in owners:
            owner = getattr(owner, part)
        old = getattr(owner, leaf)
        if old != value:
            setattr(owner, leaf, value)
            changes.append(f"{path}: {old!r} -> {value!r} ({why})")

    m = run.model
    if m.num_moe_experts:
        change("model.moe_router_force_load_balancing", True, "balanced routing: what the mirror collectives "
               "assume and our activation table prices")
    if m.moe_token_dispatcher_type == "flex":
        change("model.moe_token_dispatcher_type", "alltoall", "DeepEP/HybridEP communicate outside torch.distributed")
    change("dist.use_gloo_process_groups", False, "gloo groups need a real rendezvous")
    change("train.train_iters", steps, "a few steps")
    micro = microbatches_for_peak(plan)
    if micro < plan.num_microbatches:
        change("train.global_batch_size", plan.micro_batch_size * plan.layout.dp * micro,
               f"{micro} microbatches per step instead of {plan.num_microbatches}: the peak holds the microbatches "
               "in flight at once (megatron-core's warm-up count), and that many reach it")
    change("scheduler.lr_warmup_iters", min(run.scheduler.lr_warmup_iters or 0, max(steps - 1, 0)), "within the run")
    change("scheduler.lr_decay_iters", steps, "within the run")
    change("checkpoint.save", None, "nothing saved")
    change("checkpoint.async_save", False, "nothing saved (megatron-bridge refuses async_save without a save path)")
    change("checkpoint.load", None, "nothing loaded")
    change("checkpoint.pretrained_checkpoint", None, "random weights: memory does not depend on their values")
    change("validation.eval_interval", None, "no evaluation")
    change("validation.eval_iters", 0, "no evaluation")
    change("logger.log_interval", 1, "every step")
    if not te_installed():
        if plan.precision != "bf16":
            raise LcmoeError(f"this job computes in {plan.precision}, which needs Transformer Engine's kernels",
                             "run the measurement where Transformer Engine is installed (the cluster container)")
        changes += [f"model.{line}" for line in use_local_implementation(run.model)]
        changes += [f"optimizer.{line}" for line in optimizer_without_te(run.optimizer)]
    return RankRun(cfg=run, plan=plan_from_config(run, hardware, world, plan.name), rank=rank, pp_rank=pp_rank,
                   world_size=world, hardware=hardware, changes=changes)


def microbatches_for_peak(plan: Plan) -> int:
    """The fewest microbatches per step that still put as many in flight on every pipeline rank as the job does
    (megatron-core's 1F1B / interleaved warm-up, :func:`lcmoe_recipes.cost.memory._in_flight`), a multiple of PP."""
    from ...cost.memory import _in_flight, ep_overlap_warmup

    lay = plan.layout
    vpp, extra = lay.vpp or 1, ep_overlap_warmup(plan)
    job = [_in_flight(lay.pp, vpp, max(1, plan.num_microbatches), r, extra) for r in range(lay.pp)]
    for micro in range(lay.pp, plan.num_microbatches + lay.pp, lay.pp):
        if all(_in_flight(lay.pp, vpp, micro, r, extra) == job[r] for r in range(lay.pp)):
            return min(micro, plan.num_microbatches)
    return plan.num_microbatches


def prediction(run: RankRun) -> dict:
    """Our memory model for the rank's pipeline stage (GiB per component, and the allocator peak)."""
    from ...cost.memory import rank_memory

    memory = rank_memory(run.plan, run.pp_rank)
    return {"pp_rank": run.pp_rank, "total_gib": memory.total / 2**30, "components_gib": memory.gib(),
            "dispatcher_gib_outside_allocator": memory.dispatcher / 2**30}


def measure(run: RankRun, out: Path) -> dict:
    """Run ``run`` on this machine's GPU 0 as its rank; write ``out/as_rank.json`` and ``out/memory_snapshot.pickle``.

    Returns:
        the JSON written: the rank, the changes, measured peak allocated / reserved (GiB), our prediction, the ratio.

    Raises:
        LcmoeError: no GPU.
    """
    import torch

    if not torch.cuda.is_available():
        raise LcmoeError("one rank alone (`as_rank`) runs on a GPU; none is visible here",
                         "run it on a GPU machine (scripts/gpu_proof.sh runs it for the most loaded rank)",
                         fields=("as_rank",))
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    from ..stack import use_prebuilt_dataset_helpers
    from .fake_world import MIRROR, init_world

    use_prebuilt_dataset_helpers()

    out.mkdir(parents=True, exist_ok=True)
    os.environ.update(RANK=str(run.rank), WORLD_SIZE=str(run.world_size), LOCAL_RANK="0",
                      MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                      MASTER_PORT=os.environ.get("MASTER_PORT", "29500"))
    torch.cuda.set_device(0)
    init_world(run.world_size, run.rank, MIRROR)  # megatron-bridge then skips init_process_group
    torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_ENTRIES)
    start = time.monotonic()
    pretrain(run.cfg, forward_step)
    seconds = time.monotonic() - start
    torch.cuda.memory._dump_snapshot(str(out / "memory_snapshot.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
    predicted = prediction(run)
    result = {
        "date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "job": {"world_size": run.world_size, "hardware": run.hardware, "layout": run.plan.layout.describe(),
                "seq_length": run.plan.seq_length, "model": run.plan.model},
        "rank": run.rank, "pp_rank": run.pp_rank, "steps": run.cfg.train.train_iters, "seconds": seconds,
        "changes": run.changes,
        "measured": {"peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                     "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30},
        "predicted": predicted,
    }
    result["measured_over_predicted"] = result["measured"]["peak_allocated_gib"] / predicted["total_gib"]
    (out / "as_rank.json").write_text(json.dumps(result, indent=1))
    return result


def table(result: dict) -> str:
    """The measurement beside our prediction, as text."""
    measured, predicted = result["measured"], result["predicted"]
    lines = [f"rank {result['rank']} (PP rank {result['pp_rank']}) of {result['job']['world_size']} x "
             f"{result['job']['hardware']} ({result['job']['layout']}), {result['steps']} steps on "
             f"{result['device']}:",
             f"  peak allocated {measured['peak_allocated_gib']:.1f} GiB, reserved {measured['peak_reserved_gib']:.1f} "
             f"GiB; ours {predicted['total_gib']:.1f} GiB (allocated / ours {result['measured_over_predicted']:.3f})",
             "  ours by component, GiB: " + ", ".join(f"{k} {v:.1f}" for k, v in predicted["components_gib"].items()
                                                    if k != "total")]
    lines += [f"  changed for the measurement: {c}" for c in result["changes"]]
    return "\n".join(lines)
