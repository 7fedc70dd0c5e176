"""Stop-55 diff review: the break-it review's speed-ups of the ABC toolkit against the code they replaced.

The lexer's inline field (a regex for the whole `[X:value]` → the next "]" found once per stretch), the parser's
control characters ending a line (a regex `[…]+\\Z` → str.rstrip) and the structure's sections (every section
looking at all later ones → one pass) must give what the old code gave on every input, except the named fix: an
inline field never closed on its line is one error token now. Each old version is written out here as it was at
5028d9f (the lexer's by putting the old regex back in place of `_inline`), and random and hand-made input is compared.
"""

from __future__ import annotations

import random
import re

from yue2_core.abc import lexer, parse, structure, validate
from yue2_core.abc.parser import _CONTROL, _CONTROL_CHARS

HEAD = ('X:1\nT:\nM:4/4\nL:1/16\nQ:1/4=96\nV: Vocal clef=treble name="Vocal Melody" snm="Vocal"\n'
        'V: Ins clef=treble name="Ins Melody" snm="Inst."\nK:G\n')
OLD_INLINE = re.compile(r"\[(?P<field>[A-Za-z]):(?P<value>[^\]\n]*)\]")  # lexer.py at 5028d9f
UNCLOSED = re.compile(r"\[[A-Za-z]:(?!.*\])")  # an inline field with no "]" after it on the line
FRAGMENTS = ["[K:", "[K:D]", "[K:Em", "]", "[", "[Q:1/4=90", "[M:3/4]", "[|", "|]", "|", "||", ":|", "|:", "::", "C",
             "D4", "E8", "G16", "c'", "_B,", "^F2-", "z4", "x8", "Z", "Z2", "(3", ">", "<<", '"C"', '"Am7"', '"', " ",
             "\t", "%", "K", ":", "D]", "[k:", "[1:", "x", "[CEG]", "!", ".", "-", "\\", "{", "é", "\x07", "[K:]"]


def _tokens(line: str) -> list:
    return [(t.kind, t.start, t.end, t.text, t.groups, t.reason) for t in lexer.tokenize(line)]


def _old_inline(line, pos, closes):
    match = OLD_INLINE.match(line, pos)
    return None if match is None else lexer.Token("inline", pos, match.end(), match.group(0), match.groupdict())


def test_the_lexer_reads_every_line_as_before_up_to_an_unclosed_inline_field(monkeypatch):
    rng = random.Random(55)
    alphabet = '[]KQk:|CDzZ2/"% \t-(3>x'
    lines = ["[K:D]G16|", "C8[K:D]D8|", "[K:D[K:E]C|", "[K:Bb]|[M:3/4]", "[|K:D]", "[K:]C", "[K:D C16|", "[K:" * 5]
    lines += ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 12))) for _ in range(6_000)]
    lines += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))) for _ in range(6_000)]
    new = [_tokens(line) for line in lines]
    monkeypatch.setattr(lexer, "_inline", _old_inline)
    old = [_tokens(line) for line in lines]
    unclosed = 0
    for line, before, now in zip(lines, old, new):
        first = UNCLOSED.search(line)
        if first is None:
            assert now == before, line
            continue
        unclosed += 1
        assert [t for t in now if t[2] <= first.start()] == [t for t in before if t[2] <= first.start()], line
        for token in now:  # one that is not inside a comment, a chord symbol or an earlier field is an error
            if token[1] == first.start():
                assert token[0] == "error" and "is not closed with ']'" in token[5], (line, token)
    assert 1_000 < unclosed < len(lines) - 5_000  # both kinds of line were compared


def test_an_unclosed_key_change_is_advised_only_as_a_key():
    """The unclosed field's advice quoted what followed `[K:` up to a space, "|", '"' or "[" as the key to write:
    `[K:Dc4d4e4f4|` (the "]" left out before the notes) was advised as "[K:Dc4d4e4f4]", no key the dialect has."""
    for bar, advice in (("[K:Dc4d4e4f4|", "[K:D]"), ("C8[K:DD8|", "[K:D]"), ("C8[K:em C8|", "[K:D]"),
                        ("C8[K:Bb C8|", "[K:Bb]"), ('C8[K:F#m"C"D8|', "[K:F#m]")):
        [error] = [i for i in validate(HEAD + f"V: Vocal\n{bar}\nV: Ins\nG16|\n") if i.severity == "error"]
        assert error.message.endswith(f"the dialect writes a key change as {advice}."), (bar, error.message)


def test_control_characters_ending_a_line_are_dropped_as_before():
    old = re.compile(f"{_CONTROL.pattern}+\\Z")  # parser.py at 5028d9f
    rng = random.Random(5)
    chars = [chr(c) for c in range(0x100)] + ["\u2028", "\ufeff", "\ud800", "é"]
    lines = ["".join(rng.choice(chars) for _ in range(rng.randint(0, 8))) for _ in range(20_000)]
    lines += [c * 3 for c in chars] + ["a" + c for c in chars]
    assert [line.rstrip(_CONTROL_CHARS) for line in lines] == [old.sub("", line) for line in lines]


def _old_sections(score, total_bars: int) -> list:  # structure.py at 5028d9f
    sections = []
    ordered = sorted(score.sections, key=lambda s: (s.first_bar, s.line))
    for index, section in enumerate(ordered):
        later = [s.first_bar for s in ordered[index + 1:] if s.first_bar > section.first_bar]
        last = (later[0] - 1) if later else total_bars
        bars = max(0, last - section.first_bar + 1)
        onsets = sum(1 for bar in score.voices["Vocal"][section.first_bar - 1:last] for n in bar.notes
                     if n.kind == "note" and not n.tie_continues)
        sections.append({"label": section.label, "line": section.line, "first_bar": section.first_bar,
                         "last_bar": last if bars else None, "bars": bars, "vocal_notes": onsets})
    return sections


def _score(rng) -> str:
    """A score that mostly parses: groups of 0–4 bars, section comments before any of them (none, one, several),
    now and then a group that starts with Ins or has bars in one voice only, comments after the last group."""
    bars = ["G16|", "G8-G8|", "z16|", "G4G4G4G4|", '"C"G16|', "C8[K:D]D8|", "G8-|G8B8|", "B4-B4z8|", "x16|"]
    out = [HEAD.rstrip("\n")]
    for _ in range(rng.randint(0, 12)):
        labels = rng.choice([0, 0, 1, 1, 2, 3])
        out += [rng.choice(["% verse", "% chorus", "% intro", "% bridge"]) for _ in range(labels)]
        count = rng.randint(0, 4)
        order = ["Vocal", "Ins"] if rng.random() < 0.85 else rng.choice([["Ins"], ["Vocal"], ["Ins", "Vocal"]])
        for voice in order:
            out += [f"V: {voice}", "".join(rng.choice(bars) for _ in range(count if rng.random() < 0.9 else
                                                                            rng.randint(0, 5)))]
    out += [rng.choice(["% outro", "% verse", "V: Vocal"]) for _ in range(rng.choice([0, 0, 1, 2]))]
    return "\n".join(out) + "\n"


def test_sections_are_described_as_before():
    rng = random.Random(55)
    compared = 0
    for _ in range(400):
        text = _score(rng)
        try:
            score = parse(text)
        except ValueError:
            continue
        described = structure(text)
        assert described["sections"] == _old_sections(score, described["bars"]["Vocal"]), text
        compared += bool(described["sections"])
    assert compared > 100
