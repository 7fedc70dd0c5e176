"""Break-it review, stop 56 (edit the lead sheet, re-render the same song): what the ABC editor's analyze route sends
with every edit, and chord symbols stacked on one note.

- The analyze answer carried the whole playback timeline — every note with its bar, line and column at full float
  precision, ≈ 100 bytes a note —: a 100 kB score of short notes answered 7.8 MB of JSON, sent on every edit. It
  now carries what web/abc_editor/synth.js plays (start, length and pitch, to the millisecond), at most 12,000 notes
  and chord symbols, with "cut_s" where playback stops when there are more.
- `"C""G"C16` (a user's; the planner writes one chord symbol a note) was not flagged, and the editor's playback
  skipped "C" (it lasts no time) without a word.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


from yue2_core.abc import analyze, timeline, validate
from yue2_core.abc.timeline import MAX_PLAYBACK_EVENTS

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = (REPO / "examples" / "text2music_lead_sheet.abc").read_text()
HEAD = EXAMPLE[:EXAMPLE.index("% verse")]


def _dense(groups: int) -> str:
    """`groups` groups of 4 bars of 32 thirty-second notes in each voice (the densest the dialect writes)."""
    group = "V: Vocal\n" + "|".join(["B" * 32] * 4) + "|\nV: Ins\n" + "|".join(["G" * 32] * 4) + "|\n"
    return HEAD + group * groups


def test_the_analyze_answer_sends_a_compact_capped_timeline():
    text = _dense(354)  # ≈ 100 kB, the editor's limit: 90,624 notes
    assert 99_000 < len(text.encode()) <= 100_000
    answer = analyze({"abc": text})
    size = len(json.dumps(answer))
    assert size < 800_000, size  # was 7,845,029 bytes
    played = answer["timeline"]
    notes = [n for voice in played["voices"].values() for n in voice]
    assert len(notes) + len(played["chords"]) <= MAX_PLAYBACK_EVENTS
    assert played["cut_s"] is not None and all(n["start_s"] < played["cut_s"] for n in notes)
    assert played["duration_s"] == timeline(text)["duration_s"]  # the score's own length, as before
    # a score under the cap: the same notes and chords as the full timeline, to the millisecond, and no cut
    full, sent = timeline(EXAMPLE), analyze({"abc": EXAMPLE})["timeline"]
    assert sent["cut_s"] is None and sent["tempo"] == full["tempo"] and sent["duration_s"] == full["duration_s"]
    for voice, notes in full["voices"].items():
        assert [set(n) for n in sent["voices"][voice]] == [{"start_s", "dur_s", "midi"}] * len(notes)
        assert [(round(n["start_s"], 3), round(n["dur_s"], 3), n["midi"]) for n in notes] == \
            [(n["start_s"], n["dur_s"], n["midi"]) for n in sent["voices"][voice]]
    assert [(round(c["start_s"], 3), c["midis"], c["symbol"]) for c in full["chords"]] == \
        [(c["start_s"], c["midis"], c["symbol"]) for c in sent["chords"]]


SYNTH = REPO / "web" / "abc_editor" / "synth.js"
SCRIPT = """
import { timelineEvents } from %(url)s;
const given = JSON.parse(await new Promise((done) => {
    let text = ""; process.stdin.on("data", (d) => { text += d; }); process.stdin.on("end", () => done(text));
}));
console.log(JSON.stringify(given.map((t) => timelineEvents(t).map((e) => [e.start, e.dur, e.midi, e.part]))));
"""


def test_the_editors_synth_plays_the_compact_timeline_as_the_full_one(tmp_path, node_js):
    """web/abc_editor/synth.js (run by node, no browser) turns the route's compact timeline into the same events as
    the full one, to the millisecond. Skipped without node (scripts/test.sh installs it)."""
    script = tmp_path / "synth.mjs"
    script.write_text(SCRIPT % {"url": repr(SYNTH.as_uri())}, "utf-8")
    given = json.dumps([timeline(EXAMPLE), analyze({"abc": EXAMPLE})["timeline"]])
    proc = subprocess.run([node_js, str(script)], input=given, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    full, compact = json.loads(proc.stdout)
    assert len(full) == len(compact) > 100
    assert [[round(e[0], 3), round(e[1], 3), *e[2:]] for e in full] == compact


def test_chord_symbols_stacked_on_one_note_get_one_warning_a_stack():
    two = EXAMPLE.replace('"G"z8B8B8A8|', '"C""G"z8B8B8A8|', 1)
    issues = validate(two)
    assert [(i.code, i.severity, i.line, i.column) for i in issues] == [("chord-symbol", "warning", 11, 4)]
    assert issues[0].message.startswith('2 chord symbols stand on one note or rest of bar 1: the harmony there is '
                                        'the last one, "G"; "C" sounds for no time'), issues[0].message
    assert analyze({"abc": two})["ok"] is True  # a warning: the score is used as written
    many = EXAMPLE.replace('"Em"G16E16|', 'G8"D""Em""Am""C"G8E16|', 1)  # mid-bar, a stack of four
    found = [i for i in validate(many) if i.code == "chord-symbol"]
    assert len(found) == 1 and '"D" and 2 more sound for no time' in found[0].message, found
    assert validate(EXAMPLE) == []  # one symbol a note (the planner's way) stays unflagged
