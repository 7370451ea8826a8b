"""Retarget your own ConfigContainer to a longer sequence length: ``launch --from CONFIG.yaml --seq N``.

The config (an upstream 4K recipe dumped to YAML, or one of your own) is read back into a Plan (by the emitter); the
planner plans the same model, precision and GPUs for N; then only the settings long context requires are written onto
*your* config (:func:`lcmoe_recipes.emit.settings.retarget_config`) -- layout and CP (and its communication),
pipeline layout, seq_length, positions, batch, recompute, optimizer offload, CUDA graphs, the dispatcher and its
environment, the loss normalisation and the attention mask -- with the same settings groups (and reasons) our own
recipes use. Everything else stays yours: data, tokenizer, optimizer and schedule, checkpointing, logging, kernels.
"""

from __future__ import annotations

from ..core.plan import Plan, Reason
from ..core.request import TrainingRequest
from ..rules.extension import with_ep_overlap


def retarget_plan(before: Plan, request: TrainingRequest, name: str) -> Plan:
    """The Plan of ``before`` (a config read back) retargeted to ``request.seq_length`` on ``request``'s target.

    Args:
        before: the config's own Plan (:func:`lcmoe_recipes.emit.plan_from_config`).
        request: the request (its ``seq_length``, ``hardware``, ``num_gpus`` set); its wishes and run options apply
            as for any request; the config's own precision is kept unless ``request.precision`` is given.
        name: the new plan's name.

    Raises:
        LcmoeError: no layout fits (InfeasibleConfig, naming the constraint).
    """
    from .search import plan as search

    wished = request.precision
    asked = request.replace(model=before.model, model_config=None, from_config=None, recipe=None,
                            precision=wished or before.precision, pretrained_checkpoint=before.pretrained_checkpoint)
    best = search(asked).best.plan
    # the schedule, weights and data loading stay the config's own
    reasons = {**best.reasons,
               "schedule": Reason("the config's own schedule, kept (--lr / --train-iters change it)", "your config"),
               "base_recipe": Reason("the config given to --from: every field this retargeting does not list as "
                                     "changed is kept as it was", "your config")}
    if not wished:
        reasons["precision"] = Reason(f"{best.precision}: the config's own (--precision changes it)", "your config")
    # the config's own EP-overlap choice, kept where the new recompute and layout allow it
    best = with_ep_overlap(best.with_changes(moe_ep_overlap=before.moe_ep_overlap, reasons=reasons))
    return best.with_changes(name=name, schedule=before.schedule, num_workers=before.num_workers,
                             eval_iters=before.eval_iters, pin_cpu_grads=before.pin_cpu_grads, reasons=best.reasons)
