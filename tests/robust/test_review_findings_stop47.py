"""Found by the stop-47 interruption review (docs/bad_inputs.md §29): interrupts, kills, full and read-only disks
around the song folders, batch.json and the files the commands write."""
from __future__ import annotations

import os
import signal

import pytest

from synthetic_cache import tokenizers_built_once
from test_cli import main_inprocess
from yue2_core.artifacts import load_song


@pytest.fixture(scope="module", autouse=True)
def _one_tokenizer():
    """The module's ≈ 15 loads of the tiny model parse its embedded tokenizer once (`tokenizers_built_once`)."""
    with tokenizers_built_once():
        yield


def _signal_after_rename(monkeypatch, sig=signal.SIGINT):
    """The song folder's rename into place succeeds, then `sig` arrives (a Ctrl-C, `timeout`'s SIGTERM) before the
    command has noted the save."""
    real = os.rename

    def rename(src, dst, *a, **k):
        real(src, dst, *a, **k)
        if str(src).endswith(".partial"):
            signal.raise_signal(sig)
    monkeypatch.setattr(os, "rename", rename)


def test_an_interrupt_just_after_the_rename_reports_the_saved_song(tmp_path, tiny_paths, capsys, monkeypatch):
    """Was: exit 130 and `cancelled` — which says no song folder exists — with the complete song in place (a wrapper
    read the run as cancelled; running it again met `exists and is not empty`)."""
    _signal_after_rename(monkeypatch)
    rc, err = main_inprocess(capsys, "generate", "--checkpoint", tiny_paths["bf16"], "--style", "pop", "--lyrics",
                             "la", "--cot", "off", "--max-seconds", "0.2", "--steps", "1", "--device", "cpu",
                             "--offline", "--output", tmp_path / "song")
    load_song(tmp_path / "song")  # the song is complete
    assert rc == 0 and "interrupted after the song was saved" in err and "cancelled" not in err, (rc, err)


def test_a_batch_interrupted_just_after_a_rename_records_the_song_as_saved(tmp_path, tiny_paths, capsys,
                                                                            monkeypatch):
    """Was: the row stayed "pending" in batch.json and the table with `… was not rendered or saved (interrupted)`
    while its complete song folder was in place."""
    import json
    requests = tmp_path / "req.jsonl"
    requests.write_text(json.dumps({"id": "a", "style": "pop", "lyrics": "la", "cot": "off", "seed": 1}) + "\n"
                        + json.dumps({"id": "b", "style": "rock", "lyrics": "na", "cot": "off", "seed": 2}) + "\n")
    _signal_after_rename(monkeypatch)
    rc, err = main_inprocess(capsys, "batch", requests, "--output", tmp_path / "album", "--checkpoint",
                             tiny_paths["bf16"], "--max-seconds", "0.2", "--steps", "1", "--device", "cpu",
                             "--offline")
    assert rc == 130, err
    load_song(tmp_path / "album" / "a")
    rows = {r["id"]: r for r in json.loads((tmp_path / "album" / "batch.json").read_text())["results"]}
    assert rows["a"]["status"] == "complete" and rows["a"]["output"], (rows["a"], err)
    assert rows["b"]["status"] == "pending", rows["b"]
    assert "not rendered or saved" not in err.split("line  id")[-1].splitlines()[2], err


@pytest.fixture(scope="module")
def made_song(tiny_paths, tmp_path_factory):
    """A tiny song made once by `generate` (in this process) for the tests below, which each edit a copy of it."""
    import contextlib
    import io
    from yue2_core.__main__ import main
    out, err = tmp_path_factory.mktemp("stop47") / "song", io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["generate", "--checkpoint", tiny_paths["bf16"], "--style", "pop", "--lyrics", "la", "--cot", "off",
                   "--max-seconds", "0.2", "--steps", "1", "--device", "cpu", "--offline", "--output", str(out)])
    assert rc == 0, err.getvalue()[-3000:]
    return out


def _tiny_song(made_song, out):
    """A copy of `made_song` at `out` (its own files to edit)."""
    import shutil
    shutil.copytree(made_song, out)
    return out


def _retag(flac):
    """What a tag editor does to audio.flac: the same samples, a title in its metadata — other bytes."""
    import soundfile as sf
    data, rate = sf.read(str(flac), dtype="int32", always_2d=True)
    with sf.SoundFile(str(flac) + ".new", "w", rate, data.shape[1], "PCM_24", format="FLAC") as fh:
        fh.title = "My song"
        fh.write(data)
    os.replace(str(flac) + ".new", flac)


def _resample(flac):
    """Audio.flac with other samples (one changed by one step): what an audio editor's save does."""
    import soundfile as sf
    data, rate = sf.read(str(flac), dtype="int32", always_2d=True)
    data[0, 0] += 256  # one 24-bit step
    sf.write(str(flac) + ".new", data, rate, subtype="PCM_24", format="FLAC")
    os.replace(str(flac) + ".new", flac)


def test_a_retagged_song_loads_everywhere_with_its_samples(tmp_path, made_song, capsys):
    """Was: a song whose audio.flac a player or tag editor had retagged (same samples, other bytes) was refused by
    Load Song, Regenerate and Continue (`… does not match its sha256`); the manifest now records a digest of the
    samples (`samples_sha256`), so such a file loads, `audio_changed` "tagged", and its samples are the saved ones."""
    import hashlib
    import json
    from yue2_core.edit import read_audio
    song = _tiny_song(made_song, tmp_path / "song")
    entry = json.loads((song / "result.json").read_text())["artifacts"]["audio.flac"]
    assert len(entry["samples_sha256"]) == 64
    before = read_audio(song / "audio.flac")
    _retag(song / "audio.flac")
    assert hashlib.sha256((song / "audio.flac").read_bytes()).hexdigest() != entry["sha256"]
    saved = load_song(song)
    assert saved.audio_changed == "tagged" and read_audio(song / "audio.flac").equal(before)
    rc, err = main_inprocess(capsys, "render", song, "--output", tmp_path / "again", "--steps", "1", "--device", "cpu")
    assert rc == 0 and "has changed since the song was saved" not in err, err


def test_a_retagged_song_saved_before_the_digest_is_refused_as_before(tmp_path, made_song, capsys):
    """A song saved before the samples digest (no `samples_sha256` in its manifest) cannot tell new tags from new
    samples: Load Song refuses it as before; `render` and `inspect` take it (`audio_changed` "changed")."""
    import json
    import pytest
    from yue2_core.artifacts import seal_result
    from yue2_core.errors import ArtifactError
    song = _tiny_song(made_song, tmp_path / "song")
    result = json.loads((song / "result.json").read_text())
    del result["artifacts"]["audio.flac"]["samples_sha256"]
    (song / "result.json").write_text(json.dumps(seal_result(result)))
    _retag(song / "audio.flac")
    with pytest.raises(ArtifactError, match="audio.flac"):
        load_song(song)
    assert load_song(song, audio_ok=True).audio_changed == "changed"


def test_a_song_whose_audio_was_tagged_or_moved_away_still_renders(tmp_path, made_song, capsys):
    """Was: `render` refused the song — `audio.flac is … bytes but result.json lists … (modified or damaged)` /
    `audio.flac is missing` — though render never reads the audio and its tokens, score and latents verify: a song
    tagged in a music player (or whose audio went into a DAW project) could no longer be re-rendered or re-sampled
    after an edited score.abc. Every other file is still held to its hash."""
    import pytest
    from yue2_core.errors import ArtifactError
    song = _tiny_song(made_song, tmp_path / "song")
    _resample(song / "audio.flac")  # other samples: Load Song, regenerate, continue refuse it, as before
    with pytest.raises(ArtifactError, match="audio.flac"):
        load_song(song)
    assert load_song(song, audio_ok=True).audio_changed == "changed"
    rc, err = main_inprocess(capsys, "render", song, "--output", tmp_path / "again", "--steps", "1", "--device", "cpu")
    assert rc == 0 and "audio.flac has changed since the song was saved" in err, err
    load_song(tmp_path / "again")
    (song / "audio.flac").unlink()
    rc, err = main_inprocess(capsys, "render", song, "--output", tmp_path / "again2", "--seed", "3", "--steps", "1",
                             "--device", "cpu")
    assert rc == 0 and "audio.flac is missing" in err, err
    (song / "latent.npy").write_bytes(b"x")  # the files render reads stay checked
    rc, err = main_inprocess(capsys, "render", song, "--output", tmp_path / "again3", "--device", "cpu")
    assert rc == 2 and "latent.npy" in err, err


def test_a_killed_checkpoint_write_leaves_no_hidden_copy_for_ever(tmp_path):
    """`make-synthetic` (scripts/song.sh runs it; the test fixtures too) killed by SIGKILL, the OOM killer or a
    container stop left `.NAME.PID.XXXXXXXX.tmp` — up to the whole file, 7.8 GB for the full profile — hidden beside
    it for ever, and a rerun needed the room twice. The next write of that file removes it; a file another writer
    still holds (its flock), a live writer's, and look-alikes stay."""
    import fcntl
    import subprocess
    import sys
    import torch
    from yue2_core.weights.synthetic import TensorSpec, _host_tag, write_safetensors_stream
    target = tmp_path / "t.safetensors"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    killed = tmp_path / f".t.safetensors.{dead}.{_host_tag()}abcd.tmp"  # written on this host (its name says)
    killed.write_bytes(b"\0" * 4096)
    held = tmp_path / f".t.safetensors.{dead}.4567abcd.tmp"  # a writer elsewhere (another pid namespace) holds it
    held.write_bytes(b"\0" * 4096)
    live = tmp_path / f".t.safetensors.{os.getpid()}.89abcdef.tmp"  # this process is alive: not swept
    live.write_bytes(b"\0" * 16)
    other = tmp_path / ".t.safetensors.mine.tmp"
    other.write_bytes(b"x")
    fd = os.open(held, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        spec = TensorSpec("w", (2, 2), "F32", "normal", "w")
        write_safetensors_stream(str(target), [spec], [torch.zeros(2, 2)], {})
    finally:
        os.close(fd)
    assert not killed.exists() and held.exists() and live.exists() and other.exists() and target.is_file()


def test_an_unwritable_triton_cache_without_a_temporary_folder_is_said(tmp_path, monkeypatch):
    """Triton's cache directory not writable (a read-only home in a container) and no temporary folder to fall back
    to (a read-only root file system): was an OSError traceback out of the model's load (`WarmUp.start`, GPUs only);
    now a RequestError naming both and the fixes."""
    import tempfile
    import pytest
    from yue2_core import warmup
    from yue2_core.errors import RequestError
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(warmup, "_CACHE_CHECKED", {})
    monkeypatch.setattr(tempfile, "tempdir", str(blocker / "tmp"))
    with pytest.raises(RequestError, match="set TRITON_CACHE_DIR to a writable folder"):
        warmup.ensure_cache_dir()



def _inspect(capsys, *args) -> tuple[int, str, str]:
    from yue2_core.__main__ import main
    rc = main(["inspect", *map(str, args)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_inspect_describes_a_song_whose_audio_was_tagged_or_moved(tmp_path, made_song, capsys):
    """Was: `inspect` refused such a song (`audio.flac is … bytes but result.json lists …`) while `render` takes it
    (the diff review of stop 47): it now says what changed (the JSON's `audio_changed`, the summary line on stderr)
    and still verifies every other file."""
    import json
    song = _tiny_song(made_song, tmp_path / "song")
    rc, out, err = _inspect(capsys, song)
    assert rc == 0 and json.loads(out)["audio_changed"] is None, out
    assert "files verified against result.json" in err and "audio.flac" not in err, err
    _retag(song / "audio.flac")
    rc, out, err = _inspect(capsys, song)
    assert rc == 0 and json.loads(out)["audio_changed"] == "tagged", (out, err)
    assert "but the saved samples" in err, err
    _resample(song / "audio.flac")
    rc, out, err = _inspect(capsys, song)
    assert rc == 0 and json.loads(out)["audio_changed"] == "changed", (out, err)
    assert "audio.flac differs from the one saved" in err, err
    (song / "audio.flac").unlink()
    rc, out, err = _inspect(capsys, song)
    assert rc == 0 and json.loads(out)["audio_changed"] == "missing" and "audio.flac is missing" in err, (out, err)
    (song / "latent.npy").write_bytes(b"x")  # the other files stay held to their hashes
    rc, out, err = _inspect(capsys, song)
    assert rc == 2 and "latent.npy" in err, (out, err)


def test_resume_names_the_changed_audio_of_a_song_without_the_samples_digest(tmp_path, made_song, capsys):
    """--resume's check of a song folder whose verification failed: a song saved before the samples digest whose
    audio.flac was retagged is still named for its audio (kept, never redone), as before stop 47."""
    import json
    from yue2_core.artifacts import seal_result
    from yue2_core.batch.driver import _metadata_edited
    song = _tiny_song(made_song, tmp_path / "song")
    result = json.loads((song / "result.json").read_text())
    del result["artifacts"]["audio.flac"]["samples_sha256"]
    (song / "result.json").write_text(json.dumps(seal_result(result)))
    assert _metadata_edited(song) == []
    _retag(song / "audio.flac")
    assert _metadata_edited(song) == ["audio.flac"]
