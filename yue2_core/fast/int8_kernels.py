"""int8 ConvRot linear on CUDA: a W8A16 skinny GEMM in the rotated basis (Triton) for decode-sized inputs, and
dequantize-then-GEMM for large inputs (the NAR's thousands of rows, where a bf16 GEMM is faster; performance.md §3).

    y[m, n] = s[n] · Σ_k (x·H)[m, k] · q[n, k]  (+ b[n])

`convrot_linear(x, q, s, bias, group)` picks the path: Triton when x is on CUDA, Triton imports and x has ≤ 16
rows; otherwise a pure-torch path (the same maths). Results are deterministic (no atomics: split-K partial sums
are avoided; each program owns a block of output rows and the whole K loop).
"""
from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from ..weights.quant import dequantize, rotate

MAX_ROWS = 16  # rows handled by the skinny kernel (one tensor-core tile); more rows use dequantize + GEMM


@functools.lru_cache(maxsize=1)
def _kernel():
    from . import triton_modules
    if triton_modules() is None:
        return None
    triton, tl = triton_modules()

    configs = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=st)
               for bn, bk, w, st in [(16, 256, 4, 4), (32, 256, 4, 3), (32, 128, 4, 4), (64, 128, 4, 3),
                                     (64, 256, 8, 3), (128, 128, 8, 3), (16, 512, 4, 3)]]
    interpret = os.environ.get("TRITON_INTERPRET") == "1"  # CPU interpreter (tests): one fixed config

    @triton.jit
    def w8a16(x_ptr, q_ptr, s_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):
        pid_n = tl.program_id(0)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < K
            xt = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :],
                         mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
            qt = tl.load(q_ptr + offs_n[None, :] * K + offs_k[:, None],
                         mask=(offs_n[None, :] < N) & k_ok[:, None], other=0)
            acc += tl.dot(xt, qt.to(xt.dtype))
        scale = tl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0)
        out = acc * scale[None, :]
        tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], out.to(y_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

    # the choices persist in Triton's cache directory where this Triton can (`cache_results`, Triton ≥ 3.4), so a new
    # process does not benchmark the configurations again (warmup.py)
    import inspect
    persist = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
    tuned = None if interpret else triton.autotune(configs=configs, key=["M", "N", "K"], **persist)(w8a16)

    def run(xr: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, out_dtype) -> torch.Tensor:
        m, k = xr.shape
        n = q.shape[0]
        y = torch.empty(m, n, dtype=out_dtype, device=xr.device)
        if tuned is None:
            w8a16[(triton.cdiv(n, 32),)](xr, q, scale, y, m, n, k, BLOCK_M=16, BLOCK_N=32, BLOCK_K=128)
        else:
            tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](xr, q, scale, y, m, n, k, BLOCK_M=16)
        return y

    return run


def triton_available() -> bool:
    return _kernel() is not None


def _w8a8_ok(k: int, group: int) -> bool:
    """The W8A8 kernels apply: Triton imports, K a multiple of 256 and the ConvRot group 16, 64 or 256 (the
    quantizer rotates a group with one tensor-core product, whose sides must be ≥ 16: a file with groups of 4 —
    which the loader accepts — failed to compile mid-render; stop-48 diff review)."""
    from . import w8a8
    return k % 256 == 0 and w8a8.MIN_GROUP <= group <= 256 and k % group == 0 and w8a8.available()


def convrot_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                   group: int, force: str | None = None, w8a8: bool = False) -> torch.Tensor:
    """x [..., K] → y [..., N] in x's dtype for int8 codes q [N, K] with row scales `scale` [N, 1].
    `w8a8` (the int8 NAR's layers, `nar.int8_linears`): inputs of more than MAX_ROWS bf16 rows on CUDA take
    `fast.w8a8.linear` (int8 × int8, ComfyUI's arithmetic) instead of dequantize + GEMM.
    `force` = "triton" | "dequant" | "portable" | "w8a8" selects a path (tests and benchmarks)."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    rows = x2.shape[0]
    path = force or ("triton" if x.is_cuda and rows <= MAX_ROWS and _kernel() is not None else
                     "w8a8" if w8a8 and x.is_cuda and x.dtype == torch.bfloat16 and _w8a8_ok(k, group) else
                     "dequant" if x.is_cuda else "portable")
    if path == "w8a8":
        from .w8a8 import linear
        return linear(x, q, scale, bias, group)
    s = scale.reshape(-1)
    if path == "triton":
        xr = rotate(x2.to(torch.bfloat16), group).contiguous()
        y = _kernel()(xr, q.contiguous(), s.float().contiguous(), x.dtype)
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
