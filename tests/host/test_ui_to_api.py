"""ui_to_api on the two official YuE2 template workflows (shared/data/comfyui_templates; their nodes are newer than the
0.3.75 host, so no server here). Newer frontends save every widget twice: positionally in `widgets_values` and by
name in `widgets_values_named`. The converter must give the same prompt from either, which checks the positional
mapping (control_after_generate values, subgraph instance widgets) against the frontend's own naming."""
import copy
import json
from pathlib import Path

import pytest

from comfy_client import ui_to_api

REPO = Path(__file__).resolve().parents[2]
# the official templates from the workplace's shared data; $YUE2_SHARED_DIR points elsewhere when the repo is not beside it
TEMPLATES = Path(__import__("os").environ.get("YUE2_SHARED_DIR", REPO.parent / "shared")) / "data" / "comfyui_templates"
NAMES = ["audio_yue2_text2music", "audio_yue2_music_cover"]
CONTROL_VALUES = {"fixed", "increment", "decrement", "randomize"}
KIND = {bool: "BOOLEAN", int: "INT", float: "FLOAT", str: "STRING"}


def load(name: str) -> dict:
    path = TEMPLATES / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{path} not present (set YUE2_SHARED_DIR to the shared folder that holds data/comfyui_templates)")
    return json.loads(path.read_text())


def all_nodes(workflow: dict):
    yield from workflow["nodes"]
    for subgraph in workflow.get("definitions", {}).get("subgraphs", []):
        yield from subgraph["nodes"]


def object_info_from_names(workflow: dict) -> dict:
    """A stand-in /object_info built from widgets_values_named: each named widget becomes a declared input, a
    control value ("randomize", …) after an INT marks that INT control_after_generate, and sockets come from the UI
    inputs that have no widget. Display-only widgets with a None value (LoadAudio's upload button) are skipped."""
    info = {}
    subgraph_ids = {s["id"] for s in workflow.get("definitions", {}).get("subgraphs", [])}
    for node in all_nodes(workflow):
        if node["type"] in subgraph_ids or node["type"] in ("Note", "MarkdownNote"):
            continue
        required = {i["name"]: [i["type"], {}] for i in node.get("inputs", []) if not i.get("widget")}
        previous = None
        for name, value in (node.get("widgets_values_named") or {}).items():
            if previous and isinstance(value, str) and value in CONTROL_VALUES and required[previous][0] == "INT":
                required[previous][1]["control_after_generate"] = True
            elif value is not None:
                required[name] = [KIND[type(value)], {}]
                previous = name
        info[node["type"]] = {"input": {"required": required}, "input_order": {"required": list(required)}}
    return info


@pytest.mark.parametrize("name", NAMES)
def test_positional_and_named_widgets_give_the_same_prompt(name):
    workflow = load(name)
    info = object_info_from_names(workflow)
    by_name = ui_to_api(workflow, info)
    positional = copy.deepcopy(workflow)
    for node in all_nodes(positional):
        node.pop("widgets_values_named", None)
    assert ui_to_api(positional, info) == by_name


def test_template_flattens_subgraph_with_frontend_ids():
    prompt = ui_to_api(load("audio_yue2_text2music"), object_info_from_names(load("audio_yue2_text2music")))
    assert "MarkdownNote" not in {n["class_type"] for n in prompt.values()}
    assert all(node_id.startswith("33:") for node_id in prompt if node_id != "10")
    music = prompt["33:25"]
    assert music["class_type"] == "YuE2GenerateMusic"
    # style/lyrics/seed come from nodes inside the subgraph; max_duration from the instance's promoted widget
    assert music["inputs"]["max_duration"] == 120
    assert music["inputs"]["seed"] == ["33:34", 0]
    assert prompt["33:15"]["inputs"] == {"ckpt_name": "yue2_3b_int8_convrot.safetensors"}
    assert prompt["10"]["inputs"]["audio"] == ["33:9", 0]
    sampler = prompt["33:8"]["inputs"]  # a linked (converted) widget takes the link over its value 42
    assert sampler["seed"] == ["33:34", 0] and sampler["steps"] == 32 and sampler["sampler_name"] == "dpm_2"


def test_unknown_node_types_are_listed():
    workflow = {"nodes": [{"id": 1, "type": "NoSuchNode", "inputs": [], "widgets_values": []}], "links": []}
    with pytest.raises(ValueError, match="NoSuchNode"):
        ui_to_api(workflow, {})

