"""Tokenizer for one music line. Positions are 0-based character offsets into the line (callers add 1).

Accepted tokens (ABC 2.1 [A], subset; the native dialect [V] uses notes, z rests, Z/Z2..Z4 bar rests, quoted chord
symbols, [K:] inline keys and plain `|`):
  note      accidental? letter octave-marks length? tie?      e.g. ^F,3/2-   _b'  c16
  rest      z or x with a length                               z8  x/2
  bar-rest  Z or X with an optional bar count                  Z  Z3
  chord     "symbol"                                           "F#m/C#"
  inline    [K:key] (other inline fields are reported as unsupported)
  bar       | || |] [| |: :| :: :|: ...
  tuplet    (p  (p:q  (p:q:r  (p::r
  broken    > >> >>> < << <<<
  comment   % to the end of the line
Everything else becomes an "error" token with a reason; the lexer never raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .dialect import KEYS

_LENGTH = r"(?P<num>[0-9]*)(?P<slash>/*)(?P<den>[0-9]*)"
MAX_DIGITS = 6  # longer numbers are refused (a length, count or tuplet that large is a typo, and int() of huge digit
                # strings is slow or refused by Python); a bar rest's count and a tuplet's digits are matched
                # whatever their length, so that bars.py names them ("(1000 is not a tuplet", not a slur)
_NOTE = re.compile(r"(?P<acc>\^\^|\^|__|_|=)?(?P<letter>[A-Ga-g])(?P<oct>[,']*)" + _LENGTH + r"(?P<tie>-?)")
_REST = re.compile(r"(?P<letter>[zx])" + _LENGTH)
_BAR_REST = re.compile(r"(?P<letter>[ZX])(?P<count>[0-9]*)")  # any digits: bars.py words the range
_BAR = re.compile(r":*\[?\|[\]|]?:*|::+")
_TUPLET = re.compile(r"\((?P<p>[0-9]+)(?::(?P<q>[0-9]*))?(?::(?P<r>[0-9]*))?")  # any digits: as _BAR_REST
_BROKEN = re.compile(r">{1,3}|<{1,3}")
_INLINE = re.compile(r"\[(?P<field>[A-Za-z]):")  # up to the next "]" of the line (`_Closes`): the value

_REASONS = {
    "(": "slurs are not part of the dialect",
    ")": "slurs are not part of the dialect",
    "{": "grace notes are not part of the dialect",
    "!": "decorations are not part of the dialect",
    "+": "decorations are not part of the dialect",
    ".": "staccato dots and other decorations are not part of the dialect",
    "~": "decorations are not part of the dialect",
    "\\": "line continuations are not part of the dialect; write each group's music on one line",
    "-": "a tie must follow a note directly (e.g. c4-)",
}


@dataclass(frozen=True)
class Token:
    """kind (see module doc), start/end offsets (end exclusive), the matched text, named groups of the match, and
    for "error" tokens the reason."""

    kind: str
    start: int
    end: int
    text: str
    groups: dict
    reason: str = ""


def parse_length(num: str, slash: str, den: str) -> tuple[int, int] | None:
    """(numerator, denominator) of an ABC length suffix; "" = 1, "/" = 1/2, "//" = 1/4, "3/" = 3/2, "/4" = 1/4.
    None for a zero length or one with more than `MAX_DIGITS` digits or slashes."""
    if len(num) > MAX_DIGITS or len(den) > MAX_DIGITS or len(slash) > MAX_DIGITS:
        return None
    numerator = int(num) if num else 1
    if not slash:
        denominator = 1
    elif den:
        denominator = int(den) * 2 ** (len(slash) - 1)
    else:
        denominator = 2 ** len(slash)
    if numerator == 0 or denominator == 0:
        return None
    return numerator, denominator


class _Closes:
    """Where the next "]" of a line is, found once per stretch: a regex for a whole inline field (`[^\\]]*\\]`)
    scanned to the line's end from every "[" that opens none, so a 100 kB paste of "[K:" took 31 s of the editor's
    score thread for analyze and as long for each score tool (break-it review, stop 55)."""

    def __init__(self, line: str):
        self.line, self.start, self.at = line, 0, line.find("]")

    def after(self, pos: int) -> int:
        """Index of the first "]" at or after `pos`, -1 when there is none."""
        if not (self.start <= pos and (self.at < 0 or pos <= self.at)):
            self.start, self.at = pos, self.line.find("]", pos)
        return self.at


def tokenize(line: str) -> list[Token]:
    """Tokens of one music line, whitespace dropped. Unknown characters yield one "error" token each run."""
    tokens: list[Token] = []
    pos = 0
    size = len(line)
    closes = _Closes(line)
    while pos < size:
        char = line[pos]
        if char in " \t\r":
            pos += 1
            continue
        token = _match_at(line, pos, closes)
        tokens.append(token)
        pos = token.end
    return tokens


def _inline(line: str, pos: int, closes: _Closes) -> Token | None:
    """An inline field `[X:value]` at `pos` (value: up to the line's next "]"); an "error" token for one that is never
    closed (was: `'[': notes sounding together ([CEG])…` and a second error for `K:D`; break-it review, stop 55)."""
    match = _INLINE.match(line, pos)
    if not match:
        return None
    close = closes.after(match.end())
    if close >= 0:
        return Token("inline", pos, close + 1, line[pos:close + 1],
                     {"field": match.group("field"), "value": line[match.end():close]})
    end = match.end()
    while end < len(line) and not line[end].isspace() and line[end] not in '|"[':
        end += 1
    field, value = match.group("field"), line[match.end():end]
    # the field as written only when it is a key: `[K:Dc4d4|` ran into the notes (was advised as "[K:Dc4d4]")
    example = f"[K:{value}]" if field == "K" and value in KEYS else "[K:D]"
    return Token("error", pos, end, line[pos:end], {},
                 f"the inline field '[{field}:' is not closed with ']' on this line; the dialect writes a key change "
                 f"as {example}")


def _match_at(line: str, pos: int, closes: _Closes) -> Token:
    char = line[pos]
    if char == "%":
        return Token("comment", pos, len(line), line[pos:], {})
    if char == '"':
        close = line.find('"', pos + 1)
        if close < 0:
            return Token("error", pos, len(line), line[pos:], {}, "a chord symbol's closing quote is missing")
        return Token("chord", pos, close + 1, line[pos:close + 1], {"text": line[pos + 1:close]})
    match = _BAR.match(line, pos)
    if match:
        return Token("bar", pos, match.end(), match.group(0), match.groupdict())
    inline = _inline(line, pos, closes)
    if inline is not None:
        return inline
    for kind, pattern in (("note", _NOTE), ("rest", _REST), ("bar-rest", _BAR_REST), ("tuplet", _TUPLET),
                          ("broken", _BROKEN)):
        match = pattern.match(line, pos)
        if match:
            return Token(kind, pos, match.end(), match.group(0), match.groupdict())
    if char == "[":
        return Token("error", pos, pos + 1, char, {},
                     "notes sounding together ([CEG]) are not part of the dialect; each voice is one melody line")
    end = pos + 1
    while end < len(line) and not line[end].isspace() and line[end] not in '|"' and _is_unknown(line, end):
        end += 1
    reason = _REASONS.get(char, "this is not a note, rest, chord symbol or bar line of the dialect")
    return Token("error", pos, end, line[pos:end], {}, reason)


def _is_unknown(line: str, pos: int) -> bool:
    """True when nothing known starts at `pos` (used to swallow a run of garbage as one error token)."""
    for pattern in (_BAR, _NOTE, _REST, _BAR_REST):
        if pattern.match(line, pos):
            return False
    return line[pos] not in "%[("  # an inline field starts with "[": never swallowed
