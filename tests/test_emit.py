"""Plans -> real megatron-bridge ConfigContainers, validated for their target; YAML; overrides; offline build."""

import copy
import os
import re
import sys
import textwrap

import pytest

from lcmoe_recipes.emit.fields import precision_of
from lcmoe_recipes.errors import InfeasibleConfig, OverrideError

pytestmark = pytest.mark.slow

# name: (TP, CP, EP, PP, VPP, seq_length, mixed_precision, backend, recompute_modules, cuda graph modules)
EXPECTED = {
    "dsv3_128k_h100": (1, 32, 32, 8, 4, 131072, "fp8_blockwise", "deepep",
                       ["mla_up_proj", "layernorm", "moe", "mlp"], []),
    "dsv3_256k_h100": (1, 64, 32, 8, 4, 262144, "fp8_blockwise", "deepep",
                       ["mla_up_proj", "layernorm", "moe", "mlp"], []),
    "qwen3_235b_128k_gb200": (4, 8, 32, 4, 12, 131072, "bf16", "hybridep", ["moe_act"],
                              ["attn", "moe_router", "moe_preprocess"]),
    "qwen3_next_8k_gb200": (1, 1, 16, 2, 4, 8192, "bf16", "hybridep", ["layernorm", "moe_act"], []),
    "qwen3_next_32k_gb200": (1, 4, 16, 2, 4, 32768, "bf16", "hybridep", ["layernorm", "moe"], []),
    "qwen3_next_64k_gb200": (1, 16, 16, 2, 4, 65536, "bf16", "hybridep", ["layernorm", "moe"], []),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_config_container_values(configs, name):
    from megatron.bridge.training.config import ConfigContainer

    tp, cp, ep, pp, vpp, seq, mp, backend, modules, graphs = EXPECTED[name]
    plan, cfg = configs[name]
    m = cfg.model
    assert isinstance(cfg, ConfigContainer)
    assert (m.tensor_model_parallel_size, m.context_parallel_size, m.expert_model_parallel_size) == (tp, cp, ep)
    assert (m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size, m.expert_tensor_parallel_size) == (pp, vpp, 1)
    assert m.seq_length == cfg.dataset.seq_length == seq
    assert precision_of(cfg.mixed_precision) == mp
    # FP32 gradient reduction and accumulation (upstream's perf recipes reduce in BF16 for benchmarking only)
    assert cfg.mixed_precision.grad_reduce_in_fp32 is True and cfg.ddp.grad_reduce_in_fp32 is True
    assert plan.grad_dtype == "fp32"
    assert (m.moe_token_dispatcher_type, m.moe_flex_dispatcher_backend) == ("flex", backend)
    assert m.recompute_granularity == "selective" and m.recompute_modules == modules
    assert (list(m.cuda_graph_modules) if graphs else m.cuda_graph_impl == "none" and []) == graphs
    assert m.cuda_graph_impl == ("transformer_engine" if graphs else "none")
    assert cfg.train.global_batch_size == plan.global_batch_size and cfg.train.micro_batch_size == 1
    assert cfg.dataset.blend is None and cfg.tokenizer.tokenizer_type == "NullTokenizer"
    assert cfg.tokenizer.vocab_size == plan.model_spec.vocab_size


def test_dsv3_offload_and_mla(configs):
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    _, cfg = configs["dsv3_128k_h100"]
    opt = cfg.optimizer
    assert opt.optimizer_cpu_offload and opt.optimizer_offload_fraction == 1.0 and opt.overlap_cpu_optimizer_d2h_h2d
    assert opt.use_distributed_optimizer and cfg.ddp.use_distributed_optimizer and opt.use_precision_aware_optimizer
    m = cfg.model
    assert (m.num_layers, m.mtp_num_layers, m.num_moe_experts, m.multi_latent_attention) == (61, 1, 256, True)
    layout = PipelineParallelLayerLayout.from_str(m.pipeline_model_parallel_layout, 8)
    assert layout.virtual_pipeline_model_parallel_size == 4
    layout.validate_layer_layout(num_layers=61, mtp_num_layers=1)  # raises if illegal
    # the layer spec answers the *target* (TE present), not this TE-less machine
    assert m.transformer_layer_spec.keywords["use_transformer_engine"] is True
    env = cfg.env_vars  # upstream's perf-recipe environment, minus HybridEP's variables (DeepEP here)
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == 1 and env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["NVTE_FWD_LAYERNORM_SM_MARGIN"] == 20 and "NVLINK_DOMAIN_SIZE" not in env
    assert m.init_method_std == 0.006 and m.cross_entropy_fusion_impl == "te"  # as upstream (TE 2.18+ fixed)
    assert cfg.dataset.create_attention_mask is False and m.moe_router_force_load_balancing is False


def test_qwen3_235b_pipeline_and_env(configs):
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    _, cfg = configs["qwen3_235b_128k_gb200"]
    m = cfg.model
    layout = PipelineParallelLayerLayout.from_str(m.pipeline_model_parallel_layout, 4)
    assert layout.virtual_pipeline_model_parallel_size == 12
    layout.validate_layer_layout(num_layers=94, mtp_num_layers=None)
    assert m.sequence_parallel and m.use_te_rng_tracker and cfg.rng.te_rng_tracker
    assert cfg.env_vars["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == 32
    assert cfg.env_vars["USE_MNNVL"] == 1 and cfg.env_vars["NCCL_GRAPH_REGISTER"] == 0  # graphs + expandable segments
    # TP 4 with sequence parallelism: upstream's recipe asks for TP communication overlap, and here it applies
    assert m.moe_router_dtype == "fp32" and cfg.comm_overlap.tp_comm_overlap is True
    assert (m.position_embedding_type, m.yarn_rotary_scaling_factor, m.yarn_original_max_position_embeddings) == (
        "yarn", 4.0, 32768)  # Qwen3 model card: YaRN factor 4 over 32,768 for 131,072


def test_qwen3_235b_mxfp8_selectable():
    from lcmoe_recipes import qwen3_235b_128k_gb200

    cfg = qwen3_235b_128k_gb200(precision="mxfp8")
    assert precision_of(cfg.mixed_precision) == "mxfp8" and cfg.mixed_precision.fp8_recipe == "mxfp8"


def test_yaml_round_trip(configs, tmp_path):
    from lcmoe_recipes.emit import plan_from_config, read_yaml, validate_config, write_yaml

    for name, (plan, cfg) in configs.items():
        path = write_yaml(cfg, tmp_path / f"{name}.yaml", {"recipe": name, "world_size": plan.layout.world,
                                                           "hardware": plan.hardware})
        back, meta = read_yaml(path)
        assert meta == {"recipe": name, "world_size": plan.layout.world, "hardware": plan.hardware}
        again = tmp_path / f"{name}.again.yaml"
        back.to_yaml(str(again))
        assert again.read_text() == path.read_text().split("\n", 1)[1]  # identical ConfigContainer YAML
        assert plan_from_config(back, plan.hardware, plan.layout.world, name) == plan
        validate_config(back, plan.hardware, plan.layout.world, name)


def test_validation_judges_the_target_not_this_machine(fresh_config):
    import torch
    from lcmoe_recipes.emit import validate_config

    env_before = dict(os.environ)
    probe_before = torch.cuda.get_device_properties
    plan, cfg = fresh_config("qwen3_235b_128k_gb200")
    mixed_before = copy.deepcopy(cfg.mixed_precision)
    validate_config(cfg, "gb200", 128)                 # passes for the planned target
    with pytest.raises(InfeasibleConfig, match="does not divide the world size 96"):
        validate_config(cfg, "gb200", 96)               # a world size that does not fold
    assert dict(os.environ) == env_before and torch.cuda.get_device_properties is probe_before
    assert cfg.mixed_precision == mixed_before          # validation ran on a copy


def test_upstream_validate_rejects_deepep_on_gb200(fresh_config):
    """Our check fires first; upstream's validate_flex_dispatcher_backend, answered for GB200, agrees."""
    from lcmoe_recipes.emit.target import target_environment
    from lcmoe_recipes.catalog import get_hardware
    from megatron.bridge.training.flex_dispatcher_backend import validate_flex_dispatcher_backend

    _, cfg = fresh_config("qwen3_235b_128k_gb200")
    cfg.model.moe_flex_dispatcher_backend = "deepep"
    with target_environment(get_hardware("gb200"), 128):
        with pytest.raises(ValueError, match="DeepEP is supported for Ampere, Hopper"):
            validate_flex_dispatcher_backend(cfg.model)
    with target_environment(get_hardware("h100"), 128):
        validate_flex_dispatcher_backend(cfg.model)  # fine on H100


def test_overrides(fresh_config):
    from lcmoe_recipes.emit import apply_overrides, validate_config

    _, cfg = fresh_config("qwen3_235b_128k_gb200")
    apply_overrides(cfg, ["model.tensor_model_parallel_size=8", "model.context_parallel_size=4", "+env_vars.NCCL_DEBUG=INFO",
                          "train.global_batch_size=128", "~model.recompute_modules"])
    assert cfg.model.tensor_model_parallel_size == 8 and cfg.env_vars["NCCL_DEBUG"] == "INFO"
    assert cfg.train.global_batch_size == 128
    assert cfg.model.recompute_modules is None  # "~" resets a dataclass field to its default
    warnings = validate_config(cfg, "gb200", 128)  # megatron-core then fills in ["core_attn"]: legal but costly
    assert [w.rule for w in warnings if w.rule != "known-issue/assumed-version"] == ["recompute/core-attn-long-context"]

    with pytest.raises(OverrideError, match="did you mean 'model.tensor_model_parallel_size'"):
        apply_overrides(cfg, ["model.tensor_model_paralel_size=4"])
    with pytest.raises(OverrideError, match="'model.foo' is not a field of GPTModelProvider"):
        apply_overrides(cfg, ["+model.foo=1"])
    with pytest.raises(OverrideError, match="cannot parse override"):
        apply_overrides(cfg, ["model.tensor_model_parallel_size=="])
    assert cfg.model.tensor_model_parallel_size == 8  # a rejected override changes nothing


def test_override_breaking_a_rule(fresh_config):
    from lcmoe_recipes.emit import apply_overrides, validate_config

    _, cfg = fresh_config("qwen3_235b_128k_gb200")
    apply_overrides(cfg, ["model.context_parallel_size=48"])
    with pytest.raises(InfeasibleConfig) as err:
        validate_config(cfg, "gb200", 128)
    assert "CP=48" in err.value.message
    assert {f.rule for f in err.value.findings} >= {"rank-folding/dense", "divisibility/seq-cp"}

    _, cfg = fresh_config("dsv3_128k_h100")
    # (BF16, so that the deeper stages' FP8 weight caches do not push the plan over HBM before the layout is read)
    apply_overrides(cfg, ["model.pipeline_model_parallel_size=4", "model.expert_model_parallel_size=64",
                          "mixed_precision=bf16_mixed"])
    from lcmoe_recipes.planner.recipes import DSV3_H100_PIPELINE  # the recipe's own 32-chunk split

    with pytest.raises(InfeasibleConfig, match=re.escape(f"'{DSV3_H100_PIPELINE}' has 32 stages but PP=4 x VPP=4 = 16")):
        validate_config(cfg, "h100", 256)

    _, cfg = fresh_config("qwen3_next_8k_gb200")
    apply_overrides(cfg, ["model.seq_length=16384"])  # dataset.seq_length left at 8192: upstream rejects
    with pytest.raises(InfeasibleConfig, match="'seq_length' is 16384 on the model but 8192 on the dataset"):
        validate_config(cfg, "gb200", 32)

    _, cfg = fresh_config("dsv3_128k_h100")
    apply_overrides(cfg, ["model.rotary_interleaved=true"])  # nothing of ours checks this: megatron-core does
    with pytest.raises(InfeasibleConfig, match="rejected the config for 256 x h100: rotary_interleaved does not work "
                                               "with multi_latent_attention"):
        validate_config(cfg, "h100", 256)


def test_build_is_offline(zygote):
    """Build a recipe with every socket connection refused: nothing may reach a hub. The command runs forked from the
    session's server (tests/zygote.py), whose megatron-bridge import ran with every socket connection refused too; a
    command the server cannot run as a fresh interpreter would runs as one."""
    code = textwrap.dedent("""
        import socket
        def refuse(*a, **k):
            raise OSError("network use during config build")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        from lcmoe_recipes import qwen3_next_64k_gb200
        cfg = qwen3_next_64k_gb200()
        print("OK", cfg.model.num_moe_experts, cfg.model.context_parallel_size)
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = zygote.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "OK 512 16"


def test_op_fuser_written_and_read_back():
    """A plan that runs the routed experts through Transformer Engine's op fuser says so in the config, and the
    config reads back to the same plan (off, megatron-core's default, everywhere else)."""
    from lcmoe_recipes import recipe_plan
    from lcmoe_recipes.emit import config_from_plan, plan_from_config

    plan = recipe_plan("qwen3_235b_128k_gb200")
    assert plan.use_transformer_engine_op_fuser is False
    fused = plan.with_changes(use_transformer_engine_op_fuser=True)
    cfg = config_from_plan(fused, quiet=True)
    assert cfg.model.use_transformer_engine_op_fuser is True
    assert plan_from_config(cfg, fused.hardware, fused.layout.world, fused.name) == fused


def test_dispatcher_sms_inherited_written_and_read_back():
    """The flex dispatcher's SM count: a plan takes its base recipe's (megatron-bridge's performance settings give
    HybridEP 32, through the deprecated moe_hybridep_num_sms that megatron-core routes into
    moe_flex_dispatcher_num_sms); a plan that asks for another count gets it written, and it reads back."""
    from lcmoe_recipes import recipe_plan
    from lcmoe_recipes.emit import config_from_plan, plan_from_config
    from lcmoe_recipes.emit.fields import dispatcher_num_sms

    plan = recipe_plan("qwen3_235b_128k_gb200")
    assert plan.moe_flex_dispatcher_backend == "hybridep" and plan.moe_flex_dispatcher_num_sms == 32
    cfg = config_from_plan(plan, quiet=True)
    assert dispatcher_num_sms(cfg.model) == 32 and cfg.model.moe_flex_dispatcher_num_sms is None  # the base's
    other = plan.with_changes(moe_flex_dispatcher_num_sms=24)
    cfg = config_from_plan(other, quiet=True)
    assert cfg.model.moe_flex_dispatcher_num_sms == 24
    assert plan_from_config(cfg, other.hardware, other.layout.world, other.name) == other
