"""Continuous batching of one AR phase: `RefillDecoder` decodes a queue of songs on `rows` rows of one
`PhaseDecoder` batch, and when a song ends (its end token, its budget, or NaN logits) its row is refilled with the
next song's prompt between two graph replays, instead of idling until the batch's longest song ends.

What differs from `PhaseDecoder` (whose step, kernels, graphs and fallbacks it reuses):

- **A step per row.** `step` is [G] (the sampling tail indexes each row's Exp(1) draws `noise[step[g], g]`, output
  column and penalty-ring slot with its own step — `decode.sample_tail` and the sampling-tail kernels take either
  form) and a row's step and position advance only while it is live: a finished row is frozen on a spare slot
  (`out`, `noise`, `forced` have max_tokens + 1 slots, the K/V buffers one position more) until it is harvested, so
  it never writes past its capacity or over its own output.
- **Capacity for the whole queue.** The K/V buffers hold the longest prompt of ALL queued songs + the phase's budget
  + 1
  (`memory.per_song_bytes` sizes a row the same way), allocated once; graphs are captured per attention-length
  bucket, which follows the longest live row.
- **An eager row prefill between replays** (`_refill`): the new song's prompt (and its negative prompt, with CFG)
  through `ARModel.hidden` into its row of the static buffers, its logits, position, step, penalty ring, output and
  done flag reset, and its own seed's Exp(1) draws — the same draws and the same prefill a single run does, so a
  refilled song samples as it would alone (on the GPU within the guarantee batches already give: row-wise kernels,
  the attention's split count following the bucket).
- **A budget per row.** Songs of one decoder share the phase, the sampling settings (temperature, top-k, top-p,
  penalty), CFG scale and legacy-off flag (`batch.runner` groups them), but each has its own min_tokens / max_tokens
  (`budget` [G, 2], read by the sampling tail at the row's step) and its own budget's worth of draws — songs of
  different lengths share a decoder. No teacher-forced tokens and no shared-prefix attention.

The host reads the done flags, NaN flags and steps once per block (16 steps), as `PhaseDecoder.run` reads its flags.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..constants import CONTEXT
from ..errors import BudgetError, NumericalError, RequestError
from ..protocol import Sampling
from ..sampling import PhaseResult
from .decode import BUCKET, PhaseDecoder, _RowCache


@dataclass
class QueuedSong:
    """One song waiting for a row: `key` is the caller's handle (returned with the result), `prefix` / `negative`
    token lists (the negative prompt only with CFG), `seed` its sampling seed, `min_tokens` / `max_tokens` its own
    budget (None: the decoder's sampling preset's) — songs of different lengths share a decoder."""

    key: object
    prefix: list
    seed: int
    negative: list | None = None
    min_tokens: int | None = None
    max_tokens: int | None = None


class RefillDecoder(PhaseDecoder):
    """`queue` (QueuedSong) decoded on up to `rows` rows at a time (module docstring). Raises RequestError for an
    empty queue, rows < 1, or a missing negative prompt with CFG; BudgetError when a song's prompt + max_tokens
    exceeds the context (checked for the whole queue before any work)."""

    _layer_ok = False  # rows freeze and refill between replays: the per-kernel step (`fast.persistent` not used)

    def __init__(self, ar, queue: list, rows: int, sampling: Sampling, phase: str, *, cfg_scale: float = 1.0,
                 legacy_off: bool = False, use_graph: bool | None = None, block: int = 16,
                 fused: bool | None = None):
        queue = list(queue)
        if not queue:
            raise RequestError("continuous batching needs at least one queued song")
        if type(rows) is not int or rows < 1:
            raise RequestError(f"rows must be a positive integer, got {rows!r}")
        cfg = float(cfg_scale) != 1.0
        self.budgets = []  # (min_tokens, max_tokens) of each queued song
        for song in queue:
            if cfg and song.negative is None:
                raise RequestError("CFG (cfg_scale ≠ 1) needs one negative prefix per song")
            own = replace(sampling, min_tokens=sampling.min_tokens if song.min_tokens is None else song.min_tokens,
                          max_tokens=sampling.max_tokens if song.max_tokens is None else song.max_tokens)
            try:
                own.validate(phase)
            except RequestError as exc:
                raise RequestError(f"queued song {song.key!r}: {exc}") from None
            self.budgets.append((own.min_tokens, own.max_tokens))
            for ids in (song.prefix, song.negative if cfg else None):
                if ids is not None and len(ids) + own.max_tokens > CONTEXT:
                    raise BudgetError(f"prompt ({len(ids)} tokens) + {phase} budget ({own.max_tokens}) "
                                      f"exceeds the {CONTEXT}-token context; at most {CONTEXT - len(ids)} {phase} "
                                      "tokens fit")
        first = queue[:rows]
        # the decoder's preset: the songs' shared settings with the queue's largest budget (buffers are sized by it)
        super().__init__(ar, [q.prefix for q in first], replace(sampling, min_tokens=0, max_tokens=max(
                             b[1] for b in self.budgets)), [q.seed for q in first], phase,
                         negatives=[q.negative for q in first] if cfg else None, cfg_scale=cfg_scale,
                         legacy_off=legacy_off, use_graph=use_graph, block=block, fused=fused,
                         row_budgets=[b[1] for b in self.budgets[:rows]])
        self.queue = queue
        self.shared = 0  # rows change: no common prefix to read once
        self._step_rows, self._spare = self.G, 1
        self.refills = 0

    def _length(self, song: QueuedSong) -> int:
        return max(len(song.prefix), len(song.negative) if self.cfg != 1.0 else 0)

    def _capacity(self) -> int:
        """The queue's longest prompt + its song's budget, + 1: a frozen row goes on writing its K/V one position
        past its last token."""
        return max(self._length(q) + b[1] for q, b in zip(self.queue, self.budgets)) + 1

    def _allocate(self):
        super()._allocate()
        self.live = torch.ones(self.G, dtype=torch.long, device=self.device)
        self.budget = torch.tensor(self.budgets[:self.G], dtype=torch.long, device=self.device)

    def _row_draws(self, g: int, index: int | None = None) -> torch.Tensor:
        """The draws of the queue's song `index` (default: row g's first song) as a single run of it draws them:
        its own budget's worth, padded to the buffer's slots."""
        index = g if index is None else index
        return self._padded(self._draws(self.queue[index].seed, self.budgets[index][1]))

    def _step(self, attn_len: int):
        self.live.copy_(~self.done)  # the rows sampling this step (a finished row stays where it is)
        super()._step(attn_len)

    def _advance(self):
        self.step.add_(self.live)
        self.pos.add_(self.live.repeat(self.R // self.G))

    def _refill(self, g: int, index: int) -> None:
        """Row g (and its CFG row) takes the queue's song `index`: prompt prefilled into the static K/V buffers, its
        budget and draws set, the rest of the row's state reset."""
        song = self.queue[index]
        rows = [(g, song.prefix)] + ([(self.G + g, song.negative)] if self.cfg != 1.0 else [])
        for r, ids in rows:
            cache = _RowCache(self.k, self.v, r, self.capacity)
            h = self.ar.hidden(torch.tensor([list(ids)], device=self.device), cache)[:, -1]
            self.logits[r] = self.head(self.ar.model.norm(h))[0]
            self.pos[r] = len(ids)
        self.budget[g] = torch.tensor(self.budgets[index], dtype=torch.long)
        self.step[g] = 0
        self.ring[g] = 0
        self.ring_w[g] = 0.0
        self.out[g] = -1
        self.done[g] = False
        if self.noise is not None:
            self.noise[:, g] = self._row_draws(g, index)
        self.refills += 1

    def run_queue(self, on_result: Callable[[object, object], None],
                  on_block: Callable[[list], None] | None = None) -> dict:
        """`iter_queue` with a callback: `on_result(key, PhaseResult | NumericalError)` for each song. Returns the
        phase's totals (`self.totals`)."""
        for key, result in self.iter_queue(on_block):
            on_result(key, result)
        return self.totals

    @torch.inference_mode()
    def iter_queue(self, on_block: Callable[[list], None] | None = None):
        """Decode the whole queue, yielding (key, PhaseResult | NumericalError) for each song as soon as the block it
        ended in is read (NaN logits fail that song only; its row is refilled like any other). `on_block(live)` after
        each block with live = [(key, steps taken)] of the rows still decoding (may raise to cancel). Exceptions of
        the step itself (out of memory, a cancel) propagate: the songs already yielded are done, the others are not.
        At the end `self.totals` holds the phase's totals (seconds, steps, refills, capture seconds, execution)."""
        try:
            yield from self._decode_queue(on_block)
        finally:
            self.release()  # also when the consumer stops early (Ctrl-C, an error)

    def _decode_queue(self, on_block):
        t0 = time.perf_counter()
        self._allocate()
        self._prefill()
        if self.device.type == "cuda":  # this stream only (a render worker may be running beside it)
            torch.cuda.current_stream(self.device).synchronize()
        G, cfg = self.G, self.cfg != 1.0
        end = self.slice.start + self.slice.end_col
        slot = list(range(G))  # the queue index of each row's song
        started = [time.perf_counter()] * G
        length = [self._length(self.queue[i]) for i in slot]
        taken = [0] * G  # steps since the row's song started (an upper bound once it ended)
        active = [True] * G
        nxt, steps = G, 0
        while any(active):
            n = self.block
            longest = max(length[g] + taken[g] for g in range(G) if active[g])
            attn_len = min(self.capacity, math.ceil((longest + n) / BUCKET) * BUCKET)
            self._run_block(n, attn_len)
            steps += n
            for g in range(G):
                taken[g] += n if active[g] else 0
            nan = torch.isnan(self.logits).any(dim=1)
            nan = nan[:G] | nan[G:] if cfg else nan
            flags = torch.cat([self.done.long(), nan.long(), self.step]).cpu().tolist()  # the block's one sync
            done, bad, at = flags[:G], flags[G:2 * G], flags[2 * G:]
            for g in range(G):
                if not active[g] or not (done[g] or bad[g]):
                    continue
                index = slot[g]
                song = self.queue[index]
                if bad[g]:
                    from ..weights.own import blame  # names the adapters the AR carries, if any
                    result = NumericalError(blame("the model produced NaN logits: the AR weights look damaged — "
                                                  "download the checkpoint again", self.ar))
                else:
                    result = self._result(g, song, self.budgets[index][1], at[g], end,
                                          time.perf_counter() - started[g])
                if nxt < len(self.queue):
                    self._refill(g, nxt)
                    slot[g], started[g], taken[g] = nxt, time.perf_counter(), 0
                    length[g] = self._length(self.queue[nxt])
                    nxt += 1
                else:
                    active[g] = False
                    self.done[g] = True  # a NaN row that had not ended freezes too
                yield song.key, result
            if on_block is not None:
                on_block([(self.queue[slot[g]].key, taken[g]) for g in range(G) if active[g]])
        self.totals = {"seconds": time.perf_counter() - t0, "decoded_steps": steps, "refills": self.refills,
                       "rows": G, "songs": len(self.queue), "graph_capture_seconds": self.capture_s,
                       "execution": ("cuda_graph" if self.graphs and self.graph_error is None
                                     else "eager_device_sampler")}

    def _result(self, g: int, song: QueuedSong, budget: int, at: int, end: int, seconds: float) -> PhaseResult:
        seq = self.out[g, :min(at, budget)].cpu().tolist()
        ended = end in seq
        content = seq[:seq.index(end)] if ended else seq[:budget]
        count = len(content) + int(ended)
        return PhaseResult(content, ended, {
            "seconds": seconds, "output_tokens": count, "content_tokens": len(content),
            "tokens_per_second": count / seconds if seconds > 0 else 0.0, "batch": self.G,
            "continuous_batching": True, "cfg_branches": 2 if self.cfg != 1.0 else 1,
            "prefix_tokens": len(song.prefix), "decoded_steps": at,
            "execution": "cuda_graph" if self.graphs and self.graph_error is None else "eager_device_sampler",
            "sampling_tail": "kernels" if self.tail is not None else "torch"})


__all__ = ["RefillDecoder", "QueuedSong"]
