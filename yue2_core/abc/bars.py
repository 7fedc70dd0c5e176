"""Turn the tokens of one bar into a `Bar`: pitches, sounding lengths, onsets, chord symbols and inline keys.

Semantics follow the native dialect [V]: accidentals hold for the letter in every octave until the bar line or an
inline key change; an unmarked note that continues a tie from the same written note keeps the tied pitch (and does not
change the bar's accidentals); ties may cross bar lines but not enter rests. Tuplets `(p:q:r` fit p notes into the
time of q for the next r notes [A]; broken rhythm `>`/`<` dots one note and shortens its neighbour [A] — both are
computed exactly, and warned about because the model flattens them [U entry 11].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from .chords import is_native_quality, split_chord
from .dialect import ACCIDENTALS, MAX_BARS_PER_LINE, NATIVE_LENGTHS, TUPLET_DEFAULT_Q
from .errors import Issue, shown as _shown  # shown: a user's text quoted by its start and length
from .header import parse_key
from .lexer import MAX_DIGITS, Token, parse_length
from .model import Bar, ChordSymbol, InlineKey, Note
from .pitch import natural_midi, signature, written_octave

MAX_MEASURE_REST = 64  # a larger Zn is refused instead of expanded (Z999999 would be a million bars)




@dataclass
class VoiceState:
    """What carries from bar to bar in one voice: meter, key, bar count, elapsed units, an open tie."""

    name: str
    meter: tuple[int, int]
    key: str
    unit: Fraction
    bars: list[Bar] = field(default_factory=list)
    time: Fraction = Fraction(0)
    tie_from: Note | None = None

    @property
    def bar_length(self) -> Fraction:
        """Length of a full bar in units: meter as a whole-note fraction divided by the unit."""
        return Fraction(*self.meter) / self.unit


@dataclass
class _Pending:
    """A note/rest being assembled: its tuplet scale and broken-rhythm factor are applied once the bar is complete."""

    note: Note
    scale: Fraction = Fraction(1)
    factor: Fraction = Fraction(1)


class BarBuilder:
    """Build the bars of one voice from token lists; appends issues to `issues` (shared with the parser)."""

    def __init__(self, state: VoiceState, issues: list[Issue]):
        self.state = state
        self.issues = issues

    # -- entry point ---------------------------------------------------------------------------------------------
    def build(self, tokens: list[Token], line: int, span: tuple[int, int], barline: str, complete: bool,
              readable: bool) -> list[Bar]:
        """Bars for the tokens between two bar lines (several for `Z2`…), appended to the voice state.
        line is 1-based; span = 1-based columns of the bar content (end exclusive)."""
        state = self.state
        if any(t.kind == "bar-rest" for t in tokens):
            return self._measure_rests(tokens, line, span, barline, complete)
        bar = Bar(state.name, len(state.bars) + 1, line, span[0], span, state.meter, state.bar_length,
                  start=state.time, complete=complete, barline=barline, key=state.key, readable=readable)
        self._fill(bar, tokens)
        return [self._append(bar)]

    def _append(self, bar: Bar) -> Bar:
        self.state.bars.append(bar)
        self.state.time += bar.length
        return bar

    def _issue(self, severity: str, code: str, message: str, line: int, column: int, bar: Bar | None = None):
        self.issues.append(Issue(severity, code, message, line, column, bar.number if bar else None,
                                 self.state.name))

    # -- Z / Zn --------------------------------------------------------------------------------------------------
    def _measure_rests(self, tokens, line, span, barline, complete) -> list[Bar]:
        state = self.state
        first = tokens[0]
        written = first.groups.get("count") or ""  # any number of digits (lexer): never int() of a huge one
        count = int(written) if written and len(written) <= MAX_DIGITS else MAX_MEASURE_REST + 1 if written else 1
        too_many = count > MAX_MEASURE_REST
        if too_many:
            self.issues.append(Issue("error", "token", f"{_shown(first.text)} is more bars than a music line holds; "
                                     f"the dialect writes Z2…Z{MAX_BARS_PER_LINE}.", line, first.start + 1,
                                     len(state.bars) + 1, state.name))
            count = 1
        # not after that error too: the same token named twice (review, stop 46: Z65 got both)
        if written and not too_many and (count == 1 or count > MAX_BARS_PER_LINE):
            self._issue("warning", "dialect", f"{_shown(first.text)!r} is not a bar rest the planner writes; it "
                        f"writes Z for one bar and Z2…Z{MAX_BARS_PER_LINE} for several (the vendor's checker refuses "
                        f"{_shown(first.text)}).", line, first.start + 1)
        if len(tokens) != 1 or first.kind != "bar-rest" or count == 0:
            where = next(t for t in tokens if t.kind == "bar-rest")
            self.issues.append(Issue("error", "token", "Z fills whole bars on its own (Z, or Z2…Z4 for several); "
                                     "write it alone between bar lines.", line, where.start + 1,
                                     len(state.bars) + 1, state.name))
            count = max(count, 1)
        if state.tie_from is not None:
            self._tie_into_rest(line, first.start + 1)
        bars = []
        for _ in range(count):
            bar = Bar(state.name, len(state.bars) + 1, line, span[0], span, state.meter, state.bar_length,
                      start=state.time, complete=complete, barline=barline, key=state.key, measure_rest_count=count)
            bar.notes.append(Note("measure-rest", line, first.start + 1, (first.start + 1, first.end + 1),
                                  bar.expected, bar.expected))
            bar.length = bar.expected
            bars.append(self._append(bar))
        return bars

    # -- ordinary bar --------------------------------------------------------------------------------------------
    def _fill(self, bar: Bar, tokens: list[Token]) -> None:
        state = self.state
        local: dict[str, int] = {}
        sig = signature(state.key)
        tuplet = None  # [p, q, remaining, r]
        pending: list[_Pending] = []
        anchors: list[tuple[object, int]] = []  # chord symbols / inline keys and the index of the event they precede
        broken_next: Fraction | None = None
        warned: set[str] = set()
        for token in tokens:
            if token.kind == "chord":
                anchors.append((self._chord(token, bar), len(pending)))
            elif token.kind == "inline":
                key = self._inline_key(token, bar)
                if key is not None:
                    sig, local = signature(key.key), {}
                    state.key = key.key
                    anchors.append((key, len(pending)))
            elif token.kind == "tuplet":
                tuplet = self._tuplet(token, bar, tuplet, warned)
            elif token.kind == "broken":
                broken_next = self._broken(token, bar, pending, warned)
            elif token.kind in ("note", "rest"):
                item = self._event(token, bar, sig, local, warned)
                if item is None:
                    bar.readable = False
                    continue
                if tuplet is not None:
                    item.scale = Fraction(tuplet[1], tuplet[0])
                    item.note.tuplet = (tuplet[0], tuplet[1])
                    item.note.tuplet_edge = "start" if tuplet[3] == tuplet[2] else ""
                    tuplet[2] -= 1
                    if tuplet[2] == 0:
                        item.note.tuplet_edge = (item.note.tuplet_edge + " stop").strip()
                        tuplet = None
                if broken_next is not None:
                    item.factor *= broken_next
                    item.note.broken = True
                    broken_next = None
                pending.append(item)
        if tuplet is not None:
            self._issue("warning", "tuplet", f"A tuplet is still open at the end of bar {bar.number}; it needs "
                        f"{tuplet[2]} more note(s) in this bar.", bar.line, bar.column, bar)
        if broken_next is not None:
            self._issue("error", "token", "A broken-rhythm mark (> or <) needs a note after it in the same bar.",
                        bar.line, bar.column, bar)
            bar.readable = False
        self._place(bar, pending, anchors)

    def _place(self, bar: Bar, pending: list[_Pending], anchors) -> None:
        offset = Fraction(0)
        onsets = []
        for item in pending:
            item.note.length = item.note.written_length * item.scale * item.factor
            item.note.onset = offset
            onsets.append(offset)
            offset += item.note.length
            bar.notes.append(item.note)
        bar.length = offset
        stacked: dict[int, list[ChordSymbol]] = {}  # the chord symbols before each note or rest
        for anchor, index in anchors:
            anchor.onset = onsets[index] if index < len(onsets) else offset
            if index >= len(onsets) and onsets and bar.complete:
                self._after_last_event(anchor, bar)
            elif isinstance(anchor, ChordSymbol):
                stacked.setdefault(index, []).append(anchor)
            (bar.chords if isinstance(anchor, ChordSymbol) else bar.keys).append(anchor)
        for chords in stacked.values():
            if len(chords) > 1:
                self._stacked(chords, bar)

    def _stacked(self, chords: list, bar: Bar) -> None:
        """Chord symbols stacked on one note or rest (`"C""G"C16`, typed or pasted; the planner writes one a note):
        all but the last change the harmony for no time (break-it review, stop 56: not flagged, and the editor's
        playback dropped them without a word). One warning a stack, at its second symbol."""
        first, last, more = chords[0], chords[-1], len(chords) - 2
        before = f'"{_shown(first.text)}" sounds' if not more else f'"{_shown(first.text)}" and {more:,} more sound'
        self._issue("warning", "chord-symbol", f"{len(chords):,} chord symbols stand on one note or rest of bar "
                    f'{bar.number}: the harmony there is the last one, "{_shown(last.text)}"; {before} for no time '
                    f"(the editor's playback skips {'it' if not more else 'them'}). The dialect writes one chord "
                    "symbol a note: keep the one you mean, or split the note where the harmony changes.",
                    chords[1].line, chords[1].column, bar)

    def _after_last_event(self, anchor, bar: Bar) -> None:
        """A chord symbol or [K:] after the bar's last note or rest sits on no event: it sounds nowhere in this bar
        (the vendor's checker refuses it as "event after the measure end" [V])."""
        if isinstance(anchor, ChordSymbol):
            self._issue("warning", "chord-symbol", f'Chord symbol "{_shown(anchor.text)}" comes after the last note '
                        f"or rest of bar {bar.number}, so it sounds over nothing; write it before the note it "
                        f"belongs to (at the start of the next bar if it starts there).", anchor.line, anchor.column,
                        bar)
        else:
            self._issue("warning", "dialect", f"[K:{anchor.key}] comes after the last note or rest of bar "
                        f"{bar.number}; write a key change at the start of the bar it applies to.", anchor.line,
                        anchor.column, bar)

    def _event(self, token: Token, bar: Bar, sig, local, warned) -> _Pending | None:
        state = self.state
        groups = token.groups
        length = parse_length(groups["num"], groups["slash"], groups["den"])
        column = token.start + 1
        if length is None:
            self._issue("error", "token", f"{token.text[:20]!r} has length 0 or an unusable length; lengths are "
                        f"positive multiples of L: such as 2, 3/2 or /2.", bar.line, column, bar)
            return None
        written = Fraction(*length)
        if (written.denominator != 1 or written.numerator not in NATIVE_LENGTHS) and "length" not in warned:
            warned.add("length")
            self._issue("warning", "duration-value", f"Length {token.text!r} is not one the planner writes; it "
                        f"writes whole multiples of L: from {sorted(NATIVE_LENGTHS)} (split other lengths into "
                        f"tied notes).", bar.line, column, bar)
        span = (column, token.end + 1)
        if token.kind == "rest":
            if groups["letter"] == "x" and "x" not in warned:
                warned.add("x")
                self._issue("warning", "dialect", "Invisible rests (x) are not part of the dialect; write z.",
                            bar.line, column, bar)
            if state.tie_from is not None:
                self._tie_into_rest(bar.line, column, bar)
            return _Pending(Note("rest", bar.line, column, span, written, written))
        letter = groups["letter"].upper()
        octave = written_octave(groups["letter"], groups["oct"])
        written_text = groups["letter"] + groups["oct"]
        if "," in groups["oct"] and "'" in groups["oct"]:
            self._issue("warning", "dialect", f"{token.text!r} mixes ' and , octave marks; write one kind.",
                        bar.line, column, bar)
        acc = groups["acc"] or ""
        alter = ACCIDENTALS[acc] if acc else local.get(letter, sig[letter])
        pitch = natural_midi(letter, octave) + alter
        note = Note("note", bar.line, column, span, written, written, letter=letter, written=written_text,
                    accidental=acc, octave=octave,
                    pitch_span=(column, column + len(acc) + len(written_text)), tied=bool(groups["tie"]))
        source = state.tie_from
        if source is not None:
            if not acc and written_text == source.written:
                pitch = source.pitch
            if pitch == source.pitch:
                note.tie_continues = True
            else:
                self._issue("error", "tie", f"The tie from line {source.line}, column {source.column} joins "
                            f"different pitches (MIDI {source.pitch} and {pitch}); a tie holds one pitch.",
                            bar.line, column, bar)
        if acc:
            local[letter] = alter
        note.pitch = pitch
        state.tie_from = note if note.tied else None
        return _Pending(note)

    def _tie_into_rest(self, line: int, column: int, bar: Bar | None = None) -> None:
        source = self.state.tie_from
        self._issue("error", "tie", f"The tie from line {source.line}, column {source.column} runs into a rest; "
                    f"a tie must end on a note of the same pitch.", line, column, bar)
        self.state.tie_from = None

    def _chord(self, token: Token, bar: Bar) -> ChordSymbol:
        text = token.groups["text"]
        column = token.start + 1
        chord = ChordSymbol(text, bar.line, column, (column, token.end + 1), Fraction(0))
        parts = split_chord(text)
        if parts is None:
            chord.known = chord.native = False
            self._issue("error", "chord-symbol", f'"{_shown(text)}" is not a chord symbol the dialect reads: a '
                        f'root A-G (with #, b), a quality such as m, 7, maj7, m7, dim, aug, sus4, and an optional '
                        f'/bass, e.g. "F#m/C#". Text annotations are not part of the dialect.', bar.line, column, bar)
            return chord
        chord.root, chord.quality, chord.bass = parts
        chord.native = is_native_quality(chord.quality)
        if not chord.native:
            self._issue("warning", "chord-symbol", f'The quality "{_shown(chord.quality)}" in "{_shown(text)}" '
                        f"is not one the planner writes (its qualities: major, m, dim, aug, 7, maj7, m7, dim7, m7b5, "
                        f"sus4, sus2, 6, m6, 7sus4, m(maj7)); the model has not seen it.", bar.line, column, bar)
        if self.state.name != "Vocal":
            self._issue("warning", "chord-in-ins", f'Chord symbol "{_shown(text)}" is on the {self.state.name} '
                        f"voice; the dialect writes chord symbols on the Vocal voice only (also over its rests).",
                        bar.line, column, bar)
        return chord

    def _inline_key(self, token: Token, bar: Bar) -> InlineKey | None:
        column = token.start + 1
        if token.groups["field"] != "K":
            self._issue("error", "token", f"Inline field {token.text!r} is not part of the dialect; only [K:key] may "
                        f"appear inside a bar (meter changes go on an M: line after the V: selector).",
                        bar.line, column, bar)
            bar.readable = False
            return None
        key, reason = parse_key(token.groups["value"])
        if key is None:
            self._issue("error", "header-value", reason + ".", bar.line, column, bar)
            return None
        value = token.groups["value"]
        value_start = column + 3 + len(value) - len(value.lstrip())  # "[K:" then optional spaces
        return InlineKey(key, bar.line, column, (column, token.end + 1), (value_start, value_start + len(key)),
                         Fraction(0))

    def _tuplet(self, token: Token, bar: Bar, active, warned):
        column = token.start + 1
        p_text = token.groups["p"]  # any number of digits (lexer): never int() of a huge one
        p = int(p_text) if len(p_text) <= MAX_DIGITS else None
        if active is not None or p is None or not 2 <= p <= 9:
            problem = "nested tuplets are not supported" if active is not None else \
                f"({p} is not a tuplet (2-9)" if p is not None else f"{_shown('(' + p_text)} is not a tuplet (2-9)"
            self._issue("error", "token", f"{problem}.", bar.line, column, bar)
            bar.readable = False
            return active
        q_text, r_text = token.groups.get("q"), token.groups.get("r")
        if len(q_text or "") > 3 or len(r_text or "") > 3:
            self._issue("error", "token", f"{_shown(token.text)!r}: tuplet counts q and r are 1 to 999 "
                        "(p:q:r, e.g. (3:2:3)).", bar.line, column, bar)
            bar.readable = False
            return None
        if q_text:
            q = int(q_text)
        else:
            compound = self.state.meter[0] % 3 == 0 and self.state.meter[0] > 3
            q = TUPLET_DEFAULT_Q.get(p, 3 if compound else 2)
        r = int(r_text) if r_text else p
        if q == 0 or r == 0:
            self._issue("error", "token", f"{token.text!r}: tuplet counts must be positive.", bar.line, column, bar)
            bar.readable = False
            return None
        if "tuplet" not in warned:
            warned.add("tuplet")
            self._issue("warning", "tuplet", f"Bar {bar.number} has a tuplet {token.text!r}; the planner writes on "
                        f"a straight grid and the model flattens tuplets, so this rhythm will not be kept. Write "
                        f"the notes on the straight grid instead.", bar.line, column, bar)
        return [p, q, r, r]

    def _broken(self, token: Token, bar: Bar, pending: list[_Pending], warned) -> Fraction | None:
        column = token.start + 1
        if not pending:
            self._issue("error", "token", "A broken-rhythm mark (> or <) needs a note before it in the same bar.",
                        bar.line, column, bar)
            bar.readable = False
            return None
        if "broken" not in warned:
            warned.add("broken")
            self._issue("warning", "broken-rhythm", f"Bar {bar.number} uses broken rhythm {token.text!r} (swing "
                        f"dotting); the model flattens it. Write the dotted lengths explicitly (e.g. c3c instead "
                        f"of c2>c2 with L:1/16).", bar.line, column, bar)
        short = Fraction(1, 2 ** len(token.text))
        long = 2 - short
        first, second = (long, short) if token.text[0] == ">" else (short, long)
        pending[-1].factor *= first
        pending[-1].note.broken = True
        return second
