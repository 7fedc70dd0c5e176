"""A layer linear and the kernel that consumes it, in one launch (CUDA, Triton): the split-K GEMV of `fast.gemv`
whose last program per output group runs the consumer of `fast.fused` on that group. Three pairs per layer:

    qkv_proj   + QK-norm, RoPE, KV store     group: one head of q‖k‖v      (`qk_norm_rope_store`)
    gate_up    + SiLU·up (rotated for int8)  group: 256 columns of gate+up  (`silu_mul`)
    o_proj / down_proj + add+RMSNorm         group: the whole product      (`add_rmsnorm`; the next norm's input)

Each program counts itself in its group's int32 counter (zero before, zero again after the launch) after a
GPU-scope fence; the program that counts last reads the group's sums from L2 and runs the consumer, so the step has
four launches fewer per layer (the next layer's input norm rides on down_proj; 112 of ~340 a step), with the same
arithmetic as the separate kernels (equal in the CPU interpreter; on a GPU the fp32 sums of the row norm may be
reduced in another order by another warp count: one bf16 step of the norm's scale now and then). The add+RMSNorm
of the whole row runs in one program, serially: cheap at 1–2 rows, unmeasured for candidate batches.
Unmeasured on a GPU so far: off by default, YUE2_GEMV_EPILOGUE=1 turns it on in the decoder (fast/decode.py).
Needs NVIDIA (the fence is PTX) or the CPU interpreter.
"""
from __future__ import annotations

import os

import torch

from . import gemv as G

COUNTERS = 64  # ≥ heads + 2·kv heads (32) and F / 256 (24) of every YuE2 release; `counters()` sizes to the model


def counters(heads: int, kv_heads: int, ffn: int, device) -> torch.Tensor:
    """The zeroed int32 counters one decoder's epilogue launches share (one launch at a time)."""
    return torch.zeros(max(COUNTERS, heads + 2 * kv_heads, ffn // 256 + 1), dtype=torch.int32, device=device)


def _fence(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.version.hip is None and os.environ.get("TRITON_INTERPRET") != "1"


def _launch(x: torch.Tensor, w: torch.Tensor, scale, cnt: torch.Tensor, groups: int, runs, width: int):
    """(kernels module, triton, cfg, split, out, common launch args, meta) of the product x [M, K] · w [N, K]ᵀ
    (`gemv.plan`) with `groups` counters in cnt, whose output groups are `width` columns wide. Raises ValueError
    for inputs the kernels do not take (`gemv.plan`'s, counters, a block not dividing a group)."""
    from . import _decode_triton as k
    triton = G._kernels()[0]
    cfg, split, out, args, meta = G.plan(x, w, scale, who="epilogue product")
    n = w.shape[0]
    if (width % cfg.bn or n % width or cnt.dtype != torch.int32 or cnt.numel() < groups or cnt.device != x.device
            or (runs is not None and (runs.dtype != torch.int32 or runs.numel() < groups
                                      or runs.device != x.device))):
        raise ValueError(f"epilogue product: needs output blocks of {cfg.bn} dividing groups of {width} columns "
                         f"dividing {n}, and ≥ {groups} int32 counters on {x.device}")
    meta.update(SPLIT=split, FENCE=_fence(x), **({"runs_ptr": runs, "RUNS": True} if runs is not None else {}))
    return k, triton, cfg, split, out, args, meta


def fits(hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, rows: int, int8: bool, device) -> bool:
    """Whether a decoder of these dimensions and batch rows can use the epilogues on `device`: NVIDIA CUDA (or the
    CPU interpreter), hidden a power of two ≥ 256, ffn a multiple of 256, and each product's configuration
    (`gemv.choose`) with output blocks dividing its groups (head_dim for qkv, 256 for gate_up)."""
    device = torch.device(device)
    if not ((device.type == "cuda" and torch.version.hip is None) or os.environ.get("TRITON_INTERPRET") == "1"):
        return False
    if hidden < 256 or hidden & (hidden - 1) or ffn % 256 or rows > G.MAX_ROWS:
        return False

    def bn(n, k):
        return G.usable(G.choose(n, k, rows, int8), n, k, rows, int8, device).bn

    return head_dim % bn((heads + 2 * kv_heads) * head_dim, hidden) == 0 and 256 % bn(2 * ffn, hidden) == 0


def qkv_rope_store(y: torch.Tensor, w: torch.Tensor, scale, cnt: torch.Tensor, qn, kn, cos, sin, pos, k_cache,
                   v_cache, heads: int, kv_heads: int, head_dim: int, eps: float, runs=None) -> torch.Tensor:
    """y [R, H] (rotated for int8) · qkv_proj → q [R, nh, D]; k and v stored at pos[r] — `gemv.gemv` then
    `fused.qk_norm_rope_store`, in one launch. `runs` (tests): int32 [nh + 2·nkv] zeros, counts each head's
    consumer runs (1 each). Caller checks `fits`; ValueError for inputs the kernel does not take."""
    if heads % kv_heads or w.shape[0] != (heads + 2 * kv_heads) * head_dim or qn.numel() != head_dim:
        raise ValueError(f"qkv_rope_store epilogue: w must have (heads + 2·kv_heads)·head_dim = "
                         f"{(heads + 2 * kv_heads) * head_dim} rows (heads a multiple of kv_heads) and the norms "
                         f"{head_dim} weights; got w {tuple(w.shape)}, {heads}/{kv_heads} heads")
    k, _, cfg, split, out, args, meta = _launch(y, w, scale, cnt, heads + 2 * kv_heads, runs, head_dim)
    r = y.shape[0]
    q = torch.empty(r, heads, head_dim, dtype=k_cache.dtype, device=y.device)
    k.gemv_qk_rope_kernel[(w.shape[0] // cfg.bn, split)](
        *args, cnt, qn, kn, cos, sin, pos, q, k_cache, v_cache, k_cache.stride(0), k_cache.stride(1), eps,
        NH=heads, NKV=kv_heads, D=head_dim, **meta)
    return q


def gate_up_silu(y: torch.Tensor, w: torch.Tensor, scale, cnt: torch.Tensor, rot: bool, runs=None) -> torch.Tensor:
    """y [R, H] · gate_up_proj [2F, H]ᵀ → silu(gate)·up [R, F] (rotated per 256-group with `rot`) — `gemv.gemv`
    then `fused.silu_mul`, in one launch. `runs` (tests): int32 [F / 256] zeros, counts each group's consumer
    runs. Caller checks `fits`; ValueError for inputs the kernel does not take."""
    f = w.shape[0] // 2
    if f % 256 or f == 0:
        raise ValueError(f"gate_up_silu: the gate and up halves must be multiples of 256 columns; got {f}")
    k, _, cfg, split, out, args, meta = _launch(y, w, scale, cnt, f // 256, runs, 256)
    act = torch.empty(y.shape[0], f, dtype=y.dtype, device=y.device)
    k.gemv_silu_kernel[(w.shape[0] // cfg.bn, split)](*args, cnt, act, GW=256, ROT=rot, **meta)
    return act


def add_rmsnorm(h: torch.Tensor, w: torch.Tensor, scale, cnt: torch.Tensor, x: torch.Tensor, nw: torch.Tensor,
                eps: float, rot: bool, runs=None) -> tuple[torch.Tensor, torch.Tensor]:
    """h [R, K] · w [N, K]ᵀ added to the residual x [R, 1, N] → (new x, RMSNorm(new x)·nw) [R, 1, N] (the norm
    rotated per 256-group with `rot`) — `gemv.gemv` then `fused.add_rmsnorm`, in one launch. N a power of two
    ≥ 256. `runs` (tests): int32 [1] zero, counts the consumer runs. Caller checks `fits`; ValueError for inputs
    the kernel does not take."""
    n = w.shape[0]
    k, triton, cfg, split, out, args, meta = _launch(h, w, scale, cnt, 1, runs, n)
    if n < 256 or n & (n - 1) or not x.is_contiguous() or x.numel() != h.shape[0] * n or nw.numel() != n:
        raise ValueError(f"add_rmsnorm epilogue: N must be a power of two ≥ 256, x a contiguous [R, 1, N] and the "
                         f"norm N weights; got N = {n}, x {tuple(x.shape)}, {nw.numel()} weights")
    xo, y = torch.empty_like(x), torch.empty_like(x)
    k.gemv_add_rmsnorm_kernel[(triton.cdiv(n, cfg.bn), split)](*args, cnt, x, nw, xo, y, eps, NB=n, ROT=rot,
                                                                 **meta)
    return xo, y
