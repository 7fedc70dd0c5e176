"""N candidate songs from one Composer run, and YuE2 Pick Take.

The Composer with `candidates` = N > 1 samples N songs in ONE autoregressive batch (`yue2_core.fast.decode.
PhaseDecoder`, the decoder behind `yue2_core.candidates`): take i uses seed + i for its lead sheet (when the Composer
writes one), its music tokens and — through the Renderer's seed −1 — its render noise, so take i is the engine's
`candidates(engine, request with seed + i, 1)` — exactly on CPU, up to floating-point rounding on a GPU (see
`yue2_core.candidates`). The AR batch is planned with ComfyUI's model management (the AR
expert is loaded with a working-memory estimate for N rows) and checked with the engine's `check_memory` ("at most
K candidates fit in X GiB free") before anything is allocated.

The takes travel as one `TakeBatch` on the YUE2_TOKENS socket, so the existing chain Composer → Renderer → VAE
Decode keeps its sockets. Takes differ in length, and ComfyUI batches are rectangular: the Renderer renders each
take on its own and returns LATENT [N, 64, T_max] zero-padded, with the true lengths in "yue2_frames"; VAE Decode
decodes each take over its own frames only (so its audio is exactly the take's: padding never reaches the VAE) and
returns AUDIO [N, 2, S_max] zero-padded with "yue2_samples". YuE2 Pick Take cuts take i back to its own length and
gives one song (tokens, latent, audio, score) plus a report of every take (the engine's `Take.report()`). The
ComfyUI-free pieces (TakeBatch, padding, picking, reports) are in batch.py.
"""
from __future__ import annotations

import time
from dataclasses import replace

import comfy.model_management as mm
import torch
from comfy_api.latest import io
from comfy_execution.graph_utils import ExecutionBlocker

from yue2_core.artifacts import expected_samples
from yue2_core.candidates import check_memory, device_free_bytes, take_seeds
from yue2_core.constants import CONTEXT, FRAMES_PER_SECOND, HOP, LATENT_DIM, SAMPLE_RATE
from yue2_core.errors import RequestError
from yue2_core.pipeline import Score, SemanticTokens, request_dict
from yue2_core.protocol import (check_budget, codes_from_ids, negative_prefix, planning_prefix,
                                semantic_prefix)

from . import memory, records, types
from .records import restamp
from .batch import (TakeBatch, as_takes, describe_take, latent_frames, pick_audio, pick_latent_samples,
                    take_reports)
from .progress import check_cancel, user_errors

# ---------------------------------------------------------------------------------------------------------------------
# the Composer's batch
# ---------------------------------------------------------------------------------------------------------------------

def _on_token(progress, stage: str, n: int, t0: float):
    def cb(phase, step, total, token):
        elapsed = time.perf_counter() - t0
        progress(stage, step + 1, total, {"batch": n, "tokens_per_second": n * (step + 1) / elapsed if elapsed else 0})
    return cb


def _check_fits(prefix_len: int, max_tokens: int, what: str, max_seconds: float):
    if prefix_len + max_tokens > CONTEXT:
        fit = max(CONTEXT - prefix_len, 0)
        raise ValueError(f"max_seconds = {max_seconds:g} s ({max_tokens} music tokens) does not fit the {CONTEXT}-"
                         f"token context after the {prefix_len}-token prompt of {what}: at most "
                         f"{fit / FRAMES_PER_SECOND:.2f} s ({fit} tokens) fit. Lower max_seconds to "
                         f"{int(fit / FRAMES_PER_SECOND)} or less, or shorten the lyrics/style/score.")


def compose_takes(model, request, given: Score | None, n: int, abc_sampling, music_sampling, max_seconds: float,
                  progress) -> TakeBatch:
    """Plan (unless a score is given or cot is off) and sample N takes in one AR batch each phase; the same maths as
    `yue2_core.candidates.candidates` without its render/decode (the Renderer and VAE Decode nodes do those)."""
    from yue2_core.fast.decode import PhaseDecoder
    tok = model.tokenizer
    enc = tok.encode
    seeds = take_seeds(request.seed, n)
    on_cuda = model.device.type == "cuda"
    use_graph = None if on_cuda else False
    cfg = request.guidance
    branches = 2 if cfg != 1.0 else 1
    t0 = time.perf_counter()
    info = {"n": n, "seeds": seeds, "shared_score": request.cot == "off" or given is not None}

    if request.cot == "off":
        scores = [Score(abc=None, abc_ids=[], cot="off", seed=s, source="none") for s in seeds]
    elif given is not None:
        scores = [replace(given, seed=s) for s in seeds]
    else:
        pp = planning_prefix(request, enc)
        check_budget(len(pp), abc_sampling.max_tokens, "ABC")
        _check_fits(len(pp) + 2, music_sampling.max_tokens, "the style and lyrics (before any lead sheet)",
                    max_seconds)
        need = memory.ar_phase(model.dims, model.dtype, len(pp), abc_sampling.max_tokens, rows=n, on_cuda=on_cuda)
        progress.start("plan", abc_sampling.max_tokens,
                       f"writing {n} lead sheets in one batch (≤ {abc_sampling.max_tokens} ABC tokens each after a "
                       f"{len(pp)}-token prompt)")
        (ar,) = model.load(("ar",), need)
        free = device_free_bytes(ar.device)
        check_memory(ar, n, len(pp), abc_sampling, False, "abc", free)
        check_memory(ar, n, len(pp) + 2, music_sampling, cfg != 1.0, "semantic", free)  # the smallest prompt
        t = time.perf_counter()
        results = PhaseDecoder(ar, [pp] * n, abc_sampling, seeds, "abc", use_graph=use_graph).run(
            _on_token(progress, "plan", n, t))
        del ar
        scores = [Score(abc=tok.decode(r.tokens), abc_ids=r.tokens, cot=request.cot, seed=s, source="model",
                        truncated=r.truncated, timing=r.timing) for r, s in zip(results, seeds)]
        check_cancel()
    info["plan_seconds"] = time.perf_counter() - t0

    requests = [replace(request, seed=s) for s in seeds]
    prefixes = [semantic_prefix(r, sc.abc_ids, enc) for r, sc in zip(requests, scores)]
    negatives = [negative_prefix(r, sc.abc_ids, enc) for r, sc in zip(requests, scores)] if cfg != 1.0 else None
    for i, p in enumerate(prefixes + (negatives or [])):
        _check_fits(len(p), music_sampling.max_tokens, f"take {i % n} (seed {seeds[i % n]})", max_seconds)
    longest = max(len(p) for p in prefixes + (negatives or []))
    need = memory.ar_phase(model.dims, model.dtype, longest, music_sampling.max_tokens, rows=n * branches,
                           on_cuda=on_cuda)
    progress.start("semantic", music_sampling.max_tokens,
                   f"sampling {n} takes in one batch (≤ {music_sampling.max_tokens} music tokens = {max_seconds:g} s "
                   f"each, seeds {seeds[0]} … {seeds[-1]})")
    (ar,) = model.load(("ar",), need)
    check_memory(ar, n, max(len(p) for p in prefixes), music_sampling, cfg != 1.0, "semantic",
                 device_free_bytes(ar.device))
    t = time.perf_counter()
    results = PhaseDecoder(ar, prefixes, music_sampling, seeds, "semantic", negatives=negatives, cfg_scale=cfg,
                           legacy_off=request.cot == "off", use_graph=use_graph).run(
        _on_token(progress, "semantic", n, t))
    del ar
    mm.soft_empty_cache()
    info["semantic_seconds"] = time.perf_counter() - t
    takes = []
    for i, (req, score, prefix, res) in enumerate(zip(requests, scores, prefixes, results)):
        tokens = SemanticTokens(codes=codes_from_ids(res.tokens), prefix=prefix, score=score,
                                request=request_dict(req), seed=req.seed, cfg_scale=cfg,
                                sampling=music_sampling.to_dict(), ended=res.ended,
                                timing={**res.timing, "take": i, "batch": n})
        if not tokens.codes:
            raise RequestError(f"candidate {i} (seed {req.seed}) ended before its first music token; compose again "
                               "with another seed")
        takes.append(tokens)
    return TakeBatch(takes, seeds, info)


def _pick_latent(latent, takes: list, i: int, frames: int, seed: int):
    n = len(takes)
    if latent is None:
        return ExecutionBlocker("YuE2 Pick Take: no latent is connected, so there is no latent to pick; connect the "
                                "Renderer's latent")
    samples = latent.get("samples") if isinstance(latent, dict) else None
    if not isinstance(samples, torch.Tensor) or samples.ndim != 3 or samples.shape[1] != LATENT_DIM:
        raise ValueError("latent must be a YuE2 audio latent [N, 64, frames] from YuE2 Renderer")
    if samples.shape[0] != n:
        raise ValueError(f"the latent holds {samples.shape[0]} item(s) but the tokens hold {n} take(s): connect the "
                         "latent rendered from these tokens")
    lengths = latent_frames(latent, n, samples.shape[2])
    if lengths[i] != frames:
        raise ValueError(f"take {i} has {frames} frames but latent item {i} has {lengths[i]}: connect the latent "
                         "rendered from these tokens")
    picked = pick_latent_samples(samples, i, frames)
    render = restamp(latent, picked)
    seeds = render.pop("seeds", None)
    if isinstance(seeds, list) and len(seeds) == n:
        render["seed"] = seeds[i]
    digests = render.pop("tokens_sha256s", None)
    if isinstance(digests, list) and len(digests) == n:
        render["tokens_sha256"] = digests[i]
    if render["samples_sha256"] != records.CHANGED:  # the record still describes the samples
        batch = [render.get("tokens_sha256")] if n == 1 else digests if isinstance(digests, list) else []
        for item, (digest, take) in enumerate(zip(batch, takes)):
            if isinstance(digest, str) and digest != records.tokens_digest(take):
                raise ValueError(f"{records.OTHER_TOKENS.replace('the latent', f'latent item {item}', 1)}: connect "
                                 "the latent rendered from these tokens (the Renderer whose tokens input is the "
                                 "Composer output connected here)")
    render.setdefault("seed", seed)
    return {"samples": picked, "type": "audio", "downscale_ratio_temporal": HOP, "yue2_render": render}


def _audio_lengths(audio, n: int) -> list[int]:
    wave = audio.get("waveform") if isinstance(audio, dict) else None
    if not isinstance(wave, torch.Tensor) or wave.ndim != 3:
        raise ValueError("audio must be ComfyUI AUDIO with waveform [N, channels, samples] from YuE2 VAE Decode")
    if audio.get("sample_rate") != SAMPLE_RATE:
        raise ValueError(f"audio must be {SAMPLE_RATE} Hz (YuE2 VAE Decode), got {audio.get('sample_rate')}")
    if wave.shape[0] != n:
        raise ValueError(f"the audio holds {wave.shape[0]} item(s) but the tokens hold {n} take(s): connect the "
                         "audio decoded from these tokens")
    lengths = audio.get("yue2_samples")
    if lengths is None:
        return [wave.shape[-1]] * n
    if not isinstance(lengths, (list, tuple)) or len(lengths) != n or not all(
            type(s) is int and 0 < s <= wave.shape[-1] for s in lengths):
        raise ValueError(f"the audio's yue2_samples {lengths!r} does not describe its {n} item(s)")
    return list(lengths)


class YuE2PickTake(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="YuE2PickTake",
            display_name="YuE2 Pick Take",
            category=types.CATEGORY,
            description="Chooses one take of a batch of candidate songs (YuE2 Composer with candidates > 1) and "
                        "cuts its latent and audio back to its own length, for YuE2 Save Song or anything that "
                        "takes one song. The report lists every take: its seed, whether its music ended on its own "
                        "end token or hit max_seconds, its length, and the score-to-audio length ratio (the lead "
                        "sheet's duration at its tempo ÷ the audio's; ≈ 1 = the song covers its score, > 1 = it "
                        "stops before the score ends).",
            inputs=[
                types.Tokens.Input("tokens", tooltip="The Composer's tokens (a batch of N takes, or one song)."),
                io.Int.Input("index", default=0, min=0, max=types.MAX_CANDIDATES - 1,
                             tooltip="Which take, 0-based: 0 … N−1 (take i was sampled with seed + i)."),
                io.Latent.Input("latent", optional=True,
                                tooltip="The Renderer's latent of these tokens ([N, 64, frames], zero-padded)."),
                io.Audio.Input("audio", optional=True,
                               tooltip="VAE Decode's audio of that latent ([N, 2, samples], zero-padded)."),
            ],
            outputs=[
                types.Tokens.Output("tokens_out", display_name="tokens", tooltip="The picked take's music tokens."),
                io.Latent.Output("latent_out", display_name="latent",
                                 tooltip="Its latent [1, 64, frames] (blocked when no latent is connected)."),
                io.Audio.Output("audio_out", display_name="audio",
                                tooltip="Its audio [1, 2, 1920·frames − 64] at 48 kHz (blocked when no audio is "
                                        "connected)."),
                types.Score.Output("score", display_name="score", tooltip="Its lead sheet."),
                io.String.Output("report", display_name="report",
                                 tooltip="Every take's seed, ending, length and score-to-audio ratio; the pick."),
            ],
        )

    @classmethod
    def execute(cls, tokens, index, latent=None, audio=None) -> io.NodeOutput:
        takes = as_takes(tokens)
        n = len(takes)
        if not 0 <= index < n:
            raise ValueError(f"take {index} does not exist: the tokens hold {n} take{'s' if n != 1 else ''} "
                             f"(index 0 … {n - 1}, 0-based); set index to at most {n - 1}")
        pick = takes[index]
        frames = len(pick.codes)
        lengths = _audio_lengths(audio, n) if audio is not None else [None] * n
        with user_errors():
            reports = take_reports(takes, lengths)
        latent_out = _pick_latent(latent, takes, index, frames, int(pick.seed))
        if audio is None:
            audio_out = ExecutionBlocker("YuE2 Pick Take: no audio is connected, so there is no audio to pick; "
                                         "connect VAE Decode's audio")
        else:
            samples = lengths[index]
            if samples != expected_samples(frames):
                raise ValueError(f"take {index} has {frames} frames = {expected_samples(frames)} samples, but audio "
                                 f"item {index} has {samples}: connect the audio decoded from these tokens")
            audio_out = pick_audio(audio, index, samples)
            audio_out.update(records.picked_audio_stamp(audio, latent, audio_out["waveform"], latent_out))
        lines = [f"- {n} take{'s' if n != 1 else ''}; picked take {index} (seed {pick.seed})"]
        lines += [f"- {describe_take(r)}{'  ← picked' if r['index'] == index else ''}" for r in reports]
        report = "\n".join(lines)
        return io.NodeOutput(pick, latent_out, audio_out, pick.score, report,
                             ui={"text": [report], "takes": reports})


__all__ = ["compose_takes", "YuE2PickTake"]
