"""The fault drill: a job that is killed, hung, requeued and handed a truncated checkpoint, and must still end where an
uninterrupted run ends (``python -m lcmoe_recipes.launch MODEL --seq N --executor slurm --drill``; docs/launch.md).

What runs: the smoke job (:func:`lcmoe_recipes.jobs.node.smoke`: same launch path, NeMo-Run's ``SlurmExecutor``
with torchrun, 2 CPU ranks on gloo) extended to train. Each rank (:func:`drill_rank`, ``python -m
lcmoe_recipes.train --config YAML --drill SPEC``) trains a small real model -- embedding, two-layer MLP, output
layer, Adam, next-token loss on a deterministic synthetic sequence, gradients all-reduced over gloo -- for the
config's ``train.train_iters`` steps and saves every ``checkpoint.save_interval`` steps into the config's
``checkpoint.save`` (= ``checkpoint.load``, the resume pattern). A restart resumes through
:func:`lcmoe_recipes.jobs.resume.pin_resume`, the same call the training entry script makes before ``pretrain``.

Stand-ins, stated: megatron-bridge's ``pretrain`` needs CUDA (0.6.2 ``training/initialize.py`` refuses NCCL without
a GPU), so the model and loop are ours. The checkpoint is megatron-core 0.19.2's own ``dist_checkpointing.save`` in
the ``torch_dist`` format (PyTorch DCP shards, ``.metadata``, ``metadata.json``), weights and Adam moments as
``ShardedTensor`` s replicated over the data-parallel ranks, then ``train_state.pt`` and the trackers
(``latest_train_state.pt``, ``latest_checkpointed_iteration.txt``) written last, in megatron-bridge 0.6.2's order
(``training/checkpointing.py`` ``save_checkpoint``); the save is synchronous. megatron-core's writer reports its
results through a multiprocessing queue it starts on first use; like megatron-bridge (``training/state.py``
``initialize_async_checkpoint_worker``), the rank starts it up front with the config's
``checkpoint.async_write_results_mp_mode`` (bridge's default ``fork``; megatron-core's own default, ``spawn``,
starts a fresh interpreter: about ten seconds per job start on 2 busy cores). megatron-core's torch_dist writer calls
``torch.cuda.synchronize()`` and broadcasts a flag from ``torch.cuda.current_device()``; on a CPU-only rank those two
answer for the CPU (:func:`_cpu_checkpointing`). A config whose ``checkpoint.ckpt_format`` is not ``torch_dist`` is
drilled with torch_dist, and the drill says so. The heartbeat monitor is ours too (nvidia-resiliency-ext's
``ft_launcher`` is not installable beside megatron-core 0.19.2 here, requirements/light.txt): every rank writes a
heartbeat file each step and a watchdog thread on every rank exits the rank when another's heartbeat is older than
``heartbeat_timeout`` s, so the launcher tears the job down -- what ft_launcher's ``rank_heartbeat_timeout`` does.

Faults (each fires once, marked under ``<drill>/fired/``):

* ``kill``: a rank SIGKILLs itself mid-step (after its backward, before the gradient all-reduce);
* ``hang``: a rank stops mid-step and sends no more heartbeats (its watchdog stands down);
* ``requeue``: the driver cancels the running job and requeues it (``scontrol requeue``) at a step boundary;
* ``truncate``: right after a save completes, rank 0 cuts the newest iteration's largest shard in half and SIGKILLs
  itself: the restart must skip that iteration (:func:`lcmoe_recipes.jobs.resume.incomplete_reason`).

A failed job requeues itself (NeMo-Run's batch script: ``scontrol requeue`` while ``SLURM_RESTART_COUNT`` is under
the executor's ``retries``). Slurm holds a requeued job until the job's credentials have expired (its ``BeginTime``:
``AuthInfo=cred_expire``, 120 s by default; the local test cluster of scripts/slurm_local.sh sets 10 s). Where the
hold is longer than :data:`HOLD_CLEAR_AFTER_S`, the driver clears it once the node has cleaned up (``scontrol update
StartTime=now``), which only shortens the wait.

Nothing is left behind: the job ids are written to ``<folder>/jobs.json`` as they are submitted, and on any error,
timeout, Ctrl-C or SIGTERM the driver cancels the jobs that have not ended (``scancel``), which stops their ranks.

The verdict (:func:`judge`): for each fault, the job restarted, resumed from the newest complete checkpoint at or
before the last completed step, lost at most one save interval, and its loss and parameter checksum after the
resumed step equal the uninterrupted reference run's; the run ends with the reference's final checksum. Printed as
``faults injected N, survived N, steps lost S, corrupt loads 0``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import LcmoeError

DRILL_ITERS = 20
"""Training steps of a drill job (``train.train_iters``): room for four faults and a save between each (our choice)."""
DRILL_SAVE_INTERVAL = 4
"""Steps between saves (``checkpoint.save_interval``): the most steps a fault may cost (our choice)."""
HEARTBEAT_TIMEOUT_S = 8.0
"""Seconds without another rank's heartbeat before a rank gives up: the tiny model's step takes under 0.1 s on 2
cores (measured: at most 0.08 s between two steps' metrics outside a save), so 8 s is a hundred steps of margin for a
rank descheduled by other work on a loaded machine; each second here is a second of the hang fault's cost (our
choice for the drill; a GPU run sizes it from the step: :mod:`lcmoe_recipes.jobs.resilience`)."""
SAVE_TIMEOUT_S = 30.0
"""Seconds a rank may stay silent inside a save (its heartbeat names the ``checkpointing`` section): the first save
imports PyTorch DCP's writer (seconds on 2 busy cores); ft_launcher has a section timeout of its own for it too."""
GLOO_TIMEOUT_S = 60.0
"""torch.distributed's collective timeout on gloo: the backstop behind the heartbeat watchdog."""
HOLD_CLEAR_AFTER_S = 15.0
"""A requeued job's hold (seconds until its ``BeginTime``) longer than this is cleared by the driver once the node is
idle; a shorter one (the local cluster's ``cred_expire``) is left to Slurm."""
ATTEMPT_VAR = "LCMOE_DRILL_ATTEMPT"
"""The attempt number for a local drill (under Slurm, ``SLURM_RESTART_COUNT``)."""


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` (kill, hang, requeue, truncate), the ``step`` it fires at and the ``rank`` that fires it."""

    kind: str
    step: int
    rank: int = 0

    @property
    def name(self) -> str:
        return f"{self.kind}@{self.step}"


DEFAULT_FAULTS = (Fault("kill", 7, 1), Fault("hang", 10, 0), Fault("requeue", 14, 0), Fault("truncate", 16, 0))
"""The drill's faults: a SIGKILL mid-step 7 on rank 1, a hang mid-step 10 on rank 0, a cancel-and-requeue before
step 14, the newest checkpoint (step 16) truncated before the restart."""


@dataclass
class DrillSpec:
    """What every rank of a drill job reads (``--drill SPEC``, JSON): where it saves, how long it trains, the faults.

    Attributes:
        folder: the drill's folder (heartbeats, events, metrics, fired markers); on storage every rank sees.
        save: ``checkpoint.save`` (= ``checkpoint.load``) of the validated config.
        iters, interval: ``train.train_iters`` and ``checkpoint.save_interval``.
        ckpt_format: the config's ``checkpoint.ckpt_format``.
        faults: the faults to fire (none: the reference run).
        heartbeat_timeout: seconds (see :data:`HEARTBEAT_TIMEOUT_S`).
        seed: the model's and the data's seed.
        results_mp_mode: the config's ``checkpoint.async_write_results_mp_mode`` (megatron-bridge 0.6.2's default
            ``fork``): how megatron-core's writer starts its results queue.
    """

    folder: str
    save: str
    iters: int = DRILL_ITERS
    interval: int = DRILL_SAVE_INTERVAL
    ckpt_format: str = "torch_dist"
    faults: list = field(default_factory=list)
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT_S
    seed: int = 1234
    results_mp_mode: str = "fork"

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def read(cls, path: str | Path) -> "DrillSpec":
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise LcmoeError(f"drill spec '{path}' unreadable ({exc})", "start the drill with launch --drill") from None
        raw["faults"] = [Fault(**f) for f in raw.get("faults", [])]
        return cls(**raw)


# ---------------------------------------------------------------------------------------------------------------
# the rank


def _line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _append(path: Path, record: dict) -> None:
    """One JSON line, in one write (O_APPEND), so lines of both ranks and all attempts never interleave. No fsync: a
    killed process loses nothing the kernel has (only a lost machine would), and an fsync stalled by another
    process's I/O must not look like a hang to the heartbeat watchdog."""
    data = (json.dumps({**record, "time": round(time.time(), 3)}) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def attempt_number() -> int:
    """Which start of the job this is: Slurm's ``SLURM_RESTART_COUNT`` (0 at the first start), else
    ``$LCMOE_DRILL_ATTEMPT`` (the local driver sets it), else 0."""
    for var in ("SLURM_RESTART_COUNT", ATTEMPT_VAR):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _cpu_checkpointing() -> None:
    """On a rank without CUDA, megatron-core 0.19.2's torch_dist writer's two CUDA calls answer for the CPU:
    ``torch.cuda.synchronize()`` (``strategies/filesystem_async.py`` ``preload_tensors``: nothing to wait for) and
    ``torch.cuda.current_device()`` (``strategies/state_dict_saver.py``: where its failure flag is broadcast from;
    the CPU under gloo). The files it writes are megatron-core's own."""
    import torch

    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None
        torch.cuda.current_device = lambda: "cpu"


def _die_with_parent(parent: int) -> None:
    """In the results queue's server process: end with the rank (``PR_SET_PDEATHSIG``), so that a SIGKILLed rank's
    server is not left running, reparented away from the job's process tree where Slurm's ``proctrack/linuxproc``
    no longer finds it."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (linux/prctl.h)
    if os.getppid() != parent:  # the rank died before the line above
        os._exit(0)


def _start_results_queue(mp_mode: str) -> None:
    """megatron-core 0.19.2's writer results queue (``strategies/filesystem_async.py`` ``get_write_results_queue``:
    a ``multiprocessing`` manager's ``Queue``), started as megatron-bridge 0.6.2 starts it before the first save
    (``training/state.py``, with ``checkpoint.async_write_results_mp_mode``), its server bound to this rank's life
    (:func:`_die_with_parent`). The queue is set where megatron-core looks for it, as megatron-bridge's
    ``pretrain`` resets it there."""
    import multiprocessing
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:
        manager = SyncManager(ctx=multiprocessing.get_context(mp_mode))
        manager.start(initializer=_die_with_parent, initargs=(os.getpid(),))
        filesystem_async._results_queue = manager.Queue()


VOCAB, DIM, BATCH, SEQ = 64, 32, 8, 16


def _model(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, DIM), torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(),
                               torch.nn.Linear(4 * DIM, DIM), torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, VOCAB))


def _batch(seed: int, step: int, rank: int):
    """Rank ``rank``'s tokens and targets at ``step``: the same on every attempt (seeded by step and rank); the target
    is an affine map of the token, which the model learns (the loss falls)."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 97 + rank)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    return tokens, (tokens * 5 + 3) % VOCAB


def checksum(model) -> str:
    """SHA-1 (16 hex) of every parameter's bytes, in order: equal only for bit-identical weights."""
    digest = hashlib.sha1()
    for p in model.parameters():
        digest.update(p.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _sharded_state(model, optimizer, replica: int, template: bool = False):
    """The model's weights and Adam's moments as megatron-core ``ShardedTensor`` s (whole tensors, replicated over the
    data-parallel ranks: ``replica_id`` = the rank, so rank 0 writes them), Adam's step count as common state."""
    import torch
    from megatron.core.dist_checkpointing import ShardedTensor

    state = {}
    for name, p in model.named_parameters():
        state[f"model.{name}"] = ShardedTensor.from_rank_offsets(f"model.{name}", p.detach(), replica_id=replica)
        moments = optimizer.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            value = torch.zeros_like(p) if template or key not in moments else moments[key]
            state[f"optimizer.{key}.{name}"] = ShardedTensor.from_rank_offsets(f"optimizer.{key}.{name}", value,
                                                                                replica_id=replica)
    first = next(iter(model.parameters()))
    step = optimizer.state.get(first, {}).get("step")
    state["optimizer_step"] = float(step) if step is not None else 0.0
    return state


def _save(spec: DrillSpec, model, optimizer, step: int, rank: int) -> None:
    """Iteration ``step`` as megatron-bridge lays it out: megatron-core's torch_dist save, then (rank 0, after every
    rank is done) ``train_state.pt``, ``latest_train_state.pt`` and the tracker, last."""
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from .resume import TRACKER_PT, TRACKER_TXT, TRAIN_STATE

    folder = Path(spec.save) / f"iter_{step:07d}"
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(_sharded_state(model, optimizer, rank), str(folder))
    dist.barrier()
    if rank == 0:
        train_state = {"step": step, "consumed_train_samples": step * BATCH * dist.get_world_size()}
        torch.save(train_state, folder / TRAIN_STATE)
        torch.save(train_state, Path(spec.save) / TRACKER_PT)
        tmp = Path(spec.save) / (TRACKER_TXT + ".tmp")
        tmp.write_text(str(step))
        os.replace(tmp, Path(spec.save) / TRACKER_TXT)
    dist.barrier()


def _load(folder: str, model, optimizer, rank: int) -> None:
    import torch
    from megatron.core import dist_checkpointing

    loaded = dist_checkpointing.load(_sharded_state(model, optimizer, rank, template=True), folder)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(loaded[f"model.{name}"])
    step = loaded["optimizer_step"]
    if step:
        for name, p in model.named_parameters():
            optimizer.state[p] = {"step": torch.tensor(step), "exp_avg": loaded[f"optimizer.exp_avg.{name}"].clone(),
                                  "exp_avg_sq": loaded[f"optimizer.exp_avg_sq.{name}"].clone()}


class _Heartbeats:
    """Each rank's heartbeat file (``<drill>/heartbeat/rank<R>``: attempt, step, time), written every step and around each save; a
    watchdog thread exits this rank (exit code 1, so the launcher stops the job) when another rank's heartbeat of
    this attempt is older than the timeout (:data:`SAVE_TIMEOUT_S` inside a save)."""

    def __init__(self, spec: DrillSpec, rank: int, world: int, attempt: int) -> None:
        self.folder = Path(spec.folder) / "heartbeat"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rank, self.world, self.attempt, self.timeout = rank, world, attempt, spec.heartbeat_timeout
        self.standing_down = False
        self.events = Path(spec.folder) / "events.jsonl"

    def beat(self, step: int, section: str = "step") -> None:
        path = self.folder / f"rank{self.rank}"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"attempt": self.attempt, "step": step, "section": section, "time": time.time()}))
        os.replace(tmp, path)

    def _stale(self) -> tuple[int, float] | None:
        now = time.time()
        for other in range(self.world):
            if other == self.rank:
                continue
            try:
                beat = json.loads((self.folder / f"rank{other}").read_text())
            except (OSError, ValueError):
                continue
            limit = SAVE_TIMEOUT_S if beat.get("section") == "checkpointing" else self.timeout
            if beat["attempt"] == self.attempt and now - beat["time"] > limit:
                return other, now - beat["time"]
        return None

    def watch(self) -> None:
        def loop() -> None:
            while True:
                time.sleep(0.25)
                if self.standing_down:
                    continue
                if found := self._stale():
                    other, age = found
                    _append(self.events, {"event": "heartbeat_timeout", "attempt": self.attempt, "rank": self.rank,
                                          "silent_rank": other, "seconds": round(age, 1)})
                    _line(f"drill: rank {self.rank}: rank {other} sent no heartbeat for {age:.1f} s (timeout "
                          f"{self.timeout:g} s): stopping so the launcher restarts the job")
                    os._exit(1)

        threading.Thread(target=loop, daemon=True, name="heartbeat-watchdog").start()


def _fire(spec: DrillSpec, fault: Fault, attempt: int, last_step: int) -> bool:
    """Whether ``fault`` fires now (once per drill: its marker under ``<drill>/fired/`` is created first)."""
    marker = Path(spec.folder) / "fired" / fault.name
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    _append(Path(spec.folder) / "events.jsonl", {"event": "fault", "fault": fault.kind, "step": fault.step,
                                                 "rank": fault.rank, "attempt": attempt, "last_step": last_step})
    return True


def _truncate_newest(spec: DrillSpec, step: int) -> str:
    folder = Path(spec.save) / f"iter_{step:07d}"
    shard = max(folder.glob("*.distcp"), key=lambda p: p.stat().st_size)
    size = shard.stat().st_size
    with open(shard, "r+b") as handle:
        handle.truncate(size // 2)
    return f"{shard.name} {size} -> {size // 2} bytes"


def drill_rank(spec_path: str | Path) -> int:
    """One rank of a drill job (started by torchrun): gloo from torchrun's variables, resume from the newest complete
    checkpoint, train, save, fire this rank's faults. Returns 0 when it trained to the end.

    Raises:
        LcmoeError: the spec is unreadable, saves exist but none is complete (:func:`lcmoe_recipes.jobs.resume.pin_resume`).
    """
    import datetime
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    from .resume import incomplete_reason, pin_resume

    spec = DrillSpec.read(spec_path)
    attempt = attempt_number()
    torch.set_num_threads(1)
    _cpu_checkpointing()
    _start_results_queue(spec.results_mp_mode)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    events = Path(spec.folder) / "events.jsonl"
    log = _line if rank == 0 else (lambda _text: None)
    if rank == 0 and spec.ckpt_format != "torch_dist":
        _line(f"drill: checkpoint.ckpt_format {spec.ckpt_format} is not drilled on the CPU; torch_dist stands in")
    model = _model(spec.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ckpt = SimpleNamespace(checkpoint=SimpleNamespace(load=spec.save, save=spec.save, ckpt_step=None))
    Path(spec.save).mkdir(parents=True, exist_ok=True)
    resume = pin_resume(ckpt, log=log)  # the call the training entry script makes before pretrain
    start = 0
    if resume is not None and resume.iteration is not None:
        start = ckpt.checkpoint.ckpt_step or resume.iteration
        folder = str(Path(spec.save) / f"iter_{start:07d}")
        corrupt = incomplete_reason(folder)  # judged again at the moment of loading
        _load(folder, model, optimizer, rank)
        if rank == 0:
            _append(events, {"event": "resume", "attempt": attempt, "iteration": start, "corrupt": corrupt,
                             "skipped": [[Path(f).name, why] for f, why in resume.skipped]})
    elif rank == 0:
        _append(events, {"event": "start", "attempt": attempt})
    beats = _Heartbeats(spec, rank, world, attempt)
    beats.beat(start)
    dist.barrier()
    beats.watch()
    mine = {f.kind: f for f in spec.faults if f.rank == rank or f.kind in ("requeue",)}
    loss_fn = torch.nn.CrossEntropyLoss()
    metrics = Path(spec.folder) / "metrics.jsonl"
    for step in range(start + 1, spec.iters + 1):
        beats.beat(step)
        if (f := mine.get("requeue")) and f.step == step and not (Path(spec.folder) / "fired" / f.name).exists():
            # a step boundary where the driver cancels and requeues the job: wait for it (heartbeating)
            if rank == 0:
                _append(events, {"event": "waiting_for_requeue", "attempt": attempt, "step": step})
            deadline = time.time() + GLOO_TIMEOUT_S
            while time.time() < deadline:
                beats.beat(step)
                time.sleep(0.2)
            raise LcmoeError(f"the drill driver did not requeue the job at step {step} within {GLOO_TIMEOUT_S:g} s",
                             "run the drill through launch --drill, which requeues it")
        tokens, targets = _batch(spec.seed, step, rank)
        loss = loss_fn(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        if (f := mine.get("kill")) and f.step == step and _fire(spec, f, attempt, step - 1):
            os.kill(os.getpid(), signal.SIGKILL)  # mid-step: gradients computed, not yet all-reduced
        if (f := mine.get("hang")) and f.step == step and _fire(spec, f, attempt, step - 1):
            beats.standing_down = True  # the whole rank stops: no heartbeat, no watchdog, no collective
            while True:
                time.sleep(1)
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        mean = torch.tensor([loss.item()])
        dist.all_reduce(mean)
        if rank == 0:
            _append(metrics, {"attempt": attempt, "step": step, "loss": mean.item() / world,
                              "checksum": checksum(model)})
        if step % spec.interval == 0 or step == spec.iters:
            beats.beat(step, "checkpointing")
            _save(spec, model, optimizer, step, rank)
            beats.beat(step)
            log(f"drill: saved iteration {step}")
            if (f := mine.get("truncate")) and f.step == step and _fire(spec, f, attempt, step):
                _line(f"drill: truncated {_truncate_newest(spec, step)}; rank {rank} exits (SIGKILL)")
                os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    if rank == 0:
        _append(events, {"event": "finished", "attempt": attempt, "checksum": checksum(model)})
        _line(f"drill: trained {spec.iters} steps, checksum {checksum(model)}")
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------------------------------------------
# the verdict


def _records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class FaultOutcome:
    """What one fault did: the step it left off at, the iteration the next attempt resumed from, the steps lost, and
    whether the resumed step's loss and checksum equal the reference's."""

    fault: str
    last_step: int
    resumed: int | None
    lost: int | None
    matches: bool
    skipped: list
    survived: bool
    why: str = ""


@dataclass
class Verdict:
    """The drill's result: one :class:`FaultOutcome` per fault; ``finished``: the run reached the last step with the
    reference's checksum; ``corrupt_loads``: attempts that loaded an incomplete iteration."""

    outcomes: list
    finished: bool
    corrupt_loads: int
    seconds: float = 0.0
    notes: list = field(default_factory=list)

    @property
    def injected(self) -> int:
        return len(self.outcomes)

    @property
    def survived(self) -> int:
        return sum(o.survived for o in self.outcomes)

    @property
    def steps_lost(self) -> int:
        return sum(o.lost or 0 for o in self.outcomes)

    @property
    def ok(self) -> bool:
        return self.finished and self.survived == self.injected and self.corrupt_loads == 0

    def line(self) -> str:
        return (f"faults injected {self.injected}, survived {self.survived}, steps lost {self.steps_lost}, "
                f"corrupt loads {self.corrupt_loads}")

    def text(self) -> str:
        rows = [f"  {o.fault}: left off after step {o.last_step}, resumed from "
                f"{'nothing' if o.resumed is None else o.resumed}, lost {o.lost} step(s); "
                + ("loss and checksum equal the reference's" if o.matches else "DIFFERS from the reference")
                + "".join(f"; skipped {name} ({why})" for name, why in o.skipped)
                + ("" if o.survived else f"; NOT SURVIVED: {o.why}") for o in self.outcomes]
        rows += [f"  note: {n}" for n in self.notes]
        return "\n".join(rows + [self.line()])


def judge(reference: Path, run: Path, interval: int, iters: int) -> Verdict:
    """Compare the faulted run in ``run`` with the uninterrupted ``reference`` (two drill folders)."""
    ref = {m["step"]: m for m in _records(reference / "metrics.jsonl")}
    metrics = _records(run / "metrics.jsonl")
    events = _records(run / "events.jsonl")
    faults = [e for e in events if e["event"] == "fault"]
    starts = {e["attempt"]: e for e in events if e["event"] in ("resume", "start")}
    outcomes = []
    for fault in sorted(faults, key=lambda e: e["attempt"]):
        done = [m["step"] for m in metrics if m["attempt"] == fault["attempt"]]
        last = max(done + [fault["last_step"]])
        nxt = starts.get(fault["attempt"] + 1)
        name = f"{fault['fault']}@{fault['step']} (rank {fault['rank']})"
        if nxt is None:
            outcomes.append(FaultOutcome(name, last, None, None, False, [], False, "the job did not start again"))
            continue
        resumed = nxt.get("iteration", 0)
        lost = last - resumed
        after = next((m for m in metrics if m["attempt"] == fault["attempt"] + 1 and m["step"] == resumed + 1), None)
        matches = bool(after) and after["loss"] == ref.get(resumed + 1, {}).get("loss") and \
            after["checksum"] == ref.get(resumed + 1, {}).get("checksum")
        why = []
        if lost > interval:
            why.append(f"{lost} steps lost, more than the save interval {interval}")
        if not matches:
            why.append(f"step {resumed + 1} after the resume differs from the reference")
        if nxt.get("corrupt"):
            why.append(f"loaded an incomplete iteration ({nxt['corrupt']})")
        outcomes.append(FaultOutcome(name, last, resumed, lost, matches, nxt.get("skipped", []), not why,
                                     "; ".join(why)))
    finished = next((e for e in events if e["event"] == "finished"), None)
    ref_end = ref.get(iters, {}).get("checksum")
    ok_end = finished is not None and ref_end is not None and finished["checksum"] == ref_end
    corrupt = sum(1 for e in events if e["event"] == "resume" and e.get("corrupt"))
    notes = [] if ok_end else [f"the run did not end with the reference's checksum ({ref_end})"]
    return Verdict(outcomes, ok_end, corrupt, notes=notes)


# ---------------------------------------------------------------------------------------------------------------
# the driver


def _job(job_id: str) -> dict:
    """The controller's view of a job (``scontrol show job -o``: JobState, Reason, BeginTime, ...), ``{}`` once the
    controller has forgotten it (``MinJobAge`` after its end)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        return {}
    return dict(field.split("=", 1) for field in out.stdout.split() if "=" in field)


def _job_state(job_id: str) -> tuple[str, float | None]:
    """(state, seconds until its BeginTime when it waits for it, else None): the controller's, else the accounting
    database's (``sacct``) for a job the controller has forgotten. The controller first: it answers while slurmdbd
    is slow or down."""
    job = _job(job_id)
    if job:
        wait = None
        if job.get("Reason") == "BeginTime" and job.get("BeginTime", "").startswith("2"):
            import datetime

            begin = datetime.datetime.fromisoformat(job["BeginTime"]).timestamp()
            wait = begin - time.time()
        return job.get("JobState", ""), wait
    out = subprocess.run(["sacct", "-j", job_id, "-n", "-X", "-P", "-o", "State"], capture_output=True, text=True,
                         timeout=30)
    return (out.stdout.strip().splitlines() or [""])[0].split(" ")[0], None


def _node_completing() -> bool:
    """Whether the node is still cleaning up a job instance (a start before it is done is refused by slurmd: "job
    credential revoked")."""
    out = subprocess.run(["scontrol", "show", "node", "-o"], capture_output=True, text=True, timeout=30)
    return out.returncode != 0 or "COMPLETING" in out.stdout


def _submit(one, settings, spec_path: Path, retries: int) -> tuple[str, object]:
    """One drill job through the launch path: NeMo-Run's SlurmExecutor, torchrun with 2 CPU ranks running
    ``lcmoe_recipes.train --drill SPEC``, ``retries`` requeues on failure. Returns (job id, its LaunchResult)."""
    from .executors.common import train_arguments
    from .executors.slurm import run_slurm

    args = ["--drill", str(spec_path)] + train_arguments(overrides=one.job.overrides if one.job else ())
    result = run_slurm(one.output, one.meta, dict(one.cfg.env_vars or {}), settings, smoke=True, wait=False,
                       train_args=args, retries=retries)
    if not result.job_id:
        raise LcmoeError(f"the drill job was not submitted: {result.summary()}", "see the sbatch error above")
    return result.job_id, result


FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL")


def _watch(jobs: dict, requeue: tuple | None, deadline: float, echo, states: dict) -> list[str]:
    """Watch the submitted ``jobs`` ({name: job id}) to their ends, filling ``states`` ({name: final state}): clear
    a requeued job's hold when it is longer than :data:`HOLD_CLEAR_AFTER_S` once the node has cleaned up, and
    cancel-and-requeue (``scontrol requeue``) the job named in ``requeue`` (name, fault, drill folder) when its ranks
    wait at the fault's step. Returns notes for the verdict.

    Raises:
        LcmoeError: the jobs did not end by ``deadline`` (the caller cancels them)."""
    notes, held = [], {}
    while len(states) < len(jobs) and time.time() < deadline:
        for name, job in jobs.items():
            if name in states:
                continue
            state, wait = _job_state(job)
            if state in FINAL_STATES:
                states[name] = state
                echo(f"drill: {name} job {job}: {state}")
                continue
            if wait is not None and wait > HOLD_CLEAR_AFTER_S:
                held.setdefault(job, time.time())
                if time.time() - held[job] > 0.5 and not _node_completing():
                    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True,
                                   timeout=30)
                    notes.append(f"Slurm's hold on each requeued job ({wait:.0f} s left: AuthInfo=cred_expire) was "
                                 "cleared once the node had cleaned up (scontrol update StartTime=now)")
                    held.pop(job)
        if requeue is not None:
            name, fault, folder = requeue
            events = folder / "events.jsonl"
            if any(e["event"] == "waiting_for_requeue" for e in _records(events)):
                _append(events, {"event": "fault", "fault": "requeue", "step": fault.step, "rank": fault.rank,
                                 "attempt": attempt_of(events), "last_step": fault.step - 1, "time": time.time()})
                (folder / "fired").mkdir(exist_ok=True)
                (folder / "fired" / fault.name).touch()
                subprocess.run(["scontrol", "requeue", jobs[name]], check=True, capture_output=True, timeout=30)
                requeue = None
        time.sleep(0.25)
    if len(states) < len(jobs):
        raise LcmoeError(f"the drill jobs did not finish in time ({', '.join(f'{n} {j}' for n, j in jobs.items())}; "
                         "cancelled)", "see the jobs' logs; the drill needs an idle Slurm node with 2 CPUs")
    return notes


def cancel_jobs(job_ids, echo=print) -> list[str]:
    """Cancel those of ``job_ids`` Slurm still runs or holds (``scancel``: Slurm stops every process of the job,
    its ranks included), and wait up to 30 s for them to leave the node. Returns the ids cancelled."""
    alive = [j for j in job_ids if _job_state(j)[0] not in FINAL_STATES + ("",)]
    if not alive:
        return []
    subprocess.run(["scancel", *alive], capture_output=True, timeout=30)
    echo(f"drill: cancelled job(s) {', '.join(alive)}")
    end = time.time() + 30
    while time.time() < end and any(_job_state(j)[0] in ("RUNNING", "COMPLETING", "PENDING", "REQUEUED",
                                                         "CONFIGURING", "SUSPENDED") for j in alive):
        time.sleep(0.5)
    return alive


class _Terminated(LcmoeError):
    """SIGTERM reached the driver (a CI timeout, ``kill``): unwinds it so that its jobs are cancelled."""


def _on_sigterm(signum, frame):
    raise _Terminated(f"the drill was stopped (signal {signum}); its Slurm jobs were cancelled",
                      "run it again on an idle node")


def attempt_of(events: Path) -> int:
    """The attempt now running, from the events written so far."""
    return max((e["attempt"] for e in _records(events) if e["event"] in ("start", "resume")), default=0)


def run_drill(one, settings, folder: str | Path, faults=DEFAULT_FAULTS, iters: int = DRILL_ITERS,
              interval: int = DRILL_SAVE_INTERVAL, timeout_s: float = 600.0, echo=print) -> Verdict:
    """The drill for a prepared config (``launch --drill``): an uninterrupted reference job and the faulted job, side
    by side (one CPU each), through NeMo-Run's SlurmExecutor with 2 ranks each; returns the :class:`Verdict`.

    Args:
        one: :class:`lcmoe_recipes.jobs.prepare.Configured` (validated for its target; its checkpoint format is
            drilled).
        settings: :class:`lcmoe_recipes.jobs.executors.slurm.SlurmSettings`.
        folder: a folder every rank sees; ``ref/`` and ``run/`` (each with its ``checkpoints/``) go under it.
        faults: what to inject (:data:`DEFAULT_FAULTS`); each must fire after the previous one's restart.
        iters, interval: training steps and steps between saves.
        timeout_s: seconds for both jobs together.

    The job ids go to ``<folder>/jobs.json`` as they are submitted; on an error, a timeout, Ctrl-C or SIGTERM the
    jobs that have not ended are cancelled (:func:`cancel_jobs`) before the error is raised again.

    Raises:
        LcmoeError: a job was refused, ended other than COMPLETED, or did not end within ``timeout_s`` seconds.
    """
    import shutil

    start = time.time()
    folder = Path(folder).resolve()
    jobs, requeue, states = {}, None, {}
    mp_mode = str(getattr(one.cfg.checkpoint, "async_write_results_mp_mode", None) or "fork")
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        for name, these in (("reference", []), ("faulted", list(faults))):
            where = folder / name
            if where.exists():
                shutil.rmtree(where)
            where.mkdir(parents=True)
            spec = DrillSpec(folder=str(where), save=str(where / "checkpoints"), iters=iters, interval=interval,
                             ckpt_format=str(one.cfg.checkpoint.ckpt_format), faults=[asdict(f) for f in these],
                             results_mp_mode=mp_mode)
            jobs[name], _ = _submit(one, settings, spec.write(where / "spec.json"), len(these) + 1)
            (folder / "jobs.json").write_text(json.dumps(jobs))
            if fault := next((f for f in these if f.kind == "requeue"), None):
                requeue = (name, fault, where)
        notes = _watch(jobs, requeue, start + timeout_s, echo, states)
    except (Exception, KeyboardInterrupt):
        cancel_jobs([job for name, job in jobs.items() if name not in states], echo)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    for name, state in states.items():
        if state != "COMPLETED":
            raise LcmoeError(f"the drill's {name} job {jobs[name]} ended {state}",
                             f"see its log (NeMo-Run's job folder) and {folder / name}/events.jsonl")
    verdict = judge(folder / "reference", folder / "faulted", interval, iters)
    verdict.seconds = time.time() - start
    verdict.notes += sorted(set(notes))
    return verdict
