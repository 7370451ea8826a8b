"""``python -m lcmoe_recipes.train --as-rank R`` up to the GPU call (lcmoe_recipes.emit.probe.rank_run): which rank, what
changes for the measurement and why, the microbatches that keep the peak, and the refusals. The GPU run itself is
scripts/gpu_proof.sh's (docs/build.md)."""

from __future__ import annotations

import pytest

from lcmoe_recipes import NAMED_RECIPES, recipe_plan

pytestmark = pytest.mark.slow


def test_pipeline_rank_is_megatron_cores():
    """Our rank -> pipeline rank agrees with megatron-core 0.19.2's own RankGenerator (order tp-cp-ep-dp-pp)."""
    from megatron.core.parallel_state import RankGenerator

    from lcmoe_recipes.emit.probe.rank_run import pipeline_rank

    for name in ("dsv3_128k_h100", "qwen3_235b_128k_gb200"):
        plan = recipe_plan(name)
        lay = plan.layout
        groups = RankGenerator(tp=lay.tp, ep=1, dp=lay.dp, pp=lay.pp, cp=lay.cp, order="tp-cp-ep-dp-pp").get_ranks("pp")
        for rank in range(0, lay.world, 7):
            assert pipeline_rank(plan, rank) == next(g.index(rank) for g in groups if rank in g)


def test_most_loaded_rank_of_each_named_recipe():
    from lcmoe_recipes.cost.memory import estimate_memory
    from lcmoe_recipes.emit.probe.rank_run import most_loaded_rank, pipeline_rank

    for name in NAMED_RECIPES:
        plan = recipe_plan(name)
        rank = most_loaded_rank(plan)
        assert pipeline_rank(plan, rank) == estimate_memory(plan).pp_rank
        assert rank % (plan.layout.world // plan.layout.pp) == 0  # TP = CP = EP = DP rank 0 of its stage
    # PP rank 0: 8 decoder layers beside the embedding and the most microbatches in flight (the recipe's pipeline
    # split moves a layer off PP rank 7, which holds the MTP layer and a second embedding)
    assert most_loaded_rank(recipe_plan("dsv3_128k_h100")) == 0


def test_fewer_microbatches_keep_every_ranks_peak():
    from lcmoe_recipes.cost.memory import _in_flight, rank_memory
    from lcmoe_recipes.emit.probe.rank_run import microbatches_for_peak

    plan = recipe_plan("dsv3_128k_h100")  # PP8 VPP4, 480 microbatches per step
    micro = microbatches_for_peak(plan)
    assert micro == 16 and micro % plan.layout.pp == 0
    fewer = plan.with_changes(global_batch_size=plan.micro_batch_size * plan.layout.dp * micro)
    for r in range(plan.layout.pp):
        assert _in_flight(8, 4, micro, r) == _in_flight(8, 4, 480, r)
        assert rank_memory(fewer, r).total == rank_memory(plan, r).total
    assert microbatches_for_peak(plan.with_changes(global_batch_size=8)) == 8  # never more than the job's


def test_prepare_changes_what_fake_collectives_need(configs):
    import copy

    from lcmoe_recipes.emit import target_meta
    from lcmoe_recipes.emit.probe.rank_run import prepare
    from lcmoe_recipes.emit.stack import te_installed

    plan, cfg = configs["qwen3_235b_128k_gb200"]
    if not te_installed():  # megatron-core's local attention runs CP1 only (test_refusals): the job at CP1, DP8
        cfg = copy.deepcopy(cfg)
        cfg.model.context_parallel_size = 1
    original = copy.deepcopy(cfg)
    run = prepare(cfg, target_meta(plan), 96, 3)
    assert (run.rank, run.pp_rank, run.world_size, run.hardware) == (96, 3, 128, "gb200")
    changed = {line.split(":")[0] for line in run.changes}
    assert {"model.moe_router_force_load_balancing", "model.moe_token_dispatcher_type", "dist.use_gloo_process_groups",
            "train.train_iters", "checkpoint.save"} <= changed
    # 8 microbatches put as many in flight as the job's own (64 at CP8, DP1; at CP1, DP8 the job has 8 already)
    assert run.cfg.train.global_batch_size == plan.micro_batch_size * run.plan.layout.dp * 8
    assert ("train.global_batch_size" in changed) == (run.plan.layout.dp == 1)
    assert run.cfg.model.moe_token_dispatcher_type == "alltoall" and run.cfg.model.moe_router_force_load_balancing
    assert cfg.model.moe_token_dispatcher_type == original.model.moe_token_dispatcher_type == "flex"  # cfg untouched
    if not te_installed():  # the run's own recompute: our prediction prices the config as run
        assert run.cfg.model.transformer_impl == "local" and run.plan.recompute_modules == ()
        assert any("'moe_act' dropped" in line for line in run.changes)  # the recipe's one module (no layernorm)


def test_refusals(configs):
    from lcmoe_recipes.emit import target_meta
    from lcmoe_recipes.emit.probe.rank_run import prepare
    from lcmoe_recipes.emit.stack import te_installed
    from lcmoe_recipes.errors import LcmoeError

    plan, cfg = configs["qwen3_235b_128k_gb200"]
    with pytest.raises(LcmoeError, match=r"`as_rank` 128 is not a rank of this 128-GPU job; give a rank in 0\.\.127"):
        prepare(cfg, target_meta(plan), 128, 3)
    with pytest.raises(LcmoeError, match="does not record the world size"):
        prepare(cfg, {}, 0, 3)
    if not te_installed():
        dsv3, dsv3_cfg = configs["dsv3_128k_h100"]
        with pytest.raises(LcmoeError, match="computes in fp8_blockwise, which needs Transformer Engine"):
            prepare(dsv3_cfg, target_meta(dsv3), 224, 3)
        with pytest.raises(LcmoeError, match=r"context parallelism \(8 ranks\) runs only with Transformer Engine"):
            prepare(cfg, target_meta(plan), 96, 3)


def test_the_command_stops_at_the_gpu_call(capsys, tmp_path):
    import torch

    from lcmoe_recipes.cli.train import main

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the run would start")
    from lcmoe_recipes.emit.stack import te_installed

    cp1 = [] if te_installed() else ["model.context_parallel_size=1"]  # megatron-core's local attention: CP1 only
    assert main(["--recipe", "qwen3_235b_128k_gb200", "--as-rank", "96", "--out", str(tmp_path)] + cp1) == 2
    out = capsys.readouterr()
    assert "as-rank: model.moe_router_force_load_balancing: False -> True" in out.out
    assert "one rank alone (--as-rank) runs on a GPU; none is visible here" in out.err  # the library names the field; the command, its flag
    assert main(["--recipe", "qwen3_235b_128k_gb200", "--as-rank", "0", "--steps", "0"]) == 2
