"""One request, one resolver: every command and the Python API answer a TrainingRequest with lcmoe_recipes.planner.resolve;
commands only parse and print; the default output is a summary a person reads, --explain keeps every reason."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

from lcmoe_recipes import (LcmoeError, NAMED_RECIPES, TrainingRequest, dsv3_128k_h100, phase_requests, recipe_plan,
                           resolve)
from lcmoe_recipes.catalog import get_model
from lcmoe_recipes.cli.common import as_flags, request_from_args
from lcmoe_recipes.cli.launch import _parser as launch_parser, main as launch
from lcmoe_recipes.cli.plan import main as plan_main
from lcmoe_recipes.planner.resolve import search
from lcmoe_recipes.report.text import Citations, split_sources

ROOT = Path(__file__).resolve().parent.parent


def _request(*argv: str) -> TrainingRequest:
    return request_from_args(launch_parser().parse_intermixed_args(list(argv)), named=tuple(NAMED_RECIPES))


# --- one resolver ------------------------------------------------------------------------------------------------

def test_a_named_recipe_resolves_to_its_plan_by_name_or_by_request():
    by_name = resolve(TrainingRequest(recipe="dsv3_128k_h100"))
    assert by_name.plan == recipe_plan("dsv3_128k_h100")
    assert (by_name.recipe.name, by_name.options, by_name.source, by_name.weights.pretrained) == (
        "dsv3_128k_h100", {}, None, None)
    by_model = resolve(TrainingRequest(model="deepseek-v3", seq_length=131072))
    assert by_model.plan == recipe_plan("dsv3_128k_h100")
    mxfp8 = resolve(_request("qwen3_235b", "--seq", "131072", "--precision", "mxfp8", "--tokens-per-step", "4194304"))
    assert mxfp8.plan == recipe_plan("qwen3_235b_128k_gb200", precision="mxfp8", tokens_per_step=4194304)
    # what the YAML header records, so `check` rebuilds the same recipe
    assert mxfp8.options == {"precision": "mxfp8", "tokens_per_step": 4194304}


def test_layout_wishes_plan_the_named_recipes_target():
    resolution = resolve(_request("qwen3_next_8k_gb200", "--tp", "2"))
    plan = resolution.plan
    assert (plan.layout.world, plan.hardware, plan.layout.tp) == (32, "gb200", 2)
    assert plan.reasons["layout"].why.startswith("planned for the named recipe's target (32 x gb200) because the "
                                                 "wishes tp ask for what qwen3_next_8k_gb200 pins")
    assert resolution.recipe is None and resolution.options == {}  # searched: no named recipe's options to record
    # a named recipe on another GPU count (a fresh user's `launch dsv3_128k_h100 --gpus 512`, refused before): its
    # model is planned there, as a layout wish would have it
    moved = resolve(TrainingRequest(recipe="dsv3_128k_h100", num_gpus=512))
    assert (moved.plan.layout.world, moved.plan.hardware, moved.plan.seq_length, moved.recipe) == (
        512, "h100", 131072, None)
    assert moved.plan.reasons["layout"].why.startswith(
        "planned for 512 x h100 at seq_length 131072: the request asks for num_gpus 512 (the named recipe "
        "dsv3_128k_h100 is 256 x h100 at 131072, and no named recipe is for this target); ")
    # where a named recipe is for the target asked, it answers
    assert resolve(TrainingRequest(recipe="dsv3_128k_h100", seq_length=262144, num_gpus=512)).recipe.name == \
        "dsv3_256k_h100"


def test_a_request_no_recipe_covers_is_searched_or_refused_with_the_fix():
    plan = resolve(TrainingRequest(model="qwen3_235b", seq_length=65536, hardware="gb200", num_gpus=64)).plan
    assert plan.name == "qwen3_235b_64k_64xgb200" and plan.layout.world == 64
    with pytest.raises(LcmoeError) as err:
        resolve(TrainingRequest(model="qwen3_235b", seq_length=65536))
    assert "no named recipe for qwen3_235b at seq_length 65536" in err.value.message
    # the library names the request's fields; a command line shows its flags
    assert "or give `num_gpus` and `hardware` to plan one" in err.value.fix
    assert set(err.value.fields) >= {"num_gpus", "hardware"}
    assert as_flags(err.value.fix, err.value.fields).endswith("or give --gpus and --hardware to plan one")
    assert "seq_length=131072 num_gpus=128 hardware=gb200" in err.value.fix
    assert "--seq 131072 --gpus 128 --hardware gb200" in as_flags(err.value.fix, err.value.fields)
    with pytest.raises(LcmoeError) as err:
        resolve(TrainingRequest(model="qwen3_235b"))
    assert (err.value.message, err.value.fields) == ("`seq_length` is required with model 'qwen3_235b'",
                                                     ("seq_length",))
    assert as_flags(err.value.message, err.value.fields) == "--seq is required with model 'qwen3_235b'"
    assert as_flags(err.value.fix, err.value.fields) == "e.g. --seq 131072 (a named recipe sets its own)"
    with pytest.raises(LcmoeError, match="unknown recipe 'dsv3_128k_h10'"):
        resolve(TrainingRequest(recipe="dsv3_128k_h10"))
    with pytest.raises(LcmoeError, match="one plan per phase"):
        resolve(TrainingRequest(model="qwen3_30b", phases=(32768, 65536), hardware="h100", num_gpus=64))


def test_phases_are_one_request_each_on_one_target():
    phases = phase_requests(TrainingRequest(model="dsv3", phases=(32768, 131072)))
    assert [(p.seq_length, p.phase, p.num_gpus, p.hardware) for p in phases] == [(32768, 1, 256, "h100"),
                                                                                 (131072, 2, 256, "h100")]
    # the phase whose length gave the target names its recipe: it is not looked up again
    assert [p.recipe for p in phases] == [None, "dsv3_128k_h100"]
    first = resolve(phases[0]).plan
    assert first.name == "dsv3_32k_256xh100-phase1"
    resolved = resolve(phases[1].replace(pretrained_checkpoint="/ckpt/phase1"))
    second = resolved.plan
    assert second.pretrained_checkpoint == "/ckpt/phase1" and second.name == "dsv3_128k_h100-phase2"
    assert resolved.weights.entry == {"from_checkpoint": "/ckpt/phase1"}
    assert resolved.options == {"pretrained_checkpoint": "/ckpt/phase1"}
    assert second.reasons["pretrained_checkpoint"].why.startswith("model weights from phase 1's checkpoints "
                                                                  "(/ckpt/phase1)")


def test_bad_requests_name_every_field_and_the_fix():
    with pytest.raises(LcmoeError) as err:
        TrainingRequest.parse(model="dsv3", seq_length=-4096, tokens_per_step=0, lr=-1e-5)
    assert "seq_length -4096 must be greater than 0" in err.value.message
    assert "tokens_per_step 0 must be greater than 0" in err.value.message and "lr -1e-05" in err.value.message
    assert err.value.fix == "use e.g. 131072 (128K); use e.g. 8388608 (8M); use e.g. 1e-05"
    with pytest.raises(LcmoeError, match="use one of bf16, fp8_blockwise, fp8_cs, mxfp8"):
        TrainingRequest.parse(model="dsv3", seq_length=4096, precision="fp6")
    with pytest.raises(LcmoeError, match="convert_to converts a Hugging Face folder and needs from_hf"):
        TrainingRequest.parse(model="dsv3", seq_length=4096, convert_to="/x")
    with pytest.raises(LcmoeError, match="seq_length and phases both given"):
        TrainingRequest.parse(model="dsv3", seq_length=4096, phases=(4096, 8192))


def test_nothing_below_the_commands_takes_a_namespace():
    """The library's entry points take requests and keywords (the import rule itself: tests/test_architecture.py)."""
    from lcmoe_recipes import build_phases, build_recipe

    for fn in (resolve, phase_requests, build_recipe, build_phases):
        assert "Namespace" not in str(inspect.signature(fn))


# --- the Python API ----------------------------------------------------------------------------------------------

def test_named_factories_show_their_options():
    params = inspect.signature(dsv3_128k_h100).parameters
    assert list(params) == ["precision", "rope", "tokens_per_step", "global_batch_size", "lr", "train_iters",
                            "pretrained_checkpoint", "overrides"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    assert "DeepSeek-V3 at 128K on 256 H100" in dsv3_128k_h100.__doc__
    # a keyword the recipe does not take (a fresh user's gpus=8): the keywords there are, and where another target goes
    with pytest.raises(TypeError) as err:
        dsv3_128k_h100(gpus=8)
    assert str(err.value) == (
        "dsv3_128k_h100() got an unexpected keyword argument 'gpus': it takes keywords only (precision, rope, "
        "tokens_per_step, global_batch_size, lr, train_iters, pretrained_checkpoint, overrides); its layout and GPU "
        "count are the recipe's (256 x h100). For another target plan one: build_recipe(TrainingRequest("
        "model='dsv3', seq_length=131072, num_gpus=N, hardware='h100'))")
    with pytest.raises(TypeError, match=r"^dsv3_128k_h100\(\) too many positional arguments: it takes keywords only"):
        dsv3_128k_h100("fp8_blockwise")


@pytest.mark.slow
def test_build_recipe_and_factories_take_overrides(configs):
    from lcmoe_recipes import OverrideError, build_recipe, qwen3_next_8k_gb200

    cfg = qwen3_next_8k_gb200(overrides=["train.train_iters=200"])
    assert cfg.train.train_iters == 200
    cfg = build_recipe(recipe="qwen3_next_8k_gb200", tokens_per_step=2**21, overrides=["train.train_iters=50"])
    assert (cfg.train.train_iters, cfg.train.global_batch_size) == (50, 256)
    with pytest.raises(OverrideError):
        build_recipe(recipe="qwen3_next_8k_gb200", overrides=["train.no_such_field=1"])


# --- bugs from a new user's trial ---------------------------------------------------------------------------------

QWEN3_30B = json.loads((ROOT / "src" / "lcmoe_recipes" / "catalog" / "hf_configs" / "qwen3_30b_a3b.json").read_text())


def test_a_config_json_equal_to_a_catalogue_model_takes_its_published_facts(tmp_path):
    """Qwen3-30B-A3B's own config.json (max_position_embeddings 40,960) is Qwen3-30B-A3B: YaRN factor 4 over its
    model card's native 32,768, as for `qwen3_30b`, and the reasons say so; a changed file cites the file."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN3_30B, "_name_or_path": "/home/me/Qwen3-30B-A3B", "torch_dtype": "float32"}))
    spec = get_model(str(path))
    assert spec.same_as == "qwen3_30b" and spec.published_id == "Qwen/Qwen3-30B-A3B"
    request = dict(seq_length=131072, hardware="h100", num_gpus=64)
    mine = resolve(TrainingRequest(model_config=str(path), **request)).plan
    catalogue = resolve(TrainingRequest(model="qwen3_30b", **request)).plan
    assert mine.positions == catalogue.positions
    assert (mine.positions.factor, mine.positions.original_max_position_embeddings) == (4.0, 32768)
    assert "your config.json has exactly the values of Qwen3-30B-A3B's published config.json" in mine.reasons["model"].why
    assert "Qwen3-30B-A3B model card" in mine.reasons["positions"].source
    edited = tmp_path / "edited" / "config.json"
    edited.parent.mkdir()
    edited.write_text(json.dumps({**QWEN3_30B, "max_position_embeddings": 65536}))
    other = resolve(TrainingRequest(model_config=str(edited), **request)).plan
    assert get_model(str(edited)).same_as is None
    assert (other.positions.factor, other.positions.original_max_position_embeddings) == (2.0, 65536)
    assert f"your config.json ({edited.resolve()}) max_position_embeddings" in other.reasons["positions"].source
    assert "model card" not in other.reasons["precision"].source and str(edited.resolve()) in other.reasons["precision"].source


@pytest.mark.slow
def test_launch_takes_model_config(tmp_path, monkeypatch, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_30B))
    monkeypatch.chdir(tmp_path)
    assert launch(["--model-config", str(path), "--seq", "32768", "--gpus", "16", "--hardware", "h100",
                   "--dry-run", "--output", "mine.yaml"]) == 0
    out = capsys.readouterr().out
    assert "valid for 16 x h100" in out and (tmp_path / "mine.yaml").is_file()
    assert "model: your config.json has exactly the values of Qwen3-30B-A3B's" in out


def test_negative_numbers_reach_the_request_check(capsys):
    """`--lr -1e-5` is the value of --lr (argparse alone says 'expected one argument'); the request names the fix."""
    args = launch_parser().parse_intermixed_args(["dsv3", "--seq", "131072", "--lr", "-1e-5"])
    assert args.lr == -1e-5
    assert plan_main(["dsv3", "--seq", "-4096", "--gpus", "256", "--hardware", "h100"]) == 2
    err = capsys.readouterr().err
    assert "seq_length -4096 must be greater than 0" in err and "fix: use e.g. 131072 (128K)" in err


# --- output a person reads -----------------------------------------------------------------------------------------

def test_citations_are_keys_listed_once():
    c = Citations()
    assert split_sources("a (x; y); b; a (x; y)") == ["a (x; y)", "b", "a (x; y)"]
    assert c.cite("a (x; y); b") == "[1, 2]" and c.cite("b; c") == "[2, 3]" and c.cite("a (x; y)") == "[1]"
    assert c.listing() == "sources:\n  [1] a (x; y)\n  [2] b\n  [3] c"


@pytest.mark.slow
def test_main_job_output_fits_one_screen_and_explain_keeps_every_reason(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert launch(["qwen3_235b", "--seq", "131072", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    # one screen: 45 lines, 3,300 characters (3,000 until the summary named the TE bug an assumed TE hides, one line)
    assert len(out) + len(err) <= 3300 and len(out.splitlines()) <= 45, (len(out) + len(err), len(out.splitlines()))
    assert "TP=4 PP=4 VPP=12 CP=8 EP=32 ETP=1 -> DP=1 EDP=1" in out and "why (the decisions that matter" in out
    sources = [line for line in out.splitlines() if re.match(r"  \[\d+\] ", line)]
    assert sources and len(sources) == len(set(s.split("] ", 1)[1] for s in sources))  # each source once
    assert launch(["qwen3_235b", "--seq", "131072", "--dry-run", "--explain"]) == 0
    full = capsys.readouterr().out
    plan = recipe_plan("qwen3_235b_128k_gb200")
    for knob, reason in plan.reasons.items():
        assert f"- {knob}: {reason.why}" in full, knob
    listed = [line.split("] ", 1)[1] for line in full.splitlines() if re.match(r"  \[\d+\] ", line)]
    assert len(listed) == len(set(listed))
    assert "DeepSeek-V3 technical report (arXiv 2412.19437) §4.3: 1,000 steps per phase at the final pre-training LR" \
        in listed


# --- one walk, one door ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_launch_request_visits_each_room_once(tmp_path, monkeypatch):
    """Qwen3-Next 8K -> 32K from a Hugging Face folder: every phase is resolved once, each named recipe looked up
    once, the weights' folder read once, and configuring the run never calls back into the resolver (it reads the
    Resolution)."""
    import lcmoe_recipes.checks.weights as weights
    import lcmoe_recipes.planner.resolve as resolver
    from lcmoe_recipes.jobs import prepare

    calls: list[tuple[str, bool]] = []
    inside = [False]

    def spy(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls.append((name, inside[0]))
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    real_resolve = resolver.resolve

    def resolve(request):
        inside[0] = True
        try:
            calls.append(("resolve", True))
            return real_resolve(request)
        finally:
            inside[0] = False

    monkeypatch.setattr(prepare, "resolve", resolve)
    for name in ("find_named_recipe", "weights_of", "read_source", "search", "named_options", "recipe_plan"):
        spy(resolver, name)
    monkeypatch.setattr(weights, "check_hf_folder", lambda folder, spec: calls.append(("check_hf_folder", inside[0])))
    hf = tmp_path / "Qwen3-Next-80B-A3B"
    hf.mkdir()
    request = TrainingRequest(model="qwen3_next", phases=(8192, 32768), from_hf=str(hf))
    configs = prepare.configure_phases(request)
    assert [c.plan.name for c in configs] == ["qwen3_next_8k_gb200-phase1", "qwen3_next_32k_gb200-phase2"]
    counts = {name: sum(1 for n, _ in calls if n == name) for name, _ in calls}
    # phase_requests finds the target (32K's recipe) and names it on that phase; phase 1 looks its recipe up once
    assert counts["find_named_recipe"] == 2 and counts["resolve"] == 2
    assert counts["weights_of"] == 2 and counts["check_hf_folder"] == 1  # phase 2 starts from phase 1's saves
    assert counts["recipe_plan"] == 2 and "read_source" not in counts and "search" not in counts
    after_phase_requests = calls[next(i for i, (n, _) in enumerate(calls) if n == "resolve"):]
    assert all(within for _, within in after_phase_requests), after_phase_requests  # nothing calls back
    # what configure needed came with the resolution
    assert configs[0].weights.entry == {"from_hf": str(hf)} and configs[0].meta["weights"] == {"from_hf": str(hf)}
    assert configs[1].meta["options"] == {"pretrained_checkpoint": configs[0].cfg.checkpoint.save}


def _profile(tmp_path):
    from lcmoe_recipes.calibration import calibrate, read_log, write_profile

    logs = Path(__file__).resolve().parent / "fixtures" / "logs"
    profile = calibrate([(recipe_plan("qwen3_235b_128k_gb200"), read_log(logs / "bridge_qwen3_235b_128k_gb200.log"),
                          "qwen3_235b_128k_gb200")])
    return profile, str(write_profile(profile, tmp_path / "gb200.yaml"))


def test_calibration_holds_through_the_comparison(tmp_path, capsys):
    """`plan --compare` reaches the search through the resolver's one door, so --calibration ranks and fits every
    column: the GB200 column's step is the profile's estimate; the H100 one is what the door gives with the profile
    (whose memory overhead holds for any GPU, its step constants for GB200 only)."""
    from lcmoe_recipes.cost import estimate_step
    from lcmoe_recipes.planner.resolve import search

    profile, path = _profile(tmp_path)
    argv = ["qwen3_235b", "--seq", "65536", "--gpus", "128", "--compare", "gb200,h100", "--json"]
    assert plan_main(argv) == 0
    published = {c["hardware"]: c for c in json.loads(capsys.readouterr().out)["targets"]}
    assert plan_main(argv + ["--calibration", path]) == 0
    calibrated = {c["hardware"]: c for c in json.loads(capsys.readouterr().out)["targets"]}
    assert calibrated["gb200"]["step_seconds"] != pytest.approx(published["gb200"]["step_seconds"], rel=1e-3)
    best = resolve(TrainingRequest(model="qwen3_235b", seq_length=65536, num_gpus=128, hardware="gb200",
                                   precision="bf16", calibration=path)).plan
    assert calibrated["gb200"]["step_seconds"] == pytest.approx(
        estimate_step(best, profile.step_table()).step_seconds)
    h100 = TrainingRequest(model="qwen3_235b", seq_length=65536, num_gpus=128, hardware="h100", precision="bf16")
    assert calibrated["h100"]["step_seconds"] == pytest.approx(
        search(h100.replace(calibration=path), top=1).best.step.step_seconds)
    assert published["h100"]["step_seconds"] == pytest.approx(search(h100, top=1).best.step.step_seconds)


@pytest.mark.slow
def test_calibration_holds_through_a_retargeting(tmp_path):
    """`launch --from CONFIG.yaml` reaches the search through the same door: with --calibration the retargeted
    plan's layout is ranked with the profile's constants (its reason states the profile's prediction)."""
    from lcmoe_recipes.cost import estimate_step

    profile, path = _profile(tmp_path)
    source = str(ROOT / "recipes" / "qwen3_235b_128k_gb200.yaml")
    published = resolve(TrainingRequest(from_config=source, seq_length=262144))
    calibrated = resolve(TrainingRequest(from_config=source, seq_length=262144, calibration=path))
    assert published.source.name == calibrated.source.name == source
    seconds = estimate_step(calibrated.plan, profile.step_table()).step_seconds
    assert f"predicted {seconds:.2f} s per step" in calibrated.plan.reasons["layout"].why
    assert calibrated.plan.reasons["layout"].why != published.plan.reasons["layout"].why


def test_overrides_after_a_model_config_are_overrides(tmp_path):
    """`launch --model-config PATH --seq N key=value`: argparse hands the first override to MODEL; it stays an
    override (it said "unknown model 'model.expert_model_parallel_size=16'")."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_30B))
    request = _request("--model-config", str(path), "--seq", "32768", "--gpus", "64", "--hardware", "h100",
                       "model.expert_model_parallel_size=16", "train.train_iters=20")
    assert request.overrides == ("model.expert_model_parallel_size=16", "train.train_iters=20")
    assert request.model == get_model(str(path)).key and request.recipe is None


def test_a_gpu_count_alone_takes_the_named_recipes_hardware():
    """`--gpus 96` without `--hardware`: the hardware of the model's named recipe at that length (the flag's default),
    planned for 96 GPUs; with no named recipe at that length the fix asks for the hardware, not for both."""
    planned = resolve(_request("qwen3_235b", "--seq", "131072", "--gpus", "96"))
    assert (planned.recipe, planned.plan.hardware, planned.plan.layout.world) == (None, "gb200", 96)
    with pytest.raises(LcmoeError) as err:
        resolve(_request("qwen3_235b", "--seq", "65536", "--gpus", "64"))
    assert err.value.message == "no named recipe for qwen3_235b at seq_length 65536 on 64"
    assert err.value.fix.endswith("or give `hardware` too to plan one")


def test_plan_names_the_named_recipe_launch_would_use(capsys):
    assert plan_main(["qwen3_235b", "--seq", "131072", "--gpus", "128", "--hardware", "gb200", "--top", "1"]) == 0
    assert ("note: the named recipe qwen3_235b_128k_gb200 covers this request, and launch uses it (TP4 CP8 EP32 ETP1 "
            "PP4 VPP12 -> DP1 EDP1 on 128 GPUs, predicted ") in (out := capsys.readouterr().out)
    # the wishes it names (the search winner's TP, PP, CP, EP and MBS, not a fixed "--tp 2") launch the winner
    wishes = out.split("give its layout as wishes (")[1].split(")")[0].split()
    searched = search(_request("qwen3_235b", "--seq", "131072", "--gpus", "128", "--hardware", "gb200")).best.plan
    assert wishes == ["--tp", str(searched.layout.tp), "--pp", str(searched.layout.pp), "--cp",
                      str(searched.layout.cp), "--ep", str(searched.layout.ep), "--mbs", "1"]
    launched = resolve(_request("qwen3_235b", "--seq", "131072", "--gpus", "128", "--hardware", "gb200", *wishes)).plan
    assert (launched.layout, launched.micro_batch_size) == (searched.layout, searched.micro_batch_size)
    # a named recipe the cost model predicts much slower than the winner is said to be (a fresh user found 4x unsaid)
    assert plan_main(["qwen3_next", "--seq", "65536", "--gpus", "32", "--hardware", "gb200", "--top", "1"]) == 0
    note = capsys.readouterr().out.split("note: the named recipe qwen3_next_64k_gb200 covers this request")[1]
    slower = float(note.split("the cost model predicts it ")[1].split("x slower per sequence")[0])
    assert slower >= 1.5 and "measure both before a long run" in note
    assert "x slower" not in out  # qwen3_235b's recipe is within 1.5x of its winner
    assert plan_main(["qwen3_235b", "--seq", "131072", "--gpus", "128", "--hardware", "gb200", "--top", "1",
                      "--tp", "2"]) in (0, 1)
    assert "note: the named recipe" not in capsys.readouterr().out  # a layout wish: launch searches too
    # at a precision the recipe does not pin, the note prices the recipe as launch runs it (BF16), not at its FP8
    from lcmoe_recipes.cost import estimate_step

    assert plan_main(["dsv3", "--seq", "131072", "--gpus", "256", "--hardware", "h100", "--precision", "bf16",
                      "--top", "1"]) == 0
    launched = resolve(_request("dsv3", "--seq", "131072", "--gpus", "256", "--hardware", "h100", "--precision",
                                "bf16")).plan
    assert launched.precision == "bf16" and launched.name == "dsv3_128k_h100"
    note = capsys.readouterr().out.split("note: the named recipe dsv3_128k_h100 covers this request")[1]
    assert f"predicted {estimate_step(launched).step_seconds:.2f} s per step against" in note


def test_a_launch_that_trains_refuses_mock_data_random_weights_and_missing_gpus(tmp_path, capsys):
    """Not a dry run, not a smoke check: the named recipe as it stands would train a random DeepSeek-V3 on synthetic
    tokens on a machine without GPUs; every blocker is listed at once with its flag, and nothing is written."""
    out = tmp_path / "d.yaml"
    assert launch(["dsv3", "--seq", "131072", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "error: this launch would not train as asked: (1) the config names no dataset" in err
    assert "(3) this machine has 0 GPU(s); the config needs 256" in err
    assert ("fix: (1) give --data-path PREFIX (Megatron .bin/.idx prefixes) with --tokenizer NAME, or set --mock-data "
            "to train on mock data on purpose; (2) give --from-hf DIR (a Hugging Face folder, converted) or "
            "--from-checkpoint DIR (a Megatron checkpoint), or set --from-scratch to start from random weights on "
            "purpose; (3) run it on the cluster (--executor slurm or --executor kubeflow), or check it here with "
            "--smoke") in err
    assert not out.exists()
    # opted in to both: only the GPUs remain, and the launch still stops before torchrun
    assert launch(["dsv3", "--seq", "131072", "--output", str(out), "--mock-data", "--from-scratch"]) == 2
    assert "error: this launch would not train as asked: (1) this machine has 0 GPU(s)" in capsys.readouterr().err
    # the dry run shows what the ranks would read
    assert launch(["qwen3_next", "--seq", "8192", "--dry-run", "--output", str(out)]) == 0
    assert "  data               mock (synthetic tokens; NullTokenizer)" in capsys.readouterr().out


def test_an_override_of_cp_derives_the_hierarchical_cp_sizes_again(tmp_path, capsys):
    """The recipe's a2a+p2p sizes [8, 4] no longer multiply to CP=16: chosen again for the new layout (said, and
    recorded as overrides so check rebuilds the same config), not refused by upstream validate()."""
    out = tmp_path / "d.yaml"
    assert launch(["dsv3", "--seq", "131072", "model.context_parallel_size=16", "model.tensor_model_parallel_size=2",
                   "model.sequence_parallel=true", "--dry-run", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert ("override/derived: model.hierarchical_context_parallel_sizes=[4,4]: derived again for CP=16, TP=2 (was "
            "cp_comm_type 'a2a+p2p' with hierarchical_context_parallel_sizes [8, 4]): hierarchical a2a+p2p, sizes 4 x "
            "4: predicted step") in text
    from lcmoe_recipes.emit import read_yaml

    cfg, meta = read_yaml(out)
    assert (cfg.model.cp_comm_type, cfg.model.hierarchical_context_parallel_sizes) == ("a2a+p2p", [4, 4])
    assert meta["overrides"][-1:] == ["model.hierarchical_context_parallel_sizes=[4,4]"]
    from lcmoe_recipes.cli.check import main as check_main

    assert check_main([str(out)]) == 0 and "edited-named-recipe" not in capsys.readouterr().out


def test_an_override_of_tp_derives_sequence_parallelism_again(tmp_path, capsys):
    """TP=1 -> TP=2 over qwen3_next_8k_gb200 (EP16, SP off): sequence parallelism on, said and recorded."""
    from lcmoe_recipes import TrainingRequest
    from lcmoe_recipes.jobs.prepare import configure

    one = configure(resolve(TrainingRequest(recipe="qwen3_next_8k_gb200")), ["model.tensor_model_parallel_size=2"])
    assert one.cfg.model.sequence_parallel is True and one.overrides[-1] == "model.sequence_parallel=true"
    (note,) = [w for w in one.warnings if w.rule == "override/derived"]
    assert note.message == ("model.sequence_parallel=true: derived again for TP=2: sequence parallelism on "
                            "(megatron-core warns that expert and tensor parallelism together need it)")


def test_a_relative_weights_folder_is_made_absolute(tmp_path, monkeypatch):
    """`--from-hf relm/q235` was written into the YAML as typed: the ranks, which start elsewhere (a Slurm job's in
    its code folder), would look for it there. The request makes it absolute where the command runs."""
    monkeypatch.chdir(tmp_path)
    request = TrainingRequest(model="qwen3_30b", seq_length=8192, from_hf="relm/q235", convert_to="~/mg/q235")
    assert request.from_hf == str(tmp_path / "relm" / "q235")
    assert request.convert_to == str(Path("~/mg/q235").expanduser())
    assert TrainingRequest(model="qwen3_30b", seq_length=8192, from_checkpoint="ck").from_checkpoint == str(
        tmp_path / "ck")


def test_a_job_smaller_than_a_node_runs_on_one_node_and_a_refused_one_writes_nothing(tmp_path, capsys):
    """qwen3_30b at 32K on 4 of a node's 8 H100: plan accepts it, so launch runs it on one node (torchrun with 4
    processes); a Slurm job of whole nodes refuses it by name, and writes no YAML (before, the YAML was written, then
    the command was refused with "use 8 or 8 GPUs")."""
    local = tmp_path / "q.yaml"
    assert launch(["qwen3_30b", "--seq", "32768", "--gpus", "4", "--hardware", "h100", "--dry-run",
                   "--output", str(local)]) == 0
    out = capsys.readouterr().out
    assert "cluster command (on one node, 4 GPUs):\n  torchrun --nnodes 1 --nproc-per-node 4 " in out
    assert local.is_file()
    slurm = tmp_path / "s.yaml"
    assert launch(["qwen3_30b", "--seq", "32768", "--gpus", "4", "--hardware", "h100", "--dry-run", "--executor",
                   "slurm", "--account", "a", "--partition", "p", "--output", str(slurm)]) == 2
    assert "error: 4 GPUs do not fill whole nodes of 8\n  fix: use 8 GPUs (one whole node)" in capsys.readouterr().err
    assert not slurm.exists()


@pytest.mark.slow
@pytest.mark.parametrize("source, gpus, hardware, kept", [
    ("deepseek_v3_pretrain_1024gpu_h100_fp8sc_config", 256, "h100", "grad_dtype"),  # the perf recipe's BF16 grads
    (str(ROOT / "recipes" / "dsv3_128k_h100.yaml"), 256, "gb200", "moment_dtype"),  # FP32 moments (its offload's)
])
def test_a_retargeted_configs_prediction_is_the_written_yamls(tmp_path, source, gpus, hardware, kept):
    """launch --from printed the memory of the searched plan (FP32 gradients, BF16 moments) while the YAML kept the
    config's own dtypes, so `check` on it read another peak (57.0 vs 64.8 GiB; 157.5 vs 147.6): the plan keeps them."""
    from lcmoe_recipes.cost import estimate_memory
    from lcmoe_recipes.emit import plan_from_config
    from lcmoe_recipes.jobs.prepare import prepare

    (one,) = prepare(TrainingRequest(from_config=source, seq_length=131072, num_gpus=gpus, hardware=hardware),
                     output=tmp_path / "r.yaml")
    back = plan_from_config(one.cfg, one.shown.hardware_spec, gpus, "back")
    assert estimate_memory(one.shown).hbm_total == estimate_memory(back).hbm_total
    assert getattr(one.shown, kept) == getattr(back, kept)
    assert "the config's own, kept; the layout was searched with" in one.shown.reasons[kept].why


@pytest.mark.slow
def test_a_retarget_to_blackwell_says_blockwise_fp8_and_writes_a_requested_precision(tmp_path):
    """An H100 FP8-blockwise config retargeted to GB200 kept blockwise without a word; with --precision mxfp8 the plan
    was MXFP8 but the YAML kept blockwise (and was refused for HBM): the precision is now written, and the kept
    blockwise is said (precision/blockwise-on-blackwell)."""
    from lcmoe_recipes.cost import estimate_memory
    from lcmoe_recipes.emit import plan_from_config
    from lcmoe_recipes.emit.fields import precision_of
    from lcmoe_recipes.jobs.prepare import prepare

    asked = dict(from_config=str(ROOT / "recipes" / "dsv3_128k_h100.yaml"), seq_length=131072, num_gpus=256,
                 hardware="gb200")
    (kept,) = prepare(TrainingRequest(**asked), output=tmp_path / "k.yaml")
    assert precision_of(kept.cfg.mixed_precision) == "fp8_blockwise"
    (said,) = [w for w in kept.warnings if w.rule == "precision/blockwise-on-blackwell"]
    assert said.fix.startswith("use mxfp8 (launch --precision mxfp8")
    (mx,) = prepare(TrainingRequest(**asked, precision="mxfp8"), output=tmp_path / "m.yaml")
    assert precision_of(mx.cfg.mixed_precision) == mx.shown.precision == "mxfp8"
    back = plan_from_config(mx.cfg, mx.shown.hardware_spec, 256, "back")
    assert estimate_memory(mx.shown).hbm_total == estimate_memory(back).hbm_total
    assert not [w for w in mx.warnings if w.rule == "precision/blockwise-on-blackwell"]
