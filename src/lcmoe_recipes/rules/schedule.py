"""The optimizer schedule of a context-extension phase: a short warm-up, then a constant learning rate at the base
model's final one, for a fixed number of steps."""

from __future__ import annotations

from ..catalog import ModelSpec
from ..catalog.history import history_of
from ..core.plan import Reason, Schedule
from ..errors import LcmoeError

DSV3 = "DeepSeek-V3 technical report (arXiv 2412.19437) §4.3: 1,000 steps per phase at the final pre-training LR"
WARMUP_FRACTION = 0.02  # of the phase: Adam's moments start from zero in a new phase, so its first steps are damped


def choose_schedule(spec: ModelSpec, base_min_lr: float | None, lr: float | None = None,
                    train_iters: int | None = None) -> tuple[Schedule, Reason]:
    """(Schedule, reason) for one extension phase.

    Args:
        base_min_lr: the final LR of megatron-bridge's pre-training recipe for the model (its ``min_lr``), used
            when the base model's own final LR is not published.
        lr, train_iters: the request's values (``--lr``, ``--train-iters``).

    Raises:
        LcmoeError: a non-positive learning rate or step count.
    """
    if lr is not None and lr <= 0:
        raise LcmoeError(f"`lr` {lr:g} is not a positive learning rate", "e.g. lr=7.3e-6", fields=("lr",))
    if train_iters is not None and train_iters <= 0:
        raise LcmoeError(f"`train_iters` {train_iters} is not a positive number of steps", "e.g. train_iters=1000",
                         fields=("train_iters",))
    history = history_of(spec.published_id)
    if lr is not None:
        rate, where = lr, "your --lr"
    elif history.final_lr is not None:
        rate, where = history.final_lr, f"{spec.display}'s final pre-training LR ({history.source})"
    else:
        rate = base_min_lr if base_min_lr else 1e-5
        where = (f"the final LR of megatron-bridge's pre-training schedule for this model (min_lr {rate:g}); "
                 f"{spec.display}'s own is not published")
    steps = train_iters or history.extension_steps or 1000
    warmup = max(1, round(WARMUP_FRACTION * steps))
    schedule = Schedule(train_iters=steps, lr=rate, min_lr=rate, lr_warmup_iters=warmup, lr_decay_style="constant")
    source = "your --train-iters" if train_iters else (history.source if history.extension_steps else DSV3)
    return schedule, Reason(f"{steps} steps, {warmup} of linear warm-up, then a constant LR {rate:g} "
                            f"({where})", source)
