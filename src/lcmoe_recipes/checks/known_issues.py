"""Known upstream bugs that apply to a config and the versions it will run with.

The bugs are data (``catalog/known_issues.yaml``: trigger over the config's fields, affected ranges of megatron-core,
megatron-bridge, Transformer Engine, cuDNN, NCCL, DeepEP or PyTorch, the architectures each was seen on, severity,
symptom, fix, public sources); this module only evaluates them. The versions are, by default, the installed ones (package metadata; Transformer Engine, absent in the light
environment, is the target's :data:`lcmoe_recipes.emit.target.TARGET_TE_VERSION`), or those of a listed container
image (``catalog/containers.yaml``). See docs/known_issues.md.

Used by ``lcmoe_recipes.emit.config_findings`` (so ``check`` on a YAML, ``launch`` and the entry script on every rank
report them) and by ``python -m lcmoe_recipes.check --known-issues``. Imports neither torch nor megatron.
"""

from __future__ import annotations

import functools
from typing import Any

from ..catalog import Hardware
from ..catalog.known_issues import ARCHITECTURE_OF, OVERLAID, KnownIssue, containers, find_container, known_issues
from ..catalog.versions import StackVersions, installed_versions
from .conditions import ConfigView, holds, problems
from .feasibility import Finding


def stack_versions(container_image: str | None = None) -> tuple[StackVersions, list[Finding]]:
    """The versions a job will run with: a listed container's, else the installed ones.

    Returns:
        (versions, findings): for an image that ``catalog/containers.yaml`` does not list, one warning
        (``known-issue/unlisted-container``) saying that its versions are unknown and which are assumed.
    """
    if not container_image:
        return installed_versions(), []
    found = find_container(container_image)
    if found is not None:
        return StackVersions(found.stack, f"container {found.image}, {found.release}"), []
    assumed = installed_versions()
    listed = ", ".join(c.image.rsplit(":", 1)[-1] for c in containers()[0])
    return assumed, [Finding(
        "warning", "known-issue/unlisted-container",
        f"container image '{container_image}' is not in the version table (nvcr.io/nvidia/nemo: {listed}), so the "
        f"megatron-core / megatron-bridge / Transformer Engine versions it runs are unknown; known upstream issues "
        f"were checked for {assumed.describe()}",
        "use a listed image, or run the check inside the container (python -m lcmoe_recipes.check CONFIG reads the "
        "versions installed there; the entry script does so on every rank)")]


def config_view(config: Any, hardware: Hardware | None = None, world_size: int | None = None) -> ConfigView:
    """A :class:`ConfigView` of ``config`` (ConfigContainer, its ``to_dict()``, or a YAML's dict) with the target's
    pseudo-fields ``target.hardware``, ``target.architecture`` (hopper or blackwell:
    :data:`lcmoe_recipes.catalog.known_issues.ARCHITECTURE_OF`), ``target.hbm_gb`` (datasheet GB),
    ``target.gpus_per_node`` and ``target.gpus``."""
    target: dict[str, Any] = {}
    if hardware is not None:
        target.update(hardware=hardware.key, hbm_gb=hardware.hbm_bytes / 1e9, gpus_per_node=hardware.gpus_per_node)
        if hardware.key in ARCHITECTURE_OF:
            target["architecture"] = ARCHITECTURE_OF[hardware.key]
    if world_size is not None:
        target["gpus"] = world_size
    return ConfigView(config, target)


@functools.cache
def catalogue() -> tuple[tuple[KnownIssue, ...], dict[str, Any]]:
    """The known-issue entries and named conditions, every trigger checked.

    Raises:
        ValueError: a malformed trigger or named condition (a test loads the catalogue, so this never reaches a user).
    """
    issues, refs = known_issues()
    found = [p for name, cond in refs.items() for p in problems(cond, refs, f"conditions.{name}")]
    found += [p for issue in issues for p in problems(issue.trigger, refs, f"{issue.id}.trigger")]
    if found:
        raise ValueError("known_issues.yaml: " + "; ".join(found))
    return issues, refs


def _finding(issue: KnownIssue, versions: StackVersions, architecture: str | None = None) -> Finding:
    sources = ", ".join(s.short for s in issue.sources)
    confidence = (f"; an open report whose root cause upstream has not confirmed (confidence: {issue.confidence})"
                  if issue.confidence else "")
    arch = issue.on_architecture(architecture)
    if arch == "affected" and not issue.seen_on:  # a bug of code that runs the same everywhere: nothing to add
        arch = "seen"
    where = {"seen": "", "affected": f" (seen on {issue.seen_text()}; its cause is not specific to a GPU "
                                     f"architecture, so {architecture} is affected too)",
             "unknown": f" (seen on {issue.seen_text()}; whether {architecture} is affected is unknown, so it is "
                        f"reported)"}[arch]
    return Finding(issue.severity, f"known-issue/{issue.id}",
                   f"{issue.title} [{sources}]. {issue.symptom} Affects {issue.affected_text()} "
                   f"({issue.fixed_in()}){confidence}{where}; this config runs "
                   f"{versions.describe(tuple(issue.affected))}", issue.fix)


def _architecture(view: ConfigView) -> str | None:
    value = view.get("target.architecture")
    return value if isinstance(value, str) else None


def known_issue_findings(view: ConfigView | Any, versions: StackVersions | None = None) -> list[Finding]:
    """One finding (rule ``known-issue/<id>``) per catalogued bug whose versions match and whose trigger holds.

    Args:
        view: a :class:`ConfigView` (see :func:`config_view`), or a bare config (then ``target.*`` are absent).
        versions: the versions the config will run with (default: :func:`installed_versions`). A component whose
            version is unknown matches no range.

    Returns:
        Findings in catalogue order; severity, message (the bug, its sources, the affected and the matching versions,
        the symptom) and fix come from the entry. With a target (``target.architecture``), an entry whose
        architectures say ``safe`` for it is skipped; one not seen there but ``affected`` or ``unknown`` is reported
        and says so.
    """
    view = view if isinstance(view, ConfigView) else ConfigView(view)
    versions = versions or installed_versions()
    issues, refs = catalogue()
    arch = _architecture(view)
    return [_finding(issue, versions, arch) for issue in issues
            if issue.affects(versions.versions) and issue.on_architecture(arch) != "safe"
            and holds(issue.trigger, view, refs)]


def assumed_version_findings(view: ConfigView | Any, versions: StackVersions | None = None) -> list[Finding]:
    """Catalogued bugs that an assumed version hides (rule ``known-issue/assumed-version``, warnings).

    Where ``versions`` assume a component instead of reading it (Transformer Engine in the light environment:
    :func:`lcmoe_recipes.catalog.versions.installed_versions`), a bug whose trigger holds for the config but whose
    range misses the assumed version is silent, even when every listed NeMo image (``catalog/containers.yaml``, with
    the overlay of the pinned megatron-core / megatron-bridge that launch adds) is affected -- as TE's fused
    cross-entropy before 2.18 is on every image up to 26.08. One warning per such bug that affects the newest listed
    image names the images it affects and asks for the image the job runs (a bug of older images only is left to
    ``--container-image``).

    Returns:
        [] when nothing is assumed (TE installed, or a listed ``--container-image``'s versions), else one
        :class:`Finding` per bug that holds, is not judged affected for the assumed versions, and affects a listed
        image.
    """
    view = view if isinstance(view, ConfigView) else ConfigView(view)
    versions = versions or installed_versions()
    if not versions.notes:
        return []
    issues, refs = catalogue()
    arch, images = _architecture(view), containers()[0]
    pinned = {c: versions.versions.get(c) for c in OVERLAID}
    out = []
    for issue in issues:
        if not set(issue.affected) & set(versions.notes) or issue.affects(versions.versions) \
                or issue.on_architecture(arch) == "safe" or not holds(issue.trigger, view, refs):
            continue
        hit = [c for c in images if issue.affects({**c.stack, **pinned})]
        if not hit or hit[0] is not images[0]:  # the newest listed image (what a new job would run) is spared
            continue
        assumed = versions.describe(tuple(c for c in issue.affected if c in versions.notes))
        tags = (f"every listed NeMo image ({hit[-1].tag} to {hit[0].tag})" if len(hit) == len(images) else
                "NeMo images " + ", ".join(c.tag for c in hit))
        short = ", ".join(f"{c} {versions.versions.get(c)}" for c in issue.affected if c in versions.notes)
        # "id ... [...]. details": a summary shows it up to the bracket, as it shows a known issue
        out.append(Finding("warning", "known-issue/assumed-version",
                           f"{issue.id} affects {tags} [not judged here: {short} assumed; --container-image IMAGE "
                           f"judges yours]. {issue.title}: it holds for this config and affects "
                           f"{issue.affected_text()}, on nvcr.io/nvidia/nemo {', '.join(c.tag for c in hit)}; this "
                           f"check judged {assumed}",
                           f"name the image the job runs (--container-image IMAGE) to have it judged; on an affected "
                           f"image: {issue.fix}"))
    return out


def catalogue_rows(versions: StackVersions) -> list[tuple[str, str, str, str, str, tuple[str, ...], str, str]]:
    """(id, severity, affected versions, whether ``versions`` are affected: yes / no / unknown, title with its package
    and, for an open report, its confidence, source URLs, architectures (``seen on hopper; blackwell: unknown``),
    stack components it is keyed to with where the job's version comes from) for every entry: what
    ``python -m lcmoe_recipes.check --known-issues`` prints."""
    answer = {True: "yes", False: "no", None: "unknown"}

    def components(issue: KnownIssue) -> str:
        return ", ".join(f"{c} {versions.versions.get(c) or 'unknown'} "
                         f"({'overlaid on an image' if c in OVERLAID else 'the image' + chr(39) + 's'})"
                         for c in issue.affected)

    return [(issue.id, issue.severity, f"{issue.affected_text()} ({issue.fixed_in()})",
             answer[issue.affects(versions.versions)],
             f"{issue.title} [{issue.package}" + (f"; confidence {issue.confidence}" if issue.confidence else "") + "]",
             tuple(s.url for s in issue.sources), issue.architecture_text(), components(issue))
            for issue in catalogue()[0]]


def job_versions(image: str | None, overlay: bool = True):
    """The versions a job on ``image`` runs, for the known issues and megatron-core's TE gates: the image's own,
    or, where the overlay replaces megatron-core / megatron-bridge (a listed image with other versions, unless
    ``overlay`` is False), the pinned ones with the image's Transformer Engine, cuDNN, NCCL, DeepEP and PyTorch
    (``catalog/containers.yaml``; None where the image's version is not published).

    Returns:
        (:class:`lcmoe_recipes.checks.known_issues.StackVersions`, findings): the warning for an unlisted image.
    """
    from importlib import metadata

    versions, notes = stack_versions(image)
    found = find_container(image) if image else None
    pinned = {name: metadata.version(name) for name in ("megatron-core", "megatron-bridge")}
    if not overlay or found is None or all(found.versions.get(n) == v for n, v in pinned.items()):
        return versions, notes
    overlay = " / ".join(f"{n} {v}" for n, v in pinned.items())
    return StackVersions({**versions.versions, **pinned}, f"container {found.image}, {found.release}, with an overlay "
                         f"of {overlay}"), notes
