"""Kubernetes through NeMo-Run's own KubeflowExecutor (lcmoe_recipes.jobs.executors.kubeflow): the TrainJob NeMo-Run's dry run
produces validates against the published Kubeflow Trainer CRD schema (vendored: tests/fixtures/kubeflow/SOURCE.md),
with the target's nodes, GPUs, environment, shared volume, topology hint and exit before the time limit. No
Kubernetes cluster is part of this: nothing is submitted."""

from __future__ import annotations

import copy
import gzip
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from lcmoe_recipes.emit import read_meta
from lcmoe_recipes.errors import InfeasibleConfig, LcmoeError
from lcmoe_recipes.jobs.executors.kubeflow import (CLIQUE_LABEL, JOB_LABEL, KubeflowSettings, TRAINER_VERSION,
                                                   check_kubeflow_settings, kube_job_overrides, run_kubeflow)

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "tests" / "fixtures" / "kubeflow"
SETTINGS = KubeflowSettings(image="nvcr.io/nvidia/nemo:26.06", pvc="lcmoe-shared", time="04:00:00", overlay=False)


def trainjob_schema(release: str) -> dict:
    """The TrainJob openAPIV3Schema of a Kubeflow Trainer release, made strict as ``kubectl --validate=strict``
    checks it: an object schema with properties accepts no other field (unless it preserves unknown fields)."""
    crd = yaml.safe_load(gzip.decompress((CRDS / f"trainer.kubeflow.org_trainjobs-{release}.yaml.gz").read_bytes()))
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])

    def strict(node):
        if isinstance(node, dict):
            if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)

    strict(schema)
    return schema


def errors(manifest: dict, release: str) -> list[str]:
    validator = jsonschema.Draft7Validator(trainjob_schema(release))
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest))


def dry_run(recipe: str, settings: KubeflowSettings = SETTINGS, **kwargs):
    path = ROOT / "recipes" / f"{recipe}.yaml"
    env = yaml.safe_load(path.read_text().split("\n", 1)[1])["env_vars"]
    return run_kubeflow(path, read_meta(path), env, settings, dry_run=True, **kwargs)


@pytest.fixture(scope="module")
def qwen_job():
    return dry_run("qwen3_235b_128k_gb200", train_args=["train.exit_duration_in_mins=220"])


def test_manifest_validates_against_the_trainer_crd(qwen_job):
    result, job = qwen_job
    assert result.state == "DRY_RUN" and TRAINER_VERSION == "v2.1.0"
    manifest = job.manifest
    assert errors(manifest, "v2.1.0") == []
    assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and manifest["kind"] == "TrainJob"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", manifest["metadata"]["name"])  # RFC 1123, <= 63
    assert len(manifest["metadata"]["name"]) <= 63
    # The newest Trainer (v2.3.0) replaced podTemplateOverrides with runtimePatches: NeMo-Run 0.11.1's pod overrides
    # are not part of its TrainJob.
    newest = errors(manifest, "v2.3.0")
    assert newest == ["spec: Additional properties are not allowed ('podTemplateOverrides' was unexpected)"]
    bad = copy.deepcopy(manifest)  # and the schema does catch a wrong field
    bad["spec"]["trainer"]["numNodes"] = "32"
    assert errors(bad, "v2.1.0") == ["spec.trainer.numNodes: '32' is not of type 'integer'"]


def test_manifest_carries_the_target(qwen_job):
    _, job = qwen_job
    trainer = job.manifest["spec"]["trainer"]
    # qwen3_235b_128k_gb200: 128 GB200 = 32 compute trays of 4 GPUs
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (32, 4)
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "4"}, "requests": {"nvidia.com/gpu": "4"}}
    assert trainer["image"] == "nvcr.io/nvidia/nemo:26.06" and job.manifest["spec"]["runtimeRef"] == {
        "name": "torch-distributed"}
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert env["NVLINK_DOMAIN_SIZE"] == "72" and env["USE_MNNVL"] == "1" and env["PYTHONPATH"] == "/nemo_run"
    (override,) = job.manifest["spec"]["podTemplateOverrides"]
    assert override["spec"]["volumes"] == [{"name": "lcmoe-shared", "persistentVolumeClaim": {"claimName": "lcmoe-shared"}}]
    assert override["spec"]["containers"] == [{"name": "node", "volumeMounts": [{"name": "lcmoe-shared",
                                                                                 "mountPath": "/shared"}]}]
    # 128 GPUs: two NVLink blocks of 64 -> a preferred (not required) affinity on the NVLink partition label
    (term,) = override["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    label = override["metadata"]["labels"][JOB_LABEL]
    assert term["podAffinityTerm"] == {"labelSelector": {"matchLabels": {JOB_LABEL: label}}, "topologyKey": CLIQUE_LABEL}
    script = job.launch_script
    assert trainer["command"][0] == "/bin/bash" and trainer["command"][1].endswith("/train/code/launch.sh")
    assert f"ln -sfn {trainer['command'][1].removesuffix('/launch.sh')} /nemo_run" in script
    assert re.search(r"torchrun .*--nnodes 32 --nproc-per-node 4 .*-m lcmoe_recipes\.train --config "
                     r"/nemo_run/qwen3_235b_128k_gb200\.yaml train\.exit_duration_in_mins=220\n", script)
    assert set(job.staged) == {"lcmoe_recipes", "qwen3_235b_128k_gb200.yaml"}


def test_small_nvl72_job_stays_in_one_partition_and_hgx_needs_no_hint():
    _, small = dry_run("qwen3_next_8k_gb200")  # 32 GB200: inside one 64-GPU block
    (override,) = small.manifest["spec"]["podTemplateOverrides"]
    (term,) = override["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == CLIQUE_LABEL and errors(small.manifest, "v2.1.0") == []
    _, hgx = dry_run("dsv3_128k_h100")  # HGX: the NVLink domain is the node
    assert "affinity" not in hgx.manifest["spec"]["podTemplateOverrides"][0]["spec"]
    assert hgx.manifest["spec"]["trainer"]["numNodes"] == 32 and errors(hgx.manifest, "v2.1.0") == []
    _, smoke = dry_run("qwen3_next_8k_gb200", smoke=True, smoke_ranks=2)  # CPU-only rehearsal: one pod, no GPUs
    trainer = smoke.manifest["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (1, 2) and "resourcesPerNode" not in trainer


def test_overlay_travels_with_the_code():
    result, job = dry_run("qwen3_next_8k_gb200", KubeflowSettings(image="nvcr.io/nvidia/nemo:26.06", pvc="p"))
    env = {e["name"]: e["value"] for e in job.manifest["spec"]["trainer"]["env"]}
    assert re.fullmatch(r"/nemo_run/lcmoe-overlay/[0-9a-f]{12}", env["LCMOE_OVERLAY"])
    assert any(n.startswith("overlay: nvcr.io/nvidia/nemo:26.06, NeMo Framework 26.06 holds megatron-core 0.18.0 / "
                            "megatron-bridge 0.5.0; to be built on this machine") for n in result.notes)


@pytest.mark.slow
def test_pre_launch_checks(fresh_config):
    _, cfg = fresh_config("qwen3_next_8k_gb200")
    with pytest.raises(InfeasibleConfig, match="checkpoint.save 'nemo_experiments/qwen3_next_8k_gb200/checkpoints' is "
                                               "not on the shared volume lcmoe-shared \\(mounted at /shared\\)"):
        kube_job_overrides(cfg, SETTINGS)
    cfg.checkpoint.save = cfg.checkpoint.load = "/shared/runs/q/checkpoints"
    cfg.logger.tensorboard_dir = "/shared/runs/q/tb"
    overrides, findings, notes = kube_job_overrides(cfg, SETTINGS)
    assert overrides == ["train.exit_duration_in_mins=220"] and findings == []
    assert kube_job_overrides(cfg, KubeflowSettings(image="i", pvc="p", mount="/shared"))[0] == []


def test_settings_refusals():
    for settings, message in ((KubeflowSettings(image="", pvc="p"), "needs its image"),
                              (KubeflowSettings(image="i", pvc=""), "needs a shared volume"),
                              (KubeflowSettings(image="i", pvc="p", mount="shared"), "is not an absolute folder"),
                              (KubeflowSettings(image="i", pvc="p", time="4"), "is 4 minute")):
        with pytest.raises(LcmoeError, match=message):
            check_kubeflow_settings(settings)
