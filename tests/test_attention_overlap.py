"""The attention backend Transformer Engine selects, its price, and the overlaps of cost/overlap.py.

Backend rules: TransformerEngine 2.20.0.dev0 (commit d0067d0) ``transformer_engine/pytorch/attention/
dot_product_attention/utils.py`` ``get_attention_backend`` and ``transformer_engine/common/fused_attn/fused_attn.cpp``
``nvte_get_fused_attn_backend``. Overlap conditions: megatron-bridge 0.6.2 ``training/comm_overlap.py``.
"""

import sys
from pathlib import Path

import pytest

from lcmoe_recipes.catalog import get_hardware, get_model
from lcmoe_recipes.cost.attention import (FLASH, FUSED, UNFUSED, layer_attention_seconds, select_backend,
                                          target_cudnn, window_waste)
from lcmoe_recipes.cost.overlap import (FLEX_DISPATCHER_SMS, bucket_share, contended, dispatcher_sm_share, dp_overlap,
                                        ep_overlap, exposed)
from lcmoe_recipes.cost.shapes import shapes
from lcmoe_recipes.cost.step import estimate_step

sys.path.insert(0, str(Path(__file__).parent))
from published import THROUGHPUT_ROWS  # noqa: E402

H100, GB200 = get_hardware("h100").compute_capability, get_hardware("gb200").compute_capability


def _layer(model: str, kind: str) -> tuple:
    s = shapes(get_model(model))
    return s, s.kinds.index(kind)


def test_target_cudnn_is_the_newest_image_that_states_it():
    # containers.yaml: 26.08, 26.06.01 list no cuDNN; 26.06's software-versions row is 9.21.1.3
    assert target_cudnn() == ((9, 21, 1), "nvcr.io/nvidia/nemo:26.06")


@pytest.mark.parametrize("cc", [H100, GB200])
def test_vanilla_softmax_gets_fused_attention_on_hopper_and_blackwell(cc):
    # TE prefers FusedAttention over FlashAttention on SM >= 90 when both are allowed
    for model, kind in (("qwen3_235b", "full"), ("dsv3", "mla")):  # GQA 128/128; MLA 192/128
        s, i = _layer(model, kind)
        backend = select_backend(s, i, cc, 1, None)
        assert backend.name == FUSED
        assert "preferred over FlashAttention" in backend.why[-1]


def test_gpt_oss_sinks_turn_flash_attention_off():
    for kind in ("full", "sliding"):
        s, i = _layer("gpt_oss_120b", kind)
        for cc in (H100, GB200):
            backend = select_backend(s, i, cc, 1, None)
            assert backend.name == FUSED and "learnable softmax" in backend.why[0]
    s, i = _layer("gpt_oss_120b", "full")
    # cuDNN below 9.13.1 has no learnable-softmax kernel (nemo:25.09 ships 9.11.0): the unfused path
    assert select_backend(s, i, H100, 1, None, cudnn=(9, 11, 0)).name == UNFUSED
    # packed sequences with sinks need cuDNN 9.18 (nemo:25.11 ships 9.13.1)
    assert select_backend(s, i, H100, 1, None, thd=True, cudnn=(9, 13, 1)).name == UNFUSED
    assert select_backend(s, i, H100, 1, None, thd=True, cudnn=(9, 18, 0)).name == FUSED
    # CP: sinks need a2a; with p2p neither fused nor unfused (no CP) nor flash (sinks) runs
    assert select_backend(s, i, H100, 2, "a2a").name == FUSED
    with pytest.raises(ValueError, match="cp_comm_type"):
        select_backend(s, i, H100, 2, "p2p")


def test_head_dim_256_on_blackwell_needs_cudnn_9_23():
    # Qwen3-Next's softmax layers have 256-dim heads: cuDNN trains them on SM100 from 9.23, on SM90 from 9.5
    s, i = _layer("qwen3_next", "full")
    assert select_backend(s, i, GB200, 1, None).name == FLASH
    assert select_backend(s, i, GB200, 1, None, cudnn=(9, 23, 0)).name == FUSED
    assert select_backend(s, i, H100, 1, None).name == FUSED


def test_fp8_attention_rules():
    s, i = _layer("qwen3_235b", "full")
    # FP8 attention in training: no FlashAttention, no unfused path; fused FP8 current scaling needs SM100
    assert select_backend(s, i, GB200, 1, None, fp8_dpa="fp8_cs").name == FUSED
    with pytest.raises(ValueError, match="FP8 current scaling needs SM100"):
        select_backend(s, i, H100, 1, None, fp8_dpa="fp8_cs")
    with pytest.raises(ValueError, match="MXFP8 attention needs"):
        select_backend(s, i, GB200, 1, None, fp8_dpa="mxfp8", cudnn=(9, 20, 0))


def test_unfused_attention_costs_more_than_fused():
    # gpt-oss-120b at 4K on one H100, TP1, MBS1: the score matrix in HBM (64 heads x 4096^2 x 43 bytes) against
    # the fused kernel: several times slower, as the roofline of its passes says
    s, i = _layer("gpt_oss_120b", "full")
    fused = layer_attention_seconds(s, i, "h100", 4096, 1, 1, 1, None, None, False)
    unfused = layer_attention_seconds(s, i, "h100", 4096, 1, 1, 1, None, None, False, cudnn=(9, 11, 0))
    scores = 64 * 4096 * 4096
    assert unfused > 3 * fused
    assert unfused >= 0.999 * (22 + 21) * scores / 3.35e12  # at least the bytes over the HBM bandwidth


def test_a_128_token_window_does_twice_the_useful_work():
    assert window_waste(128) == 2.0  # the band touches 2 key tiles of 128 per query tile
    assert window_waste(4096) == pytest.approx(33 / 32)


def test_exposed_is_communication_beyond_the_compute():
    assert exposed(3.0, 1.0) == 2.0 and exposed(1.0, 3.0) == 0.0


def test_dp_overlap_follows_megatron_bridge_dp_rule():
    row = THROUGHPUT_ROWS["LC6"].plan  # DSV3 on 512 H100, PP8 CP64: DP = 1
    assert row.layout.dp == 1 and dp_overlap(row) == (False, dp_overlap(row)[1])
    assert dp_overlap(THROUGHPUT_ROWS["LC1"].plan)[0]  # DP = 256 / 8 = 32
    # one bucket of max(40M, 1M x DP) parameters out of 400M: a tenth reduces last
    assert bucket_share(THROUGHPUT_ROWS["LC1"].plan, 400e6) == pytest.approx(0.1)


def test_ep_overlap_hides_the_all_to_all_behind_the_other_microbatch():
    # DeepSeek-V3 on 1,024 H100 (PS26's layout, DeepEP): the all-to-all across nodes is over a quarter of the step
    # without the overlap; with it, each quarter hides behind one compute block of the other microbatch, except what
    # DeepEP's 20 SMs of H100's 132 take from that compute while they run (cost.overlap.contended)
    plan = THROUGHPUT_ROWS["PS26"].plan
    off = estimate_step(plan.with_changes(moe_ep_overlap=False))
    on = estimate_step(plan.with_changes(moe_ep_overlap=True))
    assert ep_overlap(plan.with_changes(moe_ep_overlap=True))[:2] == (True, True)
    assert off.parts["ep_exposed"] > 0.25 * off.step_seconds
    assert on.step_seconds < off.step_seconds
    ep = {o.name: o for o in on.overlaps}["EP all-to-all"]
    share = FLEX_DISPATCHER_SMS / 132
    assert ep.on and share * ep.communication <= ep.exposed < 1.1 * share * ep.communication
    assert on.parts["ep_exposed"] == pytest.approx(ep.exposed)
    ep_off = {o.name: o for o in off.overlaps}["EP all-to-all"]
    assert not ep_off.on and ep_off.exposed == ep_off.communication


def test_contended_overlap_is_max_of_the_uncovered_and_the_sm_share():
    """A transfer of c s beside b s of compute whose SMs it shares (k of S): the pair takes max(c, b + c k / S)."""
    assert contended(1.0, 3.0, 0.0) == exposed(1.0, 3.0) == 0.0
    assert contended(1.0, 3.0, 0.15) == pytest.approx(0.15)   # compute slowed while the transfer runs
    assert contended(4.0, 1.0, 0.15) == pytest.approx(3.0)    # the transfer outlasts the compute
    assert dispatcher_sm_share(THROUGHPUT_ROWS["PS17"].plan) == 0.0  # alltoall: NCCL channels, not priced
    # HybridEP on GB200 with the 32 SMs megatron-bridge's performance settings give it; DeepEP on H100 with
    # megatron-core's default 20
    assert THROUGHPUT_ROWS["PS4"].plan.moe_flex_dispatcher_num_sms == 32
    assert dispatcher_sm_share(THROUGHPUT_ROWS["PS4"].plan) == pytest.approx(32 / 148)
    assert THROUGHPUT_ROWS["HC1"].plan.moe_flex_dispatcher_num_sms is None
    assert dispatcher_sm_share(THROUGHPUT_ROWS["HC1"].plan) == pytest.approx(20 / 132)
    from lcmoe_recipes.catalog.hardware import HARDWARE

    assert {k: h.sm_count for k, h in HARDWARE.items()} == {"h100": 132, "h200": 132, "b200": 148, "gb200": 148,
                                                             "gb300": 160}


def test_graphed_attention_with_biases_keeps_wgrad_undelayed():
    # gpt-oss has biases: megatron-bridge turns delay_wgrad_compute off with graphed attention
    plan = THROUGHPUT_ROWS["PS11"].plan.with_changes(cuda_graph_impl="transformer_engine",
                                                     cuda_graph_modules=("attn",))
    assert ep_overlap(plan)[:2] == (True, False)


def test_tp_overlap_hides_each_layers_tp_traffic_behind_its_gemms():
    """Qwen3-235B 128K on GB200 at TP4: megatron-bridge's Qwen3 MoE recipes set tp_comm_overlap, and the run keeps it
    (TP >= 2, sequence parallel). Each layer's TP all-gathers / reduce-scatters then run beside its GEMMs outside the
    routed experts; the pipelined and bulk overlaps (about half that GEMM time) run their GEMMs on 148 - 16 SMs
    (TE 2.x initialize_ub defaults), so the layer loses max(traffic - GEMMs, GEMMs / 2 x 16 / 132); without it every
    TP collective is exposed. Here the SMs cost more than the traffic left uncovered, and less than the traffic."""
    from lcmoe_recipes.cost.overlap import TP_BULK_SMS, tp_overlap, tp_overlap_allowed
    from lcmoe_recipes.cost.step import step_constants, step_terms, tp_overlap_steps
    from lcmoe_recipes.planner.recipes import recipe_plan

    plan = recipe_plan("qwen3_235b_128k_gb200")
    assert plan.layout.tp == 4 and plan.sequence_parallel and plan.tp_comm_overlap and tp_overlap(plan)[0]
    assert "as the base recipe asks" in plan.reasons["tp_comm_overlap"].why
    on, off = estimate_step(plan), estimate_step(plan.with_changes(tp_comm_overlap=False))
    tp_on, tp_off = ({o.name: o for o in e.overlaps}["TP"] for e in (on, off))
    assert not tp_off.on and tp_off.exposed == tp_off.communication == pytest.approx(tp_on.communication)
    assert tp_on.on and tp_on.exposed == pytest.approx(on.parts["tp_exposed"]) and on.step_seconds < off.step_seconds
    terms = step_terms(plan)
    gemm = step_constants(plan)[0].value
    w = terms.slowest(gemm, *(c.value for c in step_constants(plan)[1:]))[1]
    s, lay = shapes(plan.model_spec), plan.layout
    tokens = plan.micro_batch_size * plan.seq_length / (lay.tp * lay.cp)
    (c, dense, n), = w.tp_layers  # every layer of this model is a MoE layer with GQA attention
    assert dense == pytest.approx(6 * s.layer_dense_params(0) * tokens)  # moe_act recompute adds no GEMM
    d = dense / (terms.peak * gemm)
    assert TP_BULK_SMS == 16 and c > d * 0.5 * 16 / 132 > c - d
    assert tp_on.exposed == pytest.approx(terms.micro * n * d * 0.5 * 16 / 132)
    assert tp_on.exposed < 0.3 * tp_on.communication
    assert tp_overlap_steps(plan) == (pytest.approx(on.step_seconds), pytest.approx(off.step_seconds))
    assert tp_overlap_allowed(1, False) == (False, "megatron-bridge turns tp_comm_overlap off at TP < 2")
    assert tp_overlap_allowed(4, False)[1] == "megatron-bridge turns tp_comm_overlap off without sequence parallelism"
    assert tp_overlap(THROUGHPUT_ROWS["HC1"].plan) == (False, "tp_comm_overlap off")  # published rows: as they ran

