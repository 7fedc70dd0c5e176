"""A layer linear and the kernel that consumes it, in one launch (CUDA, Triton): the split-K GEMV of `fast.gemv`
whose last program per output group runs the consumer of `fast.fused` on that group. Three pairs per layer:

    qkv_proj   + QK-norm, RoPE, KV store     group: one head of q‖k‖v      (`qk_norm_rope_store`)
    gate_up    + SiLU·up (rotated for int8)  group: 256 columns of gate+up  (`silu_mul`)
    o_proj / down_proj + add+RMSNorm         group: the whole product      (`add_rmsnorm`; the next norm's input)

Each program counts itself in its group's int32 counter (zero before, zero again after the launch) after a
GPU-scope fence; the program that counts last reads the group's sums from L2 and runs the consumer, so the step has
three launches fewer per layer, with the same arithmetic as the separate kernels (results equal in the CPU
interpreter; on a GPU the full-row rotation of the norm uses a 16-row tensor-core product instead of 1-row ones).
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


def _launch(x: torch.Tensor, w: torch.Tensor, scale):
    """(kernels module, cfg, split, ks, out, common launch args) of the product x [M, K] · w [N, K]ᵀ."""
    from . import _decode_triton as k
    triton = G._kernels()[0]
    m, kk = x.shape
    n = w.shape[0]
    int8 = w.dtype == torch.int8
    cfg = G.usable(G.choose(n, kk, m, int8), n, kk, m, int8)
    split = cfg.split if kk % (cfg.split * cfg.bk) == 0 else 1
    ks = triton.cdiv(triton.cdiv(kk, split), cfg.bk) * cfg.bk
    out = (torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1
           else torch.empty(m, n, dtype=x.dtype, device=x.device))
    args = (x, w, scale.view(-1) if int8 else x, out, m, n, kk, ks, x.stride(0))
    meta = dict(BM=16 if cfg.dot else triton.next_power_of_2(m), BN=cfg.bn, BK=cfg.bk, INT8=int8, SPLIT=split,
                DOT=cfg.dot, FENCE=_fence(x), num_warps=cfg.warps, num_stages=cfg.stages, **G._pdl(x))
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
        return G.usable(G.choose(n, k, rows, int8), n, k, rows, int8).bn

    return head_dim % bn((heads + 2 * kv_heads) * head_dim, hidden) == 0 and 256 % bn(2 * ffn, hidden) == 0


def qkv_rope_store(y: torch.Tensor, w: torch.Tensor, scale, cnt: torch.Tensor, qn, kn, cos, sin, pos, k_cache,
                   v_cache, heads: int, kv_heads: int, head_dim: int, eps: float) -> torch.Tensor:
    """y [R, H] (rotated for int8) · qkv_proj → q [R, nh, D]; k and v stored at pos[r] — `gemv.gemv` then
    `fused.qk_norm_rope_store`, in one launch. Caller checks `fits`."""
    k, _, cfg, split, out, args, meta = _launch(y, w, scale)
    r = y.shape[0]
    q = torch.empty(r, heads, head_dim, dtype=k_cache.dtype, device=y.device)
    k.gemv_qk_rope_kernel[(w.shape[0] // cfg.bn, split)](
        *args, cnt, qn, kn, cos, sin, pos, q, k_cache, v_cache, k_cache.stride(0), k_cache.stride(1), eps,
        NH=heads, NKV=kv_heads, D=head_dim, **meta)
    return q


def gate_up_silu(y: torch.Tensor, w: torch.Tensor, scale, cnt: torch.Tensor, rot: bool) -> torch.Tensor:
    """y [R, H] · gate_up_proj [2F, H]ᵀ → silu(gate)·up [R, F] (rotated per 256-group with `rot`) — `gemv.gemv`
    then `fused.silu_mul`, in one launch. Caller checks `fits`."""
    k, _, cfg, split, out, args, meta = _launch(y, w, scale)
    f = w.shape[0] // 2
    act = torch.empty(y.shape[0], f, dtype=y.dtype, device=y.device)
    k.gemv_silu_kernel[(w.shape[0] // cfg.bn, split)](*args, cnt, act, GW=256, ROT=rot, **meta)
    return act


def add_rmsnorm(h: torch.Tensor, w: torch.Tensor, scale, cnt: torch.Tensor, x: torch.Tensor, nw: torch.Tensor,
                eps: float, rot: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """h [R, K] · w [N, K]ᵀ added to the residual x [R, 1, N] → (new x, RMSNorm(new x)·nw) [R, 1, N] (the norm
    rotated per 256-group with `rot`) — `gemv.gemv` then `fused.add_rmsnorm`, in one launch. N a power of two
    ≥ 256; caller checks `fits`."""
    k, triton, cfg, split, out, args, meta = _launch(h, w, scale)
    n = w.shape[0]
    xo, y = torch.empty_like(x), torch.empty_like(x)
    k.gemv_add_rmsnorm_kernel[(triton.cdiv(n, cfg.bn), split)](*args, cnt, x, nw, xo, y, eps, NB=n, ROT=rot,
                                                                 **meta)
    return xo, y
