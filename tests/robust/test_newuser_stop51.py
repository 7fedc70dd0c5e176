"""Found by the stop-51 new-user review (docs/bad_inputs.md §40a): `--checkpoint NAME` as the Checkpoint Loader lists
it was "not found" (with download advice) where `--lora NAME` / `--vae NAME` beside it are found in ComfyUI's folders;
`inspect CHECKPOINT` printed only JSON, though LoRAs, VAEs and songs print a line on stderr; `inspect score.abc` said
"not a safetensors file (header length 5551313623310219864 …)" three times instead of checking the lead sheet; `batch
--help` gave the release's 4,096 lead-sheet tokens as the default where synthetic weights get 256."""
from __future__ import annotations

import json
from pathlib import Path

from test_cli import main_inprocess

REPO = Path(__file__).resolve().parents[2]


def _comfy(tmp_path, monkeypatch) -> Path:
    """A ComfyUI folder layout named by $COMFYUI_PATH, with a (not loadable) file in models/checkpoints."""
    checkpoints = tmp_path / "ComfyUI" / "models" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "mine.safetensors").write_bytes(b"not a checkpoint")
    monkeypatch.setenv("COMFYUI_PATH", str(tmp_path / "ComfyUI"))
    monkeypatch.delenv("COMFYUI_DIR", raising=False)
    monkeypatch.delenv("YUE2_CHECKPOINT", raising=False)
    monkeypatch.chdir(tmp_path)  # the name is no path here
    return checkpoints


def test_a_checkpoint_name_is_looked_for_in_comfyuis_checkpoints_folder(tmp_path, monkeypatch, capsys):
    from yue2_core.weights.locate import find_checkpoint
    checkpoints = _comfy(tmp_path, monkeypatch)
    path, how = find_checkpoint("mine.safetensors", download=False)
    assert path == str(checkpoints / "mine.safetensors") and how == f"ComfyUI folder {checkpoints}"
    # through the command line: the file it found is the one that is read (and refused: it is no checkpoint)
    rc, err = main_inprocess(capsys, "generate", "--style", "x", "--lyrics", "y", "--offline", "--checkpoint",
                             "mine.safetensors", "--output", tmp_path / "out")
    assert rc == 2 and str(checkpoints / "mine.safetensors") in err and "checkpoint not found" not in err, err
    # a name that is nowhere says where it was looked for, as --lora does
    rc, err = main_inprocess(capsys, "generate", "--style", "x", "--lyrics", "y", "--offline", "--checkpoint",
                             "other.safetensors", "--output", tmp_path / "out")
    assert rc == 2 and f"checkpoint not found: other.safetensors (neither here nor in ComfyUI's {checkpoints})" \
        in err, err
    assert not (tmp_path / "out").exists()


def test_inspect_of_a_checkpoint_says_what_it_is_on_stderr(micro_paths, capsys):
    from yue2_core.__main__ import main
    assert main(["inspect", micro_paths["int8"]]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["kind"] == "checkpoint" and "int8 all-in-one" in report["summary"], report["summary"]
    assert err.strip() == report["summary"].strip(), err


def test_inspect_of_an_abc_file_checks_the_lead_sheet(tmp_path, capsys):
    from yue2_core.__main__ import main
    good = REPO / "examples" / "text2music_lead_sheet.abc"
    assert main(["inspect", str(good)]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["kind"] == "ABC lead sheet" and report["ok"] is True and report["issues"] == []
    assert report["structure"]["bars"] == {"Vocal": 16, "Ins": 16} and report["structure"]["key"] == "G"
    assert err.startswith(f"ABC lead sheet {good}: key G, 4/4") and "0 error(s), 0 warning(s)" in err, err
    lines = good.read_text("utf-8").splitlines()
    bad_line = next(i for i, ln in enumerate(lines) if ln.startswith('"G"'))
    lines[bad_line] = lines[bad_line].replace("z8", "z16", 1)  # a bar with too many beats
    bad = tmp_path / "score.abc"
    bad.write_text("\n".join(lines) + "\n", "utf-8")
    assert main(["inspect", str(bad)]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["ok"] is False and any(i["line"] == bad_line + 1 and i["severity"] == "error"
                                         for i in report["issues"]), report["issues"]
    assert f"  line {bad_line + 1} column " in err and "1 error(s)" in err, err  # the one format (§40d)
    soup = tmp_path / "soup" / "score.abc"  # what a synthetic model writes: no header at all
    soup.parent.mkdir()
    soup.write_text("hpei k epaenhlerp HStQUy LmdDtuPdvGC\n", "utf-8")
    assert main(["inspect", str(soup)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["ok"] is False and "does not parse" in err and "The score has no ABC header" in err, err
    lyrics = REPO / "examples" / "text2music_lyrics.txt"  # other text is still not taken for a score
    rc, err = main_inprocess(capsys, "inspect", lyrics)
    assert rc == 2 and "is neither a YuE2 checkpoint" in err, err


def test_the_help_says_what_these_options_now_do():
    from yue2_core.__main__ import SYNTHETIC_ABC_TOKENS, build_parser
    text = " ".join(build_parser().format_help().split())  # top level: names the commands
    assert "ABC lead sheet" in text
    batch_help = _sub_help("batch")
    assert f"with synthetic weights {SYNTHETIC_ABC_TOKENS}" in batch_help, batch_help
    assert "looked for in ComfyUI's models/checkpoints" in _sub_help("generate")
    assert "looked for in ComfyUI's models/checkpoints" in _sub_help("render")


def _sub_help(name: str) -> str:
    from yue2_core.__main__ import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return " ".join(sub.choices[name].format_help().split())
