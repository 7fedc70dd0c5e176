"""The shipped workflows in the real frontend (Debian chromium + playwright-core, the harness of tests/e2e): every one
loads with no missing node type, the prompt the frontend builds from it equals comfy_client.ui_to_api's (so the API
tests run exactly what a user's click would), and a song queued from the page ends with ComfyUI's audio player on
the Save Song node pointing at the saved audio.flac."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from comfy_client import ui_to_api
from nodes_testlib import EXAMPLES, TINY

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def browser_run(comfy_server, checkpoints, tmp_path_factory) -> dict:
    e2e_dir = Path(os.environ.get("YUE2_E2E_DIR") or REPO / ".comfyhost" / "e2e")
    chromium = os.environ.get("YUE2_CHROMIUM") or "/usr/bin/chromium"
    playwright = e2e_dir / "node_modules" / "playwright-core" / "package.json"
    checks = (("node", shutil.which("node")), (f"chromium ({chromium})", os.access(chromium, os.X_OK)),
              (f"playwright-core in {e2e_dir}", playwright.is_file()))
    missing = [what for what, ok in checks if not ok]
    if missing:
        reason = f"browser tools missing: {', '.join(missing)}; run `bash scripts/test.sh` to install them"
        if os.environ.get("YUE2_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{reason} (YUE2_REQUIRE_BROWSER=1)", pytrace=False)
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("browser") / "result.json"
    env = dict(os.environ, COMFY_URL=comfy_server.url, YUE2_E2E_DIR=str(e2e_dir), YUE2_CHROMIUM=chromium,
               YUE2_ARTIFACTS=os.environ.get("YUE2_ARTIFACTS") or str(REPO / ".comfyhost" / "artifacts"))
    proc = subprocess.run(["node", str(HERE / "nodes_workflows.mjs"), str(out), TINY], cwd=HERE, env=env,
                          check=False, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0 or not out.is_file():
        pytest.fail(f"nodes_workflows.mjs exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    return json.loads(out.read_text())


def _declared(prompt: dict, object_info: dict) -> dict:
    """Only the data inputs each node declares: the frontend also sends values of widgets its own JS adds, and of the
    audio player (AUDIO_UI, always "") that ComfyUI's audio extension puts on the Save Song node."""
    out = {}
    for node_id, node in prompt.items():
        spec = object_info[node["class_type"]]["input"]
        names = {n for section in ("required", "optional") for n, (kind, *_) in spec.get(section, {}).items()
                 if kind != "AUDIO_UI"}
        out[node_id] = {"class_type": node["class_type"],
                        "inputs": {k: v for k, v in node["inputs"].items() if k in names}}
    return out


def test_every_workflow_loads_with_no_missing_node(browser_run):
    assert sorted(browser_run["workflows"]) == sorted(p.stem for p in EXAMPLES.glob("*.json"))
    for name, loaded in browser_run["workflows"].items():
        assert loaded["missing"] == [], name


def test_the_frontend_builds_the_prompt_ui_to_api_builds(browser_run, comfy):
    object_info = comfy.object_info()
    for name, loaded in browser_run["workflows"].items():
        ours = ui_to_api(json.loads((EXAMPLES / f"{name}.json").read_text()), object_info)
        assert _declared(loaded["prompt"], object_info) == _declared(ours, object_info), name


def test_a_song_queued_from_the_page_plays_in_the_save_node(browser_run, comfy_server):
    run = browser_run["run"]
    assert run["status"]["status_str"] == "success", run["status"]
    (save,) = [out for out in run["outputs"].values() if "song_dir" in out]
    song_dir = comfy_server.output_dir / save["song_dir"][0]
    assert (song_dir / "audio.flac").is_file()
    player = run["player"]
    assert player["hasWidget"], "the Save Song node has no audioUI player widget"
    assert "audio.flac" in player["src"] and "yue2" in player["src"], player
    assert run["pageErrors"] == [], run["pageErrors"]
