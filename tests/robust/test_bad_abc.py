"""Catalogue rows: ABC scores (docs/bad_inputs.md §2). The engine refuses what cannot be rendered (empty score, ids
outside the text range, a score in off mode, a score over the context budget); the validator (`yue2_core.abc`)
reports what renders wrongly (one voice, a cut-off last group, tuplets) so the editor and the nodes can show it; the
planner flags its own truncation."""
from __future__ import annotations

from pathlib import Path

import pytest

from robust_helpers import LYRICS, STYLE
from yue2_core.abc import analyze, validate
from yue2_core.constants import ABC_END, ABC_START, CONTEXT, EOD, MUSIC_START
from yue2_core.errors import BudgetError, RequestError, ScoreError
from yue2_core.pipeline import Score, plan, semantic
from yue2_core.protocol import SEMANTIC_PRESET, Sampling, SongRequest, semantic_prefix, validate_abc_ids

CORPUS = Path(__file__).resolve().parents[1] / "abc" / "corpus"


def corpus(name: str) -> str:
    return (CORPUS / name).read_text("utf-8")


def codes(text: str, severity: str | None = None) -> set:
    return {i.code for i in validate(text) if severity in (None, i.severity)}


def test_empty_abc_refused(tokenizer):
    for text in ("", "   \n\t", "\n"):
        with pytest.raises(ScoreError, match="empty or whitespace"):
            SongRequest(style=STYLE, lyrics=LYRICS, abc=text).validate()
        with pytest.raises(ScoreError, match="the ABC score is empty"):
            Score.from_text(text, tokenizer)
    assert codes(corpus("empty.abc"), "error") == {"empty"} and not analyze({"abc": ""})["ok"]


def test_abc_with_cot_off_refused(tokenizer):
    with pytest.raises(RequestError, match="off mode has no score"):
        SongRequest(style=STYLE, lyrics=LYRICS, cot="off", abc=corpus("song.abc")).validate()
    with pytest.raises(RequestError, match="cannot be used with cot='off'"):
        Score.from_text(corpus("song.abc"), tokenizer, cot="off")


def test_abc_ids_out_of_range_refused(tokenizer):
    for bad in ([1, EOD], [-1], [ABC_START], [MUSIC_START], [1.5], ["7x"], [None]):
        with pytest.raises(ScoreError, match="ABC token #"):
            validate_abc_ids(bad)
    request = SongRequest(style=STYLE, lyrics=LYRICS).validate()
    with pytest.raises(ScoreError, match=rf"outside the text range \[0, {EOD}\)"):
        semantic_prefix(request, [10, 20, ABC_END], tokenizer.encode)
    assert validate_abc_ids([0, EOD - 1, 7.0]) == [0, EOD - 1, 7]  # integral floats are the same ids


def test_one_voice_abc_reported(tokenizer):
    text = corpus("one_voice.abc")
    issues = [i for i in validate(text) if i.code == "missing-voice"]
    assert issues and issues[0].severity == "error" and "V: Ins" in issues[0].message
    assert analyze({"abc": text})["ok"] is False
    score = Score.from_text(text, tokenizer)  # the engine itself renders a non-empty score verbatim
    assert tokenizer.decode(score.abc_ids) == text


def test_abc_cut_mid_group_reported_and_planner_truncation_flagged(tiny_engine):
    assert codes(corpus("truncated_mid_group.abc")) == {"truncated"}
    truncated = next(i for i in validate(corpus("truncated_mid_group.abc")) if i.code == "truncated")
    assert truncated.severity == "warning"
    request = SongRequest(style=STYLE, lyrics=LYRICS, seed=5).validate()
    # end token blocked for the whole budget: the planner cannot finish, and says so
    score = plan(tiny_engine.ar, tiny_engine.tokenizer, request, Sampling(0.7, 0.9, 30, 1.005, 100, 4, 4))
    assert score.truncated is True and len(score.abc_ids) == 4


def test_abc_tuplets_reported():
    issues = [i for i in validate(corpus("tuplets.abc")) if i.code == "tuplet"]
    assert len(issues) == 2 and all(i.severity == "warning" for i in issues)
    assert all(i.bar is not None and i.voice in ("Vocal", "Ins") for i in issues)


def test_abc_over_token_budget_says_seconds(tokenizer):
    bar = corpus("song.abc")
    text = bar * (22_000 // len(tokenizer.encode(bar)) + 1)
    score = Score.from_text(text, tokenizer)
    request = SongRequest(style=STYLE, lyrics=LYRICS, abc=text).validate()
    prefix = semantic_prefix(request, score.abc_ids, tokenizer.encode)
    room = CONTEXT - len(prefix)
    assert 0 < room < SEMANTIC_PRESET.max_tokens
    with pytest.raises(BudgetError) as info:
        semantic(None, tokenizer, request, score, SEMANTIC_PRESET)
    assert f"at most {room} music tokens = {room / 25:.2f} s of music fit after this {len(prefix)}-token prompt" \
        in str(info.value)
    huge = Score.from_text(bar * (30_000 // len(tokenizer.encode(bar)) + 1), tokenizer)
    with pytest.raises(BudgetError, match="at most 0 music tokens = 0.00 s of music fit"):
        semantic(None, tokenizer, request, huge, SEMANTIC_PRESET)
