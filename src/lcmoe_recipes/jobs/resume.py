"""Resume from the latest *complete* checkpoint: what a restarted or requeued job loads.

A job saves into ``checkpoint.save`` and loads from ``checkpoint.load``, the same folder (the resume pattern,
:mod:`lcmoe_recipes.emit.settings`). megatron-bridge loads the iteration its tracker names; a crash or a kill during a
save can leave that iteration half-written, or a file system can truncate a shard. Before ``pretrain`` every rank
runs :func:`choose_resume` on the shared folder (the same files, so the same answer on every rank, no collective) and,
when the newest iteration is not complete, pins the load to the newest one that is (``checkpoint.ckpt_step``, which
megatron-bridge 0.6.2 validates and loads, ``training/checkpointing.py`` ``_get_checkpoint_iteration``), logging
why.

Completeness is judged by the markers megatron writes, in the order it writes them (megatron-bridge 0.6.2
``training/checkpointing.py`` ``save_checkpoint``; megatron-core 0.19.2 ``dist_checkpointing``):

1. the shards; for the ``torch_dist`` format, PyTorch Distributed Checkpoint's ``.metadata``, written by the
   coordinator after every rank's shard, listing each tensor's file, offset and length (the non-sharded state is
   one of them: ``serialization.py`` saves it as the ``common_state`` object; the separate ``common.pt`` of older
   checkpoints, ``strategies/common.py``, is no longer written): every listed file must exist and hold at least
   offset + length bytes (a truncated shard fails here);
2. ``metadata.json`` in ``iter_N`` -- megatron-core's checkpoint format (``core.py`` ``CONFIG_FNAME``), written by rank 0
   in ``metadata_finalize_fn`` once the sharded save is done;
3. last, once the data is durable (``train_state_finalize_fn``, after the asynchronous write for ``async_save``):
   ``iter_N/train_state.pt``, then ``latest_train_state.pt`` and ``latest_checkpointed_iteration.txt`` in the save
   folder. An iteration without ``train_state.pt``, or newer than the tracker, was never finished.

Non-persistent (overwritten) saves live in ``<save>/non_persistent`` with the same markers; megatron-bridge loads
them when newer than the persistent ones, so they are judged the same way (:func:`choose_resume` looks in both).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

ITER = re.compile(r"^iter_(\d{7})$")
TRACKER_TXT = "latest_checkpointed_iteration.txt"
TRACKER_PT = "latest_train_state.pt"
TRAIN_STATE = "train_state.pt"
CONFIG_FNAME = "metadata.json"  # megatron-core 0.19.2 dist_checkpointing/core.py
COMMON_FNAME = "common.pt"  # megatron-core dist_checkpointing/strategies/common.py (older checkpoints only)
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint FileSystemWriter's global metadata


def incomplete_reason(folder: str | Path) -> str | None:
    """Why the iteration folder ``folder`` is not a complete megatron checkpoint (None: complete). See the module
    doc for the markers and their order."""
    import json

    folder = Path(folder)
    if not folder.is_dir():
        return f"{folder} does not exist"
    if not (folder / TRAIN_STATE).is_file():
        return f"{TRAIN_STATE} missing: the save never finished (megatron-bridge writes it last)"
    config = folder / CONFIG_FNAME
    if not config.is_file():
        return f"{CONFIG_FNAME} missing (megatron-core writes it once the sharded save is done)"
    try:
        backend = json.loads(config.read_text()).get("sharded_backend")
    except (OSError, ValueError) as exc:
        return f"{CONFIG_FNAME} unreadable ({exc})"
    if (folder / COMMON_FNAME).is_file() and (folder / COMMON_FNAME).stat().st_size == 0:
        return f"{COMMON_FNAME} empty"  # an older checkpoint's non-sharded state
    if backend == "torch_dist":
        return _dcp_problem(folder)
    return None


def _dcp_problem(folder: Path) -> str | None:
    """A torch_dist iteration: PyTorch DCP's ``.metadata`` readable, every shard it lists long enough."""
    meta = folder / DCP_METADATA
    if not meta.is_file() or meta.stat().st_size == 0:
        return f"{DCP_METADATA} missing or empty (PyTorch DCP writes it after every shard)"
    try:
        from torch.distributed.checkpoint import FileSystemReader

        metadata = FileSystemReader(str(folder)).read_metadata()
    except Exception as exc:  # a truncated or garbled pickle: any unpickling error
        return f"{DCP_METADATA} unreadable ({type(exc).__name__}: {exc})"
    need: dict[str, int] = {}
    for item in (metadata.storage_data or {}).values():
        end = int(item.offset) + int(item.length)
        need[item.relative_path] = max(need.get(item.relative_path, 0), end)
    for name, end in sorted(need.items()):
        path = folder / name
        if not path.is_file():
            return f"shard {name} missing"
        size = path.stat().st_size
        if size < end:
            return f"shard {name} truncated: {size} bytes, {end} listed in {DCP_METADATA}"
    return None


def tracker_iteration(save_dir: str | Path) -> int | None:
    """The iteration the tracker of ``save_dir`` names (``latest_checkpointed_iteration.txt``), or None."""
    path = Path(save_dir) / TRACKER_TXT
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


@dataclass
class Resume:
    """What a restart loads: ``iteration`` (None: nothing complete, or nothing saved yet) in ``folder``; ``latest``:
    the newest iteration on disk; ``skipped``: (folder, reason) of every newer one that is not complete."""

    iteration: int | None
    folder: str | None
    latest: int | None
    skipped: list = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"resume: skipped {f}: {why}" for f, why in self.skipped]
        if self.iteration is not None:
            out.append(f"resume: iteration {self.iteration} from {self.folder} (complete)")
        elif self.skipped:
            out.append("resume: no complete checkpoint left")
        return out


def _iterations(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted((int(m.group(1)) for p in folder.iterdir() if (m := ITER.match(p.name))), reverse=True)


def choose_resume(save_dir: str | Path) -> Resume:
    """The newest complete checkpoint under ``save_dir`` (its ``iter_*`` folders and those of
    ``non_persistent/``), newest first; every newer incomplete one with its reason."""
    save_dir = Path(save_dir)
    candidates = []
    for base in (save_dir, save_dir / "non_persistent"):
        tracked = tracker_iteration(base)
        for it in _iterations(base):
            candidates.append((it, base, tracked))
    candidates.sort(key=lambda c: c[0], reverse=True)
    latest = candidates[0][0] if candidates else None
    skipped = []
    for it, base, tracked in candidates:
        folder = base / f"iter_{it:07d}"
        why = incomplete_reason(folder)
        if why is None and tracked is not None and it > tracked:
            why = f"newer than the tracker ({TRACKER_TXT} says {tracked}): the save never finished"
        if why is None:
            return Resume(it, str(folder), latest, skipped)
        skipped.append((str(folder), why))
    return Resume(None, None, latest, skipped)


def pin_resume(cfg, log=print) -> Resume | None:
    """Before ``pretrain``: when ``cfg`` resumes from its own saves (``checkpoint.load`` = ``checkpoint.save``) and the
    newest saved iteration is incomplete, load the newest complete one instead (``checkpoint.ckpt_step``), logging
    each skipped folder and why. Returns what was chosen (None: nothing saved yet, or load is another folder).

    Raises:
        LcmoeError: saves exist but none is complete (starting over silently would lose the run).
    """
    from ..errors import LcmoeError

    ckpt = cfg.checkpoint
    if not ckpt.load or str(ckpt.load) != str(ckpt.save or "") or not os.path.isdir(str(ckpt.load)):
        return None
    if getattr(ckpt, "ckpt_step", None) is not None:
        return None  # the user chose the iteration
    res = choose_resume(ckpt.load)
    for line in res.lines():
        log(line)
    if res.latest is None:
        return res
    if res.iteration is None:
        raise LcmoeError(f"{ckpt.load} holds checkpoints but none is complete: "
                         + "; ".join(f"{f}: {why}" for f, why in res.skipped),
                         "restore a complete iteration folder, or move the folder aside to start over")
    if res.skipped:
        # checkpoint.ckpt_step names a persistent iteration (megatron-bridge 0.6.2 _get_checkpoint_iteration): pin
        # the newest complete persistent one (a newer complete non-persistent one cannot be named; logged)
        persistent = choose_resume_persistent(Path(str(ckpt.load)))
        if persistent is None:
            raise LcmoeError(f"{ckpt.load}: the newest checkpoints are incomplete and no complete persistent "
                             "iteration is left to pin with checkpoint.ckpt_step",
                             "restore a complete iteration folder, or move the folder aside to start over")
        if persistent != res.iteration:
            log(f"resume: pinning persistent iteration {persistent} (checkpoint.ckpt_step), the newest complete "
                f"one megatron-bridge can be told to load; {res.folder} is newer but non-persistent")
        ckpt.ckpt_step = persistent
    return res


def choose_resume_persistent(save_dir: Path) -> int | None:
    """The newest complete persistent iteration of ``save_dir`` (no newer than its tracker), or None."""
    tracked = tracker_iteration(save_dir)
    for it in _iterations(save_dir):
        if (tracked is None or it <= tracked) and incomplete_reason(save_dir / f"iter_{it:07d}") is None:
            return it
    return None
