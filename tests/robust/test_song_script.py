"""scripts/song.sh passes the user's options through in both spellings (`--opt value` and `--opt=value`): the given
checkpoint, style, lyrics and output are the ones used (its defaults only fill what the user left out)."""
import json
import os
import subprocess

from robust_helpers import REPO


def test_song_script_honours_equals_options(tmp_path, tiny_paths):
    out = tmp_path / "song"
    env = {k: v for k, v in os.environ.items() if k not in ("YUE2_CHECKPOINT",)}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "song.sh"), f"--checkpoint={tiny_paths['int8']}",
                           "--style=smooth jazz", "--lyrics", "hello world", "--max-seconds=0.2", f"--output={out}",
                           "--cot=off", "--steps=1", "--device=cpu", "--offline"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    request = json.loads((out / "request.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert request["style"] == "smooth jazz" and request["lyrics"] == "hello world", request
    assert config["checkpoint"]["path"] == str(tiny_paths["int8"]), config["checkpoint"]
    assert len(json.loads(proc.stdout)["output"]) and json.loads(proc.stdout)["semantic_tokens"] <= 5


def test_printed_output_is_absolute_for_a_relative_output(tmp_path, tiny_paths):
    """A relative --output is relative to where the command runs, and the summary names the song folder by its
    absolute path (a relative one could not be found from another folder)."""
    env = {k: v for k, v in os.environ.items() if k not in ("YUE2_CHECKPOINT",)}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "song.sh"), "--checkpoint", str(tiny_paths["int8"]),
                           "--max-seconds", "0.2", "--output", "songs/first", "--cot", "off", "--steps", "1",
                           "--device", "cpu", "--offline"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout)["output"]
    assert os.path.isabs(printed) and printed == str((tmp_path / "songs" / "first").resolve()), printed
    assert (tmp_path / "songs" / "first" / "result.json").is_file()


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
