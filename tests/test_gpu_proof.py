"""The GPU proof up to the GPU call (docs/gpu_proof.md): the device bundle builds and installs into a clean folder,
the data step writes a real Megatron indexed dataset, and each proxy plans, passes our checks and megatron-bridge's
validate() for 1 x H200 (with megatron-core's local modules, as on a machine without Transformer Engine), and its
YAML reads back the way the entry script reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_proof  # noqa: E402


def test_proxies_are_plannable_on_one_h200():
    from lcmoe_recipes.checks import check_plan
    from lcmoe_recipes.cost import estimate_memory
    from lcmoe_recipes.checks.memory import memory_findings

    for model in gpu_proof.PROXIES:
        plan = gpu_proof.proof_plan(model, 4096, 8)
        assert (plan.layout.world, plan.layout.tp, plan.layout.ep, plan.global_batch_size) == (1, 1, 1, 8)
        assert not [f for f in check_plan(plan) + memory_findings(plan) if f.severity == "error"]
        assert 2 < estimate_memory(plan).gib()["total"] < 40  # a few GiB: meaningful, and far from 141


@pytest.mark.slow
def test_hf_step_writes_a_proxy_that_transformers_reads_back(tmp_path):
    """The proof's first step (``gpu_proof.py hf``) in its own process, as on the GPU machine, for the GQA MoE proxy;
    every proxy's transformers config class resolves (the catalogue leaves it to ``model_type``). The first GPU run
    (2026-12-04) failed here: the step passed the catalogue's unset class name to transformers."""
    import transformers

    assert [gpu_proof.hf_config_class(m) for m in gpu_proof.PROXIES] == ["Qwen3MoeConfig", "DeepseekV3Config",
                                                                          "Qwen3NextConfig"]
    out = tmp_path / "hf"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_proof.py"), "hf", "proxy_qwen3_moe", str(out)],
                   check=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    config = transformers.AutoConfig.from_pretrained(str(out))
    spec = gpu_proof.get_model("proxy_qwen3_moe")
    assert (config.hidden_size, config.num_experts, config.num_hidden_layers) == (
        spec.hidden_size, spec.num_moe_experts, spec.num_layers)
    assert sorted(p.name for p in out.glob("*.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("model", gpu_proof.PROXIES)
def test_proxy_config_validates_for_one_h200_and_reads_back(model, tmp_path):
    from lcmoe_recipes import emit
    from lcmoe_recipes.emit.local_impl import NeedsTransformerEngine
    from lcmoe_recipes.emit.stack import te_installed

    pretrained = tmp_path / "converted"
    pretrained.mkdir()
    needs_te = {"proxy_qwen3_next": "gated_delta_net", "proxy_dsv3": "multi-latent attention runs only with"}
    if model in needs_te and not te_installed():  # local_impl refuses them (their local modules do not run)
        with pytest.raises(NeedsTransformerEngine, match=needs_te[model]):
            gpu_proof.proof_config(model, tmp_path / "c.yaml", pretrained, 5, 4096, 8, drop_mtp=True)
        return
    prediction = gpu_proof.proof_config(model, tmp_path / "c.yaml", pretrained, 5, 4096, 8,
                                        drop_mtp=not te_installed())
    assert prediction["predicted_peak_gib"] > 2 and prediction["predicted_step_seconds"] > 0
    cfg, meta = emit.read_yaml(tmp_path / "c.yaml")
    assert (meta["world_size"], meta["hardware"]) == (1, "h200")
    assert cfg.checkpoint.pretrained_checkpoint == str(pretrained) and cfg.train.train_iters == 5
    if not te_installed():
        assert cfg.model.transformer_impl == "local" and cfg.model.mtp_num_layers is None
        # what the first GPU run (2026-12-04) stopped on, or would have next: TE's FusedAdam, and the local
        # softmax's compiled extension, imported mid-forward for keys of 16-4096 tokens
        assert not cfg.optimizer.use_precision_aware_optimizer and not cfg.model.masked_softmax_fusion
        assert cfg.checkpoint.load is None
        # the local attention's bf16 probabilities alone: 2 bytes x 16 heads x 4096² x 8 layers = 4 GiB
        assert 4.0 < prediction["local_excess_gib"] < 5.0
        assert prediction["predicted_peak_as_run_gib"] == pytest.approx(
            prediction["predicted_peak_gib"] + prediction["local_excess_gib"])
    emit.validate_config(cfg, "h200", 1, model)  # the entry script's check before pretrain()


def test_rank_measurements_planned_for_one_h200():
    """scripts/gpu_proof.sh's ranks step on a 141 GB H200: DeepSeek-V3's most loaded H100 rank fits and is measured
    (with TE), and so does Qwen3-235B's GB200 rank at CP8 (101 GiB), which an 80 GB GPU skips; without TE only BF16
    models without MLA, MTP or gated DeltaNet run."""
    h200 = 141 * 10**9
    with_te = {job["recipe"]: job for job in gpu_proof.rank_jobs(["dsv3_128k_h100", "qwen3_235b_128k_gb200",
                                                                  "qwen3_next_8k_gb200"], h200, te=True)}
    # PP rank 0 (TP = CP = EP rank 0): the most loaded stage since the recipe moves a layer off PP rank 7
    assert with_te["dsv3_128k_h100"]["rank"] == 0 and "--as-rank" in with_te["dsv3_128k_h100"]["command"]
    assert with_te["qwen3_235b_128k_gb200"]["rank"] == 96 and "command" in with_te["qwen3_235b_128k_gb200"]
    (small,) = gpu_proof.rank_jobs(["qwen3_235b_128k_gb200"], 80 * 10**9, te=True)
    assert small["skipped"].startswith("predicted 101 GiB for rank 96, more than 95%")
    assert "command" in with_te["qwen3_next_8k_gb200"]
    without = gpu_proof.rank_jobs(["dsv3_128k_h100", "qwen3_next_8k_gb200", "qwen3_235b_128k_gb200"], h200, te=False)
    assert all(job["skipped"].startswith("needs Transformer Engine") for job in without)  # BF16 Qwen3-235B: its CP8


@pytest.mark.slow
def test_data_step_writes_a_megatron_indexed_dataset(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    import transformers

    prefix, tokenizer = gpu_proof.build_data(tmp_path)
    data = IndexedDataset(str(prefix))
    assert len(data) > 50  # one document per text file of the repository
    first = data[0]
    assert first[-1] == 256 and first[:-1].max() < 256  # bytes, then the end-of-document id
    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer))
    assert (tok.eos_token_id, len(tok)) == (256, 257)
    text = (gpu_proof.ROOT / "README.md").read_text()[:300] + " é"
    assert tok(text)["input_ids"] == list(text.encode()) and tok.decode(list(text.encode())) == text


def test_proof_data_passes_the_entry_scripts_tokenizer_checks(tmp_path):
    """The train step's --data-path/--tokenizer, applied as the entry script applies them, pass our path and
    vocabulary checks (the first GPU run, 2026-12-04, was refused by the data/tokenizer rule: NullTokenizer ids)."""
    from lcmoe_recipes import emit
    from lcmoe_recipes.emit.paths import path_findings
    from lcmoe_recipes.jobs.node import vocabulary_problems

    tokenizer = gpu_proof.write_tokenizer(tmp_path / "tokenizer")
    cfg = emit.config_from_plan(gpu_proof.proof_plan("proxy_qwen3_moe", 4096, 8), validate=False, quiet=True)
    emit.apply_overrides(cfg, emit.data_overrides([str(tmp_path / "text_document")], str(tokenizer)))
    assert path_findings(cfg) == [] and vocabulary_problems(cfg) == []
    emit.apply_overrides(cfg, ["tokenizer.tokenizer_type=NullTokenizer"])
    assert [f.rule for f in path_findings(cfg)] == ["data/tokenizer"]


def test_device_bundle_builds_and_installs_into_a_clean_folder(tmp_path):
    bundle = Path(os.environ.get("LCMOE_DEVICE_BUNDLE", tmp_path / "bundle"))
    if "LCMOE_DEVICE_BUNDLE" not in os.environ:
        if os.environ.get("CI_OFFLINE"):
            pytest.skip("no package registry")
        subprocess.run(["bash", "scripts/build_device_bundle.sh", str(bundle)], cwd=ROOT, check=True,
                       env={**os.environ, "PYTHON": sys.executable})
    wheels = sorted(bundle.glob("*.whl"))
    names = {w.name.split("-")[0].lower().replace("_", "-") for w in wheels}
    required = [line.split("==")[0].strip().lower().replace("_", "-").replace(".", "-")
                for line in (ROOT / "requirements/device.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert {r for r in required} <= {n.replace(".", "-") for n in names}
    assert sum(w.stat().st_size for w in wheels) < 61 * 2**20  # + the tree (~3 MiB) under the machine's 64 MiB
    assert all(("cp312" in w.name or "py3" in w.name or "py2.py3" in w.name) and
               ("x86_64" in w.name or w.name.endswith("-any.whl")) for w in wheels)
    target = tmp_path / "site"
    # As the GPU machine (CPython 3.12, glibc 2.39) would install them: pip checks each wheel's tags against it.
    device = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"] + [
        arg for tag in (*(f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)), "manylinux2014_x86_64",
                        "manylinux1_x86_64", "any")
        for arg in ("--platform", tag)]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    *device, "--target", str(target), *map(str, wheels)], check=True)
    for package in ("megatron/core", "megatron/bridge", "nvidia_resiliency_ext/inprocess"):
        assert (target / package).is_dir(), package
    assert not (target / "fla").exists()  # gated DeltaNet's kernels need TE, which no bundle can carry


def test_measured_over_predicted_gives_the_step_ratio_with_or_without_the_local_excess():
    measured = {"peak_allocated_gib": 20.0, "step_seconds_median": 0.2}
    te = {"predicted_peak_gib": 16.0, "predicted_step_seconds": 0.1}
    assert gpu_proof.measured_over_predicted(te, measured) == {"peak_measured_over_predicted": 1.25,
                                                              "step_measured_over_predicted": 2.0}
    local = {**te, "predicted_peak_as_run_gib": 25.0}
    assert gpu_proof.measured_over_predicted(local, measured)["peak_measured_over_predicted_as_run"] == 0.8
    assert gpu_proof.measured_over_predicted({}, measured) == {}
