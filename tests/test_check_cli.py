"""`python -m lcmoe_recipes.check`: findings on a named plan, on our YAML, and on a YAML without our header."""

import subprocess
import sys

import pytest

from lcmoe_recipes.cli.check import main

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_named_recipe_is_clean(capsys):
    assert main(["qwen3_235b_128k_gb200"]) == 0
    out = capsys.readouterr().out
    assert "  EP       32              8                      1" in out  # 8 trays, one 64-GPU NVLink block
    # at CP8 (planner/recipes.py QWEN3_235B_CP) it leaves more than the memory model's worst error free: no warning
    # the one warning where TE is not installed: every NeMo image's TE fused cross-entropy bug, which the assumed TE
    # 2.20.2 does not have (known-issue/assumed-version)
    from lcmoe_recipes.emit.stack import te_installed

    expected = 0 if te_installed() else 1
    assert "memory/thin-headroom" not in out and out.rstrip().endswith(f"0 error(s), {expected} warning(s)")
    assert ("warning known-issue/assumed-version: te-fused-cross-entropy-bf16-grad affects every listed NeMo image "
            "(25.09 to 26.08) [not judged here: transformer-engine 2.20.2 assumed" in out) == (expected == 1)
    assert "\ndata: mock (synthetic tokens; NullTokenizer): --data-path PREFIX --tokenizer NAME" in out


@pytest.mark.slow
def test_failing_yaml_exits_1_with_findings(configs, tmp_path, capsys):
    import copy

    from lcmoe_recipes.emit import apply_overrides, write_yaml

    plan, cfg = configs["qwen3_235b_128k_gb200"]
    bad = copy.deepcopy(cfg)
    apply_overrides(bad, ["model.context_parallel_size=48", "~model.expert_tensor_parallel_size"])
    path = write_yaml(bad, tmp_path / "bad.yaml", {"recipe": "bad", "world_size": 128, "hardware": "gb200"})
    assert main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "error   rank-folding/dense: TP=4 · PP=4 · CP=48 = 768 does not divide the world size 128" in out
    assert "error   divisibility/seq-cp: CP=48 does not divide seq_length 131072 into 2·CP chunks" in out
    assert "warning parallel/etp-unset" in out
    assert "        fix: use CP=8" in out


@pytest.mark.slow
def test_a_yaml_value_of_the_wrong_type_is_refused(configs, tmp_path, capsys):
    """A number field holding text (a typo in a hand-edited YAML) is refused by name: omegaconf keeps it as written
    and megatron would fail on it only once the job runs. The same values given as overrides are refused as well
    (emit.overrides, tests/test_cli.py test_bad_override)."""
    from lcmoe_recipes.emit import write_yaml

    _, cfg = configs["qwen3_235b_128k_gb200"]
    path = write_yaml(cfg, tmp_path / "typo.yaml", {"recipe": "typo", "world_size": 128, "hardware": "gb200"})
    text = path.read_text()
    assert "  weight_decay: 0.033\n" in text and "  train_iters: " in text
    path.write_text(text.replace("  weight_decay: 0.033\n", "  weight_decay: abc\n"))
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "has 1 value(s) of the wrong type: optimizer.weight_decay: expects float, got 'abc'" in err


@pytest.mark.slow
def test_a_yaml_without_a_required_section_names_it(configs, tmp_path, capsys):
    """A YAML with its optimizer section deleted: the message used to stop at hydra's first line ("Error in call to
    target '...ConfigContainer':"), the cause cut off."""
    import yaml

    from lcmoe_recipes.emit import write_yaml

    _, cfg = configs["qwen3_235b_128k_gb200"]
    path = write_yaml(cfg, tmp_path / "cut.yaml", {"recipe": "cut", "world_size": 128, "hardware": "gb200"})
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    tree = yaml.safe_load(path.read_text())
    del tree["optimizer"]
    path.write_text(header + yaml.safe_dump(tree, sort_keys=False))
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert f"error: '{path}' has no 'optimizer' section: megatron-bridge's ConfigContainer requires it" in err
    assert "fix: restore it from the YAML `launch --dry-run --output` writes" in err


@pytest.mark.slow
def test_json_of_a_layout_that_does_not_fold_is_json(configs, tmp_path, capsys):
    """check --json on a YAML whose layout does not fold (CP=48 on 128 GPUs) used to crash pricing its memory (DP
    does not exist): a CI step calling it failed on exactly the configs it is there to catch."""
    import copy
    import json

    from lcmoe_recipes.emit import apply_overrides, write_yaml

    _, cfg = configs["qwen3_235b_128k_gb200"]
    bad = copy.deepcopy(cfg)
    apply_overrides(bad, ["model.context_parallel_size=48"])
    path = write_yaml(bad, tmp_path / "bad.yaml", {"recipe": "bad", "world_size": 128, "hardware": "gb200"})
    assert main([str(path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["valid"], doc["priced"], doc["layout"]["cp"], doc["layout"]["dp"]) == (False, False, 48, None)
    assert doc["findings"][0]["rule"] == "rank-folding/dense" and doc["findings"][0]["fix"] == "use CP=8"
    assert "memory_gib" not in doc and doc["not_priced"].startswith("the layout does not fold into the GPUs")


@pytest.mark.slow
def test_headerless_yaml_needs_a_target(configs, tmp_path, capsys):
    _, cfg = configs["dsv3_128k_h100"]
    path = tmp_path / "user.yaml"
    cfg.to_yaml(str(path))  # plain megatron-bridge YAML, as a user or upstream writes it
    assert main([str(path)]) == 2
    assert "does not record its target" in capsys.readouterr().err
    assert main([str(path), "--gpus", "256", "--hardware", "h100"]) == 0
    assert main([str(path), "--gpus", "256", "--hardware", "gb200"]) == 1  # DeepEP on GB200
    assert "dispatcher/deepep-hardware" in capsys.readouterr().out


def test_bad_input_fails_fast(capsys, tmp_path):
    assert main([str(tmp_path / "nope.yaml"), "--gpus", "8", "--hardware", "h100"]) == 2
    assert f"config file '{tmp_path / 'nope.yaml'}' does not exist" in capsys.readouterr().err
    assert main(["dsv3_128k_h10", "--gpus", "8", "--hardware", "h100"]) == 2
    err = capsys.readouterr().err
    assert "'dsv3_128k_h10' is neither a file nor a named recipe" in err and "did you mean 'dsv3_128k_h100'?" in err
    assert main(["dsv3_128k_h100", "--gpus", "0"]) == 2
    assert "--gpus 0 is not a positive GPU count" in capsys.readouterr().err
    assert main(["dsv3_128k_h100", "--hardware", "a100"]) == 2
    assert "unknown hardware 'a100'" in capsys.readouterr().err


def test_named_recipe_on_another_target(capsys):
    assert main(["qwen3_235b_128k_gb200", "--hardware", "h100"]) == 1
    out = capsys.readouterr().out
    assert "error   memory/exceeds-hbm: predicted HBM use" in out  # 128 x 80 GB is too small for this layout
    assert main(["dsv3_128k_h100", "--gpus", "512"]) == 0
    assert "-> DP2 EDP2 on 512 GPUs" in capsys.readouterr().out


@pytest.mark.slow
def test_broken_yaml_says_so_before_asking_for_a_target(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("model:\n  tensor_model_parallel_size: [1\n  bad: : :\n")
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "is not valid YAML at line 3, column 6: expected ',' or ']', but got ':'" in err
    assert "does not record its target" not in err


def test_yaml_checked_for_another_target_warns(configs, tmp_path, capsys):
    from lcmoe_recipes.emit import write_yaml

    plan, cfg = configs["dsv3_128k_h100"]
    path = write_yaml(cfg, tmp_path / "d.yaml", {"recipe": "dsv3_128k_h100", "world_size": 256, "hardware": "h100"})
    assert main([str(path), "--gpus", "512"]) == 0
    out = capsys.readouterr().out
    assert "warning target/differs-from-header: checking for 512 x h100, but the YAML was written for 256 x h100" in out
    # a command to run, not one with '...' in it
    assert (f"fix: re-plan it for this target: python -m lcmoe_recipes.launch --from {path} --seq 131072 --gpus 512 "
            "--hardware h100 --dry-run") in out
    # a count the planner refuses gets a whole-node count in the command, not one that launch refuses in turn
    main([str(path), "--gpus", "100"])
    assert (f"fix: re-plan it for this target: python -m lcmoe_recipes.launch --from {path} --seq 131072 --gpus 104 "
            "--hardware h100 --dry-run (100 does not fill whole nodes of 8; or --gpus 96)") in capsys.readouterr().out
    path.write_text(path.read_text().split("\n", 1)[1])  # drop the header
    assert main([str(path), "--gpus", "256"]) == 2
    assert "fix: give --hardware NAME" in capsys.readouterr().err
    # a GB200 YAML checked for H100 keeps HybridEP's NVL72 variables: said, with the values launch writes there
    _, q = configs["qwen3_235b_128k_gb200"]
    path = write_yaml(q, tmp_path / "q.yaml", {"recipe": "qwen3_235b_128k_gb200", "world_size": 128, "hardware": "gb200"})
    main([str(path), "--gpus", "128", "--hardware", "h100"])
    out = capsys.readouterr().out
    assert ("warning env/nvlink-domain: env_vars NVLINK_DOMAIN_SIZE=72, USE_MNNVL=1 describe another system than H100 "
            "SXM5 80GB (HGX) (NVLink domain of 8 GPUs), and HybridEP reads them\n        fix: set "
            "env_vars.NVLINK_DOMAIN_SIZE=8 env_vars.USE_MNNVL=0 (what launch writes for this GPU)") in out
    main([str(path)])
    assert "env/nvlink-domain" not in capsys.readouterr().out  # on its own target: nothing to say
    # a fresh user's hand edit of EP (32 -> 16, the fix check had named) left HybridEP's ranks at 32, unsaid
    edited = tmp_path / "q16.yaml"
    edited.write_text(path.read_text().replace("expert_model_parallel_size: 32", "expert_model_parallel_size: 16"))
    main([str(edited)])
    assert ("warning env/hybridep-ranks: env_vars.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=32, but EP x ETP = 16 x 1 = "
            "16: HybridEP sizes its groups from it\n        fix: set env_vars.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=16 "
            "(what launch derives for EP=16, ETP=1)") in capsys.readouterr().out


def test_check_of_a_plan_is_fast_and_light():
    code = ("import time, sys\nfrom lcmoe_recipes import recipe_plan, check_plan\n"
            "p = recipe_plan('qwen3_235b_128k_gb200')\nt = time.perf_counter()\n"
            "for _ in range(200): check_plan(p)\n"
            "print((time.perf_counter() - t) / 200 * 1e3, any(m.startswith(('torch', 'megatron')) for m in sys.modules))")
    ms, heavy = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert heavy == "False"
    print(f"check_plan: {float(ms):.3f} ms per layout")  # reported, not asserted (timing varies with load)


def test_memory_that_does_not_fit_is_an_error(capsys):
    from lcmoe_recipes import recipe_plan
    from lcmoe_recipes.checks.memory import memory_findings

    # DeepSeek-V3 128K with the even pipeline split (the recipe moves a layer off PP rank 7 for this): 65.5 GiB of the
    # 70.8 GiB limit, it fits, with less free than the memory model's worst error (8% = 5.7 GiB)
    even = recipe_plan("dsv3_128k_h100").with_changes(pipeline_model_parallel_layout="Et|(tt|)*30mL")
    (thin,) = memory_findings(even)
    assert (thin.severity, thin.rule) == ("warning", "memory/thin-headroom")
    assert thin.message.startswith("5.3 GiB of the 70.8 GiB limit left free") and "(8%, 5.7 GiB)" in thin.message
    on_h100 = recipe_plan("qwen3_235b_128k_gb200").with_changes(hardware="h100", moe_flex_dispatcher_backend="deepep",
                                                                 cuda_graph_impl="none", cuda_graph_modules=())
    (finding,) = memory_findings(on_h100)
    assert finding.rule == "memory/exceeds-hbm" and "exceeds 95% of H100 SXM5 80GB (HGX)'s 75 GiB" in finding.message


def test_named_recipe_costs_are_printed(capsys):
    assert main(["dsv3_128k_h100"]) == 0
    out = capsys.readouterr().out
    # FP32 gradients (twice the bf16 parameters); FP8 blockwise keeps an FP8 copy of the bf16 weights (weight_cache);
    # the optimizer state is wholly offloaded. PP rank 0 (8 decoder layers + the embedding, the most microbatches in
    # flight) is the most loaded since the recipe's split moves a layer off PP rank 7 (MTP layer + its embedding)
    assert ("memory per GPU (PP rank 0, the most loaded), GiB: parameters 10.4, weight_cache 8.7, gradients 20.9, "
            "optimizer 0.0") in out
    assert "TFLOP/s/GPU, MFU" in out


def test_edited_named_recipe_says_so(tmp_path, capsys):
    """A copy of a named recipe's YAML checks clean as that recipe; an edited copy is labelled edited, with the diff."""
    from pathlib import Path

    source = Path(__file__).resolve().parent.parent / "recipes" / "qwen3_next_8k_gb200.yaml"
    copy = tmp_path / "mine.yaml"
    copy.write_text(source.read_text())
    assert main([str(copy)]) == 0
    assert "edited" not in capsys.readouterr().out
    copy.write_text(source.read_text().replace("train_iters: 1000", "train_iters: 400"))
    assert main([str(copy)]) == 0
    out = capsys.readouterr().out
    assert "qwen3_next_8k_gb200 (edited)" in out
    assert ("config/edited-named-recipe: 'mine.yaml' is labelled qwen3_next_8k_gb200 but differs from that recipe "
            "(with the overrides its header lists) in 1 field(s): train.train_iters: 1000 -> 400") in out.replace(
                str(tmp_path) + "/", "")


def test_the_based_on_line_names_the_same_base_for_one_config(tmp_path):
    """A named recipe, the YAML launch wrote for it (its header records the base), and that YAML without the header
    (the base is unknown, not upstream's template)."""
    from lcmoe_recipes import examine as check, recipe_plan
    from lcmoe_recipes.report.text import base_recipe_text, plan_rows

    recipe = ROOT / "recipes" / "qwen3_next_8k_gb200.yaml"
    named = base_recipe_text(recipe_plan("qwen3_next_8k_gb200"))
    assert named == "megatron-bridge qwen3_next_80b_a3b_pretrain_64gpu_gb200_bf16_config"
    assert dict(plan_rows(check(str(recipe)).plan))["based on"] == named
    bare = tmp_path / "bare.yaml"
    bare.write_text(recipe.read_text().split("\n", 1)[1])
    found = check(str(bare), gpus=32, hardware="gb200").plan
    assert dict(plan_rows(found))["based on"] == "not recorded (a YAML without an lcmoe_recipes header)"


def test_check_refuses_an_image_that_cannot_take_the_overlay(capsys):
    """As launch does: exit 2 with the reason and the nearest image that can, before 'checked with ... overlay'."""
    code = main([str(ROOT / "recipes" / "qwen3_next_8k_gb200.yaml"), "--container-image", "nvcr.io/nvidia/nemo:25.11"])
    captured = capsys.readouterr()
    assert code == 2
    assert "error: megatron-bridge 0.2.0 is not on the package registry" in captured.err
    assert "fix: use nvcr.io/nvidia/nemo:26.04" in captured.err and "checked with" not in captured.out
    # the image's own megatron judged instead: no overlay needed, so no refusal
    assert main([str(ROOT / "recipes" / "qwen3_next_8k_gb200.yaml"), "--container-image", "nvcr.io/nvidia/nemo:25.11",
                 "--no-overlay"]) in (0, 1)
    assert "checked with" in capsys.readouterr().out


def test_a_partial_node_is_an_error_of_the_config_too():
    """A YAML checked for 100 H100 (12.5 nodes of 8) is refused as the request would be, with the counts that fit."""
    from lcmoe_recipes.checks import check_plan
    from lcmoe_recipes.planner.recipes import recipe_plan

    plan = recipe_plan("dsv3_128k_h100")
    partial = plan.with_changes(layout=__import__("dataclasses").replace(plan.layout, world=100))
    (finding,) = [f for f in check_plan(partial) if f.rule == "placement/partial-node"]
    assert (finding.severity, finding.fix) == ("error", "use 96 or 104 GPUs")
    assert not [f for f in check_plan(plan) if f.rule == "placement/partial-node"]


@pytest.mark.slow
def test_the_data_line_names_what_the_yaml_trains_on(configs, tmp_path, capsys):
    import copy

    from lcmoe_recipes.emit import apply_overrides, data_overrides, write_yaml

    _, cfg = configs["qwen3_next_8k_gb200"]
    real = apply_overrides(copy.deepcopy(cfg), data_overrides(["0.7", "/data/web_text_document", "0.3",
                                                               "/data/code_text_document"], "/models/qwen3-tokenizer"))
    path = write_yaml(real, tmp_path / "real.yaml", {"recipe": "qwen3_next_8k_gb200", "world_size": 32,
                                                     "hardware": "gb200"})
    main([str(path)])
    assert ("\ndata: 2 prefix(es): /data/web_text_document, /data/code_text_document; tokenizer HuggingFaceTokenizer "
            "/models/qwen3-tokenizer\n") in capsys.readouterr().out


def test_the_hbm_fix_offers_only_what_the_plan_has_not_done():
    """DeepSeek-V3 128K squeezed onto 64 H100 (CP8, EP8, PP8: DP=1) overflows HBM with its optimizer fully offloaded
    already: the fix does not offer the offload again, every fix it offers is re-checked (priced by the memory model at
    the same GPU count), and since none fits it says so; without offload and recompute it offers and prices both."""
    from lcmoe_recipes.checks.memory import memory_findings
    from lcmoe_recipes.planner.recipes import recipe_plan

    plan = recipe_plan("dsv3_128k_h100")
    small = plan.with_changes(layout=__import__("dataclasses").replace(plan.layout, world=64, cp=8, ep=8))
    (over,) = [f for f in memory_findings(small) if f.rule == "memory/exceeds-hbm"]
    assert small.optimizer_offload_fraction == 1 and "offload" not in over.fix
    # no larger CP or PP folds into 64 GPUs at DP=1, so neither is offered; full recompute is, with its price
    assert over.fix.startswith("re-checked at the same GPU count: full recompute (model.recompute_granularity=full "
                               "model.recompute_method=uniform model.recompute_num_layers=1): ")
    assert "still over the 70.8 GiB limit; nothing fits on 64 GPUs: use more GPUs" in over.fix
    bare = small.with_changes(optimizer_cpu_offload=False, optimizer_offload_fraction=0.0, recompute_granularity=None,
                              recompute_modules=())
    (over,) = [f for f in memory_findings(bare) if f.rule == "memory/exceeds-hbm"]
    assert "selective recompute of layernorm, moe_act (model.recompute_granularity=selective " in over.fix
    assert ("offload the whole optimizer state (optimizer.optimizer_cpu_offload=true "
            "optimizer.optimizer_offload_fraction=1.0 optimizer.use_precision_aware_optimizer=true)") in over.fix
    assert "; all of them together: " in over.fix and "nothing fits on 64 GPUs" in over.fix
    # already selective (moe_act): the next rung names only the modules; granularity=selective would be a no-op
    moe_act = bare.with_changes(recompute_granularity="selective", recompute_modules=("moe_act",))
    (over,) = [f for f in memory_findings(moe_act) if f.rule == "memory/exceeds-hbm"]
    assert "selective recompute of layernorm, moe_act (model.recompute_modules=[layernorm,moe_act])" in over.fix


def test_an_hbm_fix_is_not_blamed_for_the_plans_own_errors():
    """A fresh user's 256K edit of qwen3_235b_128k_gb200 breaks the positions (YaRN 4 covers 131,072) and overflows
    HBM: the offload fix fits, and the positions error is its own finding -- the fix said 'fits, but then seq_length
    exceeds the positions ...; nothing fits on 128 GPUs: use more GPUs', which more GPUs would not mend."""
    from lcmoe_recipes.checks.memory import memory_findings
    from lcmoe_recipes.planner.recipes import recipe_plan

    plan = recipe_plan("qwen3_235b_128k_gb200").with_changes(seq_length=262144)
    (over,) = [f for f in memory_findings(plan) if f.rule == "memory/exceeds-hbm"]
    assert over.fix.endswith("optimizer.use_precision_aware_optimizer=true): 152.1 GiB, fits")
    assert "positions" not in over.fix and "nothing fits" not in over.fix


def test_an_hbm_fix_is_priced_before_it_is_offered():
    """DeepSeek-V3 128K on its 256 H100 with PP lowered to 4 (VPP 8) overflows; the fix prices going back to PP=8 x
    VPP=4 (the named recipe's layout, which fits) and says that CP=64 alone and full recompute alone do not fit."""
    from lcmoe_recipes.checks.memory import memory_findings
    from lcmoe_recipes.core.pipeline import build_pipeline_layout
    from lcmoe_recipes.planner.recipes import recipe_plan

    plan = recipe_plan("dsv3_128k_h100")
    four = plan.with_changes(layout=__import__("dataclasses").replace(plan.layout, pp=4, vpp=8),
                             pipeline_model_parallel_layout=build_pipeline_layout(61, 32, 1))
    (over,) = [f for f in memory_findings(four) if f.rule == "memory/exceeds-hbm"]
    parts = dict(part.split(": ", 1) for part in over.fix.removeprefix("re-checked at the same GPU count: ").split("; "))
    fitting = {k for k, v in parts.items() if v.endswith(", fits")}
    assert fitting == {"PP=8 x VPP=4 (model.pipeline_model_parallel_size=8 model.virtual_pipeline_model_parallel_size=4)"}
    assert parts["CP=64 (model.context_parallel_size=64)"].endswith("still over the 70.8 GiB limit")


@pytest.mark.slow
def test_check_says_it_is_loading_megatron_bridge():
    """A fresh user's `check` sat silent for 20 s while megatron-bridge loaded (launch said so; check, launch --from
    and Slurm dry runs did not): the commands announce the load on stderr."""
    done = subprocess.run([sys.executable, "-m", "lcmoe_recipes.check", "dsv3_128k_h100"], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr
    assert "Loading Megatron-Bridge (" in done.stderr and "done in " in done.stderr
