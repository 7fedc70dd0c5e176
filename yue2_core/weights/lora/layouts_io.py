"""Opening an adapter: a `.safetensors` file, a torch `.pt` file (weights-only load, never arbitrary pickle), or a
PEFT directory; and the `adapter_config.json` sidecar (weights_and_lora.md §1.1 H). The container is recognised by its
first bytes, never by the file name. Everything wrong with the container is an `AdapterError` naming the file."""
from __future__ import annotations

import json
import math
import os
import pickle
import re
import stat
import warnings
from dataclasses import dataclass, field

import torch

from ...errors import AdapterError, CheckpointError, json_number_too_long, json_too_large
from ..checkpoint import not_a_file, open_tensors, read_header

SIDECAR = "adapter_config.json"
# a single file given by name reads the adapter_config.json beside it only under these names (PEFT's
# save_pretrained); a folder always reads its own
# the weights files a PEFT adapter_config.json is read beside (weights_and_lora.md §1.1 H: PEFT saves
# adapter_model.*; published YuE2 adapters also ship `lora.safetensors` + adapter_config.json folders)
PEFT_FILE_NAMES = ("adapter_model.safetensors", "adapter_model.bin", "lora.safetensors")
# file names a PEFT directory keeps its weights under (§1.1 H), in the order they are looked for
DIR_WEIGHTS = ("adapter_model.safetensors", "lora.safetensors", "adapter_model.bin")
# Mothersuperior `.pt`: per layer A, B of q, k, v, o, gate, up, down in this order (§1.1 F; order matters)
MS_PT_ORDER = ("nar_self_attn.q_proj", "nar_self_attn.k_proj", "nar_self_attn.v_proj", "nar_self_attn.o_proj",
               "nar_mlp.gate_proj", "nar_mlp.up_proj", "nar_mlp.down_proj")


@dataclass
class Source:
    """One opened adapter file: `tensors` (key → tensor, copied out of the file), `metadata` (safetensors
    `__metadata__`, str → str), `sidecar` (the parsed adapter_config.json beside it or None), `container`
    "safetensors" | "pt" | "pt-mothersuperior" (the `{"lora": [...], "rank", "io"}` dict, already flattened into
    Mothersuperior raw NAR keys), `files` every file read."""
    path: str
    tensors: dict
    metadata: dict
    container: str
    sidecar: dict | None = None
    files: list = field(default_factory=list)


def open_source(path: str) -> Source:
    """Open `path` (file or PEFT directory). Raises AdapterError for a missing path, a path that is a FIFO / device /
    other non-regular file (named before anything is opened: reading one would block), a directory without weights
    (or whose only `.safetensors` entry is not a file), a file that is neither safetensors nor a torch zip/pickle, a
    truncated file, a `.pt` that needs unrestricted pickle, a `.pt` holding something other than tensors, a
    malformed adapter_config.json (also one that is a directory or a FIFO), or model weights rather than an adapter
    — a checkpoint file or vendor model folder, a VAE file or folder (`refuse_model_weights`, said with the option
    they belong to).

    The container: a file whose first 8 bytes and header parse as safetensors IS safetensors (whatever its first
    byte: a header length such as 0x…80 must not send it to torch.load, which would lose `__metadata__`); only
    otherwise a zip (`PK`) or pickle (`0x80`) start is read as a torch file.

    adapter_config.json (§1.1 H) is read when `path` is a folder, or a file named as PEFT saves its weights
    (PEFT_FILE_NAMES: adapter_model.safetensors / .bin, lora.safetensors) — never beside a file of another name, so an
    unrelated sidecar in a shared loras folder cannot change another adapter's scale."""
    path = os.fspath(path)
    kind = not_a_file(path)
    if os.path.isdir(path):
        _refuse_model_folder(path)
        weights = _dir_weights(path)
        sidecar_path = os.path.join(path, SIDECAR)
    elif kind is not None:
        raise AdapterError(f"adapter {path} is {kind}, not a file (an adapter is a .safetensors file, a torch .pt "
                           f"file or a PEFT folder)")
    elif os.path.isfile(path):
        weights = path
        sidecar_path = (os.path.join(os.path.dirname(os.path.abspath(path)), SIDECAR)
                        if os.path.basename(path) in PEFT_FILE_NAMES else None)
    else:
        raise AdapterError(f"adapter not found: {path}")
    try:
        header = read_header(weights)
    except CheckpointError as exc:
        try:
            with open(weights, "rb") as f:
                magic = f.read(4)
        except OSError as err:  # unreadable (permissions, I/O): say so, not a traceback (break-it finding)
            raise AdapterError(f"cannot read adapter {weights}: {err.strerror or err}") from None
        if magic[:2] == b"PK" or magic[:1] == b"\x80":
            src = _open_pt(weights)
            refuse_model_weights(weights, src.tensors)
        else:
            raise AdapterError(f"adapter {exc} (an adapter is a .safetensors file, a torch .pt file or a PEFT "
                               f"folder)") from None
    else:
        refuse_model_weights(weights, header[0])  # from the header: a 7 GB checkpoint is never read as an adapter
        src = _open_safetensors(weights, header)
    if sidecar_path is not None and os.path.lexists(sidecar_path):
        what = not_a_file(sidecar_path)
        if what is not None:
            raise AdapterError(f"{sidecar_path} is {what}, not a file; a PEFT adapter's {SIDECAR} is a JSON file "
                               f"(r, lora_alpha, …) — remove or replace it")
        src.sidecar = read_sidecar(sidecar_path)
        src.files.append(sidecar_path)
    return src


_ADAPTER_ROLE = re.compile(r"\.(lora_[A-Za-z]+|lokr_\w+|hada_\w+|alpha|diff|diff_b|dora_scale)(\.|$)")
_VAE_PREFIXES = ("encoder.", "decoder.", "vae.encoder.", "vae.decoder.")
_USE = {"checkpoint": "give it as --checkpoint (nodes: YuE2 Checkpoint Loader)",
        "vae": "give it as --vae (nodes: YuE2 VAE Loader)"}


def weights_kind(keys) -> tuple[str, str] | None:
    """What a file of model weights (not an adapter) is, from its tensor names (a safetensors header's keys):
    ("checkpoint", why) for a Comfy-Org all-in-one file (the tokenizer tensor, or transformer weights beside a
    `vae.decoder.` tree), ("model", why) for plain Linear / norm / embedding weights without a single adapter role
    (the vendor's model.safetensors or one of its shards), ("vae", why) for a VAE file (only `encoder.` / `decoder.`
    tensors, optionally under `vae.`); None for anything else (adapters, other models' files)."""
    keys = sorted(keys)
    if not keys:
        return None
    if "text_encoders.yue2_tokenizer_json" in keys:
        return "checkpoint", "it holds the tokenizer"
    if all(k.startswith(_VAE_PREFIXES) for k in keys):
        return "vae", f"only encoder / decoder tensors, such as {keys[0]}"
    if any(k.startswith("vae.decoder.") for k in keys):
        return "checkpoint", "it holds the VAE beside other weights"
    if any(_ADAPTER_ROLE.search(k) for k in keys):
        return None
    plain = [k for k in keys if k.endswith(("embed_tokens.weight", "_proj.weight", "layernorm.weight",
                                            "lm_head.weight"))]
    return ("model", f"plain weights such as {plain[0]} and no LoRA factors") if plain else None


def refuse_model_weights(path: str, keys) -> None:
    """AdapterError saying what `path` is and which option takes it when its tensor names are model weights, not an
    adapter (`weights_kind`): a checkpoint (--checkpoint), the vendor's model weights (their folder as
    --checkpoint), a VAE (--vae) — a break-it finding (stop 40): they got "norm diffs are not supported" or "not a
    YuE2 adapter"."""
    kind = weights_kind(keys)
    if kind is None:
        return
    what, why = kind
    if what == "checkpoint":
        raise AdapterError(f"{path} is a whole YuE2 checkpoint ({why}), not an adapter: {_USE['checkpoint']}, and an "
                           "adapter file as --lora")
    if what == "model":
        raise AdapterError(f"{path} is a model checkpoint's weights, not an adapter ({why}; the vendor's "
                           "model.safetensors or a shard of it): give its model folder as --checkpoint (nodes: YuE2 "
                           "Checkpoint Loader), and an adapter file as --lora")
    raise AdapterError(f"{path} is a VAE, not an adapter ({why}): {_USE['vae']}, and an adapter file as --lora")


def _refuse_model_folder(path: str) -> None:
    """AdapterError for a folder whose config.json says it is a YuE2 model (model_type "yue2": the vendor's
    m-a-p/YuE2-3B layout) or a YuE2 VAE (model_type "yue2_vae") and that holds none of the PEFT weights names —
    before any of its files is read (a model folder holds gigabytes)."""
    from ..vendor import MODEL_TYPE, VAE_MODEL_TYPE, folder_model_type
    if any(os.path.lexists(os.path.join(path, name)) for name in DIR_WEIGHTS):
        return
    model_type = folder_model_type(path)
    if model_type == MODEL_TYPE:
        raise AdapterError(f"{path} is a YuE2 model checkpoint folder (config.json model_type \"{MODEL_TYPE}\", the "
                           f"m-a-p/YuE2-3B layout), not an adapter: {_USE['checkpoint']}, and an adapter file or "
                           "PEFT folder as --lora")
    if model_type == VAE_MODEL_TYPE:
        raise AdapterError(f"{path} is a YuE2 VAE folder (config.json model_type \"{VAE_MODEL_TYPE}\"), not an "
                           f"adapter: {_USE['vae']}, and an adapter file or PEFT folder as --lora")


def read_state(path: str, _seen: tuple = ()) -> tuple:
    """What a node fingerprints of the adapter at `path` (`_path_state` of every file `read_adapter` reads
    or would read there): the file itself — for a folder every file in it, which covers the weights file it picks
    (a lora.safetensors added beside custom.safetensors) and its adapter_config.json —, the adapter_config.json beside
    a file named as PEFT saves its weights (`()` while there is none), and the FL companion the weights file's
    metadata `acoustic_adapter` names, with its own. Any of them added, changed, replaced or removed changes the
    result (stop 40 review: only the main file counted, so a sidecar added later left the node's cached adapter in
    place, and `render` then refused the song). Each file is `_stat_state` — size, mtime, inode and ctime, so an
    in-place replacement with the same size and a preserved mtime (`cp -p`) is seen too; a folder's entries are
    each their own, so one unreadable entry (a symlink loop) marks only itself. Never raises: what cannot be read
    is `()` or an `("unreadable", errno)` entry (reading it says why)."""
    path = os.fspath(path)
    state: list = [(os.path.basename(path), _path_state(path))]
    try:
        if os.path.isdir(path):
            weights = _dir_weights(path)
        elif os.path.isfile(path):
            weights = path
            if os.path.basename(path) in PEFT_FILE_NAMES:
                sidecar = os.path.join(os.path.dirname(os.path.abspath(path)), SIDECAR)
                state.append((SIDECAR, _path_state(sidecar) if os.path.lexists(sidecar) else ()))
        else:
            return tuple(state)
        companion = read_header(weights)[1].get("acoustic_adapter")
    except (AdapterError, CheckpointError, OSError):
        return tuple(state)
    if companion:
        folder = os.path.dirname(os.path.abspath(weights))
        target = os.path.normpath(os.path.join(folder, companion))
        real = os.path.realpath(folder)
        try:
            inside = os.path.commonpath([real, os.path.realpath(target)]) == real
        except ValueError:  # another drive (Windows): outside
            inside = False
        if inside and target not in _seen and target != os.path.abspath(path):  # as `read_adapter` follows it
            state.append((companion, read_state(target, (*_seen, os.path.abspath(path)))))
    return tuple(state)


def _stat_state(st: os.stat_result) -> tuple:
    """What `read_state` compares of one file: size, mtime, inode and ctime (ns). `checkpoint.file_state` keeps
    (size, mtime) for its other users; a `cp -p` over an adapter keeps both, but changes the ctime."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def _path_state(path: str) -> tuple:
    """`_stat_state` of a file, or of every entry directly in a folder by name (regular files, links followed; an
    entry whose stat fails — a symlink loop, a dangling link — is `(name, "unreadable", errno)`, so the others
    still count); `()` when `path` itself cannot be read."""
    try:
        if os.path.isdir(path):
            out = []
            for e in sorted(os.scandir(path), key=lambda e: e.name):
                try:
                    st = e.stat()
                except OSError as exc:
                    out.append((e.name, "unreadable", exc.errno))
                    continue
                if stat.S_ISREG(st.st_mode):
                    out.append((e.name, *_stat_state(st)))
            return tuple(out)
        return _stat_state(os.stat(path))
    except OSError:
        return ()


def _dir_weights(path: str) -> str:
    for name in DIR_WEIGHTS:
        candidate = os.path.join(path, name)
        if os.path.lexists(candidate):
            what = not_a_file(candidate)
            if what is not None:
                raise AdapterError(f"adapter folder {path}: {name} is {what}, not a file")
            return candidate
    found = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    files = [n for n in found if not_a_file(os.path.join(path, n)) is None]
    if len(found) == 1 and len(files) == 1:
        return os.path.join(path, found[0])
    if len(found) == 1:
        raise AdapterError(f"adapter folder {path}: its only .safetensors entry, {found[0]}, is "
                           f"{not_a_file(os.path.join(path, found[0]))}, not a file; expected one of "
                           f"{', '.join(DIR_WEIGHTS)} (a PEFT folder) or a single .safetensors file")
    raise AdapterError(f"adapter folder {path}: expected one of {', '.join(DIR_WEIGHTS)} (a PEFT folder) or a single "
                       f".safetensors file; found {', '.join(found) if found else 'no weight file'}")


def _open_safetensors(path: str, header: tuple) -> Source:
    entries, metadata, _ = header
    try:
        with open_tensors(path) as f:
            tensors = {k: f.get_tensor(k).clone() for k in entries}  # owned, not a view of the memory map
    except CheckpointError as exc:
        raise AdapterError(f"adapter {exc} (an adapter is a .safetensors file, a torch .pt file or a PEFT "
                           f"folder)") from None
    return Source(path, tensors, {str(k): str(v) for k, v in metadata.items()}, "safetensors", files=[path])


def _open_pt(path: str) -> Source:
    try:  # an open file, not the path: torch.load hands any path ending in .safetensors to the safetensors reader
        with open(path, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch's note on a foreign pickle protocol: ours says more
            obj = torch.load(f, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        raise AdapterError(f"adapter {path}: this .pt file holds Python objects beyond tensors, which a weights-only "
                           f"load refuses (we never unpickle arbitrary code): {str(exc).splitlines()[0][:200]}. "
                           f"Convert it to .safetensors.") from None
    except Exception as exc:  # truncated, damaged, or no torch file at all: named, never a traceback
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise AdapterError(f"adapter {path}: not a readable torch file (truncated or damaged?): {first}") from None
    if isinstance(obj, dict) and "lora" in obj:
        return Source(path, _dense(path, _ms_pt_tensors(path, obj)),
                      {"format": "pt", "rank": str(obj.get("rank", ""))}, "pt-mothersuperior", files=[path])
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not (isinstance(obj, dict) and obj and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                 for k, v in obj.items())):
        raise AdapterError(f"adapter {path}: a .pt adapter must hold a {{name: tensor}} dict or Mothersuperior's "
                           f"{{'lora': [...], 'rank', 'io'}} dict; found {type(obj).__name__}")
    return Source(path, _dense(path, dict(obj)), {}, "pt", files=[path])


def _dense(path: str, tensors: dict) -> dict:
    """`tensors` when every one is an ordinary dense tensor with data; AdapterError naming the first that is sparse
    (COO / CSR / CSC / BSR), meta (no data), quantized or nested — a torch file can hold those, safetensors cannot."""
    for key, t in tensors.items():
        kind = ("a meta tensor (shape only, no data)" if t.is_meta else
                f"a sparse tensor (layout {t.layout})" if t.layout is not torch.strided else
                "a quantized tensor" if t.is_quantized else
                "a nested tensor" if t.is_nested else None)
        if kind:
            raise AdapterError(f"adapter {path}: {key} is {kind}; adapter factors must be dense float tensors with "
                               "data (save them with .to_dense() / real values)")
    return tensors


def _ms_pt_tensors(path: str, obj: dict) -> dict:
    """Mothersuperior `nar_lora_joint_v4.pt` (§1.1 F) → the same keys as its safetensors form:
    `layers.N.nar_self_attn.q_proj.lora_A` … and `vae2llm.weight` / `.bias`, `llm2vae.weight` / `.bias`.
    `lora` is [A, B] per projection, layer-major, projections in MS_PT_ORDER (flat, or as [A, B] pairs)."""
    flat = []
    for item in obj["lora"] if isinstance(obj["lora"], (list, tuple)) else ():
        flat += list(item) if isinstance(item, (list, tuple)) else [item]
    per_layer = 2 * len(MS_PT_ORDER)
    if not flat or len(flat) % per_layer or not all(isinstance(t, torch.Tensor) for t in flat):
        raise AdapterError(f"adapter {path}: Mothersuperior .pt 'lora' must be a list of tensors, A and B of "
                           f"{', '.join(MS_PT_ORDER)} per layer ({per_layer} a layer); found "
                           f"{len(flat)} entries")
    tensors = {}
    for i in range(0, len(flat), 2):
        layer, proj = divmod(i // 2, len(MS_PT_ORDER))
        tensors[f"layers.{layer}.{MS_PT_ORDER[proj]}.lora_A"] = flat[i]
        tensors[f"layers.{layer}.{MS_PT_ORDER[proj]}.lora_B"] = flat[i + 1]
    io = obj.get("io") or {}
    if not isinstance(io, dict):
        raise AdapterError(f"adapter {path}: Mothersuperior .pt 'io' must be a dict {{module: {{weight, bias}}}}")
    for module, parts in io.items():
        if not isinstance(parts, dict) or not all(isinstance(t, torch.Tensor) for t in parts.values()):
            raise AdapterError(f"adapter {path}: Mothersuperior .pt io[{module!r}] must be {{'weight': tensor, "
                               f"'bias': tensor}}")
        for name, t in parts.items():
            tensors[f"{module}.{name}"] = t
    rank = obj.get("rank")
    if type(rank) is not int or rank < 1:
        raise AdapterError(f"adapter {path}: Mothersuperior .pt 'rank' must be a positive integer; found {rank!r}")
    return tensors


def read_sidecar(path: str) -> dict:
    """Parse and check adapter_config.json (§1.1 H). Returns the dict with `r` (int ≥ 1), `lora_alpha` (finite
    float > 0; PEFT's default 8 when absent; `rank` / `alpha` read for them when "r" is absent), `use_rslora`, `use_dora`, `fan_in_fan_out` (bools),
    `rank_pattern` {pattern: int ≥ 1}, `alpha_pattern` {pattern: float}. Raises AdapterError for a file that is not
    JSON, not an object, a `peft_type` other than LORA, or any field of the wrong type or range."""
    where = f"{path}"
    if too_large := json_too_large(path):
        raise AdapterError(f"{where} {too_large}")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad UTF-8 / JSON, a number past the digit cap
        fault = json_number_too_long(exc) or str(exc).splitlines()[0][:120]
        raise AdapterError(f"{where}: not a readable JSON file ({fault}); a PEFT "
                           f"adapter_config.json is a JSON object with at least \"r\" and \"lora_alpha\"") from None
    if not isinstance(cfg, dict):
        raise AdapterError(f"{where}: expected a JSON object, found {type(cfg).__name__}")
    peft_type = cfg.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise AdapterError(f"{where}: peft_type {_short(peft_type)} is not a LoRA; only peft_type \"LORA\" is read")
    if "r" not in cfg and "rank" in cfg:  # another trainer's sidecar spelling (rank / alpha): read as PEFT's
        cfg = {**cfg, "r": cfg["rank"], **({"lora_alpha": cfg["alpha"]} if "alpha" in cfg else {})}
    r = cfg.get("r")
    if type(r) is not int or r < 1:
        raise AdapterError(f"{where}: \"r\" must be a positive integer; found {_short(r)}")
    alpha = cfg.get("lora_alpha", 8)
    if not _positive_number(alpha):
        raise AdapterError(f"{where}: \"lora_alpha\" must be a positive finite number; found {_short(alpha)}")
    for flag in ("use_rslora", "use_dora", "fan_in_fan_out"):
        if type(cfg.get(flag, False)) is not bool:
            raise AdapterError(f"{where}: \"{flag}\" must be true or false; found {_short(cfg.get(flag))}")
    for name, check, what in (("rank_pattern", lambda v: type(v) is int and v >= 1, "a positive integer"),
                              ("alpha_pattern", _positive_number, "a positive finite number")):
        pattern = cfg.get(name) or {}
        if not isinstance(pattern, dict) or not all(isinstance(k, str) and check(v) for k, v in pattern.items()):
            raise AdapterError(f"{where}: \"{name}\" must map module names to {what}; found {str(pattern)[:200]}")
        for key in pattern:
            if len(key) > PATTERN_KEY_MAX or not PATTERN_KEY.fullmatch(key):
                raise AdapterError(f"{where}: \"{name}\" key {key[:80]!r}{'…' if len(key) > 80 else ''} is not a "
                                   f"module name; only module names or their dotted suffixes are read (such as "
                                   f"\"q_proj\" or \"model.layers.3.self_attn.q_proj\", at most "
                                   f"{PATTERN_KEY_MAX} characters) — regular expressions are not")
    return {**cfg, "r": r, "lora_alpha": float(alpha), "use_rslora": cfg.get("use_rslora", False),
            "use_dora": cfg.get("use_dora", False), "fan_in_fan_out": cfg.get("fan_in_fan_out", False),
            "rank_pattern": cfg.get("rank_pattern") or {}, "alpha_pattern": cfg.get("alpha_pattern") or {}}


# rank_pattern / alpha_pattern keys: module names or dotted suffixes of them, matched literally (never compiled as
# regular expressions: a crafted pattern could backtrack for hours). PEFT's own rule for such keys: a key matches the
# module whose name equals it or ends with "." + key.
PATTERN_KEY_MAX = 200
PATTERN_KEY = re.compile(r"[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+){0,30}")


def pattern_value(patterns: dict, name: str, default):
    """PEFT rank_pattern / alpha_pattern lookup: the value of the first key (file order) equal to the module `name`
    or to a dotted suffix of it (`q_proj` matches `model.layers.0.self_attn.q_proj`, `layers.0.self_attn.q_proj` too;
    `proj` does not); `default` when none matches."""
    for key, value in patterns.items():
        if name == key or name.endswith("." + key):
            return value
    return default


def _positive_number(v) -> bool:
    """An int or float (not bool) > 0 that is finite as a float: an int too large for one (400 digits) is not."""
    try:
        return type(v) in (int, float) and math.isfinite(float(v)) and v > 0
    except OverflowError:
        return False


def _short(value) -> str:
    """repr(value) cut to 40 characters for a message (a 400-digit number)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}…{text[-8:]} ({len(text)} characters)"
