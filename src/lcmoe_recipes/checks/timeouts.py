"""Distributed timeouts against the waits the cost model predicts for a config.

A rank blocked in a collective or a pipeline receive longer than its process group's timeout is killed by PyTorch's
NCCL watchdog, although nothing is wrong: a long-context step can keep a pipeline stage waiting for its first
activation or gradient for a long time (Megatron-LM #5643: DeepSeek-V4 SFT with CP timed out in the pipeline group
at --distributed-timeout-minutes=5 and ran at 10). The timeouts a config sets:

* ``dist.distributed_timeout_minutes`` -- every process group megatron-bridge creates (megatron-core
  ``parallel_state.initialize_model_parallel``; before megatron-core 0.16 not the expert-parallel group, see
  ``known-issue/ep-group-default-timeout``); megatron-bridge's default is 10;
* ``dist.distributed_timeout_seconds_after_init`` -- when set, megatron-bridge switches every group to it after the
  first iteration (``training/train.py``, ``update_pg_timeout``);
* DeepEP's dispatch and combine give up after 100 s (``NUM_CPU_TIMEOUT_SECS`` and ``NUM_TIMEOUT_CYCLES``, 200G
  cycles, in DeepEP ``csrc/kernels/configs.cuh``, v1.2.1): compiled in, no setting or environment variable changes it.

No NCCL environment variable bounds how long a collective may wait (``NCCL_IB_TIMEOUT`` bounds one InfiniBand
retransmission, ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` the watchdog thread's own liveness), so ``env_vars`` is not
compared.

The waits come from :func:`lcmoe_recipes.cost.step.longest_waits`: the longest single collective (an upper bound)
and the pipeline fill, modelled, not measured. The first iteration also builds NCCL communicators, captures CUDA
graphs and may load a checkpoint; those are not predicted, which is one reason the timeout after init can be shorter.

Rules (all warnings): ``timeout/distributed``, ``timeout/after-init``, ``timeout/deepep``.
"""

from __future__ import annotations

import math

from ..core.plan import Plan
from ..cost.step import longest_waits
from .conditions import ABSENT, ConfigView
from .feasibility import Finding

# A timeout should cover 3x the predicted longest wait: the step model's worst leave-one-out error on the published
# throughput rows is 29% (docs/accuracy.md, row T7), and stragglers (a slow node, a garbage-collection pause, a
# checkpoint write on some ranks) add to a wait the model does not see.
TIMEOUT_SAFETY = 3.0
DEFAULT_TIMEOUT_MINUTES = 10  # megatron-bridge DistributedInitConfig.distributed_timeout_minutes (0.6.2)
DEEPEP_TIMEOUT_SECONDS = 100.0  # DeepEP csrc/kernels/configs.cuh: NUM_CPU_TIMEOUT_SECS; 200G cycles ~ 100 s


def _number(view: ConfigView, path: str, default: float | None) -> float | None:
    value = view.get(path)
    return default if value is ABSENT or value is None else float(value)


def timeout_findings(view: ConfigView, plan: Plan) -> list[Finding]:
    """Warnings for each timeout of ``view`` shorter than :data:`TIMEOUT_SAFETY` x the longest wait predicted for
    ``plan`` (the same config read back into a Plan), each naming the value to use.

    Args:
        view: the config (:func:`lcmoe_recipes.checks.known_issues.config_view`).
        plan: its Plan (:func:`lcmoe_recipes.emit.plan_from_config`); the layout must be legal.

    Returns:
        rules ``timeout/distributed`` (``dist.distributed_timeout_minutes``, minutes), ``timeout/after-init``
        (``dist.distributed_timeout_seconds_after_init``, seconds) and ``timeout/deepep`` (a DeepEP dispatch
        predicted near its compiled 100 s).
    """
    waits = longest_waits(plan)
    what, wait = waits.longest
    need = TIMEOUT_SAFETY * wait
    basis = (f"the predicted longest wait is the {what} ({wait:.1f} s; longest single collective {waits.collective[0]} "
             f"{waits.collective[1]:.2f} s, first-gradient pipeline wait {waits.pipeline:.1f} s, modelled by lcmoe_recipes.cost), "
             f"and a timeout should cover {TIMEOUT_SAFETY:g}x that")
    out = []
    minutes = _number(view, "dist.distributed_timeout_minutes", DEFAULT_TIMEOUT_MINUTES)
    if minutes * 60 < need:
        use = math.ceil(need / 60)
        out.append(Finding("warning", "timeout/distributed",
                           f"dist.distributed_timeout_minutes={minutes:g} ({minutes * 60:.0f} s) is shorter than "
                           f"{need:.0f} s: {basis}; the NCCL watchdog would abort a healthy run",
                           f"set dist.distributed_timeout_minutes={use}"))
    after = _number(view, "dist.distributed_timeout_seconds_after_init", None)
    if after is not None and after < need:
        out.append(Finding("warning", "timeout/after-init",
                           f"dist.distributed_timeout_seconds_after_init={after:g} is shorter than {need:.0f} s: "
                           f"{basis}; from the second iteration on every process group uses it",
                           f"set dist.distributed_timeout_seconds_after_init={math.ceil(need)}"))
    if waits.dispatch is not None and waits.dispatch[0] == "deepep" \
            and TIMEOUT_SAFETY * waits.dispatch[1] > DEEPEP_TIMEOUT_SECONDS:
        out.append(Finding("warning", "timeout/deepep",
                           f"one DeepEP dispatch is predicted at {waits.dispatch[1]:.1f} s; DeepEP gives up after "
                           f"{DEEPEP_TIMEOUT_SECONDS:.0f} s (compiled in, csrc/kernels/configs.cuh) and a dispatch "
                           f"should stay under 1/{TIMEOUT_SAFETY:g} of that",
                           "send fewer tokens per dispatch: raise CP (or EP), lower micro_batch_size, or use HybridEP "
                           "(moe_flex_dispatcher_backend=hybridep)"))
    return out
