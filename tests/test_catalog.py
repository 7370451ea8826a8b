"""Offline catalogue: the config.json values we ship, and the hardware table."""

import pytest

from lcmoe_recipes.catalog import get_hardware, get_model
from lcmoe_recipes.errors import UnknownName


def test_deepseek_v3_architecture():
    # deepseek-ai/DeepSeek-V3 config.json (catalog/hf_configs/SOURCES.md)
    m = get_model("deepseek_v3")
    assert m.key == "dsv3"
    assert (m.num_layers, m.mtp_num_layers, m.num_moe_experts, m.moe_router_topk) == (61, 1, 256, 8)
    assert (m.hidden_size, m.num_attention_heads, m.num_dense_layers, m.vocab_size) == (7168, 128, 3, 129280)
    assert m.config["kv_lora_rank"] == 512 and m.config["q_lora_rank"] == 1536
    assert m.attention_kind == "mla"


def test_qwen3_235b_architecture():
    # Qwen/Qwen3-235B-A22B config.json
    m = get_model("qwen3-235b-a22b")
    assert (m.num_layers, m.num_moe_experts, m.moe_router_topk) == (94, 128, 8)
    assert (m.num_attention_heads, m.num_query_groups, m.hidden_size) == (64, 4, 4096)
    assert m.attention_kind == "gqa" and m.mtp_num_layers == 0


def test_qwen3_next_architecture():
    # Qwen/Qwen3-Next-80B-A3B-Instruct config.json
    m = get_model("qwen3_next")
    assert (m.num_layers, m.num_moe_experts, m.moe_router_topk) == (48, 512, 10)
    assert m.linear_num_heads == (16, 32)
    assert (m.num_attention_heads, m.num_query_groups) == (16, 2)
    assert m.config["full_attention_interval"] == 4
    assert m.attention_kind == "gated_deltanet+gqa"


def test_unknown_model_names_valid_ones():
    with pytest.raises(UnknownName) as err:
        get_model("qwen3_253b")
    assert "unknown model 'qwen3_253b'" in str(err.value)
    assert "qwen3_235b" in err.value.fix and "dsv3" in err.value.fix


def test_hardware_catalogue():
    assert get_hardware("H100").nvlink_domain == 8
    gb200 = get_hardware("gb200_nvl72")
    assert (gb200.nvlink_domain, gb200.gpus_per_node, gb200.compute_capability) == (72, 4, (10, 0))
    assert get_hardware("h100").supports_deepep and not gb200.supports_deepep
    assert get_hardware("b200").supports_deepep and gb200.supports_hybridep
    with pytest.raises(UnknownName, match="valid hardware: h100, h200, b200, gb200, gb300"):
        get_hardware("a100")


def test_stack_versions_describe_says_where_each_version_comes_from():
    from lcmoe_recipes.catalog.versions import StackVersions

    stack = StackVersions({"megatron-core": "0.19.2", "megatron-bridge": "0.6.2", "transformer-engine": "2.20.2"},
                          "installed here",
                          {"transformer-engine": "assumed: the full environment's, requirements/te.txt; not installed here"})
    assert stack.describe() == ("megatron-core 0.19.2, megatron-bridge 0.6.2 (installed here); transformer-engine "
                                "2.20.2 (assumed: the full environment's, requirements/te.txt; not installed here)")
    assert stack.describe(("transformer-engine",)) == ("transformer-engine 2.20.2 (assumed: the full environment's, "
                                                       "requirements/te.txt; not installed here)")
