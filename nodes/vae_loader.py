"""YuE2 VAE Loader: another YuE2 VAE decoder (m-a-p/YuE2-Vae, YuE2-Vae-legacy, the 0.666 merge, or any file with the
YuE2 decoder's tensors) from ComfyUI's `vae` folders → a new YUE2_MODEL that decodes with it (the input model keeps
its own VAE). Detection and checks: `yue2_core.weights.vae_files.open_vae`."""
from __future__ import annotations

import json
import os

import folder_paths
from comfy_api.latest import io, ui

from yue2_core.weights.checkpoint import file_state
from yue2_core.weights.vae_files import CONFIG, MODEL_TYPE, open_vae

from . import inputs, types
from .progress import user_errors


def _is_vendor_folder(path: str) -> bool:
    """A folder whose config.json says model_type "yue2_vae" (read as JSON; anything unreadable is not one)."""
    try:
        with open(os.path.join(path, CONFIG), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(config, dict) and config.get("model_type") == MODEL_TYPE


def vendor_folders() -> dict[str, str]:
    """{"rel/name/": absolute path} of the vendor VAE folders under ComfyUI's `vae` folders (first folder wins)."""
    found = {}
    for root in folder_paths.get_folder_paths("vae"):
        if not os.path.isdir(root):
            continue
        for dirpath, dirnames, _ in os.walk(root, followlinks=True):
            dirnames.sort()
            keep = []
            for d in dirnames:
                full = os.path.join(dirpath, d)
                if _is_vendor_folder(full):
                    found.setdefault(os.path.relpath(full, root).replace(os.sep, "/") + "/", full)
                else:
                    keep.append(d)
            dirnames[:] = keep  # never list the files inside a vendor folder separately
    return found


def vae_names() -> list[str]:
    """The combo's options: vendor folders ("name/") first, then the files ComfyUI lists in its `vae` folders,
    minus the weights inside those vendor folders."""
    folders = vendor_folders()
    files = [n for n in folder_paths.get_filename_list("vae") if not any(n.startswith(f) for f in folders)]
    return sorted(folders) + files


def vae_path(name: str) -> str | None:
    """Absolute path of a combo entry (a vendor folder or a file), None when it is not in a `vae` folder."""
    if name.endswith("/"):
        return vendor_folders().get(name)
    return folder_paths.get_full_path("vae", name)


def missing_message(name: str) -> str:
    """The VAE Loader's message for an entry that is not there: the entry meant when only the trailing "/" of a
    vendor folder is missing (an API prompt written by hand, new-user review stop 39), else what is listed."""
    folders = folder_paths.get_folder_paths("vae")
    names = vae_names()
    if isinstance(name, str) and name.rstrip("/") + "/" in names:
        return (f"VAE {name!r} is not an entry of the list: the vendor VAE folder is listed as "
                f"{name.rstrip('/') + '/'!r} (folders end with '/'); pick that one")
    listed = (f" Listed now: {', '.join(repr(n) for n in names[:8])}{' …' if len(names) > 8 else ''}." if names
              else "")
    return (f"VAE {name!r} is not in ComfyUI's vae folder ({', '.join(folders) or 'models/vae'}). Put a YuE2 VAE "
            "there — the vendor folder (config.json + model.safetensors, e.g. m-a-p/YuE2-Vae-legacy) or a "
            f".safetensors with decoder.* / vae.decoder.* tensors — and refresh (press R).{listed}")


class YuE2VAELoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="YuE2VAELoader",
            display_name="YuE2 VAE Loader",
            category=types.CATEGORY,
            description="Decodes with another YuE2 VAE decoder: m-a-p/YuE2-Vae (standard), YuE2-Vae-legacy, the "
                        "0.666 merge, or any file holding the YuE2 Oobleck decoder (decoder.* or vae.decoder.* "
                        "tensors; decoder-only files work, a whole Comfy checkpoint gives its VAE). The releases "
                        "share the architecture and differ only in decoder weights; the variant comes from the "
                        "folder's config.json (release_variant), never the file name. The input model keeps its own "
                        "VAE; the VAE runs in float32 like the checkpoint's.",
            inputs=[
                types.Model.Input("model", tooltip="A YuE2 model (Checkpoint Loader, LoRA or another VAE Loader)."),
                io.Combo.Input("vae_name", options=vae_names(),
                               tooltip="A YuE2 VAE in ComfyUI's models/vae folder: a vendor folder (listed as "
                                       "\"name/\": config.json with model_type yue2_vae + model.safetensors, "
                                       "F32, ≈ 530 MB) or a .safetensors file. It must decode 64 latent channels "
                                       "at 1920 samples per frame (25 frames/s → 48 kHz stereo)."),
            ],
            outputs=[
                types.Model.Output("model_out", display_name="model",
                                   tooltip="The model decoding with this VAE (shares the input's AR/NAR weights)."),
                io.String.Output("info", display_name="info",
                                 tooltip="The variant (standard / legacy / merge / unknown), the layout read, the "
                                         "decoder's channels, blocks and samples per frame, and the tensor dtypes."),
            ],
        )

    @classmethod
    def validate_inputs(cls, vae_name=inputs.MISSING) -> bool | str:
        if vae_name is inputs.MISSING:  # absent from the prompt: ComfyUI's "Required input is missing" names it
            return True
        bad = inputs.entry_name("vae_name", vae_name, "a VAE from the list")
        if bad:
            return bad
        return True if vae_path(vae_name) is not None else missing_message(vae_name)

    @classmethod
    def fingerprint_inputs(cls, vae_name, **kwargs):
        """A replaced file (another `file_identity`: size, mtime, inode, sampled bytes) re-runs the node instead of
        reusing the cached model."""
        path = vae_path(vae_name)
        if path is None:
            return None
        return (path, file_state(path))  # a folder: every file in it (config.json, shards), not model.safetensors only

    @classmethod
    def execute(cls, model, vae_name) -> io.NodeOutput:
        path = vae_path(vae_name)
        if path is None:
            raise ValueError(missing_message(vae_name))
        with user_errors():
            vae = open_vae(path)
            out = model.derive(vae_file=vae)
        text = f"VAE decoder: {vae.describe()}"
        own = model.info.vae
        if own is None:  # a vendor model folder without a VAE folder: this one is its decoder
            text += "\nThe checkpoint has no VAE of its own (a vendor folder without one): this one decodes."
        elif vae.config != own:
            text += ("\nIts geometry differs from the checkpoint's VAE (channels "
                     f"{own.first_channels} → {vae.config.first_channels}); it decodes the same 64-channel latents.")
        if model.vae_file is not None:
            text += f"\nreplaces the VAE of the input model ({model.vae_file.describe()})"
        return io.NodeOutput(out, text, ui=ui.PreviewText(text))
