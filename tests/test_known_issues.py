"""Known upstream bugs (catalog/known_issues.yaml): the trigger language, version matching, containers, every entry
triggered and not triggered, the CLI, the generated page, and (slow) the named recipes' real ConfigContainers."""

import enum
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from packaging.version import Version

from lcmoe_recipes.catalog import get_hardware
from lcmoe_recipes.catalog.known_issues import containers, find_container, normalise_image
from lcmoe_recipes.checks.conditions import ABSENT, ConfigView, describe, evaluate, holds, problems
from lcmoe_recipes.checks.known_issues import (StackVersions, catalogue, config_view, installed_versions,
                                               known_issue_findings, stack_versions)
from lcmoe_recipes.cli.check import main as check_main

ROOT = Path(__file__).resolve().parent.parent
# the pinned stack: megatron-core / megatron-bridge, the target's TE, and the cuDNN / NCCL / PyTorch wheels the pinned
# requirements install (DeepEP has no wheel: unknown)
INSTALLED = {"megatron-core": "0.19.2", "megatron-bridge": "0.6.2", "transformer-engine": "2.20.2",
             "cudnn": "9.24.0.43", "nccl": "2.30.7", "deep-ep": None, "pytorch": "2.14.1"}


def stack(**changed) -> StackVersions:
    """The installed stack with some components changed: stack(core="0.17.1", cudnn="9.13.1.26")."""
    names = {"core": "megatron-core", "bridge": "megatron-bridge", "te": "transformer-engine", "cudnn": "cudnn",
             "nccl": "nccl", "deepep": "deep-ep", "torch": "pytorch"}
    return StackVersions({**INSTALLED, **{names[k]: v for k, v in changed.items()}}, "test")


def rules(config, versions, hardware=None) -> list[str]:
    view = config_view(config, get_hardware(hardware) if hardware else None)
    return [f.rule.removeprefix("known-issue/") for f in known_issue_findings(view, versions)]


MTP_FULL = {"mtp_num_layers": 1, "recompute_granularity": "full", "recompute_method": "uniform"}
QWEN_MXFP8_VPP = {"mixed_precision": "bf16_with_mxfp8_mixed",
                  "model": {"virtual_pipeline_model_parallel_size": 12, "cuda_graph_impl": "transformer_engine",
                            "cuda_graph_modules": ["attn", "moe_router", "moe_preprocess"], "num_moe_experts": 128,
                            "expert_model_parallel_size": 32}}

# id -> {hit: {config, hardware, gpus, versions}, miss: config, fixed: versions} (tests/fixtures/known_issue_cases.yaml)
CASES = yaml.safe_load((ROOT / "tests" / "fixtures" / "known_issue_cases.yaml").read_text())


def case_rules(issue_id: str, config, versions: dict | None = None) -> list[str]:
    """The rules ``config`` gets with the hardware and world size of ``issue_id``'s triggering case."""
    hit = CASES[issue_id]["hit"]
    view = config_view(config, get_hardware(hit["hardware"]) if "hardware" in hit else None, hit.get("gpus"))
    return [f.rule.removeprefix("known-issue/") for f in known_issue_findings(view, stack(**(versions or {})))]


def test_every_entry_has_cases_and_the_required_kinds_are_catalogued():
    ids = [issue.id for issue in catalogue()[0]]
    assert sorted(ids) == sorted(CASES) and len(ids) >= 40
    for required in ("pp-variable-seq-lengths", "mtp-packed-full-recompute-crash", "mtp-fp8-full-recompute-grad-drop",
                     "optimizer-cpu-offload-checkpoint", "mxfp8-vpp-te-cuda-graphs-nan",
                     "full-iteration-cuda-graph-oom", "cp-masked-loss-normalization"):
        assert required in ids
    for issue in catalogue()[0]:  # an entry without a fixed release has no `fixed` case, and the reverse
        assert ("fixed" in CASES[issue.id]) == (issue.fixed_in() != "no fixed release known"), issue.id


@pytest.mark.parametrize("issue_id", sorted(CASES))
def test_entry_triggers(issue_id):
    hit = CASES[issue_id]["hit"]
    assert issue_id in case_rules(issue_id, hit["config"], hit.get("versions"))


@pytest.mark.parametrize("issue_id", sorted(CASES))
def test_entry_does_not_trigger_outside_its_trigger_or_range(issue_id):
    case = CASES[issue_id]
    assert issue_id not in case_rules(issue_id, case["miss"], case["hit"].get("versions"))
    if "fixed" in case:
        assert issue_id not in case_rules(issue_id, case["hit"]["config"], case["fixed"])


def test_catalogue_covers_every_package_and_states_confidence_for_open_reports():
    issues = catalogue()[0]
    assert {i.package for i in issues} == {"megatron-core", "megatron-bridge", "transformer-engine", "deep-ep",
                                           "nemo-container"}
    for issue in issues:
        if issue.confidence:  # an open report: no fixed release, and the status says why it is that sure
            assert issue.fixed_in() == "no fixed release known" and "confidence" in issue.status, issue.id
        assert "2026-12-01" in issue.status or "2026-12-02" in issue.status, issue.id  # when the sources were read


def test_trigger_variants():
    in_batch = {"model": {"pipeline_model_parallel_size": 2}, "dataset": {"enable_in_batch_packing": True}}
    assert "pp-variable-seq-lengths" in rules(in_batch, stack())  # megatron-bridge sets variable_seq_lengths
    resume = {"optimizer": {"optimizer_cpu_offload": True}, "checkpoint": {"load": "ckpt", "load_optim": True}}
    assert rules(resume, stack()) == ["optimizer-cpu-offload-checkpoint"]
    sft = {"model": {"mtp_num_layers": 1}, "dataset": {"_target_": "megatron.bridge.data.builders.gpt_sft.GPTSFTDatasetConfig"}}
    assert rules(sft, stack()) == ["mtp-loss-ignores-loss-mask"]
    assert rules({"model": {"cuda_graph_scope": ["full_iteration"]}}, stack(), "h100") == ["full-iteration-cuda-graph-oom"]
    assert rules({"model": {"cuda_graph_impl": "full_iteration"}}, stack(), "gb200") == []  # 186 GB: NVIDIA runs it
    assert "mxfp8-vpp-te-cuda-graphs-nan" not in rules(QWEN_MXFP8_VPP, stack(bridge="0.3.0"), "b200")  # not reported
    # MTP + packed + full recompute under FP8 is the silent variant, not the crash
    fp8_packed = {"model": MTP_FULL, "dataset": {"enable_offline_packing": True},
                  "mixed_precision": "bf16_with_fp8_current_scaling_mixed"}
    assert rules(fp8_packed, stack(core="0.17.1")) == ["mtp-fp8-full-recompute-grad-drop",
                                                       "mtp-loss-ignores-loss-mask"]  # packed batches are masked


def test_finding_names_the_bug_versions_symptom_and_fix():
    issue = next(i for i in catalogue()[0] if i.id == "mtp-full-recompute-padding-mask")
    (finding,) = known_issue_findings({"model": {"mtp_num_layers": 1, "recompute_granularity": "full"}},
                                      stack(core="0.18.2"))
    assert finding.severity == "error" and finding.rule == "known-issue/mtp-full-recompute-padding-mask"
    assert finding.message.startswith("MTP with full recompute on megatron-core 0.18: TypeError on padding_mask "
                                      "[Megatron-LM #4933, Megatron-LM PR #6367]. MultiTokenPredictionLayer.forward")
    assert ("Affects megatron-core >=0.18.0,<0.19.0 (fixed in megatron-core 0.19.0); this config runs "
            "megatron-core 0.18.2 (test)") in finding.message
    assert finding.fix == issue.fix == "Run megatron-core 0.19.0 or newer, or set model.recompute_granularity=selective."


def test_unknown_version_matches_no_range():
    config = {"model": {"context_parallel_size": 2}}
    assert rules(config, StackVersions({"megatron-core": None}, "test")) == []
    assert catalogue()[0][0].affects({"megatron-core": None}) is None


# --- the trigger language ----------------------------------------------------------------------------------------

class Impl(enum.Enum):
    TE = "transformer_engine"


@dataclass
class Model:
    context_parallel_size: int = 4
    cuda_graph_impl: Impl = Impl.TE
    cuda_graph_modules: tuple = (Impl.TE,)
    recompute_modules: list | None = None


def test_conditions_read_objects_and_dicts_alike():
    obj = SimpleNamespace(model=Model(), mixed_precision="bf16_with_mxfp8_mixed", dataset=Model())
    data = {"model": {"context_parallel_size": 4, "cuda_graph_impl": "transformer_engine",
                      "cuda_graph_modules": ["transformer_engine"], "recompute_modules": None},
            "mixed_precision": "bf16_with_mxfp8_mixed", "dataset": {"_target_": f"{__name__}.Model"}}
    cases = [
        ({"field": "model.context_parallel_size", "op": ">", "value": 1}, True),
        ({"field": "model.context_parallel_size", "op": "<=", "value": 2}, False),
        ({"field": "model.cuda_graph_impl", "op": "==", "value": "transformer_engine"}, True),  # enum by value
        ({"field": "model.cuda_graph_impl", "op": "in", "value": ["local", "full_iteration"]}, False),
        ({"field": "model.cuda_graph_impl", "op": "not in", "value": ["local"]}, True),
        ({"field": "model.cuda_graph_modules", "op": "contains", "value": "transformer_engine"}, True),
        ({"field": "mixed_precision", "op": "contains", "value": "mxfp8"}, True),
        ({"field": "model.recompute_modules", "op": "falsy"}, True),
        ({"field": "model.recompute_modules", "op": ">", "value": 0}, False),  # None is not ordered
        ({"field": "model.no_such_field", "op": "falsy"}, True),  # absent: only falsy holds
        ({"field": "model.no_such_field", "op": "!=", "value": 1}, False),
        ({"field": "mixed_precision.fp8_recipe", "op": "truthy"}, False),  # a string has no fields
        ({"field": "dataset._target_", "op": "==", "value": f"{__name__}.Model"}, True),  # class path of an object
        ({"not": {"field": "model.context_parallel_size", "op": "==", "value": 4}}, False),
        ({"any": [{"ref": "cp"}, {"field": "x", "op": "truthy"}]}, True),
        ({"all": [{"ref": "cp"}, {"field": "x", "op": "truthy"}]}, False),
    ]
    refs = {"cp": {"field": "model.context_parallel_size", "op": ">=", "value": 4}}
    for condition, expected in cases:
        assert problems(condition, refs) == []
        for config in (obj, data):
            assert holds(condition, ConfigView(config), refs) is expected, (condition, config)


def test_expressions_and_list_orderings():
    config = {"model": {"seq_length": 131072, "context_parallel_size": 2, "moe_router_topk": 8, "hidden_size": 7168,
                        "num_query_groups": 0, "moe_aux_loss_coeff": [0.0, 1e-4], "recompute_modules": None,
                        "fp8": True},
              "train": {"micro_batch_size": 1}}
    view = config_view(config, get_hardware("h100"), 256)
    tokens = "train.micro_batch_size * model.seq_length / model.context_parallel_size"
    assert evaluate(tokens, view) == 65536.0
    assert evaluate(f"{tokens} * model.moe_router_topk * model.hidden_size", view) == 65536 * 8 * 7168
    assert evaluate("target.gpus / target.gpus_per_node", view) == 32.0  # 256 H100s, 8 per node
    assert evaluate("model.hidden_size / model.num_query_groups", view) is ABSENT  # a divisor of 0
    assert evaluate("model.hidden_size * model.no_such_field", view) is ABSENT
    assert evaluate("model.hidden_size * model.recompute_modules", view) is ABSENT  # None is not a number
    assert evaluate("2 * 3", view) == 6.0
    cases = [
        ({"expr": f"{tokens} * model.moe_router_topk * model.hidden_size", "op": ">=", "value": 2**31}, True),
        ({"expr": "model.hidden_size * model.no_such_field", "op": "falsy"}, True),
        ({"expr": "model.hidden_size * model.no_such_field", "op": "<", "value": 1}, False),
        ({"field": "model.moe_aux_loss_coeff", "op": ">", "value": 0}, True),  # any element of a list
        ({"field": "model.moe_aux_loss_coeff", "op": ">", "value": 1e-3}, False),
        ({"field": "model.fp8", "op": ">", "value": 0}, False),  # a bool is not ordered
    ]
    for condition, expected in cases:
        assert problems(condition, {}) == []
        assert holds(condition, view, {}) is expected, condition
    assert describe({"expr": "model.tensor_model_parallel_size / model.num_query_groups", "op": ">", "value": 1}) == \
        "(model.tensor_model_parallel_size / model.num_query_groups) > 1"


def test_target_pseudo_fields():
    view = config_view({}, get_hardware("b200"), 256)
    assert (view.get("target.hardware"), view.get("target.hbm_gb"), view.get("target.gpus"),
            view.get("target.gpus_per_node")) == ("b200", 180.0, 256, 8)
    assert ConfigView({}).get("target.hbm_gb") is ABSENT


def test_malformed_conditions_are_named():
    assert problems({"field": "a.b", "op": "~="}, {}) == \
        ["trigger: op '~=' is not one of ==, !=, <, <=, >, >=, in, not in, contains, truthy, falsy"]
    assert problems({"field": "a", "op": "in", "value": 3}, {}) == ["trigger: op 'in' needs a list value"]
    assert problems({"field": "a", "op": "truthy", "value": 1}, {}) == ["trigger: op 'truthy' takes no value"]
    assert problems({"all": [{"ref": "nope"}]}, {}) == ["trigger.all[0]: unknown condition name 'nope'"]
    assert problems({"any": [], "not": {}}, {}) == \
        ["trigger: exactly one of all/any/not/ref/field/expr expected, got ['any', 'not']"]
    assert problems({"expr": "a.b * ", "op": ">", "value": 1}, {}) == \
        ["trigger: expr must be operands joined by ' * ' or ' / ', not 'a.b * '"]
    assert problems({"expr": "a.b + c", "op": ">", "value": 1}, {}) == \
        ["trigger: expr must be operands joined by ' * ' or ' / ', not 'a.b + c'"]


def test_describe():
    issue = next(i for i in catalogue()[0] if i.id == "mtp-packed-full-recompute-crash")
    assert describe(issue.trigger) == "mtp and packed_sequences and full_recompute_uniform and not (fp8)"
    assert describe(catalogue()[1]["full_recompute_uniform"]) == \
        "model.recompute_granularity == full and model.recompute_method == uniform"


# --- versions ----------------------------------------------------------------------------------------------------

def test_installed_versions():
    from lcmoe_recipes.emit.stack import te_installed
    from lcmoe_recipes.emit.target import TARGET_TE_VERSION

    found = installed_versions()
    assert found.versions["megatron-core"] == "0.19.2" and found.versions["megatron-bridge"] == "0.6.2"  # the pins
    if not te_installed():
        assert found.versions["transformer-engine"] == TARGET_TE_VERSION
        assert found.notes == {"transformer-engine": "assumed: the full environment's, requirements/te.txt; not installed here"}


@pytest.mark.parametrize("spelling", ["nvcr.io/nvidia/nemo:26.02", "nvcr.io#nvidia/nemo:26.02", "nvidia/nemo:26.02",
                                      "docker://nvcr.io/nvidia/nemo:26.02", "NVCR.IO/nvidia/nemo:26.02"])
def test_listed_container(spelling):
    # NeMo Framework 26.02: Megatron Core main:0.16.0, TE 2.12, Megatron-Bridge 0.3.0, PyTorch 2.10.0a0, cuDNN
    # 9.18.0.50 (Megatron-Bridge docs/releases/software-versions.md); NCCL and DeepEP are not published
    versions, notes = stack_versions(spelling)
    assert versions.versions == {"megatron-core": "0.16.0", "megatron-bridge": "0.3.0", "transformer-engine": "2.12",
                                 "cudnn": "9.18.0.50", "nccl": None, "deep-ep": None, "pytorch": "2.10.0a0"}
    assert notes == [] and versions.origin == "container nvcr.io/nvidia/nemo:26.02, NeMo Framework 26.02"


def test_unlisted_container_is_a_warning_that_says_what_is_assumed():
    assert find_container("/lustre/images/nemo.sqsh") is None and normalise_image("nvidia/nemo:x") == "nvcr.io/nvidia/nemo:x"
    versions, (note,) = stack_versions("nvcr.io/nvidia/nemo:25.07")
    assert versions.versions == installed_versions().versions
    assert note.severity == "warning" and note.rule == "known-issue/unlisted-container"
    assert note.message.startswith("container image 'nvcr.io/nvidia/nemo:25.07' is not in the version table "
                                   "(nvcr.io/nvidia/nemo: 26.08, 26.06.01, 26.06, 26.04.01, 26.04, 26.02.01, 26.02, "
                                   "25.11, 25.09), so the megatron-core / "
                                   "megatron-bridge / Transformer Engine versions it runs are unknown; known upstream "
                                   "issues were checked for megatron-core 0.19.2, megatron-bridge 0.6.2")


# --- every catalogued container, and our own recipes ----------------------------------------------------------------

@pytest.mark.parametrize("container", containers()[0], ids=lambda c: c.image.rsplit(":", 1)[-1])
def test_container_is_judged(container):
    """A config that triggers an entry on the container's versions and not on ours, for every entry that tells the
    two stacks apart; a container older than ours in any component must have one (else the catalogue misses its
    bugs), a newer or equal one may have none."""
    ours = installed_versions().versions
    theirs = StackVersions(dict(container.versions), container.release)
    distinct = [i for i in catalogue()[0] if i.affects(theirs.versions) and not i.affects(ours)]
    older = any(Version(theirs.versions[c]) < Version(ours[c]) for c in ours if ours[c] and theirs.versions.get(c))
    assert distinct or not older, f"{container.image}: no catalogued bug tells it apart from {ours}"
    for issue in distinct:
        hit = CASES[issue.id]["hit"]
        view = config_view(hit["config"], get_hardware(hit["hardware"]) if "hardware" in hit else None,
                           hit.get("gpus"))
        assert f"known-issue/{issue.id}" in [f.rule for f in known_issue_findings(view, theirs)], issue.id
        assert f"known-issue/{issue.id}" not in [f.rule for f in known_issue_findings(view, installed_versions())]


RECIPE_YAMLS = sorted((ROOT / "recipes").glob("*.yaml"))


def recipe_rules(path: Path, versions: StackVersions) -> list[str]:
    """The known-issue rules of a generated recipe YAML (its header gives hardware and world size), read as a dict."""
    text = path.read_text()
    meta = json.loads(text.splitlines()[0].split(":", 1)[1])
    view = config_view(yaml.safe_load(text), get_hardware(meta["hardware"]), meta["world_size"])
    return [f.rule.removeprefix("known-issue/") for f in known_issue_findings(view, versions)]


# What each named recipe gets (recipes/*.yaml, regenerated by scripts/regen_recipes.py) on the installed stack:
# the open hazards the recipes walk into, each with its sources in the catalogue.
NAMED_FINDINGS = {
    "dsv3_128k_h100": ["optimizer-cpu-offload-checkpoint", "mtp-context-parallel-loss-scale",
                       "deepep-internode-dispatch-timeout"],  # CP32 with MTP; DeepEP at EP32 over 8-GPU nodes
    "dsv3_256k_h100": ["optimizer-cpu-offload-checkpoint", "mtp-context-parallel-loss-scale",
                       "deepep-internode-dispatch-timeout"],
    "qwen3_235b_128k_gb200": [],
    "qwen3_next_8k_gb200": ["global-aux-loss-scale"],  # Qwen3-Next balances with global_aux_loss
    "qwen3_next_32k_gb200": ["mtp-context-parallel-loss-scale", "global-aux-loss-scale"],
    "qwen3_next_64k_gb200": ["mtp-context-parallel-loss-scale", "global-aux-loss-scale"],
}
# ... and on NeMo 26.04's (megatron-core 0.17.0, megatron-bridge 0.4.0, TE 2.14): what the older stack adds
NAMED_FINDINGS_2604 = {  # and TE 2.14 < 2.18 with the recipes' TE cross-entropy fusion; megatron-bridge 0.4.0 < 0.6.0
    # with the recipes' pipeline layouts and checkpoint saves (custom-pipeline-layout-checkpoint)
    "dsv3_128k_h100": ["moe-aux-loss-per-token-tp-cp-scale", "te-fused-cross-entropy-bf16-grad",  # per-token loss at CP32: aux gradient 1/32
                       "optimizer-offload-resume-fp32-master", "custom-pipeline-layout-checkpoint"],  # CPU offload, resumed
    "dsv3_256k_h100": ["moe-aux-loss-per-token-tp-cp-scale", "te-fused-cross-entropy-bf16-grad",
                       "optimizer-offload-resume-fp32-master", "custom-pipeline-layout-checkpoint"],
    "qwen3_235b_128k_gb200": ["moe-aux-loss-per-token-tp-cp-scale", "expert-grad-norm-tp-undercount",
                              "vpp-async-send-freed-output",
                              "te-graphs-hybridep-router-grad", "te-fused-cross-entropy-bf16-grad",
                              "custom-pipeline-layout-checkpoint"],  # TP4 CP4 EP32 VPP12, TE graphs with HybridEP
    "qwen3_next_8k_gb200": ["vpp-async-send-freed-output", "te-fused-cross-entropy-bf16-grad",  # VPP4, outputs deallocated, P2P overlapped
                            "custom-pipeline-layout-checkpoint"],
    "qwen3_next_32k_gb200": ["moe-aux-loss-per-token-tp-cp-scale", "vpp-async-send-freed-output", "te-fused-cross-entropy-bf16-grad",
                             "gdn-context-parallel-unsupported", "custom-pipeline-layout-checkpoint"],  # GDN at CP4: 0.17 refuses it
    "qwen3_next_64k_gb200": ["moe-aux-loss-per-token-tp-cp-scale", "vpp-async-send-freed-output", "te-fused-cross-entropy-bf16-grad",
                             "gdn-context-parallel-unsupported", "custom-pipeline-layout-checkpoint"],
}


def test_named_recipes_get_exactly_these_findings():
    assert [p.stem for p in RECIPE_YAMLS] == sorted(NAMED_FINDINGS)
    nemo_2604 = StackVersions(find_container("nvcr.io/nvidia/nemo:26.04").stack, "26.04")  # its own cuDNN, PyTorch
    for path in RECIPE_YAMLS:
        assert recipe_rules(path, installed_versions()) == NAMED_FINDINGS[path.stem], path.stem
        added = [r for r in recipe_rules(path, nemo_2604) if r not in NAMED_FINDINGS[path.stem]]
        assert added == NAMED_FINDINGS_2604[path.stem], path.stem


# --- command line and page -----------------------------------------------------------------------------------------

def test_check_known_issues_lists_the_catalogue(capsys):
    assert check_main(["--known-issues"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{len(CASES)} known upstream bugs") and len(CASES) >= 40
    for issue in catalogue()[0]:  # every entry with its affected range and every source URL
        assert f" {issue.id}: {issue.affected_text()}" in out
        assert "  ".join(s.url for s in issue.sources) in out
    assert ("error   mxfp8-vpp-te-cuda-graphs-nan: megatron-bridge >=0.2.0,<0.4.0 (fixed in megatron-bridge 0.4.0); "
            "these versions affected: no") in out
    assert "https://github.com/NVIDIA/Megatron-LM/issues/5100  https://github.com/NVIDIA/Megatron-LM/pull/5271" in out
    for issue in catalogue()[0]:  # every entry's architectures and the stack components it is keyed to
        assert f"architectures: {issue.architecture_text()}; stack: " in out
    cudnn = installed_versions().versions["cudnn"] or "unknown"  # the pip wheel's cuDNN here
    assert f"architectures: seen on hopper; blackwell: safe; stack: cudnn {cudnn} (the image's)" in out
    assert "architectures: seen on blackwell; hopper: safe; stack: megatron-bridge 0.6.2 (overlaid on an image)" in out
    assert check_main(["--known-issues", "--container-image", "nvcr.io/nvidia/nemo:26.02"]) == 0
    out = capsys.readouterr().out
    assert "'these versions' = megatron-core 0.16.0, megatron-bridge 0.3.0, transformer-engine 2.12" in out
    # the image's own cuDNN decides the cuDNN-keyed entries: 26.02 has cuDNN 9.18.0.50, past the 9.18 fix
    assert ("cudnn-thd-cp-backward-nan-hopper: cudnn <9.18 (fixed in cudnn 9.18); these versions affected: no"
            in out)
    assert "stack: cudnn 9.18.0.50 (the image's)" in out
    assert "mxfp8-vpp-te-cuda-graphs-nan: megatron-bridge >=0.2.0,<0.4.0 (fixed in megatron-bridge 0.4.0); these " \
           "versions affected: yes" in out


def test_check_refuses_without_config_and_judges_a_named_recipe_for_an_image(capsys):
    assert check_main([]) == 2
    assert "error: no CONFIG given" in capsys.readouterr().err
    # a named recipe is judged on its own ConfigContainer, as its YAML is: the image's TE under the pinned overlay
    assert check_main(["dsv3_128k_h100", "--container-image", "nvcr.io/nvidia/nemo:26.06"]) == 0
    out = capsys.readouterr().out
    assert ("known upstream bugs for megatron-core 0.19.2, megatron-bridge 0.6.2, transformer-engine 2.16 (container "
            "nvcr.io/nvidia/nemo:26.06") in out
    assert "warning known-issue/optimizer-cpu-offload-checkpoint:" in out


def test_page_is_current():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "known_issues_doc.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# --- the named recipes' real ConfigContainers (megatron-bridge) ----------------------------------------------------

@pytest.mark.slow
def test_stock_dsv3_128k_h100_reports_what_applies_to_the_installed_versions(configs):
    from lcmoe_recipes.emit import config_findings

    _, cfg = configs["dsv3_128k_h100"]  # CP32, optimizer CPU offload with checkpoints saved, MTP without masking
    found = [f.rule for f in config_findings(cfg, "h100", 256) if f.rule.startswith("known-issue/")
             and f.rule != "known-issue/assumed-version"]  # (what an assumed TE hides: the next test)
    # the same as its YAML read as a dict; not cp-masked-loss-normalization: per-token loss is set
    assert found == [f"known-issue/{r}" for r in NAMED_FINDINGS["dsv3_128k_h100"]]


# Field paths that only configs of older releases have (a trigger for an older stack reads them there).
OLDER_RELEASE_FIELDS = {
    "dataset.packed_sequence_specs.packed_sequence_size",  # megatron-bridge 0.2-0.5 SFT packing (FinetuningDataset)
    "model.hybrid_override_pattern",  # megatron-bridge before 0.4 (renamed hybrid_layer_pattern, PR #2628)
}
# Fields only the hybrid (Mamba) provider has (megatron-bridge HybridModelProvider), not the GPT / MLA providers.
HYBRID_FIELDS = {"model.hybrid_layer_pattern"}


@pytest.mark.slow
def test_object_and_to_dict_agree_and_every_field_path_exists(configs):
    import dataclasses

    from megatron.bridge.data.builders.direct_hf_sft import DirectHFSFTDatasetConfig
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetConfig

    for name, (plan, cfg) in configs.items():
        hw = plan.hardware_spec
        assert rules(cfg, stack(core="0.18.0"), hw.key) == rules(cfg.to_dict(), stack(core="0.18.0"), hw.key), name
    issues, refs = catalogue()
    paths = set()

    def collect(cond):
        for key in ("all", "any"):
            for c in cond.get(key, []):
                collect(c)
        if "not" in cond:
            collect(cond["not"])
        if "field" in cond:
            paths.add(cond["field"])
        if "expr" in cond:  # its operands that are not numbers
            paths.update(t for t in cond["expr"].split()[::2] if not t.replace(".", "").isdigit())

    for cond in [*refs.values(), *(i.trigger for i in issues)]:
        collect(cond)
    view = ConfigView(configs["dsv3_128k_h100"][1])
    sft_fields = {f.name for cls in (GPTSFTDatasetConfig, DirectHFSFTDatasetConfig) for f in dataclasses.fields(cls)}
    missing = [p for p in sorted(paths) if not p.startswith("target.") and view.get(p) is ABSENT
               and not (p.startswith("dataset.") and p.split(".")[1] in sft_fields)
               and not p.startswith("mixed_precision.")  # fields of a MixedPrecisionConfig object
               and p not in OLDER_RELEASE_FIELDS and p not in HYBRID_FIELDS]
    assert missing == []


@pytest.mark.slow
def test_named_recipes_keep_the_cp_objective_right(configs):
    hit = [name for name, (plan, cfg) in configs.items()
           if "cp-masked-loss-normalization" in rules(cfg, installed_versions(), plan.hardware)]
    assert hit == []


@pytest.mark.slow
def test_the_cp_fix_validates_and_clears_the_finding(fresh_config):
    from lcmoe_recipes.emit import validate_config

    _, cfg = fresh_config("qwen3_235b_128k_gb200")
    cfg.model.calculate_per_token_loss = True
    cfg.ddp.average_in_collective = False
    warnings = validate_config(cfg, "gb200", 128)  # megatron-bridge's validate() and megatron-core accept it
    # no CP finding (and none of the recipe's own: at CP8 it keeps the memory model's worst error free); the TE
    # cross-entropy bug an assumed TE hides is named where TE is not installed (test_te_gated_issue_...)
    assert [w.rule for w in warnings if w.rule != "known-issue/assumed-version"] == []


@pytest.mark.slow
def test_real_config_mutations_trigger(fresh_config):
    _, cfg = fresh_config("dsv3_128k_h100")
    cfg.model.recompute_granularity, cfg.model.recompute_method, cfg.model.recompute_num_layers = "full", "uniform", 1
    cfg.model.recompute_modules = None
    assert "mtp-full-recompute-padding-mask" in rules(cfg, stack(core="0.18.0"), "h100")  # NeMo 26.06
    assert "mtp-fp8-full-recompute-grad-drop" in rules(cfg, stack(core="0.17.0"), "h100")  # FP8 blockwise, NeMo 26.04
    assert not {"mtp-full-recompute-padding-mask", "mtp-fp8-full-recompute-grad-drop"} & set(rules(cfg, stack(), "h100"))


@pytest.mark.slow
def test_check_yaml_with_container_image(fresh_config, tmp_path, capsys):
    from lcmoe_recipes.emit import write_yaml

    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    _, cfg = fresh_config("qwen3_235b_128k_gb200")  # VPP12, EP32, TE graphs on attn/moe_router/moe_preprocess
    cfg.mixed_precision = get_mixed_precision_config("bf16_with_mxfp8_mixed")
    cfg.mixed_precision.grad_reduce_in_fp32 = False  # the recipe's bf16 gradients: fp32 ones would not fit in HBM
    path = write_yaml(cfg, tmp_path / "q.yaml", {"recipe": "q", "world_size": 128, "hardware": "gb200"})
    # the image's own megatron (--no-overlay): its megatron-bridge 0.3.0 has the bug
    assert check_main([str(path), "--container-image", "nvcr.io/nvidia/nemo:26.02", "--no-overlay"]) == 1
    out = capsys.readouterr().out
    assert "error   known-issue/mxfp8-vpp-te-cuda-graphs-nan: MXFP8 MoE with VPP and TE CUDA graphs on GB200/GB300" in out
    assert "this config runs megatron-bridge 0.3.0 (container nvcr.io/nvidia/nemo:26.02, NeMo Framework 26.02)" in out
    # through the overlay launch builds for that image, the pinned megatron-bridge 0.6.2 runs: not affected
    assert check_main([str(path), "--container-image", "nvcr.io/nvidia/nemo:26.02"]) == 0
    out = capsys.readouterr().out
    assert "mxfp8-vpp-te-cuda-graphs-nan" not in out and "megatron-bridge     0.3.0" in out and "overlay" in out
    assert check_main([str(path), "--container-image", "registry.example/nemo:custom"]) == 0
    out = capsys.readouterr().out
    assert "warning known-issue/unlisted-container: container image 'registry.example/nemo:custom'" in out
    assert "mxfp8-vpp-te-cuda-graphs-nan" not in out  # installed megatron-bridge 0.6.2 assumed


@pytest.mark.slow
def test_launch_judges_the_container_versions(tmp_path, capsys):
    from lcmoe_recipes.cli.launch import main as launch_main

    argv = ["qwen3_235b", "--seq", "131072", "--precision", "mxfp8", "--dry-run", "--output", str(tmp_path / "q.yaml")]
    assert launch_main(argv + ["--container-image", "nvcr.io/nvidia/nemo:26.02", "--no-overlay"]) == 2
    err = capsys.readouterr().err  # the first error's message: the bug's title, then its sources
    assert "error: qwen3_235b_128k_gb200: MXFP8 MoE with VPP and TE CUDA graphs on GB200/GB300: NaN gradient norm " \
           "[Megatron-Bridge #2096, Megatron-Bridge PR #2209, Megatron-Bridge PR #2850]" in err
    assert not (tmp_path / "q.yaml").exists()  # nothing written on error


# What the planner chooses for these requests, built into real ConfigContainers, gets on the installed stack.
PLANNER_FINDINGS = {
    ("dsv3", 131072, "h100", 256): ["mtp-context-parallel-loss-scale",  # CP8 with MTP
                                    "deepep-internode-dispatch-timeout"],  # DeepEP over EP256 on 8-GPU nodes
    ("qwen3_235b", 131072, "gb200", 128): [],
    ("qwen3_next", 65536, "gb200", 32): ["optimizer-cpu-offload-checkpoint",  # the planner's TP2 CP1 EP8 PP4 VPP6:
                                         "global-aux-loss-scale"],  # a CP=1 tie avoids MTP under CP (rule 'hazard')
}


@pytest.mark.slow
def test_planner_outputs_get_exactly_these_findings(configs):  # configs: megatron-bridge loaded once per session
    from lcmoe_recipes.emit import config_from_plan
    from lcmoe_recipes.core.request import TrainingRequest
    from lcmoe_recipes.planner.search import search_layouts

    for (model, seq, hardware, gpus), expected in PLANNER_FINDINGS.items():
        best = search_layouts(TrainingRequest(model=model, seq_length=seq, hardware=hardware, num_gpus=gpus)).best.plan
        cfg = config_from_plan(best, quiet=True)
        assert rules(cfg, installed_versions(), hardware) == expected, (model, best.layout)


@pytest.mark.slow
def test_config_findings_compare_the_timeouts(fresh_config):
    from lcmoe_recipes.cost.step import longest_waits
    from lcmoe_recipes.emit import config_findings

    plan, cfg = fresh_config("dsv3_256k_h100")
    assert not [f for f in config_findings(cfg, "h100", 512) if f.rule.startswith("timeout/")]
    cfg.dist.distributed_timeout_seconds_after_init = 1
    (finding,) = [f for f in config_findings(cfg, "h100", 512) if f.rule.startswith("timeout/")]
    need = math.ceil(3 * longest_waits(plan).longest[1])  # the Plan read back from the config prices the same
    assert finding.rule == "timeout/after-init" and finding.fix == f"set dist.distributed_timeout_seconds_after_init={need}"


@pytest.mark.slow
def test_te_gated_issue_is_judged_for_the_images_transformer_engine(configs):
    """Our recipes fuse the cross-entropy with TE as megatron-bridge's do: fine with the full environment's TE 2.20.2
    (named as hidden by that assumption where TE is not installed), warned about on nemo:26.06 through the overlay
    (the pinned megatron with the image's TE 2.16)."""
    from lcmoe_recipes.emit import config_findings
    from lcmoe_recipes.checks.known_issues import job_versions

    from lcmoe_recipes.emit.stack import te_installed

    plan, cfg = configs["qwen3_next_8k_gb200"]
    here = {f.rule: f for f in config_findings(cfg, plan.hardware_spec, plan.layout.world, plan.name)}
    assert "known-issue/te-fused-cross-entropy-bf16-grad" not in here
    if not te_installed():  # TE assumed at 2.20.2, which no NeMo image ships: the bug it hides is named, not silent
        hidden = here["known-issue/assumed-version"]
        assert hidden.message.startswith(
            "te-fused-cross-entropy-bf16-grad affects every listed NeMo image (25.09 to 26.08) [not judged here: "
            "transformer-engine 2.20.2 assumed; --container-image IMAGE judges yours]. Transformer Engine fused "
            "cross-entropy before 2.18: its backward loses gradient precision: it holds for this config and affects "
            "transformer-engine <2.18, on nvcr.io/nvidia/nemo 26.08, 26.06.01, 26.06, 26.04.01, 26.04, 26.02.01, "
            "26.02, 25.11, 25.09; this check judged transformer-engine 2.20.2 (assumed: ")
        assert hidden.fix.startswith("name the image the job runs (--container-image IMAGE) to have it judged; on an "
                                     "affected image: On an image whose Transformer Engine is older than 2.18")
    versions, _ = job_versions("nvcr.io/nvidia/nemo:26.06")
    image = {f.rule: f for f in config_findings(cfg, plan.hardware_spec, plan.layout.world, plan.name, versions)}
    found = image["known-issue/te-fused-cross-entropy-bf16-grad"]
    assert found.severity == "warning" and "this config runs transformer-engine 2.16" in found.message
    assert found.fix.startswith("On an image whose Transformer Engine is older than 2.18")
    assert "known-issue/assumed-version" not in image  # the image's TE is known: judged, nothing assumed



def test_the_launch_summary_lists_known_issues_in_one_line_each():
    """A known upstream issue is several lines of symptom, versions and fix: the summary gives its title and sources
    and points at --explain, which prints it in full."""
    from lcmoe_recipes.errors import Finding
    from lcmoe_recipes.planner.recipes import recipe_plan
    from lcmoe_recipes.report.text import format_plan

    issue = Finding("warning", "known-issue/x", "A title [Megatron-LM #1]. A long symptom. Affects megatron-core "
                    ">=0.1 (no fixed release known); this config runs megatron-core 0.19.2", "The fix.")
    other = Finding("warning", "memory/thin-headroom", "little left", "measure")
    plan = recipe_plan("dsv3_128k_h100")
    short = format_plan(plan, [issue, other])
    assert "    - known-issue/x: A title [Megatron-LM #1]\n" in short and "A long symptom" not in short
    assert "    - memory/thin-headroom: little left; measure\n" in short
    assert "--explain for each one's symptom, affected versions and fix" in short
    full = format_plan(plan, [issue, other], explain=True)
    assert "A long symptom. Affects megatron-core >=0.1" in full and "The fix." in full
