"""Leftovers of the stop-49 reviews, fixed in stop 50 (docs/bad_inputs.md §39): a disk quota with some room left, but
less than the song, is said before any work (it failed only at the save); see also
tests/weights/test_lora_layouts.py::test_kohya_unet_keys_spelled_alike_go_to_the_nar_beside_te_keys."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections import namedtuple

import pytest

from test_cli import main_inprocess
import yue2_core.artifacts as artifacts
from yue2_core.artifacts import free_space_note, room_refused, song_bytes_bound


@pytest.fixture
def small_fs(tmp_path):
    """A real 1 MiB tmpfs (needs the right to mount, as CI's root has); unmounted afterwards."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_room_refused_asks_the_file_system_itself(small_fs, tmp_path):
    """fallocate(2) on a real small file system: more than it holds is refused with ENOSPC, less is given; the
    probe's file is gone either way."""
    assert room_refused(small_fs, 4 << 20) == errno.ENOSPC
    assert room_refused(small_fs, 64 << 10) is None
    assert room_refused(tmp_path, 8 << 20) is None
    assert os.listdir(small_fs) == [] and sorted(os.listdir(tmp_path)) == ["small"]


def test_a_quota_smaller_than_the_song_is_noted_before_any_work(small_fs, monkeypatch):
    """Was: the free-space note read statvfs only, which shows the disk and not the user's quota: a quota with some
    room left, but less than the song, failed at the save after the song was computed. The disk here reports plenty
    (as with a quota), the file system refuses the room: the note says so."""
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(artifacts.shutil, "disk_usage", lambda p: usage(1 << 40, 0, 1 << 40))
    need = song_bytes_bound(750)[1]
    note = free_space_note(small_fs, [750])
    assert note is not None and f"but the file system there gave no room for {need / 1e6:,.1f} MB" in note, note
    assert os.listdir(small_fs) == []
    assert free_space_note(small_fs.parent, [750]) is None  # room there: nothing to say


def test_generate_warns_of_a_used_up_quota_before_loading(tmp_path, capsys, monkeypatch):
    """The CLI prints the quota note before the checkpoint is even looked for (EDQUOT: the quota's wording)."""
    monkeypatch.setattr(artifacts, "room_refused", lambda folder, n: errno.EDQUOT)
    rc, err = main_inprocess(capsys, "generate", "--style", "pop", "--lyrics", "la", "--checkpoint",
                             "/nonexistent/yue2.safetensors", "--offline", "--max-seconds", "30",
                             "--output", tmp_path / "song")
    assert rc == 2 and "warning: " in err and "but your disk quota there gave no room for" in err, err
    assert "(`quota -s` shows the quota)" in err and err.index("quota") < err.index("/nonexistent"), err
    assert shutil.disk_usage(tmp_path).free > song_bytes_bound(750)[1]
