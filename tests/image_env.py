"""A Python environment that holds what ``nvcr.io/nvidia/nemo:26.06`` holds of our stack, built from this virtualenv
without a second PyTorch: megatron-core 0.18.0, megatron-bridge 0.5.0 and hydra-core 1.3.2 installed from the
package registry (the image's versions: Megatron-Bridge docs/releases/software-versions.md; its megatron-bridge
0.5.0 declares ``hydra-core<=1.3.2,>1.3``), and every other package of this virtualenv (torch, transformers, ...)
linked in, not copied. This package itself is not in it: a job gets it from NeMo-Run's code archive.

Used by tests/test_overlay.py and tests/test_slurm_live.py (the smoke job through an overlay).
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from packaging.utils import canonicalize_name

IMAGE_PACKAGES = {"megatron-core": "0.18.0", "megatron-bridge": "0.5.0", "hydra-core": "1.3.2"}
LEFT_OUT = {*IMAGE_PACKAGES, "lcmoe-recipes"}


def _owned_top_level() -> set[str]:
    """Top-level names of site-packages that belong to a left-out distribution (their dist-info included)."""
    out = set()
    for dist in metadata.distributions():
        if canonicalize_name(dist.metadata["Name"] or "") in LEFT_OUT:
            out |= {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
    return out - {"megatron"}  # a namespace shared with megatron-energon: merged entry by entry below


def build(dest: Path) -> Path:
    """Create the environment in ``dest``; returns its ``bin/python``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = dest / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                    "--target", str(site), *(f"{n}=={v}" for n, v in IMAGE_PACKAGES.items())], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    skip = _owned_top_level()
    for entry in ours.iterdir():
        name = entry.name
        if name in skip or name.startswith(("__editable__", "_lcmoe", "__pycache__")) or name.endswith(".pth"):
            continue
        if name == "megatron":
            for child in entry.iterdir():  # megatron/energon; core, bridge and training are the image's
                if not (site / "megatron" / child.name).exists():
                    (site / "megatron" / child.name).symlink_to(child)
            continue
        if not (site / name).exists():
            (site / name).symlink_to(entry)
    python = dest / "bin" / "python"
    torchrun = dest / "bin" / "torchrun"  # the console script an image's torch installs
    torchrun.write_text(f"#!{python}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n")
    torchrun.chmod(0o755)
    return python


def versions(python: Path) -> dict[str, str]:
    """megatron-core / megatron-bridge / hydra-core as the environment reports them."""
    code = ("import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in "
            f"{sorted(IMAGE_PACKAGES)}}}))")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    import json

    return json.loads(out.stdout)
