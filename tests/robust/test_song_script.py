"""scripts/song.sh passes the user's options through in both spellings (`--opt value` and `--opt=value`): the given
checkpoint, style, lyrics and output are the ones used (its defaults only fill what the user left out)."""
import json
import os
import subprocess
import sys

import pytest

from robust_helpers import REPO


@pytest.fixture(scope="module")
def equals_song(tmp_path_factory, tiny_paths) -> tuple:
    """(the run, its folder) of one `song.sh` run for the two tests below: options in the `--opt=value` spelling (and
    --lyrics as `--opt value`), a relative --output=songs/first from the folder the command runs in."""
    where = tmp_path_factory.mktemp("song_sh")
    env = {k: v for k, v in os.environ.items() if k not in ("YUE2_CHECKPOINT",)}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "song.sh"), f"--checkpoint={tiny_paths['int8']}",
                           "--style=smooth jazz", "--lyrics", "hello world", "--max-seconds=0.2",
                           "--output=songs/first", "--cot=off", "--steps=1", "--device=cpu", "--offline"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=where)
    return proc, where


def test_song_script_honours_equals_options(equals_song, tiny_paths):
    proc, where = equals_song
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = where / "songs" / "first"
    request = json.loads((out / "request.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert request["style"] == "smooth jazz" and request["lyrics"] == "hello world", request
    assert config["checkpoint"]["path"] == str(tiny_paths["int8"]), config["checkpoint"]
    assert len(json.loads(proc.stdout)["output"]) and json.loads(proc.stdout)["semantic_tokens"] <= 5


def test_printed_output_is_absolute_for_a_relative_output(equals_song):
    """A relative --output is relative to where the command runs, and the summary names the song folder by its
    absolute path (a relative one could not be found from another folder)."""
    proc, where = equals_song
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout)["output"]
    assert os.path.isabs(printed) and printed == str((where / "songs" / "first").resolve()), printed
    assert (where / "songs" / "first" / "result.json").is_file()


def test_broken_venv_link_is_named(tmp_path):
    """A .venv that is a broken symlink (or a file) is named with what to do, not a `python -m venv` error."""
    venv = tmp_path / "venv"
    venv.symlink_to(tmp_path / "nowhere")
    env = dict(os.environ, SONG_SH_VENV=str(venv))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "song.sh"), "--device=cpu"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert f"{venv} exists but" in proc.stderr and "broken symlink" in proc.stderr and "delete" in proc.stderr
    assert "Errno" not in proc.stderr


def test_help_describes_song_sh_then_generate(tmp_path):
    """Review finding: `song.sh --help` printed generate's help alone (its --output required, 360 s default) without
    a word of song.sh's own defaults. Now its own header and defaults first, then generate's options; with no
    installed engine it says so instead of creating a venv."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "song.sh"), "--style", "x", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    head, _, tail = proc.stdout.partition("usage: python -m yue2_core generate")
    assert "makes a song from a style and lyrics" in head and "--max-seconds 20" in head, proc.stdout[:2000]
    assert "--output is optional here" in head and "--checkpoint" in tail, proc.stdout[-2000:]
    env = dict(os.environ, SONG_SH_VENV=str(tmp_path / "none"))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "song.sh"), "-h"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "the engine is not installed yet" in proc.stdout, proc.stdout[-2000:]
    assert not (tmp_path / "none").exists()


SONG_SH = REPO / "scripts" / "song.sh"

# A virtual environment for scripts/song.sh whose python records the options `-m yue2_core generate` gets (and does
# not run it), answers `-m pip` with the lines pip prints, and runs everything else (song.sh's checks) with this
# interpreter; with the file `fresh` beside it, every `-c` check fails until "pip install" has run (with
# `keeps_torch` too, except the one listing the installed torch: this interpreter's). The check that the engine
# imports passes without importing torch (seconds each time; this interpreter has it).
FAKE_PYTHON = """#!/bin/bash
d=$(dirname "$0")
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
    echo "Collecting torch"; echo "Installing collected packages: torch, numpy"; echo "Successfully installed torch"
    touch "$d/installed"; exit 0
fi
if [ "$1" = "-c" ] && [ -f "$d/keeps_torch" ] && [[ "$2" == *importlib.metadata* ]]; then exec {real} "$@"; fi
if [ "$1" = "-c" ] && [ -f "$d/fresh" ] && [ ! -f "$d/installed" ]; then exit 1; fi
if [ "$1" = "-c" ] && [[ "$2" == "import yue2_core, torch, "* ]]; then exit 0; fi
if [ "$1" = "-m" ] && [ "$2" = "yue2_core" ]; then shift 2; printf '%s\\n' "$@" > "$d/generate_args"; exit 0; fi
exec {real} "$@"
"""


def _song_env(tmp_path, fresh=False, keeps_torch=False, **extra):
    """(environment, bin folder) for scripts/song.sh with the fake python above, HOME and the Hugging Face cache in
    `tmp_path`, no ComfyUI and no $YUE2_CHECKPOINT; `extra` added."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(FAKE_PYTHON.format(real=sys.executable))
    (bin_dir / "python").chmod(0o755)
    if fresh:
        (bin_dir / "fresh").touch()
    if keeps_torch:
        (bin_dir / "keeps_torch").touch()
    env = {k: v for k, v in os.environ.items() if k not in ("YUE2_CHECKPOINT", "COMFYUI_PATH", "COMFYUI_DIR",
                                                            "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    env.update(SONG_SH_VENV=str(tmp_path / "venv"), HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO),
               HF_HUB_CACHE=str(tmp_path / "hf"))
    env.update(extra)
    return env, bin_dir


def _generate_args(env, bin_dir, *args) -> list[str]:
    proc = subprocess.run(["bash", str(SONG_SH), "--output", "out", *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return (bin_dir / "generate_args").read_text().splitlines()


def _vendor_config(folder):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "yue2"}))


# --- new-user review, stop 46 (docs/bad_inputs.md §27): song.sh searches as generate does -----------------------------

def test_song_sh_leaves_a_vendor_folder_in_comfyui_checkpoints_to_generate(tmp_path):
    """A vendor YuE2-3B folder in ComfyUI's models/checkpoints: song.sh checked only for all-in-one files and ran
    its synthetic file (random weights) instead; now it leaves the choice to generate, which takes the folder."""
    comfy = tmp_path / "ComfyUI"
    _vendor_config(comfy / "models" / "checkpoints" / "YuE2-3B")
    env, bin_dir = _song_env(tmp_path, COMFYUI_PATH=str(comfy))
    args = _generate_args(env, bin_dir)
    assert "--checkpoint" not in args and "--max-abc-tokens" not in args, args


def test_song_sh_leaves_the_hugging_face_cache_snapshot_to_generate(tmp_path):
    """m-a-p/YuE2-3B already in the Hugging Face cache (the vendor runtime downloaded it): the same."""
    repo = tmp_path / "hf" / "models--m-a-p--YuE2-3B"
    _vendor_config(repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    env, bin_dir = _song_env(tmp_path)
    args = _generate_args(env, bin_dir)
    assert "--checkpoint" not in args, args


def test_song_sh_takes_its_synthetic_file_only_when_nothing_is_found(tmp_path):
    """Nothing in ComfyUI or the cache (an empty checkpoints folder, a cache of another model): the synthetic file,
    with its token cap; --checkpoint given: nothing added."""
    comfy = tmp_path / "ComfyUI"
    (comfy / "models" / "checkpoints").mkdir(parents=True)
    (comfy / "models" / "checkpoints" / "notes.txt").write_text("x")
    _vendor_config(tmp_path / "hf" / "models--someone--other" / "snapshots" / "1")
    models = REPO / "models"
    made = not (models / "yue2_tiny_bf16.safetensors").exists()
    if made:  # song.sh would write it (seconds): a placeholder it finds instead
        models.mkdir(exist_ok=True)
        (models / "yue2_tiny_bf16.safetensors").write_bytes(b"")
    try:
        env, bin_dir = _song_env(tmp_path, COMFYUI_PATH=str(comfy))
        args = _generate_args(env, bin_dir)
    finally:
        if made:
            (models / "yue2_tiny_bf16.safetensors").unlink()
    at = args.index("--checkpoint")
    assert args[at + 1] == str(models / "yue2_tiny_bf16.safetensors"), args
    assert "picked by scripts/song.sh" in args[at + 3] and "--max-abc-tokens" in args, args
    args = _generate_args(env, bin_dir, "--checkpoint", "mine.safetensors")
    assert args.count("--checkpoint") == 1 and "--max-abc-tokens" not in args, args


def test_song_sh_help_names_the_search(tmp_path):
    proc = subprocess.run(["bash", str(SONG_SH), "--help"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, SONG_SH_VENV=str(tmp_path / "none")))
    text = " ".join(proc.stdout.split())
    assert "vendor YuE2-3B folder in ComfyUI's models/checkpoints" in text, text[:2000]
    assert "m-a-p/YuE2-3B in the Hugging Face cache" in text and "When none is found" in text, text[:2000]


@pytest.mark.parametrize("keeps_torch", [False, True])
def test_song_sh_says_that_installing_prints_nothing_for_a_while(tmp_path, keeps_torch):
    """First run: after pip's "Installing collected packages: …" nothing was printed for about a minute (5 GB of
    torch), though the header promised progress for each package. Now a line says the quiet step is coming."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env, bin_dir = _song_env(tmp_path, fresh=True, keeps_torch=keeps_torch, YUE2_CHECKPOINT="mine.safetensors",
                             TMPDIR=str(scratch))
    proc = subprocess.run(["bash", str(SONG_SH), "--output", "out"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the kept torch's pins file is gone once the song starts (the final `exec` skips the EXIT trap: one file a run
    # was left in /tmp before stop 51)
    assert not list(scratch.glob("song_sh_pins.*")), list(scratch.iterdir())
    lines = proc.stdout.splitlines()
    at = lines.index("[pip] Installing collected packages: torch, numpy")
    said = ("[song.sh] installing the downloaded packages: pip prints nothing until it is done" if keeps_torch else
            "[song.sh] installing ≈ 5 GB of packages (torch with CUDA): about a minute without output")
    assert lines[at + 1:at + 3] == [said, "[pip] Successfully installed torch"], lines
    assert (bin_dir / "generate_args").is_file()
    helped = subprocess.run(["bash", str(SONG_SH), "--help"], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, SONG_SH_VENV=str(tmp_path / "none")))
    text = " ".join(helped.stdout.split())
    assert "each package as it is downloaded and installed" not in text
    assert "installing the downloaded packages then takes about a minute without output" in text, text[:2000]
