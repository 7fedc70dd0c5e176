"""validate(): one test per rule, on small scores written for that rule."""

from __future__ import annotations

import pytest

from yue2_core.abc import validate

HEAD = ('X:1\nT:\nM:4/4\nL:1/8\nQ:1/4=120\nV: Vocal clef=treble name="Vocal Melody" snm="Vocal"\n'
        'V: Ins clef=treble name="Ins Melody" snm="Inst."\nK:C\n')
GOOD = HEAD + '% verse\nV: Vocal\n"C"C2E2G2c2|"G"B8|\nV: Ins\nC,8|G,8|\n'


def codes(text, severity=None, **kwargs):
    return [i.code for i in validate(text, **kwargs) if severity in (None, i.severity)]


def test_good_score_has_no_issues():
    assert validate(GOOD) == []


def test_instrumental_flags_a_singing_vocal_voice_once():
    issues = [i for i in validate(GOOD, instrumental=True)]
    assert [(i.code, i.severity, i.line, i.column, i.bar, i.voice) for i in issues] == \
        [("vocal-in-instrumental", "warning", 11, 4, 1, "Vocal")]
    silent = GOOD.replace('"C"C2E2G2c2|"G"B8|', '"C"z8|"G"z8|')
    assert validate(silent, instrumental=True) == []


def test_max_seconds_uses_bars_times_beats_over_tempo():
    # 2 bars × 4 beats ÷ 120 BPM = 4.0 s
    assert codes(GOOD, max_seconds=4.0) == []
    issues = validate(GOOD, max_seconds=3.9)
    assert [i.code for i in issues] == ["too-long"] and "4.0 s" in issues[0].message


def test_group_without_ins_in_the_middle_is_an_error():
    text = HEAD + 'V: Vocal\nC8|\nV: Vocal\nD8|\nV: Ins\nC8|\n'
    assert codes(text, "error") == ["group-order"]


def test_ins_before_vocal_is_an_error():
    text = HEAD + 'V: Ins\nC8|\nV: Vocal\nD8|\nV: Ins\nC8|\n'
    assert "group-order" in codes(text, "error")


def test_bar_count_and_meter_must_agree_between_voices():
    assert codes(HEAD + 'V: Vocal\nC8|D8|\nV: Ins\nZ3|\n', "error") == ["voice-mismatch"]
    text = HEAD + 'V: Vocal\nM:3/4\nC6|\nV: Ins\nC8|\n'
    assert codes(text, "error") == ["voice-mismatch"]


def test_only_full_bars_are_measured():
    assert codes(HEAD + 'V: Vocal\nC8|D7|\nV: Ins\nC8|D8|\n', "error") == ["bar-length"]
    truncated = HEAD + 'V: Vocal\nC8|D8|\nV: Ins\nC8|D4'
    assert codes(truncated) == ["truncated"]


def test_bar_length_message_names_the_numbers():
    issue = validate(HEAD + 'V: Vocal\nC8|D4E4F4|\nV: Ins\nC8|D8|\n')[0]
    assert (issue.code, issue.bar, issue.voice, issue.line, issue.column) == ("bar-length", 2, "Vocal", 10, 4)
    assert "12" in issue.message and "8" in issue.message


def test_group_size_is_one_to_four_bars():
    text = HEAD + 'V: Vocal\nC8|C8|C8|C8|C8|\nV: Ins\nZ4|Z|\n'
    assert codes(text) == ["group-size", "group-size"]


def test_range_is_midi_21_to_108():
    assert codes(HEAD + "V: Vocal\nA,,,,8|\nV: Ins\nc'''8|\n") == []
    assert codes(HEAD + "V: Vocal\n_A,,,,8|\nV: Ins\n^c'''8|\n") == ["note-range", "note-range"]


def test_open_tie_at_the_end_and_tie_into_a_rest():
    assert codes(HEAD + 'V: Vocal\nC8-|\nV: Ins\nC8|\n') == ["tie"]
    assert codes(HEAD + 'V: Vocal\nC8-|z8|\nV: Ins\nC8|C8|\n', "error") == ["tie"]
    assert codes(HEAD + 'V: Vocal\nC8-|Z|\nV: Ins\nC8|C8|\n', "error") == ["tie"]


def test_key_mismatch_between_voices_is_a_warning():
    text = HEAD + 'V: Vocal\nK:G\nF8|\nV: Ins\nC8|\n'
    assert codes(text) == ["key-mismatch"]


def test_only_rests_warns():
    assert codes(HEAD + 'V: Vocal\nz8|\nV: Ins\nZ|\n') == ["no-notes"]


def test_chord_quality_outside_the_native_list_is_a_warning():
    text = GOOD.replace('"G"B8', '"Gadd9"B8')
    issues = validate(text)
    assert [(i.code, i.severity) for i in issues] == [("chord-symbol", "warning")]


def test_empty_bar_and_unterminated_middle_line_are_errors():
    assert "empty-bar" in codes(HEAD + 'V: Vocal\nC8||D8|\nV: Ins\nC8|C8|\n'.replace("||", "| |"), "error")
    assert codes(HEAD + 'V: Vocal\nC8|D8\nV: Ins\nC8|C8|\n', "error") == ["unterminated-bar", "voice-mismatch"]


def test_blank_lines_and_directives_are_dialect_warnings():
    text = GOOD.replace("% verse\n", "%%MIDI program 1\n\n% verse\n")
    assert codes(text) == ["dialect", "dialect"]


def test_dangling_section_comment_warns():
    assert codes(GOOD + "% outro\n") == ["dialect"]


@pytest.mark.parametrize("text", ["", " \n\t ", "\n\n"])
def test_empty_text(text):
    assert codes(text) == ["empty"]


def test_garbage_is_reported_not_raised():
    issues = validate("\x00\x01\xff garbage \ufffd\n" * 50)
    assert {"missing-header"} <= {i.code for i in issues}
    assert all(i.severity == "error" for i in issues)


def test_issue_list_is_capped():
    text = HEAD + "V: Vocal\n" + "C7|" * 400 + "\nV: Ins\n" + "C8|" * 400 + "\n"
    issues = validate(text)
    assert len(issues) == 200 and issues[-1].code == "too-many-issues"
    total = len(validate(text, limit=10**6))
    assert total == 802  # 400 bar lengths, 400 non-native lengths (C7), 2 lines of 400 bars
    assert f"{total - 199} more issues" in issues[-1].message


def test_bar_of_only_a_chord_symbol_is_an_empty_bar():
    # found by the fuzz test: stripping the chord would have changed the bar count
    text = HEAD + 'V: Vocal\n"C"|C8|\nV: Ins\nC8|\n'
    issues = validate(text)
    assert [(i.code, i.line, i.column) for i in issues] == [("empty-bar", 10, 1)]


@pytest.mark.parametrize("music", ["C" + "9" * 5000 + "|", "Z" + "9" * 5000 + "|", "(" + "3" * 5000 + "C8|",
                                   "Z999999|"])
def test_huge_numbers_are_token_errors_not_crashes(music):
    text = HEAD + f"V: Vocal\n{music}\nV: Ins\nC8|\n"
    assert "token" in codes(text, "error")


def test_huge_header_numbers_are_value_errors():
    text = GOOD.replace("Q:1/4=120", "Q:1/4=" + "9" * 5000).replace("M:4/4", "M:" + "4" * 5000 + "/4")
    assert codes(text, "error") == ["header-value", "header-value"]


def test_cjk_lyrics_line_is_kept_and_warned():
    from yue2_core.abc import parse

    text = GOOD.replace('"G"B8|\n', '"G"B8|\nw: 我 们 走 吧\n')
    assert codes(text) == ["dialect"]
    assert parse(text).lyrics[0].text == "我 们 走 吧" and parse(text).lyrics[0].voice == "Vocal"


def test_comment_only_score_is_not_said_to_have_a_header():
    """A score of comments only: one finding for the missing header and one for the missing music — not "has a
    header but no music" on a line that does not exist (break-it finding: it named line 2 of a one-line file)."""
    issues = validate("% just a comment\n")
    assert [i.code for i in issues] == ["missing-header", "empty"], issues
    assert "has a header" not in issues[1].message and issues[1].line == 1
    header_only = validate("X:1\nT:t\nM:4/4\nL:1/32\nQ:1/4=100\nV:Vocal\nV:Ins\nK:C\n")
    assert any(i.code == "empty" and "has a header but no music" in i.message for i in header_only)


@pytest.mark.parametrize("old,new", [("M:4/4", "M:\u0664/4"), ("Q:1/4=120", "Q:1/4=\u0661\u0662\u0660"),
                                     ("L:1/8", "L:1/\uff18"), ("X:1", "X:\u00b9")])
def test_header_numbers_in_other_scripts_are_value_errors(old, new):
    # Python's \d and int() take Arabic-Indic, full-width and superscript digits; ABC readers (and the model) do not
    assert codes(GOOD.replace(old, new), "error")[:1] == ["header-value"]


@pytest.mark.parametrize("music", ["C\u0668|", "Z\u0662|", "(\u0663CDE"])
def test_lengths_in_other_scripts_are_not_read_as_numbers(music):
    text = HEAD + f"V: Vocal\n{music}\nV: Ins\nC8|\n"
    assert "token" in codes(text, "error")
