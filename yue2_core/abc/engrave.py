"""`engrave(text)`: SVG of the score and a time map for cursor following (optional dependency: verovio).

Route, chosen by trying them (verovio 6.4, music21 10.5): Verovio's own ABC import draws one voice only (it logs
"Multi-voice music is not supported"); music21's ABC import merges both voices into one part and loses `Z2` bar rests.
So the score is parsed by this package, written as MusicXML (`musicxml.py`), engraved by Verovio, and the SVG is
passed through the allow-list sanitiser (`svg.py`). Install: `pip install verovio`.
"""

from __future__ import annotations

import os
import threading

from .dialect import VOICES
from .errors import AbcError
from .musicxml import to_musicxml
from .parser import parse
from .svg import sanitize_svg
from .timing import seconds_per_unit

INSTALL_HINT = "Engraving needs the optional package verovio: pip install verovio"
_LOCK = threading.Lock()  # one Verovio toolkit per call, but Verovio's resource loading is not re-entrant


def _toolkit():
    try:
        import verovio
    except ImportError:
        raise AbcError(INSTALL_HINT, code="missing-dependency") from None
    return verovio


def engrave(text: str, *, page_width: int = 2100, scale: int = 40) -> dict:
    """Engrave a score that parses (raises `AbcError` otherwise, or when verovio is missing).

    page_width in Verovio units (tenths of a staff space at scale 100); scale in percent. Returns
    {"svg": the sanitised SVG — one document, one page of at most `PAGE_HEIGHT` units (a score that needs more
    raises AbcError code "too-large-to-engrave") —, "pages": [that svg], "time_map": [{id, voice, kind
    ("note"/"rest"), start_s, dur_s, line, col}] with ids that exist in the SVG (see `musicxml`), "engine":
    "verovio <version>"}. Times use the score's Q: tempo and actual bar lengths, like `timeline`.
    """
    return render(parse(text), page_width=page_width, scale=scale)


# Engraving holds the Python lock (Verovio is native code, one core), so it is bounded to keep the editor's answer
# under ~3 s: measured 2026-12-01 on the CI's 2-core machine as CPU time of the whole analyze route, the worst scores
# inside these limits (every note with an accidental and a chord symbol, one bar per line; 32 notes a bar in 4/4 or
# 48 in 12/8) took 1.7-2.0 s; the earlier limits (128 a bar, 6,000 in all) took ~3.9 s, and 64 a bar with 4,000 in
# all up to 3.3 s (tests/abc/test_abc_editor_inputs.py).
MAX_NOTES_PER_BAR = 48  # a bar at L:1/32 holds one native note per unit: 32 in 4/4, 48 in 6/4 or 12/8
MAX_NOTES = 3000  # both voices; a generated 6-minute song has ~2,000 (≈ 130 bars × 2 voices × ~8 notes)
# Verovio's tallest page (its maximum pageHeight; adjustPageHeight trims it to the music). The default, 2,970 (A4),
# broke a score of ≥ ~50 bars into pages, and the pages joined by newlines were no SVG document the editor could show
# ("The score could not be engraved."; break-it review, stop 45). At this height the longest scores within
# MAX_NOTES (1,500 one-note bars per voice, each with a chord symbol) take ~22,000 of the 24,000 units at scale 40
# with notes on the staff; notes far off it make every system taller (1,500 bars of "Cmaj7"c'' over C,: two pages, said
# in svg_error — review rd45), so a score that long may still not be drawn.
PAGE_HEIGHT = 60_000


def check_size(score) -> None:
    """Refuse to engrave scores whose size would stall the caller (Verovio runs native code without releasing the
    Python lock: 8,000 notes in one bar take ~50 s). Raises AbcError(code="too-large-to-engrave")."""
    totals = {"notes": 0, "chord symbols": 0}
    for voice, bars in score.voices.items():
        for bar in bars:
            # chord symbols too: Verovio's time for symbols stacked on one note grows with their square — 33,000
            # `"C"` before one note (a 100 kB paste) held the server for 265 s (break-it review, stop 55)
            for what, n in (("notes", len(bar.notes)), ("chord symbols", len(bar.chords))):
                totals[what] += n
                if n > MAX_NOTES_PER_BAR:
                    raise AbcError(f"bar {bar.number} of voice {voice} has {n} {what}; the engraver draws at most "
                                   f"{MAX_NOTES_PER_BAR} per bar (the text is still checked)",
                                   code="too-large-to-engrave", line=bar.line)
    for what, n in totals.items():
        if n > MAX_NOTES:
            raise AbcError(f"the score has {n} {what}; the engraver draws at most {MAX_NOTES} (the text is still "
                           "checked)", code="too-large-to-engrave")


def render(score, *, page_width: int = 2100, scale: int = 40) -> dict:
    """`engrave` for an already parsed score (raises AbcError for scores too large to engrave, see `check_size`)."""
    check_size(score)
    verovio = _toolkit()
    xml = to_musicxml(score)
    with _LOCK:
        toolkit = verovio.toolkit()
        # Verovio's default resource path is set per thread at import time: set it for this toolkit explicitly so
        # engraving works from any thread (ComfyUI runs nodes and routes outside the importing thread)
        toolkit.setResourcePath(os.path.join(os.path.dirname(verovio.__file__), "data"))
        toolkit.setOptions({"pageWidth": page_width, "pageHeight": PAGE_HEIGHT, "scale": scale,
                            "adjustPageHeight": True, "header": "none", "footer": "none", "svgViewBox": True,
                            "breaks": "auto"})
        if not toolkit.loadData(xml):
            raise AbcError(f"Verovio could not read the score: {toolkit.getLog()[:300]}", code="engrave")
        count = toolkit.getPageCount()
        if count != 1:  # the editor shows one SVG document: pages joined were not one (break-it review, stop 45)
            raise AbcError(f"the score needs {count} pages of engraving; the editor draws one page ({PAGE_HEIGHT:,} "
                           "Verovio units tall) — the text is still checked and plays", code="too-large-to-engrave")
        pages = [sanitize_svg(toolkit.renderToSVG(1))]
        version = toolkit.getVersion()
    return {"svg": pages[0], "pages": pages, "time_map": time_map(score), "engine": f"verovio {version}"}


def time_map(score) -> list[dict]:
    """Every written note/rest with its SVG id and its time in seconds, in time order."""
    per_unit = seconds_per_unit(score.header)
    entries = []
    for voice in VOICES:
        for index, (bar, note) in enumerate(score.notes(voice)):
            entries.append({"id": f"{voice}-{index}", "voice": voice,
                            "kind": "note" if note.kind == "note" else "rest",
                            "start_s": float((bar.start + note.onset) * per_unit),
                            "dur_s": float(note.length * per_unit), "line": note.line, "col": note.column})
    entries.sort(key=lambda e: (e["start_s"], e["voice"]))
    return entries
