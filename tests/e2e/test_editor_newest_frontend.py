"""The ABC editor widget against the newest ComfyUI frontend on PyPI (issue #20 item 17).

The session's server (conftest.comfy_server) runs the frontend the host pins (ComfyUI 0.3.75 ships
comfyui-frontend-package 1.32.9). Users update the frontend on its own, so a frontend change that breaks the widget
must show up here too: scripts/test.sh installs the newest `comfyui-frontend-package` into
.comfyhost/frontend-newest/ (a `pip install --target`, apart from the venv) and exports YUE2_FRONTEND_NEWEST; this
module starts a second server with `--front-end-root <that package's static/>` and runs only the editor widget's
browser scripts (editor*.test.mjs) against it — the other browser scripts stay on the pinned frontend, which keeps
the CI time in check (one more server start and ~3 scripts).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from comfy_client import ComfyError, ComfyServer
from test_browser import browser_tools, run_node  # noqa: F401 (fixture used below)
from test_editor_browser import CKPT_NAME, SCRIPTS, engraver  # noqa: F401 (fixture used below)

REPO = Path(__file__).resolve().parents[2]


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
    from synthetic_cache import synthetic_copy
    path = Path(server.models_dir) / CKPT_NAME
    partial = path.with_name(path.name + ".partial")
    synthetic_copy(str(partial), "tiny", "bf16")
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


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_editor_script_on_the_newest_frontend(script, engraver, browser_tools, newest_server):  # noqa: F811
    env = dict(os.environ, **browser_tools, COMFY_URL=newest_server.url, YUE2_EDITOR_CKPT=CKPT_NAME)
    env["YUE2_ARTIFACTS"] = str(Path(browser_tools["YUE2_ARTIFACTS"]) / "newest-frontend")
    Path(env["YUE2_ARTIFACTS"]).mkdir(parents=True, exist_ok=True)
    run_node([script], env)
