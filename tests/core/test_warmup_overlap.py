"""The song's AR phases beside the warm-up's NAR and VAE stages (yue2_core/warmup.py `WarmUp.wait_ar`, stop 54), on
the CPU: where the AR-ready point falls, that every later step holds the capture lock, that the engine's AR phases
start before the warm-up ended while its render waits for it, and YUE2_WARMUP_OVERLAP=0."""
import threading

import pytest
import torch

from yue2_core import warmup
from yue2_core.errors import RequestError


class _Guard:
    """A stand-in for `capture_guard()` (the capture lock) that records each acquisition among the events."""

    def __init__(self, events):
        self.events, self.depth = events, 0

    def acquire(self):
        self.depth += 1
        self.events.append("guard")
        return True

    def release(self):
        self.depth -= 1


def _plan(tiny_paths):
    from yue2_core.weights.checkpoint import inspect_checkpoint
    return warmup.Plan.from_info(inspect_checkpoint(tiny_paths["bf16"]), source=None)


def test_ar_ready_after_the_decode_stages_and_every_later_step_guarded(tiny_paths, monkeypatch):
    events = []
    guard = _Guard(events)
    monkeypatch.setattr(warmup, "capture_guard", lambda: guard)
    heads = []
    real_drop = warmup._drop_head

    def drop(shadow, device, g):
        real_drop(shadow, device, g)
        heads.append(shadow.ar.model.lm_head)
    monkeypatch.setattr(warmup, "_drop_head", drop)
    report = warmup.run_plan(_plan(tiny_paths), "cpu", allow_cpu=True, before_stage=events.append,
                             ar_ready=lambda: events.append("ready"))
    assert report["skipped"] is None
    stages = [e for e in events if e != "guard"]
    assert stages == ["decode_abc", "decode_semantic", "ready", "nar", "vae"], stages
    ready = events.index("ready")
    assert "guard" not in events[:ready]  # the decode stages run before any song: no lock taken
    # after it: the NAR velocity, then the full VAE tile and the 16 short ones, each under the lock
    assert events[ready:].count("guard") >= 1 + 1 + len(warmup.VAE_SHORT_FRAMES), events[ready:]
    assert heads == [None] and guard.depth == 0  # the shadow's LM head let go at the AR-ready point
    assert report["beside"]["holds"] == events[ready:].count("guard") and report["beside"]["max_seconds"] > 0


def test_without_ar_ready_no_lock_and_the_head_kept(tiny_paths, monkeypatch):
    """Children (and the stage-by-stage tests) pass no `ar_ready`: nothing runs beside a song there."""
    events = []
    monkeypatch.setattr(warmup, "capture_guard", lambda: _Guard(events))
    called = []
    monkeypatch.setattr(warmup, "_drop_head", lambda *a: called.append(a))
    warmup.run_plan(_plan(tiny_paths), "cpu", allow_cpu=True)
    assert events == [] and called == []


def test_a_child_decodes_no_full_vae_tile(tiny_paths, monkeypatch):
    """`full=False` (compiling children): only the 16 short tiles (the local `full` used to shadow the argument, so
    children decoded the full tile too)."""
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.vae import VAEDecoder
    info = inspect_checkpoint(tiny_paths["bf16"])
    vae = warmup.fill_(VAEDecoder(info.vae).eval())
    lengths = []
    real = vae.decode
    monkeypatch.setattr(vae, "decode", lambda lat: (lengths.append(lat.shape[-1]), real(lat))[1])
    warmup._vae(vae, lambda: None, full=False)
    assert lengths == list(warmup.VAE_SHORT_FRAMES)
    lengths.clear()
    warmup._vae(vae, lambda: None, full=True)
    assert len(lengths) == 1 + len(warmup.VAE_SHORT_FRAMES) and lengths[0] > max(warmup.VAE_SHORT_FRAMES)


def _gated(w: "warmup.WarmUp", gate: threading.Event, log: list):
    def work(plan, device, should_stop):
        w.mark_ar_ready()
        log.append("ready")
        assert gate.wait(30), "the test never opened the gate"
        log.append("warm-up end")
        return {"seconds": 0.0, "steps": 1, "stages": {}, "skipped": None}
    return work


def test_wait_ar_returns_while_the_later_stages_run(monkeypatch):
    gate, log = threading.Event(), []
    w = warmup.WarmUp(warmup.Plan(None, {}), torch.device("cpu"))
    w.work = _gated(w, gate, log)
    w._thread = threading.Thread(target=w._run, daemon=True)
    w._thread.start()
    assert w.wait_ar(10) is True and w.running  # the AR may start; the warm-up goes on
    assert w.wait(0.05) == {} and w.running  # the NAR and VAE still wait
    gate.set()
    assert w.wait(10)["steps"] == 1 and not w.running
    assert w.wait_ar(0) is False and log == ["ready", "warm-up end"]


def test_overlap_off_waits_for_the_whole_warm_up(monkeypatch):
    gate, log = threading.Event(), []
    w = warmup.WarmUp(warmup.Plan(None, {}), torch.device("cpu"), overlap=False)
    w.work = _gated(w, gate, log)
    w._thread = threading.Thread(target=w._run, daemon=True)
    w._thread.start()
    assert w.wait_ar(0.3) is False and w.running  # timed out: still waiting for the end, not for the AR point
    gate.set()
    assert w.wait_ar(10) is False and not w.running


def test_a_work_that_never_marks_waits_for_the_end():
    """A failing or custom work: the AR-ready event is set when the thread ends, whatever happened."""
    w = warmup.WarmUp(warmup.Plan(None, {}), torch.device("cpu"),
                      work=lambda p, d, s: (_ for _ in ()).throw(RuntimeError("broken")))
    with pytest.warns(UserWarning, match="broken"):
        w._run()
    assert w.wait_ar(1) is False and w.error


@pytest.mark.parametrize("value,ok", [("0", False), ("1", True), ("", True), ("yes", None)])
def test_overlap_switch(monkeypatch, value, ok):
    monkeypatch.setenv("YUE2_WARMUP_OVERLAP", value)
    if ok is None:
        with pytest.raises(RequestError, match="YUE2_WARMUP_OVERLAP"):
            warmup.overlap()
        from yue2_core.switch_check import check_environment
        with pytest.raises(RequestError, match="YUE2_WARMUP_OVERLAP"):
            check_environment()
    else:
        assert warmup.overlap() is ok


def test_the_songs_ar_phases_start_beside_the_warm_up_and_the_render_waits(tiny_paths):
    """The engine: its plan (ABC) phase starts while the warm-up still runs (opened from the music phase's first
    progress report), and the render starts only after the warm-up ended."""
    from yue2_core.pipeline import Budgets, YuE2Engine
    from yue2_core.protocol import Sampling, SongRequest
    eng = YuE2Engine.load(tiny_paths["bf16"], device="cpu", dtype=torch.float32)
    gate, log = threading.Event(), []
    w = warmup.WarmUp(warmup.Plan(None, {}), torch.device("cpu"))
    w.work = _gated(w, gate, log)
    w._thread = threading.Thread(target=w._run, daemon=True)
    w._thread.start()
    eng.warm = w

    def progress(stage, done, total, info):
        if not log or log[-1] != stage:
            log.append(stage)
        if stage == "semantic" and not gate.is_set():
            assert w.running, "the warm-up ended before the music phase"
            gate.set()
    abc = Sampling(0.7, 0.9, 30, 1.005, 100, 8, 8)
    song = eng.generate(SongRequest("pop", "[Verse]\nla la", cot="full", seed=1),
                        Budgets(abc=abc, semantic=Sampling(min_tokens=25, max_tokens=25)), steps=2,
                        progress=progress)
    assert "plan" in log and "render" in log, log
    assert log.index("plan") < log.index("warm-up end") < log.index("render"), log
    assert eng.warm is None and eng.warm_up_report["steps"] == 1
    assert song.timing["warm_up_wait_seconds"] >= 0 and song.audio.shape[-1] > 0


def test_a_decode_block_runs_eagerly_while_another_thread_holds_the_capture_lock(tiny_engine_fp32, monkeypatch):
    """`PhaseDecoder._run_block`: a block whose graph is still to be captured runs its steps eagerly while another
    thread (a warm-up step beside the song) holds CAPTURE_LOCK, instead of idling on the lock; once the lock is
    free the capture is tried (here: `_graph` stands for it), and a pending side capture of that bucket counts as
    busy too. The tokens equal a plain eager decode's."""
    from yue2_core.fast import decode as fd
    from yue2_core.protocol import Sampling
    s = Sampling(temperature=0.0, min_tokens=48, max_tokens=48)
    prefix = [151852 + 5 * j for j in range(12)]

    def decoder():
        return fd.PhaseDecoder(tiny_engine_fp32.ar, [prefix], s, [1], "semantic", use_graph=False)
    plain = decoder().run()[0].tokens
    dec = decoder()
    dec.use_graph = True  # as on a GPU; `_graph` (the capture) is replaced below
    captured = []

    def fake_graph(attn_len):
        captured.append(attn_len)
        raise RuntimeError("no graphs on the CPU")  # → the decoder's eager fallback, one warning
    monkeypatch.setattr(dec, "_graph", fake_graph)
    held, release = threading.Event(), threading.Event()

    def holder():
        with fd.CAPTURE_LOCK:
            held.set()
            release.wait(30)
    t = threading.Thread(target=holder, daemon=True)
    t.start()
    assert held.wait(10)
    assert dec._capture_busy(1024) is True
    calls = []
    real_block = dec._run_block

    def block(n, attn_len):
        calls.append(n)
        out = real_block(n, attn_len)
        if len(calls) == 2:
            release.set()  # the "warm-up step" ends after the second block
            t.join(10)
        return out
    monkeypatch.setattr(dec, "_run_block", block)
    with pytest.warns(UserWarning, match="CUDA graph decode unavailable"):
        got = dec.run()[0]
    assert got.tokens == plain
    assert dec.lock_busy_blocks == 2 and captured, (dec.lock_busy_blocks, captured)  # then the capture was tried
    assert got.timing.get("eager_blocks_beside_capture_lock") == 2

    class _Pending:
        attn_len = 2048

        def __init__(self, finished):
            self.finished = finished

        def done(self):
            return self.finished
    dec.graphs = {}
    dec._side = _Pending(False)
    assert dec._capture_busy(2048) is True and dec._capture_busy(1024) is False  # the lock is free now
    dec._side = _Pending(True)
    assert dec._capture_busy(2048) is False
    dec.graphs = {2048: object()}
    dec._side = _Pending(False)
    assert dec._capture_busy(2048) is False  # captured already: replayed
    dec._side = None
