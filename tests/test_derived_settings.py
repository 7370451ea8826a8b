"""Settings derived from a quantity an override changes are derived again (lcmoe_recipes.emit.derived), one test per
pair; the fixes the checks print are re-checked, and a root cause leads over the memory it overflows.

The CP -> cp_comm_type and TP -> sequence_parallel pairs are also exercised through the command line in
tests/test_resolve.py."""

from __future__ import annotations

import copy

import pytest

from lcmoe_recipes import TrainingRequest
from lcmoe_recipes.checks.memory import memory_findings
from lcmoe_recipes.errors import InfeasibleConfig
from lcmoe_recipes.planner.recipes import recipe_plan
from lcmoe_recipes.planner.resolve import resolve


def _configure(recipe: str, overrides: list[str]):
    from lcmoe_recipes.jobs.prepare import configure

    return configure(resolve(TrainingRequest(recipe=recipe)), overrides)


def _derived(one) -> dict[str, str]:
    """override texts -> message, for each derived setting."""
    return {w.message.split(": ", 1)[0]: w.message.split(": ", 1)[1] for w in one.warnings
            if w.rule == "override/derived"}


def test_cp_derives_the_cp_exchange_again():
    one = _configure("dsv3_128k_h100", ["model.context_parallel_size=16", "model.tensor_model_parallel_size=2"])
    # the recipe's a2a+p2p [8, 4] does not multiply to CP16: chosen again, a2a over 4 and a ring of 4 (the ring's
    # merges grow with its size: cost.elementwise.cp_ring_bytes)
    assert (one.cfg.model.cp_comm_type, one.cfg.model.hierarchical_context_parallel_sizes) == ("a2a+p2p", [4, 4])
    assert one.overrides[-1:] == ["model.hierarchical_context_parallel_sizes=[4,4]"]
    assert one.shown.cp_comm_type == "a2a+p2p" and one.shown.hierarchical_cp_sizes == (4, 4)  # what the YAML states


def test_ep_derives_hybridep_ranks_per_nvlink_domain():
    """qwen3_next_8k_gb200 runs HybridEP over EP16: with EP=8 its environment says 8 ranks per NVLink domain."""
    one = _configure("qwen3_next_8k_gb200", ["model.expert_model_parallel_size=8"])
    assert one.cfg.env_vars["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == 8
    (text,) = _derived(one)
    assert text == "env_vars.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=8"
    assert _derived(one)[text].startswith("derived again for EP=8, ETP=1, dispatcher flex/hybridep")


def test_a_dispatcher_override_drops_hybridep_settings():
    """alltoall instead of HybridEP: HybridEP's environment goes, as the planner writes it for alltoall."""
    one = _configure("qwen3_235b_128k_gb200", ["model.moe_token_dispatcher_type=alltoall"])
    assert not any(k.startswith("NUM_OF_HYBRID_EP") or k in ("USE_MNNVL", "NVLINK_DOMAIN_SIZE")
                   for k in one.cfg.env_vars)
    assert "~env_vars.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN" in one.overrides
    assert one.cfg.model.moe_expert_rank_capacity_factor is None


def test_vpp_derives_the_pipeline_layout(tmp_path):
    """qwen3_235b_128k_gb200 (PP4 x VPP12, 'Et|(tt|)*46tL'): VPP=6 gives 24 stages, and a layout of 24 stages
    spreading its 94 layers; the YAML's header overrides rebuild the same layout (the string is quoted for Hydra)."""
    one = _configure("qwen3_235b_128k_gb200", ["model.virtual_pipeline_model_parallel_size=6"])
    assert one.cfg.model.pipeline_model_parallel_layout == "Ettt|(t*4|)*22tttL"
    assert one.overrides[-1] == "model.pipeline_model_parallel_layout='Ettt|(t*4|)*22tttL'"
    from lcmoe_recipes.core.pipeline import layout_stages
    from lcmoe_recipes.emit import apply_overrides, config_from_plan

    assert len(layout_stages(one.cfg.model.pipeline_model_parallel_layout)) == 24
    rebuilt = apply_overrides(config_from_plan(recipe_plan("qwen3_235b_128k_gb200"), validate=False), one.overrides)
    assert rebuilt.model.pipeline_model_parallel_layout == "Ettt|(t*4|)*22tttL"
    assert rebuilt.model.virtual_pipeline_model_parallel_size == 6


def test_seq_length_derives_dataset_positions_and_gbs():
    """qwen3_235b_128k_gb200 at 131,072 (YaRN factor 4 over Qwen3's 32,768, GBS 64 = 8.4M tokens per step):
    model.seq_length=65536 sets the dataset's too, YaRN factor 2, and GBS 128 for the same tokens per step."""
    one = _configure("qwen3_235b_128k_gb200", ["model.seq_length=65536"])
    m = one.cfg.model
    assert (m.seq_length, one.cfg.dataset.seq_length) == (65536, 65536)
    assert m.yarn_rotary_scaling_factor == 2.0 and m.yarn_original_max_position_embeddings == 32768
    assert one.cfg.train.global_batch_size == 128  # 128 x 65,536 = 64 x 131,072 = 8,388,608 tokens
    assert one.overrides[-3:] == ["dataset.seq_length=65536", "model.yarn_rotary_scaling_factor=2.0",
                                  "train.global_batch_size=128"]
    assert "the same 8.4M tokens per step" in _derived(one)["train.global_batch_size=128"]


def test_an_override_of_the_derived_setting_itself_wins():
    """GBS given with the new seq_length: only the dataset's length and the positions follow."""
    one = _configure("qwen3_235b_128k_gb200", ["model.seq_length=65536", "train.global_batch_size=64"])
    assert one.cfg.train.global_batch_size == 64 and set(_derived(one)) == {
        "dataset.seq_length=65536", "model.yarn_rotary_scaling_factor=2.0"}


def test_recompute_derives_cuda_graphs():
    """Full recompute on qwen3_235b_128k_gb200 (TE graphs on attn, moe_router, moe_preprocess): megatron-core forbids
    CUDA graphs with full recompute, so they go, said; the config is then valid (it was refused before)."""
    one = _configure("qwen3_235b_128k_gb200", ["model.recompute_granularity=full", "model.recompute_method=uniform",
                                               "model.recompute_num_layers=1", "model.recompute_modules=null"])
    assert (one.cfg.model.cuda_graph_impl, one.cfg.model.cuda_graph_modules) == ("none", [])
    assert _derived(one)["model.cuda_graph_impl=none model.cuda_graph_modules=[]"].endswith(
        "no CUDA graphs: megatron-core forbids them with full recompute")
    # a recompute of the moe layer keeps graphs on attention only
    one = _configure("qwen3_235b_128k_gb200", ["model.recompute_modules=[moe]"])
    assert one.cfg.model.cuda_graph_modules == ["attn"]


def test_bf16_derives_no_router_padding():
    """A base with FP8 router padding (as megatron-bridge's gpt-oss perf recipes set it) overridden to BF16: the
    padding goes (megatron-core pads routed tokens for FP8/FP4 GEMMs only)."""
    from lcmoe_recipes.emit import apply_overrides, config_from_plan, follow_overrides, plan_from_config

    plan = recipe_plan("dsv3_128k_h100")
    cfg = config_from_plan(plan, validate=False)
    cfg.model.moe_router_padding_for_quantization = True
    apply_overrides(cfg, ["mixed_precision=bf16_mixed"])
    shown = plan_from_config(cfg, "h100", plan.layout.world)
    _, derived = follow_overrides(cfg, ["mixed_precision=bf16_mixed"], shown, plan)
    assert cfg.model.moe_router_padding_for_quantization is False
    assert [d.overrides for d in derived] == [("model.moe_router_padding_for_quantization=false",)]
    # the padding overridden too: the user's value stays
    cfg2 = copy.deepcopy(config_from_plan(plan, validate=False))
    cfg2.model.moe_router_padding_for_quantization = True
    keys = ["mixed_precision=bf16_mixed", "model.moe_router_padding_for_quantization=true"]
    assert follow_overrides(cfg2, keys, plan_from_config(cfg2, "h100", plan.layout.world), plan)[1] == []


def test_fp8_token_alignment_names_seq_lengths_that_fit():
    """DeepSeek-V3 FP8 (blockwise) at seq_length 131,000 and CP=4: 32,750 tokens per GEMM input, not a multiple of 8;
    the fix names the nearest lengths that are, and 131,072."""
    from lcmoe_recipes.checks.feasibility import check_plan

    plan = recipe_plan("dsv3_128k_h100")
    odd = plan.with_changes(seq_length=131000, layout=__import__("dataclasses").replace(plan.layout, cp=4, world=32))
    (bad,) = [f for f in check_plan(odd) if f.rule == "divisibility/fp8-tokens"]
    assert bad.message == ("fp8_blockwise needs the tokens per GEMM input (MBS·seq_length/CP = 1·131000/4) to be a "
                           "multiple of 8")
    assert bad.fix == ("use seq_length 130,944 or 131,008 (multiples of 8·2·CP = 64) at CP=4, or a power of two such "
                       "as 131,072, which every CP splits")
    (hint,) = [f for f in check_plan(odd) if f.rule == "divisibility/seq-length-cp"]
    assert "only for CP <= 1, below the CP rule's first guess CP=32" in hint.message
    assert hint.fix.endswith("e.g. --seq 131072")
    for fixed in (130944, 131008, 131072):
        assert not [f for f in check_plan(odd.with_changes(seq_length=fixed)) if f.rule == "divisibility/fp8-tokens"]


def test_a_root_cause_leads_over_the_memory_it_overflows():
    """An unknown recompute module leaves that layer unrecomputed, so HBM overflows too: the module name is the
    headline, the overflow an 'also'."""
    # DeepSeek-V3 128K without its MoE recompute keeps 108 GiB of 70.8 (qwen3_235b at CP8 now fits without moe_act)
    with pytest.raises(InfeasibleConfig) as info:
        _configure("dsv3_128k_h100", ["model.recompute_modules=[mla_up_proj,layernorm,moee,mlp]"])
    exc = info.value
    assert exc.message.startswith("dsv3_128k_h100: unknown recompute module(s) ['moee']")
    assert exc.message.endswith("(and 1 more: memory/exceeds-hbm)")
    assert [f.rule for f in exc.findings if f.severity == "error"][:2] == ["recompute/module-name", "memory/exceeds-hbm"]


def test_a_cp_fix_is_rechecked_before_it_is_offered():
    """seq_length 131,000 on dsv3_128k_h100 (FP8 blockwise, CP=32): the CPs that split it into 2·CP chunks are 2
    and 4, and under FP8 neither leaves the tokens per GEMM a multiple of 8 -- so the fix names CP=4 with what it
    then needs, instead of offering a CP that fails the next rule. For CP=48 on qwen3_235b_128k_gb200 the nearest
    CPs pass every layout rule and are offered as they are."""
    import dataclasses

    from lcmoe_recipes.checks.feasibility import check_plan

    odd = recipe_plan("dsv3_128k_h100").with_changes(seq_length=131000)
    (bad,) = [f for f in check_plan(odd) if f.rule == "divisibility/seq-cp"]
    assert bad.fix.startswith("use CP=4, which then also needs: use seq_length 130,944 or 131,008 (multiples of "
                              "8·2·CP = 64) at CP=4")
    qwen = recipe_plan("qwen3_235b_128k_gb200")
    wide = qwen.with_changes(layout=dataclasses.replace(qwen.layout, cp=48))
    fixes = {f.rule: f.fix for f in check_plan(wide) if f.severity == "error"}
    assert fixes["divisibility/seq-cp"] == fixes["rank-folding/dense"] == "use CP=8"
    for cp in (4, 8):  # both pass the layout rules; CP=4 is not named because it is over HBM by the memory model
        assert not [f for f in check_plan(qwen.with_changes(layout=dataclasses.replace(qwen.layout, cp=cp)))
                    if f.severity == "error"]
    over = {f.rule for f in memory_findings(qwen.with_changes(layout=dataclasses.replace(qwen.layout, cp=4)))}
    assert "memory/exceeds-hbm" in over
    cramped = qwen.with_changes(layout=dataclasses.replace(qwen.layout, world=32, cp=48, pp=2, ep=16, vpp=None),
                                pipeline_model_parallel_layout=None)  # no CP that folds fits: the nearest are named
    fix = {f.rule: f.fix for f in check_plan(cramped)}["divisibility/seq-cp"]
    assert fix == ("use CP=2 or 4 (by the memory model neither then fits in HBM, nor does any other value the layout "
                   "rules allow: see the memory finding's fixes)")


def test_pp_and_cp_together_derive_the_layout_before_the_cp_exchange():
    """qwen3_235b_128k_gb200 (PP4 x VPP12, 48 stages) with PP=8, CP=4 and EP=16: the CP exchange is priced on the
    layers of each stage, so the 96-stage layout is derived first ('E|(t|)*94L': a decoder layer per middle stage).
    Before, the exchange was priced on the stale 48-stage string and the launch died with an IndexError."""
    one = _configure("qwen3_235b_128k_gb200", ["model.pipeline_model_parallel_size=8", "model.context_parallel_size=4",
                                               "model.expert_model_parallel_size=16",  # and the HBM fix it names:
                                               "optimizer.optimizer_cpu_offload=true",
                                               "optimizer.optimizer_offload_fraction=1.0",
                                               "optimizer.use_precision_aware_optimizer=true"])
    assert one.cfg.model.pipeline_model_parallel_layout == "E|(t|)*94L"
    assert "model.pipeline_model_parallel_layout='E|(t|)*94L'" in one.overrides
    from lcmoe_recipes.emit.derived import PAIRS

    order = [pair.setting for pair in PAIRS]  # a stale string now refuses pricing: derived first, or CP's is skipped
    assert order.index("pipeline_model_parallel_layout") < min(order.index(s) for s in ("cp_comm_type", "dispatcher"))


def test_a_stale_layout_string_is_refused_by_name_when_priced():
    """A plan whose layout string has fewer stages than PP·VPP (48 for PP8 x VPP12 = 96) is refused with the fix,
    not an IndexError, wherever the step is priced on it."""
    import dataclasses

    from lcmoe_recipes.core.pipeline import stage_decoder_layers

    plan = recipe_plan("qwen3_235b_128k_gb200")
    stale = plan.with_changes(layout=dataclasses.replace(plan.layout, pp=8, cp=4, ep=16))
    with pytest.raises(InfeasibleConfig, match=r"'Et\|\(tt\|\)\*46tL' has 48 stages, but PP=8 x VPP=12 needs 96") as err:
        stage_decoder_layers(stale)
    assert "model.pipeline_model_parallel_layout=null" in err.value.fix


def _pp8_qwen3_235b():
    """qwen3_235b_128k_gb200 with PP=8 (VPP 6, the layout launch derives): TP4 PP8 CP8 and EP32 PP8 both need 256 of
    its 128 GPUs."""
    import dataclasses

    from lcmoe_recipes.core.pipeline import build_pipeline_layout

    qwen = recipe_plan("qwen3_235b_128k_gb200")
    return qwen.with_changes(layout=dataclasses.replace(qwen.layout, pp=8, vpp=6),
                             pipeline_model_parallel_layout=build_pipeline_layout(94, 48, qwen.mtp_num_layers))


def test_a_two_rule_fix_says_when_no_pair_of_fixes_fits_in_hbm():
    """A fresh user applied "use CP=4, which then also needs: use EP=8 or 16" and was refused for HBM: the fix now
    says no such pair fits, and each pair is over the planning limit by the memory model."""
    import dataclasses

    from lcmoe_recipes.checks.feasibility import check_plan
    from lcmoe_recipes.core.plan import HBM_MARGIN
    from lcmoe_recipes.cost import estimate_memory

    plan = _pp8_qwen3_235b()
    fixes = {f.rule: f.fix for f in check_plan(plan) if f.severity == "error"}
    assert fixes["rank-folding/dense"] == (
        "use CP=4, which then also needs: use EP=8 or 16 (ETP=1 · EP=32 · PP=8 = 256 does not divide the world size "
        "128); by the memory model no such pair then fits in HBM (its memory finding names what would)")
    for cp, ep in ((4, 8), (4, 16)):
        pair = plan.with_changes(layout=dataclasses.replace(plan.layout, cp=cp, ep=ep))
        assert not [f for f in check_plan(pair) if f.severity == "error" and not f.rule.startswith("memory/")]
        assert estimate_memory(pair).hbm_total > HBM_MARGIN * pair.hardware_spec.hbm_bytes


def test_a_two_rule_fix_names_the_pair_that_fits(monkeypatch):
    """Where a pair passes every layout rule and fits (here: the memory model's verdict replaced by "fits", to reach
    the branch), the fix names it: "use CP=4 with EP=16" (the nearer EP to 32 first)."""
    from lcmoe_recipes.checks import feasibility

    monkeypatch.setattr(feasibility, "_fits_hbm", lambda plan: True)
    fixes = {f.rule: f.fix for f in feasibility.check_plan(_pp8_qwen3_235b()) if f.severity == "error"}
    assert fixes["rank-folding/dense"] == "use CP=4 with EP=16"
