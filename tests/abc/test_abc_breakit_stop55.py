"""Break-it review, stop 55: pastes into the ABC editor that held its score thread for seconds to minutes.

The editor sends every edit to /yue2/abc/analyze (with engraving) and each tool button to /yue2/abc/tool; both run
on one worker thread of the ComfyUI server, and Verovio's engraving holds the Python lock. A score may be 100 kB
(routes.MAX_ABC_BYTES). Within that size these took, on the 2-core CI machine, before the fixes:

- a run of control characters on one line (a binary file or terminal output pasted): 28 s to analyze, 56 s for each
  tool — the regex that drops control characters ending a line tried every start of the run;
- "[K:" repeated, an inline field never closed: 31 s to analyze and as long for each tool — the inline field's
  regex scanned to the line's end from every "["; and one unclosed `[K:D` was named as "notes sounding together
  ([CEG])" plus a second error for `K:D`;
- chord symbols stacked on one note (`"C""C"…C16|`): the engraving bound counted notes only, and Verovio took
  265 s of CPU for 33,000 symbols, the whole server frozen;
- section comments (`% verse`) by the thousand: every section looked at all later ones and counted its bars anew.

CPU time of this process is measured (Verovio and the parser run here, on one core), so a busy machine does not make
the bounds flaky; each bound is a guard against quadratic time, far above the linear time and far below the old one.
"""

from __future__ import annotations

import time
from importlib.util import find_spec

import pytest

from yue2_core.abc import analyze, structure, transpose, validate
from yue2_core.abc.engrave import MAX_NOTES, MAX_NOTES_PER_BAR

HEAD = ('X:1\nT:\nM:4/4\nL:1/16\nQ:1/4=96\nV: Vocal clef=treble name="Vocal Melody" snm="Vocal"\n'
        'V: Ins clef=treble name="Ins Melody" snm="Inst."\nK:G\n')
needs_verovio = pytest.mark.skipif(find_spec("verovio") is None, reason="engraving needs the optional package verovio")


def _one_bar(vocal: str) -> str:
    return HEAD + f"V: Vocal\n{vocal}\nV: Ins\nG16|\n"


def _cpu(call) -> tuple[float, object]:
    t0 = time.process_time()
    result = call()
    return time.process_time() - t0, result


def test_a_long_run_of_control_characters_is_read_in_linear_time():
    text = _one_bar("\x07" * 60_000 + "G16|")  # was: 10 s to analyze, 20 s for each tool
    took, result = _cpu(lambda: analyze({"abc": text}))
    [issue] = [i for i in result["issues"] if i["severity"] == "error"]
    assert issue["code"] == "control-character" and (issue["line"], issue["column"]) == (10, 1), issue
    assert "U+0007" in issue["message"] and "(60000 control characters in all)" in issue["message"], issue
    assert took < 1.5, f"analyze took {took:.2f} s of CPU"
    took, moved = _cpu(lambda: transpose(text, 2))
    assert moved.count("\x07") == 60_000 and "K:A\n" in moved and took < 1.5, f"transpose took {took:.2f} s"
    ends = _one_bar("G16|" + "\x1b" * 60_000)  # a run that ends its line: dropped before the rules
    took, issues = _cpu(lambda: validate(ends))
    assert [i.code for i in issues if i.severity == "error"] == ["control-character"] and took < 1.5, issues


def test_an_inline_field_never_closed_is_named_once_and_read_in_linear_time():
    for bar, field, place, advice in (("[K:D C16|", "[K:", 1, "[K:D]"), ("C8[K:Em C8|", "[K:", 3, "[K:Em]"),
                                      ("[Q:1/4=90 G16|", "[Q:", 1, "[K:D]")):
        errors = [i for i in validate(_one_bar(bar)) if i.severity == "error"]
        assert [(i.code, i.line, i.column) for i in errors] == [("token", 10, place)], (bar, errors)
        message = errors[0].message
        assert f"the inline field '{field}' is not closed with ']'" in message and advice in message, message
        assert "sounding together" not in message, message  # was: "notes sounding together ([CEG])" + 'K:D' error
    closed = [i.code for i in validate(_one_bar("[K:D]G16|"))]
    assert "token" not in closed, closed  # a closed one reads as before
    text = _one_bar("[K:" * 33_000 + "G16|")  # was: 31 s to analyze, as long for each tool
    took, result = _cpu(lambda: analyze({"abc": text}))
    assert result["ok"] is False and took < 1.5, f"analyze took {took:.2f} s of CPU"
    with pytest.raises(Exception, match="is not closed with"):
        t0 = time.process_time()
        transpose(text, 2)
    assert time.process_time() - t0 < 1.5


@needs_verovio
def test_chord_symbols_are_bounded_before_engraving():
    stacked = _one_bar('"C"' * (MAX_NOTES_PER_BAR + 1) + "G16|")
    result = analyze({"abc": stacked, "engrave": True})
    assert result["svg"] is None and result["structure"] is not None, result  # checked, not engraved
    assert f"{MAX_NOTES_PER_BAR + 1} chord symbols; the engraver draws at most {MAX_NOTES_PER_BAR} per bar" in \
        result["svg_error"], result["svg_error"]
    took, result = _cpu(lambda: analyze({"abc": _one_bar('"C"' * 33_000 + "G16|"), "engrave": True}))
    assert result["svg"] is None and "33000 chord symbols" in result["svg_error"] and took < 1.5, took  # was 265 s
    bars = MAX_NOTES // MAX_NOTES_PER_BAR  # at the limits: 48 symbols on the one note of each of 62 bars
    symbols = '"C"' * MAX_NOTES_PER_BAR
    text = HEAD + "".join(f"V: Vocal\n{symbols}G16|\nV: Ins\nG16|\n" for _ in range(bars))
    analyze({"abc": HEAD + "V: Vocal\nG16|\nV: Ins\nG16|\n", "engrave": True})  # Verovio's first load: not measured
    took, result = _cpu(lambda: analyze({"abc": text, "engrave": True}))
    assert result["svg"] and result["svg_error"] is None and took < 4.5, (took, result["svg_error"])
    rest = '"C"' * (MAX_NOTES - bars * MAX_NOTES_PER_BAR + 1)
    over = text + f"V: Vocal\n{rest}G16|\nV: Ins\nG16|\n"
    assert f"{MAX_NOTES + 1} chord symbols; the engraver draws at most {MAX_NOTES}" in \
        analyze({"abc": over, "engrave": True})["svg_error"]


def test_thousands_of_section_comments_are_described_in_linear_time():
    small = HEAD + ("% intro\n% verse\nV: Vocal\nG4G4G4G4|\nV: Ins\nG16|\n% chorus\nV: Vocal\nG8-G8|B16|\n"
                    "V: Ins\nG16|G16|\n")
    assert [(s["label"], s["first_bar"], s["last_bar"], s["vocal_notes"]) for s in structure(small)["sections"]] == \
        [("intro", 1, 1, 4), ("verse", 1, 1, 4), ("chorus", 2, 3, 2)]  # two labels on one bar share it; a tie is one
    text = HEAD + "% verse\n" * 6_000 + "V: Vocal\n" + "G16|" * 6_000 + "\nV: Ins\n" + "G16|" * 6_000 + "\n"
    took, described = _cpu(lambda: structure(text))
    sections = described["sections"]
    assert len(sections) == 6_000 and {(s["bars"], s["vocal_notes"]) for s in sections} == {(6_000, 6_000)}
    assert took < 1.5, f"structure took {took:.2f} s of CPU"  # was 3.9 s on the 2-core CI machine
