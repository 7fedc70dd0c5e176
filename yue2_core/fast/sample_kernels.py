"""The sampling tail of a decode step in three launches — `_sample_triton.scores_kernel`, `torch.topk`,
`_sample_triton.finish_kernel` — instead of the ~60 small PyTorch kernels of `decode.sample_tail` (whose launch
latency, not work, made up ≈ 0.15 ms of a 1.43 ms int8 step on an H200).

Same rules and state updates as `decode.sample_tail`: the processed scores equal `sampler.candidates`' bit for bit
(CFG, mask, end block, the penalty factors from a table made with the same torch `pow`, the temperature as this
PyTorch applies a Python-scalar division on that device — `temperature_rule` finds out: on an H200 with torch 2.11
x · fp32(1/T) with the reciprocal taken in double, a division on the CPU), and the same `torch.topk`
gives the candidates, so ties come out in the same order. The softmaxes of top-p and of the race use the same expf
but Triton's summation order, so a draw can differ from the PyTorch tail only when a probability lands within float
rounding of the top-p edge or two race entries are within rounding of each other.

Not used (the PyTorch tail runs): decoders without the fused step (YUE2_FUSED=0, YUE2_COMPILE=1, head shapes the
fused kernels do not support, CPU), temperature 0, the legacy `off` mode (bf16 processing), top_k + TIE_PAD above
MAX_CANDIDATES, no Triton (or no `_sample_triton`), ROCm, a temperature division `temperature_rule` cannot
reproduce, or YUE2_SAMPLER=torch; and after these kernels failed once in a decoder (`PhaseDecoder._eager_step`).

Measured on an H200 (bench/bench.py at d4a80b5, same run, against YUE2_SAMPLER=torch): batch 1 683 vs 652 tok/s
bf16, 710 vs 674 int8; CFG pair 668 vs 634 bf16; 8 candidates 4,710 vs 4,502 bf16; 298 instead of 347 kernels a
step (docs/bench_h200.log, docs/profile_decode_h200.log).
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
    if not (triton_modules() is not None and torch.version.hip is None and sampling.temperature != 0
            and not legacy_off and k_cand <= MAX_CANDIDATES):
        return False
    try:
        from . import _sample_triton  # noqa: F401  (libdevice, div_rn: a Triton without them cannot build it)
    except Exception:  # an import error or a broken Triton: the PyTorch tail
        return False
    return True


_RULES: dict = {}


def temperature_rule(t: float, device) -> tuple[str, float] | None:
    """How PyTorch divides fp32 scores by the Python scalar `t` on `device` (`sampler.candidates` does `scores / t`),
    found by trying it once per (t, device) on 4,096 values: ("recip", inv) when the result equals x · inv for
    inv = fp32(1/t) with the reciprocal taken in double (torch 2.11 on CUDA, measured on an H200) or 1/fp32(t) (what
    PyTorch's CUDA source has long done); ("div", fp32(t)) when it equals the correctly rounded division (the CPU);
    None when it is neither (the kernels then cannot reproduce it and the PyTorch tail runs)."""
    key = (float(t), str(device))
    if key not in _RULES:
        x = torch.randn(4096, generator=torch.Generator().manual_seed(0)).mul_(10).to(device)
        ref = x / float(t)
        t32 = torch.tensor(float(t), dtype=torch.float32)
        rule = None
        if torch.equal(ref, x / t32.to(device)):
            rule = ("div", float(t32))
        else:
            for inv in (float(torch.tensor(1.0 / float(t), dtype=torch.float32)), float(1.0 / t32)):
                if torch.equal(ref, x * inv):
                    rule = ("recip", inv)
                    break
        _RULES[key] = rule
    return _RULES[key]


class KernelTail:
    """The tail for G songs of one phase: `scores` [G, width] fp32 scratch and the penalty table [window + 1]
    (penalty^count, clamped as `sampler.candidates` clamps it). Call with the decoder's state; updates in place.

    logits [R, width] (R = G, or 2G with CFG: cond rows then uncond rows), step [1] long, ring [G, window] long,
    ring_w [G, window] fp32, mask [width] fp32, noise [≥ max_tokens, G, K] fp32 (K = k_cand), forced [≥ max_tokens]
    long (−1 = free), out [G, ≥ max_tokens] long, done [G] bool, tokens [R] long. Continuous batching (`fast.refill`):
    `budget` [G, 2] long (each row's min_tokens, max_tokens) and step [G], a step per row."""

    def __init__(self, sampling, phase: str, G: int, k_cand: int, device, pdl: dict | None = None):
        triton, _ = triton_modules()
        self.s, self.slice, self.G, self.K = sampling, SLICES[phase], G, k_cand
        self.KP = max(16, triton.next_power_of_2(k_cand))
        self.scores = torch.empty(G, self.slice.width, dtype=torch.float32, device=device)
        counts = torch.arange(sampling.penalty_window + 1, dtype=torch.float32, device=device)
        self.alpha = (sampling.repetition_penalty ** counts).clamp(1e-30, 1e30)  # as sampler.candidates computes it
        # how this PyTorch divides the scores by T on this device (None: not reproducible, see `temperature_rule`)
        self.rule = temperature_rule(sampling.temperature, device) if sampling.temperature != 1 else ("div", 1.0)
        self.pdl = pdl or {}
        from ._sample_triton import finish_kernel, scores_kernel
        self.kernels = (triton_modules()[0], scores_kernel, finish_kernel)

    def __call__(self, logits, step, ring, ring_w, mask, noise, forced, out, done, tokens, cfg: float,
                 budget=None) -> None:
        triton, scores_kernel, finish_kernel = self.kernels
        s, sl, G, W = self.s, self.slice, self.G, self.slice.width
        per_row = budget is not None  # continuous batching: step [G] and budget [G, 2] (min, max tokens) per row
        rows_budget = budget if per_row else step  # (not read without ROWS)
        scores_kernel[(G, triton.cdiv(W, BLOCK))](
            logits, logits.stride(0), mask, self.scores, step, ring, ring_w, self.alpha, rows_budget,
            W, G, s.penalty_window, float(cfg), s.min_tokens, sl.end_col, self.rule[1],
            CFG=cfg != 1.0, PENALTY=s.repetition_penalty != 1.0, SCALE=s.temperature != 1,
            RECIP=self.rule[0] == "recip", BLOCK=BLOCK, LIBDEVICE=logits.is_cuda, ROWS=per_row, num_warps=4,
            **self.pdl)
        vals, cols = self.scores.topk(self.K, dim=1)
        finish_kernel[(G,)](
            vals, cols, noise, step, forced, out, out.stride(0), ring, ring_w, done, tokens, rows_budget,
            self.K, min(s.top_k, W), G, tokens.shape[0], s.penalty_window, float(s.top_p), s.max_tokens,
            sl.end_col, sl.start, TOPP=s.top_p < 1, KP=self.KP, LIBDEVICE=logits.is_cuda, ROWS=per_row, num_warps=4,
            **self.pdl)
