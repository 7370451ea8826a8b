"""The versions of megatron-core, megatron-bridge and Transformer Engine a config will run with, and of the rest of
its stack (cuDNN, NCCL, DeepEP, PyTorch) where known (package metadata only: nothing is imported)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

from .known_issues import COMPONENTS, IMAGE_COMPONENTS

# TE of the full environment (what megatron-core's TE gates and the known issues assume where TE is not installed):
# the version pip resolves for transformer-engine[pytorch] with
# megatron-core 0.19.2 / torch 2.14 (requirements/te.txt). Override with LCMOE_TARGET_TE_VERSION.
TARGET_TE_VERSION = os.environ.get("LCMOE_TARGET_TE_VERSION", "2.20.2")
# No NeMo image ships it (26.08 has 2.17.1): a bug of an image's TE is judged with --container-image, and
# lcmoe_recipes.checks.known_issues.assumed_version_findings names the ones this assumption hides.
ASSUMED_TE = "assumed: the full environment's, requirements/te.txt; not installed here"


@dataclass(frozen=True)
class StackVersions:
    """The versions a config will run with.

    Attributes:
        versions: component (``megatron-core``, ``megatron-bridge``, ``transformer-engine``) -> version, or None
            when unknown.
        origin: where they come from, e.g. ``installed`` or ``container nvcr.io/nvidia/nemo:26.06, NeMo Framework
            26.06``.
        notes: component -> a remark on its version (e.g. Transformer Engine assumed from the target).
    """

    versions: dict[str, str | None]
    origin: str
    notes: dict[str, str] = field(default_factory=dict)

    def describe(self, components: tuple[str, ...] = COMPONENTS) -> str:
        """The components' versions with where they come from: ``megatron-core 0.19.2, megatron-bridge 0.6.2
        (installed here); transformer-engine 2.20.2 (assumed: the full environment's, requirements/te.txt; not installed
        here)`` -- a component with a note carries its note in place of the origin."""
        def shown(c: str) -> str:
            return f"{c} {self.versions.get(c) or 'unknown'}"

        plain = [c for c in components if c not in self.notes]
        parts = [", ".join(shown(c) for c in plain) + f" ({self.origin})"] if plain else []
        parts += [f"{shown(c)} ({self.notes[c]})" for c in components if c in self.notes]
        return "; ".join(parts)


# The pip distributions that carry each image component here (the CUDA 13 wheels first); DeepEP has no wheel on PyPI
# and is unknown unless built into this environment.
IMAGE_DISTRIBUTIONS = {"cudnn": ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12"),
                       "nccl": ("nvidia-nccl-cu13", "nvidia-nccl-cu12"),
                       "deep-ep": ("deep_ep", "deep-ep"), "pytorch": ("torch",)}


def _first_installed(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def installed_versions() -> StackVersions:
    """megatron-core, megatron-bridge and Transformer Engine as installed here (package metadata, no import), and
    cuDNN, NCCL, DeepEP and PyTorch from the pip distributions that carry them (:data:`IMAGE_DISTRIBUTIONS`; None
    where none is installed).

    Transformer Engine is absent in the light environment: then the target's version
    (:data:`TARGET_TE_VERSION`, the cluster container's) is used, with a note saying so.
    """
    found: dict[str, str | None] = {}
    for component in COMPONENTS:
        try:
            found[component] = version(component)
        except PackageNotFoundError:
            found[component] = None
    for component in IMAGE_COMPONENTS:  # None (unknown) where not installed
        found[component] = _first_installed(IMAGE_DISTRIBUTIONS[component])
    notes = {}
    if found["transformer-engine"] is None:
        found["transformer-engine"] = TARGET_TE_VERSION
        notes["transformer-engine"] = ASSUMED_TE
    return StackVersions(found, "installed here", notes)
