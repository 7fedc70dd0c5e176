"""Findings of the stop-46 new-user review (docs/bad_inputs.md §27)."""
from __future__ import annotations

import os
import stat


# --- the test-file writers' safetensors are 0600, the JSON beside them 0644 -----------------------------------------

def test_synthetic_lora_and_vae_files_get_a_new_files_mode(tmp_path):
    """safetensors' save_file leaves 0600: the LoRA and VAE files of the test-file writers could not be read by
    another user (a ComfyUI service account) while the JSON files beside them could. Now 0666 less the umask."""
    from yue2_core.artifacts import UMASK
    from yue2_core.weights.lora.synthetic import profile_dims, write_all
    from yue2_core.weights.synthetic_vae import write_vae
    want = 0o666 & ~UMASK
    paths = list(write_all(tmp_path / "loras", profile_dims("tiny")).values())
    paths += [write_vae(str(tmp_path / "vae")), write_vae(str(tmp_path / "v.safetensors"), layout="comfy-prefixed")]
    files = [p for p in map(str, paths) if os.path.isfile(p)]
    files += [str(p) for p in (tmp_path / "loras").rglob("*") if p.is_file()]
    files += [str(p) for p in (tmp_path / "vae").iterdir()]
    assert len(files) > 20 and any(f.endswith(".json") for f in files)
    modes = {f: stat.S_IMODE(os.stat(f).st_mode) for f in files}
    assert {f: m for f, m in modes.items() if m != want} == {}, want
