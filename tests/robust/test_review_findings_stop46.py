"""Findings of the stop-46 break-it review of bad input (docs/bad_inputs.md §26): a NAR adapter whose branch
metadata was not recognised patched the AR without a word; line breaks the model does not see as new lines, in
inline text, were not named."""
from __future__ import annotations

from pathlib import Path

import pytest

from yue2_core.errors import AdapterError

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
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_cli import main_inprocess

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
