"""Catalogue rows: checkpoint files (docs/bad_inputs.md §3). Every refusal is a CheckpointError (TokenizerError for
the embedded tokenizer) whose message names the problem and what is accepted; formats are told apart by tensor
names and dtypes, never by file name; nothing but safetensors is ever parsed (no pickle)."""
from __future__ import annotations

import json
import pickle

import pytest
import torch

from robust_helpers import copy, edit_header, patch_tensor, read_raw, rewrite
from yue2_core.weights.checkpoint import TOKENIZER_KEY, inspect_checkpoint, load_ar, load_nar, load_tokenizer, load_vae
from yue2_core.errors import CheckpointError, TokenizerError
from yue2_core.pipeline import YuE2Engine


class _Boom:
    """Unpickling this creates a file: proof that a pickle was (not) loaded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_not_a_safetensors_file_refused(tmp_path):
    marker = tmp_path / "UNPICKLED"
    torch_pickle = tmp_path / "model.ckpt.safetensors"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "boom": _Boom(str(marker))}, torch_pickle)
    plain_pickle = tmp_path / "plain.safetensors"
    plain_pickle.write_bytes(pickle.dumps(_Boom(str(marker))))
    text = tmp_path / "notes.safetensors"
    text.write_text("this is not a model\n" * 10)
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    json_only = tmp_path / "json.safetensors"
    json_only.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00[1, 2, 3]       ")
    for path in (torch_pickle, plain_pickle, text, short, json_only):
        with pytest.raises(CheckpointError, match="not a safetensors file"):
            inspect_checkpoint(path)
    assert not marker.exists()  # nothing was unpickled
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        inspect_checkpoint(tmp_path / "missing.safetensors")
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        inspect_checkpoint(tmp_path)


def test_truncated_checkpoint_refused(micro_paths, tmp_path):
    blob = open(micro_paths["int8"], "rb").read()
    for cut, phrase in ((len(blob) // 2, "the file is truncated"), (len(blob) - 1, "the file is truncated"),
                        (4000, "not a safetensors file"), (5, "not a safetensors file")):
        path = tmp_path / f"cut{cut}.safetensors"
        path.write_bytes(blob[:cut])
        with pytest.raises(CheckpointError, match=phrase) as info:
            inspect_checkpoint(path)
        if "truncated" in phrase:
            assert f"the file has {cut:,}" in str(info.value) and "Download it again" in str(info.value)


def test_double_extension_checkpoint_loads(micro_paths, tmp_path):
    for fmt in ("bf16", "int8"):
        path = copy(micro_paths[fmt], tmp_path / f"yue2_3b_{fmt}.safetensors.safetensors")
        info = inspect_checkpoint(path)
        assert info.format == fmt
        load_tokenizer(info), load_ar(info), load_nar(info), load_vae(info)
    odd = copy(micro_paths["int8"], tmp_path / "my model (copy).bin")  # detection never looks at the name
    assert inspect_checkpoint(odd).format == "int8"
    from yue2_core.weights.locate import yue2_files
    assert [p.name for p in yue2_files(tmp_path)] == ["yue2_3b_int8.safetensors.safetensors",
                                                      "yue2_3b_bf16.safetensors.safetensors"]


def test_other_model_checkpoint_names_missing_groups(micro_paths, tmp_path):
    from safetensors.torch import save_file
    sd = tmp_path / "yue2_3b_int8_convrot.safetensors"  # a YuE2 file name does not make a YuE2 file
    save_file({"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(4, 4),
               "first_stage_model.decoder.conv_in.weight": torch.zeros(2, 2)}, str(sd))
    with pytest.raises(CheckpointError, match="is not a YuE2 all-in-one checkpoint: it has none of the YuE2 tensor "
                                              "groups") as info:
        inspect_checkpoint(sd)
    assert "First keys: first_stage_model.decoder.conv_in.weight" in str(info.value)
    upstream = tmp_path / "upstream.safetensors"
    save_file({"model.layers.0.self_attn.q_proj.weight": torch.zeros(2, 2), "lm_head.weight": torch.zeros(2, 2)},
              str(upstream))
    with pytest.raises(CheckpointError, match="none of the YuE2 tensor groups"):
        inspect_checkpoint(upstream)
    partial = tmp_path / "ar_only.safetensors"
    edit_header(micro_paths["bf16"], partial,
                lambda h: [h.pop(k) for k in list(h) if k.startswith(("model.diffusion_model.", "vae."))])
    with pytest.raises(CheckpointError) as info:
        inspect_checkpoint(partial)
    assert "is missing YuE2 tensor groups: NAR expert (model.diffusion_model.*); VAE decoder (vae.decoder.*)" \
        in str(info.value)
    no_tok = tmp_path / "no_tokenizer.safetensors"
    edit_header(micro_paths["bf16"], no_tok, lambda h: h.pop(TOKENIZER_KEY))
    with pytest.raises(CheckpointError, match=r"missing YuE2 tensor groups: embedded tokenizer"):
        inspect_checkpoint(no_tok)


def _swap_shape(key):
    def edit(header):
        header[key]["shape"] = list(reversed(header[key]["shape"]))
    return edit


def test_shape_mismatch_names_tensor_expected_got(micro_paths, tmp_path):
    key = "text_encoders.model.layers.1.mlp.down_proj.weight"
    path = edit_header(micro_paths["bf16"], tmp_path / "shape.safetensors", _swap_shape(key))
    with pytest.raises(CheckpointError, match=rf"shape mismatch for {key}: expected \[256, 512\], got \[512, 256\]"):
        inspect_checkpoint(path)
    g = "vae.decoder.layers.1.layers.1.weight_g"  # consistent header, wrong parameter shape: caught while loading
    header, _ = read_raw(micro_paths["bf16"])
    shape = header[g]["shape"]
    path = edit_header(micro_paths["bf16"], tmp_path / "shape_g.safetensors", _swap_shape(g))
    info = inspect_checkpoint(path)
    with pytest.raises(CheckpointError, match=rf"shape mismatch for {g}: expected {shape}, got "
                                              rf"{list(reversed(shape))}".replace("[", r"\[").replace("]", r"\]")):
        load_vae(info)


def _tokenizer_file(src, dst, fn):
    copy(src, dst)
    patch_tensor(dst, TOKENIZER_KEY, fn)
    return dst


def test_corrupt_tokenizer_blob_refused(micro_paths, tmp_path):
    src = micro_paths["bf16"]
    not_utf8 = _tokenizer_file(src, tmp_path / "t1.safetensors", lambda t: torch.full_like(t, 0xFF))
    cut = _tokenizer_file(src, tmp_path / "t2.safetensors",
                          lambda t: torch.cat([t[: len(t) // 2], torch.full((len(t) - len(t) // 2,), 32,
                                                                             dtype=torch.uint8)]))
    doc = json.dumps({"version": "1.0", "nothing": "here"}).encode()
    no_model = _tokenizer_file(src, tmp_path / "t3.safetensors",
                               lambda t: torch.tensor(list(doc) + [32] * (len(t) - len(doc)), dtype=torch.uint8))
    for path, phrase in ((not_utf8, "not UTF-8"), (cut, "not valid JSON"), (no_model, "has no 'model' section")):
        info = inspect_checkpoint(path)  # the header is fine
        with pytest.raises(TokenizerError, match=phrase):
            load_tokenizer(info)
        with pytest.raises(TokenizerError, match=phrase):
            YuE2Engine.load(path, device="cpu")  # refused before any weights are loaded
    wrong_dtype = edit_header(src, tmp_path / "t4.safetensors", lambda h: h[TOKENIZER_KEY].update(
        dtype="I8"))
    with pytest.raises(CheckpointError, match="must be a rank-1 U8 tensor"):
        inspect_checkpoint(wrong_dtype)


def _marker_file(src, dst, text: bytes, key="text_encoders.model.layers.0.mlp.down_proj.comfy_quant"):
    def edit(tensors, meta):
        tensors[key] = torch.tensor(list(text), dtype=torch.uint8)
    return rewrite(src, dst, edit)


def test_unknown_quantization_marker_refused(micro_paths, tmp_path):
    key = "text_encoders.model.layers.0.mlp.down_proj.comfy_quant"
    int4 = copy(micro_paths["int8"], tmp_path / "int4.safetensors")
    patch_tensor(int4, key, lambda t: torch.tensor(list(bytes(t.tolist()).replace(b"int8", b"int4")),
                                                   dtype=torch.uint8))
    with pytest.raises(CheckpointError, match=rf"{key}: unsupported quantization marker .*'int4_tensorwise'"):
        inspect_checkpoint(int4)
    cases = [(b'{"format": "int8_tensorwise", "convrot": false}', "unsupported quantization marker"),
             (b'{"format": "float8_e4m3fn"}', "unsupported quantization marker"),
             (b'{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 100}', "must be a power of 4"),
             (b"\xff\xfe garbage", "is not JSON"), (b"[1, 2]", "not a JSON object")]
    for i, (text, phrase) in enumerate(cases):
        path = _marker_file(micro_paths["int8"], tmp_path / f"m{i}.safetensors", text)
        with pytest.raises(CheckpointError, match=phrase):
            inspect_checkpoint(path)
    missing = tmp_path / "no_marker.safetensors"
    edit_header(micro_paths["int8"], missing, lambda h: h.pop(key))
    with pytest.raises(CheckpointError, match="its quantization marker\\) is missing"):
        inspect_checkpoint(missing)


@pytest.mark.parametrize("change,phrase", [
    ("pe0", "latent_pos_embed.pe has no rows"),
    ("freq_odd", "an even number ≥ 2"),
    ("latent32", "YuE2 latents have 64"),
])
def test_nar_shapes_the_renderer_cannot_use_refused_at_inspect(micro_paths, tmp_path, change, phrase):
    """Review finding: these files passed `inspect` and crashed inside torch after the whole AR phase."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    with safe_open(micro_paths["bf16"], "pt") as f:
        meta = f.metadata()
    t = load_file(micro_paths["bf16"])
    n = "model.diffusion_model."
    if change == "pe0":
        t[n + "latent_pos_embed.pe"] = t[n + "latent_pos_embed.pe"][:0].clone()
    elif change == "freq_odd":
        w = t[n + "time_embedder.mlp.0.weight"]
        t[n + "time_embedder.mlp.0.weight"] = w[:, :w.shape[1] - 1].clone()
    else:
        t[n + "vae2llm.weight"] = t[n + "vae2llm.weight"][:, :32].clone()
        for key in ("llm2vae.weight", "llm2vae.bias"):
            t[n + key] = t[n + key][:32].clone()
    path = tmp_path / f"{change}.safetensors"
    save_file(t, str(path), metadata=meta)
    with pytest.raises(CheckpointError, match=phrase):
        inspect_checkpoint(str(path))


@pytest.mark.parametrize("change,phrase", [
    ("lora", "adapter tensors"), ("gap", "numbered 0–"), ("extra_nar", "numbered 0–"),
    ("stranger", "not part of a YuE2"),
])
def test_tensors_the_loaders_would_ignore_are_refused(micro_paths, tmp_path, change, phrase):
    """Break-it finding: unknown tensors were ignored and layers past a gap silently dropped (a checkpoint with
    unmerged lora_A/lora_B, or one layer renumbered, loaded as a smaller or other model). checkpoint_format.md §1.1:
    nothing but the three trees is in the file; each such tensor is refused, named, with what to do."""
    layer = "text_encoders.model.layers.1.mlp.down_proj.weight"

    def edit(tensors, meta):
        if change == "lora":
            tensors[layer.replace(".weight", ".lora_A.weight")] = torch.zeros(4, tensors[layer].shape[1])
            tensors[layer.replace(".weight", ".lora_B.weight")] = torch.zeros(tensors[layer].shape[0], 4)
        elif change == "gap":  # layer 1 of the AR renamed to a number past the end
            for k in [k for k in tensors if k.startswith("text_encoders.model.layers.1.")]:
                tensors[k.replace("layers.1.", "layers.7.")] = tensors.pop(k)
        elif change == "extra_nar":
            tensors["model.diffusion_model.model.layers.9.self_attn.k_norm.weight"] = torch.ones(4)
        else:
            tensors["model.diffusion_model.pos_embed.extra"] = torch.zeros(3)
    bad = rewrite(micro_paths["bf16"], tmp_path / f"{change}.safetensors", edit)
    with pytest.raises(CheckpointError, match=phrase) as e:
        inspect_checkpoint(bad)
    if change == "lora":
        assert "lora_A" in str(e.value) and "--lora" in str(e.value)
    if change == "stranger":  # one tensor, named in the singular (stop-53 review: "1 tensor that are not part")
        assert "pos_embed.extra" in str(e.value) and "holds 1 tensor that is not part of a YuE2" in str(e.value)
    inspect_checkpoint(micro_paths["bf16"])  # the file it came from is fine
    inspect_checkpoint(micro_paths["int8"])  # and so are the int8 triplets (weight, weight_scale, comfy_quant)


def test_non_text_metadata_is_named_not_download_again(tmp_path):
    """A safetensors file whose __metadata__ holds a number (a non-conforming writer) is refused by the safetensors
    reader; the header check says which key and how to re-save it, instead of "download it again" (break-it
    finding, on a LoRA adapter)."""
    import struct
    from safetensors.torch import save_file
    from yue2_core.weights.checkpoint import read_header
    good = tmp_path / "a.safetensors"
    save_file({"w": torch.zeros(2, 2)}, str(good), metadata={"ss_network_dim": "4"})
    raw = good.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    for meta, words in (({"ss_network_dim": 4}, "value of 'ss_network_dim' is int 4"), ([1], "is not a JSON object")):
        header = json.loads(raw[8:8 + n])
        header["__metadata__"] = meta
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        bad = tmp_path / "bad.safetensors"
        bad.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
        with pytest.raises(CheckpointError) as e:
            read_header(str(bad))
        assert words in str(e.value) and "allows only text values" in str(e.value)
        assert "download it again" not in str(e.value).lower()
    assert read_header(str(good))[1] == {"ss_network_dim": "4"}


def test_weights_at_a_path_that_is_not_utf8_load(tmp_path, micro_paths):
    """A folder name with byte 0xFF (a Latin-1 name on a Linux disk): the safetensors reader takes UTF-8 paths only,
    and its refusal was reported as "not a valid safetensors file … Download it again" for a file that is fine
    (break-it review, stop 32). Now the file is opened and the reader given its /proc/self/fd alias."""
    import os
    from yue2_core.weights.checkpoint import inspect_checkpoint, open_tensors
    folder = os.fsencode(str(tmp_path)) + b"/ck\xff"
    os.mkdir(folder)
    path = os.fsdecode(folder + b"/m.safetensors")  # '…/ck\udcff/m.safetensors'
    os.link(micro_paths["int8"], path)
    info = inspect_checkpoint(path)
    with open_tensors(path) as f:
        key = next(iter(f.keys()))
        assert f.get_tensor(key).numel() > 0
    assert info.dims.layers >= 1


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_nan_in_the_nar_weights_is_refused_at_load(micro_paths, tmp_path, fmt):
    """Found only as non-finite latents after a whole song's AR work before (stop 39's list)."""
    from yue2_core.errors import DamagedWeightsError
    path = copy(micro_paths[fmt], tmp_path / "nan_nar.safetensors")
    info = inspect_checkpoint(path)
    key = next(k for k, e in info.entries.items() if k.startswith("model.diffusion_model.") and "norm" in k
               and e.dtype in ("BF16", "F32", "F16"))
    patch_tensor(path, key, lambda t: torch.where(torch.arange(t.numel()).reshape(t.shape) == 1, float("nan"), t))
    with pytest.raises(DamagedWeightsError, match=f"NAR expert in {path}: {key} holds NaN/inf \\(1 of its"):
        load_nar(inspect_checkpoint(path))
    assert load_ar(inspect_checkpoint(path)) is not None  # the AR part is untouched
