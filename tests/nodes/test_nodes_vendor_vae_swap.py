"""A vendor model folder's VAE replaced on disk between two queue runs (break-it review, stop 43; docs/bad_inputs.md
§20), against the session's real ComfyUI server.

The Checkpoint Loader fingerprinted the model folder's own files only, not the VAE folder the model decodes with
(`vae/` inside it, a sibling folder, the Hugging Face cache), so ComfyUI reused the cached model: a VAE read before
the change kept decoding every later song, and one not read yet failed every later run with "changed on disk … queue
the workflow again" — queueing again changed nothing."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from nodes_testlib import TINY, VALID_ABC, saved_dirs


def _prompt(seed: int, name: str, ckpt: str, decode: bool = True) -> dict:
    """Loader → Composer (a given score, 1 s) → Save Song; with `decode`, Renderer (2 steps) and VAE Decode too."""
    model = ["1", 0]
    prompt = {
        "1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": ckpt}},
        "6": {"class_type": "PrimitiveString", "inputs": {"value": VALID_ABC}},
        "2": {"class_type": "YuE2Composer", "inputs": {"model": model, "style": "pop", "lyrics": "[verse]\nla",
                                                       "cot": "full", "seed": seed, "max_seconds": 1.0,
                                                       "abc_text": ["6", 0]}},
        "5": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["2", 1], "name": name}},
    }
    if decode:
        prompt["3"] = {"class_type": "YuE2Renderer", "inputs": {"model": model, "tokens": ["2", 1], "steps": 2,
                                                                "seed": -1}}
        prompt["4"] = {"class_type": "YuE2VAEDecode", "inputs": {"model": model, "latent": ["3", 0]}}
        prompt["5"]["inputs"].update(latent=["3", 0], audio=["4", 0])
    return prompt


@pytest.mark.parametrize("first_decodes", [True, False], ids=["vae-read-before", "vae-not-read-yet"])
def test_a_vendor_vae_replaced_between_runs_is_read_again(comfy, comfy_server, checkpoints, tmp_path,
                                                          first_decodes):
    from synthetic_cache import synthetic_link
    from yue2_core.weights.synthetic_vendor import write_vendor_folder
    from yue2_core.weights.vendor import vae_folder_sample
    other = tmp_path / "other.safetensors"
    synthetic_link(str(other), "tiny", "bf16", seed=5)
    write_vendor_folder(str(other), str(tmp_path / "other"))  # its vae/ holds other decoder weights
    name = f"YuE2vaeswap{int(first_decodes)}"
    folder = comfy_server.models_dir / name
    write_vendor_folder(str(checkpoints[TINY]), str(folder))
    first = comfy.wait(comfy.queue(_prompt(31, f"{name}_a", f"{name}/", first_decodes)), timeout=480, check=False)
    assert first["status"]["status_str"] == "success", first["status"]
    for file in ("model.safetensors", "weights_manifest.json"):  # a new VAE download, file by file
        shutil.copyfile(tmp_path / "other" / "vae" / file, folder / "vae" / f"{file}.tmp")
        os.replace(folder / "vae" / f"{file}.tmp", folder / "vae" / file)
    entry = comfy.wait(comfy.queue(_prompt(32, f"{name}_b", f"{name}/")), timeout=480, check=False)
    assert entry["status"]["status_str"] == "success", entry["status"]  # was: "changed on disk …", every time
    (song,) = saved_dirs(entry, comfy_server.output_dir)
    recorded = json.loads((song / "config.json").read_text())["checkpoint"]["vae_sample_sha256"]
    assert recorded == vae_folder_sample(folder / "vae")  # decoded with the new VAE (was: the cached old one)
    shutil.rmtree(folder)  # passed: its ≈ 0.2 GB leave the session's models folder (a failing test's stay; stop 58)


def test_a_vendor_folder_without_its_vae_loads_and_decodes_through_a_vae_loader(comfy, comfy_server, checkpoints):
    """New-user review, stop 46 (docs/bad_inputs.md §27): a vendor model folder without its vae/ could not be loaded
    at all ("no VAE folder … (or pass its path as vae_path)"), so a YuE2 VAE Loader could not give it a decoder. Now
    the Checkpoint Loader loads it (its info says the VAE is missing), VAE Decode without a VAE Loader stops with
    what to do, and with one the song decodes and records that VAE."""
    import shutil

    from yue2_core.weights.synthetic_vae import write_vae
    from yue2_core.weights.synthetic_vendor import write_vendor_folder
    name = "YuE2novae"
    folder = comfy_server.models_dir / name
    write_vendor_folder(str(checkpoints[TINY]), str(folder))
    shutil.rmtree(folder / "vae")
    write_vae(str(comfy_server.models_root / "vae" / "NoVaeStd"), layout="vendor-folder", variant="standard")
    prompt = _prompt(41, f"{name}_a", f"{name}/")
    entry = comfy.wait(comfy.queue(prompt), timeout=480, check=False)
    assert entry["status"]["status_str"] == "error", entry["status"]
    error = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    assert error["node_type"] == "YuE2VAEDecode" and error["exception_type"] == "ValueError", error
    assert (f"the vendor model folder {folder} has no VAE folder, so it cannot decode audio" in
            error["exception_message"] and "a YuE2 VAE Loader node in ComfyUI" in error["exception_message"]), error
    prompt = _prompt(42, f"{name}_b", f"{name}/")
    prompt["7"] = {"class_type": "YuE2VAELoader", "inputs": {"model": ["1", 0], "vae_name": "NoVaeStd/"}}
    prompt["4"]["inputs"]["model"] = ["7", 0]
    entry = comfy.wait(comfy.queue(prompt), timeout=480, check=False)
    assert entry["status"]["status_str"] == "success", entry["status"]
    (song,) = saved_dirs(entry, comfy_server.output_dir)
    config = json.loads((song / "config.json").read_text())
    assert config["weights"]["vae"]["path"].endswith("NoVaeStd") and "vae" not in config["checkpoint"]["files"]
    assert (song / "audio.flac").is_file()
    shutil.rmtree(folder)  # passed: its ≈ 0.2 GB leave the session's models folder (a failing test's stay; stop 58)
