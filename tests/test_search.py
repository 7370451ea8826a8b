"""The search at scale: pruned == exhaustive, the bounds are bounds, ties within the error band, --memory-margin,
--compare, and the one-way flow (the search never imports the plots)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lcmoe_recipes.catalog import MODELS, get_hardware
from lcmoe_recipes.cli.plan import main
from lcmoe_recipes.core.request import TrainingRequest
from lcmoe_recipes.cost import estimate_memory, estimate_step
from lcmoe_recipes.cost.bands import (BORROWED_WIDENING, HELD_OUT_BANDS, MEMORY_ERROR_BAND, MIN_BAND_MODELS,
                                      MIN_BAND_ROWS, STEP_ERROR_BAND, band_for, borrowed_widening, group_bands,
                                      held_out_ratios, memory_band, step_band)
from lcmoe_recipes.cost.bounds import compute_lower_bound, memory_lower_bound, step_lower_bound
from lcmoe_recipes.errors import InfeasibleConfig
from lcmoe_recipes.planner.search import (MIN_TP_WIDTH, _context, _tie_break, _with_knobs, enumerate_layouts,
                                          search_layouts, tp_width_limit)

ROOT = Path(__file__).resolve().parent.parent

# (seq_length, hardware, GPUs): 8K-256K, 64-16,384 GPUs, H100 and GB200; each model gets two, in turn
TARGETS = [(8192, "h100", 64), (32768, "gb200", 256), (131072, "h100", 1024), (262144, "gb200", 4096),
           (65536, "h100", 16384), (131072, "gb200", 16384), (16384, "gb200", 64), (262144, "h100", 2048)]
REQUESTS = [dict(model=m, seq_length=s, hardware=h, num_gpus=n)
            for i, m in enumerate(MODELS) for s, h, n in (TARGETS[(2 * i) % len(TARGETS)],
                                                           TARGETS[(2 * i + 1) % len(TARGETS)])]
REQUESTS += [dict(model="dsv3", seq_length=131072, hardware="h100", num_gpus=1024, allow_cpu_offload=False),
             dict(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=512, tp=2, memory_margin=0.15),
             # MBS 1 of TP4 CP2 EP64 PP1 fits only with recompute of the experts (its rung bound is over the cut) where
             # MBS 2 fits with no recompute and the optimizer offloaded, a tie: a larger MBS is not skipped with its
             # half on the rung bound, nor kept waiting behind it (a review found both, 2026-12-05)
             dict(model="dsv3", seq_length=8192, hardware="gb200", num_gpus=64),
             dict(model="minimax_m2", seq_length=8192, hardware="gb200", num_gpus=32, memory_margin=0.1)]


def _outcome(request: TrainingRequest, exhaustive: bool):
    try:
        return search_layouts(request, exhaustive=exhaustive)
    except InfeasibleConfig as exc:
        return exc.message


@pytest.mark.parametrize("fields", REQUESTS, ids=lambda f: "-".join(str(v) for v in f.values()))
def test_pruned_search_finds_the_exhaustive_winner_and_ranking(fields):
    request = TrainingRequest(**fields)
    pruned, exhaustive = _outcome(request, False), _outcome(request, True)
    if isinstance(exhaustive, str):
        assert pruned == exhaustive  # nothing fits: nothing is skipped, the same rejection counts and message
        return
    assert pruned.best.plan == exhaustive.best.plan  # layout and every knob (reasons aside)
    assert pruned.best.memory == exhaustive.best.memory and pruned.best.step == exhaustive.best.step
    assert [c.plan for c in pruned.ranked] == [c.plan for c in exhaustive.ranked]
    assert (pruned.ties, pruned.fastest.plan) == (exhaustive.ties, exhaustive.fastest.plan)
    assert exhaustive.pruned == 0 and exhaustive.evaluated == exhaustive.considered
    assert pruned.evaluated + pruned.pruned == pruned.considered


def test_pruning_skips_most_layouts_at_scale():
    result = search_layouts(TrainingRequest(model="dsv3", seq_length=131072, hardware="h100", num_gpus=16384))
    # 1,080 layouts (TP <= 4: DeepSeek-V3's hidden 7168 / 1024) x MBS 1, 2, 4
    assert result.considered == 3240 and result.pruned > 3240 // 2, (result.considered, result.pruned)  # most
    assert f"({result.pruned} skipped: a lower bound of their step time is slower" in result.why


@pytest.mark.parametrize("fields", [dict(model="dsv3", seq_length=131072, hardware="h100", num_gpus=1024),
                                    dict(model="qwen3_next", seq_length=65536, hardware="gb200", num_gpus=128),
                                    dict(model="qwen3_235b", seq_length=32768, hardware="h200", num_gpus=256)])
def test_bounds_never_exceed_the_prediction(fields):
    """Every bound is at most the predicted step / memory of every knob choice the search can make for a layout."""
    request = TrainingRequest(**fields)
    result = search_layouts(request, top=40, exhaustive=True)
    ctx = _context(request)
    checked = 0
    for candidate in result.ranked:
        p = candidate.plan
        lay = p.layout
        base = _with_knobs(p, ctx.ladder[0], 0.0, ctx.hw, request)
        cheap = compute_lower_bound(p.model, p.hardware, p.precision, p.seq_length, p.mtp_num_layers,
                                    p.micro_batch_size, lay, p.num_microbatches)
        tight = step_lower_bound(base)
        params = memory_lower_bound(base)
        assert cheap <= tight * (1 + 1e-12)
        for rung in ctx.ladder:
            for fraction in ctx.fractions:
                knobs = _with_knobs(base, rung, fraction, ctx.hw, request)
                assert tight <= estimate_step(knobs).step_seconds * (1 + 1e-12), (lay, rung, fraction)
                assert params <= estimate_memory(knobs).total <= estimate_memory(knobs).hbm_total
                checked += 1
    assert checked >= 40 * len(ctx.ladder)


@pytest.mark.parametrize("fields", [dict(model="dsv3", seq_length=131072, hardware="h100", num_gpus=1024),
                                    dict(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=64),
                                    dict(model="gpt_oss_120b", seq_length=65536, hardware="b200", num_gpus=64)])
def test_rung_bound_never_exceeds_the_priced_step(fields, monkeypatch):
    """The bound a rung is queued with (its own recompute; CP exchange, EP and TP overlaps at their fastest) is at
    most the step the search then prices for it, on every layout the exhaustive search fits; and it is tighter than
    the no-recompute bound wherever the rung recomputes (so a layout that needs recompute is priced later)."""
    from lcmoe_recipes.planner import search

    seen, priced = [], search._priced

    def record(ctx, rung, rules):
        candidate = priced(ctx, rung, rules)
        plans = [p for p in (rung.plan, rung.fallback and rung.fallback[0]) if p]
        plans = [p.with_changes(moe_ep_overlap=p.moe_ep_overlap or rung.wanted) for p in plans]
        loose = min(search._step_bound(p, ctx.table) for p in plans)  # the layout's bound without recompute
        seen.append((search._rung_bound(ctx, rung, loose), candidate.step.step_seconds, loose,
                     plans[0].recompute_granularity))
        return candidate

    monkeypatch.setattr(search, "_priced", record)
    search_layouts(TrainingRequest(**fields), exhaustive=True)
    assert len(seen) >= 20
    for bound, step, _, _ in seen:
        assert bound <= step * (1 + 1e-12)
    assert all(tight >= loose * (1 - 1e-12) for tight, _, loose, _ in seen)
    assert any(tight > loose * 1.05 for tight, _, loose, granularity in seen if granularity == "full")


def test_step_bound_takes_the_faster_of_tp_overlap_on_and_off():
    """Qwen3-235B 32K on 256 H200, TP2 CP1 EP16 PP1: its TP traffic is small beside the GEMMs it runs with, so the
    microbatch is slower with tp_comm_overlap on than off (the SMs TE's bulk transfers hold cost the GEMMs more than
    the traffic takes) and the search keeps it off. The bound of the base (overlap on, where megatron-bridge keeps
    it) must be at most the plan with it off: the faster of the two, not the on price (which was 0.18% too high)."""
    from dataclasses import replace

    from lcmoe_recipes.cost.step import microbatch_seconds, step_terms
    from lcmoe_recipes.planner.search import _base

    request = TrainingRequest(model="qwen3_235b", seq_length=32768, hardware="h200", num_gpus=256)
    lay = next(lay for lay in enumerate_layouts(request, None) if lay.describe().startswith("TP2 CP1 EP16 ETP1 PP1 "))
    base = _base(_context(request), lay, 1, {})[0]
    assert base.tp_comm_overlap
    terms = step_terms(base)
    on, off = microbatch_seconds(base, None, terms), microbatch_seconds(base, None, replace(terms, tp_on=False))
    assert on > off * 1.001  # the overlap is priced slower here
    factor = base.num_microbatches + (lay.pp - 1) / (lay.vpp or 1)
    assert step_lower_bound(base) == pytest.approx(factor * off, rel=1e-12)
    assert step_lower_bound(base) == step_lower_bound(base.with_changes(tp_comm_overlap=False))


def test_ties_keep_dp_alive_qwen3_235b_64k_64_gb200():
    """Qwen3-235B at 64K on 64 GB200 (issue 26's planned case, the README's plan example): the band is the median
    error of the held-out GB200 BF16 rows (LC8 0.89, LC10 1.00, HC11 1.08, PS11 1.27, PS24 1.21: ±10.7%), not the
    pooled ±12.8%. Within it, the fastest (TP4 CP4 EP64 PP1, DP4) leaves less than the memory band free (rule
    'headroom'); the next, TP4 CP8 EP32 PP1, keeps it, and DP alive (DP2)."""
    result = search_layouts(TrainingRequest(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=64), top=5)
    fastest, best, gib = result.fastest, result.best, 2**30
    assert HELD_OUT_BANDS[("gb200", "bf16")] == (5, 3, 0.107, 0.267)
    assert result.band == HELD_OUT_BANDS[("gb200", "bf16")][2] == 0.107 < STEP_ERROR_BAND
    assert "5 published gb200 bf16 rows" in result.band_reason
    ties = result.tie_break
    assert len(ties) == result.ties > 1
    steps = [t.step for t in ties]
    assert steps == sorted(steps) and steps[0] == fastest.step.step_seconds
    assert steps[-1] <= steps[0] * (1 + result.band)
    safe = MEMORY_ERROR_BAND * result.limit
    assert all(t.safe == (t.headroom >= safe) for t in ties)
    chosen = [t for t in ties if t.winner]
    assert len(chosen) == 1 and chosen[0][:2] == (best.plan.layout.describe(), best.plan.micro_batch_size)
    assert result.rule == "headroom" and "rule 'headroom'" in best.plan.reasons["layout"].why
    lay = best.plan.layout
    assert (lay.tp, lay.cp, lay.ep, lay.pp, lay.dp) == (4, 8, 32, 1, 2) and lay.dp >= 2
    before = ties.index(chosen[0])
    assert [t.passed_over for t in ties[:before]] == ["headroom"]
    assert ties[0].layout.startswith("TP4 CP4 EP64 ETP1 PP1 -> DP4") and not ties[0].safe
    assert not any(t.safe for t in ties[:before])  # no faster tie kept the band
    assert best.step.step_seconds / fastest.step.step_seconds - 1 < result.band
    assert best.memory.hbm_total <= result.limit and round(result.limit / gib, 1) == 164.6


def test_ties_keep_dp_alive_qwen3_235b_128k_128_h200():
    """Qwen3-235B at 128K on 128 H200 (no H200 row: the pooled band widened by the borrowing, ±57.7%): the four
    fastest ties leave less than the memory band free (rule 'headroom'); of those that keep it, the fastest three
    have DP1 and are passed over for a DP2 layout 0.5% slower than the first of them, TP4 CP16 EP64 PP1: rule 'data
    parallel' decides."""
    result = search_layouts(TrainingRequest(model="qwen3_235b", seq_length=131072, hardware="h200", num_gpus=128),
                            top=5)
    best, ties = result.best, result.tie_break
    assert result.rules == ("headroom", "data parallel") and result.rule == "data parallel"
    assert result.band == round(STEP_ERROR_BAND + BORROWED_WIDENING, 3) == 0.577
    (won,) = [t for t in ties if t.winner]
    before = ties[:ties.index(won)]
    assert won.layout == best.plan.layout.describe() == "TP4 CP16 EP64 ETP1 PP1 -> DP2 EDP2 on 128 GPUs"
    assert [t.passed_over for t in before if t.safe] == ["data parallel"] * 3
    assert all(t.dp == 1 for t in before if t.safe) and won.safe and won.dp == 2
    assert all(t.passed_over == "headroom" for t in before if not t.safe)
    first_safe = next(t for t in before if t.safe)
    assert 0 < won.step / first_safe.step - 1 < 0.01


def _tie(step, dp, free, hazards=()):
    from types import SimpleNamespace

    lay = SimpleNamespace(dp=dp)
    return SimpleNamespace(plan=SimpleNamespace(layout=lay), step=SimpleNamespace(step_seconds=step), free=free,
                           hazards=hazards)


@pytest.mark.parametrize("ties, winner, rule, passed", [
    # the fastest is safe and DP > 1: it wins
    ([(1.00, 2, 20), (1.01, 1, 30)], 0, "fastest", ["", "data parallel"]),
    # the fastest is safe, DP1; an equal-cost safe DP2 wins
    ([(1.00, 1, 20), (1.01, 2, 20), (1.02, 4, 30)], 1, "data parallel", ["data parallel", "", ""]),
    # no tie with DP > 1 keeps the band free: the fastest safe DP1 wins (memory before DP)
    ([(1.00, 2, 5), (1.01, 1, 20), (1.02, 2, 1)], 1, "headroom", ["headroom", "", "headroom"]),
    # every tie is DP1: headroom alone decides
    ([(1.00, 1, 5), (1.01, 1, 20)], 1, "headroom", ["headroom", ""]),
    # none keeps the band free: the most headroom wins
    ([(1.00, 2, 5), (1.01, 1, 8), (1.02, 2, 3)], 1, "most headroom", ["most headroom", "", "most headroom"]),
    # the fastest walks into an open hazard; of the rest, DP > 1 and safe
    ([(1.00, 2, 20, ("h",)), (1.01, 1, 20), (1.02, 2, 20)], 2, "data parallel", ["hazard", "data parallel", ""]),
])
def test_tie_break_rules_in_order(ties, winner, rule, passed, monkeypatch):
    """The tie-break's rules in order -- hazard, headroom, data parallel, then the fastest; most headroom when no
    tie keeps the memory band (10 here) free -- and the rule that decided is the last that passed over a faster
    tie."""
    from lcmoe_recipes.planner import search

    monkeypatch.setattr(search, "hazard_weight", lambda ids: len(ids))
    cands = [_tie(*t) for t in ties]
    best, decided, over = _tie_break(cands, {id(c): c.hazards for c in cands}, lambda c: c.free, 10)
    assert best is cands[winner] and decided == rule
    assert [over.get(id(c), "") for c in cands] == passed


def test_band_is_the_held_out_error_of_the_gpu_and_precision():
    """HELD_OUT_BANDS is what tests/published.py's held-out rows give per GPU x precision at the fitted constants;
    a GPU x precision with too few rows (or rows of one model) is widened, and the reason says so."""
    sys.path.insert(0, str(ROOT / "tests"))
    from published import THROUGHPUT_ROWS

    held = held_out_ratios(THROUGHPUT_ROWS, lambda p: estimate_step(p).tflops_per_gpu)
    assert group_bands(THROUGHPUT_ROWS, held) == HELD_OUT_BANDS  # after a refit: scripts/calibrate_step.py
    assert step_band(held) == STEP_ERROR_BAND and sum(n for n, *_ in HELD_OUT_BANDS.values()) == len(held) == 29
    for (gpu, precision), (rows, models, med, worst) in HELD_OUT_BANDS.items():
        band, why = band_for(gpu, precision, False)
        if rows >= MIN_BAND_ROWS and models >= MIN_BAND_MODELS:
            assert band >= med and f"{rows} published {gpu} {precision} rows" in why
        else:
            assert band >= max(STEP_ERROR_BAND, worst) and "widened" in why and f"only {rows} held-out" in why
            assert "a band of its own needs 3 rows of 2+ models" in why
    # H100 FP8 blockwise: 4 rows, all DeepSeek-V3 (LC2, LC4, LC6, HC1): one model's rows, widened to the pooled
    assert HELD_OUT_BANDS[("h100", "fp8_blockwise")][:2] == (4, 1)
    assert band_for("h100", "fp8_blockwise", False)[0] == STEP_ERROR_BAND
    # H100 FP8 current scaling: one row (PS22 1.00) whose error, 0.4%, is under the pooled median: the pooled
    assert band_for("h100", "fp8_cs", False)[0] == STEP_ERROR_BAND > HELD_OUT_BANDS[("h100", "fp8_cs")][3] == 0.004
    # B200 BF16: one row (PS13 1.42), and its attention scale is borrowed: the wider of its own worst row (0.423)
    # and the pooled median widened by the borrowing (0.577)
    assert HELD_OUT_BANDS[("b200", "bf16")][3] == 0.423
    assert band_for("b200", "bf16", False)[0] == round(STEP_ERROR_BAND + BORROWED_WIDENING, 3) == 0.577
    # H200: no rows and borrowed constants: the pooled median widened by the borrowing
    band, why = band_for("h200", "bf16", False)
    assert band == round(STEP_ERROR_BAND + BORROWED_WIDENING, 3) and "no held-out h200 bf16 row" in why


def test_tp_no_wider_than_the_width_supports():
    """Moonlight (hidden 2048) supports TP <= 2 at 1024 columns per rank: the search enumerates no wider TP while a
    narrower layout fits; a TP wish is honoured."""
    from lcmoe_recipes.catalog import get_model

    assert tp_width_limit(get_model("moonlight")) == 2048 // MIN_TP_WIDTH == 2
    assert tp_width_limit(get_model("dsv3")) == 4 and tp_width_limit(get_model("qwen3_235b")) == 4
    request = TrainingRequest(model="moonlight", seq_length=32768, hardware="h100", num_gpus=32)
    assert {lay.tp for lay in enumerate_layouts(request, 2)} <= {1, 2}
    result = search_layouts(request, top=20)
    assert all(c.plan.layout.tp <= 2 for c in result.ranked) and not result.tp_note
    wished = search_layouts(request.model_copy(update={"tp": 4}), top=1)
    assert wished.best.plan.layout.tp == 4


def test_mbs_searched_unless_given():
    from lcmoe_recipes.catalog import get_model

    request = TrainingRequest(model="qwen3_30b", seq_length=8192, hardware="gb200", num_gpus=8)
    searched = search_layouts(request, top=30, exhaustive=True)
    layouts = len(enumerate_layouts(request, tp_width_limit(get_model("qwen3_30b"))))
    assert searched.considered == 3 * layouts
    assert {c.plan.micro_batch_size for c in searched.ranked} >= {1, 2}
    given = search_layouts(TrainingRequest(model="qwen3_30b", seq_length=8192, hardware="gb200", num_gpus=8,
                                 micro_batch_size=2), top=30)
    assert given.considered == layouts and {c.plan.micro_batch_size for c in given.ranked} == {2}


@pytest.mark.slow
def test_error_bands_are_the_held_out_spread():
    """The bands are what the published rows give (refit: python scripts/calibrate_step.py prints them)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from published import MEMORY_ROWS, THROUGHPUT_ROWS

    from lcmoe_recipes.calibration.fit_memory import leave_one_out as memory_leave_one_out

    held = held_out_ratios(THROUGHPUT_ROWS, lambda p: estimate_step(p).tflops_per_gpu)
    assert step_band(held) == STEP_ERROR_BAND and borrowed_widening() == BORROWED_WIDENING
    assert memory_band(memory_leave_one_out({k: (r.plan, r.value) for k, r in MEMORY_ROWS.items()})) == MEMORY_ERROR_BAND


def test_memory_margin():
    request = TrainingRequest(model="qwen3_235b", seq_length=131072, hardware="gb200", num_gpus=128)
    default, roomy = search_layouts(request), search_layouts(request.model_copy(update={"memory_margin": 0.45}))
    hbm = get_hardware("gb200").hbm_bytes
    assert default.limit == pytest.approx(0.95 * hbm) and roomy.limit == pytest.approx(0.55 * hbm)
    assert all(c.memory.hbm_total <= 0.55 * hbm for c in roomy.ranked)
    assert default.best.memory.hbm_total > 0.55 * hbm  # the default winner would not have fitted the larger margin
    with pytest.raises(ValueError, match="memory_margin 0.01 is not a fraction of HBM to keep free between 0.05 and 1"):
        TrainingRequest(model="dsv3", seq_length=4096, hardware="h100", num_gpus=8, memory_margin=0.01)


def test_memory_margin_flag(capsys):
    assert main(["qwen3_235b", "--seq", "131072", "--gpus", "128", "--hardware", "gb200", "--top", "1",
                 "--memory-margin", "0.25", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["winner"]["memory_gib"]["total"] <= 0.75 * data["winner"]["hbm_gib"]
    assert main(["dsv3", "--seq", "4096", "--gpus", "8", "--hardware", "h100", "--memory-margin", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "memory_margin 1.5 is not a fraction of HBM to keep free" in err and "use e.g. 0.1" in err


def test_compare_hardware_at_one_precision(capsys):
    assert main(["dsv3", "--seq", "131072", "--gpus", "256", "--compare", "h100,gb200"]) == 0
    out = capsys.readouterr().out
    assert ("at bf16: the GPUs' defaults differ (h100 fp8_blockwise, gb200 mxfp8); BF16 is the precision every GPU "
            "in the catalogue runs") in out
    header = out.splitlines()[1]
    assert "256 x h100" in header and "256 x gb200" in header
    assert main(["dsv3", "--seq", "131072", "--gpus", "256", "--compare", "h100,gb200", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["precision"] == "bf16" and [t["hardware"] for t in data["targets"]] == ["h100", "gb200"]
    h100 = data["targets"][0]
    assert h100["precision"] == "bf16" and h100["memory_gib"] <= h100["limit_gib"]
    expected = search_layouts(TrainingRequest(model="dsv3", seq_length=131072, hardware="h100", num_gpus=256, precision="bf16"),
                    top=1).best
    assert h100["step_seconds"] == pytest.approx(expected.step.step_seconds)
    assert h100["layout"]["dp"] == expected.plan.layout.dp


def test_compare_gpu_counts_and_refusals(capsys):
    assert main(["dsv3", "--seq", "131072", "--gpus", "64,256", "--hardware", "h100"]) == 0
    out = capsys.readouterr().out
    assert "at fp8_blockwise: the precision chosen for DeepSeek-V3 (671B, 37B active) on every GPU compared" in out
    assert "64 x h100: no layout for dsv3 at seq_length 131072 on 64 x h100" in out and "fix: use 128 GPUs (the smallest count above 64 tried at which a layout fits; of the counts tried, 72, 80, 88 and 96 do not)" in out
    # 256 H100 is the named recipe's target: the comparison says launch uses the recipe there, as one target does
    assert "256 x h100: note: the named recipe dsv3_128k_h100 covers this request, and launch uses it" in out
    assert "--tp " in out.split("256 x h100: note:")[1]  # the wishes that launch the search's answer instead
    # the recipe keeps upstream's optimizer CPU offload and its confirmed checkpoint bug; the winner fits without it
    assert ("it walks into open upstream bug(s) the winner avoids: optimizer-cpu-offload-checkpoint (warning, "
            "confidence confirmed)") in out.split("256 x h100: note:")[1]
    assert "avoids" not in out.split("256 x h100: note:")[0]  # 64 x h100 has no named recipe, so no note
    assert main(["dsv3", "--seq", "131072", "--gpus", "256", "--hardware", "h100", "--compare", "gb200"]) == 2
    assert "give --compare h100,gb200 alone, or --hardware NAME alone" in capsys.readouterr().err
    assert main(["dsv3", "--seq", "131072", "--gpus", "256,512", "--hardware", "h100", "--plot", "x"]) == 2
    assert "--plot works on one target" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["dsv3", "--seq", "131072", "--gpus", "256,x", "--hardware", "h100"])
    assert "'256,x' is not a GPU count or a comma-separated list of them" in capsys.readouterr().err
    # a fresh user's --gpus 256,256 planned the same target twice, and --top was ignored by a comparison
    with pytest.raises(SystemExit):
        main(["dsv3", "--seq", "131072", "--gpus", "256,512,256", "--hardware", "h100"])
    assert "'256,512,256' lists 256 more than once\n  fix: give each once: --gpus 256,512\n" in capsys.readouterr().err
    assert main(["dsv3", "--seq", "131072", "--gpus", "256,512", "--hardware", "h100", "--top", "3"]) == 2
    assert "--top works on one target" in capsys.readouterr().err


def test_search_never_imports_the_plots():
    code = ("import sys, lcmoe_recipes.planner.search, lcmoe_recipes.cli.plan; a = 'lcmoe_recipes.report.plots' in sys.modules; "
            "import lcmoe_recipes.report.plots; print(a, 'lcmoe_recipes.planner.search' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]
    imports = [line for line in (ROOT / "src" / "lcmoe_recipes" / "report" / "plots.py").read_text().splitlines()
               if line.strip().startswith(("import ", "from "))]
    assert not [line for line in imports if "search" in line or "planner" in line or "request" in line], imports


def test_scaling_doc_is_current():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "scaling_report.py"), "--check"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


def test_launch_takes_memory_margin():
    """launch plans a request no named recipe covers with the same flag (nothing built: the Plan only)."""
    from lcmoe_recipes import resolve
    from lcmoe_recipes.cli.common import request_from_args
    from lcmoe_recipes.cli.launch import _parser

    args = _parser().parse_intermixed_args(["qwen3_235b", "--seq", "65536", "--gpus", "64", "--hardware", "gb200",
                                            "--memory-margin", "0.3", "--dry-run"])
    planned = resolve(request_from_args(args)).plan
    assert estimate_memory(planned).hbm_total <= 0.7 * get_hardware("gb200").hbm_bytes
    assert planned.layout == search_layouts(TrainingRequest(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=64,
                                                  memory_margin=0.3), top=1).best.plan.layout


def test_planner_doc_states_the_bands():
    text = (ROOT / "docs" / "planner.md").read_text()
    assert f"**±{STEP_ERROR_BAND:.1%}**" in text and f"**{MEMORY_ERROR_BAND:.1%}**" in text
    assert f"GB200 BF16 **±{HELD_OUT_BANDS[('gb200', 'bf16')][2]:.1%}**" in text
    for name, key in (("GB200 MXFP8", ("gb200", "mxfp8")), ("GB300 MXFP8", ("gb300", "mxfp8")),
                      ("H100 BF16", ("h100", "bf16"))):
        assert f"{name} ±{HELD_OUT_BANDS[key][2]:.1%}" in text
    assert f"B200 BF16: one row, ±{band_for('b200', 'bf16', False)[0]:.1%}" in text
    from lcmoe_recipes.planner.search import UNCALIBRATED_FACTOR

    assert f"{UNCALIBRATED_FACTOR:.0%} of that" in text  # the gated-DeltaNet planning factor
    assert f"**±{BORROWED_WIDENING:.1%}**" in text


def test_plan_says_which_rule_decided(capsys):
    """`plan` prints the rule that decided (and the rules before it), `--explain` the rule that passed over each
    tie, `--json` both: the README's example, Qwen3-235B at 64K on 64 GB200."""
    args = ["qwen3_235b", "--seq", "65536", "--gpus", "64", "--hardware", "gb200", "--top", "3"]
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rule"] == "headroom" and data["rules"] == ["headroom"]
    assert data["band"] == HELD_OUT_BANDS[("gb200", "bf16")][2]
    won = [t for t in data["tie_break"] if t["winner"]]
    assert len(won) == 1 and won[0]["dp"] == 2 and won[0]["passed_over"] == ""
    before = data["tie_break"][:data["tie_break"].index(won[0])]
    assert [(t["dp"], t["passed_over"], t["keeps_memory_band"]) for t in before] == [(4, "headroom", False)]
    assert main(args + ["--explain"]) == 0
    out = capsys.readouterr().out
    assert "decided by: headroom (within ±10.7% of the fastest" in out
    assert "TP4 CP4 EP64 ETP1 PP1 -> DP4 EDP1 on 64 GPUs, MBS 1: 52.83 s, 8.5 GiB free  (passed over: headroom)" in out
    assert "TP4 CP8 EP32 ETP1 PP1 -> DP2 EDP2 on 64 GPUs, MBS 1: 53.35 s, 28.3 GiB free, band free  <- winner" in out
    # a DP1 tie after the winner that keeps the band: the data-parallel rule passes it over
    assert "TP4 CP4 EP16 ETP1 PP4 VPP12 -> DP1 EDP1 on 64 GPUs, MBS 1: 53.41 s, 19.8 GiB free, band free  (passed " \
           "over: data parallel)" in out


@pytest.mark.parametrize("fields", [dict(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=64),
                                    REQUESTS[-2], dict(model="gpt_oss_120b", seq_length=32768, hardware="gb200",
                                                       num_gpus=64)], ids=lambda f: f["model"])
def test_a_rung_changes_only_the_knob_checks(fields):
    """The search checks a rung's plan with checks.knob_findings alone (its base passed check_plan): every other
    check reads none of the fields a rung sets, so on every rung -- recompute level x offload fraction, with the CUDA
    graphs the rule allows -- the findings outside knob_findings are the base's."""
    from lcmoe_recipes.checks import check_plan, knob_findings

    request = TrainingRequest(**fields)
    ctx = _context(request)
    base = search_layouts(request).best.plan
    rest = [f for f in check_plan(base) if f not in knob_findings(base)]
    for rung in ctx.ladder:
        for fraction in ctx.fractions:
            plan = _with_knobs(base, rung, fraction, ctx.hw, request)
            assert [f for f in check_plan(plan) if f not in knob_findings(plan)] == rest, (rung, fraction)
    # a rung whose knobs Megatron refuses is caught by knob_findings alone
    refused = base.with_changes(recompute_granularity="full", recompute_method=None, recompute_num_layers=None)
    assert "recompute/full-args" in [f.rule for f in knob_findings(refused) if f.severity == "error"]


def test_planner_turns_the_ep_overlap_on_where_megatron_allows_it_and_it_pays():
    """Issue 26, item 3: the README's plan (Qwen3-235B, 64K, 64 GB200) starts from megatron-bridge's 64-GPU GB200
    BF16 recipe, which leaves overlap_moe_expert_parallel_comm off; megatron-core allows it on the winner (EP32, PP1,
    no 'moe' recompute), so the planner turns it on, with delayed weight gradients, and the reason gives the step
    with and without it; the config says so (and keeps the shared-expert overlap off, which megatron-core forbids
    beside it)."""
    from lcmoe_recipes.catalog import get_model
    from lcmoe_recipes.cost.step import ep_overlap_steps
    from lcmoe_recipes.emit import config_from_plan
    from lcmoe_recipes.rules.base import choose_base
    from lcmoe_recipes.rules.extension import ep_overlap_blockers

    fields, _ = choose_base(get_model("qwen3_235b"), get_hardware("gb200"), "bf16", 64)
    assert fields["base_recipe"].endswith("qwen3_235b_a22b_pretrain_64gpu_gb200_bf16_config")
    assert fields["moe_ep_overlap"] is False
    best = search_layouts(TrainingRequest(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=64)).best
    plan = best.plan
    assert plan.moe_ep_overlap and ep_overlap_blockers(plan) == []
    on, off = ep_overlap_steps(plan)
    assert on == pytest.approx(best.step.step_seconds, rel=1e-12) and on < 0.97 * off  # at least 3% faster
    why = plan.reasons["moe_ep_overlap"].why
    assert "which the base recipe leaves off" in why and f"({off:.2f} s -> {on:.2f} s)" in why
    (ep,) = [o for o in best.step.overlaps if o.name.startswith("EP")]
    assert ep.on and ep.exposed < ep.communication
    cfg = config_from_plan(plan, quiet=True)
    assert cfg.comm_overlap.overlap_moe_expert_parallel_comm is True
    assert cfg.comm_overlap.delay_wgrad_compute is True
    assert cfg.model.moe_shared_expert_overlap is False


def test_planner_turns_tp_comm_overlap_on_wherever_megatron_bridge_keeps_it():
    """Issue 26, item 3: every planned layout with TP >= 2 (sequence parallel) runs tp_comm_overlap, says why, and
    writes it; TP1 layouts do not."""
    from lcmoe_recipes.emit import config_from_plan

    result = search_layouts(TrainingRequest(model="qwen3_235b", seq_length=32768, hardware="h100", num_gpus=64),
                            top=20)
    by_tp = {c.plan.layout.tp > 1: c.plan for c in result.ranked}
    assert set(by_tp) == {True, False}
    wide, narrow = by_tp[True], by_tp[False]
    assert wide.tp_comm_overlap and wide.sequence_parallel and not narrow.tp_comm_overlap
    assert wide.reasons["tp_comm_overlap"].why.startswith(f"on: megatron-bridge keeps it at TP{wide.layout.tp}")
    assert narrow.reasons["tp_comm_overlap"].why == "megatron-bridge turns tp_comm_overlap off at TP < 2"
    assert config_from_plan(wide, quiet=True).comm_overlap.tp_comm_overlap is True


def test_a_rung_or_graphs_megatron_forbids_turn_the_ep_overlap_off_and_say_why():
    """A rung with 'moe' in its recompute modules (DeepSeek-V3 at 128K on 256 H100: the winner recomputes
    layernorm, mla_up_proj, mlp and moe) runs without the overlap, priced and stated so; Transformer Engine CUDA
    graphs over the moe / mlp scope forbid it too (megatron-core 0.19.2 TransformerConfig)."""
    from lcmoe_recipes.cost.memory import ep_overlap_warmup
    from lcmoe_recipes.rules.extension import ep_overlap_blockers

    best = search_layouts(TrainingRequest(model="dsv3", seq_length=131072, hardware="h100", num_gpus=256)).best
    plan = best.plan
    assert "moe" in plan.recompute_modules and not plan.moe_ep_overlap and ep_overlap_warmup(plan) == 0
    assert plan.reasons["moe_ep_overlap"].why.startswith(
        "EP all-to-all overlap off: the planner would overlap it with compute, but megatron-core forbids that with "
        "'moe' in recompute_modules")
    (ep,) = [o for o in best.step.overlaps if o.name.startswith("EP")]
    assert not ep.on and ep.exposed == ep.communication > 0
    graphed = plan.with_changes(recompute_modules=("layernorm",), cuda_graph_impl="transformer_engine",
                                cuda_graph_modules=("moe",))
    assert ep_overlap_blockers(graphed) == ["Transformer Engine CUDA graphs over the moe / mlp scope"]
    assert ep_overlap_blockers(graphed.with_changes(cuda_graph_modules=("attn",))) == []


def test_a_vpp_rung_that_fits_only_without_the_ep_overlap_runs_without_it():
    """With VPP the overlap keeps one more model chunk of activations in flight (megatron-core's extra warm-up
    microbatch). DeepSeek-V3 128K on 1,024 H100, TP2 CP32 EP32 PP8 VPP4: the first rung that fits with the overlap
    off does not fit with it on, and every later rung that fits recomputes 'moe', which forbids it: the layout runs
    that first rung without the overlap, and says so."""
    from lcmoe_recipes.planner.search import _base, _fit

    request = TrainingRequest(model="dsv3", seq_length=131072, hardware="h100", num_gpus=1024)
    ctx = _context(request)
    (layout,) = [lay for lay in enumerate_layouts(request) if lay.describe().startswith("TP2 CP32 EP32 ETP1 PP8 VPP4")]
    base, rules = _base(ctx, layout, 1, {})
    assert base.moe_ep_overlap and rules[2] is False  # the planner's, not the base recipe's
    fitted = _fit(ctx, base, rules, {})
    plan = fitted.plan
    assert not plan.moe_ep_overlap and "moe" not in plan.recompute_modules
    assert plan.reasons["moe_ep_overlap"].why.endswith(
        "this layout fits only with recompute that megatron-core forbids beside it, or not at all")
    with_it = plan.with_changes(moe_ep_overlap=True)
    assert estimate_memory(with_it).hbm_total > ctx.limit >= fitted.memory.hbm_total
    assert estimate_memory(with_it).activations > fitted.memory.activations


def test_the_table_says_why_a_faster_row_is_below_the_winner(capsys):
    """A fresh user read rank 1 (53.35 s) above a faster rank 2 (52.83 s) as a sorting error: the header says the
    winner leads and the faster rows lost the tie-break, by which rule."""
    assert main(["qwen3_235b", "--seq", "65536", "--gpus", "64", "--hardware", "gb200"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith("5 shown (exposed seconds per step by collective); rank 1 is the winner, the others "
                           "fastest first: the faster ones lost the tie-break (rule 'headroom', below)")
    # where different rules passed over the faster rows shown, the header names each, as the CSV's column does
    assert main(["glm45", "--seq", "65536", "--gpus", "128", "--hardware", "h100"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(
        "the faster ones lost the tie-break (rules 'data parallel' and 'headroom', below)")
    assert main(["glm45", "--seq", "65536", "--gpus", "128", "--hardware", "h100", "--csv", "-"]) == 0  # CSV alone
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("rank,TP,CP,") and rows[0].endswith(",tie-break") and len(rows) == 6
    assert {r.rsplit(",", 1)[1] for r in rows[1:]} >= {"passed over (data parallel)", "passed over (headroom)"}


def test_plan_piped_into_head_keeps_its_csv(tmp_path):
    """`plan --csv FILE | head -1`: a fresh user lost the CSV (the closed pipe raised before it was written) and got
    a BrokenPipeError traceback; the file is written first, and a closed pipe ends the command quietly. The pipe
    here is closed before the command writes (its read end shut), so every write fails."""
    import os

    csv_file = tmp_path / "t.csv"
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "lcmoe_recipes.plan", "glm45", "--seq", "65536", "--gpus", "128",
                               "--hardware", "h100", "--csv", str(csv_file)], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=300)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, "")
    assert csv_file.read_text().splitlines()[0].endswith(",tie-break") and len(csv_file.read_text().splitlines()) == 6


def test_a_cp_wish_that_does_not_split_seq_length_names_cps_the_search_finds_layouts_with():
    """--cp 32 at seq_length 100,000 (not a multiple of 64): the fix was "use CP=16, which then also needs: use
    GBS=80 or 88" -- one candidate's GBS re-checked -- though --cp 16 alone launches (the search derives GBS)."""
    from lcmoe_recipes.errors import InfeasibleConfig
    from lcmoe_recipes.planner.resolve import search

    asked = dict(model="qwen3_235b", seq_length=100000, hardware="gb200", num_gpus=128)
    with pytest.raises(InfeasibleConfig) as err:
        search(TrainingRequest(**asked, cp=32))
    assert err.value.fix == ("use CP=8 or 16 (a CP whose 2·CP chunks split seq_length 100,000; a layout was found "
                             "with it)")
    for cp in (8, 16):
        assert search(TrainingRequest(**asked, cp=cp)).best.plan.layout.cp == cp
