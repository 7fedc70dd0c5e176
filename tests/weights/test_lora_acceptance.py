"""Acceptance of the LoRA layout reader against files in every published layout (weights_and_lora.md §1, §6).

For every positive layout of `yue2_core.weights.lora.synthetic`, the file is written, parsed with
`layouts.read_adapter`, and for every module the file touches the Adapter's patches, applied to a random base
W [out, in] (and bias b [out]) as `W[rows] += strength · delta.dense()` (a `Replace` replaces W and b at any non-zero
strength), must give the same W'·x + b' as an independent fp64 computation made here straight from the file's raw
tensors and the layout's scale rule (§1.2), for strength 1 and 0.7; strength 0 leaves W and b exactly unchanged. The
expectation code below uses neither the reader nor the generator's helpers: its key grammar and scale rules are
written from the reference. Every negative file must raise `AdapterError` whose message names the problem.

The generator's own guarantees (dtypes, metadata strings, exact zero off-blocks, non-zero B, F16 inf alpha, `.pt`
loadable with weights_only=True, full-size shapes, determinism) are checked without the reader.
"""
from __future__ import annotations

import json
import math
import re
import zlib
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from yue2_core.errors import AdapterError
from yue2_core.layers import ModelDims
from yue2_core.weights.lora import synthetic as syn
from yue2_core.weights.lora.model import Adapter, BiasDiff, Replace

F64 = torch.float64
# The tiny checkpoint geometry (weights/synthetic.py profile "tiny", with the "micro" profile's vocab 1024 so that an
# lm_head target stays small) and the release geometry (§1.0), written out here rather than taken from the generator.
TINY = ModelDims(hidden=256, layers=2, heads=2, kv_heads=1, head_dim=128, ffn=512, vocab=1024)
FULL = ModelDims(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=6144, vocab=184704)


@pytest.fixture(scope="module")
def read_adapter():
    from yue2_core.weights.lora.layouts import read_adapter  # task A's reader: a missing module is a failure

    return read_adapter


# ---------------------------------------------------------------------------------------------------- geometry
# §1.0: fused qkv rows q ‖ k ‖ v (q = heads·head_dim, kv = kv_heads·head_dim), gate_up rows gate ‖ up.

def module_shape(dims: ModelDims, module: str) -> tuple[int, int]:
    q, kv, h, f = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim, dims.hidden, dims.ffn
    m = re.fullmatch(r"model\.layers\.\d+\.(.+)", module)
    table = {"self_attn.qkv_proj": (q + 2 * kv, h), "self_attn.o_proj": (h, q), "mlp.gate_up_proj": (2 * f, h),
             "mlp.down_proj": (h, f)}
    if m:
        return table[m.group(1)]
    return {"vae2llm": (h, dims.latent_dim), "llm2vae": (dims.latent_dim, h),
            "time_embedder.mlp.0": (h, dims.time_freq), "time_embedder.mlp.2": (h, h),
            "model.lm_head": (dims.vocab, h)}[module]


def split_target(dims: ModelDims, layer: int, proj: str) -> tuple[str, tuple[int, int] | None]:
    """A vendor split projection → (engine module, rows (start, count) or None)."""
    q, kv, f = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim, dims.ffn
    fused, rows = {"q_proj": ("self_attn.qkv_proj", (0, q)), "k_proj": ("self_attn.qkv_proj", (q, kv)),
                   "v_proj": ("self_attn.qkv_proj", (q + kv, kv)), "o_proj": ("self_attn.o_proj", None),
                   "gate_proj": ("mlp.gate_up_proj", (0, f)), "up_proj": ("mlp.gate_up_proj", (f, f)),
                   "down_proj": ("mlp.down_proj", None)}[proj]
    return f"model.layers.{layer}.{fused}", rows


HOT_PROJ = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
            "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}
MS_PT_ORDER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # §1.1 F, a literal


# ---------------------------------------------------------------------------------------------------- expectation

class Expected:
    """(expert, module) → ΔW pieces [(first row, fp64 delta already × s)], Δb [out], replacement (W, b)."""

    def __init__(self, dims: ModelDims):
        self.dims = dims
        self.mods: dict[tuple[str, str], dict] = {}
        self.scales: set[float] = set()

    def _entry(self, expert, module):
        out_f, _ = module_shape(self.dims, module)
        return self.mods.setdefault((expert, module), {"dW": [], "db": torch.zeros(out_f, dtype=F64),
                                                       "replace": None})

    def weight(self, expert, module, delta, rows=None, scale=1.0):
        """Add ΔW = delta (already multiplied by `scale`, which is recorded) to rows (start, count) or all rows."""
        self.scales.add(round(float(scale), 9))
        out_f, in_f = module_shape(self.dims, module)
        r0, n = rows or (0, out_f)
        assert delta.shape == (n, in_f), (expert, module, tuple(delta.shape), n)
        self._entry(expert, module)["dW"].append((r0, delta))

    def bias(self, expert, module, delta):
        e = self._entry(expert, module)
        assert delta.shape == e["db"].shape
        e["db"] += delta

    def replace(self, expert, module, weight, bias):
        e = self._entry(expert, module)
        assert weight.shape == module_shape(self.dims, module) and bias.shape == e["db"].shape
        e["replace"] = (weight, bias)

    def change(self, expert, module, x):
        """Σ ΔW·x + Δb [out, cols] (fp64)."""
        e = self.mods[(expert, module)]
        y = e["db"][:, None].repeat(1, x.shape[1])
        for r0, delta in e["dW"]:
            y[r0:r0 + delta.shape[0]] += delta @ x
        return y


def raw(path: Path) -> tuple[dict, dict]:
    """Every tensor of a safetensors file in fp64 (exact for F16/BF16/F32), and its metadata."""
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k).to(F64) for k in f.keys()}, dict(f.metadata() or {})


class Keys:
    """Consumes keys by regex, so that a test can assert the expectation read every tensor of the file."""

    def __init__(self, tensors: dict):
        self.t, self.left = tensors, set(tensors)

    def match(self, pattern: str):
        for k in sorted(self.t):
            m = re.fullmatch(pattern, k)
            if m:
                self.left.discard(k)
                yield k, m

    def get(self, key):
        self.left.discard(key)
        return self.t[key]


def _pairs(keys: Keys, pattern: str, down: str, up: str):
    """{stem match groups: (down, up)} for keys `pattern` whose last group is the factor name."""
    found: dict = {}
    for k, m in keys.match(pattern):
        found.setdefault(m.groups()[:-1], {})[m.groups()[-1]] = keys.t[k]
    return {g: (v[down], v[up]) for g, v in found.items()}


def expect_comfy_named(path, dims, *, down, up, alpha_rule, branch=None):
    """Layouts A/B/D-fused/Mothersuperior-fused: `<prefix><module>.<down|up>.weight` with prefix text_encoders. (AR)
    or diffusion_model. (NAR) — or, when `branch` is given, the file's branch for every key (Mothersuperior fused);
    `.alpha` → s = alpha / down rows when `alpha_rule`, else s = 1; `.diff`/`.diff_b`; full-rank LoKr (s = 1,
    alpha ignored)."""
    tensors, meta = raw(path)
    keys, exp = Keys(tensors), Expected(dims)
    expert_of = {"text_encoders": "ar", "diffusion_model": "nar"}

    def expert(prefix):
        return branch or expert_of[prefix]

    for (prefix, module), (a, b) in _pairs(keys, rf"(text_encoders|diffusion_model)\.(.+)\.({down}|{up})\.weight",
                                           down, up).items():
        s = 1.0
        alpha_key = f"{prefix}.{module}.alpha"
        if alpha_key in tensors:
            assert alpha_rule, f"{alpha_key} in a layout without alpha"
            s = keys.get(alpha_key).item() / a.shape[0]
        exp.weight(expert(prefix), module, s * (b @ a), scale=s)
    for k, m in keys.match(r"(text_encoders|diffusion_model)\.(.+)\.diff"):
        exp.weight(expert(m.group(1)), m.group(2), keys.t[k])
    for k, m in keys.match(r"(text_encoders|diffusion_model)\.(.+)\.diff_b"):
        exp.bias(expert(m.group(1)), m.group(2), keys.t[k])
    for (prefix, module), (w1, w2) in _pairs(keys, r"(text_encoders|diffusion_model)\.(.+)\.(lokr_w1|lokr_w2)",
                                             "lokr_w1", "lokr_w2").items():
        alpha = keys.get(f"{prefix}.{module}.alpha").item()
        assert math.isinf(alpha), alpha  # 9 999 999 999 stored as F16: ignored, both factors are full (§1.1 E)
        exp.weight(expert(prefix), module, torch.kron(w1, w2))
    assert not keys.left, sorted(keys.left)
    return exp


def expect_split(path, dims, *, pattern, down, up, scale, companion=True):
    """Split layouts: `pattern` groups (layer, 'nar_' or '', proj name, factor). Scale `scale(meta)`.
    Also NAR io `.diff`/`.diff_b` (FL), io LoRA (Starnodes), full `weight`/`bias` replacements (Mothersuperior raw)
    and the FL companion named by `acoustic_adapter`."""
    tensors, meta = raw(path)
    keys, exp = Keys(tensors), Expected(dims)
    s = scale(meta)
    for (layer, nar, proj), (a, b) in _pairs(keys, pattern, down, up).items():
        proj = HOT_PROJ.get(proj, proj)
        module, rows = split_target(dims, int(layer), proj)
        exp.weight("nar" if nar else "ar", module, s * (b @ a), rows, scale=s)
    io = r"(vae2llm|llm2vae|time_embedder\.mlp\.[02])"
    for (module,), (a, b) in _pairs(keys, io + rf"\.lora_({down}|{up})\.weight", down, up).items():
        exp.weight("nar", module, s * (b @ a), scale=s)
    for k, m in keys.match(io + r"\.diff"):
        exp.weight("nar", m.group(1), keys.t[k])
    for k, m in keys.match(io + r"\.diff_b"):
        exp.bias("nar", m.group(1), keys.t[k])
    for (module,), (w, bias) in _pairs(keys, r"(vae2llm|llm2vae)\.(weight|bias)", "weight", "bias").items():
        exp.replace("nar", module, w, bias)
    assert not keys.left, sorted(keys.left)
    if companion and "acoustic_adapter" in meta:
        other = expect_split(path.parent / meta["acoustic_adapter"], dims, pattern=pattern, down=down, up=up,
                             scale=scale, companion=False)
        assert not set(other.mods) & set(exp.mods)
        exp.mods.update(other.mods)
    return exp


VENDOR = r"(?:model\.)?layers\.(\d+)\.(nar_)?(?:self_attn|mlp)\.(\w+_proj)"


def expect_hot_lokr(path, dims):
    """HOT LoKr: ΔW = alpha/lokr_dim · kron(w1, w2_a @ w2_b) (w2 factorised, §1.1 E)."""
    tensors, meta = raw(path)
    keys, exp = Keys(tensors), Expected(dims)
    s = float(meta["alpha"]) / float(meta["lokr_dim"])
    found: dict = {}
    for k, m in keys.match(r"yue2\.blk\.(\d+)\.(nar_)?(\w+)\.(lokr_w1|lokr_w2_a|lokr_w2_b)"):
        found.setdefault(m.groups()[:3], {})[m.group(4)] = tensors[k]
    for (layer, nar, site), f in found.items():
        assert f["lokr_w2_b"].shape[0] == int(meta["lokr_dim"])
        module, rows = split_target(dims, int(layer), HOT_PROJ[site])
        exp.weight("nar" if nar else "ar", module, s * torch.kron(f["lokr_w1"], f["lokr_w2_a"] @ f["lokr_w2_b"]), rows,
                   scale=s)
    assert not keys.left, sorted(keys.left)
    return exp


def expect_ms_pt(path, dims):
    """Mothersuperior `.pt`: lora = [A, B] per projection, layer-major, order q,k,v,o,gate,up,down; io replaced."""
    obj = torch.load(str(path), weights_only=True, map_location="cpu")
    exp = Expected(dims)
    lora = obj["lora"]
    assert len(lora) == 14 * dims.layers and obj["rank"] == lora[0].shape[0]
    for i in range(0, len(lora), 2):
        layer, proj = divmod(i // 2, 7)
        module, rows = split_target(dims, layer, MS_PT_ORDER[proj])
        a, b = lora[i].to(F64), lora[i + 1].to(F64)
        exp.weight("nar", module, b @ a, rows)
    for module, wb in obj["io"].items():
        exp.replace("nar", module, wb["weight"].to(F64), wb["bias"].to(F64))
    return exp


def expect_peft(path, dims):
    """PEFT folder: s = lora_alpha / r, or / √r with use_rslora (§1.1 H); `nar_` projections → NAR."""
    cfg = json.loads((path / "adapter_config.json").read_text())
    s = cfg["lora_alpha"] / (math.sqrt(cfg["r"]) if cfg.get("use_rslora") else cfg["r"])
    return expect_split(path / "adapter_model.safetensors", dims, down="A", up="B", scale=lambda meta: s,
                        pattern=r"base_model\.model\." + VENDOR + r"\.lora_(A|B)(?:\.default)?\.weight")


def _meta_alpha_rank(meta):
    return float(meta["alpha"]) / float(meta["rank"])


EXPECT = {
    "aitk": lambda p, d: expect_comfy_named(p, d, down="lora_A", up="lora_B", alpha_rule=False),
    "aitk-lokr": lambda p, d: expect_comfy_named(p, d, down="lora_A", up="lora_B", alpha_rule=False),
    "aitk-full": lambda p, d: expect_comfy_named(p, d, down="lora_A", up="lora_B", alpha_rule=False),
    "hot-fused": lambda p, d: expect_comfy_named(p, d, down="lora_A", up="lora_B", alpha_rule=False),
    "comfy-native": lambda p, d: expect_comfy_named(p, d, down="lora_down", up="lora_up", alpha_rule=True),
    "ms-fused-ar": lambda p, d: expect_comfy_named(p, d, down="lora_down", up="lora_up", alpha_rule=False,
                                                   branch="ar"),
    "ms-fused-nar": lambda p, d: expect_comfy_named(p, d, down="lora_down", up="lora_up", alpha_rule=False,
                                                    branch="nar"),
    "fl": lambda p, d: expect_split(p, d, pattern=VENDOR + r"\.lora_(down|up)\.weight", down="down", up="up",
                                    scale=lambda meta: 1.0),
    "fl-nar": lambda p, d: expect_split(p, d, pattern=VENDOR + r"\.lora_(down|up)\.weight", down="down", up="up",
                                        scale=lambda meta: 1.0),
    "hot-split-ar": lambda p, d: expect_split(p, d, pattern=r"yue2\.blk\.(\d+)\.(nar_)?(\w+)\.lora_(A|B)\.weight",
                                              down="A", up="B", scale=_meta_alpha_rank),
    "hot-split-nar": lambda p, d: expect_split(p, d, pattern=r"yue2\.blk\.(\d+)\.(nar_)?(\w+)\.lora_(A|B)\.weight",
                                               down="A", up="B", scale=_meta_alpha_rank),
    "hot-lokr": expect_hot_lokr,
    "ms-raw-ar": lambda p, d: expect_split(p, d, pattern=VENDOR + r"\.lora_(A|B)", down="A", up="B",
                                           scale=lambda meta: float(meta["lora_scale"])),
    "ms-raw-ar-bf16": lambda p, d: expect_split(p, d, pattern=VENDOR + r"\.lora_(A|B)", down="A", up="B",
                                                scale=lambda meta: float(meta["lora_scale"])),
    "ms-raw-nar": lambda p, d: expect_split(p, d, pattern=VENDOR + r"\.lora_(A|B)", down="A", up="B",
                                            scale=lambda meta: float(meta["lora_scale"])),
    "ms-raw-nar-pt": expect_ms_pt,
    "starnodes": lambda p, d: expect_split(p, d, pattern=VENDOR + r"\.lora_(down|up)\.weight", down="down", up="up",
                                           scale=_meta_alpha_rank),
    "peft": expect_peft,
    "peft-rslora": expect_peft,
}

# The scale each layout must give (§1.2) with rank 4 — a check of the expectation code itself.
SCALES = {"comfy-native": {1.0, 0.5}, "hot-split-ar": {2.0}, "hot-split-nar": {2.0}, "hot-lokr": {0.5},
          "starnodes": {2.0}, "peft": {2.0}, "peft-rslora": {4.0}}


# ---------------------------------------------------------------------------------------------------- comparison

def apply_patches(items, W, b, strength: float):
    """The applier's contract (lora/model.py): W[rows] += strength·delta.dense(); Δb likewise; Replace at any
    strength ≠ 0. `items`: [(patch, its dense ΔW or None)]."""
    W, b = W.clone(), b.clone()
    for p, dense in items:
        d = p.delta
        r0, n = p.rows or (0, W.shape[0])
        if isinstance(d, Replace):
            assert p.rows is None
            if strength != 0:
                W = d.weight.to(F64).clone()
                if d.bias is not None:
                    b = d.bias.to(F64).clone()
        elif isinstance(d, BiasDiff):
            assert d.delta.shape == (n,), (p.module, tuple(d.delta.shape), n)
            b[r0:r0 + n] += strength * d.scale * d.delta.to(F64)
        else:
            W[r0:r0 + n] += strength * dense
    return W, b


def base_weight(out_f: int, in_f: int, g: torch.Generator) -> torch.Tensor:
    """A random base W [out, in] (fp64, scale ~0.02) that is cheap at lm_head size: a tiled 64×64 random block plus
    a random rank-1 term, so no two rows or columns are equal."""
    tile = torch.randn(64, 64, generator=g, dtype=F64) * 0.02
    W = tile.repeat(-(-out_f // 64), -(-in_f // 64))[:out_f, :in_f]
    return W + 0.01 * torch.outer(torch.randn(out_f, generator=g, dtype=F64), torch.randn(in_f, generator=g, dtype=F64))


def check_adapter(adapter: Adapter, exp: Expected, dims: ModelDims, strengths=(1.0, 0.7, 0.0)):
    """The reader's patches on every module equal the expectation: same module set, nothing unmatched, and for each
    strength the same y = W'·x + b' on a random base (W `base_weight` [out, in], b [out], x [in, 3], fp64)."""
    got = {(p.expert, p.module) for p in adapter.patches}
    assert got == set(exp.mods), (f"missing {sorted(set(exp.mods) - got)}", f"extra {sorted(got - set(exp.mods))}")
    assert not adapter.unmatched, adapter.unmatched
    for (expert, module), e in sorted(exp.mods.items()):
        g = torch.Generator().manual_seed(zlib.crc32(f"{expert}:{module}".encode()))
        out_f, in_f = module_shape(dims, module)
        W = base_weight(out_f, in_f, g)
        b = torch.randn(out_f, generator=g, dtype=F64) * 0.02
        x = torch.randn(in_f, 3, generator=g, dtype=F64)
        items = []
        for p in adapter.patches:
            if (p.expert, p.module) == (expert, module):
                dense = None if isinstance(p.delta, (Replace, BiasDiff)) else p.delta.dense()
                n = p.rows[1] if p.rows else out_f
                assert dense is None or dense.shape == (n, in_f), (expert, module, p.keys, tuple(dense.shape))
                items.append((p, dense))
        base = W @ x + b[:, None]
        change_file = exp.change(expert, module, x)
        assert e["replace"] is not None or change_file.abs().max() > 0, (expert, module, "expectation is zero")
        for strength in strengths:
            W2, b2 = apply_patches(items, W, b, strength)
            if strength == 0:
                assert torch.equal(W2, W) and torch.equal(b2, b), (expert, module, "strength 0 changed it")
                continue
            if e["replace"] is not None:
                We, be = e["replace"]
                y_exp = We @ x + be[:, None]
            else:
                y_exp = base + strength * change_file
            change, change_exp = W2 @ x + b2[:, None] - base, y_exp - base
            tol = 1e-6 * float(change_exp.abs().max()) + 1e-12
            err = float((change - change_exp).abs().max())
            assert err <= tol, f"{expert}:{module} strength {strength}: |Δy − expected| {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("layout", syn.LAYOUTS)
def test_layout_matches_fp64_expectation(layout, tmp_path, read_adapter):
    path = syn.write_adapter(layout, tmp_path / syn._FILE_NAMES.get(layout, f"{layout}.safetensors"), TINY, seed=3)
    exp = EXPECT[layout](path, TINY)
    adapter = read_adapter(str(path), TINY)
    assert isinstance(adapter, Adapter)
    check_adapter(adapter, exp, TINY)
    assert {round(float(s), 9) for s in adapter.scales} == exp.scales, (adapter.scale_rule, adapter.scales)
    companions = {"fl": "fl-nar.safetensors", "peft": "adapter_config.json", "peft-rslora": "adapter_config.json"}
    if layout in companions:  # every file read is reported (the FL NAR companion, the PEFT sidecar)
        assert any(Path(f).name == companions[layout] for f in adapter.files), adapter.files


@pytest.mark.parametrize("layout", ["hot-lokr", "ms-fused-nar"])
def test_layout_full_geometry_last_layer(layout, tmp_path, read_adapter):
    """Release shapes (qkv [4096, 2048], gate_up [12288, 2048], LoKr factors) on layer 27 only, rank 2, strength
    0.7 (the tiny tests cover the others)."""
    path = syn.write_adapter(layout, tmp_path / f"{layout}.safetensors", FULL, rank=2, layers=[27])
    check_adapter(read_adapter(str(path), FULL), EXPECT[layout](path, FULL), FULL, strengths=(0.7,))


def test_expectation_scales(tmp_path):
    """The expectation code alone (no reader): the §1.2 scale of every layout's file (rank 4), every key read."""
    for layout, path in syn.write_all(tmp_path, TINY).items():
        assert EXPECT[layout](path, TINY).scales == SCALES.get(layout, {1.0}), layout


# ---------------------------------------------------------------------------------------------------- negatives

# kind → (regex the message must match, text it must name or None)
NEGATIVE_WORDS = {
    "missing-b": (r"missing|lora_B|without|no .*\bB\b|\bup\b", "down_proj"),
    "missing-a": (r"missing|lora_A|without|no .*\bA\b|\bdown\b", "o_proj"),
    "rank-mismatch": (r"rank", "o_proj"),
    "dora-scale": (r"dora", None),
    "loha": (r"loha|hada", None),
    "lora-mid": (r"lora_mid|tucker|\bmid\b", None),
    "unmatched": (r"match|unknown|nothing|not a yue2|unsupported|recogni", None),
    "nan": (r"nan|non-finite|finite", "gate_up_proj"),
    "sdxl": (r"not a yue2|sdxl|stable diffusion|lora_unet|lora_te", None),
    "truncated": (r"truncat|safetensors|does not fit", None),
    "not-safetensors": (r"safetensors", None),
    "bad-peft-config": (r"adapter_config", None),
    "peft-dora": (r"dora", None),
    "artist-bundle": (r"artist", None),
    "layer-out-of-range": (r"layer", "2"),
    "shape-mismatch": (r"shape|expected", "o_proj"),
    "conceptmod": (r"conceptmod|slider|particle|routed", None),
    "hot-param-method": (r"param_method|dora|hira|pissa", None),
}


def test_negative_table_covers_every_kind():
    assert set(NEGATIVE_WORDS) == set(syn.NEGATIVES)


@pytest.mark.parametrize("kind", sorted(syn.NEGATIVES))
def test_negative_refused(kind, tmp_path, read_adapter):
    path = syn.write_negative(kind, tmp_path, TINY)
    with pytest.raises(AdapterError) as info:
        read_adapter(str(path), TINY)
    msg = str(info.value)
    word, name = NEGATIVE_WORDS[kind]
    assert re.search(word, msg, re.I), f"{kind}: message does not name the problem: {msg!r}"
    if name:
        assert name in msg, f"{kind}: message does not name {name!r}: {msg!r}"


# ---------------------------------------------------------------------------------------------------- the generator

def _dtypes(path: Path) -> set:
    with safe_open(str(path), framework="pt") as f:
        return {f.get_slice(k).get_dtype() for k in f.keys()}


def test_files_follow_section_6(tmp_path):
    paths = syn.write_all(tmp_path, TINY)
    assert set(paths) == set(syn.LAYOUTS)
    expected_dtypes = {"aitk": {"F16"}, "aitk-lokr": {"F16"}, "aitk-full": {"F16"}, "hot-split-nar": {"BF16"},
                       "hot-lokr": {"BF16"}, "ms-raw-ar": {"F32"}, "ms-raw-ar-bf16": {"BF16"}, "starnodes": {"F32"},
                       "comfy-native": {"BF16", "F32"}}  # comfy-native: F32 alpha scalars
    for layout, dts in expected_dtypes.items():
        assert _dtypes(paths[layout]) == dts, layout
    for layout, path in paths.items():
        files = [path / "adapter_model.safetensors"] if path.is_dir() else [path] if path.suffix != ".pt" else []
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                meta = h.metadata() or {}
                assert all(isinstance(v, str) for v in meta.values()), layout
                for k in h.keys():  # non-zero B / up everywhere (a zero B hides bugs)
                    if re.search(r"(lora_B|lora_up)(\.default)?(\.weight)?$", k):
                        assert h.get_tensor(k).abs().max() > 0, (layout, k)
    with safe_open(str(paths["aitk-lokr"]), framework="pt") as h:
        alpha = h.get_tensor("text_encoders.model.layers.0.self_attn.qkv_proj.alpha")
        assert alpha.dtype == torch.float16 and torch.isinf(alpha)
        assert h.get_slice("text_encoders.model.layers.0.self_attn.qkv_proj.lokr_w1").get_shape() == [16, 16]
    meta = safe_open(str(paths["starnodes"]), framework="pt").metadata()
    assert (meta["format"], meta["alpha"], meta["rank"]) == ("yue2-lora-v1", "8", "4")
    fl_meta = safe_open(str(paths["fl"]), framework="pt").metadata()
    assert (tmp_path / fl_meta["acoustic_adapter"]).is_file() and fl_meta["branch"] == "ar"
    cfg = json.loads((paths["peft-rslora"] / "adapter_config.json").read_text())
    assert cfg["use_rslora"] is True and cfg["r"] == 4 and cfg["lora_alpha"] == 8
    obj = torch.load(str(paths["ms-raw-nar-pt"]), weights_only=True)
    assert set(obj) == {"lora", "rank", "io"} and len(obj["lora"]) == 14 * TINY.layers


def test_block_diagonal_off_blocks_exactly_zero(tmp_path):
    path = syn.write_adapter("comfy-native", tmp_path / "c.safetensors", TINY, rank=3)
    tensors, _ = raw(path)
    q, kv, r = 256, 128, 3
    for prefix in ("text_encoders.", "diffusion_model."):
        up = tensors[f"{prefix}model.layers.1.self_attn.qkv_proj.lora_up.weight"]
        assert up.shape == (q + 2 * kv, 3 * r)
        assert tensors[f"{prefix}model.layers.1.self_attn.qkv_proj.alpha"].item() == 3 * r
        assert tensors[f"{prefix}model.layers.1.mlp.gate_up_proj.alpha"].item() == 2 * r
        assert tensors[f"{prefix}model.layers.1.mlp.down_proj.alpha"].item() == r
        mask = torch.zeros_like(up, dtype=torch.bool)
        mask[:q, :r] = mask[q:q + kv, r:2 * r] = mask[q + kv:, 2 * r:] = True
        assert torch.all(up[~mask] == 0) and torch.all(up[mask] != 0)
        gu = tensors[f"{prefix}model.layers.0.mlp.gate_up_proj.lora_up.weight"]
        assert torch.all(gu[:512, r:] == 0) and torch.all(gu[512:, :r] == 0)


def test_full_profile_shapes_and_layers(tmp_path):
    path = syn.write_adapter("aitk", tmp_path / "a.safetensors", FULL, rank=2)
    with safe_open(str(path), framework="pt") as h:
        shapes = {k: h.get_slice(k).get_shape() for k in h.keys()}
    assert {int(m.group(1)) for k in shapes if (m := re.search(r"layers\.(\d+)\.", k))} == {0, 27}
    assert shapes["text_encoders.model.layers.27.self_attn.qkv_proj.lora_B.weight"] == [4096, 2]
    assert shapes["diffusion_model.model.layers.0.mlp.gate_up_proj.lora_B.weight"] == [12288, 2]
    assert shapes["diffusion_model.model.layers.0.mlp.down_proj.lora_A.weight"] == [2, 6144]
    assert len(shapes) == 2 * 2 * 4 * 2
    assert syn.lokr_factors(4096) == (64, 64) and syn.lokr_factors(2048) == (32, 64)
    assert syn.lokr_factors(12288) == (96, 128) and syn.lokr_factors(6144) == (64, 96)


def test_seeded_and_reproducible(tmp_path):
    a = syn.write_adapter("hot-split-nar", tmp_path / "a.safetensors", TINY, seed=1)
    b = syn.write_adapter("hot-split-nar", tmp_path / "b.safetensors", TINY, seed=1)
    c = syn.write_adapter("hot-split-nar", tmp_path / "c.safetensors", TINY, seed=2)
    (ta, ma), (tb, mb), (tc, _) = raw(a), raw(b), raw(c)  # (metadata order in the header is not stable)
    assert ma == mb and ta.keys() == tb.keys() == tc.keys()
    assert all(torch.equal(ta[k], tb[k]) for k in ta) and not any(torch.equal(ta[k], tc[k]) for k in ta)


def test_generator_refuses_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown adapter layout"):
        syn.write_adapter("nope", tmp_path / "x", TINY)
    with pytest.raises(ValueError, match="outside"):
        syn.write_adapter("aitk", tmp_path / "x", TINY, layers=[2])
    with pytest.raises(ValueError, match="unknown negative kind"):
        syn.write_negative("nope", tmp_path, TINY)
