"""The corpus: each file's issues, and facts the generator recorded independently of the parser."""

from __future__ import annotations

from fractions import Fraction

import make_corpus
import pytest
from abc_corpus import CASES, GENERATED, VALID, read

from yue2_core.abc import parse, structure, timeline, validate


@pytest.mark.parametrize("name", sorted(make_corpus.SPECS))
def test_generated_files_match_generator(name):
    text, facts = make_corpus.generate(name)
    assert read(f"{name}.abc") == text
    assert GENERATED[name] == facts


@pytest.mark.parametrize("name", sorted(CASES))
def test_issue_codes(name):
    issues = validate(read(name))
    errors = {i.code for i in issues if i.severity == "error"}
    warnings = {i.code for i in issues if i.severity == "warning"}
    assert errors == set(CASES[name]["errors"]), [i.message for i in issues]
    assert set(CASES[name]["warnings"]) <= warnings, [i.message for i in issues]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_issue_is_located_and_explained(name):
    text = read(name)
    lines = text.split("\n")
    for issue in validate(text):
        assert issue.severity in ("error", "warning")
        assert issue.message.endswith(".") and len(issue.message) > 20
        assert 1 <= issue.line <= max(len(lines), 1)
        assert issue.column is None or issue.column >= 1


@pytest.mark.parametrize("name", [n for n in VALID if "truncated" not in n])
def test_complete_bars_sum_to_the_meter(name):
    score = parse(read(name))
    for voice, bars in score.voices.items():
        for bar in bars:
            n, d = bar.meter
            assert bar.length == Fraction(n, d) / score.header.unit, (voice, bar.number)


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_facts(name):
    facts = GENERATED[name]
    text = read(f"{name}.abc")
    info = structure(text)
    n, d = facts["meter"]
    beats = Fraction(n * 4, d)  # quarter-note beats per bar, Q:1/4
    assert info["bars"] == {"Vocal": facts["bars"], "Ins": facts["bars"]}
    assert info["groups"] == facts["groups"]
    assert info["duration_s"] == pytest.approx(float(facts["bars"] * beats * 60 / facts["bpm"]))
    assert info["key"] == facts["key"] and info["meter"] == f"{n}/{d}" and info["unit_length"] == f"1/{facts['unit']}"
    assert info["chord_count"] == facts["chords"] and info["has_chords"] == bool(facts["chords"])
    assert info["notes"] == facts["notes"]
    assert [(s["label"], s["first_bar"]) for s in info["sections"]] == \
        [(s["label"], s["first_bar"]) for s in facts["sections"]]
    played = timeline(text)
    for voice in ("Vocal", "Ins"):
        assert [note["midi"] for note in played["voices"][voice]] == facts["midis"][voice]


def test_song_structure_by_hand(song):
    info = structure(song)
    # 15 bars of 4/4 at Q:1/4=96: 15 × 4 beats ÷ 96 BPM × 60 s = 37.5 s
    assert info["duration_s"] == pytest.approx(15 * 4 / 96 * 60)
    assert info["bars"] == {"Vocal": 15, "Ins": 15}
    assert [(s["label"], s["first_bar"], s["last_bar"]) for s in info["sections"]] == \
        [("intro", 1, 2), ("verse", 3, 6), ("chorus", 7, 13), ("outro", 14, 15)]
    assert info["tempo"] == {"bpm": 96.0, "beat": "1/4", "seconds_per_beat": 0.625}
    assert info["chord_symbols"][:3] == ["G", "D/F#", "Em"]
