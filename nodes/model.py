"""The object on a YUE2_MODEL socket: checkpoint info, tokenizer and one ComfyUI ModelPatcher per part.

Each part (AR expert, NAR expert, VAE decoder) is built on first use with `yue2_core.weights.checkpoint.load_*` on ComfyUI's
offload device, wrapped in a `PartModule` and handed to a `comfy.model_patcher.ModelPatcher`. Before every stage the
nodes call `YuE2Model.load(parts, memory_required)`, which asks ComfyUI's model management to place those parts on
the compute device (offloading other models, ours included, when memory is short) and returns the engine modules
for that one call; nothing else keeps a reference to them.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading

import comfy.model_management as mm
from comfy.cli_args import args as comfy_args
import comfy.model_patcher
import torch
from torch import nn

from comfy.weight_adapter.base import WeightAdapterBase
from yue2_core.errors import AdapterError, CheckpointError
from yue2_core.weights.checkpoint import (CheckpointInfo, file_state, load_ar, load_nar, load_vae,
                                         missing_vae_message)
from yue2_core.weights.lora.apply import merge_into, plan_expert, set_side, side_deltas
from yue2_core.weights.lora.model import BiasDiff, Replace
from yue2_core.weights.lora.record import STACK_RULES, lora_record
from yue2_core.weights import own
from yue2_core.constants import CODEC_OFFSET, CODEC_SIZE, MUSIC_END
from yue2_core.nar import adapters_want_bf16, auto_mode, keeps_int8, keeps_w8a8, prepare_linears
from yue2_core import warmup

log = logging.getLogger("ComfyUI-YuE2")

# Where each part lives in the all-in-one file; PartModule registers the engine module under this path, so the
# patcher's parameter names are the checkpoint keys (e.g. text_encoders.model.layers.0.self_attn.qkv_proj.weight) and
# ComfyUI weight patches (LoRA) keyed like the file can address them.
PREFIXES = {"ar": "text_encoders", "nar": "model.diffusion_model", "vae": "vae"}
NAMES = {"ar": "AR expert", "nar": "NAR expert", "vae": "VAE decoder"}


LATER = {"ar": ("nar", "vae"), "nar": ("vae",)}  # the parts the stages after one using a part will load


def reads_ahead(device: torch.device) -> bool:
    """Whether `YuE2Model.load` starts reading the later stages' parts in the background (`prefetch`): on CUDA
    devices, where the stage then runs on the GPU and the CPU is idle. Not on a CPU device: the read would take the
    cores the stage computes on."""
    return device.type == "cuda"


@contextlib.contextmanager
def _nothing():
    yield


def load_whole(patcher) -> None:
    """Finish a load that ComfyUI left partial: under `--novram` (VRAMState.NO_VRAM) `load_models_gpu` gives every
    model a budget of 0.1 bytes even with `force_full_load=True` (comfy/model_management.py, 0.3.75), and a
    ModelPatcher then moves none of the modules that lack ComfyUI's cast-on-the-fly ops — all of ours — while it
    sets the model's `device` to the GPU. The stages follow their weights, so every song ran on the CPU without a
    word (H100, tiny checkpoint: music 48 instead of 359 tok/s;
    docs/experiments/gpu_nodes_novram_h100_2026-12-06.json). Loaded whole instead (weights on the load device,
    ComfyUI's accounting says so), with one log line; the next stage's load unloads it as usual when memory is
    short. A no-op for a load that is already whole.

    A part that ComfyUI unloaded partially under memory pressure (`partially_unload`) and then reloads under
    `--novram` is left with only some modules on the device and `model_lowvram` False, the flag `partially_load`
    reads as "loaded completely" (it returns at once when bytes are loaded): marked partial first, so the full-load
    path runs (review 42; tests/nodes/test_nodes_novram.py)."""
    size = patcher.model_size()
    if patcher.loaded_size() >= size:
        return
    if patcher.loaded_size() > 0:
        patcher.model.model_lowvram = True  # what it is: partly loaded (ComfyUI's `load` cleared it)
    if not getattr(load_whole, "said", False):
        load_whole.said = True
        log.info("[YuE2] ComfyUI loaded a YuE2 part partially (--novram?); its parts run only whole, so each is "
                 "loaded whole for its stage and unloaded by the next stage's load when memory is short")
    patcher.partially_load(patcher.load_device, size + 1)  # more than the model: ModelPatcher's full-load path


class PartModule(nn.Module):
    """One engine module registered under its checkpoint prefix, with the plain `device` attribute ModelPatcher
    reads and writes (the engine modules expose `device` as a read-only property)."""

    def __init__(self, part: str, module: nn.Module, device: torch.device):
        super().__init__()
        *parents, leaf = PREFIXES[part].split(".")
        holder = self
        for name in parents:
            holder.add_module(name, nn.Module())
            holder = getattr(holder, name)
        holder.add_module(leaf, module)
        self.part_name = part
        self.device = device

    @property
    def engine_module(self) -> nn.Module:
        return self.get_submodule(PREFIXES[self.part_name])

    def get_dtype(self) -> torch.dtype:
        return next(p.dtype for p in self.parameters() if p.dtype.is_floating_point)


class YuE2ARExpert(PartModule):
    """The AR expert (text_encoders.*) as ComfyUI sees it."""


class YuE2NARExpert(PartModule):
    """The NAR expert (model.diffusion_model.*) as ComfyUI sees it."""


class YuE2VAEDecoder(PartModule):
    """The VAE decoder (vae.*) as ComfyUI sees it."""


PART_CLASSES = {"ar": YuE2ARExpert, "nar": YuE2NARExpert, "vae": YuE2VAEDecoder}


def compute_dtype(device: torch.device) -> torch.dtype:
    """bf16 wherever ComfyUI says bf16 works, fp32 otherwise (e.g. pre-Ampere GPUs, --force-fp32). On the CPU the
    reference runs bf16 too (ComfyUI would pick fp32 there); on the tiny model bf16 measured as fast as fp32."""
    if mm.FORCE_FP32:
        return torch.float32
    if device.type == "cpu":
        return torch.bfloat16
    return torch.bfloat16 if mm.should_use_bf16(device) else torch.float32


class YuE2Delta(WeightAdapterBase):
    """A ComfyUI weight patch that adds adapters' deltas to one float weight (or bias) with the engine's own
    arithmetic (`yue2_core.weights.lora.apply.merge_into`: fp32, in stack order); ModelPatcher then rounds to the
    weight's dtype, keeps the backup and unpatches as for any LoRA."""
    name = "yue2_adapter"

    def __init__(self, items, bias: bool = False):
        self.items, self.bias, self.loaded_keys, self.weights = items, bias, set(), []

    def calculate_weight(self, weight, key, strength, strength_model, offset, function,
                         intermediate_dtype=torch.float32, original_weight=None):
        return merge_into(weight, self.items, bias=self.bias)


BUILD_WAIT_POLL_S = 0.05  # how often a stage waiting for the background read looks at ComfyUI's Cancel (seconds)


def _checkpoint_state(info: CheckpointInfo) -> tuple:
    """`file_state` of the checkpoint and of a vendor layout's other folders (its VAE, tokenizer)."""
    return tuple(file_state(p) for p in (info.path, *sorted(set(info.files.values()) - {info.path})))


class YuE2Model:
    """A YuE2 checkpoint for the nodes. `info` (CheckpointInfo), `tokenizer`, `dtype` (AR/NAR compute dtype; the VAE
    is fp32), `device` (where the stages run), `adapters` (LoRA stack: `Applied` entries, oldest first), `vae_file`
    (a `weights.vae_files.VAEFile` replacing the checkpoint's VAE, or None).

    The model a Checkpoint Loader makes is the *root*: it owns one ModelPatcher per part, read from the file on first
    use. `derive()` makes a new model for the LoRA and VAE nodes that shares the root's weights: its AR/NAR patchers
    are ComfyUI clones carrying weight patches for float layers, and its int8 ConvRot layers get their side deltas
    set when it is loaded (`load`), so the root stays usable unpatched in the same graph."""

    def __init__(self, info: CheckpointInfo, tokenizer, *, root: "YuE2Model | None" = None,
                 adapters: tuple = (), vae_file=None):
        self.info = info
        self.tokenizer = tokenizer
        self._root = root  # None for a root: `root` is then the model itself, with no reference cycle, so a root
        # nothing uses any more is freed at once with its parts' GPU memory (not at the next full collection)
        self.adapters = tuple(adapters)
        self.vae_file = vae_file
        if root is None:
            self.device = mm.get_torch_device()
            self.offload_device = mm.unet_offload_device()
            self.vae_device = mm.vae_device()
            self.vae_offload_device = mm.vae_offload_device()
            self.dtype = compute_dtype(self.device)
            self._vae_patchers: dict = {}  # VAE file key → ModelPatcher (root only; shared by derived models)
            # held while any model of this root builds a patcher, by the stages and by `prefetch`'s thread
            self._build_lock = threading.RLock()
            self._prefetch_thread = None
            self._file_state = _checkpoint_state(info)  # the file(s) as the loader read them (`_root_patcher`)
        else:
            for name in ("device", "offload_device", "vae_device", "vae_offload_device", "dtype"):
                setattr(self, name, getattr(root, name))
        # what a song records of the adapters and the VAE file, taken when each was added (`derive`), so a file
        # deleted or replaced on disk later neither fails the Renderer after its work nor records the new file's
        # sha256 beside the old file's weights (break-it, stop 41)
        self._lora_records: tuple = ()
        self._vae_record = None
        self._warm = None  # the root's background warm-up (yue2_core.warmup), started by the Checkpoint Loader
        self._patchers: dict[str, comfy.model_patcher.ModelPatcher] = {}
        self._sides: dict = {}  # part → {module: SideDelta} (int8 layers), made with the patchers
        self._side_cache: dict = {}  # (part, device) → the same on that device

    @property
    def root(self) -> "YuE2Model":
        """The model the Checkpoint Loader made (itself for a root), which owns the parts' patchers."""
        return self if self._root is None else self._root

    def derive(self, *, adapter=None, vae_file=None) -> "YuE2Model":
        """A new model sharing this one's weights, with `adapter` (an `Applied`) added on top of this model's stack
        and/or `vae_file` replacing the VAE. Their records (file, sha256, …) are taken now, from the files as the
        node read them; AdapterError / CheckpointError when a file can no longer be read."""
        out = YuE2Model(self.info, self.tokenizer, root=self.root,
                        adapters=self.adapters + ((adapter,) if adapter is not None else ()),
                        vae_file=vae_file if vae_file is not None else self.vae_file)
        out._lora_records, out._vae_record = self._lora_records, self._vae_record
        if adapter is not None:
            try:
                out._lora_records += (lora_record(adapter),)
            except OSError as exc:
                raise AdapterError(f"LoRA {adapter.adapter.path} can no longer be read ({exc.strerror or exc}): it "
                                   "was moved or deleted after it was opened; put it back and queue again") from None
        if vae_file is not None:
            try:
                out._vae_record = vae_file.record()
            except OSError as exc:
                raise CheckpointError(f"VAE {vae_file.path} can no longer be read ({exc.strerror or exc}): it was "
                                      "moved or deleted after it was opened; put it back and queue again") from None
        return out

    def start_warm_up(self) -> None:
        """Compile the fast path's kernels in the background while nothing is loaded yet (CUDA only; YUE2_WARMUP=0
        turns it off); ComfyUI's Cancel stops it."""
        self._warm = warmup.start_for_checkpoint(self.info, self.device, self.dtype,
                                                  getattr(mm, "processing_interrupted", None))

    def wait_warm_up(self) -> None:
        """Wait for the root's warm-up (before the first GPU work of a stage)."""
        warm, self.root._warm = self.root._warm, None
        if warm is not None:
            warm.wait()

    @property
    def dims(self):
        return self.info.dims

    def weights_record(self) -> dict:
        """What a song records of this model's own weights (config.json "weights"): every adapter (file, sha256,
        strengths, layout) and the VAE file, if any; `lora_int8` "side" when int8 layers of the parts loaded so far
        got the adapters (the nodes always apply them as exact side deltas), as the command line records its mode
        (`YuE2Engine.load`), so a `render` under YUE2_LORA_INT8=bf16 says that it changes the song (review, stop 41:
        node songs recorded none); `nar_linears` "w8a8" when the NAR read so far keeps its int8 layers for W8A8
        products (YUE2_NAR_LINEARS: w8a8, or auto on a Hopper GPU), which a `render` without it notes."""
        out = {"loras": [dict(r) for r in self._lora_records],  # taken by `derive`, when each file was read
               "vae": None if self._vae_record is None else dict(self._vae_record)}
        if self.int8_patched():
            out["lora_int8"] = "side"
        if self.adapters:  # the stacking rule (a replacement first), as `YuE2Engine.load` records it
            out["stack_rules"] = STACK_RULES
        if self._read_nar() is not None and self.nar_linears() == "w8a8":  # W8A8 took effect (YUE2_NAR_LINEARS)
            out["nar_linears"] = "w8a8"
        return out

    def _read_nar(self):
        """This model's NAR patcher when read (a clone of the root's, or for adapters the bf16 root's: `_patcher`),
        else the root's; None before either was read."""
        return self._patchers.get("nar") or (None if self.adapters else self.root._patchers.get("nar"))

    def _adapts_nar(self) -> bool:
        """Whether an adapter of this model patches the NAR (a NAR strength ≠ 0 and NAR patches)."""
        return any(a.strength("nar") != 0 and any(p.expert == "nar" for p in a.adapter.patches) for a in self.adapters)

    def nar_linears(self) -> str | None:
        """How this model's NAR multiplies, as a song records it: "w8a8" where its int8 layers keep their codes for
        W8A8 products, None for float layers. The NAR read (`_read_nar`) says; before it is read, what it will be
        (Load Song's note, `songs.nar_linears_notes`): an int8 file's NAR on CUDA in `prepare_linears`' terms
        (`nar.keeps_int8` for the compute device), unless adapters reaching it take the bf16 root under auto
        (`_patcher`, `nar.adapters_want_bf16`)."""
        nar = self._read_nar()
        if nar is not None:
            return "w8a8" if keeps_w8a8(nar.model.engine_module) else None
        if not self._root_keeps_int8():
            return None
        return None if auto_mode() and self._adapts_nar() else "w8a8"

    def _root_keeps_int8(self) -> bool:
        """Whether the root's NAR, once read, keeps its int8 layers for W8A8 products (`prepare_linears` on the
        compute device: an int8 file's NAR on CUDA where `nar.keeps_int8`)."""
        return bool(self.info.quant_nar) and self.device.type == "cuda" and keeps_int8(self.dtype, self.device)

    def int8_patched(self) -> bool:
        """Whether this model's adapters reach int8 layers of the AR / NAR parts made so far (`patcher`: the side
        deltas planned with their clones; the NAR on CUDA has float layers, `float_linears`)."""
        return any(self._sides.get(p) for p in ("ar", "nar"))

    def __str__(self) -> str:
        """What ComfyUI's Preview as Text shows for a model socket: the loader's description, not "<…custom_nodes/
        ComfyUI-YuE2.nodes.model.YuE2Model object at 0x…>" (review, stop 44)."""
        return self.describe()

    def describe(self) -> str:
        text = (f"{self.info.summary()}\n\ncompute: AR/NAR {str(self.dtype).split('.')[-1]} on {self.device}, "
                f"VAE float32 on {self.vae_device}; weights are read on first use and offloaded by ComfyUI")
        for a in self.adapters:
            text += (f"\nLoRA {os.path.basename(a.adapter.path)} ({a.adapter.layout}): AR ×{a.strength_ar:g}, "
                     f"NAR ×{a.strength_nar:g}")
        if self.vae_file is not None:
            text += f"\nVAE decoder from {self.vae_file.describe()}"
        return text

    def decoder_config(self):
        """The geometry of the VAE this model decodes with: its VAE file's (a VAE Loader), else the checkpoint's.
        CheckpointError for a vendor model folder without a VAE folder and no VAE Loader (the Checkpoint Loader
        accepts one: new-user review, stop 46)."""
        if self.vae_file is not None:
            return self.vae_file.config
        if self.info.vae is None:
            raise CheckpointError(missing_vae_message(self.info.path))
        return self.info.vae

    def _root_patcher(self, part: str, layers: str | None = None) -> comfy.model_patcher.ModelPatcher:
        """The root's patcher of `part`, read from the checkpoint on first use. CheckpointError when the file changed
        on disk since the loader read its header: the parts would come from two files (break-it finding, stop 38).
        `layers="bf16"` (the NAR for adapters where YUE2_NAR_LINEARS=auto chose W8A8, `nar.adapters_want_bf16`): a
        second root NAR with bf16 layers, which adapters patch merged, as before W8A8 was the default."""
        key = part if layers is None else f"{part}:{layers}"
        if key not in self._patchers:
            if _checkpoint_state(self.info) != self._file_state:
                raise CheckpointError(f"the checkpoint {self.info.path} changed on disk since the YuE2 Checkpoint "
                                      "Loader read it (its size, modification time, inode or sampled bytes differ), so "
                                      f"its {part.upper()} part would come from another file than the parts already "
                                      "read; queue the workflow again (the loader then reads the new file)")
            self.info.to_dict()  # its content samples, taken now: the song records the file read, not a later one
            if part == "vae":
                load_dev, offload_dev = self.vae_device, self.vae_offload_device
                module = load_vae(self.info, offload_dev)
            else:
                load_dev, offload_dev = self.device, self.offload_device
                module = (load_ar if part == "ar" else load_nar)(self.info, offload_dev, self.dtype)
                if part == "nar" and load_dev.type == "cuda":
                    # The engine renders on CUDA with the NAR's int8 linears dequantized to bf16 (faster GEMMs) and
                    # converts them in place on first use; do it here, before ComfyUI sizes the model, so its memory
                    # accounting matches what it moves. The arithmetic runs on the GPU (seconds on a CPU).
                    # (W8A8, the default on Hopper GPUs: the codes stay, marked for int8 × int8 products:
                    # nar.prepare_linears)
                    prepare_linears(module, work_device=load_dev,
                                    pinned=not getattr(comfy_args, "disable_pinned_memory", False), layers=layers)
            self._patchers[key] = self._wrap(part, module, load_dev, offload_dev, self.info.path)
        return self._patchers[key]

    def _wrap(self, part, module, load_dev, offload_dev, source) -> comfy.model_patcher.ModelPatcher:
        holder = PART_CLASSES[part](part, module, offload_dev)
        patcher = comfy.model_patcher.ModelPatcher(holder, load_device=load_dev, offload_device=offload_dev,
                                                   size=mm.module_size(holder))
        log.info("[YuE2] %s read from %s (%.1f MiB)", NAMES[part], source, mm.module_size(holder) / 2 ** 20)
        return patcher

    def patcher(self, part: str) -> comfy.model_patcher.ModelPatcher:
        """The part's ModelPatcher: the root's (read on first use), a VAE file's, or a clone with this model's
        adapters as weight patches. Waits while `prefetch`'s thread builds a part; ComfyUI's Cancel ends that wait
        at once (InterruptProcessingException; the thread finishes its part for the next run)."""
        lock = self.root._build_lock
        while not lock.acquire(timeout=BUILD_WAIT_POLL_S):
            mm.throw_exception_if_processing_interrupted()
        try:
            return self._patcher(part)
        finally:
            lock.release()

    def prefetch(self, parts) -> None:
        """Build `parts`' patchers (the file read into CPU memory and checked; the NAR's int8 linears turned into
        bf16 on the GPU, on the warm-up's side stream) in a background thread, while the stage that called this works
        on the GPU. `load` starts it on CUDA for the parts after its own — the Composer's music decode then hides
        the Renderer's and VAE Decode's reading. A failure is dropped: the stage that needs the part reads it again
        and raises the error itself. One prefetch thread a root at a time (a running one is left to finish)."""
        root, todo = self.root, list(parts)
        if not todo or (root._prefetch_thread is not None and root._prefetch_thread.is_alive()):
            return

        def run():
            from yue2_core.fast.decode import CAPTURE_LOCK
            stream = warmup.side_stream(self.device) if self.device.type == "cuda" else None
            for part in todo:
                # No CUDA call of this thread while the stage captures a graph (every capture holds CAPTURE_LOCK;
                # in mode "global" another thread's cudaMalloc, copy or sync invalidates it): the NAR's conversion
                # takes the lock layer by layer (`nar.float_linears`), a part read straight onto a GPU (an offload
                # device that is not the CPU: --highvram, --gpu-only) holds it for the whole read, and so does the
                # stream sync below. The root's build lock first, as the stages take the two (no lock-order cycle).
                offload = self.vae_offload_device if part == "vae" else self.offload_device
                on_gpu = stream is not None and torch.device(offload).type != "cpu"
                try:
                    with root._build_lock, CAPTURE_LOCK if on_gpu else _nothing(), \
                            torch.cuda.stream(stream) if stream is not None else _nothing():
                        self.patcher(part)
                    if stream is not None:
                        with CAPTURE_LOCK:
                            stream.synchronize()
                except Exception as exc:  # the stage that needs the part reads it again and raises this itself
                    log.debug("[YuE2] background read of the %s failed (%s); its stage reads it again",
                              NAMES[part], exc)
                    return
        root._prefetch_thread = threading.Thread(target=run, name="yue2-prefetch", daemon=True)
        root._prefetch_thread.start()

    def _patcher(self, part: str) -> comfy.model_patcher.ModelPatcher:
        root = self.root
        if part == "vae":
            if self.vae_file is None:
                return root._root_patcher("vae")
            key = self.vae_file.key
            if key not in root._vae_patchers:
                module = self.vae_file.load(self.vae_offload_device)
                root._vae_patchers[key] = self._wrap("vae", module, self.vae_device, self.vae_offload_device,
                                                     self.vae_file.path)
            return root._vae_patchers[key]
        if not self.adapters:
            return root._root_patcher(part)
        if part not in self._patchers:
            expert = "ar" if part == "ar" else "nar"
            bf16_root = expert == "nar" and self._adapts_nar() and auto_mode() and self._root_keeps_int8()
            # (known before reading: a LoRA model never reads the W8A8 root NAR it would not use)
            base = root._root_patcher(part, layers="bf16" if bf16_root else None)
            if expert == "nar" and not bf16_root and self._adapts_nar() \
                    and adapters_want_bf16(base.model.engine_module):  # a root marked otherwise (tests, CPU)
                base = root._root_patcher(part, layers="bf16")
            engine = base.model.engine_module
            floats, ints = plan_expert(engine, list(self.adapters), expert)
            clone = base.clone()
            prefix = PREFIXES[part]
            patches = {}
            for name, items in floats.items():
                patches[f"{prefix}.{name}.weight"] = YuE2Delta(items)
                if any(isinstance(p.delta, BiasDiff) or (isinstance(p.delta, Replace) and p.delta.bias is not None)
                       for _, p in items):
                    patches[f"{prefix}.{name}.bias"] = YuE2Delta(items, bias=True)
            if patches:
                clone.add_patches(patches, 1.0, 1.0)
            self._sides[part] = side_deltas(engine, ints)
            self._patchers[part] = clone
        return self._patchers[part]

    def side_bytes(self, parts) -> int:
        """Bytes the int8 layers' side deltas of `parts` take on the device (added to the working memory)."""
        for p in parts:
            if p != "vae":
                self.patcher(p)
        return sum(s.nbytes() for p in parts for s in self._sides.get(p, {}).values())

    def load(self, parts: tuple[str, ...], memory_required: int) -> list[nn.Module]:
        """Place `parts` on their compute device with `memory_required` bytes of working memory free, and return
        their engine modules (use them for this call only). Full loads: the engine modules are plain torch modules,
        not ComfyUI's cast-on-the-fly ops, so a partial (lowvram) load would leave some weights off the device.
        The int8 layers get this model's adapter side deltas (none for a model without adapters)."""
        patchers = [self.patcher(p) for p in parts]  # weights read from disk while the warm-up compiles
        self.wait_warm_up()
        mm.load_models_gpu(patchers, memory_required=int(memory_required) + self.side_bytes(parts),
                           force_full_load=True)
        for patcher in patchers:
            load_whole(patcher)
        if reads_ahead(self.device):  # the later stages' parts read while this one computes
            self.prefetch([p for p in LATER.get(parts[-1], ()) if p not in parts])
        modules = [p.model.engine_module for p in patchers]
        for part, module in zip(parts, modules):
            if part == "vae":
                continue
            dev = next(module.buffers(), next(module.parameters())).device
            key = (part, str(dev))
            if key not in self._side_cache:
                self._side_cache = {k: v for k, v in self._side_cache.items() if k[0] != part}
                self._side_cache[key] = {n: s.to(dev) for n, s in self._sides.get(part, {}).items()}
            set_side(module, self._side_cache[key])
            # the adapters this load patched in, named if the stage meets NaN (`weights.own.blame`)
            own.mark(module, [("lora", a.adapter.path, part, a.strength(part)) for a in self.adapters
                              if a.strength(part) != 0.0 and any(p.expert == part for p in a.adapter.patches)],
                     replace=True)
        return modules

    def check_tokens(self, tokens) -> None:
        """Tokens made by another model cannot be rendered with this one when their ids fall outside this model's
        vocabulary (embed_tokens rows); raise ValueError naming both sizes."""
        vocab = self.dims.vocab
        highest = max([*tokens.prefix, CODEC_OFFSET + max(tokens.codes, default=0), MUSIC_END])
        if highest >= vocab:
            raise ValueError(
                f"these tokens do not fit this model: they use token ids up to {highest} (semantic codes are ids "
                f"{CODEC_OFFSET}…{CODEC_OFFSET + CODEC_SIZE - 1}), but this checkpoint's vocabulary has {vocab} rows "
                f"(text_encoders.model.embed_tokens is [{vocab}, {self.dims.hidden}]). They were made with another "
                f"model; render them with the checkpoint that composed them (this one is "
                f"{os.path.basename(self.info.path)}: {self.info.format}, hidden {self.dims.hidden}, "
                f"{self.dims.layers} layers).")

    def check_protocol(self) -> None:
        """A checkpoint whose vocabulary cannot hold the YuE2 protocol ids cannot compose at all."""
        needed = CODEC_OFFSET + CODEC_SIZE
        if self.dims.vocab < needed:
            raise ValueError(f"this checkpoint's vocabulary has {self.dims.vocab} rows "
                             f"(text_encoders.model.embed_tokens [{self.dims.vocab}, {self.dims.hidden}]); the YuE2 "
                             f"protocol needs {needed} (ids up to {needed - 1}), so it cannot compose songs")
