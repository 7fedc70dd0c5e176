"""The load-time self-check (yue2_core/weights/selfcheck.py; catalogue row "int8 self-check failure"): deliberately damaged
int8 tiny files are refused with a CheckpointError naming the module, clean files (ours and the parity fixture,
written by an independent producer) pass, and the tokenizer probe round-trips."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from robust_helpers import copy, rewrite, patch_tensor
from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar, load_tokenizer
from yue2_core.errors import CheckpointError, TokenizerError
from yue2_core.pipeline import YuE2Engine
from yue2_core.weights.quant import ConvRotEmbedding, ConvRotLinear
from yue2_core.weights.selfcheck import PROBE_TEXT, check_int8, check_tokenizer, selfcheck

LAYER1_AR = [f"text_encoders.model.layers.1.{m}" for m in ("self_attn.qkv_proj", "self_attn.o_proj",
                                                           "mlp.gate_up_proj", "mlp.down_proj")]


@pytest.fixture
def damaged(tiny_paths, tmp_path):
    """A fresh copy of the tiny int8 file to damage in place."""
    return lambda name="damaged.safetensors": copy(tiny_paths["int8"], tmp_path / name)


def _both(path):
    """Run the check on the file (CheckpointInfo) and load the AR and NAR experts (the loaders run the same check
    and refuse a damaged expert); return the errors."""
    info = inspect_checkpoint(path)
    errors = []
    for target in (lambda: check_int8(info), lambda: load_ar(info), lambda: load_nar(info)):
        try:
            target()
        except CheckpointError as error:
            errors.append(error)
    return errors


def test_selfcheck_passes_clean_files(tiny_paths, micro_paths):
    for path in (tiny_paths["int8"], micro_paths["int8"]):
        info = inspect_checkpoint(path)
        report = check_int8(info)
        assert report["ok"] and report["quantized_modules"] == 21 and report["max_rel_error"] < 0.01
        assert report["layers"] == {"text_encoders": [0, 1], "model.diffusion_model": [0, 1]}
        for dtype in (torch.bfloat16, torch.float32):
            ar, nar = load_ar(info, dtype=dtype), load_nar(info, dtype=dtype)
            assert check_int8(ar)["quantized_modules"] == 10 and check_int8(nar)["quantized_modules"] == 11
    bf16 = check_int8(inspect_checkpoint(tiny_paths["bf16"]))
    assert bf16["ok"] and bf16["quantized_modules"] == 0


def test_selfcheck_passes_parity_int8_file():
    """The parity fixture's int8 file was quantized by the official tooling, not by our generator."""
    root = os.environ.get("YUE2_PARITY_DIR")
    if not root or not (Path(root) / "tiny_comfy_int8.safetensors").is_file():
        pytest.skip("YUE2_PARITY_DIR is not set (the parity fixtures give an independently quantized file)")
    info = inspect_checkpoint(str(Path(root) / "tiny_comfy_int8.safetensors"))
    assert check_int8(info)["ok"] and check_int8(load_ar(info))["ok"] and check_int8(load_nar(info))["ok"]
    assert check_tokenizer(info)["ok"]


def test_int8_selfcheck_scales_times_1000_refused(damaged):
    path = damaged()
    for module in LAYER1_AR:
        patch_tensor(path, module + ".weight_scale", lambda s: s * 1000)
    errors = _both(path)
    assert len(errors) == 2  # the file and the AR expert; the NAR expert is intact
    for error in errors:
        assert "int8 self-check failed for text_encoders.model.layers.1." in str(error)
        assert "the scales were altered" in str(error) and "would render noise" in str(error)
        assert {k for k, _ in error.failures} == set(LAYER1_AR)


def test_int8_selfcheck_nan_scales_refused(damaged):
    path = damaged()
    module = "model.diffusion_model.model.layers.0.self_attn.o_proj"

    def nan_rows(s):
        s = s.clone()
        s[3] = float("nan")
        s[7] = float("inf")
        return s
    patch_tensor(path, module + ".weight_scale", nan_rows)
    errors = _both(path)
    assert len(errors) == 2
    for error in errors:
        assert f"int8 self-check failed for {module}: 2 row scale(s) are NaN or infinite (first: row 3" in str(error)


def test_int8_selfcheck_shuffled_codes_refused(damaged):
    path = damaged()
    module = "model.diffusion_model.model.layers.1.mlp.gate_up_proj"
    g = torch.Generator().manual_seed(0)
    patch_tensor(path, module + ".weight", lambda q: q.reshape(-1)[torch.randperm(q.numel(), generator=g)])
    errors = _both(path)
    assert len(errors) == 2
    for error in errors:
        assert f"int8 self-check failed for {module}: row " in str(error)
        assert "the codes and scales do not belong together" in str(error)


def test_int8_selfcheck_overflow_and_clipping_refused(damaged):
    path = damaged()
    codes = "text_encoders.model.lm_head"
    patch_tensor(path, codes + ".weight", lambda q: q.index_fill(1, torch.tensor([5]), -128))
    clipped = "model.diffusion_model.llm2vae"
    patch_tensor(path, clipped + ".weight", lambda q: (q.to(torch.int16) * 8).clamp(-127, 127).to(torch.int8))
    info = inspect_checkpoint(path)
    with pytest.raises(CheckpointError) as error:
        check_int8(info)
    failures = dict(error.value.failures)
    assert "code −128 in row 0" in failures[codes]
    assert "the row was clipped" in failures[clipped]


def test_int8_selfcheck_wrong_scale_shape_refused(micro_paths, tmp_path):
    module = "text_encoders.model.layers.0.self_attn.o_proj"

    def edit(tensors, meta):
        s = tensors[module + ".weight_scale"]
        tensors[module + ".weight_scale"] = s.reshape(-1)[: s.numel() // 2].reshape(-1, 1).repeat(1, 2)
    path = rewrite(micro_paths["int8"], tmp_path / "scale_shape.safetensors", edit)
    with pytest.raises(CheckpointError, match=rf"shape mismatch for {module}.weight_scale: expected \[256, 1\] "
                                              r"\(one scale per row of the int8 weight \[256, 256\]\), got \[128, 2\]"):
        inspect_checkpoint(path)  # refused from the header, before any weight is read
    ar = load_ar(inspect_checkpoint(micro_paths["int8"]))
    ar.model.layers[0].self_attn.o_proj.weight_scale = torch.ones(128, 2)  # a loader that got it wrong
    with pytest.raises(CheckpointError, match=rf"{module}: weight_scale has shape \[128, 2\]; a ConvRot module with "
                                              r"weight \[256, 256\] stores one scale per row, \[256, 1\]"):
        check_int8(ar)


def test_int8_selfcheck_rotation_inconsistent_refused(tiny_paths, monkeypatch):
    info = inspect_checkpoint(tiny_paths["int8"])
    ar = load_ar(info)
    # a kernel/loader that forgets the Hadamard rotation (the reported "noise" bug of other ports)
    monkeypatch.setattr(ConvRotLinear, "dequantized",
                        lambda self, dtype=torch.float32: (self.weight.float() * self.weight_scale.float()).to(dtype))
    with pytest.raises(CheckpointError) as error:
        check_int8(ar)
    assert "differs from the dequantized reference" in str(error.value)
    assert "the ConvRot kernel/rotation on this device is wrong" in str(error.value)
    assert {k for k, _ in error.value.failures} == {
        f"text_encoders.model.layers.{i}.{m}" for i in (0, 1)
        for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
    } | {"text_encoders.model.lm_head"}
    monkeypatch.undo()
    monkeypatch.setattr(ConvRotEmbedding, "forward", lambda self, ids: (
        self.weight[ids].float() * self.weight_scale[ids].float()).to(self.dtype))  # embedding not un-rotated
    with pytest.raises(CheckpointError, match="int8 self-check failed for text_encoders.model.embed_tokens: its "
                                              "int8 forward differs"):
        check_int8(ar)


def test_int8_selfcheck_is_cheap(tiny_paths):
    engine = YuE2Engine.load(tiny_paths["int8"], device="cpu")
    t0 = time.perf_counter()
    report = selfcheck(engine)
    assert time.perf_counter() - t0 < 2.0
    assert report["int8"]["quantized_modules"] == 21 and report["tokenizer"]["ok"]
    assert check_int8(engine.ar, layers=(-1,), rows=2)["layers"] == {"text_encoders": [1]}


def test_tokenizer_selfcheck(tiny_paths, micro_paths, tokenizer):
    for path in (tiny_paths["int8"], micro_paths["bf16"]):
        report = check_tokenizer(inspect_checkpoint(path))
        assert report["ok"] and report["probe_tokens"] > 10
    from yue2_core.weights.synthetic_tokenizer import tokenizer_json
    from yue2_core.weights.tokenizer import YuE2Tokenizer
    doc = json.loads(tokenizer_json(768))
    doc["decoder"] = None  # byte-level symbols would come back instead of text
    with pytest.raises(TokenizerError, match="does not round-trip text"):
        check_tokenizer(YuE2Tokenizer(json.dumps(doc)))
    assert check_tokenizer(tokenizer)["probe_chars"] == len(PROBE_TEXT)
    with pytest.raises(TokenizerError, match="not valid JSON"):
        load_tokenizer(inspect_checkpoint(_cut_tokenizer(micro_paths["bf16"])))


def _cut_tokenizer(src):
    from yue2_core.weights.checkpoint import TOKENIZER_KEY
    dst = str(Path(src).with_name("cut_tokenizer.safetensors"))
    copy(src, dst)
    patch_tensor(dst, TOKENIZER_KEY, lambda t: torch.cat([t[:100], torch.full((len(t) - 100,), 32,
                                                                              dtype=torch.uint8)]))
    return dst
