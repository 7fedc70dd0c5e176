"""Issue 20, "say what is really wrong" and "as a newcomer sees it" (items 11, 13, 19, 21, 22): invalid UTF-8 arguments
named as bytes, NUL and fake prompt sections warned about, the score check with the run's --max-seconds and control
characters, song.sh's install progress / last lines / checkpoint origin / seed, one rule for a supplied score in the
CLI and the Composer, inspect's download hint, and the ComfyUI guide's structure."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

from robust_helpers import REPO
from test_cli import main_inprocess

NO_CKPT = "/nonexistent/yue2.safetensors"
GEN = ("generate", "--offline", "--checkpoint", NO_CKPT)
CORPUS = REPO / "tests" / "abc" / "corpus" / "song.abc"


# --- item 11 -------------------------------------------------------------------------------------------------------

def test_invalid_utf8_arguments_are_named_as_bytes(tmp_path, capsys):
    """Before: 'style contains an unpaired surrogate U+DCFF' — a Python detail, not what the user typed."""
    style = os.fsdecode(b"pop \xff rock")  # what Python makes of a non-UTF-8 argv byte
    rc, err = main_inprocess(capsys, *GEN, "--style", style, "--lyrics", "la", "--output", tmp_path / "o")
    assert rc == 2 and "--style is not valid UTF-8: byte 0xFF at character 4" in err, err
    assert "surrogate" not in err and "--style-file" in err


def test_nul_bytes_and_fake_prompt_sections_are_warned_about(tmp_path, capsys):
    lyrics = tmp_path / "l.txt"
    lyrics.write_bytes(b"[Verse]\nla\x00la\n")
    rc, err = main_inprocess(capsys, *GEN, "--style", "pop [Lyrics] rock\n[Tags]\nmetal", "--lyrics-file", lyrics,
                             "--output", tmp_path / "o")
    assert rc == 2 and "checkpoint not found" in err  # warnings only: the request went on
    assert "lyrics line 2 column 3: control character U+0000 (NUL)" in err
    assert "style contains '[Lyrics]'" in err and "style contains '[Tags]'" in err and "fakes a section" in err


def test_invisible_format_characters_are_named(tmp_path, capsys):
    """A right-to-left override and a byte-order mark inside the lyrics are invisible in an editor but read by the
    model (break-it finding: they passed without a word); ZWJ (emoji and Indic sequences need it) and a file's
    leading byte-order mark (its own note) are not reported as such."""
    lyrics = tmp_path / "l.txt"
    lyrics.write_text("\ufeffla \u202ela\nhey\ufeffyou \U0001F469\u200d\U0001F4BB", encoding="utf-8")
    rc, err = main_inprocess(capsys, *GEN, "--style", "pop", "--lyrics-file", lyrics, "--output", tmp_path / "o")
    assert rc == 2 and "checkpoint not found" in err
    assert "lyrics line 1 column 5: invisible format character U+202E (RIGHT-TO-LEFT OVERRIDE)" in err, err
    assert "lyrics line 2 column 4: invisible format character U+FEFF (BYTE-ORDER MARK inside the text)" in err, err
    assert "U+200D" not in err and "line 1 column 1: invisible" not in err
    assert "starts with a byte-order mark (U+FEFF)" in err


# --- item 13 -------------------------------------------------------------------------------------------------------

def test_the_score_check_knows_max_seconds_and_names_control_characters(tmp_path, capsys):
    """Before: the CLI's check ran without the budget (a 22-minute score with a 10-second budget: no warning)."""
    text = CORPUS.read_text("utf-8")
    long = tmp_path / "long.abc"
    body = text.split("K:", 1)[1].split("\n", 1)[1]
    long.write_text(text + body * 40, "utf-8")
    rc, err = main_inprocess(capsys, *GEN, "--style", "pop", "--lyrics", "la", "--abc-file", long,
                             "--max-seconds", "10", "--output", tmp_path / "o")
    assert rc == 2 and re.search(r"more than the 10 s requested", err), err
    bell = tmp_path / "bell.abc"
    bell.write_text(text.replace("K:", "K:\x07", 1), "utf-8")
    rc, err = main_inprocess(capsys, *GEN, "--style", "pop", "--lyrics", "la", "--abc-file", bell,
                             "--output", tmp_path / "o")
    assert "warning: what the ABC check found in --abc-file" in err
    assert re.search(r"\n  score line \d+ column \d+: control character U\+0007 \(BEL\)", err), err


# --- item 21 -------------------------------------------------------------------------------------------------------

def _scores_module():
    """nodes/scores.py alone (it imports only yue2_core; the nodes package needs ComfyUI)."""
    spec = importlib.util.spec_from_file_location("yue2_nodes_scores", REPO / "nodes" / "scores.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_invalid_score_gets_one_rule_in_the_cli_and_the_composer(tmp_path, capsys):
    """Both use the score as given and report every finding the same way (before: the CLI printed each finding, the
    Composer only a count and the first one, with another budget)."""
    bad = CORPUS.read_text("utf-8").replace("K:", "KK:", 1)
    path = tmp_path / "bad.abc"
    path.write_text(bad, "utf-8")
    rc, err = main_inprocess(capsys, *GEN, "--style", "pop", "--lyrics", "la", "--abc-file", path,
                             "--max-seconds", "30", "--output", tmp_path / "o")
    assert rc == 2 and "checkpoint not found" in err  # it went on to the model
    import re
    assert "warning: what the ABC check found in --abc-file" in err and "the score is used as written" in err
    composer = [n.split("the given score ", 1)[1] for n in _scores_module().given_score_notes(bad, 30.0)]
    assert composer and any("[error]" in n for n in composer)
    for note in composer:  # the same findings (the CLI gathers the line numbers of a repeated one, new-user finding)
        m = re.match(r"(line \d+ column \d+): (.*) \[(\w+)\]$", note)
        message = m.group(2) if m else note.rsplit(" [", 1)[0]
        # each names its own duration setting (stop 40 review), the finding is the same
        message = message.replace("(the Composer's max_seconds input)", "(--max-seconds)")
        assert message in err, (message, err)
        if m:
            assert re.search(rf"\n  score (line \d+ column \d+, )*{m.group(1)}\b", err), (note, err)
    rule = (REPO / "docs" / "bad_inputs.md").read_text("utf-8")
    assert "used as given" in rule and "test_an_invalid_score_gets_one_rule_in_the_cli_and_the_composer" in rule


def test_the_too_long_advice_names_the_callers_own_setting(tmp_path, capsys):
    """Review finding (stop 40): the ABC check's too-long warning said "--max-seconds on the command line,
    max_seconds on the Composer node" wherever it was shown. The command line names its option, the Composer and
    the editor (whose duration is the Composer's widget) the node's input, `batch` its option and the row's field."""
    from yue2_core.abc.service import analyze
    from yue2_core.protocol import score_notes
    text = CORPUS.read_text("utf-8")
    long = text + text.split("K:", 1)[1].split("\n", 1)[1] * 40
    path = tmp_path / "long.abc"
    path.write_text(long, "utf-8")
    rc, err = main_inprocess(capsys, *GEN, "--style", "pop", "--lyrics", "la", "--abc-file", path,
                             "--max-seconds", "10", "--output", tmp_path / "o")
    assert "the song will be cut. Shorten the score or raise the duration (--max-seconds)." in err, err
    assert "Composer" not in err and "max_seconds" not in err, err
    composer = " ".join(_scores_module().given_score_notes(long, 10.0))
    assert "raise the duration (the Composer's max_seconds input)." in composer, composer
    assert "--max-seconds" not in composer and "command line" not in composer, composer
    editor = [i["message"] for i in analyze({"abc": long, "max_seconds": 10})["issues"] if i["code"] == "too-long"]
    assert editor and editor[0].endswith("raise the duration (the Composer's max_seconds input)."), editor
    assert score_notes(long, 10.0)[0].endswith("raise the duration. [warning]")  # a caller that names none


# --- item 22 -------------------------------------------------------------------------------------------------------

def test_inspect_of_a_missing_file_gives_the_download_hint(tmp_path, capsys):
    missing = tmp_path / "yue2.safetensors"
    rc, inspect_err = main_inprocess(capsys, "inspect", missing)
    rc2, gen_err = main_inprocess(capsys, "generate", "--style", "p", "--lyrics", "l", "--offline", "--checkpoint",
                                  missing, "--output", tmp_path / "o")
    assert rc == rc2 == 2
    line = lambda err: next(ln for ln in err.splitlines() if ln.startswith("error:"))  # noqa: E731
    assert "huggingface.co" in line(gen_err) and "huggingface.co" in line(inspect_err)
    assert line(inspect_err).startswith(f"error: checkpoint not found: {missing}")
    # generate's hint names --checkpoint; inspect has no such option (new-user finding, stop 32): it names its argument
    assert "--checkpoint" in line(gen_err) and "--checkpoint" not in line(inspect_err)
    assert "inspect takes the path of a checkpoint" in line(inspect_err)


def test_the_comfyui_guide_can_be_skimmed():
    guide = (REPO / "docs" / "comfyui.md").read_text("utf-8")
    heads = [h.lower() for h in re.findall(r"^#+ (.*)$", guide, re.M)]
    assert any("first" in h and "workflow" in h for h in heads), heads
    assert any("without the real weights" in h for h in heads), heads
    assert "make-synthetic" in guide and "synthetic" in guide.lower()
    assert "(comfyui_gpu.md)" in guide and (REPO / "docs" / "comfyui_gpu.md").is_file()
    assert not re.search(r"\d tok/s|\d MiB", guide)  # measurements live in their own document


# --- item 19 -------------------------------------------------------------------------------------------------------

FAKE_PYTHON = """#!/bin/bash
# a virtual environment whose first import check fails until "pip install" has run (no network, no real install);
# then the engine's import check passes without importing torch (seconds; the song itself imports it)
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
    echo "Collecting torch"; echo "Downloading torch-2.10.0.whl (900.0 MB)"; touch "$(dirname "$0")/installed"; exit 0
fi
if [ "$1" = "-c" ] && [ ! -f "$(dirname "$0")/installed" ]; then exit 1; fi
if [ "$1" = "-c" ] && [[ "$2" == "import yue2_core, torch, "* ]]; then exit 0; fi
exec {real} "$@"
"""


def test_song_script_shows_install_progress_origin_seed_and_where_the_song_is(tmp_path, tiny_paths):
    """Before: ~4 silent minutes of pip -q, '(given path)' of the file the script picked itself, no seed in --help,
    and the song folder only inside the JSON."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(FAKE_PYTHON.format(real=sys.executable))
    (venv / "python").chmod(0o755)
    models = REPO / "models"
    made = not (models / "yue2_tiny_bf16.safetensors").exists()
    if made:  # the script's own synthetic file (models/ is git-ignored): the session's tiny file
        models.mkdir(exist_ok=True)
        os.link(tiny_paths["bf16"], models / "yue2_tiny_bf16.safetensors") if os.stat(
            tiny_paths["bf16"]).st_dev == os.stat(models).st_dev else \
            __import__("shutil").copyfile(tiny_paths["bf16"], models / "yue2_tiny_bf16.safetensors")
    env = {k: v for k, v in os.environ.items() if k not in ("YUE2_CHECKPOINT", "COMFYUI_PATH", "COMFYUI_DIR")}
    env.update(SONG_SH_VENV=str(tmp_path / "venv"), HOME=str(tmp_path))
    out = tmp_path / "song"
    try:
        proc = subprocess.run(["bash", str(REPO / "scripts" / "song.sh"), "--cot", "off", "--max-seconds", "0.12",
                               "--steps", "1", "--device", "cpu", "--output", str(out)], env=env,
                              capture_output=True, text=True, timeout=600)
    finally:
        if made:
            (models / "yue2_tiny_bf16.safetensors").unlink()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[song.sh] installing torch" in proc.stdout and "[pip] Collecting torch" in proc.stdout
    assert "[song.sh] installed in" in proc.stdout
    assert "(given path)" not in proc.stderr and "picked by scripts/song.sh" in proc.stderr
    assert "seed 831001 (the default" in proc.stderr
    last = proc.stderr.rstrip().splitlines()[-2:]
    assert last == [f"song folder: {out.resolve()}", f"audio: {out.resolve() / 'audio.flac'}"], last
    assert json.loads(proc.stdout.split("[song.sh] installed in")[1].split("\n", 1)[1])["output"] == str(out.resolve())
    helped = subprocess.run([sys.executable, "-m", "yue2_core", "generate", "--help"], capture_output=True, text=True,
                            cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert "default 831001" in " ".join(helped.stdout.split()) and "same song every run" in " ".join(
        helped.stdout.split())
