"""Helpers of the robustness tests: crafting damaged checkpoints, a song directory without a model, running the CLI."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import torch

from yue2_core.weights.synthetic import Profile

REPO = Path(__file__).resolve().parents[2]

#: One-layer synthetic model for header fuzzing (1.2 MB int8 file, 491 tensors, 13 int8 modules): every YuE2 tensor
#: group with tiny dimensions. A labelled deviation like `micro`; parse/loader tests only.
NANO = Profile("nano", hidden=256, heads=2, kv_heads=1, head_dim=128, ffn=256, layers=1, vocab=320,
               vae_channels=1, vae_c_mults=(1, 1, 1, 1, 1, 1), bpe_size=300, tokenizer_bytes=None, pe_rows=8,
               deviation="fuzzing only: 1 layer, vocab 320, pe 8 rows")

STYLE = "indie pop, warm female vocals, bright guitars, 100 bpm"
LYRICS = "[Verse]\nCity lights are fading slow\nI keep walking, nowhere to go\n\n[Chorus]\nHold on, hold on\n"
_TORCH = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I8": torch.int8, "U8": torch.uint8}


# --- safetensors files ---------------------------------------------------------------------------------------------

def read_raw(path) -> tuple[dict, bytes]:
    """(header JSON including __metadata__, data section bytes) of a safetensors file."""
    blob = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def header_bytes(header: dict) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_raw(path, header: dict, data: bytes) -> str:
    Path(path).write_bytes(header_bytes(header) + data)
    return str(path)


def edit_header(src, dst, edit) -> str:
    """Copy `src` to `dst` with `edit(header)` applied to its JSON header (data section unchanged)."""
    header, data = read_raw(src)
    edit(header)
    return write_raw(dst, header, data)


def rewrite(src, dst, edit) -> str:
    """Load every tensor of `src`, let `edit(tensors, metadata)` change the dicts in place, save as `dst`."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    with safe_open(str(src), framework="pt", device="cpu") as f:
        meta = dict(f.metadata() or {})
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(tensors, meta)
    save_file(tensors, str(dst), metadata=meta)
    return str(dst)


def patch_tensor(path, key: str, fn) -> None:
    """Overwrite tensor `key` of the file in place with fn(tensor) (same dtype and element count)."""
    from yue2_core.weights.checkpoint import read_header
    entries, _, start = read_header(str(path))
    e = entries[key]
    with open(path, "r+b") as f:
        f.seek(start + e.start)
        raw = bytearray(f.read(e.end - e.start))
        t = torch.frombuffer(raw, dtype=_TORCH[e.dtype]).reshape(e.shape).clone()
        new = fn(t).to(t.dtype).contiguous()
        assert new.numel() == t.numel()
        data = new.reshape(-1).view(torch.uint8).numpy().tobytes()
        f.seek(start + e.start)
        f.write(data)


def copy(src, dst) -> str:
    shutil.copyfile(src, dst)
    return str(dst)


# --- song directories ----------------------------------------------------------------------------------------------

def make_song(frames: int = 8, cot: str = "full", style: str = STYLE, lyrics: str = LYRICS, seed: int = 7):
    """A complete `Song` without running a model (random latents, quiet noise audio)."""
    from yue2_core.constants import ABC_END, ABC_START, EOD, MUSIC_START
    from yue2_core.pipeline import Score, SemanticTokens, Song, request_dict
    from yue2_core.protocol import SEMANTIC_PRESET, SongRequest
    request = SongRequest(style=style, lyrics=lyrics, cot=cot, seed=seed, id="song")
    abc = None if cot == "off" else "X:1\nT:\nM:4/4\nL:1/16\nQ:1/4=96\nK:C\n"
    ids = [] if cot == "off" else [11, 22, 33]
    score = Score(abc=abc, abc_ids=ids, cot=cot, seed=seed, source="none" if cot == "off" else "model")
    prefix = [EOD, 5, 6, ABC_START, *ids, ABC_END, MUSIC_START]
    g = torch.Generator().manual_seed(seed)
    tokens = SemanticTokens(codes=torch.randint(0, 32768, (frames,), generator=g).tolist(), prefix=prefix,
                            score=score, request=request_dict(request), seed=seed, cfg_scale=1.0,
                            sampling=SEMANTIC_PRESET.to_dict(), ended=True)
    latents = torch.randn(frames, 64, generator=g)
    audio = (0.1 * torch.randn(2, 1920 * frames - 64, generator=g)).clamp(-1, 1)
    return Song(request=request, score=score, tokens=tokens, latents=latents, audio=audio,
                settings={"protocol": "yue2-native-v1", "cot": cot}, warnings=request.input_warnings())


def snapshot(root) -> dict:
    """{relative path: sha256 or '<dir>'} of everything under `root` (to prove nothing changed)."""
    root = Path(root)
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "<dir>" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def listing(root) -> list[str]:
    return sorted(p.name for p in Path(root).iterdir())


# --- the command line ----------------------------------------------------------------------------------------------

def run_cli(*args, cwd=None, timeout: int = 240, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m yue2_core ARGS` in a clean environment (no checkpoint search outside the given paths; `extra_env`
    added to it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("YUE2_CHECKPOINT", "COMFYUI_PATH", "COMFYUI_DIR")}
    env.update(extra_env or {})
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-m", "yue2_core", *map(str, args)], cwd=cwd or REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def cli_inprocess(monkeypatch, capsys, *args, cwd=None, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """`run_cli(*args, cwd=cwd, extra_env=extra_env)` — its environment (no YUE2_CHECKPOINT/COMFYUI_DIR/COMFYUI_PATH,
    HF_HUB_OFFLINE=1, `extra_env` added) and working folder — but `main(args)` in this process, as a CompletedProcess
    for `assert_cli_error`. For the further inputs of a test whose first input ran as a real subprocess (saves a torch
    import per input, 2–4 s); an exception main() does not turn into an exit status fails the test, as the traceback
    on stderr would."""
    from yue2_core.__main__ import main
    with monkeypatch.context() as m:
        for name in ("YUE2_CHECKPOINT", "COMFYUI_PATH", "COMFYUI_DIR"):
            m.delenv(name, raising=False)
        m.setenv("HF_HUB_OFFLINE", "1")
        for name, value in (extra_env or {}).items():
            m.setenv(name, value)
        m.chdir(cwd or REPO)
        capsys.readouterr()
        try:
            rc = main([str(a) for a in args])
        except SystemExit as exit_:  # argparse
            rc = exit_.code
        out = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), rc, out.out, out.err)


def assert_cli_error(proc: subprocess.CompletedProcess, phrase: str) -> None:
    """Exit status 2, `phrase` on stderr, no Python traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert phrase in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]


def signal_when(proc: subprocess.Popen, marker: str, sig: int, timeout: float = 180.0) -> str:
    """Read `proc`'s stderr (text, piped) line by line; at the first line holding `marker` — the command is then in
    its work, past its signal handlers' installation — send `sig`; return all of stderr once the process ended.
    (A fixed sleep before the signal raced the child's start-up on a loaded machine: the default action then killed
    it before the handlers existed.) The process is killed after `timeout` seconds."""
    import threading
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    lines, sent = [], False
    try:
        for line in proc.stderr:
            lines.append(line)
            if not sent and marker in line:
                proc.send_signal(sig)
                sent = True
        proc.wait()
    finally:
        timer.cancel()
    assert sent, f"{marker!r} never appeared on stderr:\n" + "".join(lines)[-2000:]
    return "".join(lines)


def proc_stat(*cores) -> str:
    """A /proc/stat of the given (busy, idle) ticks per CPU (busy as user time), for the busy-CPU note's tests."""
    lines = [f"cpu  {sum(b for b, _ in cores)} 0 0 {sum(i for _, i in cores)} 0 0 0 0 0 0"]
    lines += [f"cpu{n} {b} 0 0 {i} 0 0 0 0 0 0" for n, (b, i) in enumerate(cores)]
    return "\n".join(lines + ["intr 1 2 3", "ctxt 5"]) + "\n"



class Forked:
    """A child process of this one (`os.fork`) that runs `body(child)` and exits (status 0, or 1 with the traceback
    sent up as its last line). For a second process that needs what this one already imported — yue2_core, torch:
    a fresh `python -c` spends 2–4 s importing them — and not a fresh interpreter. Two pipes join them:
    `child.say(text)` sends a line up, which `readline()` here returns; `child.readline()` returns what `send(text)`
    here sent down, '' once `close()` closed the way down (or this process ended). The child closes, first thing,
    the pipes of the `Forked` made before it (so that their `close()` is seen by their own child alone)."""

    _open: list = []  # the pipe ends this process holds, of every Forked still open

    def __init__(self, body):
        import traceback
        import warnings
        up_r, up_w = os.pipe()
        down_r, down_w = os.pipe()
        with warnings.catch_warnings():  # Python ≥ 3.12 warns of fork() in a process with threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: never returns into the caller (os._exit)
            status = 1
            try:
                for fd in Forked._open + [up_r, down_w]:
                    os.close(fd)
                self.pid = None  # the child's side
                self._up, self._down = os.fdopen(up_w, "w", buffering=1), os.fdopen(down_r, "r")
                body(self)
                status = 0
            except BaseException:
                try:
                    self.say("Traceback: " + traceback.format_exc().replace("\n", " | "))
                except BaseException:
                    pass
            finally:
                os._exit(status)
        os.close(up_w)
        os.close(down_r)
        self.pid = pid
        self._fds = [up_r, down_w]
        Forked._open.extend(self._fds)
        self._up, self._down = os.fdopen(up_r, "r"), os.fdopen(down_w, "w", buffering=1)

    def say(self, text: str) -> None:  # in the child
        self._up.write(text + "\n")

    def readline(self) -> str:
        """Here: the next line the child said ('' once it ended). In the child: the next line sent down."""
        return (self._down if self.pid is None else self._up).readline().rstrip("\n")

    def send(self, text: str) -> None:  # in the parent
        self._down.write(text + "\n")

    def close(self) -> None:
        """Close the way down (the child's `readline()` then returns '')."""
        if not self._down.closed:
            self._down.close()

    def end(self, timeout: float = 60.0, kill: bool = False) -> int:
        """Close both pipes (after SIGKILL with `kill`), wait for the child (killed after `timeout` s): its status."""
        import signal
        import time
        self.close()
        if kill:
            os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                _, status = os.waitpid(self.pid, 0)
                break
            time.sleep(0.01)
        self._up.close()
        for fd in self._fds:
            if fd in Forked._open:
                Forked._open.remove(fd)
        return os.waitstatus_to_exitcode(status)
