"""Fuzzing the checkpoint reader (issue 6): `read_header` and `inspect_checkpoint` — and, when a mutated file still
passes, `load_tokenizer`, the int8 self-check and the loaders — on mutated bytes of a small valid YuE2 file
(`NANO`, 1.2 MB): the header length field, raw header bytes, truncations, random files, JSON-level edits of tensor
entries and metadata, and re-laid-out files whose offsets are consistent again (so the deeper shape, dtype, group
and marker checks are reached). Only CheckpointError / TokenizerError may escape; nothing may crash or hang."""
from __future__ import annotations

import json
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robust_helpers import header_bytes
from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar, load_tokenizer, load_vae
from yue2_core.errors import CheckpointError, TokenizerError
from yue2_core.weights.selfcheck import check_int8, check_tokenizer

ALLOWED = (CheckpointError, TokenizerError)
SIZES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8, "BOOL": 1}
pytestmark = pytest.mark.usefixtures("single_thread")


def fuzz(examples: int):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Nano(dict):
    """The valid NANO file split into parts (short repr: hypothesis prints fixtures of failing examples)."""

    def __repr__(self):
        return f"<nano checkpoint, {len(self['blob'])} bytes>"


@pytest.fixture(scope="module")
def nano(nano_path):
    blob = open(nano_path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    return Nano(blob=blob, n=n, header=header, data=blob[8 + n:], keys=sorted(header))


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_st") / "model.safetensors"


def run(path, blob: bytes, deep: str = "") -> None:
    """Write `blob` and read it back through the public reader; only the pack's errors may escape. `deep`:
    "load" also loads the tokenizer and the AR/NAR/VAE modules, "values" runs the tokenizer and int8 self-checks."""
    path.write_bytes(blob)
    t0 = time.perf_counter()
    try:
        info = inspect_checkpoint(str(path))  # reads the header with `read_header` first: its errors are these
        assert info.format in ("bf16", "int8")
        if deep == "load":
            load_tokenizer(info)
            load_ar(info), load_nar(info), load_vae(info)
        elif deep == "values":
            check_tokenizer(info)
            check_int8(info, rows=4, sample_rows=16)
    except ALLOWED as error:
        assert str(error)
    assert time.perf_counter() - t0 < 20, "the reader took too long (hang?)"


# --- byte-level mutations ------------------------------------------------------------------------------------------

@fuzz(600)
@given(data=st.data())
def test_fuzz_safetensors_bytes(nano, target, data):
    """Length field, flipped header bytes, truncation and random files."""
    blob, n = nano["blob"], nano["n"]
    mode = data.draw(st.sampled_from(["length", "flip", "truncate", "random", "text"]))
    if mode == "length":
        value = data.draw(st.one_of(st.integers(0, 2 ** 64 - 1), st.integers(n - 16, n + 16),
                                    st.sampled_from([0, 1, 2, 7, 8, len(blob), len(blob) - 8, 100 * 2 ** 20 + 1])))
        blob = struct.pack("<Q", value) + blob[8:]
    elif mode == "flip":
        blob = bytearray(blob)
        for _ in range(data.draw(st.integers(1, 6))):
            at = data.draw(st.integers(8, 8 + n - 1))
            blob[at] = data.draw(st.sampled_from(list(b'"{}[]:,0123456789-.eE \\\x00\xff') + [data.draw(
                st.integers(0, 255))]))
        blob = bytes(blob)
    elif mode == "truncate":
        cut = data.draw(st.one_of(st.integers(0, 8 + n + 64), st.integers(0, len(blob) - 1),
                                  st.integers(len(blob) - 4096, len(blob) - 1)))
        blob = blob[:cut]
    elif mode == "random":
        blob = data.draw(st.binary(max_size=300))
    else:  # a valid length field around arbitrary text
        text = data.draw(st.one_of(st.text(max_size=200), st.sampled_from(
            ['{}', '[]', 'null', '1', '"x"', '{"__metadata__": 5}', '{"a": {"dtype": "F32", "shape": [Infinity], '
             '"data_offsets": [0, 4]}}', '{"a": {"dtype": "F32", "shape": [1e999], "data_offsets": [0, 4]}}',
             '{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', '{"a": []}', '{"a": null}',
             '[' * 5000 + ']' * 5000, '{"a":' * 3000 + '1' + '}' * 3000, '{"a": {"dtype": "F32", "shape": "12", '
             '"data_offsets": "04"}}'])))
        raw = text.encode("utf-8", "surrogatepass")
        blob = struct.pack("<Q", len(raw)) + raw + data.draw(st.binary(max_size=16))
    run(target, blob)


# --- JSON-level mutations ------------------------------------------------------------------------------------------

DTYPES = st.one_of(st.sampled_from(["BF16", "F16", "F32", "F64", "I8", "U8", "I64", "BOOL", "F8_E4M3", "U16", "Q4",
                                    "", "bf16"]), st.none(), st.integers(), st.text(max_size=4))
DIM = st.one_of(st.integers(-2, 600), st.sampled_from([0, 1, 2 ** 31, 2 ** 63, 2 ** 64 + 1, 10 ** 30]),
                st.floats(allow_nan=True), st.text(max_size=2), st.none(), st.booleans())
SHAPES = st.one_of(st.lists(DIM, max_size=4), st.text(max_size=4), st.integers(), st.none(),
                   st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))
OFFSETS = st.one_of(st.lists(st.one_of(st.integers(-5, 2 ** 21), st.sampled_from([2 ** 63, 2 ** 64 + 5, 10 ** 30]),
                                       st.floats(), st.none(), st.text(max_size=2)), max_size=3),
                    st.integers(), st.none(), st.text(max_size=3))
JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
                       lambda inner: st.one_of(st.lists(inner, max_size=3),
                                               st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                       max_leaves=8)


def _mutate(data, header: dict, keys: list[str]) -> dict:
    header = json.loads(json.dumps(header))
    for _ in range(data.draw(st.integers(1, 4))):
        key = data.draw(st.sampled_from(keys))
        op = data.draw(st.sampled_from(["delete", "rename", "dtype", "shape", "offsets", "entry", "extra",
                                        "metadata", "swap"]))
        if key not in header and op not in ("extra", "metadata"):
            continue
        if op == "delete":
            header.pop(key)
        elif op == "rename":
            new = data.draw(st.one_of(st.text(max_size=20), st.just(key.replace("layers.0", "layers.1")),
                                      st.just(key.replace(".weight", ".weight.weight")),
                                      st.just("text_encoders.model.layers.0.x.comfy_quant"), st.just(key + "_")))
            header[new] = header.pop(key)
        elif op == "dtype" and isinstance(header[key], dict):
            header[key]["dtype"] = data.draw(DTYPES)
        elif op == "shape" and isinstance(header[key], dict):
            header[key]["shape"] = data.draw(SHAPES)
        elif op == "offsets" and isinstance(header[key], dict):
            header[key]["data_offsets"] = data.draw(OFFSETS)
        elif op == "entry":
            header[key] = data.draw(JSONISH)
        elif op == "extra":
            header[data.draw(st.text(max_size=30))] = data.draw(st.one_of(JSONISH, st.fixed_dictionaries(
                {"dtype": DTYPES, "shape": SHAPES, "data_offsets": OFFSETS})))
        elif op == "metadata":
            header["__metadata__"] = data.draw(st.one_of(JSONISH, st.dictionaries(st.text(max_size=8),
                                                                                   st.text(max_size=8))))
        elif op == "swap":
            other = data.draw(st.sampled_from(keys))
            if other in header:
                header[key], header[other] = header[other], header[key]
    return header


@fuzz(450)
@given(data=st.data())
def test_fuzz_safetensors_json(nano, target, data):
    """Edited tensor entries with the data section unchanged (offsets and sizes usually inconsistent)."""
    header = _mutate(data, nano["header"], nano["keys"])
    raw = json.dumps(header, allow_nan=True).encode("utf-8")
    blob = struct.pack("<Q", len(raw)) + raw + nano["data"]
    run(target, blob)


def _relayout(header: dict, data: bytes, markers: dict) -> bytes:
    """Rebuild a file whose offsets are consistent with the (mutated) dtypes and shapes: data copied from the
    original tensor when the size matches, zeros otherwise, marker tensors replaced by `markers`."""
    out, chunks, offset = {}, [], 0
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            out[name] = entry
            continue
        try:
            shape = [int(s) for s in entry["shape"]]
            width = SIZES[entry["dtype"]]
            count = 1
            for s in shape:
                count *= s
            size = count * width
            start, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError, OverflowError):
            out[name] = entry
            continue
        if count < 0 or size > 4 * 2 ** 20:
            out[name] = entry
            continue
        if name in markers:
            piece = markers[name]
            entry = {**entry, "dtype": "U8", "shape": [len(piece)]}
            size = len(piece)
        else:
            piece = data[start:end] if 0 <= start <= end <= len(data) and end - start == size else bytes(size)
        out[name] = {**entry, "data_offsets": [offset, offset + size]}
        chunks.append(piece)
        offset += size
    return header_bytes(out) + b"".join(chunks)


MARKER = st.one_of(
    st.builds(lambda f, c, g, extra: json.dumps({"format": f, "convrot": c, "convrot_groupsize": g, **extra}).encode(),
              st.sampled_from(["int8_tensorwise", "int4_tensorwise", "float8_e4m3fn", "", "INT8_TENSORWISE"]),
              st.one_of(st.booleans(), st.none(), st.integers(), st.text(max_size=2)),
              st.one_of(st.sampled_from([256, 64, 16, 4, 1, 0, -256, 255, 1024, 2 ** 40]), st.booleans(),
                        st.floats(), st.text(max_size=2), st.none()),
              st.dictionaries(st.sampled_from(["params", "orig_dtype", "x"]), JSONISH, max_size=2)),
    st.binary(max_size=80),
    st.just(json.dumps({"format": "int8_tensorwise", "params": {"convrot": True, "convrot_groupsize": 64}}).encode()),
)


@fuzz(260)
@given(data=st.data())
def test_fuzz_safetensors_layout(nano, target, data):
    """Edited entries and quantization markers in files whose layout is consistent again, then the deep path
    (tokenizer, int8 self-check, AR/NAR/VAE loaders) when the header still passes."""
    header = _mutate(data, nano["header"], nano["keys"]) if data.draw(st.booleans()) else dict(nano["header"])
    markers = {}
    if data.draw(st.booleans()):
        names = [k for k in nano["keys"] if k.endswith(".comfy_quant")]
        for name in data.draw(st.lists(st.sampled_from(names), max_size=2, unique=True)):
            markers[name] = data.draw(MARKER)
    run(target, _relayout(header, nano["data"], markers), deep="load")


@fuzz(200)
@given(data=st.data())
def test_fuzz_safetensors_values(nano, target, data):
    """Valid layout, damaged values: tokenizer bytes, int8 codes and scales (the self-check's inputs)."""
    blob = bytearray(nano["blob"])
    start = 8 + nano["n"]
    header = nano["header"]
    names = [k for k in nano["keys"] if k != "__metadata__" and (
        k.endswith((".comfy_quant", ".weight_scale", "yue2_tokenizer_json")) or header[k]["dtype"] == "I8")]
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from(names))
        a, b = header[name]["data_offsets"]
        at = data.draw(st.integers(a, b - 1))
        piece = data.draw(st.binary(min_size=1, max_size=8))
        piece = piece[:b - at]
        blob[start + at:start + at + len(piece)] = piece
    run(target, bytes(blob), deep="values")
