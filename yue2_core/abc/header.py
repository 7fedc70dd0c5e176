"""The header block: `X:1`, `T:`, `M:n/d`, `L:1/n`, `Q:1/4=BPM`, the two voice definitions, `K:key`, in that order
[V][R]. Errors for what makes the score unreadable (missing, duplicated, out of order, unknown fields, bad values);
warnings ("dialect") where a line works but is not spelled the way the planner writes it — the model is conditioned
on the exact text, so e.g. `M: 4/4` or a title is unseen input."""

from __future__ import annotations

import re
from fractions import Fraction

from .dialect import (
    HEADER_ORDER,
    KEYS,
    MAJOR_KEYS,
    MAX_DENOMINATOR,
    MINOR_KEYS,
    NATIVE_TEMPO_BEAT,
    NATIVE_TITLE,
    NATIVE_X,
    VOICE_DEFINITIONS,
    VOICES,
)
from .errors import Issue, shown as _shown  # shown: a user's text quoted by its start and length
from .model import Header, HeaderField

FIELD_LINE = re.compile(r"([A-Za-z]):(.*)")
VOICE_VALUE = re.compile(r"\s*(\S*)(.*)")
_METER = re.compile(r"\s*([0-9]{1,6})\s*/\s*([0-9]{1,6})\s*")
_UNIT = re.compile(r"\s*1\s*/\s*([0-9]{1,6})\s*")
_TEMPO = re.compile(r"\s*([0-9]{1,6})\s*/\s*([0-9]{1,6})\s*=\s*([0-9]{1,6}(?:\.[0-9]{1,6})?)\s*")
NATIVE_HEADER = "X:1, T:, M:4/4, L:1/32, Q:1/4=<BPM>, the V: Vocal and V: Ins definitions, then K:<key>"


def is_field_line(line: str) -> bool:
    """True for `F:...` lines (a letter and a colon at the start), except music that starts with a repeat `A:|`."""
    return bool(FIELD_LINE.match(line)) and line[2:3] not in ("|", ":")


def power_of_two(value: int) -> bool:
    """True for 1, 2, 4, ... up to `dialect.MAX_DENOMINATOR`."""
    return 0 < value <= MAX_DENOMINATOR and value & (value - 1) == 0


def parse_meter(value: str) -> tuple[tuple[int, int] | None, str]:
    """((n, d), "") for `n/d` with d a power of two; C and C| give 4/4 and 2/2 with a note; (None, reason) else."""
    text = value.strip()
    if text in ("C", "C|"):
        fraction = "4/4" if text == "C" else "2/2"
        return ((4, 4) if text == "C" else (2, 2)), f"write the meter as a fraction (M:{fraction})"
    match = _METER.fullmatch(value)
    if match and int(match[1]) > 0 and power_of_two(int(match[2])):
        return (int(match[1]), int(match[2])), ""
    return None, (f"M:{_shown(text)} is not a meter the dialect accepts; write n/d with d a power of two up to "
                  f"{MAX_DENOMINATOR}, e.g. M:4/4 or M:6/8")


def parse_unit(value: str) -> tuple[Fraction | None, str]:
    """(1/n, "") for `1/n` with n a power of two, else (None, reason)."""
    match = _UNIT.fullmatch(value)
    if match and power_of_two(int(match[1])):
        return Fraction(1, int(match[1])), ""
    return None, (f"L:{_shown(value.strip())} is not a unit length the dialect accepts; write L:1/n with n a power "
                  f"of two, usually L:1/32")


def parse_tempo(value: str) -> tuple[tuple[Fraction, Fraction] | None, str]:
    """((beat as a whole-note fraction, BPM), "") for `a/b=N`, else (None, reason)."""
    match = _TEMPO.fullmatch(value)
    if match and int(match[1]) > 0 and int(match[2]) > 0 and 0 < Fraction(match[3]) <= 1000:
        return (Fraction(int(match[1]), int(match[2])), Fraction(match[3])), ""
    return None, (f"Q:{_shown(value.strip())} is not a tempo the dialect accepts; write Q:1/4=<BPM> with BPM a "
                  f"whole number from 1 to 1000")


def parse_key(value: str) -> tuple[str | None, str]:
    """(key, "") for one of the 30 key names, else (None, reason)."""
    key = value.strip()
    if key in KEYS:
        return key, ""
    return None, (f"K:{_shown(key)} is not a key the dialect uses; write one of the major keys "
                  f"{', '.join(MAJOR_KEYS)} or the minor keys {', '.join(MINOR_KEYS)}")


def parse_header(lines: list[str]) -> tuple[Header, int, list[Issue]]:
    """Read the header at the top of `lines` (source lines without line ends).

    Returns the decoded header (defaults where a value is missing or bad), the 0-based index of the first body line,
    and the issues found. The header ends after the K: line, or before the first line that is not a field line, or
    before a bare `V:` selector of a voice that is already defined.
    """
    header = Header()
    issues: list[Issue] = []
    seen: list[HeaderField] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.strip():
            if seen:
                break
            index += 1
            continue
        if line.startswith("%"):
            index += 1
            continue
        if not is_field_line(line):
            break
        name, value = line[0], line[2:]
        if name == "V":
            voice, rest = VOICE_VALUE.match(value).groups()
            if not rest.strip() and any(f.name == f"V:{voice}" for f in seen):
                break  # a selector: the body has started
            name = f"V:{voice}" if voice in VOICES else "V:?"
        seen.append(HeaderField(name, value, index + 1, line))
        index += 1
        if name == "K":
            break
    header.end_line = index
    _check_fields(seen, header, issues, lines)
    return header, index, issues


def _check_fields(seen: list[HeaderField], header: Header, issues: list[Issue], lines: list[str]) -> None:
    err = lambda code, msg, line: issues.append(Issue("error", code, msg, line, 1))  # noqa: E731
    warn = lambda msg, line: issues.append(Issue("warning", "dialect", msg, line, 1))  # noqa: E731
    if not seen:
        first = next((i + 1 for i, text in enumerate(lines) if text.strip()), 1)
        err("missing-header", f"The score has no ABC header; it must start with {NATIVE_HEADER}.", first)
        return
    for item in seen:
        if item.name == "V:?":
            voice = VOICE_VALUE.match(item.value).group(1)
            err("unknown-voice", f"Voice '{_shown(voice)}' is not part of the dialect; the only voices are Vocal and "
                                 f"Ins (V: Vocal, V: Ins).", item.line)
        elif item.name in header.fields:
            err("duplicate-header", f"The header has a second {_label(item.name)} line (the first is on line "
                                    f"{header.fields[item.name].line}); keep one.", item.line)
        elif item.name not in HEADER_ORDER:
            err("unknown-header", f"Header field {item.name}: is not part of the dialect; the header is "
                                  f"{NATIVE_HEADER}.", item.line)
        else:
            header.fields[item.name] = item
    _check_order(header, err)
    for rank, name in enumerate(HEADER_ORDER):
        if name not in header.fields:
            later = [f.line for f in header.fields.values() if HEADER_ORDER.index(f.name) > rank]
            err("missing-header", f"The header has no {_label(name)} line; the header is {NATIVE_HEADER}.",
                min(later) if later else seen[-1].line)
    _decode_values(header, err, warn)


def _check_order(header: Header, err) -> None:
    present = sorted(header.fields.values(), key=lambda f: f.line)
    ranks = [HEADER_ORDER.index(f.name) for f in present]
    for position in range(1, len(present)):
        if ranks[position] < max(ranks[:position]):
            item = present[position]
            after = present[ranks.index(max(ranks[:position]))]
            err("header-order", f"{_label(item.name)} must come before {_label(after.name)}; the native order is "
                                f"X, T, M, L, Q, V: Vocal, V: Ins, K.", item.line)
            return


def _decode_values(header: Header, err, warn) -> None:
    fields = header.fields
    if "X" in fields:
        x = fields["X"].value.strip()
        if not (x.isascii() and x.isdigit()):
            err("header-value", f"X:{_shown(x)} is not a tune number; write X:1.", fields["X"].line)
        elif fields["X"].raw != f"X:{NATIVE_X}":
            warn("The planner writes X:1 here; other text is unseen input for the model.", fields["X"].line)
    if "T" in fields:
        header.title = fields["T"].value.strip()
        if fields["T"].raw != f"T:{NATIVE_TITLE}":
            warn("The planner leaves the title empty (T:); a title is passed to the model as unseen conditioning "
                 "text.", fields["T"].line)
    for name, parser, attribute in (("M", parse_meter, "meter"), ("L", parse_unit, "unit"), ("K", parse_key, "key")):
        if name in fields:
            value, reason = parser(fields[name].value)
            if value is None:
                err("header-value", reason + ".", fields[name].line)
            else:
                setattr(header, attribute, value)
                if reason:
                    warn(reason[0].upper() + reason[1:] + "; the planner always does.", fields[name].line)
                elif fields[name].raw != f"{name}:{fields[name].value.strip()}":
                    warn(f"Write {name}:{_shown(fields[name].value.strip())} without spaces, as the planner does.",
                         fields[name].line)
    if "Q" in fields:
        tempo, reason = parse_tempo(fields["Q"].value)
        if tempo is None:
            err("header-value", reason + ".", fields["Q"].line)
        else:
            header.tempo_beat, header.bpm = tempo
            if tempo[0] != NATIVE_TEMPO_BEAT or tempo[1].denominator != 1:
                warn("The planner writes the tempo as Q:1/4=<whole-number BPM>; this tempo is honoured for "
                     "playback but is unseen input for the model.", fields["Q"].line)
    for voice in VOICES:
        item = fields.get(f"V:{voice}")
        if item and item.raw.rstrip() != VOICE_DEFINITIONS[voice]:
            warn(f"The planner defines this voice exactly as {VOICE_DEFINITIONS[voice]}; keep that text literal "
                 f"(describe instruments in the style prompt instead).", item.line)


def _label(name: str) -> str:
    return f"V: {name[2:]} definition" if name.startswith("V:") else f"{name}:"
