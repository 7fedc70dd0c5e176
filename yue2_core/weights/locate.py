"""Finding a checkpoint: an explicit path (an all-in-one file or a vendor model folder), else `$YUE2_CHECKPOINT`,
else a YuE2 file or vendor folder in a ComfyUI `models/checkpoints` folder, else the vendor's m-a-p/YuE2-3B snapshot
already in the Hugging Face cache (never downloaded here), else the Hugging Face file Comfy-Org/YuE2
checkpoints/yue2_3b_int8_convrot.safetensors (downloaded with huggingface-hub into its cache)."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import CheckpointError

HF_REPO = "Comfy-Org/YuE2"
HF_FILE = "checkpoints/yue2_3b_int8_convrot.safetensors"  # 3.69 GB; the bf16 file is checkpoints/yue2_3b_bf16…


def comfy_checkpoint_dirs() -> list[Path]:
    """ComfyUI checkpoint folders: $COMFYUI_PATH/models/checkpoints, and the one next to the custom_nodes folder
    this package sits in (ComfyUI/custom_nodes/<pack>/yue2_core → ComfyUI/models/checkpoints). CheckpointError
    naming the variable when $COMFYUI_PATH / $COMFYUI_DIR gives a path that cannot be looked at (too long, no
    permission: Python 3.11's is_dir raises for those; break-it finding)."""
    dirs = []
    for env in ("COMFYUI_PATH", "COMFYUI_DIR"):
        if os.environ.get(env):
            dirs.append((env, Path(os.environ[env]) / "models" / "checkpoints"))
    here = Path(__file__).resolve()
    for parent in here.parents:
        if parent.name == "custom_nodes":
            dirs.append((None, parent.parent / "models" / "checkpoints"))
            break
    found = []
    for env, d in dirs:
        try:
            if d.is_dir():
                found.append(d)
        except OSError as exc:
            if env is None:
                continue
            shown = os.environ[env] if len(os.environ[env]) <= 80 else os.environ[env][:60] + "…"
            raise CheckpointError(f"the environment variable {env}={shown!r} ({len(os.environ[env])} characters) "
                                  f"cannot be searched for checkpoints: {exc.strerror or exc} at its models/"
                                  f"checkpoints; fix or unset it") from None
    return found


def comfy_model_path(name: str, kind: str) -> tuple[str, str] | None:
    """(path, ComfyUI folder) of `name` — a relative path such as the ComfyUI node lists show (`my_lora.safetensors`,
    `sub/x.safetensors`, a VAE folder `YuE2-Vae-legacy`) — inside the `models/<kind>` folder ("loras", "vae",
    "checkpoints" for `--checkpoint`) of the ComfyUI the checkpoint search uses (`comfy_checkpoint_dirs`), or None.
    Only for a name that is not a path here: the command line reads `--lora` / `--vae` / `--checkpoint` in that
    ComfyUI's folders as the nodes do (own-weights review, stop 49: the checkpoint was found there, the LoRA beside it
    was "not found"; new-user review, stop 51: the checkpoint's own name was "not found"). The name must stay inside
    the folder as written (no `..` in it, no absolute path; ComfyUI lists no such name); a link in the folder is
    followed wherever it points, as ComfyUI's own `folder_paths.get_full_path` does (diff review, stop 49: a linked
    file, which the LoRA node lists and loads, was "not found" here)."""
    if not looks_up_in_comfy(name):
        return None
    try:
        models = [d.parent for d in comfy_checkpoint_dirs()]
    except CheckpointError:  # a $COMFYUI_PATH that cannot be searched: the checkpoint search says so
        return None
    for m in models:
        folder = m / kind
        candidate = folder / name
        try:
            if candidate.exists():
                return str(candidate), str(folder)
        except (OSError, ValueError):  # no permission, a name too long; a NUL byte (ValueError)
            continue
    return None


def looks_up_in_comfy(name: str) -> bool:
    """Whether `comfy_model_path` looks for `name` in ComfyUI's folders: a relative name that names nothing here —
    not even a link (`lexists`: a broken link here is the user's path, said to be broken, not a reason to take
    ComfyUI's file of that name; stop-51 diff review) — that stays inside the folder (no `..`), and that is not
    anchored here by `./` (ComfyUI lists no such name: `./x.safetensors` is this folder's file, or none)."""
    if not name or os.path.isabs(name) or os.path.lexists(name):
        return False
    if os.pardir in Path(name).parts:  # `../x`, `sub/../../x` (or `link/../x`): a way out of the folder
        return False
    return not name.startswith(tuple(os.curdir + sep for sep in (os.sep, os.altsep) if sep))


def comfy_model_folders(kind: str) -> list[str]:
    """The `models/<kind>` folders `comfy_model_path` looks in that exist (none when $COMFYUI_PATH cannot be
    searched): what a "not found" message names."""
    try:
        folders = [d.parent / kind for d in comfy_checkpoint_dirs()]
        return [str(f) for f in folders if f.is_dir()]
    except (CheckpointError, OSError):
        return []


def yue2_files(folder: Path) -> list[Path]:
    """YuE2 all-in-one files in `folder` (detected by tensor names, not file names), int8 first."""
    from .checkpoint import inspect_checkpoint
    found = []
    for f in sorted(folder.glob("*.safetensors")):
        try:
            info = inspect_checkpoint(f)
        except CheckpointError:
            continue
        found.append((0 if info.format == "int8" else 1, f))
    return [f for _, f in sorted(found)]


def vendor_folders(folder: Path) -> list[Path]:
    """Vendor model folders (config.json with model_type "yue2", m-a-p/YuE2-3B layout) directly inside `folder`, by
    name. Only the config is read here; `inspect_checkpoint` checks the rest."""
    from .vendor import is_vendor_folder
    try:
        return [d for d in sorted(Path(folder).iterdir()) if is_vendor_folder(d)]
    except OSError:
        return []


def hf_vendor_snapshot() -> Path | None:
    """The m-a-p/YuE2-3B snapshot the vendor runtime downloaded into the Hugging Face cache, if any (no download)."""
    from .vendor import MODEL_REPO, hf_snapshot, is_vendor_folder
    snap = hf_snapshot(MODEL_REPO)
    return snap if snap is not None and is_vendor_folder(snap) else None


def find_checkpoint(explicit: str | None = None, download: bool = True) -> tuple[str, str]:
    """Return (path, how it was found): a file or a vendor folder. Raises CheckpointError with the download
    instructions when nothing is available."""
    from .checkpoint import not_a_file
    if explicit:
        in_comfy = comfy_model_path(explicit, "checkpoints")
        if in_comfy is not None:  # a name as the Checkpoint Loader lists it, like --lora / --vae (new-user review,
            # stop 51: `--checkpoint yue2_tiny_synthetic.safetensors` was "not found" with download advice)
            return in_comfy[0], f"ComfyUI folder {in_comfy[1]}"
        if not (os.path.isfile(explicit) or os.path.isdir(explicit)) and _is_repo_id(explicit):
            return _from_repo_id(explicit, download)
        if not (os.path.isfile(explicit) or os.path.isdir(explicit)):
            kind = not_a_file(explicit)  # it exists, but is a FIFO / device / socket
            folders = comfy_model_folders("checkpoints") if looks_up_in_comfy(explicit) else []
            where = f" (neither here nor in ComfyUI's {' or '.join(folders)})" if folders else ""
            near = "" if kind else _near_miss(explicit)  # else the checkpoints lying in ./models are named
            raise CheckpointError(f"checkpoint {explicit} is {kind}, not a file (a checkpoint is a .safetensors file "
                                  "or a vendor model folder)" if kind else
                                  f"checkpoint not found: {explicit}{where}{near}. {where_to_get()}"
                                  f"{'' if near else _local_hint()}")
        return explicit, "given path"
    env = os.environ.get("YUE2_CHECKPOINT")
    if env:
        if not (os.path.isfile(env) or os.path.isdir(env)):
            kind = not_a_file(env)
            raise CheckpointError(f"$YUE2_CHECKPOINT points to {kind}, not a checkpoint file or folder: {env}"
                                  if kind else f"$YUE2_CHECKPOINT points to a missing file or folder: {env}")
        return env, "$YUE2_CHECKPOINT"
    for folder in comfy_checkpoint_dirs():
        found = yue2_files(folder) + vendor_folders(folder)
        if len(found) > 1:  # break-it finding (stop 38): the choice among several was silent
            names = ", ".join(p.name for p in found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
            return str(found[0]), (f"ComfyUI folder {folder}, which holds {len(found)} YuE2 checkpoints ({names}): "
                                   "the first taken, int8 files first, then by name — --checkpoint picks another")
        if found:
            return str(found[0]), f"ComfyUI folder {folder}"
    snap = hf_vendor_snapshot()
    if snap is not None:
        return str(snap), "Hugging Face cache of m-a-p/YuE2-3B (vendor folder)"
    comfy = comfy_env_hint()
    if download:
        reason = _hub_unreachable()
        if reason is None:
            if comfy:  # before 3.7 GB are fetched: a mistyped $COMFYUI_PATH should not cost a silent download
                import sys
                print(f"note: {comfy}; no other YuE2 checkpoint found: downloading {HF_REPO}/{HF_FILE} (3.7 GB; "
                      "--offline never downloads)", file=sys.stderr)
            try:
                from huggingface_hub import hf_hub_download
                return hf_hub_download(HF_REPO, HF_FILE), f"Hugging Face {HF_REPO}/{HF_FILE}"
            except Exception as exc:  # network errors, missing package, auth
                reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        head = (f"no YuE2 checkpoint found and the download failed ({reason}; --offline skips the download "
                "attempt)")
    else:
        head = "no YuE2 checkpoint found (downloading is off: --offline)"
    if comfy:
        head += f"; {comfy}"
    raise CheckpointError(f"{head}. {where_to_get()}{_local_hint()}")


def _is_repo_id(name: str) -> bool:
    """Whether `name` reads as a Hugging Face repo id (ORG/NAME, letters, digits, '-', '_', '.'), e.g. m-a-p/YuE2-3B,
    rather than a relative path: only asked of names that are no existing path; ORG is no folder here and NAME
    has no weights-file suffix (`models/yue2.safetensor`, a typo, stays a path and gets "did you mean")."""
    import re
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", name) is None:
        return False
    org, rest = name.split("/")
    return not os.path.isdir(org) and not rest.lower().endswith(WEIGHT_SUFFIXES)


# what a weights file's name ends with (ComfyUI's model extensions — `.sft` is its short safetensors name — and
# others'): `ORG/NAME` with one of these is a mistyped path, never a Hugging Face repo id (diff review 58)
WEIGHT_SUFFIXES = (".safetensors", ".safetensor", ".sft", ".ckpt", ".pt", ".pt2", ".pth", ".pkl", ".bin", ".gguf",
                   ".json")


def _from_repo_id(repo: str, download: bool) -> tuple[str, str]:
    """`--checkpoint ORG/NAME` for the two repos YuE2 ships in (own-weights review, stop 58: m-a-p/YuE2-3B was "not
    found" with download advice while the automatic search finds its cached snapshot): m-a-p/YuE2-3B → its snapshot
    in the Hugging Face cache (the vendor runtime downloads it; never downloaded here); Comfy-Org/YuE2 → the int8
    all-in-one file HF_FILE, from the cache or downloaded unless `download` is False. Raises CheckpointError for
    any other repo id, or when the file is neither cached nor downloadable."""
    from .vendor import MODEL_REPO, VAE_REPO
    if repo.lower() == MODEL_REPO.lower():
        snap = hf_vendor_snapshot()
        if snap is None:
            raise CheckpointError(f"checkpoint {repo}: no snapshot of the vendor's {MODEL_REPO} in the Hugging Face "
                                  "cache (this pack reads the folder the vendor runtime downloads, e.g. `hf download "
                                  f"{MODEL_REPO}`, but does not download it itself). {where_to_get()}")
        return str(snap), f"Hugging Face cache of {MODEL_REPO} (vendor folder)"
    if repo.lower() == HF_REPO.lower():
        try:
            from huggingface_hub import hf_hub_download
        except ImportError:
            raise CheckpointError(f"checkpoint {repo}: reading a Hugging Face repo needs huggingface-hub "
                                  f"(pip install huggingface-hub). {where_to_get()}") from None
        try:
            return hf_hub_download(HF_REPO, HF_FILE, local_files_only=True), f"Hugging Face cache {HF_REPO}/{HF_FILE}"
        except Exception:  # not cached (LocalEntryNotFoundError and kin)
            pass
        if not download:
            raise CheckpointError(f"checkpoint {repo}: {HF_FILE} is not in the Hugging Face cache and downloading "
                                  f"is off (--offline). {where_to_get()}")
        reason = _hub_unreachable()
        if reason is None:
            try:
                return hf_hub_download(HF_REPO, HF_FILE), f"Hugging Face {HF_REPO}/{HF_FILE}"
            except Exception as exc:  # network errors, auth
                reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        raise CheckpointError(f"checkpoint {repo}: the download of {HF_FILE} failed ({reason}). {where_to_get()}")
    if repo.lower() == VAE_REPO.lower():  # diff review 58: "not one YuE2 ships in" for the release's own VAE
        raise CheckpointError(f"checkpoint {repo}: that repo holds YuE2's VAE decoder alone, not a model — give "
                              f"it as --vae {VAE_REPO} (read from the Hugging Face cache); the model is --checkpoint "
                              f"{MODEL_REPO} or {HF_REPO}")
    folders = comfy_model_folders("checkpoints") if looks_up_in_comfy(repo) else []
    where = f" (neither here nor in ComfyUI's {' or '.join(folders)})" if folders else " here"
    raise CheckpointError(f"checkpoint {repo}: no such file or folder{where}, and as a Hugging Face repo id it is "
                          f"not one YuE2 ships in (accepted: {HF_REPO} — the all-in-one int8 file —, or "
                          f"{MODEL_REPO} — the vendor's folder, read from the Hugging Face cache). A path or a file "
                          f"name in ComfyUI's checkpoints folder is read as well.{_near_miss(repo)}")


def _yue2_in(files: list[Path], folder: Path, most: int = 50) -> list[Path]:
    """The YuE2 all-in-one files among `files` that lie in subfolders of `folder` (headers read, at most `most`)."""
    from .checkpoint import inspect_checkpoint
    found = []
    for f in [f for f in files if f.parent != folder and f.suffix == ".safetensors"][:most]:
        try:
            inspect_checkpoint(f)
        except CheckpointError:
            continue
        found.append(f)
    return found


def comfy_env_hint() -> str:
    """Why $COMFYUI_PATH / $COMFYUI_DIR, where set, gave no checkpoint: the folder does not exist, has no
    models/checkpoints, or that holds no YuE2 checkpoint; "" when neither is set (or it cannot be searched:
    `comfy_checkpoint_dirs` names that). New-user review 53: a mistyped or too deep $COMFYUI_PATH got the same
    "searched only when … $COMFYUI_PATH names that ComfyUI" advice as an unset one, or a silent 3.7 GB download."""
    said = []
    for env in ("COMFYUI_PATH", "COMFYUI_DIR"):
        value = os.environ.get(env)
        if not value:
            continue
        root, folder = Path(value), Path(value) / "models" / "checkpoints"
        try:
            if not root.is_dir():
                said.append(f"${env}={value} is not a folder")
            elif not folder.is_dir():
                said.append(f"${env}={value} has no models/checkpoints folder (it must name the ComfyUI folder "
                            "itself, the one holding main.py and models/)")
            else:
                weights = [f for f in folder.rglob("*") if f.suffix in (".safetensors", ".ckpt", ".pt")]
                top = sum(1 for f in weights if f.parent == folder)
                deeper = [str(f.relative_to(folder)) for f in sorted(_yue2_in(weights, folder))]
                said.append(f"${env}'s {folder} holds no YuE2 checkpoint"
                            + (f" ({top} other weight file(s))" if top else " (no weight files in it)")
                            + (f"; its subfolders, which are not searched, hold {', '.join(deeper[:3])}"
                               f"{' …' if len(deeper) > 3 else ''}: give one as --checkpoint {deeper[0]}"
                               if deeper else ""))
        except OSError:
            continue
    return "; ".join(said)


def _hub_unreachable(timeout: float = 5.0) -> str | None:
    """Why the Hugging Face hub cannot be reached, or None (reachable, offline mode, or behind a proxy that a direct
    connection cannot judge): one name lookup and TCP connect, a few seconds at most, where the hub client's own
    retries take ~25 s before failing on a machine without that network (new-user finding)."""
    import socket
    from urllib.parse import urlparse
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return None  # the client reads its cache only
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY",
                                       "http_proxy")):
        return None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        url = urlparse(endpoint)
        host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    except ValueError as exc:  # a port out of range or not a number, an unclosed [IPv6 (break-it finding)
        return f"the environment variable HF_ENDPOINT={endpoint!r} is not a valid address ({exc}); unset or fix it"
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"cannot reach {host}:{port}: {exc.strerror or exc}"


def _near_miss(path: str) -> str:
    """`(did you mean DIR/NAME?)` for a --checkpoint path that names nothing, where its folder holds an entry of a
    close name (new-user review 57: `--checkpoint models/yue2_tiny_bf16.safetenors` got the download advice only,
    not the file beside it); "" otherwise."""
    import difflib
    folder, name = os.path.split(path.rstrip(os.sep) or path)  # a folder typed with its tab-completed "/" too
    try:
        names = os.listdir(folder or os.curdir) if name else []
    except (OSError, ValueError):  # no such folder, no permission, a NUL byte
        return ""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
    return f" (did you mean {os.path.join(folder, close[0])}?)" if close else ""


def _local_hint(shown: int = 4) -> str:
    """Checkpoints lying in ./models (scripts/song.sh writes its synthetic one there; vendor folders too), named so
    the user can pass one: the one song.sh writes first, at most `shown`, and how many more (new-user finding: the
    first two by name hid song.sh's file)."""
    try:
        here = sorted(Path("models").glob("*.safetensors"), key=lambda p: (p.name != SONG_SH_FILE, p.name))
        here += vendor_folders(Path("models"))
    except OSError:
        return ""
    if not here:
        return ""
    more = f" (and {len(here) - shown} more in models/)" if len(here) > shown else ""
    return ". Found here: " + ", ".join(f"--checkpoint {p}" for p in here[:shown]) + more


SONG_SH_FILE = "yue2_tiny_bf16.safetensors"  # the synthetic checkpoint scripts/song.sh writes into models/


def where_to_get() -> str:
    """WHERE_TO_GET, its make-synthetic step dropped when models/ already holds that file (new-user finding: the
    suggested command would refuse to overwrite it)."""
    if (Path("models") / SONG_SH_FILE).is_file():
        return WHERE_TO_GET.replace(f"python -m yue2_core make-synthetic --output models/{SONG_SH_FILE}, then ", "")
    return WHERE_TO_GET


HF_URL = f"https://huggingface.co/{HF_REPO}/resolve/main/{HF_FILE}"  # the file itself (blob/ is its web page)

WHERE_TO_GET = (f"The release file is yue2_3b_int8_convrot.safetensors (3.7 GB; its page: https://huggingface.co/"
                f"{HF_REPO}/tree/main/checkpoints). Download it, e.g. curl -L -o yue2_3b_int8_convrot.safetensors "
                f"{HF_URL}, then pass --checkpoint PATH or set YUE2_CHECKPOINT=PATH (a file, or the folder of the "
                "vendor's m-a-p/YuE2-3B with m-a-p/YuE2-Vae beside it); ComfyUI/models/checkpoints is searched "
                "only when this pack sits in ComfyUI/custom_nodes or $COMFYUI_PATH names that ComfyUI, then the "
                "Hugging Face cache for the vendor's m-a-p/YuE2-3B (found there when the vendor runtime downloaded "
                "it). For a test "
                "run without the real weights: bash scripts/song.sh writes and uses a synthetic one (random "
                "weights), or python -m yue2_core make-synthetic --output models/yue2_tiny_bf16.safetensors, then "
                "--checkpoint models/yue2_tiny_bf16.safetensors --max-abc-tokens 128 --max-seconds 10 (synthetic "
                "weights never end a song)")
