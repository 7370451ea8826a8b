"""Resume from the latest complete checkpoint (lcmoe_recipes.jobs.resume), on checkpoints megatron-core's own
dist-checkpointing writes (torch_dist format, one gloo rank on the CPU): a truncated shard, a save that never wrote its
train_state.pt and an iteration newer than the tracker are skipped with their reason, and the load is pinned to the
newest complete iteration (checkpoint.ckpt_step)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def gloo():
    """One gloo rank. megatron-core 0.19.2's torch_dist writer is written for GPUs: it calls torch.cuda.synchronize()
    before copying the tensors (strategies/filesystem_async.py preload_tensors) and broadcasts its failure flag from
    torch.cuda.current_device() (strategies/state_dict_saver.py save_state_dict_async_finalize). On a CPU-only machine
    there is nothing to wait for and the flag lives on the CPU, so those two calls answer for the CPU here; the
    files written are megatron-core's own."""
    import torch.distributed as dist

    mp = pytest.MonkeyPatch()
    if not torch.cuda.is_available():
        mp.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
        mp.setattr(torch.cuda, "current_device", lambda: "cpu")

    ours = not dist.is_initialized()
    if ours:
        mp.setenv("MASTER_ADDR", "127.0.0.1")
        mp.setenv("MASTER_PORT", "29671")
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    if ours:  # later tests fake other world sizes (target validation reads torch.distributed's when it is up)
        dist.destroy_process_group()
    mp.undo()


def save_iteration(save_dir, step: int, value: float) -> None:
    """One iteration as megatron-bridge lays it out: megatron-core's dist_checkpointing.save (PyTorch DCP's shard
    and .metadata, then metadata.json), then train_state.pt and the trackers, written last."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor

    folder = save_dir / f"iter_{step:07d}"
    folder.mkdir(parents=True)
    weight = torch.full((64, 32), value)
    state = {"weight": ShardedTensor.from_rank_offsets("weight", weight), "iteration": step}
    dist_checkpointing.save(state, str(folder))
    torch.save({"step": step}, folder / "train_state.pt")
    (save_dir / "latest_checkpointed_iteration.txt").write_text(str(step))


def test_a_truncated_or_unfinished_latest_checkpoint_is_skipped(gloo, tmp_path):
    from lcmoe_recipes.jobs.resume import choose_resume, incomplete_reason, pin_resume

    save = tmp_path / "checkpoints"
    for step, value in ((10, 1.0), (20, 2.0), (30, 3.0)):
        save_iteration(save, step, value)
    names = sorted(p.name for p in (save / "iter_0000030").iterdir())
    assert {"metadata.json", ".metadata", "train_state.pt"} <= set(names)
    assert incomplete_reason(save / "iter_0000030") is None
    assert choose_resume(save).iteration == 30 and choose_resume(save).skipped == []

    shard = next((save / "iter_0000030").glob("*.distcp"))
    size = shard.stat().st_size
    with open(shard, "r+b") as f:  # a shard cut short, as a crash or a full disk leaves it
        f.truncate(size // 2)
    why = incomplete_reason(save / "iter_0000030")
    assert why == f"shard {shard.name} truncated: {size // 2} bytes, {size} listed in .metadata", why

    (save / "iter_0000020" / "train_state.pt").unlink()  # a save killed before its last marker
    res = choose_resume(save)
    assert res.iteration == 10 and res.latest == 30
    assert [os.path.basename(f) for f, _ in res.skipped] == ["iter_0000030", "iter_0000020"]
    assert "never finished" in res.skipped[1][1]

    (save / "iter_0000040").mkdir()  # a save begun after the tracker's: incomplete by definition
    cfg = SimpleNamespace(checkpoint=SimpleNamespace(load=str(save), save=str(save), ckpt_step=None))
    logged = []
    assert pin_resume(cfg, log=logged.append).iteration == 10 and cfg.checkpoint.ckpt_step == 10
    assert logged[0].startswith(f"resume: skipped {save / 'iter_0000040'}: train_state.pt missing")
    assert logged[-1] == f"resume: iteration 10 from {save / 'iter_0000010'} (complete)"

    # the load megatron-core then does reads the pinned iteration's values
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor

    loaded = dist_checkpointing.load({"weight": ShardedTensor.from_rank_offsets("weight", torch.zeros(64, 32))},
                                     str(save / "iter_0000010"))
    assert float(loaded["weight"].sum()) == 64 * 32 * 1.0


def test_no_complete_checkpoint_is_refused_and_a_fresh_folder_is_fine(gloo, tmp_path):
    from lcmoe_recipes.errors import LcmoeError
    from lcmoe_recipes.jobs.resume import pin_resume

    save = tmp_path / "c"
    save.mkdir()
    fresh = SimpleNamespace(checkpoint=SimpleNamespace(load=str(save), save=str(save), ckpt_step=None))
    assert pin_resume(fresh, log=lambda _: None).iteration is None and fresh.checkpoint.ckpt_step is None
    save_iteration(save, 5, 1.0)
    (save / "iter_0000005" / ".metadata").write_bytes(b"\x80\x04garbage")
    with pytest.raises(LcmoeError, match="none is complete: .*iter_0000005: .metadata unreadable"):
        pin_resume(fresh, log=lambda _: None)
    other = SimpleNamespace(checkpoint=SimpleNamespace(load=str(save), save="/elsewhere", ckpt_step=None))
    assert pin_resume(other) is None  # loading another run's folder: not ours to judge
