"""Time arithmetic: units of L: to seconds through the Q: tempo.

seconds per unit = (L as a whole-note fraction ÷ Q beat as a whole-note fraction) × 60 ÷ BPM. All results are exact
`Fraction`s; callers convert to float at the edge.
"""

from __future__ import annotations

from fractions import Fraction

from .dialect import VOICES
from .model import AbcScore, Header


def seconds_per_unit(header: Header) -> Fraction:
    """Seconds one L: unit lasts at the header tempo."""
    return header.unit / header.tempo_beat * 60 / header.bpm


def voice_units(score: AbcScore, voice: str) -> Fraction:
    """Total written length of `voice` in units: the sum of its actual bar lengths (a short bar counts short)."""
    return sum((bar.length for bar in score.voices.get(voice, ())), Fraction(0))


def score_seconds(score: AbcScore) -> Fraction:
    """Estimated length in seconds: the longer voice's summed bar lengths at the header tempo."""
    units = max((voice_units(score, v) for v in VOICES), default=Fraction(0))
    return units * seconds_per_unit(score.header)


def beats_per_bar(meter: tuple[int, int], beat: Fraction) -> Fraction:
    """Q: beats in one bar of `meter` (4/4 with a quarter beat -> 4; 6/8 with a quarter beat -> 3)."""
    return Fraction(*meter) / beat
