"""Apply column-range replacements to source text, leaving every other byte (line ends included) as it was."""

from __future__ import annotations

from dataclasses import dataclass

from .parser import line_ends, split_lines


@dataclass(frozen=True)
class Edit:
    """Replace columns [start, end) of 1-based `line` (1-based columns, end exclusive) with `text`."""

    line: int
    start: int
    end: int
    text: str


def apply_edits(source: str, edits: list[Edit]) -> str:
    """`source` with `edits` applied. Edits on one line must not overlap (checked)."""
    lines = split_lines(source)
    by_line: dict[int, list[Edit]] = {}
    for edit in edits:
        by_line.setdefault(edit.line, []).append(edit)
    for number, line_edits in by_line.items():
        line = lines[number - 1]
        ordered = sorted(line_edits, key=lambda e: e.start, reverse=True)
        for later, earlier in zip(ordered, ordered[1:]):
            if earlier.end > later.start:
                raise AssertionError(f"overlapping edits on line {number}")
        for edit in ordered:
            line = line[:edit.start - 1] + edit.text + line[edit.end - 1:]
        lines[number - 1] = line
    ends = line_ends(source) + [""]
    return "".join(line + end for line, end in zip(lines, ends))
