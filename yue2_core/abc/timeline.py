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
