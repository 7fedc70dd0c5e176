"""Token sampling exactly as the official runtime (runtime.md §3; parity fixtures `sampling.*`).

Per step, on one logits row [V]: (1) fp32 copy — bf16 in legacy off mode; (2) allow-mask: ABC phase ids [0, EOD) +
ABC_END, semantic phase codec ids [151853, 184621) + MUSIC_END; (3) end token −inf while step < min_tokens;
(4) windowed count-exponent repetition penalty over the last `penalty_window` generated ids; (5) temperature 0 →
argmax; (6) ÷ temperature; (7) top-k keeping ties; (8) top-p keeping the first 1 (legacy off: 3) candidates. Then
`torch.multinomial(softmax(scores), 1, generator)`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .constants import ABC_END, CODEC_OFFSET, CODEC_SIZE, CONTEXT, EOD, MUSIC_END
from .errors import BudgetError, RequestError
from .protocol import Sampling

PHASES = ("abc", "semantic")


def end_token(phase: str) -> int:
    """The token that ends a phase: ABC_END for "abc" (the lead sheet), MUSIC_END for "semantic"."""
    return ABC_END if phase == "abc" else MUSIC_END


def allowed_mask(vocab: int, phase: str, dtype, device) -> torch.Tensor:
    """Additive mask [vocab]: 0 where the phase may emit a token, −inf elsewhere (runtime.md §3.1 step 2)."""
    if phase not in PHASES:
        raise RequestError(f"phase must be 'abc' or 'semantic', got {phase!r}")
    mask = torch.full((vocab,), float("-inf"), dtype=dtype, device=device)
    if phase == "abc":
        mask[:EOD] = 0
    else:
        mask[CODEC_OFFSET:CODEC_OFFSET + CODEC_SIZE] = 0
    mask[end_token(phase)] = 0
    return mask


def window_penalty(scores: torch.Tensor, recent: list[int], penalty: float) -> torch.Tensor:
    """score·α if score < 0 else score/α, α = penalty^count(id in `recent`), computed in the scores' dtype."""
    if penalty == 1.0 or len(recent) == 0:
        return scores
    ids = torch.as_tensor(recent, dtype=torch.long, device=scores.device)
    freq = torch.zeros_like(scores)
    freq.scatter_add_(-1, ids, torch.ones_like(ids, dtype=scores.dtype))
    alpha = (penalty ** freq).clamp(1e-30, 1e30)  # finite even for extreme penalties × counts
    return torch.where(scores < 0, scores * alpha, scores / alpha)


def process_logits(logits: torch.Tensor, sampling: Sampling, history: list[int], step: int, phase: str,
                   legacy_off: bool = False) -> torch.Tensor:
    """Processed scores [V] (fp32, or bf16 in legacy off mode) for one logits row [V]; −inf marks removed ids.
    `history` = content tokens generated so far in this phase; `step` = index of the token being sampled."""
    scores = logits.clone() if legacy_off else logits.float().clone()
    scores = scores + allowed_mask(scores.shape[-1], phase, scores.dtype, scores.device)
    if step < sampling.min_tokens:
        scores[end_token(phase)] = float("-inf")
    scores = window_penalty(scores, history[-sampling.penalty_window:], sampling.repetition_penalty)
    if sampling.temperature == 0:
        return scores
    if sampling.temperature != 1:
        scores = scores / sampling.temperature
    threshold = scores.topk(min(sampling.top_k, scores.shape[-1])).values[-1]
    scores = scores.masked_fill(scores < threshold, float("-inf"))
    if sampling.top_p < 1:
        values, order = scores.sort(descending=True)
        probs = values.softmax(-1)
        removed = probs.cumsum(-1) - probs > sampling.top_p
        removed[:3 if legacy_off else 1] = False
        values = values.masked_fill(removed, float("-inf"))
        scores = values.scatter(-1, order, values)
    return scores


def draw(scores: torch.Tensor, temperature: float, generator: torch.Generator, model=None) -> int:
    """Pick the next id from processed scores: argmax at temperature 0, else one multinomial draw from
    softmax(scores) with the phase's generator (on CPU when the scores live on a device without a generator).
    NumericalError for NaN scores, naming the adapters `model` carries (`weights.own.blame`)."""
    if torch.isnan(scores).any() or not torch.isfinite(scores).any():
        from .errors import NumericalError
        from .weights.own import blame
        raise NumericalError(blame("the model produced NaN logits (or no allowed token has a finite score): the AR "
                                   "weights look damaged — download the checkpoint again", model))
    if temperature == 0:
        return int(scores.argmax(-1))
    probs = scores.softmax(-1)
    if probs.device.type != generator.device.type:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator))


def cfg_combine(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """uncond + s·(cond − uncond), evaluated in the branch dtype (bf16 for the release model; runtime.md §3.2)."""
    return uncond + scale * (cond - uncond)


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    """A fresh generator per phase seeded with the request seed, on the model's device for CPU/CUDA, else CPU."""
    dev = device if device.type in ("cpu", "cuda") else torch.device("cpu")
    return torch.Generator(device=dev).manual_seed(int(seed))


@dataclass
class PhaseResult:
    """Output of one AR phase. `tokens` = content ids (end token excluded); `ended` = the end token was sampled
    (False means the budget ran out: `truncated`)."""

    tokens: list[int]
    ended: bool
    timing: dict = field(default_factory=dict)

    @property
    def truncated(self) -> bool:
        return not self.ended


StepCallback = Callable[[str, int, int, int], None]  # (phase, step, max_tokens, token) — may raise to cancel


@torch.inference_mode()
def generate(model, prefix: list[int], sampling: Sampling, seed: int, phase: str, *, negative: list[int] | None = None,
             cfg_scale: float = 1.0, legacy_off: bool = False, on_token: StepCallback | None = None,
             forced: list[int] | None = None) -> PhaseResult:
    """Portable AR loop (any device): prefill each branch, then sample up to `sampling.max_tokens` tokens.

    CFG (cfg_scale ≠ 1) runs the `negative` prefix as a second branch in lockstep. `forced` teacher-forces the first
    len(forced) content tokens (used to continue or regenerate from a cut; they are fed, not sampled, and count
    towards the budget and the penalty history). Raises BudgetError when prefix + max_tokens exceeds the context.
    `on_token` is called after every sampled token and may raise to cancel."""
    sampling.validate(phase)
    if phase not in PHASES:
        raise RequestError(f"phase must be 'abc' or 'semantic', got {phase!r}")
    branches = [prefix]
    if cfg_scale != 1.0:
        if negative is None:
            raise RequestError("CFG (cfg_scale ≠ 1) needs a negative prefix")
        branches.append(negative)
    for ids in branches:
        if len(ids) + sampling.max_tokens > CONTEXT:
            raise BudgetError(f"prompt ({len(ids)} tokens) + {phase} budget ({sampling.max_tokens}) exceeds the "
                              f"{CONTEXT}-token context; at most {CONTEXT - len(ids)} {phase} tokens fit")
    forced = [int(t) for t in (forced or [])]
    if len(forced) > sampling.max_tokens:
        raise RequestError(f"{len(forced)} forced tokens exceed the budget of {sampling.max_tokens}")
    end = end_token(phase)
    if end in forced:
        raise RequestError("forced tokens cannot contain the end token")
    device = model.device
    generator = make_generator(seed, device)
    t0 = time.perf_counter()
    caches = [model.new_cache(1, len(ids) + sampling.max_tokens) for ids in branches]
    # the prompt and the teacher-forced tokens are prefilled in one pass: they are fed, never sampled
    rows = [model.prefill(torch.tensor([list(ids) + forced], device=device), c)[0]
            for ids, c in zip(branches, caches)]
    prefill_s = time.perf_counter() - t0
    history: list[int] = list(forced)
    if on_token is not None:
        for step, token in enumerate(forced):
            on_token(phase, step, sampling.max_tokens, token)
    ended = False
    first_token_s = None
    for step in range(len(forced), sampling.max_tokens):
        logits = rows[0] if len(rows) == 1 else cfg_combine(rows[0], rows[1], cfg_scale)
        scores = process_logits(logits, sampling, history, step, phase, legacy_off)
        token = draw(scores, sampling.temperature, generator, model)
        if first_token_s is None:
            first_token_s = time.perf_counter() - t0
        if on_token is not None:
            on_token(phase, step, sampling.max_tokens, token)
        if token == end:
            ended = True
            break
        history.append(token)
        if step + 1 < sampling.max_tokens:
            tok = torch.tensor([[token]], device=device)
            rows = [model.decode(tok, c)[0] for c in caches]
    seconds = time.perf_counter() - t0
    count = len(history) + int(ended)
    timing = {"seconds": seconds, "prefill_seconds": prefill_s, "ttft_seconds": first_token_s,
              "output_tokens": count, "content_tokens": len(history),
              "tokens_per_second": count / seconds if seconds > 0 else 0.0, "prefix_tokens": len(prefix),
              "cfg_branches": len(branches), "forced_tokens": len(forced), "execution": "eager"}
    return PhaseResult(history, ended, timing)
