"""A fork server for the tests that run ``python ...`` commands as a user would, without paying megatron-bridge's
import (12-17 s on 2 cores) once per command.

One server process per test session (``tests/conftest.py``: the session fixture ``zygote``) starts as a fresh
interpreter, imports megatron-bridge once through ``lcmoe_recipes.emit.stack.load_bridge(quiet=True)`` (which first
installs the light-environment import guard) and nothing of the test session's state, then forgets every
``lcmoe_recipes`` module again (so each command imports this checkout's package anew, prints load_bridge's progress
line, and sees source edited since the server started). For each request it forks a child that:

* moves into the request's cwd, replaces ``os.environ`` with the request's env, points fd 0 at /dev/null and fds 1
  and 2 at files, starts its own process group;
* sets ``sys.argv``, ``sys.orig_argv``, ``sys.path[0]`` and a new ``__main__`` module and runs the command exactly
  as ``python -m MODULE ARGS`` (``runpy._run_module_as_main``, what the interpreter itself calls),
  ``python SCRIPT ARGS`` or ``python -c CODE ARGS`` would;
* maps ``SystemExit`` / an uncaught exception to the exit status as the interpreter does, waits for non-daemon
  threads, runs atexit handlers, flushes and ``os._exit``\\ s.

:meth:`Zygote.run` returns a ``subprocess.CompletedProcess`` like ``subprocess.run(..., capture_output=True,
text=True)``; a timeout kills the child's process group and raises ``subprocess.TimeoutExpired``. Children may start
processes of their own (torchrun ranks are fresh interpreters, as for a user).

A command runs as a real subprocess instead (:meth:`Zygote.why_not` says why) when it is not ``sys.executable`` with
``-m``/``-c``/a script, when its env differs from the server's in a variable the preload read (recorded while it
imported: ``os.environ`` lookups, prefix scans of known libraries) or one the interpreter or native libraries read at
start-up (``PYTHON*``, ``LC_*``, ``OMP_*``, ...), or when the server is not available. Children run torch with one
intra-op thread (the server sets ``OMP_NUM_THREADS=1`` / ``torch.set_num_threads(1)`` before forking: forking after
an OpenMP pool exists is unsafe); nothing in the suite depends on the thread count.

What a fork cannot prove: anything about the import itself in a fresh interpreter (which modules load, what the
import prints or warns, what it does on the network). Tests about those keep ``subprocess.run``.
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

# Read by the interpreter at start-up or by native libraries (not through os.environ): a difference means a fork
# cannot behave as a fresh process.
STARTUP_PREFIXES = ("PYTHON", "LC_", "LANG", "LANGUAGE", "TZ", "LD_", "MALLOC", "OMP_", "GOMP_", "KMP_", "MKL_",
                    "OPENBLAS_", "CUDA", "NVIDIA_", "NCCL_", "TORCH", "PYTORCH_", "ARROW_", "JE_", "GLIBC_", "VIRTUAL_ENV")
# Libraries that scan os.environ for a prefix while megatron-bridge imports (tqdm.utils.envwrap, networkx's backend
# config, fsspec.config, diffusers' Colab check): their prefixes count as read. A scan from any other package makes
# every variable count (then any env difference runs a real subprocess).
SCANNED_PREFIXES = {"tqdm": ("TQDM_",), "networkx": ("NETWORKX_",), "fsspec": ("FSSPEC_",), "diffusers": ("COLAB_",)}
# Set in the server while it imports, not part of the env a child sees (see the module docstring).
SERVER_ONLY = {"OMP_NUM_THREADS": "1"}


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


class Zygote:
    """The test session's handle on the server. ``start()`` spawns it (it imports in the background); ``run()`` waits
    for it the first time and falls back to ``subprocess.run`` for what it cannot run (``fallbacks`` lists those)."""

    def __init__(self, env: dict[str, str] | None = None, ready_timeout: float = 900):
        self.env = dict(os.environ if env is None else env)
        self.ready_timeout = ready_timeout
        self.fallbacks: list[tuple[list[str], str]] = []
        self.forked = 0
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._ready: dict | None = None
        self._error: str | None = None
        self._lock = threading.Lock()
        self._home = tempfile.mkdtemp(prefix="lcmoe-zygote-")  # the server's cwd (sys.path[0] while it imports)
        self._log = open(os.path.join(self._home, "server.log"), "w+b")

    # lifecycle
    def start(self) -> "Zygote":
        if self._proc is not None:
            return self
        ours, theirs = socket.socketpair()
        loader = ("import importlib.util as u, sys; s = u.spec_from_file_location('_lcmoe_test_zygote', sys.argv[1]); "
                  "m = u.module_from_spec(s); s.loader.exec_module(m); m._serve(int(sys.argv[2]))")
        self._proc = subprocess.Popen([sys.executable, "-c", loader, os.path.abspath(__file__), str(theirs.fileno())],
                                      pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=self._log, cwd=self._home, env=self.env)
        theirs.close()
        self._sock = ours
        return self

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the server sees EOF and exits
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        import shutil

        shutil.rmtree(self._home, ignore_errors=True)

    def _wait_ready(self) -> dict:
        if self._ready is not None:
            return self._ready
        if self._error is not None:
            raise ZygoteUnavailable(self._error)
        self.start()
        self._sock.settimeout(self.ready_timeout)
        try:
            message = _recv(self._sock)
        except OSError as exc:  # socket.timeout included
            message = {"error": f"no answer from the server: {exc!r}"}
        finally:
            if self._sock is not None:
                self._sock.settimeout(None)
        if not message or "error" in message:
            self._log.seek(0)
            log = self._log.read().decode(errors="replace")[-3000:]
            self._error = f"{(message or {}).get('error', 'the server exited')}\n{log}"
            raise ZygoteUnavailable(self._error)
        self._ready = message
        return message

    # what it can run
    def why_not(self, argv: list[str], env: dict[str, str]) -> str | None:
        """None when the server runs ``argv`` with ``env`` as a fresh interpreter would, else the reason it does not."""
        argv = [os.fspath(a) for a in argv]
        if len(argv) < 2 or argv[0] != sys.executable:
            return "not sys.executable with arguments"
        if argv[1] in ("-m", "-c"):
            if len(argv) < 3:
                return f"{argv[1]} without its argument"
        elif argv[1].startswith("-"):
            return f"interpreter option {argv[1]}"
        try:
            ready = self._wait_ready()
        except ZygoteUnavailable as exc:
            return f"server unavailable: {str(exc).splitlines()[0]}"
        read, scanned = set(ready["read"]), ready["scanned"]
        for name in sorted(set(env) ^ set(self.env) | {k for k in env if env[k] != self.env.get(k)}):
            if name in read or name.startswith(STARTUP_PREFIXES) or name.startswith(tuple(scanned)) or "*" in scanned:
                return f"env variable {name} differs from the server's (read at start-up or while importing)"
        return None

    def run(self, argv, *, cwd=None, env=None, timeout=None, capture_output=True, text=True):
        """``subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)``, forked."""
        assert capture_output and text, "the zygote captures output as text, as the suite's subprocess calls do"
        argv = [os.fspath(a) for a in argv]
        env = dict(os.environ if env is None else env)
        cwd = os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd())
        reason = self.why_not(argv, env) if os.path.isdir(cwd) else "cwd is not a folder"
        if reason is not None:
            self.fallbacks.append((argv, reason))
            return subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)
        with self._lock, tempfile.TemporaryDirectory(prefix="lcmoe-zygote-run-") as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            _send(self._sock, {"argv": argv[1:], "cwd": cwd, "env": env, "stdout": out, "stderr": err})
            pid = _recv(self._sock)["pid"]
            self.forked += 1
            self._sock.settimeout(timeout)
            try:
                done = _recv(self._sock)
            except TimeoutError:
                self._kill(pid)
                self._sock.settimeout(60)
                _recv(self._sock)  # the server reaps it and answers
                raise subprocess.TimeoutExpired(argv, timeout, output=_read(out), stderr=_read(err)) from None
            except BaseException:  # interrupted: leave no child behind, keep the protocol in step
                self._kill(pid)
                self._sock.settimeout(60)
                _recv(self._sock)
                raise
            finally:
                if self._sock is not None:
                    self._sock.settimeout(None)
            return subprocess.CompletedProcess(argv, done["returncode"], _read(out), _read(err))

    @staticmethod
    def _kill(pid: int) -> None:
        import signal

        for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                kill()
            except OSError:
                pass


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
    """Patch os._Environ while the preload runs: the names it looks up, and the packages that scan it."""
    environ_type = os._Environ
    get, iterate = environ_type.__getitem__, environ_type.__iter__
    read, scanned = set(), set()

    def getitem(self, key):
        read.add(key.decode(errors="replace") if isinstance(key, bytes) else str(key))
        return get(self, key)

    def scan(self):
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "") in ("collections.abc", "_collections_abc", "os", __name__):
            frame = frame.f_back
        package = (frame.f_globals.get("__name__", "") if frame is not None else "").split(".")[0]
        scanned.update(SCANNED_PREFIXES.get(package, ("*",)))
        return iterate(self)

    environ_type.__getitem__, environ_type.__iter__ = getitem, scan

    def stop():
        environ_type.__getitem__, environ_type.__iter__ = get, iterate
        return read, scanned

    return stop


def _serve(fd: int) -> None:
    import gc

    sock = socket.socket(fileno=fd)
    started_env = dict(os.environ)
    os.environ.update(SERVER_ONLY)
    stop = _record_env_reads()
    try:
        from lcmoe_recipes.emit.stack import load_bridge

        load_bridge(quiet=True)
        import torch

        torch.set_num_threads(1)
    except BaseException as exc:  # noqa: BLE001 - reported to the client, which then runs real subprocesses
        stop()
        import traceback

        _send(sock, {"error": f"preload failed: {exc!r}\n{traceback.format_exc()[-3000:]}"})
        return
    read, scanned = stop()
    os.environ.clear()
    os.environ.update(started_env)
    # Forget our package: each command imports this checkout's lcmoe_recipes anew (load_bridge included: it prints its
    # progress line again, and megatron-bridge is already in sys.modules). The guard instance goes with its module.
    for name in [n for n in sys.modules if n == "lcmoe_recipes" or n.startswith("lcmoe_recipes.")]:
        del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("lcmoe_recipes")]
    gc.collect()
    gc.freeze()  # the preload's objects stay shared with the children (copy-on-write), never scanned by their GC
    sys.stdout.flush()
    sys.stderr.flush()
    _send(sock, {"ready": True, "read": sorted(read), "scanned": sorted(scanned)})
    while True:
        request = _recv(sock)
        if request is None:
            return
        pid = os.fork()
        if pid == 0:
            _child(request, sock)  # never returns
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


def _child(request: dict, sock: socket.socket) -> None:
    status = 1
    try:
        sock.close()
        os.setpgid(0, 0)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
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
            exec(compile(source, script, "exec"), main.__dict__)
    except SystemExit as exc:
        return _exit_status(exc)
    except BaseException:  # noqa: BLE001 - as the interpreter: the traceback on stderr, status 1
        sys.excepthook(*sys.exc_info())
        return 1
    return 0
