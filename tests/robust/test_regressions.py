"""Crashes the fuzzers (and the catalogue tests) found, kept as explicit examples. Each failed before the fix with
an exception other than the pack's own (OverflowError, TypeError, RecursionError, SafetensorError, RuntimeError,
AttributeError, JSONDecodeError, ValueError) or silently accepted bad data."""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from robust_helpers import edit_header, make_song, read_raw, write_raw
from yue2_core.artifacts import load_song, save_song
from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar, load_tokenizer, read_header
from yue2_core.errors import ArtifactError, CheckpointError, RequestError
from yue2_core.protocol import Sampling, SongRequest, seconds_to_tokens


# --- protocol --------------------------------------------------------------------------------------------------------

def test_regression_huge_int_settings():
    """math.isfinite(10**400) raised OverflowError out of Sampling/SongRequest validation."""
    with pytest.raises(RequestError, match="temperature must be a finite number"):
        Sampling(temperature=10 ** 400).validate()
    with pytest.raises(RequestError, match="cfg_scale must be a finite number"):
        SongRequest("a", "b", cfg_scale=-(10 ** 400)).validate()
    with pytest.raises(RequestError, match="max duration must be a finite number"):
        seconds_to_tokens(10 ** 400)
    with pytest.raises(RequestError, match="far beyond the 24576-token context"):
        seconds_to_tokens(1e308)  # finite, but ×25 overflowed in round()


def test_regression_lone_surrogate_text(tokenizer):
    """`tokenizers` raised a bare TypeError ("TextInputSequence must be str") for a lone surrogate."""
    with pytest.raises(RequestError, match="unpaired surrogate U\\+D800"):
        SongRequest(style="", lyrics="\ud800").validate()
    with pytest.raises(RequestError, match="unpaired surrogate"):
        tokenizer.encode("\ud800")


def test_regression_reserved_song_id():
    """SongRequest accepted "CON" (and "x." that Windows renames) while artifacts.safe_name refused it."""
    for bad in ("CON", "nul.txt", "song."):
        with pytest.raises(RequestError, match="is not allowed"):
            SongRequest("a", "b", id=bad).validate()


# --- checkpoint reader -----------------------------------------------------------------------------------------------

def _with_header(tmp_path, text: str) -> Path:
    raw = text.encode()
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x00" * 8)
    return path


def test_regression_header_infinity_and_nesting(tmp_path):
    """shape [Infinity] raised OverflowError; deeply nested JSON raised RecursionError."""
    for text in ('{"a":{"dtype":"F32","shape":[Infinity],"data_offsets":[0,4]}}',
                 '{"a":{"dtype":"F32","shape":[1e999],"data_offsets":[0,4]}}',
                 '{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}',
                 '{"a":{"dtype":"F32","shape":"12","data_offsets":[0,8]}}',
                 '{"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}'):
        with pytest.raises(CheckpointError, match="malformed header entry for tensor 'a'"):
            read_header(str(_with_header(tmp_path, text)))
    with pytest.raises(CheckpointError, match="its header is not JSON"):
        read_header(str(_with_header(tmp_path, "[" * 5000 + "]" * 5000)))


def test_regression_layout_refused_by_safetensors(micro_paths, tmp_path):
    """A file our header check accepts but the safetensors reader refuses (trailing bytes after the data, the case
    the fuzzer made by shrinking the header length): SafetensorError escaped from inspect/load."""
    header, data = read_raw(micro_paths["int8"])
    path = write_raw(tmp_path / "trailing.safetensors", header, data + b"\x00" * 16)
    with pytest.raises(CheckpointError, match="the safetensors reader refuses it"):
        inspect_checkpoint(path)  # reading the int8 markers
    header, data = read_raw(micro_paths["bf16"])
    path = write_raw(tmp_path / "trailing_bf16.safetensors", header, data + b"\x00" * 16)
    info = inspect_checkpoint(path)  # no markers to read: the header alone looks fine
    with pytest.raises(CheckpointError, match="the safetensors reader refuses it"):
        load_tokenizer(info)
    with pytest.raises(CheckpointError, match="the safetensors reader refuses it"):
        load_ar(info)


def test_regression_missing_or_misshapen_marker(micro_paths, tmp_path):
    """int8 codes without their marker reached load_state_dict (RuntimeError); a marker swapped with a 3-D tensor
    reached parse_marker (TypeError)."""
    path = edit_header(micro_paths["int8"], tmp_path / "a.safetensors",
                       lambda h: h.pop("model.diffusion_model.llm2vae.comfy_quant"))
    with pytest.raises(CheckpointError, match="llm2vae.weight is int8 codes but .*comfy_quant .* is missing"):
        inspect_checkpoint(path)
    marker, g = "text_encoders.model.embed_tokens.comfy_quant", "vae.decoder.layers.1.layers.4.layers.3.weight_g"

    def swap(h):
        h[marker], h[g] = h[g], h[marker]
    path = edit_header(micro_paths["int8"], tmp_path / "b.safetensors", swap)
    with pytest.raises(CheckpointError):
        inspect_checkpoint(path)


def test_regression_scale_shape_not_reinterpreted(micro_paths, tmp_path):
    """A weight_scale stored as [out/2, 2] was silently reshaped to [out, 1] by the loader."""
    key = "model.diffusion_model.model.layers.0.mlp.down_proj.weight_scale"

    def reshape(h):
        rows = h[key]["shape"][0]
        h[key]["shape"] = [rows // 2, 2]
    path = edit_header(micro_paths["int8"], tmp_path / "s.safetensors", reshape)
    with pytest.raises(CheckpointError, match=f"shape mismatch for {key}"):
        load_nar(inspect_checkpoint(path))


# --- song directories ------------------------------------------------------------------------------------------------

@pytest.fixture
def song(tmp_path):
    return save_song(make_song(), tmp_path / "song")


def _set(root: Path, name: str, data: bytes) -> None:
    (root / name).write_bytes(data)
    result = json.loads((root / "result.json").read_text())
    result["artifacts"][name].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (root / "result.json").write_text(json.dumps(result))


def _npy(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def test_regression_song_dir_crashes(song, tmp_path):
    """AttributeError (manifest not an object), JSONDecodeError / RecursionError (request.json, result.json),
    ValueError (NUL in a listed name), TypeError (2-D ids), silent out-of-range codes."""
    cases = []
    r = Path(shutil.copytree(song, tmp_path / "c1"))
    (r / "result.json").write_text('{"artifacts": 1e999}')
    cases.append((r, "no artifacts manifest"))
    r = Path(shutil.copytree(song, tmp_path / "c2"))
    _set(r, "request.json", b"{not json")
    cases.append((r, "request.json is damaged or not a song request"))
    r = Path(shutil.copytree(song, tmp_path / "c3"))
    (r / "result.json").write_text("[" * 5000 + "]" * 5000)
    cases.append((r, "result.json is damaged"))
    r = Path(shutil.copytree(song, tmp_path / "c4"))
    result = json.loads((r / "result.json").read_text())
    result["artifacts"]["x\x00y"] = {"sha256": "0"}
    (r / "result.json").write_text(json.dumps(result))
    cases.append((r, "unsafe file name"))
    r = Path(shutil.copytree(song, tmp_path / "c5"))
    _set(r, "prefix.npy", _npy(np.zeros((2, 3), dtype=np.int32)))
    cases.append((r, "prefix.npy must be a 1-D integer array"))
    r = Path(shutil.copytree(song, tmp_path / "c6"))
    _set(r, "abc_tokens.npy", _npy(np.array([151643], dtype=np.int64)))
    cases.append((r, "abc_tokens.npy holds values outside [0, 151643)"))
    r = Path(shutil.copytree(song, tmp_path / "c7"))
    _set(r, "latent.npy", _npy(np.full((8, 64), np.nan, dtype=np.float32)))
    cases.append((r, "latent.npy holds NaN"))
    r = Path(shutil.copytree(song, tmp_path / "c8"))
    _set(r, "request.json", json.dumps({"style": "x"}).encode())
    cases.append((r, "request.json lacks lyrics, cot, seed"))
    r = Path(shutil.copytree(song, tmp_path / "c9"))
    result = json.loads((r / "result.json").read_text())
    result["semantic"]["seed"] = "seven"
    (r / "result.json").write_text(json.dumps(result))
    cases.append((r, "the semantic seed must be an integer"))
    for root, phrase in cases:
        with pytest.raises(ArtifactError) as info:
            load_song(root)
        assert phrase in str(info.value), (root.name, str(info.value))
    assert torch.equal(load_song(song).latents, load_song(song).latents)
