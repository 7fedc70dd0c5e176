"""Alternate VAE decoders (yue2_core.weights.vae_files, weights_and_lora.md §5): every layout opens and loads the same
decoder module as the checkpoint's own VAE, bit for bit where the weights are the same; the three releases are told
apart only by config; every refusal names what was wrong."""
from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from yue2_core.errors import CheckpointError
from yue2_core.vae import VAEDecoder
from yue2_core.weights.checkpoint import inspect_checkpoint, load_vae, stat_identity
from yue2_core.weights.lora import record as lora_record
from yue2_core.weights.synthetic import write_synthetic_checkpoint
from yue2_core.weights.synthetic_vae import (MERGE, vae_config, vae_tensors, write_negative, write_vae,
                                             write_vendor_folder)
from yue2_core.weights.vae_files import open_vae

LAYOUTS = ("vendor-folder", "vendor-file", "comfy-prefixed")
FRAMES = 6  # latent frames decoded in the equality checks (→ 1920·6 − 64 samples)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict:
    """The synthetic all-in-one checkpoints (seed 0): bf16 (F32 VAE) and int8 (F16 VAE). The micro profile has the
    tiny profile's VAE geometry and the same VAE tensors (same key-seeded generators), at a fraction of the bytes."""
    d = tmp_path_factory.mktemp("vae_ckpt")
    out = {}
    for fmt in ("bf16", "int8"):
        out[fmt] = str(d / f"micro_{fmt}.safetensors")
        write_synthetic_checkpoint(out[fmt], "micro", fmt, seed=0)
    return out


@pytest.fixture(scope="module")
def own_vae(ckpts) -> VAEDecoder:
    return load_vae(inspect_checkpoint(ckpts["bf16"]))


@pytest.fixture(scope="module")
def latents() -> torch.Tensor:
    return torch.randn(1, 64, FRAMES, generator=torch.Generator().manual_seed(5))


def _path(tmp_path, layout, name="vae"):
    return str(tmp_path / (name if layout == "vendor-folder" else f"{name}.safetensors"))


def _same_module(a: VAEDecoder, b: VAEDecoder) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ---------------------------------------------------------------------------------------------------------------
# What loads
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_standard_release_equals_the_checkpoint_vae(tmp_path, layout, own_vae, latents):
    path = write_vae(_path(tmp_path, layout), layout=layout, variant="standard", seed=0)
    vae = open_vae(path)
    assert (vae.layout, vae.variant, vae.encoder) == (layout, "standard", True)
    assert vae.config == own_vae.cfg
    assert vae.dtypes == {"F32": 435}
    module = vae.load("cpu")
    assert type(module) is VAEDecoder and not module.training
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in module.parameters())
    assert _same_module(module, own_vae)
    audio = module.decode_tiled(latents)
    assert audio.shape == (1, 2, 1920 * FRAMES - 64)
    assert torch.equal(audio, own_vae.decode_tiled(latents))


def test_vendor_folder_from_the_checkpoints_own_tensors_decodes_bit_identically(tmp_path, ckpts, own_vae, latents):
    raw = load_file(ckpts["bf16"])
    tensors = {k[len("vae."):]: v for k, v in raw.items() if k.startswith("vae.decoder.")}
    folder = write_vendor_folder(str(tmp_path / "from_ckpt"), tensors, vae_config("tiny", "standard"))
    vae = open_vae(folder)
    assert (vae.layout, vae.encoder, vae.dtypes) == ("vendor-folder", False, {"F32": 217})
    assert torch.equal(vae.load().decode_tiled(latents), own_vae.decode_tiled(latents))


@pytest.mark.parametrize("fmt, dtype", [("bf16", "F32"), ("int8", "F16")])
def test_a_whole_comfy_checkpoint_gives_its_vae(ckpts, fmt, dtype):
    vae = open_vae(ckpts[fmt])
    assert (vae.layout, vae.variant, vae.dtypes) == ("comfy-prefixed", "unknown", {dtype: 435})
    info = inspect_checkpoint(ckpts[fmt])
    assert _same_module(vae.load(), load_vae(info))  # the int8 file's F16 VAE upcast exactly as load_vae does


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decoder_only_files_are_accepted(tmp_path, layout, own_vae):
    vae = open_vae(write_vae(_path(tmp_path, layout), layout=layout, encoder=False))
    assert vae.encoder is False and vae.dtypes == {"F32": 217}
    assert _same_module(vae.load(), own_vae)
    assert "decoder only" in vae.describe()


def test_sharded_vendor_folder(tmp_path, own_vae):
    folder = tmp_path / "sharded"
    write_vae(str(folder), layout="vendor-folder")
    tensors = load_file(str(folder / "model.safetensors"))
    os.remove(folder / "model.safetensors")
    os.remove(folder / "weights_manifest.json")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(folder / shard))
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    vae = open_vae(str(folder))
    assert len(vae.weights) == 2 and _same_module(vae.load(), own_vae)
    rec = vae.record()
    assert rec["sha256"] == hashlib.sha256((folder / "model.safetensors.index.json").read_bytes()).hexdigest()
    assert [s["file"] for s in rec["shards"]] == list(shards)
    # an index naming a tensor twice (the first entry pointing at the other shard) is refused by name: JSON readers
    # keep the last entry, so the first was never checked (stop 51, as for the model's vendor folder)
    key = names[0]
    text = json.dumps({"weight_map": weight_map})
    (folder / "model.safetensors.index.json").write_text(
        text.replace('"weight_map": {', f'"weight_map": {{"{key}": "model-00002-of-00002.safetensors", ', 1))
    with pytest.raises(CheckpointError, match=f"names '{key}' twice: an index lists each tensor once"):
        open_vae(str(folder))


# ---------------------------------------------------------------------------------------------------------------
# Releases, identity, record
# ---------------------------------------------------------------------------------------------------------------

def test_the_three_releases_differ_in_the_decoder_only(tmp_path):
    mods, raw = {}, {}
    for v in ("standard", "legacy", "merge"):
        path = write_vae(str(tmp_path / v), layout="vendor-folder", variant=v)
        vae = open_vae(path)
        assert vae.variant == v
        mods[v] = vae.load().state_dict()
        raw[v] = load_file(os.path.join(path, "model.safetensors"))
    enc = [k for k in raw["standard"] if k.startswith("encoder.")]
    assert len(enc) == 218 and all(torch.equal(raw["standard"][k], raw[v][k]) for v in ("legacy", "merge") for k in enc)
    for k, s in mods["standard"].items():
        assert not torch.equal(s, mods["legacy"][k]), k
        assert torch.equal(mods["merge"][k], MERGE[0] * s + MERGE[1] * mods["legacy"][k]), k


def test_variant_comes_from_config_never_the_name(tmp_path):
    folder = tmp_path / "YuE2-Vae-legacy"  # the name says legacy; the config does not say anything
    write_vae(str(folder), layout="vendor-folder", variant="legacy")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["release_variant"]
    (folder / "config.json").write_text(json.dumps(cfg))
    assert open_vae(str(folder)).variant == "unknown"
    cfg["release_variant"] = "standard"
    cfg["merge_ratio"] = 0.666  # a config that says it is a merge
    (folder / "config.json").write_text(json.dumps(cfg))
    assert open_vae(str(folder)).variant == "merge"
    single = tmp_path / "legacy.safetensors"
    save_file(vae_tensors("tiny", "legacy", encoder=False), str(single))  # no metadata, no config
    assert open_vae(str(single)).variant == "unknown"


def test_record_describe_and_key(tmp_path):
    path = write_vae(str(tmp_path / "v.safetensors"), layout="vendor-file", variant="legacy")
    vae = open_vae(path)
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    rec = vae.record()
    assert rec == {"file": "v.safetensors", "path": os.path.abspath(path), "sha256": digest,
                   "bytes": os.path.getsize(path), "layout": "vendor-file", "variant": "legacy"}
    st = os.stat(path)
    assert (os.path.abspath(path), *stat_identity(st)) in lora_record._HASHES  # cached per file version
    line = vae.describe()
    assert "\n" not in line and line.startswith("legacy VAE (vendor-file") and "v.safetensors" in line
    assert "6 blocks" in line and "1920 samples/frame" in line
    assert vae.key == open_vae(path).key and hash(vae.key) is not None
    folder = write_vae(str(tmp_path / "f"), layout="vendor-folder")
    frec = open_vae(folder).record()
    assert frec["file"] == "f" and frec["sha256"] == hashlib.sha256(
        open(os.path.join(folder, "model.safetensors"), "rb").read()).hexdigest()
    write_vae(path, layout="vendor-file", variant="standard")  # same size, new bytes and mtime
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
    assert open_vae(path).key != vae.key
    with pytest.raises(CheckpointError, match="changed on disk since it was opened"):
        vae.load()


# ---------------------------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------------------------

def _refused(path, *fragments):
    with pytest.raises(CheckpointError) as err:
        open_vae(str(path))
    for f in fragments:
        assert f in str(err.value), str(err.value)
    return str(err.value)


def test_missing_and_unreadable_files(tmp_path):
    _refused(tmp_path / "nope.safetensors", "VAE not found", "nope.safetensors")
    text = tmp_path / "notes.safetensors"
    text.write_text("not a tensor file at all")
    _refused(text, "not a safetensors file")
    good = write_vae(str(tmp_path / "v.safetensors"), layout="vendor-file")
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(open(good, "rb").read()[:-1000])
    _refused(cut, "truncated")


def test_negative_files(tmp_path):
    _refused(write_negative(str(tmp_path / "enc.safetensors"), "encoder-only"),
             "only encoder.* tensors; YuE2 needs the decoder")
    msg = _refused(write_negative(str(tmp_path / "sd.safetensors"), "sd-vae"), "not a YuE2 VAE decoder",
                   "decoder.layers.0.weight_v", "decoder.layers.6.layers.1.weight_v", "decoder.layers.8.weight_v")
    assert "decoder.conv_in" in msg  # says what it found instead
    _refused(write_negative(str(tmp_path / "l32.safetensors"), "latent-32"), "32 latent channels",
             "YuE2 latents have 64")
    _refused(write_negative(str(tmp_path / "i8.safetensors"), "int8-decoder"),
             "decoder.layers.3.layers.1.weight_v is stored as I8", "F32")
    other = tmp_path / "other.safetensors"
    save_file({"model.embed.weight": torch.zeros(2, 2)}, str(other))
    _refused(other, "holds no VAE tensors", "model.embed.weight")
    lora = tmp_path / "a_lora.safetensors"  # new-user finding (stop 40): a LoRA given as --vae, named as one
    save_file({"diffusion_model.model.layers.0.mlp.down_proj.lora_A.weight": torch.zeros(2, 2),
               "diffusion_model.model.layers.0.mlp.down_proj.lora_B.weight": torch.zeros(2, 2)}, str(lora))
    _refused(lora, "is a LoRA / LoKr adapter (tensors such as diffusion_model.model.layers.0.mlp.down_proj.lora_A",
             "not a VAE: give it as --lora")


def test_prefixed_names_in_messages(tmp_path):
    tensors = {"vae." + k: v for k, v in vae_tensors("tiny", encoder=False).items()
               if k != "decoder.layers.4.layers.3.layers.1.bias"}
    path = tmp_path / "holes.safetensors"
    save_file(tensors, str(path))
    _refused(path, "1 decoder tensors missing", "vae.decoder.layers.4.layers.3.layers.1.bias")


def test_wrong_hop_from_the_weights(tmp_path):
    tensors = vae_tensors("tiny", encoder=False)
    v = tensors["decoder.layers.1.layers.1.weight_v"]  # stride 6: kernel 12 → 8 makes stride 4
    tensors["decoder.layers.1.layers.1.weight_v"] = v[:, :, :8].clone()
    path = tmp_path / "hop.safetensors"
    save_file(tensors, str(path))
    _refused(path, "1280 samples per latent frame", "YuE2 songs have 1920")


@pytest.mark.parametrize("field, value, fragment", [
    ("model_type", "dac", "model_type 'dac'"),
    ("sample_rate", 44100, "sample_rate is 44100"),
    ("downsampling_ratio", 2048, "downsampling_ratio is 2048"),
    ("latent_dim", 32, "latent_dim is 32"),
])
def test_vendor_config_refusals(tmp_path, field, value, fragment):
    folder = tmp_path / "v"
    write_vae(str(folder), layout="vendor-folder")
    cfg = json.loads((folder / "config.json").read_text())
    cfg[field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    _refused(folder, fragment)


@pytest.mark.parametrize("change, fragment", [
    ({"decoder.final_tanh": True}, "decoder.final_tanh is true; this decoder implements final_tanh = false"),
    ({"decoder.snake_type": "bogus"},
     "decoder.snake_type is 'bogus'; this decoder implements snake_type = \"vanilla\""),
    ({"decoder.use_snake": False}, "decoder.use_snake is false"),
    ({"decoder.use_snake": 1}, "decoder.use_snake is 1"),
    ({"decoder.latent_dim": 32}, "decoder.latent_dim is 32"),
    ({"decoder.out_channels": 1}, "decoder.out_channels is 1"),
    ({"decoder.strides": [2, 2, 4, 4, 5, 7]}, "decoder.strides is [2, 2, 4, 4, 5, 7]; a YuE2 decoder's strides"),
    ({"decoder.strides": "2x2"}, "decoder.strides is '2x2'"),
    ({"decoder": [1]}, "config.json decoder must be an object, got list"),
    ({"decode_core_frames": 0}, "decode_core_frames is 0; a positive whole number"),
    ({"decode_core_frames": -5}, "decode_core_frames is -5"),
    ({"decode_halo_frames": 1.5}, "decode_halo_frames is 1.5"),
])
def test_vendor_decoder_settings_this_decoder_does_not_implement(tmp_path, change, fragment):
    """Break-it finding (stop 38): a VAE folder's config.json asking for a final tanh, another snake form, no snake,
    other strides or channels, or absurd tiling hints was decoded with this decoder's math without a word."""
    folder = tmp_path / "v"
    write_vae(str(folder), layout="vendor-folder")
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in change.items():
        if "." in key:
            top, sub = key.split(".")
            cfg[top][sub] = value
        else:
            cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    _refused(folder, fragment)


def test_vendor_folder_refusals(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(empty, "folder without config.json")
    folder = tmp_path / "v"
    write_vae(str(folder), layout="vendor-folder")
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(folder / "config.json", bare / "config.json")
    _refused(bare, "no model.safetensors")
    (bare / "config.json").write_text("{oops")
    _refused(bare, "config.json is not valid JSON")
    # the manifest: a wrong byte count is refused on open, a wrong hash on load
    man = json.loads((folder / "weights_manifest.json").read_text())
    good = dict(man["files"]["model.safetensors"])
    man["files"]["model.safetensors"]["bytes"] = good["bytes"] + 1
    (folder / "weights_manifest.json").write_text(json.dumps(man))
    _refused(folder, "weights_manifest.json says", "download it again")
    man["files"]["model.safetensors"] = {"bytes": good["bytes"], "sha256": "0" * 64}
    (folder / "weights_manifest.json").write_text(json.dumps(man))
    vae = open_vae(str(folder))
    with pytest.raises(CheckpointError, match="has sha256 .* says 0000"):
        vae.load()


@pytest.mark.parametrize("prefix", ["module.", "first_stage_model.", "model.", "vae.vae."])
def test_a_decoder_under_another_prefix_is_named_not_called_a_lora(tmp_path, prefix):
    """A YuE2 VAE re-saved by another tool with its keys under a prefix (`module.decoder.…`): its snake `…alpha`
    tensors made the refusal say "is a LoRA / LoKr adapter … give it as --lora" (break-it finding, stop 42)."""
    plain = load_file(write_vae(_path(tmp_path, "vendor-file", "plain"), layout="vendor-file", encoder=False))
    path = str(tmp_path / "prefixed.safetensors")
    save_file({prefix + k: v for k, v in plain.items()}, path)
    with pytest.raises(CheckpointError) as refused:
        open_vae(path)
    message = str(refused.value)
    assert f"holds the YuE2 VAE decoder's tensors under the prefix '{prefix}'" in message, message
    assert "LoRA" not in message, message
