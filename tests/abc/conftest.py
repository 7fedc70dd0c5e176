"""Shared fixtures for the ABC tests: the repository on sys.path and the corpus files."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).parent))
from abc_corpus import read  # noqa: E402


@pytest.fixture
def song() -> str:
    """A hand-written native score: 4 sections, chords, Z4, 15 bars."""
    return read("song.abc")
