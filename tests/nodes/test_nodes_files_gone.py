"""A LoRA or VAE file deleted or replaced on disk while a prompt runs, after its node read it (break-it, stop 41): the
song records the file the weights came from, and a file that is gone stops the node that needs it with one line.

Before: the Renderer hashed the adapter and VAE files after its whole render (`weights_record`), so a deleted file
failed it with a FileNotFoundError traceback from yue2_core, and a replaced one was recorded with the new file's
sha256 beside the old file's weights (Load Song then re-applied the new file: another song)."""
from __future__ import annotations

import hashlib
import json
import os

import pytest
import torch
from safetensors.torch import save_file

from nodes_testlib import TINY, VALID_ABC, saved_dirs, wait_for_log


def _lora(path, seed: int, dims) -> None:
    """An ai-toolkit LoRA of rank 4 on both experts of the tiny geometry."""
    g = torch.Generator().manual_seed(seed)
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    shapes = {"self_attn.qkv_proj": (q + 2 * kv, dims.hidden), "self_attn.o_proj": (dims.hidden, q),
              "mlp.gate_up_proj": (2 * dims.ffn, dims.hidden), "mlp.down_proj": (dims.hidden, dims.ffn)}
    t = {}
    for prefix in ("text_encoders.model.layers", "diffusion_model.model.layers"):
        for i in range(dims.layers):
            for leaf, (out, inp) in shapes.items():
                t[f"{prefix}.{i}.{leaf}.lora_A.weight"] = (torch.randn(4, inp, generator=g) * 0.1).half()
                t[f"{prefix}.{i}.{leaf}.lora_B.weight"] = (torch.randn(out, 4, generator=g) * 0.1).half()
    save_file(t, str(path))


def _prompt(seed: int, name: str, extra: dict, model_node: str) -> dict:
    """Loader → `extra` (a LoRA or VAE Loader node "9") → Composer (a given score, 2 s) → Renderer → VAE Decode →
    Save Song, every stage on the model of `model_node`."""
    model = [model_node, 0]
    return {
        "1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}},
        **extra,
        "6": {"class_type": "PrimitiveString", "inputs": {"value": VALID_ABC}},
        "2": {"class_type": "YuE2Composer", "inputs": {"model": model, "style": "pop", "lyrics": "[verse]\nla",
                                                       "cot": "full", "seed": seed, "max_seconds": 2.0,
                                                       "abc_text": ["6", 0]}},
        "3": {"class_type": "YuE2Renderer", "inputs": {"model": model, "tokens": ["2", 1], "steps": 4, "seed": -1}},
        "4": {"class_type": "YuE2VAEDecode", "inputs": {"model": model, "latent": ["3", 0]}},
        "5": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["2", 1], "name": name, "latent": ["3", 0],
                                                       "audio": ["4", 0]}},
    }


def _while_composing(comfy, comfy_server, prompt: dict, change) -> dict:
    """Queue `prompt`, call `change()` once the Composer samples music (the LoRA / VAE node has run), wait."""
    since = len(comfy_server.log_text())
    prompt_id = comfy.queue(prompt)
    wait_for_log(comfy_server, "[YuE2] YuE2 Composer: sampling music tokens", since, timeout=240)
    change()
    return comfy.wait(prompt_id, timeout=480, check=False)


@pytest.fixture(scope="module")
def dims(checkpoints):
    from yue2_core.weights.checkpoint import inspect_checkpoint
    return inspect_checkpoint(str(checkpoints[TINY])).dims


def test_a_lora_replaced_while_the_prompt_runs_is_recorded_as_the_file_applied(comfy, comfy_server, dims):
    folder = comfy_server.models_root / "loras"
    path, other = folder / "yue2_gone_lora.safetensors", folder / "yue2_gone_lora.other"
    _lora(path, 3, dims)
    applied = hashlib.sha256(path.read_bytes()).hexdigest()
    _lora(other, 4, dims)
    lora = {"9": {"class_type": "YuE2LoRA", "inputs": {"model": ["1", 0], "lora_name": path.name,
                                                      "strength_ar": 1.0, "strength_nar": 1.0}}}
    entry = _while_composing(comfy, comfy_server, _prompt(901, "lora_replaced", lora, "9"),
                             lambda: os.replace(other, path))
    assert entry["status"]["status_str"] == "success", entry["status"]
    (song,) = saved_dirs(entry, comfy_server.output_dir)
    (record,) = json.loads((song / "config.json").read_text())["weights"]["loras"]
    assert record["sha256"] == applied != hashlib.sha256(path.read_bytes()).hexdigest()
    # deleted: the render and the save still succeed (was: FileNotFoundError in the Renderer after its render), with
    # the record of the file that was applied
    _lora(path, 5, dims)
    applied = hashlib.sha256(path.read_bytes()).hexdigest()
    entry = _while_composing(comfy, comfy_server, _prompt(902, "lora_deleted", lora, "9"), lambda: os.remove(path))
    assert entry["status"]["status_str"] == "success", entry["status"]
    (song,) = saved_dirs(entry, comfy_server.output_dir)
    (record,) = json.loads((song / "config.json").read_text())["weights"]["loras"]
    assert record["sha256"] == applied and not path.exists()


def test_a_vae_file_deleted_while_the_prompt_runs_stops_vae_decode_with_one_line(comfy, comfy_server):
    from yue2_core.weights.synthetic_vae import write_vae
    path = comfy_server.models_root / "vae" / "yue2_gone_vae.safetensors"
    write_vae(str(path), layout="vendor-file", variant="standard")
    vae = {"9": {"class_type": "YuE2VAELoader", "inputs": {"model": ["1", 0], "vae_name": path.name}}}
    entry = _while_composing(comfy, comfy_server, _prompt(903, "vae_deleted", vae, "9"), lambda: os.remove(path))
    (error,) = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"]
    trace = "".join(error["traceback"])
    assert error["node_type"] == "YuE2VAEDecode", (error["node_type"], error["exception_message"])
    assert error["exception_type"] == "ValueError" and "yue2_core" not in trace, trace
    assert f"VAE {path} can no longer be read since it was opened" in error["exception_message"]
    assert "put it back" in error["exception_message"]
