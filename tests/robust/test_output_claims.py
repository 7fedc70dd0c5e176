"""Catalogue rows: two runs given the same output at the same time (docs/bad_inputs.md §13). Before, nothing claimed
the folder while a song was computed: the second `generate` ran all four stages and then threw its song away at the
save ("exists and is not empty"), and two `batch --resume` on one folder computed the pending songs twice and left a
batch.json calling complete songs failed. Now the first run claims the path (`artifacts.reserve_output`) and the
second stops before loading anything, naming the first's pid. The claim is a kernel lock (flock) on a file beside the
output: it ends with its process however that ends, so a file left by a killed run is taken over."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from robust_helpers import Forked, assert_cli_error, cli_inprocess, run_cli
from yue2_core.artifacts import reserve_output
from yue2_core.errors import ArtifactError


@pytest.fixture
def holder():
    """`hold(path, what=None)` → the pid of another process of this host holding the claim on `path` through the
    test (another run in the middle of its work): a child of this process (`Forked`), killed at the end."""
    children = []

    def hold(path, what=None):
        def body(child):
            claim = reserve_output(path, *([what] if what else []))  # noqa: F841 (held until the process ends)
            child.say("held")
            child.readline()  # until the test ends (the pipe closed, or SIGKILL)
        child = Forked(body)
        children.append(child)
        assert child.readline() == "held"
        return child.pid
    yield hold
    for child in children:
        child.end(kill=True)


def _claim_file(path, pid, host=None) -> None:
    """A claim file as a run killed by SIGKILL leaves it: its content, no lock held on it."""
    lock = path.parent / f".{path.name}.yue2-lock"
    lock.write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(), "created": 0}))


def test_a_claim_stops_a_second_one_and_is_released(tmp_path):
    out = tmp_path / "songs" / "a"
    claim = reserve_output(out)
    lock = tmp_path / "songs" / ".a.yue2-lock"
    assert lock.is_file() and not out.exists()  # the parent is made, the folder is left to the save
    with pytest.raises(ArtifactError, match=r"is being written by another run \(pid \d+"):
        reserve_output(out)
    claim.release()
    assert not lock.exists()
    with reserve_output(out):  # free again
        assert lock.is_file()
    assert not lock.exists()


@pytest.mark.parametrize("left", ["dead pid", "own pid", "empty", "garbage", "huge pid", "other host"])
def test_a_claim_file_no_process_holds_is_taken_over(tmp_path, left):
    """Break-it findings (stop 32): an empty claim (a full disk, a kill between create and write) and a claim
    naming this process's own pid (pid namespaces restart at 1 after a container stop) blocked the output for good;
    a 20-digit pid raised OverflowError. The claim is a kernel lock now: a file no live process locks is free."""
    import os
    lock = tmp_path / ".song.yue2-lock"
    if left == "dead pid":
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True)
        _claim_file(tmp_path / "song", int(dead.stdout))
    elif left == "own pid":
        _claim_file(tmp_path / "song", os.getpid())
    elif left == "huge pid":
        _claim_file(tmp_path / "song", 10 ** 20)
    elif left == "other host":
        _claim_file(tmp_path / "song", 1, host="elsewhere")
    else:
        lock.write_bytes(b"" if left == "empty" else b"\xff\x00{")
    with reserve_output(tmp_path / "song") as claim:
        assert json.loads(claim.lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()


def test_a_live_holder_is_named_and_its_claim_never_removed(tmp_path, holder):
    pid = holder(tmp_path / "song")
    lock = tmp_path / ".song.yue2-lock"
    for _ in range(3):
        with pytest.raises(ArtifactError, match=f"being written by another run \\(pid {pid};"):
            reserve_output(tmp_path / "song")
    assert json.loads(lock.read_text())["pid"] == pid  # the refused attempts left it as it was


def test_a_folder_in_the_way_and_outputs_that_name_no_folder(tmp_path):
    (tmp_path / ".song.yue2-lock").mkdir()
    with pytest.raises(ArtifactError, match=r"\.song\.yue2-lock is a folder; remove it"):
        reserve_output(tmp_path / "song")
    for text in ("", "/", ".", ".."):  # no claim beside a root or the working folder; the output checks refuse them
        assert reserve_output(text).lock is None


def test_only_one_of_several_racing_runs_gets_the_claim(tmp_path):
    """Break-it finding: with the stale-file takeover of the first version, 8 of 30 races of 4 processes ended with
    two or three holders. Each process is told the common start time once it is ready (on a loaded machine the
    imports of fresh interpreters took longer than the fixed 1.5 s lead, so the processes came one after another
    rather than racing; they are children of this process now, `Forked`, with everything imported), and the one
    that gets the claim holds it until every process has reported (its pipe closed): with a fixed hold, a late
    process got the released claim too and failed the test (diff review, stop 49)."""
    import time
    _claim_file(tmp_path / "out", 999998)

    def body(child):
        start = float(child.readline())
        while time.time() < start:
            pass
        try:
            claim = reserve_output(tmp_path / "out")  # noqa: F841 (held until the process ends)
        except ArtifactError:
            child.say("refused")
            return
        child.say("got")
        child.readline()  # '' once the test closed the pipe: every other process has reported
    for trial in range(2):
        children = [Forked(body) for _ in range(4)]
        try:
            start = time.time() + 0.2
            for child in children:
                child.send(repr(start))
            outcomes = [child.readline() for child in children]  # each reports while the holder still holds
        finally:
            statuses = [child.end() for child in children]
        assert outcomes.count("got") == 1 and outcomes.count("refused") == 3, (trial, outcomes)
        assert statuses == [0] * 4, statuses


def test_generate_and_render_stop_before_loading_while_another_run_writes_the_output(tmp_path, holder,
                                                                                     tiny_paths, monkeypatch,
                                                                                     capsys):
    """`generate` as a subprocess, `render` in this process (`cli_inprocess`)."""
    out = tmp_path / "song"
    live_pid = holder(out)
    proc = run_cli("generate", "--checkpoint", tiny_paths["bf16"], "--offline", "--device", "cpu", "--style", "pop",
                   "--lyrics", "la", "--max-abc-tokens", "4", "--max-seconds", "1", "--steps", "1",
                   "--output", out, timeout=120)
    assert_cli_error(proc, f"is being written by another run (pid {live_pid}")
    assert "loading" not in proc.stderr.lower() and not out.exists()
    proc = cli_inprocess(monkeypatch, capsys, "render", tmp_path / "missing-song", "--output", out)
    assert_cli_error(proc, f"is being written by another run (pid {live_pid}")  # before the song is even read


def test_batch_stops_while_another_batch_works_on_its_folder(tmp_path, holder, tiny_paths):
    req = tmp_path / "r.jsonl"
    req.write_text(json.dumps({"id": "a", "style": "pop", "lyrics": "la"}) + "\n")
    out = tmp_path / "runs"
    live_pid = holder(out, "batch folder")
    proc = run_cli("batch", req, "--checkpoint", tiny_paths["bf16"], "--offline", "--device", "cpu",
                   "--max-seconds", "1", "--max-abc-tokens", "4", "--steps", "1", "--output", out, "--resume",
                   timeout=120)
    assert_cli_error(proc, f"batch folder {out} is being written by another run (pid {live_pid}")
    assert not out.exists()


def test_an_output_through_a_new_folder_and_dotdot_leaves_no_empty_folder(tmp_path):
    """Break-it finding (stop 38): `--output new/../song` saved ./song but left an empty `new/` behind (the claim and
    the save made the parents as written). The ".." is resolved first now: the song lands where the OS would put
    it, and no folder is made that the song does not sit in."""
    from robust_helpers import make_song
    from yue2_core.artifacts import save_song
    given = tmp_path / "new" / ".." / "song"
    with reserve_output(given):
        assert (tmp_path / ".song.yue2-lock").is_file()
        save_song(make_song(), given)
    assert (tmp_path / "song" / "result.json").is_file() and not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["song"]
