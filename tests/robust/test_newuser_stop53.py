"""Found by the stop-53 new-user review (docs/bad_inputs.md §44): with `$COMFYUI_PATH` set to a folder that is no
ComfyUI — mistyped, or one level too deep (`ComfyUI/models`) — the command line said "no YuE2 checkpoint found …
searched only when … $COMFYUI_PATH names that ComfyUI", the advice an unset variable gets, and without --offline it
went on to download the 3.7 GB release file without a word about the variable; scripts/song.sh took its synthetic
file in silence."""
from __future__ import annotations

import subprocess

import pytest

from robust_helpers import REPO
from test_cli import main_inprocess


@pytest.fixture
def no_other_checkpoint(tmp_path, monkeypatch):
    from yue2_core.weights import locate
    for var in ("YUE2_CHECKPOINT", "COMFYUI_DIR", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(locate, "hf_vendor_snapshot", lambda: None)  # whatever this machine's HF cache holds
    monkeypatch.chdir(tmp_path)  # no models/ here
    return tmp_path


@pytest.mark.parametrize("case", ["missing", "too_deep", "no_yue2_file"])
def test_a_comfyui_path_that_gave_nothing_is_named(no_other_checkpoint, monkeypatch, capsys, case):
    comfy = no_other_checkpoint / "ComfyUI"
    (comfy / "models" / "checkpoints").mkdir(parents=True)
    (comfy / "models" / "checkpoints" / "sdxl.safetensors").write_bytes(b"not a YuE2 file")
    value = {"missing": no_other_checkpoint / "ComfyUl", "too_deep": comfy / "models", "no_yue2_file": comfy}[case]
    monkeypatch.setenv("COMFYUI_PATH", str(value))
    rc, err = main_inprocess(capsys, "generate", "--style", "x", "--lyrics", "y", "--offline", "--output",
                             no_other_checkpoint / "out")
    assert rc == 2 and "no YuE2 checkpoint found (downloading is off: --offline)" in err, err
    said = {"missing": f"$COMFYUI_PATH={value} is not a folder",
            "too_deep": f"$COMFYUI_PATH={value} has no models/checkpoints folder (it must name the ComfyUI folder",
            "no_yue2_file": f"$COMFYUI_PATH's {comfy / 'models' / 'checkpoints'} holds no YuE2 checkpoint (1 other"}
    assert said[case] in err.split(". The release file")[0], err
    # batch finds its checkpoint with the same search, and says the same
    requests = no_other_checkpoint / "r.jsonl"
    requests.write_text('{"id": "a", "style": "x", "lyrics": "y"}\n')
    rc, err = main_inprocess(capsys, "batch", requests, "--offline", "--output", no_other_checkpoint / "runs")
    assert rc == 2 and said[case] in err, err



def test_a_yue2_file_in_a_checkpoints_subfolder_is_named(no_other_checkpoint, monkeypatch, capsys, tiny_paths):
    """ComfyUI lists `audio/yue2.safetensors` in its Loader; the command line's search looks only at the folder's own
    files: the error names the file and the --checkpoint that takes it (an image checkpoint beside it is not named)."""
    checkpoints = no_other_checkpoint / "ComfyUI" / "models" / "checkpoints"
    (checkpoints / "audio").mkdir(parents=True)
    (checkpoints / "audio" / "yue2.safetensors").symlink_to(tiny_paths["int8"])
    (checkpoints / "audio" / "aaa_sdxl.safetensors").write_bytes(b"not a YuE2 file")
    monkeypatch.setenv("COMFYUI_PATH", str(no_other_checkpoint / "ComfyUI"))
    rc, err = main_inprocess(capsys, "generate", "--style", "x", "--lyrics", "y", "--offline", "--output",
                             no_other_checkpoint / "out")
    assert rc == 2 and (f"$COMFYUI_PATH's {checkpoints} holds no YuE2 checkpoint (no weight files in it); its "
                        "subfolders, which are not searched, hold audio/yue2.safetensors: give one as --checkpoint "
                        "audio/yue2.safetensors.") in err and "aaa_sdxl" not in err, err
    from yue2_core.weights.locate import find_checkpoint
    found, _ = find_checkpoint("audio/yue2.safetensors", download=False)  # the advice works
    assert found == str(checkpoints / "audio" / "yue2.safetensors")

def test_an_unset_or_working_comfyui_path_adds_nothing(no_other_checkpoint, monkeypatch, capsys):
    from yue2_core.weights.locate import comfy_env_hint
    monkeypatch.delenv("COMFYUI_PATH", raising=False)
    assert comfy_env_hint() == ""
    rc, err = main_inprocess(capsys, "generate", "--style", "x", "--lyrics", "y", "--offline", "--output",
                             no_other_checkpoint / "out")
    assert rc == 2 and "$COMFYUI_PATH" not in err.split(". The release file")[0], err


def test_the_download_is_announced_when_comfyui_path_gave_nothing(no_other_checkpoint, monkeypatch, capsys):
    """Online, a mistyped $COMFYUI_PATH leads to the 3.7 GB download: a note says why before it starts."""
    import huggingface_hub
    from yue2_core.weights import locate
    monkeypatch.setenv("COMFYUI_PATH", str(no_other_checkpoint / "nowhere"))
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")  # no direct reachability probe: the client runs
    asked = []

    def download(repo, name, **kw):
        asked.append((repo, name, capsys.readouterr().err))  # what was printed before the client was asked
        raise OSError("test: no network here")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    with pytest.raises(locate.CheckpointError, match="the download failed"):
        locate.find_checkpoint(None, download=True)
    assert [a[:2] for a in asked] == [(locate.HF_REPO, locate.HF_FILE)]
    note = asked[0][2]
    assert note.startswith(f"note: $COMFYUI_PATH={no_other_checkpoint / 'nowhere'} is not a folder; ") \
        and "downloading" in note and "--offline never downloads" in note, note


def test_song_sh_names_a_comfyui_path_that_gave_nothing(tmp_path):
    """scripts/song.sh fell back to its synthetic file (random weights) without a word about the variable."""
    from test_song_script import _generate_args, _song_env
    env, bin_dir = _song_env(tmp_path, COMFYUI_PATH=str(tmp_path / "ComfyUl"))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "song.sh"), "--output", "out"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"[song.sh] note: $COMFYUI_PATH={tmp_path / 'ComfyUl'} is not a folder: no checkpoint found there" \
        in proc.stderr, proc.stderr[-3000:]
    args = (bin_dir / "generate_args").read_text().splitlines()
    assert "picked by scripts/song.sh: its synthetic file, random weights" in args, args
    env.pop("COMFYUI_PATH")  # unset: the synthetic file, no note
    proc = subprocess.run(["bash", str(REPO / "scripts" / "song.sh"), "--output", "out"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "[song.sh] note:" not in proc.stderr, proc.stderr[-3000:]
    assert "--checkpoint" in _generate_args(env, bin_dir)
