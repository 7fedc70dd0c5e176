"""The overlap (`iter_songs(overlap=True)`, `batch --overlap`): a batch's songs are rendered, decoded and delivered on a
worker thread while the next batch's AR phases run — on the CPU here (tiny model, one intra-op thread).

- the songs are identical with and without the overlap (5 requests, max-batch 2: 3 batches), rows one at a time
  (the CPU default) and in the batched decoder, and the outcomes come in the same order;
- a render failing in the worker fails that song only;
- Ctrl-C during the second batch's AR: the first batch's songs are complete, nothing partial is left, the worker
  thread is gone; Ctrl-C while the worker renders stops it at its next step without writing that song;
- an exception escaping the worker (not a song's failure) reaches the main thread;
- the memory sizing adds the render stage to the AR batch with the overlap.
"""
import json
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from batch_data import ABC_CAP, expected, rows, write_requests  # noqa: E402

STEPS = 2
WORKER, SAVER = "yue2-render", "yue2-save"  # the render worker and its writer


def _items():
    from yue2_core.batch.requests import BatchRequest
    return [BatchRequest(i + 1, *expected(row)) for i, row in enumerate(rows())]


def _worker_alive() -> bool:
    return any(t.name in (WORKER, SAVER) and t.is_alive() for t in threading.enumerate())


def _run(engine, items, overlap, **kw):
    songs, threads = {}, {}

    def deliver(item, song):
        songs[item.id], threads[item.id] = song, threading.current_thread().name
        return item.id
    from yue2_core.batch.runner import iter_songs
    outcomes = list(iter_songs(engine, items, deliver=deliver, max_batch=2, steps=STEPS, overlap=overlap, **kw))
    return outcomes, songs, threads


@pytest.mark.parametrize("batched", [False, True], ids=["rows-one-at-a-time", "batched-decoder"])
def test_songs_identical_with_and_without_overlap(engine, monkeypatch, batched):
    import yue2_core.fast as fast
    from yue2_core.fast.decode import generate as one_row_decoder
    if batched:  # single rows and failing batches through the GPU's decoder, as on CUDA
        monkeypatch.setattr(fast, "select_generate", lambda ar: one_row_decoder)
    items = _items()
    plain, plain_songs, plain_threads = _run(engine, items, False, batched=batched)
    over, over_songs, over_threads = _run(engine, items, True, batched=batched)
    assert [o.id for o in over] == [o.id for o in plain]  # the same order
    assert [o.status for o in over] == [o.status for o in plain] == ["complete"] * 5
    assert set(plain_threads.values()) == {"MainThread"} and set(over_threads.values()) == {SAVER}
    assert not _worker_alive()
    for o in plain:
        a, b = plain_songs[o.id], over_songs[o.id]
        assert a.score.abc_ids == b.score.abc_ids and a.tokens.codes == b.tokens.codes, o.id
        assert torch.equal(a.latents, b.latents) and torch.equal(a.audio, b.audio), o.id
        assert a.settings == b.settings, o.id


def test_a_failing_render_in_the_worker_fails_that_song_only(engine, monkeypatch):
    import yue2_core.pipeline as pipeline
    from yue2_core.errors import NumericalError
    real, seen = pipeline.render, []

    def render(ar, nar, tokens, *args, **kw):
        seen.append(threading.current_thread().name)
        if tokens.request["id"] == "off-cfg":  # the first song of the second batch
            raise NumericalError("flow matching produced non-finite latents (test)")
        return real(ar, nar, tokens, *args, **kw)
    monkeypatch.setattr(pipeline, "render", render)
    outcomes, songs, _ = _run(engine, _items(), True)
    status = {o.id: (o.status, o.stage, o.error) for o in outcomes}
    assert status["off-cfg"][:2] == ("failed", "render") and "non-finite latents" in status["off-cfg"][2]
    assert [o.id for o in outcomes if o.status == "complete"] == [r["id"] for r in rows() if r["id"] != "off-cfg"]
    assert set(songs) == {r["id"] for r in rows()} - {"off-cfg"}
    assert set(seen) == {WORKER} and not _worker_alive()


def _driver(engine, tmp_path):
    from yue2_core.batch import BatchOptions
    req = write_requests(tmp_path / "in")
    opts = BatchOptions(str(req), str(tmp_path / "out"), steps=STEPS, max_abc_tokens=ABC_CAP, max_batch=2,
                        overlap=True)
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=lambda: engine, vae=engine.info.vae)
    return opts, kw, tmp_path / "out"


def _wait(condition, what: str, timeout: float = 120.0):
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_ctrl_c_in_the_second_batch_leaves_the_first_batch_complete(tmp_path, engine, monkeypatch):
    from yue2_core import artifacts
    from yue2_core.batch import driver as run, runner
    real_save, real_semantic, saved, calls = artifacts.save_song, runner._semantic_phase, [], []
    monkeypatch.setattr(artifacts, "save_song", lambda song, path, lineage=None: (
        saved.append(song.request.id), real_save(song, path, lineage))[1])

    def semantic(engine_, jobs, batched, meter):
        calls.append(threading.current_thread().name)
        if len(calls) == 2:  # the second batch's AR, while the worker renders the first batch
            _wait(lambda: len(saved) == 2, "the first batch's songs")
            raise KeyboardInterrupt
        return real_semantic(engine_, jobs, batched, meter)
    monkeypatch.setattr(runner, "_semantic_phase", semantic)
    opts, kw, out = _driver(engine, tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run.run_batch(opts, **kw)
    assert not _worker_alive()
    first = [r["id"] for r in rows()[:2]]
    assert sorted(p.name for p in out.iterdir()) == sorted(["batch.json", *first])  # no partial folder
    for song_id in first:
        artifacts.load_song(out / song_id)  # verifies every file against its sha256
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert summary["interrupted"] and (summary["complete"], summary["pending"]) == (2, 3)
    assert summary["settings"]["overlap"] is True and calls == ["MainThread"] * 2


def test_ctrl_c_while_the_worker_renders_stops_it_at_its_next_step(tmp_path, engine, monkeypatch):
    import yue2_core.pipeline as pipeline
    from yue2_core import artifacts
    from yue2_core.batch import driver as run, runner
    stages, real_render, real_semantic, calls = [], pipeline.render, runner._semantic_phase, []
    rendering, steps_after_stop = threading.Event(), []

    class Stage(runner._RenderStage):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            stages.append(self)

    def render(ar, nar, tokens, steps, progress=None, **kw):
        rendering.set()
        _wait(lambda: stages[0].stop.is_set(), "the stop request")

        def counted(stage, done, total, info):
            steps_after_stop.append(done)
            return progress(stage, done, total, info)
        return real_render(ar, nar, tokens, steps, progress=counted, **kw)

    def semantic(engine_, jobs, batched, meter):
        calls.append(1)
        if len(calls) == 2:
            _wait(rendering.is_set, "the worker's first render")
            raise KeyboardInterrupt
        return real_semantic(engine_, jobs, batched, meter)
    monkeypatch.setattr(runner, "_RenderStage", Stage)
    monkeypatch.setattr(pipeline, "render", render)
    monkeypatch.setattr(runner, "_semantic_phase", semantic)
    opts, kw, out = _driver(engine, tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run.run_batch(opts, **kw)
    assert not _worker_alive() and not stages[0].thread.is_alive()
    assert steps_after_stop == [1]  # the first ODE step's callback raised: no second step, no decode, no save
    assert sorted(p.name for p in out.iterdir()) == ["batch.json"]
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert summary["interrupted"] and (summary["complete"], summary["pending"]) == (0, 5)


def test_an_exception_escaping_the_worker_reaches_the_main_thread(engine):
    """Not a song's failure (those are Exceptions, recorded per song): a BaseException from `deliver` — e.g. the
    SystemExit from a bug — is re-raised on the main thread, after the songs delivered before it."""
    from yue2_core.batch.runner import iter_songs
    delivered, got = [], []

    def deliver(item, song):
        if len(delivered) == 3:
            raise SystemExit("stop (test)")
        delivered.append(item.id)
        return item.id
    with pytest.raises(SystemExit, match="stop"):
        for outcome in iter_songs(engine, _items(), deliver=deliver, max_batch=2, steps=STEPS, overlap=True):
            got.append(outcome.id)
    assert got == delivered == [r["id"] for r in rows()[:3]]
    assert not _worker_alive()


def test_the_worker_renders_the_next_song_while_one_is_written(engine, monkeypatch):
    """Writing a song (FLAC, hashes, the folder) happens on the saver thread: while the first song's `deliver` is
    held, the worker renders the next one; the outcomes keep the queue's order (the items' own order: a second run
    of the five songs without the overlap, which this test used to compare with, gives that order too —
    test_songs_identical_with_and_without_overlap)."""
    import yue2_core.pipeline as pipeline
    from yue2_core.batch.runner import iter_songs
    real, rendered, held = pipeline.render, [], threading.Event()

    def render(ar, nar, tokens, *args, **kw):
        rendered.append(tokens.request["id"])
        return real(ar, nar, tokens, *args, **kw)

    def deliver(item, song):
        if not held.is_set():  # the first song: wait until the worker has started the second one's render
            held.set()
            _wait(lambda: len(rendered) >= 2, "the next song's render while the first is written", timeout=60)
        return item.id
    monkeypatch.setattr(pipeline, "render", render)
    items = _items()
    outcomes = list(iter_songs(engine, items, deliver=deliver, max_batch=2, steps=STEPS, overlap=True))
    assert [o.status for o in outcomes] == ["complete"] * 5
    assert [o.id for o in outcomes] == [item.id for item in items] == [r["id"] for r in rows()]
    assert not _worker_alive()


def test_a_second_ctrl_c_while_queued_songs_are_written_is_absorbed(engine, monkeypatch):
    """Break-it finding: with the writer's queue full, the first Ctrl-C's wait put a sentinel into that queue, so a
    second Ctrl-C escaped the wait and no song was reported although they were written. Now the second one is
    absorbed, every song handed to the writer is written and reported, and the interrupt propagates."""
    import _thread
    from yue2_core.batch import runner
    stages, calls, writing, written = [], [], threading.Event(), []
    real_semantic = runner._semantic_phase

    class Stage(runner._RenderStage):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            stages.append(self)

    def deliver(item, song):
        writing.set()
        time.sleep(0.8)  # a slow disk
        written.append(item.id)
        return item.id

    def second_ctrl_c():  # once the worker has ended, while the wait is on the writer's queued songs
        _wait(lambda: not stages[0].thread.is_alive(), "the worker's end")
        time.sleep(0.1)
        _thread.interrupt_main()

    def semantic(engine_, jobs, batched, meter):
        calls.append(1)
        if len(calls) == 2:  # the second batch; the first batch's 4 songs are with the worker and its writer
            _wait(lambda: writing.is_set() and stages[0].saver.items.full(), "a full writer queue")
            print("DBG queue", [(i[0], i[1].item.id if i[1] is not None else None) for i in list(stages[0].saver.items.queue)], written, flush=True)
            threading.Thread(target=second_ctrl_c, daemon=True).start()
            raise KeyboardInterrupt
        return real_semantic(engine_, jobs, batched, meter)
    monkeypatch.setattr(runner, "_RenderStage", Stage)
    monkeypatch.setattr(runner, "_semantic_phase", semantic)
    got = []
    with pytest.raises(KeyboardInterrupt):
        for outcome in runner.iter_songs(engine, _items(), deliver=deliver, max_batch=4, steps=STEPS, overlap=True):
            got.append(outcome.id)
    assert len(written) >= 3 and got == written  # every written song reported, in order
    assert not _worker_alive()


def test_a_ctrl_c_between_two_songs_still_reports_the_written_ones(tmp_path, engine, monkeypatch):
    """Break-it finding: a Ctrl-C landing in the driver (writing batch.json after a song) left songs the writer had
    finished, but not yet handed over, as "pending" in batch.json. The driver now raises it inside the songs'
    generator and records what that hands over: no verified song folder is left listed as pending."""
    from yue2_core import artifacts
    from yue2_core.batch import BatchOptions, driver as run, runner
    from yue2_core.batch.summary import BatchSummary
    real_write, real_plan, writes, plans, written = BatchSummary.write, runner._plan_phase, [], [], []

    def write(self, folder):
        writes.append(1)
        if len(writes) == 2:  # after the first recorded song: as if Ctrl-C came during this write
            raise KeyboardInterrupt
        return real_write(self, folder)

    def plan(engine_, jobs, batched, meter, **kw):
        plans.append(1)
        if len(plans) == 2:  # the second batch: the first batch's 4 songs are all written before any is reported
            _wait(lambda: len(written) == 4, "the first batch's songs on disk")
        return real_plan(engine_, jobs, batched, meter, **kw)

    def save(song, path, lineage=None):
        folder = real_save(song, path, lineage)
        written.append(path)
        return folder
    real_save = artifacts.save_song
    monkeypatch.setattr(BatchSummary, "write", write)
    monkeypatch.setattr(runner, "_plan_phase", plan)
    monkeypatch.setattr(artifacts, "save_song", save)
    opts, kw, out = _driver(engine, tmp_path)
    opts = BatchOptions(opts.requests, opts.output, steps=STEPS, max_abc_tokens=ABC_CAP, max_batch=4, overlap=True)
    with pytest.raises(KeyboardInterrupt):
        run.run_batch(opts, **kw)
    assert not _worker_alive()
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    status = {r["id"]: r["status"] for r in summary["results"]}
    on_disk = [p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(on_disk) == 4 and summary["interrupted"]
    for song_id in on_disk:
        artifacts.load_song(out / song_id)  # verifies
        assert status[song_id] == "complete", (song_id, status)


def test_memory_sizing_adds_the_render_stage_with_the_overlap(tmp_path, engine):
    from yue2_core.batch import BatchOptions, driver as run
    from yue2_core.batch.memory import fit_batch, size_batch, stage_bytes, vae_tile_bytes, render_bytes
    from yue2_core.batch.requests import prompt_tokens
    from yue2_core.errors import RequestError
    per, stage = 10, 25
    assert fit_batch(100, 0, per, 0, stage, overlap=True) == 7  # 100 ≥ 7·10 + 25
    assert fit_batch(100, 0, per, 0, stage, overlap=False) == 10  # 100 ≥ max(10·10, 25)
    assert fit_batch(100, 0, per, 0, 101, overlap=False) == 0
    with pytest.raises(RequestError, match=r"--max-batch 8 does not fit: at most 7 songs fit .*render stage"):
        size_batch(per, budget_bytes=100, weights_bytes=0, max_batch=8, on_cuda=False, stage=stage, overlap=True)
    assert size_batch(per, budget_bytes=100, weights_bytes=0, max_batch=8, on_cuda=False, stage=stage) == 8
    item = _items()[0]
    counts = prompt_tokens(item, engine.tokenizer.encode)
    dims, vae = engine.info.dims, engine.info.vae
    frames = item.budgets.semantic_sampling().max_tokens
    cpu = stage_bytes(dims, vae, 2, counts, item, on_cuda=False)
    assert cpu == max(render_bytes(dims, 2, counts["semantic"], frames), vae_tile_bytes(vae, frames)) > 0
    assert stage_bytes(dims, vae, 2, counts, item, on_cuda=True) == cpu + 384 * 2 ** 20
    # the release geometry: a 3.6-minute song after a 2,000-token prompt — NAR 1.76 GiB, VAE tile 3.33 GiB
    from types import SimpleNamespace
    from yue2_core.vae import VAEConfig
    full = SimpleNamespace(layers=28, kv_heads=8, head_dim=128, heads=16, hidden=2048, ffn=6144)
    release_vae = VAEConfig(64, 2048, ((2048, 1024, 6), (1024, 512, 5), (512, 256, 4), (256, 128, 4), (128, 64, 2),
                                       (64, 64, 2)))
    assert 1.7 < render_bytes(full, 2, 2000, 5371) / 2 ** 30 < 1.9
    assert 3.2 < vae_tile_bytes(release_vae, 5371) / 2 ** 30 < 3.5
    # through the driver: a budget that holds 5 songs' K/V and the stage side by side only without the overlap
    req = write_requests(tmp_path / "in")
    from yue2_core.batch.memory import song_bytes
    from yue2_core.batch.requests import read_requests
    todo, _ = read_requests(req, max_abc_tokens=ABC_CAP)
    sizes = [song_bytes(dims, 2, prompt_tokens(i, engine.tokenizer.encode), i) for i in todo]
    stages = [stage_bytes(dims, vae, 2, prompt_tokens(i, engine.tokenizer.encode), i, False) for i in todo]
    budget = 2 * max(sizes) + max(stages) - 1  # CPU: no headroom; two songs' K/V and the stage do not both fit
    kw = dict(tokenizer=engine.tokenizer, dims=dims, engine_factory=_never, vae=vae)
    gib = budget / 2 ** 30
    with pytest.raises(RequestError, match=r"--max-batch 2 does not fit: at most 1 songs fit .*--overlap"):
        run.run_batch(BatchOptions(str(req), str(tmp_path / "o1"), max_batch=2, budget_gib=gib,
                                   max_abc_tokens=ABC_CAP, overlap=True), **kw)
    with pytest.raises(AssertionError, match="must not load"):  # without the overlap, two fit
        run.run_batch(BatchOptions(str(req), str(tmp_path / "o2"), max_batch=2, budget_gib=gib,
                                   max_abc_tokens=ABC_CAP, overlap=False), **kw)


def _never():
    raise AssertionError("the engine must not load")


def test_default_overlap_follows_the_device():
    from yue2_core.__main__ import build_parser
    from yue2_core.batch.runner import default_overlap
    parse = build_parser().parse_args
    assert [parse(["batch", "r.jsonl", "--output", "o", *flag]).overlap
            for flag in ([], ["--overlap"], ["--no-overlap"])] == [None, True, False]
    assert default_overlap(torch.device("cuda")) is True and default_overlap("cuda:1") is True
    assert default_overlap(torch.device("cpu")) is False


def test_a_song_folder_keeps_its_marker_through_the_syncs(tmp_path, engine, monkeypatch):
    """Break-it finding: the save removed its temporary folder's marker before the fsyncs, so a save killed during
    them (SIGKILL, a slow disk) left a folder the next save's sweep could not recognise. The marker now stays until
    the files are synced (the folder and its parent are synced after it, stop 45)."""
    import os as os_
    from yue2_core import artifacts
    seen, real = [], os_.fsync

    def fsync(fd):
        path = Path(os_.readlink(f"/proc/self/fd/{fd}"))
        if path.is_file():  # the files' syncs; the folder syncs (artifacts.fsync_folder) come after the marker's end
            seen.append(artifacts.PARTIAL_MARKER in {p.name for p in path.parent.iterdir()})
        return real(fd)
    item = _items()[0]
    song = engine.generate(item.request, item.budgets, steps=1)
    monkeypatch.setattr(os_, "fsync", fsync)
    artifacts.save_song(song, tmp_path / "song")
    assert seen and all(seen)
    assert artifacts.PARTIAL_MARKER not in {p.name for p in (tmp_path / "song").iterdir()}
