"""YuE2 Checkpoint Loader: a YuE2 all-in-one safetensors file from ComfyUI's `checkpoints` folders → YUE2_MODEL."""
from __future__ import annotations

import os

import folder_paths
from comfy_api.latest import io, ui

from yue2_core.weights.checkpoint import inspect_checkpoint, load_tokenizer
from yue2_core.weights.locate import HF_FILE, HF_REPO

from . import types
from .model import YuE2Model
from .progress import user_errors

DEFAULT_FILE = os.path.basename(HF_FILE)  # yue2_3b_int8_convrot.safetensors
DOWNLOAD_URL = f"https://huggingface.co/{HF_REPO}/resolve/main/{HF_FILE}"


def missing_checkpoint_message(ckpt_name: str, available: list[str]) -> str:
    folders = folder_paths.get_folder_paths("checkpoints")
    where = folders[0] if folders else "ComfyUI/models/checkpoints"
    have = (f"Files there now: {', '.join(available[:10])}{' …' if len(available) > 10 else ''}." if available
            else "That folder has no checkpoint files at all.")
    return (f"YuE2 checkpoint '{ckpt_name}' is not in ComfyUI's checkpoints folder. Download {DEFAULT_FILE} "
            f"(3.7 GB, int8) from {DOWNLOAD_URL} — or yue2_3b_bf16.safetensors (7.8 GB) from the same "
            f"{HF_REPO} repository — put it in {where} and refresh (press R). {have} "
            f"Checkpoint folders searched: {', '.join(folders) or where}.")


class YuE2CheckpointLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        names = folder_paths.get_filename_list("checkpoints")
        default = DEFAULT_FILE if DEFAULT_FILE in names else next((n for n in names if "yue2" in n.lower()), None)
        return io.Schema(
            node_id="YuE2CheckpointLoader",
            display_name="YuE2 Checkpoint Loader",
            category=types.CATEGORY,
            description="Loads a YuE2-3B all-in-one checkpoint (AR expert, NAR expert, VAE and the embedded "
                        "tokenizer). The format (bf16 or int8 ConvRot) is detected from the tensor names, never the "
                        "file name. Weights are read on first use and placed/offloaded by ComfyUI.",
            inputs=[
                io.Combo.Input("ckpt_name", options=names, default=default,
                               tooltip=f"A YuE2 all-in-one .safetensors in ComfyUI's models/checkpoints folder: "
                                       f"{DEFAULT_FILE} (3.7 GB, low VRAM) or yue2_3b_bf16.safetensors (7.8 GB), "
                                       f"from huggingface.co/{HF_REPO}."),
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
    def validate_inputs(cls, ckpt_name) -> bool | str:
        available = folder_paths.get_filename_list("checkpoints")
        if ckpt_name in available:
            return True
        return missing_checkpoint_message(ckpt_name, available)

    @classmethod
    def execute(cls, ckpt_name) -> io.NodeOutput:
        path = folder_paths.get_full_path("checkpoints", ckpt_name)
        if path is None:
            raise ValueError(missing_checkpoint_message(ckpt_name, folder_paths.get_filename_list("checkpoints")))
        with user_errors():
            info = inspect_checkpoint(path)
            tokenizer = load_tokenizer(info)
        model = YuE2Model(info, tokenizer)
        text = model.describe()
        return io.NodeOutput(model, text, ui=ui.PreviewText(text))
