"""--explain, --json and --plot on plan and launch."""

import json
import struct

import pytest

from lcmoe_recipes import recipe_plan
from lcmoe_recipes.cli.plan import main as plan_main
from lcmoe_recipes.report.explain import decisions, explain_text


def _png_size(path):
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_explain_names_every_decision_reason_and_source():
    plan = recipe_plan("dsv3_128k_h100")
    knobs = {k: (v, why, src) for k, v, why, src in decisions(plan)}
    assert knobs["recompute"][0] == "mla_up_proj, layernorm, moe, mlp"
    assert knobs["optimizer_cpu_offload"][0] == "1" and "require --optimizer-cpu-offload" in knobs["optimizer_cpu_offload"][1]
    assert "nemo-mbridge-perf-moe-long-context" in knobs["dispatcher"][2]
    text = explain_text(plan)
    assert "decisions (value -- reason [source]):" in text and "findings:\n  none" in text
    assert "memory per GPU, PP rank 0 (GiB; HBM 75):" in text and "traffic per GPU per step (GB):" in text


def test_explain_shows_findings_with_fixes():
    plan = recipe_plan("qwen3_next_64k_gb200")
    text = explain_text(plan)
    assert "warning memory/uncalibrated" in text and "fix: keep more headroom" in text


def test_plan_json_and_plots(capsys, tmp_path):
    assert plan_main(["qwen3_next", "--seq", "8192", "--gpus", "32", "--hardware", "gb200", "--top", "3", "--json",
                      "--plot", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["candidates"]
    assert len(rows) == 3 and list(rows[0])[:4] == ["rank", "tp", "cp", "ep"]
    assert isinstance(rows[0]["hbm_use_gib"], float) and 0 < rows[0]["mfu"] < 1
    assert rows[0]["hbm_use_gib"] <= data["limit_gib"] and data["tie_break"][0]["winner"] in (True, False)
    assert {"layout", "mbs", "step_seconds", "headroom_gib"} <= set(data["tie_break"][0])
    assert {"tp_seconds", "bubble_seconds", "step_seconds", "tflops_per_gpu"} <= set(rows[0])
    assert not [k for row in rows for k in row if " " in k]
    assert "allocator_peak" in data["winner"]["hbm_budget_gib"] and not [k for k in data["winner"]["hbm_budget_gib"]
                                                                         if " " in k]
    winner = data["winner"]
    assert winner["layout"]["world"] == 32 and {d["knob"] for d in winner["decisions"]} >= {"layout", "recompute"}
    assert winner["memory_gib"]["total"] <= 0.95 * winner["hbm_gib"]
    for name in ("memory.png", "time.png", "sweep.png"):
        width, height = _png_size(tmp_path / name)
        assert width >= 660 and height == 550, (name, width, height)  # 5 in tall at 110 dpi


@pytest.mark.slow
def test_launch_json(capsys, tmp_path, monkeypatch):
    from lcmoe_recipes.cli.launch import main

    monkeypatch.chdir(tmp_path)
    assert main(["qwen3_235b", "--seq", "131072", "--dry-run", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] and data["recipe"] == "qwen3_235b_128k_gb200" and data["yaml"] == "out/qwen3_235b_128k_gb200.yaml"
    assert data["layout"] == {"world": 128, "tp": 4, "pp": 4, "vpp": 12, "cp": 8, "ep": 32, "etp": 1, "dp": 1, "edp": 1}
    assert data["command"].startswith("torchrun --nnodes 32 --nproc-per-node 4")


def test_plan_json_failure_is_json(capsys):
    assert plan_main(["qwen3_235b", "--seq", "131072", "--gpus", "60", "--hardware", "gb200", "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is False and data["fix"].startswith("use 48 GPUs (fewer, but a layout fits there") and (
        "or 64 GPUs (the smallest count above 60" in data["fix"])


def test_launch_json_lists_the_effective_settings(capsys, tmp_path, monkeypatch):
    """DeepSeek-V3 128K (optimizer state offloaded): --json carries every value megatron derives, key 'effective' --
    the scheduler's weight decay at step 1 (0.033, its start_weight_decay) and FP32 Adam moments on the host
    (megatron-core builds HybridDeviceOptimizer without exp_avg_dtype) -- each with its upstream source."""
    from lcmoe_recipes.cli.launch import main

    monkeypatch.chdir(tmp_path)
    assert main(["dsv3", "--seq", "131072", "--dry-run", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recipe"] == "dsv3_128k_h100"
    values = {v["key"]: v for v in data["effective"]["values"]}
    assert values["weight_decay_at_step_1"]["runs"] == pytest.approx(0.033)
    moment = values["optimizer.moment_dtype"]
    assert moment["runs"] == "float32" and "HybridDeviceOptimizer" in moment["source"]
    assert values["optimizer.state_location"]["runs"] == "host"
    assert values["data"]["runs"] == "mock"
    assert all(v["source"].startswith(("megatron-core 0.19.2", "megatron-bridge 0.6.2")) for v in values.values())
    assert not [k for k, v in values.items() if v["differs"]]  # ours states what runs
    assert {"logs", "stand_ins"} <= set(data["effective"])


def test_launch_explain_shows_the_effective_settings(capsys, tmp_path, monkeypatch):
    """Qwen3-235B 128K (YaRN): --explain's section names rope fusion off, as megatron-bridge's
    validate_rope_fusion_compatibility leaves it, and the MoE layer's pre-MLP norm not recomputed."""
    from lcmoe_recipes.cli.launch import main

    monkeypatch.chdir(tmp_path)
    assert main(["qwen3_235b", "--seq", "131072", "--dry-run", "--explain"]) == 0
    text = capsys.readouterr().out
    section = text[text.index("effective settings (read back from megatron):"):]
    assert ("  rope_fusion: False <- megatron-bridge 0.6.2 models/gpt_provider.py GPTModelProvider.provide -> "
            "utils/fusions.py validate_rope_fusion_compatibility") in section
    assert "  layer[moe].recompute_pre_mlp_layernorm: False <- megatron-core 0.19.2" in section
    assert "  weight_decay_at_step_1: 0.033 <-" in section and "the config says" not in section


def test_check_json_reads_back_once(capsys, monkeypatch):
    """check --json: the check's own read-back (config_findings) is the one printed: megatron's objects are built
    once per config; without --explain the text output has no effective section."""
    from lcmoe_recipes.cli.check import main
    from lcmoe_recipes.emit import effective

    built = []
    real = effective._rope_fusion
    monkeypatch.setattr(effective, "_SETTINGS_CACHE", {})
    monkeypatch.setattr(effective, "_rope_fusion", lambda *a: built.append(1) or real(*a))
    assert main(["qwen3_next_8k_gb200", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is True and data["errors"] == 0
    values = {v["key"]: v for v in data["effective"]["values"]}
    assert values["rope_fusion"]["source"].endswith("validate_rope_fusion_compatibility")
    assert values["grad_buffer_dtype"]["runs"] == "fp32"  # FP32 gradient reduction, the training default
    assert len(built) == 1
    assert main(["qwen3_next_8k_gb200"]) == 0
    assert "effective settings" not in capsys.readouterr().out and len(built) == 1
