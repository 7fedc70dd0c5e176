"""Found by the stop-54 new-user review (docs/bad_inputs.md §50): README's command line shows `generate --checkpoint
yue2_3b_int8_convrot.safetensors` and then `inspect yue2_3b_int8_convrot.safetensors`; where the file lies in
ComfyUI's models/checkpoints (the pack in ComfyUI/custom_nodes, or `$COMFYUI_PATH`), generate found it by that name
— as `--lora` / `--vae` names are found in models/loras and models/vae — but inspect said "checkpoint not found: …
no such file or folder". inspect (and its `--model`) now looks a name that is no path here up in the same folders,
with the same note."""
from __future__ import annotations

import json

from test_cli import main_inprocess


def _comfy(tmp_path, monkeypatch, tiny_paths):
    from yue2_core.weights import locate
    for var in ("YUE2_CHECKPOINT", "COMFYUI_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(locate, "hf_vendor_snapshot", lambda: None)
    models = tmp_path / "ComfyUI" / "models"
    for kind in ("checkpoints", "loras", "vae"):
        (models / kind).mkdir(parents=True)
    (models / "checkpoints" / "yue2_tiny.safetensors").symlink_to(tiny_paths["int8"])
    monkeypatch.setenv("COMFYUI_PATH", str(tmp_path / "ComfyUI"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # no file of that name here
    return models


def test_inspect_finds_a_checkpoint_name_in_comfyui_as_generate_does(tmp_path, monkeypatch, capsys, tiny_paths):
    models = _comfy(tmp_path, monkeypatch, tiny_paths)
    from yue2_core.__main__ import main
    rc = main(["inspect", "yue2_tiny.safetensors"])
    out, err = capsys.readouterr()
    path = models / "checkpoints" / "yue2_tiny.safetensors"
    assert rc == 0, err
    assert f"note: yue2_tiny.safetensors: {path} (ComfyUI folder {models / 'checkpoints'})" in err, err
    assert "YuE2 int8 all-in-one" in err and json.loads(out)["kind"] == "checkpoint"


def test_inspect_finds_lora_and_vae_names_and_model_names_in_comfyui(tmp_path, monkeypatch, capsys, tiny_paths):
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    from yue2_core.weights.synthetic_vae import write_vae
    models = _comfy(tmp_path, monkeypatch, tiny_paths)
    write_adapter("aitk", models / "loras" / "aitk.safetensors", profile_dims("tiny"))
    write_vae(str(models / "vae" / "YuE2-Vae-legacy"), variant="legacy", profile="tiny")
    rc, err = main_inprocess(capsys, "inspect", "aitk.safetensors", "--model", "yue2_tiny.safetensors")
    assert rc == 0 and "YuE2 adapter, layout ai-toolkit" in err, err
    assert f"note: aitk.safetensors: {models / 'loras' / 'aitk.safetensors'} (ComfyUI folder {models / 'loras'})" \
        in err and f"note: --model yue2_tiny.safetensors: {models / 'checkpoints' / 'yue2_tiny.safetensors'}" in err
    rc, err = main_inprocess(capsys, "inspect", "YuE2-Vae-legacy")
    assert rc == 0 and "legacy VAE" in err and f"(ComfyUI folder {models / 'vae'})" in err, err
    # a name found nowhere is still "not found", and the message names the folders looked in
    rc, err = main_inprocess(capsys, "inspect", "yue2_3b_int8_convrot.safetensors")
    assert rc == 2 and "checkpoint not found: yue2_3b_int8_convrot.safetensors — no such file or folder here" in err \
        and str(models / "checkpoints") in err, err
