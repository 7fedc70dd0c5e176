"""`validate(text)`: every problem of a score as a list of `Issue`s (never raises on text).

Codes — errors: encoding (an unpaired surrogate), byte-order-mark (a leading U+FEFF, or one inside), empty,
missing-header, duplicate-header, header-order, header-value, unknown-header, unknown-voice, token, structure,
empty-bar, unterminated-bar, group-order, missing-voice, voice-mismatch, bar-length, note-range, tie, chord-symbol.
Warnings: truncated, tuplet, broken-rhythm, vocal-in-instrumental, too-long, dialect, duration-value, chord-symbol
(quality outside the native list), chord-in-ins, group-size, key-mismatch, no-notes, tie (left open at the end),
line-ends (CR LF or CR), too-many-issues; chord-symbol also warns of a symbol after a bar's last note and of
symbols stacked on one note (`"C""G"C16`: all but the last sound for no time), dialect of the
spellings the vendor's checker refuses (Z1, Z5, `V: Vocal ` with a trailing space, `%verse`, a blank line after the last
group).
"""

from __future__ import annotations

from .dialect import MAX_BARS_PER_LINE, SANE_MIDI, VOICES
from .errors import Issue
from .model import AbcScore
from .parser import scan
from .timing import score_seconds

ISSUE_LIMIT = 200


def validate(text: str, *, instrumental: bool = False, max_seconds: float | None = None,
             limit: int = ISSUE_LIMIT, duration_setting: str | None = None) -> list[Issue]:
    """Check `text` against the native two-voice dialect; sorted by line and column.

    instrumental=True warns when the Vocal voice sounds notes (an instrumental render needs a silent Vocal voice
    [U entries 1-2]); max_seconds warns when the estimated length (bars × beats ÷ tempo) exceeds it, its advice
    naming `duration_setting` — how the caller sets the duration: "--max-seconds" on the command line, the
    Composer's max_seconds input in ComfyUI (None: named by neither). At most `limit` issues are returned, the last
    then being a "too-many-issues" warning. Non-text input raises `AbcError`.
    """
    return check(scan(text), instrumental=instrumental, max_seconds=max_seconds, limit=limit,
                 duration_setting=duration_setting)


def check(score: AbcScore, *, instrumental: bool = False, max_seconds: float | None = None,
          limit: int = ISSUE_LIMIT, duration_setting: str | None = None) -> list[Issue]:
    """`validate` for an already scanned score (what the parser found plus the whole-score rules)."""
    issues = list(score.issues)
    if not any(i.code == "empty" for i in issues):
        issues += check_groups(score)
        issues += check_bars(score)
        issues += check_content(score, instrumental, max_seconds, duration_setting)
    issues.sort(key=lambda i: (i.line or 0, i.column or 0, i.severity != "error"))
    if len(issues) > limit:
        rest = len(issues) - (limit - 1)
        issues = issues[:limit - 1] + [Issue("warning", "too-many-issues", f"{rest} more issues are not shown; fix "
                                             f"the ones above first.", issues[limit - 1].line, 1)]
    return issues


def check_groups(score: AbcScore) -> list[Issue]:
    """Pairing of V: Vocal / V: Ins lines per group [V]: both voices, equal bar counts, equal meters per bar,
    1-4 bars per line. The unfinished last group of a truncated score is not held to these rules."""
    issues: list[Issue] = []
    groups = score.groups
    present = {v for g in groups for v in g.selectors}
    if groups and present != set(VOICES):
        missing = next(v for v in VOICES if v not in present)
        issues.append(Issue("error", "missing-voice", f"The score has no V: {missing} lines; every group is a "
                            f"V: Vocal line followed by a V: Ins line with the same number of bars.",
                            groups[0].line, 1, None, missing))
        return issues
    for group in groups:
        last = group is groups[-1]
        if last and score.truncated:
            continue
        for voice in VOICES:
            if voice not in group.selectors:
                other = next(iter(group.selectors))
                issues.append(Issue("error", "group-order", f"Group {group.number} (line {group.line}) has a "
                                    f"V: {other} line without a V: {voice} line; every group is V: Vocal then "
                                    f"V: Ins.", group.line, 1, None, voice))
            for music in group.lines.get(voice, ()):
                if not 1 <= len(music.bars) <= MAX_BARS_PER_LINE:
                    issues.append(Issue("warning", "group-size", f"This {voice} line has {len(music.bars)} bars; "
                                        f"the dialect writes 1 to {MAX_BARS_PER_LINE} bars per line (Z2…Z4 count "
                                        f"as 2…4).", music.line, 1, None, voice))
        counts = {v: group.bar_count(v) for v in VOICES if v in group.selectors}
        if len(counts) == 2 and counts["Vocal"] != counts["Ins"]:
            line = group.selectors["Ins"]
            issues.append(Issue("error", "voice-mismatch", f"Group {group.number}: V: Vocal has {counts['Vocal']} "
                                f"bar(s) but V: Ins has {counts['Ins']}; both lines of a group have the same number "
                                f"of bars.", line, 1, None, "Ins"))
    return issues


def check_bars(score: AbcScore) -> list[Issue]:
    """Every complete bar sums exactly to its meter; both voices agree on each bar's meter and key [V]."""
    issues: list[Issue] = []
    for voice in VOICES:
        for bar in score.voices[voice]:
            if bar.complete and bar.readable and bar.length != bar.expected:
                meter = f"{bar.meter[0]}/{bar.meter[1]}"
                issues.append(Issue("error", "bar-length", f"Bar {bar.number} of {voice} lasts {_units(bar.length)} "
                                    f"unit(s) of L:1/{score.header.unit.denominator} but M:{meter} needs "
                                    f"{_units(bar.expected)}.", bar.line, bar.column, bar.number, voice))
    vocal, ins = score.voices["Vocal"], score.voices["Ins"]
    for a, b in zip(vocal, ins):
        if a.meter != b.meter:
            issues.append(Issue("error", "voice-mismatch", f"Bar {b.number} is in {b.meter[0]}/{b.meter[1]} for Ins "
                                f"but {a.meter[0]}/{a.meter[1]} for Vocal; write a meter change in both voices.",
                                b.line, b.column, b.number, "Ins"))
            break
    for a, b in zip(vocal, ins):
        if a.key != b.key or [(k.onset, k.key) for k in a.keys] != [(k.onset, k.key) for k in b.keys]:
            issues.append(Issue("warning", "key-mismatch", f"Bar {b.number} has a different key in Vocal and Ins; "
                                f"the dialect changes the key in both voices at the same place.",
                                b.line, b.column, b.number, "Ins"))
            break
    return issues


def check_content(score: AbcScore, instrumental: bool, max_seconds: float | None,
                  duration_setting: str | None = None) -> list[Issue]:
    """Note range, silent-vocal rule for instrumentals, empty scores, estimated length (its advice naming
    `duration_setting`, the caller's own duration setting: `validate`)."""
    issues: list[Issue] = []
    low, high = SANE_MIDI
    for voice in VOICES:
        for bar, note in score.notes(voice):
            if note.kind == "note" and not low <= note.pitch <= high and not note.tie_continues:
                issues.append(Issue("error", "note-range", f"Note {note.accidental}{note.written} is MIDI "
                                    f"{note.pitch}; notes must lie between MIDI {low} (A0, written A,,,,) and {high} "
                                    f"(C8, written c''').", note.line, note.column, bar.number, voice))
    vocal_notes = [(bar, note) for bar, note in score.notes("Vocal") if note.kind == "note"]
    if instrumental and vocal_notes:
        bar, note = vocal_notes[0]
        bars = len({b.number for b, _ in vocal_notes})
        issues.append(Issue("warning", "vocal-in-instrumental", f"Instrumental mode, but the Vocal voice sings "
                            f"{len(vocal_notes)} note(s) in {bars} bar(s), from bar {bar.number}; the model sings "
                            f"what the Vocal voice holds. Silence it (every Vocal bar a rest, chord symbols kept).",
                            note.line, note.column, bar.number, "Vocal"))
    has_bars = any(score.voices.values())
    if has_bars and not any(n.kind == "note" for v in VOICES for _, n in score.notes(v)):
        issues.append(Issue("warning", "no-notes", "The score has only rests; the model needs at least one note to "
                            "follow.", score.header.end_line + 1, 1))
    if max_seconds is not None and has_bars:
        seconds = float(score_seconds(score))
        if seconds > max_seconds:
            # the caller's own setting only (stop 40 review: one message named the CLI option and the node input)
            named = f" ({duration_setting})" if duration_setting else ""
            issues.append(Issue("warning", "too-long", f"The score lasts about {seconds:.1f} s at its tempo, more "
                                f"than the {max_seconds:g} s requested; generation stops at that length and "
                                f"the song will be cut. Shorten the score or raise the duration{named}.",
                                score.header.fields["Q"].line if "Q" in score.header.fields else 1, 1))
    return issues


def _units(value) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
