"""Data, tokenizer and checkpoint paths: refused where the config is built when no machine could make them right,
never required to exist there, and checked where the job runs (the entry script, --smoke on every node)."""

from __future__ import annotations

import json
import os
import socket

import pytest

from lcmoe_recipes.cli.launch import main as launch_main
from lcmoe_recipes.errors import InfeasibleConfig

pytestmark = pytest.mark.slow
NODE = os.uname().nodename


def hf_folder(path):
    """A Hugging Face model folder as megatron-bridge recognises one: config.json + model.safetensors."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_next"}))
    (path / "model.safetensors").write_bytes(b"\0" * 16)
    return path


def validate(cfg, plan):
    from lcmoe_recipes.emit import validate_config

    return validate_config(cfg, plan.hardware_spec, plan.layout.world, plan.name)


def test_bin_suffix_and_null_tokenizer_refused_at_build_time(fresh_config):
    plan, cfg = fresh_config("qwen3_next_8k_gb200")
    cfg.tokenizer.tokenizer_type, cfg.tokenizer.tokenizer_model = "HuggingFaceTokenizer", "Qwen/Qwen3-Next-80B-A3B"
    cfg.dataset.blend = [["/data/docs_text_document.bin"], None]
    with pytest.raises(InfeasibleConfig) as caught:
        validate(cfg, plan)
    assert caught.value.message == (
        "qwen3_next_8k_gb200: dataset.blend prefix '/data/docs_text_document.bin' ends in .bin: megatron-core appends "
        ".bin and .idx to every prefix itself, so it would open '/data/docs_text_document.bin.bin'")
    assert caught.value.fix == ("drop the suffix: --data-path /data/docs_text_document (the prefix of "
                                "/data/docs_text_document.bin and /data/docs_text_document.idx)")
    cfg.dataset.blend = [["/data/docs_text_document"], None]  # paths that exist nowhere here: fine to build
    validate(cfg, plan)
    cfg.tokenizer.tokenizer_type, cfg.tokenizer.tokenizer_model = "NullTokenizer", None
    with pytest.raises(InfeasibleConfig, match="reads real data \\(dataset prefixes are set\\) with megatron's "
                                               "NullTokenizer") as caught:
        validate(cfg, plan)
    assert caught.value.fix.startswith("give the tokenizer the .bin/.idx files were made with: --tokenizer NAME_OR_DIR")


def test_cli_data_path_with_bin_suffix(tmp_path, capsys):
    out = tmp_path / "x.yaml"
    code = launch_main(["qwen3_next", "--seq", "8192", "--data-path", "/data/docs_text_document.idx", "--tokenizer",
                        "Qwen/Qwen3-Next-80B-A3B", "--dry-run", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "ends in .idx: megatron-core appends .bin and .idx" in err
    assert "fix: drop the suffix: --data-path /data/docs_text_document " in err and not out.exists()


def test_pretrained_checkpoint_on_the_cluster_only(fresh_config, tmp_path):
    """megatron-bridge's CheckpointConfig.finalize asserts the pretrained checkpoint exists; building for the target
    answers that probe as the cluster would, for that path only, and the job start checks it for real."""
    from lcmoe_recipes.emit.target import target_environment
    from lcmoe_recipes.jobs.node import problems_here

    plan, cfg = fresh_config("qwen3_next_8k_gb200")
    cfg.checkpoint.pretrained_checkpoint = "/lustre/ckpt/qwen3_next_base"
    trial = __import__("copy").deepcopy(cfg)
    with pytest.raises(AssertionError, match="Pretrained checkpoint /lustre/ckpt/qwen3_next_base does not exist"):
        trial.checkpoint.finalize()  # upstream's own check, on this machine
    validate(cfg, plan)  # builds here
    import megatron.bridge.training.utils.checkpoint_utils as utils

    with target_environment(plan.hardware_spec, 32, cluster_paths=["/lustre/ckpt/qwen3_next_base", None]):
        assert utils.file_exists("/lustre/ckpt/qwen3_next_base")
        assert not utils.file_exists("/lustre/ckpt/other") and utils.file_exists(str(tmp_path))  # others: real answer
    assert not utils.file_exists("/lustre/ckpt/qwen3_next_base")  # restored
    assert problems_here(cfg) == ["checkpoint.pretrained_checkpoint '/lustre/ckpt/qwen3_next_base' not found (the "
                                  "weights training starts from)"]
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg.checkpoint.pretrained_checkpoint = str(empty)
    assert problems_here(cfg)[0].startswith(f"checkpoint.pretrained_checkpoint '{empty}' holds no Megatron checkpoint")
    (empty / "latest_checkpointed_iteration.txt").write_text("100")  # a Megatron-LM tracker file
    assert problems_here(cfg) == []
    cfg.checkpoint.pretrained_checkpoint = str(hf_folder(tmp_path / "hf"))  # megatron-bridge loads HF folders there
    assert problems_here(cfg) == []


def test_checkpoint_load_of_a_hugging_face_folder(fresh_config, tmp_path):
    from lcmoe_recipes.jobs.node import problems_here

    plan, cfg = fresh_config("qwen3_next_8k_gb200")
    hf = hf_folder(tmp_path / "Qwen3-Next")
    cfg.checkpoint.load = str(hf)
    with pytest.raises(InfeasibleConfig) as caught:  # here at build time, because the folder is here
        validate(cfg, plan)
    assert caught.value.message == (f"qwen3_next_8k_gb200: checkpoint.load '{hf}' is a Hugging Face model folder "
                                    "(config.json + weights); megatron-bridge 0.6.2 resumes only from its own "
                                    "checkpoints")
    assert caught.value.fix == (f"use --from-hf {hf} (converts the Hugging Face weights and starts training from them), "
                                "and keep checkpoint.load for resuming this run")
    assert problems_here(cfg) == [f"{caught.value.message.split(': ', 1)[1]}: {caught.value.fix}"]  # at job start
    cfg.checkpoint.load = "/lustre/ckpt/elsewhere"  # not here: built, then refused where the job runs
    validate(cfg, plan)
    assert problems_here(cfg)[0].startswith("checkpoint.load '/lustre/ckpt/elsewhere' holds no checkpoint (megatron-"
                                            "bridge would warn and start from random weights)")
    cfg.checkpoint.load = cfg.checkpoint.save  # the resume pattern: nothing saved yet is fine
    assert problems_here(cfg) == []


def test_data_and_tokenizer_checked_where_the_job_runs(fresh_config, tmp_path):
    from lcmoe_recipes.jobs.node import problems_here

    _, cfg = fresh_config("qwen3_next_8k_gb200")
    (tmp_path / "web_text_document.bin").write_bytes(b"")
    cfg.dataset.blend = [[str(tmp_path / "web_text_document"), "/data/code_text_document"], [0.7, 0.3]]
    cfg.tokenizer.tokenizer_type, cfg.tokenizer.tokenizer_model = "HuggingFaceTokenizer", "/data/tokenizers/qwen3"
    assert problems_here(cfg) == [
        f"dataset prefix '{tmp_path}/web_text_document': {tmp_path}/web_text_document.idx not found (give the prefix "
        "of an existing .bin/.idx pair)",
        "dataset prefix '/data/code_text_document': /data/code_text_document.bin and /data/code_text_document.idx not "
        "found (give the prefix of an existing .bin/.idx pair)",
        "tokenizer.tokenizer_model '/data/tokenizers/qwen3' not found (copy the tokenizer there, or give a Hugging "
        "Face name)"]
    cfg.tokenizer.tokenizer_model = "Qwen/Qwen3-Next-80B-A3B"  # a hub name, not a path: not checked here
    assert len(problems_here(cfg)) == 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_smoke_names_the_node_and_the_missing_path(tmp_path, capsys, monkeypatch):
    """--smoke on one rank (gloo, world size 1): the missing data prefix is named with the node, exit code 2."""
    from lcmoe_recipes.cli.train import main

    out = tmp_path / "n.yaml"
    assert launch_main(["qwen3_next_8k_gb200", "--data-path", "/data/web_text_document", "--tokenizer",
                        "Qwen/Qwen3-Next-80B-A3B", "--dry-run", "--output", str(out)]) == 0
    capsys.readouterr()
    for var, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(_free_port())), ("RANK", "0"),
                       ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(var, value)
    assert main(["--config", str(out), "--smoke"]) == 2
    captured = capsys.readouterr()
    assert "smoke rank 0/1" in captured.out and "all_reduce 1 (expected 1)" in captured.out
    assert (f"error: on node {NODE}: dataset prefix '/data/web_text_document': /data/web_text_document.bin and "
            "/data/web_text_document.idx not found") in captured.err
    assert f"fix: make these paths exist on {NODE} (a filesystem every node mounts at the same path" in captured.err


def _tokenizer_folder(folder, size: int):
    """A Hugging Face tokenizer folder of ``size`` tokens (a word-level vocabulary), made with the tokenizers library."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w1").save_pretrained(str(folder))
    return str(folder)


def test_the_tokenizer_vocabulary_is_checked_against_the_model_and_the_data(fresh_config, tmp_path):
    """Where the job runs: the tokenizer is built with megatron-bridge's build_tokenizer and judged by its own start-up
    rule (a model vocabulary smaller than the tokenizer's is refused); a dataset whose .idx stores uint16 token ids
    (written here by megatron-core's IndexedDatasetBuilder) cannot come from a tokenizer of 70,000 tokens."""
    import numpy
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from lcmoe_recipes.jobs.node import problems_here, vocabulary_problems

    _, cfg = fresh_config("qwen3_next_8k_gb200")  # vocab_size 151,936
    prefix = tmp_path / "web_text_document"
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=numpy.uint16)
    builder.add_item(torch.tensor([5, 6, 7]))
    builder.end_document()
    builder.finalize(f"{prefix}.idx")
    cfg.dataset.blend = [[str(prefix)], None]
    cfg.tokenizer.tokenizer_type = "HuggingFaceTokenizer"
    cfg.tokenizer.tokenizer_model = _tokenizer_folder(tmp_path / "small", 1000)
    assert vocabulary_problems(cfg) == []  # 1,000 tokens in a 151,936-row embedding, uint16 ids: fits
    cfg.tokenizer.tokenizer_model = big = _tokenizer_folder(tmp_path / "big", 70000)
    assert vocabulary_problems(cfg) == [
        f"{prefix}.idx stores token ids as uint16 (megatron-core writes uint16 only for vocabularies under 65,500), "
        f"but the tokenizer '{big}' has 70,000 tokens: the data was tokenized with another tokenizer; tokenize it "
        "again with this one (Megatron-LM's preprocess_data script, --tokenizer-model)"]
    cfg.model.vocab_size = 50000
    (first, _) = problems_here(cfg)
    assert first == (f"tokenizer '{big}' has 70,000 tokens but the model's vocabulary is 50,000 (megatron-bridge: "
                     "Model vocab_size (50000) cannot be smaller than tokenizer's vocab_size (70000).): give the "
                     "model's own tokenizer")
