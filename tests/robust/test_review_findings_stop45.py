"""Findings of the 2026-12-06 break-it review of the editor, its routes and song folders (stop 45),
docs/bad_inputs.md §23: inputs that passed every check and then showed nothing, stopped a node with a Python
traceback's last line, or could lose a saved song after a crash."""
from __future__ import annotations

import importlib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from yue2_core.abc.svg import SVG_NS

REPO = Path(__file__).resolve().parents[2]
HEAD = "X:1\nT:\nM:4/4\nL:1/32\nQ:1/4=100\nV: Vocal clef=treble\nV: Ins clef=treble\nK:G\n"


def _score(bars: int, vocal: str, ins: str) -> str:
    """A two-voice score of `bars` bars per voice, four bars a line, a section comment every four bars."""
    text = HEAD
    for _ in range(0, bars, 4):
        text += f"% verse\nV: Vocal\n{'|'.join([vocal] * 4)}|\nV: Ins\n{'|'.join([ins] * 4)}|\n"
    return text


@pytest.mark.parametrize("bars, vocal, ins", [(64, '"G"z8B8B8A8', "G,16D16"),  # a 2.5-minute song
                                              (128, '"C"e16d8c8', "C16G16"),  # a 5-minute song
                                              (1500, '"Cmaj7"z32', '"G7"z32')])  # the 3,000-note limit, tallest
def test_a_long_score_is_engraved_as_one_svg_document(bars, vocal, ins):
    """Verovio broke a score of more than ~50 bars into A4 pages, and the editor's analyze answer joined them with a
    newline: two <svg> roots, which is no XML document — the widget's DOMParser (Chromium) said parsererror, so
    the editor showed "The score could not be engraved." for every song longer than about two minutes. Now the
    engraving is one page (Verovio's tallest, trimmed to the music) and `svg` one document holding every note."""
    pytest.importorskip("verovio")
    from yue2_core.abc.service import analyze

    answer = analyze({"abc": _score(bars, vocal, ins), "engrave": True})
    assert answer["svg_error"] is None and answer["svg"], answer.get("svg_error")
    root = ET.fromstring(answer["svg"])  # was: ParseError "junk after document element"
    assert root.tag == f"{{{SVG_NS}}}svg"
    ids = {element.get("id") for element in root.iter()}
    notes = [entry["id"] for entry in answer["time_map"]]
    assert len(notes) >= 2 * bars and all(note in ids for note in notes)


def test_a_score_taller_than_one_page_is_said_not_joined(monkeypatch):
    """Should a score still need more than one page (a smaller page height here), the answer says so in
    `svg_error` (the text is still checked) instead of an SVG the editor cannot show."""
    pytest.importorskip("verovio")
    from yue2_core.abc.service import analyze

    engrave = importlib.import_module("yue2_core.abc.engrave")  # the package's `engrave` is the function
    monkeypatch.setattr(engrave, "PAGE_HEIGHT", 2970)
    answer = analyze({"abc": _score(128, '"C"e16d8c8', "C16G16"), "engrave": True})
    assert answer["svg"] is None and answer["structure"] is not None
    assert answer["svg_error"].startswith("the score needs 3 pages of engraving; the editor draws one page (2,970 "), answer
