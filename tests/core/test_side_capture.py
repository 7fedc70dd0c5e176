"""The side capture's bookkeeping on the CPU (`yue2_core.fast.side_capture`, `PhaseDecoder._take_side`): a finished
capture's graph is kept for its bucket, a failed one is recorded and turns side captures off, the switch is
validated at construction, and a CPU decoder never starts one. The captures themselves need CUDA:
tests/core/test_side_capture_gpu.py."""
import concurrent.futures

import pytest

from yue2_core.errors import RequestError
from yue2_core.fast import decode as fd
from yue2_core.fast import side_capture
from yue2_core.protocol import Sampling, SongRequest, semantic_prefix


def _decoder(eng, steps=40):
    sp = semantic_prefix(SongRequest("pop", "la la", cot="full"), [], eng.tokenizer.encode)
    return fd.PhaseDecoder(eng.ar, [sp], Sampling(min_tokens=steps, max_tokens=steps), [1], "semantic")


def _pending(attn_len, result=None, error=None):
    future = concurrent.futures.Future()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result((result, 0.25))
    return side_capture.SideCapture(attn_len, future)


def test_a_finished_side_capture_is_kept_for_its_bucket(tiny_engine):
    dec = _decoder(tiny_engine)
    graph = object()  # what the worker returned; the bookkeeping never calls it
    dec._side = _pending(2048, result=graph)
    dec._take_side()
    assert dec.graphs == {2048: graph} and dec.side_captures == 1 and dec.side_capture_s == 0.25
    assert dec._side is None and dec.side_capture_error is None


def test_a_failed_side_capture_is_recorded_and_turns_them_off(tiny_engine):
    dec = _decoder(tiny_engine)
    dec._side = _pending(2048, error=RuntimeError("operation not permitted when stream is capturing"))
    dec._take_side()
    assert dec.graphs == {} and dec.side_captures == 0
    assert "not permitted" in dec.side_capture_error
    dec.graphs[1024] = object()  # even with a graph replaying, no further side capture is started
    dec.use_graph, dec.device = True, __import__("torch").device("cuda")
    dec._start_side(3072)
    assert dec._side is None


def test_a_side_capture_after_a_graph_failure_is_dropped(tiny_engine):
    """The decoder went eager (graph_error) while a capture was pending: its graph is not kept."""
    dec = _decoder(tiny_engine)
    dec.graph_error = "capture failed"
    dec._side = _pending(2048, result=object())
    dec._take_side()
    assert dec.graphs == {} and dec.side_captures == 0


def test_the_switch_is_checked_when_a_decoder_is_made(tiny_engine, monkeypatch):
    monkeypatch.setenv("YUE2_SIDE_CAPTURE", "on")
    with pytest.raises(RequestError) as e:
        _decoder(tiny_engine)
    assert "YUE2_SIDE_CAPTURE" in str(e.value) and "0 or 1" in str(e.value)


def test_a_cpu_decoder_starts_no_side_capture(tiny_engine):
    res = _decoder(tiny_engine, steps=24).run()[0]
    assert res.timing["side_captures"] == 0 and "side_capture_fallback_reason" not in res.timing


def test_a_phase_s_first_bucket_is_never_side_captured(tiny_engine, monkeypatch):
    """Only once a graph of this phase exists (its eager step compiled the step's kernels) is the next bucket
    captured on the worker; the first bucket is captured in the main thread, not beside the prefill (stop 42: on an
    H100 the prefill beside it took 0.156 instead of 0.039 s, more than the capture it took off the path)."""
    import torch
    dec = _decoder(tiny_engine)
    dec.use_graph, dec.device = True, torch.device("cuda")
    started = []
    monkeypatch.setattr(side_capture, "start", lambda *a, **k: started.append(a[1]) or "pending")
    monkeypatch.setattr(fd, "_capture_stream", lambda device: "stream")  # no CUDA here

    class Graph:
        def pool(self):
            return "pool"

    dec._start_side(1024)
    assert started == [] and dec._side is None
    dec.graphs[1024] = Graph()
    dec._start_side(2048)
    assert started == [2048] and dec._side == "pending"


def test_the_collector_is_held_off_during_a_capture_and_restored():
    import gc
    assert gc.isenabled()
    with side_capture._no_collection():
        with side_capture._no_collection():  # nested (two devices' workers)
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with side_capture._no_collection():
            pass
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()


def test_the_current_bucket_replays_without_waiting_for_the_next_ones_capture(tiny_engine):
    """`_graph` of a bucket whose graph exists returns it at once, the side capture of the next bucket still
    pending (stop 41 review: it joined the worker at the next block, so a capture overlapped only ~16 replays)."""
    import threading
    import time
    dec = _decoder(tiny_engine)
    current = object()
    dec.graphs[1024] = current
    future = concurrent.futures.Future()
    pending = side_capture.SideCapture(2048, future)
    dec._side = pending
    timer = threading.Timer(3.0, lambda: future.set_result((object(), 0.1)))
    timer.start()
    try:
        t0 = time.perf_counter()
        assert dec._graph(1024) is current
        assert time.perf_counter() - t0 < 1.0 and dec._side is pending
    finally:
        timer.join()
    dec._take_side()  # the decode reaches 2,048: now it waits for (here: takes) the finished capture
    assert 2048 in dec.graphs and dec.side_captures == 1


@pytest.mark.parametrize("beside_worker", [False, True])
def test_a_main_thread_capture_runs_with_the_collector_held_off(tiny_engine, monkeypatch, beside_worker):
    """A phase's first bucket is captured in the main thread (stop 42). A cyclic collection during that capture
    could destroy an earlier decoder's graph ("operation not permitted when stream is capturing (function reset)",
    docs/experiments/side_capture_gpu_tests_h200_2026-12-06_a7d1e8e_before_gc_fix.log) and the phase would go eager;
    `torch.cuda.graph` of the pinned torch does not collect first (only with torch.compiler.config
    .force_cudagraph_gc). The collector is off during the capture, as on the worker (review 42). CUDA faked."""
    import contextlib
    import gc
    import torch
    dec = _decoder(tiny_engine)
    dec.use_graph = True
    seen = []

    class Stream:
        device = torch.device("cpu")

        def wait_stream(self, other):
            pass

        def synchronize(self):
            pass

    class Graph:
        def pool(self):
            return "pool"

    @contextlib.contextmanager
    def graph(g, pool=None, capture_error_mode=None):
        seen.append(gc.isenabled())
        yield

    def beside(g, pool, stream, fn):
        seen.append(gc.isenabled())
        fn()

    monkeypatch.setattr(fd, "_capture_stream", lambda device: Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(fd, "_capture_beside_worker", beside)
    monkeypatch.setattr(fd, "_CONCURRENT", [int(beside_worker)])
    dec._allocate()
    assert gc.isenabled()
    assert isinstance(dec._graph(dec.capacity), Graph)
    assert seen == [False] and gc.isenabled()
