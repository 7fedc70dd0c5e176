"""Fixtures for the node tests: the synthetic checkpoints in the session server's models folder and /object_info.

Every test here talks to the real ComfyUI server of the session (tests/conftest.py: `comfy_server`, `comfy`); the
checkpoints are written once per session with yue2_core.weights.synthetic (random weights). Helpers: nodes_testlib.py.
"""
from __future__ import annotations

import pytest

from nodes_testlib import MICRO, TINY, TINY_INT8


@pytest.fixture(scope="session")
def checkpoints(comfy_server) -> dict:
    """{name: path} of the synthetic checkpoints, written into the server's models/checkpoints once."""
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    made = {}
    for name, profile, fmt in ((TINY, "tiny", "bf16"), (TINY_INT8, "tiny", "int8"), (MICRO, "micro", "bf16")):
        path = comfy_server.models_dir / name
        if not path.exists():
            write_synthetic_checkpoint(str(path), profile, fmt)
        made[name] = path
    return made


@pytest.fixture(scope="session")
def node_info(comfy, checkpoints) -> dict:
    """/object_info after the checkpoints exist (the loader's list includes them)."""
    return comfy.object_info()
