"""The real-model build (lcmoe_recipes.emit.probe.build): every named recipe, a `--from` retarget and planner outputs across
the catalogue, built by megatron-core at their full world size on this CPU, and our memory model's parameter and
gradient bytes equal to the built model's for every stage -- or the difference named here.

Known differences, each named and computed:
* DDP's buffers pad: with the distributed optimizer each parameter starts at a multiple of 64 elements and each bucket
  ends at a multiple of lcm(DP, 128) (megatron-core 0.19.2 optimizer/param_layout.py:26, :33): reported apart
  (``grad_padding_bytes``), under 1 MiB a stage;
* without Transformer Engine, megatron-core's local MLA spec splits the q/kv down projections over TP where TE keeps
  them whole (multi_latent_attention.py:525, :572): ``StageBuild.explained``, checked against the shapes below.

One megatron import is shared with the session; the builds of one module run once (``built``), one pipeline rank per
distinct set of modules (``distinct_only``), each in this process with its fake world torn down after it.
"""

from __future__ import annotations

import time

import pytest

from lcmoe_recipes.catalog import get_model
from lcmoe_recipes.emit.stack import te_installed

pytestmark = pytest.mark.slow

# (model, GPUs, hardware, seq_length[, TP asked for]): planner outputs across the catalogue. The planner's best
# layout for each.
PLANNED = (
    ("qwen3_30b_a3b", 4, "h100", 8192), ("qwen3_30b_a3b", 8, "h100", 32768), ("qwen3_30b_a3b", 64, "h100", 131072),
    ("qwen3_30b_a3b", 16, "b200", 262144), ("qwen3_235b_a22b", 64, "gb200", 65536),
    ("qwen3_235b_a22b", 256, "h100", 32768), ("qwen3_coder_480b", 128, "gb300", 262144),
    ("gpt_oss_20b", 8, "h100", 16384), ("gpt_oss_120b", 64, "b200", 131072), ("glm_4_5_air", 32, "h200", 32768),
    ("glm_4_5_air", 64, "b200", 131072), ("glm_4_5", 128, "h100", 65536), ("kimi_k2", 256, "gb200", 16384),
    ("course_moe", 8, "h100", 8192), ("proxy_dsv3", 1, "h200", 4096), ("proxy_qwen3_moe", 8, "h200", 8192),
    ("deepseek_v3", 64, "b200", 32768, 2),  # TP=2 asked for (a layout wish): the MLA down projections split over TP
    # built only with Transformer Engine (here: "not built", with the reason)
    ("qwen3_next_80b_a3b", 32, "gb200", 32768), ("minimax_m2", 64, "gb200", 131072), ("moonlight", 16, "h100", 32768),
)
NEEDS_TE = {"qwen3_next_80b_a3b", "minimax_m2", "moonlight"}
RETARGET = ("qwen3_30b_a3b_pretrain_64gpu_b200_bf16_config", "b200", 64, 131072)  # an upstream 4K recipe -> 128K


@pytest.fixture(scope="module")
def built(configs):
    """name -> (BuildReport, seconds, Plan) for every named recipe, the retarget and every planner output."""
    from lcmoe_recipes import build_recipe
    from lcmoe_recipes import resolve
    from lcmoe_recipes.emit import config_from_plan
    from lcmoe_recipes.emit.probe.build import build_ranks
    from lcmoe_recipes.core.request import TrainingRequest
    from lcmoe_recipes.planner.search import search_layouts as search

    out = {}

    def build(name, plan, cfg, hardware, gpus):
        start = time.monotonic()
        report = build_ranks(cfg, hardware, gpus, name, distinct_only=True)
        out[name] = (report, time.monotonic() - start, plan)

    for name, (plan, cfg) in configs.items():
        build(name, plan, cfg, plan.hardware, plan.layout.world)
    source, hardware, gpus, seq = RETARGET  # launch --from SOURCE --seq N --gpus G --hardware H
    request = TrainingRequest.parse(from_config=source, seq_length=seq, hardware=hardware, num_gpus=gpus)
    build("retargeted", resolve(request).plan, build_recipe(request), hardware, gpus)
    for model, gpus, hardware, seq, *tp in PLANNED:
        plan = search(TrainingRequest(model=model, seq_length=seq, hardware=hardware, num_gpus=gpus,
                                      tp=tp[0] if tp else None)).best.plan
        build(_name(model, gpus, hardware, seq), plan, config_from_plan(plan, validate=False, quiet=True), hardware, gpus)
    return out


def _name(model: str, gpus: int, hardware: str, seq: int) -> str:
    return f"{model}-{gpus}x{hardware}-{seq}"


def _stages_equal_ours(report):
    for stage in report.stages:
        assert stage.residuals == {"dense": 0, "expert": 0, "gradients": 0}, (report.name, stage.pp_rank, stage)
        assert stage.decoder_layers == stage.predicted_decoder_layers and stage.mtp_layers == stage.predicted_mtp_layers
        assert 0 <= stage.grad_padding_bytes < 2**20 and stage.coordinate_classes == 1


def test_every_named_recipe_builds_and_equals_the_memory_model(built, configs):
    for name, (plan, _) in configs.items():
        report = built[name][0]
        if plan.model_spec.gated_delta_net and not te_installed():
            assert report.not_built.startswith("needs Transformer Engine") and not report.stages
            assert [f.rule for f in report.findings] == ["build/needs-te"]
            continue
        assert report.ok and report.not_built is None, report.table()
        assert [s.pp_rank for s in report.stages] == list(range(plan.layout.pp))
        _stages_equal_ours(report)
        assert "byte for byte" in report.table()


def test_dsv3_last_stage_holds_a_second_embedding_and_the_mtp_norms(built):
    """The MTP stage of DeepSeek-V3 (TP1): output layer + the MTP block's own word embedding (GPTModel builds it when
    pre_process or mtp_process), enorm/hnorm/final norm and eh_proj -- and the decoder's final norm sits with the
    last decoder layer (PP rank 6's last chunk), not on the MTP stage."""
    report = built["dsv3_128k_h100"][0]
    last, middle = report.stages[7], report.stages[3]  # PP 3: 8 MoE layers; PP 7: 5 MoE layers + 1 MTP layer (MoE)
    h, vocab = get_model("deepseek_v3").hidden_size, get_model("deepseek_v3").vocab_size
    assert last.mtp_layers == 1 and last.decoder_layers == (1, 2, 2, 0) and middle.decoder_layers == (2, 2, 2, 2)
    # beyond 6 MoE layers' dense parts: eh_proj (2h x h), enorm + hnorm + MTP final norm (3h), embedding + output
    # layer (2 x V x h) -- bf16
    assert last.dense_bytes - 6 * middle.dense_bytes // 8 == 2 * (2 * h * h + 3 * h + 2 * vocab * h)
    assert report.stages[6].dense_bytes - report.stages[5].dense_bytes == 2 * h  # the decoder's final norm


def test_planner_outputs_across_the_catalogue_build(built):
    planned = {_name(*case[:4]): built[_name(*case[:4])] for case in PLANNED}
    assert len(planned) == len(PLANNED)
    built_here = [n for n, (r, _, _) in planned.items() if r.stages]
    assert len(built_here) >= 15 and len({n.split("-")[0] for n in built_here}) >= 10
    for name, (report, _, plan) in planned.items():
        if name.split("-")[0] in NEEDS_TE and not te_installed():
            assert report.not_built.startswith("needs Transformer Engine"), report.table()
            continue
        assert report.ok, report.table()
        assert len(report.stages) == plan.layout.pp
        _stages_equal_ours(report)


def test_retargeted_config_builds(built):
    report, _, plan = built["retargeted"]
    assert report.ok and plan.seq_length == 131072 and report.stages
    _stages_equal_ours(report)


def test_local_mla_down_projections_are_the_one_named_difference(built):
    """DeepSeek-V3 at TP2 without TE: the built model holds 1/TP of each MLA down projection; the report names the
    rest, (TP - 1)/TP x h x (q_lora + kv_lora + rope dim) per layer, bf16, from config.json."""
    from lcmoe_recipes.emit.probe.build import LOCAL_MLA_DOWN

    report, _, plan = built[_name("deepseek_v3", 64, "b200", 32768)]
    assert plan.layout.tp == 2
    c = get_model("deepseek_v3").config
    per_layer = 7168 * (int(c["q_lora_rank"]) + int(c["kv_lora_rank"]) + int(c["qk_rope_head_dim"]))
    for stage in report.stages:
        if te_installed():
            assert stage.explained == ()
            continue
        layers = sum(stage.decoder_layers) + stage.mtp_layers
        dense = [b for k, r, b in stage.explained if k == "dense" and r == LOCAL_MLA_DOWN]
        tp = plan.layout.tp
        assert dense == [-(tp - 1) * (per_layer // tp) * layers * 2]  # built: 1/TP of each; the run: all of it


def test_each_build_is_within_budget(built):
    """<= 60 s per config here (2 cores shared), and the process stays far under 2 GiB (meta device)."""
    import resource

    slow = {n: round(s, 1) for n, (_, s, _) in built.items() if s > 60}
    assert not slow, slow
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 3 * 2**20  # KiB: the whole test process < 3 GiB


def test_a_config_that_cannot_be_built_names_the_stage_line_and_fix(configs):
    """A vocabulary that does not split over TP passes validation and fails when the embedding is built."""
    import copy

    from lcmoe_recipes.emit.probe.build import build_ranks

    plan, cfg = configs["qwen3_235b_128k_gb200"]
    bad = copy.deepcopy(cfg)
    bad.model.vocab_size += 1
    report = build_ranks(bad, plan.hardware, plan.layout.world, "odd-vocab", pp_ranks=[0])
    (finding,) = report.findings
    assert finding.severity == "error" and finding.rule == "build/stage" and not report.stages
    assert finding.message.startswith("pipeline stage 0 (global rank 0) does not build: AssertionError: 151937 is not "
                                      "divisible by 4 [at megatron/core/utils.py")
    assert "called from megatron/core/tensor_parallel/utils.py:118 (vocab_range_from_global_vocab_size)" in finding.message
    assert "pad model.vocab_size to a multiple of 4" in finding.fix
    assert "Traceback" not in report.table()


def test_the_build_leaves_no_global_state(built):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    from lcmoe_recipes.emit.probe import substitutions as subs

    assert not dist.is_initialized() and not parallel_state.model_parallel_is_initialized()
    assert MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is None
    assert torch.cuda.current_device.__module__ == "torch.cuda" and torch.cuda.Stream.__module__ == "torch.cuda.streams"
    assert DotProductAttention.__init__.__module__ == "megatron.core.transformer.dot_product_attention"
    assert all(s.name in {x.name for x in subs.SUBSTITUTIONS} for r, _, _ in built.values() for s in r.substitutions)


# --- the stand-ins against the installed upstream code --------------------------------------------------------------

def test_every_stand_in_still_matches_upstream():
    """Each named line reads as the stand-in expects and each re-implemented function hashes as written: a change in
    megatron-core / megatron-bridge fails here instead of rotting in the build."""
    from lcmoe_recipes.emit.probe import substitutions as subs

    assert subs.mismatches(list(subs.SUBSTITUTIONS)) == []
    assert {s.name for s in subs.SUBSTITUTIONS} == {
        "dispatcher-stream", "ddp-init-stream", "meta-device", "cp-pos-emb", "local-norm-sp", "local-attention-cp",
        "local-attention-kv-channels", "local-mtp-spec"}


def test_a_changed_upstream_line_is_caught():
    import dataclasses

    from lcmoe_recipes.emit.probe import substitutions as subs

    sub = subs.SUBSTITUTIONS[0]
    moved = dataclasses.replace(sub, sites=(dataclasses.replace(sub.sites[0], line=sub.sites[0].line + 1),))
    rehashed = dataclasses.replace(sub, reimplements=(
        ("megatron.core.models.common.embeddings.rope_utils:get_pos_emb_on_this_cp_rank", "0" * 16),))
    assert subs.mismatches([moved])[0].startswith("dispatcher-stream: megatron/core/transformer/moe/"
                                                  "token_dispatcher.py:469 reads")
    assert "source hash" in subs.mismatches([rehashed])[0]
    with pytest.raises(subs.SubstitutionMismatch):
        with subs.installed([moved]):
            pass


def test_stand_ins_answer_only_at_their_lines():
    """The meta-device stand-in answers at its named lines; called from anywhere else it is the real
    torch.cuda.current_device (which fails here: no GPU)."""
    import torch

    from lcmoe_recipes.emit.probe import substitutions as subs

    meta = next(s for s in subs.SUBSTITUTIONS if s.name == "meta-device")
    real = torch.cuda.current_device
    with subs.installed([meta]):
        assert torch.cuda.current_device is not real
        if not torch.cuda.is_available():
            with pytest.raises((RuntimeError, AssertionError)):
                torch.cuda.current_device()
    assert torch.cuda.current_device is real


def test_cp_index_stand_in_selects_what_upstream_selects():
    """The stand-in for rope_utils.get_pos_emb_on_this_cp_rank picks the same two chunks (rank r and 2·CP - r - 1) as
    upstream's arithmetic, for every CP rank of CP4."""
    import torch

    from lcmoe_recipes.emit.probe.substitutions import _pos_emb_on_this_cp_rank

    class Group:
        def __init__(self, rank, size):
            self._rank, self._size = rank, size

        def rank(self):
            return self._rank

        def size(self):
            return self._size

    emb = torch.arange(16.0).view(16, 1, 1, 1)
    for rank in range(4):
        got = _pos_emb_on_this_cp_rank(emb, 0, Group(rank, 4)).flatten().tolist()
        assert got == [2 * rank, 2 * rank + 1, 2 * (7 - rank), 2 * (7 - rank) + 1]


# --- the commands and the Python entry ------------------------------------------------------------------------------

def test_check_build_prints_the_table_and_exits_0(capsys):
    from lcmoe_recipes.cli.check import main

    assert main(["qwen3_235b_128k_gb200", "--build"]) == 0
    out = capsys.readouterr().out
    assert "build: qwen3_235b_128k_gb200 at its full world size (128 ranks, gb200)" in out
    assert "equal our memory model's, byte for byte" in out and "local-norm-sp:" in out


def test_check_build_refuses_a_config_that_does_not_build(configs, tmp_path, capsys):
    import copy

    from lcmoe_recipes.cli.check import main
    from lcmoe_recipes.emit import target_meta, write_yaml

    plan, cfg = configs["qwen3_235b_128k_gb200"]
    bad = copy.deepcopy(cfg)
    bad.model.vocab_size += 1
    path = write_yaml(bad, tmp_path / "odd.yaml", {**target_meta(plan), "recipe": "odd"})
    assert main([str(path), "--build"]) == 1
    out = capsys.readouterr().out
    # the embedding (stage 0) and the output layer (stage 3) split the vocabulary over TP
    assert ("error build/stage: pipeline stage 0 (global rank 0) does not build: AssertionError: 151937 is not "
            "divisible by 4") in out and "error build/stage: pipeline stage 3 (global rank 96) does not build" in out
    assert "equal our memory model's on the 2 stage(s) built, byte for byte" in out
    assert "pad model.vocab_size to a multiple of 4" in out and "Traceback" not in out


def test_launch_dry_run_build_and_the_python_entry(tmp_path, monkeypatch, capsys):
    import lcmoe_recipes
    from lcmoe_recipes.cli.launch import main

    monkeypatch.chdir(tmp_path)
    assert main(["qwen3_30b", "--seq", "32768", "--gpus", "8", "--hardware", "h100", "--dry-run", "--build"]) == 0
    assert "build: qwen3_30b_32k_8xh100 at its full world size (8 ranks, h100)" in capsys.readouterr().out
    report = lcmoe_recipes.build_ranks("qwen3_235b_128k_gb200")
    assert report.ok and [s.pp_rank for s in report.stages] == [0, 1, 2, 3] and report.world_size == 128
