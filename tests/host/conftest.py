"""Fixtures for tests that talk to the real ComfyUI host over HTTP.

`comfy_server` and `comfy` live in tests/conftest.py so that tests/e2e (and any other folder) share the same single
server per session; this file adds what only the HTTP layer uses.
"""
import json
from pathlib import Path

import pytest

WORKFLOWS = Path(__file__).resolve().parent / "workflows"


@pytest.fixture(scope="session")
def object_info(comfy) -> dict:
    """GET /object_info once per session (≈ 400 node types on 0.3.75 with --disable-api-nodes)."""
    return comfy.object_info()


@pytest.fixture
def load_workflow():
    """load_workflow("core_strings") -> the UI-format workflow dict from tests/host/workflows/<name>.json."""
    def load(name: str) -> dict:
        return json.loads((WORKFLOWS / f"{name}.json").read_text())
    return load
