"""Found by the stop-51 diff review (docs/bad_inputs.md §40d): `--checkpoint NAME` (and `--lora` / `--vae`) took
ComfyUI's file of that name for a broken link here or a `./`-anchored path; the ASCII-number options refused a value
with spaces around it (a shell variable, `wc -l` on macOS); `inspect score.abc` wrote its findings as `line N:`
beside the one format, and a `.abc` over the limit or not UTF-8 got the "header length …" reasons again."""
from __future__ import annotations

import json
import os

import pytest

from test_cli import NO_CKPT, main_inprocess
from test_newuser_stop51 import REPO, _comfy
from yue2_core.errors import CheckpointError


def test_a_broken_link_or_a_dot_slash_name_is_not_taken_from_comfyuis_folder(tmp_path, monkeypatch, capsys):
    """`--checkpoint NAME` is looked for in ComfyUI's models/checkpoints when it is no path here (§40a). A broken
    link here is a path here (the user's file, on an unmounted disk?): it is said to be broken, as before stop 51 —
    not replaced by ComfyUI's same-named file (`os.path.exists` is False for it). `./NAME` names this folder's file
    (ComfyUI lists no such name): not found here is "not found", without "neither here nor in ComfyUI's"."""
    from yue2_core.weights.locate import find_checkpoint
    checkpoints = _comfy(tmp_path, monkeypatch)
    os.symlink(tmp_path / "unmounted" / "mine.safetensors", tmp_path / "mine.safetensors")
    with pytest.raises(CheckpointError) as caught:
        find_checkpoint("mine.safetensors", download=False)
    assert "checkpoint mine.safetensors is a broken symbolic link, not a file" in str(caught.value), caught.value
    os.unlink(tmp_path / "mine.safetensors")
    assert find_checkpoint("mine.safetensors", download=False)[0] == str(checkpoints / "mine.safetensors")
    with pytest.raises(CheckpointError) as caught:
        find_checkpoint("./mine.safetensors", download=False)
    message = str(caught.value)
    assert message.startswith("checkpoint not found: ./mine.safetensors. ") and "ComfyUI's" not in message, message
    # --lora and --vae share the rule (locate.comfy_model_path)
    loras = checkpoints.parent / "loras"
    loras.mkdir()
    (loras / "a.safetensors").write_bytes(b"x")
    base = ("generate", "--style", "x", "--lyrics", "y", "--offline", "--checkpoint", NO_CKPT, "--output",
            tmp_path / "out")
    rc, err = main_inprocess(capsys, *base, "--lora", "./a.safetensors")
    assert rc == 2 and "LoRA file './a.safetensors' not found (form" in err and "note: --lora" not in err, err
    rc, err = main_inprocess(capsys, *base, "--lora", "a.safetensors")  # the plain name is still found there
    assert f"note: --lora a.safetensors: {loras / 'a.safetensors'}" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option, text, value", [
    ("--seed", " 7", 7), ("--seed", "42\n", 42), ("--seed", "      3", 3), ("--steps", "\t8 ", 8),
    ("--max-seconds", " 2.5", 2.5), ("--cfg-scale", "1e-3 ", 1e-3), ("--max-abc-tokens", " +16", 16),
])
def test_number_options_take_ascii_spaces_around_the_number(option, text, value):
    """A value from a shell variable or a command (`--seed "$(wc -l < f)"`: macOS pads it with spaces) names one
    number; int() and float() took it before stop 51 and the break-it fix refused it. ASCII space around it is
    dropped again; other scripts' digits and spaces (`\u3000`) stay refused (tests/robust/test_break_stop51.py)."""
    from yue2_core.__main__ import build_parser
    args = build_parser().parse_args(["generate", "--style", "x", "--lyrics", "y", "--output", "o", option, text])
    assert getattr(args, option[2:].replace("-", "_")) == value


def test_inspect_of_an_abc_file_writes_the_one_place_format(tmp_path, capsys):
    """`inspect score.abc` (§40a) listed findings as `line 11: …` while every other score message says `line 11
    column 13: …` (§40c)."""
    from yue2_core.__main__ import main
    lines = (REPO / "examples" / "text2music_lead_sheet.abc").read_text("utf-8").splitlines()
    bad_line = next(i for i, ln in enumerate(lines) if ln.startswith('"G"'))
    lines[bad_line] = lines[bad_line].replace("z8", "z16", 1)  # a bar with too many beats
    bad = tmp_path / "score.abc"
    bad.write_text("\n".join(lines) + "\n", "utf-8")
    assert main(["inspect", str(bad)]) == 0
    out, err = capsys.readouterr()
    issue = next(i for i in json.loads(out)["issues"] if i["line"] == bad_line + 1)
    assert issue["column"] and f"\n  line {bad_line + 1} column {issue['column']}: {issue['message']} [error]" \
        in err, err


def test_inspect_of_an_abc_file_too_large_or_not_utf8_says_so(tmp_path, capsys):
    """A `score.abc` over the 100 kB the check reads, or saved as Latin-1 (common for ABC files from the web), fell
    back to the three "not a safetensors file (header length …)" reasons §40a removed. Now: what it is and why it
    is not checked, exit 2."""
    text = (REPO / "examples" / "text2music_lead_sheet.abc").read_text("utf-8")
    big = tmp_path / "big.abc"
    big.write_text(text + "%" + "x" * 120_000 + "\n", "utf-8")
    rc, err = main_inprocess(capsys, "inspect", big)
    assert rc == 2 and f"{big} is an ABC lead sheet of {big.stat().st_size:,} bytes; inspect checks at most " \
        "100,000" in err and "header length" not in err, err
    latin = tmp_path / "latin.abc"
    latin.write_bytes(text.replace("T:", "T:Caf\xe9 ", 1).encode("latin-1"))
    rc, err = main_inprocess(capsys, "inspect", latin)
    at = latin.read_bytes().index(b"\xe9")
    assert rc == 2 and f"{latin} is an ABC lead sheet that is not UTF-8 (byte {at:,} is 0xE9" in err, err
    assert "save it as UTF-8" in err and "header length" not in err, err


@pytest.mark.parametrize("name, wrapped", [("Bob's s.pt", False), ("Bob's s.pt", True), ("Bob's s.safetensors", False)])
def test_the_put_back_command_of_a_stripped_pt_lora_reads_the_pt_file(tmp_path, name, wrapped):
    """§40c's note on a lost alpha gives a command that writes a copy with the metadata put back. For a torch .pt
    file laid out as Starnodes' (a .pt holds no metadata) it was `save_file(load_file("x.pt"), "with-alpha-x.pt", …)`
    — safetensors' load_file cannot read a .pt, so the command failed. Now it loads the .pt (weights only; a
    `state_dict` wrapper as the reader takes it) and writes `with-alpha-x.safetensors`, which, with the alpha filled
    in, reads at the original's scale — also for a torch file named `.safetensors` (which torch.load, given the
    path, hands to the safetensors reader)."""
    import runpy
    import shlex

    import torch
    from safetensors.torch import load_file
    from yue2_core.weights.lora.layouts import adapter_notes, read_adapter
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    dims = profile_dims("tiny")
    original = read_adapter(str(write_adapter("starnodes", tmp_path / "orig.safetensors", dims)), dims)
    tensors = load_file(tmp_path / "orig.safetensors")
    pt = tmp_path / name
    torch.save({"state_dict": tensors} if wrapped else tensors, pt)
    [note] = adapter_notes(read_adapter(str(pt), dims))
    command = shlex.split(note.split("put the metadata back, ALPHA replaced by the alpha: ", 1)[1]
                          .split(", then load ", 1)[0])
    fixed = tmp_path / "with-alpha-Bob's s.safetensors"
    assert command[:2] == ["python", "-c"] and note.endswith(f", then load {fixed}"), note
    script = tmp_path / "put_back.py"  # as a shell gives it to `python -c`, run in this interpreter
    script.write_text(command[2].replace('"ALPHA"', '"8"'))
    runpy.run_path(str(script), run_name="__main__")
    again = read_adapter(str(fixed), dims)
    assert again.scales == original.scales != [1.0] and adapter_notes(again) == [], (again.scales, original.scales)
