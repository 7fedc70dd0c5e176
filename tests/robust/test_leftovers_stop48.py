"""Leftovers of the stop-47 reviews, fixed in stop 48 (docs/bad_inputs.md §31): a song past this process's
file-size limit (`ulimit -f`) refused before any work, and a disk with less room than the songs warned of; a batch
interrupted while its song writer thread renames a folder records that song as it is on disk; Save Song of audio
that is not the decode of its latent records so, and the edits make the kept part again from the latent."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from robust_helpers import REPO, make_song
from test_cli import main_inprocess
from yue2_core.artifacts import load_song, save_song, song_bytes_bound, tokens_within

LIMIT = 100 * 1024  # bytes: `ulimit -f 100`


def _limited(*args, limit: int = LIMIT, code: str | None = None) -> subprocess.CompletedProcess:
    """`python -m yue2_core ARGS` (or `python -c CODE`) under a file-size limit of `limit` bytes (RLIMIT_FSIZE's
    soft limit, as `ulimit -f` sets it)."""
    import resource

    def limit_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    env = {k: v for k, v in os.environ.items() if k not in ("YUE2_CHECKPOINT", "COMFYUI_PATH", "COMFYUI_DIR")}
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "yue2_core", *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
                          preexec_fn=limit_files)


def _limited_inprocess(monkeypatch, capsys, *args, limit: int = LIMIT) -> subprocess.CompletedProcess:
    """`_limited(*args)` for an input refused before anything is written: `main(args)` in this process, where
    `resource.getrlimit` reports `limit` as RLIMIT_FSIZE's soft limit (a real limit here would fail this process's
    own writes). For the further inputs of a test whose first ones ran under a real limit (`_limited`)."""
    import resource
    from robust_helpers import cli_inprocess
    real = resource.getrlimit
    with monkeypatch.context() as m:
        m.setattr(resource, "getrlimit",
                  lambda which: (limit, real(which)[1]) if which == resource.RLIMIT_FSIZE else real(which))
        return cli_inprocess(monkeypatch, capsys, *args)


def _requests(tmp_path, *rows) -> str:
    path = tmp_path / "req.jsonl"
    path.write_text("".join(json.dumps({"id": i, "style": "pop", "lyrics": "la", "cot": "off", "seed": n}) + "\n"
                            for n, i in enumerate(rows, 1)), "utf-8")
    return str(path)


# ------------------------------------------------------------------------------------------- the file-size limit

@pytest.mark.skipif(not hasattr(os, "fork"), reason="RLIMIT_FSIZE is a POSIX limit")
def test_a_batch_past_the_file_size_limit_is_refused_before_any_work(tmp_path, tiny_paths):
    """Was: under `ulimit -f 100` every row was computed (lead sheet, music, render, decode), then each failed at
    its save with `File too large (nothing was written)`. Now each row is refused at validate, before the model
    loads, with the limit, the estimate and what to do; nothing is written."""
    out = tmp_path / "album"
    proc = _limited("batch", _requests(tmp_path, "a", "b"), "--output", out, "--checkpoint", tiny_paths["bf16"],
                    "--max-seconds", "2", "--steps", "1", "--device", "cpu", "--offline")
    err = proc.stderr
    largest = song_bytes_bound(50)[0]  # 2 s: 50 music tokens
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert "semantic" not in err.split("line  id")[0] and "render 1/1" not in err, err[-3000:]  # no row computed
    assert err.count("this process's file-size limit (`ulimit -f` 100: 102,400 bytes) is below what row '") == 2, err
    assert (f"its audio.flac (50 music tokens = 2 s of 48 kHz stereo 24-bit FLAC) can take up to {largest:,} bytes"
            in err and f"Raise the limit (`ulimit -f unlimited`, or at least `ulimit -f {-(-largest // 1024)}`), or "
            "lower --max-seconds" in err and f"to at most {tokens_within(LIMIT) / 25:g} s" in err), err[-3000:]
    assert "nothing ran: every row failed before any work" in err and not out.exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="RLIMIT_FSIZE is a POSIX limit")
def test_generate_and_render_past_the_file_size_limit_are_refused_before_loading(tmp_path, tiny_paths, monkeypatch,
                                                                                  capsys):
    """`generate` and `render` say it before the checkpoint is read (exit 2, no song folder); a song short enough
    for the limit (the estimate's own cap, 0.32 s) is made and saved under it — the estimate does not refuse what
    fits. (`generate` under a real limit, in subprocesses; `render`'s refusals in this process.)"""
    common = ("--checkpoint", tiny_paths["bf16"], "--steps", "1", "--device", "cpu", "--offline")
    proc = _limited("generate", "--style", "pop", "--lyrics", "la", "--cot", "off", "--max-seconds", "2",
                    "--output", tmp_path / "s", *common)
    assert proc.returncode == 2 and "error: this process's file-size limit" in proc.stderr, proc.stderr[-2000:]
    assert "checkpoint:" not in proc.stderr and not (tmp_path / "s").exists(), proc.stderr[-2000:]
    proc = _limited("generate", "--style", "pop", "--lyrics", "la", "--cot", "off", "--max-seconds", "0.32",
                    "--output", tmp_path / "short", *common)
    assert proc.returncode == 0, proc.stderr[-2000:]
    load_song(tmp_path / "short")
    song = save_song(make_song(frames=50), tmp_path / "fifty")  # 2 s of music tokens, saved without a limit
    proc = _limited_inprocess(monkeypatch, capsys, "render", song, "--output", tmp_path / "again", *common)
    assert proc.returncode == 2 and "its length is fixed: the saved music tokens" in proc.stderr, proc.stderr[-2000:]
    assert "checkpoint:" not in proc.stderr and not (tmp_path / "again").exists()
    proc = _limited_inprocess(monkeypatch, capsys, "render", song, "--seed", "3", "--output", tmp_path / "again",
                              *common)  # new tokens: a budget
    assert proc.returncode == 2 and "or lower --max-seconds to at most 0.32 s" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="RLIMIT_FSIZE is a POSIX limit")
def test_a_save_that_meets_the_limit_names_it(tmp_path):
    """Where a file still meets the limit at the save (EFBIG: Python ignores SIGXFSZ, so the write raises), the
    error says which limit and how to raise it, and nothing is left behind (was: `File too large (nothing was
    written)` alone)."""
    code = ("from yue2_core.artifacts import write_song_dir\n"
            "from yue2_core.errors import ArtifactError\n"
            f"try:\n    write_song_dir({str(tmp_path / 'song')!r}, {{'audio.flac': bytes(200_000)}}, {{}})\n"
            "except ArtifactError as exc:\n    print(exc)\n")
    proc = _limited(code=code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == (f"could not save the song to {tmp_path / 'song'}: File too large (this process's "
                                   "file-size limit, `ulimit -f`, is 102,400 bytes (`ulimit -f` 100): raise it, e.g. "
                                   "`ulimit -f unlimited`) (nothing was written)"), proc.stdout
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


def test_the_estimate_bounds_a_noise_song_and_inverts(tmp_path):
    """The estimate is an upper bound of what the encoder writes for audio that does not compress (the synthetic
    model's noise), and `tokens_within` is its inverse (the longest song that fits)."""
    import torch
    from yue2_core.artifacts import expected_samples, flac_bytes, song_bytes_bound, tokens_within
    for tokens in (1, 50, 250):
        audio = (torch.rand(2, expected_samples(tokens), generator=torch.Generator().manual_seed(tokens)) * 2 - 1)
        written = len(flac_bytes(audio))
        assert written <= song_bytes_bound(tokens)[0] < written * 1.02 + 9000, (tokens, written)
    for limit in (LIMIT, 10 ** 6, 10 ** 8):
        fits = tokens_within(limit)
        assert song_bytes_bound(fits)[0] <= limit < song_bytes_bound(fits + 1)[0], limit
    assert tokens_within(5000) == 0


def test_a_disk_with_less_room_than_the_songs_is_warned_of_before_the_work(tmp_path, capsys, monkeypatch):
    """The free space of the output's disk is read before the work (cheap: one statvfs): less than the songs may
    take gives a warning naming both (not a refusal — real music compresses and space changes meanwhile)."""
    import shutil
    from collections import namedtuple
    import yue2_core.artifacts as artifacts
    usage, real = namedtuple("usage", "total used free"), shutil.disk_usage
    monkeypatch.setattr(artifacts.shutil, "disk_usage", lambda path: usage(10 ** 9, 10 ** 9 - 10 ** 6, 10 ** 6))
    rc, err = main_inprocess(capsys, "generate", "--style", "pop", "--lyrics", "la", "--max-seconds", "60",
                             "--checkpoint", "/nonexistent/yue2.safetensors", "--offline",
                             "--output", tmp_path / "song")
    need = song_bytes_bound(60 * 25)[1] / 1e6
    assert rc == 2 and f"has 1.0 MB free, and the song may take up to {need:,.1f} MB" in err, err
    assert err.index("free") < err.index("error:"), err  # said before the checkpoint was looked for
    assert artifacts.free_space_note(tmp_path, [1500]) is not None
    monkeypatch.setattr(artifacts.shutil, "disk_usage", real)
    assert artifacts.free_space_note(tmp_path, [1]) is None  # this disk has room for a 0.04 s song


def test_a_batch_warns_of_the_room_its_songs_need(tmp_path, monkeypatch, tiny_paths):
    import io
    from collections import namedtuple
    import yue2_core.artifacts as artifacts
    from yue2_core.batch import BatchOptions, run_batch
    from yue2_core.batch.runner import SongOutcome

    class Runner:  # the driver's runner interface: no engine is loaded
        settings: dict = {}

        def prepare(self):
            return None, False

        def songs(self, todo, out, **kw):
            stream.write("-- songs start --\n")
            for item in todo:
                yield SongOutcome(item.id, item.line, "failed", "plan", error="not run here")

    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.synthetic_tokenizer import tokenizer_json
    from yue2_core.weights.tokenizer import YuE2Tokenizer
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(artifacts.shutil, "disk_usage", lambda path: usage(10 ** 9, 10 ** 9 - 10 ** 6, 10 ** 6))
    stream = io.StringIO()
    run_batch(BatchOptions(_requests(tmp_path, "a", "b", "c"), str(tmp_path / "album"), max_seconds=10.0),
              tokenizer=YuE2Tokenizer(tokenizer_json().decode("utf-8")),
              dims=inspect_checkpoint(tiny_paths["bf16"]).dims, engine_factory=None,
              runner=Runner(), stream=stream)
    text = stream.getvalue()
    need = 3 * song_bytes_bound(10 * 25)[1] / 1e6
    assert f"warning: {tmp_path / 'album'} has 1.0 MB free, and the 3 songs may take up to {need:,.1f} MB" in text, text
    assert text.index("may take up to") < text.index("-- songs start --"), text


# ------------------------------------------------------------- an interrupted batch: its writer thread's renames

def _held_sigint():
    """SIGINT raises KeyboardInterrupt in this process (Python's own handler), as in the CLI; restored after."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return before


def _interrupted_overlap(tmp_path, tiny_engine, monkeypatch, where: str):
    """A CPU batch of two songs with the overlap on (`overlap=True`: the render worker and its writer thread
    `yue2-save` run as on a GPU; only the CUDA streams are not there): the first Ctrl-C lands while the main thread
    plans the second song and the writer saves the first; the writer is held at `where` ("before": its folder sync
    before the rename; "during": the rename itself) until the main thread has written batch.json (at most 2 s), and
    the user's further Ctrl-Cs stop the waiting for it (the third, `_join`). Returns (batch.json rows, folder a
    complete, the stderr text)."""
    import io
    import yue2_core.artifacts as artifacts
    import yue2_core.batch.runner as runner
    from yue2_core.batch import BatchOptions, run_batch
    from yue2_core.batch.summary import BatchSummary
    saving, written = threading.Event(), threading.Event()
    out = tmp_path / "album"

    def hold(path) -> None:
        if threading.current_thread().name == "yue2-save":
            saving.set()
            written.wait(2.0)  # with the fix the main thread waits for a rename in progress: 2 s, then it goes on

    real_sync, real_rename = artifacts.fsync_folder, os.rename

    def sync(folder):
        if where == "before" and str(folder).endswith(".partial") and os.path.basename(folder).startswith(".a."):
            hold(folder)
        return real_sync(folder)

    def rename(src, dst, *a, **k):
        if where == "during" and os.path.basename(dst) == "a":
            hold(dst)
        return real_rename(src, dst, *a, **k)
    monkeypatch.setattr(artifacts, "fsync_folder", sync)
    monkeypatch.setattr(os, "rename", rename)
    calls = []
    real_plan = runner._plan_phase

    def plan(engine, jobs, *a, **k):
        calls.append(jobs[0].item.id)
        if len(calls) == 2:  # the second song's plan, on the main thread, while the writer saves the first
            assert saving.wait(60), "the writer never reached the save"
            signal.raise_signal(signal.SIGINT)
        return real_plan(engine, jobs, *a, **k)
    monkeypatch.setattr(runner, "_plan_phase", plan)
    real_join = runner._join

    def join(thread, ended, interrupts=None):
        if thread.name == "yue2-save" and not ended.wait(0.2):
            signal.raise_signal(signal.SIGINT)  # the Ctrl-C that stops the waiting (`_join`'s third)
        return real_join(thread, ended, interrupts)
    monkeypatch.setattr(runner, "_join", join)
    real_write = BatchSummary.write

    def write(self, folder):
        real_write(self, folder)
        if self.interrupted:
            written.set()
    monkeypatch.setattr(BatchSummary, "write", write)
    before = _held_sigint()
    stream = io.StringIO()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_batch(BatchOptions(_requests(tmp_path, "a", "b"), str(out), max_seconds=0.2, steps=1, overlap=True),
                      tokenizer=tiny_engine.tokenizer, dims=tiny_engine.info.dims, engine_factory=lambda: tiny_engine,
                      stream=stream)
    finally:
        signal.signal(signal.SIGINT, before)
    for thread in threading.enumerate():  # the writer goes on after the run returned (it is a daemon thread)
        if thread.name == "yue2-save":
            thread.join(30)
    assert calls == ["a", "b"], calls
    rows = {r["id"]: r for r in json.loads((out / "batch.json").read_text("utf-8"))["results"]}
    leftovers = [p for p in os.listdir(out) if p.endswith(".partial")]
    assert not leftovers, leftovers
    return rows, (out / "a" / "result.json").is_file(), stream.getvalue()


@pytest.mark.parametrize("where", ["before", "during"])
def test_an_interrupted_batch_records_what_its_writer_thread_saved(tmp_path, tiny_engine, monkeypatch, where):
    """Was: with the overlap (the default on a GPU) the writer thread renamed a song folder into place after the
    main thread, interrupted and done waiting, had written batch.json: the row stayed "pending" beside the complete
    folder (`--resume` then kept it as verified). Now the main thread seals the writer before it records the end: a
    rename in progress finishes first and the row is complete ("during"); one not begun is not made, and the row
    stays pending with no folder and nothing half-written ("before")."""
    rows, saved, text = _interrupted_overlap(tmp_path, tiny_engine, monkeypatch, where)
    assert rows["a"]["status"] == ("complete" if saved else "pending"), (rows["a"], saved, text[-2000:])
    assert saved is (where == "during"), (saved, text[-2000:])
    assert rows["b"]["status"] == "pending", rows["b"]
    if saved:
        load_song(tmp_path / "album" / "a")
        assert rows["a"]["output"], rows["a"]


def test_a_ctrl_c_during_the_record_of_an_interrupted_batch_still_writes_it(tmp_path, tiny_engine, monkeypatch):
    """A second Ctrl-C landing while the interrupted batch records how it ended (after the drain recorded the songs
    saved meanwhile) left batch.json as it was before — the saved song "pending". The record is now written with
    the interrupts held, and the interrupt goes on after it."""
    import io
    import yue2_core.batch.driver as driver
    from yue2_core.batch import BatchOptions, run_batch
    from yue2_core.batch.summary import BatchSummary
    real_write, writes = BatchSummary.write, []

    def write(self, folder):
        writes.append(self.interrupted)
        if len(writes) == 2:  # the write after song a's record: the first Ctrl-C lands there
            signal.raise_signal(signal.SIGINT)
        real_write(self, folder)
    monkeypatch.setattr(BatchSummary, "write", write)
    real_left = driver._account_left

    def account_left(*a, **k):
        signal.raise_signal(signal.SIGINT)  # the second, while the end is recorded
        return real_left(*a, **k)
    monkeypatch.setattr(driver, "_account_left", account_left)
    before = _held_sigint()
    stream = io.StringIO()
    out = tmp_path / "album"
    try:
        with pytest.raises(KeyboardInterrupt):
            run_batch(BatchOptions(_requests(tmp_path, "a", "b"), str(out), max_seconds=0.2, steps=1,
                                   overlap=False),
                      tokenizer=tiny_engine.tokenizer, dims=tiny_engine.info.dims, engine_factory=lambda: tiny_engine,
                      stream=stream)
    finally:
        signal.signal(signal.SIGINT, before)
    load_song(out / "a")
    record = json.loads((out / "batch.json").read_text("utf-8"))
    rows = {r["id"]: r for r in record["results"]}
    assert record["interrupted"] and rows["a"]["status"] == "complete", (rows, stream.getvalue()[-2000:])
    assert rows["b"]["status"] == "pending" and "line  id" in stream.getvalue()


# ------------------------------------------------------------------ Save Song's given audio: what the folder records

def test_an_edit_of_a_song_whose_audio_was_given_makes_the_kept_part_again(tmp_path):
    """A song whose config.json records audio_source "given" (ComfyUI's Save Song of audio that is not its decode:
    a gain, an effect, another node's audio) is not spliced by Regenerate / Continue: the part they keep is decoded
    again from the latents, with a note (was: the processed audio before the cut joined to an unprocessed render
    after it). "decoded" — and songs without the key — splice their audio.flac as before; another value is refused
    at load like any damaged setting."""
    import pytest
    from yue2_core.edit import as_parent
    from yue2_core.errors import ArtifactError
    from dataclasses import replace
    song = make_song(frames=8)
    given = save_song(replace(song, settings={**song.settings, "audio_source": "given"}), tmp_path / "given")
    parent = as_parent(given)
    assert parent.audio is None and any("saved as given" in n for n in parent.notes), parent.notes
    decoded = save_song(replace(song, settings={**song.settings, "audio_source": "decoded"}), tmp_path / "decoded")
    assert as_parent(decoded).audio is not None and as_parent(save_song(song, tmp_path / "plain")).audio is not None
    bad = save_song(replace(song, settings={**song.settings, "audio_source": "edited"}), tmp_path / "bad")
    with pytest.raises(ArtifactError, match='config.json audio_source must be decoded or given, got "edited"'):
        load_song(bad)


def test_render_and_inspect_say_a_song_s_audio_was_given(tmp_path, tiny_paths, capsys, older_song):
    """`render` of such a song says its audio.flac is not what it renders (and its own song records no
    audio_source: its audio is the decode); `inspect` says it in its summary and report."""
    rc, err = main_inprocess(capsys, "generate", "--checkpoint", tiny_paths["bf16"], "--style", "pop", "--lyrics",
                             "la", "--cot", "off", "--max-seconds", "0.2", "--steps", "1", "--device", "cpu",
                             "--offline", "--output", tmp_path / "song")
    assert rc == 0, err
    song = older_song(tmp_path / "song", tmp_path / "given", lambda c: c.update(audio_source="given"))
    rc, err = main_inprocess(capsys, "render", song, "--output", tmp_path / "again", "--steps", "1", "--device",
                             "cpu")
    assert rc == 0 and "audio.flac was saved as given" in err, err
    assert "audio_source" not in json.loads((tmp_path / "again" / "config.json").read_text("utf-8"))
    from yue2_core.cli.inspect_cmd import _song_report
    report = _song_report(str(song))
    assert report["audio_source"] == "given" and "saved as given by ComfyUI's Save Song" in report["summary"]
    assert _song_report(str(tmp_path / "again"))["audio_source"] is None
