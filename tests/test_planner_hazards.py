"""The planner's answer to every open hazard (a catalogued upstream bug with no fixed release, on the pinned stack) it
walks into: avoided by an equal-cost tie, the upstream recipe's setting made, or named with why it cannot be avoided
(lcmoe_recipes.planner.hazards, the 'hazard' rule of lcmoe_recipes.planner.search)."""

import pytest
from pydantic import ValidationError

from lcmoe_recipes.catalog.versions import installed_versions
from lcmoe_recipes.checks.known_issues import catalogue
from lcmoe_recipes.core.request import TrainingRequest
from lcmoe_recipes.planner.hazards import (RECIPE_CHOICES, follow_recipe_choices, open_hazards, plan_view)
from lcmoe_recipes.planner.recipes import recipe_plan
from lcmoe_recipes.planner.search import search_layouts

AVOIDED = "avoided: "
UNAVOIDABLE = "cannot avoid: decided by the request: every fitting candidate priced walks into it"
LOW = ("not avoided: low confidence -- it does not decide among equal-cost ties, so no predicted step time is given "
       "up for it")


def answers(result) -> dict[str, tuple[str, str]]:
    return {issue_id: (confidence, how) for issue_id, confidence, how in result.hazards}


@pytest.fixture(scope="module")
def dsv3_128k_h100():
    return search_layouts(TrainingRequest(model="dsv3", seq_length=131072, hardware="h100", num_gpus=256))


def test_open_hazards_are_the_catalogues_unfixed_entries_on_the_pinned_stack():
    versions = installed_versions().versions
    open_ids = {i.id for i in catalogue()[0] if i.fixed_in() == "no fixed release known" and i.affects(versions)}
    assert {"mtp-context-parallel-loss-scale", "deepep-internode-dispatch-timeout", "optimizer-cpu-offload-checkpoint",
            "ep-a2a-overlap-b200", "hybridep-nvl8-ep-above-node", "deepep-internode-blackwell"} <= open_ids
    assert set(RECIPE_CHOICES) <= open_ids


def test_dsv3_128k_h100_names_what_it_cannot_avoid(dsv3_128k_h100):
    """DeepSeek-V3 at 128K on 256 H100 with FP32 gradients: the fastest tie (TP4 CP8, PP8) offloads part of the
    optimizer, a confirmed bug with checkpoints; an equal-cost tie without offload (TP4 CP16, PP4) wins: the hazard
    rule decides. MTP with CP > 1 is decided by the request (128K needs CP; the model has MTP); DeepEP across nodes
    is a low-confidence report: it decides nothing."""
    result = dsv3_128k_h100
    best = result.best.plan
    assert result.rules == ("hazard",) and result.rule == "hazard"
    assert best.layout.describe() == "TP4 CP16 EP64 ETP1 PP4 VPP8 -> DP1 EDP1 on 256 GPUs"
    assert not best.optimizer_cpu_offload and result.fastest.plan.optimizer_cpu_offload
    got = answers(result)
    assert list(got) == ["optimizer-cpu-offload-checkpoint", "mtp-context-parallel-loss-scale",
                         "deepep-internode-dispatch-timeout"]
    assert got["optimizer-cpu-offload-checkpoint"][0] == "confirmed"
    assert got["optimizer-cpu-offload-checkpoint"][1].startswith(AVOIDED + "TP4 CP16 EP64 ETP1 PP4 VPP8")
    assert got["mtp-context-parallel-loss-scale"] == ("medium", UNAVOIDABLE)
    assert got["deepep-internode-dispatch-timeout"] == ("low", LOW)
    why = best.reasons["layout"].why
    assert "rule 'hazard'" in why
    assert "mtp-context-parallel-loss-scale (warning, confidence medium) -- cannot avoid: decided by the request" in why
    # the winner walks into what the answers say, and nothing else
    assert open_hazards(best) == ("mtp-context-parallel-loss-scale", "deepep-internode-dispatch-timeout")


def test_qwen3_next_64k_gb200_avoids_mtp_with_cp():
    """Qwen3-Next at 64K on 32 GB200: CP=1 ties (TP2) are as fast as the CP2 fastest within the band, so the
    MTP-under-CP hazard is avoided; none of them keeps the memory band free, so the one with the most headroom wins
    (TP2 EP16 PP1); the optimizer offload is needed by every fitting layout."""
    result = search_layouts(TrainingRequest(model="qwen3_next", seq_length=65536, hardware="gb200", num_gpus=32))
    best = result.best.plan
    assert result.rules == ("hazard", "most headroom") and result.rule == "most headroom"
    assert best.layout.describe() == "TP2 CP1 EP16 ETP1 PP1 -> DP16 EDP2 on 32 GPUs"
    assert result.fastest.plan.layout.cp == 2 and best.layout.cp == 1
    got = answers(result)
    assert list(got) == ["optimizer-cpu-offload-checkpoint", "mtp-context-parallel-loss-scale"]
    assert got["optimizer-cpu-offload-checkpoint"] == ("confirmed", UNAVOIDABLE)
    assert got["mtp-context-parallel-loss-scale"][0] == "medium"
    assert got["mtp-context-parallel-loss-scale"][1].startswith(AVOIDED + "TP2 CP1 EP16 ETP1 PP1")
    assert open_hazards(best) == ("optimizer-cpu-offload-checkpoint",)


def test_qwen3_next_8k_h100_avoids_the_offload():
    """Qwen3-Next at 8K on 64 H100: the fastest tie offloads the optimizer; the hazard rule passes over the ties that
    do, then headroom decides among the rest. The winner (EP8, inside one node) also keeps out of the low-confidence
    DeepEP report, which the answers say, though it decided nothing (test_dsv3_128k_h100_names_what_it_cannot_avoid:
    where every tie walks into it, none is passed over for it)."""
    result = search_layouts(TrainingRequest(model="qwen3_next", seq_length=8192, hardware="h100", num_gpus=64))
    best = result.best.plan
    assert result.rules == ("hazard", "headroom") and result.rule == "headroom"
    assert not best.optimizer_cpu_offload and result.fastest.plan.optimizer_cpu_offload
    assert best.layout.describe() == "TP2 CP1 EP8 ETP1 PP8 VPP3 -> DP4 EDP1 on 64 GPUs"
    got = answers(result)
    assert list(got) == ["optimizer-cpu-offload-checkpoint", "deepep-internode-dispatch-timeout"]
    assert got["optimizer-cpu-offload-checkpoint"][1].startswith(AVOIDED)
    assert got["deepep-internode-dispatch-timeout"][0] == "low"
    assert got["deepep-internode-dispatch-timeout"][1].startswith(AVOIDED)
    assert open_hazards(best) == ()


def test_no_hazard_leaves_the_ranking_alone():
    """Qwen3-235B at 128K on 128 GB200: no tie walks into an open hazard, so the memory rule decides as before."""
    result = search_layouts(TrainingRequest(model="qwen3_235b", seq_length=131072, hardware="gb200", num_gpus=128))
    assert result.hazards == () and result.rule in ("fastest", "headroom", "most headroom")
    assert "open hazards" not in result.best.plan.reasons["layout"].why


def test_b200_follows_the_recipe_and_turns_the_ep_overlap_off():
    """NVIDIA's DeepSeek-V3 B200 recipe turned the EP all-to-all overlap off (Megatron-Bridge PR #1476): a B200
    plan that would overlap it gets it off, with the recipe's reason; H100 keeps it."""
    h100 = recipe_plan("dsv3_128k_h100")
    b200 = h100.with_changes(hardware="b200", moe_ep_overlap=True)
    assert open_hazards(b200, ("ep-a2a-overlap-b200",)) == ("ep-a2a-overlap-b200",)
    followed = follow_recipe_choices(b200)
    assert followed.moe_ep_overlap is False
    assert "Megatron-Bridge PR #1476" in followed.reasons["moe_ep_overlap"].why
    kept = follow_recipe_choices(h100.with_changes(moe_ep_overlap=True))
    assert kept.moe_ep_overlap is True and "ep-a2a-overlap-b200" not in open_hazards(kept)
    result = search_layouts(TrainingRequest(model="moonlight", seq_length=8192, hardware="b200", num_gpus=16))
    assert result.best.plan.moe_ep_overlap is False
    (answer,) = result.hazards
    assert answer[:2] == ("ep-a2a-overlap-b200", "low") and answer[2].startswith("recipe: EP all-to-all overlap off "
                                                                                   "on B200")


def test_hybridep_wish_on_8_gpu_nodes_keeps_ep_inside_a_node():
    """HybridEP asked for on H100: candidates with EP 16 walk into hybridep-nvl8-ep-above-node; the winner keeps EP
    at 8, as NVIDIA's recipes do."""
    result = search_layouts(TrainingRequest(model="qwen3_235b", seq_length=8192, hardware="h100", num_gpus=64,
                                            dispatcher="hybridep"), top=30)
    reached = {h for c in result.ranked for h in open_hazards(c.plan)}
    assert "hybridep-nvl8-ep-above-node" in reached
    best = result.best.plan
    assert best.moe_flex_dispatcher_backend == "hybridep" and best.layout.ep <= 8
    assert "hybridep-nvl8-ep-above-node" not in open_hazards(best)


def test_deepep_wish_on_b200_low_confidence_hang_decides_nothing():
    """DeepEP asked for on 256 B200 for DeepSeek-V3 at 16K: candidates with EP across nodes walk into the open B200
    internode hang, a low-confidence report, so it does not decide -- the winner walks into it, with the EP
    all-to-all overlap (MXFP8: no recipe turned it off) hiding its internode all-to-all; MTP under CP does decide: a
    CP=1 tie wins."""
    result = search_layouts(TrainingRequest(model="dsv3", seq_length=16384, hardware="b200", num_gpus=256,
                                            dispatcher="deepep"), top=30)
    assert "deepep-internode-blackwell" in {h for c in result.ranked for h in open_hazards(c.plan)}
    best = result.best.plan
    assert best.layout.describe() == "TP4 CP1 EP64 ETP1 PP4 VPP8 -> DP16 EDP1 on 256 GPUs" and best.moe_ep_overlap
    assert open_hazards(best) == ("deepep-internode-blackwell",)
    got = answers(result)
    assert list(got) == ["mtp-context-parallel-loss-scale", "deepep-internode-blackwell"]
    assert got["mtp-context-parallel-loss-scale"][1].startswith(AVOIDED + "TP4 CP1 EP64 ETP1 PP4 VPP8")
    assert got["deepep-internode-blackwell"] == ("low", LOW)


def test_deepep_wish_on_nvl72_is_refused():
    """On GB200 megatron-bridge would replace DeepEP by alltoall (deepep-nvl72-falls-back-to-alltoall): the planner
    refuses the wish, with the request, instead of planning a dispatcher that will not run."""
    with pytest.raises(ValidationError, match="dispatcher 'deepep' does not run on GB200 NVL72"):
        TrainingRequest(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=64, dispatcher="deepep")


def test_plan_view_mirrors_the_emitted_fields():
    plan = recipe_plan("dsv3_128k_h100")
    view = plan_view(plan)
    m = view["model"]
    assert (m["context_parallel_size"], m["expert_model_parallel_size"], m["moe_flex_dispatcher_backend"]) == \
        (plan.layout.cp, plan.layout.ep, "deepep")
    assert m["calculate_per_token_loss"] is True  # emit/settings._loss with CP > 1
    assert m["multi_latent_attention"] is True and m["mtp_num_layers"] == 1
    assert view["checkpoint"]["save"] == view["checkpoint"]["load"]  # a restarted job resumes from its saves


def test_dsv3_256k_h100():
    """DeepSeek-V3 at 256K on 512 H100: no fitting tie offloads (FP32 gradients priced), MTP under CP is decided by the
    request, DeepEP across nodes is a low-confidence report; a DP2 tie within the band wins ('data parallel')."""
    result = search_layouts(TrainingRequest(model="dsv3", seq_length=262144, hardware="h100", num_gpus=512))
    got = answers(result)
    assert list(got) == ["mtp-context-parallel-loss-scale", "deepep-internode-dispatch-timeout"]
    assert got["deepep-internode-dispatch-timeout"] == ("low", LOW)
    assert got["mtp-context-parallel-loss-scale"] == ("medium", UNAVOIDABLE)
    assert result.rule == "data parallel" and result.best.plan.layout.dp == 2


# Every open hazard the tests above assert the planner's answer to.
ASSERTED = {"optimizer-cpu-offload-checkpoint", "mtp-context-parallel-loss-scale", "deepep-internode-dispatch-timeout",
            "ep-a2a-overlap-b200", "hybridep-nvl8-ep-above-node", "deepep-internode-blackwell"}


@pytest.mark.parametrize("request_fields", [
    dict(model="qwen3_235b", seq_length=131072, hardware="gb200", num_gpus=512),
    dict(model="qwen3_next", seq_length=32768, hardware="gb200", num_gpus=32),
    dict(model="dsv3", seq_length=32768, hardware="gb300", num_gpus=256),
    dict(model="qwen3_235b", seq_length=65536, hardware="h200", num_gpus=128),
    dict(model="kimi_k2", seq_length=32768, hardware="h100", num_gpus=512),
    dict(model="qwen3_next", seq_length=131072, hardware="b200", num_gpus=64),
], ids=lambda r: f"{r['model']}_{r['seq_length'] // 1024}k_{r['num_gpus']}x{r['hardware']}")
def test_every_hazard_the_planner_walks_into_has_an_asserted_answer(request_fields):
    """Across GPUs and models, the open hazards the planner answers are those the tests above pin down: a new one
    the planner walks into needs its own test here."""
    result = search_layouts(TrainingRequest(**request_fields))
    assert {h for h, _, _ in result.hazards} <= ASSERTED
    for issue_id, confidence, how in result.hazards:
        assert confidence in ("high", "medium", "low", "confirmed")
        assert how.startswith(("avoided: ", "cannot avoid: ", "recipe: ", "not avoided: ")), how
        assert (issue_id in open_hazards(result.best.plan)) == how.startswith(("cannot avoid: ", "not avoided: "))
