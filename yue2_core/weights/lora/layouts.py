"""Read every published YuE2 LoRA layout into the one form of `model.py` (weights_and_lora.md §1).

    adapter = read_adapter(path, dims)     # a .safetensors / torch .pt file, or a PEFT folder
    print(describe_adapter(adapter))

The layout is detected from tensor names and metadata, never from the file name (§1.1, in this order):
refusals first (DoRA, LoHa, Tucker/`lora_mid`, LoKr `t1`/`t2`, artist bundles, routed particle sliders, HOT-Step
`hot_step.param_method` ≠ 0, PEFT `use_dora` / `fan_in_fan_out` / `lora_bias` / `modules_to_save`), then
- `lokr` / `hot-step-lokr` (E): any `lokr_*` key (HOT when `format=yue2-{ar,nar,aitk}-lokr-v1`);
- `mothersuperior-pt` (F): a torch file holding `{"lora": [...], "rank", "io"}`;
- `fl` (C): `format=fl-yue2-lora-v1`, `branch=ar|nar`; the `acoustic_adapter` companion is read too;
- `comfy-native` (B): `format=comfyui-native-lora` (or `yue2-lora-v1` with Comfy-prefixed keys);
- `mothersuperior-comfyui` (B): `format=pt` + `yue2_lora_branch=ar|nar` — that branch decides the expert of every
  key, so a `text_encoders.` key of a branch=nar file goes to the NAR;
- `mothersuperior-raw` (F): `format=pt` with bare `layers.N.…` keys (`nar_*` → NAR; `vae2llm`/`llm2vae` full
  `.weight`/`.bias` → `Replace`);
- `hot-step-fused` (D): `format=yue2-aitk-fused-lora-v1` (one shared A per fused site: one LowRank on the whole
  fused module, never split into blocks);
- `hot-step-split` (D): `format=yue2-{ar,nar}-lora-v1`, `yue2_adapter_layout=native_split_v1` or `yue2.blk.N.*` keys;
- `starnodes` (G): `format=yue2-lora-v1` (branch defaults to the NAR);
- `peft` (H): an adapter_config.json (read for a folder or a file named adapter_model.*) or `base_model.model.`
  keys;
- `ai-toolkit` (A): `text_encoders.`/`diffusion_model.` keys with lora_A/lora_B, `.diff`, no metadata;
  `comfy-native` again for such keys with lora_down/lora_up;
- `kohya`: `lora_unet_` / `lora_te_` keys naming YuE2 modules with `_` for `.` (layouts_keys.kohya_names: which
  expert), read as the same names with dots;
- `unlabelled`: anything else whose keys name YuE2 modules (vendor or Comfy names without metadata).

Fused modules stay fused: a fused key (`qkv_proj`, `gate_up_proj`) is one patch on the whole module, block-diagonal
or shared-A alike (both are exact, §1.3); a split key (`q_proj` … `up_proj`, HOT `attn_q` …) is a patch on its row
slice of the fused module (model.py docstring).

Scale rule (§1.2) — one precedence for every layout, per module, first that applies:
1. the module's `.alpha` tensor / rank (rank = A's rows; LoKr: the factorised factor's inner size);
2. metadata `alpha` / rank (metadata `rank` when present, which must equal the tensor rank; LoKr: / its dim,
   checked against metadata `lokr_dim`); else an explicit metadata scale: `lora_scale` (Mothersuperior raw) or
   `scale` (a `format=pt` file);
3. adapter_config.json: `lora_alpha` / r, or / √r with `use_rslora`; `rank_pattern` / `alpha_pattern` per module;
4. 1.
LoKr with neither factor factorised is always 1 (its alpha, inf in F16 for ai-toolkit full rank, is ignored).
`.diff`, `.diff_b` and replacements carry no scale. The scale is folded into each delta (`LowRank.scale`, …).
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex

from ...errors import AdapterError, quoted
from ...layers import ModelDims
from .layouts_build import FileContext, build_patches
from ..checkpoint import not_a_file
from .layouts_io import Source, open_source
from .layouts_keys import REFUSED_ROLES, kohya_base, kohya_names, split_role
from .model import EXPERTS, Adapter, BiasDiff, Diff, Kron, LowRank, Replace

# the release geometry (§1.0): describing or checking an adapter without a checkpoint at hand
RELEASE_DIMS = ModelDims(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=6144, vocab=184704)

SUPPORTED = (
    "ai-toolkit (text_encoders./diffusion_model. lora_A/lora_B, .diff/.diff_b, LoKr)",
    "Comfy-native fused (lora_down/lora_up + .alpha, format=comfyui-native-lora)",
    "Mothersuperior ComfyUI fused (format=pt, yue2_lora_branch=ar|nar)",
    "FL per-branch files (format=fl-yue2-lora-v1, acoustic_adapter companion)",
    "HOT-Step native split, fused shared-A and LoKr (yue2.blk.N.*, yue2-aitk-fused-lora-v1, yue2-*-lokr-v1)",
    "LoKr (lokr_w1/lokr_w2, plain or factorised _a/_b)",
    "Mothersuperior raw AR/NAR (layers.N.*.lora_A/lora_B, lora_scale) and its .pt dict",
    "Starnodes (format=yue2-lora-v1)",
    "PEFT (base_model.model. keys, adapter_config.json)",
    "kohya-style (lora_unet_model_layers_N_self_attn_qkv_proj / lora_te_…, .alpha)",
)
SUPPORTED_TEXT = "Supported YuE2 adapter layouts: " + "; ".join(SUPPORTED) + "."


def read_adapter(path: str, dims: ModelDims, _stack: tuple = ()) -> Adapter:
    """Read the adapter at `path` (a .safetensors file, a torch .pt file loaded weights-only, or a PEFT folder /
    an adapter_model.safetensors|.bin with adapter_config.json beside it) for a model of geometry `dims` (the checkpoint's, or RELEASE_DIMS).

    Returns an `Adapter` whose patches target engine module names with split q/k/v and gate/up on row slices of
    the fused modules and the scale (module docstring) folded in; keys that name no module are listed in
    `Adapter.unmatched`. Raises AdapterError for a refused layout (the message names it and lists the supported
    ones), a file that is not an adapter or not a YuE2 one (a checkpoint, the vendor's model folder or a VAE is
    named with the option it belongs to), shapes that do not fit `dims`, NaN/inf, ranks of A and B that disagree, a
    missing half of a pair, a layer index ≥ dims.layers, keys that match nothing, a module given both fused and
    split, a malformed adapter_config.json, a missing FL companion."""
    src = open_source(path)
    if not src.tensors:
        raise AdapterError(f"{path}: the file holds no tensors, so it is not an adapter. {SUPPORTED_TEXT}")
    _refusals(src)
    layout = detect_layout(src)
    file_keys = list(src.tensors)
    read_as = {}  # key as read → the file's own key (kohya: what messages, `unmatched` and Patch.keys name)
    if layout == "kohya":  # the keys in the spelling the rest of the reader understands (layouts_keys.kohya_names)
        try:
            names = kohya_names(src.tensors)
        except ValueError as e:
            raise AdapterError(f"{path}: {e}") from None
        src.tensors = {names.get(k, k): t for k, t in src.tensors.items()}
        read_as = {new: old for old, new in names.items() if new != old}
    ctx = _context(src, layout)
    try:
        patches, unmatched, rule, scales = build_patches(path, src.tensors, ctx, dims)
    except AdapterError as exc:
        if not read_as:
            raise
        raise type(exc)(_in_file_keys(str(exc), read_as)) from None
    if read_as:
        unmatched = [read_as.get(k, k) for k in unmatched]
        for p in patches:
            p.keys = tuple(read_as.get(k, k) for k in p.keys)
    if not patches:
        raise AdapterError(f"{path}: not a YuE2 adapter — none of its {len(file_keys)} keys names a YuE2 module "
                           f"({_look(file_keys)}). {SUPPORTED_TEXT}")
    adapter = Adapter(path=os.fspath(path), layout=layout, patches=patches, scale_rule=rule, scales=scales,
                      unmatched=unmatched, files=list(src.files), metadata=dict(src.metadata))
    note = unsaid_expert_note(src, layout) or other_expert_note(src, patches)
    if note:
        adapter.notes.append(note)
    if lost := lost_alpha_note(src, adapter):
        adapter.notes.append(lost)
    companion = src.metadata.get("acoustic_adapter") if layout == "fl" else None
    if companion:
        _join_companion(adapter, src.path, companion, dims, _stack)
    if not _stack:  # the whole adapter, its FL companion's patches included
        adapter.notes.extend(zero_notes(adapter))
    return adapter


def _is_zero(delta) -> bool:
    """Whether a delta patch changes no weight: a LoRA pair with an all-zero factor, a LoKr with one, an all-zero
    (bias) difference. A replacement always changes its module (zeros are a weight too)."""
    if isinstance(delta, LowRank):
        return not (delta.down.any() and delta.up.any())
    if isinstance(delta, Kron):
        return not (delta.w1.any() and delta.w2.any())
    if isinstance(delta, (Diff, BiasDiff)):
        return not delta.delta.any()
    return False


def zero_notes(adapter: Adapter) -> list[str]:
    """One note per expert whose every patch is zero: the adapter changes nothing there, at any strength — an
    adapter saved before its first training step (PEFT and most trainers start B at zero) or zeroed weights. It was
    applied and recorded without a word, the song the same as without it (break-it review, stop 51)."""
    notes = []
    for expert in EXPERTS:
        mine = [p for p in adapter.patches if p.expert == expert]
        if mine and all(_is_zero(p.delta) for p in mine):
            modules = len({p.module for p in mine})
            notes.append(f"the LoRA {adapter.path} changes nothing on the {expert.upper()}: all its {len(mine)} "
                         f"{expert.upper()} patches ({modules} modules) are zero (an up / lora_B factor, or a "
                         "difference, of all zeros) — an adapter saved before any training step, or zeroed weights; "
                         "any strength gives the same song as without it")
    return notes


def _in_file_keys(text: str, read_as: dict) -> str:
    """`text` (a reader's message) with each key as read (`read_as`'s keys, e.g. `diffusion_model.model.layers.0.…`)
    written as the file spells it (`lora_unet_model_layers_0_…`): the user looks the key up in the file (diff
    review, stop 49: a kohya file's shape error named a key the file does not have)."""
    pattern = re.compile("|".join(re.escape(k) for k in sorted(read_as, key=len, reverse=True)))
    return pattern.sub(lambda m: read_as[m.group(0)], text)


def detect_layout(src: Source) -> str:
    """The layout id of an opened file, from its keys, metadata and container (module docstring)."""
    meta, keys = src.metadata, list(src.tensors)
    fmt = meta.get("format", "").strip().lower()
    prefixed = any(k.startswith(EXPERT_PREFIXES) for k in keys)
    if src.container == "pt-mothersuperior":
        return "mothersuperior-pt"
    if any((role := split_role(k)) and kohya_base(role[0]) for k in keys):
        return "kohya"
    if any((split_role(k) or ("", ""))[1].startswith("lokr_") for k in keys):
        return "hot-step-lokr" if fmt.startswith("yue2-") and "lokr" in fmt else "lokr"
    if fmt == "fl-yue2-lora-v1":
        return "fl"
    if fmt == "comfyui-native-lora":
        return "comfy-native"
    if fmt == "pt" and _branch(src) in EXPERTS:
        return "mothersuperior-comfyui"
    if fmt == "pt" and any(k.startswith("layers.") for k in keys):
        return "mothersuperior-raw"
    if fmt == "yue2-aitk-fused-lora-v1":
        return "hot-step-fused"
    if fmt in ("yue2-ar-lora-v1", "yue2-nar-lora-v1") or meta.get("yue2_adapter_layout") == "native_split_v1" \
            or any(k.startswith("yue2.blk.") for k in keys):
        return "hot-step-split"
    if fmt in ("yue2-lora-v1", "yue2-studio-lora-v1"):
        return "comfy-native" if prefixed else "starnodes"
    if src.sidecar is not None or any(k.startswith(("base_model.model.", "model.base_model.model.")) for k in keys):
        return "peft"
    if prefixed:
        return "comfy-native" if any(".lora_down" in k for k in keys) else "ai-toolkit"
    return "unlabelled"


def _refusals(src: Source) -> None:
    """AdapterError for every layout we recognise and do not apply (§1.1 I and "Others seen"; §2 DoRA/LoHa)."""
    meta, path = src.metadata, src.path

    def refuse(what: str, detail: str):
        raise AdapterError(f"{path}: {what} is not supported ({detail}). {SUPPORTED_TEXT}")

    for key in src.tensors:
        sr = split_role(key)
        leaf = key.rsplit(".", 2)
        for marker, what in REFUSED_ROLES.items():
            if (sr and sr[1] == marker) or any(part.startswith(marker) for part in leaf):
                refuse(what, f"key {key}")
    fmt = meta.get("format", "").strip().lower()
    if fmt == "yue2-artist-ar-v1" or ("companion_sha256" in meta and "manifest" in meta):
        refuse("an artist bundle (format=yue2-artist-ar-v1: an AR LoRA pinned to a full NAR decoder state)",
               f"metadata format={_shorten(meta.get('format'))}")
    if any("conceptmod" in (k + " " + v).lower() for k, v in meta.items()) or \
            any(k.startswith("adapters.model-layers-") for k in src.tensors):
        refuse("a routed particle slider (conceptmod: router and net MLPs, not a plain LoRA)",
               "conceptmod metadata or adapters.model-layers-* keys")
    method = meta.get("hot_step.param_method")
    if method is not None and method.strip() not in ("0", "0.0"):
        refuse("a HOT-Step adapter with hot_step.param_method ≠ 0 (DoRA / HiRA / PiSSA)",
               f"hot_step.param_method={_shorten(method)}")
    cfg = src.sidecar
    if cfg is not None and cfg["use_dora"]:
        refuse("DoRA (adapter_config.json use_dora: true)", "the magnitude vector needs the base weight")
    if cfg is not None and cfg["fan_in_fan_out"]:
        refuse("a PEFT LoRA with fan_in_fan_out: true (made for Conv1D weights stored [in, out]; YuE2's are "
               "Linear [out, in])", "adapter_config.json")
    _peft_parts(src, refuse)
    init = cfg.get("init_lora_weights") if cfg is not None else None
    if isinstance(init, str) and init.strip().lower().startswith(BASE_CHANGING_INITS):
        # stop-54 review: PiSSA / OLoRA / CorDA move part of each weight into the adapter at initialisation and
        # train B·A against the remaining W − B₀A₀ (LoftQ against a quantised W); applied to YuE2's own W the
        # adapter also adds B₀A₀ back — another model, without a word
        refuse(f"a PEFT LoRA initialised with init_lora_weights={_shorten(init)} (it was trained against base "
               "weights that PEFT changed at initialisation, so on YuE2's own weights it gives another model; "
               "PEFT's save_pretrained(..., path_initial_model_for_weight_conversion=...) converts a PiSSA / OLoRA / "
               "CorDA adapter into a plain LoRA, whose adapter_config.json then says init_lora_weights true)",
               "adapter_config.json")
    for where, base in (("adapter_config.json base_model_name_or_path", (cfg or {}).get("base_model_name_or_path")),
                        ("metadata base_model", meta.get("base_model")),
                        ("metadata base_model_name_or_path", meta.get("base_model_name_or_path"))):
        if other := other_base_model(base):
            why = (" A Qwen3 text model's LoRA names the YuE2 AR's layers the same way and, for Qwen3-1.7B, has "
                   "their shapes, so it would load and change the AR to no purpose." if other == "qwen" else "")
            raise AdapterError(f"{path}: made for another model — its {where} is {_shorten(base)} ({other}), not "
                               f"YuE2.{why} A YuE2 adapter is trained on m-a-p/YuE2-3B; if this one was and only "
                               "the field is wrong, set it to m-a-p/YuE2-3B")


_LORA_B_BIAS = re.compile(r"\.lora_(?:B|up)(?:\.[A-Za-z0-9_\-]+)?\.bias$")
_PEFT_PREFIXES = ("base_model.model.", "model.base_model.model.")


def _peft_parts(src: Source, refuse) -> None:
    """`refuse` the parts of a PEFT adapter beside its LoRA pairs that the pack does not apply (leftovers of the
    stop-54 review: both were listed as "keys that name no YuE2 module" and the LoRA applied without them — another
    model than the one trained): `lora_bias` (a bias on each B, `…lora_B.bias`: PEFT adds (B·A·x + b)·scale, and the
    attention / MLP Linears it targets have no bias to carry b), and `modules_to_save` (whole trained modules —
    lm_head, embed_tokens, a norm — saved as full `…<module>.weight` tensors, or under `.modules_to_save.<name>.`);
    and (stop-54 diff review) PEFT's bias="all" / "lora_only" (trained biases, full `….bias` tensors), said as such.
    A `…<module>.base_layer.weight` is not refused: PEFT's untrained copy of a LoRA-wrapped embedding / lm_head."""
    cfg = src.sidecar or {}
    bias = next((k for k in src.tensors if _LORA_B_BIAS.search(k)), None)
    if bias is not None or cfg.get("lora_bias") is True:
        refuse("a PEFT LoRA with lora_bias (a bias b on each LoRA's B: it adds (B·A·x + b)·scale, and YuE2's attention "
               "and MLP Linears have no bias to carry b, so without it the adapter would give another model)",
               (f"key {bias}" if bias else "adapter_config.json lora_bias: true") + "; a LoRA saved with lora_bias "
               "false, PEFT's default, is read")
    peft = src.sidecar is not None or any(k.startswith(_PEFT_PREFIXES) for k in src.tensors)
    whole: dict = {}
    biases: dict = {}
    for key in src.tensors:
        role = split_role(key)
        if ".modules_to_save." in key:
            name, found = key.split(".modules_to_save.")[0], whole
        elif peft and role is not None and role[1] in ("weight", "bias"):
            if role[1] == "weight" and role[0].endswith(".base_layer"):
                # stop-54 diff review: PEFT's frozen copy of the base weight of a module it wrapped with a LoRA —
                # what its default save_embedding_layers="auto" writes beside a LoRA on lm_head / embed_tokens
                # (`…lm_head.base_layer.weight`): nothing trained, left unmatched as before (it was refused as
                # modules_to_save, a legit lm_head LoRA with it)
                continue
            name, found = role[0], (biases if role[1] == "bias" else whole)
        else:
            continue
        for prefix in _PEFT_PREFIXES:
            name = name[len(prefix):] if name.startswith(prefix) else name
        found.setdefault(name.removesuffix(".base_layer"), key)
    if whole:
        shown = ", ".join(f"{m} ({k})" for m, k in list(whole.items())[:4])
        more = f", … ({len(whole) - 4} more)" if len(whole) > 4 else ""
        said = cfg.get("modules_to_save")
        refuse(f"a PEFT adapter with modules_to_save (whole trained modules saved beside its LoRA pairs: "
               f"{shown}{more})",
               (f"adapter_config.json modules_to_save {_shorten(said)}" if said else "full weights in the adapter file")
               + "; the pack applies low-rank adapters only, and the LoRA without those modules would give another "
               "model than the one trained: save it without modules_to_save")
    if biases:  # stop-54 diff review: PEFT's bias="all" / "lora_only" (trained biases) was called modules_to_save
        shown = ", ".join(f"{m} ({k})" for m, k in list(biases.items())[:4])
        more = f", … ({len(biases) - 4} more)" if len(biases) > 4 else ""
        said = cfg.get("bias")
        refuse(f"a PEFT LoRA trained with bias=\"all\" or \"lora_only\" (trained biases of the model saved beside "
               f"its LoRA pairs: {shown}{more})",
               (f"adapter_config.json bias {_shorten(said)}" if said not in (None, "none") else
                "bias tensors in the adapter file")
               + "; the pack applies low-rank adapters only, and the LoRA without those biases would give another "
               "model than the one trained: save it with bias \"none\", PEFT's default")


# PEFT init_lora_weights values whose adapter fits only the base weights PEFT changed when it initialised them
BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq")
# families of other models an adapter's base model may name (its last path part; never when it mentions YuE)
_OTHER_BASE = re.compile(r"qwen|llama|mistral|gemma|phi-?\d|flux|stable-diffusion|sdxl|sd3|hunyuan|deepseek|"
                         r"chatglm|glm-\d|gpt|wan2", re.IGNORECASE)


def other_base_model(name) -> str | None:
    """The other model family an adapter's base-model field names (`Qwen/Qwen3-1.7B` → "qwen"), else None: a value
    that is no string, mentions YuE, or whose last path part names none of `_OTHER_BASE` (a local folder, a hash)."""
    if not isinstance(name, str) or "yue" in name.lower():
        return None
    leaf = re.split(r"[\\/]", name.strip().rstrip("/\\"))[-1]
    found = _OTHER_BASE.search(leaf)
    return found.group(0).lower() if found else None


_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_INT = re.compile(r"[+-]?\d{1,18}", re.ASCII)


def _number(src: Source, name: str, kind=float, positive: bool = False):
    """Metadata field `name` as a float (finite; > 0 when `positive`, the rule of adapter_config.json's lora_alpha)
    or an int ≥ 1; None when absent. AdapterError naming the field otherwise."""
    raw = src.metadata.get(name)
    if raw is None:
        return None
    text = raw.strip()
    try:  # ASCII digits only: float() / int() also read "٨" (Arabic-Indic), "８" (full width) and "1_6" (stop 44)
        v = None if not (_FLOAT if kind is float else _INT).fullmatch(text) else \
            kind(text) if kind is float else int(text)
    except ValueError:
        v = None
    if v is None or (kind is float and not math.isfinite(v)) or (kind is int and v < 1) or \
            (positive and v <= 0):
        what = ("a positive finite number" if positive else "a finite number") if kind is float else \
            "a positive integer"
        raise AdapterError(f"{src.path}: metadata {name}={_shorten(raw)} must be {what}")
    return v


BRANCH_KEYS = ("branch", "yue2_lora_branch")
# `ar+nar`: a file for both experts whose keys say which is which (the Comfy-native files write it)
BRANCHES = EXPERTS + ("ar+nar",)


EXPERT_PREFIXES = ("text_encoders.", "diffusion_model.", "model.diffusion_model.", "transformer.")


def _branch(src: Source) -> str | None:
    """The expert the metadata names (`branch` / `yue2_lora_branch`, stripped, lower case), read once for
    `detect_layout` and `_context`; None when no key names one. An empty value counts as absent when the other key
    is set. Where the metadata decides the expert — `format=pt` (Mothersuperior ComfyUI), FL, or no key carrying an
    expert prefix — AdapterError for a value that is not one of BRANCHES (an unknown one fell through to another
    layout and patched the AR) and for two keys that disagree (break-it review, stop 46). Where every key's
    `text_encoders.` / `diffusion_model.` prefix decides, an unknown value is ignored, as it always was (a trainer's
    `branch=main` names a git branch, not an expert); two experts named still disagree."""
    fmt = src.metadata.get("format", "").strip().lower()
    decides = fmt in ("pt", "fl-yue2-lora-v1") or not any(k.startswith(EXPERT_PREFIXES) for k in src.tensors)
    raw = {k: src.metadata[k] for k in BRANCH_KEYS if src.metadata.get(k) is not None}
    if len(raw) > 1 and any(v.strip() for v in raw.values()):
        raw = {k: v for k, v in raw.items() if v.strip()}
    found = {}
    for key, value in raw.items():
        value = value.strip().lower()
        if value in BRANCHES:
            found[key] = value
        elif decides:
            raise AdapterError(f"{src.path}: metadata {key}={_shorten(raw[key])} names no expert; accepted: "
                               f"{', '.join(BRANCHES)} (ar+nar: the keys' text_encoders./diffusion_model. prefixes "
                               f"decide)")
    if len(set(found.values())) > 1:
        said = " and ".join(f"{k}={_shorten(src.metadata[k])}" for k in found)
        raise AdapterError(f"{src.path}: metadata {said} disagree, so the file names two experts; keep one key "
                           f"(accepted: {', '.join(BRANCHES)})")
    return next(iter(found.values()), None)


def _context(src: Source, layout: str) -> FileContext:
    meta = src.metadata
    fmt = meta.get("format", "").strip().lower()
    branch = _branch(src) or ""
    default = branch if branch in EXPERTS else None
    forced = None
    if layout == "mothersuperior-comfyui":
        forced = branch
    elif layout == "fl" and branch not in EXPERTS:
        raise AdapterError(f"{src.path}: an FL file (format=fl-yue2-lora-v1) must say branch=ar or branch=nar in "
                           f"its metadata; found branch={_shorten(meta.get('branch'))}")
    elif layout.startswith("hot-step") and fmt.startswith(("yue2-ar-", "yue2-nar-")):
        default = fmt.split("-")[1]
    elif layout == "starnodes":
        default = default or "nar"
    elif layout == "mothersuperior-pt":
        default = "nar"
    meta_scale = None
    # positive, as an alpha is: a negative scale inverted the adapter without a word (break-it review, stop 44)
    if _number(src, "lora_scale", positive=True) is not None:
        meta_scale = ("lora_scale", _number(src, "lora_scale", positive=True))
    elif fmt == "pt" and _number(src, "scale", positive=True) is not None:
        meta_scale = ("scale", _number(src, "scale", positive=True))
    rank_field = None if src.container == "pt-mothersuperior" else _number(src, "rank", int)
    return FileContext(layout=layout, path=src.path, forced=forced, default=default,
                       replace_ok=layout in ("mothersuperior-raw", "mothersuperior-pt"),
                       meta_alpha=_number(src, "alpha", positive=True), meta_rank=rank_field, meta_scale=meta_scale,
                       lokr_dim=_number(src, "lokr_dim", int), sidecar=src.sidecar)


def _join_companion(adapter: Adapter, path: str, rel: str, dims: ModelDims, stack: tuple) -> None:
    """FL (§1.1 C): the AR file's metadata `acoustic_adapter` names its NAR file relative to the AR file's folder;
    its patches join the same Adapter. The companion must resolve (links followed) inside that folder: an absolute
    path, `../…` or a link out of it is refused (a file would otherwise make the pack open any path), as is a
    companion that is a FIFO / directory / device, or a value holding a NUL byte (no path can: os.path would raise
    ValueError "embedded null byte")."""
    if "\x00" in rel:
        raise AdapterError(f"{path}: its metadata acoustic_adapter={_shorten(rel)} holds a NUL byte, which no file "
                           f"name can; it names the FL NAR companion file relative to this file — fix the metadata "
                           f"or load the NAR file as its own LoRA")
    folder = os.path.dirname(os.path.abspath(path))
    target = os.path.normpath(os.path.join(folder, rel))
    real_folder, real_target = os.path.realpath(folder), os.path.realpath(target)
    if os.path.isabs(rel) or os.path.commonpath([real_folder, real_target]) != real_folder:
        raise AdapterError(f"{path}: its companion NAR adapter (metadata acoustic_adapter={_shorten(rel)}) lies "
                           f"outside the AR file's folder {folder}; a companion is read only from that folder (or "
                           f"below it) — put the FL NAR file beside the AR file and name it relative to it")
    kind = not_a_file(target)
    if kind is not None:
        raise AdapterError(f"{path}: its companion NAR adapter (metadata acoustic_adapter={_shorten(rel)}) "
                           f"{quoted(target, False)} is {kind}, not a file")
    if not os.path.isfile(target):
        raise AdapterError(f"{path}: its companion NAR adapter (metadata acoustic_adapter={_shorten(rel)}) is "
                           f"missing: {quoted(target, False)} does not exist. Put the FL NAR file there, or remove the "
                           "metadata field.")
    here = os.path.abspath(path)
    if target in stack or target == here:
        raise AdapterError(f"{path}: acoustic_adapter {_shorten(rel)} leads back to a file already read ({target})")
    other = read_adapter(target, dims, (*stack, here))
    wrong = sorted({p.expert for p in other.patches} - {"nar"})
    if wrong:  # e.g. acoustic_adapter naming another AR file: its patches would silently add to the AR
        raise AdapterError(f"{path}: its companion (metadata acoustic_adapter={_shorten(rel)}) changes the "
                           f"{'/'.join(w.upper() for w in wrong)} expert; an FL companion must be the NAR file "
                           f"(branch=nar). Name the FL NAR file there, or load the other file as its own LoRA.")
    for p in other.patches:  # apply.check_unique: the companion given again as its own LoRA would apply twice
        p.source = p.source or target
    adapter.patches += other.patches
    adapter.files += [f for f in other.files if f not in adapter.files]
    adapter.unmatched += [f"{os.path.basename(target)}: {k}" for k in other.unmatched]
    if other.scale_rule not in adapter.scale_rule:
        adapter.scale_rule += f"; companion: {other.scale_rule}"
    adapter.scales = sorted(set(adapter.scales) | set(other.scales))


def _shorten(value: str, limit: int = 60) -> str:
    """repr(value) cut to about `limit` characters for a one-line message (a metadata value may be megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 20]}…{text[-12:]} ({len(value)} characters)"


def _look(keys: list) -> str:
    """What a non-YuE2 file looks like, for the error message."""
    sample = ", ".join(sorted(keys)[:3])
    if any(k.startswith(("lora_unet_", "lora_te_", "lora_te1_", "lora_te2_")) for k in keys):
        return f"kohya-style names of an image-model LoRA such as SDXL: {sample}"
    if any(k.endswith(("qkv_proj.weight", "embed_tokens.weight", "lm_head.weight")) for k in keys):
        return f"full model weights, not an adapter — load it as a checkpoint: {sample}"
    if any("transformer_blocks" in k or "double_blocks" in k for k in keys):
        return f"a diffusion-transformer image-model LoRA (Flux-like): {sample}"
    return f"keys such as {sample}"


_KINDS = ("attention qkv", "attention o", "mlp gate_up", "mlp down", "io", "norm")


def _kind(module: str) -> str:
    for leaf, kind in (("qkv_proj", "attention qkv"), ("o_proj", "attention o"), ("gate_up_proj", "mlp gate_up"),
                       ("down_proj", "mlp down"), ("norm", "norm")):
        if module.endswith(leaf) or (kind == "norm" and "norm" in module.rsplit(".", 1)[-1]):
            return kind
    return "io"


def unsaid_expert_note(src: Source, layout: str) -> str | None:
    """A warning when the file cannot say which expert it is for, else None. Both experts' layers have the same
    shapes (§1.0), so only names or metadata tell; the one layout whose names do not is Mothersuperior's ComfyUI
    fused files (§1.1 B): `text_encoders.` lora_down/lora_up keys, no alpha, and `format=pt` +
    `yue2_lora_branch=ar|nar` — the NAR file (nar_lora_joint_v9_comfyui) has the same `text_encoders.` keys. With
    the metadata stripped such a file is read as Comfy-native and goes to the AR (what `text_encoders.` means in
    ComfyUI, and what a Comfy-native AR-only file is), which is wrong for the NAR file; no option moves a file's
    patches to the other expert (the strengths scale each expert's own), so the note tells how to put the metadata
    back. Files with `diffusion_model.` or `nar_` names, an `.alpha` tensor or any metadata branch say it."""
    keys = list(src.tensors)
    if layout != "comfy-native" or src.metadata.get("format", "").strip() or _branch(src) is not None:
        return None
    if not all(k.startswith("text_encoders.") for k in keys) or any(k.endswith(".alpha") for k in keys):
        return None
    fixed = os.path.join(os.path.dirname(src.path), "nar-" + os.path.basename(src.path))
    code = (f"from safetensors.torch import load_file, save_file; save_file(load_file({src.path!r}), {fixed!r}, "
            "{'format': 'pt', 'yue2_lora_branch': 'nar'})")
    # quoted for a POSIX shell: a path with ' or $ broke the command's quotes (diff review, stop 49)
    command = "python -c " + shlex.quote(code)
    return (f"LoRA {src.path}: which expert it is for cannot be told — it has only `text_encoders.` lora_down/"
            "lora_up keys, no alpha and no metadata: the layout of Mothersuperior's ComfyUI fused files, where only "
            "the metadata yue2_lora_branch=ar|nar says the expert (both experts' layers have the same shapes), and "
            "it was stripped. It is applied to the AR (what `text_encoders.` means in ComfyUI). If it is a NAR file "
            "(e.g. nar_lora_joint_v9_comfyui), no strength or option moves it to the NAR: put the metadata back with "
            f"{command} and load {fixed} instead")


_STARNODES_NAR = ("vae2llm.", "llm2vae.", "time_embedder.")  # with `.nar_` modules: Starnodes' NAR-only targets
_FL_NAR_IO = ("vae2llm.diff", "llm2vae.diff")  # an FL NAR file's IO diffs (`.diff`, `.diff_b`); Starnodes has none


def lost_alpha_note(src: Source, adapter: Adapter) -> str | None:
    """A warning when the file's scale was evidently lost with its metadata, else None. Stop-50 leftover: HOT-Step
    split / LoKr files (`yue2.blk.N` keys) and Starnodes files (`format=yue2-lora-v1`, vendor NAR names with
    lora_down/lora_up) keep their alpha only in the metadata — no `.alpha` tensor —, so a tool that drops the
    metadata (a converter, a merge, `save_file` without `metadata=`) leaves nothing to read it from: the file is
    applied at scale 1 (alpha = rank), i.e. at rank/alpha of its trained strength (HOT-Step's usual alpha 2r:
    half; Starnodes' alpha 8 at rank 4: half). Nothing can recover it, so the note says, once per file read, which
    scale is assumed and how to set it: the strength, or the metadata put back.

    Unlabelled files with the vendor's NAR layer names and lora_down/lora_up (stop-51 leftover: "if it is one"): an
    FL NAR companion (`format=fl-yue2-lora-v1`, scale 1 by design) is laid out so too. FL's vae2llm / llm2vae
    `.diff` / `.diff_b` say it is FL: no note (was: the Starnodes note, whose advice — strength × alpha / rank —
    played an FL file too strong). LoRA pairs on vae2llm / llm2vae / time_embedder, targets FL never has, say it
    is Starnodes'. With neither, nothing in the file tells the two apart: the note says both cases."""
    if "1 (no alpha)" not in adapter.scale_rule:
        return None
    keys = list(src.tensors)
    fmt = src.metadata.get("format", "").strip().lower()
    lokr, either = any(".lokr_" in k for k in keys), False
    if any(k.startswith("yue2.blk.") for k in keys):
        what = ("it is a HOT-Step file (`yue2.blk.N` keys), which keeps its alpha only in its metadata, and this "
                "file has none (stripped by a converter or a merge tool?)")
        expert = "nar" if {p.expert for p in adapter.patches} == {"nar"} else "ar"
        restore = {"format": f"yue2-{expert}-{'lokr' if lokr else 'lora'}-v1"}
    elif adapter.layout == "peft" and src.sidecar is None:
        # stop-54 review: PEFT writes no alpha into the weights file — lora_alpha lives in adapter_config.json, read
        # for a folder or beside adapter_model.safetensors / .bin only; a renamed adapter_model.safetensors put into
        # ComfyUI's loras folder (the usual way) played at r / lora_alpha of its strength without a word
        first = (adapter.files or [adapter.path])[0]
        from .layouts_io import PEFT_FILE_NAMES
        where = ("and there is none beside this one" if os.path.basename(first) in PEFT_FILE_NAMES else
                 "which was not read for it (it is read for a PEFT folder, or beside a file named "
                 "adapter_model.safetensors / adapter_model.bin / lora.safetensors)")
        what = ("it has PEFT's `base_model.model.` keys, and PEFT keeps the alpha (lora_alpha) only in the "
                f"adapter_config.json saved beside adapter_model.safetensors, {where}; giving the "
                "folder with both files applies the alpha exactly (use_rslora and per-module patterns too)")
        restore = {}
    elif adapter.layout == "starnodes":
        what = "it is a Starnodes file (format=yue2-lora-v1), which keeps its alpha only in its metadata, and this " \
               "file has none (stripped by a converter or a merge tool?)"
        restore = {"format": "yue2-lora-v1"}
    elif adapter.layout == "unlabelled" and not fmt and not any(k.endswith(".alpha") for k in keys) and any(
            ".lora_down" in k and (".nar_" in k or k.startswith(_STARNODES_NAR)) for k in keys):
        if any(".lora_down" in k and k.startswith(_STARNODES_NAR) for k in keys):
            what = ("it is laid out as a Starnodes file (the vendor's NAR names with lora_down/lora_up, and LoRA "
                    "pairs on vae2llm / llm2vae / time_embedder, which an FL file never has; no metadata): its alpha "
                    "went with the metadata (stripped by a converter or a merge tool?)")
        elif any(k.startswith(_FL_NAR_IO) for k in keys):  # FL's NAR companion: scale 1 by design, nothing lost
            return None
        else:
            either = True
            what = ("it has only the vendor's NAR layer names with lora_down/lora_up and no metadata, the layout "
                    "of a Starnodes file (format=yue2-lora-v1, whose alpha is only in its metadata) and of an FL NAR "
                    "file (format=fl-yue2-lora-v1, scale 1 by design); nothing left in it tells which. If it is an "
                    "FL file, nothing was lost: strength 1 plays it as trained. If it is a Starnodes file, its "
                    "alpha went with the metadata (stripped by a converter or a merge tool?)")
        restore = {"format": "yue2-lora-v1"}
    else:
        return None
    if lokr:  # alpha / the factorised factor's inner size
        sizes = sorted({int(t.shape[0]) for k, t in src.tensors.items() if k.endswith((".lokr_w1_b", ".lokr_w2_b"))})
        unit = "LoKr dim"
    else:
        sizes = sorted({r for rs in adapter.ranks().values() for r in rs})
        unit = "rank"
    one = sizes[0] if len(sizes) == 1 else None
    if one and not lokr:
        restore["rank"] = str(one)
    meta = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in {**restore, "alpha": "ALPHA"}.items())
    if src.container == "safetensors":
        fixed = os.path.join(os.path.dirname(src.path), "with-alpha-" + os.path.basename(src.path))
        code = (f"from safetensors.torch import load_file, save_file; save_file(load_file({json.dumps(src.path)}), "
                f"{json.dumps(fixed)}, {{{meta}}})")
    else:  # a torch .pt file (stop-51 diff review: load_file cannot read one): a .safetensors copy, which has metadata
        # (an open file, not the path: torch.load hands a path ending in .safetensors to the safetensors reader)
        stem = os.path.splitext(os.path.basename(src.path))[0]
        fixed = os.path.join(os.path.dirname(src.path), f"with-alpha-{stem}.safetensors")
        code = (f"import torch; from safetensors.torch import save_file; d = torch.load(open({json.dumps(src.path)}, "
                "'rb'), weights_only=True, map_location='cpu'); d = d.get('state_dict', d); save_file({k: "
                f"v.contiguous().clone() for k, v in d.items()}}, {json.dumps(fixed)}, {{{meta}}})")
    example = f" (e.g. alpha {2 * one}: strength 2 plays it as trained)" if one else ""
    return (f"LoRA {src.path}: its scale cannot be read — {what}. It "
            f"is applied at scale 1 (as if alpha = {unit}; {unit} {', '.join(map(str, sizes))}), so "
            f"{'a Starnodes file plays ' * either}at {unit} / alpha of the strength it was trained for. If "
            f"{'it is a Starnodes file and ' * either}you know its alpha, multiply the strength by "
            f"alpha / {unit}{example} — the LoRA node's strength_ar / strength_nar, or `--lora PATH:STRENGTH` — or "
            f"put the metadata back, ALPHA replaced by the alpha: python -c {shlex.quote(code)}, then load {fixed}")


def other_expert_note(src: Source, patches: list) -> str | None:
    """A warning when the metadata names one expert (`branch` / `yue2_lora_branch`) and every patch, placed by its
    keys' prefixes (`text_encoders.` → AR, `diffusion_model.` → NAR), went to the other, else None. Diff review, stop
    49: a Mothersuperior ComfyUI fused NAR file that lost only `format=pt` (kept yue2_lora_branch=nar) went to the AR
    without a word, the branch being taken as saying the expert (`unsaid_expert_note` is silent then). The prefixes
    still decide (as ComfyUI applies such a file); the note says how to make the metadata decide."""
    branch = _branch(src)
    experts = {p.expert for p in patches}
    if branch not in EXPERTS or not experts or branch in experts:
        return None
    named = next(f"{k}={src.metadata[k].strip()}" for k in BRANCH_KEYS if src.metadata.get(k, "").strip())
    return (f"LoRA {src.path}: its metadata says {named}, but its keys name the {'/'.join(sorted(experts)).upper()} "
            f"(their text_encoders. / diffusion_model. prefixes), where it is applied; if it is a {branch.upper()} "
            f"file, the metadata format=pt (Mothersuperior's ComfyUI files) makes {named} decide")


def adapter_notes(adapter: Adapter) -> list[str]:
    """Every warning of reading `adapter` for the caller to show: keys not applied (`unmatched_note`) and
    `Adapter.notes` (a file whose expert could not be told, or whose metadata names the other expert)."""
    return [n for n in (unmatched_note(adapter), *adapter.notes) if n]


def unmatched_note(adapter: Adapter, shown: int = 3) -> str | None:
    """One warning line when `adapter` has keys that name no YuE2 module (they are not applied): the count and the
    first `shown` keys; None when every key was used. `inspect` / the LoRA node's report list them all."""
    keys = adapter.unmatched
    if not keys:
        return None
    more = f", … ({len(keys) - shown} more; `inspect` lists them all)" if len(keys) > shown else ""
    return (f"LoRA {adapter.path}: {len(keys)} key{'s name' if len(keys) != 1 else ' names'} no YuE2 module and "
            f"{'are' if len(keys) != 1 else 'is'} NOT applied: {', '.join(keys[:shown])}{more}")


def describe_adapter(adapter: Adapter) -> str:
    """A multi-line report: layout, files, scale rule and values, per expert the ranks and the modules patched by
    kind (attention qkv / o, mlp gate_up / down, io, norm) and by delta type, the replacements, and every unmatched
    key in full."""
    lines = [f"YuE2 adapter, layout {adapter.layout}", "file(s):"]
    lines += [f"  {f}" for f in adapter.files or [adapter.path]]
    values = ", ".join(f"{v:g}" for v in adapter.scales) or "-"
    lines.append(f"scale rule: {adapter.scale_rule}; value(s): {values}")
    ranks = adapter.ranks()
    for expert in EXPERTS:
        own = [p for p in adapter.patches if p.expert == expert]
        if not own:
            lines.append(f"{expert.upper()}: not patched")
            continue
        kinds = {}
        for p in own:
            kinds.setdefault(_kind(p.module), set()).add(p.module)
        types = {}
        for p in own:
            name = {LowRank: "LoRA", Kron: "LoKr", Diff: "diff", BiasDiff: "bias diff", Replace: "replace"}[
                type(p.delta)]
            types[name] = types.get(name, 0) + 1
        rank_text = ", ".join(map(str, ranks.get(expert, []))) or "-"
        lines.append(f"{expert.upper()}: {len(own)} patches on {len({p.module for p in own})} modules; "
                     f"rank(s) {rank_text}; " + ", ".join(f"{n} {t}" for t, n in sorted(types.items())))
        for kind in _KINDS:
            if kind in kinds:
                mods = sorted(kinds[kind])
                shown = ", ".join(mods) if kind == "io" or len(mods) <= 4 else f"{mods[0]} … {mods[-1]}"
                lines.append(f"  {kind}: {len(mods)} modules ({shown})")
    rep = adapter.replacements()
    lines.append("replacements (full strength unless strength 0): " + (", ".join(rep) if rep else "none"))
    lines.append(f"unmatched keys: {len(adapter.unmatched)}" + (" (not applied):" if adapter.unmatched else ""))
    lines += [f"  {k}" for k in adapter.unmatched]
    return "\n".join(lines)
