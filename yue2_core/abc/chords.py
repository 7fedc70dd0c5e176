"""Chord symbols: grammar, playback pitches and transposition.

Grammar [V]: root A-G with an optional #, ##, b or bb; a quality; an optional `/bass` spelled like a root.
Native qualities are `dialect.NATIVE_QUALITIES`; `dialect.EXTRA_QUALITIES` are understood but were never written by
the planner (the caller warns). Anything else is not a chord symbol (ABC annotations such as "^text" included).
"""

from __future__ import annotations

import re

from .dialect import CHORD_ROOT_OCTAVE_MIDI, EXTRA_QUALITIES, NATIVE_QUALITIES, NATURAL_PC
from .pitch import pitch_class_name, shift_letter, spell

_NAME = r"[A-G](?:##|bb|#|b)?"
_QUALITIES = sorted({**NATIVE_QUALITIES, **EXTRA_QUALITIES}, key=len, reverse=True)
_CHORD = re.compile(rf"(?P<root>{_NAME})(?P<quality>{'|'.join(re.escape(q) for q in _QUALITIES)})"
                    rf"(?:/(?P<bass>{_NAME}))?")


def split_chord(text: str) -> tuple[str, str, str] | None:
    """(root, quality, bass) of a chord symbol, bass "" when absent; None when `text` is not a chord symbol."""
    match = _CHORD.fullmatch(text)
    if match is None:
        return None
    return match["root"], match["quality"], match["bass"] or ""


def is_native_quality(quality: str) -> bool:
    """True when the vendor dialect lists `quality`."""
    return quality in NATIVE_QUALITIES


def name_pitch_class(name: str) -> int:
    """Pitch class 0..11 of a spelled name such as "Bb" or "F##"."""
    alter = name.count("#") - name.count("b")
    return (NATURAL_PC[name[0]] + alter) % 12


def chord_midis(root: str, quality: str, bass: str = "") -> list[int]:
    """Playback pitches: the root in the octave from C3 (MIDI 48) with the quality's intervals above it, and a slash
    bass one octave lower. Ascending."""
    intervals = NATIVE_QUALITIES.get(quality, EXTRA_QUALITIES.get(quality))
    base = CHORD_ROOT_OCTAVE_MIDI + name_pitch_class(root)
    pitches = [base + step for step in intervals]
    if bass:
        pitches.insert(0, CHORD_ROOT_OCTAVE_MIDI - 12 + name_pitch_class(bass))
    return pitches


def transpose_name(name: str, semitones: int, steps: int, choose) -> str:
    """Respell a root/bass name `steps` letters up, `semitones` higher in pitch class.
    `choose(name, pitch_class, letter, alter) -> (letter, alter)` has the last word on that spelling (alter None:
    that letter would need more than two accidentals)."""
    target = name_pitch_class(name) + semitones
    letter = shift_letter(name[0], steps)
    spelled = spell(60 + target % 12, letter)
    letter, alter = choose(name, target % 12, letter, None if spelled is None else spelled[1])
    return pitch_class_name(letter, alter)


def transpose_chord(text: str, semitones: int, steps: int, choose) -> str:
    """Chord symbol text moved by `semitones` (root and bass), letters moved by `steps`; quality kept."""
    root, quality, bass = split_chord(text)
    out = transpose_name(root, semitones, steps, choose) + quality
    if bass:
        out += "/" + transpose_name(bass, semitones, steps, choose)
    return out
