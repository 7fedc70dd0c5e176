"""Scores between nodes: edited text → Score, and the ABC checks the editor and the composer report.

The ABC Editor has no model (and so no tokenizer). When its text differs from the score it received it emits an
*untokenized* user Score: source "user", the edited text, no ids. The composer turns it into a real one with its
model's tokenizer (`tokenized`); an unchanged score is passed on as is, so its exact ids (what the planner sampled)
reach the music stage untouched.
"""
from __future__ import annotations

from yue2_core import abc
from yue2_core.pipeline import Score
from yue2_core.protocol import score_notes

MAX_LISTED = 8
DURATION_INPUT = "the Composer's max_seconds input"  # what the too-long advice names in ComfyUI (not --max-seconds)


def edited_score(text: str, base: Score | None) -> Score:
    """`text` as a user score whose ids are not known yet; cot and seed come from `base` when there is one."""
    cot = base.cot if base is not None and base.cot != "off" else "full"
    return Score(abc=text, abc_ids=[], cot=cot, seed=base.seed if base is not None else 0, source="user",
                 timing={"edited": True})


def needs_tokens(score: Score) -> bool:
    return score.source == "user" and bool(score.abc) and not score.abc_ids


def tokenized(score: Score, tokenizer, cot: str) -> Score:
    """The score the music stage reads: an untokenized user score becomes Score.from_text(text) for `cot` (the
    composer's mode); any other score is returned unchanged (exact ids)."""
    if needs_tokens(score):
        return Score.from_text(score.abc, tokenizer, cot, score.seed)
    return score


def check(text: str) -> tuple[list, list]:
    """(errors, warnings) of yue2_core.abc.validate."""
    issues = abc.validate(text)
    return [i for i in issues if i.severity == "error"], [i for i in issues if i.severity != "error"]


def given_score_notes(text: str, max_seconds: float | None, cot: str | None = None,
                      duration_setting: str = DURATION_INPUT) -> list[str]:
    """The Composer's notes on a score given as text (abc_text, or an edited score): the same rule and the same
    lines as the command line's --abc-file (`protocol.score_notes`: used as given, every dialect finding with its
    line and severity, the too-long check against `max_seconds`, control characters named, chords with cot
    "melody"). Regenerate and Continue give an edited score the same notes, naming their own duration input."""
    return [_given(note) for note in score_notes(text, max_seconds, limit=MAX_LISTED, cot=cot,
                                                  duration_setting=duration_setting)]


def _given(note: str) -> str:
    """A note of `protocol.score_notes` as the nodes say it: "score line 3 column 19: …" becomes "the given score
    line 3 column 19: …" and "the score has …" "the given score has …" (before: "the given score score line …" and
    "the given score the score …")."""
    if note.startswith(("score ", "score:")):
        return "the given " + note
    return "the given score " + note.removeprefix("the score ")


def describe(issues, limit: int = MAX_LISTED) -> str:
    """One issue per line, "score line N column C: message" (the CLI's and the Composer's format); the count of the
    rest at the end."""
    lines = [f"score {i.located()}" if i.line else i.message for i in issues[:limit]]
    if len(issues) > limit:
        lines.append(f"(+{len(issues) - limit} more)")
    return "\n".join(lines)
