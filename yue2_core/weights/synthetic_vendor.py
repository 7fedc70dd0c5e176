"""Converting between the Comfy-Org all-in-one layout and the vendor's split layout (weights_and_lora.md §4–§6),
for test fixtures: no real vendor folder can be downloaded where this project is tested.

    write_vendor_folder(comfy_path, out_dir)  a bf16 all-in-one file → m-a-p/YuE2-3B folder (+ its VAE folder)
    comfy_from_vendor(folder, out_path)       the inverse (vendor → Comfy names); the round trip is bit-exact
    tiktoken_text(json_vocab)                 the JSON tokenizer's vocabulary → `qwen.tiktoken` text
    tokenizer_json_from_ranks(ranks)          `qwen.tiktoken` ranks → a `tokenizers` JSON giving the same ids
    main(argv)                                command line: python -m yue2_core.weights.synthetic_vendor CKPT OUT
                                              (refuses to replace files unless --force)

Every file is streamed tensor by tensor (`synthetic.write_safetensors_stream`), so the full-size bf16 file converts
without holding it twice. The vendor `model.safetensors` has the upstream names (runtime.md §4.3): split
q/k/v and gate/up, one `model.norm.weight`, `nar_*` leaves, `lm_head.weight`; its metadata is {"format": "pt"} as
Hugging Face writes it.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path

import torch

from ..constants import AUDIO_CHANNELS, CONTEXT, EOD, LATENT_DIM, MUSIC_END, ODE_STEPS, PROTOCOL_VERSION, SAMPLE_RATE
from ..errors import CheckpointError, TokenizerError
from .checkpoint import AR, NAR, TOKENIZER_KEY, VAE, inspect_checkpoint, open_tensors
from .synthetic import TensorSpec, write_safetensors_stream
from .synthetic_tokenizer import bytes_to_unicode
from .tokenizer import QWEN_PATTERN, special_tokens
from .vendor import (CONFIG, INDEX, MANIFEST, MODEL_TYPE, TIKTOKEN, VAE_MODEL_TYPE, WEIGHTS, inspect_vendor,
                     sha256_file, vendor_pairs)

_HF_METADATA = {"format": "pt"}


# ---------------------------------------------------------------------------------------------------------------------
# tokenizer formats
# ---------------------------------------------------------------------------------------------------------------------

def tiktoken_text(vocab: dict[str, int]) -> str:
    """`qwen.tiktoken` from a `tokenizers` BPE vocabulary in the GPT-2 byte alphabet: each id < 151,643 (EOD) as
    `base64(bytes) id` per line, in id order. TokenizerError for a token outside the byte alphabet or a gap."""
    u2b = {u: b for b, u in bytes_to_unicode().items()}
    by_id = {}
    for token, i in vocab.items():
        if i >= EOD:
            continue
        try:
            by_id[i] = bytes(u2b[c] for c in token)
        except KeyError:
            raise TokenizerError(f"vocabulary token {token!r} (id {i}) is not in the byte-level alphabet") from None
    if sorted(by_id) != list(range(len(by_id))):
        raise TokenizerError("the vocabulary's ids below EOD are not 0 … n−1 without gaps")
    return "".join(f"{base64.b64encode(by_id[i]).decode('ascii')} {i}\n" for i in range(len(by_id)))


def _bpe(ranks: dict[bytes, int], token: bytes, below: int) -> list[bytes]:
    """tiktoken's merge loop on `token`'s bytes using only ranks < `below`: the lowest-rank adjacent concatenation
    first, leftmost on ties."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, at = below, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best:
                best, at = r, i
        if at < 0:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merge list tiktoken's ranks imply: for each multi-byte token in rank order, the two parts its own
    bytes reach with lower ranks (a token its bytes cannot reach gets no merge: tiktoken never emits it either).
    With these merges a `tokenizers` BPE gives tiktoken's ids (tested on a corpus)."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) > 1:
            parts = _bpe(ranks, token, rank)
            if len(parts) == 2:
                merges.append((parts[0], parts[1]))
    return merges


def tokenizer_json_from_ranks(ranks: dict[bytes, int]) -> str:
    """A `tokenizers` JSON document equivalent to the vendor tokenizer over `ranks`: NFC, Split(Qwen pattern,
    isolated) + ByteLevel(no prefix space, no regex), BPE with `merges_from_ranks`, ByteLevel decoder, and the 208
    specials as added tokens at 151,643 + i (layout of checkpoint_format.md §5)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TokenizerError("ranks must be 0 … n−1 without gaps (each rank is a token id)")
    b2u = bytes_to_unicode()

    def u(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {u(t): r for t, r in ranks.items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(u(a), u(b)) for a, b in merges_from_ranks(ranks)],
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    if len(ranks) == EOD:  # added tokens are numbered after the vocabulary: only a full table puts them at 151,643+
        tok.add_tokens([AddedToken(s, special=i < 3, normalized=i >= 3) for i, s in enumerate(special_tokens())])
    return tok.to_str()


# ---------------------------------------------------------------------------------------------------------------------
# configs
# ---------------------------------------------------------------------------------------------------------------------

def _json(doc: dict) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def model_config(dims, extra: dict) -> dict:
    """config.json of the model folder (weights_and_lora.md §4 `YuE2Config` fields) for `dims`; `extra` = our
    `yue2_*` markers (e.g. yue2_synthetic), which the loader reads as the folder's metadata."""
    return {"architectures": ["YuE2ForCausalLM"], "model_type": MODEL_TYPE, "torch_dtype": "bfloat16",
            "hidden_size": dims.hidden, "num_hidden_layers": dims.layers, "num_attention_heads": dims.heads,
            "num_key_value_heads": dims.kv_heads, "head_dim": dims.head_dim, "intermediate_size": dims.ffn,
            "vocab_size": dims.vocab, "rms_norm_eps": dims.eps, "rope_theta": dims.rope_theta,
            "max_position_embeddings": CONTEXT, "tie_word_embeddings": False, "latent_type": "vae",
            "latent_dim": dims.latent_dim, "max_latent_frames": dims.pe_rows, "timestep_shift": 1.0, **extra}


def vae_config(vae, extra: dict) -> dict:
    """config.json of the VAE folder (§5, VEN-V defaults) for the decoder geometry `vae` (VAEConfig)."""
    blocks = list(reversed(vae.blocks))  # encoder order
    width = [blocks[0][1]] + [c_in for c_in, _, _ in blocks]
    mults = [w // width[0] for w in width[1:]]
    strides = [s for _, _, s in blocks]
    return {"model_type": VAE_MODEL_TYPE, "release_variant": "standard", "sample_rate": SAMPLE_RATE,
            "latent_dim": vae.latent_dim, "downsampling_ratio": vae.hop, "audio_channels": AUDIO_CHANNELS,
            "decode_core_frames": 1024, "decode_halo_frames": 16,
            "encoder": {"in_channels": AUDIO_CHANNELS, "channels": width[0], "c_mults": mults, "strides": strides,
                        "latent_dim": 2 * LATENT_DIM, "use_snake": True},
            "decoder": {"out_channels": vae.out_channels, "channels": width[0], "c_mults": mults,
                        "strides": strides, "latent_dim": vae.latent_dim, "snake_type": "vanilla",
                        "final_tanh": False}, **extra}


def _generation_configs() -> dict[str, dict]:
    """generation_config.json / yue2_generation_config.json: best-effort contents (the release's are not known);
    the loader reads neither."""
    from ..protocol import ABC_PRESET, SEMANTIC_PRESET
    return {"generation_config.json": {"bos_token_id": EOD, "eos_token_id": MUSIC_END, "pad_token_id": EOD},
            "yue2_generation_config.json": {"protocol": PROTOCOL_VERSION, "abc": ABC_PRESET.to_dict(),
                                            "semantic": SEMANTIC_PRESET.to_dict(), "ode_method": "midpoint",
                                            "ode_steps": ODE_STEPS}}


def _manifest(folder: Path, names: list[str]) -> str:
    return _json({"files": {n: {"sha256": sha256_file(str(folder / n)), "bytes": os.path.getsize(folder / n)}
                            for n in names}})


# ---------------------------------------------------------------------------------------------------------------------
# writers
# ---------------------------------------------------------------------------------------------------------------------

def _write_weights(folder: Path, specs: list[TensorSpec], get, max_shard_bytes: int | None) -> list[str]:
    """`model.safetensors`, or shards `model-0000i-of-0000n.safetensors` + index when `max_shard_bytes` is set.
    Returns the written file names (index last)."""
    if not max_shard_bytes:
        write_safetensors_stream(str(folder / WEIGHTS), specs, (get(s.key) for s in specs), _HF_METADATA)
        return [WEIGHTS]
    shards, size = [[]], 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, group in zip(names, shards):
        write_safetensors_stream(str(folder / name), group, (get(s.key) for s in group), _HF_METADATA)
    index = {"metadata": {"total_size": sum(s.nbytes for s in specs)},
             "weight_map": {s.key: name for name, group in zip(names, shards) for s in group}}
    (folder / INDEX).write_text(_json(index), "utf-8")
    return names + [INDEX]


def write_vendor_folder(comfy_path: str, out_dir: str, vae_dir: str | None = None,
                        max_shard_bytes: int | None = None) -> dict:
    """Write the vendor layout of a bf16 all-in-one file: `out_dir` gets config.json, generation configs,
    model.safetensors (or shards + index with `max_shard_bytes`), qwen.tiktoken and weights_manifest.json;
    `vae_dir` (default `out_dir/vae`) gets config.json (model_type yue2_vae), model.safetensors (unprefixed F32
    encoder.* + decoder.*) and its manifest. Our `yue2_*` metadata (yue2_synthetic …) goes into both configs.

    Returns {"model": out_dir, "vae": vae_dir, "tensors": vendor LM tensors, "files": names written}. CheckpointError
    for an int8 file (no vendor form), two final norms that differ (the vendor file has one), a vocabulary that is
    not byte-level."""
    info = inspect_checkpoint(comfy_path)
    if info.layout != "comfy" or info.format != "bf16":
        raise CheckpointError(f"{comfy_path}: write_vendor_folder needs a bf16 all-in-one file (got {info.layout} "
                              f"{info.format}); int8 ConvRot weights have no vendor form")
    d = info.dims
    out, vae_out = Path(out_dir), Path(vae_dir) if vae_dir is not None else Path(out_dir) / "vae"
    out.mkdir(parents=True, exist_ok=True)
    vae_out.mkdir(parents=True, exist_ok=True)
    splits = {"self_attn.qkv_proj.weight": (d.heads * d.head_dim, d.kv_heads * d.head_dim, d.kv_heads * d.head_dim),
              "mlp.gate_up_proj.weight": (d.ffn, d.ffn)}
    specs, plan = [], {}  # vendor key → (comfy key, row start, row count)
    for comfy, keys in vendor_pairs(d.layers):
        if keys[0] in plan:  # the shared norm: written once (from the AR copy), checked below
            continue
        e = info.entries[comfy]
        rows = splits.get(next((leaf for leaf in splits if comfy.endswith(leaf)), ""), (e.shape[0],))
        start = 0
        for key, n in zip(keys, rows):
            plan[key] = (comfy, start, n)
            specs.append(TensorSpec(key, (n, *e.shape[1:]), e.dtype, "copy", comfy))
            start += n
    with open_tensors(info.path) as f:
        if not torch.equal(f.get_tensor(AR + "model.norm.weight"), f.get_tensor(NAR + "model.norm.weight")):
            raise CheckpointError(f"{comfy_path}: {AR}model.norm.weight and {NAR}model.norm.weight differ; the "
                                  "vendor layout has one model.norm.weight for both experts")
        cache = {}

        def get(key: str) -> torch.Tensor:
            comfy, start, n = plan[key]
            if comfy not in cache:
                cache.clear()
                cache[comfy] = f.get_tensor(comfy)
            return cache[comfy][start:start + n].contiguous()

        files = _write_weights(out, specs, get, max_shard_bytes)
        vocab = json.loads(bytes(f.get_tensor(TOKENIZER_KEY).numpy()).decode("utf-8"))["model"]["vocab"]
        (out / TIKTOKEN).write_text(tiktoken_text(vocab), "utf-8")
        ours = {k: v for k, v in info.metadata.items() if k.startswith("yue2_") and k != "yue2_format"}
        (out / CONFIG).write_text(_json(model_config(d, ours)), "utf-8")
        for name, doc in _generation_configs().items():
            (out / name).write_text(_json(doc), "utf-8")
        (out / MANIFEST).write_text(_manifest(out, [n for n in files if n != INDEX] + [TIKTOKEN]), "utf-8")
        vae_keys = [k for k in info.entries if k.startswith(VAE + "encoder.")] + \
                   [k for k in info.entries if k.startswith(VAE + "decoder.")]
        vae_specs = [TensorSpec(k[len(VAE):], info.entries[k].shape, "F32", "copy", k) for k in vae_keys]
        write_safetensors_stream(str(vae_out / WEIGHTS), vae_specs,
                                 (f.get_tensor(s.source).to(torch.float32) for s in vae_specs), _HF_METADATA)
    (vae_out / CONFIG).write_text(_json(vae_config(info.vae, ours)), "utf-8")
    (vae_out / MANIFEST).write_text(_manifest(vae_out, [WEIGHTS]), "utf-8")
    return {"model": str(out), "vae": str(vae_out), "tensors": len(specs),
            "files": sorted([*files, TIKTOKEN, CONFIG, MANIFEST, *_generation_configs()])}


def comfy_from_vendor(folder: str, out_path: str, vae_path: str | None = None) -> dict:
    """Write the Comfy-Org all-in-one file of a vendor folder (+ its VAE folder): q‖k‖v and gate‖up fused, the one
    norm duplicated into both experts, the VAE under `vae.`, and `text_encoders.yue2_tokenizer_json` built from
    `qwen.tiktoken` (`tokenizer_json_from_ranks`). Metadata: {"yue2_format": "1"} + the config's `yue2_*` markers.
    Hashes are checked as on a load. Returns {"path", "tensors", "file_bytes"}."""
    from .tokenizer import read_tiktoken_ranks
    info = inspect_vendor(folder, vae_path)
    blob = tokenizer_json_from_ranks(read_tiktoken_ranks(info.files["tokenizer"])).encode("utf-8")
    order = ([k for k in info.entries if k.startswith(AR)] + [k for k in info.entries if k.startswith(NAR)]
             + [k for k in info.entries if k.startswith(VAE)])
    specs = [TensorSpec(k, info.entries[k].shape, info.entries[k].dtype, "copy", k) for k in order]
    specs.append(TensorSpec(TOKENIZER_KEY, (len(blob),), "U8", "tokenizer", TOKENIZER_KEY))
    metadata = {"yue2_format": "1", **{k: v for k, v in info.metadata.items() if k.startswith("yue2_")}}
    with info.source.open("cpu") as get:
        tensors = (get(k) for k in order)
        size = write_safetensors_stream(out_path, specs, _then(tensors, torch.frombuffer(bytearray(blob),
                                                                                         dtype=torch.uint8)),
                                        metadata)
    return {"path": os.path.abspath(out_path), "tensors": len(specs), "file_bytes": size}


def _then(items, last):
    yield from items
    yield last


def planned_files(out_dir: str, vae_dir: str | None = None) -> list[Path]:
    """The files `write_vendor_folder(…, out_dir, vae_dir)` may write — the weights as one file or as shards +
    index, so both names and any shards already there — which its command line refuses to replace without --force."""
    out, vae_out = Path(out_dir), Path(vae_dir) if vae_dir is not None else Path(out_dir) / "vae"
    names = [CONFIG, WEIGHTS, INDEX, TIKTOKEN, MANIFEST, *_generation_configs()]
    try:
        shards = sorted(out.glob("model-*-of-*.safetensors"))
    except OSError:
        shards = []
    return [out / n for n in names] + shards + [vae_out / n for n in (CONFIG, WEIGHTS, MANIFEST)]


def main(argv=None) -> int:
    """Command line: `write_vendor_folder(CHECKPOINT, OUT_DIR)` and print the folders and files written. Returns 0,
    or 1 with the message on stderr when the checkpoint is refused (CheckpointError / TokenizerError: an int8 file,
    not a YuE2 file …) or a file it would write exists and --force is not given (`planned_files`)."""
    ap = argparse.ArgumentParser(prog="python -m yue2_core.weights.synthetic_vendor",
                                 description="Write the vendor (m-a-p/YuE2-3B) folder layout of a bf16 Comfy-Org "
                                             "all-in-one checkpoint, e.g. the synthetic tiny one, with its VAE "
                                             "folder in OUT_DIR/vae.")
    ap.add_argument("checkpoint", help="a bf16 all-in-one .safetensors (make-synthetic --format bf16)")
    ap.add_argument("out_dir", help="the vendor model folder to write (created)")
    ap.add_argument("--vae-dir", default=None, help="where the VAE folder goes (default OUT_DIR/vae)")
    ap.add_argument("--max-shard-bytes", type=int, default=None,
                    help="split model.safetensors into shards of at most this many bytes, with an index")
    ap.add_argument("--force", action="store_true", help="replace the files if they exist (refused otherwise)")
    args = ap.parse_args(argv)
    from .synthetic import refuse_overwrite
    refused = refuse_overwrite(planned_files(args.out_dir, args.vae_dir), args.force)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 1
    try:
        done = write_vendor_folder(args.checkpoint, args.out_dir, args.vae_dir, args.max_shard_bytes)
    except (CheckpointError, TokenizerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"model folder: {os.path.abspath(done['model'])} ({done['tensors']} tensors)")
    for name in done["files"]:
        print(f"  {name}")
    print(f"VAE folder:   {os.path.abspath(done['vae'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
