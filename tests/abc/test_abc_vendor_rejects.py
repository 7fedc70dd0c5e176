"""Issue #20 item 4: the checker speaks up (at least a warning) on every input the vendor's checker refuses.

The 27 cases are the bad-input list of the vendor's skill test (`tests/test_skill_abc_tools.py::test_bad_input_cases`
of multimodal-art-projection/YuE @ fcb5b96f, for `skills/yue2-music/scripts/abc_tools.py`), rebuilt here with the
same score template; the review of issue #20 added five spellings it also refuses. Each case names the issue code
we expect, so a case that only gets an unrelated finding (e.g. "no-notes") still fails. Our note range stays
stricter than the vendor's (MIDI 21-108 against 0-127).
"""

from __future__ import annotations

import pytest

from yue2_core.abc import validate


def score(vocal: str, ins: str = "Z|", meter: str = "4/4", key: str = "C", extra: str = "") -> str:
    """The vendor test's template: the native header, one `% verse` group, a final newline."""
    return ("X:1\nT:\nM:" + meter + "\nL:1/32\nQ:1/4=88\n"
            'V: Vocal clef=treble name="Vocal Melody" snm="Vocal"\n'
            'V: Ins clef=treble name="Ins Melody" snm="Inst."\n'
            "K:" + key + "\n% verse\nV: Vocal\n" + vocal + "\nV: Ins\n" + ins + "\n" + extra)


GOOD = score("C32|")

# (id, text, the issue code that must be reported for it)
VENDOR_27 = [
    ("short-bar", score("C16|"), "bar-length"),
    ("long-bar", score("C48|"), "bar-length"),
    ("tie-open-at-end", score("C32-|"), "tie"),
    ("tie-changes-pitch", score("C32-|D32|", "Z2|"), "tie"),
    ("tie-into-rest", score("C32-|z32|", "Z2|"), "tie"),
    ("tie-natural-breaks-pitch", score("C32-|=C32|", "Z2|", key="D").replace("C32-|", "^C32-|"), "tie"),
    ("tied-rest", score("z32-|"), "token"),
    ("rest-accidental", score("^z32|"), "token"),
    ("length-10", score("C10C22|"), "duration-value"),
    ("fraction-length", score("C/2C31|"), "duration-value"),
    ("chord-notes", score("[CEG]32|"), "token"),
    ("broken-rhythm", score("C16>C16|"), "broken-rhythm"),
    ("grace-note", score("{C}D32|"), "token"),
    ("double-bar", score("C32||"), "dialect"),
    ("repeat-bar", score("C32:|"), "dialect"),
    ("Z1", score("Z1|"), "dialect"),
    ("Z5", score("Z5|"), "dialect"),
    ("chord-13", score('"C13"C32|'), "chord-symbol"),
    ("chord-alt", score('"A7alt"C32|'), "chord-symbol"),
    ("chord-after-last-note", score('C32"C"|'), "chord-symbol"),
    ("chord-on-Z-in-Ins", score("C32|", '"C"Z|'), "token"),
    ("key-change-one-voice", score("C16[K:D]C16|"), "key-mismatch"),
    ("unit-1/3", score("C32|").replace("L:1/32", "L:1/3"), "header-value"),
    ("mode-key", score("C32|").replace("K:C", "K:Cmix"), "header-value"),
    ("directive", score("C32|").replace("% verse", "%%MIDI program 1"), "dialect"),
    ("five-bars", score("C32|").replace("C32|", "C32|C32|C32|C32|C32|"), "group-size"),
    ("bar-count-mismatch", score("C32|", "Z2|"), "voice-mismatch"),
]

ISSUE_20 = [
    ("trailing-blank-line", GOOD + "\n", "dialect"),
    ("trailing-blank-line-spaces", GOOD + "  ", "dialect"),
    ("selector-trailing-space", GOOD.replace("V: Vocal\nC", "V: Vocal \nC"), "dialect"),
    ("comment-without-space", GOOD.replace("% verse", "%verse"), "dialect"),
    ("empty-comment", GOOD.replace("% verse", "%"), "dialect"),
]


def test_the_vendor_list_has_27_cases():
    assert len(VENDOR_27) == 27 and len({name for name, _, _ in VENDOR_27}) == 27


def test_the_template_itself_is_clean():
    assert validate(GOOD) == []
    assert validate(GOOD.replace("% verse", "% verse\n% pre-chorus")) == []


@pytest.mark.parametrize("text, code", [c[1:] for c in VENDOR_27 + ISSUE_20], ids=[c[0] for c in VENDOR_27 + ISSUE_20])
def test_every_vendor_rejection_gets_at_least_a_warning(text, code):
    issues = validate(text)
    assert code in {i.code for i in issues}, [(i.code, i.message) for i in issues]


@pytest.mark.parametrize("text, words", [
    (score("Z1|"), ["'Z1'", "writes Z for one bar"]),
    (score("Z5|"), ["'Z5'", "Z2…Z4"]),
    (score('C32"C"|'), ['"C"', "after the last note", "bar 1"]),
    (GOOD + "\n", ["blank line after its last group"]),
    (GOOD.replace("V: Vocal\nC", "V: Vocal \nC"), ["'V: Vocal'", "nothing after"]),
    (GOOD.replace("% verse", "%verse"), ["'%verse'", "'% label'"]),
], ids=["Z1", "Z5", "chord-at-end", "blank-end", "selector-space", "comment"])
def test_the_new_warnings_name_what_is_wrong(text, words):
    messages = " ".join(i.message for i in validate(text) if i.severity == "warning")
    for word in words:
        assert word in messages, messages


def test_a_chord_after_the_last_note_is_placed_at_the_bar_end_and_still_parses():
    from yue2_core.abc import parse
    bar = parse(score('C32"G"|')).voices["Vocal"][0]
    assert [c.onset for c in bar.chords] == [32]
    # a chord before the last note is the dialect and stays quiet
    assert validate(score('C16"G"C16|')) == []


def test_a_cut_off_last_bar_ending_in_a_chord_is_truncation_not_a_misplaced_chord():
    text = GOOD.replace("V: Ins\nZ|\n", "V: Ins\nC16\"G\"")
    codes = [i.code for i in validate(text)]
    assert "truncated" in codes and "chord-symbol" not in codes


def test_a_final_newline_is_not_a_blank_line():
    assert validate(GOOD) == [] and validate(GOOD.rstrip("\n")) == []


def test_our_note_range_stays_stricter_than_the_vendors():
    # MIDI 120 is inside the vendor's 0..127 but outside our 21..108: an error here
    issues = validate(score("c''''32|"))
    assert [i.code for i in issues if i.severity == "error"] == ["note-range"]
