"""`transpose(text, semitones)`: move every note, chord symbol and key by a number of semitones.

Spelling: the key moves to the key with the fewest accidentals on the new tonic (`pitch.transpose_key`); every note
and chord root/bass moves by the same number of letters as the tonic, so the music keeps its shape on the page (a
raised 4th stays a raised 4th). A spelling that would need more than two accidentals falls back to the plainest
spelling in the new key. Accidentals are written where the new key and the dialect's bar-wide, across-octave
accidental rule [V] need them, and kept where the original wrote one (courtesy accidentals survive).
"""

from __future__ import annotations

from .chords import transpose_chord
from .dialect import VOICES
from .edits import Edit, apply_edits
from .errors import AbcError
from .parser import parse
from .pitch import (
    accidental_text,
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
    score = parse(text)
    if semitones == 0:
        return text
    edits: list[Edit] = []
    header_key = score.header.key
    new_header_key = transpose_key(header_key, semitones)
    key_line = score.header.fields["K"]
    edits.append(_value_edit(key_line.line, key_line.raw, 2, new_header_key))
    for line, value in sorted({(c.line, c.value) for c in score.changes if c.name == "K"}):
        edits.append(_value_edit(line, score.lines[line - 1].rstrip("\r"), 2, transpose_key(value, semitones)))
    for voice in VOICES:
        edits += _voice_edits(score, voice, semitones)
    result = apply_edits(text, edits)
    _check(score, parse(result), semitones)
    return result


def _value_edit(line: int, raw: str, start: int, new_value: str) -> Edit:
    """Replace the stripped value after `F:` (0-based offset `start`) keeping surrounding spaces."""
    value = raw[start:]
    lead = len(value) - len(value.lstrip())
    core = value.strip()
    begin = start + lead + 1
    return Edit(line, begin, begin + len(core), new_value)


def _voice_edits(score, voice: str, semitones: int) -> list[Edit]:
    edits: list[Edit] = []
    tied_from = None  # (new pitch, new written text) of an open tie
    for bar in score.voices[voice]:
        new_key = transpose_key(bar.key, semitones)
        old_key = bar.key
        sig = signature(new_key)
        local: dict[str, int] = {}
        steps = letter_steps(old_key, new_key)
        keys = list(bar.keys)
        for chord in bar.chords:
            if chord.known:
                key_at = _key_at(bar, chord.onset, old_key)
                new_at = transpose_key(key_at, semitones)
                text = transpose_chord(chord.text, semitones, letter_steps(key_at, new_at),
                                       lambda pc, k=new_at: _plain(pc, k))
                edits.append(Edit(chord.line, chord.span[0] + 1, chord.span[1] - 1, text))
        for inline in keys:
            edits.append(Edit(inline.line, inline.value_span[0], inline.value_span[1],
                              transpose_key(inline.key, semitones)))
        for note in bar.notes:
            while keys and keys[0].onset <= note.onset and note.kind != "measure-rest":
                old_key = keys.pop(0).key
                new_key = transpose_key(old_key, semitones)
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
            if spelled is None:
                letter, octave, alter = simplest_spelling(target, new_key)
            else:
                octave, alter = spelled
            written = write_note_name(letter, octave)
            continuation = note.tie_continues and tied_from == (target, written) and not note.accidental
            if continuation:
                accidental = ""
            elif note.accidental or alter != local.get(letter, sig[letter]):
                accidental = accidental_text(alter)
                local[letter] = alter
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


def _plain(pitch_class: int, key: str) -> tuple[str, int]:
    letter, _, alter = simplest_spelling(60 + pitch_class, key)
    return letter, alter


def _check(before, after, semitones: int) -> None:
    """Self-check: every sounding pitch moved by exactly `semitones`, nothing else moved."""
    for voice in VOICES:
        old = [(n.kind, n.length, n.pitch) for _, n in before.notes(voice)]
        new = [(n.kind, n.length, None if n.pitch is None else n.pitch - semitones) for _, n in after.notes(voice)]
        if old != new:
            raise AbcError("Internal check failed: transposition changed the music beyond the pitch shift; the "
                           "score was left unchanged.", code="internal")
