"""Found by the stop-58 diff review (docs/bad_inputs.md §68) in `--checkpoint ORG/NAME` / `--vae m-a-p/YuE2-Vae`:
the release's VAE repo given as the checkpoint was "not one YuE2 ships in"; `models/yue2.sft` (ComfyUI's short
safetensors suffix) in a missing folder was read as a repo id; a two-part name looked for in ComfyUI's checkpoints
folder no longer said where it was looked for; `--vae /m-a-p/YuE2-Vae` (an absolute path) and `--vae m-a-p/YuE2-Vae`
with a folder m-a-p here were read as the repo id; `--vae m-a-p/YuE2-3B` did not say it is the model's repo."""
from __future__ import annotations

import argparse
import json

import pytest

from yue2_core.errors import CheckpointError
from yue2_core.weights import locate


@pytest.fixture
def here(tmp_path, monkeypatch):
    """cwd = tmp_path, no ComfyUI, a Hugging Face cache holding a snapshot of m-a-p/YuE2-Vae (its config.json)."""
    for env in ("COMFYUI_PATH", "COMFYUI_DIR", "YUE2_CHECKPOINT", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(locate, "comfy_model_path", lambda *a: None)
    monkeypatch.setattr(locate, "comfy_model_folders", lambda kind: [])
    cache = tmp_path / "hub"
    root = cache / "models--m-a-p--YuE2-Vae"
    snap = root / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("0123abc")
    (snap / "config.json").write_text(json.dumps({"model_type": "yue2_vae"}))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return {"root": tmp_path, "snap": snap}


def test_the_vae_repo_given_as_the_checkpoint_says_to_give_it_as_vae(here):
    with pytest.raises(CheckpointError) as caught:
        locate.find_checkpoint("m-a-p/YuE2-Vae", download=False)
    text = str(caught.value)
    assert "holds YuE2's VAE decoder alone, not a model — give it as --vae m-a-p/YuE2-Vae" in text, text
    assert "--checkpoint m-a-p/YuE2-3B or Comfy-Org/YuE2" in text and "not one YuE2 ships in" not in text, text


def test_comfyuis_short_safetensors_suffix_stays_a_path(here):
    for name in ("nope/yue2.sft", "nope/yue2.pt2"):
        with pytest.raises(CheckpointError, match="checkpoint not found: nope/yue2"):
            locate.find_checkpoint(name, download=False)


def test_a_two_part_name_says_the_comfyui_folders_it_was_looked_for_in(here, monkeypatch):
    monkeypatch.setattr(locate, "comfy_model_folders", lambda kind: ["/c/models/checkpoints"])
    with pytest.raises(CheckpointError) as caught:
        locate.find_checkpoint("yue2/tiny_int8", download=False)
    text = str(caught.value)
    assert "no such file or folder (neither here nor in ComfyUI's /c/models/checkpoints)" in text, text
    monkeypatch.setattr(locate, "comfy_model_folders", lambda kind: [])
    with pytest.raises(CheckpointError, match="no such file or folder here, and as a Hugging Face repo id"):
        locate.find_checkpoint("someone/other-model", download=False)


def test_vae_repo_id_only_where_no_path_is_meant(here, capsys):
    from yue2_core.cli.options import parse_vae
    assert parse_vae("m-a-p/YuE2-Vae") == str(here["snap"])  # the repo id: its cached snapshot
    assert parse_vae("m-a-p/yue2-vae/") == str(here["snap"])
    assert "Hugging Face cache" in capsys.readouterr().err
    with pytest.raises(argparse.ArgumentTypeError, match="VAE '/m-a-p/YuE2-Vae' not found"):
        parse_vae("/m-a-p/YuE2-Vae")  # an absolute path that is not there: never the repo
    (here["root"] / "m-a-p").mkdir()  # a folder m-a-p here: m-a-p/YuE2-Vae is a path in it
    with pytest.raises(argparse.ArgumentTypeError, match="VAE 'm-a-p/YuE2-Vae' not found"):
        parse_vae("m-a-p/YuE2-Vae")


def test_the_model_repo_given_as_vae_is_named(here):
    from yue2_core.cli.options import parse_vae
    for repo in ("m-a-p/YuE2-3B", "Comfy-Org/YuE2"):
        with pytest.raises(argparse.ArgumentTypeError,
                           match=f"; {repo} is the model's repo — give it as --checkpoint; the VAE's is "
                                 "m-a-p/YuE2-Vae$"):
            parse_vae(repo)
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        parse_vae("models/vae.safetensors")
    assert "model's repo" not in str(caught.value)
