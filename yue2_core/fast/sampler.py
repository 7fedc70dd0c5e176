"""The sampling processor on device tensors, without host synchronisation (so it can live inside a CUDA graph).

Same rules as `yue2_core.sampling.process_logits` (runtime.md §3.1), computed on the phase's slice of the
vocabulary only (the LM head is restricted to those rows; every other id is −inf in the reference anyway):

    semantic phase: ids [MUSIC_END, CODEC_OFFSET + 32768) = 32,769 columns (column 0 is MUSIC_END)
    ABC phase:      ids [0, ABC_END] = 151,849 columns, with the specials [EOD, ABC_END) masked

Top-k keeps ties by taking `top_k + TIE_PAD` sorted candidates and masking those below the k-th value; top-p then
works on the candidates (entries outside them have probability 0). The draw is an exponential race over the
candidates, argmax(p / E) with E ~ Exp(1) — the same distribution as `torch.multinomial`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..constants import ABC_END, CODEC_OFFSET, CODEC_SIZE, EOD, MUSIC_END
from ..protocol import Sampling

TIE_PAD = 256  # extra candidates kept so values tied with the k-th survive (more ties than this are dropped)


@dataclass(frozen=True)
class PhaseSlice:
    """Vocabulary slice of a phase: global id = start + column; `end_col` is the end token's column;
    `masked` = (first, last) columns forced to −inf (the ABC phase's special tokens)."""

    start: int
    stop: int
    end_col: int
    masked: tuple | None

    @property
    def width(self) -> int:
        return self.stop - self.start


SLICES = {
    "semantic": PhaseSlice(MUSIC_END, CODEC_OFFSET + CODEC_SIZE, 0, None),
    "abc": PhaseSlice(0, ABC_END + 1, ABC_END, (EOD, ABC_END)),
}


def static_mask(phase: str, dtype, device) -> torch.Tensor:
    """Additive mask [width]: 0 for allowed columns, −inf for the ABC phase's specials."""
    sl = SLICES[phase]
    mask = torch.zeros(sl.width, dtype=dtype, device=device)
    if sl.masked:
        mask[sl.masked[0]:sl.masked[1]] = float("-inf")
    return mask


def candidates(logits: torch.Tensor, s: Sampling, phase: str, step: torch.Tensor, ring: torch.Tensor,
               ring_weight: torch.Tensor, mask: torch.Tensor, legacy_off: bool, min_tokens=None):
    """Processed candidates of each row. logits [G, width] (phase slice, model dtype); step [] or [G] long (index of
    the token being sampled); ring [G, W] long (slice columns of the last W generated tokens) with ring_weight [G, W]
    (1 for filled slots, 0 otherwise); min_tokens: s.min_tokens, or [G] long, each row's (`fast.refill`). Returns
    (values [G, K], columns [G, K]) sorted by value, removed entries −inf, or for temperature 0 (values [G, 1],
    columns [G, 1]) of the argmax."""
    sl = SLICES[phase]
    scores = logits.clone() if legacy_off else logits.float()
    scores = scores + mask.to(scores.dtype)
    end_block = torch.where(step < (s.min_tokens if min_tokens is None else min_tokens), float("-inf"),
                            0.0).to(scores.dtype)
    scores[:, sl.end_col] = scores[:, sl.end_col] + end_block
    if s.repetition_penalty != 1.0:
        freq = torch.zeros_like(scores)
        freq.scatter_add_(1, ring, ring_weight.to(scores.dtype))
        alpha = (s.repetition_penalty ** freq).clamp(1e-30, 1e30)  # finite for extreme penalties
        scores = torch.where(scores < 0, scores * alpha, scores / alpha)
    if s.temperature == 0:
        values, cols = scores.max(dim=1, keepdim=True)
        return values, cols
    if s.temperature != 1:
        scores = scores / s.temperature
    k = min(s.top_k, scores.shape[1])
    values, cols = scores.topk(min(k + TIE_PAD, scores.shape[1]), dim=1)
    threshold = values[:, k - 1:k]
    values = values.masked_fill(values < threshold, float("-inf"))
    if s.top_p < 1:
        probs = values.softmax(-1)
        removed = probs.cumsum(-1) - probs > s.top_p
        removed[:, :3 if legacy_off else 1] = False
        values = values.masked_fill(removed, float("-inf"))
    return values, cols


def choose(values: torch.Tensor, cols: torch.Tensor, exp_noise: torch.Tensor | None) -> torch.Tensor:
    """Pick one column per row: argmax(softmax(values) / E) with E = exp_noise [G, K] ~ Exp(1), or the single
    candidate when K == 1 (greedy). Returns [G] long."""
    if values.shape[1] == 1 or exp_noise is None:
        return cols[:, 0]
    probs = values.softmax(-1).float()
    pick = (probs / exp_noise[:, :values.shape[1]]).argmax(dim=1, keepdim=True)
    return cols.gather(1, pick)[:, 0]


def dense_scores(values: torch.Tensor, cols: torch.Tensor, phase: str, vocab: int) -> torch.Tensor:
    """Scatter candidates back to full-vocabulary rows [G, vocab] (−inf elsewhere), for comparisons."""
    sl = SLICES[phase]
    out = torch.full((values.shape[0], vocab), float("-inf"), dtype=values.dtype, device=values.device)
    return out.scatter(1, cols + sl.start, values)
