"""Helpers of the node tests: the shipped workflows as API prompts with test-size budgets, running prompts that must
succeed or fail, and reading what a run saved."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from comfy_client import ComfyError, ui_to_api

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "example_workflows"
PACK_NODES = ["YuE2CheckpointLoader", "YuE2LoRA", "YuE2VAELoader", "YuE2Composer", "YuE2ABCEditor", "YuE2Renderer", "YuE2VAEDecode",
              "YuE2SaveSong", "YuE2LoadSong", "YuE2PickTake", "YuE2Regenerate", "YuE2Continue"]
TINY = "yue2_test_tiny_bf16.safetensors"
TINY_INT8 = "yue2_test_tiny_int8.safetensors"
MICRO = "yue2_test_micro_bf16.safetensors"

# Test-size budgets: one second of music (25 frames), an 8-token lead sheet, 8 ODE steps.
FAST = {"max_seconds": 1.0, "max_abc_tokens": 8}
RENDER_STEPS = 8

# Four bars at 240 bpm (4 s): cuts by bar land on whole seconds (regenerate / continue / takes tests).
SCORE_240 = """X:1
T:
M:4/4
L:1/32
Q:1/4=240
V: Vocal clef=treble name="Vocal Melody" snm="Vocal"
V: Ins clef=treble name="Ins Melody" snm="Inst."
K:C
% verse
V: Vocal
"C"c8d8e8f8|"G"g16e16|"Am"a8g8e8c8|"F"f32|
V: Ins
C32|G,32|A,32|F,32|
"""

# A valid lead sheet in YuE2's two-voice dialect (the synthetic model writes random text, never a valid score).
VALID_ABC = """X:1
T:
M:4/4
L:1/32
Q:1/4=88
V: Vocal clef=treble name="Vocal Melody" snm="Vocal"
V: Ins clef=treble name="Ins Melody" snm="Inst."
K:C
% verse
V: Vocal
"C"z8E8G8c8|"G"d16B16|
V: Ins
C,16G,16|Z|
"""


def load_example(name: str) -> dict:
    return json.loads((EXAMPLES / f"{name}.json").read_text())


def by_class(prompt: dict, class_type: str) -> list[str]:
    return [node_id for node_id, node in prompt.items() if node["class_type"] == class_type]


def set_inputs(prompt: dict, class_type: str, **values) -> dict:
    """Set widget values on every node of `class_type` (raises if there is none)."""
    ids = by_class(prompt, class_type)
    assert ids, f"no {class_type} in the prompt"
    for node_id in ids:
        prompt[node_id]["inputs"].update(values)
    return prompt


def test_sized(prompt: dict, ckpt: str = TINY, **composer) -> dict:
    """The prompt with the test checkpoint, one-second songs, 8-token lead sheets and 8 ODE steps."""
    set_inputs(prompt, "YuE2CheckpointLoader", ckpt_name=ckpt)
    if by_class(prompt, "YuE2Composer"):
        set_inputs(prompt, "YuE2Composer", **{**FAST, **composer})
    if by_class(prompt, "YuE2Renderer"):
        set_inputs(prompt, "YuE2Renderer", steps=RENDER_STEPS)
    return prompt


test_sized.__test__ = False  # a helper, not a test


def run(comfy, prompt: dict, timeout: float = 480.0) -> dict:
    """Queue `prompt` and wait for its history entry. A prompt still running at the timeout is cancelled and the
    queue drained before the error is raised, so it cannot finish inside (and fail) the next test."""
    try:
        return comfy.run(prompt, timeout=timeout)
    except ComfyError as exc:
        if "did not finish within" in str(exc):
            comfy.interrupt()
            deadline = time.monotonic() + 120
            while comfy.queue_state() != {"queue_running": [], "queue_pending": []} and time.monotonic() < deadline:
                time.sleep(0.5)
        raise


def run_error(comfy, prompt: dict, timeout: float = 240.0) -> tuple[str, str, str]:
    """Run a prompt that must fail during execution; returns (node type, exception type, message)."""
    with pytest.raises(ComfyError) as err:
        comfy.run(prompt, timeout=timeout)
    entry = err.value.body
    assert isinstance(entry, dict) and "status" in entry, f"expected an execution error, got: {err.value}"
    errors = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"]
    assert errors, entry["status"]
    return errors[0]["node_type"], errors[0]["exception_type"], errors[0]["exception_message"]


def rejected(comfy, prompt: dict) -> dict:
    """Queue a prompt that validation must reject; returns node_errors."""
    with pytest.raises(ComfyError) as err:
        comfy.queue(prompt)
    body = err.value.body
    assert isinstance(body, dict) and body.get("node_errors") or body.get("error"), body
    return body


def saved_dirs(entry: dict, output_dir: Path) -> list[Path]:
    """Song directories the Save Song nodes of a finished prompt report."""
    dirs = []
    for node in entry["outputs"].values():
        for rel in node.get("song_dir", []):
            dirs.append(output_dir / rel)
    return dirs


def codes(song_dir: Path) -> list[int]:
    return np.load(song_dir / "semantic.npy").tolist()


def wait_for_log(server, text: str, since: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in server.log_text()[since:]:
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} did not appear in the server log within {timeout} s")
        time.sleep(0.05)


def api(name: str, node_info: dict) -> dict:
    """A shipped workflow converted to an API prompt."""
    return ui_to_api(load_example(name), node_info)
