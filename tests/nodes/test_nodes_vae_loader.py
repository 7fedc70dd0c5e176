"""YuE2 VAE Loader against the session's real ComfyUI server: vendor VAE folders in models/vae are listed and decode
the song (bit-identical to the checkpoint's VAE when the folder holds the same weights, different for the legacy
release), the input model still decodes with its own VAE in the same graph, and a file that is not a decoder stops
the run with its specific message."""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import soundfile as sf

from nodes_testlib import api, by_class, codes, rejected, run, run_error, saved_dirs, set_inputs, test_sized

STANDARD, LEGACY = "YuE2-Vae/", "YuE2-Vae-legacy/"  # the shipped workflow's default is LEGACY
ENCODER_ONLY = "yue2_encoder_only.safetensors"


@pytest.fixture(scope="module")
def vae_files(comfy_server, checkpoints) -> dict:
    """Vendor folders of the tiny profile in the server's models/vae: the standard release of seed 0 (the tiny
    checkpoint's own VAE tensors) and the legacy release, plus an encoder-only file."""
    from yue2_core.weights.synthetic_vae import write_negative, write_vae
    root = comfy_server.models_root / "vae"
    made = {STANDARD: write_vae(str(root / STANDARD.rstrip("/")), layout="vendor-folder", variant="standard"),
            LEGACY: write_vae(str(root / LEGACY.rstrip("/")), layout="vendor-folder", variant="legacy"),
            ENCODER_ONLY: write_negative(str(root / ENCODER_ONLY), "encoder-only")}
    return made


def _two_decoders(node_info, vae_name: str, seed: int = 11) -> tuple[dict, dict]:
    """The shipped custom-VAE workflow at test size, plus a second VAE Decode + Save Song fed by the Checkpoint
    Loader's own model (same tokens and latents). Returns (prompt, {"custom"|"own": Save Song node id})."""
    prompt = test_sized(api("yue2_custom_vae_decoder", node_info), seed=seed)
    set_inputs(prompt, "YuE2VAELoader", vae_name=vae_name)
    (loader,) = by_class(prompt, "YuE2CheckpointLoader")
    (decode,) = by_class(prompt, "YuE2VAEDecode")
    (save,) = by_class(prompt, "YuE2SaveSong")
    prompt["own_decode"] = {"class_type": "YuE2VAEDecode",
                            "inputs": {**prompt[decode]["inputs"], "model": [loader, 0]}}
    prompt["own_save"] = {"class_type": "YuE2SaveSong",
                          "inputs": {**prompt[save]["inputs"], "audio": ["own_decode", 0], "name": "yue2_own_vae"}}
    prompt[save]["inputs"]["name"] = "yue2_custom_vae"
    return prompt, {"custom": save, "own": "own_save"}


def _songs(entry, comfy_server, saves) -> dict:
    out = {}
    for key, node in saves.items():
        (rel,) = entry["outputs"][node]["song_dir"]
        out[key] = comfy_server.output_dir / rel
    assert len(set(out.values())) == len(out)
    return out


def _audio(song_dir):
    audio, rate = sf.read(str(song_dir / "audio.flac"), dtype="float32")
    assert rate == 48000 and audio.shape == (1920 * len(codes(song_dir)) - 64, 2)
    return audio


def test_vendor_folders_are_listed(comfy, vae_files):
    options = comfy.object_info("YuE2VAELoader")["input"]["required"]["vae_name"]
    names = options[1]["options"] if options[0] == "COMBO" else options[0]
    assert STANDARD in names and LEGACY in names and ENCODER_ONLY in names
    assert not any(n.startswith(STANDARD) and n != STANDARD for n in names)  # no files from inside a folder


@pytest.fixture(scope="module")
def standard_run(comfy, comfy_server, node_info, vae_files):
    prompt, saves = _two_decoders(node_info, STANDARD)
    entry = run(comfy, prompt)
    return prompt, entry, _songs(entry, comfy_server, saves)


def test_same_weights_decode_bit_identically(standard_run):
    prompt, entry, songs = standard_run
    assert codes(songs["custom"]) == codes(songs["own"])
    assert np.array_equal(np.load(songs["custom"] / "latent.npy"), np.load(songs["own"] / "latent.npy"))
    assert np.array_equal(_audio(songs["custom"]), _audio(songs["own"]))
    (vae_node,) = by_class(prompt, "YuE2VAELoader")
    info = entry["outputs"][vae_node]["text"][0]
    assert info.startswith("VAE decoder: standard VAE (vendor-folder, decoder + encoder)") and "YuE2-Vae" in info
    assert "6 blocks" in info and "1920 samples/frame" in info


def test_legacy_release_differs_and_the_input_model_keeps_its_vae(comfy, comfy_server, node_info, vae_files,
                                                                  standard_run):
    _, _, first = standard_run
    prompt, saves = _two_decoders(node_info, LEGACY)
    entry = run(comfy, prompt)
    songs = _songs(entry, comfy_server, saves)
    # same seed and AR/NAR weights: the same music tokens and latents; only the decoder differs
    assert codes(songs["custom"]) == codes(first["custom"])
    assert np.array_equal(np.load(songs["custom"] / "latent.npy"), np.load(first["custom"] / "latent.npy"))
    legacy, own = _audio(songs["custom"]), _audio(songs["own"])
    assert legacy.shape == own.shape and not np.array_equal(legacy, own)
    assert np.abs(legacy - own).max() > 1e-3
    assert np.array_equal(own, _audio(first["own"]))  # the checkpoint's VAE, unchanged by the VAE Loader in the graph
    (vae_node,) = by_class(prompt, "YuE2VAELoader")
    assert "legacy VAE (vendor-folder" in entry["outputs"][vae_node]["text"][0]
    recorded = json.loads((songs["custom"] / "config.json").read_text())["weights"]["vae"]
    weights_file = os.path.join(vae_files[LEGACY], "model.safetensors")
    assert recorded == {"file": "YuE2-Vae-legacy", "path": os.path.abspath(vae_files[LEGACY]),
                        "sha256": hashlib.sha256(open(weights_file, "rb").read()).hexdigest(),
                        "bytes": os.path.getsize(weights_file), "layout": "vendor-folder", "variant": "legacy",
                        "weights_file": "model.safetensors"}


def test_encoder_only_file_is_refused_with_its_reason(comfy, node_info, vae_files):
    prompt, _ = _two_decoders(node_info, ENCODER_ONLY)
    node_type, exc_type, message = run_error(comfy, prompt)
    assert node_type == "YuE2VAELoader" and exc_type == "ValueError"
    assert "only encoder.* tensors; YuE2 needs the decoder" in message and ENCODER_ONLY in message


def test_unknown_name_is_rejected_before_running(comfy, node_info, vae_files):
    prompt, _ = _two_decoders(node_info, "no_such_vae/")
    body = rejected(comfy, prompt)
    errors = body.get("node_errors") or {}
    (vae_node,) = by_class(prompt, "YuE2VAELoader")
    assert list(errors) == [vae_node], body  # the checkpoint and the rest are valid: only the VAE name is refused
    assert "no_such_vae/" in json.dumps(errors[vae_node]) and "not in ComfyUI's vae folder" in json.dumps(errors)
