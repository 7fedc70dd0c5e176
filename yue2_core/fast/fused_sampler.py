"""The sampling tail of a decode step as one Triton kernel (`_sample_triton.sample_kernel`), for `fast.decode`.

Same rules and the same state updates as the PyTorch tail of `PhaseDecoder._step` (`sampler.candidates` +
`sampler.choose`, then forcing, out/ring/done/tokens): processed scores equal bit for bit (the penalty factors come
from a table computed with the same torch `pow`; the temperature applied as PyTorch does on that device: x·fl(1/T)
on CUDA, a division on the CPU), the top-k threshold is found exactly by
radix select, every entry above it is kept and ties fill the remaining K slots, candidates are ranked by
(value ↓, column ↑); above MAX_CANDIDATES (top_k + 256 > 4096) the PyTorch tail runs. The softmax of top-p and of the race uses Triton's
`exp`, so a draw can differ from the PyTorch tail only when a probability lands within float rounding of a top-p
edge or two race entries tie. Legacy `off` mode (bf16 processing) is not covered: the PyTorch tail runs there.

Experimental: `fast.decode` uses it when YUE2_FUSED_SAMPLER=1 (off by default until measured on a GPU).
"""
from __future__ import annotations

import torch

from . import triton_modules
from .sampler import SLICES

BLOCK = 4096  # columns per loop iteration (the semantic slice, 32,769 columns, takes 9)
MAX_CANDIDATES = 4096  # above this top_k + 256 the PyTorch tail runs (one program sorts the candidates in registers)


def available() -> bool:
    return triton_modules() is not None


class FusedSampler:
    """Buffers of the fused tail for G songs of one phase (`scratch` [G, width] fp32, `cand` [G, KP] int64, the
    penalty table [window + 1] fp32). Call with the decoder's state tensors; returns nothing (updates in place).

    logits [R, width] (R = G, or 2G with CFG: cond rows then uncond rows), step [1] long, ring [G, window] long,
    ring_w [G, window] fp32, noise [max_tokens, G, K] fp32 or None (temperature 0), forced [max_tokens] long
    (−1 = free), out [G, max_tokens] long, done [G] bool, tokens [R] long."""

    def __init__(self, sampling, phase: str, G: int, k_cand: int, device, pdl: dict | None = None):
        triton, _ = triton_modules()
        self.s, self.slice, self.G, self.K = sampling, SLICES[phase], G, k_cand
        self.KP = max(16, triton.next_power_of_2(k_cand))
        self.PP = max(16, triton.next_power_of_2(sampling.penalty_window))
        self.scratch = torch.empty(G, self.slice.width, dtype=torch.float32, device=device)
        self.cand = torch.empty(G, self.KP, dtype=torch.int64, device=device)
        counts = torch.arange(sampling.penalty_window + 1, dtype=torch.float32, device=device)
        self.alpha = (sampling.repetition_penalty ** counts).clamp(1e-30, 1e30)  # as sampler.candidates computes it
        self.pdl = pdl or {}

    def __call__(self, logits, step, ring, ring_w, mask, noise, forced, out, done, tokens, cfg: float):
        from ._sample_triton import sample_kernel
        s, sl, G = self.s, self.slice, self.G
        greedy = s.temperature == 0
        # PyTorch on CUDA divides by a Python scalar as x · fl(1/T) (fp32); on the CPU it divides
        inv = (torch.tensor(1.0, dtype=torch.float32) / torch.tensor(float(s.temperature or 1.0))).item()
        sample_kernel[(G,)](
            logits, logits.stride(0), mask, self.scratch, self.cand, step, ring, ring_w, self.alpha,
            noise if noise is not None else self.scratch, forced, out, done, tokens,
            sl.width, G, tokens.shape[0], float(cfg), s.min_tokens, s.max_tokens, sl.end_col, sl.start,
            s.penalty_window, float(s.temperature or 1.0), float(inv), min(s.top_k, sl.width), float(s.top_p), self.K,
            CFG=cfg != 1.0, PENALTY=s.repetition_penalty != 1.0, GREEDY=greedy, SCALE=not greedy and s.temperature != 1,
            TOPP=s.top_p < 1, RECIP=logits.is_cuda, BLOCK=BLOCK, PP=self.PP, KP=self.KP, num_warps=8, **self.pdl)
