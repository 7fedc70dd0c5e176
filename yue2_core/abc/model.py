"""Data model of a parsed score. Every element keeps its source position (1-based line, 1-based column) so that
errors and edits can point at it. Lengths are `Fraction`s in units of the L: default length ("units"); pitches are
MIDI numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction


@dataclass
class HeaderField:
    """One header line `F:value` (for voices F is "V:Vocal" / "V:Ins")."""

    name: str
    value: str
    line: int
    raw: str


@dataclass
class Header:
    """Decoded header. meter = (numerator, denominator); unit = L: as a fraction of a whole note; tempo_beat = the Q:
    beat as a fraction of a whole note and bpm = beats per minute; key = one of `dialect.KEYS`."""

    fields: dict[str, HeaderField] = field(default_factory=dict)
    title: str = ""
    meter: tuple[int, int] = (4, 4)
    unit: Fraction = Fraction(1, 32)
    tempo_beat: Fraction = Fraction(1, 4)
    bpm: Fraction = Fraction(120)
    key: str = "C"
    end_line: int = 0  # last header line (1-based); the body starts after it


@dataclass
class Note:
    """A note or rest as written. kind: "note", "rest" (z/x) or "measure-rest" (Z/X, fills the bar).

    letter = the upper-case letter; written = letter + octave marks as written (e.g. "c'", "B,"); accidental = the
    written accidental text or ""; octave = scientific octave of the written note (`C` is C4, MIDI 60).
    length = sounding length in units after tuplet and broken-rhythm scaling; written_length = the length as written.
    onset = units from the start of the bar. pitch = sounding MIDI pitch (None for rests). tied = a `-` follows;
    tie_continues = this note continues the previous tied note (same sounding pitch, not a new attack).
    span = (start, end) columns of the whole token, 1-based, end exclusive; pitch_span = the accidental+letter+octave
    part that transposition rewrites.
    """

    kind: str
    line: int
    column: int
    span: tuple[int, int]
    written_length: Fraction
    length: Fraction
    onset: Fraction = Fraction(0)
    letter: str = ""
    written: str = ""
    accidental: str = ""
    octave: int = 0
    pitch: int | None = None
    pitch_span: tuple[int, int] = (0, 0)
    tied: bool = False
    tie_continues: bool = False
    tuplet: tuple[int, int] | None = None  # (p, q): p notes in the time of q
    tuplet_edge: str = ""  # "start" on the first note of a tuplet group, "stop" on its last (for engraving)
    broken: bool = False


@dataclass
class ChordSymbol:
    """A quoted chord symbol. root/bass are spelled names ("F#"), quality a key of the quality tables; native =
    quality in the vendor list. onset in units from the bar start."""

    text: str
    line: int
    column: int
    span: tuple[int, int]
    onset: Fraction
    root: str = ""
    quality: str = ""
    bass: str = ""
    native: bool = True
    known: bool = True


@dataclass
class InlineKey:
    """An inline `[K:key]` field inside a bar (value_span = the key text's columns)."""

    key: str
    line: int
    column: int
    span: tuple[int, int]
    value_span: tuple[int, int]
    onset: Fraction


@dataclass
class Bar:
    """One bar of one voice. number = 1-based bar number in the voice; expected = the meter's length in units;
    length = the sum of what is written; complete = closed by a bar line (an unterminated last bar is not).
    span = the columns of the bar's content between its bar lines. measure_rest_count > 0 for a `Z`/`Zn` bar
    (all bars expanded from one `Zn` share the span)."""

    voice: str
    number: int
    line: int
    column: int
    span: tuple[int, int]
    meter: tuple[int, int]
    expected: Fraction
    start: Fraction = Fraction(0)  # units from the start of the voice (sum of the actual lengths before it)
    length: Fraction = Fraction(0)
    complete: bool = True
    barline: str = "|"
    key: str = "C"  # key in force at the bar start
    notes: list[Note] = field(default_factory=list)
    chords: list[ChordSymbol] = field(default_factory=list)
    keys: list[InlineKey] = field(default_factory=list)
    measure_rest_count: int = 0
    readable: bool = True  # False when a token in the bar could not be read (its length is then not checked)

    @property
    def has_notes(self) -> bool:
        """True when the bar sounds at least one note."""
        return any(n.kind == "note" for n in self.notes)


@dataclass
class MusicLine:
    """One music line of a voice inside a group."""

    voice: str
    line: int
    bars: list[Bar] = field(default_factory=list)


@dataclass
class Group:
    """A V: Vocal / V: Ins pair of music lines. line = the line of its first selector. selectors maps voice -> the
    line of its V: selector; lines maps voice -> music lines (native: exactly one each)."""

    number: int
    line: int
    selectors: dict[str, int] = field(default_factory=dict)
    lines: dict[str, list[MusicLine]] = field(default_factory=dict)

    def bar_count(self, voice: str) -> int:
        """Number of bars `voice` has in this group (Z2..Z4 expanded)."""
        return sum(len(m.bars) for m in self.lines.get(voice, ()))


@dataclass
class Section:
    """A `% label` comment and the first bar (1-based) of the group it precedes."""

    label: str
    line: int
    first_bar: int


@dataclass
class FieldChange:
    """A body `M:` or `K:` line (name "M"/"K") taking effect at bar `from_bar` (1-based) of `voice`."""

    name: str
    value: str
    line: int
    voice: str
    from_bar: int


@dataclass
class LyricsLine:
    """A `w:` or `W:` line; voice = the voice of the music line it follows (None when none)."""

    kind: str
    text: str
    line: int
    voice: str | None


@dataclass
class AbcScore:
    """A parsed score. `lines` are the source lines without their line ends (split at LF, CR LF or CR); `voices`
    maps each voice name to its bars in order; `issues` are what parsing found (errors and warnings)."""

    text: str
    lines: list[str]
    header: Header
    groups: list[Group] = field(default_factory=list)
    voices: dict[str, list[Bar]] = field(default_factory=dict)
    sections: list[Section] = field(default_factory=list)
    changes: list[FieldChange] = field(default_factory=list)
    lyrics: list[LyricsLine] = field(default_factory=list)
    issues: list = field(default_factory=list)
    truncated: bool = False

    def notes(self, voice: str):
        """Every written note/rest event of `voice` with its bar, in order."""
        for bar in self.voices.get(voice, ()):
            for note in bar.notes:
                yield bar, note

    @property
    def errors(self) -> list:
        """The error-level issues."""
        return [i for i in self.issues if i.severity == "error"]
