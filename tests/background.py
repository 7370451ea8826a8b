"""One background lane for the session: slow, self-contained command runs that a test will look at later, started as
the session begins so that they use the machine's second core while the in-process tests use the first.

A test module registers what it will need (``register(name, start)``); the session fixture in tests/conftest.py calls
``start(session.items, tmp_path_factory)`` before the first test, which calls each registered ``start`` whose tests are
selected; ``start`` submits work with ``submit`` and returns. The work runs in one thread, in submission order (the doc
examples keep their order), each piece exactly as its test ran it before (same argv, cwd, env); the test then asserts
on ``result(key)``. Nothing here decides what a test checks: the assertions stay in the test.
"""

from __future__ import annotations

import concurrent.futures
import time

_STARTERS: list[tuple[str, object]] = []
_FUTURES: dict[str, concurrent.futures.Future] = {}
_SECONDS: dict[str, float] = {}
_CLEANUPS: list = []
_LANE: concurrent.futures.ThreadPoolExecutor | None = None


def register(name: str, start) -> None:
    """``start(items, tmp_path_factory)`` submits the module's work when its tests are selected (it sees the items)."""
    if name not in {n for n, _ in _STARTERS}:
        _STARTERS.append((name, start))


def start(items, tmp_path_factory) -> None:
    for _, starter in _STARTERS:
        starter(items, tmp_path_factory)


def submit(key: str, fn, *args, **kwargs) -> concurrent.futures.Future:
    """Run ``fn(*args, **kwargs)`` in the lane after everything submitted before it; its future, also ``result(key)``."""
    global _LANE
    if _LANE is None:
        _LANE = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lcmoe-background")

    def timed():
        t0 = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            _SECONDS[key] = time.monotonic() - t0

    _FUTURES[key] = _LANE.submit(timed)
    return _FUTURES[key]


def started(key: str) -> bool:
    return key in _FUTURES


def result(key: str):
    """What the work returned (its exception re-raised, a timeout included), once it is done."""
    return _FUTURES[key].result()


def on_close(fn) -> None:
    _CLEANUPS.append(fn)


def summary() -> str | None:
    if not _SECONDS:
        return None
    groups: dict[str, list[float]] = {}
    for key, seconds in _SECONDS.items():
        groups.setdefault(key.split("::")[0], []).append(seconds)
    parts = [f"{name} {sum(s):.0f} s ({len(s)} run(s))" for name, s in groups.items()]
    return "background lane (tests/background.py): " + ", ".join(parts)


def close() -> None:
    """Drop what has not started; stop what runs (the cleanups kill its processes) and wait for the thread."""
    global _LANE
    if _LANE is not None:
        _LANE.shutdown(wait=False, cancel_futures=True)
    while _CLEANUPS:
        _CLEANUPS.pop()()
    if _LANE is not None:
        _LANE.shutdown(wait=True)
        _LANE = None
