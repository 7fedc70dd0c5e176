"""Score tools that rewrite only what they must: `set_tempo`, `strip_chords`, `silence_vocal`.

Each parses first (raising `AbcError` on text that does not parse), edits exact column ranges, re-parses its own
output and checks the promise it makes (a failure raises `AbcError` with code "internal" and returns nothing).
"""

from __future__ import annotations

from fractions import Fraction

from .dialect import NATIVE_LENGTHS, VOICES
from .edits import Edit, apply_edits, split_lines
from .errors import AbcError
from .parser import parse


def set_tempo(text: str, bpm: int) -> str:
    """`text` with the BPM of its `Q:` line replaced by `bpm` (a whole number from 1 to 1000; the beat unit and the
    rest of the line are kept). Raises `AbcError` if the text does not parse or bpm is out of range."""
    if isinstance(bpm, bool) or not isinstance(bpm, (int, float)) or not 1 <= bpm <= 1000 or int(bpm) != bpm:
        # (the range first: int(inf) raised OverflowError, int(nan) ValueError — break-it review, stop 53)
        raise AbcError(f"bpm must be a whole number from 1 to 1000 (the dialect writes Q:1/4=<whole BPM>), got "
                       f"{bpm!r}.", code="argument")
    score = parse(text, edit=True)
    field = score.header.fields["Q"]
    equals = field.raw.index("=")
    value = field.raw[equals + 1:]
    start = equals + 1 + (len(value) - len(value.lstrip())) + 1
    result = apply_edits(text, [Edit(field.line, start, start + len(value.strip()), str(int(bpm)))])
    if parse(result, edit=True).header.bpm != int(bpm):
        raise AbcError("Internal check failed: the tempo was not set.", code="internal")
    return result


_JOINS = tuple("0123456789/,'-")  # characters that would join the text before a removed chord symbol


def strip_chords(text: str) -> str:
    """`text` without any quoted chord symbol (what melody mode conditions on [V]: `cot="melody"` expects a chord-free
    score and does not strip chords itself). Notes, rests, bar lines, spaces and headers are kept; header quotes
    such as name="Vocal Melody" are not chord symbols and stay."""
    score = parse(text, edit=True)
    lines = split_lines(text)
    # A chord symbol followed by a digit, /, ', comma or - (the unfinished end of a cut-off last bar, `C8"C"8`) is
    # replaced by a space, not removed: `C88` would be another note (break-it finding: an "internal error").
    edits = [Edit(c.line, c.span[0], c.span[1], " " if lines[c.line - 1][c.span[1] - 1:c.span[1]] in _JOINS else "")
             for v in VOICES for bar in score.voices[v] for c in bar.chords]
    result = apply_edits(text, edits)
    after = parse(result, edit=True)
    if _music(after) != _music(score) or any(bar.chords for v in VOICES for bar in after.voices[v]):
        raise AbcError("Internal check failed: removing chord symbols changed the notes.", code="internal")
    return result


def silence_vocal(text: str, *, keep_chords: bool = True) -> str:
    """`text` with every Vocal bar that sounds a note replaced by rests filling the bar (its meter length; the
    written length for an unterminated last bar), for instrumental renders [U entries 1-2].

    Chord symbols stay at their onsets when keep_chords (the dialect carries the harmony on the Vocal voice, also
    over rests [V]); inline [K:] changes always stay. Rests are written in the native style: z with whole multiples
    of L: from the native set, largest first (z32, z16z4, ...). Bar lines, other bars, the Ins voice and everything
    else are kept byte for byte; Vocal bars without notes are left as written."""
    score = parse(text, edit=True)
    edits = []
    for bar in score.voices["Vocal"]:
        if not bar.has_notes:
            continue
        fill = bar.expected if bar.complete else bar.length
        anchors = sorted(([(c.onset, 0, f'"{c.text}"') for c in bar.chords] if keep_chords else [])
                         + [(k.onset, 1, f"[K:{k.key}]") for k in bar.keys], key=lambda a: (a[0], a[1]))
        parts, position = [], Fraction(0)
        for onset, _, symbol in anchors:
            onset = min(onset, fill)
            parts.append(rests(onset - position))
            parts.append(symbol)
            position = onset
        parts.append(rests(fill - position))
        edits.append(Edit(bar.line, bar.span[0], bar.span[1], "".join(parts)))
    result = apply_edits(text, edits)
    _check_silenced(score, parse(result, edit=True), keep_chords)
    return result


def rests(units: Fraction) -> str:
    """Rest text lasting `units` (≥ 0) of L: native lengths greedily, largest first; a fractional remainder is written
    as z<num>/<den>. `rests(0)` is ""."""
    out = []
    whole = int(units)
    for size in sorted(NATIVE_LENGTHS, reverse=True):
        while whole >= size:
            out.append("z" if size == 1 else f"z{size}")
            whole -= size
    remainder = units - int(units)
    if remainder:
        out.append(f"z{remainder.numerator}/{remainder.denominator}")
    return "".join(out)


def _music(score) -> list:
    return [[(bar.number, n.kind, n.onset, n.length, n.pitch) for bar, n in score.notes(v)] for v in VOICES]


def _check_silenced(before, after, keep_chords: bool) -> None:
    ok = [len(b) for b in before.voices.values()] == [len(a) for a in after.voices.values()]
    ok = ok and _music(before)[1] == _music(after)[1]
    ok = ok and not any(bar.has_notes for bar in after.voices["Vocal"])
    for old, new in zip(before.voices["Vocal"], after.voices["Vocal"]):
        wanted = old.length if not old.has_notes else (old.expected if old.complete else old.length)
        ok = ok and new.length == wanted
        if keep_chords:
            ok = ok and [c.text for c in old.chords] == [c.text for c in new.chords]
    if not ok:
        raise AbcError("Internal check failed: silencing the Vocal voice changed something else.", code="internal")
