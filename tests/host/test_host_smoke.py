"""The real ComfyUI host is up, loads the pack without import errors, serves its web directory, and runs a prompt
converted from a UI-format workflow."""
import os
import re
from pathlib import Path

import pytest

from comfy_client import ComfyError, PACK_NAME, ui_to_api

REPO = Path(__file__).resolve().parents[2]


def test_system_stats_reports_the_host_version(comfy, comfy_server):
    stats = comfy.system_stats()
    want = os.environ.get("YUE2_COMFY_VERSION")
    if not want:  # another tree (COMFYUI_SRC): expect whatever that tree says it is
        text = (comfy_server.comfy_dir / "comfyui_version.py").read_text()
        want = re.search(r'__version__\s*=\s*"([^"]+)"', text).group(1)
    assert stats["system"]["comfyui_version"] == want
    assert stats["devices"] and stats["devices"][0]["type"] == "cpu"


def test_pack_imports_without_failure(comfy_server):
    log = comfy_server.log_text()
    assert f"custom_nodes/{PACK_NAME}" in log, "ComfyUI did not try to load the pack at all"
    # the import report ends where the server starts (import_problems): that line must be there, and after the pack
    assert "\nStarting server" in log and log.index(f"custom_nodes/{PACK_NAME}") < log.index("\nStarting server")
    assert comfy_server.import_problems() == []
    assert "Unable to parse pyproject.toml" not in log  # ComfyUI reads the pack's pyproject.toml ([tool.comfy]) too
    pack_line = [line for line in log.splitlines() if line.rstrip().endswith(f"custom_nodes/{PACK_NAME}")
                 and "seconds" in line]
    assert pack_line and "IMPORT FAILED" not in pack_line[0]


def test_pack_registers_its_nodes_when_nodes_package_exists(comfy_server, object_info):
    if not (REPO / "nodes" / "__init__.py").exists():
        pytest.skip("nodes/ not written yet: the pack registers no nodes (it logs why) and must still load cleanly")
    assert comfy_server.pack_load_error is None, comfy_server.pack_load_error
    ours = [name for name, info in object_info.items() if info.get("python_module", "").endswith(PACK_NAME)]
    assert ours, "nodes/ exists but no node of the pack is in /object_info"


def test_web_directory_is_served(comfy):
    assert "/extensions/ComfyUI-YuE2/yue2_boot.js" in comfy.get_json("/extensions")
    script = comfy.get_bytes("/extensions/ComfyUI-YuE2/yue2_boot.js").decode()
    assert "ComfyUI-YuE2.boot" in script and "__yue2PackLoaded" in script


def test_tutorial_completed_is_preseeded(comfy):
    assert comfy.get_json("/settings").get("Comfy.TutorialCompleted") is True


def test_ui_workflow_converts_and_runs(comfy, object_info, load_workflow):
    prompt = ui_to_api(load_workflow("core_strings"), object_info)
    assert prompt == {
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "hello"}, "_meta": {"title": "String"}},
        "2": {"class_type": "PrimitiveInt", "inputs": {"value": 3}, "_meta": {"title": "Int"}},
        "3": {"class_type": "StringConcatenate", "inputs": {"string_a": ["1", 0], "string_b": "world", "delimiter": "-"},
              "_meta": {"title": "Concatenate"}},
        "4": {"class_type": "StringSubstring", "inputs": {"string": ["3", 0], "start": ["2", 0], "end": 8},
              "_meta": {"title": "Substring"}},
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}, "_meta": {"title": "substring"}},
    }
    entry = comfy.run(prompt, timeout=60)
    assert entry["status"]["status_str"] == "success"
    assert entry["outputs"]["5"]["text"] == ["hello-world"[3:8]]


def test_subgraph_workflow_flattens_and_runs(comfy, object_info, load_workflow):
    prompt = ui_to_api(load_workflow("core_subgraph"), object_info)
    assert prompt["20:1"]["inputs"] == {"string_a": ["10", 0], "string_b": "!", "delimiter": ""}
    assert prompt["21"]["inputs"] == {"source": ["20:1", 0]}
    entry = comfy.run(prompt, timeout=60)
    assert entry["outputs"]["21"]["text"] == ["hey!"]


def test_rejected_prompt_raises_with_node_errors(comfy):
    wrong_type = {"1": {"class_type": "PrimitiveInt", "inputs": {"value": 5}},
                  "2": {"class_type": "StringLength", "inputs": {"string": ["1", 0]}},
                  "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}}}
    with pytest.raises(ComfyError) as err:
        comfy.queue(wrong_type)
    assert "return_type_mismatch" in str(err.value.body["node_errors"])


def test_execution_error_is_reported_and_models_dir_is_read(comfy, comfy_server, object_info):
    # A file dropped into models_dir is listed by the server at once; loading garbage fails at run time.
    (comfy_server.models_dir / "not_a_model.safetensors").write_bytes(b"\0" * 64)
    assert "not_a_model.safetensors" in comfy.object_info("CheckpointLoaderSimple")["input"]["required"]["ckpt_name"][0]
    prompt = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "not_a_model.safetensors"}},
              "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}
    with pytest.raises(ComfyError, match="ended with error") as err:
        comfy.run(prompt, timeout=60)
    assert "CheckpointLoaderSimple" in str(err.value)


def test_interrupt_and_free_are_accepted(comfy):
    comfy.interrupt()
    comfy.free()
    assert comfy.queue_state() == {"queue_running": [], "queue_pending": []}


def test_parity_dir_env_points_at_shared_fixtures():
    # scripts/test.sh exports YUE2_PARITY_DIR when ../shared/parity exists; tests/core reads it.
    parity = os.environ.get("YUE2_PARITY_DIR")
    if not parity:
        pytest.skip("YUE2_PARITY_DIR not set: point it at the parity fixture folder (scripts/test.sh uses "
                    "../shared/parity beside the repository when it exists)")
    assert (Path(parity) / "cases.json").is_file()


def test_requirements_txt_matches_pyproject_dependencies():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    # ComfyUI-Manager installs requirements.txt into ComfyUI's Python, which already has torch: never list it there.
    assert sorted(filter(None, requirements)) == sorted(d for d in project["dependencies"] if not d.startswith("torch"))
