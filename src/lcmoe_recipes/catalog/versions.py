"""The versions of megatron-core, megatron-bridge and Transformer Engine a config will run with (package metadata
only: nothing is imported)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

from .known_issues import COMPONENTS

# TE in the cluster container our recipes target; the version pip resolves for transformer-engine[pytorch] with
# megatron-core 0.19.2 / torch 2.14 (requirements/te.txt). Override with LCMOE_TARGET_TE_VERSION.
TARGET_TE_VERSION = os.environ.get("LCMOE_TARGET_TE_VERSION", "2.20.2")


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
        (installed here); transformer-engine 2.20.2 (assumed: the target container's; not installed here)`` -- a
        component with a note carries its note in place of the origin."""
        def shown(c: str) -> str:
            return f"{c} {self.versions.get(c) or 'unknown'}"

        plain = [c for c in components if c not in self.notes]
        parts = [", ".join(shown(c) for c in plain) + f" ({self.origin})"] if plain else []
        parts += [f"{shown(c)} ({self.notes[c]})" for c in components if c in self.notes]
        return "; ".join(parts)


def installed_versions() -> StackVersions:
    """megatron-core, megatron-bridge and Transformer Engine as installed here (package metadata, no import).

    Transformer Engine is absent in the light environment: then the target's version
    (:data:`TARGET_TE_VERSION`, the cluster container's) is used, with a note saying so.
    """
    found: dict[str, str | None] = {}
    for component in COMPONENTS:
        try:
            found[component] = version(component)
        except PackageNotFoundError:
            found[component] = None
    notes = {}
    if found["transformer-engine"] is None:
        found["transformer-engine"] = TARGET_TE_VERSION
        notes["transformer-engine"] = "assumed: the target container's; not installed here"
    return StackVersions(found, "installed here", notes)
