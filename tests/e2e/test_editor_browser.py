"""Runs the ABC editor's browser tests (editor*.test.mjs) against the session's ComfyUI server, with a tiny synthetic
YuE2 checkpoint in its checkpoints folder so the widget can count tokens with an embedded tokenizer and the workflow
can be queued. (test_browser.py runs the other *.test.mjs scripts; it leaves these to this file.)
"""
import os
from importlib.util import find_spec
from pathlib import Path

import pytest

from test_browser import browser_env, browser_tools, run_node  # noqa: F401 (fixtures used below)

E2E = Path(__file__).resolve().parent
SCRIPTS = sorted(E2E.glob("editor*.test.mjs"))
CKPT_NAME = "yue2_editor_tiny.safetensors"


@pytest.fixture(scope="module")
def editor_checkpoint(comfy_server):
    """A tiny synthetic YuE2 checkpoint in the server's checkpoints folder, removed again afterwards (other tests share
    this server and may list its checkpoints)."""
    from synthetic_cache import synthetic_link

    path = Path(comfy_server.models_dir) / CKPT_NAME
    partial = path.with_name(path.name + ".partial")  # not a checkpoint extension: never listed half-written
    synthetic_link(str(partial), "tiny", "bf16")
    os.replace(partial, path)
    yield CKPT_NAME
    path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def engraver():
    """The widget shows the score engraved by verovio (in the server's Python, which is this one)."""
    if find_spec("verovio") is None:
        reason = "the ABC editor engraves scores with verovio, which is not installed: pip install verovio"
        if os.environ.get("YUE2_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{reason} (YUE2_REQUIRE_BROWSER=1)", pytrace=False)
        pytest.skip(reason)


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_editor_script(script, engraver, browser_env, editor_checkpoint):
    run_node([script], dict(browser_env, YUE2_EDITOR_CKPT=editor_checkpoint))
