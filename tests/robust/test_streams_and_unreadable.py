"""Break-it findings of stop 30: a song saved but standard output failing (full, broken pipe, closed) or standard
error closed; unreadable adapters and song folders; a damaged all-in-one file taken for a VAE by `inspect`; checks
that came after the model loaded. Each: a clear message (or success), never a traceback, never a lost song."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from robust_helpers import REPO, assert_cli_error, cli_inprocess, make_song, run_cli
from yue2_core.errors import AdapterError, ArtifactError


def _generate(tiny, out: Path, **streams) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "YUE2_CHECKPOINT"}
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    args = [sys.executable, "-m", "yue2_core", "generate", "--checkpoint", tiny, "--style", "pop", "--lyrics", "la",
            "--cot", "off", "--max-seconds", "0.2", "--steps", "1", "--device", "cpu", "--output", str(out)]
    return subprocess.run(args, cwd=REPO, env=env, timeout=240, **streams)


def test_a_saved_song_with_stdout_full_or_closed_exits_0(tiny_paths, tmp_path):
    """`> /dev/full` (the summary cannot be written) and a closed stdout: exit 0, the song complete, a warning on
    stderr; a closed stderr (`2>&-`, pythonw) no longer crashes the progress line."""
    with open("/dev/full", "w") as full:
        proc = _generate(tiny_paths["bf16"], tmp_path / "a", stdout=full, stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "could not write to standard output (No space left on device); the song is saved" in proc.stderr
    assert "Traceback" not in proc.stderr and (tmp_path / "a" / "audio.flac").is_file()
    proc = _generate(tiny_paths["bf16"], tmp_path / "b", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                     text=True, pass_fds=(), close_fds=True, preexec_fn=lambda: os.close(1))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert (tmp_path / "b" / "audio.flac").is_file()
    proc = _generate(tiny_paths["bf16"], tmp_path / "c", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                     text=True, preexec_fn=lambda: os.close(2))
    assert proc.returncode == 0 and json.loads(proc.stdout)["output"] == str(tmp_path / "c")


def test_inspect_into_a_closed_pipe_exits_0_without_a_traceback(tiny_paths):
    """`inspect … | head` (review finding): the reader went away before the report was written — a
    BrokenPipeError traceback before; now nothing on stderr and exit 0. The pipe's read end is closed before the
    child writes (it is still importing torch)."""
    env = {k: v for k, v in os.environ.items() if k != "YUE2_CHECKPOINT"}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "yue2_core", "inspect", tiny_paths["bf16"]], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err[-2000:]
    assert "Traceback" not in err and "Broken pipe" not in err and "Exception ignored" not in err, err[-2000:]


def test_an_unreadable_adapter_is_an_adapter_error(tmp_path, monkeypatch):
    """chmod 000 on a --lora file gave a PermissionError traceback (the read error is injected: root reads any
    file)."""
    from safetensors.torch import save_file
    import torch
    from yue2_core.weights.lora import layouts_io
    path = tmp_path / "nr.safetensors"
    save_file({"w": torch.zeros(1)}, str(path))
    real = open

    def refusing(p, *a, **kw):
        if str(p) == str(path):
            raise PermissionError(13, "Permission denied")
        return real(p, *a, **kw)
    monkeypatch.setattr(layouts_io, "open", refusing, raising=False)
    monkeypatch.setattr("yue2_core.weights.checkpoint.open", refusing, raising=False)
    with pytest.raises(AdapterError, match="cannot read adapter .*nr.safetensors: Permission denied"):
        layouts_io.open_source(str(path))


def test_an_unreadable_song_folder_is_named(tmp_path, monkeypatch):
    """Python 3.11's pathlib raised PermissionError from `is_file()` inside an unreadable folder (render, resume);
    an unreadable result.json was called "damaged"."""
    from yue2_core import artifacts
    folder = artifacts.save_song(make_song(), tmp_path / "song")
    real = Path.is_file

    def refusing(self):
        if self == folder / "result.json":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)
    monkeypatch.setattr(Path, "is_file", refusing)
    with pytest.raises(ArtifactError, match="cannot read the song folder .*song: Permission denied"):
        artifacts.load_song(folder)
    monkeypatch.setattr(Path, "is_file", real)
    real_read = Path.read_text

    def refusing_read(self, *a, **kw):
        if self == folder / "result.json":
            raise PermissionError(13, "Permission denied")
        return real_read(self, *a, **kw)
    monkeypatch.setattr(Path, "read_text", refusing_read)
    with pytest.raises(ArtifactError, match="cannot read .*result.json: Permission denied"):
        artifacts.load_song(folder)


def test_inspect_names_a_damaged_checkpoint_not_a_vae(micro_paths, tmp_path, monkeypatch, capsys):
    """A checkpoint with one AR tensor removed was reported as "kind": "VAE decoder" with exit 0; with layer 0's
    first norm removed, the load said the AR expert has no layers. (The first file inspected as a subprocess, the
    second in this process.)"""
    import struct
    raw = Path(micro_paths["bf16"]).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    for key, words in (("text_encoders.model.layers.1.self_attn.qkv_proj.weight", "missing tensor text_encoders"),
                       ("text_encoders.model.layers.0.input_layernorm.weight", "layer 0 of the AR expert is "
                                                                              "incomplete")):
        header = json.loads(raw[8:8 + n])
        header.pop(key)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        bad = tmp_path / "damaged.safetensors"
        bad.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
        proc = run_cli("inspect", bad) if "qkv_proj" in key else cli_inprocess(monkeypatch, capsys, "inspect", bad)
        assert_cli_error(proc, "is a YuE2 checkpoint that does not load")
        assert words in proc.stderr and "VAE" not in proc.stdout


def test_late_checks_now_come_before_loading(tmp_path, monkeypatch, capsys):
    """`render --seed -1` was refused only after the checkpoint loaded; `make-synthetic` under a file said
    "File exists". (`render` as a subprocess, `make-synthetic` in this process.)"""
    from yue2_core import artifacts
    song = artifacts.save_song(make_song(), tmp_path / "song")
    assert_cli_error(run_cli("render", song, "--seed", "-1", "--checkpoint", tmp_path / "none.safetensors",
                             "--output", tmp_path / "again"), "--seed must be an integer in [0, ")
    (tmp_path / "afile").write_text("x")
    assert_cli_error(cli_inprocess(monkeypatch, capsys, "make-synthetic", "--output",
                                   tmp_path / "afile" / "x.safetensors"),
                     "afile is a file, not a folder")
