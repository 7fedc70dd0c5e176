"""Catalogue rows: the song request and its prompt (docs/bad_inputs.md §1). Each test is one row: the exact exception
class and a key phrase of its message, or — for inputs that are allowed — the warning and proof that nothing was
changed behind the user's back (same mode, same prompt text)."""
from __future__ import annotations

import math
import unicodedata

import pytest
import torch

from robust_helpers import LYRICS, STYLE, assert_cli_error
from yue2_core.constants import ABC_END, ABC_START, CONTEXT, EOD, INSTRUCTIONS, MUSIC_START
from yue2_core.errors import BudgetError, RequestError
from yue2_core.pipeline import Budgets, Score, plan, semantic
from yue2_core.protocol import (ABC_PRESET, SEED_MAX, SEMANTIC_PRESET, Sampling, SongRequest, check_budget,
                                negative_prefix, planning_prefix, semantic_prefix)


def _text(style: str, lyrics: str, cot: str = "full") -> str:
    return f"{INSTRUCTIONS[cot]}\n[Tags]\n{style}\n[Lyrics]\n{lyrics}\n"


def _lines(tokenizer, target: int) -> str:
    """Lyrics whose planning prefix is about `target` tokens."""
    line = "Walking down the avenue where the neon rivers flow\n"
    per = len(tokenizer.encode(line))
    return "[Verse]\n" + line * (target // per)


# --- style and lyrics ------------------------------------------------------------------------------------------------

def test_empty_style_warns_and_keeps_prompt(tokenizer):
    request = SongRequest(style="", lyrics=LYRICS).validate()
    assert any("style is empty" in n for n in request.input_warnings())
    prefix = planning_prefix(request, tokenizer.encode)
    assert tokenizer.decode(prefix[1:-1]) == _text("", LYRICS)  # "[Tags]\n\n[Lyrics]": nothing invented


def test_empty_lyrics_cot_full_warns_and_keeps_mode(tokenizer, tiny_engine):
    request = SongRequest(style=STYLE, lyrics="", cot="full", seed=3).validate()
    notes = request.input_warnings()
    assert any("NOT an instrumental switch" in n for n in notes)
    assert request.cot == "full"
    score = plan(tiny_engine.ar, tiny_engine.tokenizer, request, Sampling(0.7, 0.9, 30, 1.005, 100, 0, 3))
    assert score.cot == "full" and score.source == "model"  # planned in full mode: no silent switch to "off"
    prefix = semantic_prefix(request, score.abc_ids, tokenizer.encode)
    assert prefix[-2:] == [ABC_END, MUSIC_START] and ABC_START in prefix
    assert tokenizer.decode(prefix[1:prefix.index(ABC_START)]) == _text(STYLE, "")


def test_lyrics_only_section_tags_warn(tokenizer):
    for lyrics in ("[Intro]\n[Verse]\n[Chorus]\n[Outro]\n", "[instrumental]"):
        request = SongRequest(style=STYLE, lyrics=lyrics).validate()
        notes = request.input_warnings()
        assert any("only section tags" in n for n in notes), notes
        assert request.lyrics == lyrics and request.cot == "full"


def test_stage_directions_and_repeat_shorthand_warn(tokenizer):
    lyrics = "[Intro]\n(soft piano, no vocals)\n[Chorus]\nHold on to me (x2)\n"
    request = SongRequest(style=STYLE, lyrics=lyrics).validate()
    notes = request.input_warnings()
    assert any("'(x2)'" in n for n in notes) and any("stage directions" in n for n in notes)
    assert tokenizer.decode(planning_prefix(request, tokenizer.encode)[1:-1]) == _text(STYLE, lyrics)  # not edited


def test_long_lyrics_budget_message_in_seconds(tokenizer):
    lyrics = _lines(tokenizer, 18_000)
    request = SongRequest(style=STYLE, lyrics=lyrics).validate()
    prompt = len(planning_prefix(request, tokenizer.encode))
    assert prompt + ABC_PRESET.max_tokens <= CONTEXT < prompt + 2 + SEMANTIC_PRESET.max_tokens
    room = CONTEXT - (prompt + 2)  # the score markers ABC_END, MUSIC_START follow even an empty score
    with pytest.raises(BudgetError) as info:
        plan(None, tokenizer, request, ABC_PRESET, semantic_max_tokens=SEMANTIC_PRESET.max_tokens)
    message = str(info.value)
    assert f"at most {room} music tokens = {room / 25:.2f} s of music fit after this {prompt + 2}-token prompt" \
        in message
    assert "nothing is truncated silently" in message


def test_prompt_plus_budget_over_context_says_seconds(tokenizer):
    check_budget(CONTEXT - 9000, 9000)  # exactly full: accepted
    with pytest.raises(BudgetError, match=r"at most 8999 music tokens = 359\.96 s of music fit"):
        check_budget(CONTEXT - 8999, 9000)
    request = SongRequest(style=STYLE, lyrics=_lines(tokenizer, 20_000), cot="off").validate()
    off_score = Score(abc=None, abc_ids=[], cot="off", seed=request.seed, source="none")
    prompt = len(semantic_prefix(request, [], tokenizer.encode))
    with pytest.raises(BudgetError) as info:
        semantic(None, tokenizer, request, off_score, SEMANTIC_PRESET)  # refused before any model work
    assert f"{(CONTEXT - prompt) / 25:.2f} s of music fit" in str(info.value)


# --- durations, seeds, sampling --------------------------------------------------------------------------------------

@pytest.mark.parametrize("seconds", [0, 0.0, -5, -0.01, float("nan"), float("inf"), True, "60", None])
def test_max_duration_zero_or_negative_refused(seconds):
    budgets = Budgets(max_seconds=seconds)
    if seconds is None:  # no cap: the semantic preset
        assert budgets.semantic_sampling().max_tokens == SEMANTIC_PRESET.max_tokens
        return
    with pytest.raises(RequestError, match="max duration must be"):
        budgets.semantic_sampling()


def test_max_duration_900_seconds(tokenizer):
    sem = Budgets(max_seconds=900).semantic_sampling()
    assert (sem.max_tokens, sem.min_tokens) == (22_500, 200)
    request = SongRequest(style=STYLE, lyrics=LYRICS, cot="off").validate()
    prefix = semantic_prefix(request, [], tokenizer.encode)
    check_budget(len(prefix), sem.max_tokens)  # a short prompt leaves room for 900 s
    full = SongRequest(style=STYLE, lyrics=LYRICS).validate()
    score = Score(abc="x", abc_ids=[100] * 3000, cot="full", seed=1, source="user")
    prefix = semantic_prefix(full, score.abc_ids, tokenizer.encode)
    room = CONTEXT - len(prefix)
    with pytest.raises(BudgetError, match=rf"at most {room} music tokens = {room / 25:.2f} s of music fit"):
        semantic(None, tokenizer, full, score, sem)
    assert Budgets(max_seconds=10).semantic_sampling().min_tokens == 200  # min shrinks only when the cap is lower
    assert Budgets(max_seconds=4).semantic_sampling().min_tokens == 100


def test_seed_0_and_max_accepted_out_of_range_refused(tiny_engine):
    from yue2_core.nar import song_noise
    for seed in (0, SEED_MAX):
        request = SongRequest(style=STYLE, lyrics=LYRICS, cot="off", seed=seed).validate()
        off = Score(abc=None, abc_ids=[], cot="off", seed=seed, source="none")
        budget = Sampling(1.0, 0.95, 100, 1.2, 50, 4, 4)
        a = semantic(tiny_engine.ar, tiny_engine.tokenizer, request, off, budget)
        b = semantic(tiny_engine.ar, tiny_engine.tokenizer, request, off, budget)
        assert a.codes == b.codes and len(a.codes) == 4  # reproducible at both ends of the range
        assert torch.equal(song_noise(3, seed), song_noise(3, seed))
    for seed in (-1, SEED_MAX + 1, 2 ** 64, True, 1.0, "7"):
        with pytest.raises(RequestError, match=r"seed must be an integer in \[0, 2\^63−1\]"):
            SongRequest(style=STYLE, lyrics=LYRICS, seed=seed).validate()


SAMPLING_CASES = [
    ("temperature", -0.1, "temperature must be in [0, 5]"), ("temperature", 5.01, "temperature must be in [0, 5]"),
    ("temperature", float("nan"), "temperature must be a finite number"),
    ("temperature", 10 ** 400, "temperature must be a finite number"),
    ("top_p", 0.0, "top_p must be in (0, 1]"), ("top_p", 1.01, "top_p must be in (0, 1]"),
    ("top_k", 0, "top_k must be ≥ 1"), ("top_k", 2.0, "top_k must be an integer"),
    ("top_k", True, "top_k must be an integer"),
    ("repetition_penalty", 0.0, "repetition_penalty must be > 0"),
    ("repetition_penalty", -1.2, "repetition_penalty must be > 0"),
    ("repetition_penalty", float("inf"), "repetition_penalty must be a finite number"),
    ("penalty_window", 0, "penalty_window must be in [1, 100]"), ("penalty_window", 101, "penalty_window must be in"),
    ("max_tokens", 0, "max_tokens must be ≥ 1"), ("min_tokens", -1, "min_tokens must be in [0, max_tokens"),
]


@pytest.mark.parametrize("field,value,phrase", SAMPLING_CASES)
def test_sampling_and_cfg_out_of_range_refused(field, value, phrase):
    with pytest.raises(RequestError) as info:
        Sampling(**{field: value}).validate("semantic")
    assert phrase in str(info.value) and str(info.value).startswith("semantic sampling")
    with pytest.raises(RequestError, match="min_tokens must be in"):
        Sampling(min_tokens=10, max_tokens=5).validate()
    with pytest.raises(RequestError, match="unknown sampling fields"):
        Sampling().merged({"temprature": 0.5})
    for cfg in (-0.01, 20.01, float("nan"), float("inf"), True, "1.5", 10 ** 400):
        with pytest.raises(RequestError, match=r"cfg_scale must be a finite number in \[0, 20\]"):
            SongRequest(style=STYLE, lyrics=LYRICS, cfg_scale=cfg).validate()
    for cfg, mode, want in ((None, "off", 1.01), (None, "full", 1.0), (0, "full", 0.0), (20, "off", 20.0)):
        assert SongRequest(style=STYLE, lyrics=LYRICS, cot=mode, cfg_scale=cfg).validate().guidance == want


def test_cot_invalid_refused():
    for cot in ("FULL", "none", "", " full", None, 1):
        with pytest.raises(RequestError, match="cot must be one of full, melody, off"):
            SongRequest(style=STYLE, lyrics=LYRICS, cot=cot).validate()


# --- text fidelity ---------------------------------------------------------------------------------------------------

CJK = "[Verse]\n你好，世界！\n「こんにちは」。（サビ）\nＡＢＣ！？　〜、…\n"


def test_cjk_fullwidth_punctuation_preserved_byte_for_byte(tokenizer, tmp_path):
    assert unicodedata.normalize("NFC", CJK) == CJK  # already NFC: nothing may change
    request = SongRequest(style="J-pop、女性ボーカル", lyrics=CJK).validate()
    prefix = planning_prefix(request, tokenizer.encode)
    decoded = tokenizer.decode(prefix[1:-1])
    assert decoded.encode("utf-8") == _text("J-pop、女性ボーカル", CJK).encode("utf-8")
    sem = semantic_prefix(request, [5, 6], tokenizer.encode)
    assert sem[:len(prefix)] == prefix and sem[len(prefix):] == [5, 6, ABC_END, MUSIC_START]
    assert all(0 <= i < EOD for i in prefix[1:-1])
    # NFKC would turn "，" into "," and "Ａ" into "A": the tokens must spell the full-width forms
    assert "，" in decoded and "Ａ" in decoded and "," not in CJK
    # the one documented change: decomposed input is composed (NFC), as the reference does
    composed = tokenizer.decode(tokenizer.encode("Cafe\u0301"))
    assert composed == "Café" and composed.encode("utf-8") == b"Caf\xc3\xa9"
    neg = negative_prefix(request, [5, 6], tokenizer.encode)
    assert tokenizer.decode(neg[1:neg.index(ABC_START)]) == INSTRUCTIONS["full"]
    # and the saved song keeps the text byte for byte (request.json is UTF-8, not \u escapes)
    from robust_helpers import make_song
    from yue2_core.artifacts import load_song, save_song
    saved = save_song(make_song(lyrics=CJK), tmp_path / "cjk")
    assert CJK.encode("utf-8") in (saved / "request.json").read_bytes().replace(b"\\n", b"\n")
    assert load_song(saved).tokens.request["lyrics"] == CJK


def test_unpaired_surrogate_in_text_refused(tokenizer):
    for field in ("style", "lyrics"):
        kwargs = {"style": STYLE, "lyrics": LYRICS, field: "la \ud800 la"}
        with pytest.raises(RequestError, match="unpaired surrogate U\\+D800 at character 3"):
            SongRequest(**kwargs).validate()
    with pytest.raises(RequestError, match="unpaired surrogate"):
        tokenizer.encode("x\udfff")
    with pytest.raises(RequestError, match="unpaired surrogate"):
        Score.from_text("X:1\n\ud83d", tokenizer)


def test_song_id_traversal_absolute_reserved_refused():
    from yue2_core.artifacts import safe_name
    from yue2_core.errors import ArtifactError
    for bad in ("../x", "..", ".", "/etc/passwd", "a/b", "a\\b", "C:x", "CON", "nul", "nul.txt", "Com1.flac",
                "LPT9", "a" * 181, "", ".hidden", "song.", "x\x00y"):
        with pytest.raises(RequestError, match="is not allowed"):
            SongRequest(style=STYLE, lyrics=LYRICS, id=bad).validate()
        with pytest.raises(ArtifactError, match="is not allowed"):
            safe_name(bad)
    for good in ("song", "my_song-2.v1", "a" * 180, "CONcert", "nul_x"):
        assert SongRequest(style=STYLE, lyrics=LYRICS, id=good).validate().id == good == safe_name(good)
    assert math.isclose(SongRequest(STYLE, LYRICS).validate().guidance, 1.0)


def test_environment_switches_refuse_unknown_values(monkeypatch):
    """Review finding: YUE2_FAST=false used to mean *on* (anything but "0"). Every switch takes 0/1 or its listed
    values; others raise RequestError naming the variable, on any device."""
    from yue2_core.fast import fast_enabled
    from yue2_core.switches import choice, flag
    monkeypatch.setenv("YUE2_FAST", "false")
    with pytest.raises(RequestError, match="YUE2_FAST must be 0 or 1"):
        fast_enabled("cpu")
    monkeypatch.setenv("YUE2_FAST", "0")
    assert fast_enabled("cuda") is False
    monkeypatch.setenv("YUE2_X", " 1 ")
    assert flag("YUE2_X", False) is True
    monkeypatch.setenv("YUE2_X", "")
    assert flag("YUE2_X", True) is True
    monkeypatch.setenv("YUE2_DECODE_ATTN", "flash")
    with pytest.raises(RequestError, match="YUE2_DECODE_ATTN must be 'triton' or 'torch'"):
        choice("YUE2_DECODE_ATTN", ("triton", "torch"), "triton")


def test_cli_reports_a_bad_switch(tmp_path, tiny_paths, monkeypatch):
    from robust_helpers import run_cli
    monkeypatch.setenv("YUE2_FAST", "off")
    assert_cli_error(run_cli("generate", "--checkpoint", tiny_paths["bf16"], "--style", "pop", "--lyrics", "la",
                             "--cot", "off", "--max-seconds", "0.2", "--device", "cpu", "--output", tmp_path / "s"),
                     "YUE2_FAST must be 0 or 1")


def test_max_seconds_below_half_a_frame_is_noted(capsys):
    """--max-seconds 1e-300 used to be rounded up to one frame silently (break-it finding); now a note says so.
    One frame and more get no note."""
    from yue2_core.__main__ import _check_budget_fits
    _check_budget_fits(1e-300, None)
    assert "less than half a music frame" in capsys.readouterr().err
    for ok in (0.02, 0.04, 3.0):
        _check_budget_fits(ok, None)
        assert "half a music frame" not in capsys.readouterr().err
