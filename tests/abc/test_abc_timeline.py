"""timeline(): seconds from Q: and L:, ties merged, chord symbols with durations and pitches."""

from __future__ import annotations

import pytest

from yue2_core.abc import AbcError, timeline

HEAD = ('X:1\nT:\nM:{m}\nL:1/8\nQ:{q}\nV: Vocal clef=treble name="Vocal Melody" snm="Vocal"\n'
        'V: Ins clef=treble name="Ins Melody" snm="Inst."\nK:C\n')


def play(vocal, ins="Z|", m="4/4", q="1/4=120"):
    return timeline(HEAD.format(m=m, q=q) + f"V: Vocal\n{vocal}\nV: Ins\n{ins}\n")


def test_note_times_by_hand():
    # quarter = 0.5 s at 120 BPM; L:1/8 -> one unit = 0.25 s
    t = play('"C"C2 D2 E4|"G"G8|', "C,8|G,8|")
    assert [(n["start_s"], n["dur_s"], n["midi"]) for n in t["voices"]["Vocal"]] == \
        [(0.0, 0.5, 60), (0.5, 0.5, 62), (1.0, 1.0, 64), (2.0, 2.0, 67)]
    assert [(n["bar"], n["line"], n["col"]) for n in t["voices"]["Vocal"]][:2] == [(1, 10, 4), (1, 10, 7)]
    assert t["duration_s"] == 4.0 and t["tempo"] == {"bpm": 120.0, "beat": "1/4"}


def test_ties_merge_into_one_note():
    t = play("C4 E4-|E4 z4|")
    assert [(n["start_s"], n["dur_s"], n["midi"]) for n in t["voices"]["Vocal"]] == [(0.0, 1.0, 60), (1.0, 2.0, 64)]


def test_chords_last_until_the_next_symbol():
    t = play('"C"C4 "Am7"A4|"F#m/C#"F8|z8|', "Z3|")
    assert [(c["symbol"], c["start_s"], c["dur_s"]) for c in t["chords"]] == \
        [("C", 0.0, 1.0), ("Am7", 1.0, 1.0), ("F#m/C#", 2.0, 4.0)]
    assert t["chords"][0]["midis"] == [48, 52, 55]
    assert t["chords"][1]["midis"] == [57, 60, 64, 67]
    assert t["chords"][2]["midis"] == [37, 54, 57, 61]  # C#2 bass below F#3-A3-C#4


def test_compound_tempo_beat():
    # Q:3/8=60 -> a dotted quarter per second; L:1/8 -> one unit = 1/3 s; 6/8 bar = 2 s
    t = play("C3 D3|", m="6/8", q="3/8=60")
    assert [n["dur_s"] for n in t["voices"]["Vocal"]] == pytest.approx([1.0, 1.0])
    assert t["duration_s"] == pytest.approx(2.0)


def test_rests_and_measure_rests_take_time():
    t = play("z8|C8|", "Z2|")
    assert t["voices"]["Vocal"][0]["start_s"] == 2.0 and t["voices"]["Ins"] == []


def test_refuses_unparseable_text():
    with pytest.raises(AbcError):
        timeline("X:1\n")
