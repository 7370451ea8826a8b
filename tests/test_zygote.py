"""The fork server (tests/zygote.py) that the doc examples and the CLI's end-to-end tests run through: a command run
there sees what it would see as a fresh `python ...` process -- argv, sys.path[0], cwd, env, __main__, exit status,
stdout/stderr, atexit, a fresh lcmoe_recipes -- each command in its own state; timeouts kill it; what it cannot
run as a fresh interpreter would runs as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # the server imports megatron-bridge once (shared with the rest of the session)

PROBE = textwrap.dedent("""
    import json, os, sys
    main = sys.modules["__main__"]
    print(json.dumps({"argv": sys.argv, "orig_argv": sys.orig_argv[1:], "path0": sys.path[0], "cwd": os.getcwd(),
                      "probe": os.environ.get("ZYGOTE_PROBE"), "name": __name__, "main_is_us": main.__dict__ is globals(),
                      "file": globals().get("__file__"), "spec": getattr(globals().get("__spec__"), "name", None),
                      "ours_loaded": "lcmoe_recipes" in sys.modules, "executable": sys.executable,
                      "globals": sorted(globals()), "loader": type(__loader__).__name__}))
    print("to stderr", file=sys.stderr)
    sys.exit(int(os.environ.get("ZYGOTE_EXIT", "0")))
""")


def _both(zygote, argv, **kw):
    forked_before = zygote.forked
    forked = zygote.run(argv, **kw)
    assert zygote.forked == forked_before + 1, zygote.fallbacks[-1:]  # it did run in the server
    real = subprocess.run(argv, capture_output=True, text=True, **kw)
    return forked, real


@pytest.mark.parametrize("how", ["-c", "-m", "script"])
def test_a_command_sees_what_a_fresh_interpreter_sees(zygote, tmp_path, how):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    (tmp_path / "sub").mkdir()
    argv = {"-c": [sys.executable, "-c", PROBE, "a", "b c"],
            "-m": [sys.executable, "-m", "probe_mod", "a", "b c"],
            "script": [sys.executable, "../probe_mod.py", "a", "b c"]}[how]
    env = {**os.environ, "ZYGOTE_PROBE": "42", "ZYGOTE_EXIT": "3"}
    forked, real = _both(zygote, argv, cwd=tmp_path / ("sub" if how == "script" else ""), env=env, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr) \
        == (3, real.stdout, "to stderr\n")
    seen = json.loads(forked.stdout)
    assert seen["probe"] == "42" and seen["name"] == "__main__" and seen["main_is_us"] and not seen["ours_loaded"]
    assert seen["argv"][1:] == ["a", "b c"] and seen["executable"] == sys.executable


@pytest.mark.parametrize("code,status,err", [
    ("raise SystemExit", 0, ""),
    ("import sys; sys.exit('bad input')", 1, "bad input\n"),
    ("import sys; sys.exit(258)", 2, ""),
    ("raise ValueError('boom')", 1, "ValueError: boom\n"),
    ("import atexit, threading, time; atexit.register(print, 'atexit');"
     "threading.Thread(target=lambda: (time.sleep(0.5), print('thread'))).start()", 0, ""),
    ("import os, sys; sys.stdout.write('unflushed'); os.kill(os.getpid(), 9)", -9, ""),
])
def test_exit_status_and_output_as_the_interpreter(zygote, code, status, err):
    forked, real = _both(zygote, [sys.executable, "-c", code], timeout=120)
    assert (forked.returncode, forked.stdout) == (real.returncode, real.stdout)
    assert forked.returncode == status and forked.stderr.endswith(err) and real.stderr.endswith(err)
    if err.startswith("ValueError"):
        assert forked.stderr.startswith("Traceback (most recent call last):\n")


def test_each_command_starts_from_the_servers_state_not_the_last_commands(zygote, tmp_path):
    first = zygote.run([sys.executable, "-c", "import json, lcmoe_recipes; json.leaked = 1; import sys;"
                        "sys.modules['lcmoe_recipes'].leaked = 1"], timeout=120)
    assert first.returncode == 0, first.stderr
    second = zygote.run([sys.executable, "-c", "import json, sys; print(hasattr(json, 'leaked'), "
                         "'lcmoe_recipes' in sys.modules)"], timeout=120)
    assert second.stdout == "False False\n", second.stderr


def test_our_package_is_imported_anew_and_megatron_bridge_is_preloaded(zygote):
    code = textwrap.dedent("""
        import sys
        preloaded = "megatron.bridge.training.config" in sys.modules
        from lcmoe_recipes.emit import stack
        assert not stack._loaded and stack._GUARD not in sys.meta_path
        stack.load_bridge()
        print(preloaded, stack._GUARD in sys.meta_path, stack.__file__)
    """)
    out = zygote.run([sys.executable, "-c", code], timeout=120)
    assert out.returncode == 0, out.stderr
    import lcmoe_recipes.emit.stack as stack

    assert out.stdout == f"True True {stack.__file__}\n"
    assert "Loading Megatron-Bridge" in out.stderr  # the progress line a user sees, printed by the command itself


def test_a_timeout_kills_the_command_and_its_children(zygote, tmp_path):
    marker = tmp_path / "grandchild.pid"
    code = (f"import subprocess, sys, time; p = subprocess.Popen(['sleep', '300']); open({str(marker)!r}, 'w')"
            ".write(str(p.pid)); print('started', flush=True); time.sleep(300)")
    with pytest.raises(subprocess.TimeoutExpired) as timeout:
        zygote.run([sys.executable, "-c", code], timeout=5)
    assert timeout.value.stdout == "started\n"
    grandchild = int(marker.read_text())
    import time

    def alive(pid):  # a killed process may stay a zombie until something reaps it
        try:
            with open(f"/proc/{pid}/stat") as handle:
                return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except FileNotFoundError:
            return False

    for _ in range(50):
        if not alive(grandchild):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the command's child outlived the timeout")
    after = zygote.run([sys.executable, "-c", "print('still serving')"], timeout=60)
    assert after.stdout == "still serving\n"


def test_commands_can_start_processes_of_their_own(zygote):
    code = "import subprocess, sys; print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, " \
           "text=True, check=True).stdout.strip())"
    out = zygote.run([sys.executable, "-c", code], timeout=120)
    assert (out.returncode, out.stdout) == (0, "42\n"), out.stderr


@pytest.mark.parametrize("argv", [["-X", "dev", "-c", "import sys; print(sys.flags.dev_mode)"], ["-c"]])
def test_what_is_not_a_plain_python_command_runs_as_a_real_subprocess(zygote, argv):
    fallbacks = len(zygote.fallbacks)
    out = zygote.run([sys.executable, *argv], timeout=120)
    real = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    assert len(zygote.fallbacks) == fallbacks + 1
    assert (out.returncode, out.stdout, out.stderr) == (real.returncode, real.stdout, real.stderr)


def _light(preload):
    from zygote import Zygote

    return Zygote(preload=preload, ready_timeout=120)


def test_an_env_the_import_read_otherwise_gets_a_server_of_its_own():
    """A server's children see what its import saw: a request whose env differs in a variable the import read goes to
    a server started with that env; past MAX_SERVERS it runs as a real subprocess."""
    pool = _light("import os, builtins; builtins.seen_at_import = os.environ.get('ZYGOTE_AT_IMPORT')")
    pool.MAX_SERVERS = 3
    probe = [sys.executable, "-c", "import builtins, sys; print(builtins.seen_at_import, sys.flags.hash_randomization)"]
    try:
        def run(**env):
            return pool.run(probe, env={**os.environ, **env}, timeout=60)

        assert run(ZYGOTE_AT_IMPORT="a").stdout == "a 1\n" and pool.started == 1
        assert run(ZYGOTE_AT_IMPORT="b").stdout == "b 1\n" and pool.started == 2
        assert run(ZYGOTE_AT_IMPORT="a", UNREAD_BY_THE_IMPORT="x").stdout == "a 1\n" and pool.started == 2
        assert run(ZYGOTE_AT_IMPORT="a", PYTHONHASHSEED="0").stdout == "a 0\n" and pool.started == 3  # start-up
        assert pool.forked == 4 and not pool.fallbacks
        real = run(ZYGOTE_AT_IMPORT="c")  # a fourth env: no server for it
        assert real.returncode == 1 and "seen_at_import" in real.stderr  # a fresh interpreter ran it
        assert "servers were started already" in pool.fallbacks[-1][1]
    finally:
        pool.close()


@pytest.mark.parametrize("preload,error", [
    ("raise ImportError('this checkout does not import')", "ImportError('this checkout does not import')"),
    ("import socket; socket.create_connection(('127.0.0.1', 9))", "network use while the zygote server imports"),
])
def test_a_preload_that_fails_runs_everything_as_real_subprocesses(preload, error):
    """Also an import that reaches for the network: a server imports with every socket connection refused."""
    pool = _light(preload)
    try:
        pool.prepare()
        out = pool.run([sys.executable, "-c", "print('ran')"], timeout=60)
        assert out.stdout == "ran\n" and pool.forked == 0
        assert "preload failed: " in pool.fallbacks[-1][1] and error in pool.fallbacks[-1][1]
        pool.prepare()
        pool.run([sys.executable, "-c", "print('ran')"], timeout=60)
        assert pool.started == 1  # not tried again
    finally:
        pool.close()


@pytest.mark.parametrize("preload,unrelated_counts", [
    ("import tqdm", False),  # tqdm scans os.environ for TQDM_*: only those count (and what it looks up by name)
    ("import os; dict(os.environ)", True),  # a scan by a package not known: every variable counts
])
def test_a_scan_of_the_env_counts_as_reading_what_it_reads(preload, unrelated_counts):
    pool = _light(preload)
    try:
        probe = [sys.executable, "-c", "print('ok')"]
        pool.run(probe, env={**os.environ}, timeout=60)
        pool.run(probe, env={**os.environ, "UNREAD_BY_THE_IMPORT": "x"}, timeout=60)
        assert pool.started == (2 if unrelated_counts else 1)
        pool.run(probe, env={**os.environ, "TQDM_MININTERVAL": "5"}, timeout=60)
        assert pool.started == (3 if unrelated_counts else 2) and pool.forked == 3
    finally:
        pool.close()
