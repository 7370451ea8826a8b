"""Effective settings read back from megatron itself (lcmoe_recipes.emit.effective, docs/checks.md): our named recipes
and planner outputs state what megatron-core 0.19.2 / megatron-bridge 0.6.2 run; a difference is an error in ours and
a warning naming the fix in a user's YAML."""

from __future__ import annotations

import copy

import pytest

NAMED = ("dsv3_128k_h100", "dsv3_256k_h100", "qwen3_235b_128k_gb200", "qwen3_next_8k_gb200", "qwen3_next_32k_gb200",
         "qwen3_next_64k_gb200")
# (model, seq_length, hardware, GPUs): planner outputs across models and GPUs
PLANNED = (("dsv3", 32768, "h100", 256), ("dsv3", 65536, "h200", 256), ("dsv3", 131072, "b200", 256),
           ("qwen3_235b", 32768, "h100", 64), ("qwen3_235b", 65536, "gb200", 64), ("qwen3_235b", 131072, "h200", 128),
           ("qwen3_235b", 16384, "b200", 32), ("qwen3_next", 8192, "h100", 16), ("qwen3_next", 32768, "h200", 32),
           ("qwen3_next", 131072, "gb200", 72), ("qwen3_next", 65536, "b200", 32), ("gpt_oss_120b", 32768, "h100", 32),
           ("gpt_oss_120b", 65536, "gb200", 72), ("gpt_oss_20b", 16384, "h100", 8), ("qwen3_30b", 32768, "h100", 16),
           ("qwen3_30b", 131072, "b200", 32), ("moonlight", 32768, "h100", 16), ("glm45_air", 32768, "h200", 64),
           ("kimi_k2", 32768, "h100", 512), ("minimax_m2", 32768, "h100", 128))


def _config(plan):
    from lcmoe_recipes.emit import config_from_plan

    return config_from_plan(plan, validate=False, quiet=True)


def _effective(cfg, plan):
    from lcmoe_recipes.emit.effective import effective_settings

    return effective_settings(cfg, plan.hardware_spec, plan.layout.world)


@pytest.fixture(scope="module")
def named():
    from lcmoe_recipes.planner.recipes import recipe_plan

    out = {}
    for name in NAMED:
        plan = recipe_plan(name)
        cfg = _config(plan)
        out[name] = (plan, cfg, _effective(cfg, plan))
    return out


@pytest.mark.parametrize("name", NAMED)
def test_named_recipes_state_what_runs(named, name):
    _, _, effective = named[name]
    assert [(v.key, v.stated, v.runs) for v in effective.differences] == []


def test_planner_outputs_state_what_runs():
    from lcmoe_recipes import TrainingRequest, resolve

    differing = {}
    for model, seq, hw, gpus in PLANNED:
        plan = resolve(TrainingRequest(model=model, seq_length=seq, hardware=hw, num_gpus=gpus)).plan
        found = _effective(_config(plan), plan).differences
        if found:
            differing[(model, seq, hw, gpus)] = [(v.key, v.stated, v.runs) for v in found]
    assert differing == {}
    assert len(PLANNED) == 20


def test_values_read_back_for_dsv3_offload(named):
    """DeepSeek-V3 128K offloads all optimizer state: megatron-core builds HybridDeviceOptimizer, whose Adam moments
    are FP32 (it is built without exp_avg_dtype); the recipe now says so, and the scheduler's 0.033 is the decay."""
    plan, cfg, effective = named["dsv3_128k_h100"]
    moment = effective.get("optimizer.moment_dtype")
    assert moment.runs == "float32" and "HybridDeviceOptimizer" in moment.source
    assert effective.get("optimizer.state_location").runs == "host"
    assert effective.get("weight_decay_at_step_1").runs == pytest.approx(0.033) == cfg.optimizer.weight_decay
    assert effective.get("data").runs == "mock" and cfg.dataset.mock is True
    assert effective.get("layer[moe].recompute_pre_mlp_layernorm").runs is True  # no graphs: recomputed
    assert effective.get("layer[dense].recompute_input_layernorm").runs is True  # MLA: a norm of its own


def test_values_read_back_for_qwen3_235b(named):
    """YaRN: megatron-bridge turns rope fusion off (the recipe says off); flex + graphed router: megatron-core turns
    the pre-MLP norm recompute off and logs why; GQA: the input norm is inside TE's QKV linear."""
    _, cfg, effective = named["qwen3_235b_128k_gb200"]
    rope = effective.get("rope_fusion")
    assert (rope.stated, rope.runs) == (False, False) and cfg.model.apply_rope_fusion is False
    assert effective.get("layer[moe].recompute_pre_mlp_layernorm").runs is False
    assert effective.get("layer[moe].recompute_input_layernorm").runs is False
    assert not any("Disabling pre_mlp_layernorm recompute" in line for line in effective.logs)  # not asked for
    plan = named["qwen3_235b_128k_gb200"][0]
    asked = copy.deepcopy(cfg)
    asked.model.recompute_modules = ["moe_act", "layernorm"]  # the published set: megatron-core skips the norm
    again = _effective(asked, plan)
    assert any("Disabling pre_mlp_layernorm recompute" in line for line in again.logs)
    assert again.get("layer[moe].recompute_pre_mlp_layernorm").runs is False


def test_tp_comm_overlap_is_written_and_read_back_as_megatron_bridge_keeps_it(named):
    """megatron-bridge's Qwen3 MoE recipes ask for tp_comm_overlap: our TP4 recipe writes it and reads it back on;
    the same config at TP1, where CommOverlapConfig.setup turns it off, reads back off."""
    from lcmoe_recipes.emit.readback import plan_from_config

    plan, cfg, _ = named["qwen3_235b_128k_gb200"]
    assert cfg.comm_overlap.tp_comm_overlap is True and plan.tp_comm_overlap
    assert plan_from_config(cfg, plan.hardware_spec, plan.layout.world).tp_comm_overlap is True
    one = copy.deepcopy(cfg)
    one.model.tensor_model_parallel_size, one.model.sequence_parallel = 1, False
    assert plan_from_config(one, plan.hardware_spec, plan.layout.world).tp_comm_overlap is False
    asked_off = copy.deepcopy(cfg)
    asked_off.comm_overlap.tp_comm_overlap = False
    assert plan_from_config(asked_off, plan.hardware_spec, plan.layout.world).tp_comm_overlap is False
    next_plan, next_cfg, _ = named["qwen3_next_64k_gb200"]  # TP1: the recipe's request is inert, the YAML says off
    assert next_plan.tp_comm_overlap is False and next_cfg.comm_overlap.tp_comm_overlap is False


def test_what_megatron_warns_is_read_after_a_jobs_logging_setup():
    """megatron-bridge's setup_logging (run by a training job in this process) leaves a filter that drops WARNING
    records on the loggers: the read-back still sees megatron-core's warning, and leaves the loggers as it found them."""
    import logging

    from megatron.bridge.training.utils.log_utils import setup_logging

    from lcmoe_recipes.emit.effective import capture

    loggers = [logging.getLogger()] + [lg for lg in logging.root.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    before = [(lg, list(lg.filters), lg.level) for lg in loggers]
    try:
        setup_logging()
        layer_logger = logging.getLogger("megatron.core.transformer.transformer_layer")
        set_up = (list(layer_logger.filters), layer_logger.level)
        lines: list[str] = []
        with capture(lines):
            layer_logger.warning("Disabling pre_mlp_layernorm recompute.")
        assert lines == ["megatron.core.transformer.transformer_layer: Disabling pre_mlp_layernorm recompute."]
        assert (list(layer_logger.filters), layer_logger.level) == set_up  # restored
    finally:
        for lg, filters, level in before:
            lg.filters = filters
            lg.setLevel(level)


def test_user_yaml_difference_is_a_warning_naming_the_fix(named, tmp_path):
    from lcmoe_recipes.planner.examine import examine
    from lcmoe_recipes.emit import target_meta, write_yaml

    plan, cfg, _ = named["qwen3_next_8k_gb200"]
    mine = copy.deepcopy(cfg)
    mine.optimizer.weight_decay = 0.1  # the scheduler's start_weight_decay (0.033) replaces it at step 1
    path = tmp_path / "mine.yaml"
    write_yaml(mine, path, target_meta(plan))
    found = [f for f in examine(str(path)).findings if f.rule == "effective/weight_decay_at_step_1"]
    assert [f.severity for f in found] == ["warning"]
    assert "optimizer.weight_decay=0.033" in found[0].fix and "0.1" in found[0].message


def test_own_difference_is_an_error(named):
    from lcmoe_recipes.emit import validate_config
    from lcmoe_recipes.errors import InfeasibleConfig

    plan, cfg, _ = named["qwen3_next_8k_gb200"]
    ours = copy.deepcopy(cfg)
    ours.optimizer.exp_avg_dtype = ours.optimizer.exp_avg_sq_dtype = __import__("torch").bfloat16
    ours.optimizer.use_precision_aware_optimizer = True
    ours.optimizer.optimizer_cpu_offload, ours.optimizer.optimizer_offload_fraction = True, 1.0
    ours.optimizer.overlap_cpu_optimizer_d2h_h2d = True
    with pytest.raises(InfeasibleConfig) as raised:
        validate_config(ours, plan.hardware_spec, plan.layout.world, plan.name, own=True)
    assert "effective/optimizer.moment_dtype" in str(raised.value) or any(
        f.rule == "effective/optimizer.moment_dtype" for f in getattr(raised.value, "findings", ()))


def test_checkpoint_prices_fp32_moments_under_offload():
    """DeepSeek-V3 (671B parameters) with its optimizer offloaded: bf16 weight + fp32 master + two fp32 moments =
    14 bytes per parameter, 9.39 TB, not the 6.71 TB of bf16 moments."""
    from lcmoe_recipes.cost.shapes import shapes
    from lcmoe_recipes.cost.wallclock import checkpoint_bytes
    from lcmoe_recipes.planner.recipes import recipe_plan

    plan = recipe_plan("dsv3_128k_h100")
    assert plan.optimizer_cpu_offload and plan.effective_moment_dtype == "fp32"
    assert checkpoint_bytes(plan) == shapes(plan.model_spec).total_params * 14
    assert checkpoint_bytes(plan) / 1e12 == pytest.approx(9.39, abs=0.01)


def test_memory_credits_no_pre_mlp_norm_recompute_megatron_skips():
    from lcmoe_recipes.cost.memory import layer_activations, pre_mlp_norm_recomputed
    from lcmoe_recipes.cost.shapes import shapes
    from lcmoe_recipes.planner.recipes import recipe_plan

    qwen = recipe_plan("qwen3_235b_128k_gb200")
    assert qwen.moe_token_dispatcher_type == "flex" and "moe_router" in qwen.cuda_graph_modules
    assert pre_mlp_norm_recomputed(qwen) is False
    assert layer_activations(shapes(qwen.model_spec), 0, qwen)["pre_mlp_norm_out"][1] == ()
    dsv3 = recipe_plan("dsv3_128k_h100")
    assert pre_mlp_norm_recomputed(dsv3) is True
    assert layer_activations(shapes(dsv3.model_spec), 5, dsv3)["pre_mlp_norm_out"][1] == ("layernorm",)


GLM = ("glm45_air", 32768, "h200", 64)  # GQA, one dense layer first (first_k_dense_replace 1), then MoE layers


@pytest.fixture(scope="module")
def glm():
    from lcmoe_recipes import TrainingRequest, resolve

    model, seq, hw, gpus = GLM
    plan = resolve(TrainingRequest(model=model, seq_length=seq, hardware=hw, num_gpus=gpus)).plan
    return plan, _config(plan)


def _kinds(plan):
    """{kind: a layer of that kind} of the plan's model."""
    from lcmoe_recipes.cost.shapes import shapes

    s = shapes(plan.model_spec)
    out = {}
    for layer in range(s.num_layers):
        out.setdefault("moe" if s.is_moe(layer) else "dense", layer)
    return s, out


@pytest.mark.parametrize("which", ["dsv3_128k_h100", "glm"])
def test_memory_credits_exactly_the_norm_recomputes_megatron_runs(named, glm, which):
    """For each layer kind the memory table drops a norm's output under 'layernorm' exactly where megatron-core's
    built layer recomputes that norm: DeepSeek-V3 (MLA: the input norm a module of its own in both kinds) and
    GLM-4.5-Air (GQA: the input norm inside TE's QKV linear; the dense MLP's pre-MLP norm inside its linear_fc1)."""
    from lcmoe_recipes.cost.memory import layer_activations

    plan, cfg = (named[which][0], named[which][1]) if which != "glm" else glm
    assert "layernorm" in plan.recompute_modules
    effective = _effective(cfg, plan)
    s, kinds = _kinds(plan)
    assert set(kinds) == {"dense", "moe"}
    for kind, layer in kinds.items():
        table = layer_activations(s, layer, plan)
        for tensor, flag in (("input_norm_out", "recompute_input_layernorm"),
                             ("pre_mlp_norm_out", "recompute_pre_mlp_layernorm")):
            assert ("layernorm" in table[tensor][1]) is effective.get(f"layer[{kind}].{flag}").runs, (kind, tensor)
    assert effective.get("layer[dense].recompute_pre_mlp_layernorm").runs is False  # TE: fused into linear_fc1
    assert effective.differences == ()  # the MoE layers' norm is recomputed: 'layernorm' does something


def test_dense_pre_mlp_norm_is_recomputable_only_in_the_local_spec(glm):
    """GLM-4.5-Air's dense layer under 'layernorm': TE's spec keeps the pre-MLP norm's BF16 output and FP32 1/rms
    (inside linear_fc1); megatron-core's local spec, which the activation probe measures, drops both."""
    from lcmoe_recipes.cost.memory import layer_activations_kept

    plan, _ = glm
    s, kinds = _kinds(plan)
    args = (s, kinds["dense"], 256, 1, 1, False, "selective", ("layernorm",))
    te, local = layer_activations_kept(*args), layer_activations_kept(*args, te_spec=False)
    assert te - local == 256 * s.h * 2 + 256 * 4
    assert te == layer_activations_kept(s, kinds["dense"], 256, 1, 1, False, None, ())  # nothing dropped under TE


def test_layernorm_that_recomputes_nothing_is_flagged_and_priced_as_nothing(glm):
    """GLM-4.5-Air with the flex dispatcher and a TE-graphed router: megatron-core skips the MoE layers' pre-MLP norm
    recompute, the dense layer has no norm of its own to recompute, GQA none at the input -- the read-back says
    'layernorm' does nothing, and the memory model credits it nothing in any layer."""
    from lcmoe_recipes.cost.memory import layer_activations
    from lcmoe_recipes.emit import plan_from_config

    plan, cfg = glm
    asked = copy.deepcopy(cfg)
    asked.model.moe_token_dispatcher_type, asked.model.moe_flex_dispatcher_backend = "flex", "deepep"
    asked.model.cuda_graph_impl, asked.model.cuda_graph_scope = "transformer_engine", None
    asked.model.cuda_graph_modules = ["moe_router"]
    asked.model.recompute_modules = ["layernorm"]
    effective = _effective(asked, plan)
    assert [(v.key, v.stated, v.runs) for v in effective.differences] == [
        ("layer[moe].recompute_pre_mlp_layernorm", True, False), ("layernorm_recompute_does_anything", True, False)]
    assert any("Disabling pre_mlp_layernorm recompute" in line for line in effective.logs)
    priced = plan_from_config(asked, plan.hardware_spec, plan.layout.world, "glm_graphed_router")
    s, kinds = _kinds(priced)
    for layer in kinds.values():
        assert not [t for t, (_, by) in layer_activations(s, layer, priced).items() if "layernorm" in by]
