"""Without Transformer Engine (lcmoe_recipes.emit.local_impl): what megatron-core 0.19.2's local modules cannot run is
changed with its reason or refused -- each upstream failure shown here first, then our handling of it."""

from __future__ import annotations

import copy

import pytest

from lcmoe_recipes.emit.stack import te_installed

pytestmark = [pytest.mark.slow, pytest.mark.skipif(te_installed(), reason="the path without Transformer Engine")]


def test_layernorm_recompute_reaches_an_undefined_fp8_manager():
    """Upstream: CheckpointWithoutOutput() takes its default fp8=False for FP8 (random.py:740) and calls TE."""
    import torch
    from megatron.core.tensor_parallel.random import CheckpointWithoutOutput, CheckpointWithoutOutputFunction

    checkpoint = CheckpointWithoutOutput()
    assert checkpoint.fp8 is True
    with pytest.raises(NameError, match="FP8GlobalStateManager"):  # the step checkpoint() takes after its RNG states
        CheckpointWithoutOutputFunction.apply(lambda x: x * 2, checkpoint, torch.ones(2, requires_grad=True))


def test_moe_act_recompute_without_grouped_gemm_is_refused_upstream(fresh_config):
    from lcmoe_recipes.emit.stack import quiet_upstream

    _, cfg = fresh_config("qwen3_235b_128k_gb200")
    model = cfg.model
    model.moe_grouped_gemm = False
    model.cuda_graph_impl = "none"
    with pytest.raises(ValueError, match="moe_act in recompute_modules is only supported with moe_grouped_gemm"):
        with quiet_upstream():
            model.finalize()


def test_qwen3_235b_is_changed_with_reasons_and_then_validates(fresh_config):
    from megatron.bridge.training.config import runtime_config_update

    from lcmoe_recipes.catalog import get_hardware
    from lcmoe_recipes.emit.local_impl import use_local_implementation
    from lcmoe_recipes.emit.stack import quiet_upstream
    from lcmoe_recipes.emit.target import target_environment

    plan, cfg = fresh_config("qwen3_235b_128k_gb200")
    changes = use_local_implementation(cfg.model)
    text = "\n".join(changes)
    assert "transformer_impl: 'transformer_engine' -> 'local'" in changes
    assert "moe_router_fusion: True -> False -- the fused top-k and aux-loss kernels are TE's" in text
    assert "cuda_graph_impl: 'transformer_engine' -> 'none'" in text
    assert "'moe_act' dropped: only TE's TEGroupedMLP recomputes" in text
    assert cfg.model.recompute_granularity is None and not cfg.model.moe_router_fusion
    with target_environment(get_hardware("gb200"), plan.layout.world), quiet_upstream():
        runtime_config_update(copy.deepcopy(cfg))  # megatron-bridge's validate() accepts what we run


def test_a_remaining_module_keeps_selective_recompute(fresh_config):
    from lcmoe_recipes.emit.local_impl import use_local_implementation

    _, cfg = fresh_config("qwen3_next_32k_gb200")  # layernorm + moe: moe stays (megatron-core's own code)
    cfg.model.experimental_attention_variant = None  # only to reach the recompute switch (its refusal: below)
    cfg.model.mtp_num_layers = None
    changes = "\n".join(use_local_implementation(cfg.model))
    assert "'layernorm' dropped: megatron-core 0.19.2 tensor_parallel/random.py:740" in changes
    assert (cfg.model.recompute_granularity, cfg.model.recompute_modules) == ("selective", ["moe"])


def test_mla_is_refused_and_the_upstream_failure_is_real(fresh_config, configs):
    from lcmoe_recipes.emit.local_impl import NeedsTransformerEngine, local_refusals, use_local_implementation

    _, cfg = fresh_config("dsv3_128k_h100")
    with pytest.raises(NeedsTransformerEngine, match="multi-latent attention runs only with Transformer Engine"):
        use_local_implementation(cfg.model, drop_mtp=True)
    assert [str(e.message).split(" ")[0] for e in local_refusals(cfg.model)] == ["this", "multi-latent"]  # MTP, MLA
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    with pytest.raises(TypeError, match="unexpected keyword argument 'k_channels'"):
        DotProductAttention(configs["dsv3_128k_h100"][1].model, 1, None, "self", k_channels=192)
    _, nxt = fresh_config("qwen3_next_8k_gb200")
    with pytest.raises(NeedsTransformerEngine, match="'gated_delta_net' layers are built only with"):
        use_local_implementation(nxt.model, drop_mtp=True)
