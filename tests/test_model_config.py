"""Any model from its config.json: the seven shipped MoE models, a user's own (made-up) config.json, a dense decoder,
and clean refusals (unsupported architecture, malformed files). Sources of the numbers: catalog/hf_configs/SOURCES.md.
"""

import json
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from lcmoe_recipes.catalog import get_model
from lcmoe_recipes.catalog.architectures import supported_architectures
from lcmoe_recipes.checks import check_plan
from lcmoe_recipes.checks.memory import memory_findings
from lcmoe_recipes.core.layout import ParallelLayout
from lcmoe_recipes.core.request import TrainingRequest
from lcmoe_recipes.cost.shapes import shapes
from lcmoe_recipes.errors import LcmoeError, ModelConfigError
from lcmoe_recipes.planner.search import search_layouts

ROOT = Path(__file__).resolve().parent.parent

# Published totals (model cards / docs): Kimi-K2 "1T total, 32B activated" (moonshotai/Kimi-K2-Instruct model card);
# GLM-4.5 355B / 32B and GLM-4.5-Air 106B / 12B (transformers docs, model_doc/glm4_moe.md); gpt-oss-120b "117B
# parameters with 5.1B active", gpt-oss-20b "21B parameters with 3.6B active" (openai model cards); Qwen3-Coder
# 480B total, 35B active (model name and card); MiniMax-M2 230B / 10B (transformers docs, model_doc/minimax_m2.md).
# Ours: decoder + embedding + output layer (MTP layers not counted, as in the published totals); active = the weights
# one token multiplies with, output layer included, input embedding (a lookup) not.
PUBLISHED = {
    "kimi_k2": (1026e9, 32e9), "glm45": (355e9, 32e9), "glm45_air": (106e9, 12e9), "gpt_oss_120b": (117e9, 5.1e9),
    "gpt_oss_20b": (21e9, 3.6e9), "qwen3_coder_480b": (480e9, 35e9), "minimax_m2": (230e9, 10e9),
}


def _totals(key):
    s = shapes(get_model(key))
    return s.total_params, s.active_params_per_token


@pytest.mark.parametrize("key", list(PUBLISHED))
def test_shipped_model_sizes_match_their_cards(key):
    total, active = _totals(key)
    pub_total, pub_active = PUBLISHED[key]
    assert abs(total / pub_total - 1) < 0.02, (key, total / 1e9)
    assert abs(active / pub_active - 1) < 0.08, (key, active / 1e9)


def test_kimi_k2_count_matches_its_checkpoint():
    # 1,026,470,731,056 parameters in the moonshotai/Kimi-K2-Instruct checkpoint (hf_configs/SOURCES.md)
    assert abs(_totals("kimi_k2")[0] - 1_026_470_731_056) < 1e8


def test_features_read_from_config():
    glm = get_model("glm-4.5")
    assert glm.moe_layers[:4] == (False, False, False, True) and glm.num_dense_layers == 3
    assert (glm.mtp_num_layers, glm.qk_layernorm, glm.attention_bias) == (1, True, True)
    assert glm.shared_expert_ffn_hidden_size == 1536 and glm.attention_kind == "gqa"
    oss = get_model("gpt-oss-120b")
    assert oss.layer_attention[:4] == ("sliding", "full", "sliding", "full") and oss.sliding_window == 128
    assert oss.attention_sinks and oss.linear_bias and oss.moe_ffn_hidden_size == 2880 and oss.num_dense_layers == 0
    kimi = get_model("kimi-k2")
    assert kimi.attention_kind == "mla" and kimi.num_dense_layers == 1 and kimi.mtp_num_layers == 0
    assert get_model("qwen3_next").layer_attention[:4] == ("gdn", "gdn", "gdn", "full")
    coder = get_model("qwen3-coder-480b")
    assert coder.shared_expert_ffn_hidden_size == 0 and coder.sliding_window is None and coder.qk_layernorm
    mm = get_model("minimax-m2")
    assert mm.num_moe_experts == 256 and mm.moe_ffn_hidden_size == 1536 and mm.mtp_num_layers == 0
    assert [k for k, _, _ in mm.unmodelled_features] == ["num_mtp_modules"]


def test_supported_list_is_megatron_bridges_registry():
    archs = supported_architectures()
    for key in ("dsv3", "kimi_k2", "glm45", "gpt_oss_120b", "qwen3_coder_480b", "minimax_m2", "qwen3_next"):
        assert get_model(key).architecture in archs
    assert "LlamaForCausalLM" in archs and "DeepseekV2ForCausalLM" in archs
    assert archs["GptOssForCausalLM"] == "bridge/models/gpt_oss/gpt_oss_bridge.py"
    assert "Qwen3VLMoeForConditionalGeneration" not in archs  # a vision-language model: not a GPTModel target


# --- a user's own config.json ---------------------------------------------------------------------------------
# a made-up MoE (the docs' example too: docs/models.md)
MADE_UP = json.loads((ROOT / "tests" / "fixtures" / "made_up_moe" / "config.json").read_text())
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
             "tie_word_embeddings": False, "hidden_act": "silu"}  # meta-llama/Meta-Llama-3.1-8B's sizes


def _write(folder: Path, values) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(values) if not isinstance(values, str) else values)
    return folder


def test_user_config_becomes_a_catalogue_entry(tmp_path):
    req = TrainingRequest(model_config=str(_write(tmp_path / "a", MADE_UP)), seq_length=65536, hardware="gb200",
                          num_gpus=16)
    spec = get_model(req.model)
    assert req.model.startswith("user_made_up_moe_") and spec.is_user_config
    assert (spec.num_moe_experts, spec.moe_router_topk, spec.num_dense_layers, spec.qk_layernorm) == (32, 4, 0, True)
    # the same values elsewhere give the same key; a path in place of a model name works too
    assert get_model(str(_write(tmp_path / "b", MADE_UP) / "config.json")).key == req.model
    best = search_layouts(req).best.plan
    assert best.model == req.model and not [f for f in check_plan(best) if f.severity == "error"]


def test_dense_model_degenerate_case(tmp_path):
    req = TrainingRequest(model_config=str(_write(tmp_path, LLAMA3_8B)), seq_length=32768, hardware="h100",
                          num_gpus=16)
    spec = get_model(req.model)
    assert not spec.is_moe and spec.moe_router_topk == 0 and spec.num_dense_layers == 32
    best = search_layouts(req).best.plan
    assert best.layout.ep == 1 and (best.moe_token_dispatcher_type, best.moe_flex_dispatcher_backend) == ("alltoall", None)
    assert best.cuda_graph_impl == "none" and "moe" not in best.recompute_modules
    bad = best.with_changes(layout=ParallelLayout(world=16, tp=1, pp=1, cp=8, ep=2, etp=1))
    assert "parallel/ep-dense-model" in [f.rule for f in check_plan(bad) if f.severity == "error"]
    with pytest.raises(ValueError, match="dense model"):
        TrainingRequest(model=req.model, seq_length=32768, hardware="h100", num_gpus=16, dispatcher="deepep")


@pytest.mark.parametrize("content, message", [
    ("{\"hidden_size\": 8,", "is not valid JSON: Expecting property name enclosed in double quotes at line 1"),
    ("[1, 2]", "holds a JSON list, not an object"),
    (dict(MADE_UP, hidden_size=None), "has no 'hidden_size' (the model width)"),
    (dict(MADE_UP, num_experts_per_tok=None), "has 32 experts but no 'num_experts_per_tok'"),
    # a fresh user's broken file: a ZeroDivisionError deep in the communication model before
    (dict(MADE_UP, num_experts_per_tok=200), "'num_experts_per_tok' is 200, more than the 32 routed experts"),
    (dict(MADE_UP, num_experts_per_tok=2.5), "'num_experts_per_tok' is 2.5, not a positive integer (experts per token)"),
    ({k: v for k, v in MADE_UP.items() if k != "architectures"}, "has no 'architectures' list"),
    (dict(MADE_UP, architectures=["BertForMaskedLM"]), "megatron-bridge cannot build architecture 'BertForMaskedLM'"),
])
def test_bad_config_refused_cleanly(tmp_path, content, message):
    folder = _write(tmp_path, content)
    with pytest.raises(ModelConfigError) as err:
        TrainingRequest(model_config=str(folder), seq_length=4096, hardware="h100", num_gpus=8)
    assert message in err.value.message and str(folder / "config.json") in err.value.message
    if "BertForMaskedLM" in message:
        assert "GptOssForCausalLM" in err.value.fix and "Qwen3MoeForCausalLM" in err.value.fix
    with pytest.raises(ModelConfigError, match="does not exist"):
        get_model(str(tmp_path / "nowhere" / "config.json"))


def test_a_yaml_given_as_the_model_names_the_commands_that_take_it(tmp_path):
    """A fresh user's `launch out/x.yaml` was told the YAML "is not valid JSON": it is a ConfigContainer, and the
    error now says which commands run, re-plan and check one."""
    path = tmp_path / "x.yaml"
    path.write_text("# lcmoe_recipes: {}\nmodel: {}\n")
    with pytest.raises(ModelConfigError) as err:
        get_model(str(path))
    assert err.value.message == (f"'{path}' is a YAML file (a ConfigContainer): the first argument is a model, a name "
                                 "or a Hugging Face config.json")
    assert f"lcmoe_recipes.launch.submit('{path}', executor)" in err.value.fix and f"--from {path} --seq N" in err.value.fix
    with pytest.raises(ModelConfigError) as err:  # a mistyped one: not "model config ... does not exist"
        get_model(str(tmp_path / "y.yaml"))
    assert err.value.message == f"'{tmp_path / 'y.yaml'}' does not exist (and a YAML is a ConfigContainer, not a model)"


def test_cli_refuses_bad_config_with_exit_2(tmp_path):
    folder = _write(tmp_path, dict(MADE_UP, hidden_size=None))
    out = subprocess.run([sys.executable, "-m", "lcmoe_recipes.plan", "--model-config", str(folder), "--seq", "4096",
                          "--gpus", "8", "--hardware", "h100"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "has no 'hidden_size'" in out.stderr and "fix:" in out.stderr
    assert "Traceback" not in out.stderr


def test_cp_exchange_follows_features():
    oss = search_layouts(TrainingRequest(model="gpt_oss_20b", seq_length=65536, hardware="gb200", num_gpus=8, cp=4)).best.plan
    assert oss.layout.cp > 1 and oss.cp_comm_type == "a2a"  # attention sinks: a2a only
    rules = lambda p: [f.rule for f in check_plan(p) if f.severity == "error"]  # noqa: E731
    assert {"cp/attention-sinks-exchange", "cp/sliding-window-exchange"} <= set(rules(oss.with_changes(cp_comm_type="p2p")))
    lay = ParallelLayout(world=64, tp=2, pp=1, cp=8, ep=8, etp=1)  # 8 K/V heads / TP2 = 4 per rank: not over CP8
    assert "divisibility/heads-cp-a2a" in rules(oss.with_changes(layout=lay, global_batch_size=4))


def test_feature_not_modelled_is_said():
    from lcmoe_recipes.checks.memory import memory_findings as findings

    p = search_layouts(TrainingRequest(model="minimax_m2", seq_length=32768, hardware="gb200", num_gpus=32)).best.plan
    warn = [f for f in findings(p) if f.rule == "model/feature-not-modelled"]
    assert len(warn) == 1 and "num_mtp_modules" in warn[0].message and "no MTP layers" in warn[0].fix
    assert memory_findings is findings


# --- every shipped model: long-context plans that pass check and megatron-bridge validate() ---------------------
# GPU counts per (H100, GB200): the smallest power of two whose plans fit at 128K in our model.
TARGETS = {"kimi_k2": (512, 256), "glm45": (128, 64), "glm45_air": (32, 16), "gpt_oss_120b": (32, 16),
           "gpt_oss_20b": (8, 8), "qwen3_coder_480b": (256, 128), "minimax_m2": (64, 32)}
CASES = [(m, seq, hw, n[i]) for m, n in TARGETS.items() for seq in (32768, 131072)
         for i, hw in enumerate(("h100", "gb200"))]


@lru_cache(maxsize=None)
def _planned(model, seq, hw, n):
    return search_layouts(TrainingRequest(model=model, seq_length=seq, hardware=hw, num_gpus=n)).best.plan


@pytest.mark.slow
@pytest.mark.parametrize("model, seq, hw, n", CASES)
def test_shipped_model_plans_pass_check(model, seq, hw, n):
    p = _planned(model, seq, hw, n)
    assert not [f for f in check_plan(p) if f.severity == "error"]
    assert not [f for f in memory_findings(p) if f.severity == "error"]


@pytest.mark.slow
@pytest.mark.parametrize("model, seq, hw, n", CASES)
def test_shipped_model_plans_validate_upstream(model, seq, hw, n):
    from lcmoe_recipes.emit import config_from_plan

    p = _planned(model, seq, hw, n)
    cfg = config_from_plan(p, quiet=True)  # our checks + megatron-bridge runtime_config_update / validate() for the target
    spec = get_model(model)
    assert (cfg.model.num_layers, cfg.model.num_moe_experts, cfg.model.seq_length) == (spec.num_layers,
                                                                                       spec.num_moe_experts, seq)
    if p.layout.cp > 1:
        assert (cfg.model.cp_comm_type or "p2p") == p.cp_comm_type


@pytest.mark.slow
def test_user_config_plans_emits_validates_and_reads_back(tmp_path):
    from lcmoe_recipes import build_recipe
    from lcmoe_recipes.emit import plan_from_config, read_meta, read_yaml, target_meta, write_yaml
    from lcmoe_recipes.emit.validate import config_findings

    folder = _write(tmp_path / "moe", MADE_UP)
    cfg = build_recipe(model_config=str(folder), seq_length=32768, hardware="h100", num_gpus=16)
    assert (cfg.model.num_moe_experts, cfg.model.moe_router_topk, cfg.model.hidden_size) == (32, 4, 2048)
    key = get_model(str(folder)).key
    path = write_yaml(cfg, tmp_path / "moe.yaml", target_meta(plan_from_config(cfg, "h100", 16)))
    meta = read_meta(path)
    assert meta["model"] == key and meta["model_config"]["num_experts"] == 32
    loaded, _ = read_yaml(path)
    assert plan_from_config(loaded, "h100", 16).model == key
    assert not [f for f in config_findings(loaded, "h100", 16) if f.severity == "error"]
    dense = build_recipe(model_config=str(_write(tmp_path / "llama", LLAMA3_8B)), seq_length=32768, hardware="h100",
                         num_gpus=16)
    assert not dense.model.num_moe_experts and dense.model.expert_model_parallel_size == 1


def test_errors_are_lcmoe_errors():
    assert issubclass(ModelConfigError, LcmoeError)
