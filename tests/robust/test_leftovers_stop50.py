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


def _mount(mnt, *args) -> None:
    mnt.mkdir()
    done = subprocess.run(["mount", *args, str(mnt)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount {args} here: {done.stderr.decode(errors='replace').strip()}")


@pytest.fixture
def small_fs(tmp_path):
    """A real 8 MiB ext4 in a loop-mounted image (needs mkfs.ext4 and the right to mount, as CI's root has);
    unmounted afterwards. (Review 50: the probe skips tmpfs, whose fallocate takes RAM.)"""
    image, mnt = tmp_path / "small.img", tmp_path / "small"
    with open(image, "wb") as f:
        f.truncate(8 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-m", "0", str(image)], capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot make an ext4 image here: {made.stderr.decode(errors='replace').strip()}")
    _mount(mnt, "-o", "loop", str(image))
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 1 MiB tmpfs; unmounted afterwards."""
    mnt = tmp_path / "tmpfs"
    _mount(mnt, "-t", "tmpfs", "-o", "size=1m", "tmpfs")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def _entries(folder) -> list[str]:
    return sorted(set(os.listdir(folder)) - {"lost+found"})


def test_room_refused_asks_the_file_system_itself(small_fs, tmp_path):
    """fallocate(2) on a real small file system: more than it holds is refused with ENOSPC, less is given; the
    probe's file is gone either way."""
    assert room_refused(small_fs, 64 << 20) == errno.ENOSPC
    assert room_refused(small_fs, 64 << 10) is None
    assert room_refused(tmp_path, 8 << 20) is None
    assert _entries(small_fs) == [] and sorted(os.listdir(tmp_path)) == ["small", "small.img"]


def test_the_probe_leaves_no_file_even_when_interrupted(small_fs, monkeypatch):
    """Review 50: the probe's hidden file had its name while fallocate(2) gave it the room, so a kill then (or a
    Ctrl-C just before its removal) left a file holding the song's room. Now it is nameless (O_TMPFILE) or unlinked
    before the room is asked, on both paths: a Ctrl-C during the fallocate leaves nothing."""
    import ctypes
    seen = []

    class Libc:
        def __init__(self, *args, **kwargs):
            def fallocate(fd, mode, offset, length):
                seen.append((_entries(small_fs), os.fstat(fd).st_nlink))
                raise KeyboardInterrupt
            self.fallocate = fallocate

    monkeypatch.setattr(ctypes, "CDLL", Libc)
    with pytest.raises(KeyboardInterrupt):
        room_refused(small_fs, 1 << 20)
    real_open = os.open

    def no_tmpfile(path, flags, *args, **kwargs):  # a file system without O_TMPFILE (NFS, FAT)
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_tmpfile)
    with pytest.raises(KeyboardInterrupt):
        room_refused(small_fs, 1 << 20)
    monkeypatch.undo()
    assert seen == [([], 0), ([], 0)] and _entries(small_fs) == []


def test_no_probe_on_a_memory_file_system(small_tmpfs, monkeypatch):
    """Review 50: on tmpfs fallocate(2) takes memory, page by page (1 GB of RAM for 0.4 s; the note of a batch on a
    big /tmp would have taken tens of GB — the model's RAM, or an OOM kill). Its room is its size, which statvfs
    shows: no probe there (more than the 1 MiB it holds is not refused by the probe), the free-space note still."""
    assert artifacts._fs_type(small_tmpfs) == "tmpfs"
    assert room_refused(small_tmpfs, 4 << 20) is None and os.listdir(small_tmpfs) == []
    note = free_space_note(small_tmpfs, [750])
    assert note is not None and note.startswith(f"{small_tmpfs} has 1.0 MB free, and the song may take up to"), note


def test_a_quota_smaller_than_the_song_is_noted_before_any_work(small_fs, monkeypatch):
    """Was: the free-space note read statvfs only, which shows the disk and not the user's quota: a quota with some
    room left, but less than the song, failed at the save after the song was computed. The disk here reports plenty
    (as with a quota), the file system refuses the room: the note says so."""
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(artifacts.shutil, "disk_usage", lambda p: usage(1 << 40, 0, 1 << 40))
    need = song_bytes_bound(750)[1]
    note = free_space_note(small_fs, [750])
    assert note is not None and f"but the file system there gave no room for {need / 1e6:,.1f} MB" in note, note
    assert _entries(small_fs) == []
    assert free_space_note(small_fs.parent, [750]) is None  # room there: nothing to say


def test_generate_warns_of_a_used_up_quota_before_loading(tmp_path, capsys, monkeypatch):
    """The CLI prints the quota note before the checkpoint is even looked for (EDQUOT: the quota's wording)."""
    monkeypatch.setattr(artifacts, "probe_room", lambda folder, n: artifacts.RoomProbe(errno.EDQUOT, n))
    rc, err = main_inprocess(capsys, "generate", "--style", "pop", "--lyrics", "la", "--checkpoint",
                             "/nonexistent/yue2.safetensors", "--offline", "--max-seconds", "30",
                             "--output", tmp_path / "song")
    assert rc == 2 and "warning: " in err and "but your disk quota there gave no room for" in err, err
    assert "(`quota -s` shows the quota)" in err and err.index("quota") < err.index("/nonexistent"), err
    assert shutil.disk_usage(tmp_path).free > song_bytes_bound(750)[1]


def test_max_abc_tokens_with_an_abc_file_is_said_to_do_nothing(tmp_path, capsys):
    """New-user review, stop 50: `generate --abc-file … --max-abc-tokens 128` ignored the cap without a word (no
    lead sheet is sampled when one is given); the warning comes before loading. Without the option: no warning."""
    from pathlib import Path
    score = Path(__file__).resolve().parents[2] / "examples" / "text2music_lead_sheet.abc"
    base = ("generate", "--style", "pop", "--lyrics", "la", "--abc-file", score, "--checkpoint",
            "/nonexistent/yue2.safetensors", "--offline")
    rc, err = main_inprocess(capsys, *base, "--max-abc-tokens", "128", "--output", tmp_path / "a")
    assert rc == 2 and "warning: --max-abc-tokens has no effect with --abc-file" in err, err
    assert err.index("--max-abc-tokens has no effect") < err.index("/nonexistent"), err
    rc, err = main_inprocess(capsys, *base, "--output", tmp_path / "b")
    assert rc == 2 and "has no effect" not in err, err


def test_inspect_of_a_vae_says_what_it_is_on_stderr(tmp_path, capsys):
    """New-user review, stop 50: `inspect VAE` printed only the JSON, while a checkpoint, a LoRA and a song folder
    each also print a human-readable line on stderr; a VAE now prints its summary there too (the JSON's "summary")."""
    import json
    from yue2_core.__main__ import main
    from yue2_core.weights.synthetic_vae import write_vae
    path = write_vae(str(tmp_path / "vae.safetensors"), layout="vendor-file")
    assert main(["inspect", path]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["kind"] == "VAE decoder" and report["summary"], report
    assert err.strip() == report["summary"].strip(), err
