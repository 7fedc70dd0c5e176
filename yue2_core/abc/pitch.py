"""Pitch arithmetic of the dialect: key signatures, written note -> MIDI, and spelling MIDI back to text.

Conventions [V]: `C` = MIDI 60, lower case one octave up, each `'` up and each `,` down an octave; a key signature
is the number of sharps (>0) or flats (<0) of one of the 30 named keys in `dialect.KEYS`.
"""

from __future__ import annotations

from .dialect import (
    ACCIDENTAL_TEXT,
    FLAT_ORDER,
    KEYS,
    LETTERS,
    MAJOR_KEYS,
    MIDDLE_C,
    MINOR_KEYS,
    NATURAL_PC,
    SHARP_ORDER,
)


def signature(key: str) -> dict[str, int]:
    """Alteration (-1, 0, +1) per letter for `key` (a name in `dialect.KEYS`)."""
    count = KEYS[key]
    altered = (SHARP_ORDER if count > 0 else FLAT_ORDER)[:abs(count)]
    return {letter: (1 if count > 0 else -1) if letter in altered else 0 for letter in LETTERS}


def written_octave(letter_case: str, marks: str) -> int:
    """Scientific octave of a written note: `C` is octave 4, `c` octave 5; `'` adds one, `,` subtracts one."""
    return (5 if letter_case.islower() else 4) + marks.count("'") - marks.count(",")


def natural_midi(letter: str, octave: int) -> int:
    """MIDI number of the natural `letter` (upper case) in scientific `octave` (C4 = 60)."""
    return MIDDLE_C + 12 * (octave - 4) + NATURAL_PC[letter]


def write_note_name(letter: str, octave: int) -> str:
    """ABC text of a natural note: letter case and octave marks for scientific `octave` (no accidental)."""
    if octave >= 5:
        return letter.lower() + "'" * (octave - 5)
    return letter.upper() + "," * (4 - octave)


def tonic(key: str) -> tuple[str, int]:
    """(tonic letter, tonic pitch class) of a key name such as "F#m"."""
    letter = key[0]
    alter = 1 if key[1:2] == "#" else -1 if key[1:2] == "b" else 0
    return letter, (NATURAL_PC[letter] + alter) % 12


def transpose_key(key: str, semitones: int, tie: str | None = None) -> str:
    """The key name a transposition by `semitones` lands on: same mode, tonic moved, spelled with the fewest
    accidentals; on a tie (6 or 7 either way) keep the side (sharps/flats) of the original key, sharps from C/Am —
    or the side `tie` names ("sharps" / "flats"), which `transpose` picks by the spelling of the notes."""
    minor = key in MINOR_KEYS
    table = MINOR_KEYS if minor else MAJOR_KEYS
    target = (tonic(key)[1] + semitones) % 12
    candidates = [name for name in table if tonic(name)[1] == target]
    prefer_flats = KEYS[key] < 0 if tie is None else tie == "flats"
    return min(candidates, key=lambda name: (abs(KEYS[name]), (KEYS[name] > 0) == prefer_flats))


def is_tie_key(key: str) -> bool:
    """True for the keys a transposition may spell either way (F#/Gb major, D#/Eb minor: 6 accidentals)."""
    return abs(KEYS[key]) == 6


def spell(midi: int, letter: str) -> tuple[int, int] | None:
    """(octave, alteration) writing `midi` with `letter`, alteration in -2..2, or None if that letter cannot."""
    base = NATURAL_PC[letter]
    octave = round((midi - MIDDLE_C - base) / 12) + 4
    alter = midi - natural_midi(letter, octave)
    return (octave, alter) if -2 <= alter <= 2 else None


def simplest_spelling(midi: int, key: str) -> tuple[str, int, int]:
    """(letter, octave, alteration) for `midi` in `key`: the key's own scale note when there is one, otherwise a
    single sharp in sharp keys (and C/Am) or a single flat in flat keys."""
    sig = signature(key)
    for letter in LETTERS:
        spelled = spell(midi, letter)
        if spelled and spelled[1] == sig[letter]:
            return letter, spelled[0], spelled[1]
    wanted = -1 if KEYS[key] < 0 else 1
    for alter in (wanted, -wanted, 0, 2 * wanted, -2 * wanted):
        for letter in LETTERS:
            spelled = spell(midi, letter)
            if spelled and spelled[1] == alter:
                return letter, spelled[0], alter
    raise AssertionError("every pitch has a spelling")  # pragma: no cover


def scale_spelling(midi: int, key: str) -> tuple[str, int, int] | None:
    """(letter, octave, alteration) of `midi` as a note of `key`'s scale (its signature), or None when it is not."""
    sig = signature(key)
    for letter in LETTERS:
        spelled = spell(midi, letter)
        if spelled and spelled[1] == sig[letter]:
            return letter, spelled[0], spelled[1]
    return None


def shift_letter(letter: str, steps: int) -> str:
    """The letter `steps` diatonic steps above `letter` (cyclic)."""
    return LETTERS[(LETTERS.index(letter) + steps) % 7]


def letter_steps(old_key: str, new_key: str) -> int:
    """Diatonic steps from the tonic letter of `old_key` to that of `new_key` (0..6)."""
    return (LETTERS.index(tonic(new_key)[0]) - LETTERS.index(tonic(old_key)[0])) % 7


def accidental_text(alter: int) -> str:
    """ABC accidental for an alteration: ^ ^^ _ __ or = for natural."""
    return ACCIDENTAL_TEXT[alter]


def pitch_class_name(letter: str, alter: int) -> str:
    """Chord-symbol spelling: letter plus #/##/b/bb."""
    return letter + ("#" * alter if alter > 0 else "b" * -alter)
