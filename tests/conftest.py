"""Shared fixtures. Building ConfigContainers loads megatron-bridge once per session (~15-40 s)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the suite may reach a hub

_ZYGOTE = None
_ZYGOTE_TESTS: set[str] = set()  # node ids of the selected tests that use it, not yet run


def _zygote():
    global _ZYGOTE
    if _ZYGOTE is None:
        from zygote import Zygote  # tests/zygote.py (pytest puts tests/ on sys.path)

        _ZYGOTE = Zygote()
    return _ZYGOTE


def pytest_collection_finish(session):
    if not session.config.option.collectonly:
        _ZYGOTE_TESTS.update(item.nodeid for item in session.items if "zygote" in getattr(item, "fixturenames", ()))


def pytest_runtest_logfinish(nodeid, location):
    """After each test, while a selected test still needs the fork server: start one for the session's env now, in
    the background (it imports megatron-bridge while other tests run), unless one already serves that env. Not
    before the first test: that one may change the env the commands inherit (the session's first megatron import
    sets TORCHINDUCTOR_CACHE_DIR), which a server started earlier would not have seen."""
    _ZYGOTE_TESTS.discard(nodeid)
    if _ZYGOTE_TESTS:
        _zygote().prepare()


def pytest_terminal_summary(terminalreporter):
    if _ZYGOTE is not None and (_ZYGOTE.forked or _ZYGOTE.fallbacks):
        terminalreporter.write_line(_ZYGOTE.summary(verbose=terminalreporter.config.option.verbose > 0))


def pytest_unconfigure(config):
    if _ZYGOTE is not None:
        _ZYGOTE.close()


@pytest.fixture(scope="session")
def zygote():
    """A fork server that runs `python -m ...` / `python -c ...` / `python script.py` commands as a fresh interpreter
    would, from one process that imported megatron-bridge once (tests/zygote.py); `zygote.run(argv, cwd=, env=,
    timeout=)` answers like subprocess.run(..., capture_output=True, text=True)."""
    return _zygote()

# Tests import megatron.bridge directly too: the light environment's import guard goes first, as our own loader
# (lcmoe_recipes.emit.stack.load_bridge) puts it; importing lcmoe_recipes no longer does.
from lcmoe_recipes.emit.stack import install_te_guard  # noqa: E402

install_te_guard()


@pytest.fixture(scope="session")
def configs():
    """name -> (Plan, ConfigContainer) for every named recipe, each validated for its target."""
    from lcmoe_recipes import NAMED_RECIPES, recipe_plan
    from lcmoe_recipes.emit import config_from_plan

    out = {}
    for name in NAMED_RECIPES:
        plan = recipe_plan(name)
        out[name] = (plan, config_from_plan(plan, quiet=True))
    return out


@pytest.fixture
def fresh_config(configs):
    """A deep copy of one named recipe's ConfigContainer, safe to modify: fresh_config('dsv3_128k_h100')."""
    import copy

    def make(name):
        plan, cfg = configs[name]
        return plan, copy.deepcopy(cfg)

    return make


@pytest.fixture
def nemorun_home():
    """NeMo-Run's home in a fresh folder under the repository's out/ (its experiments, scripts and logs go there),
    removed afterwards. Not under /tmp: a multi-node job folder there is refused (node-local), so a checkout that
    itself lies under a node-local prefix (a CI clone in /tmp) uses a folder under the home directory instead. The
    name avoids '/nemo_run', which NeMo-Run 0.11.1 rewrites in jobs without a container."""
    import shutil
    import tempfile
    from pathlib import Path

    from nemo_run import config

    from lcmoe_recipes.jobs.job_checks import NODE_LOCAL_PREFIXES

    base = Path(__file__).resolve().parent.parent / "out"
    if any(str(base) == p or str(base).startswith(p + "/") for p in NODE_LOCAL_PREFIXES):
        base = Path.home() / ".cache" / "lcmoe-recipes-tests"
    base.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="test-nemorun-", dir=base))
    old = config.get_nemorun_home()
    config.set_nemorun_home(str(home))
    yield home
    config.set_nemorun_home(old)
    shutil.rmtree(home, ignore_errors=True)
