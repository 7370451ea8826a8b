"""A fork server for the tests that run ``python ...`` commands as a user would, without paying megatron-bridge's
import (12-17 s on 2 cores) once per command.

A server (tests/conftest.py starts the first one as soon as a selected test needs the ``zygote`` fixture) is a fresh
interpreter that imports megatron-bridge once through ``lcmoe_recipes.emit.stack.load_bridge(quiet=True)`` (which
first installs the light-environment import guard) and nothing of the test session's state, then forgets every
``lcmoe_recipes`` module again (so each command imports this checkout's package anew, prints load_bridge's progress
line, and sees source edited since the server started). For each request it forks a child that:

* moves into the request's cwd, replaces ``os.environ`` with the request's env (plus what the server's import set
  in it, as the import would have), points fd 0 at /dev/null and fds 1 and 2 at files, starts its own process
  group;
* sets ``sys.argv``, ``sys.orig_argv``, ``sys.path[0]`` and a new ``__main__`` module and runs the command exactly
  as ``python -m MODULE ARGS`` (``runpy._run_module_as_main``, what the interpreter itself calls),
  ``python SCRIPT ARGS`` or ``python -c CODE ARGS`` would;
* maps ``SystemExit`` / an uncaught exception to the exit status as the interpreter does, waits for non-daemon
  threads, runs atexit handlers, flushes, and exits with ``os._exit``.

:meth:`Zygote.run` returns a ``subprocess.CompletedProcess`` like ``subprocess.run(..., capture_output=True,
text=True)``; a timeout kills the child's process group and raises ``subprocess.TimeoutExpired``. Children may start
processes of their own (torchrun ranks are fresh interpreters, as for a user).

A child must see what its import would have seen: while a server imports, it records the environment variables the
import looks up (``os.environ`` lookups; prefix scans of known libraries; any other scan counts as reading all);
with those, the ones the interpreter and native libraries read at start-up (``PYTHON*``, ``LC_*``, ``OMP_*``, ...)
must be equal in the request's env, or the request goes to another server started with that env (at most
``Zygote.MAX_SERVERS`` per session). What is not ``sys.executable`` with ``-m``/``-c``/a script runs as a real
subprocess, as does everything when the preload itself fails. Children run torch with one intra-op thread (the
server sets ``OMP_NUM_THREADS=1`` / ``torch.set_num_threads(1)`` before forking: forking after an OpenMP pool
exists is unsafe); nothing in the suite depends on the thread count.

A server imports with every socket connection refused: nothing a command inherits came from the network.

What a fork cannot prove: anything else about the import itself in a fresh interpreter (which modules load, in which
order, what the import prints or warns). Tests about those keep ``subprocess.run``.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

# Read by the interpreter at start-up (before the server can record anything: site, the user site under HOME) or by
# native libraries (not through os.environ): a difference means the command needs a server started with its env.
STARTUP_PREFIXES = ("PYTHON", "HOME", "LC_", "LANG", "TZ", "LD_", "MALLOC", "OMP_", "GOMP_", "KMP_", "MKL_",
                    "OPENBLAS_", "CUDA", "NVIDIA_", "NCCL_", "TORCH", "PYTORCH_", "ARROW_", "JE_", "GLIBC_", "VIRTUAL_ENV")
# Libraries that scan os.environ for a prefix while megatron-bridge imports (tqdm.utils.envwrap, networkx's backend
# config, fsspec.config, diffusers' Colab check): their prefixes count as read. A scan from any other package makes
# every variable count (then a command whose env differs in anything needs a server started with its env).
SCANNED_PREFIXES = {"tqdm": ("TQDM_",), "networkx": ("NETWORKX_",), "fsspec": ("FSSPEC_",), "diffusers": ("COLAB_",)}
# Set in the server while it imports, not part of the env a child sees (see the module docstring).
SERVER_ONLY = {"OMP_NUM_THREADS": "1"}
# What a server imports before it forks: megatron-bridge, as our loader imports it (guard first).
PRELOAD = "from lcmoe_recipes.emit.stack import load_bridge; load_bridge(quiet=True)"


def _send(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> dict | None:
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    body = _recv_exact(sock, struct.unpack("!I", head)[0])
    return None if body is None else json.loads(body)


# --- the client (the test session) -----------------------------------------------------------------------------------

class ZygoteUnavailable(RuntimeError):
    pass


def _sensitive(name: str, ready: dict) -> bool:
    """Whether a fork's behaviour may depend on ``name`` as it was when its server imported."""
    scanned = ready["scanned"]
    return (name in ready["read"] or name.startswith(STARTUP_PREFIXES) or name.startswith(tuple(scanned))
            or "*" in scanned)


class _Server:
    """One server process, started with one env; it imports in the background until the first ``ready()``."""

    def __init__(self, env: dict[str, str], preload: str, ready_timeout: float):
        self.env, self.ready_timeout = env, ready_timeout
        self.last_used = time.monotonic()
        self.info: dict | None = None  # its first message: the names its preload read
        self.inflight: int | None = None  # the pid of the command it runs now
        self.error: str | None = None
        self._home = tempfile.mkdtemp(prefix="lcmoe-zygote-")  # its cwd (sys.path[0] while it imports)
        self._log = open(os.path.join(self._home, "server.log"), "w+b")
        ours, theirs = socket.socketpair()
        loader = ("import importlib.util as u, sys; s = u.spec_from_file_location('_lcmoe_test_zygote', sys.argv[1]); "
                  "m = u.module_from_spec(s); s.loader.exec_module(m); m._serve(int(sys.argv[2]), sys.argv[3])")
        self.proc = subprocess.Popen([sys.executable, "-c", loader, os.path.abspath(__file__), str(theirs.fileno()),
                                      preload],
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self._log, cwd=self._home, env=env)
        theirs.close()
        self.sock = ours

    def log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-3000:]

    def ready(self) -> dict:
        if self.info is not None:
            if self.proc.poll() is not None:
                raise ZygoteUnavailable(f"the server exited with status {self.proc.returncode}")
            return self.info
        if self.error is None:
            self.sock.settimeout(self.ready_timeout)
            try:
                message = _recv(self.sock)
            except OSError as exc:  # socket.timeout included
                message = {"error": f"no answer from the server: {exc!r}"}
            finally:
                self.sock.settimeout(None)
            if message and "error" not in message:
                self.info = message
                return message
            self.error = f"{(message or {}).get('error', 'the server exited')}\n{self.log_tail()}"
        raise ZygoteUnavailable(self.error)

    def differs(self, env: dict[str, str]) -> str | None:
        """The first variable this server's preload may have read that ``env`` has otherwise, or None."""
        for name in sorted(set(env) ^ set(self.env) | {k for k in env if env[k] != self.env.get(k)}):
            if _sensitive(name, self.info):
                return name
        return None

    def answer(self, key: str):
        message = _recv(self.sock)
        if message is None:  # the server itself died (not the command: its death is a status)
            self.error = f"the server exited while a command ran\n{self.log_tail()}"
            raise ZygoteUnavailable(self.error)
        return message[key]

    def run(self, argv: list[str], cwd: str, env: dict[str, str], timeout: float | None):
        with tempfile.TemporaryDirectory(prefix="lcmoe-zygote-run-") as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            _send(self.sock, {"argv": argv[1:], "cwd": cwd, "env": env, "stdout": out, "stderr": err})
            pid = self.inflight = self.answer("pid")
            self.sock.settimeout(timeout)
            try:
                returncode = self.answer("returncode")
            except TimeoutError:
                self._kill(pid)
                self.sock.settimeout(60)
                self.answer("returncode")  # the server reaps it and answers
                raise subprocess.TimeoutExpired(argv, timeout, output=_read(out), stderr=_read(err)) from None
            except BaseException:  # interrupted: leave no child behind, keep the protocol in step
                self._kill(pid)
                self.sock.settimeout(60)
                self.answer("returncode")
                raise
            finally:
                self.inflight = None
                self.sock.settimeout(None)
            return subprocess.CompletedProcess(argv, returncode, _read(out), _read(err))

    def kill_inflight(self) -> None:
        if self.inflight is not None:
            self._kill(self.inflight)

    @staticmethod
    def _kill(pid: int) -> None:
        import signal

        for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                kill()
            except OSError:
                pass

    def close(self) -> None:
        if self.info is None:
            self.proc.kill()  # still importing (or never asked): nothing to wait for
        self.sock.close()  # the server sees EOF and exits
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        import shutil

        shutil.rmtree(self._home, ignore_errors=True)


class Zygote:
    """The test session's handle on its servers. ``prepare()`` starts one for an env (it imports in the background);
    ``run()`` forks from a server whose preload saw the request's env -- starting one for it when none did (a test
    that touches torch's compiler sets ``TORCHINDUCTOR_CACHE_DIR`` in the session's env, which commands inherit) --
    and runs ``subprocess.run`` for what no server can run (``fallbacks`` lists those, with the reason)."""

    MAX_SERVERS = 4  # servers started per session; env changes beyond that run as real subprocesses
    ALIVE = 2  # servers kept at once (the least recently used one goes)

    def __init__(self, preload: str = PRELOAD, ready_timeout: float = 900):
        self.preload, self.ready_timeout = preload, ready_timeout
        self.fallbacks: list[tuple[list[str], str]] = []
        self.forked = 0
        self.started = 0
        self._servers: list[_Server] = []  # alive
        self._all: list[_Server] = []  # every server started
        self._lock = threading.RLock()

    def prepare(self, env: dict[str, str] | None = None) -> "Zygote":
        """Start a server for ``env`` (default: this process's) in the background, unless one serves it already or
        one is still importing (what it reads is not known until it is done)."""
        env = dict(os.environ if env is None else env)
        with self._lock:
            if self._preload_failed() or any(s.info is None and s.error is None for s in self._servers):
                return self
            if self._ready_for(env) is None:
                self._start(env)
        return self

    def _preload_failed(self) -> str | None:
        """The error of a server whose preload failed: this checkout's preload fails, and would again."""
        return next((s.error for s in self._servers if (s.error or "").startswith("preload failed")), None)

    def _ready_for(self, env: dict[str, str]) -> _Server | None:
        """The most recently used server whose preload saw ``env`` (waiting for those still importing)."""
        for server in sorted(self._servers, key=lambda s: s.last_used, reverse=True):
            try:
                server.ready()
            except ZygoteUnavailable:
                continue
            if server.differs(env) is None:
                return server
        return None

    def _start(self, env: dict[str, str]) -> _Server | None:
        if self.started >= self.MAX_SERVERS:
            return None
        while len(self._servers) >= self.ALIVE:
            oldest = min(self._servers, key=lambda s: s.last_used)
            self._servers.remove(oldest)
            oldest.close()
        server = _Server(env, self.preload, self.ready_timeout)
        known = [s for s in self._all if s.info is not None]
        server.started_for = known[-1].differs(env) if known else "(first)"
        self.started += 1
        self._servers.append(server)
        self._all.append(server)
        return server

    @staticmethod
    def why_not(argv: list[str]) -> str | None:
        """None when ``argv`` is a command a fork can run as the interpreter would, else why it is not."""
        argv = [os.fspath(a) for a in argv]
        if len(argv) < 2 or argv[0] != sys.executable:
            return "not sys.executable with arguments"
        if argv[1] in ("-m", "-c"):
            if len(argv) < 3:
                return f"{argv[1]} without its argument"
        elif argv[1].startswith("-"):
            return f"interpreter option {argv[1]}"
        return None

    def _server_for(self, env: dict[str, str]) -> tuple[_Server | None, str | None]:
        server = self._ready_for(env)
        if server is not None:
            return server, None
        failed = self._preload_failed()
        if failed:
            return None, f"server unavailable: {failed.splitlines()[0]}"
        server = self._start(env)
        if server is None:
            return None, f"the env differs from every server's and {self.MAX_SERVERS} servers were started already"
        try:
            server.ready()
        except ZygoteUnavailable as exc:
            return None, f"server unavailable: {str(exc).splitlines()[0]}"
        return server, None

    def run(self, argv, *, cwd=None, env=None, timeout=None, capture_output=True, text=True):
        """``subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)``, forked."""
        assert capture_output and text, "the zygote captures output as text, as the suite's subprocess calls do"
        argv = [os.fspath(a) for a in argv]
        env = dict(os.environ if env is None else env)
        cwd = os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd())
        with self._lock:
            reason = self.why_not(argv) if os.path.isdir(cwd) else "cwd is not a folder"
            server = None
            if reason is None:
                server, reason = self._server_for(env)
            if server is not None:
                self.forked += 1
                server.last_used = time.monotonic()
                return server.run(argv, cwd, env, timeout)
        self.fallbacks.append((argv, reason))
        return subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)

    def summary(self, verbose: bool = False) -> str:
        """One line for the end of the session (``-v``: the servers' envs and each fallback's reason)."""
        line = (f"zygote: {self.forked} command(s) forked from {self.started} server(s), {len(self.fallbacks)} run as "
                f"real subprocesses (tests/zygote.py)")
        line += "".join(f"\n  server {i}: started for an env that differs in {s.started_for}"
                        for i, s in enumerate(self._all, 1))
        if verbose:
            line += "".join(f"\n  subprocess: {' '.join(argv)[:100]!r}: {reason}" for argv, reason in self.fallbacks)
        return line

    def close(self) -> None:
        for server in list(self._servers):  # a command another thread waits on ends now (it holds the lock)
            server.kill_inflight()
        with self._lock:
            while self._servers:
                self._servers.pop().close()


def _read(path: str) -> str:
    """The file decoded as ``subprocess.run(text=True)`` decodes a pipe (locale encoding, universal newlines)."""
    import locale

    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return ""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


# --- the server --------------------------------------------------------------------------------------------------------

def _record_env_reads():
    """Patch os._Environ while the preload runs: the names it looks up, and the packages that scan it.

    A scan fetches the values of the keys it yielded, in order (``os.environ.items()``, ``dict(os.environ)``): those
    lookups belong to the scan (its package's prefix), not to the names; the first lookup out of that order ends it.
    """
    import collections

    environ_type = os._Environ
    get, iterate = environ_type.__getitem__, environ_type.__iter__
    read, scanned = set(), set()
    pending = collections.deque()  # keys the current scan yielded whose values it has not fetched yet

    def name(key):
        return key.decode(errors="replace") if isinstance(key, bytes) else str(key)

    def getitem(self, key):
        if pending and pending[0] == name(key):
            pending.popleft()
        else:
            pending.clear()
            read.add(name(key))
        return get(self, key)

    def scan(self):
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "") in ("collections.abc", "_collections_abc",
                                                                             "os", __name__):
            frame = frame.f_back
        package = (frame.f_globals.get("__name__", "") if frame is not None else "").split(".")[0]
        scanned.update(SCANNED_PREFIXES.get(package, ("*",)))
        pending.clear()
        for key in iterate(self):
            pending.append(name(key))
            yield key

    environ_type.__getitem__, environ_type.__iter__ = getitem, scan

    def stop():
        environ_type.__getitem__, environ_type.__iter__ = get, iterate
        return read, scanned

    return stop


def _refuse_network():
    """Every socket connection refused while the server imports, as tests/test_emit.py::test_build_is_offline
    refuses them in the command: what a command inherits never came from the network (an import that needs it fails
    the preload, and every command then runs as a real subprocess, where that test sees it)."""
    saved = socket.socket.connect, socket.socket.connect_ex, socket.create_connection

    def refuse(*args, **kwargs):
        raise OSError("network use while the zygote server imports (tests/zygote.py)")

    socket.socket.connect = socket.socket.connect_ex = socket.create_connection = refuse

    def allow():
        socket.socket.connect, socket.socket.connect_ex, socket.create_connection = saved

    return allow


def _serve(fd: int, preload: str) -> None:
    import gc

    sock = socket.socket(fileno=fd)
    started_env, path0 = dict(os.environ), sys.path[0]
    os.environ.update(SERVER_ONLY)
    before = dict(os.environ)
    stop = _record_env_reads()
    allow_network = _refuse_network()
    try:
        exec(compile(preload, "<zygote preload>", "exec"), {"__name__": "__zygote_preload__"})
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)
    except BaseException as exc:  # noqa: BLE001 - reported to the client, which then runs real subprocesses
        stop()
        allow_network()
        import traceback

        _send(sock, {"error": f"preload failed: {exc!r}\n{traceback.format_exc()[-3000:]}"})
        return
    read, scanned = stop()
    allow_network()
    # What the import itself set in os.environ (torch sets some of its cache folders): a child starts from the
    # request's env (equal to ours in every variable the import read) and gets the same writes, as after its import.
    set_by_import = {k: v for k, v in os.environ.items() if before.get(k) != v and k not in SERVER_ONLY}
    unset_by_import = [k for k in before if k not in os.environ and k not in SERVER_ONLY]
    os.environ.clear()
    os.environ.update(started_env)
    if sys.path[0] != path0:  # the entry a child replaces with its own script folder / cwd / ''
        sys.path.remove(path0)
        sys.path.insert(0, path0)
    # Forget our package: each command imports this checkout's lcmoe_recipes anew (load_bridge included: it prints its
    # progress line again, and megatron-bridge is already in sys.modules). The guard instance goes with its module.
    for name in [n for n in sys.modules if n == "lcmoe_recipes" or n.startswith("lcmoe_recipes.")]:
        del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("lcmoe_recipes")]
    gc.collect()
    gc.freeze()  # the preload's objects stay shared with the children (copy-on-write), never scanned by their GC
    sys.stdout.flush()
    sys.stderr.flush()
    _send(sock, {"ready": True, "read": sorted(read), "scanned": sorted(scanned), "set": set_by_import,
                 "unset": unset_by_import})
    while True:
        request = _recv(sock)
        if request is None:
            return
        pid = os.fork()
        if pid == 0:
            _child(request, sock, set_by_import, unset_by_import)  # never returns
        try:
            os.setpgid(pid, pid)  # also done in the child: whichever runs first
        except OSError:
            pass
        _send(sock, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send(sock, {"returncode": os.waitstatus_to_exitcode(status)})


def _exit_status(exc: SystemExit) -> int:
    """As the interpreter maps SystemExit.code (Python/pythonrun.c, handle_system_exit)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child(request: dict, sock: socket.socket, set_by_import: dict[str, str], unset_by_import: list[str]) -> None:
    status = 1
    try:
        sock.close()
        os.setpgid(0, 0)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.update(set_by_import)
        for name in unset_by_import:
            os.environ.pop(name, None)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(handle, fd)
            os.close(handle)
        status = _run_main(request["argv"])
    except BaseException:  # noqa: BLE001 - a failure of the machinery itself: report it like an uncaught exception
        import traceback

        traceback.print_exc()
    finally:
        try:
            threading._shutdown()  # as Py_FinalizeEx: wait for non-daemon threads, then atexit, then flush
            import atexit

            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001
                    pass
            os._exit(status)


def _run_main(args: list[str]) -> int:
    """Run ``python ARGS`` in this (forked) process; its exit status."""
    import builtins
    import importlib
    import importlib.machinery
    import runpy
    import types

    importlib.invalidate_caches()
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __annotations__={})
    sys.modules["__main__"] = main
    if "__mp_main__" in sys.modules:
        sys.modules["__mp_main__"] = main  # multiprocessing's alias of __main__
    sys.orig_argv = [sys.executable, *args]
    try:
        if args[0] == "-m":
            sys.argv = ["-m", *args[2:]]
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(args[1], alter_argv=True)
        elif args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            sys.path[0] = ""
            main.__loader__ = importlib.machinery.BuiltinImporter
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        else:
            script = args[0]
            sys.argv = list(args)
            sys.path[0] = os.path.dirname(os.path.realpath(script))
            try:
                with open(script, "rb") as handle:
                    source = handle.read()
            except OSError as exc:  # as the interpreter words it (Modules/main.c, pymain_run_file_obj)
                print(f"{sys.executable}: can't open file {os.path.abspath(script)!r}: [Errno {exc.errno}] "
                      f"{exc.strerror}", file=sys.stderr)
                return 2
            # as Python 3.12 sets them: the file joined to the cwd (not normalised), a source loader, no cache path
            main.__file__ = os.path.join(os.getcwd(), script)
            main.__cached__ = None
            main.__loader__ = importlib.machinery.SourceFileLoader("__main__", main.__file__)
            exec(compile(source, main.__file__, "exec"), main.__dict__)
    except SystemExit as exc:
        return _exit_status(exc)
    except BaseException:  # noqa: BLE001 - as the interpreter: the traceback on stderr, status 1
        sys.excepthook(*sys.exc_info())
        return 1
    return 0
