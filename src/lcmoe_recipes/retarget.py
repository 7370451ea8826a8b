"""Retarget your own ConfigContainer to a longer sequence length: ``launch --from CONFIG.yaml --seq N``.

The config (an upstream 4K recipe dumped to YAML, or one of your own) is read back into a Plan; the planner plans the
same model, precision and GPUs for N; then only the settings long context requires are written onto *your* config --
layout and CP (and its communication), pipeline layout, seq_length, positions, batch, recompute, optimizer offload,
CUDA graphs, the dispatcher and its environment, the loss normalisation and the attention mask -- with the same
:mod:`lcmoe_recipes.emit.settings` groups (and reasons) our own recipes use. Everything else stays yours: data,
tokenizer, optimizer and schedule, checkpointing, logging, kernels. Every changed field is reported with its setting
and reason.
"""

from __future__ import annotations

import copy

from .emit.settings import SETTINGS, Difference, parity
from .errors import LcmoeError
from .plan import Plan, Reason
from .rules.extension import with_ep_overlap

# The settings groups a retarget writes (the rest of the config is the user's).
RETARGET_SETTINGS = ("layout", "sequence_parallel", "pipeline_model_parallel_layout", "seq_length", "positions",
                     "cp_comm_type", "dispatcher", "hardware_env", "recompute", "cuda_graphs", "optimizer_cpu_offload",
                     "global_batch_size", "loss", "attention_mask", "moe_ep_overlap")


def retarget(cfg, hardware: str, world_size: int, seq_length: int, wishes=None,
             name: str = "retargeted") -> tuple[object, Plan, list[Difference]]:
    """(a retargeted copy of ``cfg``, its Plan, every field changed with its reason).

    Args:
        cfg: the ConfigContainer to retarget (not changed).
        hardware, world_size: the target.
        seq_length: the new length N.
        wishes: the CLI's parsed flags (or None): planning wishes and run options apply as for any request; the
            config's own precision is kept unless ``--precision`` is given.

    Raises:
        LcmoeError: the config's model is not in the catalogue, or no layout fits.
    """
    from .emit import plan_from_config
    from .search import plan as search
    from .plan.cli import request_from_args

    if seq_length <= 0:
        raise LcmoeError(f"--seq {seq_length} is not a positive number of tokens", "e.g. --seq 131072")
    before = plan_from_config(cfg, hardware, world_size, name)
    values = dict(vars(wishes)) if wishes is not None else {}
    defaults = {"gbs": None, "mbs": before.micro_batch_size, "dispatcher": None, "tp": None, "pp": None, "cp": None,
                "ep": None, "no_offload": False, "variable_length": before.variable_length, "rope": "auto",
                "tokens_per_step": None, "lr": None, "train_iters": None}
    merged = {**defaults, **{k: v for k, v in values.items() if v is not None}}
    merged.update(gpus=world_size, hardware=hardware, precision=values.get("precision") or before.precision,
                  pretrained_checkpoint=before.pretrained_checkpoint)
    import argparse

    best = search(request_from_args(before.model, seq_length, argparse.Namespace(**merged))).best.plan
    # the schedule, weights and data loading stay the config's own
    reasons = {**best.reasons,
               "schedule": Reason("the config's own schedule, kept (--lr / --train-iters change it)", "your config"),
               "base_recipe": Reason("the config given to --from: every field this retargeting does not list as "
                                     "changed is kept as it was", "your config")}
    if not values.get("precision"):
        reasons["precision"] = Reason(f"{best.precision}: the config's own (--precision changes it)", "your config")
    # the config's own EP-overlap choice, kept where the new recompute and layout allow it
    best = with_ep_overlap(best.with_changes(moe_ep_overlap=before.moe_ep_overlap, reasons=reasons))
    reasons = best.reasons
    plan = best.with_changes(name=name, schedule=before.schedule, num_workers=before.num_workers,
                             eval_iters=before.eval_iters, pin_cpu_grads=before.pin_cpu_grads, reasons=reasons)
    settings = tuple(s for s in SETTINGS if s.key in RETARGET_SETTINGS)
    out = copy.deepcopy(cfg)
    changes = parity(out, plan, settings)
    return out, plan, changes
