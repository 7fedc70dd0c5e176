"""Found by the stop-52 never-lose-work review (docs/bad_inputs.md §43): writers that share an output folder, saves
killed at every step, and outputs inside another song's folder."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time

import pytest

from robust_helpers import Forked, make_song, snapshot
from test_cli import main_inprocess
from yue2_core import artifacts
from yue2_core.artifacts import PARTIAL_MARKER, load_song, rename_gate, save_song

NO_CKPT = "/nonexistent/yue2.safetensors"  # reaching the checkpoint would print "checkpoint not found"


def _next(root, prefix="song"):
    """The Save Song node's numbering (nodes/songs.py `next_song_dir`): one past the highest existing number."""
    numbers = [int(p.name.rsplit("_", 1)[1]) for p in root.glob(f"{prefix}_*")]
    return root / f"{prefix}_{max(numbers, default=0) + 1:05d}"


def _hidden(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def test_a_song_whose_number_another_writer_took_goes_to_the_next_free_one(tmp_path, monkeypatch):
    """Two ComfyUI servers saving into one output folder (one per GPU) both pick song_0000N. Before: the loser's
    rename failed, Save Song wrote the whole song again under the next number, and after the third such collision
    said "could not find a free song folder" — the computed song was lost. Now the finished temporary folder is
    renamed to the next free number at once (written once), whether the number was taken while the files were
    encoded or during the write; the other writers' songs are untouched."""
    root = tmp_path / "yue2"
    root.mkdir()
    other = save_song(make_song(seed=1), root / "song_00001")
    theirs = snapshot(other)
    made = []
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(artifacts.tempfile, "mkdtemp", lambda *a, **k: made.append(1) or mkdtemp(*a, **k))
    taken = []

    @contextlib.contextmanager
    def another_writer_renames_first():  # entered right before each rename on this thread
        if not taken:  # this save's: another writer's song takes the number it chose
            taken.append(None)
            taken[0] = save_song(make_song(seed=2), _next(root))
        yield

    with rename_gate(another_writer_renames_first):
        path = save_song(make_song(seed=3), _next(root), next_free=lambda: _next(root))
    assert len(made) == 2  # this save's temporary folder and the other writer's: the song was written once
    assert taken == [root / "song_00002"] and path == root / "song_00003"
    assert load_song(path).tokens.seed == 3 and snapshot(other) == theirs
    assert load_song(taken[0]).tokens.seed == 2 and _hidden(root) == []
    # taken before the save began (while the song's files were encoded): the next free number, no error
    late = save_song(make_song(seed=4), root / "song_00002", next_free=lambda: _next(root))
    assert late == root / "song_00004" and load_song(taken[0]).tokens.seed == 2
    # without next_free (the command line's --output): still refused, nothing written, the song there untouched
    with pytest.raises(artifacts.ArtifactError, match="exists and is not empty"):
        save_song(make_song(seed=5), root / "song_00002")
    assert load_song(taken[0]).tokens.seed == 2 and _hidden(root) == []


def test_a_save_killed_at_its_rename_is_swept_not_kept_hidden(tmp_path):
    """SIGKILL after every file was written and synced, just before the rename into place. Before: the marker had
    been removed already, so the hidden `.NAME.XXXXXXXX.partial` — a complete song no list shows — was kept forever
    (4 of 58 kill points of `generate` left one). Now the marker stays until the rename: the next save sweeps the
    folder (its writer is dead), and a saved song holds no marker."""
    earlier = save_song(make_song(seed=1), tmp_path / "earlier")
    before = snapshot(earlier)

    def body(child):
        @contextlib.contextmanager
        def killed():
            os.kill(os.getpid(), signal.SIGKILL)
            yield

        with rename_gate(killed):
            save_song(make_song(seed=2), tmp_path / "killed")

    status = Forked(body).end()
    assert status == -signal.SIGKILL and not (tmp_path / "killed").exists()
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".killed.")]
    assert len(left) == 1 and (left[0] / "result.json").is_file() and (left[0] / PARTIAL_MARKER).is_file()
    after = save_song(make_song(seed=3), tmp_path / "next")
    assert _hidden(tmp_path) == [] and snapshot(earlier) == before
    assert not (after / PARTIAL_MARKER).exists() and load_song(after).tokens.seed == 3


def test_a_save_killed_before_its_marker_is_swept_once_old(tmp_path):
    """SIGKILL between making the temporary folder and writing its marker (an empty folder), or a power cut before
    the marker reached the disk (an empty marker file beside empty song files). Before: no readable marker, so never
    swept, however old. Now both go once older than an hour — a fresh one may be a save just starting and stays —
    and a look-alike folder holding someone's files without our marker is still never touched."""
    old = time.time() - 7200
    empty = tmp_path / ".a.abcdefgh.partial"
    blank = tmp_path / ".b.abcdefgh.partial"
    fresh = tmp_path / ".c.abcdefgh.partial"
    theirs = tmp_path / ".notes.abcdefgh.partial"
    for d in (empty, blank, fresh, theirs):
        d.mkdir()
    (blank / PARTIAL_MARKER).write_bytes(b"")
    (blank / "audio.flac").write_bytes(b"")
    (theirs / "notes.txt").write_text("mine")
    for d in (empty, blank, theirs):
        os.utime(d, (old, old))
    save_song(make_song(), tmp_path / "new")
    assert _hidden(tmp_path) == [fresh.name, theirs.name]
    assert (theirs / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("command", ["generate", "render", "batch"])
def test_an_output_inside_another_song_folder_is_refused(tmp_path, capsys, command):
    """`render A --output B/v2` (B another song), or the same through a link to B: before, the new song was written
    inside B's folder, where no song list (Load Song, `render out`'s hint) shows it and deleting the take B deletes
    it too; `generate` and `batch` likewise. Now refused before any work (`generate` / `render`: before the
    checkpoint is looked for; `batch`: with its other output checks), naming B; B is byte-identical. A project folder
    holding a config.json and a result.json of another tool is no song folder."""
    from yue2_core.batch.driver import check_output
    a = save_song(make_song(seed=1), tmp_path / "a")
    b = save_song(make_song(seed=2), tmp_path / "b")
    before = snapshot(b)
    (tmp_path / "link").symlink_to("b")
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.json").write_text("{}")
    (project / "result.json").write_text("{}")

    def refusal(out) -> str | None:
        if command == "batch":
            try:
                check_output(out, {"s1"}, False)
            except artifacts.ArtifactError as exc:
                return str(exc)
            return None
        run = ("generate", "--style", "pop", "--lyrics", "la") if command == "generate" else ("render", a)
        rc, err = main_inprocess(capsys, *run, "--offline", "--checkpoint", NO_CKPT, "--output", out)
        assert rc == 2, err
        return None if "checkpoint not found" in err else err

    for out in (b / "v2", tmp_path / "link" / "v2", b / "deep" / "v2"):
        err = refusal(out)
        assert err is not None and f"is inside the song folder {out.parent if out.parent != b / 'deep' else b}" in err
    assert snapshot(b) == before
    assert refusal(project / "v2") is None
