"""Catalogue rows: two runs given the same output at the same time (docs/bad_inputs.md §13). Before, nothing claimed
the folder while a song was computed: the second `generate` ran all four stages and then threw its song away at the
save ("exists and is not empty"), and two `batch --resume` on one folder computed the pending songs twice and left a
batch.json calling complete songs failed. Now the first run claims the path (`artifacts.reserve_output`) and the
second stops before loading anything, naming the first's pid; a claim whose process has ended is taken over."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from robust_helpers import assert_cli_error, run_cli
from yue2_core.artifacts import reserve_output
from yue2_core.errors import ArtifactError


@pytest.fixture
def live_pid():
    """The pid of a process of this host that lives through the test (another run)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _claim(path, pid: int) -> None:
    lock = path.parent / f".{path.name}.yue2-lock"
    lock.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "created": 0}))


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


def test_a_claim_of_an_ended_process_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _claim(tmp_path / "song", int(dead.stdout))  # that pid has exited (a run killed by SIGKILL)
    with reserve_output(tmp_path / "song") as claim:
        assert json.loads(claim.lock.read_text())["pid"] != int(dead.stdout)


def test_a_claim_is_never_removed_by_another_process(tmp_path, live_pid):
    _claim(tmp_path / "song", live_pid)
    claim = reserve_output(tmp_path / "elsewhere")
    claim.lock = tmp_path / ".song.yue2-lock"  # even pointed at it, release removes only this process's own claim
    claim.release()
    assert (tmp_path / ".song.yue2-lock").is_file()


def test_generate_and_render_stop_before_loading_while_another_run_writes_the_output(tmp_path, live_pid,
                                                                                     tiny_paths):
    out = tmp_path / "song"
    _claim(out, live_pid)
    proc = run_cli("generate", "--checkpoint", tiny_paths["bf16"], "--offline", "--device", "cpu", "--style", "pop",
                   "--lyrics", "la", "--max-abc-tokens", "4", "--max-seconds", "1", "--steps", "1",
                   "--output", out, timeout=120)
    assert_cli_error(proc, f"is being written by another run (pid {live_pid}")
    assert "loading" not in proc.stderr.lower() and not out.exists()
    proc = run_cli("render", tmp_path / "missing-song", "--output", out, timeout=120)
    assert_cli_error(proc, f"is being written by another run (pid {live_pid}")  # before the song is even read


def test_batch_stops_while_another_batch_works_on_its_folder(tmp_path, live_pid, tiny_paths):
    req = tmp_path / "r.jsonl"
    req.write_text(json.dumps({"id": "a", "style": "pop", "lyrics": "la"}) + "\n")
    out = tmp_path / "runs"
    _claim(out, live_pid)
    proc = run_cli("batch", req, "--checkpoint", tiny_paths["bf16"], "--offline", "--device", "cpu",
                   "--max-seconds", "1", "--max-abc-tokens", "4", "--steps", "1", "--output", out, "--resume",
                   timeout=120)
    assert_cli_error(proc, f"batch folder {out} is being written by another run (pid {live_pid}")
    assert not out.exists()
