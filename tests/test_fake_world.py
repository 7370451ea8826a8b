"""The ``mirror`` torch.distributed backend (lcmoe_recipes.emit.probe.fake_world): each collective answers as if every
other rank were a copy of this one, without communicating -- what the one-GPU rank measurement and the activation
harness run on."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def rank3_of_8():
    from lcmoe_recipes.emit.probe.fake_world import fake_world

    with fake_world(8, 3, backend="mirror"):
        yield


def test_gathers_replicate_and_reductions_keep_this_ranks_values(rank3_of_8):
    import torch
    import torch.distributed as dist

    x = torch.arange(4.0)
    out = torch.empty(32)
    dist.all_gather_into_tensor(out, x)
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0] * 8
    dist.all_reduce(x)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]
    part = torch.empty(4)
    dist.reduce_scatter_tensor(part, torch.arange(32.0))
    assert part.tolist() == [12.0, 13.0, 14.0, 15.0]  # this rank's (3rd) chunk
    slots = [torch.empty(4) for _ in range(8)]
    dist.all_gather(slots, x)
    assert all(s.tolist() == x.tolist() for s in slots)
    objects = [None] * 8
    dist.all_gather_object(objects, {"rank": 3})
    assert objects == [{"rank": 3}] * 8


def test_all_to_all_receives_from_every_peer_what_this_rank_keeps(rank3_of_8):
    """MoE dispatch: this rank sends 1, 2, ..., 8 tokens to ranks 0..7 and keeps 4 for itself; every peer, being a copy,
    sends it 4 -- the counts the dispatcher all-gathers first say so, and the tokens are its own 4."""
    import torch
    import torch.distributed as dist

    sends = list(range(1, 9))
    tokens = torch.arange(float(sum(sends))).unsqueeze(1).expand(-1, 2).contiguous()
    counts = torch.tensor(sends)
    gathered = torch.empty(64, dtype=counts.dtype)
    dist.all_gather_into_tensor(gathered, counts)
    receives = gathered.view(8, 8)[:, 3].tolist()
    assert receives == [4] * 8
    out = torch.empty(sum(receives), 2)
    dist.all_to_all_single(out, tokens, receives, sends)
    own = tokens[sum(sends[:3]):sum(sends[:4])]
    assert torch.equal(out, own.repeat(8, 1))


def test_pipeline_receives_zeros_and_groups_are_subsets(rank3_of_8):
    import torch
    import torch.distributed as dist

    buffer = torch.full((3,), 7.0)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(3), 4), dist.P2POp(dist.irecv, buffer, 2)]):
        work.wait()
    assert buffer.tolist() == [0.0, 0.0, 0.0]
    group = dist.new_group([0, 1, 2, 3])
    out = torch.empty(8)
    dist.all_gather_into_tensor(out, torch.tensor([5.0, 6.0]), group=group)
    assert (group.size(), dist.get_rank(group), out.tolist()) == (4, 3, [5.0, 6.0] * 4)
    dist.barrier()


def test_a_world_is_refused_when_one_is_up():
    from lcmoe_recipes.emit.probe.fake_world import fake_world
    from lcmoe_recipes.errors import LcmoeError

    with fake_world(2, 0):
        with pytest.raises(LcmoeError, match="already initialised"):
            with fake_world(2, 1):
                pass
    import torch.distributed as dist

    assert not dist.is_initialized()
