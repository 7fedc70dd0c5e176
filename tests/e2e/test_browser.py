"""Runs the Playwright scripts of this folder (smoke.mjs and every *.test.mjs) with node against the session's ComfyUI
server, and checks that comfy_client.ui_to_api produces what the real frontend sends to /prompt.

Needs node, Debian chromium and playwright-core in $YUE2_E2E_DIR (bash scripts/test.sh installs them); without them
these tests skip with the reason, or fail under scripts/test.sh (YUE2_REQUIRE_BROWSER=1).
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from comfy_client import ComfyClient, ui_to_api

E2E = Path(__file__).resolve().parent
REPO = E2E.parents[1]
# editor*.test.mjs need a synthetic checkpoint: test_editor_browser.py runs them.
SCRIPTS = [E2E / "smoke.mjs", *sorted(s for s in E2E.glob("*.test.mjs") if not s.name.startswith("editor"))]
WORKFLOWS = REPO / "tests" / "host" / "workflows"
SCRIPT_TIMEOUT_S = 180


@pytest.fixture(scope="session")
def browser_tools() -> dict:
    """Checked before the server starts, so a machine without the tools skips at once."""
    e2e_dir = Path(os.environ.get("YUE2_E2E_DIR") or REPO / ".comfyhost" / "e2e")
    chromium = os.environ.get("YUE2_CHROMIUM") or "/usr/bin/chromium"
    missing = []
    if not shutil.which("node"):
        missing.append("node")
    if not os.access(chromium, os.X_OK):
        missing.append(f"chromium ({chromium})")
    if not (e2e_dir / "node_modules" / "playwright-core" / "package.json").is_file():
        missing.append(f"playwright-core in {e2e_dir}")
    if missing:
        reason = f"browser tools missing: {', '.join(missing)}; run `bash scripts/test.sh` to install them"
        if os.environ.get("YUE2_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{reason} (YUE2_REQUIRE_BROWSER=1)", pytrace=False)
        pytest.skip(reason)
    return {"YUE2_E2E_DIR": str(e2e_dir), "YUE2_CHROMIUM": chromium,
            "YUE2_ARTIFACTS": os.environ.get("YUE2_ARTIFACTS") or str(REPO / ".comfyhost" / "artifacts")}


@pytest.fixture(scope="session")
def browser_env(browser_tools, comfy_server, tmp_path_factory) -> dict:
    """The scripts' environment for the session's server; YUE2_BROWSER_CACHE: chromium's disk cache, shared by the
    scripts run against this server one after another (each still starts with a new profile: tests/e2e/lib.mjs)."""
    return dict(os.environ, **browser_tools, COMFY_URL=comfy_server.url,
                YUE2_BROWSER_CACHE=str(tmp_path_factory.mktemp("browser-cache")))


def run_node(args: list, env: dict) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(["node", *map(str, args)], cwd=E2E, env=env, capture_output=True, text=True,
                              timeout=SCRIPT_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"node {args[0]} did not finish in {SCRIPT_TIMEOUT_S} s\n{e.stdout or ''}{e.stderr or ''}",
                    pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"node {Path(args[0]).name} exited {proc.returncode}\n--- stdout ---\n{proc.stdout}"
                    f"\n--- stderr ---\n{proc.stderr}", pytrace=False)
    return proc


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_browser_script(script, browser_env):
    run_node([script], browser_env)


UI_TO_API = ["core_strings", "core_subgraph"]


@pytest.fixture(scope="module")
def frontend_prompts(browser_env, tmp_path_factory) -> dict:
    """{name: {"missing", "output"}}: what the real frontend sends to /prompt for each workflow of UI_TO_API. One
    browser session loads them one after another (graph_to_prompt.mjs): a browser start per workflow cost ~7 s."""
    out = tmp_path_factory.mktemp("frontend-prompts")
    args = [E2E / "graph_to_prompt.mjs"]
    for name in UI_TO_API:
        args += [WORKFLOWS / f"{name}.json", out / f"{name}.json"]
    run_node(args, browser_env)
    return {name: json.loads((out / f"{name}.json").read_text()) for name in UI_TO_API}


@pytest.mark.parametrize("name", UI_TO_API)
def test_ui_to_api_matches_frontend(name, frontend_prompts, comfy_server):
    workflow_path = WORKFLOWS / f"{name}.json"
    frontend = frontend_prompts[name]
    assert frontend["missing"] == []

    object_info = ComfyClient(comfy_server.url).object_info()
    ours = ui_to_api(json.loads(workflow_path.read_text()), object_info)

    def declared(prompt):
        # The frontend also sends values of widgets its own JS adds (PreviewAny's "preview" display); the server ignores
        # inputs a node does not declare, so compare only declared ones.
        out = {}
        for node_id, node in prompt.items():
            spec = object_info[node["class_type"]]["input"]
            names = {n for section in ("required", "optional") for n in spec.get(section, {})}
            out[node_id] = {"class_type": node["class_type"],
                            "inputs": {k: v for k, v in node["inputs"].items() if k in names}}
        return out

    assert declared(ours) == declared(frontend["output"])
