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
    assert answer["svg_error"].startswith("the score needs 3 pages of engraving; the editor draws one page "
                                          "(2,970 "), answer


EDITOR_HARNESS = r'''
from types import SimpleNamespace
from yue2_nodes import editor
score, new = "X:1\nK:C\n", "X:1\nK:D\n"
out = {}
shapes = {"subgraph id a list": {"definitions": {"subgraphs": [{"id": [1], "nodes": []}]}, "nodes": []},
          "subgraph id an object": {"definitions": {"subgraphs": [{"id": {"a": 1}}]}, "nodes": []},
          "node type a list": {"nodes": [{"id": 5, "type": ["sg-1"]}]},
          "node type an object": {"definitions": {"subgraphs": []}, "nodes": [{"id": 5, "type": {}}]}}
for name, workflow in shapes.items():
    try:
        out[name] = editor._holds_previous_score(score, new, {"workflow": {"id": "w", **workflow}}, "5:3")
    except Exception as exc:
        out[name] = f"{type(exc).__name__}: {exc}"
# the good subgraph is still found beside a malformed entry
sub = {"id": "sg-1", "nodes": [{"id": 3, "properties": {"yue2_composer_abc": score}}]}
good = {"workflow": {"id": "w", "nodes": [{"id": 5, "type": "sg-1"}],
                     "definitions": {"subgraphs": [{"id": [1]}, sub]}}}
out["found beside"] = editor._holds_previous_score(score, new, good, "5:3")
# the node itself, as ComfyUI's executor runs it: the box holds a score, another one arrives
editor.YuE2ABCEditor.hidden = SimpleNamespace(extra_pnginfo={"workflow": {"id": "w", **shapes["subgraph id a list"]}},
                                              unique_id="5:3")
head = "X:1\nT:\nM:4/4\nL:1/32\nQ:1/4=100\nV: Vocal clef=treble\nV: Ins clef=treble\n"
try:
    result = editor.YuE2ABCEditor.execute(head + "K:C\n% verse\nV: Vocal\nc32|\nV: Ins\nC32|\n", None,
                                          head + "K:D\n% verse\nV: Vocal\nd32|\nV: Ins\nD32|\n")
    out["node"] = result.result[1]
except Exception as exc:
    out["node"] = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps(out))
'''


def test_a_workflow_with_malformed_subgraph_entries_does_not_stop_the_editor(comfy_host, tmp_path):
    """The workflow ComfyUI's frontend sends with a prompt (extra_pnginfo) is read by the ABC Editor node to tell a
    stale box from an edited one. A hand-edited or generated workflow whose `definitions.subgraphs` holds an entry
    with a list or object `id` (or a node whose `type` is one) stopped the node whenever its box held a score and
    another arrived: `TypeError: unhashable type: 'list'` — the whole run lost over metadata. Now such entries are
    no match (the plain rule, the box wins), and a well-formed subgraph beside them is still found."""
    from pack_in_host import run_in_host

    (tmp_path / "checkpoints").mkdir()
    out = run_in_host(EDITOR_HARNESS, comfy_host, REPO, tmp_path / "checkpoints")
    for name in ("subgraph id a list", "subgraph id an object", "node type a list", "node type an object"):
        assert out[name] is False, (name, out[name])  # was: "TypeError: unhashable type: 'list'" / 'dict'
    assert out["found beside"] is True
    assert "K:C\n" in out["node"], out["node"]  # the box's score (was: TypeError, the run stopped)


def test_a_saved_song_folder_and_its_rename_are_synced_to_disk(tmp_path, monkeypatch):
    """A song is written into a hidden sibling, each file fsynced, then renamed into place — but neither the new
    folder's entries nor the rename were synced: after a crash or power cut soon after "saved", the folder could be
    gone (or hold entries without their files) although every file's data was on disk. Now the folder is fsynced
    before the rename and its parent after it; a file system that cannot sync a folder (EINVAL) still saves."""
    import errno
    import os

    from robust_helpers import make_song
    from yue2_core.artifacts import load_song, save_song

    events = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(path):
            events.append(("fsync folder", path))
        return real_fsync(fd)

    def rename(src, dst):
        events.append(("rename", str(dst)))
        return real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    out = save_song(make_song(), tmp_path / "songs" / "mine")
    kinds = [kind for kind, _ in events]
    assert kinds == ["fsync folder", "rename", "fsync folder"], events  # was: ["rename"]
    assert events[0][1].startswith(str(tmp_path / "songs" / ".mine.")) and events[0][1].endswith(".partial")
    assert events[2][1] == str(tmp_path / "songs")

    def no_folder_sync(fd):
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", no_folder_sync)
    assert load_song(save_song(make_song(), tmp_path / "songs" / "other")).tokens.codes
    assert load_song(out).tokens.codes
