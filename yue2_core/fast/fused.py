"""Fused Triton kernels for the decode step (CUDA). Each reproduces the reference's bf16 rounding order (every
PyTorch elementwise op computes in fp32 and rounds to the tensor dtype; the kernels round at the same points):

    add_rmsnorm(x, delta, w)   x ← x + delta (rounded), y = (x · bf16(rsqrt(mean x² + eps))) · w   — 1 kernel
    qk_norm_rope_store(...)    QK-norm → split-half RoPE for q and k heads, k/v written to the KV cache — 1 kernel
    silu_mul(gate‖up)          silu(gate) · up                                                      — 1 kernel
    decode_attention(...)      GQA decode attention, split over the cache length (flash-decoding)   — 1–3 kernels

They replace ~50 small kernels per layer. `available()` is False without Triton (the torch ops are used then).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

arrive = attend_chunk = depart = pdl_prologue = rot_rows = quant_store = merge_store = None  # set by _attention_kernels


@functools.lru_cache(maxsize=1)
def _kernels():
    from . import triton_modules
    if triton_modules() is None:
        return None
    from . import _decode_triton as k
    return triton_modules()[0], k.add_rmsnorm_kernel, k.qk_rope_kernel, k.silu_mul_kernel


@functools.lru_cache(maxsize=1)
def _attention_kernels():
    if _kernels() is None:
        return None
    triton, tl = _kernels()[0], __import__("triton.language", fromlist=["x"])
    global arrive, attend_chunk, depart, pdl_prologue, rot_rows, quant_store, merge_store  # the kernels below
    from ._decode_triton import arrive, attend_chunk, depart, pdl_prologue, rot_rows, quant_store  # resolve them

    @triton.jit
    def merge_store(m_ptr, l_ptr, o_ptr, out_ptr, r, h, splits, NKV: tl.constexpr, G: tl.constexpr,
                    D: tl.constexpr, SP: tl.constexpr, HG: tl.constexpr, ROT: tl.constexpr, CG: tl.constexpr,
                    q_ptr, qs_ptr, QUANT: tl.constexpr):
        # row r, query heads h [HG]: merges the splits' partial softmax sums and stores the heads' outputs; ROT
        # (HG·D = 256): they are one 256-group of the o_proj input and are written rotated (·H); QUANT: with that
        # group's int8 pair codes (`quant_store`). CG: the partial sums are read from L2 (".cg"), past this
        # multiprocessor's L1 (other programs of the same grid wrote them)
        kvh = h // G
        g = h % G
        si = tl.arange(0, SP)
        d = tl.arange(0, D)
        slot = ((r * NKV + kvh[None, :]) * splits + si[:, None]) * G + g[None, :]  # [SP, HG]
        ok = (si < splits)[:, None]
        m = tl.load(m_ptr + slot, mask=ok, other=float("-inf"), cache_modifier=".cg" if CG else "")
        l = tl.load(l_ptr + slot, mask=ok, other=0.0, cache_modifier=".cg" if CG else "")
        o = tl.load(o_ptr + slot[:, :, None] * D + d[None, None, :], mask=ok[:, :, None], other=0.0,
                    cache_modifier=".cg" if CG else "")
        top = tl.max(m, 0)
        w = tl.where(m == float("-inf"), 0.0, tl.exp(m - top[None, :]))
        out = tl.sum(o * w[:, :, None], 0) / tl.sum(l * w, 0)[:, None]  # [HG, D]
        dst = out_ptr + (r * NKV * G + h[:, None]) * D + d[None, :]
        if ROT:
            out = out.to(out_ptr.dtype.element_ty).to(tl.float32)  # the attention output, rounded, then rotated
            out = tl.reshape(rot_rows(tl.reshape(out, (1, HG * D)), 1), (HG, D))
            if QUANT:
                quant_store(q_ptr, qs_ptr, tl.reshape(out, (HG * D,)), r, tl.min(h, 0) * D // 256, NKV * G * D,
                            NKV * G * D // 256)
        tl.store(dst, out.to(out_ptr.dtype.element_ty))

    # lengths, chunks and split counts change with the prompt and the bucket: not specialised (Triton would compile
    # one more variant for each value that is 1 or a multiple of 16 — a ~1 s stall in the first song with a new one)
    @triton.jit(do_not_specialize=["CHUNK", "L", "START", "SP0", "splits"])
    def attn_split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, m_ptr, l_ptr, o_ptr, cache_row, cache_head, scale, CHUNK, L,
                          START, SP0, splits, NKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                          BL: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr = False,
                          cnt_ptr=None, out_ptr=None, MERGE: tl.constexpr = False, SP: tl.constexpr = 1,
                          ROT: tl.constexpr = False, FENCE: tl.constexpr = False, q8_ptr=None, qs_ptr=None,
                          QUANT: tl.constexpr = False):
        # one program = (row r, kv head, split sp): the G query heads of that kv head against cache positions
        # START + [sp·CHUNK, (sp+1)·CHUNK) ∩ [0, min(pos[r], L − 1)]; writes the running max m, sum l and
        # unnormalised o into split slot SP0 + sp of `splits` (START = SP0 = 0 unless a shared prefix is split apart).
        # MERGE: the last program of each (row, kv head) to finish — counted in cnt_ptr[r·NKV + kvh] (int32, zero
        # before the launch, zero again after it) — merges all `splits` slots of its G heads into out_ptr
        # (`merge_store`; ROT needs G·D = 256; QUANT: int8 pair codes too), so no merge kernel runs. FENCE (CUDA):
        # every thread fences its stores at GPU scope before the count too (the CUDA "threadfence reduction"
        # pattern; not in the CPU interpreter)
        pdl_prologue(PDL)
        r = tl.program_id(0)
        kvh = tl.program_id(1)
        sp = tl.program_id(2)
        pos = tl.minimum(tl.load(pos_ptr + r), L - 1)  # never read past the attention length (≤ capacity)
        gi = tl.arange(0, GP)
        d = tl.arange(0, D)
        q = tl.load(q_ptr + ((r * NKV + kvh) * G + gi[:, None]) * D + d[None, :], mask=gi[:, None] < G, other=0.0)
        base = r * cache_row + kvh * cache_head  # split past this row's position: nothing read
        m_i, l_i, acc = attend_chunk(q, k_ptr, v_ptr, base, START + sp * CHUNK, CHUNK, pos, scale, GP, D, BL, IEEE)
        slot = ((r * NKV + kvh) * splits + SP0 + sp) * G + gi
        tl.store(m_ptr + slot, m_i, mask=gi < G)
        tl.store(l_ptr + slot, l_i, mask=gi < G)
        tl.store(o_ptr + slot[:, None] * D + d[None, :], acc, mask=gi[:, None] < G)
        if MERGE:  # the program that counts last (`arrive`) merges
            if arrive(cnt_ptr + r * NKV + kvh, FENCE) == tl.num_programs(2) - 1:
                tl.debug_barrier()
                merge_store(m_ptr, l_ptr, o_ptr, out_ptr, r, kvh * G + tl.arange(0, G), splits, NKV, G, D, SP, G,
                            ROT, True, q8_ptr, qs_ptr, QUANT)
                depart(cnt_ptr, r * NKV + kvh)

    @triton.jit(do_not_specialize=["CHUNK", "P", "R", "splits"])
    def attn_shared_kernel(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, o_ptr, cache_head, scale, CHUNK, P, R, splits,
                           NKV: tl.constexpr, G: tl.constexpr, QP: tl.constexpr, D: tl.constexpr,
                           BL: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr = False):
        # one program = (kv head, split sp) of a prefix [0, P) that every row's cache holds identically: the G query
        # heads of *all* R rows (QP ≥ R·G tile rows) against row 0's cache positions [sp·CHUNK, (sp+1)·CHUNK) ∩
        # [0, P) — the prefix K/V are read once for the whole batch. Writes split slot sp of every row.
        pdl_prologue(PDL)
        kvh = tl.program_id(0)
        sp = tl.program_id(1)
        i = tl.arange(0, QP)
        r = i // G
        g = i % G
        ok_q = r < R
        d = tl.arange(0, D)
        q = tl.load(q_ptr + ((r[:, None] * NKV + kvh) * G + g[:, None]) * D + d[None, :], mask=ok_q[:, None],
                    other=0.0)
        m_i, l_i, acc = attend_chunk(q, k_ptr, v_ptr, kvh * cache_head, sp * CHUNK, CHUNK, P - 1, scale, QP, D,
                                     BL, IEEE)
        slot = ((r * NKV + kvh) * splits + sp) * G + g
        tl.store(m_ptr + slot, m_i, mask=ok_q)
        tl.store(l_ptr + slot, l_i, mask=ok_q)
        tl.store(o_ptr + slot[:, None] * D + d[None, :], acc, mask=ok_q[:, None])

    @triton.jit(do_not_specialize=["splits"])
    def attn_merge_kernel(m_ptr, l_ptr, o_ptr, out_ptr, splits, NKV: tl.constexpr, G: tl.constexpr,
                          D: tl.constexpr, SP: tl.constexpr, HG: tl.constexpr = 1, ROT: tl.constexpr = False,
                          PDL: tl.constexpr = False, q8_ptr=None, qs_ptr=None, QUANT: tl.constexpr = False):
        # one program = (row r, query heads [hb·HG, (hb+1)·HG)): `merge_store` of those heads
        pdl_prologue(PDL)
        merge_store(m_ptr, l_ptr, o_ptr, out_ptr, tl.program_id(0), tl.program_id(1) * HG + tl.arange(0, HG), splits,
                    NKV, G, D, SP, HG, ROT, False, q8_ptr, qs_ptr, QUANT)

    return triton, attn_split_kernel, attn_merge_kernel, attn_shared_kernel


def available() -> bool:
    return _kernels() is not None


def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether the decode kernels handle these attention shapes: head_dim a power of two ≥ 16 (Triton block sizes)
    and query heads a multiple of the KV heads (every YuE2 release: 16 / 8 heads of 128). Other shapes, e.g. a
    checkpoint with unusual dimensions, run the unfused torch step."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0 and kv_heads > 0 and heads % kv_heads == 0


def _pdl(t: torch.Tensor) -> dict:
    """Launch arguments for programmatic dependent launch on t's device (`fast.pdl_enabled`), else none."""
    from . import pdl_enabled
    return {"PDL": True, "launch_pdl": True} if t.is_cuda and pdl_enabled(t.device) else {}


def _rows_of(t) -> tuple[torch.Tensor, int, int]:
    """(tensor, S, PS) of a product's output: a plain tensor (S = 1) or `gemv.Partials` (S splits, stride PS)."""
    from .gemv import Partials
    if isinstance(t, Partials):
        return t.t, t.split, t.t[0].numel()
    return t, 1, 0


def add_rmsnorm(x: torch.Tensor, delta, w: torch.Tensor, eps: float, rot: bool = False, quant: bool = False):
    """x [..., N] (+ delta) → (new x, RMSNorm(new x)·w), both in x's dtype; x is not modified in place. `delta`:
    a tensor shaped like x, or `gemv.Partials` [S, rows, N] (summed, then rounded to x's dtype as a product's
    output is). `rot`: the normed output is returned rotated (·H per 256-group, N % 256 == 0) for an int8
    ConvRot product; `quant` (with rot, ≤ 8 rows): (new x, y, `gemv.QAct` of y's int8 pair codes) is returned."""
    triton, kern, _, _ = _kernels()
    n = x.shape[-1]
    rows = x.numel() // n
    if rot and n % 256:
        raise ValueError(f"add_rmsnorm(rot=True) rotates 256-wide groups; the last axis is {n}")
    d, splits, ps = _rows_of(delta) if delta is not None else (x, 1, 0)
    xo = torch.empty_like(x) if delta is not None else x
    y = torch.empty_like(x)
    pack = _new_pack(rows, n, x.device, rot, quant)
    kern[(rows, n // 256 if rot else 1)](x, d, w, xo, y, n, ps, eps, HAS_D=delta is not None, S=splits,
                                         BLOCK=triton.next_power_of_2(n), ROT=rot,
                                         num_warps=8 if splits > 1 else 4,  # more loads in flight for partials
                                         **_pdl(x), **_pack_args(pack, "qs_ptr"))
    return (xo, y, pack) if quant else (xo, y)


def _new_pack(rows: int, k: int, device, rot: bool, quant: bool):
    """An empty `gemv.QAct` for `quant` (which needs `rot`), else None."""
    if not quant:
        return None
    if not rot:
        raise ValueError("int8 pair codes (quant=True) are made of the rotated output: pass rot=True as well")
    from .gemv import new_pack
    return new_pack(rows, k, device)


def _pack_args(pack, scale_name: str, codes_name: str = "q_ptr") -> dict:
    return {codes_name: pack.q, scale_name: pack.s, "QUANT": True} if pack is not None else {}


def qk_norm_rope_store(qkv, qn: torch.Tensor, kn: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       heads: int, kv_heads: int, head_dim: int, eps: float, shared_row: bool = False) -> torch.Tensor:
    """qkv [R, (nh + 2·nkv)·D] (or `gemv.Partials` of it) → q [R, nh, D] (normed, rotated); k (normed, rotated)
    and v written to k_cache/v_cache [R, nkv, capacity, D] at slot pos[r] of batch row r — or, with `shared_row`,
    of batch row 0 for every r (the NAR: R token slots of one sequence). cos/sin [R, D/2] fp32."""
    _, _, kern, _ = _kernels()
    t, splits, ps = _rows_of(qkv)
    r = t.shape[-2]
    q = torch.empty(r, heads, head_dim, dtype=k_cache.dtype, device=t.device)
    br = 1 if r <= ROPE_ROW_BLOCK else ROPE_ROW_BLOCK  # the decode step's ≤ 16 rows: one program per (row, head)
    kern[(-(-r // br), heads + 2 * kv_heads)](t, qn, kn, cos, sin, pos, q, k_cache, v_cache, t.stride(-2),
                                              0 if shared_row else k_cache.stride(0), k_cache.stride(1), ps, r,
                                              NH=heads, NKV=kv_heads, D=head_dim, eps=eps, S=splits, BR=br, **_pdl(t))
    return q


ROPE_ROW_BLOCK = 16  # rows per program of qk_norm_rope_store beyond this many rows (the NAR's frames + 2)


def silu_mul(gate_up, rot: bool = False, quant: bool = False):
    """gate‖up [R, 2F] (or `gemv.Partials` of it) → silu(gate)·up [R, F] (rotated ·H per 256-group with `rot`);
    with `quant` (and rot, ≤ 8 rows): (that, `gemv.QAct` of its int8 pair codes)."""
    triton, _, _, kern = _kernels()
    t, splits, ps = _rows_of(gate_up)
    r, f2 = t.shape[-2], t.shape[-1]
    if rot and (f2 // 2) % 256:
        raise ValueError(f"silu_mul(rot=True) rotates 256-wide groups; the output width is {f2 // 2}")
    dtype = gate_up.dtype
    out = torch.empty(r, f2 // 2, dtype=dtype, device=t.device)
    block = 256 if rot else 1024
    pack = _new_pack(r, f2 // 2, t.device, rot, quant)
    kern[(r, triton.cdiv(f2 // 2, block))](t, out, f2 // 2, ps, S=splits, BLOCK=block, ROT=rot, **_pdl(t),
                                           **_pack_args(pack, "qs_ptr"))
    return (out, pack) if quant else out


# most splits the split kernel merges itself: its merging program loads all splits' partial sums at once, and
# ptxas (sm_90, 2 warps) gives the kernel 228 registers at 32 splits (the kernel without the merge: 227), 255 with
# spills at 64 — which slowed every program of the kernel (8 candidates with a shared prefix: 36 splits, −3 %)
MERGE_MAX_SPLITS = 32


@dataclass(frozen=True)
class AttnConfig:
    """Launch configuration of `decode_attention`: cache positions per inner iteration (bl), warps, pipeline
    stages, and the target number of split programs per multiprocessor (per_sm)."""
    bl: int = 32
    warps: int = 4
    stages: int = 3
    per_sm: int = 2


def attention_shared_bytes(cfg: AttnConfig, head_dim: int, q_rows: int, elt: int) -> int:
    """Shared memory of a decode-attention kernel, an upper bound (compiled for sm_90: equal for 16 and 64 query
    rows, 4 KB over at 32; tests/core/test_shared_memory.py): stages − 1 copies of a K and a V tile [bl, head_dim],
    the query tile [q_rows, head_dim] and the softmax reductions' scratch (8·q_rows² bytes, ≥ 2 KB); `elt` bytes
    per element."""
    return (max(1, cfg.stages - 1) * 2 * cfg.bl * head_dim * elt + q_rows * head_dim * elt
            + max(2048, 8 * q_rows * q_rows))


def fit_attention(cfg: AttnConfig, head_dim: int, q_rows: int, elt: int, limit: int) -> AttnConfig:
    """cfg with fewer stages (down to 2), then shorter cache blocks (down to 16), until the kernel fits `limit`
    bytes of shared memory per block less 1 KB (ATTN_CONFIG takes 70 KB at head_dim 128: more than a T4's 64 KB)."""
    from dataclasses import replace
    budget = limit - 1024
    while attention_shared_bytes(cfg, head_dim, q_rows, elt) > budget and cfg.stages > 2:
        cfg = replace(cfg, stages=cfg.stages - 1)
    while attention_shared_bytes(cfg, head_dim, q_rows, elt) > budget and cfg.bl > 16:
        cfg = replace(cfg, bl=cfg.bl // 2)
    return cfg


# the best configuration overall in bench/decode_parts.py on an H200 (docs/decode_parts_h200.log): 2–12 % faster
# than bl 32 / 4 warps at 1–8 rows and 2,256–7,424 positions
ATTN_CONFIG = AttnConfig(bl=64, warps=2, stages=3, per_sm=2)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                     attn_len: int, scale: float, sms: int | None = None,
                     cfg: AttnConfig | None = None, rot: bool = False, shared: int = 0,
                     counters: torch.Tensor | None = None, quant: bool = False):
    """GQA decode attention for one new token per row, split over the cache length (flash-decoding).

    q [R, nh, D] (query head h uses kv head h // (nh/nkv)); k_cache/v_cache [R, nkv, capacity, D]; pos [R] int64:
    row r attends to cache positions [0, min(pos[r], attn_len − 1)] (its own new k/v already stored there). `attn_len` (≥ max pos + 1)
    fixes the grid, so one captured graph serves every step of a length bucket; splits past a row's position do no
    memory traffic. Scores and the softmax are fp32 (the reference: fp32 scores, fp32 softmax); unlike the
    reference, the probabilities are not normalised before the product with V (each split rounds its unnormalised
    p to the cache dtype), so results differ from the torch path by bf16 rounding only. Returns [R, nh·D] in q's
    dtype. `sms` (default: the device's multiprocessor count) and `cfg.per_sm` set the split count; `cfg`
    (default `ATTN_CONFIG`, from bench/decode_parts.py on an H200) the block size, warps and stages. `rot`: the
    output is returned rotated (·H per 256-group, for an int8 ConvRot o_proj; nh·D % 256 == 0 and D ≤ 256);
    `quant` (with rot, ≤ 8 rows): (output, `gemv.QAct` of its int8 pair codes) is returned.
    `shared` = P > 0: cache positions [0, P) hold the same K/V in every row (a common prompt prefix, e.g. candidate
    songs of one request) and are read once, from row 0, for all rows' queries (one extra kernel; the caller must
    ensure P ≤ every pos[r], not checked: it would need a host sync); the result equals the unshared one within
    the cache dtype's rounding (another split of the softmax sums).
    `counters`: int32 [≥ R·nkv], all zero (and left zero): the last split program of each (row, kv head) merges the
    splits itself (an atomic count per pair) instead of a separate merge kernel — one launch fewer, the same
    arithmetic; used when the query heads per kv head are a power of two (and, with `rot`, G·D = 256) and there
    are at most MERGE_MAX_SPLITS splits, not on ROCm builds of torch (the merge kernel runs otherwise; with a
    shared prefix whose planned splits would make more, the prefix gets fewer, longer splits instead). One
    counters array serves one launch at a time (a decoder's layers run one after another); two launches sharing
    it concurrently (other streams) would leave `out` unmerged.
    Raises ValueError for head counts, head sizes or cache layouts the kernels do not handle."""
    triton, split_kern, merge_kern, shared_kern = _attention_kernels()
    r, nh, d = q.shape
    nkv = k_cache.shape[1]
    g = nh // nkv
    if (nh % nkv or d < 16 or d & (d - 1) or k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride()
            or k_cache.stride(3) != 1 or k_cache.stride(2) != d or not 0 < attn_len <= k_cache.shape[2]):
        raise ValueError(f"decode_attention needs q [R, nh, D] with nh a multiple of the KV heads, D a power of two "
                         f"≥ 16, k/v caches of one contiguous [R, nkv, capacity, D] layout and 0 < attn_len ≤ "
                         f"capacity; got q {tuple(q.shape)}, k {tuple(k_cache.shape)} strides {k_cache.stride()}, "
                         f"v strides {v_cache.stride()}, attn_len {attn_len}")
    if rot and (d > 256 or (nh * d) % 256):
        raise ValueError(f"decode_attention(rot=True) rotates 256-wide groups of the output; heads × head size is "
                         f"{nh} × {d}")
    if sms is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 16
    if not 0 <= shared < attn_len:
        raise ValueError(f"decode_attention: the shared prefix must be shorter than the attention length "
                         f"{attn_len}; got {shared}")
    ieee = q.dtype == torch.float32
    p = shared if r > 1 else 0
    qp = max(16, triton.next_power_of_2(r * g))
    cfg = cfg or ATTN_CONFIG
    from .gemv import shared_limit
    limit = shared_limit(q.device)
    if limit:
        cfg = fit_attention(cfg, d, qp if p else max(16, triton.next_power_of_2(g)), q.element_size(), limit)
    bl = cfg.bl
    q = q.contiguous()

    def plan(length: int, programs_per_split: int) -> tuple[int, int]:  # (chunk, splits) for ~per_sm programs/SM
        target = max(1, min(128, (cfg.per_sm * sms) // max(1, programs_per_split)))
        chunk = max(bl, triton.cdiv(triton.cdiv(length, target), bl) * bl)
        return chunk, triton.cdiv(length, chunk)

    nvidia = q.is_cuda and torch.version.hip is None  # the fence is NVIDIA PTX; ROCm keeps the merge kernel
    mergeable = (counters is not None and g & (g - 1) == 0 and (not rot or g * d == 256)
                 and (nvidia or not q.is_cuda))
    chunk_p, sp_p = plan(p, nkv) if p else (0, 0)
    chunk, sp_s = plan(attn_len - p, r * nkv)
    if mergeable and p and sp_p + sp_s > MERGE_MAX_SPLITS and sp_s < MERGE_MAX_SPLITS:
        # fewer, longer prefix splits, so that the split kernel's last program merges them all: no merge kernel
        chunk_p = max(bl, triton.cdiv(triton.cdiv(p, MERGE_MAX_SPLITS - sp_s), bl) * bl)
        sp_p = triton.cdiv(p, chunk_p)
    splits = sp_p + sp_s
    m = torch.empty(r, nkv, splits, g, dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    o = torch.empty(r, nkv, splits, g, d, dtype=torch.float32, device=q.device)
    if p:
        shared_kern[(nkv, sp_p)](q, k_cache, v_cache, m, l, o, k_cache.stride(1), scale, chunk_p, p, r, splits,
                                 NKV=nkv, G=g, QP=qp, D=d, BL=bl, IEEE=ieee, **_pdl(q),
                                 num_warps=min(32, max(cfg.warps, qp // 8)), num_stages=cfg.stages)
    out = torch.empty(r, nh * d, dtype=q.dtype, device=q.device)
    pack = _new_pack(r, nh * d, q.device, rot, quant)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    merge = mergeable and triton.next_power_of_2(splits) <= MERGE_MAX_SPLITS
    if merge and (counters.dtype != torch.int32 or counters.numel() < r * nkv or counters.device != q.device):
        raise ValueError(f"decode_attention: counters must be int32 with ≥ {r * nkv} zeros on {q.device}; got "
                         f"{counters.dtype} [{counters.numel()}] on {counters.device}")
    extra = (dict(cnt_ptr=counters, out_ptr=out, MERGE=True, SP=triton.next_power_of_2(splits), ROT=rot,
                  FENCE=nvidia and not interpreted, **_pack_args(pack, "qs_ptr", "q8_ptr")) if merge else {})
    split_kern[(r, nkv, sp_s)](q, k_cache, v_cache, pos, m, l, o, k_cache.stride(0), k_cache.stride(1), scale,
                               chunk, attn_len, p, sp_p, splits, NKV=nkv, G=g, GP=max(16, triton.next_power_of_2(g)),
                               D=d, BL=bl, IEEE=ieee, **_pdl(q), **extra, num_warps=cfg.warps, num_stages=cfg.stages)
    if not merge:
        hg = 256 // d if rot else 1
        merge_kern[(r, nh // hg)](m, l, o, out, splits, NKV=nkv, G=g, D=d, SP=triton.next_power_of_2(splits), HG=hg,
                                  ROT=rot, **_pdl(q), **_pack_args(pack, "qs_ptr", "q8_ptr"))
    return (out, pack) if quant else out


@functools.lru_cache(maxsize=1)
def _snake_kernel():
    if _kernels() is None:
        return None
    triton, tl = _kernels()[0], __import__("triton.language", fromlist=["x"])

    @triton.jit
    def snake_kernel(x_ptr, inv_ptr, alpha_ptr, y_ptr, C, T, bias_ptr=None, res_ptr=None, pre_ptr=None,
                     BLOCK: tl.constexpr = 1024, HAS_BIAS: tl.constexpr = False, HAS_RES: tl.constexpr = False,
                     KEEP: tl.constexpr = False):
        # pre = res + (x + bias[ch]) (each term optional, fp32, in that order), stored to pre_ptr with KEEP;
        # y = pre + inv[ch]·sin²(pre·alpha[ch])
        row = tl.program_id(0)  # = batch · C + channel
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = offs < T
        ch = row % C
        a = tl.load(alpha_ptr + ch)
        inv = tl.load(inv_ptr + ch)
        x = tl.load(x_ptr + row * T + offs, mask=m, other=0.0)
        if HAS_BIAS:
            x = x + tl.load(bias_ptr + ch)
        if HAS_RES:
            x = tl.load(res_ptr + row * T + offs, mask=m, other=0.0) + x
        if KEEP:
            tl.store(pre_ptr + row * T + offs, x, mask=m)
        s = tl.sin(x * a)
        tl.store(y_ptr + row * T + offs, x + inv * (s * s), mask=m)

    return triton, snake_kernel


def snake(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor, bias: torch.Tensor | None = None,
          residual: torch.Tensor | None = None, keep: bool = False):
    """SnakeBeta on x [B, C, T] fp32 in one pass: x + sin²(x·e^α) / (e^β + 1e-9) (same op order as the reference:
    the reciprocal per channel, then multiplied by the squared sine, then added).

    Folded inputs (the VAE's bias folding, `vae._Decoder.forward_folded`): the snake's input is pre = residual +
    (x + bias[c]) — a convolution's output without its bias, the bias [C], and the residual branch [B, C, T] — added
    in fp32 in the order PyTorch adds a cuDNN convolution's bias (a separate add) and then the residual, so the
    result equals bias-add, residual-add and snake as separate kernels bit for bit. `keep`: pre is needed again (a
    residual unit's input) and is written over x (x is modified in place; a non-contiguous x is copied first);
    returns (pre, y) then, else y."""
    triton, kern = _snake_kernel()
    x = x.contiguous()
    b, c, t = x.shape
    inv = 1.0 / (torch.exp(log_beta.float()) + 1e-9)
    alpha = torch.exp(log_alpha.float())
    if residual is not None:
        residual = residual.contiguous()
        if residual.shape != x.shape:
            raise ValueError(f"snake: residual {list(residual.shape)} does not match x {list(x.shape)}")
    y = torch.empty_like(x)
    block = 1024
    kern[(b * c, triton.cdiv(t, block))](x, inv, alpha, y, c, t, bias, residual, x if keep else None, BLOCK=block,
                                         HAS_BIAS=bias is not None, HAS_RES=residual is not None, KEEP=keep)
    return (x, y) if keep else y
