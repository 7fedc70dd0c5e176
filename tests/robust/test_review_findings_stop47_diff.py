"""Found reviewing the stop-47 change set (844151e..412a273): what its new code still got wrong."""
from __future__ import annotations

import os

import pytest


def _other_namespace_sweep(monkeypatch, target):
    """A `sweep_stale_tmps` of another run whose pid namespace does not hold this writer's pid (another container on
    the same volume): `os.kill(pid, 0)` says no such process, so only the writer's flock keeps its file."""
    from yue2_core.weights import synthetic

    def sweep():
        real_kill = os.kill

        def kill(pid, sig):
            raise ProcessLookupError(pid)
        monkeypatch.setattr(os, "kill", kill)
        try:
            return synthetic.sweep_stale_tmps(str(target))
        finally:
            monkeypatch.setattr(os, "kill", real_kill)
    return sweep


def _write(target):
    import torch
    from yue2_core.weights.synthetic import TensorSpec, write_safetensors_stream
    spec = TensorSpec("w", (2, 2), "F32", "normal", "w")
    return write_safetensors_stream(str(target), [spec], [torch.zeros(2, 2)], {})


def test_a_finished_checkpoint_write_keeps_its_lock_until_the_rename(tmp_path, monkeypatch):
    """The writer closed its temporary file — dropping the flock — before renaming it into place: a sweep of another
    pid namespace in that moment took the complete file, and the rename failed with a FileNotFoundError traceback
    after the whole checkpoint (7.8 GB for the full profile) had been written."""
    target = tmp_path / "t.safetensors"
    sweep = _other_namespace_sweep(monkeypatch, target)
    real_replace = os.replace
    swept = []

    def replace(src, dst, *a, **k):
        if str(src).endswith(".tmp"):
            swept.extend(sweep())
        return real_replace(src, dst, *a, **k)
    monkeypatch.setattr(os, "replace", replace)
    _write(target)
    assert target.is_file() and swept == [], swept


def test_a_checkpoint_write_swept_before_its_lock_starts_again(tmp_path, monkeypatch):
    """Between the temporary file's creation and the writer's flock, a sweep of another pid namespace could take
    the new, empty file: the writer then wrote the whole checkpoint into a file with no name and its rename failed
    (FileNotFoundError). The writer now checks, once it holds the lock, that the file is still its name's."""
    from yue2_core.weights import synthetic
    target = tmp_path / "t.safetensors"
    sweep = _other_namespace_sweep(monkeypatch, target)
    real_lock = synthetic._lock
    swept = []

    def lock(fd, wait):
        if wait and not swept:
            swept.extend(sweep())  # lands in the window: the file is there, unlocked
        return real_lock(fd, wait)
    monkeypatch.setattr(synthetic, "_lock", lock)
    _write(target)
    assert len(swept) == 1 and target.is_file()
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []


def test_an_interrupt_just_after_the_rename_still_syncs_the_rename(tmp_path, monkeypatch):
    """`write_song_dir` delivers an interrupt held over the rename right after it, and the parent folder's fsync —
    what makes the rename outlive a power cut (stop 45) — came after that delivery, so it never ran, though the
    command then says `interrupted after the song was saved: … is complete` and exits 0."""
    import signal
    from yue2_core import artifacts
    synced, real_rename, real_sync = [], os.rename, artifacts.fsync_folder

    def rename(src, dst, *a, **k):
        real_rename(src, dst, *a, **k)
        if str(src).endswith(".partial"):
            signal.raise_signal(signal.SIGINT)

    def fsync_folder(folder):
        synced.append((os.path.abspath(folder), os.path.isdir(tmp_path / "song")))
        return real_sync(folder)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(artifacts, "fsync_folder", fsync_folder)
    noted = []
    with pytest.raises(KeyboardInterrupt):
        artifacts.write_song_dir(tmp_path / "song", {"a.txt": b"x"}, {"status": "complete"}, on_saved=noted.append)
    assert noted == [tmp_path / "song"] and (tmp_path / "song" / "result.json").is_file()
    assert (str(tmp_path), True) in synced, synced  # the parent, after the rename


def test_the_readme_quotes_from_the_idle_cpu_log_only_what_it_holds():
    """README "How long" (stop 47) cited docs/experiments/cpu_song_times_2026-12-06_ac2d09f.log for ≈ 85 tokens/s,
    the render's 0.4 s and the VAE's 0.6 s; that log holds only whole-command seconds (bench/cpu_song_times.sh
    times the command). What stands before the citation, in the same list item, must be in the log."""
    import re
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    log_name = "cpu_song_times_2026-12-06_ac2d09f.log"
    log = (repo / "docs" / "experiments" / log_name).read_text("utf-8")
    readme = (repo / "README.md").read_text("utf-8")
    item = next(i for i in re.split(r"\n\s*- ", readme) if "idle 2-core machine" in i and log_name in i)
    before = " ".join(item.split(log_name)[0].split())
    assert "tokens/s" not in before or re.search(r"tok(ens)?/s", log), before
    logged = [float(x) for x in re.findall(r"(\d+(?:\.\d+)?) s\b", log)]
    for seconds in re.findall(r"(\d+(?:\.\d+)?) s\b", before):  # as rounded in the README
        assert any(abs(float(seconds) - x) <= 0.5 for x in logged), (seconds, before)
