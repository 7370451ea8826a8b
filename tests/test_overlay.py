"""The overlay of the pinned megatron-core / megatron-bridge for an image with other versions (lcmoe_recipes.jobs.overlay):
what goes in and why, the refusals, and -- for real -- an overlay built for nemo:26.06 that makes the entry script
pass its version check and run its smoke check in an environment holding that image's megatron releases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import image_env
import pytest
from packaging.specifiers import SpecifierSet

from lcmoe_recipes.catalog.known_issues import containers, find_container
from lcmoe_recipes.checks.known_issues import job_versions
from lcmoe_recipes.errors import LcmoeError
from lcmoe_recipes.jobs import overlay as ov
from lcmoe_recipes.jobs.node import activate
from lcmoe_recipes.jobs.prepare import validate_for_image

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "nemo_26_06_requires.json").read_text())


def _stack(tag: str, **changes) -> ov.JobStack:
    stack = ov.container_stack(find_container(f"nvcr.io/nvidia/nemo:{tag}"), "x86_64")
    return ov.JobStack(**{**stack.__dict__, **changes})


def test_catalogue_every_release_with_its_stack():
    # docs/versions1.json of Megatron-Bridge (main, 2026-08-22): 0.6.0 = 26.08, 0.5.1 = 26.06.01, ...; the
    # software-versions table gives 26.06: PyTorch 2.12.0a0+0291f960b6, Megatron Core 0.18.0, TE 2.16, Bridge 0.5.0.
    listed = {c.tag: c for c in containers()[0]}
    assert list(listed) == ["26.08", "26.06.01", "26.06", "26.04.01", "26.04", "26.02.01", "26.02", "25.11", "25.09"]
    c = listed["26.06"]
    assert (c.versions, c.pytorch, c.python, c.origin) == (
        {"megatron-core": "0.18.0", "megatron-bridge": "0.5.0", "transformer-engine": "2.16"},
        "2.12.0a0+0291f960b6", "3.12", "table")
    # From the pins of Megatron-Bridge v0.6.0: Megatron-LM cd4afff (package_info 0.19.0), TransformerEngine 4329ff8
    # (VERSION.txt 2.17.1); PyTorch is not published there.
    c = listed["26.08"]
    assert (c.versions, c.pytorch, c.python, c.origin) == (
        {"megatron-core": "0.19.0", "megatron-bridge": "0.6.0", "transformer-engine": "2.17.1"}, None, "3.12", "pins")
    assert listed["25.11"].python is None  # megatron-bridge 0.2.0 declares >=3.10: the image's Python is not given
    assert find_container("nvidia/nemo:26.06.01").versions["megatron-core"] == "0.18.2"


def test_range_inside():
    assert ov.range_inside(SpecifierSet(">=5.8.1,<5.9.0"), SpecifierSet(">=5.8,<=5.12.1"))
    assert not ov.range_inside(SpecifierSet(">1.3,<=1.3.2"), SpecifierSet(">=1.3.4,<1.4"))
    assert not ov.range_inside(SpecifierSet("~=0.27"), SpecifierSet("~=0.50"))
    assert ov.range_inside(SpecifierSet("==1.26.0"), SpecifierSet(">=1.2"))
    assert not ov.range_inside(SpecifierSet(""), SpecifierSet(">=2.6"))


def test_minimums_are_read_from_the_pinned_packages():
    need = ov.minimums()  # megatron-bridge 0.6.2 / megatron-core 0.19.2 METADATA
    assert str(need["python"][0]) == "<3.13,>=3.12" and str(need["torch"][0]) == ">=2.6.0"
    assert need["torch"][1] == ("megatron-core 0.19.2 Requires-Dist torch>=2.6.0; megatron-bridge 0.6.2 "
                                "Requires-Dist torch>=2.6.0")
    assert ov.wheel_python() == "3.12"  # megatron-core's WHEEL tag cp312-cp312-manylinux...


def test_overlay_for_nemo_26_06_holds_what_the_image_lacks():
    plan = ov.plan_overlay(_stack("26.06"), FIXTURE["requires"])
    assert [(p.name, p.version) for p in plan.packages] == [
        ("megatron-core", "0.19.2"), ("megatron-bridge", "0.6.2"), ("hydra-core", "1.3.8"),
        ("multi-storage-client", "1.3.1"), ("opentelemetry-api", "1.45.2")]
    reasons = {p.name: p.reason for p in plan.packages}
    assert reasons["megatron-core"] == "pinned; nvcr.io/nvidia/nemo:26.06, NeMo Framework 26.06 has 0.18.0"
    assert reasons["hydra-core"] == ("the pinned releases need hydra-core<1.4,>=1.3.4; the image's allowed "
                                     "hydra-core<=1.3.2,>1.3")
    assert "transformers" not in reasons  # 0.5.0's <5.9.0,>=5.8.1 lies inside 0.6.2's <=5.12.1,>=5.8
    assert not any(ov.IMAGE_OWNED.match(p.name) for p in plan.packages) and plan.warnings == ()
    assert 30 * 2**20 < plan.estimated_bytes() < 60 * 2**20
    assert plan.key == ov.plan_overlay(_stack("26.06"), FIXTURE["requires"]).key  # content-addressed


def test_no_overlay_for_the_pinned_stack():
    assert ov.plan_overlay(_stack("26.06", versions={"megatron-core": "0.19.2", "megatron-bridge": "0.6.2",
                                                    "transformer-engine": "2.16", "torch": "2.12.0"})) is None


def test_refusals_name_the_reason_and_the_nearest_image():
    with pytest.raises(ov.OverlayRefused) as caught:
        ov.plan_overlay(_stack("26.06", python="3.10"), FIXTURE["requires"])
    assert caught.value.message == (
        "nvcr.io/nvidia/nemo:26.06, NeMo Framework 26.06 runs Python 3.10; the overlay's megatron-core wheel is built "
        "for CPython 3.12 (its WHEEL tag) and megatron-core 0.19.2 Requires-Python >=3.12; megatron-bridge 0.6.2 "
        "Requires-Python <3.13,>=3.12: it cannot take an overlay of megatron-core 0.19.2 / megatron-bridge 0.6.2")
    assert caught.value.fix == "use nvcr.io/nvidia/nemo:26.06.01 (NeMo Framework 26.06.01), the nearest listed image " \
                               "with Python 3.12"
    with pytest.raises(ov.OverlayRefused, match=r"has PyTorch 2.5.1; megatron-core 0.19.2 Requires-Dist torch>=2.6.0"):
        ov.plan_overlay(_stack("26.06", versions={**_stack("26.06").versions, "torch": "2.5.1"}), FIXTURE["requires"])


def test_unpublished_versions_warn_and_unregistered_releases_refuse():
    # nemo:26.08: PyTorch not published -> planned, with a warning; the registry serves megatron-bridge 0.6.0's metadata
    plan = ov.plan_overlay(_stack("26.08"))
    assert [p.name for p in plan.packages][:2] == ["megatron-core", "megatron-bridge"]
    assert len(plan.warnings) == 1 and "its PyTorch version is not published" in plan.warnings[0]
    # nemo:25.11's megatron-bridge 0.2.0 was never published on the registry: what the image lacks cannot be told
    with pytest.raises(ov.OverlayRefused) as caught:
        ov.plan_overlay(_stack("25.11"))
    assert caught.value.message.startswith("megatron-bridge 0.2.0 is not on the package registry")
    assert caught.value.fix == ("use nvcr.io/nvidia/nemo:26.04 (NeMo Framework 26.04), the nearest listed image an "
                                "overlay can be planned for")


def test_stack_beside_the_target():
    rows = {r.component: r for r in ov.compare_stack("nvcr.io/nvidia/nemo:26.06")}
    assert (rows["megatron-core"].image, rows["megatron-core"].need, rows["megatron-core"].verdict) == \
        ("0.18.0", "0.19.2", "overlay")
    assert (rows["python"].verdict, rows["pytorch"].verdict) == ("ok", "ok")
    assert rows["overlay"].verdict.startswith("5 packages, ~")
    text = ov.format_stack("nvcr.io/nvidia/nemo:26.06", list(rows.values()))
    assert text.splitlines()[0] == "stack of nvcr.io/nvidia/nemo:26.06 beside the target's:"
    assert {r.verdict for r in ov.compare_stack("/lustre/images/mine.sqsh")} == {"unknown"}


def test_job_versions_keep_the_images_transformer_engine():
    versions, notes = job_versions("nvcr.io/nvidia/nemo:26.06")  # the overlay replaces megatron only: the image's
    # TE 2.16, cuDNN 9.21.1.3 and PyTorch stay (NCCL and DeepEP are not published for the image)
    assert versions.versions == {"megatron-core": "0.19.2", "megatron-bridge": "0.6.2", "transformer-engine": "2.16",
                                 "cudnn": "9.21.1.3", "nccl": None, "deep-ep": None, "pytorch": "2.12.0a0+0291f960b6"}
    own, _ = job_versions("nvcr.io/nvidia/nemo:26.06", overlay=False)  # --no-overlay: the image's own megatron
    assert own.versions["megatron-core"] == "0.18.0" and own.versions["cudnn"] == "9.21.1.3"
    assert versions.origin.endswith("with an overlay of megatron-core 0.19.2 / megatron-bridge 0.6.2") and notes == []


def test_activate_refuses_an_image_whose_megatron_shadows_the_overlay(tmp_path):
    overlay = tmp_path / "overlay"
    (overlay / "megatron" / "core").mkdir(parents=True)  # a namespace 'megatron', as the wheels install it
    (overlay / "megatron" / "bridge").mkdir()
    (overlay / "megatron" / "core" / "__init__.py").write_text("")
    (overlay / "megatron" / "bridge" / "__init__.py").write_text("")
    (overlay / ov.MANIFEST).write_text(json.dumps({"python": "%d.%d" % sys.version_info[:2]}))
    image = tmp_path / "image"  # a source checkout with megatron/__init__.py on PYTHONPATH: a regular package
    (image / "megatron" / "core").mkdir(parents=True)
    (image / "megatron" / "__init__.py").write_text("")
    (image / "megatron" / "core" / "__init__.py").write_text("")
    code = "from lcmoe_recipes.jobs.node import activate; print(activate())"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}", ov.ENV_VAR: str(overlay)}
    ok = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip() == str(overlay), ok.stderr
    env["PYTHONPATH"] += f":{image}"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert f"megatron.core imports from {image}/megatron/core/__init__.py, not from the overlay in {overlay}" in bad.stderr
    (overlay / ov.MANIFEST).write_text(json.dumps({"python": "3.10"}))
    with pytest.raises(LcmoeError, match=f"the overlay in {overlay} was built for Python 3.10, this job runs 3.12"):
        activate({ov.ENV_VAR: str(overlay)})


@pytest.fixture(scope="session")
def nemo_26_06_env(tmp_path_factory):
    return image_env.build(tmp_path_factory.mktemp("nemo_26_06") / "env")


@pytest.mark.slow
def test_overlay_for_nemo_26_06_runs_the_entry_script_there(nemo_26_06_env, tmp_path):
    """Configured for real (pip, for x86_64 / CPython 3.12) and installed into an environment holding megatron-core
    0.18.0, megatron-bridge 0.5.0 and hydra-core 1.3.2 as nemo:26.06 does: without it the entry script refuses
    the versions; with it, it passes its version check and its one-rank smoke check (config validated)."""
    assert image_env.versions(nemo_26_06_env) == image_env.IMAGE_PACKAGES
    plan = ov.plan_overlay(_stack("26.06"))
    built = ov.install(plan, tmp_path / "overlays")
    assert built.path.name == plan.key and built.manifest["python"] == "3.12"
    assert [p["name"] for p in built.manifest["packages"]] == [p.name for p in plan.packages]
    assert abs(built.bytes - plan.estimated_bytes()) < 0.1 * built.bytes  # the dry run's size is the built size
    assert ov.install(plan, tmp_path / "overlays").path == built.path  # reused, not rebuilt
    code = tmp_path / "code"  # NeMo-Run's code archive: the YAML and this package
    code.mkdir()
    (code / "lcmoe_recipes").symlink_to(ROOT / "src" / "lcmoe_recipes")
    (code / "n.yaml").write_text((ROOT / "recipes" / "qwen3_next_8k_gb200.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    torchrun = [str(nemo_26_06_env.parent / "torchrun"), "--standalone", "--nproc-per-node", "1", "-m",
                "lcmoe_recipes.train", "--config", "n.yaml", "--smoke"]
    refused = subprocess.run(torchrun, cwd=code, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and ("this config was built and validated with megatron-core 0.19.2 and "
                                        "megatron-bridge 0.6.2, but this job runs megatron-core 0.18.0 and "
                                        "megatron-bridge 0.5.0") in refused.stdout + refused.stderr
    ran = subprocess.run(torchrun, cwd=code, env={**env, ov.ENV_VAR: str(built.path)}, capture_output=True,
                         text=True, timeout=600)
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out[-3000:]
    assert f"overlay {built.path}: megatron-core and megatron-bridge import from it" in out
    assert "smoke rank 0/1" in out and "all_reduce 1 (expected 1)" in out


@pytest.mark.slow
def test_te_gates_are_judged_for_the_images_transformer_engine(fresh_config):
    """megatron-bridge 0.6.2 training/comm_overlap.py: "CUDA graph with delay_wgrad_compute requires TE version >=
    2.12.0". The target's TE passes; nemo:25.09 (TE 2.7.0) is refused, naming the nearest image whose TE passes."""
    from lcmoe_recipes.emit import apply_overrides
    from lcmoe_recipes.errors import InfeasibleConfig

    plan, cfg = fresh_config("qwen3_235b_128k_gb200")  # TE CUDA graphs
    apply_overrides(cfg, ["comm_overlap.overlap_moe_expert_parallel_comm=true", "comm_overlap.delay_wgrad_compute=true"])
    args = (cfg, plan.hardware_spec, plan.layout.world, plan.name)
    assert not [f for f in validate_for_image(*args, "nvcr.io/nvidia/nemo:26.06") if f.severity == "error"]
    with pytest.raises(InfeasibleConfig) as caught:
        validate_for_image(*args, "nvcr.io/nvidia/nemo:25.09")
    # the first error is the TE gate; TE 2.7 also has the catalogued fused cross-entropy bug (TE < 2.8)
    assert "CUDA graph with delay_wgrad_compute requires TE version >= 2.12.0." in caught.value.message
    assert caught.value.message.endswith("(with nvcr.io/nvidia/nemo:25.09's Transformer Engine 2.7.0)")
    assert caught.value.fix.startswith("use nvcr.io/nvidia/nemo:26.02 (NeMo Framework 26.02, Transformer Engine 2.12), "
                                       "the nearest listed image this config passes with; or ")
