"""ABC lead sheets of YuE2-3B: parse, validate, describe, play, edit and engrave the native two-voice dialect.

The planner writes a fixed dialect (runtime.md §1.6; vendor `abc_tools.py`): a header `X:1`, `T:`, `M:n/d`,
`L:1/32`, `Q:1/4=BPM`, two literal voice definitions, `K:key`; then groups of `% section` comments, a `V: Vocal`
music line (melody, chord symbols) and a `V: Ins` music line with the same number of bars. `dialect.py` lists
every fact with its source. Framework-free: no torch, no ComfyUI; engraving optionally uses verovio.

Public API:
    parse(text) -> AbcScore                 strict parser (raises AbcError)
    validate(text, *, instrumental, max_seconds) -> list[Issue]
    structure(text) -> dict                 key, meter, tempo, sections, bars, duration, chords, notes
    timeline(text) -> dict                  notes and chords in seconds for a browser synth
    transpose(text, semitones) / set_tempo(text, bpm) / strip_chords(text) / silence_vocal(text)
    engrave(text) -> dict                   sanitised SVG + time map (needs verovio)
    analyze(payload) -> dict                the HTTP route's pure function (service.py)
"""

from .engrave import engrave
from .errors import AbcError, Issue
from .model import AbcScore
from .parser import parse
from .service import analyze
from .structure import structure
from .timeline import timeline
from .tools import set_tempo, silence_vocal, strip_chords
from .transpose import transpose
from .validate import validate

__all__ = ["AbcError", "AbcScore", "Issue", "analyze", "engrave", "parse", "set_tempo", "silence_vocal",
           "strip_chords", "structure", "timeline", "transpose", "validate"]
