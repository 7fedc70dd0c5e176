"""Shared by tests/core/test_sample_kernels.py (Triton's CPU interpreter) and tests/core/test_cuda_fast.py (CUDA): the
finish kernel's own candidate selection (`_sample_triton._select`) against `torch.topk` on rows built to tie — bf16
logits, a few distinct integers, ±0.0, rows mostly −inf, fewer finite entries than k, the last column on top. On
CUDA the reference is `torch.topk` itself; on the CPU (whose top-k orders ties arbitrarily) `canonical_topk`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from yue2_core.fast._sample_triton import _select
from yue2_core.fast.sample_kernels import SELECT_WARPS, select_blocks
from tests.core.sample_tail_check import canonical_topk


@triton.jit
def _probe(scores, W, k, K, sk, sc, ov, oc, MAIN: tl.constexpr, TAIL: tl.constexpr, KP: tl.constexpr):
    g = tl.program_id(0)
    v, c = _select(scores, W, g, k, K, sk, sc, MAIN, TAIL, KP)
    r = tl.arange(0, KP)
    tl.store(ov + g * KP + r, v)
    tl.store(oc + g * KP + r, c)


def rows(kind: str, G: int, W: int, gen: torch.Generator) -> torch.Tensor:
    """[G, W] fp32 scores (CPU) of one tie-heavy kind."""
    if kind == "bf16":  # bf16 logits / T: exact ties among 32k columns
        return torch.randn(G, W, generator=gen).mul_(4).bfloat16().float() / 0.9
    if kind == "ints":  # 7 distinct values: tie groups far larger than K
        return torch.randint(-3, 4, (G, W), generator=gen).float()
    if kind == "zeros":  # +0.0 and −0.0 (PyTorch's radix order puts +0.0 first)
        return torch.where(torch.rand(G, W, generator=gen) < 0.5, torch.tensor(0.0), torch.tensor(-0.0))
    if kind == "masked":  # most columns −inf, the rest two tied values
        x = torch.full((G, W), float("-inf"))
        x[:, ::97] = torch.randint(0, 2, (G, len(range(0, W, 97))), generator=gen).float()
        return x
    if kind == "few":  # fewer finite entries than k: the k-th value is −inf
        x = torch.full((G, W), float("-inf"))
        x[:, 3:40] = torch.randn(G, 37, generator=gen)
        return x
    if kind == "last":  # the last column (past the power-of-two block) tied on top
        x = torch.randn(G, W, generator=gen)
        x[:, -1] = 100.0
        x[0, 5] = 100.0
        return x
    raise ValueError(kind)


KINDS = ("bf16", "ints", "zeros", "masked", "few", "last")


def compare(device: str, W: int = 32769, G: int = 2, ks=((100, 356), (1, 257), (7, 263)), seed: int = 0) -> dict:
    """Every kind × (k, K): {"cases", "mismatches": [(kind, k, K, row)]} — a row mismatches when its selected
    entries ≥ the k-th value differ from the reference's first ones (value bits or column), or a later entry is not
    −inf."""
    gen = torch.Generator().manual_seed(seed)
    main, tail = select_blocks(W)
    out = {"cases": 0, "mismatches": []}
    for kind in KINDS:
        x = rows(kind, G, W, gen).to(device).contiguous()
        for k, K in ks:
            KP = max(16, triton.next_power_of_2(K))
            sk = torch.zeros(G, KP, dtype=torch.int32, device=device)
            sc = torch.zeros_like(sk)
            ov = torch.empty(G, KP, device=device)
            oc = torch.empty(G, KP, dtype=torch.int32, device=device)
            _probe[(G,)](x, W, k, K, sk, sc, ov, oc, MAIN=main, TAIL=tail, KP=KP, num_warps=SELECT_WARPS)
            if x.is_cuda:
                rv, rc = x.topk(K, dim=1)
            else:
                rv, rc = canonical_topk(x, K)
            for g in range(G):
                n = int((rv[g] >= rv[g, k - 1]).sum())
                same = (torch.equal(ov[g, :n].view(torch.int32), rv[g, :n].view(torch.int32))
                        and torch.equal(oc[g, :n].long(), rc[g, :n])
                        and bool(torch.isneginf(ov[g, n:K]).all()))
                if not same:
                    out["mismatches"].append((kind, k, K, g))
            out["cases"] += 1
    return out
