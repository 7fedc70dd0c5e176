"""The ABC test corpus (shared by the tests in this folder; a module, not conftest, so that test folders never
import each other's conftest by name)."""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = Path(__file__).with_name("corpus")
CASES = json.loads((CORPUS / "cases.json").read_text(encoding="utf-8"))
GENERATED = json.loads((CORPUS / "generated.json").read_text(encoding="utf-8"))


def read(name: str) -> str:
    """Text of a corpus file."""
    return (CORPUS / name).read_text(encoding="utf-8")


VALID = sorted([f"{name}.abc" for name in GENERATED] + [n for n, case in CASES.items() if not case["errors"]])
INVALID = sorted(n for n, case in CASES.items() if case["errors"])
