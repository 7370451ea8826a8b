"""Our per-layer activation table (lcmoe_recipes.cost.memory) against the bytes one real megatron-core layer keeps for
its backward pass, measured on this CPU (lcmoe_recipes.emit.probe.activations): dense MLP, MoE with shared experts, MLA
and GQA attention (with q/k norms), with and without each recompute module, at TP 1 and 2 (sequence parallel).

Equal to the byte, except for two named differences:
* MoE routing metadata -- megatron-core's unfused router and permutation keep int64 top-k and sorted indices and
  fp32 top-k probabilities our table does not list (a few hundred bytes per token, under 1.5% of a layer here; TE's
  fused router keeps another set): ``ROUTING``;
* GQA with ``layernorm`` recompute -- megatron-core's local spec has a separate input norm, which that recompute
  drops; Transformer Engine's (the run's) fuses it into linear_qkv, where it stays: the norm output and its fp32
  statistics, as the table keeps them.
Not measured here (they need Transformer Engine): gated DeltaNet layers and the ``moe_act`` recompute.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

ROUTING = 0.015  # MoE layers: measured / table - 1 in [0, ROUTING) (module doc)


@pytest.fixture(scope="module")
def plans():
    from lcmoe_recipes.emit.stack import load_bridge
    from lcmoe_recipes.core.request import TrainingRequest
    from lcmoe_recipes.planner.search import search_layouts as search

    load_bridge(quiet=True)
    return {model: search(TrainingRequest(model=model, seq_length=4096, hardware="h200", num_gpus=1,
                                          precision="bf16", dispatcher="alltoall")).best.plan
            for model in ("proxy_dsv3", "proxy_qwen3_moe", "proxy_qwen3_next")}


def _measure(plans, model, layer, tp=1, *modules):
    from lcmoe_recipes.emit.probe.activations import measure_layer

    return measure_layer(plans[model], layer, tokens=256, tp=tp, granularity="selective" if modules else None,
                         modules=modules)


@pytest.fixture(scope="module")
def measure(plans):
    """measure(model, layer, tp=1, *modules): one real layer measured once per module; the tests that look at the same
    layer and recompute choice read the same measurement (a refusal is raised again each time)."""
    done = {}

    def get(model, layer, tp=1, *modules):
        key = (model, layer, tp, modules)
        if key not in done:
            done[key] = _measure(plans, model, layer, tp, *modules)
        return done[key]

    return get


@pytest.mark.parametrize("modules", [(), ("mla_up_proj",), ("layernorm",), ("mlp",)])
def test_mla_dense_layer_equals_the_table(plans, measure, modules):
    """DeepSeek-V3's first layer kind (MLA + dense MLP), shrunk: every tensor the table lists, and no other."""
    result = measure("proxy_dsv3", 0, 1, *modules)
    assert (result.attention, result.moe) == ("mla", False)
    assert result.measured_bytes == result.predicted_bytes, result.by_module
    assert "mla-fused-rope-cpu" in result.stand_ins and "te-fused-attention" in result.stand_ins


def test_mla_without_up_projection_recompute_keeps_no_second_copy(plans, measure):
    """The table once counted the up projections' output and the roped q/k/v both (28% high for DeepSeek-V3): the
    fused YaRN RoPE ropes q in place and writes new k and v, and nothing keeps the kv up projection's output."""
    from lcmoe_recipes.cost.memory import layer_activations_kept
    from lcmoe_recipes.cost.shapes import shapes

    kept, dropped = (measure("proxy_dsv3", 0, 1, *m).measured_bytes for m in ((), ("mla_up_proj",)))
    s = shapes(plans["proxy_dsv3"].model_spec)
    assert kept - dropped == 256 * s.nq * (2 * s.d_qk + s.d_v) * 2  # q, k, v of 256 tokens, bf16
    assert layer_activations_kept(s, 0, 256, 1, 1, False, None, ()) == kept


def test_mla_moe_layer(plans, measure):
    full = measure("proxy_dsv3", 1)
    assert (full.attention, full.moe) == ("mla", True)
    assert 0 <= full.ratio - 1 < ROUTING
    dropped = measure("proxy_dsv3", 1, 1, "moe")  # the whole MoE block recomputed: no routing left
    assert dropped.measured_bytes == dropped.predicted_bytes


def test_gqa_moe_layer_with_qk_norms_at_tp1_and_tp2(plans, measure):
    one, two = measure("proxy_qwen3_moe", 0, 1), measure("proxy_qwen3_moe", 0, 2)
    assert (one.attention, one.moe) == ("full", True)
    assert 0 <= one.ratio - 1 < ROUTING and 0 <= two.ratio - 1 < ROUTING
    # sequence parallel and heads split everything by TP but a few per-expert counts and scalars of the router
    assert abs(one.measured_bytes - 2 * two.measured_bytes) <= 512
    moe = measure("proxy_qwen3_moe", 0, 2, "moe")
    assert moe.measured_bytes == moe.predicted_bytes


def test_gqa_layernorm_recompute_differs_only_by_the_fused_input_norm(plans, measure):
    from lcmoe_recipes.cost.memory import layer_activations_kept
    from lcmoe_recipes.cost.shapes import shapes

    result = measure("proxy_qwen3_moe", 0, 1, "layernorm")
    s = shapes(plans["proxy_qwen3_moe"].model_spec)
    fused_norm = 256 * s.h * 2 + 256 * 4  # TE keeps it inside linear_qkv: output (bf16) and 1/rms (fp32)
    routing = result.measured_bytes - (result.predicted_bytes - fused_norm)
    assert 0 <= routing < ROUTING * result.predicted_bytes
    assert layer_activations_kept(s, 0, 256, 1, 1, False, "selective", ("layernorm",)) == result.predicted_bytes


def test_what_needs_transformer_engine_is_refused(plans, measure):
    from lcmoe_recipes.emit.probe.activations import NotMeasurable
    from lcmoe_recipes.emit.stack import te_installed

    if te_installed():
        pytest.skip("measurable with Transformer Engine")
    with pytest.raises(NotMeasurable, match="moe_act recompute runs only in TE's grouped MLP"):
        measure("proxy_qwen3_moe", 0, 1, "moe_act")
    with pytest.raises(NotMeasurable, match="'gated_delta_net' layers are built only with Transformer Engine"):
        measure("proxy_qwen3_next", 0)


def test_local_modules_keep_the_softmax_probabilities_and_the_excess_extrapolates_exactly(plans):
    """Without TE (the GPU proof's run), megatron-core's local attention keeps its s x s softmax probabilities in bf16
    (transformer/dot_product_attention.py) and the torch RMSNorm its own saved set: the excess over the TE run,
    measured at 256, 512 and 768 tokens and carried to 1,024 by the quadratic through them, is the excess measured
    at 1,024 (to 0.1%); its s² part is the probabilities, 2 bytes x heads x s²."""
    from lcmoe_recipes.emit.probe.activations import CAUSAL_MASK_MODULE, local_excess_bytes, measure_layer

    plan = plans["proxy_qwen3_moe"]
    heads = plan.model_spec.config["num_attention_heads"]
    local = measure_layer(plan, 0, 1024, te_kernels=False)
    te = measure_layer(plan, 0, 1024)
    assert local.stand_ins == ("cuda-on-cpu", "checkpoint-fp8-default") and "te-fused-attention" in te.stand_ins
    assert local.by_module[CAUSAL_MASK_MODULE] == 1024 ** 2  # the bool causal mask, shared by every layer in a run
    measured = local.measured_bytes - local.by_module[CAUSAL_MASK_MODULE] - te.measured_bytes
    carried = local_excess_bytes(plan, 0, 1024, points=(256, 512, 768))
    assert abs(carried / measured - 1) < 1e-3
    quadratic = (local_excess_bytes(plan, 0, 2048, points=(256, 512, 768)) - 2 * carried
                 + local_excess_bytes(plan, 0, 0, points=(256, 512, 768)))  # second difference at 0, 1024, 2048
    assert quadratic == pytest.approx(2 * 2 * heads * 1024 ** 2, rel=1e-3)  # f(2n) - 2f(n) + f(0) = 2·c·n²
