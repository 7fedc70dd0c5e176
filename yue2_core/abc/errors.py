"""The one error type of the ABC package and the `Issue` record every check reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import ScoreError


def shown(text: str, limit: int = 40) -> str:
    """A user's text as a message quotes it: at most `limit` characters, the rest elided with its length (break-it
    findings: a 10 kB chord symbol, stop 43: a 190 kB comment line, voice name or K: value, echoed whole)."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def place(line: int | None, column: int | None = None) -> str:
    """Where a finding is, in the one format every score message uses (CLI, batch, nodes, editor): "line 3 column 19",
    "line 3" when the column is unknown, "" when neither is (stop-50 leftover: score warnings came as "line 1: …" from
    the dialect check and as "score line 1 column 19: …" from the control-character check)."""
    if not line:
        return ""
    return f"line {line} column {column}" if column else f"line {line}"


@dataclass(frozen=True)
class Issue:
    """One finding about a score.

    severity: "error" (the score is not usable as written) or "warning" (usable, but the model or our tools will not
    do what the text suggests). line and column are 1-based (column counts characters, not bytes); bar is the 1-based
    bar number within `voice`, or None when the finding is not about a bar. code is a short stable id the UI can key
    on (see `validate` for the list); message is a sentence that says what is wrong and what is accepted.
    """

    severity: str
    code: str
    message: str
    line: int | None = None
    column: int | None = None
    bar: int | None = None
    voice: str | None = None

    def located(self) -> str:
        """The message after its place: "line 3 column 19: message" (the place as `place` writes it)."""
        where = place(self.line, self.column)
        return f"{where}: {self.message}" if where else self.message

    def to_dict(self) -> dict:
        """Plain JSON-ready dict with all seven fields."""
        return asdict(self)


class AbcError(ScoreError):
    """A score that cannot be parsed, or a score tool asked to do something it cannot do.

    A `ValueError` (through `ScoreError`), so callers that catch either keep working. `line`/`column` locate the
    first problem (1-based, None when not about a place); `code` is the `Issue` code; `issues` holds every problem
    found, so a caller can show them all.
    """

    def __init__(self, message: str, *, code: str = "invalid", line: int | None = None, column: int | None = None,
                 issues: tuple[Issue, ...] = ()):
        where = place(line, column)
        super().__init__((where + ": " if where else "") + message)
        self.message = message
        self.code = code
        self.line = line
        self.column = column
        self.issues = tuple(issues)

    @classmethod
    def from_issue(cls, issue: Issue, issues: tuple[Issue, ...] = ()) -> AbcError:
        """The error that reports `issue` first and carries `issues`."""
        return cls(issue.message, code=issue.code, line=issue.line, column=issue.column, issues=issues or (issue,))
