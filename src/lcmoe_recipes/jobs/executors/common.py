"""What every executor shares: the result of a launch (:class:`LaunchResult`), nodes for a world size, the options of
the entry script each rank runs (:func:`train_arguments`), and the first error line of a job's log with its fix.

Both executors run :mod:`lcmoe_recipes.train` on every rank. GPUs per node always come from the hardware catalogue (8
on HGX H100/H200/B200, 4 per GB200/GB300 tray): the plan's placement checks and the dispatcher's NVLink-domain settings
assume them.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import LcmoeError


EXECUTORS = ("local", "slurm", "kubeflow")


# LOGLEVEL: torch-elastic's agent (NeMo-Run sets INFO, which buries the ranks' lines); OMP_NUM_THREADS=1 is torchrun's
# own default, set here so it does not print its banner. The recipe's env_vars and --env win over both.
QUIET_ENV = {"LOGLEVEL": "WARNING", "OMP_NUM_THREADS": "1"}


PACKAGE_DIR = Path(__file__).resolve().parents[2]  # the lcmoe_recipes package folder, shipped with every job


_ERROR_LINE = re.compile(r"^(error: |[\w.]*(Error|Exception)\b:|(sbatch|srun|slurmstepd|salloc): "
                         r"(error|fatal|unrecognized|invalid)|RuntimeError)", flags=re.I)


_RANK_PREFIX = re.compile(r"^\[(default|rank)\d+\]:")


@dataclass
class LaunchResult:
    """What a launch did.

    Attributes:
        executor: ``local`` or ``slurm``.
        state: ``DRY_RUN``, ``SUBMITTED`` (not waited for), ``SUCCEEDED``, ``FAILED``, ``CANCELLED``, ``TIMEOUT``...
        command: the torchrun command (local) or the sbatch command line (slurm).
        yaml: the ConfigContainer YAML the ranks read.
        script: the sbatch script (slurm), else None.
        job_id: Slurm job id (slurm, once submitted).
        exit_code: the job's exit code, when known.
        log_path: the log of the ranks' output (a submitted job not waited for: the folder its logs will be in).
        first_error: the first error line in that log (``error: ...``, ``XxxError: ...``, ``srun: error: ...``).
        experiment_id: NeMo-Run experiment id (``nemo experiment logs ID 0`` reads it again).
        notes: what the launch decided or warns about (the exit duration from ``--time``, the job folder rule,
            unmounted paths that may be inside the image, saves in the job folder).
    """

    executor: str
    state: str
    command: str
    yaml: Path
    script: str | None = None
    job_id: str | None = None
    exit_code: int | None = None
    log_path: Path | None = None
    first_error: str | None = None
    experiment_id: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True for a dry run, a submitted job, and a job that succeeded."""
        return self.state in ("DRY_RUN", "SUBMITTED", "SUCCEEDED")

    def summary(self) -> str:
        """A few lines for people: state, job id, log, first error."""
        head = f"{self.executor}: {self.state}"
        if self.job_id:
            head += f" (Slurm job {self.job_id})"
        if self.exit_code is not None:
            head += f", exit code {self.exit_code}"
        lines = [head]
        if self.log_path and self.state == "SUBMITTED":
            lines.append(f"  logs (once it runs): {self.log_path}/")
        elif self.log_path:
            lines.append(f"  log: {self.log_path}")
        if self.first_error:
            lines.append(f"  first error: {self.first_error}")
            if hint := hint_for(self.first_error):
                lines.append(f"  fix: {hint}")
        if self.experiment_id:
            nemo = Path(sys.executable).parent / "nemo"
            lines.append(f"  NeMo-Run experiment: {self.experiment_id} ({nemo} experiment logs {self.experiment_id} 0)")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def nodes_for(world_size: int, gpus_per_node: int) -> int:
    """Nodes for ``world_size`` GPUs.

    Raises:
        LcmoeError: ``world_size`` does not fill whole nodes (names the nearest GPU counts that do).
    """
    if world_size % gpus_per_node:
        lower = world_size - world_size % gpus_per_node
        raise LcmoeError(f"{world_size} GPUs do not fill whole nodes of {gpus_per_node}",
                         f"use {lower} or {lower + gpus_per_node} GPUs" if lower else
                         f"use {gpus_per_node} GPUs (one whole node)")
    return world_size // gpus_per_node


_HINTS = (
    ("--container-image", "this cluster's srun has no Pyxis/enroot: drop --container-image and run this virtualenv "
                          "from a shared filesystem, or use a cluster with Pyxis"),
    ("OutOfMemoryError", "the ranks ran out of GPU memory: compare with the predicted peak (launch --explain), then "
                         "raise recompute, CP or PP, or turn on optimizer CPU offload"),
    ("ranks but the config was planned", "launch the planned number of GPUs, or pass --replan"),
    ("no GPU on this rank", "the job's nodes have no GPU visible: check --partition and the cluster's GPU (gres) setup"),
    ("No module named 'lcmoe_recipes'", "the ranks did not find the job's code: the job folder must be on a filesystem "
                                        "every node sees (--job-dir on shared storage)"),
    ("this config was built and validated with", "run it where the versions match (--container-image), or rebuild "
                                                 "the config there"),
)


def hint_for(error_line: str | None) -> str | None:
    """A fix for the first error lines we know (Pyxis missing, CUDA OOM, world-size refusal, no GPU), else None."""
    return next((fix for key, fix in _HINTS if error_line and key in error_line), None)


def first_error_line(text: str) -> str | None:
    """The first line of ``text`` that reports an error (rank prefixes such as ``[default0]:`` removed)."""
    for raw in text.splitlines():
        line = _RANK_PREFIX.sub("", raw).strip()
        if _ERROR_LINE.match(line):
            return line
    return None


def train_arguments(smoke: bool = False, replan: bool = False, data_path=None,
                    tokenizer: str | None = None, save_dir: str | None = None,
                    overrides: list[str] = ()) -> list[str]:
    """Options of ``python -m lcmoe_recipes.train`` after ``--config YAML`` (see
    :func:`lcmoe_recipes.cli.train.rank_arguments`), then Hydra ``overrides`` (e.g. the job's exit duration)."""
    args = []
    if data_path:
        args += ["--data-path", *data_path]
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    if save_dir:
        args += ["--save-dir", save_dir]
    if replan:
        args.append("--replan")
    if smoke:
        args.append("--smoke")
    return args + list(overrides)


@contextlib.contextmanager
def _nemo_run_session():
    """While NeMo-Run submits: its rich console is silent (we print our own lines), and the shell commands it runs
    through invoke read /dev/null, not our stdin (a pipe or a test runner's captured stdin would break them)."""
    from nemo_run.core.frontend.console.api import CONSOLE

    was_quiet, stdin = CONSOLE.quiet, sys.stdin
    CONSOLE.quiet = True
    with open(os.devnull, encoding="utf-8") as devnull:
        sys.stdin = devnull
        try:
            yield
        finally:
            CONSOLE.quiet, sys.stdin = was_quiet, stdin
