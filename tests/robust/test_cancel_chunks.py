"""Cancel inside a later NAR chunk (engine level, CPU): the callback that raises at the first ODE step of chunk 2 stops
the render with that exception, and a render afterwards gives exactly the latents of an uninterrupted one — nothing
of the cancelled run (AR K/V of chunk 1, partial latents) leaks into the next. Real songs reach a second chunk only
past ~8 minutes, so the chunking is narrowed here to 40 frames; the server tests cancel inside one chunk."""
from __future__ import annotations

import pytest
import torch

import yue2_core.nar as nar_mod
from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar
from yue2_core.errors import Cancelled

STEPS = 4
FRAMES = 100  # chunks [0, 40), [40, 80), [80, 100)


@pytest.fixture
def narrow_chunks(monkeypatch):
    real = nar_mod.chunk_ranges

    def forty(frames, prefix_len, context=None):
        return real(frames, prefix_len, context=prefix_len + 3 + 2 * 40)

    monkeypatch.setattr(nar_mod, "chunk_ranges", forty)
    assert nar_mod.chunk_ranges(FRAMES, 10) == [(0, 40), (40, 80), (80, 100)]


def test_cancel_in_a_later_nar_chunk_then_render_again(tiny_paths, narrow_chunks):
    info = inspect_checkpoint(tiny_paths["bf16"])
    ar, nar = load_ar(info, "cpu", torch.float32), load_nar(info, "cpu", torch.float32)
    prefix = [151643] + list(range(200, 230)) + [151851]
    codes = [(37 * i) % 32768 for i in range(FRAMES)]
    full = nar_mod.render(ar, nar, prefix, codes, seed=7, steps=STEPS)
    seen = []

    def cancel_in_chunk_2(done, total):
        seen.append((done, total))
        if done == STEPS + 1:  # the first midpoint step of the second chunk has run
            raise Cancelled("cancelled by the test")

    with pytest.raises(Cancelled):
        nar_mod.render(ar, nar, prefix, codes, seed=7, steps=STEPS, on_step=cancel_in_chunk_2)
    assert seen == [(k, 3 * STEPS) for k in range(1, STEPS + 2)], seen
    again = nar_mod.render(ar, nar, prefix, codes, seed=7, steps=STEPS)
    assert again.shape == (FRAMES, 64)
    assert torch.equal(again, full)


def _tensor_bytes_pinned(exc: BaseException) -> int:
    """Bytes of the tensors held as local variables by the frames of `exc`'s traceback."""
    total, tb = 0, exc.__traceback__
    while tb is not None:
        total += sum(v.numel() * v.element_size() for v in tb.tb_frame.f_locals.values() if isinstance(v, torch.Tensor))
        tb = tb.tb_next
    return total


def test_a_cancelled_render_releases_its_tensors(tiny_paths):
    """A host that keeps the exception of a cancelled call (ComfyUI keeps it until the next prompt) must not keep the
    engine's tensors with it: release_frames (used by the nodes' user_errors) drops the finished frames' locals and
    the traceback still formats with the engine's file names."""
    import traceback

    from yue2_core.errors import release_frames

    info = inspect_checkpoint(tiny_paths["bf16"])
    ar, nar = load_ar(info, "cpu", torch.float32), load_nar(info, "cpu", torch.float32)
    prefix = [151643] + list(range(200, 230)) + [151851]

    def cancel(done, total):
        if done == 2:
            raise Cancelled("cancelled by the test")

    try:
        nar_mod.render(ar, nar, prefix, [5] * 60, seed=7, steps=STEPS, on_step=cancel)
    except Cancelled as caught:
        exc = caught
    pinned = _tensor_bytes_pinned(exc)
    assert pinned > 60 * 64 * 4, f"the traceback pins only {pinned} bytes: the test no longer sees the render's state"
    release_frames(exc)
    assert _tensor_bytes_pinned(exc) == 0
    text = "".join(traceback.format_exception(exc))
    assert "nar.py" in text and "cancelled by the test" in text


def test_release_frames_follows_cause_and_context():
    """`raise X from Y` inside `except Z` (Y caught earlier): X's cause is Y and its context Z — the frames of both
    are cleared (following only the cause, as before, left Z's frames and their tensors pinned)."""
    import gc
    import weakref

    from yue2_core.errors import release_frames

    class Big:
        pass

    refs = []

    def fail(kind):
        big = Big()
        refs.append(weakref.ref(big))
        raise ValueError(kind)

    try:
        fail("cause")
    except ValueError as exc:
        saved = exc
    try:
        try:
            fail("context")
        except ValueError:
            raise RuntimeError("outer") from saved
    except RuntimeError as exc:
        caught = exc
    assert caught.__cause__ is not None and caught.__context__ is not None
    assert caught.__cause__ is not caught.__context__
    gc.collect()
    assert all(r() is not None for r in refs)  # pinned by the tracebacks' frames
    release_frames(caught)
    gc.collect()
    assert all(r() is None for r in refs), [r() for r in refs]
