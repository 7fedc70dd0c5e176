"""Fuzzing: arbitrary and mutated text never makes the ABC functions raise anything but AbcError."""

from __future__ import annotations

from abc_corpus import read
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yue2_core.abc import (
    AbcError,
    analyze,
    parse,
    silence_vocal,
    strip_chords,
    structure,
    timeline,
    transpose,
    validate,
)

SEEDS = [read(name) for name in ("song.abc", "tuplets.abc", "swing.abc", "key_meter_changes.abc",
                                 "gen_4_4_Fsharp_ties.abc", "truncated_mid_token.abc")]
ALPHABET = st.sampled_from(list("ABCDEFGabcdefgzxZX^_=,'/|:[]()<>-\"%0123456789 \nVKMLQTw") + ["V: Vocal\n",
                                                                                                  "V: Ins\n", "|\n"])


@st.composite
def mutated_scores(draw):
    """A corpus score with a few random insertions, deletions and swaps (stays close to the dialect)."""
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["insert", "delete", "replace"]))
        piece = "".join(draw(st.lists(ALPHABET, min_size=1, max_size=4)))
        if action == "insert":
            text = text[:at] + piece + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)):]
        else:
            text = text[:at] + piece + text[at + len(piece):]
    return text


def exercise(text: str) -> None:
    issues = validate(text)
    assert all(i.severity in ("error", "warning") and i.line >= 1 for i in issues)
    try:
        score = parse(text)
    except AbcError as error:
        assert error.code != "internal" and error.message
        return
    assert not any(i.code in ("empty", "token") and i.severity == "error" for i in score.issues)
    structure(text)
    timeline(text)
    for tool in (strip_chords, silence_vocal, lambda t: transpose(t, 5)):
        try:
            tool(text)
        except AbcError as error:
            assert error.code != "internal", error


def answer(text: str) -> None:
    result = analyze({"abc": text, "instrumental": True, "max_seconds": 10})
    assert "error" not in result, result.get("error")


@settings(max_examples=2000, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_arbitrary_text(text):
    exercise(text)
    answer(text)


@settings(max_examples=2000, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_scores())
def test_mutated_scores(text):
    exercise(text)
    answer(text)
