"""Communication bytes checked by hand, and predicted TFLOP/s against published throughput (tests/published.py, each row with its source)."""

from math import comb, log2

import pytest
from published import THROUGHPUT_ROWS

from lcmoe_recipes import recipe_plan
from lcmoe_recipes.catalog import get_model
from lcmoe_recipes.catalog.kernels import attention_tflops
from lcmoe_recipes.cost.attention import layer_attention_seconds
from lcmoe_recipes.cost.comm import layer_transfers, pipeline_transfer
from lcmoe_recipes.cost.efficiency import BORROWED, FITTED, GPUS, KINDS, constant
from lcmoe_recipes.cost.shapes import shapes
from lcmoe_recipes.cost.step import estimate_step, model_flops_per_token
from scripts_loader import load_script


def _by_kind(plan, layer):
    return {t.kind: t for t in layer_transfers(plan, layer)}


def test_qwen3_235b_128k_layer_bytes_by_hand():
    t = _by_kind(recipe_plan("qwen3_235b_128k_gb200"), 0)
    n = 131072 // 8                                   # tokens per CP rank
    # TP4 + SP, attention only (no shared experts): AG + RS forward, RS + AG backward, 3/4 of n·h·2 bytes each
    assert t["TP"].nvlink_bytes == 4 * 3 / 4 * n * 4096 * 2 == 402_653_184
    # CP8 ring, GQA K+V = 2·4 heads·128: 3·(CP-1) transfers of n·1024·2/TP bytes
    assert t["CP"].nvlink_bytes == 3 * 7 * n * 1024 * 2 / 4 == 176_160_768
    # EP32: n/TP tokens x top-8 x h x 2 bytes, 4 transfers, 31/32 leave the GPU; inside one 64-GPU NVLink block
    assert t["EP"].nvlink_bytes == pytest.approx(4 * (n / 4) * 8 * 4096 * 2 * 31 / 32) and t["EP"].scaleout_bytes == 0
    assert t["EP"].seconds == pytest.approx(1_040_187_392 / 900e9)


def test_dsv3_128k_layer_bytes_by_hand():
    plan = recipe_plan("dsv3_128k_h100")
    t = _by_kind(plan, 5)
    assert "TP" not in t
    n = 131072 // 32
    # hierarchical CP (8, 4): an all-to-all of q, k, v and the output inside groups of 8 (MLA: 2·128·192 + 2·128·128
    # per token), 7/8 of it leaving the GPU, forward and backward; then a ring over 4 groups with MLA's per-head K, V
    assert t["CP-a2a"].nvlink_bytes == 2 * 7 / 8 * n * (2 * 128 * 192 + 2 * 128 * 128) * 2 == 1_174_405_120
    assert t["CP"].scaleout_bytes == 3 * 3 * n * 128 * 320 * 2 == 3_019_898_880
    # EP32 over 4 nodes with DeepEP: a token crosses InfiniBand once per other node holding one of its 8 experts
    # (256 experts, 64 per node: 3 x (1 - C(192, 8) / C(256, 8)) = 2.71 nodes), the rest of its 7.75 copies that
    # leave the GPU go over NVLink
    far = 3 * (1 - comb(192, 8) / comb(256, 8))
    assert t["EP"].scaleout_bytes == pytest.approx(4 * n * 7168 * 2 * far) == pytest.approx(636_682_768)
    assert t["EP"].nvlink_bytes == pytest.approx(4 * n * 7168 * 2 * (8 * 31 / 32 - far))
    assert t["EP"].seconds == pytest.approx(max(t["EP"].nvlink_bytes / 450e9, t["EP"].scaleout_bytes / 50e9))
    # the alltoall dispatcher sends every copy: 24 of the 31 peers sit on other nodes
    nccl = _by_kind(plan.with_changes(moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_backend=None), 5)
    assert nccl["EP"].scaleout_bytes == pytest.approx(4 * n * 7168 * 2 * 8 * 31 / 32 * 24 / 31)
    # PP: each of the 4 chunks sends n·h·2 forward and receives as much backward
    assert pipeline_transfer(plan).scaleout_bytes == 2 * 4 * 4096 * 7168 * 2 == 469_762_048


def test_model_flops_grow_with_context():
    short = recipe_plan("dsv3_128k_h100").with_changes(seq_length=4096)
    long = recipe_plan("dsv3_128k_h100")
    # linear part 6 x 37.5B (incl. MTP) + attention 3 x 128 x 320 x seq per layer (61 + 1 MTP layers)
    assert model_flops_per_token(long) - model_flops_per_token(short) == pytest.approx(
        3 * 128 * 320 * (131072 - 4096) * 62)


FIT = {k: (r.plan, r.comparable) for k, r in THROUGHPUT_ROWS.items() if r.fit}


def test_kernel_tables_read_and_interpolate():
    """FlashAttention-3 paper, Figure 5 (cuDNN, H100, causal, head dim 128): 518 TFLOP/s at 4K, 529 at 8K; between
    them linear in log2(length); head dim 160 (MLA's (192 + 128) / 2) a quarter of the way from 128 to 256; longer
    than 16K holds the 16K value. Blackwell: Hopper's curve scaled so forward non-causal d128 at 16K is 1613 / 1.3
    (FlashAttention-4 paper) on B200, times 2500 / 2250 on GB200."""
    assert attention_tflops("h100", False, True, 128, 4096) == 518
    assert attention_tflops("h100", False, True, 128, 6144) == pytest.approx(518 + 11 * (log2(6144) - 12))
    assert attention_tflops("h100", False, False, 160, 2048) == pytest.approx(617 + (580 - 617) / 4)
    assert attention_tflops("h100", True, False, 128, 131072) == 516
    # backward with a causal mask: the non-causal backward x the forward's causal / non-causal ratio
    assert attention_tflops("h100", True, True, 128, 4096) == pytest.approx(499 * 518 / 609)
    assert attention_tflops("b200", False, False, 128, 16384) == pytest.approx(1241)
    assert attention_tflops("gb200", False, False, 128, 16384) == pytest.approx(1241 * 2500 / 2250)
    assert attention_tflops("h200", False, True, 64, 512) == attention_tflops("h100", False, True, 64, 512) == 225


def test_attention_calls_by_hand():
    """DeepSeek-V3 (128 heads, d_qk 192, d_v 128), 128K on CP32 with the p2p ring, one microbatch: n = 4096 local
    queries; a causal diagonal call (n x n) and 31 ring steps without mask, half n x n/2, half n/2 x n; each step
    n²/2 pairs. Forward FLOPs 2·heads·(d_qk + d_v)·pairs, backward 2.5x; time at the table's rate per call shape."""
    s = shapes(recipe_plan("dsv3_128k_h100").model_spec)
    n, width, pairs = 4096, 128 * 320, 4096**2 / 2
    fwd = 2 * width * pairs

    def t(causal, f_len, b_len):
        return fwd / (attention_tflops("h100", False, causal, 160, f_len) * 1e12) + 2.5 * fwd / (
            attention_tflops("h100", True, causal, 160, b_len) * 1e12)

    expected = t(True, n, n) + 15.5 * t(False, n / 2, n) + 15.5 * t(False, n, n / 2)
    got = layer_attention_seconds(s, 5, "h100", 131072, 1, 1, 32, "p2p", None, False)
    assert got == pytest.approx(expected)
    # every CP layout does 1/CP of the causal work: a2a as heads / 32 in one causal call over all 128K tokens
    # (the same FLOPs; at the causal kernel's long-sequence rate, which the ring's unmasked calls beat)
    a2a = layer_attention_seconds(s, 5, "h100", 131072, 1, 1, 32, "a2a", None, False)
    big = 2 * 4 * 320 * 131072**2 / 2
    assert big == pytest.approx(fwd * 32)
    assert a2a == pytest.approx(big / (attention_tflops("h100", False, True, 160, 131072) * 1e12)
                                + 2.5 * big / (attention_tflops("h100", True, True, 160, 131072) * 1e12))
    # recompute of the core attention runs the forward again
    again = layer_attention_seconds(s, 5, "h100", 131072, 1, 1, 32, "p2p", None, True)
    forward_only = sum(k * fwd / (attention_tflops("h100", False, c, 160, f) * 1e12)
                       for c, f, k in ((True, n, 1), (False, n / 2, 15.5), (False, n, 15.5)))
    assert again - got == pytest.approx(forward_only)


def test_every_constant_fitted_or_borrowed_with_a_reason():
    for gpu in GPUS:
        for kind in KINDS:
            c = constant(gpu, kind)
            assert c.source in FITTED and (c.anchored or c.note), (gpu, kind)
    # a stand-in never copies silently: the borrowed ones say what stands in and why
    assert "H200 has H100's GH100 tensor cores" in constant("h200", "bf16").note
    assert constant("gb200", "fp8_cs").source == ("gb200", "mxfp8") and not constant("gb200", "fp8_cs").anchored
    assert all(key not in FITTED or key in BORROWED for key in FITTED if key[0] == "h200")


def test_constants_are_the_fit():
    from lcmoe_recipes.calibration.fit_step import fit

    assert fit(FIT.values()) == FITTED  # rerun scripts/calibrate_step.py when the model changes


def test_trend_across_lengths_comes_from_the_physics():
    """At fixed model and GPUs: DeepSeek-V3 on 256 H100 holds ~300-320 TFLOP/s from 16K to 128K (LC2-LC5) and so do
    we (ratio drift 0.12, under 0.125: it was 0.098 before the memory-bound kernels were priced on 2026-12-04; they
    cost the same per token at every length while attention grows, so they take more off the shorter rows, and the
    record's fall after 32K, which would take more off the longer ones, is not in the model); Qwen3-235B on 128
    GB200 rises 1.6x from 4K to 128K (698 -> 1117) and so do we (within 15%): one constant per GPU for attention,
    the trend from the kernel's shape dependence and the FLOPs."""
    ratios = [estimate_step(THROUGHPUT_ROWS[k].plan).tflops_per_gpu / THROUGHPUT_ROWS[k].comparable
              for k in ("LC2", "LC3", "LC4", "LC5")]
    assert max(ratios) - min(ratios) < 0.125, ratios
    short, long = (estimate_step(THROUGHPUT_ROWS[k].plan).tflops_per_gpu for k in ("LC10", "LC11"))
    assert long / short == pytest.approx(1117 / 698, rel=0.15)


@pytest.mark.slow
def test_leave_one_out_throughput():
    """Each fit row predicted with its GPU's constants fitted without it: the spread docs/accuracy.md reports."""
    from lcmoe_recipes.calibration.fit_step import leave_one_out

    ratios = leave_one_out(FIT)
    assert set(ratios) == set(FIT)
    inside = {k for k, r in ratios.items() if 0.75 <= r <= 1.25}
    assert len(inside) >= len(FIT) // 2, ratios


def test_step_parts_add_up():
    est = estimate_step(recipe_plan("dsv3_128k_h100"))
    assert est.step_seconds == pytest.approx(sum(est.parts.values()))
    assert est.mfu == pytest.approx(est.tflops_per_gpu / 1978.9)
    assert est.comm_bytes["CP"] > est.comm_bytes["EP"] > 0
    assert est.step_seconds == estimate_step(recipe_plan("dsv3_128k_h100"), dict(FITTED)).step_seconds


def test_every_catalogue_gpu_has_an_attention_table():
    from lcmoe_recipes.catalog import HARDWARE
    from lcmoe_recipes.catalog.kernels import kernel_source

    for key in HARDWARE:
        assert attention_tflops(key, True, True, 96, 3000) > 0 and kernel_source(key)


@pytest.mark.parametrize("seq", [4096, 65536])
def test_model_flops_equal_megatron_bridge(seq):
    """Published TFLOP/s are megatron-bridge's ``num_floating_point_operations`` over the measured step; ours are our
    model FLOPs over the predicted step. The two counts must agree for every catalogue model, or a ratio in
    docs/accuracy.md would compare unlike units: within 1% (megatron-bridge 0.6.2
    ``training/utils/flop_utils.py`` leaves out small terms such as norms and the router; worst seen 0.8%, Qwen3-Next
    at 4K)."""
    from published import _plan

    from lcmoe_recipes.catalog.models import MODELS

    upstream = _installed_upstream_flops()
    for model in MODELS:
        plan = _plan("flops", model, "h100", 8, seq, "bf16", 8)
        assert model_flops_per_token(plan) / upstream(plan) == pytest.approx(1.0, abs=0.01), model


def _installed_upstream_flops():
    """plan -> the installed megatron-bridge's model FLOPs per token for it (scripts/flops_conventions.py's count)."""
    from lcmoe_recipes.emit.stack import load_bridge

    load_bridge(quiet=True)  # megatron-bridge without Transformer Engine, before its modules are imported
    from megatron.bridge.training.utils.flop_utils import num_floating_point_operations

    script = load_script("flops_conventions")
    return lambda plan: script.upstream_flops_per_token(num_floating_point_operations, plan)


def test_published_flops_conventions():
    """Every throughput row says which megatron-bridge formula counted it (tests/published_flops.py, generated from
    each release's own flop_utils.py); the rows counted by the installed release line (0.6) are recomputed here with
    the installed formula, and gpt-oss-120b's rows counted before 0.5.0 carry the old formula's 17% shortfall."""
    from published_flops import FLOPS_CONVENTION

    assert set(FLOPS_CONVENTION) == set(THROUGHPUT_ROWS)
    live = [k for k, (release, _) in FLOPS_CONVENTION.items() if release.startswith("v0.6")]
    assert len(live) >= 8
    upstream = _installed_upstream_flops()
    for key in live:
        row = THROUGHPUT_ROWS[key]
        ratio = upstream(row.plan) / model_flops_per_token(row.plan)
        assert ratio == pytest.approx(FLOPS_CONVENTION[key][1], abs=1e-4), key
    assert FLOPS_CONVENTION["PS10"] == ("v0.4.2", 0.8302) and FLOPS_CONVENTION["PS3"][1] == pytest.approx(1, abs=0.01)
    assert THROUGHPUT_ROWS["PS10"].comparable == pytest.approx(158 / 0.8302)


def test_gpt_oss_elementwise_passes_by_hand():
    """cost/elementwise.py: the bytes gpt-oss-120b's features move outside megatron-core 0.19.2's fused kernels, per
    token of one MoE layer (top-4, expert width 2,880, hidden 2,880, 64 query + 8 key heads of 64), counted pass by
    pass from experts.py, fused_bias_geglu.py, fused_bias_dropout.py and rope_utils.py."""
    from lcmoe_recipes.cost.elementwise import layer_bytes

    s = shapes(THROUGHPUT_ROWS["PS10"].plan.model_spec)
    clamp = (4 * 2880 * 2 * 2 * 2 * 2, 4 * 2880 * 2 * 5 * 2)   # [4, 5760] BF16: 2R+2W forward, 3R+2W backward
    fc2_bias = (4 * 2880 * 28, 4 * 2880 * 30)                    # FP32 routing weights
    out_bias = (2880 * 2 * 2, 2880 * 2)                          # x + b; the bias gradient's read
    rope = (72 * 64 * 10 * 2, 72 * 64 * 6 * 2)                   # unfused minus fused passes over q and k
    everything = layer_bytes(s, 0, True, True, True, False, True, False)
    assert everything == (sum(t[0] for t in (clamp, fc2_bias, out_bias, rope)),
                          sum(t[1] for t in (clamp, fc2_bias, out_bias, rope))) == (610560, 637056)
    # moe_act recompute runs the clamp's forward again in the backward
    assert layer_bytes(s, 0, True, True, True, False, True, True)[1] == 637056 + clamp[0]
    # through the op fuser only the bias gradient's extra read of the FC2 output gradient is left of the experts'
    fused = layer_bytes(s, 0, True, True, True, True, True, False)
    assert fused == (out_bias[0] + rope[0], 4 * 2880 * 2 + out_bias[1] + rope[1])


def test_every_layers_memory_bound_kernels_by_hand():
    """cost/elementwise.py common_bytes / quantize_bytes for one Qwen3-30B-A3B layer (hidden 2,048, 32 query + 4 key
    heads of 128 with q/k norms, 128 experts, top-8, expert width 768, no shared expert), per token, BF16 unless
    said, counted pass by pass."""
    from lcmoe_recipes.cost.elementwise import common_bytes, quantize_bytes

    s = shapes(get_model("qwen3_30b"))
    h, qk, k, f = 2048, 36 * 128, 8, 768
    norm, add = (2 * h * 2, 3 * h * 2), (3 * h * 2, 3 * h * 2)
    qk_norm, rope = (2 * qk * 2, 3 * qk * 2), (2 * qk * 2,) * 2
    scores = (3 * 128 * 4 + 128 * 4, 3 * 128 * 4)              # FP32: softmax R+W, top-k R, aux loss R / gradient
    permute = (2 * (h + k * h) * 2,) * 2                        # permute and unpermute, both ways
    glu = (3 * k * f * 2, 5 * k * f * 2)
    parts = (norm, add, add, qk_norm, rope, norm, scores, permute, glu)  # the second norm: pre-MLP
    assert common_bytes(s, 0) == (sum(p[0] for p in parts), sum(p[1] for p in parts)) == (190464, 231936)
    inputs = 32 * 128 + k * (h + f)                             # proj's input; the experts' FC1 and FC2 inputs
    grads = (32 + 8) * 128 + h + k * (2 * f + h)                # every GEMM's output gradient
    assert quantize_bytes(s, 0, "mxfp8") == (inputs * (4 + 2 / 32), grads * (4 + 2 / 32)) == (108160, 145600)
    assert quantize_bytes(s, 0, "fp8_cs") == (inputs * 6, grads * 6)  # amax read, then cast and transpose
    assert quantize_bytes(s, 0, "bf16") == (0.0, 0.0)
    # narrow models spend a larger share of the step there: Qwen3-30B against DeepSeek-V3, both GB200 MXFP8
    share = {r: (lambda e: (e.parts["memory_bound"] + e.parts["fp8_quantize"]) / e.step_seconds)(
        estimate_step(THROUGHPUT_ROWS[r].plan)) for r in ("PS6", "PS2")}
    assert share["PS6"] > 2 * share["PS2"] > 0.05


def test_elementwise_part_of_the_step():
    """The passes cost time only where the model has the features (gpt-oss's rows, not Qwen3-30B's or -- MLA keeps
    its fused RoPE -- DeepSeek-V3's) or the plan recomputes a norm or an activation; PS10's part is its bytes at
    H100's 3,350 GB/s."""
    from lcmoe_recipes.core.pipeline import stage_decoder_layers
    from lcmoe_recipes.cost.elementwise import features, layer_bytes

    for name in ("VC1", "PS16"):
        assert estimate_step(THROUGHPUT_ROWS[name].plan).parts["elementwise"] == 0.0
    # DeepSeek-V3 at 128K (LC5) has none of the features, but recomputes its norms (mla_up_proj+layernorm+moe+mlp):
    # only that pass is left, and it is small beside the step
    lc5 = estimate_step(THROUGHPUT_ROWS["LC5"].plan)
    assert 0 < lc5.parts["elementwise"] < 1e-3 * lc5.step_seconds
    # gpt-oss-120b, 64 x H100, MBS1, layernorm+moe_act; PP4 splits its 36 layers 8/10/10/8 (the embedding and the
    # loss count as a layer each), and the slowest rank is the last (the output layer), with 8
    plan = THROUGHPUT_ROWS["PS10"].plan
    assert features(plan) == (True, True, True, False, True, True)
    per_token = sum(layer_bytes(shapes(plan.model_spec), 0, *features(plan)))
    # and its layernorm+moe_act recompute re-runs the pre-MLP norm and the experts' activation
    # (test_recomputed_norm_and_activation_by_hand)
    recompute = 4096 * (2880 * 4 + 4) + 4 * 4096 * (2880 * 2 * 2 + 2880 * 2 + 4)
    step = estimate_step(plan)
    assert stage_decoder_layers(plan) == (8, 10, 10, 8)
    assert step.parts["elementwise"] == pytest.approx(plan.num_microbatches * 8 * (per_token * 4096 + recompute)
                                                      / 3350e9)
    op_fuser = THROUGHPUT_ROWS["PS4"].plan
    assert op_fuser.use_transformer_engine_op_fuser and features(op_fuser)[3]


def test_recomputed_norm_and_activation_by_hand():
    """cost/elementwise.py recompute_bytes: the layernorm and moe_act recomputes re-run a module without FLOPs, one
    more read of its input and write of its output (megatron-core 0.19.2 CheckpointWithoutOutput). gpt-oss-120b, one
    MoE layer, 4,096 tokens on one GPU (TP1 CP1): the pre-MLP norm reads and writes 2,880 BF16 values per token and
    keeps an FP32 1/rms; the activation reads the FC1 output (2 x 2,880) and the FP32 routing weight and writes 2,880
    per routed token, 4 per token. DeepSeek-V3 (MLA) has a separate input norm too."""
    from lcmoe_recipes.cost.elementwise import recompute_bytes

    s = shapes(THROUGHPUT_ROWS["PS10"].plan.model_spec)
    norm, act = 4096 * (2880 * 2 * 2 + 4), 4 * 4096 * (2880 * 2 * 2 + 4 + 2880 * 2)
    assert norm == 47202304 and act == 283181056
    both = ("layernorm", "moe_act")
    assert recompute_bytes(s, 0, 4096.0, 1, 1, False, both, True) == norm + act
    assert recompute_bytes(s, 0, 4096.0, 1, 1, False, both, False) == act  # the norm's output is a graph's
    assert recompute_bytes(s, 0, 4096.0, 1, 1, False, ("mla_up_proj", "mlp"), True) == 0.0
    # TP2 with sequence parallelism: the norm runs on half the tokens, the routed tokens halve with them
    assert recompute_bytes(s, 0, 4096.0, 2, 1, True, both, True) == (norm + act) / 2
    dsv3 = shapes(THROUGHPUT_ROWS["PS1"].plan.model_spec)  # hidden 7,168, top-8 experts of width 2,048
    assert recompute_bytes(dsv3, 5, 4096.0, 1, 1, False, ("layernorm",), True) == 2 * 4096 * (7168 * 4 + 4)
    assert recompute_bytes(dsv3, 5, 4096.0, 1, 1, False, ("moe_act",), True) == \
        8 * 4096 * (2048 * 2 * 2 + 4 + 2048 * 2)


def test_moe_act_under_the_op_fuser_is_not_applied():
    """megatron-core 0.19.2 runs the routed experts through the op fuser's fused grouped MLP when
    use_transformer_engine_op_fuser is on, and only the unfused path recomputes the activation
    (transformer/moe/experts.py): moe_act then frees no memory and costs no time, the check says so, and the search
    leaves it out of its rungs. PS4: gpt-oss-120b on 64 GB200, MXFP8 through the op fuser."""
    from lcmoe_recipes.checks import check_plan
    from lcmoe_recipes.core.request import TrainingRequest
    from lcmoe_recipes.cost.memory import CALIBRATED, applied_recompute_modules, estimate_memory
    from lcmoe_recipes.planner.search import _with_knobs

    fused = THROUGHPUT_ROWS["PS4"].plan.with_changes(recompute_granularity="selective",
                                                      recompute_modules=("layernorm", "moe_act"))
    norm_only = fused.with_changes(recompute_modules=("layernorm",))
    unfused = fused.with_changes(use_transformer_engine_op_fuser=False)
    assert applied_recompute_modules(fused) == ("layernorm",)
    assert applied_recompute_modules(unfused) == ("layernorm", "moe_act")
    assert estimate_memory(fused).activations == estimate_memory(norm_only).activations
    assert estimate_step(fused).step_seconds == estimate_step(norm_only).step_seconds
    # unfused, each of the 36 layers drops its activation output: top-4 x 2,880 BF16 per token of the rank's MBS 4 x
    # 4,096 (PP1: one microbatch in flight), at the memory model's activation scale
    dropped = estimate_memory(unfused.with_changes(recompute_modules=("layernorm",))).activations \
        - estimate_memory(unfused).activations
    assert dropped == pytest.approx(CALIBRATED.activation_scale * 36 * 4 * 4096 * 4 * 2880 * 2)
    rules = {f.rule: f.severity for f in check_plan(fused)}
    assert rules.get("recompute/moe-act-op-fuser") == "warning" and "recompute/moe-act-op-fuser" not in {
        f.rule for f in check_plan(unfused)}
    rung = _with_knobs(fused, ("selective", ("layernorm", "moe_act")), 0.0, fused.hardware_spec,
                       TrainingRequest(model="gpt_oss_120b", seq_length=4096, hardware="gb200", num_gpus=64))
    assert rung.recompute_modules == ("layernorm",)
