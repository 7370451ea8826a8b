"""The catalogue of known upstream bugs (``known_issues.yaml``) and of NGC containers' versions (``containers.yaml``).

Both files ship inside the package; their headers describe every field. Loading validates the structure (unique
ids, severities, PEP 440 specifiers and versions, sources, architectures, a reason for every unpublished image
version); the trigger conditions are checked by
:mod:`lcmoe_recipes.checks.known_issues`, which owns their language.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

COMPONENTS = ("megatron-core", "megatron-bridge", "transformer-engine")  # PyPI distribution names
# The rest of the stack a job runs: always the image's (the overlay replaces only megatron-core / megatron-bridge).
IMAGE_COMPONENTS = ("cudnn", "nccl", "deep-ep", "pytorch")
STACK_COMPONENTS = (*COMPONENTS, *IMAGE_COMPONENTS)  # what `affected` may key on
OVERLAID = ("megatron-core", "megatron-bridge")  # what the overlay replaces on an image
# Where a bug lives (the docs group by it); the versions that decide it are `affected`'s (STACK_COMPONENTS).
PACKAGES = (*COMPONENTS, "deep-ep", "nemo-container")
CONFIDENCES = ("high", "medium", "low")
# GPU architectures, and the catalogue's hardware keys on each (catalog/hardware.py; kernels.yaml `generations`).
ARCHITECTURES = ("hopper", "blackwell")
ARCHITECTURE_OF = {"h100": "hopper", "h200": "hopper", "b200": "blackwell", "gb200": "blackwell",
                   "gb300": "blackwell"}
# What an entry says of the architectures it was not seen on.
OTHERS = ("affected", "unknown", "safe")


_SOURCE_KINDS = {"issue": int, "pull": int, "file": str, "commit": str}


@dataclass(frozen=True)
class Source:
    """A public GitHub issue, pull request, commit, or file on a repository's default branch (e.g. release notes)."""

    repository: str
    kind: str  # "issue", "pull", "commit" or "file"
    ref: int | str  # the number, the commit's hash, or the file's path

    @property
    def url(self) -> str:
        if self.kind in ("file", "commit"):
            return f"https://github.com/{self.repository}/{'blob/main' if self.kind == 'file' else 'commit'}/{self.ref}"
        return f"https://github.com/{self.repository}/{'pull' if self.kind == 'pull' else 'issues'}/{self.ref}"

    @property
    def short(self) -> str:
        """``Megatron-LM #5100`` / ``Megatron-LM PR #5271`` / ``Megatron-LM commit c2c36f7`` /
        ``Megatron-Bridge docs/releases/known-issues.md``."""
        name = self.repository.split("/")[-1]
        if self.kind == "file":
            return f"{name} {self.ref}"
        if self.kind == "commit":
            return f"{name} commit {str(self.ref)[:7]}"
        return f"{name} {'PR ' if self.kind == 'pull' else ''}#{self.ref}"


@dataclass(frozen=True)
class KnownIssue:
    """One upstream bug (see the header of ``known_issues.yaml`` for the meaning of each field).

    Attributes:
        package: where the bug lives (one of :data:`PACKAGES`).
        affected: component (one of :data:`COMPONENTS`) -> PEP 440 specifier string.
        trigger: the condition (mapping) over the config's fields.
        confidence: for a report whose root cause upstream has not confirmed, how sure the entry is that the trigger
            leads to the symptom (one of :data:`CONFIDENCES`; ``status`` says why); "" when the cause is known.
    """

    id: str
    package: str
    title: str
    severity: str
    trigger: dict[str, Any]
    affected: dict[str, str]
    status: str
    symptom: str
    fix: str
    sources: tuple[Source, ...]
    confidence: str = ""
    seen_on: tuple[str, ...] = ()
    others: str = "unknown"

    def on_architecture(self, architecture: str | None) -> str:
        """``seen`` when the bug was reported on ``architecture``, else what the entry says of the others:
        ``affected`` (the cause is not architecture-specific), ``unknown`` or ``safe``; ``seen`` for None (no
        target known: every architecture counts)."""
        if architecture is None or architecture in self.seen_on:
            return "seen"
        return self.others

    def seen_text(self) -> str:
        """``hopper, blackwell``, or ``no architecture named`` for a report that names none."""
        return ", ".join(self.seen_on) or "no architecture named"

    def architecture_text(self) -> str:
        """``seen on hopper; blackwell: unknown`` (``seen on no architecture named; hopper, blackwell: affected``
        for a bug in code that runs the same on every GPU)."""
        rest = [a for a in ARCHITECTURES if a not in self.seen_on]
        return f"seen on {self.seen_text()}" + (f"; {', '.join(rest)}: {self.others}" if rest else "")

    def affects(self, versions: dict[str, str | None]) -> bool | None:
        """True when every component in :attr:`affected` has a version in its range, False when one is outside,
        None when a listed component's version is unknown (``versions[c]`` is None)."""
        for component, spec in self.affected.items():
            version = versions.get(component)
            if version is None:
                return None
            if not SpecifierSet(spec).contains(Version(version), prereleases=True):
                return False
        return True

    def fixed_in(self) -> str:
        """``fixed in megatron-core 0.18.0`` (the upper bounds of :attr:`affected`), or ``no fixed release known``."""
        fixed = [f"{c} {spec.version}" for c, specs in self.affected.items() for spec in SpecifierSet(specs)
                 if spec.operator == "<"]
        return f"fixed in {' and '.join(fixed)}" if fixed else "no fixed release known"

    def affected_text(self) -> str:
        """``megatron-core >=0.14.0,<0.18.0``; several components joined with ``and``."""
        return " and ".join(f"{c} {spec or '(every version)'}" for c, spec in self.affected.items())


@dataclass(frozen=True)
class Container:
    """A container image and the stack inside it, with the release it belongs to (see ``containers.yaml``).

    Attributes:
        versions: component (one of :data:`COMPONENTS`) -> version, None where the sources do not give it.
        pytorch, python: the image's PyTorch and Python versions (``"3.12"``), None where unknown.
        origin: ``table`` (the software-versions table) or ``pins`` (the Megatron-Bridge tag's pinned commits).
        image_stack: cuDNN, NCCL and DeepEP (:data:`IMAGE_COMPONENTS` but PyTorch) -> version, None where unpublished.
        unpublished: component -> why its version is None (every None of :attr:`stack` has one).
    """

    image: str
    release: str
    versions: dict[str, str | None]
    pytorch: str | None = None
    python: str | None = None
    origin: str = "table"
    note: str = ""
    image_stack: dict[str, str | None] = field(default_factory=dict)
    unpublished: dict[str, str] = field(default_factory=dict)

    @property
    def stack(self) -> dict[str, str | None]:
        """Every component of :data:`STACK_COMPONENTS` -> its version in the image (None: not published; see
        :attr:`unpublished` for why)."""
        return {**self.versions, **self.image_stack, "pytorch": self.pytorch}

    @property
    def tag(self) -> str:
        """``26.06`` of ``nvcr.io/nvidia/nemo:26.06``."""
        return self.image.rsplit(":", 1)[-1]


# libyaml's C parser where PyYAML has it (its PyPI wheels do): the same documents as yaml.safe_load, about 6x faster.
# known_issues.yaml (141 KB) then parses in 0.03 s instead of 0.16 s on the 2-core CI machine (2026-12-05), which
# every plan, check and launch paid once per process (the planner judges open hazards from it).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read(name: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 -- a safe loader


def _source(raw: dict[str, Any], where: str) -> Source:
    kinds = [k for k in _SOURCE_KINDS if k in raw]
    if set(raw) != {"repository", *kinds} or len(kinds) != 1 or not isinstance(raw[kinds[0]], _SOURCE_KINDS[kinds[0]]):
        raise ValueError(f"{where}: a source is {{repository: OWNER/NAME, issue: N}}, {{..., pull: N}}, "
                         f"{{..., commit: SHA}} or {{..., file: PATH}}, not {raw}")
    if raw["repository"].count("/") != 1:
        raise ValueError(f"{where}: repository must be OWNER/NAME, not {raw['repository']!r}")
    return Source(raw["repository"], kinds[0], raw[kinds[0]])


_REQUIRED = {"id", "package", "title", "severity", "trigger", "affected", "status", "symptom", "fix", "sources",
             "architectures"}


def _issue(raw: dict[str, Any]) -> KnownIssue:
    where = f"known_issues.yaml, {raw.get('id', '?')}"
    if not _REQUIRED <= set(raw) <= _REQUIRED | {"confidence"}:
        raise ValueError(f"{where}: fields {sorted(_REQUIRED)} (and optionally confidence) expected, got {sorted(raw)}")
    if raw["severity"] not in ("error", "warning"):
        raise ValueError(f"{where}: severity must be error or warning, not {raw['severity']!r}")
    if raw["package"] not in PACKAGES:
        raise ValueError(f"{where}: package must be one of {', '.join(PACKAGES)}, not {raw['package']!r}")
    if raw.get("confidence", "high") not in CONFIDENCES:
        raise ValueError(f"{where}: confidence must be one of {', '.join(CONFIDENCES)}, not {raw['confidence']!r}")
    for component, spec in raw["affected"].items():
        if component not in STACK_COMPONENTS:
            raise ValueError(f"{where}: unknown component {component!r} (one of {', '.join(STACK_COMPONENTS)})")
        SpecifierSet(spec)  # raises InvalidSpecifier for a bad range
    if not raw["affected"] or not raw["sources"]:
        raise ValueError(f"{where}: needs at least one affected component and one source")
    sources = tuple(_source(s, where) for s in raw["sources"])
    arch = raw["architectures"]
    if (not isinstance(arch, dict) or set(arch) != {"seen", "others"} or not isinstance(arch["seen"], list)
            or set(arch["seen"]) - set(ARCHITECTURES) or arch["others"] not in OTHERS
            or (not arch["seen"] and arch["others"] == "safe")):
        raise ValueError(f"{where}: architectures is {{seen: [{'|'.join(ARCHITECTURES)}, ...], others: "
                         f"{'|'.join(OTHERS)}}}, not {arch}")
    text = {k: " ".join(str(raw[k]).split()) for k in ("title", "status", "symptom", "fix")}
    return KnownIssue(id=raw["id"], package=raw["package"], severity=raw["severity"], trigger=raw["trigger"],
                      affected=dict(raw["affected"]), sources=sources, confidence=raw.get("confidence", ""),
                      seen_on=tuple(arch["seen"]), others=arch["others"], **text)


@functools.cache
def known_issues() -> tuple[tuple[KnownIssue, ...], dict[str, Any]]:
    """(entries, named conditions) of ``known_issues.yaml``, in file order.

    Raises:
        ValueError: a malformed entry (a test loads the catalogue, so this never reaches a user).
    """
    raw = _read("known_issues.yaml")
    issues = tuple(_issue(entry) for entry in raw["issues"])
    ids = [i.id for i in issues]
    if len(set(ids)) != len(ids):
        raise ValueError(f"known_issues.yaml: duplicate ids in {ids}")
    return issues, dict(raw["conditions"])


_CONTAINER_FIELDS = {"image", "release", "from", *STACK_COMPONENTS, "python"}


@functools.cache
def containers() -> tuple[tuple[Container, ...], str]:
    """(listed containers, newest first, the source URL of their versions) from ``containers.yaml``.

    Raises:
        ValueError: a malformed entry (a missing field, a version that is not PEP 440, an unknown ``from``).
    """
    raw = _read("containers.yaml")
    out = []
    for entry in raw["containers"]:
        where = f"containers.yaml, {entry.get('image', '?')}"
        if not _CONTAINER_FIELDS <= set(entry) or set(entry) - _CONTAINER_FIELDS - {"note", "unpublished"}:
            raise ValueError(f"{where}: fields {sorted(_CONTAINER_FIELDS)} (and optional note, unpublished) "
                             f"expected, got {sorted(entry)}")
        if entry["from"] not in ("table", "pins"):
            raise ValueError(f"{where}: 'from' is table or pins, not {entry['from']!r}")
        text = {key: None if entry[key] is None else str(entry[key]) for key in (*STACK_COMPONENTS, "python")}
        for version in text.values():
            if version is not None:
                Version(version)  # raises InvalidVersion
        unpublished = {k: " ".join(str(v).split()) for k, v in (entry.get("unpublished") or {}).items()}
        missing = [c for c in IMAGE_COMPONENTS if text[c] is None and c not in unpublished]
        if missing or set(unpublished) - {c for c in STACK_COMPONENTS if text[c] is None}:
            raise ValueError(f"{where}: `unpublished` gives a reason for each null component and only those "
                             f"(missing: {missing}, got {sorted(unpublished)})")
        out.append(Container(entry["image"], entry["release"], {c: text[c] for c in COMPONENTS}, text["pytorch"],
                             text["python"], entry["from"], entry.get("note", ""),
                             {c: text[c] for c in IMAGE_COMPONENTS if c != "pytorch"}, unpublished))
    return tuple(out), raw["source"]


def normalise_image(image: str) -> str:
    """One spelling per image: ``docker://``, enroot's ``nvcr.io#nvidia/...`` and a missing ``nvcr.io/`` in front of
    ``nvidia/...`` are all read as ``nvcr.io/nvidia/...``; case is ignored."""
    text = image.strip().lower().removeprefix("docker://").replace("#", "/", 1)
    return f"nvcr.io/{text}" if text.startswith("nvidia/") else text


def find_container(image: str) -> Container | None:
    """The listed container for ``image`` (any spelling :func:`normalise_image` accepts), else None."""
    wanted = normalise_image(image)
    return next((c for c in containers()[0] if normalise_image(c.image) == wanted), None)
