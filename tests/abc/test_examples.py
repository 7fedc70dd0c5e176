"""The files in examples/ that the README points users to are valid inputs: the lead sheet passes the dialect check
that `generate --abc-file` and the Composer apply (no finding at all, not even a warning, within the 120 s that
README's command asks for), and the batch request file parses into its three requests with no refused row."""
from __future__ import annotations

from pathlib import Path

from yue2_core.abc.parser import parse
from yue2_core.abc.validate import validate
from yue2_core.batch.requests import read_requests

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_example_lead_sheet_is_clean_dialect():
    text = (EXAMPLES / "text2music_lead_sheet.abc").read_text(encoding="utf-8")
    assert validate(text, max_seconds=120) == []
    score = parse(text)
    labels = [line[1:].strip() for line in text.splitlines() if line.startswith("%")]
    assert labels == ["verse", "verse", "chorus", "chorus"]  # the example lyrics' sections, in order
    assert score.header.key == "G" and score.header.meter == (4, 4)
    # a line that breaks the dialect is caught by the same check (the test can fail)
    broken = text.replace('"D"A24z8|', '"D"A24|', 1)
    assert any(issue.severity == "error" for issue in validate(broken))


def test_example_batch_requests_parse():
    rows, refused = read_requests(EXAMPLES / "batch_requests.jsonl")
    assert refused == []
    assert [r.id for r in rows] == ["city-lights", "river-song", "night-drive"]
