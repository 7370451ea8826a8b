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
    from lcmoe_recipes.emit.local_impl import run_without_te, switch_to_local
    from lcmoe_recipes.emit.stack import quiet_upstream
    from lcmoe_recipes.emit.target import target_environment

    plan, cfg = fresh_config("qwen3_235b_128k_gb200")
    # its CP8 is refused (below); the switch and the run changes it gets on a TE-less machine at CP1 are these
    changes = switch_to_local(cfg.model) + run_without_te(cfg.model)
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
    cfg.model.context_parallel_size = 1  # ditto (its CP refusal: below)
    changes = "\n".join(use_local_implementation(cfg.model))
    assert "'layernorm' dropped: megatron-core 0.19.2 tensor_parallel/random.py:740" in changes
    assert (cfg.model.recompute_granularity, cfg.model.recompute_modules) == ("selective", ["moe"])


def test_mla_is_refused_and_the_upstream_failure_is_real(fresh_config, configs):
    from lcmoe_recipes.emit.local_impl import NeedsTransformerEngine, local_refusals, use_local_implementation

    _, cfg = fresh_config("dsv3_128k_h100")
    with pytest.raises(NeedsTransformerEngine, match="multi-latent attention runs only with Transformer Engine"):
        use_local_implementation(cfg.model, drop_mtp=True)
    assert [str(e.message).split(" ")[0] for e in local_refusals(cfg.model)] == ["this", "multi-latent",
                                                                                "context"]  # MTP, MLA, CP
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    with pytest.raises(TypeError, match="unexpected keyword argument 'k_channels'"):
        DotProductAttention(configs["dsv3_128k_h100"][1].model, 1, None, "self", k_channels=192)
    _, nxt = fresh_config("qwen3_next_8k_gb200")
    with pytest.raises(NeedsTransformerEngine, match="'gated_delta_net' layers are built only with"):
        use_local_implementation(nxt.model, drop_mtp=True)


def test_context_parallelism_is_refused_and_the_upstream_assertion_is_real(fresh_config):
    """The local DotProductAttention cannot run CP > 1 (megatron-core 0.19.2 dot_product_attention.py:57); the refusal
    names the fix, and a CP1 copy of the same config is not refused."""
    from lcmoe_recipes.emit.local_impl import NeedsTransformerEngine, local_refusals, use_local_implementation

    _, cfg = fresh_config("qwen3_235b_128k_gb200")  # BF16 GQA: CP8 is its only TE-only part
    assert cfg.model.context_parallel_size == 8
    with pytest.raises(NeedsTransformerEngine, match=r"context parallelism \(8 ranks\) runs only with Transformer "
                                                     r"Engine") as err:
        use_local_implementation(cfg.model)
    assert "model.context_parallel_size=1" in err.value.fix
    cfg.model.context_parallel_size = 1
    assert local_refusals(cfg.model) == []
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    cfg.model.context_parallel_size = 8
    with pytest.raises(AssertionError, match="Context parallelism is only supported by TEDotProductAttention"):
        DotProductAttention(cfg.model, 1, AttnMaskType.causal, "self")


def test_precision_aware_optimizer_is_turned_off_without_te_and_memory_reads_it_back(fresh_config):
    """megatron-core 0.19.2 builds the precision-aware optimizer only on TE's FusedAdam (the first GPU run, an H200 on
    2026-12-04, stopped at OptimizerConfig.__post_init__); without it the master weights are whole fp32 (4 bytes, not
    store_param_remainders' 2), and the plan read back from the changed config says so."""
    import torch

    from lcmoe_recipes.cost.memory import master_weight_bytes
    from lcmoe_recipes.emit.local_impl import NeedsTransformerEngine, optimizer_without_te
    from lcmoe_recipes.emit.readback import plan_from_config

    _, cfg = fresh_config("dsv3_128k_h100")  # precision-aware, offloaded to the CPU: left as it is
    assert cfg.optimizer.use_precision_aware_optimizer and cfg.optimizer.optimizer_cpu_offload
    assert optimizer_without_te(cfg.optimizer) == []
    cfg.optimizer.optimizer_cpu_offload = False  # on the GPU: TE's FusedAdam
    with pytest.raises(NeedsTransformerEngine, match=r"keeps main_grads_dtype=torch.bfloat16, which only"):
        optimizer_without_te(cfg.optimizer)  # DeepSeek-V3's recipe keeps BF16 main gradients
    cfg.optimizer.main_grads_dtype = torch.float32
    assert master_weight_bytes(plan_from_config(cfg, "h100", 256)) == 2
    (line,) = optimizer_without_te(cfg.optimizer)
    assert line.startswith("use_precision_aware_optimizer: True -> False -- megatron-core 0.19.2 builds it only on "
                           "TE's FusedAdam")
    assert master_weight_bytes(plan_from_config(cfg, "h100", 256)) == 4
    assert optimizer_without_te(cfg.optimizer) == []  # nothing left to change


def test_prebuilt_dataset_helpers_replace_the_start_up_build_that_the_wheel_cannot_run():
    """The megatron-core 0.19.2 wheel has the built dataset-helper extension but no Makefile, so megatron-core's own
    compile_helpers exits (the first GPU run, 2026-12-04, stopped there); after use_prebuilt_dataset_helpers the
    reference megatron-bridge 0.6.2's initialize_megatron calls imports the extension instead, and nothing is built."""
    import os

    import megatron.bridge.training.initialize as initialize
    import megatron.core.datasets as datasets
    from megatron.core.datasets.utils import compile_helpers

    from lcmoe_recipes.emit.stack import use_prebuilt_dataset_helpers

    folder = os.path.dirname(datasets.__file__)
    if os.path.exists(os.path.join(folder, "Makefile")):
        pytest.skip("megatron-core installed from source: its Makefile builds the helpers")
    with pytest.raises(SystemExit):
        compile_helpers()  # megatron-core's own: `make` finds nothing to run
    original = initialize.compile_helpers
    try:
        line = use_prebuilt_dataset_helpers()
        assert "start-up build is skipped" in line and initialize.compile_helpers is not original
        initialize.compile_helpers()  # imports the extension; no make, no exit
        from megatron.core.datasets import helpers_cpp

        assert hasattr(helpers_cpp, "build_sample_idx_int32")
    finally:
        initialize.compile_helpers = original


def test_fused_softmax_without_its_extension_fails_upstream_and_is_turned_off(fresh_config):
    """megatron-core 0.19.2's local attention asks the compiled scaled_masked_softmax_cuda extension for its block
    size whenever the fused softmax may apply (keys of 16-4096 tokens): a pip installation has no such extension."""
    import importlib.util

    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    from megatron.core.transformer.enums import AttnMaskType

    from lcmoe_recipes.emit.local_impl import run_without_te

    if importlib.util.find_spec("scaled_masked_softmax_cuda"):
        pytest.skip("the compiled softmax extension is installed here")
    softmax = FusedScaleMaskSoftmax(input_in_fp16=False, input_in_bf16=True, attn_mask_type=AttnMaskType.causal,
                                    scaled_masked_softmax_fusion=True, mask_func=None, softmax_in_fp32=False,
                                    scale=None)
    with pytest.raises(ModuleNotFoundError, match="scaled_masked_softmax_cuda"):
        softmax.is_kernel_available(None, 1, 16, 4096, 4096)
    _, cfg = fresh_config("qwen3_next_8k_gb200")
    assert cfg.model.masked_softmax_fusion
    assert any(line.startswith("masked_softmax_fusion: True -> False -- the fused softmax of megatron-core's local "
                               "attention is the compiled scaled_masked_softmax_cuda extension")
               for line in run_without_te(cfg.model))
    assert not cfg.model.masked_softmax_fusion
