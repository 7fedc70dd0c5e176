"""Synthetic YuE2 VAE files for tests (weights_and_lora.md §5, §6): the vendor folder, single files in both key
spellings, the three releases as distinct decoders, and files a loader must refuse. Random weights, not a model.

    vae_tensors(profile, variant, seed, encoder)  {unprefixed key: float32 tensor} of one release
    vae_config(profile, variant)                  the vendor config.json (model_type "yue2_vae", §5 fields)
    write_vendor_folder(out, tensors, config)     config.json + model.safetensors (F32) + weights_manifest.json
    write_vae(out, layout=…, variant=…)           one of the accepted layouts
    write_negative(out, kind)                     encoder-only, SD-VAE-like, 32-channel latents, int8 decoder
    main(argv)                                    command line: python -m yue2_core.weights.synthetic_vae OUT …
                                                  (refuses to replace files unless --force)

Values follow `synthetic.py` exactly: the "standard" release of seed S holds the same VAE tensors as the synthetic
checkpoint of seed S (same key-seeded generators), so a standard file of the tiny profile decodes a tiny model's
latents to the same audio as the checkpoint's own VAE. The releases share one encoder and differ in the decoder only
(§5): "legacy" draws its decoder from other streams, and "merge" = 0.666·standard + 0.334·legacy (fp32 arithmetic,
tensor by tensor).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import torch

from ..constants import AUDIO_CHANNELS, HOP, LATENT_DIM, SAMPLE_RATE, VAE_CORE_FRAMES, VAE_HALO_FRAMES
from .synthetic import _FLOAT_FILL, VAE, VAE_STRIDES, TensorSpec, _float_values, _vae_tensors, get_profile

LAYOUTS = ("vendor-folder", "vendor-file", "comfy-prefixed")
VARIANTS = ("standard", "legacy", "merge")
MERGE = (0.666, 0.334)  # Mothersuperior/YuE2-Vae-merge-0.666: standard and legacy weights (§5)
NEGATIVE = ("encoder-only", "sd-vae", "latent-32", "int8-decoder")


def vae_tensors(profile="tiny", variant: str = "standard", seed: int = 0, encoder: bool = True) -> dict:
    """{key without "vae.": float32 tensor} of one release for `profile` ("tiny": the tiny checkpoint's geometry,
    widths 4·[1,1,1,1,1,1,2]; "full": the release's 64·[1,1,2,4,8,16,32], 435 tensors, 530 MB F32). The encoder is
    the same in every variant; ValueError for an unknown variant."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown VAE variant {variant!r}; choose one of {VARIANTS}")
    p = get_profile(profile)
    out = {}
    for key, shape, kind in _vae_tensors(p):
        name = key[len(VAE):]
        is_decoder = name.startswith("decoder.")
        if not is_decoder and not encoder:
            continue
        fill, std = _FLOAT_FILL[kind]

        def values(stream: str) -> torch.Tensor:
            return _float_values(TensorSpec(key, shape, "F32", fill, stream, std), seed, torch.device("cpu"))

        if not is_decoder or variant == "standard":
            out[name] = values(key)
        elif variant == "legacy":
            out[name] = values("legacy/" + key)
        else:
            out[name] = MERGE[0] * values(key) + MERGE[1] * values("legacy/" + key)
    return out


def vae_config(profile="tiny", variant: str = "standard") -> dict:
    """config.json of a vendor VAE folder: model_type "yue2_vae", release_variant, encoder/decoder blocks and the
    fixed format fields of §5 (sample_rate 48000, latent_dim 64, downsampling_ratio 1920, audio_channels 2, decode
    core 1024 / halo 16 frames). A merge also says `merge` {standard: 0.666, legacy: 0.334}."""
    p = get_profile(profile)
    mults = [1, *p.vae_c_mults]
    blocks = {"channels": p.vae_channels, "c_mults": mults, "strides": list(VAE_STRIDES), "use_snake": True}
    config = {"model_type": "yue2_vae", "release_variant": variant,
              "encoder": {"in_channels": AUDIO_CHANNELS, **blocks, "latent_dim": 2 * LATENT_DIM},
              "decoder": {"out_channels": AUDIO_CHANNELS, **blocks, "latent_dim": LATENT_DIM,
                          "snake_type": "vanilla", "final_tanh": False},
              "sample_rate": SAMPLE_RATE, "latent_dim": LATENT_DIM, "downsampling_ratio": HOP,
              "audio_channels": AUDIO_CHANNELS, "decode_core_frames": VAE_CORE_FRAMES,
              "decode_halo_frames": VAE_HALO_FRAMES, "yue2_synthetic": "random weights, not a trained model"}
    if variant == "merge":
        config["merge"] = {"standard": MERGE[0], "legacy": MERGE[1]}
    return config


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _save(tensors: dict, path: str, metadata: dict | None = None) -> str:
    """safetensors.torch.save_file through a temporary file renamed over `path` (§6), with a new file's mode (0644
    under umask 022; save_file leaves 0600). The folder `path` lies in is created when missing, as the LoRA writer
    and make-synthetic do (own-weights review, stop 58: `--layout vendor-file new/x.safetensors` ended in a
    SafetensorError trace about a hidden temporary file)."""
    from safetensors.torch import save_file

    from .synthetic import mode_as_created
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=metadata or {})
    mode_as_created(tmp)
    os.replace(tmp, path)
    return path


def write_vendor_folder(out: str, tensors: dict, config: dict) -> str:
    """A vendor VAE folder at `out` (created): config.json, model.safetensors (every tensor as F32, unprefixed keys)
    and weights_manifest.json {"files": {name: {"sha256", "bytes"}}} of both. Returns `out`."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    _save({k: v.to(torch.float32) for k, v in tensors.items()}, os.path.join(out, "model.safetensors"))
    files = {name: {"sha256": _sha256(os.path.join(out, name)), "bytes": os.path.getsize(os.path.join(out, name))}
             for name in ("config.json", "model.safetensors")}
    with open(os.path.join(out, "weights_manifest.json"), "w", encoding="utf-8") as f:
        json.dump({"files": files}, f, indent=2)
    return out


def write_vae(out: str, *, layout: str = "vendor-folder", variant: str = "standard", profile="tiny", seed: int = 0,
              encoder: bool = True) -> str:
    """Write one release in `layout`: "vendor-folder" (`out` is a folder, see `write_vendor_folder`), "vendor-file"
    (one safetensors, unprefixed F32 keys) or "comfy-prefixed" (one safetensors, `vae.` + key, F32). `encoder=False`
    writes the decoder only. Single files carry metadata release_variant (readers may ignore it). Returns `out`."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown VAE layout {layout!r}; choose one of {LAYOUTS}")
    tensors = vae_tensors(profile, variant, seed, encoder)
    if layout == "vendor-folder":
        return write_vendor_folder(out, tensors, vae_config(profile, variant))
    if layout == "comfy-prefixed":
        tensors = {VAE + k: v for k, v in tensors.items()}
    meta = {"release_variant": variant, "yue2_synthetic": "random weights, not a trained model"}
    return _save(tensors, out, meta)


def write_negative(out: str, kind: str, profile="tiny", seed: int = 0) -> str:
    """A single safetensors file a VAE loader must refuse: "encoder-only" (the encoder.* of a release, no
    decoder), "sd-vae" (keys of a Stable Diffusion VAE: decoder.conv_in, decoder.mid.block_1…, quant_conv),
    "latent-32" (a YuE2 decoder whose first conv reads 32 latent channels), "int8-decoder" (the decoder with one
    tensor stored as I8). Returns `out`."""
    if kind == "encoder-only":
        tensors = {k: v for k, v in vae_tensors(profile, "standard", seed).items() if k.startswith("encoder.")}
    elif kind == "sd-vae":
        g = torch.Generator().manual_seed(seed)
        shapes = {"encoder.conv_in.weight": (8, 3, 3, 3), "decoder.conv_in.weight": (8, 4, 3, 3),
                  "decoder.conv_in.bias": (8,), "decoder.mid.block_1.norm1.weight": (8,),
                  "decoder.mid.block_1.conv1.weight": (8, 8, 3, 3), "decoder.up.0.block.0.conv1.weight": (8, 8, 3, 3),
                  "decoder.conv_out.weight": (3, 8, 3, 3), "quant_conv.weight": (8, 8, 1, 1),
                  "post_quant_conv.weight": (4, 4, 1, 1)}
        tensors = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    elif kind == "latent-32":
        tensors = vae_tensors(profile, "standard", seed, encoder=False)
        tensors["decoder.layers.0.weight_v"] = tensors["decoder.layers.0.weight_v"][:, :32].clone()
    elif kind == "int8-decoder":
        tensors = vae_tensors(profile, "standard", seed, encoder=False)
        tensors["decoder.layers.3.layers.1.weight_v"] = tensors["decoder.layers.3.layers.1.weight_v"].to(torch.int8)
    else:
        raise ValueError(f"unknown negative VAE file {kind!r}; choose one of {NEGATIVE}")
    return _save(tensors, out)


def main(argv=None) -> int:
    """Command line: write one synthetic VAE release (`write_vae`) at OUT and print its layout, variant and path.
    Returns 0; 1 when a file it would write exists and --force is not given; argparse exits 2 on a bad option."""
    ap = argparse.ArgumentParser(prog="python -m yue2_core.weights.synthetic_vae",
                                 description="Write a synthetic YuE2 VAE (random weights, not a model) in one of the "
                                             "layouts a VAE loader accepts.")
    ap.add_argument("output", help="a folder for --layout vendor-folder, else a .safetensors file")
    ap.add_argument("--layout", choices=LAYOUTS, default="vendor-folder")
    ap.add_argument("--variant", choices=VARIANTS, default="standard",
                    help="the release whose decoder is drawn (the encoder is the same in every variant)")
    ap.add_argument("--profile", choices=("tiny", "full"), default="tiny",
                    help="tiny: the tiny checkpoint's VAE geometry; full: the release's (about 530 MB in F32)")
    ap.add_argument("--seed", type=int, default=0,
                    help="the synthetic checkpoint's seed: a standard VAE of the same seed holds its VAE tensors")
    ap.add_argument("--decoder-only", action="store_true", help="leave out the encoder.* tensors")
    ap.add_argument("--force", action="store_true", help="replace the files if they exist (refused otherwise)")
    args = ap.parse_args(argv)
    from .synthetic import refuse_overwrite
    planned = ([os.path.join(args.output, n) for n in ("config.json", "model.safetensors", "weights_manifest.json")]
               if args.layout == "vendor-folder" else [args.output])
    refused = refuse_overwrite(planned, args.force)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 1
    out = write_vae(args.output, layout=args.layout, variant=args.variant, profile=args.profile, seed=args.seed,
                    encoder=not args.decoder_only)
    print(f"{args.layout} {args.variant} ({args.profile}, seed {args.seed}): {os.path.abspath(out)}")
    if os.path.isdir(out):
        for name in sorted(os.listdir(out)):
            print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
