"""The main job, `python -m lcmoe_recipes.launch`: end to end in a subprocess, and each bad input."""

import os
import sys

import pytest

from lcmoe_recipes.cli.launch import main
from lcmoe_recipes.errors import LcmoeError
from lcmoe_recipes.jobs.prepare import torchrun_command


def _run(zygote, *args, cwd):
    """`python -m lcmoe_recipes.launch ARGS` in its own process: forked from the session's server, which imported
    megatron-bridge once (tests/zygote.py); the command imports lcmoe_recipes itself, as a user's does."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return zygote.run([sys.executable, "-m", "lcmoe_recipes.launch", *args], capture_output=True, text=True,
                      cwd=cwd, env=env, timeout=900)


@pytest.mark.slow
def test_dry_run_end_to_end(tmp_path, zygote):
    # TP8 with the recipe's CP8 is 256 GPUs: CP4 keeps it on 128 (the README's example)
    out = _run(zygote, "qwen3_235b", "--seq", "131072", "model.tensor_model_parallel_size=8",
               "model.context_parallel_size=4", "--dry-run", "--output", "cfg.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Loading Megatron-Bridge" in out.stderr  # the user sees that work is in progress
    text = out.stdout
    assert "qwen3_235b_128k_gb200: valid for 128 x gb200" in text
    assert "TP=8 PP=4 VPP=12 CP=4 EP=32 ETP=1 -> DP=1 EDP=1" in text
    assert "model.tensor_model_parallel_size=8" in text
    assert ("torchrun --nnodes 32 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint "
            "\"$MASTER_ADDR:${MASTER_PORT:-29500}\" -m lcmoe_recipes.train --config cfg.yaml") in text
    yaml_text = (tmp_path / "cfg.yaml").read_text()
    assert yaml_text.startswith('# lcmoe_recipes: {"base_recipe": "megatron.bridge.perf_recipes.qwen.gb200.qwen3_moe:'
                                'qwen3_235b_a22b_pretrain_256gpu_gb200_bf16_config", "hardware": "gb200", '
                                '"megatron_bridge": "0.6.2", "megatron_core": "0.19.2", "model": "qwen3_235b", '
                                '"overrides": ["model.tensor_model_parallel_size=8", "model.context_parallel_size=4"], '
                                '"recipe": "qwen3_235b_128k_gb200", '
                                '"seq_length": 131072, "world_size": 128}\n')
    assert "tensor_model_parallel_size: 8" in yaml_text and "seq_length: 131072" in yaml_text


@pytest.mark.slow
def test_bad_override_subprocess_writes_nothing(tmp_path, zygote):
    out = _run(zygote, "qwen3_235b", "--seq", "131072", "model.context_parallel_size=48", "--dry-run", cwd=tmp_path)
    assert out.returncode == 2
    assert "error: qwen3_235b_128k_gb200: TP=4 · PP=4 · CP=48 = 768 does not divide the world size 128" in out.stderr
    assert "divisibility/seq-cp: CP=48 does not divide seq_length 131072 into 2·CP chunks" in out.stderr
    assert "use CP=8" in out.stderr
    assert list(tmp_path.iterdir()) == []


def _main(capsys, tmp_path, *args):
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code = main(list(args))
    finally:
        os.chdir(cwd)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("args,message,fix", [
    (("qwen3_253b", "--seq", "131072"), "error: unknown model 'qwen3_253b'", "did you mean 'qwen3_235b'?"),
    (("dsv3", "--seq", "100000"), "error: no named recipe for dsv3 at seq_length 100000",
     "--seq 131072 --gpus 256 --hardware h100"),
    (("dsv3", "--seq", "131072", "--hardware", "gb200"), "error: no named recipe for dsv3 at seq_length 131072 on gb200", ""),
    (("qwen3_next",), "error: --seq is required with model 'qwen3_next'", "e.g. --seq 131072"),
    (("dsv3", "--seq", "131072", "--precision", "mxfp8"), "MXFP8 needs Blackwell tensor cores", "use fp8_blockwise"),
])
def test_bad_request(capsys, tmp_path, args, message, fix):
    code, out, err = _main(capsys, tmp_path, *args, "--dry-run")
    assert code == 2 and out == ""
    assert message in err and fix in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("overrides,message,fix", [
    # the section left off: the field's section(s) named, the model's first
    (["tensor_model_parallel_size=8"], "'tensor_model_parallel_size' is not a section of megatron-bridge's "
     "ConfigContainer but a field of model and tokenizer", "fix: 'model.tensor_model_parallel_size=8' or "),
    (["seq_length=65536"], "but a field of model and dataset", "fix: 'model.seq_length=65536' or 'dataset.seq_length"),
    # key and value typed with a space: two arguments, the first sets nothing
    (["model.tensor_model_parallel_size", "8"], "override 'model.tensor_model_parallel_size' sets nothing",
     "fix: write 'model.tensor_model_parallel_size=8' as one argument"),
])
def test_override_typos_name_the_fix(capsys, tmp_path, overrides, message, fix):
    """Refused before megatron-bridge loads (core.request.TrainingRequest.parse), nothing written."""
    code, out, err = _main(capsys, tmp_path, "qwen3_235b", "--seq", "131072", *overrides, "--dry-run")
    assert code == 2 and out == "", err
    assert message in err and fix in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("override,message", [
    ("model.tensor_model_paralel_size=4", "fix: use 'model.tensor_model_parallel_size'"),  # refused before loading
    # dataset.seq_length follows the model's (derived again); 131,076 then splits into 2·CP chunks for no CP > 2
    ("model.seq_length=131076", "CP=8 does not divide seq_length 131076 into 2·CP chunks (load-balanced causal split)"),
    # the one error (seq-tp-sp no longer repeats it), and a fix re-checked with what it then needs
    ("model.seq_length=131076 dataset.seq_length=131076",
     "CP=8 does not divide seq_length 131076 into 2·CP chunks (load-balanced causal split)\n  fix: use CP=2, which "
     "then also needs: use a seq_length divisible by CP·TP = 8, or TP=2"),
    ("model.moe_flex_dispatcher_backend=deepep", "DeepEP does not run on GB200 NVL72"),
    # DP1 (CP8): 63 microbatches, not a multiple of PP for the interleaved schedule
    ("train.global_batch_size=63", "needs microbatches per step (GBS/(MBS·DP) = 63) to be a multiple of PP"),
    ("model.recompute_modules=[up_proj,norm]", "unknown recompute module(s) ['up_proj', 'norm']"),
    # a value of the wrong type, refused before anything is written: megatron-bridge's override flow keeps the
    # string as typed (a launch used to write it and say "valid", or fail in its own schedule report)
    ("optimizer.weight_decay=abc", "optimizer.weight_decay expects float, got 'abc'\n  fix: write a float value "
                                   "(e.g. optimizer.weight_decay=0.033)"),  # the recipe's value
    ("optimizer.lr=abc", "optimizer.lr expects float, got 'abc'"),
    ("train.train_iters=abc", "train.train_iters expects int, got 'abc'"),
    ("model.tensor_model_parallel_size=4.5", "model.tensor_model_parallel_size expects int, got 4.5\n  fix: write an "
                                             "int value (e.g. model.tensor_model_parallel_size=4)"),
    ("model.sequence_parallel=yes", "model.sequence_parallel expects bool, got 'yes'"),
    # the published CP4, which the recipe leaves for CP8 (planner/recipes.py QWEN3_235B_CP)
    # (TE userbuffers: tp_comm_overlap at TP4, 12 x 32,768 x 4,096 x 2 bytes = 3 GiB)
    ("model.context_parallel_size=4", "predicted HBM use 172.3 GiB on PP rank 3 (allocator peak 165.9 + 6.4 "
                                      "outside it: dispatcher, CUDA context, NCCL, TE userbuffers) exceeds 95% of "
                                      "GB200"),
])
def test_bad_override(capsys, tmp_path, override, message):
    code, out, err = _main(capsys, tmp_path, "qwen3_235b", "--seq", "131072", *override.split(), "--dry-run")
    assert code == 2, err
    assert message in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_override_of_a_requested_quantity_is_said(capsys, tmp_path):
    """--seq 131072 picks the 128K recipe; model.seq_length=65536 then runs it at 64K. Legal (the derived settings
    follow), but the name and layout were chosen for 128K: said, with how to have them chosen for 64K."""
    code, out, err = _main(capsys, tmp_path, "qwen3_235b", "--seq", "131072", "model.seq_length=65536", "--dry-run")
    assert code == 0, err
    assert ("override/replaces-request: model.seq_length=65536 replaces the request's seq_length 131072: the config "
            "runs seq_length 65536, but its name and layout were chosen for 131072; to have them chosen for 65536, "
            "ask for it in the request (seq_length 65536) and drop the override") in out + err


@pytest.mark.slow
def test_an_override_that_changes_nothing_is_said(capsys, tmp_path):
    """The 128K GB200 recipe runs TP4 already: model.tensor_model_parallel_size=4 changes nothing, and is said to;
    the override beside it that changes GBS is not."""
    code, out, err = _main(capsys, tmp_path, "qwen3_235b", "--seq", "131072", "model.tensor_model_parallel_size=4",
                           "train.global_batch_size=256", "train.global_batch_size=128", "--dry-run")
    assert code == 0, err
    assert ("override/no-op: model.tensor_model_parallel_size=4: the planned config has this value already; the "
            "override changes nothing; drop it, or give another value") in out + err
    assert "override/no-op: train.global_batch_size" not in out + err
    # a key given twice: the last one wins, and that is said (it was not)
    assert ("override/repeated: train.global_batch_size is given 2 times (train.global_batch_size=256, "
            "train.global_batch_size=128): the last one, train.global_batch_size=128, is what runs; give it once"
            ) in out + err


@pytest.mark.slow
def test_without_dry_run_on_a_cpu_machine(capsys, tmp_path):
    """A launch that trains, here: refused before anything is written, the GPU count among its blockers."""
    code, out, err = _main(capsys, tmp_path, "dsv3_256k_h100", "--mock-data", "--from-scratch")
    assert code == 2
    assert ("error: this launch would not train as asked: (1) this machine has 0 GPU(s); the config needs 512\n"
            "  fix: (1) run it on the cluster (--executor slurm or --executor kubeflow), or check it here with --smoke") in err
    assert "torchrun" not in out and not (tmp_path / "out").exists()


def test_list_and_help(capsys):
    assert main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert "qwen3_next_64k_gb200" in listing and "65536" in listing
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "Hydra syntax" in capsys.readouterr().out


def test_torchrun_command_needs_whole_nodes():
    with pytest.raises(LcmoeError, match="6 GPUs do not fill whole nodes of 4; use 4 or 8 GPUs"):
        torchrun_command("x.yaml", 6, 4)


@pytest.mark.slow
def test_reasons_follow_overrides(capsys, tmp_path):
    code, out, err = _main(capsys, tmp_path, "qwen3_235b", "--seq", "131072", "model.tensor_model_parallel_size=8",
                           "model.context_parallel_size=4", "--precision", "mxfp8", "--dry-run",
                           "--explain")  # --explain: every reason in full; TP8 CP4 PP4 = 128 GPUs
    assert code == 0, err
    kept = "(worked out for the recipe's layout, which your overrides changed; the value itself is the recipe's)"
    assert "layout: changed from the recipe by your overrides" in out
    assert "global_batch_size: GBS 64 x 131,072 tokens" in out and "sequence_parallel: TP=4 with EP>1" in out
    assert out.count(kept) >= 2  # values the overrides left alone keep their reason, marked as the recipe's
    assert "precision: mxfp8 (BF16 published; MXFP8 selectable with precision='mxfp8')" in out
    assert "recompute: selective moe_act: the published set is moe_act + norm" in out  # untouched knobs keep theirs
    written = list((tmp_path / "out").iterdir())
    assert len(written) == 1 and written[0].name.startswith("qwen3_235b_128k_gb200+")  # not the plain recipe's file


def test_recipe_option_typo(capsys, tmp_path):
    from lcmoe_recipes import recipe_plan
    from lcmoe_recipes.errors import UnknownName

    with pytest.raises(UnknownName, match="recipe qwen3_235b_128k_gb200 has no option 'precison'; its options: precision"):
        recipe_plan("qwen3_235b_128k_gb200", precison="mxfp8")
