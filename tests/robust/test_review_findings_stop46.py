"""Findings of the stop-46 break-it review of bad input (docs/bad_inputs.md §26): a NAR adapter whose branch
metadata was not recognised patched the AR without a word; line breaks the model does not see as new lines, in
inline text, were not named; long ABC tuplets were called slurs; a long --output was quoted whole;
200,000 failed batch rows printed 200,000 "errors in full" lines."""
from __future__ import annotations

from pathlib import Path

import pytest

from yue2_core.errors import AdapterError


def _main_inprocess():
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_cli import main_inprocess
    return main_inprocess


# ------------------------------------------------------------------------------------- 1. LoRA branch metadata


def _ms_fused_nar(tmp_path: Path, **meta) -> Path:
    """The synthetic Mothersuperior ComfyUI fused NAR file (format=pt, yue2_lora_branch=nar), its metadata changed
    by `meta` (a value of None drops the key)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter

    src = write_adapter("ms-fused-nar", tmp_path / "src.safetensors", profile_dims("tiny"))
    with safe_open(str(src), "pt") as f:
        md = dict(f.metadata())
    md.update(meta)
    out = tmp_path / "nar.safetensors"
    save_file(load_file(str(src)), str(out), metadata={k: v for k, v in md.items() if v is not None})
    return out


def _read(path: Path):
    from yue2_core.weights.lora.layouts import read_adapter
    from yue2_core.weights.lora.synthetic import profile_dims

    return read_adapter(str(path), profile_dims("tiny"))


@pytest.mark.parametrize("value", ["acoustic", "stage2", "nar2", "", "  ", "AR NAR"])
def test_an_unknown_branch_value_is_refused_not_applied_to_the_ar(tmp_path, value):
    """An unknown `yue2_lora_branch` fell through to comfy-native, whose `text_encoders.` prefix sent every patch of
    a NAR adapter to the AR."""
    with pytest.raises(AdapterError) as err:
        _read(_ms_fused_nar(tmp_path, yue2_lora_branch=value))
    msg = str(err.value)
    assert f"yue2_lora_branch={value!r} names no expert" in msg and "accepted: ar, nar, ar+nar" in msg, msg


def test_two_branch_keys_that_disagree_are_refused(tmp_path):
    """`branch=ar` + `yue2_lora_branch=nar`: detect_layout read one key, _context the other (the AR was patched)."""
    with pytest.raises(AdapterError) as err:
        _read(_ms_fused_nar(tmp_path, branch="ar"))
    msg = str(err.value)
    assert "branch='ar' and yue2_lora_branch='nar' disagree" in msg and "two experts" in msg, msg


@pytest.mark.parametrize("meta", [{}, {"yue2_lora_branch": " NAR "}, {"branch": "nar"},
                                  {"branch": "nar", "yue2_lora_branch": None}])
def test_a_nar_branch_however_written_patches_the_nar(tmp_path, meta):
    adapter = _read(_ms_fused_nar(tmp_path, **meta))
    assert {p.expert for p in adapter.patches} == {"nar"}, adapter.layout


def test_a_long_branch_value_is_shortened(tmp_path):
    with pytest.raises(AdapterError) as err:
        _read(_ms_fused_nar(tmp_path, yue2_lora_branch="x" * 100_000))
    assert len(str(err.value)) < 500 and "(100000 characters)" in str(err.value)


# ------------------------------------------------------------------------------ 2. line breaks in inline text

@pytest.mark.parametrize("name", ["style", "lyrics"])
@pytest.mark.parametrize("text, said", [("a\r\nb", "CRLF (Windows) line endings: kept"),
                                        ("a\rb", "lone CR (old Mac) line endings: kept"),
                                        ("a\u2028b", "U+2028 (LINE SEPARATOR) characters: an editor shows a line "
                                                     "break, but the model reads one character"),
                                        ("a\u2029b\u2028", "U+2028 (LINE SEPARATOR) and U+2029 (PARAGRAPH "
                                                           "SEPARATOR) characters"),
                                        ("\ufeffa", "starts with a byte-order mark (U+FEFF): it is kept")])
def test_line_breaks_the_model_does_not_see_are_named_in_inline_text(name, text, said):
    """A node's text widget, a batch row or `--lyrics "$(cat win.txt)"`: CR and U+2028/U+2029 were named only for
    a --*-file (and a leading BOM not at all)."""
    from yue2_core.protocol import SongRequest

    fields = {"style": "pop", "lyrics": "la", name: text}
    notes = SongRequest(**fields).input_warnings()
    mine = [n for n in notes if n.startswith(f"the {name} text ")]
    assert len(mine) == 1 and said in mine[0], notes


def test_a_crlf_file_is_named_once(tmp_path, capsys):
    """The file reader's note and input_warnings' note were two rules: now one note, from input_warnings."""
    main_inprocess = _main_inprocess()
    lyrics = tmp_path / "l.txt"
    lyrics.write_bytes(b"[Verse]\r\nla\r\n")
    rc, err = main_inprocess(capsys, "generate", "--style", "pop", "--lyrics-file", lyrics, "--offline",
                             "--checkpoint", "/nonexistent/x.safetensors", "--output", tmp_path / "o")
    assert rc == 2 and err.count("CRLF (Windows) line endings") == 1 and "checkpoint not found" in err, err


def test_a_style_over_several_lines_is_named():
    from yue2_core.protocol import SongRequest

    notes = SongRequest(style="pop\n\n[verse]\nrock", lyrics="la").input_warnings()
    assert any(n.startswith("style spans 4 lines: the prompt has one line for the style") for n in notes), notes
    assert not any("spans" in n for n in SongRequest(style="pop, rock\n", lyrics="la").input_warnings())


# ---------------------------------------------------------------------------------- 3. long tuplets and Z<n>

_SCORE = ('X:1\nT:\nM:4/4\nL:1/32\nQ:1/4=88\nV: Vocal clef=treble name="Vocal Melody" snm="Vocal"\n'
          'V: Ins clef=treble name="Ins Melody" snm="Inst."\nK:C\n% verse\nV: Vocal\n{} C8|\nV: Ins\nZ|\n')


@pytest.mark.parametrize("mark, said", [
    ("(1000", "(1000 is not a tuplet (2-9)."),
    ("(99999", "(99999 is not a tuplet (2-9)."),
    ("(" + "9" * 5000, "(999999999999999999999999999999999999999… (5,001 characters) is not a tuplet (2-9)."),
    ("(3:99999999999999999999:3", "'(3:99999999999999999999:3': tuplet counts q and r are 1 to 999"),
    ("(3::1000", "'(3::1000': tuplet counts q and r are 1 to 999"),
    ("Z99999999999999", "Z99999999999999 is more bars than a music line holds; the dialect writes Z2…Z4."),
    ("Z" + "9" * 5000, "Z999999999999999999999999999999999999999… (5,001 characters) is more bars than a music "
                       "line holds")])
def test_long_tuplets_and_bar_rests_get_their_own_message(mark, said):
    """A tuplet of 1000 or more was called a slur, and a Z with more than 6 digits (or a tuplet's q/r of more than
    3) 'not a note, rest, chord symbol or bar line'."""
    from yue2_core.abc import analyze

    messages = [i["message"] for i in analyze({"abc": _SCORE.format(mark)})["issues"] if i["code"] == "token"]
    assert any(m.startswith(said) for m in messages), messages
    assert not any("slur" in m or "not a note, rest" in m for m in messages), messages
    assert all(len(m) < 300 for m in messages), messages


# ------------------------------------------------------------------------------------------ 4. a long --output

@pytest.mark.parametrize("command", ["generate", "render"])
@pytest.mark.parametrize("tail", ["b/" * 3000 + "x", "b" * 300])
def test_a_long_output_path_is_quoted_by_its_start_and_end(tmp_path, capsys, command, tail):
    """A 6,000-character --output (or one 300-character name) was printed whole in 'cannot use --output …'."""
    main_inprocess = _main_inprocess()
    out = f"{tmp_path}/{tail}"
    args = ["--style", "pop", "--lyrics", "hi"] if command == "generate" else [str(tmp_path / "song")]
    rc, err = main_inprocess(capsys, command, *args, "--checkpoint", "/nonexistent/x.safetensors", "--offline",
                             "--output", out)
    assert rc == 2 and "cannot use --output " in err and f"({len(out):,} characters)" in err, err[:500]
    assert len(err) < 400 and err.rstrip().endswith("File name too long") and "x.safetensors" not in err, err


# ------------------------------------------------------------------------------- 5. "errors in full" is capped

def test_the_errors_in_full_of_a_batch_are_capped_with_a_pointer_to_batch_json():
    """200,000 rows that all failed validation printed 200,000 lines of "errors in full" after the table; now at
    most FULL_ERROR_LINES, then how many more and where they are (batch.json keeps every error whole)."""
    from yue2_core.batch.summary import FULL_ERROR_LINES, BatchSummary

    s = BatchSummary()
    rows = 2000
    for i in range(1, rows + 1):
        s.add(i, f"r{i}", "failed", stage="validate", error=f"line {i}: unknown field 'x'; " + "y" * 100)
    lines = s.table().splitlines()
    full = lines[lines.index("errors in full:") + 1:]
    assert FULL_ERROR_LINES <= 300 and len(full) == FULL_ERROR_LINES + 1, len(full)
    assert full[-1] == (f"… {rows - FULL_ERROR_LINES:,} more errors not shown here: every row's error is whole in "
                        'batch.json ("results": "error")'), full[-1]
    assert all(r["error"].endswith("y" * 100) for r in s.to_dict()["results"])  # batch.json: every error, whole
    few = BatchSummary()
    few.add(1, "a", "failed", stage="validate", error="line 1: " + "z" * 200)
    assert few.table().splitlines()[-1] == "line 1 (a): " + "z" * 200  # a short list: whole, no pointer


@pytest.mark.parametrize("meta", [dict(yue2_lora_branch="acoustic"), dict(branch="ar", yue2_lora_branch="nar")])
def test_a_lora_with_a_refused_branch_in_the_checkpoints_folder_is_skipped(tmp_path, meta):
    """Review of stop 46: `_branch` raised AdapterError inside detect_layout, which `checkpoint.lora_layout` calls
    for a file given or found as a checkpoint; the folder scan (`locate.yue2_files`) skips CheckpointError only, so
    one such LoRA in ComfyUI's models/checkpoints ended the checkpoint search (': metadata … names no expert')."""
    from yue2_core.errors import CheckpointError
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.locate import yue2_files

    lora = _ms_fused_nar(tmp_path, **meta)
    assert yue2_files(tmp_path) == []
    with pytest.raises(CheckpointError, match="is a LoRA adapter, not a YuE2 checkpoint"):
        inspect_checkpoint(str(lora))


@pytest.mark.parametrize("mark, dialect", [("Z65", 0), ("Z" + "9" * 5000, 0), ("Z1", 1), ("Z5", 1), ("Z2", 0)])
def test_a_bar_rest_over_the_limit_is_named_once(mark, dialect):
    """Review of stop 46: a Z over MAX_MEASURE_REST got its error and then, its count reset to 1, the warning
    "'Z65' is not a bar rest the planner writes …" for the same token; Z1 and Z5 keep that warning."""
    from yue2_core.abc import analyze

    score = _SCORE.replace("V: Ins\nZ|", f"V: Ins\n{mark}|")
    issues = analyze({"abc": score})["issues"]
    said = [i["message"] for i in issues if "is not a bar rest the planner writes" in i["message"]]
    assert len(said) == dialect, issues
    assert sum("more bars than a music line holds" in i["message"] for i in issues) == (dialect == 0 and mark != "Z2")


# ------------------------------------------------------------------ diff review: where the keys decide the expert


def _with_meta(tmp_path: Path, layout: str, **meta) -> Path:
    """A synthetic adapter of `layout` (one file) with metadata keys added (a value of None drops the key)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter

    src = write_adapter(layout, tmp_path / f"{layout}-src.safetensors", profile_dims("tiny"))
    with safe_open(str(src), "pt") as f:
        md = dict(f.metadata() or {})
    md.update(meta)
    out = tmp_path / f"{layout}.safetensors"
    save_file(load_file(str(src)), str(out), metadata={k: v for k, v in md.items() if v is not None})
    return out


@pytest.mark.parametrize("value", ["main", "", "v2"])
def test_an_unknown_branch_is_ignored_where_the_keys_prefixes_decide(tmp_path, value):
    """ai-toolkit files (text_encoders./diffusion_model. keys) with a trainer's `branch=main` loaded before the
    stop-46 branch check and load again, each key on the expert its prefix names (diff review, stop 46)."""
    plain = _read(_with_meta(tmp_path, "aitk"))
    tagged = _read(_with_meta(tmp_path, "aitk", branch=value))
    assert sorted((p.expert, p.module, p.rows or (0, 0)) for p in tagged.patches) \
        == sorted((p.expert, p.module, p.rows or (0, 0)) for p in plain.patches)
    assert {p.expert for p in tagged.patches} == {"ar", "nar"}


def test_an_empty_branch_beside_a_named_one_counts_as_absent(tmp_path):
    """`branch=""` + `yue2_lora_branch=nar` on the Mothersuperior fused file: the NAR, as before the check."""
    adapter = _read(_ms_fused_nar(tmp_path, branch=""))
    assert {p.expert for p in adapter.patches} == {"nar"}
