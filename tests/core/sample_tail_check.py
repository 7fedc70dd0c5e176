"""Shared by tests/core/test_sample_kernels.py (Triton's CPU interpreter, in a subprocess) and
tests/core/test_cuda_fast.py (CUDA): the kernel sampling tail (`fast.sample_kernels.KernelTail`) against the PyTorch
tail (`fast.decode.sample_tail`) step by step, on random logits, both fed the same state."""
from __future__ import annotations

import torch

from yue2_core.fast.decode import sample_tail
from yue2_core.fast.sample_kernels import KernelTail, usable
from yue2_core.fast.sampler import SLICES, TIE_PAD, static_mask
from yue2_core.protocol import Sampling


def cases(cfg_dtype: torch.dtype) -> list:
    """(phase, sampling, cfg, logits dtype, songs, forced {step: column}): CFG, temperatures below / at / above 1,
    top-p on and off, penalties on and off, the end token blocked then allowed, forced tokens, the ABC slice with
    its masked specials, fp32 / fp16 / bf16 logits. `cfg_dtype`: the logits dtype of the CFG case (the interpreter
    truncates fp32 → bf16 where the GPU rounds to nearest, so it gets fp16)."""
    return [
        ("semantic", Sampling(min_tokens=3, max_tokens=8), 1.0, torch.float32, 2, {}),
        ("semantic", Sampling(0.85, 0.9, 1700, 1.3, 5, 2, 8), 1.5, cfg_dtype, 1, {4: 17}),
        ("semantic", Sampling(1.3, 1.0, 7, 1.0, 50, 0, 8), 1.0, torch.float16, 3, {0: 5, 1: 0}),
        # T = 1.1: fp32(1/T) in double differs from 1/fp32(T) (what PyTorch's CUDA division multiplies by)
        ("semantic", Sampling(1.1, 0.95, 100, 1.2, 50, 0, 6), 1.0, torch.float32, 1, {}),
        ("semantic", Sampling(0.7, 0.5, 1, 1.2, 3, 0, 5), 3.0, torch.float32, 2, {}),
        ("abc", Sampling(0.7, 0.9, 30, 1.005, 100, 2, 6), 1.0, torch.bfloat16, 1, {2: 44}),
    ]


def compare(device: str, all_cases: list, repeat: int = 1, seed: int = 0, per_row: bool = False) -> dict:
    """Runs every case `repeat` times. Returns {"steps", "score_mismatches" (steps whose processed scores — the
    input of torch.topk — differ anywhere), "state_mismatches" [(case, step, name)]}; after a state mismatch the
    case continues from the PyTorch tail's state. `per_row`: a step and a budget per row (`fast.refill`: step [G], row
    g starting at step g, its own min/max tokens, the step-indexed buffers one slot longer), cases of one song
    skipped."""
    captured = []
    real_topk = torch.Tensor.topk

    def recording_topk(self, *a, **kw):
        captured.append(self.clone())
        return real_topk(self, *a, **kw)

    gen = torch.Generator(device=device).manual_seed(seed)
    result = {"steps": 0, "score_mismatches": 0, "state_mismatches": []}
    torch.Tensor.topk = recording_topk
    try:
        for ci, (phase, s, cfg, dt, G, forced) in enumerate(all_cases * repeat):
            sl = SLICES[phase]
            W, R, K = sl.width, G * (2 if cfg != 1.0 else 1), min(s.top_k + TIE_PAD, sl.width)
            assert usable(s, K, False)
            if per_row and G == 1:
                continue
            slots = s.max_tokens + int(per_row)
            noise = torch.empty(slots, G, K, device=device).exponential_(1.0, generator=gen)
            forced_t = torch.full((slots,), -1, dtype=torch.long, device=device)
            for st, col in forced.items():
                forced_t[st] = sl.start + col
            mask = static_mask(phase, torch.float32, device)
            first = (torch.arange(G, device=device) if per_row else torch.zeros(1, dtype=torch.long, device=device))
            a = dict(step=first,
                     ring=torch.zeros(G, s.penalty_window, dtype=torch.long, device=device),
                     ring_w=torch.zeros(G, s.penalty_window, device=device),
                     out=torch.full((G, slots), -1, dtype=torch.long, device=device),
                     done=torch.zeros(G, dtype=torch.bool, device=device),
                     tokens=torch.zeros(R, dtype=torch.long, device=device))
            tail = KernelTail(s, phase, G, K, device)
            budget = None  # per row: row g's min_tokens raised by g, every other row's max_tokens lowered by one
            if per_row:
                budget = torch.tensor([[min(s.min_tokens + g, s.max_tokens), s.max_tokens - g % 2] for g in range(G)],
                                      dtype=torch.long, device=device)
            for step in range(s.max_tokens - (G - 1 if per_row else 0)):
                logits = (torch.randn(R, W, generator=gen, device=device) * 3).to(dt)
                logits[:, sl.end_col] = 4.0  # the end token competitive: blocked while step < min_tokens
                if step % 2:  # ties at the top
                    logits[:, 10:20] = logits[:, 10:11].clone()
                b = {k: v.clone() for k, v in a.items()}
                captured.clear()
                sample_tail(logits, G, cfg, s, phase, a["step"], a["ring"], a["ring_w"], mask, noise, forced_t,
                            a["out"], a["done"], a["tokens"], budget=budget)
                tail(logits, b["step"], b["ring"], b["ring_w"], mask, noise, forced_t, b["out"], b["done"],
                     b["tokens"], cfg=cfg, budget=budget)
                assert len(captured) == 2, len(captured)
                result["steps"] += 1
                result["score_mismatches"] += int(not torch.equal(captured[0], captured[1]))
                for name in ("ring", "ring_w", "out", "done", "tokens"):
                    if not torch.equal(a[name], b[name]):
                        result["state_mismatches"].append((ci, step, name))
                a["step"].add_(1)
    finally:
        torch.Tensor.topk = real_topk
    return result
