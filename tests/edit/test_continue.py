"""Continue a song: every original code kept, the original samples kept up to the crossfade at its end, and the
context never exceeded — asking for more than fits names the maximum."""
from dataclasses import replace

import pytest
import torch

import yue2_core.edit as edit
from yue2_core.constants import CONTEXT, HOP, SAMPLE_RATE
from yue2_core.errors import BudgetError, RequestError

FADE = round(0.05 * SAMPLE_RATE)


def test_continue_keeps_the_whole_original(engine, parent):
    child, lineage = edit.continue_song(engine, parent, 1.0, seed=4)
    n0, end = 60, 60 * HOP - 64  # the parent's last sample: the crossfade ends there
    assert child.tokens.codes[:n0] == parent.tokens.codes and len(child.tokens.codes) == n0 + 25
    assert torch.equal(child.latents[:n0], parent.latents)
    assert torch.equal(child.audio[:, :end - FADE], parent.audio[:, :end - FADE])
    assert child.audio.shape == (2, 85 * HOP - 64)
    assert lineage["operation"] == "continue" and lineage["cut_token"] == n0 and lineage["cut_sample"] == end
    assert lineage["added_seconds"] == 1.0 and lineage["seed"] == 4 and lineage["cut_bar"] == 3
    assert lineage["max_continuation_seconds"] == edit.max_continuation_seconds(engine, parent)
    # the end token was blocked for the whole (short) continuation: min_tokens = n0 + 25
    assert child.settings["semantic_sampling"]["min_tokens"] == 85 == child.settings["semantic_sampling"]["max_tokens"]
    assert len(child.tokens.prefix) + len(child.tokens.codes) <= CONTEXT


def _fake_long_parent(engine, parent, room: int):
    """The parent's prompt with codes filling the context up to `room` free tokens (no media: only the budget is
    checked, which happens before any generation)."""
    prefix = parent.tokens.prefix
    codes = [7] * (CONTEXT - len(prefix) - room)
    tokens = replace(parent.tokens, codes=codes)
    return (parent.score, tokens, None, None, parent.request, parent.settings)


def test_continuation_beyond_the_context_states_the_maximum(engine, parent):
    song = _fake_long_parent(engine, parent, room=10)
    assert edit.max_continuation_seconds(engine, song) == 10 / 25
    with pytest.raises(BudgetError, match=r"at most 0\.40 s of continuation are possible"):
        edit.continue_song(engine, song, 1.0)
    full = _fake_long_parent(engine, parent, room=0)
    with pytest.raises(BudgetError, match=r"at most 0\.00 s .*already fills the context"):
        edit.continue_song(engine, full, 0.04)
    # the real parent: the maximum is (24,576 − prompt − 60) / 25 s, and one token more is refused
    most = (CONTEXT - len(parent.tokens.prefix) - 60) / 25
    assert edit.max_continuation_seconds(engine, parent) == most
    with pytest.raises(BudgetError, match=f"at most {most:.2f} s"):
        edit.continue_song(engine, parent, most + 0.04)
    for bad in (0, -1.0, float("inf"), "1"):
        with pytest.raises(RequestError, match="extra seconds"):
            edit.continue_song(engine, parent, bad)


def test_continuation_up_to_the_maximum_fills_but_never_exceeds(engine, parent, monkeypatch):
    """With the context narrowed to prompt + song + 8 tokens, the largest continuation (0.32 s) runs and ends exactly
    at the context; 0.36 s is refused. (The decoders still check the real 24,576 limit themselves.)"""
    small = len(parent.tokens.prefix) + 60 + 8
    monkeypatch.setattr(edit, "CONTEXT", small)
    assert edit.max_continuation_seconds(engine, parent) == 8 / 25
    with pytest.raises(BudgetError, match=r"at most 0\.32 s"):
        edit.continue_song(engine, parent, 0.36)
    child, lineage = edit.continue_song(engine, parent, 0.32, seed=8, crossfade_s=0.01)
    assert len(child.tokens.prefix) + len(child.tokens.codes) == small
    assert child.tokens.codes[:60] == parent.tokens.codes and lineage["frames"] == 68
    end = 60 * HOP - 64
    assert torch.equal(child.audio[:, :end - 480], parent.audio[:, :end - 480])
