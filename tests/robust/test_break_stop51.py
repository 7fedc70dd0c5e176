"""Found by the stop-51 break-it review (docs/bad_inputs.md §40b): command-line numbers in other scripts' digits,
safetensors headers that name a tensor twice."""
from __future__ import annotations

import json
import struct

import pytest

from test_cli import NO_CKPT, main_inprocess
from yue2_core.errors import CheckpointError
from yue2_core.weights.checkpoint import read_header


@pytest.mark.parametrize("option, value", [
    ("--seed", "３"), ("--seed", "٣"), ("--seed", "1_0"), ("--seed", "\u30007"), ("--steps", "３"),
    ("--max-abc-tokens", "١٦"), ("--max-seconds", "1_0"), ("--max-seconds", "٥"), ("--cfg-scale", "１"),
])
def test_cli_numbers_take_ascii_digits_only(tmp_path, capsys, option, value):
    """`--seed ３` ran with seed 3 and `--max-seconds 1_0` with 10 s, without a word: argparse's int() and float()
    read other scripts' digits, underscores and spaces (the rule `--lora FILE:٣` follows since stop 33). Refused by
    name before any checkpoint is looked for; the ASCII spelling of the same value still passes the parser. (ASCII
    spaces around a number are dropped, as int() dropped them: tests/robust/test_review_findings_stop51_diff.py;
    an ideographic space, U+3000, is refused.)"""
    base = ("generate", "--style", "pop", "--lyrics", "x", "--offline", "--checkpoint", NO_CKPT,
            "--output", tmp_path / "out")
    rc, err = main_inprocess(capsys, *base, option, value)
    assert rc == 2, err
    assert f"argument {option}: {value!r} is not a" in err and "ASCII" in err, err
    assert "checkpoint not found" not in err and "Traceback" not in err
    ascii_value = value.translate(str.maketrans("３٣١٦٥１", "313651")).replace("_", "").strip()
    rc, err = main_inprocess(capsys, *base, option, ascii_value)
    assert rc == 2 and "checkpoint not found" in err and "is not a" not in err, err  # parsed; fails on NO_CKPT only
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [("batch", "--max-batch", "２", "--output", "o", "r.jsonl"),
                                     ("batch", "--budget", "٢", "--output", "o", "r.jsonl"),
                                     ("make-synthetic", "--seed", "٣", "--output", "x.safetensors"),
                                     ("render", "--seed", "５", "--output", "o", "song")])
def test_every_number_option_takes_ascii_digits_only(tmp_path, capsys, command):
    rc, err = main_inprocess(capsys, *(tmp_path / a if a in ("o", "x.safetensors") else a for a in command))
    assert rc == 2 and "is not a" in err and "ASCII" in err, err


def _safetensors(path, header_text: str, data: bytes) -> str:
    raw = header_text.encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return str(path)


def _entry(dtype: str, shape: list, start: int, end: int) -> str:
    return json.dumps({"dtype": dtype, "shape": shape, "data_offsets": [start, end]})


def test_a_safetensors_header_naming_a_tensor_twice_is_refused(tmp_path):
    """The format disallows a name given twice; json.loads (and the safetensors library) kept the last silently, so
    a file whose first "w" says U8 [4] and whose last says F32 [1] over the same 4 bytes read as the F32 here and as
    the U8 in a reader that keeps the first. Refused, naming the key — a tensor, a metadata key or an entry's field
    — for checkpoints, adapters and VAE files alike (they all read the header here)."""
    data = struct.pack("<f", 1.0)
    good = _safetensors(tmp_path / "good.safetensors", '{"w": ' + _entry("F32", [1], 0, 4) + "}", data)
    assert read_header(good)[0]["w"].dtype == "F32"
    cases = {
        "w": '{"w": ' + _entry("U8", [4], 0, 4) + ', "w": ' + _entry("F32", [1], 0, 4) + "}",
        "w ": '{"w": ' + _entry("F32", [1], 0, 4) + ', "w": ' + _entry("F32", [1], 0, 4) + "}",
        "format": '{"__metadata__": {"format": "pt", "format": "x"}, "w": ' + _entry("F32", [1], 0, 4) + "}",
        "dtype": '{"w": {"dtype": "U8", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
        "__metadata__": '{"__metadata__": {}, "w": ' + _entry("F32", [1], 0, 4) + ', "__metadata__": {}}',
    }
    for key, header in cases.items():
        path = _safetensors(tmp_path / "dup.safetensors", header, data)
        with pytest.raises(CheckpointError) as caught:
            read_header(path)
        message = str(caught.value)
        assert f"names {key.strip()!r} twice" in message and "disallows" in message, message


def test_a_checkpoint_with_a_duplicated_tensor_name_is_refused_by_generate(micro_paths, tmp_path, capsys):
    """The same through the command line: a checkpoint whose header lists one of its tensors twice (the same entry
    twice: both readers would agree, but the file breaks the format) — `generate` and `inspect` exit 2 naming it,
    before any work; no song folder."""
    src = micro_paths["bf16"]
    with open(src, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header, data = f.read(n).decode().rstrip(), f.read()
    name = next(k for k in json.loads(header) if k != "__metadata__")
    entry = json.dumps(json.loads(header)[name])
    path = _safetensors(tmp_path / "dup.safetensors", header[:-1] + f", {json.dumps(name)}: {entry}" + "}", data)
    for args in (("generate", "--style", "pop", "--lyrics", "x", "--max-seconds", "1", "--device", "cpu",
                  "--checkpoint", path, "--output", tmp_path / "song"), ("inspect", path)):
        rc, err = main_inprocess(capsys, *args)
        assert rc == 2 and f"names {name!r} twice" in err and "Traceback" not in err, err
    assert not (tmp_path / "song").exists()


def test_a_lora_whose_every_patch_is_zero_says_it_changes_nothing(tmp_path, capsys, micro_paths):
    """An adapter saved before its first training step (PEFT and most trainers start B at zero) or with zeroed
    weights was read, applied and recorded without a word — the song the same as without it. Now a note per expert
    whose every patch is zero: from `read_adapter` (so the command line, `inspect` and the LoRA node all show it);
    an expert with one nonzero patch, and the synthetic adapters as written, get none."""
    import torch
    from safetensors.torch import load_file, save_file
    from yue2_core.weights.lora.layouts import adapter_notes, read_adapter
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    dims = profile_dims("micro")  # the geometry of micro_paths' checkpoint, for `inspect --model`
    for layout, zero_keys in (("aitk", ("lora_B",)), ("comfy-native", ("lora_up", ".diff")), ("aitk-lokr", ("w2",))):
        path = write_adapter(layout, tmp_path / f"{layout}.safetensors", dims)
        assert adapter_notes(read_adapter(str(path), dims)) == [], layout
        tensors = load_file(path)
        zeroed = {k: torch.zeros_like(t) if any(z in k for z in zero_keys) else t for k, t in tensors.items()}
        save_file(zeroed, tmp_path / "zero.safetensors")
        notes = adapter_notes(read_adapter(str(tmp_path / "zero.safetensors"), dims))
        experts = sorted({"ar" if k.startswith("text_encoders.") else "nar" for k in tensors})
        assert [n.split(" changes nothing on the ")[1][:3].strip(":") for n in notes] == \
            [e.upper() for e in experts], (layout, notes)
        assert all("are zero" in n and "any strength gives the same song" in n for n in notes), notes
        one = next(k for k in zeroed if any(z in k for z in zero_keys))
        save_file({**zeroed, one: tensors[one]}, tmp_path / "zero.safetensors")  # one patch not zero
        assert len(adapter_notes(read_adapter(str(tmp_path / "zero.safetensors"), dims))) == len(experts) - 1, layout
    save_file(zeroed, tmp_path / "zero.safetensors")
    rc, err = main_inprocess(capsys, "inspect", "--model", micro_paths["bf16"], tmp_path / "zero.safetensors")
    assert "changes nothing on the" in err, err


def test_inspect_says_a_reason_every_reader_shares_once(tmp_path, capsys):
    """`inspect` of a file whose header every reader refuses (a truncated header, a name given twice) listed the
    same sentence three times, as a checkpoint, a VAE and a LoRA (§40b "not fixed"); fixed later in stop 51: said
    once, with the kinds it is not."""
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(struct.pack("<Q", 1000) + b"{")
    rc, err = main_inprocess(capsys, "inspect", truncated)
    assert rc == 2 and "is neither a YuE2 checkpoint, a VAE decoder nor a LoRA adapter" in err, err
    assert err.count("header length 1000 does not fit a 9-byte file") == 1, err
    assert "as a VAE decoder:" not in err and "Traceback" not in err, err
