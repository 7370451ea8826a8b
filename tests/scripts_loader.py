"""Load one of the repository's ``scripts/*.py`` (not a package) as a module, once per test session."""

import importlib.util
from functools import cache
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@cache
def load_script(name: str):
    """The module ``scripts/<name>.py``, executed once."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
