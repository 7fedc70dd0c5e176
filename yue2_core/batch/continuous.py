"""Continuous batching of a batch's AR phases (`iter_songs(…, continuous=True)`, `batch --continuous`).

Static batching (`runner.iter_songs`' default) cuts the queue into batches of `max_batch` songs; each batch's phase
lasts as long as its longest song, and a row whose song ended early idles. Here every compatible group of the queue
decodes on `max_batch` rows of one `fast.refill.RefillDecoder` per phase, a finished song's row taking the next
song's prompt at once:

1. **plan**: the lead sheets the model writes, one decoder per ABC sampling setting (budgets aside) over them (scores
   supplied or cot off are planned directly, as in the static path);
2. **semantic**: one decoder per group of `semantic_key` (cot off or not, CFG scale, the semantic preset's settings
   but its budgets: songs of different lengths share a decoder, each row with its own budget); each song leaves its
   row the moment it ends and goes straight on: with the overlap to the render worker (`_RenderStage`, one song per
   hand-over, rendered in the order the songs end, also while the next wave plans); without it into the wave's list,
   rendered and saved once the wave's AR phases are done (the memory rule without the overlap: the render starts
   after the decoder freed its buffers).

The queue runs in waves (plan, then semantic): the first of `max_batch` songs, so the render stage starts as soon
as with static batches, then of `WAVE` × `max_batch` songs (room for rows to refill); songs reach the disk before the
whole queue's lead sheets are written, and an interruption loses at most one wave's AR work.

Every song goes through the refill decoder, also a group of one, so a song never depends on its neighbours in the
queue (nor on a `--resume` running it alone). Outcomes are yielded as songs finish (not in the queue's order; the
driver files them by line). The same songs as `generate` alone with the GPU's decoder: each row samples from its own
seed's draws and prompt (`fast.refill`). A decoder that raises (out of memory, a kernel failure) leaves its
unfinished songs to be decoded again one by one (one-row decoders), so only a failing song fails; a song with NaN
logits fails alone. Ctrl-C: the render worker stops at its next step, the songs it finished are yielded, the
interrupt propagates. Memory: a row's K/V holds the group's longest prompt plus the phase budget — what
`memory.size_batch` already counts per row (the largest song of the batch).
"""
from __future__ import annotations

import contextlib
import time
import warnings
from typing import Iterator

from ..errors import brief
from .runner import (_Job, _Meter, _outcome, _RenderStage, _release, _finish, _groups, _plan_phase,
                     _semantic_entries, _store_tokens, semantic_tokens, score_of)


WAVE = 4  # waves after the first hold WAVE × max_batch songs: plan, then semantic (then, without the overlap, render)


def waves(count: int, max_batch: int) -> list[range]:
    """The queue's waves (index ranges of `count` songs): `max_batch` songs first — the render stage starts after one
    plan round, as with static batches (the H200's 16 songs of one length: 150.1 s with a first wave of 16 vs 132.7 s
    static) —, then `WAVE` × `max_batch` at a time."""
    out, start = [], 0
    while start < count:
        size = max_batch if start == 0 else WAVE * max_batch
        out.append(range(start, min(count, start + size)))
        start += size
    return out


def continuous_songs(engine, queue: list, *, max_batch: int, steps: int, deliver, meter: _Meter, method: str,
                     overlap: bool, make_job=_Job) -> Iterator:
    """Yield a `SongOutcome` per request of `queue` (validated `BatchRequest`s) as its song is delivered or fails
    (module docstring). `make_job(item)`: makes each song's job (`iter_songs` records them)."""
    jobs = [make_job(item) for item in queue]
    stage = _RenderStage(engine, steps, deliver, meter, method) if overlap else None
    pending: list = []
    try:
        for part in waves(len(jobs), max_batch):
            if stage is not None and stage.stop.is_set():  # the writer found the disk full: no more AR work
                break
            wave, finished = jobs[part.start:part.stop], []
            for job in _ar_phases(engine, wave, max_batch, meter, stage):
                if job.error is not None:
                    yield _outcome(job)
                elif stage is None:
                    finished.append(job)
                else:
                    pending.append(stage.submit([job]))
                if stage is not None:
                    yield from _ready(pending, stage)
                    if stage.stop.is_set():
                        break
            if stage is None:  # without the overlap: this wave's AR memory is free before its songs render
                _release(engine)
                for job in finished:
                    _finish(engine, job, steps, deliver, meter, method=method)
                    yield _outcome(job)
        for handoff in pending:
            yield from handoff.take(True, stage.finisher)
            handoff.check()
    except KeyboardInterrupt:
        if stage is not None:
            try:
                stage.close()  # the worker stops at its next step; the songs it finished are still reported
            finally:  # also when a third Ctrl-C cut the wait short: what was written so far
                for handoff in pending:
                    yield from handoff.take(False, stage.finisher)
        raise
    finally:
        if stage is not None:
            stage.close()


def _ar_phases(engine, jobs: list, max_batch: int, meter: _Meter, stage) -> Iterator:
    """The plan phase of `jobs`, then their semantic phase; yields each job once it failed or its music tokens are
    decoded (a song as soon as its row ends)."""
    ar_context = stage.ar_context() if stage is not None else contextlib.nullcontext()
    with ar_context:
        _plan_phase(engine, jobs, True, meter, rows=max_batch)
    for job in jobs:
        if job.error is not None:
            yield job
    entries = _semantic_entries(engine, [j for j in jobs if j.error is None], True, meter)
    for job in jobs:  # rows whose semantic prompt could not be built
        if job.error is not None and job.stage == "semantic":
            yield job
    for group in _groups(entries, lambda e: semantic_key(e[0].item)):
        with ar_context:
            yield from run_queue(group, "semantic", lambda part: semantic_source(engine, part, max_batch, meter),
                                 meter, _store_tokens)


def _ready(pending: list, stage) -> Iterator:
    """Outcomes the render worker finished so far (without waiting); an exception that escaped it is re-raised."""
    for handoff in pending:
        yield from handoff.take(False, stage.finisher)
        handoff.check()


def run_queue(group: list, stage: str, decode, meter: _Meter, store) -> Iterator:
    """One phase of `group` (entries whose first item is the `_Job`) through `decode(entries)` (a generator of
    (index in entries, result | exception) from one `RefillDecoder`, even for one song: a song's tokens never depend
    on how many others share its group); yields each job once its phase ended, stored or failed. If the decoder
    raises, each song it had not finished is decoded again on its own (the same decoder, one row), so only a failing
    song fails."""
    left = dict(enumerate(group))
    try:
        yield from _take(group, decode(group), left, stage, meter, store, lambda i: i)
    except Exception as exc:  # noqa: BLE001 - the unfinished songs run alone below
        warnings.warn(f"continuous batching of the {stage} phase stopped ({brief(exc)}); its {len(left)} "
                      "unfinished songs run one at a time")
        for i, e in list(left.items()):
            t = time.perf_counter()
            try:
                yield from _take([e], decode([e]), left, stage, meter, store, lambda _, i=i: i)
            except Exception as exc:  # noqa: BLE001
                left.pop(i, None)
                e[0].fail(stage, exc)
                e[0].timing[f"{stage}_seconds"] = time.perf_counter() - t
                yield e[0]


def _take(entries: list, results, left: dict, stage: str, meter: _Meter, store, index_of) -> Iterator:
    for index, result in results:
        job = left.pop(index_of(index))[0]
        if isinstance(result, Exception):
            job.fail(stage, result)
        else:
            store(job, result)
            job.rows = min(len(entries), source_rows(result))
            meter.tokens += result.timing.get("output_tokens", 0)
            job.timing[f"{stage}_seconds"] = result.timing.get("seconds", 0.0)
        yield job


def source_rows(result) -> int:
    """How many rows the decoder that produced `result` (a Score or SemanticTokens) had."""
    return int(result.timing.get("batch", 1))


def shared_settings(sampling) -> tuple:
    """What the songs of one refill decoder must share: the sampling settings but min_tokens / max_tokens (each row
    has its own budget)."""
    d = sampling.to_dict()
    d.pop("min_tokens", None), d.pop("max_tokens", None)
    return tuple(sorted(d.items()))


def semantic_key(item) -> tuple:
    """The semantic phase's grouping under continuous batching: `runner._batch_key` without the budgets."""
    r = item.request
    return (r.cot == "off", r.guidance, shared_settings(item.budgets.semantic_sampling()))


def _decoded(engine, group: list, rows: int, sampling, phase: str, meter: _Meter, convert, cfg_scale: float = 1.0,
             legacy_off: bool = False, negatives: bool = False) -> Iterator:
    from ..fast.refill import QueuedSong, RefillDecoder
    queue = [QueuedSong(i, e[1], e[0].item.request.seed, e[3] if negatives else None, e[2].min_tokens,
                        e[2].max_tokens) for i, e in enumerate(group)]
    decoder = RefillDecoder(engine.ar, queue, min(rows, len(queue)), sampling, phase, cfg_scale=cfg_scale,
                            legacy_off=legacy_off)
    stage = "plan" if phase == "abc" else "semantic"

    taken_now: dict = {}  # tokens each row's song has sampled, as of the last block: the live part of the rate

    def on_block(live):
        taken_now.clear()
        taken_now.update(live)
        for index, taken in live:
            if taken:  # a row refilled in this block has not sampled yet
                own = group[index][2].max_tokens
                meter.emit(group[index][0].item.id, stage, done=min(taken, own), total=own, rows=len(live),
                           live=sum(t for _, t in live))
    for index, result in decoder.iter_queue(on_block):
        if not isinstance(result, Exception):  # the song's last line of this phase: its own count, and the rate
            done = result.timing["output_tokens"]  # with every token sampled so far (meter.tokens adds it later)
            others = sum(t for i, t in taken_now.items() if i != index)
            meter.emit(group[index][0].item.id, stage, done=done, total=group[index][2].max_tokens, rows=decoder.G,
                       live=done + others)
        taken_now.pop(index, None)
        yield index, result if isinstance(result, Exception) else convert(group[index], result)


def plan_source(engine, group: list, rows: int, meter: _Meter) -> Iterator:
    """(index, Score | NumericalError) of the planning rows `group` (job, prefix, ABC sampling) as they end."""
    return _decoded(engine, group, rows, group[0][2], "abc", meter, lambda e, r: score_of(engine, e, r))


def semantic_source(engine, group: list, rows: int, meter: _Meter) -> Iterator:
    """(index, SemanticTokens | NumericalError) of the semantic rows `group` (job, prefix, sampling, negative)."""
    req0 = group[0][0].item.request
    return _decoded(engine, group, rows, group[0][2], "semantic", meter, semantic_tokens, cfg_scale=req0.guidance,
                    legacy_off=req0.cot == "off", negatives=req0.guidance != 1.0)


__all__ = ["continuous_songs", "run_queue", "plan_source", "semantic_source"]
