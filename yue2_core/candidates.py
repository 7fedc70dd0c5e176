"""N candidate songs from one request, sampled in ONE autoregressive batch (`fast.decode.PhaseDecoder`).

Decoding is memory-bound, so G songs per step cost little more than one on a large GPU. Take i uses seed
`seeds[i]` (default: request.seed + i) for everything — its lead sheet, its semantic tokens and its render noise: the
batch decoder draws each song's random numbers from that song's own generator, indexed by token position. On CPU the
decoder runs eagerly (`use_graph=False`), with the same maths as a batch of one, so take i is exactly the single run
`candidates(engine, replace(request, seed=seeds[i]), 1, budgets)` (the token streams are identical, see tests/edit).
On CUDA the same holds up to floating-point summation order: the decode attention splits the cache length by batch
size, and from 4 takes up the common prompt is prefilled once and read once per step (`fast.decode`,
SHARED_MIN_ROWS); a rounding difference can change which of two near-equal candidates a draw picks, after which the
streams differ. A picked take keeps its own tokens (Pick Take, Save Song), so nothing needs re-running.
Note: `YuE2Engine.generate` on CPU samples with the portable loop (torch.multinomial), a different — but equally
distributed — draw, so a CPU candidate does not equal `engine.generate` with its seed; on CUDA both run
through `PhaseDecoder`.

Planning: when the request has no score (cot full/melody without `abc`), the N lead sheets are sampled in one batch
too (the score is part of the take: different seeds, different songs); `shared_score=True` plans once with seeds[0]
and renders N performances of that one score. A given score (request.abc) or cot off is shared by every take.

Memory (`max_candidates`): the batch's K/V cache is the dominant cost:

    KV bytes per song = 2 (K and V) · layers · kv_heads · head_dim · dtype bytes × (prefix + max_tokens) × (2 with CFG)

(release bf16: 2·28·8·128·2 B = 112 KiB per position; prefix 1,000 + 9,000 tokens → 1.07 GiB per song, 2.14 GiB
with CFG). `candidates` checks N against the device's free memory before it allocates anything and raises
"at most K candidates fit in X GiB free".
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from .constants import FRAMES_PER_SECOND, ODE_STEPS, PROTOCOL_VERSION, SAMPLE_RATE
from .errors import RequestError
from .protocol import (SEED_MAX, SongRequest, check_budget, codes_from_ids, negative_prefix, planning_prefix,
                       semantic_prefix)

MAX_N = 64
GIB = 2 ** 30
RELEASE_KV = {"layers": 28, "kv_heads": 8, "head_dim": 128}
HEADROOM_BYTES = 512 * 2 ** 20  # left free for prefill activations, the sampler's workspaces and graph pools


def kv_bytes_per_song(prefix_len: int, max_tokens: int, cfg, *, layers: int = 28, kv_heads: int = 8,
                      head_dim: int = 128, dtype_bytes: int = 2) -> int:
    """2 · layers · kv_heads · head_dim · dtype_bytes × (prefix_len + max_tokens) × (2 if CFG else 1). `cfg`: a bool,
    or a guidance scale (CFG is on when it is ≠ 1)."""
    on = cfg if isinstance(cfg, bool) else float(cfg) != 1.0
    return 2 * layers * kv_heads * head_dim * dtype_bytes * (int(prefix_len) + int(max_tokens)) * (2 if on else 1)


def max_candidates(device_free_bytes: int, prefix_len: int, max_tokens: int, cfg, *, layers: int = 28,
                   kv_heads: int = 8, head_dim: int = 128, dtype_bytes: int = 2, extra_per_song: int = 0,
                   headroom_bytes: int = 0) -> int:
    """Largest N whose batch K/V (`kv_bytes_per_song` each, plus `extra_per_song`) fits in `device_free_bytes` minus
    `headroom_bytes`. Defaults are the release model in bf16. 0 when not even one song fits."""
    per = kv_bytes_per_song(prefix_len, max_tokens, cfg, layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                            dtype_bytes=dtype_bytes) + int(extra_per_song)
    return max(0, (int(device_free_bytes) - int(headroom_bytes)) // per)


def device_free_bytes(device) -> int | None:
    """Bytes a new allocation can use: CUDA free memory plus PyTorch's cached-but-unused blocks; on CPU the kernel's
    MemAvailable. None when unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def _sampler_bytes(sampling, phase: str, branches: int, dtype_bytes: int) -> int:
    """Per-song buffers of the batch decoder besides K/V: pre-drawn Exp(1) noise [max_tokens, K] fp32, the output row,
    the logits rows of its phase slice."""
    from .fast.sampler import SLICES, TIE_PAD
    width = SLICES[phase].width
    k = 1 if sampling.temperature == 0 else min(sampling.top_k + TIE_PAD, width)
    noise = sampling.max_tokens * k * 4 if sampling.temperature != 0 else 0
    return noise + sampling.max_tokens * 8 + branches * width * dtype_bytes


def check_memory(ar, n: int, prefix_len: int, sampling, cfg: bool, phase: str, free: int | None,
                 headroom: int = HEADROOM_BYTES):
    """RequestError "at most K candidates fit in X GiB free" when N songs of this phase do not fit."""
    if free is None:
        return
    d = ar.dims
    dtype_bytes = torch.empty((), dtype=ar.dtype).element_size()
    extra = _sampler_bytes(sampling, phase, 2 if cfg else 1, dtype_bytes)
    most = max_candidates(free, prefix_len, sampling.max_tokens, cfg, layers=d.layers, kv_heads=d.kv_heads,
                          head_dim=d.head_dim, dtype_bytes=dtype_bytes, extra_per_song=extra, headroom_bytes=headroom)
    if n > most:
        per = kv_bytes_per_song(prefix_len, sampling.max_tokens, cfg, layers=d.layers, kv_heads=d.kv_heads,
                                head_dim=d.head_dim, dtype_bytes=dtype_bytes) + extra
        where = f"{free / GIB:.1f} GiB free on {ar.device}"
        raise RequestError(
            f"{n} candidates do not fit: at most {most} candidates fit in {where} (each needs {per / GIB:.2f} GiB for "
            f"its {phase} K/V cache: prompt {prefix_len} + {sampling.max_tokens} tokens"
            f"{' × 2 CFG branches' if cfg else ''}, keeping {headroom / GIB:.1f} GiB headroom). Lower the number of "
            "candidates or the max seconds." if most else
            f"not even one candidate fits in {where}: one needs {per / GIB:.2f} GiB for its {phase} K/V cache; lower "
            "the max seconds or free memory.")


def take_seeds(seed: int, n: int, seeds=None) -> list[int]:
    """Per-take seeds: `seeds` when given (n distinct-or-not integers in [0, 2^63−1]), else seed + i (wrapping)."""
    if seeds is None:
        return [(int(seed) + i) % (SEED_MAX + 1) for i in range(n)]
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):  # break-it: seeds=5 was a TypeError
        raise RequestError(f"seeds must be a list of {n} integers (one per candidate), got {seeds!r}")
    seeds = list(seeds)
    if len(seeds) != n:
        raise RequestError(f"{n} candidates need {n} seeds, got {len(seeds)}")
    for s in seeds:
        if type(s) is not int or not 0 <= s <= SEED_MAX:
            raise RequestError(f"seeds must be integers in [0, 2^63−1], got {s!r}")
    return seeds


@dataclass
class Take:
    """One candidate: the Song plus what a picker shows. `ended`: the model emitted its end token (False = cut by the
    budget); `token_count`/`seconds`: the music's length (25 tokens per second); `score_seconds`: the score's
    estimated duration (`yue2_core.abc.structure`, None without a parseable score); `score_to_audio` = score_seconds /
    seconds (≈ 1 when the song covers the score at its tempo, > 1 when the audio stops before the score's end)."""

    index: int
    seed: int
    song: object
    ended: bool
    token_count: int
    seconds: float
    score_seconds: float | None
    score_to_audio: float | None
    score_note: str = ""

    def report(self) -> dict:
        """The take's line in takes.json: index, seed, ended, tokens, seconds (music, 25 tokens/s), audio_seconds
        (samples / 48,000), and the lead sheet's duration and ratio to the audio where it has one."""
        return {"index": self.index, "seed": self.seed, "ended": self.ended, "tokens": self.token_count,
                "seconds": self.seconds, "audio_seconds": self.song.audio.shape[-1] / SAMPLE_RATE,
                "score_seconds": self.score_seconds, "score_to_audio": self.score_to_audio,
                **({"score_note": self.score_note} if self.score_note else {})}

    def __getattr__(self, name):  # Song-like: take.audio, take.latents, take.score, take.tokens, …
        if name == "song" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.song, name)


def score_length(score) -> tuple[float | None, str]:
    """(estimated seconds, "" ) from the score's structure, or (None, why)."""
    if not score.abc:
        return None, "no score (cot off)"
    from .abc import structure
    try:
        seconds = float(structure(score.abc)["duration_s"])
    except RequestError as exc:
        return None, f"score does not parse: {str(exc).splitlines()[0][:160]}"
    return (seconds, "") if seconds > 0 else (None, "score has no bars")


def _use_graph(device) -> bool | None:
    return None if device.type == "cuda" else False


def _on_token(progress, stage: str, n: int, t0: float):
    if progress is None:
        return None

    def cb(phase, step, total, token):
        elapsed = time.perf_counter() - t0
        progress(stage, step + 1, total, {"batch": n, "tokens_per_second": n * (step + 1) / elapsed if elapsed else 0})
    return cb


def candidates(engine, request: SongRequest, n: int, budgets=None, seeds=None, progress=None, *,
               steps: int = ODE_STEPS, shared_score: bool = False, free_bytes: int | None = None) -> list[Take]:
    """N songs for one request in one AR batch; returns N `Take`s (Song-like, with a report each).

    seeds: per-take seeds (default request.seed + i); take i equals the single run with seeds[i] on CPU, and up to
    floating-point summation order on CUDA (module docstring). budgets: `Budgets`
    (max seconds, max ABC tokens). free_bytes: memory the batch may use (default: measured on the model's device);
    RequestError "at most K candidates fit in X GiB free" when N is too large. BudgetError when a prompt + budget
    exceeds the context."""
    from .edit import model_parts
    from .fast.decode import PhaseDecoder
    from .pipeline import Budgets, Score, SemanticTokens, Song, decode, render, request_dict
    from .nar import check_steps
    if type(n) is not int or not 1 <= n <= MAX_N:
        raise RequestError(f"the number of candidates must be an integer in [1, {MAX_N}], got {n!r}")
    steps = check_steps(steps)
    parts = model_parts(engine)
    ar, tok = parts.ar, parts.tokenizer
    budgets = budgets or Budgets()
    request = request.validate()
    seeds = take_seeds(request.seed, n, seeds)
    sem = budgets.semantic_sampling()
    cfg = request.guidance
    use_graph = _use_graph(ar.device)
    free = device_free_bytes(ar.device) if free_bytes is None else free_bytes
    timing: dict = {}
    enc = tok.encode

    # -- plan: N lead sheets in one batch (or one shared) -------------------------------------------------------
    t = time.perf_counter()
    if request.cot == "off":
        scores = [Score(abc=None, abc_ids=[], cot="off", seed=s, source="none") for s in seeds]
    elif request.abc is not None:
        given = Score.from_text(request.abc, tok, request.cot, request.seed)
        scores = [replace(given, seed=s) for s in seeds]
    else:
        abc = budgets.abc_sampling()
        pp = planning_prefix(request, enc)
        check_budget(len(pp), abc.max_tokens, "ABC")
        check_budget(len(pp) + 2, sem.max_tokens, "semantic")
        plan_seeds = seeds[:1] if shared_score else seeds
        check_memory(ar, len(plan_seeds), len(pp), abc, False, "abc", free)
        check_memory(ar, n, len(pp) + 2, sem, cfg != 1.0, "semantic", free)  # early: the smallest possible prompt
        results = PhaseDecoder(ar, [pp] * len(plan_seeds), abc, plan_seeds, "abc", use_graph=use_graph).run(
            _on_token(progress, "plan", len(plan_seeds), t))
        planned = [Score(abc=tok.decode(r.tokens), abc_ids=r.tokens, cot=request.cot, seed=s, source="model",
                         truncated=r.truncated, timing=r.timing) for r, s in zip(results, plan_seeds)]
        scores = [replace(planned[0], seed=s) for s in seeds] if shared_score else planned
    timing["plan_seconds"] = time.perf_counter() - t

    # -- semantic: N code streams in one batch --------------------------------------------------------------------
    t = time.perf_counter()
    requests = [replace(request, seed=s) for s in seeds]
    prefixes = [semantic_prefix(r, sc.abc_ids, enc) for r, sc in zip(requests, scores)]
    negatives = [negative_prefix(r, sc.abc_ids, enc) for r, sc in zip(requests, scores)] if cfg != 1.0 else None
    for p in prefixes + (negatives or []):
        check_budget(len(p), sem.max_tokens, "semantic")
    check_memory(ar, n, max(len(p) for p in prefixes), sem, cfg != 1.0, "semantic", free)
    results = PhaseDecoder(ar, prefixes, sem, seeds, "semantic", negatives=negatives, cfg_scale=cfg,
                           legacy_off=request.cot == "off", use_graph=use_graph).run(
        _on_token(progress, "semantic", n, t))
    timing["semantic_seconds"] = time.perf_counter() - t

    # -- render and decode each take ---------------------------------------------------------------------------
    takes = []
    settings_base = {"protocol": PROTOCOL_VERSION, "cot": request.cot, "cfg_scale": cfg,
                     "abc_sampling": budgets.abc_sampling().to_dict(), "semantic_sampling": sem.to_dict(),
                     "ode_steps": steps, "ode_method": "midpoint", "model_dtype": str(ar.dtype).split(".")[-1],
                     "vae_dtype": "float32", "vae_decode": "halo_crop", "device": str(ar.device),
                     **({"checkpoint": parts.info.to_dict()} if parts.info is not None else {})}
    for i, (req, score, prefix, res) in enumerate(zip(requests, scores, prefixes, results)):
        tokens = SemanticTokens(codes=codes_from_ids(res.tokens), prefix=prefix, score=score,
                                request=request_dict(req), seed=req.seed, cfg_scale=cfg, sampling=sem.to_dict(),
                                ended=res.ended, timing=res.timing)
        if not tokens.codes:
            raise RequestError(f"candidate {i} (seed {req.seed}) ended before its first music token; raise the "
                               "semantic min_tokens")
        each = None if progress is None else (lambda stage, d, tot, info, i=i: progress(stage, d, tot,
                                                                                          {**info, "take": i}))
        t = time.perf_counter()
        latents = render(ar, parts.nar, tokens, steps, progress=each)
        render_s = time.perf_counter() - t
        t = time.perf_counter()
        audio = decode(parts.vae, latents, progress=each)
        decode_s = time.perf_counter() - t
        song_timing = {**timing, "render_seconds": render_s, "decode_seconds": decode_s, "batch": n}
        song_timing["total_seconds"] = sum(v for k, v in song_timing.items() if k.endswith("_seconds"))
        seconds = len(tokens.codes) / FRAMES_PER_SECOND
        score_s, note = score_length(score)
        take_info = {"index": i, "seed": req.seed, "n": n, "seeds": seeds, "shared_score": bool(shared_score)}
        song = Song(request=req, score=score, tokens=tokens, latents=latents, audio=audio, timing=song_timing,
                    settings={**settings_base, "take": take_info},
                    warnings=req.input_warnings(getattr(score, "abc", None)))
        takes.append(Take(i, req.seed, song, res.ended, len(tokens.codes), seconds, score_s,
                          None if score_s is None else score_s / seconds, note))
    return takes


__all__ = ["candidates", "Take", "max_candidates", "kv_bytes_per_song", "device_free_bytes", "take_seeds",
           "check_memory", "score_length"]
