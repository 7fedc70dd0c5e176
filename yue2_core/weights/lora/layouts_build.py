"""Turning the tensors of one opened adapter file into `Patch`es (weights_and_lora.md §1.1–§1.3): grouping keys by
module, resolving the expert, checking shapes against `dims`, ranks, finiteness and layer indices, and folding the
scale (the precedence rule of layouts.py's docstring, §1.2) into each delta."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...errors import AdapterError, AdapterGeometryError
from ...layers import ModelDims
from .layouts_io import pattern_value
from .layouts_keys import Target, has_bias, module_shape, parse_target, part_rows, split_role
from .model import BiasDiff, Diff, Kron, LowRank, Patch, Replace

# the largest |scale| a delta may carry: alpha/rank of any trained adapter is far below (ai-toolkit 1, PEFT 2,
# Comfy-native 0.5–1); 1e30-style alphas come from a damaged or hostile file and would turn the model into inf/NaN
MAX_SCALE = 1e6
# the smallest: below it the delta vanishes against any bf16 weight — an alpha such as 5e-324 underflows alpha/rank
# to 0 (or a denormal) and the adapter would silently change nothing
MIN_SCALE = 1e-12
_F8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
            if hasattr(torch, n))

_LOKR_ROLES = ("lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b")


@dataclass
class FileContext:
    """What the file as a whole says: `layout` id, `path`, `forced` expert (Mothersuperior ComfyUI fused: its
    `yue2_lora_branch` decides even for `text_encoders.` keys), `default` expert for names that say nothing,
    `replace_ok` whether full `.weight`/`.bias` tensors of io modules are replacements (Mothersuperior raw / .pt),
    and the scale sources: metadata alpha / rank / explicit scale, HOT `lokr_dim`, the PEFT sidecar."""
    layout: str
    path: str
    forced: str | None = None
    default: str | None = None
    replace_ok: bool = False
    meta_alpha: float | None = None
    meta_rank: int | None = None
    meta_scale: tuple[str, float] | None = None  # (metadata field, value): lora_scale / scale
    lokr_dim: int | None = None
    sidecar: dict | None = None


def expert_of(t: Target, ctx: FileContext) -> str:
    """Which expert a target belongs to, first rule that answers: a module only one expert has (lm_head → AR;
    vae2llm, llm2vae, time_embedder → NAR); a vendor `nar_*` name → NAR; the file's forced branch (Mothersuperior
    ComfyUI fused `yue2_lora_branch`, §1.1: `text_encoders.` keys of a branch=nar file are the NAR's); the key's
    `text_encoders.`/`diffusion_model.` prefix; the file's branch (metadata `branch`/`yue2_lora_branch`, HOT
    `format=yue2-{ar,nar}-…`, Starnodes → NAR); else AR (in the vendor's names plain `self_attn`/`mlp` are the AR's)."""
    if t.only_expert:
        return t.only_expert
    if t.vendor_nar:
        return "nar"
    return ctx.forced or t.prefix_expert or ctx.default or "ar"


class _Scale:
    """Per-module scale resolution and the record of which rule gave which value."""

    def __init__(self, ctx: FileContext, alphas: dict):
        self.ctx, self.alphas, self.used = ctx, alphas, {}

    def _alpha_tensor(self, base: str) -> float | None:
        if base not in self.alphas:
            return None
        key, t = self.alphas[base]
        if t.numel() != 1:
            raise AdapterError(f"{self.ctx.path}: {key} must be one number (alpha); found shape {list(t.shape)}")
        if t.dtype == torch.bool or t.is_complex():
            raise AdapterError(f"{self.ctx.path}: {key} has dtype {t.dtype}; an alpha is one positive number")
        a = float(t.double().item())
        if not math.isfinite(a) or a <= 0:
            what = "not finite" if not math.isfinite(a) else "not positive"
            raise AdapterError(f"{self.ctx.path}: {key} is {a:g} ({what}); an alpha must be a positive finite number "
                               f"(the same rule as adapter_config.json's lora_alpha)")
        return a

    def _note(self, rule: str, value: float, key: str = "") -> float:
        if not abs(value) <= MAX_SCALE:
            raise AdapterError(f"{self.ctx.path}: {key + ': ' if key else ''}scale {value:g} ({rule}) is out of "
                               f"range; |scale| must be at most {MAX_SCALE:g} — the alpha is damaged")
        if abs(value) < MIN_SCALE:
            raise AdapterError(f"{self.ctx.path}: {key + ': ' if key else ''}scale {value:g} ({rule}) is too small: "
                               f"|scale| must be at least {MIN_SCALE:g}, or the adapter changes nothing (an alpha so "
                               "small that alpha/rank underflows) — the alpha is damaged; to turn an adapter off, "
                               "give it strength 0")
        self.used.setdefault(rule, set()).add(value)
        return value

    def lowrank(self, base: str, rank: int, key: str, peft_name: str) -> float:
        """alpha tensor / rank → metadata alpha / rank → metadata lora_scale (scale) → sidecar → 1."""
        ctx = self.ctx
        a = self._alpha_tensor(base)
        if a is not None:
            return self._note("module .alpha / rank", a / rank, key)
        if ctx.meta_alpha is not None:
            r = ctx.meta_rank or rank
            if r != rank:
                raise AdapterError(f"{ctx.path}: {key} has rank {rank}, the metadata says rank {ctx.meta_rank}; "
                                   f"the scale alpha/rank needs them to agree")
            return self._note("metadata alpha / rank", ctx.meta_alpha / r, key)
        if ctx.meta_scale is not None:
            return self._note(f"metadata {ctx.meta_scale[0]}", ctx.meta_scale[1], key)
        if ctx.sidecar is not None:
            return self._sidecar(peft_name, rank, key)
        return self._note("1 (no alpha)", 1.0)

    def _sidecar(self, name: str, rank: int, key: str) -> float:
        cfg = self.ctx.sidecar
        r = pattern_value(cfg["rank_pattern"], name, cfg["r"])
        alpha = float(pattern_value(cfg["alpha_pattern"], name, cfg["lora_alpha"]))
        if r != rank:
            raise AdapterError(f"{self.ctx.path}: {key} has rank {rank}, adapter_config.json says r = {r} for it; "
                               f"they must agree")
        if cfg["use_rslora"]:
            return self._note("adapter_config.json lora_alpha / √r (rslora)", alpha / math.sqrt(r), key)
        return self._note("adapter_config.json lora_alpha / r", alpha / r, key)

    def lokr(self, base: str, dim: int | None) -> float:
        """LoKr (§1.1 E, §2): alpha/dim only when a factor is factorised (dim = its inner size), else 1 and any
        alpha is ignored (ai-toolkit full rank stores alpha 9 999 999 999, inf in F16)."""
        if dim is None:
            return self._note("1 (LoKr without a factorised factor: alpha ignored)", 1.0)
        ctx = self.ctx
        if ctx.lokr_dim is not None and ctx.lokr_dim != dim:
            raise AdapterError(f"{ctx.path}: {base} has LoKr dim {dim}, the metadata says lokr_dim "
                               f"{ctx.lokr_dim}; they must agree")
        a = self._alpha_tensor(base)
        if a is not None:
            return self._note("module .alpha / LoKr dim", a / dim, base)
        if ctx.meta_alpha is not None:
            return self._note("metadata alpha / LoKr dim", ctx.meta_alpha / dim, base)
        return self._note("1 (no alpha)", 1.0)

    def rule(self) -> tuple[str, list[float]]:
        if not self.used:
            return "none (no low-rank patch: diffs and replacements are applied as stored)", []
        words = "; ".join(sorted(self.used))
        return words, sorted({v for vals in self.used.values() for v in vals})


def _float(path: str, key: str, t: torch.Tensor) -> torch.Tensor:
    """`t` checked: a float tensor without NaN/inf. FP8 tensors (F8_E4M3 / F8_E5M2) come back as float32: torch
    has no isfinite nor matmul for them."""
    if not t.is_floating_point():
        raise AdapterError(f"{path}: {key} has dtype {t.dtype}; adapter factors must be float tensors")
    if t.dtype in _F8:
        t = t.float()
    if not bool(torch.isfinite(t).all()):
        raise AdapterError(f"{path}: {key} holds NaN or inf values — the adapter is damaged; download it again")
    if t.dtype == torch.float64 and t.numel():
        # deltas are formed in float32 (merge and side delta): an F64 factor past its range became inf there — 1e200
        # beside 1e-202 passed the product bound and gave NaN logits or latents after the work (stop 44 review)
        peak = float(t.abs().max())
        if peak > torch.finfo(torch.float32).max:
            raise AdapterError(f"{path}: {key} is F64 with values up to {peak:.3g}, beyond float32's range "
                               f"({torch.finfo(torch.float32).max:.3g}), in which the pack forms every delta — the "
                               "adapter is damaged or was scaled wrongly; a trained LoRA's factors are small numbers")
    return t


def _shape(path: str, key: str, t: torch.Tensor, expected: tuple, what: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise AdapterGeometryError(f"{path}: shape mismatch for {key} ({what}): expected {list(expected)}, found "
                           f"{list(t.shape)} — made for another model size, or not a YuE2 adapter")


def build_patches(path: str, tensors: dict, ctx: FileContext, dims: ModelDims):
    """Patches of one file. Returns (patches, unmatched keys, scale rule words, scale values). Raises AdapterError
    for a missing A or B, an alpha alone, ranks of A and B that disagree, a shape that does not fit `dims`, a
    non-finite tensor, a layer index ≥ dims.layers, two keys giving the same thing, a fused module given both
    fused and split, or one module given two weight-delta forms (LoRA, LoKr, .diff: `_one_form`)."""
    groups: dict = {}
    unmatched = []
    for key in tensors:
        sr = split_role(key)
        if sr is None:
            unmatched.append(key)
            continue
        base, role = sr
        role, _, peft_name = role.partition(":")
        roles = groups.setdefault(base, {})
        if role in roles:
            raise AdapterError(_given_twice(path, base, roles[role][0], key))
        roles[role] = (key, peft_name)
    alphas = {b: (r["alpha"][0], tensors[r["alpha"][0]]) for b, r in groups.items() if "alpha" in r}
    scale = _Scale(ctx, alphas)
    targets = {}
    for base in groups:
        try:
            targets[base] = parse_target(base)
        except ValueError as exc:  # contradictory prefixes / names, a layer index of 7+ digits (parse_target)
            key = next(iter(groups[base].values()))[0]
            key = key if len(key) <= 120 else f"{key[:80]}…{key[-30:]} ({len(key):,} characters)"
            raise AdapterError(f"{path}: {key}: {exc}") from None
    for base, t in targets.items():  # layer indices first: a file for a deeper model says so before any shape
        if t is not None and t.layer is not None and t.layer >= dims.layers:
            raise AdapterGeometryError(f"{path}: {next(iter(groups[base].values()))[0]} names layer {t.layer}; the "
                                       f"model has {dims.layers} layers (0…{dims.layers - 1}) — made for another "
                                       "model size (a deeper one), or not a YuE2 adapter")
    patches, seen = [], {}
    for base, roles in groups.items():
        t = targets[base]
        if t is None:
            unmatched += [k for k, _ in roles.values()]
            continue
        expert = expert_of(t, ctx)
        made = _module_patches(path, tensors, base, roles, t, expert, dims, ctx, scale)
        used = {k for p in made for k in p.keys}
        if not made and "alpha" in roles:
            raise AdapterError(f"{path}: {roles['alpha'][0]} is an alpha with no lora_A/lora_B (lora_down/lora_up) or "
                               f"lokr factors beside it")
        used |= {roles["alpha"][0]} if made and "alpha" in roles else set()
        unmatched += [k for k, _ in roles.values() if k not in used]
        for p in made:
            ident = (p.expert, p.module, p.rows, type(p.delta).__name__)
            if ident in seen:
                raise AdapterError(f"{path}: {seen[ident][0]} and {p.keys[0]} both patch {p.expert}:{p.module}"
                                   f"{' rows ' + str(p.rows) if p.rows else ''} — two spellings of one module")
            seen[ident] = p.keys
        patches += made
    _fused_and_split(path, patches)
    _one_form(path, patches)
    _replaced_and_changed(path, patches)
    words, values = scale.rule()
    return patches, sorted(unmatched), words, values


def _scheme(base: str, key: str) -> str:
    """The naming scheme of a LoRA factor's key (`base` + its suffix): "lora_A/lora_B", "lora_down/lora_up" or a
    diffusers spelling (".lora.down/.lora.up", …); the suffix itself for any other role."""
    suffix = key[len(base):]
    for names in (("lora_A", "lora_B"), ("lora_down", "lora_up")):
        if suffix.startswith(tuple(f".{n}" for n in names)):
            return "/".join(names)
    for sep in (".lora_linear_layer.", ".lora.", "_lora."):
        if suffix.startswith(sep):
            return f"{sep[:-1]}.down/{sep[:-1]}.up"
    return suffix.lstrip(".")


def _given_twice(path: str, base: str, first: str, second: str) -> str:
    """The refusal of two keys giving one tensor of module `base` (leftover of the stop-54 review: a module given as
    lora_A and as lora_down was told "one PEFT adapter name per file", which fits only two PEFT adapter names)."""
    one, two = _scheme(base, first), _scheme(base, second)
    if one == two:  # the same spelling, two PEFT adapter names (`.lora_A.default.weight` and `.lora_A.style.weight`)
        return (f"{path}: keys {first} and {second} give the same tensor of module {base}; an adapter holds one of "
                "each (one PEFT adapter name per file)")
    return (f"{path}: module {base} is given twice, under two naming schemes: {first} ({one}) and {second} ({two}); "
            "their deltas would add up (a conversion that kept both spellings?) — an adapter names each module once: "
            "remove one of them")


def _fused_and_split(path: str, patches: list) -> None:
    """AdapterError naming the module and a key of each form when one file gives a fused module (`qkv_proj`,
    `gate_up_proj`) both whole and by its split parts (q/k/v, gate/up): the two deltas would add up in silence
    (break-it review, stop 40), which no trainer means."""
    forms: dict = {}
    for p in patches:
        if p.module.endswith(("qkv_proj", "gate_up_proj")):
            forms.setdefault((p.expert, p.module), {}).setdefault(p.rows is None, p)
    for (expert, module), seen in forms.items():
        if len(seen) == 2:
            raise AdapterError(f"{path}: {expert.upper()} {module} is given both fused ({seen[True].keys[0]}) and "
                               f"split ({seen[False].keys[0]}, …); their deltas would add up (a conversion that kept "
                               "both forms?) — an adapter gives a module in one form: remove one of them")


_FORMS = {LowRank: "a LoRA", Kron: "a LoKr", Diff: "a full difference (.diff)"}


def _one_form(path: str, patches: list) -> None:
    """AdapterError naming the module and a key of each form when one file gives one module (or one split part of
    a fused module) two weight deltas of different forms — a LoRA and a LoKr (`o_proj.lora_A` + `o_proj.lokr_w1`),
    a LoRA and a `.diff` (fused `qkv_proj` or split `q_proj` alike): they would add up in silence (break-it review,
    stop 40), which no published layout does. A weight delta with a bias difference (`.diff_b`: ai-toolkit's
    FullModule, Comfy-native io) or a replacement is not a second form of the weight and stays allowed."""
    forms: dict = {}
    for p in patches:
        if type(p.delta) in _FORMS:
            forms.setdefault((p.expert, p.module, p.rows), {}).setdefault(type(p.delta), p)
    for (expert, module, rows), seen in forms.items():
        if len(seen) > 1:
            (ta, a), (tb, b) = list(seen.items())[:2]
            part = f" rows {rows[0]}:{rows[0] + rows[1]}" if rows else ""
            raise AdapterError(f"{path}: {expert.upper()} {module}{part} is given both as {_FORMS[ta]} ({a.keys[0]}) "
                               f"and as {_FORMS[tb]} ({b.keys[0]}); their deltas would add up (a conversion that "
                               "kept both forms?) — an adapter gives a module in one form: remove one of them")


_DELTAS = {**_FORMS, BiasDiff: "a bias difference (.diff_b)"}


def _replaced_and_changed(path: str, patches: list) -> None:
    """AdapterError naming the module and both keys when one file gives one module a replacement (its full weight:
    Mothersuperior's `vae2llm.weight` / `llm2vae.weight`) and a delta (`.lora_A/B`, `.lokr_*`, `.diff`, `.diff_b`):
    whether the delta was trained against the replaced weight or the base one the file does not say, and the
    stacking rule (a replacement first, every delta added to it) would apply it to the replacement in silence —
    before 2026-12-06 the replacement erased a delta read before it (break-it review, stop 41). No published
    layout writes both."""
    replaced = {(p.expert, p.module): p for p in patches if isinstance(p.delta, Replace)}
    for p in patches:
        r = replaced.get((p.expert, p.module))
        if r is not None and type(p.delta) in _DELTAS:
            raise AdapterError(f"{path}: {p.expert.upper()} {p.module} is given both a replacement ({r.keys[0]}) "
                               f"and {_DELTAS[type(p.delta)]} ({p.keys[0]}): one file either replaces a module or "
                               "changes it — remove one of them (or give the delta as a second LoRA, which then "
                               "adds to the replacement)")


def _module_patches(path, tensors, base, roles, t, expert, dims, ctx, scale) -> list:
    rows = part_rows(t.part, dims)
    full = module_shape(t.module, dims)
    out_rows = rows[1] if rows else full[0]
    where = f"{expert}:{t.module}" + (f" rows {rows[0]}:{rows[0] + rows[1]} ({t.part})" if rows else "")
    made = []
    if t.kind == "norm":
        raise AdapterError(f"{path}: {next(iter(roles.values()))[0]} patches the norm {where}: norm diffs (and "
                           f"LoRAs on norms) are not supported; an adapter patches the attention / MLP / io Linears")
    if "down" in roles or "up" in roles:
        if "down" not in roles or "up" not in roles:
            have, miss = ("down", "up (lora_B / lora_up)") if "down" in roles else ("up", "down (lora_A / lora_down)")
            raise AdapterError(f"{path}: {roles[have][0]} has no {miss} partner for module {base}; a LoRA pair "
                               f"needs both")
        (dk, _), (uk, _) = roles["down"], roles["up"]
        down, up = _float(path, dk, tensors[dk]), _float(path, uk, tensors[uk])
        if len(full) != 2 or down.dim() != 2 or up.dim() != 2:
            raise AdapterError(f"{path}: {dk} / {uk}: a LoRA pair needs 2-D A [r, in] and B [out, r] on a Linear "
                               f"module; found {list(down.shape)} / {list(up.shape)} for {where}")
        if down.shape[0] != up.shape[1]:
            raise AdapterError(f"{path}: ranks disagree: {dk} has rank {down.shape[0]} (shape {list(down.shape)}), "
                               f"{uk} has rank {up.shape[1]} (shape {list(up.shape)})")
        r = int(down.shape[0])
        if r == 0:
            raise AdapterError(f"{path}: {dk} has rank 0 (shape {list(down.shape)}): an empty LoRA pair; a rank is "
                               f"at least 1")
        _shape(path, dk, down, (r, full[1]), f"A of {where}")
        _shape(path, uk, up, (out_rows, r), f"B of {where}")
        s = scale.lowrank(base, r, dk, _peft_module_name(base))
        made.append(Patch(expert, t.module, LowRank(down, up, s), rows, (dk, uk)))
    lokr = {role: roles[role][0] for role in _LOKR_ROLES if role in roles}
    if lokr:
        made.append(_kron_patch(path, tensors, base, lokr, t, expert, rows, full, out_rows, where, scale))
    if "diff" in roles:
        k = roles["diff"][0]
        d = _float(path, k, tensors[k])
        _shape(path, k, d, (out_rows, *full[1:]), f"full difference of {where}")
        made.append(Patch(expert, t.module, Diff(d), rows, (k,)))
    if "diff_b" in roles:
        k = roles["diff_b"][0]
        if not has_bias(t.module):
            raise AdapterError(f"{path}: {k} is a bias difference, but {where} has no bias (only vae2llm, llm2vae "
                               f"and time_embedder.mlp.0/2 do)")
        d = _float(path, k, tensors[k])
        _shape(path, k, d, (out_rows,), f"bias difference of {where}")
        made.append(Patch(expert, t.module, BiasDiff(d), rows, (k,)))
    if ctx.replace_ok and t.kind == "io" and "weight" in roles:
        wk = roles["weight"][0]
        w = _float(path, wk, tensors[wk])
        _shape(path, wk, w, full, f"replacement weight of {where}")
        b, keys = None, (wk,)
        if "bias" in roles:
            bk = roles["bias"][0]
            b = _float(path, bk, tensors[bk])
            _shape(path, bk, b, (full[0],), f"replacement bias of {where}")
            keys = (wk, bk)
        made.append(Patch(expert, t.module, Replace(w, b), None, keys))
    return made


def _kron_patch(path, tensors, base, lokr, t, expert, rows, full, out_rows, where, scale) -> Patch:
    """LoKr (§1.1 E): w1 = w1 or w1_a·w1_b, w2 = w2 or w2_a·w2_b; ΔW = scale · kron(w1, w2) of shape [rows, in]."""
    factors, dim = {}, None
    for n in ("1", "2"):
        whole, a, b = f"lokr_w{n}", f"lokr_w{n}_a", f"lokr_w{n}_b"
        if whole in lokr and (a in lokr or b in lokr):
            raise AdapterError(f"{path}: {lokr[whole]} and {lokr.get(a) or lokr.get(b)} both give LoKr factor w{n} "
                               f"of {base}")
        if whole in lokr:
            factors[n] = _float(path, lokr[whole], tensors[lokr[whole]])
        elif a in lokr and b in lokr:
            ta, tb = _float(path, lokr[a], tensors[lokr[a]]), _float(path, lokr[b], tensors[lokr[b]])
            if ta.dim() != 2 or tb.dim() != 2 or ta.shape[1] != tb.shape[0]:
                raise AdapterError(f"{path}: ranks disagree: {lokr[a]} {list(ta.shape)} and {lokr[b]} "
                                   f"{list(tb.shape)} do not multiply (a [m, r] and b [r, n])")
            if ta.shape[1] == 0:
                raise AdapterError(f"{path}: {lokr[a]} / {lokr[b]} have rank 0 (shapes {list(ta.shape)}, "
                                   f"{list(tb.shape)}): a factorised LoKr factor needs rank ≥ 1")
            m, k = int(ta.shape[0]), int(tb.shape[1])
            if m < 1 or k < 1 or out_rows % m or full[1] % k:  # before the product (break-it finding: a 100,000 × 1
                raise AdapterGeometryError(  # by 1 × 100,000 pair asked for 40 GB before its shape was checked)
                    f"{path}: shape mismatch for LoKr {base} ({where}): w{n} = {lokr[a]} · {lokr[b]} would be "
                    f"{[m, k]}, which does not divide the module's {[out_rows, full[1]]} (a Kronecker factor's rows "
                    "and columns divide the weight's)")
            factors[n] = (ta.float() @ tb.float())
            dim = int(tb.shape[0])  # ComfyUI: the w2 factor's dim wins when both are factorised (§2 LoKr)
        else:
            present = lokr.get(a) or lokr.get(b) or next(iter(lokr.values()))
            raise AdapterError(f"{path}: {present}: LoKr factor w{n} of {base} is missing (needs lokr_w{n} or "
                               f"both lokr_w{n}_a and lokr_w{n}_b)")
    w1, w2 = factors["1"], factors["2"]
    if w1.dim() != 2 or w2.dim() != 2 or (w1.shape[0] * w2.shape[0], w1.shape[1] * w2.shape[1]) != \
            (out_rows, full[1]):
        raise AdapterGeometryError(f"{path}: shape mismatch for LoKr {base} ({where}): kron(w1 {list(w1.shape)}, w2 "
                           f"{list(w2.shape)}) must be {[out_rows, full[1]]}")
    return Patch(expert, t.module, Kron(w1, w2, scale.lokr(base, dim)), rows, tuple(sorted(lokr.values())))


def _peft_module_name(base: str) -> str:
    for prefix in ("base_model.model.", "model.base_model.model."):
        if base.startswith(prefix):
            return base[len(prefix):]
    return base
