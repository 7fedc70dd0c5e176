"""The ABC editor widget against the newest ComfyUI frontend on PyPI (issue #20 item 17).

The session's server (conftest.comfy_server) runs the frontend the host pins (ComfyUI 0.3.75 ships
comfyui-frontend-package 1.32.9). Users update the frontend on its own, so a frontend change that breaks the widget
must show up here too: scripts/test.sh installs the newest `comfyui-frontend-package` into
.comfyhost/frontend-newest/ (a `pip install --target`, apart from the venv) and exports YUE2_FRONTEND_NEWEST; this
module starts a second server with `--front-end-root <that package's static/>` and runs on it the editor scripts
that exercise what differs between frontends (NEWEST_SCRIPTS):
  editor.test.mjs          the widget made on the node (DOM widget, sizing, the canvas drawing it), the composer's
                           widgets read from the graph, graphToPrompt/queue serialising the edited text, a reload
                           restoring it from the frontend's persisted workflow;
  editor_refresh.test.mjs  execution results delivered through node.onExecuted and the node properties the
                           frontend persists (its draft storage, which 1.58 moved to other keys) across two reloads;
  editor_typing.test.mjs   the frontend's change tracker (checkState, renamed captureCanvasState in 1.5x) that
                           typing calls, and the per-frame input path;
  editor_ui_review.test.mjs  the link refused on the abc box's socket (the frontend's onConnectInput and widget
                           sockets), the canvas's node copy/paste, collapse, the workflow tabs, focus in the BPM box.
On both frontends every script fails when the frontend logged a warning or error from inside our web code (lib.mjs
watchOurWarnings), such as 1.58's "input.link is deprecated" that web/abc_editor/graph.js caused until stop 58.
The other five run on the pinned frontend only (tests/e2e/test_editor_browser.py runs all nine). What they add is
our own logic: editor_bad_input the server's analysis of bad text and the widget's escaping, editor_results the
execution results nodes/editor.py sends (CR LF, errors, cached runs) and the editor's key handling, the three
editor_history* scripts the editor's history store (web/abc_editor/history.js) across node re-creation. The frontend
calls they lean on beyond the three above (the canvas graph undo, the workflow store's rename/save/delete, ComfyUI's
Ctrl+S / Ctrl+Enter bindings) are checked on the pinned frontend only; running the five here too cost ~55 s of a
2-core machine (2026-12-07). When a frontend release is suspected of changing one of those, add the script to
NEWEST_SCRIPTS.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from comfy_client import ComfyError, ComfyServer
from test_browser import browser_tools, run_node  # noqa: F401 (fixture used below)
from test_editor_browser import CKPT_NAME, E2E, SCRIPTS, engraver  # noqa: F401 (fixture used below)

REPO = Path(__file__).resolve().parents[2]
NEWEST_SCRIPTS = [E2E / name for name in ("editor.test.mjs", "editor_refresh.test.mjs", "editor_typing.test.mjs",
                                           "editor_ui_review.test.mjs")]


def _unavailable(reason: str) -> None:
    if os.environ.get("YUE2_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason} (YUE2_REQUIRE_BROWSER=1: scripts/test.sh installs it)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def newest_frontend() -> dict:
    """{"version", "static"} of the frontend package scripts/test.sh installed (YUE2_FRONTEND_NEWEST = its --target
    folder)."""
    root = Path(os.environ.get("YUE2_FRONTEND_NEWEST") or REPO / ".comfyhost" / "frontend-newest" / "lib")
    static = root / "comfyui_frontend_package" / "static"
    infos = sorted(root.glob("comfyui_frontend_package-*.dist-info"))
    if not (static / "index.html").is_file() or not infos:
        _unavailable(f"no newest comfyui-frontend-package in {root}; run `bash scripts/test.sh --setup-only`")
    return {"version": infos[-1].name.split("-")[1].removesuffix(".dist-info"), "static": static}


@pytest.fixture(scope="module")
def newest_server(comfy_host, newest_frontend, browser_tools, tmp_path_factory):  # noqa: F811
    comfy_dir, python = comfy_host
    server = ComfyServer(comfy_dir, python, tmp_path_factory.mktemp("comfyui-newest-frontend"),
                         extra_args=("--front-end-root", str(newest_frontend["static"])))
    try:
        server.start()
    except ComfyError as e:
        pytest.fail(str(e), pytrace=False)
    from synthetic_cache import synthetic_link
    path = Path(server.models_dir) / CKPT_NAME
    partial = path.with_name(path.name + ".partial")
    synthetic_link(str(partial), "tiny", "bf16")
    os.replace(partial, path)
    try:
        yield server
    finally:
        server.stop()


def test_the_second_server_serves_the_newest_frontend(newest_server, newest_frontend):
    """The page really comes from the newest package (not the venv's pinned one): its index.html is served."""
    import urllib.request
    with urllib.request.urlopen(newest_server.url + "/", timeout=30) as answer:
        served = answer.read()
    assert served == (newest_frontend["static"] / "index.html").read_bytes()
    assert "--front-end-root" in newest_server.log_text()
    with urllib.request.urlopen(newest_server.url + "/api/system_stats", timeout=30) as answer:
        stats = json.loads(answer.read())
    print(f"newest frontend {newest_frontend['version']} on ComfyUI {stats['system'].get('comfyui_version')}")


def test_the_newest_frontend_scripts_are_editor_scripts():
    """NEWEST_SCRIPTS names scripts that exist (a rename would otherwise drop one from this file unnoticed)."""
    assert NEWEST_SCRIPTS and set(NEWEST_SCRIPTS) <= set(SCRIPTS), sorted(map(str, set(NEWEST_SCRIPTS) - set(SCRIPTS)))


@pytest.fixture(scope="module")
def newest_browser_cache(tmp_path_factory) -> str:
    """Chromium's disk cache for the scripts run against the second server (as browser_env's for the first)."""
    return str(tmp_path_factory.mktemp("browser-cache-newest"))


@pytest.mark.parametrize("script", NEWEST_SCRIPTS, ids=[s.name for s in NEWEST_SCRIPTS])
def test_editor_script_on_the_newest_frontend(script, engraver, browser_tools, newest_server,  # noqa: F811
                                              newest_browser_cache):
    env = dict(os.environ, **browser_tools, COMFY_URL=newest_server.url, YUE2_EDITOR_CKPT=CKPT_NAME,
               YUE2_BROWSER_CACHE=newest_browser_cache)
    env["YUE2_ARTIFACTS"] = str(Path(browser_tools["YUE2_ARTIFACTS"]) / "newest-frontend")
    Path(env["YUE2_ARTIFACTS"]).mkdir(parents=True, exist_ok=True)
    run_node([script], env)
