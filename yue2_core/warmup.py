"""Cold-start warm-up: compile what a song's fast path needs while the weights load, so the first song runs at the
speed of the second (issue #18 item 1; on an H200 a fresh process spent 8.1 s of its first song compiling the decode
kernels during the first graph capture).

A *shadow* model does the work: the checkpoint's real dimensions and module kinds (int8 ConvRot or bf16 linears; the
NAR's linears as `nar.prepare_linears` leaves them on the GPU — bf16, or int8 for W8A8: `_nar_quant`) but ONE
transformer layer, the real-size embedding, LM head and in/out projections (their shapes pick the GEMV
configurations), and cheap deterministic weights — never uninitialised memory, whose NaNs would trip the decoder's
fallbacks. It is built from the checkpoint's header alone
(`inspect_checkpoint`), so it can run before a single weight is read.

What a Triton kernel specialises on, and how the shadow hits the same variants as a song (Triton 3.x
`JITFunction` specialisation: constexprs, dtypes, integer arguments not in `do_not_specialize` by "equals 1" and
"divisible by 16", pointers by 16-byte alignment):
- layer products (`fast.gemv`): N, K and the table's constexpr blocks per weight shape — the real shapes, the real
  LM head slices of both phases; M (rows) is not specialised;
- consumers (`fast.fused`: add+RMSNorm, QK-norm+RoPE+KV store, SiLU·up): widths and split counts of the products
  (real shapes); rows, capacities and NAR lengths are either unspecialised or always multiples of 16;
- decode attention: lengths, chunks and split counts are unspecialised, but the constexpr SP = next power of two of
  the split count depends on the attention length (and on the GPU's multiprocessor count and the rows): the shadow
  steps one representative length per SP that any length in [1, CONTEXT] gives on this GPU
  (`warmup_jobs.attention_lengths`) — a short phase's attention length is its capacity (< `fast.decode.BUCKET`), so
  stepping only the buckets missed the small SPs;
- sampling tail (`fast.sample_kernels`): the phase width, the Sampling settings (constexprs CFG, PENALTY, SCALE,
  TOPP, the candidate count) — taken from the song's presets; the budget (`min_tokens` / `max_tokens`, the output
  row stride) and the row count are not specialised (`do_not_specialize`; both budget residues mod 16 are still
  stepped, as before that); the CFG pair (2 rows) only when asked;
- the `batch` command's decoder (`Plan.batch_rows` > 1, set by the command once it sized the batch): the attention's
  SP variants of that many rows, and with `batch_refill` the continuous decoder's per-row sampling-tail kernels
  (constexpr ROWS) — static batches share the one-row tail kernels;
- NAR: one velocity on a chunk of more than 16 rows (the row-blocked RoPE kernel) — its lengths are unspecialised;
- VAE: one tile of the song's tile size (cuDNN's first use, the snake kernel) and one short tile per group of
  length residues mod 16 that meet the same snake-kernel specialisation (`vae_short_tiles`: the kernel specialises
  on its length T, an affine function of the tile's frames; 3 tiles for the release's strides).

Parallel compile (`warmup_jobs.py`): when the marker `<TRITON_CACHE_DIR>/yue2-warmup/<key>.json` of this plan,
GPU, Triton/torch and kernel sources is absent, `warm_up` first starts `warmup_jobs.procs()` child processes that
run the same steps, each compiling its shard of the kernel variants into Triton's disk cache; the in-process steps
of a stage run once every child has passed it (cache hits: they load the kernels and warm cuDNN/cuBLAS here). A
failed child is one warning (the in-process steps compile what it did not); cancel kills the children. The marker
is written (atomically) after a warm-up that completed; with it present no child is started.

Threading: the warm-up runs in a daemon thread on its own CUDA stream, while the loader reads weights on the default
stream. It never captures a CUDA graph: eager steps compile the same kernels, and a capture (global capture mode)
would make the loader's synchronous host→device copies in the other thread illegal during the capture. The stages
wait for it (`WarmUp.wait`), so no song kernel runs beside it. A failure is one warning, never an error for a song;
`WarmUp.cancel()` (or the `should_stop` callback, e.g. ComfyUI's Cancel) stops it between steps.

Triton's disk cache: every file goes through `triton.runtime.cache.FileCacheManager.put`, which writes into a fresh
`tmp.pid_<pid>_<uuid>` directory and `os.replace`s the file into place (atomic on POSIX), and a kernel's group
index (`__grp__*.json`, written last) is only trusted when every file it lists exists (`get_group`): an interrupted
compile (exception, cancel, the process ending) leaves at most a stray temporary directory, never a broken entry
(triton/runtime/cache.py in Triton 3.4–3.8; the autotuner's `*.autotune.json` goes through the same `put`). A cache
directory that is read-only or full is replaced for this process by a fresh temporary one, with one warning.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from .switches import flag

SWITCH = "YUE2_WARMUP"
MIN_FREE_BYTES = 256 * 2 ** 20  # a cache with less free space counts as full: one decode kernel set is ~30 MB
PREFIX_TOKENS = 64  # shadow prompt: more than the 16 rows under which products take the decode-sized paths
NAR_FRAMES = 256  # shadow NAR chunk (258 rows: the NAR's row-blocked kernels)
PATTERN = 4099  # period of the deterministic weight pattern (a prime: no alignment with rows of 2^k)
VAE_SHORT_FRAMES = tuple(range(33, 49))  # short VAE tiles: every residue mod 16 (`vae_short_tiles` picks from them)

_CACHE_LOCK = threading.Lock()
_CACHE_CHECKED: dict = {}


# -- when ------------------------------------------------------------------------------------------------------------
def skip_reason(device) -> str | None:
    """Why no warm-up runs on `device` (None: it runs). Reads YUE2_WARMUP (0/1, default 1; RequestError otherwise)
    first, so a bad value is reported on any device."""
    on = flag(SWITCH, True)
    dev = torch.device(device)
    if not on:
        return f"{SWITCH}=0"
    if dev.type != "cuda":
        return f"the device is {dev.type}: only the CUDA fast path compiles kernels"
    from .fast import fast_enabled, triton_modules
    if not fast_enabled(dev):
        return "YUE2_FAST=0: the portable paths compile nothing"
    if triton_modules() is None:
        return "Triton is not importable: nothing to compile"
    return None


# -- Triton's cache directory ---------------------------------------------------------------------------------------
def triton_cache_dir() -> str:
    """The directory Triton caches compiled kernels in: $TRITON_CACHE_DIR, else $TRITON_HOME (default ~)/.triton/cache
    (triton.knobs.cache.dir)."""
    explicit = os.environ.get("TRITON_CACHE_DIR", "").strip()
    if explicit:
        return explicit
    home = os.environ.get("TRITON_HOME", "").strip() or os.path.expanduser("~")
    return os.path.join(home, ".triton", "cache")


def cache_problem(path: str, min_free: int = MIN_FREE_BYTES) -> str | None:
    """Why Triton could not cache kernels in `path` (None: it can): not creatable, not writable (a probe file is
    written and removed), or under `min_free` bytes free."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".yue2-probe-", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        return f"not writable ({type(exc).__name__}: {exc.strerror or exc})"
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return None
    if free < min_free:
        return f"full ({free / 2 ** 20:.0f} MiB free)"
    return None


def ensure_cache_dir() -> str:
    """Make sure this process's Triton compiles can be cached: when `triton_cache_dir()` is read-only or full, point
    TRITON_CACHE_DIR at a fresh temporary directory for this process (Triton reads it at each compile; removed at
    exit) with one warning. Checked once per directory and process. Returns the directory in use."""
    with _CACHE_LOCK:
        path = triton_cache_dir()
        if path in _CACHE_CHECKED:
            return _CACHE_CHECKED[path]
        problem = cache_problem(path)
        use = path
        if problem is not None:
            try:
                use = tempfile.mkdtemp(prefix="yue2-triton-cache-")
            except OSError as exc:  # no writable temporary folder either (a read-only container): said, not an
                from .errors import RequestError  # OSError traceback out of the model's load (stop-47 review)
                raise RequestError(f"Triton's cache directory {path} is {problem}, and no temporary folder can be "
                                   f"made instead ({exc.strerror or exc}): Triton compiles the GPU kernels into "
                                   "it — set TRITON_CACHE_DIR to a writable folder (or TMPDIR), or YUE2_FAST=0 to "
                                   "run without the Triton kernels") from None
            os.environ["TRITON_CACHE_DIR"] = use
            atexit.register(shutil.rmtree, use, True)  # this process's alone: removed when it exits
            warnings.warn(f"Triton's cache directory {path} is {problem}: kernels compiled by this process are "
                          f"cached in {use} instead (removed when the process exits; compiled again in the next)")
        _CACHE_CHECKED[path] = _CACHE_CHECKED[use] = use
        return use


# -- the shadow model ---------------------------------------------------------------------------------------------
def _first_layer(quant: dict) -> dict:
    """The quantization map restricted to layer 0 and the modules outside the layers."""
    return {k: v for k, v in (quant or {}).items() if ".layers." not in k or ".layers.0." in k}


def _nar_quant(quant: dict, dims, dtype, device=None, layers: str | None = None) -> dict:
    """The shadow NAR's quantization map: when the NAR keeps its codes on CUDA (YUE2_NAR_LINEARS w8a8, or auto on
    Hopper; `nar.int8_linears`) its layer linears int8 as the AR's, and so are `llm2vae` and the time embedder's two
    linears, as in the int8 file (checkpoint_format.md §1.5; the AR's map, which the plan holds, has no NAR-only
    module): their products — with a bias, of a chunk's rows (the time embedding is expanded to every row) — compile
    and tune on the shadow rather than in the song (stop-48 diff review). Otherwise — or for a NAR not in bf16,
    which `nar.prepare_linears` gives float layers — none (bf16 layers, as `nar.float_linears` leaves them).
    `device`: the warm-up's (YUE2_NAR_LINEARS=auto resolves by it; "meta" and None: the current CUDA device).
    `layers` (`Plan.nar_linears`, what adapters will make of the real NAR): "bf16" — none (`nar.adapters_want_bf16`:
    every linear bf16); "layers_bf16" — the transformer layers' linears bf16, the others int8 as above
    (YUE2_LORA_INT8=bf16: `apply.dequantize_layers`)."""
    from .nar import linears_mode
    if layers == "bf16" or linears_mode(None if device is None or torch.device(device).type == "meta" else device) \
            != "w8a8" or dtype != torch.bfloat16:
        return {}
    out = {k: v for k, v in quant.items() if ".layers." in k}
    group = next(iter(out.values()), None)
    if layers == "layers_bf16":
        out = {}
    if isinstance(group, int):
        for name, in_features in (("llm2vae", dims.hidden), ("time_embedder.mlp.0", dims.time_freq),
                                  ("time_embedder.mlp.2", dims.hidden)):
            if in_features % group == 0:
                out[name] = group
    return out


@dataclass
class Shadow:
    """One-layer stand-ins of the loaded parts (any may be None)."""
    ar: object = None
    nar: object = None
    vae: object = None


def build_shadow(dims, quant_ar: dict | None, vae_cfg=None, device="cuda", dtype=torch.bfloat16, *,
                 parts=("ar", "nar", "vae"), int8_layers: bool = True, nar_linears: str | None = None) -> Shadow:
    """Shadow modules for a checkpoint of `dims` (`layers.ModelDims`) whose AR quantization map is `quant_ar`
    (`CheckpointInfo.quant_ar`; empty for bf16 files): an `ARModel` and an `NARModel` with one layer and bf16 NAR
    linears (what `nar.float_linears` makes of an int8 file's NAR on GPUs; int8 ones marked for W8A8 products with
    YUE2_NAR_LINEARS w8a8 / auto on Hopper), a full `VAEDecoder(vae_cfg)`, each with
    deterministic weights (`fill_`) on `device` in `dtype` (the VAE fp32). `device="meta"`: shapes only, nothing
    allocated (tests). `int8_layers=False`: the AR's layer linears bf16 (YUE2_LORA_INT8=bf16 with adapters);
    `nar_linears`: what adapters make of the NAR's (`_nar_quant`'s `layers`)."""
    from .ar import ARModel
    from .nar import NARModel
    from .vae import VAEDecoder
    one = replace(dims, layers=1)
    quant = _first_layer(quant_ar)
    nar_quant = _nar_quant(quant, dims, dtype, device, nar_linears)
    if not int8_layers:
        quant = {k: v for k, v in quant.items() if ".layers." not in k}
    out = Shadow()
    with torch.device("meta"):
        if "ar" in parts:
            out.ar = ARModel(one, quant, dtype)
        if "nar" in parts:
            out.nar = NARModel(one, nar_quant, dtype)
        if "vae" in parts and vae_cfg is not None:
            out.vae = VAEDecoder(vae_cfg)
    for name in ("ar", "nar", "vae"):
        mod = getattr(out, name)
        if mod is None:
            continue
        mod.eval().requires_grad_(False)
        if torch.device(device).type != "meta":
            mod = _materialize(mod, device)
            fill_(mod)
            setattr(out, name, mod)
    if out.nar is not None and torch.device(device).type != "meta" and nar_quant:
        from .nar import int8_linears
        int8_linears(out.nar)  # W8A8 (YUE2_NAR_LINEARS): its kernels compile and tune on the shadow
    if out.ar is not None:
        emb = out.ar.model.embed_tokens
        if hasattr(emb, "dtype") and not isinstance(emb, torch.nn.Embedding):
            emb.dtype = dtype  # as checkpoint._set_embed_dtype
    return out


def _materialize(module: torch.nn.Module, device) -> torch.nn.Module:
    """`module.to_empty(device=device)` without its `torch.empty_like` of meta tensors, whose reference
    implementation (torch._refs.empty_like → torch._prims_common) imports torch.fx's symbolic shapes and with them
    sympy: 1.9 s of the warm-up's build stage on an H100 machine without bytecode caches (stop 54,
    bench/warmup_profile.py), a cost no song pays otherwise."""
    return module._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))


@torch.no_grad()
def fill_(module: torch.nn.Module) -> torch.nn.Module:
    """Deterministic, finite weights in place: floats 0.02·sin(0.7·i) (row scales of int8 layers 1/512), int8 codes
    (7·i mod 255) − 127, the pattern repeating every `PATTERN` elements (one copy per tensor)."""
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        n = t.numel()
        if n == 0:
            continue
        i = torch.arange(min(n, PATTERN), device=t.device)
        if t.dtype == torch.int8:
            pattern = ((i * 7) % 255 - 127).to(torch.int8)
        elif t.dtype.is_floating_point:
            pattern = (torch.full_like(i, 1.0 / 512, dtype=torch.float32) if name.endswith("weight_scale")
                       else 0.02 * torch.sin(0.7 * i.float())).to(t.dtype)
        else:
            pattern = (i % 7).to(t.dtype)
        flat = t.view(-1)
        whole = n // PATTERN * PATTERN
        if whole:
            flat[:whole].view(-1, PATTERN).copy_(pattern.expand(whole // PATTERN, PATTERN))
        if n > whole:
            flat[whole:].copy_(pattern[:n - whole])
    return module


# -- the work -------------------------------------------------------------------------------------------------------
class Cancelled(Exception):
    """Raised inside the warm-up thread when it is cancelled (never leaves `WarmUp`)."""


def _phase_samplings(budgets, phase: str) -> list:
    """The song's Sampling of `phase` with budget lengths giving both residues mod 16 of `max_tokens` and
    `min_tokens` (the tail kernels specialise on them) and room for every attention bucket of the context."""
    from .constants import CONTEXT
    from .pipeline import Budgets
    budgets = budgets or Budgets()
    s = budgets.abc_sampling() if phase == "abc" else budgets.semantic_sampling()
    top = (CONTEXT - PREFIX_TOKENS) // 16 * 16
    return [replace(s, min_tokens=16, max_tokens=top), replace(s, min_tokens=17, max_tokens=top - 1)]


def decode_variants(budgets, phase: str, cfg_pair: bool) -> list:
    """[(Sampling, cfg)] the warm-up decodes for `phase`: each residue variant of the phase's Sampling
    (`_phase_samplings`), and with `cfg_pair` the semantic phase's CFG pair (2 rows) of each."""
    samplings = _phase_samplings(budgets, phase)
    return [(s, False) for s in samplings] + [(s, True) for s in samplings if cfg_pair and phase == "semantic"]


def attention_geometry(dims, device, dtype=torch.bfloat16) -> dict:
    """{"sms", "bl", "per_sm"} of `fast.fused.decode_attention` on `device` for the AR's head layout: the
    multiprocessor count (16 off CUDA, as decode_attention), ATTN_CONFIG after `fit_attention` for the device's
    shared memory (no shared prefix: 1–2 rows)."""
    from .fast import fused
    from .fast.gemv import shared_limit
    from .warmup_jobs import next_pow2
    device = torch.device(device)
    cfg = fused.ATTN_CONFIG
    limit = shared_limit(device)
    if limit:
        g = dims.heads // dims.kv_heads
        cfg = fused.fit_attention(cfg, dims.head_dim, max(16, next_pow2(g)), torch.empty((), dtype=dtype)
                                  .element_size(), limit)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 16
    return {"sms": sms, "bl": cfg.bl, "per_sm": cfg.per_sm}


def plan_steps(plan: "Plan", geometry: dict) -> list:
    """Every step of the warm-up of `plan`, in order: ("decode_<phase>", variant index, attention length) — the
    first variant of each row count steps one length per split constexpr SP (`warmup_jobs.attention_lengths` up
    to the decoder's capacity, CONTEXT), the other residue one length — then ("nar", 0, NAR_FRAMES) and ("vae", 0,
    frames) for one full tile and the short tiles of `vae_short_tiles`. `geometry`: `attention_geometry`."""
    from .constants import CONTEXT
    from .fast.decode import BUCKET
    from .warmup_jobs import attention_lengths
    steps = []
    ar = "ar" in plan.parts
    if ar:
        for phase in plan.phases:
            seen_rows = set()
            for k, (s, cfg) in enumerate(decode_variants(plan.budgets, phase, plan.cfg_pair)):
                rows = 2 if cfg else 1
                capacity = PREFIX_TOKENS + s.max_tokens
                if rows not in seen_rows:
                    seen_rows.add(rows)
                    lengths = sorted(attention_lengths(min(capacity, CONTEXT), rows, plan.dims.kv_heads,
                                                       geometry["sms"], geometry["bl"],
                                                       geometry["per_sm"]).values())
                else:
                    lengths = [min(BUCKET, capacity)]
                steps += [(f"decode_{phase}", k, n) for n in lengths]
            if plan.batch_rows > 1:  # the batch decoder (variant indices after the others): the rows' SP
                base = len(decode_variants(plan.budgets, phase, plan.cfg_pair))  # variants, both budget residues
                for j, s in enumerate(_phase_samplings(plan.budgets, phase)):
                    capacity = PREFIX_TOKENS + s.max_tokens
                    lengths = sorted(attention_lengths(min(capacity, CONTEXT), plan.batch_rows, plan.dims.kv_heads,
                                                       geometry["sms"], geometry["bl"],
                                                       geometry["per_sm"]).values()) if j == 0 else [BUCKET]
                    steps += [(f"decode_{phase}", base + j, n) for n in lengths]
        if "nar" in plan.parts:
            steps.append(("nar", 0, NAR_FRAMES))
    if "vae" in plan.parts and plan.vae_cfg is not None:
        steps += [("vae", 0, 0)] + [("vae", 0, f) for f in vae_short_tiles(plan.vae_cfg)]
    return steps


def _batch_decoder(ar, prefix: list, sampling, phase: str, rows: int, refill: bool):
    """The `batch` command's decoder on the shadow, without graphs: `rows` rows whose prompts differ in their first
    token (no shared prefix), a `RefillDecoder` (continuous batching; its preset's max_tokens, which the sampling
    tail specialises on, is its songs' largest budget: each song gets `sampling`'s) or a `PhaseDecoder` (static
    batches). The row count itself is specialised by the sampling-tail kernels (1, a multiple of 16, or neither)."""
    from .fast.decode import PhaseDecoder
    from .fast.refill import QueuedSong, RefillDecoder
    prefixes = [[prefix[(j + 1) % len(prefix)]] + prefix[1:] for j in range(rows)]
    if refill:
        return RefillDecoder(ar, [QueuedSong(j, p, j, min_tokens=sampling.min_tokens, max_tokens=sampling.max_tokens)
                                  for j, p in enumerate(prefixes)], rows, sampling, phase, use_graph=False)
    return PhaseDecoder(ar, prefixes, sampling, list(range(rows)), phase, use_graph=False)


def _decode(ar, phase: str, budgets, cfg_pair: bool, steps: list, stop: Callable[[], None], batch_rows: int = 0,
            batch_refill: bool = False) -> int:
    """Eager fused decode steps of the shadow AR (`fast.decode.PhaseDecoder` without graphs): for each variant of
    `decode_variants` (and, with `batch_rows` > 1, the batch command's decoder: `_batch_decoder`), its attention
    lengths among `steps` ((stage, variant, length) of `plan_steps`). Returns the steps run."""
    from .fast.decode import PhaseDecoder
    from .fast.sampler import SLICES
    sl = SLICES[phase]
    prefix = [sl.start + (7 * j) % (sl.stop - sl.start - 1) for j in range(PREFIX_TOKENS)]
    done = 0
    variants = decode_variants(budgets, phase, cfg_pair)
    batch = [(s, False) for s in _phase_samplings(budgets, phase)] if batch_rows > 1 else []
    for k, (s, cfg) in enumerate(variants + batch):
        lengths = [n for stage, v, n in steps if stage == f"decode_{phase}" and v == k]
        if not lengths:
            continue
        stop()
        if k >= len(variants):  # the batch command's decoder: rows of different prompts (no shared prefix)
            dec = _batch_decoder(ar, prefix, s, phase, batch_rows, batch_refill)
        else:
            dec = PhaseDecoder(ar, [prefix], s, [k], phase, use_graph=False,
                               negatives=[prefix[: PREFIX_TOKENS // 2]] if cfg else None,
                               cfg_scale=1.5 if cfg else 1.0)
        try:
            dec._allocate()
            dec._prefill()
            for attn_len in lengths:
                stop()
                dec._eager_step(min(attn_len, dec.capacity))
                done += 1
        finally:
            dec.release()
    return done


def _nar(ar, nar, stop: Callable[[], None]) -> None:
    """One NAR velocity of the shadow on a NAR_FRAMES chunk after PREFIX_TOKENS AR tokens."""
    from .constants import CODEC_OFFSET
    from .nar import ChunkRenderer, raw_timesteps
    tokens = [CODEC_OFFSET + (11 * j) % 1024 for j in range(PREFIX_TOKENS)]
    stop()
    renderer = ChunkRenderer(nar, ar.layer_kv(tokens, extra=NAR_FRAMES + 2), NAR_FRAMES, ar_len=len(tokens))
    state = 0.1 * torch.sin(torch.arange(NAR_FRAMES * nar.dims.latent_dim, device=nar.device, dtype=torch.float32))
    renderer.velocity(state.view(NAR_FRAMES, -1).to(nar.dtype), raw_timesteps(32)[0][0])
    from .weights.quant import ConvRotLinear
    shapes = sorted({(m.out_features, m.in_features, m.bias is not None) for m in nar.modules()
                     if isinstance(m, ConvRotLinear) and m.w8a8 and m.in_features % 256 == 0})
    if shapes:  # W8A8 products (YUE2_NAR_LINEARS): both size classes of their autotuning (the velocity
        stop()  # above ran a chunk of the smaller one), with and without a bias as each layer has it
        from .fast import w8a8
        w8a8.warm(shapes, nar.device)


def vae_short_tiles(cfg) -> tuple:
    """The short VAE tiles (latent frames) the warm-up decodes for a decoder of `cfg` (`vae.VAEConfig`): of
    `VAE_SHORT_FRAMES` (33–48, every residue mod 16) the first of each group whose snake calls meet the same Triton
    specialisation — per call, whether its length T is divisible by 16 (`vae.snake_lengths`; T = 1 never occurs
    from 33 frames on, and the channel counts do not depend on the length). T is affine in the frames, so a
    song's tile of any length meets the variants of the tile of its residue's group. With the release's strides
    3 tiles (33, 40, 48: F ≡ 0, F ≡ 8 and the other 14 residues mod 16; `bench/vae_tile_variants.py` finds the same
    groups by recording the calls); each tile less is one decode and one set of cuDNN plans less (stop 54's profile:
    0.78 s for 17 tile shapes)."""
    from .vae import snake_lengths
    seen, tiles = set(), []
    for frames in VAE_SHORT_FRAMES:
        key = tuple(t % 16 == 0 for t in snake_lengths(frames, cfg))
        if key not in seen:
            seen.add(key)
            tiles.append(frames)
    return tuple(tiles)


def _vae(vae, stop: Callable[[], None], full: bool = True) -> None:
    """One full tile (`pipeline.vae_core_frames` + two halos; `full`) and the short tiles of `vae_short_tiles`,
    which meet every Triton variant of the snake kernel a song's tiles can; the full tile warms cuDNN, which only
    helps the process that decodes (children skip it)."""
    from .constants import VAE_HALO_FRAMES
    from .pipeline import vae_core_frames
    short = vae_short_tiles(vae.cfg)
    tile = vae_core_frames(vae.device) + 2 * VAE_HALO_FRAMES if full else max(short)
    lat = 0.1 * torch.sin(torch.arange(vae.cfg.latent_dim * tile, device=vae.device, dtype=torch.float32))
    lat = lat.view(1, vae.cfg.latent_dim, tile)
    stop()
    if full:
        vae.decode(lat)
    for frames in short:
        stop()
        vae.decode(lat[:, :, :frames].contiguous())


@dataclass
class Plan:
    """What one warm-up compiles: the checkpoint's geometry and the song's settings. `source` {"path": checkpoint
    file or folder, "vae": separate VAE file or folder or None, "bytes": the checkpoint's data bytes}: where child
    processes read the header, and the model's size beside them (None: no children, the in-process warm-up
    only)."""
    dims: object
    quant_ar: dict
    vae_cfg: object = None
    dtype: torch.dtype = torch.bfloat16
    parts: tuple = ("ar", "nar", "vae")
    budgets: object = None  # `pipeline.Budgets` of the songs to come (default presets)
    cfg_pair: bool = False  # also the CFG pair rows of the semantic phase
    int8_layers: bool = True  # False: the AR's layer linears bf16 (YUE2_LORA_INT8=bf16, adapters on them)
    # what the engine's adapters make of the NAR's linears (`_nar_quant`'s `layers`): None — as YUE2_NAR_LINEARS
    # leaves them; "bf16" — all bf16 (auto, adapters on a W8A8 NAR); "layers_bf16" — YUE2_LORA_INT8=bf16 on them
    nar_linears: str | None = None
    phases: tuple = ("abc", "semantic")
    source: dict | None = None
    batch_rows: int = 0  # > 1: also the `batch` command's decoder of that many rows (no CFG)
    batch_refill: bool = False  # that decoder is continuous batching's `fast.refill.RefillDecoder`

    @classmethod
    def from_info(cls, info, dtype=torch.bfloat16, parts=("ar", "nar", "vae"), vae_cfg=None, **kw) -> "Plan":
        """A plan for a `CheckpointInfo` (header only: no weight is read); `source` defaults to the checkpoint's
        path (its own VAE)."""
        kw.setdefault("source", {"path": info.path, "vae": None, "bytes": getattr(info, "data_bytes", 0)}
                      if getattr(info, "path", None) else None)
        return cls(info.dims, dict(info.quant_ar or {}), vae_cfg if vae_cfg is not None else info.vae, dtype,
                   tuple(parts), **kw)


def plan_shadow(plan: Plan, device) -> Shadow:
    """The shadow model `run_plan` steps for `plan` on `device` (`build_shadow`)."""
    return build_shadow(plan.dims, plan.quant_ar, plan.vae_cfg, device, plan.dtype, parts=plan.parts,
                        int8_layers=plan.int8_layers, nar_linears=plan.nar_linears)


def nar_mode(plan: Plan, device) -> str:
    """How the shadow NAR of `plan` on `device` multiplies — as the real one will (YUE2_NAR_LINEARS resolved for
    `device`, "auto" by `nar.w8a8_pays`; the NAR's dtype; `plan.nar_linears`): "w8a8", "bf16", "w8a8, bf16 layers"
    (YUE2_LORA_INT8=bf16 on a W8A8 NAR), "" without a NAR. The marker key holds it, not the switch's raw value
    (stop-53 review: a change of `nar.DEFAULT_NAR_LINEARS` or of the auto rule kept the older markers)."""
    if "nar" not in plan.parts:
        return ""
    quant = _nar_quant(_first_layer(plan.quant_ar), plan.dims, plan.dtype, device, plan.nar_linears)
    if not quant:
        return "bf16"
    return "w8a8" if any(".layers." in k for k in quant) else "w8a8, bf16 layers"


def marker_key(plan: Plan, device) -> str:
    """The warm-up marker's key of `plan` on `device` (`warmup_jobs.marker_key`), the NAR's arithmetic resolved
    (`nar_mode`)."""
    from . import warmup_jobs as jobs
    return jobs.marker_key(jobs.plan_fields(plan), jobs.device_fields(device), jobs.versions(), jobs.source_hash(),
                           jobs.kernel_switches(nar_mode(plan, device)))


def _stopper(should_stop):
    def stop():
        try:
            halt = should_stop is not None and should_stop()
        except Exception:  # e.g. ComfyUI's InterruptProcessingException
            halt = True
        if halt:
            raise Cancelled("warm-up cancelled")
    return stop


def run_plan(plan: Plan, device="cuda", should_stop: Callable[[], bool] | None = None, *,
             before_stage: Callable[[str], None] | None = None, after_stage: Callable[[str], None] | None = None,
             allow_cpu: bool = False, child: bool = False) -> dict:
    """The steps of `plan` (`plan_steps`) on a shadow model in this process, stage by stage ("decode_<phase>",
    "nar", "vae"), calling `before_stage(name)` before and `after_stage(name)` after each (the parent waits for its
    children there; a child reports). Returns {"seconds", "steps", "stages": {name: seconds}, "skipped": reason or
    None, "steps_digest": sha256 of the step list}. `allow_cpu` (tests): run on a CPU device too (the portable
    paths: nothing is compiled). `child`: a compiling child process (no full VAE tile: `_vae`). Raises `Cancelled`
    when `should_stop` says so."""
    import hashlib
    device = torch.device(device)
    reason = None if allow_cpu and device.type == "cpu" else skip_reason(device)
    if reason is not None:
        return {"seconds": 0.0, "steps": 0, "stages": {}, "skipped": reason}
    stop = _stopper(should_stop)
    t0 = time.perf_counter()
    stages, done = {}, 0
    with torch.inference_mode():
        shadow = plan_shadow(plan, device)
        stages["build"] = time.perf_counter() - t0
        try:
            steps = plan_steps(plan, attention_geometry(plan.dims, device, plan.dtype))
            order = []
            for st in steps:
                if st[0] not in order:
                    order.append(st[0])
            for name in order:
                stop()
                if before_stage is not None:
                    before_stage(name)
                t = time.perf_counter()
                if name.startswith("decode_"):
                    done += _decode(shadow.ar, name[len("decode_"):], plan.budgets, plan.cfg_pair, steps, stop,
                                    plan.batch_rows, plan.batch_refill)
                elif name == "nar":
                    _nar(shadow.ar, shadow.nar, stop)
                    done += 1
                elif name == "vae":
                    _vae(shadow.vae, stop, full=not child)
                    done += int(not child) + len(vae_short_tiles(shadow.vae.cfg))
                stages[name] = time.perf_counter() - t
                if after_stage is not None:
                    after_stage(name)
            if device.type == "cuda":
                torch.cuda.current_stream(device).synchronize()
        finally:
            del shadow
    digest = hashlib.sha256(repr(steps).encode()).hexdigest()[:16]
    return {"seconds": time.perf_counter() - t0, "steps": done, "stages": stages, "skipped": None,
            "steps_digest": digest}


def warm_up(plan: Plan, device="cuda", should_stop: Callable[[], bool] | None = None, *,
            test: dict | None = None) -> dict:
    """Compile the fast path's kernels for `plan` on `device` synchronously (the caller's CUDA stream) and return a
    report {"seconds", "steps", "stages": {name: seconds}, "skipped": reason or None, "children": {"count", …},
    "marker": "hit" | "miss" | None, "marker_written": bool}. When Triton's cache lacks the plan (no marker,
    `warmup_jobs.marker_key`) and `plan.source` names the checkpoint, `warmup_jobs.procs()` child processes compile
    first (module docstring); the marker is written after the steps completed. `should_stop()` (True or an
    exception: cancel) is polled between steps; cancelling raises `Cancelled` and kills the children. Nothing
    happens (a reason is returned) on CPUs, with YUE2_WARMUP=0, YUE2_FAST=0 or without Triton; RequestError for a
    bad YUE2_WARMUP / YUE2_WARMUP_PROCS. `test` (tests only): {"allow_cpu": run on the CPU, "child": the children's
    test hooks (warmup_jobs.child_main), "procs": children regardless of the switch}."""
    from . import warmup_jobs as jobs
    test = test or {}
    device = torch.device(device)
    allow_cpu = bool(test.get("allow_cpu"))
    reason = None if allow_cpu and device.type == "cpu" else skip_reason(device)
    if reason is not None:
        return {"seconds": 0.0, "steps": 0, "stages": {}, "skipped": reason}
    n = test["procs"] if "procs" in test else jobs.procs()
    t0 = time.perf_counter()
    cache = ensure_cache_dir()
    marker, decision = None, None
    try:
        key = marker_key(plan, device)
        marker = jobs.marker_path(cache, key)
        decision = "hit" if os.path.exists(marker) else "miss"
    except Exception as exc:  # noqa: BLE001 — no marker: compile in children as if it were absent
        from .errors import brief
        decision = f"unknown ({brief(exc)})"
    if decision == "hit" or not plan.source or not plan.source.get("path"):
        n = 0
    capped = None
    if n and device.type == "cuda":  # children beside the model being loaded must not run the GPU out of memory
        free, _ = torch.cuda.mem_get_info(device)
        capped = jobs.memory_cap(plan, free, int(plan.source.get("bytes") or 0))
        n = min(n, capped)
    shards = n if jobs.sharding_available() else min(n, 1)
    children = None
    stop = _stopper(should_stop)
    try:
        if shards:
            specs = [jobs.child_spec(plan, device, i, shards, test.get("child")) for i in range(shards)]
            pool = jobs.Children(specs)
            try:
                children = pool.start()
            except (OSError, ValueError) as exc:  # no process could be started: the in-process steps compile
                pool.kill()
                warnings.warn(f"YuE2 warm-up: child processes could not be started ({exc}); compiling in this "
                              f"process (slower, same results)")
        passed = []

        def before(name):
            if children is not None:
                children.wait_stage(name, stop)
            passed.append(name)
        report = run_plan(plan, device, should_stop, before_stage=before, allow_cpu=allow_cpu)
        if children is not None:
            children.finish(passed)  # they passed every stage: only their report and exit are left
    finally:
        if children is not None:
            children.kill()
    report["seconds"] = time.perf_counter() - t0
    report["children"] = children.summary() if children is not None else {"count": 0}
    if capped is not None:
        report["children"]["memory_cap"] = capped
    report["marker"] = decision
    if children is not None and children.failures:
        warnings.warn(f"{len(children.failures)} of {shards} warm-up child processes failed ("
                      f"{children.failures[0]}); the warm-up compiled what they did not in this process (slower, "
                      f"same results)")
    report["marker_written"] = False
    if marker is not None and decision == "miss":
        jobs.write_marker(marker, {"plan": jobs.plan_fields(plan), "device": jobs.device_fields(device),
                                   "versions": jobs.versions(), "written": time.time(),
                                   "steps_digest": report.get("steps_digest")})
        report["marker_written"] = os.path.exists(marker)
    return report


_STREAMS: dict = {}  # device → the warm-up threads' stream (see `side_stream`)


def side_stream(device) -> "torch.cuda.Stream":
    """One side stream per device for every warm-up thread of the process (and the nodes' background reads of the
    later stages' parts, `nodes.model.YuE2Model.prefetch`). A new `torch.cuda.Stream` per warm-up
    (the code before 2026-12-06) gave PyTorch's cuBLAS a new (handle, stream) pair each time, and PyTorch keeps one
    cuBLAS workspace per pair for the life of the process (32 MiB each on Hopper; a stream pool of 32 per
    priority): each Checkpoint Loader run grew allocated CUDA memory by 32 MiB (H100: five warm-ups 32 → 160 MiB,
    now flat; tests/nodes/gpu_nodes_check.py's songs, each through a new loader call, 588.6 → 620.6 → 652.6 MiB,
    now flat; docs/experiments/warmup_stream_h100_2026-12-06.log, gpu_nodes_novram_h100_2026-12-06.json)."""
    key = str(torch.device(device))
    with _CACHE_LOCK:
        if key not in _STREAMS:
            _STREAMS[key] = torch.cuda.Stream(device)
        return _STREAMS[key]


@dataclass
class WarmUp:
    """A warm-up running in a daemon thread on its own CUDA stream. `wait()` blocks until it ended (done, failed
    or cancelled) and returns its report; `cancel()` asks it to stop at the next step and waits for that."""
    plan: Plan
    device: torch.device
    should_stop: Callable[[], bool] | None = None
    work: Callable = None  # (plan, device, should_stop) → report; default `warm_up`
    report: dict = field(default_factory=dict)
    error: str | None = None

    def __post_init__(self):
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "WarmUp":
        """Check Triton's cache directory (`ensure_cache_dir`), then start the thread."""
        ensure_cache_dir()
        self._thread = threading.Thread(target=self._run, name="yue2-warm-up", daemon=True)
        self._thread.start()
        return self

    def _stopped(self) -> bool:
        return self._cancel.is_set() or (self.should_stop is not None and self.should_stop())

    def _run(self):
        t0 = time.perf_counter()
        try:
            work = self.work or warm_up
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # Triton and torch read the current device per thread
                with torch.cuda.stream(side_stream(self.device)):
                    self.report = work(self.plan, self.device, self._stopped)
            else:
                self.report = work(self.plan, self.device, self._stopped)
        except Cancelled:
            self.report = {"seconds": time.perf_counter() - t0, "cancelled": True}
        except BaseException as exc:  # noqa: BLE001 — any failure: one warning, the song goes on without it
            from .errors import brief
            self.error = brief(exc)
            self.report = {"seconds": time.perf_counter() - t0, "error": self.error}
            warnings.warn(f"YuE2 warm-up failed ({self.error}); the first song compiles its kernels itself "
                          f"(slower, same results)")
        finally:
            if self.device.type == "cuda":
                try:
                    torch.cuda.empty_cache()  # the shadow's blocks back to the driver before the song's working set
                except Exception:  # noqa: BLE001 — never an error from the warm-up
                    pass

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> dict:
        """Block until the warm-up ended (or `timeout` s passed); returns the report so far."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.report

    def cancel(self, wait: bool = True) -> None:
        """Stop at the next step (a kernel being compiled finishes first) and, with `wait`, wait for the thread."""
        self._cancel.set()
        if wait:
            self.wait()


def start(plan: Plan, device, should_stop: Callable[[], bool] | None = None) -> WarmUp | None:
    """Start a background warm-up of `plan` on `device`, or return None when `skip_reason(device)` says none runs.
    Raises RequestError for a bad YUE2_WARMUP or YUE2_WARMUP_PROCS value."""
    device = torch.device(device)
    if skip_reason(device) is not None:
        return None
    from .warmup_jobs import procs
    procs()  # a bad YUE2_WARMUP_PROCS fails here (RequestError), not as the warm-up thread's warning
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return WarmUp(plan, device, should_stop).start()


def start_for_checkpoint(info, device, dtype=torch.bfloat16, should_stop: Callable[[], bool] | None = None):
    """`start` for a `CheckpointInfo` (the nodes' Checkpoint Loader: header read, weights not yet): all parts, the
    default presets. None when no warm-up runs on `device`."""
    return start(Plan.from_info(info, dtype), device, should_stop)
