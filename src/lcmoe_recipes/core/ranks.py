"""Which global ranks form each TP / CP / EP / DP / PP group: a pure-Python twin of megatron-core's RankGenerator.

megatron-core 0.19.2 (``parallel_state.initialize_model_parallel``) cuts the world twice with the default order
``tp-cp-ep-dp-pp``:

* dense grid  ``RankGenerator(tp=TP, ep=1,  dp=DP,  pp=PP, cp=CP)``  -> groups "tp", "cp", "dp", "pp", "tp-cp", "dp-cp"
* expert grid ``RankGenerator(tp=ETP, ep=EP, dp=EDP, pp=PP, cp=1)`` -> groups "ep", "tp" (=ETP), "dp" (=EDP), "tp-ep"

A rank's coordinates are a mixed-radix number in that order (TP fastest, PP slowest); a group varies the named
coordinates and fixes the others. Groups are listed in megatron-core's order (``generate_masked_orthogonal_rank_groups``),
so ``tests/test_ranks.py`` can compare them group by group with the real RankGenerator. Importing megatron-core for
that costs ~15 s; this module costs nothing, so the planner and the checks use it.
"""

from __future__ import annotations

import math
from functools import lru_cache

from .layout import ParallelLayout

ORDER = ("tp", "cp", "ep", "dp", "pp")


def _offsets(dims: list[int], stride: list[int], axes: list[int]) -> list[int]:
    """Sum of coordinate x stride over ``axes``, enumerated with the first axis fastest (megatron-core's order)."""
    out = [0]
    for i in axes:  # each new axis varies slower than the ones before it
        out = [base + c * stride[i] for c in range(dims[i]) for base in out]
    return out


def _grid(sizes: dict[str, int], token: str, order: tuple[str, ...]) -> tuple[list[int], list[int], list[int], list[int]]:
    """(dims, strides, varied axes, fixed axes) of the grid ``sizes`` for the groups of ``token``."""
    dims = [sizes.get(axis, 1) for axis in order]
    stride = [1]
    for d in dims[:-1]:
        stride.append(stride[-1] * d)
    inside = set(token.split("-"))
    varied = [i for i, axis in enumerate(order) if axis in inside]
    fixed = [i for i, axis in enumerate(order) if axis not in inside]
    return dims, stride, varied, fixed


def rank_groups(sizes: dict[str, int], token: str, order: tuple[str, ...] = ORDER) -> list[list[int]]:
    """Rank groups for ``token`` (e.g. "tp", "dp-cp") over a grid of ``sizes`` laid out in ``order``.

    Args:
        sizes: degree of every axis in ``order`` (missing axes are 1).
        token: the axes that vary inside a group, joined by "-".

    Returns:
        a list of groups (lists of global ranks), in megatron-core's order.
    """
    dims, stride, varied, fixed = _grid(sizes, token, order)
    members = _offsets(dims, stride, varied)
    return [[base + m for m in members] for base in _offsets(dims, stride, fixed)]


# --- placement questions answered without listing every group ------------------------------------------------
# Every group of a token is its first rank b plus the same offsets m (the varied axes), and
# (b + m) // block = b // block + (r + m) // block with r = b % block. So which blocks a group touches, relative to
# its own first block, depends on r alone: visiting the distinct residues r (at most ``block`` of them) answers
# for the whole world, whatever its size (16,384 GPUs: tens of residues instead of thousands of groups).


def _base_residues(dims: list[int], stride: list[int], fixed: list[int], block: int) -> set[int]:
    """Every group's first rank modulo ``block``: a fixed axis adds c·stride, whose residues repeat with period
    block / gcd(stride, block)."""
    out = {0}
    for i in fixed:
        period = block // math.gcd(stride[i], block)
        out = {(r + c * stride[i]) % block for r in out for c in range(min(dims[i], period))}
    return out


def _sizes(layout: ParallelLayout, grid: str) -> tuple[tuple[str, int], ...]:
    if grid == "dense":
        return (("tp", layout.tp), ("cp", layout.cp), ("dp", layout.dp), ("pp", layout.pp))
    return (("tp", layout.etp), ("ep", layout.ep), ("dp", layout.edp), ("pp", layout.pp))


@lru_cache(maxsize=8192)
def _profile(sizes: tuple[tuple[str, int], ...], token: str, block: int) -> tuple[tuple[int, ...], frozenset[int]]:
    """(offsets of a group's members from its first rank, residues of the first ranks modulo ``block``)."""
    dims, stride, varied, fixed = _grid(dict(sizes), token, ORDER)
    return tuple(_offsets(dims, stride, varied)), frozenset(_base_residues(dims, stride, fixed, block))


def max_span(layout: ParallelLayout, grid: str, token: str, block: int) -> int:
    """The most blocks of ``block`` consecutive ranks any one group of ``token`` touches ("dense" or "expert" grid)."""
    return _max_span(_sizes(layout, grid), token, block)


@lru_cache(maxsize=8192)
def _max_span(sizes: tuple[tuple[str, int], ...], token: str, block: int) -> int:
    # cached on the grid's sizes: the planner and the checks ask the same question for many plans
    members, residues = _profile(sizes, token, block)
    return max(len({(r + m) // block for m in members}) for r in residues)


def max_inside_own_block(layout: ParallelLayout, grid: str, token: str, block: int) -> int:
    """The most members any one group of ``token`` has inside the block of its own first rank."""
    return _max_inside(_sizes(layout, grid), token, block)


@lru_cache(maxsize=8192)
def _max_inside(sizes: tuple[tuple[str, int], ...], token: str, block: int) -> int:
    # member b + m shares its first rank b's block exactly when r + m < block (offsets m >= 0)
    members, residues = _profile(sizes, token, block)
    return max(sum(1 for m in members if r + m < block) for r in residues)


def ring_exits(layout: ParallelLayout, token: str, block: int) -> int:
    """How many ranks of the first ``block`` ranks send to a ring neighbour outside that block, when each dense-grid
    group of ``token`` passes data around a ring in megatron-core's group order (the CP ring)."""
    return _ring_exits(_sizes(layout, "dense"), token, block)


@lru_cache(maxsize=4096)
def _ring_exits(sizes: tuple[tuple[str, int], ...], token: str, block: int) -> int:
    # each rank has one successor in its ring, so visiting the first block's ranks is enough
    dims, stride, varied, _ = _grid(dict(sizes), token, ORDER)
    members = _offsets(dims, stride, varied)
    position = {m: i for i, m in enumerate(members)}
    world = math.prod(dims)
    exits = 0
    for rank in range(min(block, world)):
        offset = sum((rank // stride[i]) % dims[i] * stride[i] for i in varied)  # from its group's first rank
        successor = rank - offset + members[(position[offset] + 1) % len(members)]
        exits += successor >= block
    return exits


def dense_groups(layout: ParallelLayout, token: str) -> list[list[int]]:
    """Groups of the dense grid (TP, CP, DP, PP and their combinations)."""
    return rank_groups(dict(_sizes(layout, "dense")), token)


def expert_groups(layout: ParallelLayout, token: str) -> list[list[int]]:
    """Groups of the expert grid; "tp" here is ETP and "dp" is EDP."""
    return rank_groups(dict(_sizes(layout, "expert")), token)


GROUP_KINDS = {  # name -> (grid, token)
    "TP": ("dense", "tp"), "CP": ("dense", "cp"), "DP": ("dense", "dp"), "PP": ("dense", "pp"),
    "EP": ("expert", "ep"), "ETP": ("expert", "tp"), "EDP": ("expert", "dp"),
}


def groups_of(layout: ParallelLayout, kind: str) -> list[list[int]]:
    """The rank groups of one kind: TP, CP, DP, PP, EP, ETP or EDP."""
    grid, token = GROUP_KINDS[kind]
    return (dense_groups if grid == "dense" else expert_groups)(layout, token)


def span(group: list[int], block: int) -> int:
    """How many blocks of ``block`` consecutive ranks (nodes, NVLink domains) ``group`` touches."""
    return len({rank // block for rank in group})


def placement(layout: ParallelLayout, gpus_per_node: int, job_block: int) -> dict[str, tuple[int, int, int]]:
    """For each group kind: (group size, most nodes one group spans, most NVLink blocks one group spans)."""
    out = {}
    for kind in GROUP_KINDS:
        groups = groups_of(layout, kind)
        out[kind] = (len(groups[0]), max(span(g, gpus_per_node) for g in groups), max(span(g, job_block) for g in groups))
    return out
