"""Findings of the 2026-12-06 break-it review of own weights (stop 44), docs/bad_inputs.md §21b: checkpoints,
LoRA files and VAE files that passed every load check and then crashed, allocated tens of GB, or gave a wrong or
NaN result after the work."""
from __future__ import annotations

import json
import os
import time

import pytest
import torch
from safetensors.torch import save_file

from robust_helpers import rewrite
from yue2_core.errors import AdapterError, CheckpointError, DamagedWeightsError, TokenizerError
from yue2_core.weights.checkpoint import TOKENIZER_KEY, inspect_checkpoint, load_tokenizer

AR, NAR = "text_encoders.", "model.diffusion_model."


def _marker(doc: dict) -> torch.Tensor:
    return torch.tensor(list(json.dumps(doc).encode("utf-8")), dtype=torch.uint8)


@pytest.mark.parametrize("group", [4 ** 8, 4 ** 20, 1024])
def test_a_convrot_group_larger_than_the_layer_is_refused_before_any_matrix_is_built(tmp_path, nano_path, group):
    """A `comfy_quant` marker saying convrot_groupsize 65,536 (a power of 4, so "valid"): the check built the
    65,536² Hadamard matrix in float64 to validate it — a 34 GB allocation (a RuntimeError traceback from torch's
    allocator, or minutes of work where the memory is there); 4^20 the same. 1,024 on a 256-wide layer was refused
    only by the self-check at load. Now: refused at inspect, from the marker and the header, naming both numbers."""
    module = AR + "model.layers.0.self_attn.o_proj"
    path = rewrite(nano_path, tmp_path / "group.safetensors", lambda t, m: t.__setitem__(
        module + ".comfy_quant", _marker({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": group})))
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=f"convrot_groupsize {group} .*256 input columns"):
        inspect_checkpoint(path)
    assert time.perf_counter() - start < 10


def test_a_head_dim_of_zero_is_a_checkpoint_error(tmp_path, nano_path):
    """q_norm.weight of shape [0] (head_dim 0): `ZeroDivisionError: integer division or modulo by zero` from the
    shape reading; now a CheckpointError naming the tensor."""
    path = rewrite(nano_path, tmp_path / "hd0.safetensors", lambda t, m: t.__setitem__(
        AR + "model.layers.0.self_attn.q_norm.weight", torch.zeros(0, dtype=torch.bfloat16)))
    with pytest.raises(CheckpointError, match="q_norm.weight .*head_dim 0"):
        inspect_checkpoint(path)


def test_a_tokenizer_that_encodes_text_to_nothing_is_refused_at_load(tmp_path, nano_path):
    """An embedded tokenizer JSON that loads but whose vocabulary is empty (damaged, or edited): every prompt
    encoded to no tokens, and `generate` made a song from `[EOD][<abc>]…` alone — style and lyrics dropped without
    a word (`selfcheck.check_tokenizer` existed, but no loader ran it). Now `load_tokenizer` checks a probe text's
    round trip: TokenizerError."""
    blob = b'{"model": {"type": "BPE", "vocab": {}, "merges": []}}'
    path = rewrite(nano_path, tmp_path / "tok.safetensors", lambda t, m: t.__setitem__(
        TOKENIZER_KEY, torch.tensor(list(blob), dtype=torch.uint8)))
    info = inspect_checkpoint(path)
    with pytest.raises(TokenizerError, match="encodes .*to no tokens"):
        load_tokenizer(info)
    assert load_tokenizer(inspect_checkpoint(nano_path)).encode("la la")  # the sound one still loads


def test_a_tokenizer_that_does_not_round_trip_is_refused_at_load(tmp_path, nano_path):
    from yue2_core.weights.synthetic_tokenizer import tokenizer_json
    doc = json.loads(tokenizer_json(300))
    doc["decoder"] = None  # byte-level symbols come back instead of text
    blob = json.dumps(doc).encode("utf-8")
    path = rewrite(nano_path, tmp_path / "tok2.safetensors", lambda t, m: t.__setitem__(
        TOKENIZER_KEY, torch.tensor(list(blob), dtype=torch.uint8)))
    with pytest.raises(TokenizerError, match="does not round-trip text"):
        load_tokenizer(inspect_checkpoint(path))


def _vae_file(tmp_path, name, edit=None, prefix=""):
    from yue2_core.weights.synthetic_vae import vae_tensors
    tensors = vae_tensors("tiny", encoder=False)
    if edit:
        edit(tensors)
    path = tmp_path / name
    save_file({prefix + k: v.contiguous() for k, v in tensors.items()}, str(path))
    return str(path)


@pytest.mark.parametrize("key", ["decoder.layers.7.alpha", "decoder.layers.2.layers.0.alpha"])
def test_a_vae_whose_snake_alpha_overflows_is_refused_when_opened(tmp_path, key):
    """A VAE whose snake `alpha` (stored as log α: the decoder computes exp) holds 100: every value finite, so the
    NaN / zero-norm check passed, but exp(100) is inf in float32 and the decoder made NaN audio — after a whole
    song's AR and NAR work. Now refused when opened, naming the tensor."""
    from yue2_core.weights.vae_files import open_vae
    path = _vae_file(tmp_path, "alpha.safetensors", lambda t: t[key].fill_(100.0))
    with pytest.raises(DamagedWeightsError, match=f"{key} .*exp"):
        open_vae(path)


def test_the_checkpoints_own_vae_with_an_overflowing_snake_is_refused_at_load(tmp_path, nano_path):
    from yue2_core.weights.checkpoint import load_vae
    key = "vae.decoder.layers.7.alpha"
    path = rewrite(nano_path, tmp_path / "alpha.safetensors", lambda t, m: t[key].fill_(100.0))
    with pytest.raises(DamagedWeightsError, match="decoder.layers.7.alpha .*exp"):
        load_vae(inspect_checkpoint(path))


def test_a_vae_of_another_model_with_snake_alphas_is_not_called_a_lora(tmp_path):
    """A Stable Audio Open VAE (the Oobleck decoder with five stride blocks, under `pretransform.model.`) given as
    --vae was called `a LoRA / LoKr adapter (tensors such as ….alpha) … give it as --lora`: its snake `alpha`
    tensors were taken for LoRA alphas. Now it is named as a VAE decoder of another model."""
    from yue2_core.weights.vae_files import open_vae

    def five_blocks(t):
        for k in [k for k in t if k.startswith(("decoder.layers.6.", "decoder.layers.7."))]:
            del t[k]
        for k in [k for k in t if k.startswith("decoder.layers.8.")]:
            t[k.replace("decoder.layers.8.", "decoder.layers.7.")] = t.pop(k)
    path = _vae_file(tmp_path, "sao.safetensors", five_blocks, prefix="pretransform.model.")
    with pytest.raises(CheckpointError) as err:
        open_vae(path)
    msg = str(err.value)
    assert "LoRA" not in msg and "pretransform.model." in msg and "another model" in msg, msg


def _lora(tmp_path, name, tensors, metadata=None):
    path = tmp_path / name
    save_file(tensors, str(path), metadata=metadata)
    return str(path)


def _pair(dtype=torch.float32, a=1.0, b=1.0, expert="diffusion_model"):
    stem = f"{expert}.model.layers.0.self_attn.o_proj"
    return {stem + ".lora_A.weight": (torch.randn(4, 256, dtype=torch.float64) * a).to(dtype),
            stem + ".lora_B.weight": (torch.randn(256, 4, dtype=torch.float64) * b).to(dtype)}


def test_f64_factors_beyond_float32_are_refused_when_read(tmp_path):
    """F64 factors of 1e200 and 1e-202 (product ~1: the overflow bound passed): the merge runs in float32, where
    they are inf and 0 — NaN logits or latents after the lead sheet and music tokens. Now refused when read."""
    from yue2_core.weights.lora.layouts import read_adapter
    from yue2_core.weights.lora.synthetic import profile_dims
    path = _lora(tmp_path, "f64.safetensors", _pair(torch.float64, 1e200, 1e-202))
    with pytest.raises(AdapterError, match="lora_A.weight .*float32"):
        read_adapter(path, profile_dims("tiny"))
    fine = _lora(tmp_path, "f64_ok.safetensors", _pair(torch.float64, 0.01, 0.01))
    assert read_adapter(fine, profile_dims("tiny")).patches


@pytest.mark.parametrize("field,value", [("alpha", "٨"), ("alpha", "1_6"), ("alpha", "８"), ("rank", "٤"),
                                         ("lora_scale", "-1"), ("lora_scale", "٢")])
def test_metadata_numbers_take_ascii_numbers_and_a_positive_scale(tmp_path, field, value):
    """Metadata alpha `٨` (Arabic-Indic 8) or `1_6` was read as 8 / 16 by Python's float() — as `--lora X:٣` was
    (stop 33) —, rank `٤` as 4, and a `lora_scale` of -1 inverted the adapter without a word (an alpha ≤ 0 is
    refused). Now AdapterError naming the field."""
    from yue2_core.weights.lora.layouts import read_adapter
    from yue2_core.weights.lora.synthetic import profile_dims
    meta = {"alpha": "8", "rank": "4", field: value}
    if field == "lora_scale":
        meta = {"format": "pt", "yue2_lora_branch": "nar", "lora_scale": value}
    path = _lora(tmp_path, "meta.safetensors", _pair(), meta)
    with pytest.raises(AdapterError, match=f"metadata {field}="):
        read_adapter(path, profile_dims("tiny"))
    meta[field] = {"alpha": "8", "rank": "4", "lora_scale": "0.5"}[field]
    ok = _lora(tmp_path, "meta_ok.safetensors", _pair(), meta)
    assert read_adapter(ok, profile_dims("tiny")).scales == [{"alpha": 2.0, "rank": 2.0, "lora_scale": 0.5}[field]]


def test_vendor_index_or_shard_that_is_a_symlink_loop_is_named(tmp_path):
    """A vendor folder whose model.safetensors.index.json or one shard is a symbolic-link loop: `… has no weights:
    neither model.safetensors nor model.safetensors.index.json …` / `… names the shard X, which is not in FOLDER (an
    incomplete download …)`. Now the loop is named."""
    from yue2_core.weights.vendor import weight_files
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}
    a = tmp_path / "a"
    a.mkdir()
    os.symlink("model.safetensors.index.json", a / "model.safetensors.index.json")
    with pytest.raises(CheckpointError, match="index.json is a symbolic-link loop"):
        weight_files(a)
    b = tmp_path / "b"
    b.mkdir()
    (b / "model.safetensors.index.json").write_text(json.dumps(index))
    os.symlink("model-00001-of-00001.safetensors", b / "model-00001-of-00001.safetensors")
    with pytest.raises(CheckpointError, match="model-00001-of-00001.safetensors, which is a symbolic-link loop"):
        weight_files(b)
