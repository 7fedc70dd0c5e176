"""Findings of the stop-46 break-it review of bad input (docs/bad_inputs.md §26): a NAR adapter whose branch
metadata was not recognised patched the AR without a word."""
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
