"""Catalogue rows: song directories (docs/bad_inputs.md §4) — damaged artifacts, unsafe names, an occupied target,
a full or read-only disk, failures at every step of a save. Every refusal is an ArtifactError; a failed save leaves
nothing behind and never touches an existing song."""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from robust_helpers import listing, make_song, snapshot
from yue2_core import artifacts
from yue2_core.artifacts import load_song, save_song
from yue2_core.errors import ArtifactError, ScoreError


class _Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _rehash(root: Path, name: str) -> None:
    result = json.loads((root / "result.json").read_text("utf-8"))
    data = (root / name).read_bytes()
    result["artifacts"][name].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (root / "result.json").write_text(json.dumps(result), "utf-8")


@pytest.fixture
def saved(tmp_path):
    return save_song(make_song(), tmp_path / "song")


def test_artifact_hash_mismatch_refused(saved, tokenizer, tmp_path):
    good = load_song(saved)
    assert good.tokens.codes and good.latents.shape == (8, 64)
    for name in ("semantic.npy", "audio.flac", "prefix.npy", "request.json", "latent.npy"):
        root = Path(shutil.copytree(saved, tmp_path / f"bad_{name}"))
        if name == "audio.flac":  # a byte after its last frame decodes to the saved samples (accepted as "tagged",
            (root / name).write_bytes((root / name).read_bytes()[:-1])  # stop 47): one byte short is damage
        else:
            with open(root / name, "ab") as f:
                f.write(b"\x00")
        with pytest.raises(ArtifactError, match=rf"{name} is [\d,]+ bytes but result.json lists [\d,]+ \(modified"):
            load_song(root, tokenizer)  # a changed size is caught before hashing
        root = Path(shutil.copytree(saved, tmp_path / f"flip_{name}"))
        data = bytearray((root / name).read_bytes())
        data[-1] ^= 1
        (root / name).write_bytes(bytes(data))
        with pytest.raises(ArtifactError, match=rf"{name} does not match its sha256 in result.json"):
            load_song(root, tokenizer)
    root = Path(shutil.copytree(saved, tmp_path / "edited"))
    (root / "score.abc").write_text("X:1\nT:\nM:3/4\nL:1/16\nQ:1/4=90\nK:G\n", "utf-8")
    with pytest.raises(ArtifactError, match="score.abc does not match its sha256"):
        load_song(root)  # without a tokenizer an edited score cannot be used
    edited = load_song(root, tokenizer)  # with one, the edit is taken and flagged
    assert edited.score_edited and edited.score.source == "user" and "M:3/4" in edited.score.abc
    (root / "score.abc").write_text("   ", "utf-8")
    with pytest.raises(ScoreError, match="the ABC score is empty"):
        load_song(root, tokenizer)


def test_artifact_missing_unlisted_symlinked_or_pickled_refused(saved, tmp_path):
    cases = {}
    root = Path(shutil.copytree(saved, tmp_path / "missing"))
    (root / "semantic.npy").unlink()
    cases[root] = "semantic.npy is missing"
    root = Path(shutil.copytree(saved, tmp_path / "unlisted"))
    result = json.loads((root / "result.json").read_text())
    result["artifacts"].pop("prefix.npy")
    (root / "result.json").write_text(json.dumps(result))
    cases[root] = "does not list prefix.npy"
    root = Path(shutil.copytree(saved, tmp_path / "traversal"))
    result = json.loads((root / "result.json").read_text())
    result["artifacts"]["../../etc/passwd"] = {"sha256": "0" * 64}
    (root / "result.json").write_text(json.dumps(result))
    cases[root] = "unsafe file name '../../etc/passwd'"
    root = Path(shutil.copytree(saved, tmp_path / "symlink"))
    outside = tmp_path / "outside.npy"
    shutil.copyfile(root / "semantic.npy", outside)
    (root / "semantic.npy").unlink()
    (root / "semantic.npy").symlink_to(outside)
    cases[root] = "a symbolic link is not accepted"
    root = Path(shutil.copytree(saved, tmp_path / "folder"))
    (root / "semantic.npy").unlink()
    (root / "semantic.npy").mkdir()
    cases[root] = "semantic.npy is a folder, not a file"
    root = Path(shutil.copytree(saved, tmp_path / "fifo"))  # break-it: a FIFO was reported as "missing"
    (root / "semantic.npy").unlink()
    os.mkfifo(root / "semantic.npy")
    cases[root] = "semantic.npy is not a regular file (a pipe"
    marker = tmp_path / "UNPICKLED"
    root = Path(shutil.copytree(saved, tmp_path / "pickle"))
    buf = io.BytesIO()
    np.save(buf, np.array([_Boom(str(marker))], dtype=object), allow_pickle=True)
    (root / "semantic.npy").write_bytes(buf.getvalue())
    _rehash(root, "semantic.npy")  # the hash matches: the loader itself must refuse the pickle
    cases[root] = "semantic.npy is not a readable .npy array"
    root = Path(shutil.copytree(saved, tmp_path / "range"))
    buf = io.BytesIO()
    np.save(buf, np.array([1, 40000], dtype=np.int32))
    (root / "semantic.npy").write_bytes(buf.getvalue())
    _rehash(root, "semantic.npy")
    cases[root] = "semantic.npy holds values outside [0, 32768)"
    for root, phrase in cases.items():
        with pytest.raises(ArtifactError) as info:
            load_song(root)
        assert phrase in str(info.value), (root.name, str(info.value))
    assert not marker.exists()
    with pytest.raises(ArtifactError, match="nothing_here does not exist"):
        load_song(tmp_path / "nothing_here")


def test_output_dir_exists_and_not_empty_refused(saved, tmp_path):
    before = snapshot(saved)
    with pytest.raises(ArtifactError, match="exists and is not empty; choose a new name"):
        save_song(make_song(seed=9), saved)
    assert snapshot(saved) == before  # the earlier song is intact
    a_file = tmp_path / "file.txt"
    a_file.write_text("keep me")
    with pytest.raises(ArtifactError, match="exists and is not empty"):
        save_song(make_song(), a_file)
    assert a_file.read_text() == "keep me"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert load_song(save_song(make_song(), empty)).tokens.codes  # an empty folder may be used
    assert sorted(listing(tmp_path)) == ["empty", "file.txt", "song"]  # no temporary folders left


def _try_mount(path: Path, options: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    return proc.returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True)


def _check_failed_save(parent: Path, old: Path, before_old: dict, before_list: list, call, phrase: str):
    with pytest.raises(ArtifactError) as info:
        call()
    assert phrase in str(info.value), str(info.value)
    assert "nothing was written" in str(info.value) or "cannot write into" in str(info.value)
    assert listing(parent) == before_list  # no partial song, no temporary folder
    assert snapshot(old) == before_old  # the earlier song is untouched


def test_disk_full_clear_error_earlier_files_intact(tmp_path, monkeypatch):
    # simulated: the third file write hits ENOSPC (works everywhere)
    old = save_song(make_song(frames=2), tmp_path / "old")
    before_old, before_list = snapshot(old), listing(tmp_path)
    real = Path.write_bytes
    calls = []

    def full(self, data):
        calls.append(self.name)
        if len(calls) == 3:
            real(self, data[: len(data) // 2])  # a partial file first, as a real full disk leaves
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, data)
    monkeypatch.setattr(Path, "write_bytes", full)
    _check_failed_save(tmp_path, old, before_old, before_list, lambda: save_song(make_song(), tmp_path / "new"),
                       "No space left on device")
    monkeypatch.undo()
    # real: a 256 KiB tmpfs, where the mount is allowed (root in CI containers)
    disk = tmp_path / "tmpfs"
    disk.mkdir()
    if not _try_mount(disk, "size=256k"):
        return
    try:
        old = save_song(make_song(frames=2), disk / "old")
        before_old, before_list = snapshot(old), listing(disk)
        _check_failed_save(disk, old, before_old, before_list,
                           lambda: save_song(make_song(frames=200), disk / "big"), "No space left on device")
    finally:
        _umount(disk)


def test_read_only_output_clear_error(tmp_path, monkeypatch):
    # simulated: the file system refuses to create anything (EROFS), works as any user
    old = save_song(make_song(frames=2), tmp_path / "old")
    before_old, before_list = snapshot(old), listing(tmp_path)

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    _check_failed_save(tmp_path, old, before_old, before_list, lambda: save_song(make_song(), tmp_path / "new"),
                       "Read-only file system")
    monkeypatch.undo()
    # real: a read-only tmpfs (root) or a chmod 555 folder (other users; root ignores permissions)
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        old = save_song(make_song(frames=2), ro / "old")
        before_old, before_list = snapshot(old), listing(ro)
        ro.chmod(0o555)
        try:
            _check_failed_save(ro, old, before_old, before_list, lambda: save_song(make_song(), ro / "new"),
                               "Permission denied")
        finally:
            ro.chmod(0o755)
        return
    if not _try_mount(ro, "size=1m"):
        return
    try:
        old = save_song(make_song(frames=2), ro / "old")
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True, capture_output=True)
        before_old, before_list = snapshot(old), listing(ro)
        _check_failed_save(ro, old, before_old, before_list, lambda: save_song(make_song(), ro / "new"),
                           "Read-only file system")
    finally:
        _umount(ro)


@pytest.mark.parametrize("step", ["mkdtemp", "write", "fsync", "rename", "cancel"])
def test_unwritable_output_nothing_partial(tmp_path, monkeypatch, step):
    old = save_song(make_song(frames=2), tmp_path / "old")
    before_old, before_list = snapshot(old), listing(tmp_path)
    error = OSError(errno.EACCES, os.strerror(errno.EACCES))
    real_write, real_fsync, real_rename = Path.write_bytes, os.fsync, os.rename

    def fail(*args, **kwargs):
        raise error
    if step == "mkdtemp":
        monkeypatch.setattr(tempfile, "mkdtemp", fail)
    elif step == "write":
        monkeypatch.setattr(Path, "write_bytes", lambda self, data: fail() if self.name == "latent.npy" else
                            real_write(self, data))
    elif step == "fsync":
        monkeypatch.setattr(os, "fsync", fail)
    elif step == "rename":
        monkeypatch.setattr(os, "rename", fail)
    else:  # the user cancels in the middle of the save: re-raised, nothing kept
        def interrupt(self, data):
            if self.name == "audio.flac":
                raise KeyboardInterrupt
            return real_write(self, data)
        monkeypatch.setattr(Path, "write_bytes", interrupt)
        with pytest.raises(KeyboardInterrupt):
            save_song(make_song(), tmp_path / "new")
        monkeypatch.undo()
        assert listing(tmp_path) == before_list and snapshot(old) == before_old
        return
    _check_failed_save(tmp_path, old, before_old, before_list, lambda: save_song(make_song(), tmp_path / "new"),
                       "Permission denied")
    monkeypatch.undo()
    assert (real_write, real_fsync, real_rename) == (Path.write_bytes, os.fsync, os.rename)
    assert load_song(save_song(make_song(), tmp_path / "new")).tokens.codes  # and the next save works


def test_song_name_helper_rejects_traversal(tmp_path):
    for bad in ("../escape", "/abs", "CON", "x/..", ".."):
        with pytest.raises(ArtifactError, match="is not allowed"):
            artifacts.safe_name(bad)
    assert not (tmp_path.parent / "escape").exists()


def test_stale_partial_folders_are_swept(tmp_path):
    """A process killed mid-save (SIGKILL) leaves a hidden .NAME.XXXX.partial folder: the next save into the same
    folder removes those older than an hour and leaves a fresh one (another save in progress) alone."""
    import os
    import time

    from robust_helpers import make_song
    from yue2_core.artifacts import PARTIAL_MARKER
    old = tmp_path / ".dead.abc12345.partial"
    fresh = tmp_path / ".busy.def45678.partial"
    for d in (old, fresh):
        d.mkdir()
        (d / "audio.flac").write_bytes(b"x")
        (d / PARTIAL_MARKER).write_text('{"pid": %d, "host": "?"}' % os.getpid())  # what a save writes first
    past = time.time() - 7200
    os.utime(old, (past, past))
    save_song(make_song(), tmp_path / "new")
    assert not old.exists() and fresh.exists() and (tmp_path / "new" / "result.json").is_file()


def test_output_parent_that_refuses_a_real_write_is_named_before_work(tmp_path, monkeypatch):
    """Break-it finding: the output check trusted os.access, which says yes where a write fails (a read-only mount
    seen by root, ACLs, FUSE); a test folder is now made and removed, and its failure is named before loading."""
    import errno
    import tempfile
    from yue2_core.__main__ import _check_output
    from yue2_core.errors import YuE2Error
    assert _check_output(str(tmp_path / "song")) == tmp_path / "song"
    assert list(tmp_path.iterdir()) == []  # the test folder is gone

    def refuse(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    with pytest.raises(YuE2Error, match="Read-only file system") as e:
        _check_output(str(tmp_path / "song"))
    assert str(tmp_path) in str(e.value)


@pytest.mark.parametrize("change,phrase", [
    (lambda s: s.latents.fill_(float("nan")), "latents hold NaN or infinite values"),
    (lambda s: s.latents.mul_(1e76), "latents hold NaN or infinite values"),  # finite in float64, inf in float32
    (lambda s: s.audio.__setitem__((0, 5), float("nan")), "audio holds NaN or infinite samples"),
    (lambda s: s.settings.update(ode_steps=10 ** 9), "ode_steps must be an integer in [1, 1000]"),
    (lambda s: s.settings.update(rope_theta=float("inf")), "config.json cannot be written"),
])
def test_what_load_song_would_refuse_is_not_saved(tmp_path, change, phrase):
    """Break-it findings: Save Song wrote NaN/inf latents and a 10⁹ ode_steps that Load Song then refused, failed with
    an empty AssertionError on NaN audio, and a non-finite setting raised ValueError after the work was done. Each is
    an ArtifactError before anything is written."""
    song = make_song()
    song.latents = song.latents.double() * 1e-3 + 1.0  # float64: ×1e76 is finite there, inf as float32
    change(song)
    with pytest.raises(ArtifactError, match=phrase.replace("[", r"\[").replace("]", r"\]")):
        save_song(song, tmp_path / "song")
    assert not (tmp_path / "song").exists() and listing(tmp_path) == []


def test_numpy_settings_and_large_latents_still_save(tmp_path):
    """Second break-it review: an np.int64 ode_steps was refused ("must be an integer"), and json.dumps could not
    write numpy scalars at all; large finite latents and audio at exactly ±1 are valid."""
    song = make_song()
    song.settings["ode_steps"] = np.int64(4)
    song.settings["cfg_scale"] = np.float32(1.5)
    song.latents = song.latents * 1e30
    song.audio[:, :4] = 1.0
    song.audio[:, 4:8] = -1.0
    folder = save_song(song, tmp_path / "song")
    config = json.loads((Path(folder) / "config.json").read_text())
    assert config["ode_steps"] == 4 and config["cfg_scale"] == 1.5
    assert load_song(folder).latents.abs().max() > 1e29


def test_an_edited_score_saved_in_latin1_is_named_with_its_byte(tmp_path):
    """Before: "score.abc is not UTF-8 text ('utf-8' codec can't decode byte 0xff in position 8: invalid start
    byte)"; now the byte, its offset and what to do, as for the lyrics file (break-it review, stop 32)."""
    root = save_song(make_song(), tmp_path / "s")
    text = (root / "score.abc").read_bytes()
    (root / "score.abc").write_bytes(text[:8] + b"\xff" + text[8:])
    with pytest.raises(ArtifactError, match=r"score.abc is not UTF-8 text: byte 0xFF at offset 8 .*save the file "
                                            r"as UTF-8"):
        load_song(root, edited_ok=True)
