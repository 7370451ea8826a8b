"""An overlay of the pinned megatron-core / megatron-bridge for a job whose image holds other versions.

Our configs are built and validated with megatron-core 0.19.2 and megatron-bridge 0.6.2, and the entry script refuses
to run under other versions (:func:`lcmoe_recipes.jobs.node.check_versions`). No NeMo Framework image ships that pair
(``catalog/containers.yaml``: 26.08 has 0.19.0 / 0.6.0, 26.06 has 0.18.0 / 0.5.0). An *overlay* closes the gap
without a new image: on the login node, the pinned wheels are installed for the nodes' platform (``pip install
--target``, the compute nodes need no package registry) into a folder of the job folder (shared storage), and the
entry script puts that folder first on the import path before its version check (:func:`activate`).

What goes in (:func:`plan_overlay`): megatron-core and megatron-bridge at the versions installed here, and every
other distribution of their import chain whose version the image may not satisfy. The import chain is the closure
of their ``Requires-Dist`` over the distributions installed here (the light environment installs exactly what that
chain reaches: requirements/light.txt); for each distribution of it, the image's own megatron-core / megatron-bridge
``Requires-Dist`` (read from the package registry's metadata for the image's versions) tell what the image holds:

* a distribution the image's requirements do not reach: it goes in (a new dependency);
* one the pinned and the image's releases both require directly: it goes in when the image's range is not inside
  the pinned one (``hydra-core``: megatron-bridge 0.6.2 needs ``<1.4,>=1.3.4``, 0.5.0 allowed ``<=1.3.2,>1.3``);
* otherwise the image's own copy is kept (its version satisfied the image's release, whose range the pinned
  release accepts).

The image's GPU stack (torch, triton, Transformer Engine, CUDA libraries: :data:`IMAGE_OWNED`) never goes in; its
minimums are checked instead, and an image that cannot take the overlay is refused with the reason and the nearest
listed image that can (:class:`OverlayRefused`):

* Python: megatron-bridge 0.6.2 declares ``Requires-Python: <3.13,>=3.12``, megatron-core 0.19.2 ``>=3.12``, and
  megatron-core's wheel is built for one CPython ABI (``cp312``; its ``WHEEL`` tag);
* PyTorch: both declare ``torch>=2.6.0`` (``Requires-Dist``);
* Transformer Engine: neither declares a version (their ``te`` extra names none); what a config needs of TE is
  checked by megatron-core's own validation run with the image's TE version (its ``is_te_min_version`` gates:
  :func:`lcmoe_recipes.emit.validate_config` with ``versions``), and the known issues are judged for the image's TE
  (:func:`lcmoe_recipes.checks.known_issues.job_versions`).

Every number above is read from the installed packages' metadata at run time, not copied here. This package itself
travels in NeMo-Run's code archive (the ranks' working folder), so it is not in the overlay.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from ..catalog.known_issues import COMPONENTS, Container, containers
from ..errors import LcmoeError

PINNED = ("megatron-core", "megatron-bridge")
IMAGE_OWNED = re.compile(r"^(torch|triton|pytorch-triton|transformer-engine.*|nvidia-.*|cuda-.*)$")
"""Distributions an overlay never replaces: the image's CUDA build of PyTorch and what is built against it."""
MANIFEST = "lcmoe-overlay.json"
MOUNT_POINT = "/lcmoe_overlay"  # where a container job sees the overlay (a read-only mount)
ENV_VAR = "LCMOE_OVERLAY"       # the overlay folder, as the job sees it; read by :func:`activate`


class OverlayRefused(LcmoeError):
    """An image that cannot take the overlay (another Python, a PyTorch below the pinned releases' minimum)."""


@dataclass(frozen=True)
class JobStack:
    """The Python stack where a job runs.

    Attributes:
        where: the image (``nvcr.io/nvidia/nemo:26.06, NeMo Framework 26.06``) or the interpreter's path.
        python: ``3.12``, or None when unknown.
        platform: the nodes' ``platform.machine()``: ``x86_64`` or ``aarch64``.
        versions: ``megatron-core``, ``megatron-bridge``, ``transformer-engine``, ``torch`` -> version or None.
        container: the catalogue entry, for an image.
        installed: every distribution -> version, for a probed interpreter (exact); None for an image.
    """

    where: str
    python: str | None
    platform: str
    versions: dict[str, str | None]
    container: Container | None = None
    installed: dict[str, str] | None = None


def container_stack(container: Container, platform: str) -> JobStack:
    """The stack of a listed image on nodes of ``platform`` (:attr:`lcmoe_recipes.catalog.Hardware.cpu_arch`)."""
    return JobStack(f"{container.image}, {container.release}", container.python, platform,
                    {**container.versions, "torch": container.pytorch}, container=container)


def probe_stack(python: str) -> JobStack:
    """The stack of the interpreter ``python`` (a path the nodes share), read by running it here.

    Raises:
        LcmoeError: it does not run.
    """
    code = ("import importlib.metadata as m, json, platform, sys;"
            "print(json.dumps({'python': '%d.%d' % sys.version_info[:2], 'platform': platform.machine(),"
            "'installed': {d.metadata['Name']: d.version for d in m.distributions() if d.metadata['Name']}}))")
    try:
        out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise LcmoeError(f"cannot run the job's Python '{python}' here to read its packages ({exc})",
                         "give the path of a Python this machine and the nodes share") from None
    found = json.loads(out.stdout)
    installed = {canonicalize_name(k): v for k, v in found["installed"].items()}
    versions = {c: installed.get(c) for c in (*COMPONENTS, "torch")}
    return JobStack(python, found["python"], found["platform"], versions, installed=installed)


@dataclass(frozen=True)
class OverlayPackage:
    """One distribution the overlay holds, at ``version``, and why."""

    name: str
    version: str
    reason: str


@dataclass(frozen=True)
class Overlay:
    """What an overlay for ``stack`` holds.

    Attributes:
        packages: the distributions, megatron-core and megatron-bridge first.
        python: the CPython version its wheels are for (this interpreter's, ``3.12``).
        warnings: what could not be checked (an image whose Python or PyTorch is not published).
    """

    stack: JobStack
    packages: tuple[OverlayPackage, ...]
    python: str
    warnings: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """12 hex digits naming the content (platform, Python, packages): an overlay is built once per key."""
        text = json.dumps([self.stack.platform, self.python, [(p.name, p.version) for p in self.packages]])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def estimated_bytes(self) -> int:
        """Bytes of its files as installed here (the same versions; compiled parts are for this machine's platform),
        from each distribution's ``RECORD``."""
        total = 0
        for package in self.packages:
            for item in metadata.distribution(package.name).files or ():
                total += item.size or 0
        return total

    def summary(self) -> str:
        """``megatron-core 0.19.2, megatron-bridge 0.6.2, hydra-core 1.3.8`` ..."""
        return ", ".join(f"{p.name} {p.version}" for p in self.packages)


def _requirements(texts, extras: tuple[str, ...] = ()) -> list[Requirement]:
    """The requirements of ``texts`` (``Requires-Dist`` lines) that apply with ``extras`` on this platform."""
    out = []
    for text in texts or ():
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (extras or ("",))):
            out.append(req)
    return out


def _installed() -> dict[str, metadata.Distribution]:
    return {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions() if d.metadata["Name"]}


def _roots(requires: dict[str, list[str]]) -> list[tuple[str, tuple[str, ...]]]:
    """(name, extras) to start a closure from: megatron-bridge, and megatron-core with the extras megatron-bridge
    asks of it (``megatron-core[dev,mlm]``)."""
    extras = {canonicalize_name(r.name): tuple(sorted(r.extras)) for r in _requirements(requires["megatron-bridge"])}
    return [("megatron-bridge", ()), ("megatron-core", extras.get("megatron-core", ()))]


def _direct(requires: dict[str, list[str]]) -> dict[str, SpecifierSet]:
    """name -> the intersection of what megatron-bridge and megatron-core (with its extras) declare for it."""
    out: dict[str, SpecifierSet] = {}
    for name, extras in _roots(requires):
        for req in _requirements(requires[name], extras):
            key = canonicalize_name(req.name)
            out[key] = out.get(key, SpecifierSet()) & req.specifier
    return out


def _closure(roots, installed: dict[str, metadata.Distribution]) -> set[str]:
    """Distributions installed here that ``roots`` reach through ``Requires-Dist``."""
    seen: dict[str, set[str]] = {}
    stack = list(roots)
    while stack:
        name, extras = stack.pop()
        name = canonicalize_name(name)
        if name not in installed or (name in seen and set(extras) <= seen[name]):
            continue
        seen.setdefault(name, set()).update(extras)
        for req in _requirements(installed[name].requires, tuple(extras)):
            stack.append((req.name, tuple(req.extras)))
    return set(seen)


def _points(*specs: SpecifierSet) -> list[Version]:
    """Versions that tell whether one range lies inside another: every bound named, and its neighbours."""
    out = {Version("0"), Version("99999")}
    for spec in specs:
        for s in spec:
            v = Version(s.version.replace(".*", ".0"))
            parts = [*v.release, 0, 0][:3]
            out |= {v, Version(f"{v.base_version}.post1"), Version(f"{v.base_version}.dev0")}
            for i in range(3):
                bumped = parts[:i] + [parts[i] + 1] + [0] * (2 - i)
                out.add(Version(".".join(map(str, bumped))))
                if parts[i] > 0:
                    out.add(Version(".".join(map(str, parts[:i] + [parts[i] - 1] + [99] * (2 - i)))))
    return sorted(out)


def range_inside(inner: SpecifierSet, outer: SpecifierSet) -> bool:
    """Whether every version ``inner`` accepts is accepted by ``outer``, judged on the bounds both name and their
    neighbours (``>1.3,<=1.3.2`` is not inside ``>=1.3.4,<1.4``; ``>=5.8.1,<5.9.0`` is inside ``>=5.8,<=5.12.1``)."""
    return all(outer.contains(p, prereleases=True) for p in _points(inner, outer) if inner.contains(p, prereleases=True))


def pinned_requires() -> dict[str, list[str]]:
    """``Requires-Dist`` of the installed megatron-core and megatron-bridge."""
    return {name: metadata.distribution(name).requires or [] for name in PINNED}


class NotOnRegistry(LcmoeError):
    """The package registry has no such release (megatron-bridge 0.2.0 of NeMo 25.11 was never published there)."""


@functools.cache
def registry_requires(versions: tuple[tuple[str, str], ...], platform: str) -> dict[str, list[str]]:
    """``Requires-Dist`` of megatron-core and megatron-bridge at ``versions`` (``(("megatron-core", "0.18.0"),
    ...)``), from the package registry's metadata (``pip install --dry-run --report``: only the metadata files are
    fetched where the registry serves them).

    Raises:
        NotOnRegistry: a release the registry does not have.
        LcmoeError: pip cannot reach the registry.
    """
    wanted = [f"{name}=={version}" for name, version in versions]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--no-deps",
                               "--ignore-installed", "--disable-pip-version-check", "--report", str(report),
                               "--target", str(Path(tmp) / "t"), *pip_platform_args(platform, "3.12"), *wanted],
                              capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            if "No matching distribution found" in last:
                raise NotOnRegistry(f"{last.rsplit(' ', 1)[-1].replace('==', ' ')} is not on the package registry, "
                                    "so its requirements cannot be read", "")
            raise LcmoeError(f"cannot read the requirements of {' and '.join(wanted)} from the package registry "
                             f"(pip: {last}): they tell what the image lacks",
                             "run where pip reaches the registry (the login node), or set PIP_INDEX_URL to a mirror")
        found = json.loads(report.read_text())
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"].get("requires_dist", []) for i in found["install"]}


def _image_requires(container: Container, platform: str) -> dict[str, list[str]]:
    return registry_requires(tuple((n, container.versions[n]) for n in PINNED), platform)


def pip_platform_args(platform: str, python: str) -> list[str]:
    """pip's options for wheels that run on ``platform`` (``x86_64``/``aarch64``) with CPython ``python``: manylinux
    glibc 2.17 to 2.39 (Ubuntu 24.04's, the NeMo images' base), the CPython ABI, ``abi3`` and pure Python."""
    tags = [f"manylinux_2_{minor}_{platform}" for minor in range(39, 16, -1)] + [f"manylinux2014_{platform}"]
    abi = "cp" + python.replace(".", "")
    out = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp", "--abi", abi,
           "--abi", "abi3", "--abi", "none"]
    for tag in tags:
        out += ["--platform", tag]
    return out


def minimums() -> dict[str, tuple[SpecifierSet, str]]:
    """What the installed megatron-core and megatron-bridge declare of the image's own stack:
    ``python`` and ``torch`` -> (range, where it is declared)."""
    python, torch, where_py, where_torch = SpecifierSet(), SpecifierSet(), [], []
    for name in PINNED:
        dist = metadata.distribution(name)
        if spec := dist.metadata.get("Requires-Python"):
            python &= SpecifierSet(spec)
            where_py.append(f"{name} {dist.version} Requires-Python {spec}")
        for req in _requirements(dist.requires):
            if canonicalize_name(req.name) == "torch" and req.specifier:
                torch &= req.specifier
                where_torch.append(f"{name} {dist.version} Requires-Dist torch{req.specifier}")
    return {"python": (python, "; ".join(where_py)), "torch": (torch, "; ".join(where_torch))}


def wheel_python() -> str:
    """The CPython version the installed megatron-core wheel is built for (``3.12`` from its ``WHEEL`` tag
    ``cp312-cp312-manylinux...``): the overlay's compiled part needs exactly that interpreter."""
    text = metadata.distribution("megatron-core").read_text("WHEEL") or ""
    tags = re.findall(r"^Tag: cp(\d)(\d+)-", text, flags=re.M)
    return f"{tags[0][0]}.{tags[0][1]}" if tags else "%d.%d" % sys.version_info[:2]


def _refusal(stack: JobStack) -> tuple[str, str] | None:
    """(what is wrong, the rule) when ``stack``'s Python or PyTorch cannot take the overlay, else None."""
    need = minimums()
    python = stack.python
    abi = wheel_python()
    if python is not None and (python != abi or not need["python"][0].contains(f"{python}.0")):
        return (f"{stack.where} runs Python {python}; the overlay's megatron-core wheel is built for CPython {abi} "
                f"(its WHEEL tag) and {need['python'][1]}", f"Python {abi}")
    torch = stack.versions.get("torch")
    if torch is not None and not need["torch"][0].contains(Version(torch), prereleases=True):
        return f"{stack.where} has PyTorch {torch}; {need['torch'][1]}", f"PyTorch{need['torch'][0]}"
    return None


def image_overlay(image: str, platform: str) -> Overlay | None:
    """The overlay a job on the listed ``image`` needs on nodes of ``platform`` (None: an unlisted image, whose
    versions the entry script checks, or one that holds the pinned versions already).

    Raises:
        OverlayRefused: the image cannot take one (the reason, and the nearest listed image that can).
        LcmoeError: the package registry cannot be read.
    """
    from ..catalog.known_issues import find_container

    found = find_container(image)
    return plan_overlay(container_stack(found, platform)) if found else None


def nearest_image(container: Container, works) -> Container | None:
    """The listed image nearest to ``container`` (newer ones first, then older) for which ``works(image)`` holds."""
    listed = list(containers()[0])
    at = next((i for i, c in enumerate(listed) if c.image == container.image), 0)
    for candidate in [*reversed(listed[:at]), *listed[at + 1:]]:
        if works(candidate):
            return candidate
    return None


def _readable(container: Container, platform: str) -> bool:
    try:
        _image_requires(container, platform)
    except NotOnRegistry:
        return False
    return all(container.versions.get(n) for n in PINNED) and container.python is not None


def plan_overlay(stack: JobStack, image_requires: dict[str, list[str]] | None = None) -> Overlay | None:
    """The overlay ``stack`` needs to run our configs, or None when it already holds the pinned megatron-core and
    megatron-bridge. See the module doc for what goes in and why.

    Args:
        image_requires: ``Requires-Dist`` of the image's megatron-core / megatron-bridge (default: read from the
            package registry for the image's versions, :func:`registry_requires`); unused for a probed interpreter,
            whose installed versions are known exactly.

    Raises:
        OverlayRefused: another Python ABI, or a PyTorch below the pinned releases' minimum (names the nearest
            listed image that works).
        LcmoeError: the image's megatron-core / megatron-bridge version is unknown, or the registry cannot be read.
    """
    pinned = {name: metadata.version(name) for name in PINNED}
    if all(stack.versions.get(n) == v for n, v in pinned.items()):
        return None
    if refused := _refusal(stack):
        message, rule = refused
        near = nearest_image(stack.container, lambda c: c.python is not None and
                             _refusal(container_stack(c, stack.platform)) is None) if stack.container else None
        fix = (f"use {near.image} ({near.release}), the nearest listed image with {rule}" if near else
               f"use an image with {rule}")
        raise OverlayRefused(f"{message}: it cannot take an overlay of megatron-core {pinned['megatron-core']} / "
                             f"megatron-bridge {pinned['megatron-bridge']}", fix)
    installed = _installed()
    requires = pinned_requires()
    chain = _closure(_roots(requires), installed)
    need = _direct(requires)
    warnings = []
    if stack.installed is None:
        missing = [c for c in PINNED if not stack.versions.get(c)]
        if missing:
            raise LcmoeError(f"the {' and '.join(missing)} version of {stack.where} is not published, so what an "
                             "overlay must replace is unknown", "use an image whose versions are listed "
                             "(python -m lcmoe_recipes.check --containers)")
        if image_requires is None:
            try:
                image_requires = _image_requires(stack.container, stack.platform)
            except NotOnRegistry as exc:
                near = nearest_image(stack.container, lambda c: _readable(c, stack.platform))
                raise OverlayRefused(f"{exc.message}: what {stack.where} lacks cannot be told, so no overlay is "
                                     "planned for it", f"use {near.image} ({near.release}), the nearest listed image "
                                     "an overlay can be planned for" if near else "use a newer image") from None
        image_has = _closure(_roots(image_requires), installed) | _closure([("torch", ())], installed)
        image_need = _direct(image_requires)
        for what, key in (("Python", "python"), ("PyTorch", "torch")):
            value = stack.python if key == "python" else stack.versions.get("torch")
            if value is None:
                warnings.append(f"{stack.where}: its {what} version is not published, so the overlay's need of "
                                f"{minimums()[key][1]} is not checked here: run the job with --smoke first (it "
                                "imports the overlay inside the image)")
    packages = []
    for name in sorted(chain, key=lambda n: (n not in PINNED, PINNED.index(n) if n in PINNED else 0, n)):
        if IMAGE_OWNED.match(name):
            continue
        version = installed[name].version
        if name in PINNED:
            if stack.versions.get(name) != version:
                packages.append(OverlayPackage(name, version, f"pinned; {stack.where} has "
                                                              f"{stack.versions.get(name) or 'none'}"))
            continue
        spec = need.get(name, SpecifierSet())
        if stack.installed is not None:
            there = stack.installed.get(name)
            if there is None:
                packages.append(OverlayPackage(name, version, "on the import chain, not installed there"))
            elif not spec.contains(Version(there), prereleases=True):
                packages.append(OverlayPackage(name, version, f"the pinned releases need {name}{spec}; it has "
                                                              f"{there}"))
        elif name not in image_has:
            packages.append(OverlayPackage(name, version, "on the pinned releases' import chain; the image's "
                                                          "releases do not require it"))
        elif name in need and name in image_need and not range_inside(image_need[name], spec):
            packages.append(OverlayPackage(name, version, f"the pinned releases need {name}{spec}; the image's "
                                                          f"allowed {name}{image_need[name]}"))
    return Overlay(stack, tuple(packages), wheel_python(), tuple(warnings))


@dataclass
class InstalledOverlay:
    """An overlay folder: ``path`` (here), its size in bytes, and its manifest."""

    path: Path
    bytes: int
    manifest: dict = field(default_factory=dict)


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def install(overlay: Overlay, dest: str | os.PathLike) -> InstalledOverlay:
    """Install ``overlay``'s wheels for its platform into ``dest/<key>`` (reused when already complete): ``pip
    install --no-deps --target`` with the nodes' platform and Python, then the manifest :data:`MANIFEST` (Python,
    platform, packages and why) written last, so a folder with a manifest is complete.

    Raises:
        LcmoeError: pip cannot fetch a wheel for that platform (its last line, and the fix).
    """
    folder = Path(dest) / overlay.key
    if (folder / MANIFEST).is_file():
        return InstalledOverlay(folder, folder_bytes(folder), json.loads((folder / MANIFEST).read_text()))
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{overlay.key}-", dir=folder.parent))
    try:
        wanted = [f"{p.name}=={p.version}" for p in overlay.packages]
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                               "--disable-pip-version-check", "--target", str(staging),
                               *pip_platform_args(overlay.stack.platform, overlay.python), *wanted],
                              capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise LcmoeError(f"building the overlay ({overlay.summary()}) for {overlay.stack.platform} failed: {last}",
                             "run launch where pip reaches the package registry (the login node)")
        manifest = {"python": overlay.python, "platform": overlay.stack.platform, "built_for": overlay.stack.where,
                    "packages": [{"name": p.name, "version": p.version, "reason": p.reason}
                                 for p in overlay.packages]}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return InstalledOverlay(folder, folder_bytes(folder), json.loads((folder / MANIFEST).read_text()))


@dataclass(frozen=True)
class StackRow:
    """One line of an image's stack beside what our configs need: component, the image's version, the need, and
    the verdict (``same``, ``overlay``, ``ok``, ``refused``, ``unknown``, ``image's``)."""

    component: str
    image: str
    need: str
    verdict: str


def compare_stack(image: str, platform: str = "x86_64") -> list[StackRow]:
    """``image``'s stack beside the target's (what ``launch`` / ``check --container-image`` show): Python and
    PyTorch against the pinned releases' declared minimums, Transformer Engine (the image's is kept: configs are
    checked for it), megatron-core and megatron-bridge against the pinned versions (an overlay where they differ),
    and the overlay :func:`plan_overlay` plans (its packages and size) or its refusal. An unlisted image: every
    version ``unknown``.

    Raises:
        LcmoeError: the package registry cannot be read (see :func:`registry_requires`).
    """
    from ..catalog.known_issues import find_container
    from ..checks.known_issues import installed_versions

    found = find_container(image)
    need = minimums()
    pinned = {name: metadata.version(name) for name in PINNED}
    te_here = installed_versions().versions["transformer-engine"]
    if found is None:
        return [StackRow(c, "unknown", want, "unknown") for c, want in
                (("python", str(need["python"][0])), ("pytorch", str(need["torch"][0])),
                 ("transformer-engine", f"validated here with {te_here}"), *pinned.items())]
    stack = container_stack(found, platform)
    rows = []
    for component, value, spec in (("python", found.python, need["python"][0]),
                                   ("pytorch", found.pytorch, need["torch"][0])):
        ok = value is not None and spec.contains(Version(value if component == "pytorch" else f"{value}.0"),
                                                 prereleases=True) and (component != "python" or value == wheel_python())
        rows.append(StackRow(component, value or "unknown", str(spec), "unknown" if value is None else
                             "ok" if ok else "refused"))
    rows.append(StackRow("transformer-engine", found.versions["transformer-engine"] or "unknown",
                         f"validated here with {te_here}", "image's: configs are checked for it"))
    for name, version in pinned.items():
        have = stack.versions.get(name)
        rows.append(StackRow(name, have or "unknown", version, "same" if have == version else "overlay"))
    try:
        planned = plan_overlay(stack)
    except OverlayRefused as exc:
        return rows + [StackRow("overlay", "", "", f"refused: {exc.message}; {exc.fix}")]
    if planned is not None:
        rows.append(StackRow("overlay", "", "", f"{len(planned.packages)} packages, ~"
                             f"{planned.estimated_bytes() / 2**20:.0f} MiB: {planned.summary()}"))
    return rows


def format_stack(image: str, rows: list[StackRow]) -> str:
    """The rows of :func:`compare_stack` as an aligned table headed by the image."""
    lines = [f"stack of {image} beside the target's:", f"  {'component':<19} {'image':<28} {'needed':<26} verdict"]
    lines += [f"  {r.component:<19} {r.image:<28} {r.need:<26} {r.verdict}" for r in rows]
    return "\n".join(lines)


