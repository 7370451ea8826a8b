"""torchrun on this node: ``python -m torch.distributed.run --standalone`` runs :mod:`lcmoe_recipes.train` on every
rank here and its output is teed into ``out/logs/``."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ...catalog import get_hardware
from ...errors import LaunchError, LcmoeError
from .common import LaunchResult, QUIET_ENV, first_error_line, train_arguments


# torch.distributed.run's own output when a rank fails (torch 2.x, torch/distributed/elastic): its agent's log lines,
# then the launcher's traceback ending in ChildFailedError and its failure report, which names each rank's exit code
_AGENT_LOG = re.compile(r"^[EWI]\d{4} [\d:.]+ \d+ torch/distributed/")
_CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
_ROOT_CAUSE_EXIT = re.compile(r"Root Cause \(first observed failure\):\n\[\d+\]:\n(?:.*\n)*?\s*exitcode\s*:\s*(-?\d+)")


class _RanksOnly:
    """Echoes what the ranks print, leaving out torchrun's own report of their failure (its agent's log lines, its
    traceback and the failure table): the ranks' ``error: ...`` / ``fix: ...`` lines say what is wrong, the log
    keeps everything."""

    def __init__(self, out) -> None:
        self.out, self.held, self.done = out, [], False

    def write(self, line: str) -> None:
        if self.done or _AGENT_LOG.match(line):
            return
        if self.held or line.startswith("Traceback (most recent call last):"):
            self.held.append(line)
            if not line.startswith((" ", "Traceback")):  # the exception line closes the traceback
                if line.startswith(_CHILD_FAILED):
                    self.done = True  # the launcher's: it and the report after it are left out
                else:
                    self.out.writelines(self.held)
                self.held = []
            return
        self.out.write(line)

    def close(self) -> None:
        self.out.writelines(self.held)  # a traceback the process ended in the middle of


def rank_exit_code(log_text: str, code: int) -> int:
    """The exit code of the rank torchrun names as the root cause of a failure (our entry script's own: 2 refused, 1
    a wrong smoke answer), else torchrun's ``code``."""
    found = _ROOT_CAUSE_EXIT.search(log_text)
    return int(found.group(1)) if code and found else code


def local_gpus() -> int:
    """CUDA GPUs this machine has (0 without CUDA, or with a broken CUDA install)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install counts as no GPU
        return 0


def run_local(yaml: Path, meta: dict, env_vars: dict[str, str], *, smoke: bool = False, smoke_ranks: int = 2,
              nproc_per_node: int | None = None, dry_run: bool = False, log_dir: str | Path = "out/logs",
              train_args: list[str] | None = None, echo: bool = True) -> LaunchResult:
    """torchrun on this node.

    Args:
        yaml, meta: the config file and its target (:func:`lcmoe_recipes.emit.target_meta`).
        env_vars: exported to every rank unless already set (the recipe's ``env_vars``).
        smoke: CPU-only smoke run with ``smoke_ranks`` ranks (gloo) instead of training.
        nproc_per_node: ranks; default the planned world size (a local run is one node).
        log_dir: where the combined output of the ranks goes (``<recipe>-<time>.log``).
        echo: also print the ranks' output as it comes (torchrun's own report of a failed rank left out: the log
            has it).

    Raises:
        LcmoeError: ``nproc_per_node`` differs from the planned world size (a local run cannot be multi-node).
        LaunchError: fewer GPUs here than ranks (not for a smoke run or a dry run).
    """
    world = meta.get("world_size") or 1
    nproc = smoke_ranks if smoke else (nproc_per_node or world)
    if not smoke and nproc != world:
        raise LcmoeError(f"`nproc_per_node` {nproc}: the config was planned for {world} ranks and a local run is "
                         "one node", f"use nproc_per_node={world}, or the slurm executor for {world} GPUs on several "
                         "nodes", fields=("nproc_per_node",))
    args = ["--config", str(yaml), *(train_arguments(smoke=smoke) if train_args is None else train_args)]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "lcmoe_recipes.train", *args]
    shown = shlex.join(command)
    if dry_run:
        return LaunchResult("local", "DRY_RUN", shown, Path(yaml))
    if not smoke and (have := local_gpus()) < nproc:
        hw = get_hardware(meta.get("hardware", "h100"))
        raise LaunchError(f"this machine has {have} GPU(s); the config needs {nproc} {hw.display} GPUs",
                          "run it on the cluster (--executor slurm), or check it here with --smoke")
    log_path = Path(log_dir) / f"{meta.get('recipe', 'config')}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**QUIET_ENV, **{k: str(v) for k, v in env_vars.items()}, **os.environ}
    shown_lines = _RanksOnly(sys.stdout)
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                   bufsize=1)
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            if echo:
                shown_lines.write(line)
        code = process.wait()
    if echo:
        shown_lines.close()
    text = log_path.read_text(encoding="utf-8", errors="replace")
    return LaunchResult("local", "SUCCEEDED" if code == 0 else "FAILED", shown, Path(yaml),
                        exit_code=rank_exit_code(text, code), log_path=log_path,
                        first_error=None if code == 0 else first_error_line(text))
