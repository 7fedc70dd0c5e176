"""Findings of the 2026-12-06 break-it review (stop 43), docs/bad_inputs.md §20: files that change under a running
command (the checkpoint, a LoRA, a song folder's files)."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from robust_helpers import make_song
from yue2_core.artifacts import load_song, save_song
from yue2_core.errors import AdapterError, CheckpointError


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _after_ar_load(monkeypatch, action) -> None:
    """Run `action()` right after the engine has read the AR expert (while the checkpoint is still loading)."""
    import yue2_core.weights.checkpoint as ck
    real = ck.load_ar

    def load_ar(*args, **kwargs):
        out = real(*args, **kwargs)
        action()
        return out
    monkeypatch.setattr(ck, "load_ar", load_ar)


def test_a_lora_replaced_while_the_checkpoint_loads_is_recorded_as_the_file_applied(tmp_path, tiny_paths,
                                                                                    monkeypatch):
    """`generate --lora L` (or render, batch): L read, then replaced on disk (a trainer saving its next step under
    the same name) while the checkpoint's parts loaded. The song recorded the new file's sha256 beside the old file's
    weights, so `render` of it applied the new file without a word. Now the record is taken when the file is read."""
    from yue2_core.pipeline import YuE2Engine
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    dims = profile_dims("tiny")
    first = write_adapter("aitk", tmp_path / "first.safetensors", dims, seed=1)
    second = write_adapter("aitk", tmp_path / "second.safetensors", dims, seed=2)
    lora = tmp_path / "lora.safetensors"
    shutil.copyfile(first, lora)
    _after_ar_load(monkeypatch, lambda: os.replace(shutil.copyfile(second, tmp_path / "tmp"), lora))
    engine = YuE2Engine.load(tiny_paths["bf16"], device="cpu", loras=[(str(lora), 1.0, 1.0)], warm_up=False)
    (record,) = engine.weights["loras"]
    assert record["sha256"] == _sha(first) != _sha(lora)


def test_a_lora_changed_while_it_is_read_is_refused(tmp_path, tiny_paths, monkeypatch):
    """Replaced between its read and its record: neither file's hash is known to match the weights read."""
    import yue2_core.weights.lora.layouts as layouts
    from yue2_core.pipeline import YuE2Engine
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    dims = profile_dims("tiny")
    lora = write_adapter("aitk", tmp_path / "lora.safetensors", dims, seed=1)
    second = write_adapter("aitk", tmp_path / "second.safetensors", dims, seed=2)
    real = layouts.read_adapter

    def read_adapter(*args, **kwargs):
        out = real(*args, **kwargs)
        os.replace(second, lora)
        return out
    monkeypatch.setattr(layouts, "read_adapter", read_adapter)
    with pytest.raises(AdapterError, match="changed on disk while it was being read"):
        YuE2Engine.load(tiny_paths["bf16"], device="cpu", loras=[(str(lora), 1.0, 1.0)], warm_up=False)


def test_a_checkpoint_replaced_while_its_parts_load_is_refused(tmp_path, monkeypatch):
    """The CLI engine read the AR from one file and the NAR / VAE from the file put at its path meanwhile, and made
    a song of the mix (the nodes refuse it: `_root_patcher`). Now refused once the parts are read."""
    from yue2_core.pipeline import YuE2Engine
    from synthetic_cache import synthetic_link
    ckpt = tmp_path / "model.safetensors"  # the run's tiny bf16 files of seeds 0, 5 (hard links), each put by rename
    synthetic_link(ckpt, "tiny", "bf16")
    _after_ar_load(monkeypatch, lambda: os.replace(synthetic_link(tmp_path / "tmp", "tiny", "bf16", seed=5), ckpt))
    with pytest.raises(CheckpointError, match="changed on disk while it was being loaded .* may come from two files"):
        YuE2Engine.load(str(ckpt), device="cpu", warm_up=False)


def test_the_checkpoint_a_song_records_is_the_file_loaded(tmp_path):
    """`generate` took the checkpoint's sample hash when it saved the song: a file put at the checkpoint's path while
    the song was made (minutes with real weights) was recorded as the one used, so `render` used it without the
    "not the file this song was made with" warning. Now the sample is taken at load."""
    from yue2_core.pipeline import YuE2Engine
    from yue2_core.weights.checkpoint import content_sample
    from synthetic_cache import synthetic_link
    ckpt = tmp_path / "model.safetensors"  # the run's tiny bf16 files of seeds 0, 5 (hard links), each put by rename
    synthetic_link(ckpt, "tiny", "bf16")
    loaded = content_sample(str(ckpt))
    engine = YuE2Engine.load(str(ckpt), device="cpu", parts=("ar",), warm_up=False)
    os.replace(synthetic_link(tmp_path / "tmp", "tiny", "bf16", seed=5), ckpt)
    assert content_sample(str(ckpt)) != loaded
    assert engine.info.to_dict()["sample_sha256"] == loaded


def test_a_score_saved_while_the_song_folder_is_checked_is_never_taken_as_the_saved_one(tmp_path, monkeypatch):
    """load_song hashed score.abc, then (after hashing the other files, the audio among them) read it again to use
    it: an editor saving score.abc in between gave the new text as the unedited score, beside the saved ids — and
    `render` sealed that pair into a new song whose score.abc did not match its tokens. Now every parsed file is
    hashed and parsed from the same bytes."""
    import yue2_core.artifacts as artifacts
    song = save_song(make_song(), tmp_path / "song")
    saved_text = (song / "score.abc").read_text("utf-8")
    edited = saved_text + "% my edit\n"
    real = artifacts._sha256_file

    def sha256_file(path):
        if Path(path).name == "audio.flac":  # hashed after score.abc: the editor saves now
            (song / "score.abc").write_text(edited, "utf-8")
        return real(path)
    monkeypatch.setattr(artifacts, "_sha256_file", sha256_file)
    loaded = load_song(song, edited_ok=True)
    assert (loaded.score.abc, loaded.score_edited) == (saved_text, False)
    monkeypatch.setattr(artifacts, "_sha256_file", real)
    again = load_song(song, edited_ok=True)  # the next read sees the edit as an edit
    assert (again.score.abc, again.score_edited) == (edited, True)


def test_render_reads_the_weights_record_load_song_verified(tmp_path, monkeypatch):
    """render read config.json a second time (after load_song checked it) for the checkpoint and the adapters it
    records: one saved in between was used unchecked. Now render passes the verified record."""
    from yue2_core import __main__ as cli
    song = save_song(make_song(), tmp_path / "song")
    config = {"checkpoint": {"path": str(tmp_path / "verified.safetensors")}, "weights": {"loras": []}}
    (song / "config.json").write_text('{"checkpoint": {"path": "/elsewhere.safetensors"}}', "utf-8")
    assert cli._recorded_checkpoint(str(song), config) == str(tmp_path / "verified.safetensors")
    assert cli._recorded_checkpoint(str(song)) == "/elsewhere.safetensors"  # without one: the file, as before


CUT_WHILE_READ = r'''
import contextlib, os, sys
import safetensors
real = safetensors.safe_open


@contextlib.contextmanager
def cut_after_open(name, *args, **kwargs):
    with real(name, *args, **kwargs) as handle:
        os.truncate(sys.argv[1], 4096)  # `cp other.safetensors model.safetensors` truncates in place first
        yield handle


safetensors.safe_open = cut_after_open
from yue2_core.errors import CheckpointError
from yue2_core.pipeline import YuE2Engine
try:
    YuE2Engine.load(sys.argv[1], device="cpu", warm_up=False)
except CheckpointError as exc:
    print("ERROR " + str(exc))
'''


def test_a_checkpoint_cut_short_while_its_tensors_are_read_is_an_error_not_sigbus(tmp_path, tiny_paths):
    """The safetensors reader maps the file into memory; a file truncated in place after it was opened (a copy over
    it, a download tool writing in place) made the next tensor read end the process with SIGBUS — no message, and in
    ComfyUI the server with its queue. Tensors are now read with ordinary reads: a short read is a CheckpointError."""
    import subprocess
    import sys
    from robust_helpers import REPO
    ckpt = tmp_path / "model.safetensors"
    shutil.copyfile(tiny_paths["bf16"], ckpt)
    run = subprocess.run([sys.executable, "-c", CUT_WHILE_READ, str(ckpt)], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])  # was -7 (SIGBUS)
    assert "ERROR " in run.stdout and "but the file is 4,096 bytes now: it was cut short or is being rewritten" \
        in run.stdout, run.stdout


def test_tensors_read_without_the_memory_map_equal_the_readers_own(tiny_paths):
    """Every tensor (and a row slice) read by `open_tensors` equals what the safetensors reader gives, dtype and all,
    and owns its memory."""
    import torch
    from safetensors import safe_open
    from yue2_core.weights.checkpoint import open_tensors, read_header
    path = tiny_paths["int8"]
    entries, _, _ = read_header(path)
    with open_tensors(path) as ours, safe_open(path, framework="pt") as theirs:
        for key in entries:
            a, b = ours.get_tensor(key), theirs.get_tensor(key)
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), key
        key = next(k for k, e in entries.items() if len(e.shape) == 2 and e.shape[0] > 3)
        assert torch.equal(ours.get_slice(key)[1:3], theirs.get_slice(key)[1:3])
        first = ours.get_tensor(key)
        assert first.data_ptr() != ours.get_tensor(key).data_ptr()  # a new buffer per read, never a shared map


def _valid_score() -> str:
    return ("X:1\nT:\nM:4/4\nL:1/32\nQ:1/4=88\nV: Vocal clef=treble name=\"Vocal Melody\" snm=\"Vocal\"\n"
            "V: Ins clef=treble name=\"Ins Melody\" snm=\"Inst.\"\nK:C\n% verse\nV: Vocal\n\"C\"z8E8G8c8|\"G\"d16B16|\n"
            "V: Ins\nC,16G,16|Z|\n")


@pytest.mark.parametrize("case", ["comment", "voice", "header-voice", "key", "meter", "tempo", "unit", "tune",
                                  "one-line"])
def test_a_very_long_line_of_a_score_is_quoted_by_its_start_and_length(case):
    """A score with one very long line (a pasted paragraph as a section comment, a voice or key name run on): the
    check's warning quoted it whole — a 190 kB comment gave a 190 kB warning line on the terminal (CLI
    `--abc-file`, render of an edited score.abc), in the Composer's report and the editor. Now the quoted text is
    its first 40 characters and its length, as chord symbols were already."""
    from yue2_core.protocol import score_notes
    long = "w" * 100_000
    score = _valid_score()
    text = {"comment": score + f"% {long}\n",
            "voice": score.replace("V: Ins\nC,", f"V: {long}\nC,"),
            "header-voice": score.replace('V: Ins clef', f"V: I{long} clef"),
            "key": score.replace("K:C\n", f"K:{long}\n"),
            "meter": score.replace("M:4/4\n", f"M:{long}\n"),
            "tempo": score.replace("Q:1/4=88\n", f"Q:{long}\n"),
            "unit": score.replace("L:1/32\n", f"L:{long}\n"),
            "tune": score.replace("X:1\n", f"X:{long}\n"),
            "one-line": "X:1 " * 40_000}[case]
    notes = score_notes(text, 10)
    assert notes and max(len(n) for n in notes) < 600, [n[:120] for n in notes if len(n) >= 600]
    if case != "one-line":
        assert any("characters)" in n for n in notes), notes
