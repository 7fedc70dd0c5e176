"""Found by the stop-57 new-user review (docs/bad_inputs.md §61): `batch nope.jsonl --output runs/x` without a
checkpoint searched for one first and started the 3.7 GB download before it said the request file is missing;
`generate` / `render` / `batch --vae nope` did the same before "VAE not found" (a missing `--lora` was refused at
once); `--vae ""` loaded the model before its error; `--checkpoint models/yue2_tiny_bf16.safetenors` (a typo) got the
download advice without the file beside it."""
from __future__ import annotations

import pytest

from test_cli import main_inprocess


@pytest.fixture
def no_search(monkeypatch, tmp_path):
    """The checkpoint search, made to fail the test if it is reached; the test runs in an empty folder."""
    from yue2_core.weights import locate

    def reached(*a, **k):
        raise AssertionError("the checkpoint search (and its download) ran before the input was checked")
    monkeypatch.setattr(locate, "find_checkpoint", reached)
    for var in ("YUE2_CHECKPOINT", "COMFYUI_PATH", "COMFYUI_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_batch_checks_its_request_file_before_the_checkpoint_search(no_search, capsys):
    rc, err = main_inprocess(capsys, "batch", "nope.jsonl", "--output", "runs/x")
    assert rc == 2 and "error: request file nope.jsonl does not exist; give the path of a JSONL file" in err, err
    (no_search / "empty.jsonl").write_text("# a comment, no request\n")
    rc, err = main_inprocess(capsys, "batch", "empty.jsonl", "--output", "runs/x")
    assert rc == 2 and "empty.jsonl" in err and "Traceback" not in err, err
    assert not (no_search / "runs").exists()


@pytest.mark.parametrize("command", ["generate", "render", "batch"])
def test_a_missing_vae_is_refused_before_the_checkpoint_search(no_search, capsys, command):
    first = {"generate": ["--style", "x", "--lyrics", "y"], "render": ["song"], "batch": ["requests.jsonl"]}[command]
    rc, err = main_inprocess(capsys, command, *first, "--vae", "nope", "--output", "out")
    assert rc == 2 and "argument --vae: VAE 'nope' not found (a YuE2 VAE is a folder with config.json + " \
        "model.safetensors, or a .safetensors file)" in err, err
    rc, err = main_inprocess(capsys, command, *first, "--vae", "", "--output", "out")
    assert rc == 2 and "argument --vae: '' names no VAE (an unset shell variable?)" in err, err
    assert not (no_search / "out").exists()


def test_a_missing_vae_name_says_which_comfyui_folder_was_searched(no_search, monkeypatch):
    import argparse

    from yue2_core.cli.options import parse_vae
    models = no_search / "ComfyUI" / "models"
    for kind in ("checkpoints", "vae"):
        (models / kind).mkdir(parents=True)
    monkeypatch.setenv("COMFYUI_PATH", str(no_search / "ComfyUI"))
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        parse_vae("YuE2-Vae-legacy")
    assert f"VAE 'YuE2-Vae-legacy' not found, neither here nor in ComfyUI's {models / 'vae'} (" in str(caught.value)
    (models / "vae" / "YuE2-Vae-legacy").mkdir()  # found there, as before
    assert parse_vae("YuE2-Vae-legacy") == str(models / "vae" / "YuE2-Vae-legacy")
    (no_search / "gone").symlink_to(no_search / "missing")  # a broken link here: open_vae says it is one
    assert parse_vae("gone") == "gone"


def test_a_mistyped_checkpoint_path_names_the_file_beside_it(tmp_path, monkeypatch):
    from yue2_core.errors import CheckpointError
    from yue2_core.weights import locate
    for var in ("YUE2_CHECKPOINT", "COMFYUI_PATH", "COMFYUI_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(locate, "comfy_checkpoint_dirs", lambda: [])
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "yue2_tiny_bf16.safetensors").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as caught:
        locate.find_checkpoint("models/yue2_tiny_bf16.safetenors", download=False)
    message = str(caught.value)
    assert message.startswith("checkpoint not found: models/yue2_tiny_bf16.safetenors (did you mean "
                              "models/yue2_tiny_bf16.safetensors?). The release file is"), message
    with pytest.raises(CheckpointError) as caught:  # no close name: the checkpoints lying in ./models are named
        locate.find_checkpoint("models/other.safetensors", download=False)
    message = str(caught.value)
    assert "did you mean" not in message and message.endswith(
        "Found here: --checkpoint models/yue2_tiny_bf16.safetensors"), message
    with pytest.raises(CheckpointError) as caught:  # a folder that does not exist: no guess, no traceback
        locate.find_checkpoint("/nonexistent/folder/yue2.safetensors", download=False)
    assert "did you mean" not in str(caught.value)


def test_inspect_of_a_mistyped_path_names_the_close_one_and_what_was_not_found(tmp_path, monkeypatch, capsys):
    """`inspect out/my_song/score.ab` said "checkpoint not found: out/my_song/score.ab" and nothing about score.abc
    beside it; a song folder's typo likewise. The message now calls a lead sheet or a folder by no wrong name and
    names the close entry; a checkpoint's name keeps "checkpoint not found"."""
    for var in ("YUE2_CHECKPOINT", "COMFYUI_PATH", "COMFYUI_DIR"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "out" / "my_song").mkdir(parents=True)
    (tmp_path / "out" / "my_song" / "score.abc").write_text("X:1\n")
    monkeypatch.chdir(tmp_path)
    rc, err = main_inprocess(capsys, "inspect", "out/my_song/score.ab")
    assert rc == 2 and "error: not found: out/my_song/score.ab — no such file or folder here (did you mean " \
        "out/my_song/score.abc?); inspect takes the path of" in err, err
    rc, err = main_inprocess(capsys, "inspect", "out/my_sogn")
    assert rc == 2 and "error: not found: out/my_sogn — no such file or folder here (did you mean out/my_song?)" \
        in err, err
    rc, err = main_inprocess(capsys, "inspect", "out/my_sogn/")  # tab-completed (stop-57 diff review: no guess)
    assert rc == 2 and "(did you mean out/my_song?)" in err, err
    rc, err = main_inprocess(capsys, "inspect", "out/other.abc")
    assert rc == 2 and "error: lead sheet not found: out/other.abc — no such file or folder here;" in err, err
    rc, err = main_inprocess(capsys, "inspect", "yue2.safetensors")
    assert rc == 2 and "error: checkpoint not found: yue2.safetensors — no such file or folder here;" in err, err
