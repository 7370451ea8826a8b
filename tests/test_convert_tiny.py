"""megatron-bridge's converter on tiny models of each family, built locally with random weights (no hub).

On a CPU (this suite's machine) megatron-bridge 0.6.2 / megatron-core 0.19.2 can build and fill a GQA MoE model
(Qwen3-MoE) with megatron-core's local modules, but cannot save a checkpoint (the CUDA RNG state), build MLA layers
(their rotary embedding is created on CUDA), run a RoPE forward (``RotaryEmbedding.get_emb`` moves ``inv_freq`` to
CUDA), or build MTP and gated-DeltaNet layers without Transformer Engine. So here: the Qwen3-MoE conversion is
proven exact in memory (Hugging Face -> Megatron -> Hugging Face gives every tensor back bit for bit), and the parts
that need TE are refused with the reason. Saving, loading back and the logit match run in scripts/gpu_proof.sh.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

# Few-layer, few-expert configs of each family (config.json fields of the published models, dimensions shrunk).
TINY = {
    "qwen3_moe": ("Qwen3MoeConfig", dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_experts=8, num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, tie_word_embeddings=False, decoder_sparse_step=1, mlp_only_layers=[],
        norm_topk_prob=True)),
    "deepseek_v3": ("DeepseekV3Config", dict(  # MLA + MoE + MTP + one dense first layer, YaRN positions
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
        topk_group=1, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, max_position_embeddings=512,
        num_nextn_predict_layers=1, tie_word_embeddings=False,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 32,
                      "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})),
    "qwen3_next": ("Qwen3NextConfig", dict(  # 3 gated-DeltaNet layers + 1 full-attention layer, shared expert
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=4, full_attention_interval=4, num_experts=8,
        num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        partial_rotary_factor=0.25, max_position_embeddings=512, tie_word_embeddings=False, decoder_sparse_step=1,
        mlp_only_layers=[], norm_topk_prob=True)),
}


@pytest.fixture(scope="module")
def one_rank():
    """torch.distributed (gloo, one rank) and megatron-core's model-parallel state, by megatron-bridge's own helper."""
    from lcmoe_recipes.emit.stack import load_bridge

    load_bridge(quiet=True)
    from megatron.bridge.training.model_load_save import temporary_distributed_context

    with temporary_distributed_context(backend="gloo"):
        yield


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    from lcmoe_recipes.emit.convert import write_random_hf_checkpoint

    root = tmp_path_factory.mktemp("tiny_hf")
    return {name: write_random_hf_checkpoint(config, cls, root / name) for name, (cls, config) in TINY.items()}


def test_qwen3_moe_converts_exactly(one_rank, tiny_folders):
    from safetensors.torch import load_file

    from lcmoe_recipes.emit.stack import te_installed
    from lcmoe_recipes.emit.convert import load_hf_model

    folder = tiny_folders["qwen3_moe"]
    bridge, model, changes = load_hf_model(folder, overrides={"moe_token_dispatcher_type": "allgather"})
    if not te_installed():
        assert "transformer_impl: 'transformer_engine' -> 'local'" in changes
        assert "moe_grouped_gemm: True -> False" in changes and "moe_permute_fusion: True -> False" in changes
    original = load_file(str(folder / "model.safetensors"))
    back = {name: tensor for name, tensor in bridge.export_hf_weights(model)}
    assert set(back) == set(original) and len(original) == 69  # embed, lm_head, norm + 2 x (2 norms, q k v o,
    # q_norm, k_norm, router, 8 experts x gate/up/down)
    assert all(back[k].dtype == original[k].dtype and back[k].equal(original[k]) for k in original)
    megatron_params = sum(p.numel() for p in model[0].parameters())
    assert megatron_params == sum(t.numel() for t in original.values()) == 157056


def test_deepseek_v3_mtp_needs_transformer_engine(one_rank, tiny_folders):
    from lcmoe_recipes.emit.local_impl import NeedsTransformerEngine
    from lcmoe_recipes.emit.stack import te_installed
    from lcmoe_recipes.emit.convert import load_hf_model

    if te_installed():
        pytest.skip("with Transformer Engine the MTP layers build (on a GPU)")
    with pytest.raises(NeedsTransformerEngine, match=r"1 multi-token-prediction layer\(s\), which megatron-bridge "
                                                     r"0.6.2 builds only with Transformer Engine"):
        load_hf_model(tiny_folders["deepseek_v3"])


def test_qwen3_next_needs_transformer_engine(one_rank, tiny_folders):
    from lcmoe_recipes.emit.local_impl import NeedsTransformerEngine
    from lcmoe_recipes.emit.stack import te_installed
    from lcmoe_recipes.emit.convert import load_hf_model

    if te_installed():
        pytest.skip("with Transformer Engine the gated-DeltaNet layers build")
    with pytest.raises(NeedsTransformerEngine, match="'gated_delta_net' layers are built only with Transformer Engine"):
        load_hf_model(tiny_folders["qwen3_next"])
