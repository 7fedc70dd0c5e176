"""Alternate VAE decoders (weights_and_lora.md §5): a YuE2 VAE read from its own file instead of the checkpoint's.

    open_vae(path) -> VAEFile      reads headers, config.json and the decoder's values once (NaN/inf, a weight-norm
                                   direction of norm 0); CheckpointError when the file is unusable
    VAEFile.load(device)           the `vae.VAEDecoder` (fp32, eval, no grad) — the same module `checkpoint.load_vae`
                                   builds from an all-in-one file

Accepted, detected by tensor names and config.json (never the file name):
- "vendor-folder": a m-a-p/YuE2-Vae style folder — config.json (`model_type` "yue2_vae", `release_variant`),
  `model.safetensors` (or `model.safetensors.index.json` + shards) with unprefixed F32 `encoder.*`/`decoder.*`
  tensors, and `weights_manifest.json` ({"files": {name: {"sha256", "bytes"}}}, checked when present);
- "vendor-file": one safetensors file with unprefixed `decoder.*` (+ optional `encoder.*`) tensors;
- "comfy-prefixed": a file with `vae.decoder.*` tensors — a VAE-only file or a whole Comfy all-in-one checkpoint,
  whose VAE is taken.
Decoder-only files are accepted (decoding needs only `decoder.*`, as the vendor's `decoder_only=True`). The three
releases (standard, legacy, the 0.666 merge) share the architecture and differ in decoder weights only; which one a
file holds is known only from its config (`release_variant`), else "unknown".

The song format is fixed (runtime.md §6): 64 latent channels at 25 frames/s, 1920 samples per frame, 48 kHz stereo.
A file whose geometry or config says otherwise is refused, naming what it holds.
"""
from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field

import torch

from ..constants import AUDIO_CHANNELS, HOP, LATENT_DIM, SAMPLE_RATE, VAE_LENGTH_TRIM
from ..errors import (CheckpointError, DamagedWeightsError, DuplicateJSONKey, json_number_too_long, json_too_large,
                      quoted, unique_keys)
from ..vae import VAEConfig, VAEDecoder, length_trim
from .checkpoint import _vae_config, file_identity, not_a_file, open_tensors, read_header, stat_identity
from .lora.record import file_sha256

LAYOUTS = ("vendor-folder", "vendor-file", "comfy-prefixed")
VARIANTS = ("standard", "legacy", "merge", "unknown")
MODEL_TYPE = "yue2_vae"  # config.json model_type of every vendor VAE release (§5)
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")  # vendor files are F32; Comfy's int8 all-in-one stores its VAE as F16
#: the tensors that say "this is the YuE2 Oobleck decoder": the first conv, the last (6th) stride block's transposed
#: conv (ComfyUI's own probe, §5) and the output conv (checkpoint_format.md §3.3)
PROBES = ("decoder.layers.0.weight_v", "decoder.layers.6.layers.1.weight_v", "decoder.layers.8.weight_v")
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
MANIFEST = "weights_manifest.json"
#: the largest log-scale snake frequency `check_values` accepts: exp(50) ≈ 5e21, so x·exp(α) overflows float32 only
#: for |x| > 6e16; a trained snake's log frequency is a few units (exp(α) past ~88.7 is inf: NaN audio)
SNAKE_LOG_MAX = 50.0
_CHECKED: set = set()  # (`_stat_key`, manifest sha256) pairs whose hash matched in this process
_FINITE: set = set()  # `_stat_key`s of the files whose decoder values passed `check_values` in this process


@dataclass
class VAEFile:
    """A YuE2 VAE decoder found in a file or folder (what `open_vae` read; no weights held).

    path: the file or folder given; layout: one of LAYOUTS; variant: "standard" | "legacy" | "merge" | "unknown" (or
    the config's own `release_variant` string when it is another one); config: decoder geometry from the tensor shapes;
    dtypes: {safetensors dtype: tensor count} of the VAE tensors; key: hashable identity of the weights —
    ((absolute path, size, mtime_ns), …) per weights file; weights: the weights files; encoder: whether `encoder.*`
    tensors are present; sources: {decoder parameter name ("decoder.…"): (file, stored key)}; manifest: {file name:
    sha256} of a vendor folder's weights_manifest.json; metadata: a single file's safetensors `__metadata__`."""

    path: str
    layout: str
    variant: str
    config: VAEConfig
    dtypes: dict
    key: tuple
    weights: tuple
    encoder: bool
    sources: dict = field(repr=False)
    manifest: dict = field(default_factory=dict, repr=False)
    metadata: dict = field(default_factory=dict, repr=False)

    @property
    def weights_file(self) -> str:
        """The file whose hash identifies the VAE: model.safetensors, the shard index of a sharded folder, or the
        single file."""
        if self.layout == "vendor-folder" and len(self.weights) > 1:
            return os.path.join(self.path, INDEX)
        return self.weights[0]

    def load(self, device="cpu") -> VAEDecoder:
        """The decoder in fp32 on `device` (F16/BF16 tensors are upcast), in eval mode with requires_grad False.
        A vendor folder's files are checked against weights_manifest.json first. Raises CheckpointError when a file
        changed since `open_vae`, fails its manifest hash, cannot be read, or holds values that would decode to NaN
        (`check_values`)."""
        self._check_unchanged()
        self._check_manifest()
        with torch.device("meta"):
            module = VAEDecoder(self.config)
        dev = torch.device(device)
        read_dev = str(dev) if dev.type in ("cpu", "cuda") else "cpu"
        state, handles = {}, {}
        with contextlib.ExitStack() as stack:
            for name, _ in module.named_parameters():
                file, stored = self.sources[name]
                if file not in handles:
                    handles[file] = stack.enter_context(open_tensors(file, read_dev))
                # `open_tensors` reads into memory the tensor owns (not a view of the memory map): a file changed
                # in place cannot crash the process
                state[name] = handles[file].get_tensor(stored).to(dtype=torch.float32).to(dev)
        strict = _stat_key(self.weights)
        if strict not in _FINITE:  # a VAEFile not made by open_vae (which checks the values once), or a ctime moved
            check_values(state, state.__getitem__, self.path, self.layout)
            _FINITE.add(strict)
        try:
            module.load_state_dict(state, strict=True, assign=True)
        except RuntimeError as exc:
            detail = str(exc).strip().splitlines()[-1].strip()[:300]
            raise CheckpointError(f"VAE {self.path}: the tensors do not fit the decoder ({detail})") from None
        from .own import mark
        mark(module, [("vae", os.path.abspath(self.path))])  # non-finite audio names this file (own.blame)
        return module.eval().requires_grad_(False)

    def record(self) -> dict:
        """What a song records of this VAE (config.json "weights"."vae"): file name, absolute path, sha256 and size of
        the weights file (hash cached per path, size and mtime), layout and variant; a sharded folder adds its
        shards' names and hashes."""
        main = self.weights_file
        out = {"file": os.path.basename(os.path.abspath(self.path)), "path": os.path.abspath(self.path),
               "sha256": file_sha256(main), "bytes": os.path.getsize(main), "layout": self.layout,
               "variant": self.variant}
        if self.layout == "vendor-folder":  # which file inside the folder was hashed (record.find_recorded)
            out["weights_file"] = os.path.relpath(main, self.path)
        if self.layout == "vendor-folder" and len(self.weights) > 1:
            out["shards"] = [{"file": os.path.basename(f), "sha256": file_sha256(f)} for f in self.weights]
        return out

    def describe(self) -> str:
        """One line: variant, layout, file, channels and blocks, dtypes."""
        cfg = self.config
        strides = "·".join(str(s) for _, _, s in cfg.blocks)
        widths = "→".join(str(c) for c in (cfg.first_channels, *(co for _, co, _ in cfg.blocks)))
        dts = ", ".join(f"{n} {d}" for d, n in sorted(self.dtypes.items()))
        part = "decoder + encoder" if self.encoder else "decoder only"
        return (f"{self.variant} VAE ({self.layout}, {part}) {os.path.abspath(self.path)}: latent {cfg.latent_dim} "
                f"→ channels {widths}, {len(cfg.blocks)} blocks (strides {strides} = {cfg.hop} samples/frame) → "
                f"{cfg.out_channels} audio channels; tensors {dts}")

    def _check_unchanged(self):
        try:
            key = _file_key(self.weights)
        except OSError as exc:  # break-it (stop 41): was a FileNotFoundError traceback from os.stat
            raise CheckpointError(f"VAE {self.path} can no longer be read since it was opened ({exc.strerror or exc}: "
                                  f"{exc.filename or self.path}): it was moved or deleted; put it back, or load it "
                                  "again (press R in ComfyUI or re-run)") from None
        if key != self.key:
            raise CheckpointError(f"VAE {self.path} changed on disk since it was opened; load it again (press R in "
                                  "ComfyUI or re-run)")

    def _check_manifest(self):
        for file in self.weights:
            want = self.manifest.get(os.path.basename(file))
            if want is None:
                continue
            key = (_stat_key((file,)), want)
            if key in _CHECKED:
                continue
            got = file_sha256(file)
            if got != want:
                raise CheckpointError(f"VAE {self.path}: {os.path.basename(file)} has sha256 {got}, "
                                      f"{MANIFEST} says {want} — the file is damaged or was replaced; download it "
                                      "again")
            _CHECKED.add(key)


def _file_key(files) -> tuple:
    """(path, *`checkpoint.file_identity`) of each file: a chmod or hard link (the ctime alone) is no change."""
    return tuple((os.path.abspath(f), *file_identity(f)) for f in files)


def _stat_key(files) -> tuple:
    """(path, *`checkpoint.stat_identity`) of each file: the key of the value and manifest checks' caches, stricter
    than `_file_key` (a copy over the file whose sampled bytes match is checked again; a chmod costs one more check)."""
    return tuple((os.path.abspath(f), *stat_identity(os.stat(f))) for f in files)


def _read_json(path: str, what: str, unique: bool = False):
    """The JSON file `path` (`what` names it in errors), refused with CheckpointError when it is not a regular file,
    too large or not valid JSON; `unique`: also when one of its objects names a key twice (a shard index)."""
    from .checkpoint import not_a_file
    kind = not_a_file(str(path))
    if kind is not None:  # a FIFO or device blocks the read forever (break-it review, stop 40)
        raise CheckpointError(f"{what} {path} is {kind}, not a file")
    if too_large := json_too_large(path):
        raise CheckpointError(f"{what} {path} {too_large}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, object_pairs_hook=unique_keys if unique else None)
    except OSError as exc:
        raise CheckpointError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except DuplicateJSONKey as exc:
        from .vendor import index_names_twice
        raise CheckpointError(index_names_twice(path, exc.name)) from None
    except (ValueError, RecursionError) as exc:  # bad UTF-8 / JSON, a number past Python's digit cap, absurd nesting
        if too_long := json_number_too_long(exc):
            raise CheckpointError(f"{path}: {what} holds {too_long}") from None
        raise CheckpointError(f"{path}: {what} is not valid JSON") from None


def _check_config(config, path: str) -> None:
    """A vendor config.json: model_type yue2_vae, and the fixed song format where it states one (§5 defaults)."""
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: config.json must be a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type != MODEL_TYPE:
        raise CheckpointError(f"{path}: config.json says model_type {quoted(model_type, limit=60)}; a YuE2 VAE "
                              f"folder has model_type {MODEL_TYPE!r} (m-a-p/YuE2-Vae, YuE2-Vae-legacy, the 0.666 "
                              "merge)" + (": it is the vendor's YuE2-3B model folder — give it as --checkpoint (nodes: "
                                          "YuE2 Checkpoint Loader)" if model_type == "yue2" else ""))
    fixed = {"sample_rate": (SAMPLE_RATE, "Hz"), "downsampling_ratio": (HOP, "samples per latent frame"),
             "latent_dim": (LATENT_DIM, "latent channels"), "audio_channels": (AUDIO_CHANNELS, "audio channels")}
    for name, (want, unit) in fixed.items():
        if name in config and config[name] != want:
            raise CheckpointError(f"{path}: config.json {name} is {quoted(config[name], limit=60)}; YuE2 songs "
                                  f"are fixed at {want} {unit} (48 kHz stereo, 25 latent frames/s of 64 channels)")
    _check_decoder_config(config, path)


def decoder_section(config: dict) -> tuple[str, object]:
    """(key, value) of config.json's decoder settings: `decoder_config`, the key the vendor's YuE2VAEConfig writes
    and reads (m-a-p/YuE2-Vae, -legacy, the merge), else `decoder` ({} when neither is there). Stop-54 diff review:
    only `decoder` was read, so no check of the decoder settings (stop 38) or of the strides' order (stop 54) ever
    ran on a release's own config.json."""
    if "decoder_config" in config:
        return "decoder_config", config["decoder_config"]
    return "decoder", config.get("decoder", {})


def _check_decoder_config(config: dict, path: str) -> None:
    """The settings of config.json's "decoder" that this decoder implements (`vae.VAEDecoder`; the values every
    YuE2 VAE release states, shared/reference/weights_and_lora.md §5): snake activations (use_snake true, snake_type
    "vanilla"), no final tanh, 64 latent channels in, 2 audio channels out, strides whose product is 1920; and the
    tiling hints decode_core_frames / decode_halo_frames, where given, positive integers (the pack tiles by its own
    1,024 / 16 frames, which are the release's). A config asking for other math was decoded silently with this math
    (break-it finding, stop 38): CheckpointError saying which setting and what is accepted."""
    section, dec = decoder_section(config)
    if not isinstance(dec, dict):
        raise CheckpointError(f"{path}: config.json {section} must be an object, got {type(dec).__name__}")
    implemented = {"use_snake": (True, "snake activations"), "snake_type": ("vanilla", "the SnakeBeta form"),
                   "final_tanh": (False, "no tanh on the output"), "latent_dim": (LATENT_DIM, "latent channels in"),
                   "out_channels": (AUDIO_CHANNELS, "audio channels out")}
    for name, (want, what) in implemented.items():
        if name in dec and (dec[name] != want or type(dec[name]) is not type(want)):
            found = json.dumps(dec[name]) if isinstance(dec[name], bool) or dec[name] is None else \
                quoted(dec[name], limit=60)  # as the file spells it: true / false / null, not Python's True
            raise CheckpointError(f"{path}: config.json {section}.{name} is {found}; this "
                                  f"decoder implements {name} = {json.dumps(want)} ({what}, as every YuE2 VAE "
                                  "release states) — a VAE that needs other math is not one this pack can decode")
    strides = dec.get("strides")
    if strides is not None:
        ok = isinstance(strides, list) and strides and all(type(x) is int and x > 0 for x in strides)
        product = 1
        for x in strides if ok else ():
            product *= x
        if not ok or product != HOP:
            raise CheckpointError(f"{path}: config.json {section}.strides is {quoted(strides, limit=60)}; a YuE2 "
                                  f"decoder's strides are positive integers multiplying to {HOP} samples per "
                                  "latent frame ([2, 2, 4, 4, 5, 6] in every release)")
    for name in ("decode_core_frames", "decode_halo_frames"):
        value = config.get(name)
        if value is not None and (type(value) is not int or not 0 < value <= 1 << 20):
            raise CheckpointError(f"{path}: config.json {name} is {quoted(value, limit=60)}; a positive whole "
                                  "number of latent frames is accepted (the releases say 1024 and 16; this pack "
                                  "tiles by those)")


def _variant(config: dict) -> str:
    """config `release_variant` ("standard" | "legacy"), "merge" when the config says it is a merge, else as
    written; "unknown" without one."""
    rv = config.get("release_variant")
    merge_keys = ("merge", "merge_ratio", "merged_from", "blend")
    if (isinstance(rv, str) and any(w in rv.lower() for w in ("merge", "blend"))) or any(
            k in config for k in merge_keys):
        return "merge"
    if isinstance(rv, str) and rv.strip():
        return rv.strip().lower()
    return "unknown"


_INSTEAD = "give another VAE (--vae, the YuE2 VAE Loader)"


def _folder(path: str):
    """A vendor folder → (config, {tensor: (file, entry)}, weights files, manifest {name: sha256})."""
    from .vendor import hf_download_note
    cfg_path = os.path.join(path, CONFIG)
    if not os.path.isfile(cfg_path):
        raise CheckpointError(f"{path} is a folder without config.json; a YuE2 VAE folder holds config.json "
                              f"(model_type {MODEL_TYPE!r}) and {WEIGHTS} (or {INDEX} + shards)")
    config = _read_json(cfg_path, "config.json")
    _check_config(config, path)
    weights = os.path.join(path, WEIGHTS)
    index = os.path.join(path, INDEX)
    tensors = {}
    if os.path.isfile(weights):
        files = [weights]
        entries, meta, _ = read_header(weights)
        tensors = {k: (weights, e) for k, e in entries.items()}
    elif os.path.isfile(index):
        data = _read_json(index, "the shard index", unique=True)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index}: no weight_map {{tensor: shard file}} object")
        files = []
        for shard in dict.fromkeys(weight_map.values()):
            shard_path = os.path.join(path, shard)
            if os.path.basename(shard) != shard or not os.path.isfile(shard_path):
                raise CheckpointError(f"{index} names shard {shard!r}, which is not a file in {path}"
                                      f"{hf_download_note(path, _INSTEAD)}")
            files.append(shard_path)
            entries, _, _ = read_header(shard_path)
            for k, e in entries.items():
                if weight_map.get(k) == shard:
                    tensors[k] = (shard_path, e)
        missing = [k for k in weight_map if k not in tensors]
        if missing:
            raise CheckpointError(f"{index} lists {len(missing)} tensors its shards do not hold, e.g. {missing[:3]}")
    else:
        raise CheckpointError(f"{path}: config.json says {MODEL_TYPE} but there is no {WEIGHTS} (or {INDEX}) "
                              f"beside it{hf_download_note(path, _INSTEAD)}")
    manifest = {}
    man_path = os.path.join(path, MANIFEST)
    if os.path.isfile(man_path):
        man = _read_json(man_path, MANIFEST)
        listed = man.get("files") if isinstance(man, dict) else None
        if not isinstance(listed, dict):
            raise CheckpointError(f"{man_path}: expected {{\"files\": {{name: {{\"sha256\", \"bytes\"}}}}}}")
        for f in files:
            entry = listed.get(os.path.basename(f))
            if not isinstance(entry, dict):
                continue
            size = entry.get("bytes")
            if isinstance(size, int) and size != os.path.getsize(f):
                raise CheckpointError(f"{f} has {os.path.getsize(f):,} bytes, {MANIFEST} says {size:,} — the "
                                      "download is incomplete or the file was replaced; download it again")
            if isinstance(entry.get("sha256"), str):
                manifest[os.path.basename(f)] = entry["sha256"].lower()
    return config, tensors, files, manifest


def _decoder_keys(tensors: dict, path: str) -> tuple[str, dict]:
    """(layout, {unprefixed VAE key: (file, stored key, entry)}) of a single file's tensors."""
    plain = {k: k for k in tensors if k.startswith(("decoder.", "encoder."))}
    prefixed = {k[len("vae."):]: k for k in tensors if k.startswith(("vae.decoder.", "vae.encoder."))}
    if plain and prefixed:
        raise CheckpointError(f"{path} holds both unprefixed decoder.*/encoder.* and Comfy vae.* tensors; a VAE "
                              "file holds one of the two")
    if not plain and not prefixed:
        sample = ", ".join(sorted(tensors)[:5]) or "no tensors at all"
        # the YuE2 decoder under another prefix (`module.`, `first_stage_model.`, `model.`): its snake `…alpha`
        # tensors made it "a LoRA / LoKr adapter" (break-it finding, stop 42)
        other = next((k[:-len(PROBES[0])] for k in sorted(tensors) if k.endswith("." + PROBES[0])
                      and all(k[:-len(PROBES[0])] + probe in tensors for probe in PROBES)), None)
        if other is not None:
            raise CheckpointError(f"{path} holds the YuE2 VAE decoder's tensors under the prefix {other!r} "
                                  f"({other}{PROBES[0]} …); the pack reads them as decoder.* (vendor m-a-p/YuE2-Vae "
                                  "layout) or vae.decoder.* (Comfy checkpoint layout): save the file again with the "
                                  f"keys renamed ({other}decoder.… → decoder.…)")
        # another model's Oobleck-style decoder under a prefix (Stable Audio Open: `pretransform.model.decoder.…`,
        # five stride blocks): its snake `alpha` tensors made it "a LoRA / LoKr adapter" (break-it review, stop 44)
        first = PROBES[0]
        foreign = next((k[:-len(first)] for k in sorted(tensors) if k.endswith("." + first)), None)
        if foreign is not None:
            lacks = ", ".join(foreign + p for p in PROBES if foreign + p not in tensors)
            raise CheckpointError(f"{path} holds a VAE decoder under the prefix {foreign!r} ({foreign}{first} …), "
                                  f"but not the YuE2 one: it lacks {lacks} (the YuE2 Oobleck decoder has six stride "
                                  "blocks and its output conv at decoder.layers.8) — a VAE of another model (Stable "
                                  "Audio Open's has five stride blocks); a YuE2 VAE is m-a-p/YuE2-Vae's decoder.* or "
                                  "a Comfy checkpoint's vae.decoder.*")
        from .lora.layouts_io import _ADAPTER_ROLE
        snake = {k[:-len(".alpha")] for k in tensors if k.endswith(".alpha") and k[:-len("alpha")] + "beta" in tensors}
        adapter = next((k for k in sorted(tensors) if _ADAPTER_ROLE.search(k)
                        and not (k.endswith(".alpha") and k[:-len(".alpha")] in snake)), None)
        if adapter is not None:  # new-user finding (stop 40): a LoRA given as --vae was not named as one
            raise CheckpointError(f"{path} is a LoRA / LoKr adapter (tensors such as {adapter}), not a VAE: give it "
                                  "as --lora (nodes: YuE2 LoRA), and a YuE2 VAE file or folder as --vae (nodes: YuE2 "
                                  "VAE Loader)")
        raise CheckpointError(f"{path} holds no VAE tensors (found {sample}); a YuE2 VAE has decoder.* tensors "
                              "(vendor m-a-p/YuE2-Vae layout) or vae.decoder.* (Comfy checkpoint layout)")
    layout = "vendor-file" if plain else "comfy-prefixed"
    names = plain or prefixed
    return layout, {k: (tensors[stored][0], stored, tensors[stored][1]) for k, stored in names.items()}


def _geometry(found: dict, path: str, prefix: str) -> VAEConfig:
    """Decoder config from the shapes of `found` ({unprefixed key: (file, stored, entry)}), checked against the
    YuE2 decoder's full key set and the fixed song format. `prefix` is how the file spells the keys ("" or "vae.")."""
    dec = {k: v for k, v in found.items() if k.startswith("decoder.")}
    if not dec:
        raise CheckpointError(f"{path} has only encoder.* tensors; YuE2 needs the decoder (decoder.* — "
                              "m-a-p/YuE2-Vae's model.safetensors or a Comfy file's vae.decoder.*)")
    missing = [prefix + p for p in PROBES if p not in dec]
    if missing:
        sample = ", ".join(prefix + k for k in sorted(dec)[:4])
        raise CheckpointError(f"{path} is not a YuE2 VAE decoder: it lacks {', '.join(missing)} (the YuE2 Oobleck "
                              f"decoder's first conv, 6th stride block and output conv); it holds e.g. {sample} — "
                              "a VAE of another model?")
    bad = [(k, e.dtype) for k, (_, _, e) in dec.items() if e.dtype not in FLOAT_DTYPES]
    if bad:
        k, d = bad[0]
        raise CheckpointError(f"{path}: {prefix}{k} is stored as {d} ({len(bad)} decoder tensors are not float); "
                              f"a VAE decoder is float: {', '.join(FLOAT_DTYPES)} (vendor files are F32)")
    comfy_entries = {"vae." + k: e for k, (_, _, e) in dec.items()}
    try:
        cfg = _vae_config(comfy_entries)
    except CheckpointError as exc:
        text = str(exc) if prefix else str(exc).replace("vae.decoder.", "decoder.")
        raise CheckpointError(f"{path}: {text}") from None
    if cfg.latent_dim != LATENT_DIM:
        raise CheckpointError(f"{path}: {prefix}decoder.layers.0.weight_v reads {cfg.latent_dim} latent channels; "
                              f"YuE2 latents have {LATENT_DIM} (the NAR renders [T, {LATENT_DIM}])")
    if cfg.hop != HOP:
        strides = "·".join(str(s) for _, _, s in cfg.blocks)
        raise CheckpointError(f"{path}: the decoder's strides {strides} make {cfg.hop} samples per latent frame; "
                              f"YuE2 songs have {HOP} (2·2·4·4·5·6 reversed, 25 frames/s at 48 kHz)")
    trim = length_trim(cfg)  # cfg.hop == HOP here (checked above)
    if trim != VAE_LENGTH_TRIM:
        # stop-54 review: strides in another order (6·2·4·4·2·5) also make 1920 samples a frame, but the odd stride's
        # place sets the shortfall — 1920·T − 1 — and every song, edit and take assumes 1920·T − 64
        strides = "·".join(str(s) for _, _, s in cfg.blocks)
        raise CheckpointError(f"{path}: the decoder's strides {strides} (in decoding order) make {HOP} samples per "
                              f"latent frame, but in this order they decode T frames to {HOP}·T − {trim} samples; "
                              f"YuE2 songs are {HOP}·T − {VAE_LENGTH_TRIM} (the release's order 6·5·4·4·2·2) — "
                              "a decoder of another design")
    if cfg.out_channels != AUDIO_CHANNELS:
        raise CheckpointError(f"{path}: {prefix}decoder.layers.8.weight_v makes {cfg.out_channels} audio channels; "
                              f"YuE2 songs are stereo ({AUDIO_CHANNELS})")
    with torch.device("meta"):
        module = VAEDecoder(cfg)
    want = {n: tuple(p.shape) for n, p in module.named_parameters()}
    absent = [prefix + n for n in want if n not in dec]
    extra = [prefix + n for n in dec if n not in want]
    if absent or extra:
        parts = []
        if absent:
            parts.append(f"{len(absent)} decoder tensors missing, e.g. {absent[:3]}")
        if extra:
            parts.append(f"{len(extra)} tensors the YuE2 decoder does not have, e.g. {extra[:3]}")
        raise CheckpointError(f"{path}: not the YuE2 decoder's tensor set ({'; '.join(parts)})")
    for n, shape in want.items():
        got = tuple(dec[n][2].shape)
        if got != shape:
            raise CheckpointError(f"{path}: shape mismatch for {prefix}{n}: the decoder geometry read from the "
                                  f"first blocks needs {list(shape)}, the file has {list(got)}")
    return cfg


def _stored_name(name: str, layout: str) -> str:
    return ("vae." if layout == "comfy-prefixed" else "") + name


def check_values(names, get, path: str, layout: str = "vendor-file") -> None:
    """CheckpointError naming the VAE `path` and the tensor when a decoder tensor holds NaN/inf, or a weight-norm
    conv's `weight_v` has norm 0 for some channel along dim 0 — g·v/‖v‖ is then 0/0, NaN audio after
    a whole song's AR and NAR work —, or a snake's log-scale `alpha` is above SNAKE_LOG_MAX (exp overflows).
    `names`: the decoder parameter names ("decoder.…"); `get(name)` → its fp32
    tensor (read one at a time at open, the loaded state at load). `layout` spells the names as the file does."""
    from .checkpoint import all_finite
    names = set(names)
    for name in sorted(names):
        t = get(name)
        if not all_finite(t):
            bad = int((~torch.isfinite(t)).sum())
            raise DamagedWeightsError(f"VAE {path}: {_stored_name(name, layout)} holds NaN/inf ({bad:,} of its "
                                  f"{t.numel():,} values) — the file is damaged (download it again) or was saved "
                                  "from a diverged training run; a YuE2 VAE's weights are finite")
        if name.endswith(".alpha") and t.numel() and float(t.max()) > SNAKE_LOG_MAX:
            # a snake's frequency is exp(alpha): finite values past ~88 are inf in float32, and x·inf, sin(inf) NaN
            # audio — after a whole song's work (break-it review, stop 44)
            top = float(t.max())
            raise DamagedWeightsError(f"VAE {path}: {_stored_name(name, layout)} holds a log-scale snake frequency "
                                      f"of {top:.4g}; the decoder computes exp({top:.4g}), "
                                      f"{'inf' if top > 88.7 else 'far too large'} in float32, so the audio comes "
                                      f"out NaN — the file is damaged or not a trained VAE (a snake's log frequency "
                                      f"is a few units; at most {SNAKE_LOG_MAX:g} is accepted)")
        if name.endswith(".weight_v") and name[:-1] + "g" in names:
            # g·v/‖v‖ along dim 0 is computed as v·(g/‖v‖): finite when every channel's norm is finite and not tiny
            # and its factor g/‖v‖ is finite (v and g are finite, checked): then |v_i·g/‖v‖| ≤ |g|. A finite g
            # over a small but finite norm still overflows the factor (g 1e25 over ‖v‖ 4e-15: inf, review 43), so
            # the factor itself is bounded, with a margin for rounding and the device's own reduction order.
            g = get(name[:-1] + "g")
            if t.ndim >= 2 and g.numel() == t.shape[0]:
                norms = torch.linalg.vector_norm(t.flatten(1), dim=1)
                limit = torch.finfo(norms.dtype).max / 4
                factor = g.reshape(-1).abs().to(norms.dtype) / norms
                if (bool(torch.isfinite(norms).all()) and bool((norms > 1e-30).all())
                        and bool((factor < limit).all()) and bool((g.abs() < limit).all())):
                    continue
            if not bool(torch.isfinite(torch._weight_norm(t, g, 0)).all()):
                norms = torch.linalg.vector_norm(t.flatten(1).double(), dim=1)
                zero = torch.nonzero(norms == 0).flatten().tolist()
                what = (f"is all zero for {len(zero)} of its {t.shape[0]} channels along dim 0 (e.g. channel "
                        f"{zero[0]}): its norm is 0, so weight norm g·v/‖v‖ divides 0/0" if zero else
                        "makes weight norm g·v/‖v‖ non-finite")
                raise DamagedWeightsError(f"VAE {path}: {_stored_name(name, layout)} {what} — NaN audio. The file is "
                                      "damaged or not a trained VAE; every channel of a weight_v needs a nonzero "
                                      "finite norm")


def open_vae(path: str) -> VAEFile:
    """Open a YuE2 VAE: a vendor folder (config.json + model.safetensors or a shard index), a single safetensors with
    unprefixed `decoder.*` (+ optional `encoder.*`) tensors, or a file with `vae.`-prefixed tensors (a VAE-only file
    or a whole Comfy all-in-one checkpoint). Reads headers and JSON, then the decoder's values once per file
    version (`check_values`: a pass over the decoder tensors, before any song work).

    Raises CheckpointError (message names the file, what was found and what is accepted) when: the path does not
    exist; a file is not safetensors or is truncated; a folder has no config.json / a model_type other than
    "yue2_vae" / a sample_rate ≠ 48000, downsampling_ratio ≠ 1920, latent_dim ≠ 64 or audio_channels ≠ 2; only
    encoder tensors are present; the YuE2 decoder's tensors are missing (a VAE of another model) or incomplete; the
    decoder reads other than 64 latent channels, 1920 samples per frame or 2 audio channels; a decoder tensor is not
    float; a manifest's byte count differs from the file; a decoder tensor holds NaN/inf or a weight_v channel has
    norm 0 (`check_values`)."""
    if not isinstance(path, str) or not path:
        raise CheckpointError(f"VAE path must be a file or folder name, got {path!r}")
    if not os.path.exists(path):
        loop = os.path.islink(path)  # a link whose target is missing or loops (break-it finding: "does not exist")
        what = "is a symbolic link to nothing (a missing target or a loop)" if loop else "does not exist"
        raise CheckpointError(f"VAE not found: {path} {what} (a YuE2 VAE is a folder with config.json + "
                              "model.safetensors, or a .safetensors file)")
    kind = not_a_file(path)
    if kind is not None and kind != "a directory":  # a FIFO / device would block the header read
        raise CheckpointError(f"VAE {path} is {kind}, not a file (a YuE2 VAE is a folder with config.json + "
                              "model.safetensors, or a .safetensors file)")
    config, metadata, manifest = {}, {}, {}
    if os.path.isdir(path):
        config, tensors, files, manifest = _folder(path)
        layout = "vendor-folder"
        found = {k: (f, k, e) for k, (f, e) in tensors.items() if k.startswith(("decoder.", "encoder."))}
        if not found:
            sample = ", ".join(sorted(tensors)[:5]) or "no tensors at all"
            raise CheckpointError(f"{path}: its weights hold no decoder.* tensors (found {sample}); a YuE2 VAE "
                                  "folder's model.safetensors holds encoder.* and decoder.*")
        prefix = ""
    else:
        entries, metadata, _ = read_header(path)
        files = [path]
        layout, found = _decoder_keys({k: (path, e) for k, e in entries.items()}, path)
        prefix = "" if layout == "vendor-file" else "vae."
        if isinstance(metadata.get("release_variant"), str):
            config = {"release_variant": metadata["release_variant"]}
    cfg = _geometry(found, path, prefix)
    section, dec = decoder_section(config)
    said = dec.get("strides")  # checked by _check_config: ints multiplying to HOP, or absent
    have = [s for _, _, s in cfg.blocks]
    if said is not None and list(reversed(said)) != have:  # stop-54 review: the config's order was never compared
        raise CheckpointError(f"{path}: config.json {section}.strides {said} (encoder order; the decoder runs them "
                              f"reversed, {'·'.join(map(str, reversed(said)))}) disagree with the weights, whose "
                              f"transposed convolutions have strides {'·'.join(map(str, have))}: the config and "
                              "the weights are of different VAEs — download the folder again")
    dtypes = dict(Counter(e.dtype for _, _, e in found.values()))
    sources = {k: (f, stored) for k, (f, stored, _) in found.items() if k.startswith("decoder.")}
    key, strict = _file_key(files), _stat_key(files)
    if strict not in _FINITE:
        with contextlib.ExitStack() as stack:
            handles = {}

            def read(name):  # one tensor at a time, as fp32
                file, stored = sources[name]
                if file not in handles:
                    handles[file] = stack.enter_context(open_tensors(file))
                return handles[file].get_tensor(stored).to(torch.float32)

            check_values(sources, read, path, layout)
        _FINITE.add(strict)
    return VAEFile(path=path, layout=layout, variant=_variant(config), config=cfg, dtypes=dtypes,
                   key=key, weights=tuple(files),
                   encoder=any(k.startswith("encoder.") for k in found),
                   sources=sources,
                   manifest=manifest, metadata=dict(metadata))
