"""`transpose(text, semitones)`: move every note, chord symbol and key by a number of semitones.

Spelling: the key moves to the key with the fewest accidentals on the new tonic (`pitch.transpose_key`); every note
and chord root/bass moves by the same number of letters as the tonic, so the music keeps its shape on the page (a
raised 4th stays a raised 4th), and a round trip gives the text back. So a double sharp or flat appears only where
the new key's own degree needs one (a raised 5th in B major is F##). When the new key could be spelled either way
(F#/Gb, D#m/Ebm: six accidentals each), the side that writes fewer double accidentals wins — then the one writing
fewer accidentals, then the old key's side —, so the side follows the score's spelling, not the path: twelve +1
steps equal one octave up, and a -1 step after a +1 step gives the text back, where keeping the old key's side
flipped F# to Gb (writing every lowered note as a double flat) and back. A spelling that would need more than two
accidentals falls back to the plainest spelling in the new key — so a score that itself writes double accidentals
(K:F with ^^C) can come back respelled from a round trip through such a key (=D: the same pitch). Accidentals are written where the new key and the
dialect's bar-wide, across-octave accidental rule [V] need them, and kept where the original wrote one (courtesy
accidentals survive).
"""

from __future__ import annotations

from .chords import transpose_chord
from .dialect import VOICES
from .edits import Edit, apply_edits
from .errors import AbcError
from .parser import parse
from .pitch import (
    accidental_text,
    is_tie_key,
    letter_steps,
    shift_letter,
    signature,
    simplest_spelling,
    spell,
    transpose_key,
    write_note_name,
)


def transpose(text: str, semitones: int) -> str:
    """`text` with notes, chord symbols and K: keys (header, body K: lines, inline [K:]) moved by `semitones`
    (an int from -48 to 48). Everything else is kept byte for byte. Raises `AbcError` if the text does not parse or
    a note would leave MIDI 0..127."""
    if isinstance(semitones, bool) or not isinstance(semitones, int) or not -48 <= semitones <= 48:
        raise AbcError(f"semitones must be a whole number from -48 to 48, got {semitones!r}.", code="argument")
    score = parse(text, edit=True)
    if semitones == 0:
        return text
    ties = [None]
    if any(is_tie_key(transpose_key(key, semitones)) for key in _keys(score)):
        ties += ["sharps", "flats"]
    best = None
    for tie in ties:
        speller = _Speller(tie)
        edits = _edits(score, semitones, speller)
        rank = (speller.doubles, speller.accidentals)
        if best is None or rank < best[0]:
            best = (rank, edits)
    result = apply_edits(text, best[1])
    _check(score, parse(result, edit=True), semitones)
    return result


def _keys(score) -> set[str]:
    keys = {score.header.key} | {c.value for c in score.changes if c.name == "K"}
    for voice in VOICES:
        for bar in score.voices[voice]:
            keys.add(bar.key)
            keys.update(inline.key for inline in bar.keys)
    return keys


class _Speller:
    """How one transposition spells: the side of a tie key, and counts of what it wrote (to compare the sides)."""

    def __init__(self, tie: str | None):
        self.tie = tie
        self.doubles = 0  # double (or triple) accidentals the letter shift would write, respelled or kept
        self.accidentals = 0  # accidentals written on notes

    def key(self, key: str, semitones: int) -> str:
        return transpose_key(key, semitones, self.tie)

    def note(self, midi: int, letter: str, alter: int | None, new_key: str) -> tuple[str, int, int]:
        """(letter, octave, alter) for the target `midi`: the letter-shifted spelling, or (`alter` None: that letter
        would need three accidentals) the plainest one in `new_key`."""
        if alter is None:
            self.doubles += 1
            return simplest_spelling(midi, new_key)
        self.doubles += abs(alter) == 2
        return letter, spell(midi, letter)[0], alter

    def chord(self, new_key: str):
        def choose(name: str, pitch_class: int, letter: str, alter: int | None) -> tuple[str, int]:
            found = self.note(60 + pitch_class, letter, alter, new_key)
            return found[0], found[2]
        return choose


def _edits(score, semitones: int, speller: _Speller) -> list[Edit]:
    edits: list[Edit] = []
    key_line = score.header.fields["K"]
    edits.append(_value_edit(key_line.line, key_line.raw, 2, speller.key(score.header.key, semitones)))
    for line, value in sorted({(c.line, c.value) for c in score.changes if c.name == "K"}):
        edits.append(_value_edit(line, score.lines[line - 1].rstrip("\r"), 2, speller.key(value, semitones)))
    for voice in VOICES:
        edits += _voice_edits(score, voice, semitones, speller)
    return edits


def _value_edit(line: int, raw: str, start: int, new_value: str) -> Edit:
    """Replace the stripped value after `F:` (0-based offset `start`) keeping surrounding spaces."""
    value = raw[start:]
    lead = len(value) - len(value.lstrip())
    core = value.strip()
    begin = start + lead + 1
    return Edit(line, begin, begin + len(core), new_value)


def _voice_edits(score, voice: str, semitones: int, speller: _Speller) -> list[Edit]:
    edits: list[Edit] = []
    tied_from = None  # (new pitch, new written text) of an open tie
    for bar in score.voices[voice]:
        new_key = speller.key(bar.key, semitones)
        old_key = bar.key
        sig = signature(new_key)
        local: dict[str, int] = {}
        steps = letter_steps(old_key, new_key)
        keys = list(bar.keys)
        for chord in bar.chords:
            if chord.known:
                key_at = _key_at(bar, chord.onset, old_key)
                new_at = speller.key(key_at, semitones)
                text = transpose_chord(chord.text, semitones, letter_steps(key_at, new_at),
                                       speller.chord(new_at))
                edits.append(Edit(chord.line, chord.span[0] + 1, chord.span[1] - 1, text))
        for inline in keys:
            edits.append(Edit(inline.line, inline.value_span[0], inline.value_span[1],
                              speller.key(inline.key, semitones)))
        for note in bar.notes:
            while keys and keys[0].onset <= note.onset and note.kind != "measure-rest":
                old_key = keys.pop(0).key
                new_key = speller.key(old_key, semitones)
                sig, local, steps = signature(new_key), {}, letter_steps(old_key, new_key)
            if note.kind != "note":
                tied_from = None
                continue
            target = note.pitch + semitones
            if not 0 <= target <= 127:
                raise AbcError(f"Transposing by {semitones} moves {note.accidental}{note.written} (MIDI {note.pitch}) "
                               f"outside MIDI 0..127.", code="note-range", line=note.line, column=note.column)
            letter = shift_letter(note.letter, steps)
            spelled = spell(target, letter)
            letter, octave, alter = speller.note(target, letter, None if spelled is None else spelled[1], new_key)
            written = write_note_name(letter, octave)
            continuation = note.tie_continues and tied_from == (target, written) and not note.accidental
            if continuation:
                accidental = ""
            elif note.accidental or alter != local.get(letter, sig[letter]):
                accidental = accidental_text(alter)
                local[letter] = alter
                speller.accidentals += 1
            else:
                accidental = ""
            edits.append(Edit(note.line, note.pitch_span[0], note.pitch_span[1], accidental + written))
            tied_from = (target, written) if note.tied else None
    return edits


def _key_at(bar, onset, key):
    for inline in bar.keys:
        if inline.onset <= onset:
            key = inline.key
    return key


def _check(before, after, semitones: int) -> None:
    """Self-check: every sounding pitch moved by exactly `semitones`, nothing else moved."""
    for voice in VOICES:
        old = [(n.kind, n.length, n.pitch) for _, n in before.notes(voice)]
        new = [(n.kind, n.length, None if n.pitch is None else n.pitch - semitones) for _, n in after.notes(voice)]
        if old != new:
            raise AbcError("Internal check failed: transposition changed the music beyond the pitch shift; the "
                           "score was left unchanged.", code="internal")
