"""The node tests' harnesses in the installed host's python, each in a process of its own, without paying the host's
start-up for each: one host python per test session runs tests/host/pack_in_host.py's PREAMBLE (torch, ComfyUI in CPU
mode, the pack loaded as ComfyUI loads it: ≈ 10 s of a CI run on 2 cores, which every `run_in_host` paid again), then
forks one child per harness. A child starts from the state a fresh `python -c PREAMBLE + code` has after the
preamble: its own copy of every module, so whatever a harness patches (`ym.load_nar`, ComfyUI's VRAM state, the
interrupt flag, gc) ends with it; the checkpoints folder, sys.argv and the environment (this process's, without
YUE2_* but YUE2_TEST_CACHE, with YUE2_WARMUP=0, as `run_in_host` gives) are set for the call before the code runs.

The host forks only while it runs a single thread (/proc/self/task): a second native thread (a BLAS or OpenMP pool,
a Python thread) would be missing in the child and could leave a lock held. With OMP_NUM_THREADS=1 (scripts/test.sh
sets it for its workers on a 2-core machine) the host has one; without it the BLAS libraries start their threads at
import. Then — and when the host python cannot start — each harness runs in a fresh process (`run_in_host`), as
before: slower, never different.

  fork = HostFork(comfy_host, repo, folder); fork.run(code, checkpoints) -> dict   (as run_in_host returns it)
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
from pathlib import Path

from pack_in_host import PREAMBLE, run_in_host

SERVER = PREAMBLE + r'''
_HARNESS_GLOBALS = dict(globals())  # what a harness finds after the preamble, as in `python -c PREAMBLE + code`
import atexit as _atexit
import threading as _threading
import traceback as _traceback


def _native_threads():
    return len(os.listdir("/proc/self/task"))


def _child(request):
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in (null, out, err):
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv[3] = request["ckpts"]
    folder_paths.folder_names_and_paths["checkpoints"] = ([request["ckpts"]], folder_paths.supported_pt_extensions)
    folder_paths.filename_list_cache.clear()
    scope = dict(_HARNESS_GLOBALS, ckpts=request["ckpts"])
    code = 0
    try:
        eval(compile(request["code"], "<harness>", "exec"), scope)
    except SystemExit as exc:  # as the interpreter reads it: None is 0, a number itself, anything else 1
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:
        _traceback.print_exc()
        code = 1
    # what the end of a script does that matters here (non-daemon threads joined, atexit handlers, buffers
    # flushed), without tearing down every module the host loaded: that took seconds, for nothing
    _threading._shutdown()
    _atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


print("READY", flush=True)
for _line in sys.stdin:
    _request = json.loads(_line)
    if _native_threads() != 1:
        print("NOFORK %d" % _native_threads(), flush=True)
        continue
    sys.stdout.flush()
    sys.stderr.flush()
    _pid = os.fork()
    if _pid == 0:
        _child(_request)
    print("PID %d" % _pid, flush=True)
    print("RC %d" % os.waitstatus_to_exitcode(os.waitpid(_pid, 0)[1]), flush=True)
os._exit(0)  # stdin closed: the session is over (tearing down torch and ComfyUI took seconds)
'''


def harness_env(extra: dict | None = None) -> dict:
    """The environment `run_in_host` gives a harness: this process's, YUE2_* left out (but YUE2_TEST_CACHE)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("YUE2_") or k == "YUE2_TEST_CACHE"}
    return {**base, "YUE2_WARMUP": "0", **(extra or {})}


class HostFork:
    def __init__(self, comfy_host: tuple, repo, folder: Path, start_timeout: float = 300.0):
        self.comfy_host, self.repo, self.folder = comfy_host, repo, Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.calls = 0
        self.forked = 0
        comfy_dir, python = comfy_host
        placeholder = self.folder / "no-checkpoints"
        placeholder.mkdir(exist_ok=True)
        self.log = open(self.folder / "host.log", "w")
        self.proc = subprocess.Popen([python, "-c", SERVER, str(comfy_dir), str(repo), str(placeholder)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=harness_env())
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, name="host-fork-reader", daemon=True).start()
        if self._next(start_timeout) != "READY":
            self.close()  # the harnesses then run in fresh processes

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _next(self, timeout: float):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def run(self, code: str, checkpoints, timeout: float = 300.0) -> dict:
        """`run_in_host(code, comfy_host, repo, checkpoints)`'s answer, from a forked child of the host python."""
        self.calls += 1
        if self.proc is None or self.proc.poll() is not None:
            return run_in_host(code, self.comfy_host, self.repo, checkpoints)
        out, err = self.folder / f"harness{self.calls}.out", self.folder / f"harness{self.calls}.err"
        request = {"code": code, "ckpts": str(checkpoints), "env": harness_env(), "stdout": str(out),
                   "stderr": str(err)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self._next(60)
        if answer is None or not answer.startswith(("PID ", "NOFORK ")):
            self.close()
            raise AssertionError(f"the host python did not take the harness (answered {answer!r})")
        if answer.startswith("NOFORK "):  # more than one thread in the host: a fresh process instead
            return run_in_host(code, self.comfy_host, self.repo, checkpoints)
        self.forked += 1
        pid = int(answer.split()[1])
        done = self._next(timeout)
        if done is None:
            os.kill(pid, signal.SIGKILL)
            self._next(60)
            raise AssertionError(f"the harness ran past {timeout} s; its stderr:\n{err.read_text()[-3000:]}")
        rc = int(done.split()[1])
        lines = [line for line in out.read_text().splitlines() if line.startswith("RESULT ")]
        assert rc == 0 and lines, f"exit {rc}; stderr:\n{err.read_text()[-3000:]}"
        return json.loads(lines[-1][len("RESULT "):])

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        self.log.close()
