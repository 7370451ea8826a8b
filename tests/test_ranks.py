"""The pure-Python rank-group twin against megatron-core's own RankGenerator, group by group."""

import itertools

import pytest

from lcmoe_recipes.core.layout import ParallelLayout
from lcmoe_recipes.core.ranks import dense_groups, expert_groups, placement

LAYOUTS = [  # (world, TP, PP, CP, EP, ETP)
    (256, 1, 8, 32, 32, 1),    # DeepSeek-V3 128K
    (512, 1, 8, 64, 32, 1),    # DeepSeek-V3 256K (EDP 2)
    (128, 4, 4, 4, 32, 1),     # Qwen3-235B 128K
    (32, 1, 2, 16, 16, 1),     # Qwen3-Next 64K
    (64, 2, 2, 2, 8, 2),
    (48, 2, 3, 2, 4, 1),
    (16, 2, 1, 1, 16, 1),
    (24, 3, 2, 1, 6, 1),
    (64, 8, 1, 1, 8, 8),
] + [(w, tp, pp, cp, ep, etp) for w, tp, pp, cp, ep, etp in itertools.product(
    (8, 16), (1, 2), (1, 2), (1, 2), (1, 2, 4), (1, 2)) if w % (tp * pp * cp) == 0 and w % (etp * ep * pp) == 0]


@pytest.mark.slow
@pytest.mark.parametrize("world,tp,pp,cp,ep,etp", LAYOUTS)
def test_twin_matches_megatron_rank_generator(world, tp, pp, cp, ep, etp):
    from megatron.core.parallel_state import RankGenerator

    lay = ParallelLayout(world=world, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp)
    dense = RankGenerator(tp=tp, ep=1, dp=lay.dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    expert = RankGenerator(tp=etp, ep=ep, dp=lay.edp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    for token in ("tp", "cp", "dp", "pp", "tp-cp", "dp-cp", "tp-pp", "tp-cp-dp"):
        assert dense_groups(lay, token) == dense.get_ranks(token), token
    for token in ("tp", "ep", "dp", "pp", "tp-ep", "ep-dp"):
        assert expert_groups(lay, token) == expert.get_ranks(token), token


def test_placement_of_the_named_layouts():
    # DSV3 128K on H100: CP32 spans 4 nodes; EP32 spans 4 nodes (DeepEP crosses nodes by design); TP stays put
    p = placement(ParallelLayout(world=256, tp=1, pp=8, cp=32, ep=32), gpus_per_node=8, job_block=8)
    assert p["CP"] == (32, 4, 4) and p["EP"] == (32, 4, 4) and p["TP"] == (1, 1, 1) and p["PP"] == (8, 8, 8)
    # Qwen3-235B 128K on GB200 (4 GPUs per tray, 64-GPU NVLink blocks): TP4 in one tray, EP32 in one block
    p = placement(ParallelLayout(world=128, tp=4, pp=4, cp=4, ep=32, vpp=12), gpus_per_node=4, job_block=64)
    assert p["TP"] == (4, 1, 1) and p["EP"] == (32, 8, 1) and p["CP"] == (4, 4, 1) and p["DP"] == (2, 2, 1)


def test_placement_answers_without_listing_groups():
    """max_span, max_inside_own_block and ring_exits (answered from the residues of the groups' first ranks) equal
    the answers from listing every group, for odd and even degrees and blocks that divide nothing."""
    import random

    from lcmoe_recipes.core.ranks import max_inside_own_block, max_span, ring_exits

    rng = random.Random(12)
    checked = 0
    while checked < 300:
        tp, cp, pp, dp = (rng.choice(v) for v in ((1, 2, 3, 4, 8), (1, 2, 3, 4, 16), (1, 2, 3, 4), (1, 2, 3, 5, 8, 16)))
        ep = rng.choice([e for e in (1, 2, 4, 6, 8, 16, 32) if (tp * cp * dp) % e == 0])
        lay = ParallelLayout(world=tp * cp * pp * dp, tp=tp, pp=pp, cp=cp, ep=ep)
        block = rng.choice((4, 6, 8, 64, 72))
        for grid, token in (("dense", "tp"), ("dense", "cp"), ("dense", "dp-cp"), ("dense", "pp"),
                            ("expert", "ep"), ("expert", "dp"), ("expert", "tp-ep")):
            groups = (dense_groups if grid == "dense" else expert_groups)(lay, token)
            assert max_span(lay, grid, token, block) == max(len({r // block for r in g}) for g in groups)
            assert max_inside_own_block(lay, grid, token, block) == max(
                sum(1 for r in g if r // block == g[0] // block) for g in groups)
        rings = dense_groups(lay, "cp")
        assert ring_exits(lay, "cp", block) == sum(1 for g in rings for a, b in zip(g, g[1:] + g[:1])
                                                   if a // block == 0 and b // block != 0)
        checked += 1
