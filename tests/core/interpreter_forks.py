"""Test code for Triton's CPU interpreter, run in forks of one prepared process instead of a fresh Python each time.

`tests/core/test_fast_path.py::_run_ok` runs such code in a process of its own: Triton picks the interpreter when a
kernel is defined (TRITON_INTERPRET=1), and the code patches module state (configuration tables, functions made to
fail) that must not reach the test process. A fresh `python -c` spent ~2 s of CPU importing torch and Triton before
the code's first line — a third of many of these tests (2-core machine, 2026-12-07). Here one server per test
process (each pytest-xdist worker) imports them once, and each run is a fork of it: a copy of that state and of
nothing else — no earlier run leaves a trace, nothing of yue2_core is imported before the fork — with the caller's
environment (os.environ at the call, TRITON_INTERPRET=1), working directory and its own output files.

    run(code, env, timeout) -> (returncode, stdout, stderr), or None when no server can be used (the caller then
    runs a fresh Python); subprocess.TimeoutExpired after killing a run that took longer than `timeout` seconds.

Protocol (one JSON object a line): request {"path", "stdout", "stderr", "env", "cwd"} on the server's stdin; the
server forks, answers {"pid"}, waits for the fork and answers {"returncode"}. The server ends at the end of its
stdin, i.e. with the test process."""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time


def serve() -> None:
    """The server's loop (started by `run`): the shared imports, then one fork per request line."""
    sys.path[0] = ""  # as under `python -c`: the working directory, not this file's folder
    import torch  # noqa: F401 — what every run imports first
    import triton  # noqa: F401
    import triton.language  # noqa: F401
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        req = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(req)
        _answer({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _answer({"returncode": os.waitstatus_to_exitcode(status)})


def _answer(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _child(req: dict) -> None:
    """In the fork: output to the request's files, its environment and directory, the code as `python -c` runs it
    (a SystemExit's code or message, a traceback and exit status 1 for an exception). Never returns."""
    code = 1
    try:
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, fd)
            os.close(out)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        sys.argv = ["-c"]
        import runpy
        try:
            runpy.run_path(req["path"], run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 — reported as `python -c` would
            import traceback
            traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class _Server:
    def __init__(self, env: dict):
        self.key = _server_env(env)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=dict(env, **self.key))
        self.buf = b""

    def send(self, obj: dict) -> None:
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def receive(self, deadline: float | None) -> dict | None:
        """The next answer line, or None at the deadline. EOFError when the server has ended."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], wait)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("the interpreter server ended")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except Exception:  # noqa: BLE001 — at exit: kill what did not end
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def _server_env(env: dict) -> dict:
    """What the server's own imports read from the environment: a server is reused only where these match."""
    return {k: env.get(k, "") for k in ("PYTHONPATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                         "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "TRITON_INTERPRET")}


_SERVER: list = []  # [_Server] once started, [None] when it could not be (fresh Pythons from then on)


def _server(env: dict) -> _Server | None:
    if _SERVER and _SERVER[0] is not None and _SERVER[0].key != _server_env(env):
        _SERVER.pop().close()  # another environment for the imports: a server of its own
    if not _SERVER:
        try:
            _SERVER.append(_Server(env))
            atexit.register(_SERVER[0].close)
        except OSError:
            _SERVER.append(None)
    return _SERVER[0]


def run(code: str, env: dict, timeout: float) -> tuple[int, str, str] | None:
    """Run `code` in a fork of the server for `env` (see the module docstring)."""
    if not hasattr(os, "fork"):
        return None
    server = _server(env)
    if server is None:
        return None
    folder = tempfile.mkdtemp(prefix="yue2-interp-")
    try:
        path = os.path.join(folder, "code.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(code)
        files = {"stdout": os.path.join(folder, "out"), "stderr": os.path.join(folder, "err")}
        try:
            server.send({"path": path, **files, "env": dict(env), "cwd": os.getcwd()})
            pid = server.receive(None)["pid"]
            done = server.receive(time.monotonic() + timeout)
            if done is None:  # too long: the fork is killed, as subprocess.run kills its child
                os.kill(pid, 9)
                server.receive(None)
                raise subprocess.TimeoutExpired(["<interpreter fork>"], timeout)
        except (OSError, EOFError, ValueError, TypeError, KeyError):  # the server broke: fresh Pythons from now on
            _SERVER.pop().close()
            _SERVER.append(None)
            return None
        with open(files["stdout"], encoding="utf-8", errors="replace") as f:
            out = f.read()
        with open(files["stderr"], encoding="utf-8", errors="replace") as f:
            err = f.read()
        return done["returncode"], out, err
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    serve()
