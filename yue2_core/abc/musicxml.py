"""Write a parsed score as MusicXML 4.0 (partwise), for engraving with Verovio.

Why our own writer: Verovio's ABC import renders one voice only ("Multi-voice music is not supported"), and
music21 10.5's ABC import folds `V: Vocal` and `V: Ins` into one part and drops `Z2`-style bar rests. MusicXML built
from our parse keeps both voices, chord symbols, ties and tuplets exactly.

Every written note/rest gets an id "<voice>-<n>" (n = its 0-based index in `AbcScore.notes(voice)`); Verovio keeps
these ids in the SVG, which is how `engrave`'s time map points at notes. Extra pieces of a note that needs several
printed values get "<voice>-<n>-<k>".
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from fractions import Fraction

from .dialect import KEYS, MINOR_KEYS, VOICES
from .model import AbcScore, Bar, Note
from .pitch import natural_midi, signature

_TYPES = [(Fraction(2), "breve"), (Fraction(1), "whole"), (Fraction(1, 2), "half"), (Fraction(1, 4), "quarter"),
          (Fraction(1, 8), "eighth"), (Fraction(1, 16), "16th"), (Fraction(1, 32), "32nd"), (Fraction(1, 64), "64th"),
          (Fraction(1, 128), "128th"), (Fraction(1, 256), "256th")]
# Printable values (whole-note fractions) with 0-2 dots, largest first.
_VALUES = sorted(((base * (2 - Fraction(1, 2 ** dots)), name, dots) for base, name in _TYPES for dots in range(3)),
                 reverse=True)
_ACCIDENTAL_NAMES = {2: "double-sharp", 1: "sharp", 0: "natural", -1: "flat", -2: "flat-flat"}
_KINDS = {"": "major", "m": "minor", "dim": "diminished", "aug": "augmented", "7": "dominant",
          "maj7": "major-seventh", "m7": "minor-seventh", "dim7": "diminished-seventh", "m7b5": "half-diminished",
          "sus4": "suspended-fourth", "sus2": "suspended-second", "6": "major-sixth", "m6": "minor-sixth"}


def pieces(length: Fraction) -> list[tuple[Fraction, str, int]]:
    """Split a whole-note length into printable (value, type, dots) pieces, largest first; a remainder too small to
    print is added to the last piece's value (its duration stays exact, its symbol approximate)."""
    out = []
    remaining = length
    for value, name, dots in _VALUES:
        while remaining >= value:
            out.append((value, name, dots))
            remaining -= value
    if remaining and out:
        value, name, dots = out[-1]
        out[-1] = (value + remaining, name, dots)
    return out or [(length, "256th", 0)]


def to_musicxml(score: AbcScore) -> str:
    """MusicXML text of `score` (two parts, Vocal and Ins; the title is not written)."""
    writer = _Writer(score)
    return writer.write()


class _Writer:
    def __init__(self, score: AbcScore):
        self.score = score
        self.unit = score.header.unit
        quarters = [self._quarters(n.length) for v in VOICES for _, n in score.notes(v)]
        quarters += [self._quarters(c.onset) for v in VOICES for bar in score.voices[v] for c in bar.chords]
        quarters += [self._quarters(bar.expected) for v in VOICES for bar in score.voices[v]]
        self.divisions = math.lcm(*(q.denominator for q in quarters)) if quarters else 1

    def _quarters(self, units: Fraction) -> Fraction:
        return units * self.unit * 4

    def _duration(self, units: Fraction) -> str:
        return str(int(self._quarters(units) * self.divisions))

    def write(self) -> str:
        root = ET.Element("score-partwise", version="4.0")
        part_list = ET.SubElement(root, "part-list")
        measures = max(len(self.score.voices[v]) for v in VOICES)
        for number, voice in enumerate(VOICES, 1):
            part = ET.SubElement(part_list, "score-part", id=f"P{number}")
            ET.SubElement(part, "part-name").text = voice
        for number, voice in enumerate(VOICES, 1):
            part = ET.SubElement(root, "part", id=f"P{number}")
            self._part(part, voice, measures, first_part=number == 1)
        body = ET.tostring(root, encoding="unicode")
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + body

    def _part(self, part: ET.Element, voice: str, measures: int, first_part: bool) -> None:
        bars = self.score.voices[voice]
        pitches = sorted(n.pitch for _, n in self.score.notes(voice) if n.kind == "note")
        bass = bool(pitches) and pitches[len(pitches) // 2] < 57
        index = 0
        previous: Bar | None = None
        for number in range(measures):
            measure = ET.SubElement(part, "measure", number=str(number + 1))
            if number < len(bars):
                bar = bars[number]
                self._attributes(measure, bar, previous, bass)
                if number == 0 and first_part:
                    self._tempo(measure)
                index = self._bar(measure, bar, voice, index)
                previous = bar
            else:
                other = self.score.voices[VOICES[1 - VOICES.index(voice)]][number]
                if number == 0:
                    self._attributes(measure, other, None, bass)
                rest = ET.SubElement(measure, "note")
                ET.SubElement(rest, "rest", measure="yes")
                ET.SubElement(rest, "duration").text = self._duration(other.length)

    def _attributes(self, measure, bar: Bar, previous: Bar | None, bass: bool) -> None:
        if previous is not None and previous.key == bar.key and previous.meter == bar.meter \
                and not previous.keys:
            return
        attributes = ET.SubElement(measure, "attributes")
        if previous is None:
            ET.SubElement(attributes, "divisions").text = str(self.divisions)
        self._key(attributes, bar.key)
        time = ET.SubElement(attributes, "time")
        ET.SubElement(time, "beats").text = str(bar.meter[0])
        ET.SubElement(time, "beat-type").text = str(bar.meter[1])
        if previous is None:
            clef = ET.SubElement(attributes, "clef")
            ET.SubElement(clef, "sign").text = "F" if bass else "G"
            ET.SubElement(clef, "line").text = "4" if bass else "2"

    @staticmethod
    def _key(parent, key: str) -> None:
        element = ET.SubElement(parent, "key")
        ET.SubElement(element, "fifths").text = str(KEYS[key])
        ET.SubElement(element, "mode").text = "minor" if key in MINOR_KEYS else "major"

    def _tempo(self, measure) -> None:
        header = self.score.header
        direction = ET.SubElement(measure, "direction", placement="above")
        kind = ET.SubElement(direction, "direction-type")
        metronome = ET.SubElement(kind, "metronome")
        value = pieces(header.tempo_beat)[0]
        ET.SubElement(metronome, "beat-unit").text = value[1]
        for _ in range(value[2]):
            ET.SubElement(metronome, "beat-unit-dot")
        ET.SubElement(metronome, "per-minute").text = f"{float(header.bpm):g}"
        quarter_bpm = header.bpm * header.tempo_beat * 4
        ET.SubElement(direction, "sound", tempo=f"{float(quarter_bpm):g}")

    def _bar(self, measure, bar: Bar, voice: str, index: int) -> int:
        chords = sorted(bar.chords, key=lambda c: c.onset)
        keys = list(bar.keys)
        sig = signature(bar.key)
        shown: dict[tuple[str, int], int] = {}
        for note in bar.notes:
            while keys and keys[0].onset <= note.onset:
                key = keys.pop(0).key
                attributes = ET.SubElement(measure, "attributes")
                self._key(attributes, key)
                sig, shown = signature(key), {}
            while chords and chords[0].onset < note.onset + note.length:
                chord = chords.pop(0)
                if chord.known:
                    self._harmony(measure, chord, max(chord.onset - note.onset, Fraction(0)))
            self._note(measure, note, f"{voice}-{index}", sig, shown)
            index += 1
        for chord in chords:
            if chord.known:
                self._harmony(measure, chord, Fraction(0))
        return index

    def _harmony(self, measure, chord, offset: Fraction) -> None:
        harmony = ET.SubElement(measure, "harmony")
        root = ET.SubElement(harmony, "root")
        ET.SubElement(root, "root-step").text = chord.root[0]
        alter = chord.root.count("#") - chord.root.count("b")
        if alter:
            ET.SubElement(root, "root-alter").text = str(alter)
        kind = ET.SubElement(harmony, "kind", text=chord.quality)
        kind.text = _KINDS.get(chord.quality, "other")
        if chord.bass:
            bass = ET.SubElement(harmony, "bass")
            ET.SubElement(bass, "bass-step").text = chord.bass[0]
            bass_alter = chord.bass.count("#") - chord.bass.count("b")
            if bass_alter:
                ET.SubElement(bass, "bass-alter").text = str(bass_alter)
        if offset:
            ET.SubElement(harmony, "offset").text = self._duration(offset)

    def _note(self, measure, note: Note, ident: str, sig, shown) -> None:
        if note.kind == "measure-rest":
            element = ET.SubElement(measure, "note", id=ident)
            ET.SubElement(element, "rest", measure="yes")
            ET.SubElement(element, "duration").text = self._duration(note.length)
            return
        scale = Fraction(note.tuplet[1], note.tuplet[0]) if note.tuplet else Fraction(1)
        written = note.length * self.unit / scale
        parts = pieces(written)
        for position, (value, name, dots) in enumerate(parts):
            element = ET.SubElement(measure, "note", id=ident if position == 0 else f"{ident}-{position}")
            if note.kind == "note":
                self._pitch(element, note)
            else:
                ET.SubElement(element, "rest")
            ET.SubElement(element, "duration").text = str(int(value * scale * 4 * self.divisions))
            ties = []
            if note.kind == "note":
                if position > 0 or note.tie_continues:
                    ties.append("stop")
                if position < len(parts) - 1 or note.tied:
                    ties.append("start")
            for kind in ties:
                ET.SubElement(element, "tie", type=kind)
            ET.SubElement(element, "type").text = name
            for _ in range(dots):
                ET.SubElement(element, "dot")
            if note.kind == "note" and position == 0:
                self._accidental(element, note, shown, sig)
            if note.tuplet:
                modification = ET.SubElement(element, "time-modification")
                ET.SubElement(modification, "actual-notes").text = str(note.tuplet[0])
                ET.SubElement(modification, "normal-notes").text = str(note.tuplet[1])
            edges = []
            if note.tuplet and "start" in note.tuplet_edge and position == 0:
                edges.append("start")
            if note.tuplet and "stop" in note.tuplet_edge and position == len(parts) - 1:
                edges.append("stop")
            if ties or edges:
                notations = ET.SubElement(element, "notations")
                for kind in ties:
                    ET.SubElement(notations, "tied", type=kind)
                for kind in edges:
                    ET.SubElement(notations, "tuplet", type=kind, bracket="yes")

    @staticmethod
    def _pitch(element, note: Note) -> None:
        pitch = ET.SubElement(element, "pitch")
        ET.SubElement(pitch, "step").text = note.letter
        alter = note.pitch - natural_midi(note.letter, note.octave)
        if alter:
            ET.SubElement(pitch, "alter").text = str(alter)
        ET.SubElement(pitch, "octave").text = str(note.octave)

    @staticmethod
    def _accidental(element, note: Note, shown, sig) -> None:
        """Printed accidental by engraving convention (per octave, per measure), not the dialect's letter rule."""
        if note.tie_continues:
            return
        alter = note.pitch - natural_midi(note.letter, note.octave)
        place = (note.letter, note.octave)
        if alter != shown.get(place, sig[note.letter]) and alter in _ACCIDENTAL_NAMES:
            ET.SubElement(element, "accidental").text = _ACCIDENTAL_NAMES[alter]
        shown[place] = alter
