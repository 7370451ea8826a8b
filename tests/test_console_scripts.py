"""The console scripts pyproject.toml declares (lcmoe-launch, lcmoe-plan, lcmoe-check, lcmoe-calibrate), as `pip install -e` writes
them (here into a scratch prefix, so the test does not depend on how this environment was installed), run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("prefix")
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps",
                          "--no-build-isolation", "--no-index", "--ignore-installed",  # leave this venv's install be
                          "-e", str(ROOT), "--prefix", str(prefix)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return prefix / "bin"


def _run(bin_dir: Path, name: str, *args: str):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([str(bin_dir / name), *args], capture_output=True, text=True, env=env, timeout=300)


def test_console_scripts_run(bin_dir):
    assert sorted(p.name for p in bin_dir.iterdir() if p.name.startswith("lcmoe-")) == [
        "lcmoe-calibrate", "lcmoe-check", "lcmoe-launch", "lcmoe-plan"]
    plan = _run(bin_dir, "lcmoe-plan", "qwen3_235b", "--seq", "65536", "--gpus", "64", "--hardware", "gb200", "--top", "1")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.startswith("qwen3_235b at seq_length 65536 on 64 x gb200: ") and "\nwinner: " in plan.stdout
    check = _run(bin_dir, "lcmoe-check", "out/any.yaml", "--hardware", "a100")
    assert check.returncode == 2  # bad input, refused before anything heavy is imported
    assert check.stderr.splitlines()[0] == "error: unknown hardware 'a100'"
    calibrate = _run(bin_dir, "lcmoe-calibrate", "missing.log", "--config", "dsv3_128k_h100")
    assert calibrate.returncode == 2 and calibrate.stderr.startswith("error: cannot read log 'missing.log'")
    listed = _run(bin_dir, "lcmoe-launch", "--list")
    assert listed.returncode == 0 and "dsv3_128k_h100" in listed.stdout
