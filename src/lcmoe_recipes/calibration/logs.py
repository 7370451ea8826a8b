"""Read a training run's own measurements from its log: iteration time, TFLOP/s per GPU, peak memory per rank.

The formats are the installed upstream code's, read exactly:

* iteration lines -- megatron-bridge 0.6.2 ``training/utils/train_utils.py`` ``training_log`` (printed on the last
  rank) and Megatron-LM's ``megatron/training/training.py`` ``training_log`` (megatron-core 0.19.2's package):
  ``" [<date time>] iteration {:8d}/{:8d} | consumed samples: ... | elapsed time per iteration (ms): {:.1f} |"``,
  then, with ``log_throughput``, ``" throughput per GPU (TFLOP/s/GPU): {:.1f} |"``, ..., ``" global batch size:
  {:5d} |"``. The elapsed time is averaged over the ``log_interval`` iterations since the previous line.
* memory lines -- megatron-bridge: ``"[Rank {r}] (after {i} iterations) memory (GB) | mem-max-allocated-gigabytes:
  {x} | ... | mem-max-reserved-gigabytes: {y} | ..."`` (``report_memory``: ``torch.cuda.memory_stats()`` peaks /
  1e9, printed once per model-parallel rank by data-parallel rank 0 after the first iterations); Megatron-LM:
  ``"[Rank {r}] (after {i} iterations) memory (MB) | allocated: ... | max allocated: {x} | reserved: ... | max
  reserved: {y}"`` (``megatron/training/utils/common_utils.py`` ``report_memory``, MB = 2**20 bytes).

Launcher prefixes (``[default0]:``, ``0:``) before a line are ignored. Each defect is one clear error
(:class:`CalibrationError`) naming the file, the line and the fix: a log with no iteration line (the run did not log
a step), a line that looks like an iteration line but does not parse (garbled), too few iterations past the warm-up
(partial), iteration lines of two runs mixed in one file, or a log that disagrees with the config it is said to come
from (:func:`check_against` -- global batch size, TFLOP/s that imply another model or sequence length).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

from ..errors import CalibrationError, LcmoeError  # noqa: F401 (CalibrationError re-exported)

WARMUP_SHARE = 0.2        # the first fifth of the logged iterations (at least WARMUP_MIN) is warm-up: skipped
WARMUP_MIN = 2
MIN_STEADY = 3            # logged iterations needed past the warm-up
FLOPS_TOLERANCE = 0.03    # logged TFLOP/s x step time vs the config's model FLOPs per step


_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.]+)\s*\|")
_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([0-9.]+)\s*\|")
_GBS = re.compile(r"global batch size:\s*(\d+)\s*\|")
_MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \((GB|MB)\)(.*)$")
_PAIR = re.compile(r"\|\s*([A-Za-z][\w -]*?):\s*([0-9.eE+-]+)")


@dataclass(frozen=True)
class Iteration:
    """One logged iteration line."""

    iteration: int
    train_iters: int
    elapsed_ms: float
    tflops_per_gpu: float | None
    global_batch_size: int
    line: int


@dataclass(frozen=True)
class RunLog:
    """What one log file says: its iteration lines and, per rank, the peak memory (bytes) it reported."""

    path: str
    iterations: tuple[Iteration, ...]
    peak_allocated: dict[int, float] = field(default_factory=dict)  # rank -> bytes
    peak_reserved: dict[int, float] = field(default_factory=dict)

    @property
    def steady(self) -> tuple[Iteration, ...]:
        """The iterations past the warm-up (the first WARMUP_SHARE of them, at least WARMUP_MIN)."""
        skip = max(WARMUP_MIN, int(len(self.iterations) * WARMUP_SHARE))
        return self.iterations[skip:]

    @property
    def step_seconds(self) -> float:
        """Median logged iteration time past the warm-up, seconds."""
        return median(i.elapsed_ms for i in self.steady) / 1e3

    @property
    def tflops_per_gpu(self) -> float | None:
        """Median logged TFLOP/s per GPU past the warm-up (None: the run did not log throughput)."""
        values = [i.tflops_per_gpu for i in self.steady if i.tflops_per_gpu is not None]
        return median(values) if values else None

    @property
    def global_batch_size(self) -> int:
        return self.steady[-1].global_batch_size

    @property
    def max_allocated(self) -> float | None:
        """The largest peak allocated memory any rank reported, bytes (None: no memory line)."""
        return max(self.peak_allocated.values()) if self.peak_allocated else None


def parse_log(text: str, path: str = "LOG") -> RunLog:
    """Read a training log (module doc for the formats).

    Raises:
        CalibrationError: no iteration line; a garbled iteration line; fewer than MIN_STEADY iterations past the
            warm-up; iterations of more than one run (the iteration counter goes back, or the total changes).
    """
    iterations: list[Iteration] = []
    allocated: dict[int, float] = {}
    reserved: dict[int, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if "elapsed time per iteration" in line or _ITERATION.search(line) and "consumed samples" in line:
            iterations.append(_iteration(line, number, path))
            continue
        memory = _MEMORY.search(line)
        if memory:
            rank, unit, rest = int(memory.group(1)), memory.group(3), memory.group(4)
            pairs = {k.strip(): float(v) for k, v in _PAIR.findall(rest)}
            scale = 1e9 if unit == "GB" else 2**20
            peak = pairs.get("mem-max-allocated-gigabytes", pairs.get("max allocated"))
            peak_reserved = pairs.get("mem-max-reserved-gigabytes", pairs.get("max reserved"))
            if peak is None:
                raise CalibrationError(f"{path}, line {number}: a memory line without a peak allocated value: "
                                       f"{line.strip()[:160]!r}",
                                       "log the default memory keys (megatron-bridge logger.memory_keys unset) or "
                                       "Megatron-LM's report_memory line")
            allocated[rank] = max(allocated.get(rank, 0.0), peak * scale)
            if peak_reserved is not None:
                reserved[rank] = max(reserved.get(rank, 0.0), peak_reserved * scale)
    if not iterations:
        raise CalibrationError(f"{path} has no iteration line ('iteration N/M | ... elapsed time per iteration (ms): "
                               "...'): the run logged no step, or this is not the log of the last rank",
                               "pass the log of the rank that prints the iteration lines (the last rank), from a "
                               "run that got past its first logged iterations")
    for before, after in zip(iterations, iterations[1:]):
        if after.iteration <= before.iteration or after.train_iters != before.train_iters:
            raise CalibrationError(
                f"{path}, line {after.line}: iteration {after.iteration}/{after.train_iters} follows "
                f"{before.iteration}/{before.train_iters} (line {before.line}): two runs in one log",
                "give each run's log as its own file")
    log = RunLog(path, tuple(iterations), allocated, reserved)
    if len(log.steady) < MIN_STEADY:
        raise CalibrationError(
            f"{path} has {len(iterations)} logged iterations, {len(log.steady)} past the warm-up: too few to time a "
            f"step (a partial log: the run stopped at iteration {iterations[-1].iteration} of "
            f"{iterations[-1].train_iters})",
            f"run at least {MIN_STEADY + WARMUP_MIN + 1} logged iterations (the calibration run does 30), or pass the "
            "whole log")
    return log


def _iteration(line: str, number: int, path: str) -> Iteration:
    it, elapsed, gbs = _ITERATION.search(line), _ELAPSED.search(line), _GBS.search(line)
    if not (it and elapsed and gbs):
        missing = [name for name, m in (("iteration N/M", it), ("elapsed time per iteration (ms)", elapsed),
                                        ("global batch size", gbs)) if not m]
        raise CalibrationError(f"{path}, line {number}: a garbled iteration line (no {', '.join(missing)}): "
                               f"{line.strip()[:160]!r}",
                               "pass the unedited log; lines cut by a log collector or interleaved with another "
                               "rank's output cannot be read")
    tflops = _TFLOPS.search(line)
    return Iteration(int(it.group(1)), int(it.group(2)), float(elapsed.group(1)),
                     float(tflops.group(1)) if tflops else None, int(gbs.group(1)), number)


def read_log(path: str | Path) -> RunLog:
    """:func:`parse_log` of a file.

    Raises:
        CalibrationError: the file is missing or unreadable, or :func:`parse_log` refuses it.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CalibrationError(f"cannot read log '{path}': {exc.strerror or exc}",
                               "give the path of a training log file") from None
    return parse_log(text, str(path))


def check_against(log: RunLog, plan, model_flops_per_step: float) -> None:
    """Refuse a log that is not a run of ``plan``: its global batch size differs, or its logged TFLOP/s per GPU x
    iteration time x GPUs is not the plan's model FLOPs per step (within FLOPS_TOLERANCE: megatron-bridge counts
    model FLOPs as our step model does, so another model, sequence length or GPU count shows here).

    Raises:
        CalibrationError: naming both values and the fix.
    """
    if log.global_batch_size != plan.global_batch_size:
        raise CalibrationError(
            f"{log.path}: global batch size {log.global_batch_size}, but the config has {plan.global_batch_size}: "
            "the log is not a run of this config", "give the config the run was launched with (--config)")
    tflops = log.tflops_per_gpu
    if tflops is None:
        return
    logged = tflops * 1e12 * log.step_seconds * plan.layout.world
    if abs(logged / model_flops_per_step - 1) > FLOPS_TOLERANCE:
        raise CalibrationError(
            f"{log.path}: {tflops:.1f} TFLOP/s per GPU x {log.step_seconds:.3f} s x {plan.layout.world} GPUs = "
            f"{logged:.3e} FLOPs per step, but the config ({plan.model_spec.display}, seq_length {plan.seq_length}, "
            f"GBS {plan.global_batch_size}) does {model_flops_per_step:.3e}: the log is from another model, length "
            "or GPU count", "give the config and GPU count the run was launched with (--config, --gpus)")
