"""Our configs start from megatron-bridge's own recipe for the model and GPU; every field we change is owned by one
setting with a reason (docs/parity.md, generated), and a change outside a setting's fields fails."""

from pathlib import Path

import pytest

from lcmoe_recipes import recipe_plan
from lcmoe_recipes.catalog import get_hardware, get_model
from lcmoe_recipes.catalog.upstream import base_recipe, upstream_recipes
from scripts_loader import load_script

ROOT = Path(__file__).resolve().parent.parent




@pytest.mark.parametrize("model,hw,precision,gpus,expected,how", [
    ("dsv3", "h100", "fp8_blockwise", 256, "deepseek_v3_pretrain_1024gpu_h100_fp8sc_config", "the same model, H100"),
    ("qwen3_next", "gb200", "bf16", 32, "qwen3_next_80b_a3b_pretrain_64gpu_gb200_bf16_config", "the same model, GB200"),
    # upstream's Qwen3-235B MXFP8 recipes are full-iteration-graph or dev variants: the BF16 recipe is the base
    ("qwen3_235b", "gb200", "mxfp8", 128, "qwen3_235b_a22b_pretrain_256gpu_gb200_bf16_config",
     "upstream's mxfp8 recipes are full-iteration-graph or development variants"),
    ("qwen3_30b", "h200", "bf16", 64, "qwen3_30b_a3b_pretrain_64gpu_h100_bf16_config", "H100 (no H200 recipe)"),
    ("course_moe", "h100", "bf16", 64, "qwen3_30b_a3b_pretrain_64gpu_h100_bf16_config",
     "the closest family recipe (Qwen3-30B-A3B, same qwen3_moe architecture)"),
    ("moonlight", "h100", "bf16", 64, "moonlight_16b_pretrain_16gpu_h100_bf16_config", "library recipe"),
])
def test_base_recipe_choice(model, hw, precision, gpus, expected, how):
    recipe, why = base_recipe(get_model(model), get_hardware(hw), precision, gpus)
    assert recipe.name == expected and how in why


def test_catalogue_records_upstream_settings():
    (fp8sc,) = [r for r in upstream_recipes() if r.name == "deepseek_v3_pretrain_1024gpu_h100_fp8sc_config"]
    # megatron-bridge 0.6.2 DSV3: precision-aware optimizer with bf16 moments, bf16 gradient reduction, init 0.006
    assert (fp8sc.use_precision_aware_optimizer, fp8sc.moment_dtype, fp8sc.grad_dtype) == (True, "bf16", "bf16")
    assert fp8sc.init_method_std == 0.006 and fp8sc.pp == 8 and fp8sc.vpp == 2
    (nxt,) = [r for r in upstream_recipes() if r.name == "qwen3_next_80b_a3b_pretrain_64gpu_gb200_bf16_config"]
    assert nxt.layout_for(2, 4) == "Et*4|(t*7|)*5t*8|tmL" and nxt.layout_for(4, 2) is None


@pytest.mark.slow
def test_upstream_catalogue_is_current():
    module = load_script("regen_upstream")
    assert module.generate() == module.TARGET.read_text(), "run python scripts/regen_upstream.py"


@pytest.mark.slow
def test_parity_report_is_current():
    module = load_script("parity_report")
    assert module.generate() == module.TARGET.read_text(), "run python scripts/parity_report.py"


@pytest.mark.slow
def test_a_change_without_a_reason_fails(configs):
    from lcmoe_recipes.emit.config import base_config
    from lcmoe_recipes.emit.settings import SETTINGS, Setting, parity

    plan = recipe_plan("qwen3_next_8k_gb200")

    def sneaky(cfg, plan):
        cfg.model.init_method_std = 0.5

    rogue = SETTINGS + (Setting("numerics", ("model.cross_entropy_fusion_impl",), sneaky),)
    with pytest.raises(AssertionError, match="setting 'numerics' changed model.init_method_std, which it does not own"):
        parity(base_config(plan), plan, rogue)
    diffs = {d.path: d for d in parity(base_config(plan), plan)}
    assert diffs["dataset.create_attention_mask"].upstream is True and diffs["dataset.create_attention_mask"].ours is False
    assert diffs["model.moe_router_force_load_balancing"].setting == "real_training"
    assert "model.init_method_std" not in diffs  # upstream's value stays


@pytest.mark.slow
def test_named_recipe_yaml_keeps_upstream_settings():
    """The issue's findings, fixed through the upstream base: no s x s mask, DSV3's own init, upstream's environment
    and kernels, real training (no forced load balancing)."""
    import yaml

    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text().split("\n", 1)[1])
        assert cfg["dataset"]["create_attention_mask"] is False, path.name
        assert cfg["model"]["moe_router_force_load_balancing"] is False, path.name
        # megatron-bridge's recipes fuse the cross-entropy with TE; its precision bug is fixed from TE 2.18
        # (TransformerEngine PR #3193), older images get the known issue te-fused-cross-entropy-bf16-grad
        assert cfg["model"]["cross_entropy_fusion_impl"] == "te", path.name
        assert cfg["env_vars"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True", path.name
        assert cfg["env_vars"]["TORCH_NCCL_HIGH_PRIORITY"] == 1 and cfg["env_vars"]["NCCL_NVLS_ENABLE"] == 0
        assert cfg["dist"]["enable_megatron_core_experimental"] is path.name.startswith("dsv3"), path.name
        assert cfg["model"]["moe_router_fusion"] is True
        # the YAML states the rope fusion that runs: megatron-bridge 0.6.2 GPTModelProvider.provide turns it off for
        # position embeddings other than "rope" (utils/fusions.py validate_rope_fusion_compatibility): Qwen3-235B's
        # YaRN at 128K
        rope = cfg["model"]["position_embedding_type"] == "rope"
        assert cfg["model"]["apply_rope_fusion"] is rope and rope is not path.name.startswith("qwen3_235b"), path.name
        if path.name.startswith("dsv3"):
            assert cfg["model"]["init_method_std"] == 0.006  # megatron-bridge's DSV3 recipe (DeepSeek-V3's value)


@pytest.mark.slow
def test_named_recipe_yaml_runs_long_at_upstreams_level():
    """Checkpoints saved asynchronously and in parallel at a cadence from their size; evaluation sized for long
    context; throughput and memory logged; TP communication overlap as upstream's perf recipe asks (Qwen3-235B on
    GB200 at TP 4; upstream's own TP 1 turns it off)."""
    import yaml

    from lcmoe_recipes.cost.wallclock import save_intervals

    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text().split("\n", 1)[1])
        plan = recipe_plan(path.stem)
        ckpt, val, log = cfg["checkpoint"], cfg["validation"], cfg["logger"]
        assert ckpt["async_save"] is True and ckpt["fully_parallel_save"] is True, path.name
        cadence = save_intervals(plan, base_interval=None)
        assert ckpt["save_interval"] == cadence.persistent == val["eval_interval"], path.name
        assert ckpt["non_persistent_save_interval"] == cadence.non_persistent, path.name
        assert val["eval_global_batch_size"] == plan.eval_global_batch_size and val["eval_iters"] == 32, path.name
        assert log["log_throughput"] is log["log_memory_to_tensorboard"] is True, path.name
        assert cfg["comm_overlap"]["tp_comm_overlap"] is (plan.layout.tp > 1 and path.stem.startswith("qwen3_235b")) \
            or plan.layout.tp == 1, path.name
    dsv3 = yaml.safe_load((ROOT / "recipes" / "dsv3_128k_h100.yaml").read_text().split("\n", 1)[1])
    # 671B parameters x 10 bytes (bf16 weight, fp32 master, bf16 moments: upstream's precision-aware optimizer) =
    # 6.7 TB, 5.6 min at the default 20 GB/s; 1,000 steps: 4 kept saves, overwritten ones within 2 h of training
    assert (dsv3["checkpoint"]["save_interval"], dsv3["checkpoint"]["non_persistent_ckpt_type"]) == (250, "global")
    assert dsv3["validation"]["eval_global_batch_size"] == 8  # MBS 1 x DP 1 x PP 8: every stage busy
    qwen = yaml.safe_load((ROOT / "recipes" / "qwen3_235b_128k_gb200.yaml").read_text().split("\n", 1)[1])
    assert qwen["model"]["tensor_model_parallel_size"] == 4 and qwen["comm_overlap"]["tp_comm_overlap"] is True


@pytest.mark.slow
def test_config_fields_are_current():
    """In a fresh interpreter, as the script runs: which provider modules are loaded changes the union."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "scripts/regen_config_fields.py", "--check"], cwd=Path(__file__).parent.parent,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def test_override_naming_no_field_is_refused_before_megatron_loads():
    """A typo in an override is refused from config_fields.json (no megatron-bridge import), naming the field."""
    from lcmoe_recipes import TrainingRequest
    from lcmoe_recipes.catalog.config_fields import unknown_override
    from lcmoe_recipes.errors import OverrideError

    assert unknown_override("model.tensor_model_parralel_size=4") == (
        "override 'model.tensor_model_parralel_size=4': 'model.tensor_model_parralel_size' is not a field of any "
        "megatron-bridge model config", "use 'model.tensor_model_parallel_size'")
    assert unknown_override("modle.tensor_model_parallel_size=4")[1] == "use 'model.tensor_model_parallel_size'"
    assert unknown_override("~train.trian_iters")[1] == "use 'train.train_iters'"
    for fine in ("model.tensor_model_parallel_size=4", "+env_vars.NCCL_DEBUG=INFO", "~model.recompute_modules",
                 "model.moe_flex_dispatcher_backend=hybridep", "dataset.seq_length=8192", ""):
        assert unknown_override(fine) is None, fine
    # no '=': Hydra's parser would refuse it later, without naming the fix (a key and its value typed apart)
    assert unknown_override("model")[1] == "write 'model=VALUE' as one argument, without spaces around '='"
    with pytest.raises(OverrideError) as err:
        TrainingRequest.parse(model="qwen3_235b", seq_length=131072, overrides=("train.trian_iters=10",))
    assert "'train.trian_iters' is not a field of any megatron-bridge train config" in err.value.message
    assert err.value.fix == "use 'train.train_iters'"


@pytest.mark.slow
def test_every_benchmark_setting_has_a_fate(configs):
    """megatron-bridge 0.6.2's _benchmark_common, run on its own _pretrain_common() template and diffed field by field:
    every field it sets has a fate here, so a benchmark-only setting added upstream fails until it is handled."""
    from lcmoe_recipes.emit.benchmark import BENCHMARK_FATES, benchmark_fields, unhandled

    plan, cfg = configs["qwen3_235b_128k_gb200"]
    fields = benchmark_fields(cfg.model)
    assert unhandled(fields) == ([], []), "add the field to lcmoe_recipes.emit.benchmark.BENCHMARK_FATES"
    # the values of the installed upstream: BF16 gradient reduction, 50 steps, no NaN checks, no saves
    assert (fields["ddp.grad_reduce_in_fp32"].training, fields["ddp.grad_reduce_in_fp32"].benchmark) == (True, False)
    assert (fields["mixed_precision.grad_reduce_in_fp32"].training,
            fields["mixed_precision.grad_reduce_in_fp32"].benchmark) == (True, False)
    assert (fields["train.train_iters"].training, fields["train.train_iters"].benchmark) == (300000, 50)
    assert (fields["logger.log_interval"].training, fields["logger.log_interval"].benchmark) == (10, 1)
    assert fields["checkpoint.save"].benchmark is None and fields["ddp.check_for_nan_in_grad"].benchmark is False
    # assigned to the value the template already has: listed too (the recorder, not only the diff, finds it)
    assert fields["train.manual_gc"].training is fields["train.manual_gc"].benchmark is True
    assert fields["ddp.check_for_large_grads"].training is fields["ddp.check_for_large_grads"].benchmark is False
    assert {f.action for f in BENCHMARK_FATES.values()} == {"training", "plan", "kept"}
    # a fate taken away is reported as unhandled
    from lcmoe_recipes.emit import benchmark

    saved = benchmark.BENCHMARK_FATES.pop("tokenizer.use_tokenizer_vocab_size")
    try:
        assert unhandled(fields) == (["tokenizer.use_tokenizer_vocab_size"], [])
    finally:
        benchmark.BENCHMARK_FATES["tokenizer.use_tokenizer_vocab_size"] = saved


@pytest.mark.slow
def test_named_recipes_train_not_benchmark(configs):
    """Every named recipe's config holds each benchmark field's fate: the training template's FP32 gradient reduction
    and NaN checks, the run's own steps and saves; a config that keeps the benchmark's BF16 reduction is caught."""
    import copy

    from lcmoe_recipes.emit.benchmark import benchmark_fields, fate_findings

    fields = benchmark_fields(configs["dsv3_128k_h100"][1].model)
    for name, (plan, cfg) in configs.items():
        assert fate_findings(cfg, fields) == [], name
        assert cfg.ddp.grad_reduce_in_fp32 is cfg.mixed_precision.grad_reduce_in_fp32 is True, name
        assert cfg.ddp.check_for_nan_in_grad is True and cfg.train.manual_gc is True, name
        assert cfg.train.train_iters == plan.schedule.train_iters != 50, name
    bad = copy.deepcopy(configs["qwen3_next_8k_gb200"][1])
    bad.ddp.grad_reduce_in_fp32 = False
    assert fate_findings(bad, fields) == ["ddp.grad_reduce_in_fp32: False, not the training template's True"]


def test_fp32_gradients_are_priced_and_kept():
    """FP32 main gradients cost 4 bytes per parameter on the rank (2 more than BF16); the planner fits the layout to
    them and never hands back a BF16-gradient plan."""
    from lcmoe_recipes import TrainingRequest
    from lcmoe_recipes.core.plan import HBM_MARGIN
    from lcmoe_recipes.cost.memory import estimate_memory
    from lcmoe_recipes.planner.search import search_layouts
    from lcmoe_recipes.rules.base import GRAD_DTYPE

    assert GRAD_DTYPE == "fp32"
    plan = recipe_plan("qwen3_235b_128k_gb200")
    fp32, bf16 = estimate_memory(plan), estimate_memory(plan.with_changes(grad_dtype="bf16"))
    params = fp32.detail["dense_params"] + fp32.detail["expert_params"]
    assert fp32.gradients == pytest.approx(4 * params) and bf16.gradients == pytest.approx(2 * params)
    assert fp32.total - bf16.total == pytest.approx(2 * params)
    result = search_layouts(TrainingRequest(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=64), top=5)
    limit = HBM_MARGIN * result.best.plan.hardware_spec.hbm_bytes
    for candidate in result.ranked:  # every fitting layout priced with FP32 gradients, none fell back to BF16
        assert candidate.plan.grad_dtype == "fp32" and estimate_memory(candidate.plan).hbm_total <= limit


def test_qwen3_235b_fits_with_the_recompute_megatron_runs():
    """No layernorm recompute (megatron-core 0.19.2 runs none here: input norm fused into TE's QKV linear, pre-MLP
    norm recompute off under flex + moe_router/moe_preprocess graphs); CP8 leaves more than the memory model's worst
    error free, where the published CP4 would not fit with FP32 gradients."""
    from lcmoe_recipes.checks.memory import memory_findings
    from lcmoe_recipes.core.plan import HBM_MARGIN
    from lcmoe_recipes.cost.bands import MEMORY_ERROR_BAND
    from lcmoe_recipes.cost.memory import estimate_memory

    plan = recipe_plan("qwen3_235b_128k_gb200")
    assert plan.recompute_modules == ("moe_act",) and plan.layout.cp == 8 and plan.grad_dtype == "fp32"
    limit = HBM_MARGIN * plan.hardware_spec.hbm_bytes
    free = limit - estimate_memory(plan).hbm_total
    assert free > MEMORY_ERROR_BAND * limit
    assert not [f for f in memory_findings(plan) if f.rule.startswith("memory/")]
    cp4 = plan.with_changes(layout=plan.layout.__class__(world=128, tp=4, pp=4, vpp=12, cp=4, ep=32, etp=1))
    assert estimate_memory(cp4).hbm_total > limit  # 169.3 of 164.6 GiB when this was written


def test_expert_bias_update_rate_frozen_for_extension():
    """DeepSeek-V3 (auxiliary-loss-free balancing): biases frozen during the extension, as its last 500B pre-training
    tokens (arXiv 2412.19437 §4.2); Qwen3 has no expert biases, nothing is decided."""
    dsv3, qwen = recipe_plan("dsv3_128k_h100"), recipe_plan("qwen3_235b_128k_gb200")
    assert dsv3.moe_router_bias_update_rate == 0.0 and "500B" in dsv3.reasons["moe_router_bias_update_rate"].why
    assert qwen.moe_router_bias_update_rate is None and "moe_router_bias_update_rate" not in qwen.reasons


@pytest.mark.slow
def test_expert_bias_rate_in_the_yaml():
    import yaml

    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        model = yaml.safe_load(path.read_text().split("\n", 1)[1])["model"]
        expected = 0.0 if path.name.startswith("dsv3") else 0.001  # megatron-core's default, unused without biases
        assert (model["moe_router_enable_expert_bias"], model["moe_router_bias_update_rate"]) == (
            path.name.startswith("dsv3"), expected), path.name
