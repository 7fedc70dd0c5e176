"""The vendor's split checkpoint as a model source: a m-a-p/YuE2-3B model folder plus its m-a-p/YuE2-Vae folder
(weights_and_lora.md §4–§5; runtime.md §4.3, §7.2).

A vendor folder holds `config.json` (model_type "yue2"), `model.safetensors` or `model.safetensors.index.json` +
shards, `qwen.tiktoken` and `weights_manifest.json`; the VAE folder `config.json` (model_type "yue2_vae"),
`model.safetensors` (unprefixed F32 `encoder.*` / `decoder.*`) and its own manifest. `inspect_vendor` turns them into
the same `CheckpointInfo` as a Comfy-Org file: `entries` under Comfy names (q‖k‖v and gate‖up as virtual fused
entries, the one `model.norm.weight` feeding both experts' final norm, `lm_head.weight` as `model.lm_head`, `nar_*`
under the NAR tree, the VAE under `vae.`) and a `SplitSource` that reads each from the vendor tensors, so the
rest of the engine does not know which layout it loaded.

    is_vendor_folder(path)            → bool
    inspect_vendor(folder, vae_path, own_vae) → CheckpointInfo (layout "vendor"; own_vae: whether its VAE is needed)
    load_vendor_tokenizer(info)       → TiktokenTokenizer (same ids as the embedded JSON tokenizer)
    find_vae_folder(folder, vae_path) → the VAE folder (vae/, a yue2_vae sibling, vae_path, the HF cache)
    vae_folder_sample(folder)         → the sample hash of a VAE folder's weights (what a song records of it)
    recorded_vae_folder(record, folder, search_dirs) → the VAE folder a song records, found again by its sample hash
    hf_snapshot(repo_id)              → a cached snapshot folder of m-a-p/YuE2-3B or -Vae (never downloads)
    verify_file(path, expected)       → manifest size + sha256 check, remembered per (size, mtime_ns, inode)
    vendor_pairs(layers)              → [(Comfy key, (vendor keys …))], the key table (both directions use it)
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from pathlib import Path

from ..errors import (CheckpointError, DamagedWeightsError, DuplicateJSONKey, TokenizerError, json_number_too_long,
                      json_too_large, unique_keys)
from ..switches import flag
from .checkpoint import (AR, NAR, VAE, SplitSource, TensorEntry, build_info, check_entries, content_sample,
                         read_header)

MODEL_REPO = "m-a-p/YuE2-3B"  # vendor defaults (weights_and_lora.md §4, VEN-P)
VAE_REPO = "m-a-p/YuE2-Vae"
MODEL_TYPE, VAE_MODEL_TYPE = "yue2", "yue2_vae"
CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
TIKTOKEN, MANIFEST = "qwen.tiktoken", "weights_manifest.json"
HASH_SWITCH = "YUE2_VERIFY_HASHES"

# Comfy leaf under `…model.layers.N.` → vendor leaves under `model.layers.N.`, rows concatenated in this order
# (q ‖ k ‖ v, gate ‖ up; weights_and_lora.md §1.0, §4 key table).
_AR_LEAVES = {
    "input_layernorm.weight": ("input_layernorm.weight",),
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "self_attn.o_proj.weight": ("self_attn.o_proj.weight",),
    "self_attn.q_norm.weight": ("self_attn.q_norm.weight",),
    "self_attn.k_norm.weight": ("self_attn.k_norm.weight",),
    "post_attention_layernorm.weight": ("post_attention_layernorm.weight",),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.down_proj.weight": ("mlp.down_proj.weight",),
}


def _nar_leaf(vendor_leaf: str) -> str:
    """AR vendor leaf → the NAR expert's vendor leaf (`nar_pre_mlp_layernorm` is the post-attention norm)."""
    if vendor_leaf == "post_attention_layernorm.weight":
        return "nar_pre_mlp_layernorm.weight"
    return "nar_" + vendor_leaf


_NAR_GLOBALS = ("vae2llm.weight", "vae2llm.bias", "llm2vae.weight", "llm2vae.bias", "time_embedder.mlp.0.weight",
                "time_embedder.mlp.0.bias", "time_embedder.mlp.2.weight", "time_embedder.mlp.2.bias",
                "latent_pos_embed.pe")


def vendor_pairs(layers: int) -> list[tuple[str, tuple[str, ...]]]:
    """Every LM tensor as (Comfy key, vendor keys whose rows it concatenates), in vendor file order: embeddings,
    per layer the AR then the NAR leaves, the shared final norm (listed twice: AR and NAR Comfy keys), lm_head, the
    NAR's own modules. 461 Comfy keys ← 628 vendor tensors for 28 layers (§4 counts)."""
    pairs = [(AR + "model.embed_tokens.weight", ("model.embed_tokens.weight",))]
    for i in range(layers):
        for leaf, vendor in _AR_LEAVES.items():
            pairs.append((f"{AR}model.layers.{i}.{leaf}", tuple(f"model.layers.{i}.{v}" for v in vendor)))
        for leaf, vendor in _AR_LEAVES.items():
            pairs.append((f"{NAR}model.layers.{i}.{leaf}",
                          tuple(f"model.layers.{i}.{_nar_leaf(v)}" for v in vendor)))
    pairs += [(AR + "model.norm.weight", ("model.norm.weight",)), (NAR + "model.norm.weight", ("model.norm.weight",)),
              (AR + "model.lm_head.weight", ("lm_head.weight",))]
    pairs += [(NAR + name, (name,)) for name in _NAR_GLOBALS]
    return pairs


# ---------------------------------------------------------------------------------------------------------------------
# folders and configs
# ---------------------------------------------------------------------------------------------------------------------

def _json_text(path: Path) -> str:
    """The text of the JSON file `path`, refused without opening it when it is not a regular file (a FIFO or a
    device would block the read forever — break-it review, stop 40: a `config.json` FIFO in a folder given as
    --lora or in ComfyUI's vae folder hung `generate` / `render`). FileNotFoundError when absent; CheckpointError
    naming what it is otherwise."""
    from .checkpoint import not_a_file
    what = not_a_file(str(path))
    if what is not None:
        raise CheckpointError(f"{path} is {what}, not a file: a YuE2 folder's JSON files are regular files")
    if too_large := json_too_large(path):
        raise CheckpointError(f"{path} {too_large}")
    return path.read_text("utf-8")


def read_config(folder, expect: str = MODEL_TYPE) -> dict:
    """`folder/config.json` as a dict whose model_type is `expect`. CheckpointError naming the file otherwise."""
    path = Path(folder) / CONFIG
    what = "m-a-p/YuE2-3B" if expect == MODEL_TYPE else "m-a-p/YuE2-Vae"
    try:
        config = json.loads(_json_text(path))
    except FileNotFoundError:
        raise CheckpointError(f"{folder} is a folder without {CONFIG}: a YuE2 vendor folder ({what}) has one with "
                              f"model_type {expect!r}") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        if too_long := json_number_too_long(exc):
            raise CheckpointError(f"{path} holds {too_long}; a {what} folder's {CONFIG} is a JSON "
                                  f"object with model_type {expect!r}") from None
        raise CheckpointError(f"{path} cannot be read as JSON ({type(exc).__name__}); a {what} folder's "
                              f"{CONFIG} is a JSON object with model_type {expect!r}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} is not a JSON object; a {what} folder's {CONFIG} is one with model_type "
                              f"{expect!r}")
    if config.get("model_type") != expect:
        if (Path(folder) / "result.json").is_file():  # break-it finding: a song folder given as the model
            raise CheckpointError(f"{folder} is a song folder (it holds result.json), not a model: re-render it with "
                                  f"`python -m yue2_core render {folder}`; --checkpoint takes a YuE2 checkpoint "
                                  "file or the vendor's model folder")
        # own-weights review (stop 49): the other YuE2 folder given for this one is named with its option
        hint = {VAE_MODEL_TYPE: ": it is a YuE2 VAE folder — give it as --vae (nodes: YuE2 VAE Loader), and the "
                                "model as --checkpoint",
                MODEL_TYPE: ": it is the vendor's YuE2-3B model folder — give it as --checkpoint (nodes: YuE2 "
                            "Checkpoint Loader)"}.get(config.get("model_type"), "")
        raise CheckpointError(f"{path} is the config of another model (model_type {_show(config.get('model_type'))}); "
                              f"a {what} folder has model_type {expect!r}{hint}")
    return config


def folder_model_type(folder) -> str | None:
    """The model_type of `folder/config.json` ("yue2", "yue2_vae", another model's), None without a readable one."""
    try:
        config = json.loads(_json_text(Path(folder) / CONFIG))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, CheckpointError):
        return None
    return config.get("model_type") if isinstance(config, dict) else None


def is_vendor_folder(path) -> bool:
    """True for a folder whose config.json says model_type "yue2" (files are checked by `inspect_vendor`)."""
    return Path(path).is_dir() and folder_model_type(path) == MODEL_TYPE


def hf_cache_dir() -> str:
    """The Hugging Face hub cache, read from the environment at call time (HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE,
    HF_HOME/hub) and else huggingface-hub's default."""
    for env in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(env):
            return os.environ[env]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    from huggingface_hub import constants
    return constants.HF_HUB_CACHE


def hf_snapshot(repo_id: str, cache_dir: str | None = None) -> Path | None:
    """The snapshot folder of `repo_id` (a model repo) in the Hugging Face cache, found with huggingface-hub's cache
    API — never a download: the revision `refs/main` points to (`try_to_load_from_cache`), else, when the repo is in
    the cache under pinned revisions only, the most recently modified snapshot (`scan_cache_dir`). Only a snapshot
    with a config.json counts. None when the cache or the repo is absent (or huggingface-hub is not installed)."""
    cache_dir = cache_dir or hf_cache_dir()
    try:
        from huggingface_hub import scan_cache_dir, try_to_load_from_cache
        hit = try_to_load_from_cache(repo_id, CONFIG, cache_dir=cache_dir)
        if isinstance(hit, str) and os.path.isfile(hit):
            return Path(hit).parent
        if not (Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))).is_dir():
            return None  # not cached: skip scanning the whole cache
        cache = scan_cache_dir(cache_dir)
    except Exception:  # CacheNotFound, an unreadable folder, no huggingface-hub: no cached snapshot
        return None
    for repo in cache.repos:
        if repo.repo_id != repo_id or repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified), reverse=True):
            if (Path(rev.snapshot_path) / CONFIG).is_file():
                return Path(rev.snapshot_path)
    return None


def hf_download_note(folder, instead: str = "give another checkpoint") -> str:
    """For a folder that is a snapshot in the Hugging Face cache (…/models--ORG--NAME/snapshots/REVISION): what to
    add to "it lacks its weights" — that the download into the cache did not finish (the partly written
    `blobs/*.incomplete` files, counted), the command that finishes it, and `instead`; "" for any other folder.
    Own-weights review, stop 58: an interrupted download of m-a-p/YuE2-3B, which the checkpoint search takes from
    the cache, was told to put the weights "next to config.json" inside the cache."""
    snap = Path(os.path.abspath(folder))
    repo_dir = snap.parent.parent
    if snap.parent.name != "snapshots" or not repo_dir.name.startswith("models--"):
        return ""
    repo = "/".join(repo_dir.name[len("models--"):].split("--"))
    try:
        partial = [f for f in (repo_dir / "blobs").iterdir() if f.name.endswith(".incomplete")]
        written = sum(f.stat().st_size for f in partial)
    except OSError:
        partial, written = [], 0
    got = (f" ({len(partial)} file(s) partly downloaded, {written / 1e6:,.1f} MB written, in "
           f"{repo_dir / 'blobs'})" if partial else "")
    return (f" — it is a snapshot of {repo} in the Hugging Face cache whose download did not finish{got}: finish it "
            f"with `hf download {repo}` (huggingface-hub's command; `huggingface-cli download {repo}` in older "
            f"versions), or {instead}")


def _vae_folders(folder):
    """The VAE folders of vendor model `folder` in the order `find_vae_folder` prefers them: `folder/vae`, the
    sibling folders whose config.json has model_type "yue2_vae" (release_variant "standard" first, then by name),
    the Hugging Face cache of m-a-p/YuE2-Vae (looked at only when the earlier ones are used up)."""
    folder = Path(folder)
    if folder_model_type(folder / "vae") == VAE_MODEL_TYPE:
        yield folder / "vae"
    siblings = []
    try:
        for d in sorted(folder.resolve().parent.iterdir()):
            if d.is_dir() and d != folder.resolve() and folder_model_type(d) == VAE_MODEL_TYPE:
                variant = read_config(d, VAE_MODEL_TYPE).get("release_variant")
                siblings.append((variant != "standard", d.name, d))
    except OSError:
        pass
    for *_, d in sorted(siblings):
        yield d
    cached = hf_snapshot(VAE_REPO)
    if cached is not None and folder_model_type(cached) == VAE_MODEL_TYPE:
        yield cached


def find_vae_folder(folder, vae_path=None) -> Path:
    """The VAE folder of vendor model `folder`: `vae_path` when given, else `folder/vae`, else a sibling folder whose
    config.json has model_type "yue2_vae" (release_variant "standard" first), else the Hugging Face cache of
    m-a-p/YuE2-Vae. CheckpointError saying where it looked when none is found."""
    if vae_path is not None:
        read_config(vae_path, VAE_MODEL_TYPE)
        return Path(vae_path)
    folder = Path(folder)
    found = next(_vae_folders(folder), None)
    if found is not None:
        return found
    raise CheckpointError(f"no VAE folder for the vendor model {folder}: looked for {folder / 'vae'}, a folder beside "
                          f"it whose {CONFIG} has model_type {VAE_MODEL_TYPE!r}, and {VAE_REPO} in the Hugging Face "
                          f"cache ({hf_cache_dir()}). Download {VAE_REPO} next to the model folder or into its vae/ "
                          f"subfolder — or give a VAE: {VAE_GIVEN}.")


#: how a VAE is given for a vendor folder without one (new-user review, stop 46: the message named the internal
#: `vae_path`)
VAE_GIVEN = "--vae PATH on the command line (a VAE folder or file), a YuE2 VAE Loader node in ComfyUI"
OWN_VAE = ("required", "optional", "skip")


def vae_folder_sample(folder) -> str | None:
    """The sample hash of a vendor VAE folder's weights: sha256 over each weights file's name and `content_sample`
    (64 × 4 KiB read evenly over the file: milliseconds for the 530 MB release), in `weight_files` order. A song made
    from a vendor folder records it (config.json "checkpoint"."vae_sample_sha256") so that a re-render can tell the
    same VAE from another one at that path. None when the folder has no readable weights."""
    try:
        names = weight_files(folder)
    except CheckpointError:
        return None
    digest = hashlib.sha256()
    for name in names:
        sample = content_sample(str(Path(folder) / name))
        if sample is None:
            return None
        digest.update(f"{name}\0{sample}\n".encode("utf-8"))
    return digest.hexdigest()


def _children(dirs) -> list[Path]:
    """The entries of each folder of `dirs`, by name (a folder that cannot be listed adds none)."""
    out = []
    for root in dirs:
        try:
            out += sorted(Path(root).iterdir())
        except OSError:
            continue
    return out


def recorded_vae_folder(record, folder, search_dirs=()) -> tuple[Path | None, str | None]:
    """The VAE folder a song made from a vendor model folder was decoded with, found again for a re-render of it
    with the vendor model `folder`. `record` = the song's config.json "checkpoint" entry (`CheckpointInfo.to_dict`:
    layout "vendor", files.vae = the VAE folder's path, vae_sample_sha256 = `vae_folder_sample`). Looked for, in this
    order: the recorded path, the folders `find_vae_folder(folder)` would take (folder/vae, its yue2_vae siblings,
    the Hugging Face cache), the yue2_vae folders in `search_dirs` (ComfyUI's vae folders); the first whose sample
    hash is the recorded one is returned. Returns (folder or None, note or None): (None, None) for a song not made
    from a vendor folder (nothing to find); for a song saved before the sample hash was recorded, the recorded path
    when it is still a VAE folder, else (None, a note naming the recorded folder and the one used now).

    Raises CheckpointError (one line: the recorded folder, whether it is gone or holds other weights now, the
    folder the model would use instead, what to do) when no folder with the recorded weights is found — a re-render
    decodes with the VAE the song was made with, or says why it cannot."""
    if not isinstance(record, dict) or record.get("layout") != "vendor":
        return None, None
    files = record.get("files")
    path = files.get("vae") if isinstance(files, dict) else None
    if not isinstance(path, str) or not path:
        return None, None
    sample = record.get("vae_sample_sha256")

    def now() -> str:
        try:
            return str(find_vae_folder(folder))
        except CheckpointError:
            return "no VAE folder at all"

    if not isinstance(sample, str):  # a song saved before the sample hash: its path is all there is to go by
        if folder_model_type(path) == VAE_MODEL_TYPE:
            return Path(path), None
        return None, (f"the VAE folder this song records ({path}) is gone, and the song is older than the record "
                      f"that tells a VAE by its weights: decoding with {now()}, which may be another VAE — "
                      "--vae FOLDER picks the one it was made with")
    seen = []
    for cand in (Path(path), *_vae_folders(folder), *_children(search_dirs)):
        key = os.path.realpath(cand)
        if key in seen or folder_model_type(cand) != VAE_MODEL_TYPE:
            continue
        seen.append(key)
        if vae_folder_sample(cand) == sample:
            return cand, None
    state = ("now holds other weights" if folder_model_type(path) == VAE_MODEL_TYPE
             else "is gone" if not os.path.exists(path) else "is no longer a YuE2 VAE folder")
    searched = f" or in {', '.join(str(d) for d in search_dirs)}" if search_dirs else ""
    raise CheckpointError(f"this song was decoded with the VAE folder {path} (sample sha256 {sample[:16]}…), which "
                          f"{state}; no folder with those weights is beside the model {folder}{searched}, "
                          f"and the model would now decode with {now()}: put the song's VAE folder back, or pass "
                          "--vae FOLDER to render with another VAE (the audio will differ)")


# ---------------------------------------------------------------------------------------------------------------------
# manifest and hashes
# ---------------------------------------------------------------------------------------------------------------------

def read_manifest(folder) -> dict | None:
    """`weights_manifest.json` → {file name: {"sha256", "bytes"}}; None when the folder has none. CheckpointError
    for a malformed one."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        return None
    try:
        doc = json.loads(_json_text(path))
        files = doc["files"]
        ok = isinstance(files, dict) and all(
            isinstance(v, dict) and isinstance(v.get("sha256"), str) and type(v.get("bytes")) is int
            for v in files.values())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError):
        ok = False
    if not ok:
        raise CheckpointError(f"{path} is malformed: expected {{\"files\": {{name: {{\"sha256\": hex, \"bytes\": "
                              "int}}}}")
    return files


def _checked_files(folder, names: list[str]) -> dict:
    """Manifest entries of `names` (relative to `folder`) with each file's size checked now. Without a manifest:
    {} when YUE2_VERIFY_HASHES=0, else CheckpointError. A file the manifest does not list: CheckpointError."""
    manifest = read_manifest(folder)
    if manifest is None:
        if not flag(HASH_SWITCH, True):
            return {}
        raise CheckpointError(f"{folder} has no {MANIFEST}: the vendor folder's files cannot be checked (set "
                              f"{HASH_SWITCH}=0 to load it unchecked)")
    out = {}
    for name in names:
        entry = manifest.get(name)
        if entry is None:
            raise CheckpointError(f"{Path(folder) / name} is not listed in {Path(folder) / MANIFEST} (it lists "
                                  f"{', '.join(sorted(manifest)[:6]) or 'nothing'})")
        size = os.path.getsize(Path(folder) / name)
        if size != entry["bytes"]:
            raise CheckpointError(f"{Path(folder) / name} has {size:,} bytes; {MANIFEST} says {entry['bytes']:,} "
                                  "(an incomplete or replaced download: download it again)")
        out[str(Path(folder) / name)] = entry
    return out


def hash_cache_path() -> Path:
    """Where verified hashes are remembered: $XDG_CACHE_HOME (else ~/.cache)/yue2/verified_files.json."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "yue2" / "verified_files.json"


_VERIFIED: dict = {}  # this process: realpath → (size, mtime_ns, inode, sha256)
_LOCK = threading.Lock()


def _stamp(path: str) -> tuple:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def _load_cache() -> dict:
    try:
        doc = json.loads(hash_cache_path().read_text("utf-8"))
        return doc if isinstance(doc, dict) else {}
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}


def _remember(real: str, stamp: tuple, sha: str) -> None:
    """Record a verified file in the cache file (atomic replace); an unwritable cache only costs a re-hash later."""
    _VERIFIED[real] = (*stamp, sha)
    path = hash_cache_path()
    try:
        doc = _load_cache()
        doc[real] = {"size": stamp[0], "mtime_ns": stamp[1], "inode": stamp[2], "sha256": sha}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True), "utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


def sha256_file(path: str, chunk: int = 16 << 20) -> str:
    """Hex sha256 of a file, read in 16 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify_file(path: str, expected: dict) -> str:
    """Check `path` against its manifest entry {"sha256", "bytes"}: the size always; the sha256 unless
    YUE2_VERIFY_HASHES=0, and only when this (size, mtime_ns, inode) was not verified before (this process, or the
    cache file `hash_cache_path()`). Returns "size-only", "cached" or "hashed". CheckpointError naming the file,
    the expected and the found value on a mismatch."""
    stamp = _stamp(path)
    if stamp[0] != expected["bytes"]:
        raise CheckpointError(f"{path} has {stamp[0]:,} bytes; {MANIFEST} says {expected['bytes']:,} (an incomplete "
                              "or replaced download: download it again)")
    if not flag(HASH_SWITCH, True):
        return "size-only"
    want = expected["sha256"].lower()
    real = os.path.realpath(path)
    with _LOCK:
        if _VERIFIED.get(real) == (*stamp, want):
            return "cached"
        seen = _load_cache().get(real)
        if isinstance(seen, dict) and (seen.get("size"), seen.get("mtime_ns"), seen.get("inode"),
                                       seen.get("sha256")) == (*stamp, want):
            _VERIFIED[real] = (*stamp, want)
            return "cached"
        found = sha256_file(path)
        if found != want:
            raise CheckpointError(f"{path}: sha256 {found} does not match {MANIFEST} (expected {want}): the file is "
                                  f"damaged or from another release. Download it again (or set {HASH_SWITCH}=0 to "
                                  "skip the check).")
        _remember(real, stamp, want)
        return "hashed"


# ---------------------------------------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------------------------------------

def weight_files(folder) -> list[str]:
    """Names (relative to `folder`) of the weight files: the shards of `model.safetensors.index.json` when present,
    else `model.safetensors`. CheckpointError for no weights, a malformed index or a shard that is missing."""
    from .checkpoint import not_a_file
    folder = Path(folder)
    index = folder / INDEX
    for name in (INDEX, WEIGHTS):  # a link loop / dangling link "did not exist": "has no weights" (stop 44 review)
        what = not_a_file(str(folder / name)) if os.path.islink(folder / name) else None
        if what is not None:
            raise CheckpointError(f"{folder / name} is {what}, not a file: the vendor folder's weights must be "
                                  "files (or links to files) — download the folder again")
    if index.exists():
        try:
            weight_map = json.loads(_json_text(index), object_pairs_hook=unique_keys)["weight_map"]
            ok = isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values())
        except DuplicateJSONKey as exc:
            raise CheckpointError(index_names_twice(index, exc.name)) from None
        except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError):
            ok = False
        if not ok:
            raise CheckpointError(f"{index} is malformed: expected {{\"weight_map\": {{tensor: shard file}}}}")
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if "/" in shard or "\\" in shard or shard in ("", ".", ".."):
                raise CheckpointError(f"{index} names the shard {shard!r}; shards are files beside the index")
            if not (folder / shard).is_file():
                what = not_a_file(str(folder / shard))
                state = f"which is {what}" if what else f"which is not in {folder}"
                raise CheckpointError(f"{index} names the shard {shard}, {state} (an incomplete download: download "
                                      f"the folder again){hf_download_note(folder)}")
        return shards
    if (folder / WEIGHTS).is_file():
        return [WEIGHTS]
    note = hf_download_note(folder)
    raise CheckpointError(f"{folder} has no weights: neither {WEIGHTS} nor {INDEX} (+ its shards) is there"
                          + (f"{note}." if note else
                             f". The vendor folder ({MODEL_REPO}) needs them next to {CONFIG}."))


def index_names_twice(index, name: str) -> str:
    """The refusal of a shard index one of whose objects names `name` twice (JSON readers keep the last entry, so
    the first was never checked: stop-51 break-it review)."""
    return f"{index} names {name!r} twice: an index lists each tensor once — download the folder again"


def _unread_weights(folder, names: list[str]) -> str:
    """For a refusal of missing tensors: the weights files weights_manifest.json lists that were not read (a shard
    deleted and left out of an edited index, stop-54 review: the message named only tensors of the missing layers,
    "no model.layers.0.* tensors"), as " — …"; "" when there is none or no readable manifest."""
    try:
        manifest = read_manifest(folder) or {}
    except CheckpointError:
        return ""
    unread = sorted(n for n in manifest if n.endswith(".safetensors") and n not in names)
    if not unread:
        return ""
    many = len(unread) > 1
    where = f"{INDEX} does not name" if (Path(folder) / INDEX).exists() else \
        f"{'are' if many else 'is'} not {WEIGHTS}"
    state = ", ".join(f"{n} ({'there' if (Path(folder) / n).is_file() else 'missing'})" for n in unread[:4])
    return (f" — {MANIFEST} lists {len(unread)} weights file{'s' * many} that {where}: "
            f"{state}{', …' if len(unread) > 4 else ''} (a shard lost and left out of an edited index, or an "
            "incomplete download: download the folder again)")


def _read_tensors(folder, names: list[str]) -> dict:
    """{vendor key: (file path, TensorEntry)} over the files `names` of `folder`. CheckpointError for a key in two
    files, or an index whose weight_map disagrees with the shards' headers."""
    out = {}
    for name in names:
        path = str(Path(folder) / name)
        entries, _, _ = read_header(path)
        for key, e in entries.items():
            if key in out:
                raise CheckpointError(f"tensor {key} is in both {out[key][0]} and {path}")
            out[key] = (path, e)
    index = Path(folder) / INDEX
    if index.exists():
        weight_map = json.loads(_json_text(index))["weight_map"]
        for key, shard in weight_map.items():
            if key not in out or out[key][0] != str(Path(folder) / shard):
                raise CheckpointError(f"{index} says {key} is in {shard}, but that shard does not hold it")
    return out


def _fuse(comfy_key: str, parts: list[tuple[str, TensorEntry]], vendor_keys: tuple) -> TensorEntry:
    """The virtual entry of a row-concatenation: same dtype and column count for all parts."""
    first = parts[0][1]
    if len(parts) == 1:
        return TensorEntry(first.dtype, first.shape, 0, first.end - first.start)
    for key, (_, e) in zip(vendor_keys, parts):
        if e.dtype != first.dtype or len(e.shape) != 2 or e.shape[1:] != first.shape[1:]:
            raise CheckpointError(f"{key} is {e.dtype} {list(e.shape)}; the tensors fused into {comfy_key} "
                                  f"({', '.join(vendor_keys)}) must share dtype and columns ({first.dtype} "
                                  f"[*, {first.shape[1] if len(first.shape) == 2 else '?'}])")
    rows = sum(e.shape[0] for _, e in parts)
    return TensorEntry(first.dtype, (rows, *first.shape[1:]), 0, sum(e.end - e.start for _, e in parts))


def _check_splits(tensors: dict, layers: int) -> None:
    """q rows = o_proj in-features, k rows = v rows, gate rows = up rows, in every layer of both experts (the fused
    Comfy tensor's split points are read from these, §4 notes)."""
    for i in range(layers):
        for pre in (f"model.layers.{i}.self_attn.", f"model.layers.{i}.nar_self_attn."):
            q, k, v, o = (tensors[pre + n + "_proj.weight"][1].shape for n in "qkvo")
            if k[0] != v[0] or len(o) != 2 or q[0] != o[1]:
                raise CheckpointError(f"{pre}{{q,k,v,o}}_proj: rows q {q[0]}, k {k[0]}, v {v[0]}, o_proj in "
                                      f"{o[1] if len(o) == 2 else '?'}; expected k = v and q = o_proj in")
        for pre in (f"model.layers.{i}.mlp.", f"model.layers.{i}.nar_mlp."):
            g, u = (tensors[pre + n + "_proj.weight"][1].shape for n in ("gate", "up"))
            if g != u:
                raise CheckpointError(f"{pre}gate_proj {list(g)} and up_proj {list(u)} differ; they must match")


def _vae_parts(vae_folder: Path) -> tuple[list[str], dict, dict]:
    """(weight file names, {Comfy key: ((file, key),)}, {Comfy key: TensorEntry}) of the VAE folder: unprefixed
    `encoder.*` / `decoder.*` F32 tensors under `vae.` (decoder-only files accepted, §5)."""
    names = weight_files(vae_folder)
    tensors = _read_tensors(vae_folder, names)
    stray = [k for k in tensors if not k.startswith(("encoder.", "decoder."))]
    if stray:
        raise CheckpointError(f"the VAE folder {vae_folder} holds tensors that are not encoder.*/decoder.* "
                              f"({', '.join(sorted(stray)[:3])}): not a {VAE_REPO} file")
    if not any(k.startswith("decoder.") for k in tensors):
        raise CheckpointError(f"the VAE folder {vae_folder} has no decoder.* tensors")
    not_f32 = sorted(k for k, (_, e) in tensors.items() if e.dtype != "F32")
    if not_f32:
        raise CheckpointError(f"VAE tensor {not_f32[0]} in {vae_folder} is {tensors[not_f32[0]][1].dtype}; the "
                              f"{VAE_REPO} weights are F32 (the vendor loader rejects other dtypes)")
    parts = {VAE + k: ((f, k),) for k, (f, _) in tensors.items()}
    entries = {VAE + k: TensorEntry(e.dtype, e.shape, 0, e.end - e.start) for k, (_, e) in tensors.items()}
    return names, parts, entries


_CONFIG_DIMS = {"hidden_size": "hidden", "num_hidden_layers": "layers", "num_attention_heads": "heads",
                "num_key_value_heads": "kv_heads", "head_dim": "head_dim", "intermediate_size": "ffn",
                "vocab_size": "vocab", "latent_dim": "latent_dim", "max_latent_frames": "pe_rows"}
# accepted ranges of the float settings taken from config.json (runtime.md §4.1): RoPE and RMSNorm run in fp32, where
# a θ below 1 makes 1/θ^(2i/D) overflow (NaN angles) and an eps below ~1e-30 rounds to 0 (rsqrt(0) of a zero row)
ROPE_THETA_RANGE = (1.0, 1e30)  # the release: 1,000,000
EPS_RANGE = (1e-30, 1.0)  # the release: 1e-6; the upper end excluded


def _show(value) -> str:
    """A config value as the message shows it: its JSON-ish repr, cut to 40 characters (a 400-digit number)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}…{text[-8:]} ({len(text)} characters)"


def _is_number(value) -> bool:
    """A JSON number (int or float, not true/false) that is finite; huge ints compare exactly, never via float()."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _dims_with_config(dims, config: dict, path: Path):
    """Cross-check config.json against the dimensions read from the tensor shapes, and take rope_theta and
    rms_norm_eps from it (runtime.md §4.1; the Comfy file does not store them). Every number read is checked before
    it is used: an integer where a size is meant, a finite number in ROPE_THETA_RANGE / EPS_RANGE; CheckpointError
    naming the key, the value and what is accepted otherwise (never an OverflowError, never inf/NaN accepted)."""
    from dataclasses import replace
    for field, attr in _CONFIG_DIMS.items():
        if field not in config:
            continue
        value = config[field]
        if not _is_number(value) or value != int(value):
            raise DamagedWeightsError(f"{path}: {field} must be a whole number (the weights have "
                                      f"{getattr(dims, attr)}), got {_show(value)}")
        if value != getattr(dims, attr):
            raise DamagedWeightsError(f"{path} says {field} = {_show(value)}, the weights have "
                                      f"{getattr(dims, attr)}: the config and the weights are of different models")
    if config.get("latent_type", "vae") != "vae":
        raise DamagedWeightsError(f"{path}: latent_type {_show(config['latent_type'])}; YuE2 accepts only \"vae\"")
    tie = config.get("tie_word_embeddings", False)
    if tie is not False:  # break-it review, stop 48: `true` was ignored, the file's own lm_head used
        shown = "true" if tie is True else _show(tie)
        raise DamagedWeightsError(f"{path}: tie_word_embeddings is {shown}; this engine implements the release "
                                  "value false (the AR's lm_head is its own weight, not the input embedding)")
    shift = config.get("timestep_shift", 1.0)
    if not _is_number(shift) or shift != 1:
        raise DamagedWeightsError(f"{path}: timestep_shift {_show(shift)}; this engine implements the release "
                                  "value 1.0")
    changes = {}
    theta, eps = config.get("rope_theta"), config.get("rms_norm_eps")
    if theta is not None:
        lo, hi = ROPE_THETA_RANGE
        if not _is_number(theta) or not lo <= theta <= hi:
            raise DamagedWeightsError(f"{path}: rope_theta is {_show(theta)}; it must be a finite number from "
                                      f"{lo:g} to {hi:g} (the release's is 1000000)")
        changes["rope_theta"] = float(theta)
    if eps is not None:
        lo, hi = EPS_RANGE
        if not _is_number(eps) or not lo <= eps < hi:
            raise DamagedWeightsError(f"{path}: rms_norm_eps is {_show(eps)}; it must be a finite number from "
                                      f"{lo:g} to below {hi:g} (the release's is 1e-06)")
        changes["eps"] = float(eps)
    return replace(dims, **changes)


def inspect_vendor(folder, vae_path=None, own_vae: str = "required"):
    """Check a vendor model folder and its VAE folder from their headers and return a CheckpointInfo with layout
    "vendor", format "bf16", Comfy-named `entries` and a `SplitSource`. File sizes are checked against the
    manifests now; sha256 hashes on first read (`verify_file`). CheckpointError for: a config of another model, no
    weights, a missing shard, no qwen.tiktoken, a missing/unlisted/short file, missing or unexpected tensors,
    inconsistent shapes or dtypes, a config that disagrees with the weights, no VAE folder.

    `own_vae` (one of OWN_VAE; `vae_path` given: always its VAE): "required" — no VAE folder found is an error;
    "optional" — the info has no VAE when none is found (`inspect` describes such a folder); "skip" — the folder's
    VAE is not looked for, another VAE decodes (--vae, the VAE Loader node; new-user review, stop 46: a folder
    without its vae/ could not be used even with --vae). An info without a VAE has `vae` None, no `vae.*` entries
    and no `files["vae"]`; `checkpoint.load_vae` refuses it, naming how to give one."""
    if own_vae not in OWN_VAE:
        raise ValueError(f"own_vae must be one of {OWN_VAE}, got {own_vae!r}")
    folder = Path(folder)
    config = read_config(folder)
    names = weight_files(folder)
    tokenizer = folder / TIKTOKEN
    if not tokenizer.is_file():
        raise CheckpointError(f"{folder} has no {TIKTOKEN} (the vendor tokenizer: one base64 token and its rank per "
                              f"line, 151,643 lines); download it from {MODEL_REPO}")
    expected = _checked_files(folder, [*names, TIKTOKEN])
    tensors = _read_tensors(folder, names)
    layers = 0
    while f"model.layers.{layers}.input_layernorm.weight" in tensors:
        layers += 1
    if layers == 0:
        raise CheckpointError(f"{folder}: the weights have no model.layers.0.* tensors (first keys: "
                              f"{', '.join(sorted(tensors)[:3]) or 'none'}){_unread_weights(folder, names)}")
    pairs = vendor_pairs(layers)
    wanted = {k for _, keys in pairs for k in keys}
    missing = sorted(wanted - set(tensors))
    if missing:
        raise CheckpointError(f"{folder}: {len(missing)} vendor tensors missing, e.g. {', '.join(missing[:4])}"
                              f"{_unread_weights(folder, names)}")
    extra = sorted(set(tensors) - wanted)
    if extra:
        raise CheckpointError(f"{folder}: unexpected tensors for a {layers}-layer YuE2 model, e.g. "
                              f"{', '.join(extra[:4])} (another model, or layers beyond model.layers.{layers - 1})")
    _check_splits(tensors, layers)
    parts, entries = {}, {}
    for comfy, keys in pairs:
        found = [tensors[k] for k in keys]
        entries[comfy] = _fuse(comfy, found, keys)
        parts[comfy] = tuple((path, k) for k, (path, _) in zip(keys, found))
    if vae_path is not None or own_vae == "required":
        vae_folder = find_vae_folder(folder, vae_path)
    else:
        vae_folder = next(_vae_folders(folder), None) if own_vae == "optional" else None
    if vae_folder is not None:
        vae_names, vae_parts, vae_entries = _vae_parts(vae_folder)
        expected.update(_checked_files(vae_folder, vae_names))
        parts.update(vae_parts)
        entries.update(vae_entries)
    dims, vae = check_entries(entries, vae=vae_folder is not None)
    dims = _dims_with_config(dims, config, folder / CONFIG)
    metadata = {k: str(v) for k, v in config.items() if k.startswith("yue2_")}
    metadata["model_type"] = MODEL_TYPE

    def before_read(file: str):
        if file in expected:
            verify_file(file, expected[file])

    files = {"model": str(folder), "tokenizer": str(tokenizer)}
    if vae_folder is not None:
        files["vae"] = str(vae_folder)
    info = build_info(str(folder), entries, metadata, dims, vae, tokenizer_bytes=os.path.getsize(tokenizer),
                      layout="vendor", source=SplitSource(parts, before_read), files=files)
    if vae_folder is None:
        info.part_dtypes["vae"] = ("not read (another VAE decodes)" if own_vae == "skip" else
                                   f"missing (no VAE folder found; give one: {VAE_GIVEN})")
    return info


def load_vendor_tokenizer(info):
    """The `qwen.tiktoken` tokenizer of a vendor CheckpointInfo, its hash checked against the manifest first.
    Exactly 151,643 ranks, unless the folder's config.json marks the weights synthetic (then at most that many).
    TokenizerError / CheckpointError otherwise."""
    from .tokenizer import RELEASE_RANKS, TiktokenTokenizer
    path = info.files["tokenizer"]
    entry = _checked_files(info.files["model"], [TIKTOKEN]).get(path)
    if entry is not None:
        verify_file(path, entry)
    if "yue2_synthetic" not in info.metadata:
        return TiktokenTokenizer.from_file(path, require=RELEASE_RANKS)
    tok = TiktokenTokenizer.from_file(path, require=None)
    if tok.vocab_size > RELEASE_RANKS:
        raise TokenizerError(f"{path} has {tok.vocab_size:,} ranks, more than the {RELEASE_RANKS:,} ids below EOD")
    return tok
