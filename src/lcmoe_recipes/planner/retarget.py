"""Retarget your own ConfigContainer to a longer sequence length: ``launch --from CONFIG.yaml --seq N``.

The config (an upstream 4K recipe dumped to YAML, or one of your own) is read back into a Plan (by the emitter); the
planner plans the same model, precision and GPUs for N (the resolver's search, :func:`lcmoe_recipes.planner.resolve.
search`, with :func:`retarget_request`); then only the settings long context requires are written onto *your* config
(:func:`lcmoe_recipes.emit.settings.retarget_config`) -- layout and CP (and its communication), pipeline layout,
seq_length, positions, batch, recompute, optimizer offload, CUDA graphs, the dispatcher and its environment, the loss
normalisation and the attention mask -- with the same settings groups (and reasons) our own recipes use. Everything
else stays yours: data, tokenizer, optimizer and schedule, checkpointing, logging, kernels (:func:`retarget_plan`).
"""

from __future__ import annotations

import dataclasses

from ..core.plan import Plan, Reason
from ..core.request import TrainingRequest
from ..cost import estimate_step
from ..cost.memory import ep_overlap_warmup
from ..rules.extension import EP_OVERLAP_SOURCE, with_ep_overlap
from .hazards import follow_recipe_choices


def retarget_request(before: Plan, request: TrainingRequest) -> TrainingRequest:
    """What to search for when ``before`` (a config read back) is retargeted to ``request.seq_length`` on
    ``request``'s target (its ``hardware`` and ``num_gpus`` set): the same model, the config's own precision unless
    ``request.precision`` is given, its weights; the request's wishes and run options apply as for any request."""
    return request.replace(model=before.model, model_config=None, from_config=None, recipe=None,
                           precision=request.precision or before.precision,
                           pretrained_checkpoint=before.pretrained_checkpoint)


def retarget_plan(before: Plan, best: Plan, name: str, keep_precision: bool = True, lr: float | None = None,
                  train_iters: int | None = None) -> Plan:
    """The Plan of ``before`` retargeted: the search's ``best`` plan for :func:`retarget_request`, with the config's
    own schedule (its peak LR and steps replaced by ``lr`` and ``train_iters`` where given), weights, data loading and
    EP-overlap choice kept.

    Args:
        before: the config's own Plan (:func:`lcmoe_recipes.emit.plan_from_config`).
        best: the search's winner for ``retarget_request(before, request)``.
        name: the new plan's name.
        keep_precision: the precision is the config's own (no precision was asked for): its reason says so.
        lr, train_iters: the request's (``--lr``, ``--train-iters``): the final LR is lowered to ``lr`` where it was
            above it; warm-up and decay style stay the config's.
    """
    schedule, why = before.schedule, "the config's own schedule, kept (--lr / --train-iters change it)"
    if schedule is not None and (lr is not None or train_iters is not None):
        peak = schedule.lr if lr is None else lr
        schedule = dataclasses.replace(schedule, lr=peak, min_lr=min(schedule.min_lr, peak),
                                       train_iters=schedule.train_iters if train_iters is None else train_iters)
        why = ("the config's own schedule with " + " and ".join(
            text for given, text in ((lr, f"peak LR {peak:g} (--lr)"), (train_iters, f"{schedule.train_iters} steps "
                                                                                     "(--train-iters)"))
            if given is not None) + f": final LR {schedule.min_lr:g}, {schedule.lr_warmup_iters} warm-up steps, "
               f"{schedule.lr_decay_style} decay over the steps")
    reasons = {**best.reasons,
               "schedule": Reason(why, "your config; your request"),
               "base_recipe": Reason("the config given to --from: every field this retargeting does not list as "
                                     "changed is kept as it was", "your config")}
    if keep_precision:
        reasons["precision"] = Reason(f"{best.precision}: the config's own (--precision changes it)", "your config")
    # the config's own EP-overlap choice, kept where the new recompute and layout allow it, where no upstream
    # recipe turned it off on the new hardware (planner.hazards.RECIPE_CHOICES), and where it keeps no more
    # activations in flight than the search's plan was fitted with (with VPP the overlap adds a model chunk:
    # cost.memory.ep_overlap_warmup)
    own = best.with_changes(moe_ep_overlap=before.moe_ep_overlap, reasons=reasons)
    if ep_overlap_warmup(own) > ep_overlap_warmup(best):
        own = best.with_changes(reasons=reasons)
    searched, best = best, follow_recipe_choices(with_ep_overlap(own))
    if searched.moe_ep_overlap and not best.moe_ep_overlap and not before.moe_ep_overlap:
        # the search ranked the layout with the overlap on; the config's own "off" is kept: say so, and what it costs
        on, off = (estimate_step(p).step_seconds for p in (best.with_changes(moe_ep_overlap=True), best))
        reasons = {**best.reasons, "moe_ep_overlap": Reason(
            "EP all-to-all overlap off: the config's own setting, kept (overlap_moe_expert_parallel_comm); megatron-core "
            f"allows it here and the step model prices the step {off - on:.2f} s faster with it ({off:.2f} s -> "
            f"{on:.2f} s; the layout was ranked with it): set comm_overlap.overlap_moe_expert_parallel_comm=true "
            "comm_overlap.delay_wgrad_compute=true" + (" model.moe_shared_expert_overlap=false" if
                                                       best.model_spec.shared_expert_ffn_hidden_size else "")
            + " to take it", f"your config; {EP_OVERLAP_SOURCE}")}
        best = best.with_changes(reasons=reasons)
    # the YAML keeps its own gradient and Adam-moment dtypes (neither is retargeted): so does the plan, so what launch
    # predicts is what `check` reads from the YAML; the search sized the layout with its own, said where they differ
    reasons, kept = best.reasons, {}
    for knob, what, fields in (("grad_dtype", "gradient reduction", "ddp.grad_reduce_in_fp32"),
                               ("moment_dtype", "Adam moments", "optimizer.exp_avg_dtype, optimizer.exp_avg_sq_dtype")):
        if getattr(before, knob) != getattr(best, knob):
            kept[knob] = getattr(before, knob)
            reasons = {**reasons, knob: Reason(
                f"{getattr(before, knob)} {what} ({fields}): the config's own, kept; the layout was searched with "
                f"{getattr(best, knob)} (set {fields} for that)", "your config")}
    return best.with_changes(name=name, schedule=schedule, num_workers=before.num_workers, **kept,
                             eval_iters=before.eval_iters, pin_cpu_grads=before.pin_cpu_grads, reasons=reasons)
