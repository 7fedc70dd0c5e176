"""engrave(): both voices engraved through MusicXML + Verovio, ids shared with the time map, SVG sanitised."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from importlib.util import find_spec

import pytest
from abc_corpus import read

from yue2_core.abc import AbcError, engrave, parse, structure
from yue2_core.abc.musicxml import pieces, to_musicxml

needs_verovio = pytest.mark.skipif(find_spec("verovio") is None,
                                   reason="engraving needs the optional package verovio: pip install verovio")


def svg_elements(svg: str):
    return list(ET.fromstring(svg).iter())


def classes(svg: str, name: str):
    return [e for e in svg_elements(svg) if name in (e.get("class") or "").split()]


@needs_verovio
@pytest.mark.parametrize("name", ["song.abc", "gen_6_8_Em_chords.abc", "tuplets.abc", "key_meter_changes.abc",
                                  "gen_4_4_Fsharp_ties.abc", "truncated_mid_group.abc"])
def test_both_voices_notes_and_chords_are_engraved(name):
    text = read(name)
    result = engrave(text)
    assert len(result["pages"]) == 1 and result["engine"].startswith("verovio ")
    svg = result["pages"][0]
    ids = {e.get("id") for e in svg_elements(svg)}
    assert {entry["id"] for entry in result["time_map"]} <= ids
    assert any(entry["voice"] == "Ins" for entry in result["time_map"])
    assert len(classes(svg, "harm")) == structure(text)["chord_count"]
    staves_per_measure = {len(classes(ET.tostring(m, encoding="unicode"), "staff")) for m in classes(svg, "measure")}
    assert staves_per_measure == {2}


@needs_verovio
def test_time_map_agrees_with_verovios_own_timing():
    import verovio

    text = read("song.abc")
    ours = {e["id"]: e["start_s"] for e in engrave(text)["time_map"]}
    toolkit = verovio.toolkit()
    toolkit.loadData(to_musicxml(parse(text)))
    toolkit.renderToSVG(1)
    theirs = {note: moment["tstamp"] / 1000 for moment in toolkit.renderToTimemap() for note in moment.get("on", [])}
    shared = [i for i in theirs if i in ours]
    assert len(shared) > 50
    for note in shared:
        assert ours[note] == pytest.approx(theirs[note], abs=0.002), note


@needs_verovio
def test_title_script_never_reaches_the_svg():
    svg = engrave(read("script_title.abc"))["svg"]
    assert "script" not in svg.lower() and "alert" not in svg
    assert not any(k.startswith("on") for e in svg_elements(svg) for k in e.attrib)


@needs_verovio
def test_embedded_music_font_is_kept():
    svg = engrave(read("song.abc"))["svg"]
    assert "@font-face" in svg


def test_missing_verovio_gives_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "verovio", None)
    with pytest.raises(AbcError, match="pip install verovio") as caught:
        engrave(read("song.abc"))
    assert caught.value.code == "missing-dependency"


def test_unparseable_text_is_refused_before_engraving():
    with pytest.raises(AbcError):
        engrave(read("polyphony_token.abc"))


def test_musicxml_has_two_parts_with_all_measures():
    root = ET.fromstring(to_musicxml(parse(read("song.abc"))))
    parts = root.findall("part")
    assert [p.get("id") for p in parts] == ["P1", "P2"]
    assert [len(p.findall("measure")) for p in parts] == [15, 15]
    assert len(root.findall(".//harmony")) == structure(read("song.abc"))["chord_count"]


@pytest.mark.parametrize("length, expected", [
    ("1", [("whole", 0)]), ("3/8", [("quarter", 1)]), ("7/16", [("quarter", 2)]), ("5/8", [("half", 0), ("eighth", 0)]),
])
def test_printable_pieces(length, expected):
    from fractions import Fraction

    assert [(name, dots) for _, name, dots in pieces(Fraction(length))] == expected
