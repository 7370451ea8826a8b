"""The peer comparison (issue 26 item 5): which published rows SimuMax v1.2 can express, what it is given for them,
and the stored results docs/accuracy.md reports (tests/simumax_v1_2.json, written by scripts/simumax_compare.py from
a SimuMax v1.2 checkout; SimuMax itself is not installed here)."""

import json
from pathlib import Path

import pytest
from published import THROUGHPUT_ROWS
from scripts_loader import load_script

ROOT = Path(__file__).resolve().parent.parent




compare = load_script("simumax_compare")
STORED = json.loads((ROOT / "tests" / "simumax_v1_2.json").read_text())


def test_stored_results_follow_the_rules_and_cover_every_row():
    """Every published throughput row is either run or refused with the reason the rules give now: a row added to
    tests/published.py, or a rule changed, fails here until the comparison is re-run."""
    assert set(STORED["rows"]) | set(STORED["not_expressible"]) == set(THROUGHPUT_ROWS)
    for key, why in STORED["not_expressible"].items():
        assert compare.expressible(THROUGHPUT_ROWS[key].plan) == why, key
    for key in STORED["rows"]:
        assert compare.expressible(THROUGHPUT_ROWS[key].plan) is None, key
    assert sorted(STORED["rows"]) == ["HC8", "PS13"]       # B200 BF16: the only rows its public configs can price
    assert STORED["simumax"]["commit"] == "4dcaae513ba7679d56c116a17cd4a691ec41e252"


def test_what_simumax_is_given_for_qwen3_235b_on_b200():
    """HC8: Qwen3-235B-A22B, 128 x B200 BF16, TP2 PP4 VPP12 EP16, MBS2 GBS2048 (skills card, tracker ad4138a1d)."""
    model, strategy, assumed = compare.simumax_inputs(THROUGHPUT_ROWS["HC8"].plan)
    # Qwen/Qwen3-235B-A22B config.json
    assert (model["hidden_size"], model["head_num"], model["kv_head_num"], model["head_size"]) == (4096, 64, 4, 128)
    assert (model["layer_num"], model["expert_num"], model["topk"], model["moe_ffn_hidden_size"]) == (94, 128, 8, 1536)
    # DP = 128 / (2 x 4) = 16; microbatches = 2048 / (2 x 16) = 64; 94 layers + embedding + loss = 96 = 4 x 12 x 2
    assert strategy["micro_batch_num"] == 64 and strategy["interleaving_size"] == 12
    assert strategy["account_for_embedding_in_pipeline_split"] and strategy["account_for_loss_in_pipeline_split"]
    assert (strategy["tp_size"], strategy["pp_size"], strategy["ep_size"], strategy["world_size"]) == (2, 4, 16, 128)
    assert strategy["enable_sequence_parallel"] and not strategy["enable_recompute"] and assumed == ()


def test_gpt_oss_recompute_and_assumptions():
    """PS13: gpt-oss-120b on 64 x B200 BF16 recomputes layernorm and moe_act; sinks and windows are stated."""
    model, strategy, assumed = compare.simumax_inputs(THROUGHPUT_ROWS["PS13"].plan)
    assert (model["hidden_size"], model["head_size"], model["expert_num"], model["topk"]) == (2880, 64, 128, 4)
    assert strategy["megatron_recompute_modules"] == ["layernorm", "moe_act"]
    assert strategy["micro_batch_num"] == 1280 // (4 * 64)
    assert any("sliding windows" in a for a in assumed)


def test_rows_it_cannot_express_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="dsv3_b200: its public B200 config has no FP8 GEMM efficiency"):
        compare.simumax_inputs(THROUGHPUT_ROWS["PS14"].plan)
    assert compare.expressible(THROUGHPUT_ROWS["VC1"].plan) == "no public SimuMax system config for H100"
    assert "61 layers" in compare.expressible(THROUGHPUT_ROWS["HC2"].plan)


def test_peer_ratio_is_at_our_flop_count():
    """PS13 (NVIDIA performance summary archive, 26.04.01 pre-training table, 369 TFLOP/s counted at 0.830 of our
    FLOPs): SimuMax's 8.70 s step is 0.69 of the published throughput; our model reads 1.42."""
    from lcmoe_recipes.cost.step import estimate_step

    report = load_script("accuracy_report")
    ratios = report.simumax_ratios(THROUGHPUT_ROWS)
    row, est = THROUGHPUT_ROWS["PS13"], estimate_step(THROUGHPUT_ROWS["PS13"].plan)
    assert STORED["rows"]["PS13"]["step_seconds"] == pytest.approx(8.70, abs=0.01)
    assert ratios["PS13"] == pytest.approx(0.69, abs=0.01)
    assert est.tflops_per_gpu / row.comparable == pytest.approx(1.42, abs=0.01)
