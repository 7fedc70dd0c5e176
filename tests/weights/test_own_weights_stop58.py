"""Found by the stop-58 own-weights break-it review (docs/bad_inputs.md §63): the synthetic VAE writer given a
file in a folder that does not exist yet, `inspect` of a YuE2 VAE file that the VAE reader refuses, and an
unfinished Hugging Face download of the vendor's model folder."""
from __future__ import annotations

import os

from yue2_core.weights import synthetic_vae
from yue2_core.weights.vae_files import open_vae


def test_the_vae_writer_makes_the_folder_of_a_single_file(tmp_path, capsys):
    out = tmp_path / "models" / "vae" / "tiny legacy.safetensors"  # neither folder exists yet
    assert synthetic_vae.main([str(out), "--layout", "vendor-file", "--variant", "legacy"]) == 0
    assert os.path.abspath(out) in capsys.readouterr().out
    assert open_vae(str(out)).variant == "legacy"
    prefixed = tmp_path / "other" / "vae.safetensors"
    assert synthetic_vae.main([str(prefixed), "--layout", "comfy-prefixed"]) == 0
    assert open_vae(str(prefixed)).layout == "comfy-prefixed"


def _inspect(capsys, *args) -> tuple[int, str]:
    from yue2_core.__main__ import main
    try:
        rc = main([str(a) for a in args])
    except SystemExit as exit_:
        rc = exit_.code
    return rc, capsys.readouterr().err


def test_inspect_of_a_vae_the_vae_reader_refuses_gives_that_reason_alone(tmp_path, capsys):
    """A YuE2 VAE file with one conv's weight_g of another width, and a VAE release folder whose config.json says
    44100 Hz: `inspect` said "neither a YuE2 checkpoint, a VAE decoder nor a LoRA adapter", the checkpoint and LoRA
    readers each adding "give it as --vae" — where it is refused."""
    from safetensors.torch import load_file, save_file
    import json
    good = tmp_path / "good.safetensors"
    synthetic_vae.write_vae(str(good), layout="vendor-file")
    t = load_file(str(good))
    key = "decoder.layers.1.layers.1.weight_g"
    t[key] = t[key][: t[key].shape[0] // 2].clone()
    bad = tmp_path / "bad.safetensors"
    save_file(t, str(bad))
    rc, err = _inspect(capsys, "inspect", bad)
    assert rc == 2 and f"{bad} is a VAE file that is refused: " in err, err
    assert f"shape mismatch for {key}" in err, err
    assert "neither" not in err and "give it as --vae" not in err and "as a checkpoint" not in err, err
    folder = tmp_path / "vae_44k"
    synthetic_vae.write_vae(str(folder), layout="vendor-folder")
    config = json.loads((folder / "config.json").read_text())
    config["sample_rate"] = 44100
    (folder / "config.json").write_text(json.dumps(config))
    rc, err = _inspect(capsys, "inspect", folder)
    assert rc == 2 and "is a VAE folder (config.json model_type yue2_vae) that is refused: " in err, err
    assert "sample_rate is 44100" in err and "give it as --vae" not in err and "song folder" not in err, err


def _hf_snapshot(cache, repo: str, config: dict, partial: int):
    """A Hugging Face cache entry of `repo` whose download stopped after config.json: refs/main, the snapshot's
    config.json linked to its blob, and a blob still being written (`.incomplete`, `partial` bytes)."""
    import json
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("0123abc")
    snap = root / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (root / "blobs" / "c0nf1g").write_text(json.dumps(config))
    (snap / "config.json").symlink_to("../../blobs/c0nf1g")
    (root / "blobs" / "0123456789abcdef.incomplete").write_bytes(b"\0" * partial)
    return snap


def test_an_unfinished_hugging_face_download_is_named_with_the_command_that_finishes_it(tmp_path, monkeypatch):
    """The vendor runtime's download of m-a-p/YuE2-3B (or m-a-p/YuE2-Vae) into the Hugging Face cache, stopped after
    config.json: the checkpoint search takes the snapshot, and the refusal said `… has no weights … The vendor
    folder (m-a-p/YuE2-3B) needs them next to config.json.` — inside the cache, where nobody puts files by hand."""
    import pytest

    from yue2_core.errors import CheckpointError
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.locate import find_checkpoint
    for env in ("COMFYUI_PATH", "COMFYUI_DIR", "YUE2_CHECKPOINT", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(env, raising=False)
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    snap = _hf_snapshot(cache, "m-a-p/YuE2-3B", {"model_type": "yue2"}, 2_500_000)
    path, how = find_checkpoint(None, download=False)
    assert path == str(snap) and "Hugging Face cache" in how
    with pytest.raises(CheckpointError) as exc:
        inspect_checkpoint(path)
    text = str(exc.value)
    assert "has no weights" in text and "needs them next to config.json" not in text, text
    assert "download did not finish (1 file(s) partly downloaded, 2.5 MB written" in text, text
    assert "`hf download m-a-p/YuE2-3B`" in text and "give another checkpoint" in text, text
    vae = _hf_snapshot(cache, "m-a-p/YuE2-Vae", {"model_type": "yue2_vae"}, 10)
    with pytest.raises(CheckpointError) as exc:
        open_vae(str(vae))
    text = str(exc.value)
    assert "`hf download m-a-p/YuE2-Vae`" in text and "give another VAE (--vae" in text, text
    folder = tmp_path / "YuE2-3B"  # the same folder outside the cache keeps its message
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "yue2"}')
    with pytest.raises(CheckpointError, match="needs them next to config.json") as exc:
        inspect_checkpoint(str(folder))
    assert "Hugging Face" not in str(exc.value)


def test_a_peft_lora_on_the_token_embedding_is_refused(tmp_path):
    """PEFT with embed_tokens in target_modules saves `…embed_tokens.lora_embedding_A` [r, vocab] and `…_B`
    [hidden, r] beside the Linear pairs: they were listed as unmatched keys and the rest applied without them."""
    import pytest
    import torch
    from safetensors.torch import load_file, save_file

    from yue2_core.errors import AdapterError
    from yue2_core.weights.lora.layouts import read_adapter
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    dims = profile_dims("tiny")
    for name, suffix in (("plain", ""), ("named", ".default")):
        folder = write_adapter("peft", tmp_path / name, dims)
        weights = folder / "adapter_model.safetensors"
        t = load_file(str(weights))
        base = "base_model.model.model.embed_tokens."
        t[base + "lora_embedding_A" + suffix] = torch.randn(4, dims.vocab) * 0.01
        t[base + "lora_embedding_B" + suffix] = torch.randn(dims.hidden, 4) * 0.01
        save_file(t, str(weights))
        for path in (folder, weights):  # the folder, and its weights file given alone (no adapter_config.json)
            with pytest.raises(AdapterError) as exc:
                read_adapter(str(path), dims)
            text = str(exc.value)
            assert "a LoRA on the token embedding" in text and "without embed_tokens in target_modules" in text, text
            assert f"key {base}lora_embedding_A{suffix}" in text, text
