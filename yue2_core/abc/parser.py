"""Body parser: groups of `V: Vocal` / `V: Ins` music lines, `%` section comments, per-voice M:/K: lines.

`scan(text)` never raises and returns an `AbcScore` with every issue it found; `parse(text)` raises `AbcError` when
the text cannot be read as the dialect (the codes in `SYNTAX_CODES`). Structural rules that need the whole score
(group pairing, bar lengths, ranges) are checked by `validate`.

Layout rules [V][R]: after the header, each group is optional `% label` lines, `V: Vocal`, one music line, `V: Ins`,
one music line; each music line ends with `|`. A score the planner cut at its token budget ends inside a group or
inside a bar [U entry 7]: the unfinished tail is reported once as "truncated" (a warning), never as a syntax error.
"""

from __future__ import annotations

import re
from dataclasses import replace

from .bars import BarBuilder, VoiceState
from .dialect import VOICES
from .errors import AbcError, Issue, shown as _shown
from .header import VOICE_VALUE, is_field_line, parse_header, parse_key, parse_meter
from .lexer import tokenize
from .model import AbcScore, FieldChange, Group, LyricsLine, MusicLine, Section

# Codes that make a text unreadable: `parse` raises on the first of these (validate reports them all).
SYNTAX_CODES = frozenset({"empty", "missing-header", "duplicate-header", "header-order", "header-value",
                          "unknown-header", "unknown-voice", "token", "structure", "unterminated-bar", "empty-bar"})


_SURROGATE = re.compile("[\ud800-\udfff]")
_BOM = re.compile("\ufeff")
# control characters (Unicode category Cc) other than tab; line ends are split off before: NUL, ESC, DEL, C1 …
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# the control characters that end a line, for str.rstrip: a regex `[…]+\Z` tried every start of a run of them, and a
# 100 kB paste of BEL characters on one line took 28 s to analyze and 56 s per score tool (break-it review, stop 55)
_CONTROL_CHARS = "".join(chr(c) for c in range(0xA0) if _CONTROL.match(chr(c)))
LINE_END = re.compile(r"\r\n|\r|\n")  # what the vendor's str.splitlines() and Python's universal newlines split at


def split_lines(text: str) -> list[str]:
    """Source lines without their line ends, split at LF, CR LF and a lone CR, as the vendor's checker
    (`str.splitlines`) and the command line read them [V]. Columns are unchanged (a line end is never inside a line);
    `line_ends(text)` gives the ends, so text can be rebuilt byte for byte."""
    return LINE_END.split(text)


def line_ends(text: str) -> list[str]:
    """The line end after each line of `split_lines(text)` but the last ("\\n", "\\r\\n" or "\\r")."""
    return LINE_END.findall(text)


def scan(text: str) -> AbcScore:
    """Read `text` as far as possible; never raises. Issues are in `score.issues`, sorted by position."""
    if not isinstance(text, str):
        raise AbcError(f"The score must be text (str), not {type(text).__name__}.", code="type")
    lines = split_lines(text)
    # the rules read control characters as spaces, so one stray NUL (an editor's bad save) is one finding
    # (`_control_issue`), not a phantom music line and a "cut off" last bar too; columns are unchanged. Those that
    # end a line are dropped: as a space they were a second finding, "Write M:4/4 without spaces" for `M:4/4<ESC>`
    # (leftover of the stop-45 break-it review); no column before them moves
    clean = [_CONTROL.sub(" ", line.rstrip(_CONTROL_CHARS)) for line in lines]
    blank = not text.replace("\ufeff", "").strip()  # a byte-order mark alone is empty (protocol.blank_score)
    bom = text.startswith("\ufeff") and not blank
    marks = _inner_marks(lines, bom)
    if bom or marks:  # the rules read the score without its byte-order marks, each named once (break-it review,
        # stop 53: a leading one gave "no ABC header" for a score that visibly starts with X:1, and the rest of the
        # score was not checked; one inside gave a `token` error, or an unreadable line); the columns of what they
        # find are the text's (`_text_column`)
        clean = [line.replace("\ufeff", "") for line in clean]
    header, body_start, issues = parse_header(clean) if not blank else (None, 0, [])
    if header is None:
        from .model import Header
        score = AbcScore(text, lines, Header())
        score.issues.append(Issue("error", "empty", "The score is empty; paste a score that starts with the header "
                                  "X:1, T:, M:, L:, Q:, the two V: definitions and K:.", 1, 1))
        return score
    score = AbcScore(text, lines, header, issues=issues)
    read = len(score.issues)  # the header's findings; the checks below read the text itself: their columns are its own
    if bom:
        score.issues.append(Issue("error", "byte-order-mark", "The score starts with a byte-order mark (U+FEFF), an "
                                  "invisible character that an editor saving \"UTF-8 with BOM\" writes before X:1: "
                                  "the model would read it as text (the planner never writes it). Delete it, or save "
                                  "the file as UTF-8 without BOM.", 1, 1))
    _inner_mark_issue(marks, score.issues)
    _line_end_issue(text, score.issues)
    _surrogate_issue(lines, score.issues)
    _control_issue(lines, score.issues)
    of_text = score.issues[read:]
    _Body(score, clean, body_start).run()
    if bom or marks:
        score.issues[:] = [i if any(i is t for t in of_text) else _text_column(i, lines) for i in score.issues]
    score.issues.sort(key=lambda i: (i.line or 0, i.column or 0))
    return score


def _inner_marks(lines: list[str], leading: bool) -> list[tuple[int, int]]:
    """(line, column) of every byte-order mark (U+FEFF) but the score's leading one (`leading`: it is there)."""
    return [(number, match.start() + 1) for number, line in enumerate(lines, 1) for match in _BOM.finditer(line)
            if not (leading and number == 1 and match.start() == 0)]


def _text_column(issue: Issue, lines: list[str]) -> Issue:
    """`issue` found on the lines read without their byte-order marks, with its column in the text as written."""
    if not issue.line or not issue.column or issue.line > len(lines) or "\ufeff" not in lines[issue.line - 1]:
        return issue
    index = issue.column - 1
    for match in _BOM.finditer(lines[issue.line - 1]):
        if match.start() <= index:
            index += 1
    return replace(issue, column=index + 1)


def _inner_mark_issue(marks: list[tuple[int, int]], issues: list[Issue]) -> None:
    """An error for byte-order marks after the score's first character — two files joined together, the second
    saved as "UTF-8 with BOM" (stop-53 review: each was `'\\ufeff': this is not a note …`, and one before a field,
    a selector or a comment made the line unreadable: "Music before any voice selector", a header missing). Named
    once, with the count; the score tools refuse it (`readable`: the rules read the score without them, so the
    columns of its notes are not the text's, which the tools edit)."""
    if not marks:
        return
    number, column = marks[0]
    more = f" ({len(marks)} byte-order marks in all)" if len(marks) > 1 else ""
    issues.append(Issue("error", "byte-order-mark", f"A byte-order mark (U+FEFF) inside the score{more}: an invisible "
                        "character that an editor saving \"UTF-8 with BOM\" writes at the start of a file, here "
                        "likely where two files were joined; the model would read it as text, and the score tools "
                        "refuse it. Delete it.", number, column))


def _surrogate_issue(lines: list[str], issues: list[Issue]) -> None:
    """An error for the first unpaired surrogate (U+D800…U+DFFF alone, e.g. from a JSON "\\ud800" escape or bytes
    that were not UTF-8): such text is not valid Unicode, cannot be encoded as UTF-8 or tokenized, and the Composer
    and the command line refuse it (protocol.SongRequest.validate)."""
    found = [(number, match.start() + 1) for number, line in enumerate(lines, 1) for match in _SURROGATE.finditer(line)]
    if not found:
        return
    count = len(found)
    number, column = found[0]
    line = lines[number - 1]
    more = f" ({count} such characters in all)" if count > 1 else ""
    issues.append(Issue("error", "encoding", f"Character U+{ord(line[column - 1]):04X} is an unpaired surrogate, not "
                        f"valid Unicode text{more}: the score cannot be encoded as UTF-8 or tokenized, and the "
                        f"Composer refuses it. Delete it (it comes from a broken \\u escape or from bytes that were "
                        f"not UTF-8).", number, column))


def _control_issue(lines: list[str], issues: list[Issue]) -> None:
    """An error for the first control character (category Cc but tab; NUL, ESC, DEL …) with the count of all: it is
    invisible in an editor, the model reads it as text, and no ABC tool writes it. The rules read it as a space."""
    found = [(number, match.start() + 1) for number, line in enumerate(lines, 1) for match in _CONTROL.finditer(line)]
    if not found:
        return
    number, column = found[0]
    code = ord(lines[number - 1][column - 1])
    name = {0: " (NUL)", 27: " (ESC)", 127: " (DEL)"}.get(code, "")
    more = f" ({len(found)} control characters in all)" if len(found) > 1 else ""
    issues.append(Issue("error", "control-character", f"Control character U+{code:04X}{name}{more}: invisible in an "
                        "editor, but the model would read it as text. Delete it (a broken save or a paste from a "
                        "terminal leaves such bytes).", number, column))


def _line_end_issue(text: str, issues: list[Issue]) -> None:
    """One warning when lines end in CR LF or a lone CR: the score reads the same, but the model is given the text as
    it is, and the planner only ever writes LF (its tokens for CR differ)."""
    ends = set(line_ends(text))
    if ends - {"\n"}:
        kind = "CR (old Mac)" if "\r" in ends else "CR LF (Windows)"
        first = next(i for i, end in enumerate(line_ends(text)) if end != "\n") + 1
        issues.append(Issue("warning", "line-ends", f"Lines end in {kind}; they are read as line breaks, but the "
                            f"model is given the characters as they are and the planner writes LF only. Save the "
                            f"score with LF line ends for the tokens the model knows.", first, 1))


def parse(text: str, edit: bool = False) -> AbcScore:
    """Parse a score of the native two-voice dialect.

    Returns an `AbcScore` whose elements carry their source line and column; lengths are exact `Fraction`s in units
    of L:. Raises `AbcError` (a `ValueError`) for text that cannot be read as the dialect: empty text, a missing,
    duplicated, misplaced or malformed header line, an unknown field or voice, a token that is not a note, rest,
    chord symbol, tuplet, broken-rhythm mark or bar line, music outside a voice, an empty or unterminated bar (an
    unterminated final bar is truncation, a warning). The error's `issues` hold everything that was found.
    Musical problems (bar lengths, group pairing, ranges, ties) do not raise; `validate` reports them.
    `edit` (the score tools, which edit the text at the parsed columns): a byte-order mark after the first character
    raises too (`readable`); reading callers — structure, timeline, engraving, bar times — take such a score, whose
    mark `validate` still reports (review 53b: since the marks were named, one in a comment or a title made every
    caller refuse a score that had parsed before).
    """
    return readable(scan(text), edit)


def readable(score: AbcScore, edit: bool = False) -> AbcScore:
    """`score` itself if it has no error in `SYNTAX_CODES` (nor, for `edit`, a byte-order mark after the score's
    first character: `_inner_mark_issue`), else raise `AbcError` for the first such error."""
    fatal = [i for i in score.issues if i.severity == "error" and (
        i.code in SYNTAX_CODES or edit and i.code == "byte-order-mark" and (i.line, i.column) != (1, 1))]
    if fatal:
        raise AbcError.from_issue(fatal[0], tuple(score.issues))
    return score


def _has_events(tokens) -> bool:
    """True when a bar's tokens include a note or rest (a bar of only chord symbols/keys has no time)."""
    return any(t.kind in ("note", "rest", "bar-rest") for t in tokens)


class _Body:
    """One pass over the body lines, building groups, bars and sections."""

    def __init__(self, score: AbcScore, lines: list[str], start: int):
        self.score = score
        self.lines = lines
        self.start = start
        header = score.header
        self.states = {v: VoiceState(v, header.meter, header.key, header.unit) for v in VOICES}
        self.builders = {v: BarBuilder(self.states[v], score.issues) for v in VOICES}
        self.voice: str | None = None  # current voice; "?" after an unknown selector
        self.awaiting_music = False
        self.group: Group | None = None
        self.pending_sections: list[tuple[str, int]] = []
        self.warned: set[str] = set()
        self.last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)

    def issue(self, severity, code, message, line, column=1, bar=None, voice=None):
        self.score.issues.append(Issue(severity, code, message, line, column, bar, voice))

    def warn_once(self, key, message, line, column=1):
        if key not in self.warned:
            self.warned.add(key)
            self.issue("warning", "dialect", message, line, column)

    def run(self) -> None:
        for index in range(self.start, len(self.lines)):
            self.line(index, self.lines[index])
        self.finish()

    # -- line dispatch -------------------------------------------------------------------------------------------
    def line(self, index: int, text: str) -> None:
        number = index + 1
        if not text.strip():
            if index < self.last:
                self.warn_once("blank", "Blank lines are not part of the dialect (in ABC a blank line ends the "
                               "tune); remove them.", number)
            elif self.last >= 0 and index < len(self.lines) - 1 or text:  # not the end of the final line
                self.warn_once("blank-end", "The score ends with a blank line after its last group; remove it (the "
                               "planner ends the score with the last music line, and the vendor's checker refuses "
                               "it).", number)
            return
        if text.startswith("%"):
            self.comment(text, number)
        elif is_field_line(text):
            self.field(text, number, index)
        elif self.voice is None:
            if "outside" not in self.warned:
                self.warned.add("outside")
                self.issue("error", "structure", "Music before any voice selector; every music line follows a "
                           "V: Vocal or V: Ins line.", number)
        elif self.voice != "?":
            self.music(text, number, index)

    def comment(self, text: str, number: int) -> None:
        if text.startswith("%%"):
            self.warn_once("directive", "%% directives are not part of the dialect and are ignored.", number)
            return
        label = text[1:].strip()
        if text[1:2] != " " or not label or text != text.rstrip():
            shown = text if len(text) <= 30 else text[:27] + "..."
            self.warn_once(f"comment-{number}", f"Comment line {shown!r}: the dialect writes a section comment as "
                           f"'% label' (percent, one space, the label, nothing after); the vendor's checker refuses "
                           f"other comment lines.", number)
        if not label:
            return
        if self.awaiting_music:
            self.warn_once("comment-in-group", "A comment between a V: line and its music line; section comments "
                           "go before V: Vocal at the start of a group.", number)
        self.pending_sections.append((label, number))

    def field(self, text: str, number: int, index: int) -> None:
        name, value = text[0], text[2:]
        if name == "V":
            self.selector(text, value, number, index)
        elif name in ("M", "K"):
            self.change(name, value, number)
        elif name in ("w", "W"):
            self.warn_once("lyrics", "w:/W: lyrics lines are not part of the dialect; the model takes lyrics "
                           "from the lyrics prompt, not from the score.", number)
            voice = self.voice if self.voice in VOICES else None
            self.score.lyrics.append(LyricsLine(name, value.strip(), number, voice))
        else:
            self.issue("error", "unknown-header", f"Field {name}: is not allowed in the body; after the header "
                       f"only V: selectors and M:/K: changes (right after a V: line) may appear.", number)

    def selector(self, text: str, value: str, number: int, index: int) -> None:
        name, rest = VOICE_VALUE.match(value).groups()
        if name not in VOICES:
            if index == self.last and any(f"V: {v}".startswith(text.strip()) for v in VOICES):
                self.truncated(number, "The score ends inside a voice selector line.")
            else:
                self.issue("error", "unknown-voice", f"Voice '{_shown(name)}' is not part of the dialect; the only "
                           f"voices are Vocal and Ins (V: Vocal, V: Ins).", number)
            self.voice = "?"
            return
        if text != f"V: {name}":
            self.warn_once(f"selector-{name}", f"Write the selector as 'V: {name}' (with one space, nothing "
                           f"after), as the planner does.", number)
        groups = self.score.groups
        if name == "Vocal" or self.group is None or name in self.group.selectors:
            self.group = Group(len(groups) + 1, number)
            groups.append(self.group)
            first_bar = len(self.states[name].bars) + 1
            for label, line in self.pending_sections:
                self.score.sections.append(Section(label, line, first_bar))
            self.pending_sections = []
        self.group.selectors[name] = number
        self.group.lines.setdefault(name, [])
        self.voice = name
        self.awaiting_music = True

    def change(self, name: str, value: str, number: int) -> None:
        parser = parse_meter if name == "M" else parse_key
        parsed, reason = parser(value)
        if parsed is None:
            self.issue("error", "header-value", reason + ".", number)
            return
        if reason:
            self.issue("warning", "dialect", reason[0].upper() + reason[1:] + "; the planner always does.", number)
        voices = [self.voice] if self.voice in VOICES else list(VOICES)
        if self.voice not in VOICES:
            self.warn_once("field-outside", f"An {name}: line outside a group applies to both voices; the dialect "
                           f"writes it after each V: selector.", number)
        for voice in voices:
            state = self.states[voice]
            if name == "M":
                state.meter = parsed
            else:
                state.key = parsed
            self.score.changes.append(FieldChange(name, value.strip(), number, voice, len(state.bars) + 1))

    # -- music ---------------------------------------------------------------------------------------------------
    def music(self, text: str, number: int, index: int) -> None:
        voice = self.voice
        group = self.group
        if not self.awaiting_music:
            self.warn_once(f"lines-{group.number}-{voice}", f"Group {group.number} has more than one music line for "
                           f"{voice}; the dialect writes one line per voice per group.", number)
        self.awaiting_music = False
        music_line = MusicLine(voice, number)
        group.lines[voice].append(music_line)
        builder = self.builders[voice]
        tokens = tokenize(text)
        final = index == self.last
        current: list = []
        bar_start = 0
        readable = True
        seen_bar_line = False
        for token in tokens:
            if token.kind == "comment":
                break
            if token.kind == "bar":
                if token.text != "|":
                    self.warn_once("barline", f"Bar line {token.text!r} is not part of the dialect (only '|'); "
                                   f"repeats are not played and the planner never writes them.", number,
                                   token.start + 1)
                if readable and current and not _has_events(current):
                    self.issue("error", "empty-bar", "This bar holds no note or rest (only a chord symbol or key "
                               "change); chord symbols sit on a note or rest of the bar they sound in.", number,
                               bar_start + 1, len(self.states[voice].bars) + 1, voice)
                elif current or not readable:  # an unreadable bar still counts, so group sizes stay right
                    span = (bar_start + 1, token.start + 1)
                    music_line.bars += builder.build(current, number, span, token.text, True, readable)
                elif seen_bar_line:
                    self.issue("error", "empty-bar", "Empty bar between two bar lines; every bar holds notes or "
                               "rests (Z for a whole-bar rest).", number, token.start + 1, voice=voice)
                current, readable, bar_start, seen_bar_line = [], True, token.end, True
                continue
            if token.kind == "error":
                tail = "|" not in text[token.start:]
                if final and tail:
                    self.truncated(number, "The last bar is cut off (it has no closing bar line and ends in an "
                                   "unfinished symbol).", token.start + 1)
                    break
                readable = False
                self.issue("error", "token", f"{token.text[:20]!r}: {token.reason}.", number, token.start + 1,
                           len(self.states[voice].bars) + 1, voice)
                continue
            if not readable:
                continue
            current.append(token)
        if current or not readable:
            if final:
                span = (bar_start + 1, len(text.rstrip()) + 1)
                if _has_events(current):  # a cut tail of only a chord symbol has no time: kept as text only
                    music_line.bars += builder.build(current, number, span, "", False, readable)
                self.truncated(number, "The last bar has no closing bar line.", span[0])
            else:
                self.issue("error", "unterminated-bar", "This music line does not end with a bar line; every music "
                           "line ends with |.", number, len(text.rstrip()) + 1, voice=voice)

    def truncated(self, number: int, detail: str, column: int = 1) -> None:
        if not self.score.truncated:
            self.score.truncated = True
            self.issue("warning", "truncated", f"{detail} This is what the planner writes when it runs out of ABC "
                       f"tokens: the score is unfinished. Regenerate with a larger ABC budget or finish the last "
                       f"group (every group needs a complete V: Vocal and V: Ins line).", number, column)

    # -- end of text ---------------------------------------------------------------------------------------------
    def finish(self) -> None:
        score = self.score
        for voice, state in self.states.items():
            score.voices[voice] = state.bars
        group = self.group
        if self.awaiting_music and self.voice in VOICES:
            self.truncated(group.selectors[self.voice], f"The score ends after V: {self.voice} without its music "
                           f"line.")
        elif group is not None and "Vocal" in group.selectors and "Ins" not in group.selectors \
                and any(g.lines.get("Ins") for g in score.groups):
            self.truncated(group.line, "The last group has a V: Vocal line but no V: Ins line.")
        if not score.truncated:
            for voice, state in self.states.items():
                if state.tie_from is not None:
                    note = state.tie_from
                    self.issue("warning", "tie", f"The tie on line {note.line}, column {note.column} is not "
                               f"continued; the score ends while it is open.", note.line, note.column, voice=voice)
        if self.pending_sections and not score.truncated:
            label, line = self.pending_sections[0]
            self.issue("warning", "dialect", f"Section comment '% {_shown(label)}' is not followed by any music; a "
                       f"section comment opens the group after it.", line)
        if not any(score.voices.values()):
            if score.header.fields:
                self.issue("error", "empty", "The score has a header but no music; add groups of V: Vocal and V: "
                           "Ins music lines.", score.header.end_line or 1)
            else:  # no header either (e.g. comments only): that finding already names the first line
                self.issue("error", "empty", "The score has no music either; after the header, add groups of V: "
                           "Vocal and V: Ins music lines.", max(1, self.last + 1))
