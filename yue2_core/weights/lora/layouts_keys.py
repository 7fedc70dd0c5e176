"""The key grammar shared by every LoRA layout (weights_and_lora.md §1.0, §1.1, §4): a file key is split into a
*base* (the module it names, in whatever spelling the trainer used) and a *role* (`down`, `up`, `alpha`, `diff`,
`lokr_w1`, …), and the base is resolved to a `Target`: the engine module (`model.layers.3.self_attn.qkv_proj`,
`vae2llm`, …), the row slice of a fused module for split q/k/v and gate/up names, and what the spelling says about the
expert. Which expert a key finally goes to is decided in `layouts_build.expert_of` (it also needs the file's metadata).

Spellings understood (prefixes may combine, e.g. `base_model.model.model.layers.0.nar_self_attn.q_proj`):
- prefixes `base_model.model.` (PEFT), `text_encoders.` / `transformer.ar.` (AR), `diffusion_model.` /
  `model.diffusion_model.` / `transformer.nar.` (NAR);
- Comfy names `model.layers.N.self_attn.{qkv_proj,o_proj}`, `model.layers.N.mlp.{gate_up_proj,down_proj}`;
- vendor names `model.layers.N.(nar_)?self_attn.{q,k,v,o}_proj`, `(nar_)?mlp.{gate,up,down}_proj`, also without the
  leading `model.` (Mothersuperior raw: `layers.N.…`), and the norms `input_layernorm`, `post_attention_layernorm`,
  `nar_input_layernorm`, `nar_pre_mlp_layernorm` (→ the NAR's `post_attention_layernorm`, §4), `(nar_)?self_attn.
  {q_norm,k_norm}`;
- HOT-Step `yue2.blk.N.(nar_)?{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}` (§1.1 D);
- whole modules `lm_head` / `model.lm_head` (AR), `vae2llm`, `llm2vae`, `time_embedder.mlp.{0,2}` (NAR, optionally
  after `model.`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ...layers import ModelDims

# role suffixes (§2 "LoRA key spellings"): B/A as `.lora_up/.lora_down.weight`, `.lora_B/.lora_A(.<adapter>)?.weight`,
# and bare `.lora_A` / `.lora_B` (Mothersuperior raw, §1.1 F)
_PAIR = re.compile(r"^(?P<base>.+)\.(?P<kind>lora_A|lora_B|lora_down|lora_up)"
                   r"(?:(?:\.(?P<name>(?!weight$)[A-Za-z0-9_\-]+))?\.weight)?$")
# the other spellings ComfyUI's `load_lora` reads (§2 "LoRA key spellings"; diffusers / older trainers):
# `.lora.down.weight`, `_lora.down.weight`, `.lora_linear_layer.down.weight` (own-weights review, stop 49: a file
# spelled so was "not a YuE2 adapter — none of its keys names a YuE2 module" although every key named one)
_PAIR_DIFFUSERS = re.compile(r"^(?P<base>.+?)(?:\.lora|_lora|\.lora_linear_layer)\.(?P<kind>down|up)\.weight$")
_LOKR = re.compile(r"^(?P<base>.+)\.(?P<role>lokr_w1_a|lokr_w1_b|lokr_w2_a|lokr_w2_b|lokr_w1|lokr_w2|lokr_t1|lokr_t2)"
                   r"(?:\.weight)?$")
_SIMPLE = {".alpha": "alpha", ".diff_b": "diff_b", ".diff": "diff", ".weight": "weight", ".bias": "bias"}

# roles no layout here implements; each is refused with its own message (layouts.py)
REFUSED_ROLES = {
    "dora_scale": "DoRA (`.dora_scale`)",
    # PEFT's DoRA key, refused whether or not an adapter_config.json says use_dora (break-it, stop 39: without the
    # sidecar it was applied as a plain LoRA, its magnitudes listed as keys naming no module)
    "lora_magnitude_vector": "DoRA (PEFT `.lora_magnitude_vector`)",
    "hada_": "LoHa (`.hada_w1_a` … `.hada_w2_b`)",
    "lora_mid": "Tucker / LoCon mid factor (`.lora_mid`)",
    "lokr_t1": "LoKr with a Tucker core (`.lokr_t1` / `.lokr_t2`)",
    "lokr_t2": "LoKr with a Tucker core (`.lokr_t1` / `.lokr_t2`)",
    # own-weights review, stop 58: PEFT's LoRA on an nn.Embedding (target_modules with embed_tokens) was listed as
    # keys that "name nothing in the model" and the rest applied without it — another model than the one trained
    "lora_embedding_": "a LoRA on the token embedding (PEFT `.lora_embedding_A` / `.lora_embedding_B`, on "
                       "embed_tokens: the pack patches Linear layers, and the adapter without this part would give "
                       "another model than the one trained — train it without embed_tokens in target_modules)",
}


def split_role(key: str) -> tuple[str, str] | None:
    """(base, role) of a file key, or None when the suffix is not one an adapter uses.

    role: "down" / "up" (a LoRA A / B; a PEFT adapter name other than `default` is kept as "down:<name>"),
    "alpha", "diff", "diff_b", "weight", "bias" (full tensors of a replacement), or a LoKr factor
    ("lokr_w1", "lokr_w1_a", …, "lokr_t2")."""
    m = _PAIR.match(key)
    if m:
        role = "down" if m.group("kind") in ("lora_A", "lora_down") else "up"
        name = m.group("name")
        if name and name != "default":
            role += f":{name}"
        return m.group("base"), role
    m = _PAIR_DIFFUSERS.match(key)
    if m:
        return m.group("base"), m.group("kind")
    m = _LOKR.match(key)
    if m:
        return m.group("base"), m.group("role")
    for suffix, role in _SIMPLE.items():
        if key.endswith(suffix) and len(key) > len(suffix):
            return key[: -len(suffix)], role
    return None


@dataclass(frozen=True)
class Target:
    """What a key's base names. `module` the engine module name (model.py docstring); `part` "q"/"k"/"v"/"gate"/"up"
    for a split name of a fused module, else None; `layer` the layer index or None; `kind` the report's group
    ("attention qkv", "attention o", "mlp gate_up", "mlp down", "io", "norm"); `vendor_nar` True for a vendor
    `nar_*` name (always the NAR), `prefix_expert` "ar"/"nar" from a `text_encoders.`/`diffusion_model.` prefix,
    `only_expert` the expert a module exists in alone (lm_head → "ar", vae2llm/llm2vae/time_embedder → "nar")."""
    module: str
    part: str | None
    layer: int | None
    kind: str
    vendor_nar: bool = False
    prefix_expert: str | None = None
    only_expert: str | None = None


_PREFIXES = (("base_model.model.", None), ("model.base_model.model.", None), ("text_encoders.", "ar"),
             ("transformer.ar.", "ar"), ("model.diffusion_model.", "nar"), ("diffusion_model.", "nar"),
             ("transformer.nar.", "nar"))
# ASCII digits only (re.ASCII): int() also takes other scripts' digits, so "layers.١." would be layer 1
_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)$", re.ASCII)
_HOT = re.compile(r"^yue2\.blk\.(\d+)\.(nar_)?(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)$",
                  re.ASCII)
_HOT_SITES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj"}
# layer-relative name → (engine module inside the layer, part, report kind)
_IN_LAYER = {
    "self_attn.qkv_proj": ("self_attn.qkv_proj", None, "attention qkv"),
    "self_attn.q_proj": ("self_attn.qkv_proj", "q", "attention qkv"),
    "self_attn.k_proj": ("self_attn.qkv_proj", "k", "attention qkv"),
    "self_attn.v_proj": ("self_attn.qkv_proj", "v", "attention qkv"),
    "self_attn.o_proj": ("self_attn.o_proj", None, "attention o"),
    "mlp.gate_up_proj": ("mlp.gate_up_proj", None, "mlp gate_up"),
    "mlp.gate_proj": ("mlp.gate_up_proj", "gate", "mlp gate_up"),
    "mlp.up_proj": ("mlp.gate_up_proj", "up", "mlp gate_up"),
    "mlp.down_proj": ("mlp.down_proj", None, "mlp down"),
    "self_attn.q_norm": ("self_attn.q_norm", None, "norm"),
    "self_attn.k_norm": ("self_attn.k_norm", None, "norm"),
    "input_layernorm": ("input_layernorm", None, "norm"),
    "post_attention_layernorm": ("post_attention_layernorm", None, "norm"),
}
# vendor NAR names (§4): nar_self_attn / nar_mlp / nar_input_layernorm / nar_pre_mlp_layernorm
_VENDOR_NAR = {"nar_self_attn.": "self_attn.", "nar_mlp.": "mlp.", "nar_input_layernorm": "input_layernorm",
               "nar_pre_mlp_layernorm": "post_attention_layernorm"}
_WHOLE = {"lm_head": ("model.lm_head", "ar"), "model.lm_head": ("model.lm_head", "ar"),
          "vae2llm": ("vae2llm", "nar"), "llm2vae": ("llm2vae", "nar"),
          "time_embedder.mlp.0": ("time_embedder.mlp.0", "nar"), "time_embedder.mlp.2": ("time_embedder.mlp.2", "nar")}


def parse_target(base: str) -> Target | None:
    """The `Target` a key base names, or None when it names no YuE2 module (see the module docstring). Raises
    ValueError for a spelling that contradicts itself: prefixes of both experts (`text_encoders.diffusion_model.…`),
    or a vendor NAR name (`nar_self_attn`, …) under an AR prefix (`text_encoders.…nar_self_attn`)."""
    prefix_expert = None
    stripped = True
    while stripped:
        stripped = False
        for prefix, expert in _PREFIXES:
            if base.startswith(prefix):
                if expert and prefix_expert and expert != prefix_expert:
                    raise ValueError(f"contradictory prefixes: {prefix!r} names the {expert.upper()}, an "
                                     f"earlier prefix the {prefix_expert.upper()}; a key names one expert")
                base, stripped = base[len(prefix):], True
                prefix_expert = expert or prefix_expert
    m = _HOT.match(base)
    if m:
        base = f"model.layers.{m.group(1)}.{'nar_' if m.group(2) else ''}{_HOT_SITES[m.group(3)]}"
    m = _LAYER.match(base)
    if m:
        digits, rest = m.group(1).lstrip("0") or "0", m.group(2)  # `layers.00` is layer 0, as int() reads it
        if len(digits) > 6:  # int() of over 4,300 digits raised "Exceeds the limit … sys.set_int_max_str_digits()"
            shown = digits if len(digits) <= 12 else digits[:12] + "…"
            raise ValueError(f"its layer index {shown} ({len(digits):,} digits) is no layer of any model")
        layer = int(digits)
        vendor_nar = False
        for vendor, engine in _VENDOR_NAR.items():
            if rest.startswith(vendor):
                rest, vendor_nar = engine + rest[len(vendor):], True
                break
        hit = _IN_LAYER.get(rest)
        if hit is None:
            return None
        if vendor_nar and prefix_expert == "ar":
            raise ValueError("a vendor NAR name (nar_…) under an AR prefix (text_encoders. / transformer.ar.); a key "
                             "names one expert")
        module, part, kind = hit
        return Target(f"model.layers.{layer}.{module}", part, layer, kind, vendor_nar, prefix_expert)
    name = base if base in _WHOLE else base[len("model."):] if base.startswith("model.") else base
    if name in _WHOLE:
        module, only = _WHOLE[name]
        return Target(module, None, None, "io", False, prefix_expert, only)
    return None


def module_shape(module: str, dims: ModelDims) -> tuple[int, ...]:
    """[out, in] of an engine Linear (1-D [n] for a norm) in geometry `dims` (§1.0; nar.py, ar.py)."""
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    leaf = module.split(".", 3)[-1] if module.startswith("model.layers.") else module
    return {
        "self_attn.qkv_proj": (q + 2 * kv, dims.hidden), "self_attn.o_proj": (dims.hidden, q),
        "mlp.gate_up_proj": (2 * dims.ffn, dims.hidden), "mlp.down_proj": (dims.hidden, dims.ffn),
        "self_attn.q_norm": (dims.head_dim,), "self_attn.k_norm": (dims.head_dim,),
        "input_layernorm": (dims.hidden,), "post_attention_layernorm": (dims.hidden,),
        "model.lm_head": (dims.vocab, dims.hidden), "vae2llm": (dims.hidden, dims.latent_dim),
        "llm2vae": (dims.latent_dim, dims.hidden), "time_embedder.mlp.0": (dims.hidden, dims.time_freq),
        "time_embedder.mlp.2": (dims.hidden, dims.hidden),
    }[leaf]


def has_bias(module: str) -> bool:
    """Whether the engine module has a bias (only the NAR's io Linears do: §1.0)."""
    return module in ("vae2llm", "llm2vae", "time_embedder.mlp.0", "time_embedder.mlp.2")


def part_rows(part: str | None, dims: ModelDims) -> tuple[int, int] | None:
    """(first row, row count) of a split name inside its fused module (§1.0 row split; §1.3):
    q (0, heads·head_dim), k (heads·head_dim, kv), v (heads·head_dim + kv, kv) with kv = kv_heads·head_dim,
    gate (0, ffn), up (ffn, ffn); None for a whole module."""
    if part is None:
        return None
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    return {"q": (0, q), "k": (q, kv), "v": (q + kv, kv), "gate": (0, dims.ffn), "up": (dims.ffn, dims.ffn)}[part]


# kohya-style names (sd-scripts, musubi-tuner and trainers built on them): `lora_unet_` / `lora_te_` + the module
# path with every `.` written `_`, e.g. `lora_unet_model_layers_3_self_attn_q_proj.lora_down.weight` + `.alpha`.
# Stock ComfyUI maps `lora_unet_<path>` onto `diffusion_model.<path>` (§0 CUI-LORA `model_lora_keys_unet`), i.e. the
# NAR for the Comfy names; trainers of the vendor model (whose `self_attn` / `mlp` are the AR's and `nar_self_attn` /
# `nar_mlp` the NAR's) write the vendor names under the same prefix. The `_` spelling is read back only against the
# module names YuE2 has (never by replacing `_` with `.`).
KOHYA_PREFIXES = ("lora_unet_", "lora_te1_", "lora_te_")
_KOHYA_LAYER = re.compile(r"^(?:model_)?layers_(\d+)_(.+)$", re.ASCII)
_KOHYA_IN_LAYER = {name.replace(".", "_"): name for name in
                   [*_IN_LAYER, *(v + rest[len(e):] for rest in _IN_LAYER for v, e in _VENDOR_NAR.items()
                                  if e.endswith(".") and rest.startswith(e)),
                    "nar_input_layernorm", "nar_pre_mlp_layernorm"]}
_KOHYA_WHOLE = {name.replace(".", "_"): name for name in _WHOLE}
_SPLIT_LEAVES = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def kohya_base(base: str) -> tuple[str, str] | None:
    """("unet" | "te", dotted module path) of a kohya-style key base (`lora_unet_model_layers_3_self_attn_q_proj` →
    ("unet", "model.layers.3.self_attn.q_proj")), or None when it is not one or names no YuE2 module (an SDXL
    `lora_unet_down_blocks_0_…`)."""
    for prefix in KOHYA_PREFIXES:
        if base.startswith(prefix):
            rest, kind = base[len(prefix):], "unet" if prefix == "lora_unet_" else "te"
            break
    else:
        return None
    m = _KOHYA_LAYER.match(rest)
    if m and m.group(2) in _KOHYA_IN_LAYER:
        return kind, f"model.layers.{m.group(1)}.{_KOHYA_IN_LAYER[m.group(2)]}"
    if rest in _KOHYA_WHOLE:
        return kind, _KOHYA_WHOLE[rest]
    return None


def kohya_names(keys) -> dict:
    """{file key: key in the names the rest of the reader understands} for the kohya-style keys of one file that name
    YuE2 modules (`kohya_base`); keys of other spellings are left out. Expert: `lora_te_` / `lora_te1_` → the AR
    (`text_encoders.`, ComfyUI's text-encoder side); `lora_unet_` in the vendor's names (split q/k/v/gate/up, or
    `nar_*` anywhere in the file) → the vendor rule (`nar_*` the NAR, the rest the AR); `lora_unet_` in Comfy's fused
    names (qkv_proj / gate_up_proj) → the NAR (`diffusion_model.`), as stock ComfyUI applies them.
    `lora_unet_` keys that name only modules both models spell alike (o_proj, down_proj, norms) go to the NAR when the
    file also has `lora_te_` keys (a two-prefix file is ComfyUI's split: a vendor-model trainer writes one prefix;
    stop-49 leftover, such a file was refused). Raises ValueError when such keys stand alone — nothing says which
    expert they are for — and when two keys come to the same name (`lora_te_` and `lora_te1_`
    of one module, or a kohya key and the same module's dotted key: diff review, stop 49, one of them was dropped
    without a word)."""
    found = {}
    for key in keys:
        role = split_role(key)
        hit = kohya_base(role[0]) if role else None
        if hit:
            found[key] = (hit, key[len(role[0]):])
    unet = [dotted for (kind, dotted), _ in found.values() if kind == "unet"]
    vendor = any(".nar_" in d or d.rsplit(".", 1)[-1] in _SPLIT_LEAVES for d in unet)
    comfy = any(d.endswith(("qkv_proj", "gate_up_proj")) for d in unet)
    layered = [d for d in unet if d.startswith("model.layers.")]
    te = any(kind == "te" for (kind, _), _ in found.values())
    if layered and not vendor and not comfy and not te:
        raise ValueError(f"its kohya-style lora_unet_ keys (e.g. {_kohya_example(found)}) name only modules that the "
                         "vendor model and ComfyUI spell alike (o_proj, down_proj, norms): ComfyUI reads lora_unet_ as "
                         "the NAR, the vendor's names as the AR, and nothing in the file says which expert it was "
                         "trained for. Rename the keys to text_encoders.model.layers.N.… (AR) or "
                         "diffusion_model.model.layers.N.… (NAR)")
    out = {}
    for key, ((kind, dotted), suffix) in found.items():
        if kind == "te":
            prefix = "text_encoders."
        else:
            prefix = "" if vendor or not dotted.startswith("model.layers.") else "diffusion_model."
        out[key] = prefix + dotted + suffix
    taken = {key: key for key in keys if key not in out}
    for key, name in out.items():
        if name in taken:
            raise ValueError(f"keys {taken[name]} and {key} are the same tensor ({name}) — two spellings of one "
                             "module; an adapter holds one of each")
        taken[name] = key
    return out


def _kohya_example(found: dict) -> str:
    return sorted(k for k, ((kind, _), _) in found.items() if kind == "unet")[0]
