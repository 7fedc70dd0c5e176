"""`timeline(text)`: what a browser synth needs to play the score — notes and chord symbols in seconds."""

from __future__ import annotations

from fractions import Fraction

from .chords import chord_midis
from .dialect import VOICES
from .parser import parse
from .timing import score_seconds, seconds_per_unit


def timeline(text: str) -> dict:
    """Playback timeline of a score that parses (raises `AbcError` otherwise).

    Returns {"tempo": {"bpm", "beat"}, "duration_s", "voices": {voice: [note]}, "chords": [chord]} where a note is
    {start_s, dur_s, midi, bar, line, col} (tied notes merged into one, positioned at the first; rests omitted) and
    a chord is {start_s, dur_s, midis, symbol, voice, bar, line, col}: it sounds from its onset until the next chord
    symbol of the same voice or the end of the score; midis from `chords.chord_midis` (root from C3, slash bass
    below). Times follow the actual bar lengths (a short bar is played short); repeats are played once.
    """
    return play(parse(text))


def play(score) -> dict:
    """`timeline` for an already parsed score."""
    per_unit = seconds_per_unit(score.header)
    end = score_seconds(score)
    voices: dict[str, list[dict]] = {}
    chords: list[dict] = []
    for voice in VOICES:
        notes: list[dict] = []
        open_tie: dict | None = None
        events: list[tuple[Fraction, dict]] = []
        for bar in score.voices[voice]:
            for note in bar.notes:
                start = (bar.start + note.onset) * per_unit
                if note.kind != "note":
                    open_tie = None
                    continue
                if note.tie_continues and open_tie is not None:
                    open_tie["_end"] = start + note.length * per_unit
                else:
                    open_tie = {"_start": start, "_end": start + note.length * per_unit, "midi": note.pitch,
                                "bar": bar.number, "line": note.line, "col": note.column}
                    notes.append(open_tie)
                if not note.tied:
                    open_tie = None
            for chord in bar.chords:
                if chord.known:
                    events.append((bar.start + chord.onset, {"symbol": chord.text, "voice": voice, "bar": bar.number,
                                                             "line": chord.line, "col": chord.column,
                                                             "midis": chord_midis(chord.root, chord.quality,
                                                                                  chord.bass)}))
        voices[voice] = [_seconds(n) for n in notes]
        for index, (onset, chord) in enumerate(events):
            stop = events[index + 1][0] * per_unit if index + 1 < len(events) else end
            start = onset * per_unit
            chords.append({"start_s": float(start), "dur_s": float(max(stop - start, Fraction(0))), **chord})
    chords.sort(key=lambda c: c["start_s"])
    header = score.header
    return {"tempo": {"bpm": float(header.bpm), "beat": f"{header.tempo_beat.numerator}/"
                                                        f"{header.tempo_beat.denominator}"},
            "duration_s": float(end), "voices": voices, "chords": chords}


def _seconds(note: dict) -> dict:
    start, stop = note.pop("_start"), note.pop("_end")
    return {"start_s": float(start), "dur_s": float(stop - start), **note}


MAX_PLAYBACK_EVENTS = 12_000  # notes + chord symbols the editor's route sends (a dense 6-minute song: ~2,000)


def playback(score, max_events: int = MAX_PLAYBACK_EVENTS) -> dict:
    """`play` as the editor's analyze route sends it with every edit: what web/abc_editor/synth.js reads and no more
    — notes {start_s, dur_s, midi}, chords {start_s, dur_s, midis, symbol}, times rounded to the millisecond — and
    at most `max_events` notes and chord symbols, the earliest: when there are more, "cut_s" is the second the
    first one left out starts (every event starting before it is kept, and held until "cut_s" at most; the synth
    stops there and the editor says so), else None. Before (break-it review, stop 56): the whole timeline with
    bars, lines and columns at full float precision, ≈ 100 bytes a note — a 100 kB score of short notes answered
    7.8 MB of JSON at each edit."""
    full = play(score)
    starts = sorted([n["start_s"] for notes in full["voices"].values() for n in notes]
                    + [c["start_s"] for c in full["chords"]])
    cut = starts[max_events] if len(starts) > max_events else None

    def kept(event: dict) -> bool:
        return cut is None or event["start_s"] < cut

    def times(event: dict) -> dict:  # a note or chord held over the cut stops there (diff review, stop 56: a tied
        # note or a chord kept sounding past the "Playing the first …" the editor said, up to the next chord symbol)
        dur = event["dur_s"] if cut is None else min(event["dur_s"], cut - event["start_s"])
        return {"start_s": round(event["start_s"], 3), "dur_s": round(dur, 3)}

    voices = {voice: [{**times(n), "midi": n["midi"]} for n in notes if kept(n)]
              for voice, notes in full["voices"].items()}
    chords = [{**times(c), "midis": c["midis"], "symbol": c["symbol"]} for c in full["chords"] if kept(c)]
    return {"tempo": full["tempo"], "duration_s": full["duration_s"], "voices": voices, "chords": chords,
            "cut_s": None if cut is None else round(cut, 3)}
