"""YuE2 LoRA: an adapter file from ComfyUI's `loras` folders on both experts → a new YUE2_MODEL (the input stays
unpatched). The file is parsed once per version of the files it reads (`layouts_io.read_state`: its size, mtime,
inode and ctime, and those of an adapter_config.json or FL companion beside it) in this process, so changing a
strength re-runs the node without reading the adapter or the checkpoint again."""
from __future__ import annotations

import logging
import os

import folder_paths
from comfy_api.latest import io, ui

from yue2_core.weights.lora.apply import (STRENGTH_RANGE, Applied, check_replacements, check_strength, check_unique,
                                          idle_notes, replace_notes)
from yue2_core.weights.lora.layouts import adapter_notes, describe_adapter, read_adapter
from yue2_core.weights.lora.layouts_io import read_state

from . import inputs, types
from .progress import user_errors

log = logging.getLogger("ComfyUI-YuE2")
_PARSED: dict = {}  # (abs path, read_state, dims) → Adapter


def cached_adapter(path: str, dims):
    """The parsed adapter at `path` for a model of `dims`, read once per version of every file it reads
    (`read_state`: a sidecar or companion added, changed or removed reads it again; AdapterError on bad input)."""
    key = (os.path.abspath(path), read_state(path), tuple(sorted(vars(dims).items())))
    if key not in _PARSED:
        adapter = read_adapter(path, dims)
        log.info("[YuE2] LoRA read from %s: %s, %d patches", path, adapter.layout, len(adapter.patches))
        if len(_PARSED) >= 16:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[key] = adapter
    return _PARSED[key]


def lora_files() -> list[str]:
    """Files in ComfyUI's `loras` folders (subfolders listed as "sub/name.safetensors"), plus `.pt` adapters."""
    names = set(folder_paths.get_filename_list("loras"))
    for folder in folder_paths.get_folder_paths("loras"):
        for dirpath, _, files in os.walk(folder, followlinks=True):
            for f in files:
                if f.endswith(".pt"):
                    names.add(os.path.relpath(os.path.join(dirpath, f), folder).replace(os.sep, "/"))
    return sorted(names)


def lora_path(name: str) -> str | None:
    path = folder_paths.get_full_path("loras", name)
    if path is None:
        for folder in folder_paths.get_folder_paths("loras"):
            cand = os.path.join(folder, name)
            if os.path.isfile(cand) and os.path.abspath(cand).startswith(os.path.abspath(folder) + os.sep):
                return cand
    return path


def missing_message(lora_name: str) -> str:
    """The LoRA node's message for a name that is in no `loras` folder, with what is listed there now, as the
    Checkpoint and VAE Loaders say (new-user review 52: a shipped workflow's `my_yue2_lora.safetensors` beside the
    synthetic adapters the guide writes named none of them)."""
    folders = folder_paths.get_folder_paths("loras")
    names = lora_files()
    listed = (f" Listed now: {', '.join(repr(n) for n in names[:8])}{' …' if len(names) > 8 else ''}." if names
              else " That folder has no adapter files at all.")
    return (f"LoRA {lora_name!r} is not in ComfyUI's loras folder ({', '.join(folders) or 'models/loras'}); "
            f"put the adapter file there and refresh (press R), or pick one that is listed.{listed}")


class YuE2LoRA(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        strength = dict(default=1.0, min=-STRENGTH_RANGE, max=STRENGTH_RANGE, step=0.05)
        return io.Schema(
            node_id="YuE2LoRA",
            display_name="YuE2 LoRA",
            category=types.CATEGORY,
            description="Applies a LoRA / LoKr adapter to the AR expert (lead sheet + music tokens) and the NAR "
                        "expert (rendering). Every published YuE2 layout is read (ai-toolkit, Comfy-native, "
                        "Mothersuperior, FL, HOT-Step, Starnodes, PEFT with adapter_config.json, LoKr); the report "
                        "says what was detected and applied and lists every key that matched nothing. bf16 weights "
                        "are merged (no cost per token); int8 weights keep their codes and add the exact low-rank "
                        "delta beside them. Chain several nodes to stack adapters; the input model stays unchanged.",
            inputs=[
                types.Model.Input("model", tooltip="A YuE2 model (Checkpoint Loader, VAE Loader or another LoRA)."),
                io.Combo.Input("lora_name", options=lora_files(),
                               tooltip="An adapter in ComfyUI's models/loras folder (.safetensors; .pt read "
                                       "without pickle; a PEFT adapter_model.safetensors reads the "
                                       "adapter_config.json beside it)."),
                io.Float.Input("strength_ar", **strength,
                               tooltip="Multiplier of the adapter's AR delta (lead sheet and music tokens); 0 turns "
                                       "the adapter off on the AR. The layout's own scale (alpha/rank, …) is "
                                       "applied on top, see the report."),
                io.Float.Input("strength_nar", **strength,
                               tooltip="Multiplier of the adapter's NAR delta (rendering tokens to latents); 0 "
                                       "turns it off on the NAR, including full-layer replacements."),
            ],
            outputs=[
                types.Model.Output("model_out", display_name="model",
                                   tooltip="The model with this adapter added (shares the input's weights)."),
                io.String.Output("report", display_name="report",
                                 tooltip="Layout, rank(s), scale rule and value, modules patched per expert, "
                                         "replacements, and unmatched keys."),
            ],
        )

    @classmethod
    def validate_inputs(cls, lora_name=inputs.MISSING) -> bool | str:
        if lora_name is inputs.MISSING:  # absent from the prompt: ComfyUI's "Required input is missing" names it
            return True
        bad = inputs.entry_name("lora_name", lora_name, "a LoRA file from the list")
        if bad:
            return bad
        if lora_path(lora_name) is None:
            return missing_message(lora_name)
        return True

    @classmethod
    def fingerprint_inputs(cls, lora_name, **kwargs):
        """A file replaced on disk (another `stat_identity`: size, mtime, inode, ctime) re-runs the node instead of
        reusing the cached adapter
        (break-it finding, stop 38: the old adapter was applied and the new file's sha256 recorded) — the adapter's
        main file and every other file it reads (`read_state`: an adapter_config.json beside a PEFT file, an FL
        companion; stop 40: a sidecar added later was not seen, and `render` then refused the song)."""
        path = lora_path(lora_name)
        return (lora_name, read_state(path)) if path else lora_name

    @classmethod
    def execute(cls, model, lora_name, strength_ar=1.0, strength_nar=1.0) -> io.NodeOutput:
        path = lora_path(lora_name)
        if path is None:
            raise ValueError(cls.validate_inputs(lora_name))
        with user_errors():
            s_ar = check_strength(strength_ar, "strength_ar")
            s_nar = check_strength(strength_nar, "strength_nar")
            adapter = cached_adapter(path, model.dims)
        applied = Applied(adapter, s_ar, s_nar)
        # refused here, not at the first stage that loads the model (stop 40): an FL NAR file that its AR file already
        # reads, two different replacements of one module
        with user_errors():
            out = model.derive(adapter=applied)
            stack = list(out.adapters)
            check_unique(stack)
            check_replacements(stack)
        text = f"{describe_adapter(adapter)}\nstrengths: AR ×{s_ar:g}, NAR ×{s_nar:g}"
        # keys that patch nothing, an entry that changes nothing, deltas added to a replacement: said at the top of
        # the report and in the log, not only listed below
        earlier = replace_notes(list(model.adapters))
        notes = [n for n in (*adapter_notes(adapter), *idle_notes([applied]), *replace_notes(stack))
                 if n and n not in earlier]
        for note in notes:
            log.warning("[YuE2] %s", note)
        text = "".join(f"warning: {n}\n" for n in notes) + text
        if len(out.adapters) > 1:
            text += f"\nstacked on {len(out.adapters) - 1} earlier adapter(s): deltas add"
        return io.NodeOutput(out, text, ui=ui.PreviewText(text))
