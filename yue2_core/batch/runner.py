"""The worker side of a batch: songs of DIFFERENT requests through one loaded engine, AR phases decoded together.

`iter_songs(engine, items, deliver=…)` takes an engine (or a factory called once) and validated `BatchRequest`s,
and yields one `SongOutcome` per request as its song is delivered (or fails). It never reads the request file nor
decides what to resume: that is the driver's part (`driver.py`), so a distributed layer can hand each worker a list
of requests and a `deliver` of its own.

Static batching: the queue is cut into batches of up to `max_batch` requests. In each batch the planning phase
(requests whose score the model writes) and then the semantic phase run for all rows, then each song is rendered,
decoded and delivered. How a phase runs:

- batched (`fast.decode.PhaseDecoder`, default on CUDA): rows with their own prompts, prompt lengths, positions,
  seeds and stop flags decode in one batch; the decoder takes one sampling preset, CFG scale and legacy-off flag per
  batch, so the rows of a phase are grouped by those settings (the queue is sorted by them first, so compatible
  requests share batches). Each row draws from its own seed's stream, as a single run on the GPU does.
- one row at a time (default elsewhere, e.g. the CPU): `pipeline.plan` / `pipeline.semantic` exactly as
  `YuE2Engine.generate` calls them — the portable loop samples with `torch.multinomial` from a fresh generator per
  phase, a stream the batch decoder's exponential race does not reproduce, and batched fp32 CPU products differ from
  single-row ones in the last bits; so on the CPU a batch's songs are bit-identical to `generate`.

A failure (a budget that no longer fits after the score was written, a numerical error, a write error) fails that
song only; a batched phase that raises is re-run row by row so the failing row is isolated. Ctrl-C propagates.

The overlap (`overlap=True`, default on CUDA): when a batch's AR phases are done, its songs are rendered and decoded
one after the other by a worker thread and delivered by the worker's writer thread (`_Saver`) while the worker
renders the next song (`_RenderStage`; on CUDA each stage in a green context of its own SMs,
or on streams of low and high priority: `streams.py`) while this thread decodes the next batch's AR phases. At most one batch is in the render
stage: the next one is handed over only when the previous one is finished, so the device holds one batch's K/V
caches plus one song's NAR/VAE working set (`memory.stage_bytes`). Only host data crosses the threads (token lists
in, CPU latents/audio and the delivered path out), so no tensor is shared between the streams besides the read-only
weights (the worker's stream first waits for everything this thread queued before the hand-over). Outcomes are
yielded in the order of the sequential path (the queue's order), each when its song is done and this thread is
between AR phases; a song failing in the worker fails alone; Ctrl-C (KeyboardInterrupt on this thread) stops the
worker at its next render step, VAE tile or song, waits for it, yields the songs it finished and re-raises; an
exception escaping the worker (not a song's failure) is re-raised on this thread at the next hand-over. On CUDA the
decoder's graph captures run in "thread_local" mode and under `fast.decode.CAPTURE_LOCK` while the worker runs
(`fast.decode.concurrent_capture`).
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

from ..constants import ODE_STEPS, PROTOCOL_VERSION
from ..errors import YuE2Error, brief

Deliver = Callable[[object, object], str]  # (BatchRequest, Song) → where the song was written
Event = Callable[[str, str, dict], None]  # (song id, stage, info: done, total, rows, aggregate_tokens_per_second)


@dataclass
class SongOutcome:
    """What happened to one request: `status` "complete" or "failed"; `stage` the last stage reached (where it
    failed); `output` where `deliver` put the song; `rows` how many songs its semantic phase decoded with;
    `disk_full` its save failed for lack of space (`errors.DiskFullError`): the driver stops the batch."""

    id: str
    line: int
    status: str
    stage: str
    output: str | None = None
    error: str | None = None
    audio_seconds: float | None = None
    semantic_tokens: int | None = None
    abc_tokens: int | None = None
    truncated: dict | None = None
    rows: int = 1
    timing: dict = field(default_factory=dict)
    disk_full: bool = False

    def to_dict(self) -> dict:
        """The outcome's fields as a dict (what a Ray worker sends back)."""
        return asdict(self)


class _Job:
    def __init__(self, item):
        self.item, self.score, self.tokens, self.error, self.stage = item, None, None, None, "queued"
        self.timing: dict = {}
        self.rows = 1
        self.abc_asked = None  # the ABC budget asked for, when `fit_abc_budget` lowered it for a batched plan
        self.disk_full = False  # its save failed for lack of space (`errors.DiskFullError`)

    def fail(self, stage: str, exc: BaseException) -> None:
        self.stage, self.error = stage, str(exc) if isinstance(exc, YuE2Error) else brief(exc)


class _Meter:
    """Per-song stage events and the aggregate AR rate (all songs' sampled tokens / wall time since the start)."""

    def __init__(self, on_event: Event | None):
        self.on_event, self.t0, self.tokens = on_event, time.perf_counter(), 0
        self.lock = threading.Lock()  # the render worker reports too: one line at a time

    def rate(self, extra: int = 0) -> float:
        elapsed = time.perf_counter() - self.t0
        return (self.tokens + extra) / elapsed if elapsed > 0 else 0.0

    def emit(self, song_id: str, stage: str, **info) -> None:
        if self.on_event is not None:
            with self.lock:
                self.on_event(song_id, stage, {**info, "aggregate_tokens_per_second": self.rate(info.get("live", 0))})

    def progress(self, song_id: str, rows: int = 1, stop: threading.Event | None = None):
        """A pipeline `Progress` for one song (or a batch of `rows` decoding together). `stop`: raise `_Stopped`
        from the callback once it is set (the render worker's cancellation point: every ODE step and VAE tile)."""
        def cb(stage, done, total, info):
            if stop is not None and stop.is_set():
                raise _Stopped
            live = done * rows if stage in ("plan", "semantic") else 0
            self.emit(song_id, stage, done=done, total=total, rows=rows, live=live)
        return cb


class _Stopped(BaseException):
    """Raised inside the render worker when the main thread asked it to stop (Ctrl-C): a BaseException, so the
    per-song `except Exception` handlers do not record it as that song's failure."""


def default_batched(ar) -> bool:
    """Whether AR phases decode several songs in one batch by default: where the batch decoder is the decoder
    `generate` uses too (CUDA with YUE2_FAST on), so a batch keeps the single runs' sampling stream."""
    from ..fast import fast_enabled
    return fast_enabled(ar.device)


def default_overlap(device) -> bool:
    """Whether the render stage overlaps the next batch's AR phases by default: on CUDA (the NAR/VAE and the AR decode
    share the GPU; the AR is launch-bound and leaves most of it idle). Not on the CPU: both stages are compute-bound
    there and two threads share the same cores (measured with the tiny model on 2 cores: docs/batch.md)."""
    import torch
    return torch.device(device).type == "cuda"


def _batch_key(item) -> tuple:
    b, r = item.budgets, item.request
    return (r.cot == "off", r.guidance, tuple(sorted(b.semantic_sampling().to_dict().items())))


def iter_songs(engine, items: list, *, deliver: Deliver, max_batch: int = 8, steps: int = ODE_STEPS,
               on_event: Event | None = None, batched: bool | None = None,
               overlap: bool | None = None, method: str = "midpoint",
               continuous: bool = False, jobs: dict | None = None) -> Iterator[SongOutcome]:
    """Run `items` (validated `BatchRequest`s) on `engine` (a `YuE2Engine`, or a callable returning one) in
    batches of up to `max_batch`; yield each song's `SongOutcome` after `deliver(item, song)` wrote it, in the
    queue's order. `batched`: decode each phase's rows in one `PhaseDecoder` batch (default: `default_batched`);
    False runs rows one at a time through the same stage functions as `generate`. `overlap`: render, decode and
    deliver a batch's songs on a worker thread while the next batch's AR phases run (default: `default_overlap`;
    the songs are the same either way). `steps`, `method`: ODE steps and solver of the renderer ("midpoint", the
    release's, or the opt-in "ab2": `nar.solve`). `continuous`: continuous batching — each phase decodes the whole
    queue on `max_batch` rows, a finished song's row refilled with the next song (`continuous.py`; implies `batched`
    unless it is False, which is refused); outcomes then come as songs finish. `deliver` runs on the worker
    thread with the overlap. `jobs`: a dict this run fills with each request's job by id as the job is made, which
    `left_outcome` reads once a stopped run ended (a full disk, Ctrl-C): how far each song not yielded got. Raises
    RequestError for a bad `max_batch` or `method`, or `continuous` with `batched` False; KeyboardInterrupt and
    errors outside a song propagate (with the overlap, after the worker stopped)."""
    if not hasattr(engine, "ar") and callable(engine):
        engine = engine()
    if type(max_batch) is not int or max_batch < 1:
        from ..errors import RequestError
        raise RequestError(f"max_batch must be a positive integer, got {max_batch!r}")
    from ..nar import check_method
    method = check_method(method)
    if continuous and batched is not None and not batched:
        from ..errors import RequestError
        raise RequestError("continuous batching refills rows of the batch decoder: it needs batched AR phases")
    if continuous and engine.ar.device.type == "cuda" and not default_batched(engine.ar):
        from ..errors import RequestError
        raise RequestError("--continuous decodes with the fast GPU decoder, which YUE2_FAST=0 turns off: leave out "
                           "one of them")
    batched = (True if continuous else default_batched(engine.ar)) if batched is None else bool(batched)
    overlap = default_overlap(engine.ar.device) if overlap is None else bool(overlap)
    ledger = {} if jobs is None else jobs

    def make_job(item) -> _Job:
        ledger[item.id] = job = _Job(item)
        return job
    if continuous:
        from .continuous import continuous_songs
        yield from continuous_songs(engine, list(items), max_batch=max_batch, steps=steps,
                                    deliver=deliver, meter=_Meter(on_event), method=method, overlap=overlap,
                                    make_job=make_job)
        return
    queue = sorted(items, key=_batch_key) if batched else list(items)
    batches = [queue[start:start + max_batch] for start in range(0, len(queue), max_batch)]
    meter = _Meter(on_event)
    if overlap and len(batches) > 1:
        yield from _overlapped(engine, batches, batched, steps, deliver, meter, method, make_job)
        return
    for batch in batches:
        jobs = [make_job(item) for item in batch]
        _plan_phase(engine, jobs, batched, meter)
        _semantic_phase(engine, jobs, batched, meter)
        for job in jobs:
            if job.error is None:
                _finish(engine, job, steps, deliver, meter, method=method)
            yield _outcome(job)
        _release(engine)


def run_songs(engine, items: list, **kw) -> list[SongOutcome]:
    """`iter_songs` collected into a list (same arguments)."""
    return list(iter_songs(engine, items, **kw))


# -- phases ------------------------------------------------------------------------------------------------------
def _plan_phase(engine, jobs: list, batched: bool, meter: _Meter, rows: int | None = None) -> None:
    """The planning phase of `jobs` (scores supplied, cot off, or written by the model). `rows`: continuous
    batching — the model-written scores of each sampling group decode in one `fast.refill.RefillDecoder` of that
    many rows (`continuous.py`)."""
    from ..pipeline import fit_abc_budget, plan
    from ..protocol import check_budget, planning_prefix
    ar, tok = engine.ar, engine.tokenizer
    model_jobs = []
    for job in jobs:
        req, b = job.item.request, job.item.budgets
        t = time.perf_counter()
        try:
            if batched and req.cot != "off" and req.abc is None:
                abc, sem = b.abc_sampling(), b.semantic_sampling()
                prefix = planning_prefix(req, tok.encode)
                check_budget(len(prefix), abc.max_tokens, "ABC")  # plan()'s checks, before the batch
                check_budget(len(prefix) + 2, sem.max_tokens, "semantic")
                job.abc_asked = abc.max_tokens  # `score_of` records a budget lowered so the music fits
                model_jobs.append((job, prefix, fit_abc_budget(len(prefix), abc, sem.max_tokens)))
                continue
            job.stage = "plan"
            job.score = plan(ar, tok, req, b.abc_sampling(), meter.progress(req.id), b.semantic_sampling().max_tokens)
            meter.tokens += job.score.timing.get("output_tokens", 0) if job.score.source == "model" else 0
        except Exception as exc:  # noqa: BLE001 - one song's failure never stops the others
            job.fail("plan", exc)
        job.timing["plan_seconds"] = time.perf_counter() - t
    if rows is None:
        key = lambda entry: tuple(sorted(entry[2].to_dict().items()))  # noqa: E731 - one preset per decoder
    else:
        from .continuous import shared_settings
        key = lambda entry: shared_settings(entry[2])  # noqa: E731 - a refill decoder: a budget per row
    for group in _groups(model_jobs, key):
        def single(entry):
            job = entry[0]
            return plan(ar, tok, job.item.request, entry[2], meter.progress(job.item.id),
                        job.item.budgets.semantic_sampling().max_tokens)

        def batch(entries):
            from ..fast.decode import PhaseDecoder
            seeds = [e[0].item.request.seed for e in entries]
            results = PhaseDecoder(ar, [e[1] for e in entries], entries[0][2], seeds, "abc").run(
                _batch_tokens(meter, entries[0][0].item.id, "plan", len(entries)))
            return [score_of(engine, e, r) for r, e in zip(results, entries)]

        def store(job, score):
            job.score = score
        if rows is None:
            _run_group(group, "plan", batch, single, meter, store)
            continue
        from .continuous import plan_source, run_queue
        for _ in run_queue(group, "plan", lambda part: plan_source(engine, part, rows, meter), meter, store):
            pass


def score_of(engine, entry, result):
    """The `Score` of a batched planning row: entry (job, prefix, sampling), result its `PhaseResult`."""
    from ..pipeline import Score, abc_timing
    req = entry[0].item.request
    asked = entry[0].abc_asked or entry[2].max_tokens
    return Score(abc=engine.tokenizer.decode(result.tokens), abc_ids=result.tokens, cot=req.cot, seed=req.seed,
                 source="model", truncated=result.truncated, timing=abc_timing(result.timing, asked, entry[2]))


def _semantic_phase(engine, jobs: list, batched: bool, meter: _Meter) -> None:
    entries = _semantic_entries(engine, jobs, batched, meter)
    ar = engine.ar

    def batch(group):
        from ..fast.decode import PhaseDecoder
        req0 = group[0][0].item.request
        negatives = [e[3] for e in group] if req0.guidance != 1.0 else None
        results = PhaseDecoder(ar, [e[1] for e in group], group[0][2], [e[0].item.request.seed for e in group],
                               "semantic", negatives=negatives, cfg_scale=req0.guidance,
                               legacy_off=req0.cot == "off").run(
            _batch_tokens(meter, group[0][0].item.id, "semantic", len(group)))
        return [semantic_tokens(e, r) for r, e in zip(results, group)]
    for group in _groups(entries, lambda e: _batch_key(e[0].item)):
        _run_group(group, "semantic", batch, lambda e: semantic_single(engine, e, meter), meter, _store_tokens)


def _store_tokens(job, tokens) -> None:
    job.tokens = tokens


def semantic_tokens(entry, result):
    """The `SemanticTokens` of a batched row: entry (job, prefix, sampling, negative), result its `PhaseResult`."""
    from ..pipeline import SemanticTokens, request_dict
    from ..protocol import codes_from_ids
    job, req = entry[0], entry[0].item.request
    return SemanticTokens(codes=codes_from_ids(result.tokens), prefix=entry[1], score=job.score,
                          request=request_dict(req), seed=req.seed, cfg_scale=req.guidance,
                          sampling=entry[2].to_dict(), ended=result.ended, timing=result.timing)


def semantic_single(engine, entry, meter: _Meter):
    """One row's semantic phase on its own (`pipeline.semantic`, as `generate` runs it)."""
    from ..pipeline import semantic
    job = entry[0]
    return semantic(engine.ar, engine.tokenizer, job.item.request, job.score, entry[2], meter.progress(job.item.id))


def _semantic_entries(engine, jobs: list, batched: bool, meter: _Meter) -> list:
    """The semantic phase's batched rows (job, prefix, sampling, negative) of `jobs`; without `batched` each row
    runs here on its own instead. A row whose prompt cannot be built or does not fit fails here."""
    from ..pipeline import semantic
    from ..protocol import check_budget, negative_prefix, semantic_prefix
    ar, tok = engine.ar, engine.tokenizer
    entries = []
    for job in jobs:
        if job.error is not None:
            continue
        req, sem = job.item.request, job.item.budgets.semantic_sampling()
        job.stage = "semantic"
        if not batched:
            t = time.perf_counter()
            try:
                job.tokens = semantic(ar, tok, req, job.score, sem, meter.progress(req.id))
                meter.tokens += job.tokens.timing.get("output_tokens", 0)
            except Exception as exc:  # noqa: BLE001
                job.fail("semantic", exc)
            job.timing["semantic_seconds"] = time.perf_counter() - t
            continue
        try:
            prefix = semantic_prefix(req, job.score.abc_ids, tok.encode)
            check_budget(len(prefix), sem.max_tokens, "semantic")
            negative = negative_prefix(req, job.score.abc_ids, tok.encode) if req.guidance != 1.0 else None
        except Exception as exc:  # noqa: BLE001
            job.fail("semantic", exc)
            continue
        entries.append((job, prefix, sem, negative))
    return entries


def _groups(entries: list, key) -> list[list]:
    """Entries split by `key` (first-seen order): the rows one PhaseDecoder batch may hold together."""
    out: dict = {}
    for e in entries:
        out.setdefault(key(e), []).append(e)
    return list(out.values())


def _run_group(group: list, stage: str, batch, single, meter: _Meter, store) -> None:
    """One batched decode of `group`; if it raises (a row's NaN logits, memory), every row again on its own so
    only the failing rows fail."""
    t = time.perf_counter()
    results = None
    if len(group) > 1:
        try:
            results = batch(group)
        except Exception:  # noqa: BLE001 - isolate the failing row below
            results = None
    if results is not None:
        seconds = time.perf_counter() - t
        for e, r in zip(group, results):
            store(e[0], r)
            e[0].rows = len(group)
            e[0].timing[f"{stage}_seconds"] = seconds
            meter.tokens += r.timing.get("output_tokens", 0)
        return
    for e in group:
        t = time.perf_counter()
        try:
            r = single(e)
            store(e[0], r)
            meter.tokens += r.timing.get("output_tokens", 0)
        except Exception as exc:  # noqa: BLE001
            e[0].fail(stage, exc)
        e[0].timing[f"{stage}_seconds"] = time.perf_counter() - t


def _batch_tokens(meter: _Meter, first_id: str, stage: str, rows: int):
    def on_token(phase, step, total, token):
        meter.emit(first_id, stage, done=step + 1, total=total, rows=rows, live=(step + 1) * rows)
    return on_token


def song_settings(engine, item, steps: int, method: str = "midpoint") -> dict:
    """config.json of a batch song: exactly what `YuE2Engine.generate` records for the same request and budgets."""
    req, b = item.request, item.budgets
    return {"protocol": PROTOCOL_VERSION, "cot": req.cot, "cfg_scale": req.guidance,
            "abc_sampling": b.abc_sampling().to_dict(), "semantic_sampling": b.semantic_sampling().to_dict(),
            "ode_steps": steps, "ode_method": method, "model_dtype": str(engine.ar.dtype).split(".")[-1],
            "vae_dtype": "float32", "vae_decode": "halo_crop", "device": str(engine.ar.device),
            "checkpoint": engine.info.to_dict(), "weights": engine.weights}


def _finish(engine, job: _Job, steps: int, deliver: Deliver, meter: _Meter,
            stop: threading.Event | None = None, method: str = "midpoint", save=None) -> bool:
    """Render, decode and deliver one song (failures recorded on the job). `stop` (the render worker's): once set,
    the next ODE step or VAE tile raises `_Stopped`, and a finished song is not delivered. `save(job, song)` (the
    render worker's `_Saver.put`): hand the finished song over instead of delivering it here; returns True then."""
    from ..pipeline import Song, decode, plan_notes, render
    req = job.item.request
    progress = meter.progress(req.id, stop=stop)
    try:
        job.stage = "render"
        t = time.perf_counter()
        latents = render(engine.ar, engine.nar, job.tokens, steps, progress=progress, method=method)
        job.timing["render_seconds"] = time.perf_counter() - t
        job.stage = "decode"
        t = time.perf_counter()
        audio = decode(engine.vae, latents, progress=progress)
        job.timing["decode_seconds"] = time.perf_counter() - t
        job.timing["total_seconds"] = sum(job.timing.values())
        song = Song(request=req, score=job.score, tokens=job.tokens, latents=latents, audio=audio,
                    timing=dict(job.timing), settings=song_settings(engine, job.item, steps, method),
                    warnings=req.input_warnings(getattr(job.score, "abc", None)) + plan_notes(job.score))
        job.stage = "save"
        if stop is not None and stop.is_set():
            raise _Stopped
    except Exception as exc:  # noqa: BLE001
        job.fail(job.stage, exc)
        meter.emit(req.id, "failed", error=job.error, at=job.stage)
        return False
    if save is not None:
        save(job, song)
        return True
    _deliver(job, song, deliver, meter)
    return False


def _deliver(job: _Job, song, deliver: Deliver, meter: _Meter) -> None:
    """Write a rendered song (`deliver`: FLAC encoding, hashes, the atomic song folder) and mark the job complete, or
    failed at "save"."""
    from ..errors import DiskFullError
    req = job.item.request
    try:
        job.output = str(deliver(job.item, song))
        job.audio_seconds = song.audio.shape[-1] / song.sample_rate
        job.stage = "complete"
        meter.emit(req.id, "complete")
    except Exception as exc:  # noqa: BLE001
        job.fail(job.stage, exc)
        job.disk_full = isinstance(exc, DiskFullError)
        meter.emit(req.id, "failed", error=job.error, at=job.stage)


class _Saver:
    """The render worker's writer: a thread that delivers the songs the worker rendered, in the order handed over,
    while the worker already renders the next one (FLAC encoding, sha256 and the folder's writes take ~0.6 s for a
    3.6-minute song on one core, and release the GIL; on the render stage's critical path they would delay every
    later song). Items: ("song", job, song, handoff) — delivered, then its outcome appended to the hand-over;
    ("outcome", job, None, handoff) — a job that failed before, its outcome appended in order; ("done", None, None,
    handoff) — the hand-over is complete. The queue holds at most `DEPTH` items, so at most DEPTH + 2 songs keep
    their audio on the host (≈ 80 MB each for 3.6 minutes: one being written, those queued, one the worker waits to
    hand over) and a slow disk slows the worker down instead of filling memory. Songs handed over before a stop
    (Ctrl-C) are still written: the worker stops rendering, not writing. A BaseException escaping `deliver` (not a
    song's failure, e.g. SystemExit) is handed to the main thread and stops both: nothing more is written. The
    thread polls its queue and ends once `closing` is set and the queue is empty (no sentinel to put: a put could
    block on a full queue while Ctrl-C arrives).

    Each song folder is renamed into place under `commit` (`artifacts.rename_gate`), and `seal` — the main thread's,
    once the writer ended or the waiting for it was cut short — takes that lock and ends the renames: a rename in
    progress finishes first, a later one is refused (its temporary folder removed; the song stays "pending"). So
    what the main thread then records of the batch (batch.json, `driver._account_left` reading the folders on
    disk) holds every song folder this writer ever publishes (stop-47 review: a rename finishing after that record
    left its row "pending" beside the complete folder). Signals cannot be held on this thread (Python runs their
    handlers on the main thread), so the order is kept by the lock instead."""

    DEPTH = 2

    def __init__(self, deliver: Deliver, meter: _Meter, stop: threading.Event):
        import queue
        self.deliver, self.meter, self.stop, self.broken = deliver, meter, stop, False
        self.items: "queue.Queue" = queue.Queue(maxsize=self.DEPTH)
        self.closing = threading.Event()  # set once nothing more will be put: the thread ends when the queue is empty
        self.commit = threading.Lock()  # held over each rename into place (`_gate`); `seal` takes it
        self.sealed = False
        self.thread, self.ended = _started(self._work, "yue2-save")

    def put(self, item: tuple) -> None:
        self.items.put(item)

    @contextlib.contextmanager
    def _gate(self):
        """Where a song folder is renamed into place (`artifacts.rename_gate`): under `commit`, refused once sealed."""
        with self.commit:
            if self.sealed:
                raise _Stopped
            yield

    def seal(self) -> None:
        """On the main thread: no song folder is renamed into place from now on. Waits for a rename in progress
        (a rename and a folder sync) with Ctrl-C / SIGTERM / SIGHUP held, delivered after it (`signals_held`), so
        the wait cannot be cut between the rename and what the caller records next."""
        from ..artifacts import signals_held
        with signals_held():
            with self.commit:
                self.sealed = True

    def _work(self) -> None:
        from ..artifacts import rename_gate
        with rename_gate(self._gate):
            self._loop()

    def _loop(self) -> None:
        import queue
        while True:
            try:
                item = self.items.get(timeout=0.1)
            except queue.Empty:
                if self.closing.is_set():
                    return
                continue
            kind, job, song, handoff = item
            try:
                if kind == "song" and not self.broken:
                    _deliver(job, song, self.deliver, self.meter)
                    if job.disk_full:  # no room for songs: the worker renders no more (the driver stops the batch)
                        self.stop.set()
                if kind in ("song", "outcome") and not self.broken:
                    handoff.outcomes.append(_outcome(job))
            except _Stopped:  # sealed (`seal`): the main thread has recorded the batch's end; this song's folder was
                self.broken = True  # not renamed into place (nothing written), so it stays "pending" as recorded
            except BaseException as exc:  # noqa: BLE001 - not a song's failure (a bug, SystemExit from deliver):
                handoff.error = handoff.error or exc  # re-raised on the main thread with the hand-over; the worker
                self.broken = True  # stops at its next step and nothing more is written
                self.stop.set()
            finally:
                if kind == "done":
                    handoff.done.set()
                del item, job, song  # the song's audio is freed before the next item is awaited

    def close(self, interrupts: list | None = None) -> None:
        """Wait for the queued songs to be written, then for the thread to end (call it once nothing more is put;
        `interrupts`: `_join`'s count, shared with an earlier wait)."""
        self.closing.set()
        _join(self.thread, self.ended, interrupts)


def _started(target, name: str) -> tuple[threading.Thread, threading.Event]:
    """A daemon thread running `target`, and an event set when it ends (however it ends). Waits use the event, not
    `Thread.join`: a KeyboardInterrupt inside `join(timeout)` can leave the thread object reporting `is_alive()`
    False while the thread still runs (CPython, seen on 3.11 with a Ctrl-C during the writer's save)."""
    ended = threading.Event()

    def run():
        try:
            target()
        finally:
            ended.set()
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, ended


def _join(thread: threading.Thread, ended: threading.Event, interrupts: list | None = None) -> None:
    """Wait for a thread of `_started` to end (its `ended` event, then the thread's last instructions). A second
    Ctrl-C while waiting is absorbed (the thread is already stopping; leaving it mid-kernel or mid-write would end
    the process in an abort at exit); a third one stops the waiting. `interrupts` ([count]): the Ctrl-Cs seen so far
    by the waits of one close, which share it."""
    interrupts = [0] if interrupts is None else interrupts
    while True:
        try:
            if ended.wait(0.1):
                break
        except KeyboardInterrupt:
            interrupts[0] += 1
            if interrupts[0] >= 2:
                raise
    try:
        thread.join(1.0)  # it has set `ended`: only its return is left
    except KeyboardInterrupt:
        pass


def _outcome(job: _Job) -> SongOutcome:
    item = job.item
    ok = job.error is None
    return SongOutcome(
        id=item.id, line=item.line, status="complete" if ok else "failed", stage=job.stage,
        output=getattr(job, "output", None) if ok else None, error=job.error,
        audio_seconds=getattr(job, "audio_seconds", None) if ok else None,
        semantic_tokens=len(job.tokens.codes) if job.tokens is not None else None,
        abc_tokens=len(job.score.abc_ids) if job.score is not None else None,
        truncated={"abc": job.score.truncated, "semantic": job.tokens.truncated} if ok else None,
        rows=job.rows, timing={k: round(v, 4) for k, v in job.timing.items()}, disk_full=job.disk_full)


def left_outcome(job: _Job) -> SongOutcome:
    """The outcome of a song a stopped run did not yield (`iter_songs`' `jobs`): complete or failed as far as it
    got — a failure before the stop is one (was: left "pending") —, else "pending" with `stage` the last AR phase
    it finished ("plan": its lead sheet; "semantic": its music tokens too, not rendered), None if none."""
    if job.error is not None or job.stage == "complete":
        return _outcome(job)
    done = "semantic" if job.tokens is not None else "plan" if job.score is not None else None
    return SongOutcome(id=job.item.id, line=job.item.line, status="pending", stage=done, rows=job.rows,
                       timing={k: round(v, 4) for k, v in job.timing.items()})


def _release(engine) -> None:
    """Return the caching allocator's free blocks (the working sets of the AR batch and the render stage differ).
    Under `fast.decode.CAPTURE_LOCK`: never while the other thread captures a decode graph."""
    import torch
    if engine.ar is not None and engine.ar.device.type == "cuda":
        from ..fast.decode import CAPTURE_LOCK
        with CAPTURE_LOCK:
            torch.cuda.empty_cache()


# -- the overlap ---------------------------------------------------------------------------------------------------
class _Handoff:
    """One batch given to the render worker: its jobs, the outcomes finished so far (in the jobs' order), and how
    the worker ended (`error`: an exception that escaped it, re-raised on the main thread)."""

    def __init__(self, jobs: list, ready=None):
        self.jobs, self.ready = jobs, ready  # ready: a CUDA event after the main stream's work so far
        self.outcomes: list[SongOutcome] = []
        self.taken = 0
        self.error: BaseException | None = None
        self.done = threading.Event()

    def take(self, block: bool, worker: threading.Thread) -> Iterator[SongOutcome]:
        """The outcomes finished since the last call, one at a time (an outcome counts as taken once yielded: when
        the consumer is interrupted while handling one, the next call still yields the rest); `block`: wait until
        the batch is done first (in 0.1 s waits, so Ctrl-C is seen at once, and a `worker` — the thread that sets
        `done`, `_RenderStage.finisher` — that died without finishing cannot hang this thread)."""
        while block and not self.done.wait(0.1):
            if not worker.is_alive() and not self.done.is_set():
                raise RuntimeError("the render worker ended without finishing its batch")
        while self.taken < len(self.outcomes):
            self.taken += 1
            yield self.outcomes[self.taken - 1]

    def check(self) -> None:
        """Re-raise, on the main thread, an exception that escaped the worker (once the batch is done)."""
        if self.done.is_set() and self.error is not None:
            error, self.error = self.error, None
            raise error


class _RenderStage:
    """The render worker: a thread rendering (NAR), decoding (VAE) and delivering the songs of one handed-over batch
    at a time. On CUDA the two stages run where `streams.placements` puts them (each in a CUDA green context of its
    own SMs, or on streams of low and high priority), and the stage holds `fast.decode.concurrent_capture()` while alive, so graphs captured meanwhile by the main thread use
    capture_error_mode "thread_local": in the default "global" mode the CUDA runtime refuses "unsafe" calls from ANY
    thread during a capture — the worker's cudaMalloc when the caching allocator must grow (the capture's own
    `torch.cuda.graph` entry empties the cache first), its pageable device-to-host copies (`.cpu()` of latents and
    audio) and stream syncs — and invalidates the capture. In "thread_local" mode only the capturing thread is
    restricted; the worker's allocations come from the normal pools (PyTorch routes only the capturing stream's
    allocations into the graph's private pool), its copies and syncs touch only its own stream, which the capture
    never joins. What stays unsafe beside a capture is a device-wide synchronize or `empty_cache` (cudaFree), so the
    worker does those only under `fast.decode.CAPTURE_LOCK`, which the main thread holds while it captures."""

    def __init__(self, engine, steps: int, deliver: Deliver, meter: _Meter, method: str = "midpoint"):
        self.engine, self.steps, self.deliver, self.meter, self.method = engine, steps, deliver, meter, method
        self.stop = threading.Event()
        self.closed = False
        self.inbox: list = []
        self.wake = threading.Condition()
        self.cuda = engine.ar.device.type == "cuda"
        self.ar_place = self.render_place = None
        self.capture = contextlib.nullcontext()
        if self.cuda:
            import torch
            from ..fast.decode import concurrent_capture
            from .streams import placements
            self.ar_place, self.render_place, note = placements(engine.ar.device)
            meter.emit("", "overlap", note=f"overlap: {note}")
            self.ar_place.stream.wait_stream(torch.cuda.current_stream(engine.ar.device))  # the loaded weights
            self.capture = concurrent_capture()
        self.capture.__enter__()
        self.saver = _Saver(deliver, meter, self.stop)
        self.thread, self.ended = _started(self._work, "yue2-render")

    @property
    def finisher(self) -> threading.Thread:
        """The thread that completes a hand-over (sets its `done`): the writer, after the hand-over's songs."""
        return self.saver.thread

    def ar_context(self):
        """Where the main thread runs the AR phases on CUDA (`streams.placements`: a green context's SMs, or the
        high-priority stream)."""
        return contextlib.nullcontext() if self.ar_place is None else self.ar_place

    def submit(self, jobs: list) -> _Handoff:
        """Hand a batch whose AR phases are done to the worker (the caller waited for the previous one)."""
        ready = None
        if self.cuda:
            import torch
            ready = torch.cuda.Event()
            ready.record(self.ar_place.stream)
        handoff = _Handoff(jobs, ready)
        with self.wake:
            self.inbox.append(handoff)
            self.wake.notify()
        return handoff

    def _work(self) -> None:
        while True:
            with self.wake:
                while not self.inbox and not self.stop.is_set():
                    self.wake.wait()
                if not self.inbox:
                    return
                handoff = self.inbox.pop(0)
            try:
                self._render(handoff)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread (a bug: songs fail on their own)
                handoff.error = exc
            finally:
                self.saver.put(("done", None, None, handoff))  # done once its songs are written

    def _render(self, handoff: _Handoff) -> None:
        streams = contextlib.nullcontext()
        if self.cuda:
            self.render_place.stream.wait_event(handoff.ready)
            streams = self.render_place
        try:
            with streams:
                for job in handoff.jobs:
                    if self.stop.is_set():
                        return
                    if job.error is None and _finish(self.engine, job, self.steps, self.deliver, self.meter,
                                                     self.stop, self.method,
                                                     save=lambda j, song: self.saver.put(("song", j, song, handoff))):
                        continue  # the saver delivers it and appends its outcome
                    self.saver.put(("outcome", job, None, handoff))
        except _Stopped:
            return
        finally:
            _release(self.engine)

    def close(self) -> None:
        """Stop the worker (at its next ODE step, VAE tile or song when it is busy), wait for it to end, then for the
        saver to write the songs handed to it (`_join`: a second Ctrl-C while waiting is absorbed, a third one stops
        the waiting)."""
        if not self.closed:
            self.closed = True
            self.stop.set()
            with self.wake:
                self.inbox.clear()
                self.wake.notify()
        interrupts = [0]  # one count for both waits: the third Ctrl-C overall stops waiting
        try:  # (called again, e.g. from a `finally` after an interrupt cut the first call: waits again)
            _join(self.thread, self.ended, interrupts)
            self.saver.close(interrupts)  # after the worker: it puts nothing more
        finally:
            try:  # also when the waiting was cut short: the writer may still be saving, but from here on renames
                self.saver.seal()  # no folder into place, so the outcomes recorded next hold every one it wrote
            finally:
                if self.capture is not None:
                    self.capture.__exit__(None, None, None)
                    self.capture = None


def _overlapped(engine, batches: list, batched: bool, steps: int, deliver: Deliver,
                meter: _Meter, method: str = "midpoint", make_job=_Job) -> Iterator[SongOutcome]:
    """`iter_songs` with the render stage on a worker thread (module docstring)."""
    stage = _RenderStage(engine, steps, deliver, meter, method)
    pending: _Handoff | None = None
    try:
        for batch in batches:
            if stage.stop.is_set():  # the writer found the disk full: no more AR work (the driver stops the batch)
                break
            jobs = [make_job(item) for item in batch]
            with stage.ar_context():
                _plan_phase(engine, jobs, batched, meter)
            if pending is not None:  # the previous batch's songs finished so far
                yield from pending.take(False, stage.finisher)
                pending.check()
            if stage.stop.is_set():
                break
            with stage.ar_context():
                _semantic_phase(engine, jobs, batched, meter)
            # no `_release` here: its cudaFree synchronises the device, i.e. waits for the worker's queued render
            if pending is not None:  # at most one batch in the render stage: wait for the previous one
                yield from pending.take(True, stage.finisher)
                pending.check()
            pending = stage.submit(jobs)
        if pending is not None:
            yield from pending.take(True, stage.finisher)
            pending.check()
    except KeyboardInterrupt:
        try:
            stage.close()  # the worker stops at its next step; the songs it finished are still reported
        finally:  # also when a third Ctrl-C cut the wait short: what was written so far
            if pending is not None:
                yield from pending.take(False, stage.finisher)
        raise
    finally:
        stage.close()


__all__ = ["iter_songs", "run_songs", "SongOutcome", "song_settings", "default_batched", "default_overlap",
           "left_outcome"]
