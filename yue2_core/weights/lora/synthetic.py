"""Synthetic adapter files in every published YuE2 LoRA layout (weights_and_lora.md §1.1, §6), and files that a
reader must refuse.

No real adapter can be downloaded where this project is developed, so the layout readers are tested on files written
here: exact key spellings, metadata dicts (every value a string), the dtypes the trainers save, seeded random factors
with non-zero B (a zero-initialised B hides bugs), exact zero off-blocks in block-diagonal fused factors. Nothing
here is a trained adapter.

    write_adapter(layout, out, dims, *, rank, layers, seed, dtype) → Path   one positive layout (LAYOUTS)
    write_all(out_dir, dims, *, profile, seed)                      → {layout: Path}
    write_negative(kind, out_dir, dims)                             → Path   one refusal case (NEGATIVES)
    python -m yue2_core.weights.lora.synthetic OUT_DIR [--profile tiny|full] [--force]

Layout ids (LAYOUTS), what the file holds, and the scale a reader must apply (§1.2). "Fused" modules are
`self_attn.qkv_proj`, `self_attn.o_proj`, `mlp.gate_up_proj`, `mlp.down_proj` of `model.layers.N`; "split" are the
vendor `q,k,v,o,gate,up,down` projections (rows of the fused ones, §1.0):

| id | file | tensors | scale |
|---|---|---|---|
| `aitk` | F16, no metadata | `{text_encoders.,diffusion_model.}model.layers.N.<fused>.lora_{A,B}.weight` (§1.1 A) | 1 |
| `aitk-lokr` | F16 | `….<fused>.lokr_w1`, `.lokr_w2` (full rank), `.alpha` = 9 999 999 999 → inf in F16 (§1.1 E) | 1 |
| `aitk-full` | F16 | NAR layers as `aitk` + `diffusion_model.vae2llm.diff`/`.diff_b` (FullModule), LoRA on `diffusion_model.llm2vae`, `diffusion_model.time_embedder.mlp.0`, `text_encoders.model.lm_head` | 1 |
| `comfy-native` | BF16, metadata `format=comfyui-native-lora` | `….<fused>.lora_{down,up}.weight`, qkv/gate_up block-diagonal (rank 3r / 2r, exact zero off-blocks), `.alpha` F32 = 3r / 2r / r (o, down); `diffusion_model.llm2vae` LoRA with `.alpha` = r/2; `diffusion_model.vae2llm.diff`/`.diff_b` (§1.1 B) | alpha / rows of down (1 for layers, ½ for llm2vae) |
| `hot-fused` | BF16, `format=yue2-aitk-fused-lora-v1` | as `aitk`: one shared A per fused site (NOT block-diagonal, §1.1 D) | 1 |
| `ms-fused-ar` | BF16, `format=pt`, `yue2_lora_branch=ar` | `text_encoders.model.layers.N.<fused>.lora_{down,up}.weight`, block-diagonal 3r / 2r, no alpha | 1 |
| `ms-fused-nar` | BF16, as above with `yue2_lora_branch=nar` | the same `text_encoders.` keys, which then patch the NAR | 1 |
| `fl` | F32, `format=fl-yue2-lora-v1`, `branch=ar`, `acoustic_adapter` | AR `model.layers.N.{self_attn,mlp}.<split>.lora_{down,up}.weight`; the companion `<stem>-nar.safetensors` (as `fl-nar`) beside it (§1.1 C) | 1 |
| `fl-nar` | F32, `branch=nar` | `model.layers.N.{nar_self_attn,nar_mlp}.<split>.lora_{down,up}.weight`, `{vae2llm,llm2vae}.diff`, `.diff_b` | 1 |
| `hot-split-ar` | BF16, `format=yue2-ar-lora-v1`, `yue2_adapter_layout=native_split_v1`, `alpha` = 2r, `rank`, `steps` | `yue2.blk.N.{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}.lora_{A,B}.weight` (§1.1 D) | 2 |
| `hot-split-nar` | as above, `format=yue2-nar-lora-v1` | `yue2.blk.N.nar_<site>.lora_{A,B}.weight` | 2 |
| `hot-lokr` | BF16, `format=yue2-nar-lokr-v1`, `alpha=2`, `lokr_dim` = `rank` = r | `yue2.blk.N.nar_<site>.lokr_w1`, `.lokr_w2_a` [c, r], `.lokr_w2_b` [r, d] (§1.1 E) | 2 / r |
| `ms-raw-ar` | F32, `format=pt`, `lora_scale=1.0`, … (§6.6) | `layers.N.{self_attn,mlp}.<split>.lora_{A,B}` (no `.weight`), every split of every layer written (§1.1 F) | lora_scale = 1 |
| `ms-raw-ar-bf16` | BF16, as above | | 1 |
| `ms-raw-nar` | F32 | `layers.N.{nar_self_attn,nar_mlp}.<split>.lora_{A,B}` + full `vae2llm.{weight,bias}`, `llm2vae.{weight,bias}` (replacements) | 1; replacements at any strength ≠ 0 |
| `ms-raw-nar-pt` | `.pt`, tensors only | `{"lora": [A, B] × 7 per layer (q,k,v,o,gate,up,down), layer-major, all layers, "rank": r, "io": {"vae2llm": {"weight","bias"}, "llm2vae": {…}}}` | 1 |
| `starnodes` | F32, `format=yue2-lora-v1`, `alpha=8`, `rank` = r, `target_preset=nar_attn_mlp_proj` | `model.layers.N.{nar_self_attn,nar_mlp}.<split>.lora_{down,up}.weight`, `{vae2llm,llm2vae,time_embedder.mlp.0,time_embedder.mlp.2}.lora_{down,up}.weight` (§1.1 G) | 8 / r |
| `peft` | directory: `adapter_model.safetensors` (F32) + `adapter_config.json` (`r`, `lora_alpha` = 2r) | `base_model.model.model.layers.N.{self_attn,mlp,nar_self_attn,nar_mlp}.<split>.lora_{A,B}.weight` (§1.1 H) | 2 |
| `peft-rslora` | as `peft`, `use_rslora: true`, keys spelled `.lora_A.default.weight` | | 2r / √r |

A layer index is `model.layers.N` of the expert the key names (`nar_`, `diffusion_model.` or the file's branch → NAR).
`layers=None` writes every layer when the geometry has at most 4 layers (the `tiny` profile) and layers {0, last}
otherwise (the release geometry: real shapes, small files); `ms-raw-nar-pt` always writes every layer (its list has
no layer index).

Negative kinds (NEGATIVES), each a file or folder a reader must refuse with `AdapterError`: see `write_negative`.

Every random tensor has its own generator seeded from (seed, layout, key): a file is reproducible and a change to one
key leaves the others unchanged. Factors are N(0, 0.05²), diffs N(0, 0.02²), replacement weights and biases
N(0, 0.02²), all drawn in fp32 and cast to the file's dtype.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from ...layers import ModelDims

LAYOUTS = ("aitk", "aitk-lokr", "aitk-full", "comfy-native", "hot-fused", "ms-fused-ar", "ms-fused-nar", "fl",
           "fl-nar", "hot-split-ar", "hot-split-nar", "hot-lokr", "ms-raw-ar", "ms-raw-ar-bf16", "ms-raw-nar",
           "ms-raw-nar-pt", "starnodes", "peft", "peft-rslora")

#: Negative kinds for `write_negative`, each with what is wrong in it.
NEGATIVES = {
    "missing-b": "an `aitk` file with one lora_B removed (layer 0 mlp.down_proj keeps only its A)",
    "missing-a": "an `aitk` file with one lora_A removed (layer 0 self_attn.o_proj keeps only its B)",
    "rank-mismatch": "an `aitk` file whose layer 0 self_attn.o_proj A has rank 4 and B rank 5",
    "dora-scale": "an `aitk` file with a `.dora_scale` on layer 0 self_attn.o_proj (DoRA)",
    "loha": "LoHa factors `….hada_w1_a`/`hada_w1_b`/`hada_w2_a`/`hada_w2_b` + `.alpha` on a qkv_proj",
    "lora-mid": "a Comfy-native file with a `.lora_mid.weight` (Tucker/LoCon) on layer 0 self_attn.o_proj",
    "unmatched": "LoRA pairs on keys naming no YuE2 module (`…self_attn.qkv_projection`, `…blocks.0.attn1.to_q`)",
    "nan": "an `aitk` file with a NaN in layer 0 mlp.gate_up_proj lora_B",
    "sdxl": "an SDXL kohya LoRA (`lora_unet_down_blocks_0_…`, `lora_te_text_model_encoder_layers_0_…`)",
    "truncated": "an `aitk` file cut to half its length",
    "not-safetensors": "a text file named .safetensors",
    "bad-peft-config": "a PEFT folder whose adapter_config.json is not JSON",
    "peft-dora": "a PEFT folder with `use_dora: true` and `lora_magnitude_vector` tensors",
    "artist-bundle": "a `yue2-artist-ar-v1` AR file with manifest.json and a dummy nar_lora_joint_v4.pt beside it",
    "layer-out-of-range": "an `aitk` file naming layer dims.layers (one past the last)",
    "shape-mismatch": "an `aitk` file whose layer 0 self_attn.o_proj A has in-features hidden + 1",
    "conceptmod": "a routed particle slider (`adapters.model-layers-0-self_attn-k_proj.lora_down.weight`, metadata "
                  "format conceptmod-yue2-routed-particle-ar-v1)",
    "hot-param-method": "a HOT-Step split file with metadata `hot_step.param_method=1` (DoRA/HiRA/PiSSA)",
}

BASE_MODEL = "m-a-p/YuE2-3B"
AITK_LOKR_ALPHA = 9_999_999_999.0  # ai-toolkit lokr_full_rank alpha (§1.1 E); inf once stored as F16
FACTOR_STD, DIFF_STD, WEIGHT_STD = 0.05, 0.02, 0.02

_AR, _NAR = "text_encoders.", "diffusion_model."  # adapter key prefixes of the Comfy-named layouts (§1.1 A)
_FUSED = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
_SPLIT = (("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"), ("self_attn", "o_proj"),
          ("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj"))  # also the `.pt` list order (§1.1 F)
_HOT_SITE = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}  # §1.1 D
_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}
_DEFAULT_DTYPE = {"aitk": "F16", "aitk-lokr": "F16", "aitk-full": "F16", "comfy-native": "BF16",
                  "hot-fused": "BF16", "ms-fused-ar": "BF16", "ms-fused-nar": "BF16", "fl": "F32", "fl-nar": "F32",
                  "hot-split-ar": "BF16", "hot-split-nar": "BF16", "hot-lokr": "BF16", "ms-raw-ar": "F32",
                  "ms-raw-ar-bf16": "BF16", "ms-raw-nar": "F32", "ms-raw-nar-pt": "F32", "starnodes": "F32",
                  "peft": "F32", "peft-rslora": "F32"}
_FILE_NAMES = {"fl": "fl-ar.safetensors", "fl-nar": "fl-nar-alone.safetensors", "ms-raw-nar-pt": "nar_lora_joint.pt",
               "peft": "peft", "peft-rslora": "peft-rslora"}


# ---------------------------------------------------------------------------------------------------- geometry

def fused_shape(dims: ModelDims, module: str) -> tuple[int, int]:
    """[out, in] of a fused layer module (`self_attn.qkv_proj`, …) in `dims` (§1.0: qkv rows q‖k‖v)."""
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    return {"self_attn.qkv_proj": (q + 2 * kv, dims.hidden), "self_attn.o_proj": (dims.hidden, q),
            "mlp.gate_up_proj": (2 * dims.ffn, dims.hidden), "mlp.down_proj": (dims.hidden, dims.ffn)}[module]


def split_shape(dims: ModelDims, proj: str) -> tuple[int, int]:
    """[out, in] of a vendor split projection (`q_proj`, …, `down_proj`) in `dims` (§1.0)."""
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    return {"q_proj": (q, dims.hidden), "k_proj": (kv, dims.hidden), "v_proj": (kv, dims.hidden),
            "o_proj": (dims.hidden, q), "gate_proj": (dims.ffn, dims.hidden), "up_proj": (dims.ffn, dims.hidden),
            "down_proj": (dims.hidden, dims.ffn)}[proj]


def io_shape(dims: ModelDims, module: str) -> tuple[int, int]:
    """[out, in] of a NAR-only module (`vae2llm`, `llm2vae`, `time_embedder.mlp.0/2`) or the AR `model.lm_head`."""
    return {"vae2llm": (dims.hidden, dims.latent_dim), "llm2vae": (dims.latent_dim, dims.hidden),
            "time_embedder.mlp.0": (dims.hidden, dims.time_freq), "time_embedder.mlp.2": (dims.hidden, dims.hidden),
            "model.lm_head": (dims.vocab, dims.hidden)}[module]


def lokr_factors(n: int) -> tuple[int, int]:
    """(m, n/m) with m the largest divisor of n not above √n: ai-toolkit's factor=-1 split (§1.1 E; 4096 → 64·64,
    2048 → 32·64, 12288 → 96·128, 6144 → 64·96)."""
    m = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return m, n // m


def default_layers(dims: ModelDims) -> tuple[int, ...]:
    """Every layer for a geometry of ≤ 4 layers (tiny), else (0, last) (§6: real shapes on a subset of layers)."""
    return tuple(range(dims.layers)) if dims.layers <= 4 else (0, dims.layers - 1)


def profile_dims(profile: str) -> ModelDims:
    """ModelDims of a synthetic checkpoint profile ("tiny", "full", "micro"; weights/synthetic.py PROFILES)."""
    from ..synthetic import get_profile

    p = get_profile(profile)
    return ModelDims(hidden=p.hidden, layers=p.layers, heads=p.heads, kv_heads=p.kv_heads, head_dim=p.head_dim,
                     ffn=p.ffn, vocab=p.vocab)


# ---------------------------------------------------------------------------------------------------- writer

class _Tensors:
    """Collects the tensors of one file, each drawn from its own generator seeded from (seed, layout, key)."""

    def __init__(self, layout: str, seed: int, dtype: torch.dtype):
        self.layout, self.seed, self.dtype = layout, seed, dtype
        self.data: dict[str, torch.Tensor] = {}

    def randn(self, key: str, shape, std: float) -> torch.Tensor:
        digest = hashlib.sha256(f"{self.seed}:{self.layout}:{key}".encode()).digest()
        g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2 ** 63 - 1))
        return (torch.randn(*shape, generator=g) * std).to(self.dtype)

    def add(self, key: str, shape, std: float = FACTOR_STD) -> torch.Tensor:
        self.data[key] = self.randn(key, shape, std)
        return self.data[key]

    def pair(self, down_key: str, up_key: str, out_f: int, in_f: int, rank: int):
        """A LoRA pair: down/A [rank, in], up/B [out, rank], both non-zero."""
        self.add(down_key, (rank, in_f))
        self.add(up_key, (out_f, rank))

    def block_diagonal(self, stem: str, down_key: str, up_key: str, parts: list[int], in_f: int, rank: int):
        """Fused block-diagonal factors (§1.3): down = [A_1; …; A_p] [p·rank, in], up [Σ rows, p·rank] with B_i in
        (rows of part i, columns of part i) and exact zeros elsewhere."""
        downs, up = [], torch.zeros(sum(parts), rank * len(parts), dtype=self.dtype)
        r0 = 0
        for i, rows in enumerate(parts):
            downs.append(self.randn(f"{stem}#down{i}", (rank, in_f), FACTOR_STD))
            up[r0:r0 + rows, i * rank:(i + 1) * rank] = self.randn(f"{stem}#up{i}", (rows, rank), FACTOR_STD)
            r0 += rows
        self.data[down_key] = torch.cat(downs)
        self.data[up_key] = up

    def scalar(self, key: str, value: float, dtype=torch.float32):
        self.data[key] = torch.tensor(value, dtype=dtype)


def _save(tensors: dict, path: Path, metadata: dict | None = None) -> Path:
    """safetensors.save_file with every metadata value a string (§6), with a new file's mode (0644 under umask 022;
    save_file leaves 0600)."""
    from ..synthetic import mode_as_created
    meta = None if metadata is None else {str(k): str(v) for k, v in metadata.items()}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)
    mode_as_created(path)
    return path


def _split_parts(dims: ModelDims, module: str) -> list[int] | None:
    """Row counts of the split parts of a fused module (q, k, v / gate, up), None for o/down."""
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    return {"self_attn.qkv_proj": [q, kv, kv], "mlp.gate_up_proj": [dims.ffn, dims.ffn]}.get(module)


def _fused_lora(t: _Tensors, dims, prefixes, layers, rank, down: str, up: str, block_diag: bool, alpha: bool):
    for prefix in prefixes:
        for n in layers:
            for mod in _FUSED:
                stem = f"{prefix}model.layers.{n}.{mod}"
                out_f, in_f = fused_shape(dims, mod)
                parts = _split_parts(dims, mod)
                if block_diag and parts:
                    t.block_diagonal(stem, f"{stem}.{down}.weight", f"{stem}.{up}.weight", parts, in_f, rank)
                else:
                    t.pair(f"{stem}.{down}.weight", f"{stem}.{up}.weight", out_f, in_f, rank)
                if alpha:  # §6.2: alpha = fused rank → alpha/rank = 1
                    t.scalar(f"{stem}.alpha", float(rank * (len(parts) if block_diag and parts else 1)))


def _split_lora(t: _Tensors, dims, layers, rank, name, down: str, up: str):
    """name(n, block, proj) → key stem; one pair per vendor split projection of every layer."""
    for n in layers:
        for block, proj in _SPLIT:
            out_f, in_f = split_shape(dims, proj)
            stem = name(n, block, proj)
            t.pair(f"{stem}{down}", f"{stem}{up}", out_f, in_f, rank)


def _lokr_full(t: _Tensors, stem: str, out_f: int, in_f: int):
    (a, c), (b, d) = lokr_factors(out_f), lokr_factors(in_f)
    t.add(f"{stem}.lokr_w1", (a, b))
    t.add(f"{stem}.lokr_w2", (c, d))


def _ms_raw_meta(branch: str, rank: int) -> dict:
    delta = ("AR branch: W += lora_B @ lora_A" if branch == "ar" else
             "NAR branch: W += lora_B @ lora_A; vae2llm/llm2vae weight and bias replaced")
    return {"format": "pt", "base_model": BASE_MODEL, "intended_cot": "full", "delta": delta, "lora_scale": "1.0",
            "rank": str(rank)}


def _io_replacements(t: _Tensors, dims):
    for mod in ("vae2llm", "llm2vae"):
        out_f, in_f = io_shape(dims, mod)
        t.add(f"{mod}.weight", (out_f, in_f), WEIGHT_STD)
        t.add(f"{mod}.bias", (out_f,), WEIGHT_STD)


def _peft_config(rank: int, rslora: bool = False, dora: bool = False) -> dict:
    return {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "use_rslora": rslora, "use_dora": dora,
            "fan_in_fan_out": False, "bias": "none", "task_type": "CAUSAL_LM",
            "target_modules": [p for _, p in _SPLIT], "base_model_name_or_path": BASE_MODEL}


def _write_peft(out: Path, t: _Tensors, dims, layers, rank, spelling: str, config: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for prefix in ("", "nar_"):
        _split_lora(t, dims, layers, rank,
                    lambda n, b, p, pre=prefix: f"base_model.model.model.layers.{n}.{pre}{b}.{p}",
                    f".lora_A{spelling}.weight", f".lora_B{spelling}.weight")
    _save(t.data, out / "adapter_model.safetensors")
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out


def write_adapter(layout: str, out: str | Path, dims: ModelDims, *, rank: int = 4, layers=None, seed: int = 0,
                  dtype: str | None = None) -> Path:
    """Write one synthetic adapter in `layout` (one of LAYOUTS; the module docstring's table) and return its path.

    out: the file (or, for `peft*`, the folder) to write; parents are created. dims: the model geometry the shapes
    follow (yue2_core.layers.ModelDims). rank: LoRA rank r of each (unfused) part; block-diagonal files have 3r / 2r
    fused ranks; LoKr files are full rank except `hot-lokr`'s factorised w2 (dim r). layers: layer indices to write
    (None: `default_layers(dims)`). seed: RNG seed (per-key generators). dtype: "F16" | "BF16" | "F32" to override
    the layout's trainer dtype. For `fl` the NAR companion `<stem minus -ar>-nar.safetensors` is written beside `out`
    and named in the metadata `acoustic_adapter`.
    Raises ValueError for an unknown layout or dtype, a layer index outside [0, dims.layers), or `layers` other than
    all layers for `ms-raw-nar-pt` (its list has no layer index)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown adapter layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    dtype = dtype or _DEFAULT_DTYPE[layout]
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(_DTYPES)}")
    layers = default_layers(dims) if layers is None else tuple(sorted(set(int(n) for n in layers)))
    if any(not 0 <= n < dims.layers for n in layers):
        raise ValueError(f"layers {layers} outside [0, {dims.layers})")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t = _Tensors(layout, seed, _DTYPES[dtype])

    if layout in ("aitk", "hot-fused"):
        _fused_lora(t, dims, (_AR, _NAR), layers, rank, "lora_A", "lora_B", block_diag=False, alpha=False)
        return _save(t.data, out, {"format": "yue2-aitk-fused-lora-v1"} if layout == "hot-fused" else None)
    if layout == "aitk-lokr":
        for prefix in (_AR, _NAR):
            for n in layers:
                for mod in _FUSED:
                    stem = f"{prefix}model.layers.{n}.{mod}"
                    _lokr_full(t, stem, *fused_shape(dims, mod))
                    t.scalar(f"{stem}.alpha", AITK_LOKR_ALPHA, t.dtype)
        return _save(t.data, out)
    if layout == "aitk-full":
        _fused_lora(t, dims, (_NAR,), layers, rank, "lora_A", "lora_B", block_diag=False, alpha=False)
        out_f, in_f = io_shape(dims, "vae2llm")
        t.add(f"{_NAR}vae2llm.diff", (out_f, in_f), DIFF_STD)
        t.add(f"{_NAR}vae2llm.diff_b", (out_f,), DIFF_STD)
        for prefix, mod in ((_NAR, "llm2vae"), (_NAR, "time_embedder.mlp.0"), (_AR, "model.lm_head")):
            out_f, in_f = io_shape(dims, mod)
            t.pair(f"{prefix}{mod}.lora_A.weight", f"{prefix}{mod}.lora_B.weight", out_f, in_f, rank)
        return _save(t.data, out)
    if layout == "comfy-native":
        _fused_lora(t, dims, (_AR, _NAR), layers, rank, "lora_down", "lora_up", block_diag=True, alpha=True)
        out_f, in_f = io_shape(dims, "llm2vae")
        t.pair(f"{_NAR}llm2vae.lora_down.weight", f"{_NAR}llm2vae.lora_up.weight", out_f, in_f, rank)
        t.scalar(f"{_NAR}llm2vae.alpha", rank / 2)  # an unfused module keeps its own alpha (§1.1 B)
        out_f, in_f = io_shape(dims, "vae2llm")
        t.add(f"{_NAR}vae2llm.diff", (out_f, in_f), DIFF_STD)
        t.add(f"{_NAR}vae2llm.diff_b", (out_f,), DIFF_STD)
        return _save(t.data, out, {"format": "comfyui-native-lora", "source_format": "yue2-lora-v1",
                                   "yue2_lora_branch": "ar+nar"})
    if layout in ("ms-fused-ar", "ms-fused-nar"):
        branch = layout.rsplit("-", 1)[1]
        _fused_lora(t, dims, (_AR,), layers, rank, "lora_down", "lora_up", block_diag=True, alpha=False)
        return _save(t.data, out, {"format": "pt", "yue2_lora_branch": branch, "base_model": BASE_MODEL,
                                   "layout": "qkv_proj/gate_up_proj block-diagonal 3r", "scale": "1.0"})
    if layout in ("fl", "fl-nar"):
        if layout == "fl":
            stem = out.name[:-len(".safetensors")] if out.name.endswith(".safetensors") else out.name
            companion = (stem[:-3] if stem.endswith("-ar") else stem) + "-nar.safetensors"
            write_adapter("fl-nar", out.parent / companion, dims, rank=rank, layers=layers, seed=seed, dtype=dtype)
            _split_lora(t, dims, layers, rank, lambda n, b, p: f"model.layers.{n}.{b}.{p}",
                        ".lora_down.weight", ".lora_up.weight")
            return _save(t.data, out, {"format": "fl-yue2-lora-v1", "branch": "ar", "rank": str(rank),
                                       "acoustic_adapter": companion})
        _split_lora(t, dims, layers, rank, lambda n, b, p: f"model.layers.{n}.nar_{b}.{p}",
                    ".lora_down.weight", ".lora_up.weight")
        for mod in ("vae2llm", "llm2vae"):
            out_f, in_f = io_shape(dims, mod)
            t.add(f"{mod}.diff", (out_f, in_f), DIFF_STD)
            t.add(f"{mod}.diff_b", (out_f,), DIFF_STD)
        return _save(t.data, out, {"format": "fl-yue2-lora-v1", "branch": "nar", "rank": str(rank)})
    if layout in ("hot-split-ar", "hot-split-nar"):
        branch = layout.rsplit("-", 1)[1]
        pre = "nar_" if branch == "nar" else ""
        _split_lora(t, dims, layers, rank, lambda n, b, p: f"yue2.blk.{n}.{pre}{_HOT_SITE[p]}",
                    ".lora_A.weight", ".lora_B.weight")
        return _save(t.data, out, {"format": f"yue2-{branch}-lora-v1", "yue2_adapter_layout": "native_split_v1",
                                   "rank": str(rank), "alpha": str(2 * rank), "steps": "1000"})
    if layout == "hot-lokr":
        for n in layers:
            for _, proj in _SPLIT:
                stem = f"yue2.blk.{n}.nar_{_HOT_SITE[proj]}"
                out_f, in_f = split_shape(dims, proj)
                (a, c), (b, d) = lokr_factors(out_f), lokr_factors(in_f)
                t.add(f"{stem}.lokr_w1", (a, b))
                t.add(f"{stem}.lokr_w2_a", (c, rank))
                t.add(f"{stem}.lokr_w2_b", (rank, d))
        return _save(t.data, out, {"format": "yue2-nar-lokr-v1", "yue2_adapter_layout": "native_split_v1",
                                   "alpha": "2", "lokr_dim": str(rank), "rank": str(rank), "steps": "1000"})
    if layout in ("ms-raw-ar", "ms-raw-ar-bf16"):
        _split_lora(t, dims, layers, rank, lambda n, b, p: f"layers.{n}.{b}.{p}", ".lora_A", ".lora_B")
        return _save(t.data, out, _ms_raw_meta("ar", rank))
    if layout == "ms-raw-nar":
        _split_lora(t, dims, layers, rank, lambda n, b, p: f"layers.{n}.nar_{b}.{p}", ".lora_A", ".lora_B")
        _io_replacements(t, dims)
        return _save(t.data, out, _ms_raw_meta("nar", rank))
    if layout == "ms-raw-nar-pt":
        if layers != tuple(range(dims.layers)) and layers != default_layers(dims):
            raise ValueError("ms-raw-nar-pt holds every layer (its list has no layer index); leave layers=None")
        all_layers = range(dims.layers)
        _split_lora(t, dims, all_layers, rank, lambda n, b, p: f"layers.{n}.nar_{b}.{p}", ".lora_A", ".lora_B")
        _io_replacements(t, dims)
        lora = []
        for n in all_layers:
            for block, proj in _SPLIT:
                stem = f"layers.{n}.nar_{block}.{proj}"
                lora += [t.data[f"{stem}.lora_A"], t.data[f"{stem}.lora_B"]]
        io = {m: {"weight": t.data[f"{m}.weight"], "bias": t.data[f"{m}.bias"]} for m in ("vae2llm", "llm2vae")}
        torch.save({"lora": lora, "rank": rank, "io": io}, str(out))
        return out
    if layout == "starnodes":
        _split_lora(t, dims, layers, rank, lambda n, b, p: f"model.layers.{n}.nar_{b}.{p}",
                    ".lora_down.weight", ".lora_up.weight")
        for mod in ("vae2llm", "llm2vae", "time_embedder.mlp.0", "time_embedder.mlp.2"):
            out_f, in_f = io_shape(dims, mod)
            t.pair(f"{mod}.lora_down.weight", f"{mod}.lora_up.weight", out_f, in_f, rank)
        return _save(t.data, out, {"format": "yue2-lora-v1", "alpha": "8", "rank": str(rank),
                                   "target_preset": "nar_attn_mlp_proj"})  # no branch: NAR by default
    if layout == "peft":
        return _write_peft(out, t, dims, layers, rank, "", _peft_config(rank))
    assert layout == "peft-rslora"
    return _write_peft(out, t, dims, layers, rank, ".default", _peft_config(rank, rslora=True))


def write_all(out_dir: str | Path, dims: ModelDims, *, profile: str = "tiny", seed: int = 0) -> dict[str, Path]:
    """Write every positive layout into `out_dir` → {layout: path}. profile "tiny": every layer of `dims`;
    "full": layers {0, last} (`ms-raw-nar-pt`: every layer); rank 4 in both. Raises ValueError for another
    profile."""
    if profile not in ("tiny", "full"):
        raise ValueError(f"unknown profile {profile!r}; choose tiny or full")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    layers = tuple(range(dims.layers)) if profile == "tiny" else (0, dims.layers - 1)
    paths = {}
    for layout in LAYOUTS:
        name = _FILE_NAMES.get(layout, f"{layout}.safetensors")
        chosen = None if layout == "ms-raw-nar-pt" else layers
        paths[layout] = write_adapter(layout, out_dir / name, dims, layers=chosen, seed=seed)
    return paths


def planned_files(out_dir: str | Path) -> list[Path]:
    """The files `write_all(out_dir, …)` writes: one per layout, the `fl` file's NAR companion, each PEFT folder's
    weights and config (what its command line refuses to overwrite without --force)."""
    out_dir, files = Path(out_dir), []
    for layout in LAYOUTS:
        name = _FILE_NAMES.get(layout, f"{layout}.safetensors")
        if layout.startswith("peft"):
            files += [out_dir / name / "adapter_model.safetensors", out_dir / name / "adapter_config.json"]
            continue
        files.append(out_dir / name)
        if layout == "fl":
            stem = Path(name).stem
            files.append(out_dir / ((stem[:-3] if stem.endswith("-ar") else stem) + "-nar.safetensors"))
    return files


# ---------------------------------------------------------------------------------------------------- negatives

def write_negative(kind: str, out_dir: str | Path, dims: ModelDims) -> Path:
    """Write the refusal case `kind` (a key of NEGATIVES, which says what is wrong) into `out_dir` and return the
    path a reader is given (a file, or a folder for `bad-peft-config` / `peft-dora`). Layer 0 and rank 4 throughout.
    Raises ValueError for an unknown kind."""
    if kind not in NEGATIVES:
        raise ValueError(f"unknown negative kind {kind!r}; choose one of {', '.join(NEGATIVES)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"neg-{kind}.safetensors"
    t = _Tensors(f"neg-{kind}", 0, torch.float16)
    aitk = _AR + "model.layers.0."

    def aitk_file():
        _fused_lora(t, dims, (_AR,), (0,), 4, "lora_A", "lora_B", block_diag=False, alpha=False)

    if kind in ("missing-b", "missing-a", "rank-mismatch", "dora-scale", "nan", "shape-mismatch"):
        aitk_file()
        if kind == "missing-b":
            del t.data[aitk + "mlp.down_proj.lora_B.weight"]
        elif kind == "missing-a":
            del t.data[aitk + "self_attn.o_proj.lora_A.weight"]
        elif kind == "rank-mismatch":
            t.add(aitk + "self_attn.o_proj.lora_B.weight", (fused_shape(dims, "self_attn.o_proj")[0], 5))
        elif kind == "dora-scale":
            t.add(aitk + "self_attn.o_proj.dora_scale", (fused_shape(dims, "self_attn.o_proj")[0], 1))
        elif kind == "nan":
            t.data[aitk + "mlp.gate_up_proj.lora_B.weight"][3, 1] = float("nan")
        else:
            t.add(aitk + "self_attn.o_proj.lora_A.weight", (4, fused_shape(dims, "self_attn.o_proj")[1] + 1))
        return _save(t.data, path)
    if kind == "truncated":
        aitk_file()
        _save(t.data, path)
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2])
        return path
    if kind == "not-safetensors":
        path.write_text("this is not a safetensors file\n" * 4)
        return path
    if kind == "layer-out-of-range":
        _fused_lora(t, dims, (_AR,), (0,), 4, "lora_A", "lora_B", block_diag=False, alpha=False)
        out_f, in_f = fused_shape(dims, "self_attn.o_proj")
        stem = f"{_AR}model.layers.{dims.layers}.self_attn.o_proj"
        t.pair(f"{stem}.lora_A.weight", f"{stem}.lora_B.weight", out_f, in_f, 4)
        return _save(t.data, path)
    if kind == "loha":
        stem = aitk + "self_attn.qkv_proj"
        out_f, in_f = fused_shape(dims, "self_attn.qkv_proj")
        for w in ("w1", "w2"):
            t.add(f"{stem}.hada_{w}_a", (out_f, 4))
            t.add(f"{stem}.hada_{w}_b", (4, in_f))
        t.scalar(f"{stem}.alpha", 4.0)
        return _save(t.data, path)
    if kind == "lora-mid":
        _fused_lora(t, dims, (_AR,), (0,), 4, "lora_down", "lora_up", block_diag=True, alpha=True)
        t.add(aitk + "self_attn.o_proj.lora_mid.weight", (4, 4, 1, 1))
        return _save(t.data, path, {"format": "comfyui-native-lora", "source_format": "yue2-lora-v1",
                                    "yue2_lora_branch": "ar"})
    if kind == "unmatched":
        out_f, in_f = fused_shape(dims, "self_attn.qkv_proj")
        t.pair(aitk + "self_attn.qkv_projection.lora_A.weight", aitk + "self_attn.qkv_projection.lora_B.weight",
               out_f, in_f, 4)
        t.pair(f"{_NAR}model.blocks.0.attn1.to_q.lora_A.weight", f"{_NAR}model.blocks.0.attn1.to_q.lora_B.weight",
               dims.hidden, dims.hidden, 4)
        return _save(t.data, path)
    if kind == "sdxl":
        for stem, out_f, in_f in (("lora_unet_down_blocks_0_attentions_0_proj_in", 320, 320),
                                  ("lora_unet_mid_block_attentions_0_transformer_blocks_0_attn1_to_q", 1280, 1280),
                                  ("lora_te_text_model_encoder_layers_0_self_attn_q_proj", 768, 768)):
            t.pair(f"{stem}.lora_down.weight", f"{stem}.lora_up.weight", out_f, in_f, 4)
            t.scalar(f"{stem}.alpha", 4.0)
        return _save(t.data, path, {"ss_network_module": "networks.lora", "ss_base_model_version": "sdxl_base_v1-0"})
    if kind == "conceptmod":
        out_f, in_f = split_shape(dims, "k_proj")
        t.pair("adapters.model-layers-0-self_attn-k_proj.lora_down.weight",
               "adapters.model-layers-0-self_attn-k_proj.lora_up.weight", out_f, in_f, 4)
        t.add("router.net.0.weight", (16, dims.hidden))
        return _save(t.data, path, {"format": "conceptmod-yue2-routed-particle-ar-v1"})
    if kind == "hot-param-method":
        _split_lora(t, dims, (0,), 4, lambda n, b, p: f"yue2.blk.{n}.{_HOT_SITE[p]}", ".lora_A.weight",
                    ".lora_B.weight")
        return _save(t.data, path, {"format": "yue2-ar-lora-v1", "yue2_adapter_layout": "native_split_v1",
                                    "rank": "4", "alpha": "8", "steps": "1000", "hot_step.param_method": "1"})
    if kind == "bad-peft-config":
        folder = _write_peft(out_dir / "neg-bad-peft-config", t, dims, (0,), 4, "", _peft_config(4))
        (folder / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4, "lora_alpha": ')
        return folder
    if kind == "peft-dora":
        folder = out_dir / "neg-peft-dora"
        for n, block, proj in ((0, "self_attn", "q_proj"), (0, "nar_self_attn", "v_proj")):
            out_f, _ = split_shape(dims, proj)
            t.add(f"base_model.model.model.layers.{n}.{block}.{proj}.lora_magnitude_vector", (out_f,))
        return _write_peft(folder, t, dims, (0,), 4, "", _peft_config(4, dora=True))
    assert kind == "artist-bundle"
    _fused_lora(t, dims, (_AR,), (0,), 4, "lora_down", "lora_up", block_diag=True, alpha=False)
    companion = out_dir / "nar_lora_joint_v4.pt"
    torch.save({"lora": [], "rank": 32, "io": {}}, str(companion))
    sha = hashlib.sha256(companion.read_bytes()).hexdigest()
    (out_dir / "manifest.json").write_text(json.dumps(
        {"format": "yue2-artist-ar-v1", "base": BASE_MODEL, "companion": {"path": companion.name, "sha256": sha}}))
    return _save(t.data, path, {"format": "yue2-artist-ar-v1", "scale": "1", "encoder_revision": "0" * 40,
                                "companion_sha256": sha, "manifest": "manifest.json"})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m yue2_core.weights.lora.synthetic",
                                 description="Write a synthetic adapter in every YuE2 LoRA layout.")
    ap.add_argument("out_dir")
    ap.add_argument("--profile", choices=("tiny", "full"), default="tiny",
                    help="tiny: the tiny checkpoint geometry, every layer; full: release shapes, layers 0 and 27")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="replace the files if they exist (refused otherwise)")
    args = ap.parse_args(argv)
    from ..synthetic import refuse_overwrite
    refused = refuse_overwrite(planned_files(args.out_dir), args.force)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 1
    for layout, path in write_all(args.out_dir, profile_dims(args.profile), profile=args.profile,
                                  seed=args.seed).items():
        print(f"{layout:16s} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
