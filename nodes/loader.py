"""YuE2 Checkpoint Loader: a YuE2 all-in-one safetensors file, or a vendor model folder (m-a-p/YuE2-3B layout), from
ComfyUI's `checkpoints` folders or the Hugging Face cache → YUE2_MODEL."""
from __future__ import annotations

import os
from pathlib import Path

import comfy.model_management as mm
import folder_paths
from comfy_api.latest import io, ui

from yue2_core.errors import YuE2Error
from yue2_core.weights.checkpoint import file_state, inspect_checkpoint, load_tokenizer, not_a_file
from yue2_core.weights.locate import HF_FILE, HF_REPO, hf_vendor_snapshot, vendor_folders
from yue2_core.weights.vendor import MODEL_REPO, MODEL_TYPE, VAE_MODEL_TYPE, find_vae_folder, folder_model_type

from . import inputs, types
from .model import YuE2Model
from .progress import check_switches, user_errors

DEFAULT_FILE = os.path.basename(HF_FILE)  # yue2_3b_int8_convrot.safetensors
DOWNLOAD_URL = f"https://huggingface.co/{HF_REPO}/resolve/main/{HF_FILE}"
HF_ENTRY = f"[HF cache] {MODEL_REPO}"  # the vendor runtime's download, used where it lies (never downloaded here)


def checkpoint_options() -> list[str]:
    """The dropdown: checkpoint files, vendor model folders directly in a checkpoints folder as "<name>/", and
    `HF_ENTRY` when the Hugging Face cache holds m-a-p/YuE2-3B. Files inside vendor model and VAE folders are not
    listed on their own (they are not all-in-one checkpoints)."""
    folders, hidden = {}, set()
    for base in folder_paths.get_folder_paths("checkpoints"):
        for d in vendor_folders(Path(base)):
            folders.setdefault(d.name + "/", d)
        try:
            hidden |= {d.name + "/" for d in Path(base).iterdir()
                       if d.is_dir() and folder_model_type(d) in (MODEL_TYPE, VAE_MODEL_TYPE)}
        except OSError:
            pass
    files = [n for n in folder_paths.get_filename_list("checkpoints")
             if not any(n.replace(os.sep, "/").startswith(f) for f in hidden)]
    return files + sorted(folders) + ([HF_ENTRY] if hf_vendor_snapshot() is not None else [])


def resolve_checkpoint(name: str) -> str | None:
    """Path of dropdown entry `name` (a file, a vendor folder, the HF snapshot); None when it is not there."""
    if name == HF_ENTRY:
        snap = hf_vendor_snapshot()
        return str(snap) if snap is not None else None
    if name.endswith("/"):
        for base in folder_paths.get_folder_paths("checkpoints"):
            found = [d for d in vendor_folders(Path(base)) if d.name + "/" == name]
            if found:
                return str(found[0])
        return None
    return folder_paths.get_full_path("checkpoints", name)


def not_a_file_entry(ckpt_name: str) -> str | None:
    """Why a listed entry that resolves to no checkpoint is unusable — it lies in a checkpoints folder but is a FIFO,
    a device, a broken or looping symbolic link (`weights.checkpoint.not_a_file`) —; None when it is simply not
    there. ComfyUI lists such names in the dropdown, and "not in the folder, download it" misled (break-it, stop 39)."""
    if ckpt_name.endswith("/"):  # a vendor model folder: the message below says what such a folder needs
        return None
    for base in folder_paths.get_folder_paths("checkpoints"):
        path = os.path.join(base, ckpt_name)
        if os.path.lexists(path) and (kind := not_a_file(path)) not in (None, "a directory"):
            return (f"YuE2 checkpoint '{ckpt_name}' in {base} is {kind}, not a file: a checkpoint is a .safetensors "
                    "file (or a vendor model folder); put the file itself there and refresh (press R)")
        if os.path.isdir(path):  # break-it (stop 41): was "not in ComfyUI's checkpoints folder … Download …"
            return (f"YuE2 checkpoint '{ckpt_name}' in {base} is a folder, not a checkpoint file, and not a vendor "
                    "model folder either (listed as 'NAME/' when it holds config.json with model_type yue2 and its "
                    "weights): put the .safetensors file itself there and refresh (press R)")
    return None


def missing_checkpoint_message(ckpt_name: str, available: list[str]) -> str:
    """The Loader's message for an entry that resolves to no checkpoint: why a listed entry is unusable, or where to
    download the release file and which folders were searched."""
    unusable = not_a_file_entry(ckpt_name)
    if unusable:
        return unusable
    folders = folder_paths.get_folder_paths("checkpoints")
    where = folders[0] if folders else "ComfyUI/models/checkpoints"
    have = (f"Files there now: {', '.join(available[:10])}{' …' if len(available) > 10 else ''}." if available
            else "That folder has no checkpoint files at all.")
    return (f"YuE2 checkpoint '{ckpt_name}' is not in ComfyUI's checkpoints folder. Download {DEFAULT_FILE} "
            f"(3.7 GB, int8) from {DOWNLOAD_URL} — or yue2_3b_bf16.safetensors (7.8 GB) from the same "
            f"{HF_REPO} repository — put it in {where} and refresh (press R); the vendor's {MODEL_REPO} folder (with "
            f"m-a-p/YuE2-Vae beside it) works too. {have} "
            f"Checkpoint folders searched: {', '.join(folders) or where}.")


class YuE2CheckpointLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        names = checkpoint_options()
        default = DEFAULT_FILE if DEFAULT_FILE in names else next((n for n in names if "yue2" in n.lower()), None)
        return io.Schema(
            node_id="YuE2CheckpointLoader",
            display_name="YuE2 Checkpoint Loader",
            category=types.CATEGORY,
            description="Loads a YuE2-3B all-in-one checkpoint (AR expert, NAR expert, VAE and the embedded "
                        "tokenizer), or the vendor's m-a-p/YuE2-3B folder with its m-a-p/YuE2-Vae folder. The format "
                        "(bf16 or int8 ConvRot) is detected from the tensor names, never the file name. Weights are "
                        "read on first use and placed/offloaded by ComfyUI.",
            inputs=[
                io.Combo.Input("ckpt_name", options=names, default=default,
                               tooltip=f"A YuE2 all-in-one .safetensors in ComfyUI's models/checkpoints folder: "
                                       f"{DEFAULT_FILE} (3.7 GB, low VRAM) or yue2_3b_bf16.safetensors (7.8 GB), "
                                       f"from huggingface.co/{HF_REPO}; or a vendor folder (\"YuE2-3B/\": "
                                       f"{MODEL_REPO} with m-a-p/YuE2-Vae beside it), or \"{HF_ENTRY}\" when the "
                                       "vendor runtime already downloaded it."),
            ],
            outputs=[
                types.Model.Output("model", display_name="model",
                                   tooltip="The YuE2 model for the Composer, Renderer, VAE Decode and Load Song "
                                           "nodes."),
                io.String.Output("info", display_name="info",
                                 tooltip="What was detected: format (bf16/int8), dimensions, dtypes per part, "
                                         "compute device and dtype."),
            ],
        )

    @classmethod
    def validate_inputs(cls, ckpt_name=inputs.MISSING) -> bool | str:
        if ckpt_name is inputs.MISSING:  # absent from the prompt: ComfyUI's "Required input is missing" names it
            return True
        bad = inputs.entry_name("ckpt_name", ckpt_name, "a checkpoint from the list")
        if bad:
            return bad
        available = checkpoint_options()
        if ckpt_name in available:
            return True
        return missing_checkpoint_message(ckpt_name, available)

    @classmethod
    def fingerprint_inputs(cls, ckpt_name):
        """A file replaced on disk (another `file_identity`: size, mtime, inode, sampled bytes) re-runs the loader
        instead of reusing its cached model, whose parts are read lazily — a mix of two files' parts otherwise
        (break-it finding, stop 38). A vendor
        model folder: also the VAE folder it decodes with (`find_vae_folder`: its `vae/`, a sibling, the HF cache) —
        break-it review, stop 43: a VAE replaced there was not seen, so the cached model decoded with the old one, or
        (its VAE not read yet) every later run failed with "changed on disk … queue the workflow again"."""
        path = resolve_checkpoint(ckpt_name)
        if not path:
            return ckpt_name
        state = (ckpt_name, file_state(path))
        if os.path.isdir(path):
            try:
                vae = find_vae_folder(path)
            except (YuE2Error, OSError):  # none found: the loader says so when it runs
                return state
            state += (str(vae), file_state(str(vae)))
        return state

    @classmethod
    def execute(cls, ckpt_name) -> io.NodeOutput:
        check_switches(mm.get_torch_device())
        path = resolve_checkpoint(ckpt_name)
        if path is None:
            raise ValueError(missing_checkpoint_message(ckpt_name, checkpoint_options()))
        with user_errors():
            # a vendor folder without a VAE folder loads: a YuE2 VAE Loader after this node gives its decoder (VAE
            # Decode says so without one; new-user review, stop 46)
            info = inspect_checkpoint(path, own_vae="optional")
            tokenizer = load_tokenizer(info)
            model = YuE2Model(info, tokenizer)
            model.start_warm_up()  # kernels compile in the background; the stages wait for it before GPU work
        text = model.describe()
        return io.NodeOutput(model, text, ui=ui.PreviewText(text))
