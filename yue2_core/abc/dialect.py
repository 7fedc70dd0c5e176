"""Facts of the native YuE2 two-voice ABC dialect, in one place.

Sources, cited per fact below:
  [V]  vendor skill `skills/yue2-music/scripts/abc_tools.py` @ fcb5b96f (multimodal-art-projection/YuE), the
       checker the vendor ships next to the model; read for facts only.
  [R]  `../shared/reference/runtime.md` §1.6 (the dialect as the official runtime documents it).
  [U]  `../shared/reference/user_reports.md` (§3.1 entries 7 and 11: planner truncation, tuplets).
  [P]  Plenio `docs/design` §9.2 (a downstream editor that reverse-engineered the same dialect; corroboration only).
  [A]  ABC standard 2.1 (general syntax we tolerate but the model never saw).

Units: `Fraction`s of a whole note unless a name says `units` (multiples of the L: default length).
"""

from fractions import Fraction

# --- header -------------------------------------------------------------------------------------------------------
# Header lines in this exact order, one per line, no space after the colon [V][R]. "V:Vocal"/"V:Ins" are the two
# voice definitions; their literal text is fixed [V] (the planner writes it, abc_tools rejects anything else).
HEADER_ORDER = ("X", "T", "M", "L", "Q", "V:Vocal", "V:Ins", "K")
NATIVE_X = "1"  # `X:1` [V]
NATIVE_TITLE = ""  # `T:` is written empty by the planner [V]
VOICE_DEFINITIONS = {
    "Vocal": 'V: Vocal clef=treble name="Vocal Melody" snm="Vocal"',  # [V][R]
    "Ins": 'V: Ins clef=treble name="Ins Melody" snm="Inst."',  # [V][R]
}
VOICES = ("Vocal", "Ins")  # the only voice names, Vocal first in every group [V]
NATIVE_UNIT_DENOMINATOR = 32  # `L:1/32` in generated plans; 1/16 in vendor examples [R][P]
MAX_DENOMINATOR = 1024  # M: and L: denominators: powers of two up to 1024 [V]
NATIVE_TEMPO_BEAT = Fraction(1, 4)  # `Q:1/4=<integer BPM>` [V]

# Fields allowed in the body: voice selectors, per-voice meter/key changes right after a selector [V], and lyrics
# lines, which the dialect never contains but which ABC users paste [A] (kept, warned).
BODY_FIELDS = ("V", "M", "K", "w", "W")

# --- body ---------------------------------------------------------------------------------------------------------
# A group is: optional `% label` comment lines, `V: Vocal`, one music line, `V: Ins`, one music line [V][R].
# A music line holds 1-4 bars after expanding Z2..Z4 and ends with a plain `|` [V].
MAX_BARS_PER_LINE = 4
# Written note/rest lengths the native serializer uses, in L units [V]; anything else is accepted by ABC [A] but
# unseen by the model.
NATIVE_LENGTHS = frozenset({1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48})
# Accidentals apply by letter across octaves until the bar line or an inline key change, and an unmarked note
# tied from the same written note keeps the tied pitch [V] (standard ABC scopes accidentals per octave [A]).
ACCIDENTALS = {"^^": 2, "^": 1, "=": 0, "_": -1, "__": -2}
ACCIDENTAL_TEXT = {value: text for text, value in ACCIDENTALS.items()}

# Default q of a `(p` tuplet when q is not written: ABC 2.1 §4.13 [A]; 5, 7, 9 depend on the meter (3 if compound).
TUPLET_DEFAULT_Q = {2: 3, 3: 2, 4: 3, 6: 2, 8: 3}

# --- pitch --------------------------------------------------------------------------------------------------------
LETTERS = "CDEFGAB"
NATURAL_PC = {"C": 0, "D": 2, "E": 4, "F": 5, "G": 7, "A": 9, "B": 11}
MIDDLE_C = 60  # `C` = MIDI 60, `c` = 72 [V]
SANE_MIDI = (21, 108)  # piano range A0..C8; notes outside are errors (vendor only bounds 0..127 [V])

# Keys: 15 major and 15 minor names, value = sharps (>0) or flats (<0) in the signature [V].
MAJOR_KEYS = dict(zip(("Cb", "Gb", "Db", "Ab", "Eb", "Bb", "F", "C", "G", "D", "A", "E", "B", "F#", "C#"),
                      range(-7, 8)))
MINOR_KEYS = dict(zip(("Abm", "Ebm", "Bbm", "Fm", "Cm", "Gm", "Dm", "Am", "Em", "Bm", "F#m", "C#m", "G#m", "D#m",
                       "A#m"), range(-7, 8)))
KEYS = {**MAJOR_KEYS, **MINOR_KEYS}
SHARP_ORDER = "FCGDAEB"
FLAT_ORDER = "BEADGCF"

# --- chord symbols ------------------------------------------------------------------------------------------------
# Quoted chord symbols sit on the Vocal voice only, also over rests [V][R]: root A-G with b/#/bb/##, a quality, an
# optional /bass [V]. Value = chord tones in semitones above the root (our voicing for playback).
NATIVE_QUALITIES = {
    "": (0, 4, 7), "m": (0, 3, 7), "dim": (0, 3, 6), "aug": (0, 4, 8), "7": (0, 4, 7, 10), "maj7": (0, 4, 7, 11),
    "m7": (0, 3, 7, 10), "dim7": (0, 3, 6, 9), "m7b5": (0, 3, 6, 10), "sus4": (0, 5, 7), "sus2": (0, 2, 7),
    "6": (0, 4, 7, 9), "m6": (0, 3, 7, 9), "7sus4": (0, 5, 7, 10), "m(maj7)": (0, 3, 7, 11),
}
# Common lead-sheet spellings outside the native list: understood (warning), never written by the planner.
EXTRA_QUALITIES = {
    "maj": (0, 4, 7), "M": (0, 4, 7), "min": (0, 3, 7), "-": (0, 3, 7), "+": (0, 4, 8), "5": (0, 7),
    "sus": (0, 5, 7), "M7": (0, 4, 7, 11), "m7-5": (0, 3, 6, 10), "mmaj7": (0, 3, 7, 11), "o": (0, 3, 6),
    "o7": (0, 3, 6, 9), "9": (0, 4, 7, 10, 14), "maj9": (0, 4, 7, 11, 14), "m9": (0, 3, 7, 10, 14),
    "add9": (0, 4, 7, 14), "7b9": (0, 4, 7, 10, 13), "7#9": (0, 4, 7, 10, 15), "7b5": (0, 4, 6, 10),
    "7#5": (0, 4, 8, 10), "11": (0, 4, 7, 10, 14, 17), "13": (0, 4, 7, 10, 14, 21), "m11": (0, 3, 7, 10, 14, 17),
}
CHORD_ROOT_OCTAVE_MIDI = 48  # playback voicing: root in the octave from C3, slash bass one octave lower
