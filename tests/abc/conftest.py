"""Shared fixtures for the ABC tests: the repository on sys.path and the corpus files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CORPUS = Path(__file__).with_name("corpus")
CASES = json.loads((CORPUS / "cases.json").read_text(encoding="utf-8"))
GENERATED = json.loads((CORPUS / "generated.json").read_text(encoding="utf-8"))


def read(name: str) -> str:
    """Text of a corpus file."""
    return (CORPUS / name).read_text(encoding="utf-8")


VALID = sorted([f"{name}.abc" for name in GENERATED] + [n for n, case in CASES.items() if not case["errors"]])
INVALID = sorted(n for n, case in CASES.items() if case["errors"])


@pytest.fixture
def song() -> str:
    """A hand-written native score: 4 sections, chords, Z4, 15 bars."""
    return read("song.abc")
