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
    assert data["valid"] is False and data["fix"].startswith("use 64 GPUs")
