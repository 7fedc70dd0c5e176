"""Fuzzing the prompt builder (issue 6): arbitrary Unicode style/lyrics/ABC, seeds, cot, cfg and song ids through
`SongRequest.validate`, the lint notes, the planning / semantic / negative prefixes, a user score and the budget.

Only RequestError (and its subclasses ScoreError, BudgetError) may escape. When a request is accepted, every prefix
starts with EOD, ends with its marker (ABC_START / MUSIC_START), holds only ordinary text ids (< 151,643) between
the markers, carries the ABC ids verbatim, and its text ids decode back to the NFC form of the prompt text."""
from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yue2_core.constants import ABC_END, ABC_START, CONTEXT, EOD, INSTRUCTIONS, MUSIC_START
from yue2_core.errors import RequestError
from yue2_core.pipeline import Score
from yue2_core.protocol import (SEED_MAX, SongRequest, base_ids, check_budget, negative_prefix, planning_prefix,
                                semantic_prefix)

pytestmark = pytest.mark.usefixtures("single_thread")
EXAMPLES = 2500
SPECIAL = ["<|endoftext|>", "<abc>", "</abc>", "[Verse]\n", "[Chorus]\n", "[instrumental]", "(x2)", "(soft piano)\n",
           "\u0301", "e\u0301", "\x00", "\ufeff", "\u2028", "\r\n", "，", "。", "「", "」", "！", "？", "　", "Ａ",
           "ﬁ", "😀", "\ud800", "\udfff", "X:1\nM:4/4\nL:1/16\nK:C\n", "V: Vocal\n", "|\"C\"c4|", "\t", "\\"]
TEXT = st.one_of(
    st.text(max_size=60),
    st.text(st.characters(exclude_categories=()), max_size=30),  # includes lone surrogates and private use
    st.lists(st.one_of(st.sampled_from(SPECIAL), st.text(max_size=5)), max_size=10).map("".join),
)
ODD = st.one_of(st.none(), st.integers(), st.binary(max_size=4), st.booleans(), st.floats())
SEEDS = st.one_of(st.integers(0, SEED_MAX), st.sampled_from([0, SEED_MAX, SEED_MAX + 1, -1, 2 ** 64]),
                  st.integers(-(2 ** 70), 2 ** 70), st.booleans(), st.floats(), st.none(), st.text(max_size=3))
CFG = st.one_of(st.none(), st.floats(0, 20), st.floats(), st.integers(-(10 ** 400), 10 ** 400),
                st.sampled_from([10 ** 400, -(10 ** 400), True, 1.0, 1.01]), st.text(max_size=3))
IDS = st.one_of(st.sampled_from(["song", "../x", "..", ".", "/etc/passwd", "a/b", "C:\\x", "CON", "nul.txt",
                                 "LPT1", "a" * 180, "a" * 181, "song.", "-x", "ok_1.2-3"]),
                st.text(max_size=12), ODD)
COT = st.one_of(st.sampled_from(["full", "melody", "off"]), st.sampled_from(["FULL", "none", "", " full"]),
                st.text(max_size=4), ODD)
ABC = st.one_of(st.none(), TEXT, st.sampled_from(["", "  \n\t"]), ODD)
MODEL_IDS = st.lists(st.one_of(st.integers(0, EOD - 1), st.integers(-3, 200_000),
                               st.sampled_from([EOD, ABC_START, ABC_END, MUSIC_START, 1.5, "7", None])), max_size=12)


def _text_ids(ids) -> bool:
    return all(type(i) is int and 0 <= i < EOD for i in ids)


def exercise(tokenizer, style, lyrics, cot, seed, abc, cfg, song_id, model_ids) -> None:
    request = SongRequest(style=style, lyrics=lyrics, cot=cot, seed=seed, abc=abc, cfg_scale=cfg, id=song_id)
    try:
        request.validate()
        notes = request.input_warnings()
        assert all(isinstance(n, str) and n for n in notes)
        assert request.guidance == (float(cfg) if cfg is not None else {"off": 1.01}.get(request.cot, 1.0))
        enc = tokenizer.encode
        base = base_ids(request, enc)
        assert base[0] == EOD and _text_ids(base[1:])
        assert tokenizer.decode(base[1:]) == unicodedata.normalize("NFC", request.text())
        if request.cot == "off":
            abc_ids = []
        elif request.abc is not None:
            score = Score.from_text(request.abc, tokenizer, request.cot, request.seed)
            abc_ids = score.abc_ids
            assert _text_ids(abc_ids) and tokenizer.decode(abc_ids) == unicodedata.normalize("NFC", request.abc)
        else:
            abc_ids = model_ids
        if request.cot != "off":
            plan = planning_prefix(request, enc)
            assert plan == base + [ABC_START]
        sem = semantic_prefix(request, abc_ids, enc)
        neg = negative_prefix(request, abc_ids, enc)
        assert sem[:len(base)] == base and sem[-1] == MUSIC_START and neg[0] == EOD and neg[-1] == MUSIC_START
        if request.cot == "off":
            assert sem[len(base):] == [ABC_START, ABC_END, MUSIC_START]
            assert neg == [EOD] + enc(INSTRUCTIONS["off"]) + [MUSIC_START]
        else:
            assert sem[len(base):] == [ABC_START, *abc_ids, ABC_END, MUSIC_START]
            assert _text_ids(abc_ids)
            assert neg == [EOD] + enc(INSTRUCTIONS[request.cot]) + [ABC_START, *abc_ids, ABC_END, MUSIC_START]
        check_budget(len(sem), min(9000, max(1, CONTEXT - len(sem))))
        check_budget(len(sem), 9000)
    except RequestError as error:  # ScoreError and BudgetError are RequestErrors
        assert str(error)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(style=st.one_of(TEXT, ODD), lyrics=st.one_of(TEXT, TEXT, ODD), cot=COT, seed=SEEDS, abc=ABC, cfg=CFG,
       song_id=IDS, model_ids=MODEL_IDS)
def test_fuzz_prompt_builder(tokenizer, style, lyrics, cot, seed, abc, cfg, song_id, model_ids):
    exercise(tokenizer, style, lyrics, cot, seed, abc, cfg, song_id, model_ids)


@settings(max_examples=EXAMPLES // 2, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(style=TEXT, lyrics=TEXT, cot=st.sampled_from(["full", "melody", "off"]), abc=st.one_of(st.none(), TEXT),
       model_ids=st.lists(st.integers(0, EOD - 1), max_size=12))
def test_fuzz_prompt_builder_valid_requests(tokenizer, style, lyrics, cot, abc, model_ids):
    """Mostly-valid requests, so the prefix invariants are checked on many accepted inputs."""
    exercise(tokenizer, style, lyrics, cot, 831001, None if cot == "off" else abc, None, "song", model_ids)
