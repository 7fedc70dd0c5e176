"""The next attention bucket's decode graph, captured on a worker thread while the current bucket's graph replays
(issue #18, the whole-song row: of the warm song's 15.0 s on an H200, 0.66 s were its 8 decode-graph captures in
the main thread — one per 1,024-position attention bucket (`decode.BUCKET`) and phase —, 34–72 ms each on an H100,
about half of that the eager step run before each capture; docs/speed.md and
`docs/experiments/capture_cost_h100_2026-12-05.log`).

`PhaseDecoder.run` captures a phase's first bucket as before: an eager step (kernels chosen, Triton variants compiled
and loaded, workspaces made), then the capture in the main thread. While that graph replays, `start` hands the next
bucket's capture to one worker thread per device (`concurrent.futures`, one job at a time). The worker captures the
same step with the longer attention *directly* — no eager step first, which would write the live KV cache and state
that the replays are using — in capture_error_mode "thread_local" (the main thread's per-block sync stays legal),
on the decoder's capture stream (idle meanwhile: replays run on the current stream), into the decoder's graph pool,
under `decode.CAPTURE_LOCK`. A capture records kernels without running them, so the live buffers are untouched.
When the decode reaches that bucket, `take` returns the graph (the worker has usually long finished: a bucket is
≈ 1,024 steps, ≈ 1.4 s of replays at batch 1); only the wait, if any, counts as the phase's capture time.

The first bucket: from 2026-12-06 (stop 41) until stop 42 it too was captured on the worker, while the phase's
prompt was prefilled. Measured on an H100 (bench/bench.py's song pair row with the phase stats, 2026-12-06,
`docs/experiments/side_capture_phases_h100_2026-12-06.log`) that cost more than it saved: the prefill, itself a few
hundred launches from Python, took 0.156 instead of 0.039 s (ABC) and 0.169 instead of 0.052 s (music) beside the
capture, while the later buckets' captures beside the replays cost the decode ≈ 2 ms each (steady 668.0 vs 669.1 and
649.9 vs 650.7 tok/s; the music phase's decode 8.265 vs 8.253 s with 0.215 s of captures taken off its path).

A side capture that fails — e.g. a kernel variant that no warm-up compiled, whose first launch (module load) the
capture refuses, or anything else — is recorded on the decoder (`side_capture_error`, in the phase stats) and that
bucket is captured the old way, in the main thread; no further side captures are tried in that phase. Nothing here
raises into the decode.

Not used with the experimental one-launch layer kernel (`fast.persistent`: its first call must run eagerly), the L2
prefetch branch, torch.compile'd layers, or beside the batch command's render worker (`decode.concurrent_capture`).

Switch: YUE2_SIDE_CAPTURE=0 captures every bucket in the main thread (the behaviour before 2026-12-06).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import threading
import time

import torch

from ..errors import brief
from ..switches import flag

SWITCH = "YUE2_SIDE_CAPTURE"

_EXECUTORS: dict = {}
_LOCK = threading.Lock()
_PRIMED = threading.local()  # .streams: the capture streams this worker thread has run a library product on


def enabled() -> bool:
    """YUE2_SIDE_CAPTURE (default on). RequestError for a value other than 0 / 1."""
    return flag(SWITCH, True)


def _executor(device) -> concurrent.futures.ThreadPoolExecutor:
    key = str(device)
    with _LOCK:
        if key not in _EXECUTORS:
            _EXECUTORS[key] = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"yue2-side-capture-{key}")
        return _EXECUTORS[key]


def _prime(stream) -> None:
    """Once per (worker thread, stream), outside any capture: a small cuBLAS product on `stream`, so that the
    thread's cuBLAS handle and that stream's workspace exist before a capture might need them (PyTorch keeps
    handles per thread; creating one allocates, which a capture refuses)."""
    seen = getattr(_PRIMED, "streams", None)
    if seen is None:
        seen = _PRIMED.streams = set()
    if id(stream) in seen:
        return
    with torch.cuda.stream(stream):
        a = torch.ones(16, 16, device=stream.device, dtype=torch.bfloat16)
        (a @ a).sum().item()
    seen.add(id(stream))


_GC = {"depth": 0, "enabled": True}  # open `_no_collection` blocks; whether the collector was on before the first


@contextlib.contextmanager
def _no_collection():
    """Python's cyclic garbage collector held off while a capture is open: a collection in this thread (or the main
    one) could destroy an earlier decoder's CUDA graph or free its memory in the middle of the capture, which
    invalidates it ("operation failed due to a previous error during capture"). Also held off around the main
    thread's captures (`decode.PhaseDecoder._graph`): `torch.cuda.graph` of torch 2.14 collects first only with
    `torch.compiler.config.force_cudagraph_gc`, so the garbage of earlier decoders can still be there. Re-enabled
    after the capture when it was enabled before."""
    with _LOCK:
        if _GC["depth"] == 0:
            _GC["enabled"] = gc.isenabled()
            gc.disable()
        _GC["depth"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _GC["depth"] -= 1
            if _GC["depth"] == 0 and _GC["enabled"]:
                gc.enable()


class SideCapture:
    """One pending capture of `attn_len`'s graph on the device's worker thread (`start`); `take` waits for it.

    Attributes after `take`: `graph` (a CUDAGraph or None), `error` (str or None), `seconds` (the worker's time,
    not on the decode's path), `waited` (seconds `take` waited)."""

    def __init__(self, attn_len: int, future: concurrent.futures.Future):
        self.attn_len = attn_len
        self._future = future
        self.graph = None
        self.error: str | None = None
        self.seconds = 0.0
        self.waited = 0.0

    def take(self):
        """Wait for the capture; returns its CUDAGraph, or None when it failed (`error` says why)."""
        t0 = time.perf_counter()
        try:
            self.graph, self.seconds = self._future.result()
        except BaseException as exc:  # anything: the caller captures the old way
            self.graph, self.error = None, brief(exc) or type(exc).__name__
        self.waited = time.perf_counter() - t0
        return self.graph


def start(step, attn_len: int, device, stream, pool, capture) -> SideCapture:
    """Capture `step(attn_len)` into a new CUDAGraph on the worker thread of `device`: on `stream`, into `pool` (the
    phase's graph pool handle), via `capture(graph, pool, stream, fn, mode)` (`decode.capture_on_stream`, which
    takes `decode.CAPTURE_LOCK`), in capture_error_mode "thread_local", under torch.inference_mode. Returns at
    once; `SideCapture.take` waits. No collection runs during the capture (`_no_collection`), so the garbage of
    earlier decoders, their graphs included, is not freed in the middle of it."""
    def job():
        t0 = time.perf_counter()
        # the stream's own device: "cuda" without an index would be the worker thread's current device (0)
        with torch.inference_mode(), torch.cuda.device(stream.device):
            _prime(stream)
            graph = torch.cuda.CUDAGraph()
            with _no_collection():
                capture(graph, pool, stream, lambda: step(attn_len), "thread_local")
        return graph, time.perf_counter() - t0

    return SideCapture(attn_len, _executor(device).submit(job))
