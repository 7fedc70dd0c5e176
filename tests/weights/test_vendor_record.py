"""A song made from a vendor folder records that folder's weight files in result.json (names, sizes and sha256 from
its weights_manifest.json), not the folder paths; its VAE entry names the YuE2-Vae folder's files."""
from __future__ import annotations

import json

from yue2_core.__main__ import main
from yue2_core.weights.synthetic import write_synthetic_checkpoint
from yue2_core.weights.synthetic_vendor import write_vendor_folder


def test_vendor_song_records_the_folder_files(tmp_path):
    comfy = tmp_path / "tiny_bf16.safetensors"
    write_synthetic_checkpoint(str(comfy), "tiny", "bf16", seed=0)
    folder = tmp_path / "YuE2-3B"
    write_vendor_folder(str(comfy), str(folder))
    out = tmp_path / "song"
    assert main(["generate", "--style", "pop", "--lyrics", "la", "--checkpoint", str(folder), "--max-seconds", "1",
                 "--max-abc-tokens", "8", "--steps", "2", "--device", "cpu", "--offline", "--output", str(out)]) == 0
    weights = json.loads((out / "result.json").read_text())["weights"]
    manifest = json.loads((folder / "weights_manifest.json").read_text())["files"]
    assert weights["mot"]["files"]["model.safetensors"] == {"sha256": manifest["model.safetensors"]["sha256"],
                                                            "bytes": manifest["model.safetensors"]["bytes"]}
    assert all(entry["bytes"] != 4096 or name in manifest for name, entry in weights["mot"]["files"].items())
    assert not weights["vae"].get("embedded")
    assert any(name.endswith(".safetensors") and entry["sha256"] for name, entry in weights["vae"]["files"].items())
