"""Checkpoint folders against the planned model: Hugging Face folders (--from-hf), Megatron checkpoints
(--from-checkpoint and reuse of a conversion), and the convert command's refusals. No torch, no megatron."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lcmoe_recipes.catalog import get_model
from lcmoe_recipes.checks.weights import (CheckpointError, check_hf_folder, check_megatron_checkpoint, matching_models,
                                          megatron_architecture, read_megatron_checkpoint)
from lcmoe_recipes.cli.convert import main as convert_main


def hf_folder(path: Path, config: dict, weights: bool = True) -> Path:
    """A Hugging Face folder: config.json and (the file names of) its weights."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if weights:
        (path / "model.safetensors").write_bytes(b"")
    return path


def test_a_folder_of_the_planned_model_passes(tmp_path):
    spec = get_model("qwen3_30b")
    assert check_hf_folder(hf_folder(tmp_path / "q", spec.config), spec)["num_experts"] == 128
    assert matching_models(spec.config) == ["qwen3_30b"]


def test_a_folder_without_tokenizer_files_warns_when_the_run_takes_its_tokenizer_from_it(tmp_path):
    from lcmoe_recipes import TrainingRequest
    from lcmoe_recipes.checks.weights import weights_of

    folder = hf_folder(tmp_path / "q", get_model("qwen3_30b").config)
    data = ["/lustre/data/web_text_document"]
    (note,) = weights_of(TrainingRequest(model="qwen3_30b", seq_length=8192, from_hf=str(folder), data_path=data),
                         "qwen3_30b").notes
    assert (note.severity, note.rule) == ("warning", "weights/no-tokenizer")
    assert note.fix == "copy the checkpoint's tokenizer files into the folder, or name one with --tokenizer"
    named = TrainingRequest(model="qwen3_30b", seq_length=8192, from_hf=str(folder), data_path=data,
                            tokenizer="Qwen/Qwen3-30B-A3B")
    assert weights_of(named, "qwen3_30b").notes == ()
    (folder / "tokenizer.json").write_text("{}")
    assert weights_of(TrainingRequest(model="qwen3_30b", seq_length=8192, from_hf=str(folder), data_path=data),
                      "qwen3_30b").notes == ()


def test_each_mismatching_number_is_named_with_both_values_and_the_matching_model(tmp_path):
    folder = hf_folder(tmp_path / "q235", get_model("qwen3_235b").config)
    with pytest.raises(CheckpointError) as err:
        check_hf_folder(folder, get_model("qwen3_30b"))
    message = err.value.message
    for text in ("num_hidden_layers is 94 there but 48 for qwen3_30b", "hidden_size is 4096 there but 2048",
                 "num_attention_heads is 64 there but 32"):
        assert text in message
    assert "num_key_value_heads" not in message  # 4 in both: equal numbers are not listed
    assert "It matches catalogue model 'qwen3_235b': plan that model instead" in err.value.fix
    assert "point --from-hf at a Qwen3-30B-A3B checkpoint" in err.value.fix


def test_positions_are_not_architecture(tmp_path):
    """An extended checkpoint (other rope_scaling / max_position_embeddings) is still the same model."""
    spec = get_model("qwen3_30b")
    config = {**spec.config, "max_position_embeddings": 131072,
              "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    check_hf_folder(hf_folder(tmp_path / "q", config), spec)


def test_folder_refusals(tmp_path):
    spec = get_model("dsv3")
    with pytest.raises(CheckpointError, match="does not exist"):
        check_hf_folder(tmp_path / "nowhere", spec)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="has no config.json, so it is not a Hugging Face model folder"):
        check_hf_folder(tmp_path / "empty", spec)
    with pytest.raises(CheckpointError, match=r"has a config.json but no weights \(\*.safetensors or pytorch_model\*"):
        check_hf_folder(hf_folder(tmp_path / "cfg_only", spec.config, weights=False), spec)
    partial = hf_folder(tmp_path / "partial", spec.config, weights=False)
    shards = [f"model-{i:05d}-of-00005.safetensors" for i in range(1, 6)]
    (partial / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {f"w{i}": s for i, s in enumerate(shards)}}))
    (partial / shards[0]).write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"incomplete: model.safetensors.index.json names 5 weight files but 4 "
                                              r"are missing: model-00002-of-00005.safetensors, .*\(and 1 more\)"):
        check_hf_folder(partial, spec)


def megatron_folder(path: Path, model: dict, tracker: bool = True, metadata: bool = True) -> Path:
    """The files megatron-bridge 0.6.2's save_megatron_model writes for a converted checkpoint (iteration 0):
    the tracker, iter_0000000/.metadata (torch_dist) and iter_0000000/run_config.yaml."""
    it = path / "iter_0000000"
    it.mkdir(parents=True)
    (it / "run_config.yaml").write_text(yaml.safe_dump({"model": model, "checkpoint": {"ckpt_format": "torch_dist"}}))
    if metadata:
        (it / ".metadata").write_bytes(b"")
    if tracker:
        (path / "latest_checkpointed_iteration.txt").write_text("0")
    return path


def test_megatron_checkpoint_of_the_planned_model(tmp_path):
    spec = get_model("dsv3")
    numbers = megatron_architecture(spec)
    assert numbers == {"num_layers": 61, "hidden_size": 7168, "num_attention_heads": 128, "num_moe_experts": 256,
                       "moe_router_topk": 8, "vocab_size": 129280, "moe_ffn_hidden_size": 2048, "kv_lora_rank": 512,
                       "q_lora_rank": 1536}
    folder = megatron_folder(tmp_path / "ck", {**numbers, "hf_model_id": "/models/DeepSeek-V3"})
    ckpt = check_megatron_checkpoint(folder, spec)
    assert (ckpt.iteration, ckpt.hf_source) == (0, "/models/DeepSeek-V3")
    assert read_megatron_checkpoint(folder / "iter_0000000").root == folder  # an iteration folder finds its root


def test_megatron_checkpoint_refusals(tmp_path):
    spec = get_model("qwen3_next")
    numbers = megatron_architecture(spec)
    with pytest.raises(CheckpointError, match="no latest_train_state.pt or latest_checkpointed_iteration.txt"):
        check_megatron_checkpoint(megatron_folder(tmp_path / "unfinished", numbers, tracker=False), spec)
    with pytest.raises(CheckpointError, match=r"no complete iteration folder \(iter_NNNNNNN with run_config.yaml and "
                                              r"\.metadata\)"):
        check_megatron_checkpoint(megatron_folder(tmp_path / "nometa", numbers, metadata=False), spec)
    hf = hf_folder(tmp_path / "hf", spec.config)
    with pytest.raises(CheckpointError, match=r"looks like a Hugging Face folder: use --from-hf"):
        check_megatron_checkpoint(hf, spec)
    other = megatron_folder(tmp_path / "other", {**numbers, "num_layers": 24, "linear_num_value_heads": 16})
    with pytest.raises(CheckpointError) as err:
        check_megatron_checkpoint(other, spec)
    assert "num_layers is 24 there but 48 for qwen3_next; linear_num_value_heads is 16 there but 32" in err.value.message
    assert "point --from-checkpoint at a checkpoint of Qwen3-Next-80B-A3B" in err.value.fix


def test_convert_check_and_refusals(tmp_path, capsys):
    spec = get_model("qwen3_30b")
    folder = hf_folder(tmp_path / "q", spec.config)
    assert convert_main(["--hf", str(folder), "--check"]) == 0
    assert "holds Qwen3-30B-A3B (qwen3_30b) with its weights" in capsys.readouterr().out
    assert convert_main(["--hf", str(folder), "--model", "qwen3_235b", "--check"]) == 2
    assert "is not Qwen3-235B-A22B: num_hidden_layers is 48 there but 94" in capsys.readouterr().err
    unknown = hf_folder(tmp_path / "u", {**spec.config, "hidden_size": 1000})
    assert convert_main(["--hf", str(unknown), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no catalogue model has the numbers of" in err and "name the model with --model" in err
    assert not (tmp_path / "out").exists()


def test_convert_refuses_an_out_folder_holding_something_else(tmp_path, capsys):
    spec = get_model("qwen3_30b")
    folder = hf_folder(tmp_path / "q", spec.config)
    other = megatron_folder(tmp_path / "out", {**megatron_architecture(spec), "hf_model_id": "/elsewhere"})
    assert convert_main(["--hf", str(folder), "--out", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"already holds a conversion of '/elsewhere', not of '{folder.resolve()}'" in err
    assert f"remove '{other}' or give another --out" in err
    # The same folder, converted from this source: reused, nothing written.
    (tmp_path / "out2").mkdir()
    same = megatron_folder(tmp_path / "out2" / "ck", {**megatron_architecture(spec), "hf_model_id": str(folder.resolve()),
                                                      "transformer_impl": "local"})
    before = sorted(p.name for p in same.rglob("*"))
    assert convert_main(["--hf", str(folder), "--out", str(same)]) == 0
    assert "reusing" in capsys.readouterr().out and sorted(p.name for p in same.rglob("*")) == before


def test_the_weights_a_config_starts_from_are_checked_however_they_were_set(tmp_path):
    """checkpoint.pretrained_checkpoint set by an override or a hand-edited YAML gets --from-hf's and
    --from-checkpoint's checks where this machine sees the folder; elsewhere, or before a save exists, it is left to
    the job's start."""
    from lcmoe_recipes.checks.weights import pretrained_findings

    spec = get_model("qwen3_30b")
    (finding,) = pretrained_findings(str(hf_folder(tmp_path / "q235", get_model("qwen3_235b").config)), spec)
    assert (finding.severity, finding.rule) == ("error", "weights/pretrained-model")
    assert finding.message.startswith("checkpoint.pretrained_checkpoint: the Hugging Face checkpoint in ")
    assert "num_hidden_layers is 94 there but 48 for qwen3_30b" in finding.message
    assert finding.fix == ("It matches catalogue model 'qwen3_235b': plan that model instead, or set "
                           "checkpoint.pretrained_checkpoint to a Qwen3-30B-A3B checkpoint")
    (empty,) = pretrained_findings(str(hf_folder(tmp_path / "nothing", spec.config, weights=False)), spec)
    assert "has a config.json but no weights" in empty.message
    numbers = megatron_architecture(spec)
    other = megatron_folder(tmp_path / "other", {**numbers, "num_layers": 24})
    (finding,) = pretrained_findings(str(other / "iter_0000000"), spec)  # an iteration folder: its root's checkpoint
    assert "num_layers is 24 there but 48 for qwen3_30b" in finding.message
    assert finding.fix == "set checkpoint.pretrained_checkpoint to a checkpoint of Qwen3-30B-A3B"
    assert pretrained_findings(str(hf_folder(tmp_path / "ok", spec.config)), spec) == []
    assert pretrained_findings(str(megatron_folder(tmp_path / "ok_ck", numbers)), spec) == []
    assert pretrained_findings(str(megatron_folder(tmp_path / "running", numbers, tracker=False)), spec) == []
    assert pretrained_findings(str(tmp_path / "not_here"), spec) == []
    assert pretrained_findings("s3://bucket/ck", spec) == []


def test_an_override_naming_other_weights_is_checked_at_launch(tmp_path):
    """launch ... checkpoint.pretrained_checkpoint=DIR: refused when DIR holds another model, warned when this
    machine does not see DIR (what --from-hf gets); before, both passed silently."""
    from lcmoe_recipes import TrainingRequest
    from lcmoe_recipes.errors import InfeasibleConfig
    from lcmoe_recipes.jobs.prepare import prepare

    wrong = hf_folder(tmp_path / "q30", get_model("qwen3_30b").config)
    request = dict(model="qwen3_235b", seq_length=131072, hardware="gb200", num_gpus=128)
    with pytest.raises(InfeasibleConfig) as err:
        prepare(TrainingRequest(**request, overrides=(f"checkpoint.pretrained_checkpoint={wrong}",)),
                output=tmp_path / "a.yaml")
    assert "checkpoint.pretrained_checkpoint: the Hugging Face checkpoint in" in err.value.message
    assert "num_hidden_layers is 48 there but 94 for qwen3_235b" in err.value.message
    (one,) = prepare(TrainingRequest(**request, overrides=("checkpoint.pretrained_checkpoint=/lustre/none/Qwen3",)),
                     output=tmp_path / "b.yaml")
    (note,) = [w for w in one.warnings if w.rule == "weights/not-here"]
    assert note.message.startswith("checkpoint.pretrained_checkpoint=/lustre/none/Qwen3 is not on this machine")
