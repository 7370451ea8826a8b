"""Loading the Megatron stack: the one place that imports megatron.bridge for config building.

Two environments are served (see docs/install.md):

* **full** -- Transformer Engine (TE) is installed (the cluster container, or ``scripts/setup.sh --with-te``).
  Nothing here changes anything: megatron-bridge is imported as it is.
* **light** -- TE is absent (laptops, login nodes, CI). ``import megatron.bridge`` imports every model bridge,
  and exactly one module on that chain, ``megatron/bridge/peft/lora_layers.py`` (megatron-bridge 0.6.2, line 20),
  does ``import transformer_engine.pytorch as te`` without the ``HAVE_TE`` guard that every other TE import in
  megatron-bridge has. :class:`_LoraLayersWithoutTE` loads *that one module* with *that one line* answered by
  :class:`_AbsentTE`, and only when ``transformer_engine`` cannot be found. Every other TE import still raises
  ``ModuleNotFoundError``, so megatron-core keeps ``HAVE_TE = False``. LoRA layers (which we never build) raise
  a clear error if instantiated.

Importing megatron-bridge takes 25-40 s on a 2-core machine (measured 2026-11-30); :func:`load_bridge` tells the
user on stderr while it loads.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import threading
import time
import warnings
from types import ModuleType

_GUARDED_MODULE = "megatron.bridge.peft.lora_layers"
_UNGUARDED_IMPORT = "import transformer_engine.pytorch as te\n"


def te_installed() -> bool:
    """True when Transformer Engine's PyTorch extension can be found (the *full* environment)."""
    return importlib.util.find_spec("transformer_engine") is not None


class _AbsentTEMeta(type):
    def __getattr__(cls, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return cls  # te.ops.Sequential, te.Linear, ... all resolve to the placeholder class


class _AbsentTE(metaclass=_AbsentTEMeta):
    """Stands for ``transformer_engine.pytorch`` inside lora_layers.py only, when TE is absent.

    Attribute chains (``te.ops.Sequential``) resolve to this class, so that module's annotations and
    ``isinstance`` checks evaluate (nothing is ever an instance of it); building one raises.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise ModuleNotFoundError(
            "Transformer Engine is not installed here (light environment); LoRA layers need it. "
            "Install it with `scripts/setup.sh --with-te` or run in the cluster container."
        )


class _LoraLayersWithoutTE(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Meta-path finder for exactly ``megatron.bridge.peft.lora_layers``, active only without TE."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D401 - importlib protocol
        if fullname != _GUARDED_MODULE or te_installed():
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None:
            return None
        return importlib.util.spec_from_file_location(fullname, spec.origin, loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module: ModuleType) -> None:
        with open(module.__spec__.origin, encoding="utf-8") as handle:
            source = handle.read()
        if source.count(_UNGUARDED_IMPORT) != 1:
            raise ImportError(
                f"{_GUARDED_MODULE} no longer has exactly one unguarded TE import; the light-environment "
                "guard in lcmoe_recipes.emit.stack was written for megatron-bridge 0.6.2. Install TE "
                "(scripts/setup.sh --with-te) or update the guard."
            )
        module.__dict__["_LcmoeAbsentTE"] = _AbsentTE
        source = source.replace(_UNGUARDED_IMPORT, "te = _LcmoeAbsentTE\n")
        exec(compile(source, module.__spec__.origin, "exec"), module.__dict__)


_GUARD = _LoraLayersWithoutTE()


def install_te_guard() -> None:
    """Put the lora_layers guard on ``sys.meta_path`` (idempotent; inert when TE is installed)."""
    if _GUARD not in sys.meta_path:
        sys.meta_path.insert(0, _GUARD)


class _Progress:
    """Prints 'Loading ... (N s)' on stderr while a slow import runs; a no-op line when not a TTY."""

    def __init__(self, what: str, quiet: bool = False) -> None:
        self.what, self.quiet = what, quiet
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.seconds = 0.0

    def __enter__(self) -> "_Progress":
        self._t0 = time.monotonic()
        if not self.quiet:
            if sys.stderr.isatty():
                self._thread = threading.Thread(target=self._tick, daemon=True)
                self._thread.start()
            else:
                print(f"{self.what} (10-40 s) ...", file=sys.stderr, flush=True)
        return self

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            elapsed = time.monotonic() - self._t0
            print(f"\r{self.what} ... {elapsed:4.0f} s", end="", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self._t0
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            print("\r", end="", file=sys.stderr)
        if not self.quiet:  # on a TTY the ticking line above is overwritten; elsewhere "(10-40 s) ..." precedes
            print(f"{self.what}: done in {self.seconds:.0f} s" if self._thread is not None
                  else f"... done in {self.seconds:.0f} s", file=sys.stderr, flush=True)


STACK_PACKAGES = {"megatron_core": "megatron-core", "megatron_bridge": "megatron-bridge"}


def installed_stack() -> dict[str, str | None]:
    """Installed versions of megatron-core and megatron-bridge (distribution metadata; nothing is imported), keyed
    as in a YAML header (``megatron_core``, ``megatron_bridge``); None for one that is not installed."""
    from ..catalog.versions import installed_versions

    found = installed_versions().versions
    return {key: found[dist] for key, dist in STACK_PACKAGES.items()}


_loaded = False
_announce = False


def announce_loading() -> None:
    """Have the first :func:`load_bridge` print its progress line even where the caller asked for quiet: the
    commands call this, so a user waiting 10-40 s for ``check``, ``launch --from`` or a Slurm dry run is told why
    (the Python API stays quiet unless asked)."""
    global _announce
    _announce = True


def load_bridge(quiet: bool = False) -> None:
    """Import megatron-bridge's config machinery once, with the light-environment guard and a progress line (on
    stderr; not when ``quiet``, unless a command called :func:`announce_loading`).

    Raises:
        ModuleNotFoundError: megatron-bridge / megatron-core are not installed (run ``scripts/setup.sh``).
    """
    global _loaded
    if _loaded:
        return
    install_te_guard()
    mode = "full, with Transformer Engine" if te_installed() else "light, no Transformer Engine"
    with _Progress(f"Loading Megatron-Bridge ({mode})", quiet=quiet and not _announce), quiet_upstream():
        import megatron.bridge.training.config  # noqa: F401
    _loaded = True


@contextlib.contextmanager
def quiet_upstream(level: int = logging.WARNING):
    """Silence upstream log records up to ``level`` and Python warnings for the duration.

    Used while megatron-bridge imports (a page of "TE/Apex not installed" notices that say nothing about the
    target) and while upstream validation runs on a throw-away copy of the config (its notices describe that
    copy on this machine, e.g. "gradient_accumulation_fusion ... disabled"). Errors still raise.
    """
    previous = logging.root.manager.disable
    logging.disable(level)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def use_prebuilt_dataset_helpers() -> str:
    """Let megatron-bridge start where megatron-core came from its wheel: return a line saying what was done ("" when
    nothing needed doing).

    megatron-bridge 0.6.2's ``initialize_megatron`` (``training/initialize.py``) runs megatron-core's
    ``compile_helpers`` on local rank 0 of every node, which runs ``make -C megatron/core/datasets`` and exits the
    process when make fails. The megatron-core 0.19.2 wheel (PyPI, manylinux x86_64) ships that folder's built
    extension (``helpers_cpp.cpython-312-x86_64-linux-gnu.so``) and ``helpers.cpp`` but no Makefile, so a pip
    installation stops there ("make: *** No targets specified and no makefile found"; seen on an H200, 2026-12-04).
    NVIDIA's containers install megatron-core from source, with the Makefile, and are not touched.

    Where the Makefile is absent and the built extension imports, megatron-bridge's reference to
    ``compile_helpers`` is replaced by a function that imports that extension: the build it skips has nothing to
    build. Call it before ``pretrain``.

    Raises:
        LcmoeError: no Makefile and no built extension that imports (nothing could load the dataset index).
    """
    import importlib
    import os

    import megatron.core.datasets as datasets

    folder = os.path.dirname(datasets.__file__)
    if os.path.exists(os.path.join(folder, "Makefile")):
        return ""
    from ..errors import LcmoeError

    try:
        importlib.import_module("megatron.core.datasets.helpers_cpp")
    except ImportError as exc:
        raise LcmoeError(f"megatron-core at {folder} has neither the Makefile megatron-bridge's start-up runs nor a "
                         f"built dataset-helper extension that imports ({exc})",
                         "install megatron-core from its source (the Makefile comes with it), or use its wheel for "
                         "this Python (it carries the built extension), or run in NVIDIA's NeMo container") from exc
    import megatron.bridge.training.initialize as initialize

    def compile_helpers() -> None:  # what megatron-core's would leave: the extension, importable
        importlib.import_module("megatron.core.datasets.helpers_cpp")

    initialize.compile_helpers = compile_helpers
    return (f"megatron-core's dataset helpers are prebuilt ({folder} has the extension, no Makefile): "
            "megatron-bridge's start-up build is skipped")
