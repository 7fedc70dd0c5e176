"""int8 ConvRot linear on CUDA: a W8A16 skinny GEMM in the rotated basis (Triton) for decode-sized inputs, and
dequantize-then-GEMM for large inputs (the NAR's thousands of rows, where a bf16 GEMM is faster; performance.md §3).

    y[m, n] = s[n] · Σ_k (x·H)[m, k] · q[n, k]  (+ b[n])

`convrot_linear(x, q, s, bias, group)` picks the path: Triton when x is on CUDA, Triton imports and x has ≤ 16
rows; otherwise a pure-torch path (the same maths). Results are deterministic (no atomics: split-K partial sums
are reduced with a fixed-order sum).
"""
from __future__ import annotations

import functools
import os
import warnings

import torch
import torch.nn.functional as F

from ..quant import dequantize, rotate

MAX_ROWS = 16  # rows handled by the skinny kernel (one tensor-core tile); more rows use dequantize + GEMM
SPLITS = 8  # partial-sum slots (the autotuned split-K is ≤ this)


@functools.lru_cache(maxsize=1)
def _kernel():
    try:
        import triton
        import triton.language as tl
    except Exception as exc:  # ImportError, or a broken Triton install
        warnings.warn(f"Triton unavailable ({type(exc).__name__}); int8 layers use the portable path")
        return None

    configs = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk}, num_warps=w, num_stages=st)
               for bn, bk, sk, w, st in [(64, 128, 1, 4, 3), (64, 256, 1, 4, 3), (32, 256, 2, 4, 3),
                                         (64, 128, 4, 4, 3), (32, 128, 4, 4, 4), (128, 128, 2, 8, 3),
                                         (16, 256, 8, 4, 3), (64, 256, 8, 4, 3)]]
    interpret = os.environ.get("TRITON_INTERPRET") == "1"  # CPU interpreter (tests): one fixed config

    @triton.jit
    def w8a16(x_ptr, q_ptr, part_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_per = tl.cdiv(K, SPLIT_K)
        k0 = pid_k * k_per
        for kk in range(0, k_per, BLOCK_K):
            offs_k = k0 + kk + tl.arange(0, BLOCK_K)
            k_ok = (offs_k < K) & (offs_k < k0 + k_per)
            xt = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :],
                         mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
            qt = tl.load(q_ptr + offs_n[None, :] * K + offs_k[:, None],
                         mask=(offs_n[None, :] < N) & k_ok[:, None], other=0)
            acc += tl.dot(xt, qt.to(xt.dtype))
        tl.store(part_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :], acc,
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

    tuned = None if interpret else triton.autotune(configs=configs, key=["M", "N", "K"],
                                                   reset_to_zero=["part_ptr"])(w8a16)

    def run(xr: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        m, k = xr.shape
        n = q.shape[0]
        part = torch.zeros(SPLITS, m, n, dtype=torch.float32, device=xr.device)
        if tuned is None:
            w8a16[(triton.cdiv(n, 32), 2)](xr, q, part, m, n, k, BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, SPLIT_K=2)
        else:
            grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])  # noqa: E731
            tuned[grid](xr, q, part, m, n, k, BLOCK_M=16)
        return part.sum(0)

    return run


def triton_available() -> bool:
    return _kernel() is not None


def convrot_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                   group: int, force: str | None = None) -> torch.Tensor:
    """x [..., K] → y [..., N] in x's dtype for int8 codes q [N, K] with row scales `scale` [N, 1].
    `force` = "triton" | "dequant" | "portable" selects a path (tests and benchmarks)."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    rows = x2.shape[0]
    path = force or ("triton" if x.is_cuda and rows <= MAX_ROWS and _kernel() is not None else
                     "dequant" if x.is_cuda else "portable")
    s = scale.reshape(-1)
    if path == "triton":
        xr = rotate(x2.to(torch.bfloat16), group).contiguous()
        y = (_kernel()(xr, q.contiguous()) * s.float()).to(x.dtype)
    elif path == "dequant":
        y = F.linear(x2, dequantize(q, s.reshape(-1, 1), group, x.dtype))
    else:
        y = portable(x2, q, s, group)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.reshape(*lead, q.shape[0])


def portable(x2: torch.Tensor, q: torch.Tensor, s: torch.Tensor, group: int, block_elems: int = 1 << 26):
    """Pure torch: rotate x in fp32, multiply by the codes in row blocks (bounded temporary memory)."""
    xr = rotate(x2.float(), group)
    rows = max(1, block_elems // max(1, q.shape[1]))
    outs = [(F.linear(xr, q[i:i + rows].float()) * s[i:i + rows].float()).to(x2.dtype)
            for i in range(0, q.shape[0], rows)]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
