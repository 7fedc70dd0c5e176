"""docs/bad_inputs.md stays honest: every test it cites exists and every row cites at least one test."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "bad_inputs.md"
CITE = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def _rows(text: str):
    """(section title, row cells) for every table row under a '## ' heading."""
    section = ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("|") and not re.match(r"^\|\s*-", line) and not line.startswith("| Input") \
                and not line.startswith("| Target"):
            yield section, [c.strip() for c in line.strip().strip("|").split("|")]


def _functions(path: Path) -> set:
    tree = ast.parse(path.read_text("utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_catalogue_cites_existing_tests():
    text = DOC.read_text("utf-8")
    cited = CITE.findall(text)
    assert len(cited) >= 40
    for file, name in cited:
        path = REPO / file
        assert path.is_file(), f"docs/bad_inputs.md cites a missing file {file}"
        if name:
            assert name in _functions(path), f"docs/bad_inputs.md cites {file}::{name}, which does not exist"


def test_catalogue_every_row_has_a_test_or_is_pending():
    rows = list(_rows(DOC.read_text("utf-8")))
    assert len(rows) >= 45
    for section, cells in rows:
        last = cells[-1]
        assert CITE.search(last), f"row without a test in '{section}': {cells[0]}"


def _fuzz_examples() -> int:
    """The hypothesis examples of tests/robust/test_fuzz_*.py, read from their decorators: `@fuzz(N)` and
    `max_examples=EXAMPLES` / `EXAMPLES // 2` with the file's `EXAMPLES = N`."""
    total = 0
    for path in sorted((REPO / "tests" / "robust").glob("test_fuzz_*.py")):
        text = path.read_text("utf-8")
        total += sum(int(n) for n in re.findall(r"^@fuzz\((\d+)\)", text, re.M))
        base = re.search(r"^EXAMPLES = (\d+)", text, re.M)
        for halved in re.findall(r"max_examples=EXAMPLES( // 2)?,", text):
            total += int(base.group(1)) // (2 if halved else 1)
    return total


def test_the_fuzz_case_count_the_docs_state_is_the_tests():
    """New-user review 43: README and this catalogue said 10,600 fuzz cases after 5307175 had cut the safetensors
    ones to 600/450/260/200 (9,810 in all)."""
    total = f"{_fuzz_examples():,}"
    assert f"the bad-input catalogue, {total} fuzz cases" in (REPO / "README.md").read_text("utf-8")
    assert f"\n{total} engine cases" in DOC.read_text("utf-8")
