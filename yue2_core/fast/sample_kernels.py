"""The sampling tail of a decode step in three launches — `_sample_triton.scores_kernel`, `torch.topk`,
`_sample_triton.finish_kernel` — instead of the ~60 small PyTorch kernels of `decode.sample_tail` (whose launch
latency, not work, made up ≈ 0.15 ms of a 1.43 ms int8 step on an H200).

Same rules and state updates as `decode.sample_tail`: the processed scores equal `sampler.candidates`' bit for bit
(CFG, mask, end block, the penalty factors from a table made with the same torch `pow`, the temperature as PyTorch
applies a Python-scalar division on that device: x · fp32(1/T) on CUDA with the reciprocal taken in double, a
division elsewhere), and the same `torch.topk`
gives the candidates, so ties come out in the same order. The softmaxes of top-p and of the race use the same expf
but Triton's summation order, so a draw can differ from the PyTorch tail only when a probability lands within float
rounding of the top-p edge or two race entries are within rounding of each other.

Not used (the PyTorch tail runs): temperature 0, the legacy `off` mode (bf16 processing), top_k + TIE_PAD above
MAX_CANDIDATES, no Triton, ROCm, or YUE2_SAMPLER=torch. Measured on an H200 (bench/bench.py, same run): batch 1
683 vs 650 tok/s bf16, 710 vs 675 int8; CFG pair 664 vs 633 bf16; 8 candidates 4,698 vs 4,488 bf16; 298 instead of
347 kernels a step (docs/bench_h200.log, docs/profile_decode_h200.log).
"""
from __future__ import annotations

import torch

from . import triton_modules
from .sampler import SLICES

BLOCK = 1024  # columns per program of scores_kernel
MAX_CANDIDATES = 4096  # finish_kernel holds the candidates of a row in one program's registers


def usable(sampling, k_cand: int, legacy_off: bool) -> bool:
    """Whether `KernelTail` covers these settings (see the module docstring). Not on ROCm builds of torch: the
    kernels' rounding was matched to NVIDIA's libdevice and PyTorch's CUDA division, and checked on an H200 only."""
    return (triton_modules() is not None and torch.version.hip is None and sampling.temperature != 0
            and not legacy_off and k_cand <= MAX_CANDIDATES)


class KernelTail:
    """The tail for G songs of one phase: `scores` [G, width] fp32 scratch and the penalty table [window + 1]
    (penalty^count, clamped as `sampler.candidates` clamps it). Call with the decoder's state; updates in place.

    logits [R, width] (R = G, or 2G with CFG: cond rows then uncond rows), step [1] long, ring [G, window] long,
    ring_w [G, window] fp32, mask [width] fp32, noise [max_tokens, G, K] fp32 (K = k_cand), forced [max_tokens] long
    (−1 = free), out [G, max_tokens] long, done [G] bool, tokens [R] long."""

    def __init__(self, sampling, phase: str, G: int, k_cand: int, device, pdl: dict | None = None):
        triton, _ = triton_modules()
        self.s, self.slice, self.G, self.K = sampling, SLICES[phase], G, k_cand
        self.KP = max(16, triton.next_power_of_2(k_cand))
        self.scores = torch.empty(G, self.slice.width, dtype=torch.float32, device=device)
        counts = torch.arange(sampling.penalty_window + 1, dtype=torch.float32, device=device)
        self.alpha = (sampling.repetition_penalty ** counts).clamp(1e-30, 1e30)  # as sampler.candidates computes it
        # PyTorch on CUDA divides by a Python scalar T as x · fp32(1/T), the reciprocal taken in double precision
        # (measured on an H200: T = 0.85 and 1.1 give another fp32 reciprocal than 1/fp32(T))
        self.inv_t = float(torch.tensor(1.0 / float(sampling.temperature), dtype=torch.float32))
        self.pdl = pdl or {}

    def __call__(self, logits, step, ring, ring_w, mask, noise, forced, out, done, tokens, cfg: float) -> None:
        from ._sample_triton import finish_kernel, scores_kernel
        triton, _ = triton_modules()
        s, sl, G, W = self.s, self.slice, self.G, self.slice.width
        scores_kernel[(G, triton.cdiv(W, BLOCK))](
            logits, logits.stride(0), mask, self.scores, step, ring, ring_w, self.alpha,
            W, G, s.penalty_window, float(cfg), s.min_tokens, sl.end_col, float(s.temperature), self.inv_t,
            CFG=cfg != 1.0, PENALTY=s.repetition_penalty != 1.0, SCALE=s.temperature != 1,
            RECIP=logits.is_cuda, BLOCK=BLOCK, LIBDEVICE=logits.is_cuda, num_warps=4, **self.pdl)
        vals, cols = self.scores.topk(self.K, dim=1)
        finish_kernel[(G,)](
            vals, cols, noise, step, forced, out, ring, ring_w, done, tokens,
            self.K, min(s.top_k, W), G, tokens.shape[0], s.penalty_window, float(s.top_p), s.max_tokens,
            sl.end_col, sl.start, TOPP=s.top_p < 1, KP=self.KP, LIBDEVICE=logits.is_cuda, num_warps=4, **self.pdl)
