"""Parser: positions, lengths, pitches, ties, tuplets, broken rhythm, bar rests, tolerated spellings."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from yue2_core.abc import AbcError, parse
from yue2_core.errors import ScoreError, YuE2Error

HEAD = ('X:1\nT:\nM:{m}\nL:1/{l}\nQ:1/4=120\nV: Vocal clef=treble name="Vocal Melody" snm="Vocal"\n'
        'V: Ins clef=treble name="Ins Melody" snm="Inst."\nK:{k}\n')


def score(vocal: str, ins: str | None = None, m="4/4", l=8, k="C") -> str:  # noqa: E741 (l = L: field)
    return HEAD.format(m=m, l=l, k=k) + f"V: Vocal\n{vocal}\nV: Ins\n{ins or 'Z|'}\n"


def notes(text, voice="Vocal"):
    return [n for _, n in parse(text).notes(voice)]


def test_positions_are_one_based_line_and_column(song):
    s = parse(song)
    bar = s.voices["Vocal"][2]  # first verse bar: "G"z2B2B2d2...
    assert (bar.line, bar.column) == (16, 1)
    first_note = [n for n in bar.notes if n.kind == "note"][0]
    assert (first_note.line, first_note.column, first_note.written) == (16, 6, "B")
    assert bar.chords[0].text == "G" and (bar.chords[0].line, bar.chords[0].column) == (16, 1)


@pytest.mark.parametrize("token, units", [("C", 1), ("C8", 8), ("C/2", F(1, 2)), ("C/", F(1, 2)), ("C//", F(1, 4)),
                                          ("C3/2", F(3, 2)), ("C3/", F(3, 2)), ("C16", 16), ("z/4", F(1, 4))])
def test_lengths(token, units):
    s = parse(HEAD.format(m="4/4", l=8, k="C") + f"V: Vocal\n{token}|\nV: Ins\nZ|\n")
    assert s.voices["Vocal"][0].notes[0].written_length == units


def test_bar_sums_are_exact_fractions():
    text = score("C/2D/2E/ F// G3/4 A3/2 B2 c z/ z/2|")
    bar = parse(text).voices["Vocal"][0]
    assert [n.length for n in bar.notes] == [F(1, 2), F(1, 2), F(1, 2), F(1, 4), F(3, 4), F(3, 2), 2, 1, F(1, 2),
                                             F(1, 2)]
    assert bar.length == 8 and bar.expected == 8


def test_accidentals_hold_by_letter_across_octaves_until_the_bar_line():
    text = score("^F2 f2 F,2 =F2|F2 f2 z4|", "Z2|")
    assert [n.pitch for n in notes(text) if n.kind == "note"] == [66, 78, 54, 65, 65, 77]


def test_key_signature_and_tie_keeps_pitch_across_the_bar():
    text = score("^c4 z2 B2-|B2 =B2 c4|", "Z2|", k="F")
    pitches = [n.pitch for n in notes(text) if n.kind == "note"]
    assert pitches == [73, 70, 70, 71, 72]  # Bb held through the tie, then B natural, c back to the key
    tied = notes(text)[3]
    assert tied.tie_continues and not notes(text)[2].tie_continues


def test_unmarked_tie_continuation_keeps_a_raised_pitch_without_changing_the_bar():
    text = score("z4 z2 ^F2-|F2 F2 z4|", "Z2|")
    assert [n.pitch for n in notes(text) if n.kind == "note"] == [66, 66, 65]


def test_tuplets_scale_lengths():
    text = score("(3CDE z2 (3:2:3G2A2B2|", l=8)
    lengths = [n.length for n in notes(text)]
    assert lengths[:3] == [F(2, 3)] * 3 and lengths[4:7] == [F(4, 3)] * 3
    assert parse(text).voices["Vocal"][0].length == 8


def test_tuplet_default_q_depends_on_compound_meter():
    text = score("(5CDEFG z3|", m="6/8", l=8)
    assert notes(text)[0].length == F(3, 5)
    text = score("(5CDEFG z6|", m="4/4", l=8)
    assert notes(text)[0].length == F(2, 5)


@pytest.mark.parametrize("mark, first, second", [(">", F(3, 2), F(1, 2)), ("<", F(1, 2), F(3, 2)),
                                                 (">>", F(7, 4), F(1, 4)), ("<<<", F(1, 8), F(15, 8))])
def test_broken_rhythm(mark, first, second):
    text = score(f"C{mark}D z6|")
    a, b = notes(text)[:2]
    assert (a.length, b.length) == (first, second)


def test_measure_rests_expand_to_bars():
    s = parse(score("C8|D8|E8|F8|", "Z|Z3|"))
    assert len(s.voices["Ins"]) == 4
    assert all(b.length == 8 and b.measure_rest_count for b in s.voices["Ins"])


def test_inline_key_changes_the_rest_of_the_bar_and_resets_accidentals():
    text = score("^C2 [K:Bb] B2 C2 E2|B8|", "Z2|")
    s = parse(text)
    assert [n.pitch for n in notes(text) if n.kind == "note"] == [61, 70, 60, 63, 70]
    assert s.voices["Vocal"][0].keys[0].key == "Bb" and s.voices["Vocal"][1].key == "Bb"


def test_body_meter_and_key_lines_apply_to_their_voice():
    text = (HEAD.format(m="4/4", l=8, k="C") + "V: Vocal\nC8|\nV: Ins\nC8|\nV: Vocal\nM:3/4\nK:D\nF6|\n"
            "V: Ins\nM:3/4\nK:D\nF6|\n")
    s = parse(text)
    assert [b.meter for b in s.voices["Ins"]] == [(4, 4), (3, 4)]
    assert s.voices["Vocal"][1].notes[0].pitch == 66


def test_tolerated_spellings_parse():
    text = score('"Am7"C2 D2 E2 F2||', "C8:|").replace("V: Vocal\n", "V:Vocal\n")
    s = parse(text)
    assert s.voices["Vocal"][0].chords[0].quality == "m7"
    assert [i.code for i in s.issues] == ["dialect", "dialect"]


def test_crlf_line_ends_keep_columns():
    text = score('"C"E4 G4|').replace("\n", "\r\n")
    s = parse(text)
    assert s.voices["Vocal"][0].notes[1].column == 7 and s.header.key == "C"


@pytest.mark.parametrize("bad, code, line", [
    ("", "empty", 1),
    (score("C8|").replace("Q:1/4=120\n", ""), "missing-header", 5),
    (score("C8 y|"), "token", 10),
    (score("C8|").replace("V: Vocal\nC8|", "C8|\nV: Vocal\nC8|"), "structure", 9),
    (score("C8|").replace("K:C", "K:Hmix"), "header-value", 8),
    (score("C4 D4|E8"), "unterminated-bar", 10),
])
def test_parse_raises_located_abc_errors(bad, code, line):
    with pytest.raises(AbcError) as caught:
        parse(bad)
    error = caught.value
    assert error.code == code and error.line == line
    assert isinstance(error, ValueError) and isinstance(error, ScoreError) and isinstance(error, YuE2Error)
    assert str(error).startswith(f"line {line} column {error.column}: ") and error.issues  # one format (stop 51)


def test_non_text_is_an_abc_error():
    with pytest.raises(AbcError):
        parse(b"X:1")  # type: ignore[arg-type]


def test_a_huge_chord_symbol_is_quoted_short():
    """Break-it finding: a 10 kB chord symbol was echoed whole in the warning; messages quote 40 characters and
    the length."""
    from pathlib import Path
    from yue2_core.abc import validate
    text = (Path(__file__).parent / "corpus" / "bad_chord.abc").read_text("utf-8")
    issues = validate(text.replace('"Hmaj"', '"H' + "Z" * 10_000 + '"'))
    chord = [i for i in issues if "is not a chord symbol" in i.message]
    assert chord and "(10,001 characters)" in chord[0].message and len(chord[0].message) < 400
    assert max(len(i.message) for i in issues) < 400
