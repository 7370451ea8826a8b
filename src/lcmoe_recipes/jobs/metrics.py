"""What a training run measured, written as JSON by rank 0: ``python -m lcmoe_recipes.train ... --metrics FILE``.

A megatron-bridge 0.6.2 training callback (``training/callbacks.py``: ``Callback``, fired by ``pretrain(...,
callbacks=[...])``) records, per step: the losses megatron-bridge reduced for that step (``loss_dict``, e.g.
``lm loss``), the wall time of the step (``torch.cuda.synchronize()`` at both ends, seconds) and the peak memory
allocated so far (``torch.cuda.max_memory_allocated()``, bytes: the figure megatron-bridge logs as
``mem-max-allocated-bytes``). The file is rewritten after every step, so a run that dies still leaves its steps.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def metrics_callback(path: str | Path):
    """A megatron-bridge ``Callback`` that writes ``{"steps": [{"step", "loss", "seconds", "max_allocated_bytes"},
    ...], "device": name}`` to ``path`` (rank 0 only)."""
    import torch
    from megatron.bridge.training.callbacks import Callback

    target = Path(path)

    class _Metrics(Callback):
        def __init__(self) -> None:
            self.steps: list[dict] = []
            self.rank0 = os.environ.get("RANK", "0") == "0"
            self._t0 = 0.0

        def on_train_step_start(self, context) -> None:
            torch.cuda.synchronize()
            self._t0 = time.perf_counter()

        def on_train_step_end(self, context) -> None:
            torch.cuda.synchronize()
            seconds = time.perf_counter() - self._t0
            if not self.rank0:
                return
            losses = {name: float(value.float().mean()) if hasattr(value, "float") else float(value)
                      for name, value in (context.loss_dict or {}).items()}
            self.steps.append({"step": context.state.train_state.step, "loss": losses, "seconds": seconds,
                               "max_allocated_bytes": torch.cuda.max_memory_allocated(),
                               "skipped": bool(context.skipped_iter)})
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "steps": self.steps}, indent=1))
            os.replace(tmp, target)

    return _Metrics()
