"""Leftovers of the stop-51 reviews, fixed in stop 52 (docs/bad_inputs.md §42): a stripped FL NAR file told from a
stripped Starnodes file; the quota probe's hold and its named fallback file; output claims and checkpoint writes on
a file system whose flock fails or does nothing (SMB / NFS mounts)."""
from __future__ import annotations

import pytest

from test_leftovers_stop50 import small_fs  # noqa: F401 (a fixture: a real 8 MiB ext4)

# --- 1. a stripped Starnodes file and a stripped FL NAR file ----------------------------------------------------------


def _stripped(tmp_path, layout: str, dims, drop=()):
    """The synthetic `layout` adapter saved again without its metadata (and without the keys starting with `drop`)."""
    from safetensors.torch import load_file, save_file
    from yue2_core.weights.lora.synthetic import write_adapter
    tensors = load_file(write_adapter(layout, tmp_path / f"{layout}.safetensors", dims))
    path = tmp_path / f"{layout}-stripped.safetensors"
    save_file({k: v for k, v in tensors.items() if not k.startswith(drop)}, path)
    return str(path)


def test_a_stripped_fl_nar_file_is_told_from_a_stripped_starnodes_file(tmp_path):
    """Stop-51 leftover: a Starnodes file keeps its alpha only in its metadata; stripped, it plays at scale 1 and a
    note says so — "if it is one", since an FL NAR companion (scale 1 by design) has the same vendor NAR names with
    lora_down / lora_up. A stripped FL NAR file got that note too, whose advice (strength × alpha / rank, e.g. 2)
    played it twice too strong. Now: FL's vae2llm / llm2vae `.diff`s say FL — no note; Starnodes' LoRA pairs on
    vae2llm / llm2vae / time_embedder say Starnodes — the note without "if"; only NAR layer pairs — the note names
    both cases and what each means. Each is read at scale 1 on the NAR, as before."""
    from yue2_core.weights.lora.layouts import adapter_notes, read_adapter
    from yue2_core.weights.lora.synthetic import profile_dims
    dims = profile_dims("tiny")
    notes = {}
    for name, layout, drop in (("fl", "fl-nar", ()), ("starnodes", "starnodes", ()),
                               ("layers only", "starnodes", ("vae2llm.", "llm2vae.", "time_embedder."))):
        folder = tmp_path / name.replace(" ", "_")
        folder.mkdir()
        adapter = read_adapter(_stripped(folder, layout, dims, drop), dims)
        assert adapter.scales == [1.0] and {p.expert for p in adapter.patches} == {"nar"}, (name, adapter.scales)
        notes[name] = adapter_notes(adapter)
    assert notes["fl"] == [], notes["fl"]
    [starnodes] = notes["starnodes"]
    assert "it is laid out as a Starnodes file (" in starnodes and "which an FL file never has" in starnodes
    assert "if it is one" not in starnodes and "FL file, nothing was lost" not in starnodes, starnodes
    assert "so at rank / alpha of the strength it was trained for. If you know its alpha" in starnodes, starnodes
    [either] = notes["layers only"]
    assert "the layout of a Starnodes file (format=yue2-lora-v1" in either, either
    assert "and of an FL NAR file (format=fl-yue2-lora-v1, scale 1 by design); nothing left in it tells which" in either
    assert "If it is an FL file, nothing was lost: strength 1 plays it as trained." in either, either
    assert ("so a Starnodes file plays at rank / alpha of the strength it was trained for. If it is a Starnodes file "
            "and you know its alpha, multiply the strength by alpha / rank") in either, either


# --- 2. the quota probe: the room it holds, the file it names ---------------------------------------------------------

def test_the_quota_probe_leaves_a_writer_beside_it_room(small_fs, monkeypatch):
    """Stop-51 leftover "the quota probe holds room for ms": the probe holds the room it asks for (fallocate to
    close: 24 ms for 512 MiB, 72 ms for 2 GiB on ext4), so on a disk with little more free than the song, a writer
    beside it — another run's save — met "No space left on device" meanwhile, its song lost. On a real 8 MiB ext4,
    a writer asking for room that fits the disk, while the probe holds the song's: refused before; now no probe
    there (the disk keeps less than `probe_spare` beside the song), and the probe still runs where it does."""
    import ctypes
    import errno
    import os
    import shutil
    from collections import namedtuple

    import yue2_core.artifacts as artifacts
    from yue2_core.artifacts import free_space_note, probe_spare, song_bytes_bound
    free = shutil.disk_usage(small_fs).free
    tokens = max(t for t in range(1, 2000, 10) if song_bytes_bound(t)[1] <= free - (1 << 20))
    need = song_bytes_bound(tokens)[1]
    other = free - need + (256 << 10)  # fits the disk, not beside the probe's hold
    assert free - need < probe_spare(need) and other < free
    asked, clashes = [], []

    def writer_beside() -> None:
        fd = os.open(small_fs / "other-run", os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            os.posix_fallocate(fd, 0, other)
        except OSError as exc:
            clashes.append(exc.errno)
        finally:
            os.close(fd)
            os.unlink(small_fs / "other-run")

    class Libc:  # the real allocation, and the other writer while the probe holds it
        def __init__(self, *args, **kwargs):
            def fallocate(fd, mode, offset, length):
                asked.append(length)
                try:
                    os.posix_fallocate(fd, offset, length)
                except OSError as exc:
                    ctypes.set_errno(exc.errno)
                    return -1
                writer_beside()
                return 0
            self.fallocate = fallocate

    monkeypatch.setattr(ctypes, "CDLL", Libc)
    assert free_space_note(small_fs, [tokens]) is None
    assert asked == [] and clashes == [], (asked, clashes)  # no probe: nothing held
    writer_beside()
    assert clashes == [], "the other writer's room fits the disk when nothing is held"
    usage = namedtuple("usage", "total used free")  # a disk with spare beside the song: the quota is asked
    monkeypatch.setattr(artifacts.shutil, "disk_usage", lambda p: usage(1 << 40, 0, need + probe_spare(need)))
    assert free_space_note(small_fs, [tokens]) is None and asked == [need], asked
    assert clashes == [errno.ENOSPC], "on this small disk the hold does take the writer's room: what is avoided"


def test_a_killed_probes_named_file_is_swept_and_never_blocks_a_batch(tmp_path, monkeypatch):
    """Where a file system has no O_TMPFILE (NFS, SMB, FAT), the probe's file has a name, `.yue2-room-XXXXXXXX`, from
    its creation to its unlink; a kill in that moment left it for ever, and in a batch folder `batch --resume` then
    refused the folder ("holds files that are not this batch's"). Now the next probe there removes such files once
    they are a minute old (empty, of that exact name: a probe unlinks its file before asking for room), and the batch
    folder's check takes one as the pack's own."""
    import errno
    import os
    import time

    from yue2_core.artifacts import probe_room
    from yue2_core.batch.driver import check_output
    from yue2_core.errors import ArtifactError
    real_open = os.open

    def no_tmpfile(path, flags, *args, **kwargs):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        return real_open(path, flags, *args, **kwargs)

    old = time.time() - 120
    stale, fresh = tmp_path / ".yue2-room-abcd_123", tmp_path / ".yue2-room-efgh4567"
    kept = [fresh, tmp_path / ".yue2-room-ijkl8901", tmp_path / ".yue2-room-too_long_name", tmp_path / "x.yue2-room-a"]
    for path in (stale, *kept):
        path.write_bytes(b"x" if path.name.startswith(".yue2-room-ijkl") else b"")
        if path != fresh:
            os.utime(path, (old, old))
    monkeypatch.setattr(os, "open", no_tmpfile)
    assert probe_room(tmp_path, 1 << 20).refused is None
    monkeypatch.undo()
    assert not stale.exists() and all(p.exists() for p in kept), sorted(os.listdir(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in kept), "the probe's own file is gone too"
    batch = tmp_path / "album"
    batch.mkdir()
    (batch / ".yue2-room-efgh4567").write_bytes(b"")
    check_output(batch, {"a"}, resume=True)
    (batch / ".yue2-room-notmine!").write_bytes(b"")
    with pytest.raises(ArtifactError, match="holds files that are not this batch's: .yue2-room-notmine!"):
        check_output(batch, {"a"}, resume=True)


# --- 3. file locks on network mounts ----------------------------------------------------------------------------------

def _flock(monkeypatch, behaviour):
    """fcntl.flock replaced: an errno to raise, or "noop" (a lock local to each host, as SMB `nobrl` / NFS
    `local_lock` mounts give: another host's holder is not seen)."""
    import fcntl
    import os

    def flock(fd, op):
        if behaviour != "noop":
            raise OSError(behaviour, os.strerror(behaviour))
    monkeypatch.setattr(fcntl, "flock", flock)


@pytest.mark.parametrize("code", ["ENOLCK", "EOPNOTSUPP"])
def test_an_output_claim_where_locks_fail_warns_once_and_the_song_is_saved(tmp_path, tiny_paths, monkeypatch,
                                                                           capsys, code):
    """Stop-51 leftover "SMB flock": a file system that takes no locks (an NFS mount without its lock daemon: ENOLCK;
    some SMB / FUSE mounts: EOPNOTSUPP) made the output claim's flock fail, which was read as "being written by
    another run" — every `generate`, `render` and `batch` there was refused. Now the run goes on without a claim,
    with one warning saying so and what it means; its claim file is not left behind, and the song is saved. A lock
    another run holds (EWOULDBLOCK) is still refused by name."""
    import errno
    import io
    import os

    from robust_helpers import cli_inprocess
    from yue2_core.artifacts import reserve_output
    from yue2_core.batch import BatchOptions, run_batch
    from yue2_core.errors import ArtifactError, YuE2Error
    _flock(monkeypatch, getattr(errno, code))
    claim = reserve_output(tmp_path / "x")
    assert claim.lock is None and os.listdir(tmp_path) == [], os.listdir(tmp_path)
    assert claim.note.startswith(f"{tmp_path}'s file system takes no file locks ({os.strerror(getattr(errno, code))}: "
                                 "an NFS mount without its lock daemon"), claim.note
    assert "A save never replaces a song" in claim.note and "Give each run its own output directory" in claim.note
    stream = io.StringIO()
    with pytest.raises(YuE2Error):  # the request file is missing: after the claim, before any song
        run_batch(BatchOptions(str(tmp_path / "none.jsonl"), str(tmp_path / "album")), tokenizer=None, dims=None,
                  engine_factory=None, stream=stream)
    assert stream.getvalue().count("takes no file locks") == 1 and "batch folder" in stream.getvalue()
    if code == "ENOLCK":  # one whole song (the same path for both errnos)
        song = tmp_path / "song"
        done = cli_inprocess(monkeypatch, capsys, "generate", "--checkpoint", tiny_paths["bf16"], "--style", "pop",
                             "--lyrics", "la", "--cot", "off", "--max-seconds", "0.2", "--steps", "1", "--device",
                             "cpu", "--offline", "--output", song)
        assert done.returncode == 0 and done.stderr.count("takes no file locks") == 1, done.stderr[-3000:]
        assert (song / "result.json").is_file()
        assert not [p for p in tmp_path.rglob("*yue2-lock*")], list(tmp_path.rglob("*"))
    _flock(monkeypatch, errno.EWOULDBLOCK)
    with pytest.raises(ArtifactError, match="is being written by another run"):
        reserve_output(tmp_path / "y")


def test_where_a_lock_does_nothing_a_later_save_never_replaces_a_song(tmp_path, monkeypatch):
    """What no claim can give on a mount whose flock is local to each host (SMB `nobrl`, NFS `local_lock`): two runs
    on two hosts given one output both get their claim — nothing here can see the other host's lock. The save is
    what keeps the first song: the second, renaming its folder into place after the first was saved, is refused
    ("nothing was written"), and the first song's files are unchanged. Shown by saving the first song inside the
    second save's last step (`rename_gate`)."""
    import contextlib

    from yue2_core.artifacts import rename_gate, reserve_output, write_song_dir
    from yue2_core.errors import ArtifactError
    _flock(monkeypatch, "noop")
    out = tmp_path / "song"
    first, second = reserve_output(out), reserve_output(out)
    assert first.lock is not None and second.lock is not None and first.note is None  # the limit: both granted

    saved = []

    def other_host_saves_first():
        if not saved:  # the first song's own save passes this gate too
            saved.append(out)
            write_song_dir(out, {"semantic.npy": b"first"}, {"run": 1})
        return contextlib.nullcontext()
    with rename_gate(other_host_saves_first), pytest.raises(ArtifactError, match="nothing was written"):
        write_song_dir(out, {"semantic.npy": b"second"}, {"run": 2})
    assert (out / "semantic.npy").read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".song.yue2-lock", "song"]
    first.release(), second.release()


@pytest.mark.parametrize("behaviour", ["noop", "ENOLCK", "EOPNOTSUPP"])
def test_a_checkpoint_write_sweep_where_locks_do_nothing_or_fail(tmp_path, monkeypatch, behaviour):
    """The checkpoint writer's sweep of killed writes (`synthetic.sweep_stale_tmps`) took a temporary file once no
    lock held it and its pid was gone here. On a mount whose flock is local to each host (a no-op here), another
    host's live write — its pid unknown here — was taken, and its rename then failed; on one whose flock fails
    (ENOLCK, EOPNOTSUPP), nothing was ever taken, so a killed write (up to 7.8 GB) stayed for ever. Now a file's name
    carries its host (`_host_tag`): this host's, with its writer gone, is taken; another host's only once it has not
    been written for STALE_TMP_SECONDS; on both kinds of mount; and the write itself succeeds."""
    import errno
    import os
    import subprocess
    import sys
    import time

    import torch
    from yue2_core.weights.synthetic import STALE_TMP_SECONDS, TensorSpec, _host_tag, write_safetensors_stream
    _flock(monkeypatch, behaviour if behaviour == "noop" else getattr(errno, behaviour))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    here, elsewhere = _host_tag(), f"{(int(_host_tag(), 16) + 1) % 65536:04x}"
    killed = tmp_path / f".t.safetensors.{dead}.{here}abcd.tmp"
    live_elsewhere = tmp_path / f".t.safetensors.{dead}.{elsewhere}abcd.tmp"
    stale_elsewhere = tmp_path / f".t.safetensors.{dead}.{elsewhere}0123.tmp"
    live_here = tmp_path / f".t.safetensors.{os.getpid()}.{here}0123.tmp"
    for path in (killed, live_elsewhere, stale_elsewhere, live_here):
        path.write_bytes(b"\0" * 64)
    old = time.time() - STALE_TMP_SECONDS - 60
    os.utime(stale_elsewhere, (old, old))
    target = tmp_path / "t.safetensors"
    write_safetensors_stream(str(target), [TensorSpec("w", (2, 2), "F32", "normal", "w")], [torch.zeros(2, 2)], {})
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(p.name for p in (target, live_elsewhere, live_here)), left
