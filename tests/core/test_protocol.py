"""Prompt protocol and request validation, each rule against an expectation written out by hand from
runtime.md §1–§2 (not from the code under test)."""
import math

import numpy as np
import pytest

from yue2_core.constants import ABC_END, ABC_START, EOD, MUSIC_START
from yue2_core.errors import BudgetError, RequestError, ScoreError
from yue2_core.protocol import (ABC_PRESET, SEMANTIC_PRESET, Sampling, SongRequest, check_budget, negative_prefix,
                                planning_prefix, seconds_to_tokens, semantic_budget, semantic_prefix,
                                validate_abc_ids)


def enc(text):  # a stand-in encoder: one id per character (all < EOD)
    return [ord(c) % 1000 for c in text]


def test_prompt_text_exact():
    r = SongRequest(style="pop", lyrics="la la\n", cot="full")
    assert r.text() == ("Generate a chord-annotated ABC transcription, then generate music with codec tokens from "
                        "the given conditions.\n[Tags]\npop\n[Lyrics]\nla la\n\n")
    assert SongRequest("s", "l", cot="melody").text().startswith(
        "Generate a melody-only ABC transcription without chord symbols, then generate music with codec tokens from "
        "the given conditions.\n[Tags]\ns\n")
    assert SongRequest("s", "l", cot="off").text() == (
        "Generate music with codec tokens from the given conditions.\n[Tags]\ns\n[Lyrics]\nl\n")


def test_prefixes_full_and_off():
    r = SongRequest("pop", "la", cot="full")
    base = [EOD] + enc(r.text())
    assert planning_prefix(r, enc) == base + [ABC_START]
    assert semantic_prefix(r, [5, 6], enc) == base + [ABC_START, 5, 6, ABC_END, MUSIC_START]
    neg = negative_prefix(r, [5, 6], enc)
    instr = "Generate a chord-annotated ABC transcription, then generate music with codec tokens from the given conditions."
    assert neg == [EOD] + enc(instr) + [ABC_START, 5, 6, ABC_END, MUSIC_START]
    off = SongRequest("pop", "la", cot="off")
    assert semantic_prefix(off, [], enc) == [EOD] + enc(off.text()) + [ABC_START, ABC_END, MUSIC_START]
    assert negative_prefix(off, [], enc) == [EOD] + enc("Generate music with codec tokens from the given conditions.") \
        + [MUSIC_START]
    with pytest.raises(RequestError):
        planning_prefix(off, enc)


def test_guidance_defaults_and_range():
    assert SongRequest("a", "b", cot="off").guidance == 1.01
    assert SongRequest("a", "b", cot="full").guidance == 1.0
    assert SongRequest("a", "b", cot="melody").guidance == 1.0
    assert SongRequest("a", "b", cot="full", cfg_scale=1.5).guidance == 1.5
    for bad in (-0.1, 20.5, float("nan"), float("inf"), True):
        with pytest.raises(RequestError):
            SongRequest("a", "b", cfg_scale=bad).validate()


@pytest.mark.parametrize("seed,ok", [(0, True), (2 ** 63 - 1, True), (2 ** 63, False), (-1, False), (True, False),
                                      (np.int64(3), False), (1.0, False)])
def test_seed_range(seed, ok):
    r = SongRequest("a", "b", seed=seed)
    if ok:
        r.validate()
    else:
        with pytest.raises(RequestError):
            r.validate()


def test_request_rules():
    with pytest.raises(RequestError, match="cot"):
        SongRequest("a", "b", cot="fast").validate()
    with pytest.raises(RequestError, match="off"):
        SongRequest("a", "b", cot="off", abc="X:1").validate()
    with pytest.raises(ScoreError):
        SongRequest("a", "b", abc="  \n ").validate()
    for bad_id in ("../x", "/abs", "", ".", "..", "a" * 181, "a/b"):
        with pytest.raises(RequestError):
            SongRequest("a", "b", id=bad_id).validate()
    with pytest.raises(RequestError):
        SongRequest(None, "b").validate()


def test_input_warnings_do_not_change_request():
    r = SongRequest("", "", cot="full")
    notes = r.input_warnings()
    assert any("style is empty" in n for n in notes) and any("NOT an instrumental" in n for n in notes)
    assert r.cot == "full"
    assert any("only section tags" in n for n in SongRequest("s", "[Verse]\n[Chorus]").input_warnings())
    assert any("(x2)" in n for n in SongRequest("s", "la la (x2)").input_warnings())


def test_presets_match_reference():
    assert (ABC_PRESET.temperature, ABC_PRESET.top_p, ABC_PRESET.top_k, ABC_PRESET.repetition_penalty,
            ABC_PRESET.penalty_window, ABC_PRESET.min_tokens, ABC_PRESET.max_tokens) == (0.7, 0.9, 30, 1.005, 100, 32,
                                                                                          4096)
    assert (SEMANTIC_PRESET.temperature, SEMANTIC_PRESET.top_p, SEMANTIC_PRESET.top_k,
            SEMANTIC_PRESET.repetition_penalty, SEMANTIC_PRESET.penalty_window, SEMANTIC_PRESET.min_tokens,
            SEMANTIC_PRESET.max_tokens) == (1.0, 0.95, 100, 1.2, 50, 200, 9000)


@pytest.mark.parametrize("field,value", [("temperature", -0.1), ("temperature", 5.01), ("top_p", 0.0),
                                         ("top_p", 1.5), ("top_k", 0), ("top_k", 3.0), ("top_k", True),
                                         ("repetition_penalty", 0.0), ("penalty_window", 0), ("penalty_window", 101),
                                         ("min_tokens", -1), ("max_tokens", 0), ("temperature", float("nan")),
                                         ("max_tokens", np.int64(5))])
def test_sampling_validation(field, value):
    with pytest.raises(RequestError, match=field):
        SEMANTIC_PRESET.merged({field: value}).validate()


def test_sampling_min_above_max():
    with pytest.raises(RequestError, match="min_tokens"):
        Sampling(min_tokens=10, max_tokens=5).validate()
    with pytest.raises(RequestError, match="unknown"):
        SEMANTIC_PRESET.merged({"topk": 3})


def test_abc_ids_range():
    assert validate_abc_ids([0, 151642]) == [0, 151642]
    for bad in ([151643], [-1], [184620], [1.5], ["x"]):
        with pytest.raises(ScoreError):
            validate_abc_ids(bad)


def test_budget_message_says_seconds():
    check_budget(24576 - 9000, 9000)
    with pytest.raises(BudgetError) as e:
        check_budget(20000, 9000)
    assert "4576 music tokens" in str(e.value) and "183.04 s" in str(e.value)


def test_seconds_to_tokens_and_budget():
    assert seconds_to_tokens(10) == 250 and seconds_to_tokens(0.04) == 1 and seconds_to_tokens(0.01) == 1
    for bad in (0, -3, float("nan"), float("inf"), "5"):
        with pytest.raises(RequestError):
            seconds_to_tokens(bad)
    s = semantic_budget(4.0)  # 100 tokens < min 200 → min shrinks
    assert (s.max_tokens, s.min_tokens) == (100, 100)
    assert semantic_budget(None) == SEMANTIC_PRESET
    assert math.isclose(semantic_budget(360).max_tokens, 9000)
