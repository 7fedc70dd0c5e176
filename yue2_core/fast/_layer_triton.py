"""Triton code of the one-launch decoder layer (`fast.persistent`): a whole Qwen3 layer of the decode step for R ≤ 16
rows in one kernel of one program per multiprocessor, its five phases separated by grid barriers (atomic counters in
global memory). Imported only when Triton imports (see `fast.triton_modules`).

Phases (every program takes every NP-th work item of a phase; "all" = every program computes it redundantly):
  0  all: x + delta → RMSNorm (→ ·H for int8) into the program's scratch;  qkv_proj tiles          → qkv [R, QKV]
  1  (row, kv head, split): QK-norm + RoPE of its query heads (and of the new k, stored with v into the cache by the
     split holding the position); flash-decoding over its chunk; the last split of a (row, kv head) merges
     (→ ·H for int8)                                                                                → att [R, NH·D]
  2  o_proj tiles                                                                                   → o [R, HID]
  3  all: x + o → RMSNorm (→ ·H); paired gate/up tiles with SiLU·up in the epilogue                → act [R, F]
  4  all: act (→ ·H) into the scratch; down_proj tiles                                              → delta [R, HID]
The rounding points are those of `_decode_triton`'s kernels (the reference's bf16 order).

With SYNC the phases PH_LO..PH_HI run in one launch and a barrier separates them: every program must be resident at
once (grid ≤ multiprocessors; `persistent.LayerKernel` launches one per SM). Without SYNC the host launches one phase
at a time (the "phased" mode: Triton's CPU interpreter, which runs programs one after another, and a fallback).
"""
import triton
import triton.language as tl

from ._decode_triton import arrive, attend_chunk, depart, rot_rows

SPIN_LIMIT = tl.constexpr(1 << 22)  # polls of a barrier before giving up (err flag set; ~seconds): never reached
# when every program is resident


@triton.jit
def grid_sync(bar_ptr, idx, err_ptr, FENCE: tl.constexpr, POLL: tl.constexpr):
    # every program of the grid arrives at counter idx and waits until all have arrived; then the other programs'
    # stores are visible (read them with ".cg", past L1). POLL = 1 (CUDA): thread 0 alone fences, counts itself
    # (red.release) and polls (ld.acquire) in PTX between two block barriers — the cooperative-groups grid sync;
    # POLL = 0: `arrive`, then every thread polls with volatile loads (counted: err flag after SPIN_LIMIT polls)
    n = tl.num_programs(0)
    tl.debug_barrier()
    if POLL:
        tl.inline_asm_elementwise(
            """{
            .reg .pred %p_skip, %p_wait;
            .reg .u32 %r_tid, %r_cnt;
            mov.u32 %r_tid, %tid.x;
            setp.ne.u32 %p_skip, %r_tid, 0;
            @%p_skip bra DONE${:uid};
            fence.acq_rel.gpu;
            red.release.gpu.global.add.u32 [$1], 1;
            SPIN${:uid}:
            ld.acquire.gpu.global.u32 %r_cnt, [$1];
            setp.lt.u32 %p_wait, %r_cnt, $2;
            @%p_wait bra SPIN${:uid};
            fence.acq_rel.gpu;
            DONE${:uid}:
            mov.u32 $0, 0;
            }""", "=r,l,r", [bar_ptr + idx, n], dtype=tl.int32, is_pure=False, pack=1)
    else:
        arrive(bar_ptr + idx, FENCE)
        c = tl.load(bar_ptr + idx, volatile=True)
        spins = 0
        while (c < n) & (spins < SPIN_LIMIT):
            c = tl.load(bar_ptr + idx, volatile=True)
            spins += 1
        if spins >= SPIN_LIMIT:
            tl.atomic_or(err_ptr, 1)
        if FENCE:
            tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                      is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def _norm_to_scratch(x_ptr, d_ptr, has_d, w_ptr, xo_ptr, scr_ptr, R, eps, store_x,
                     RB: tl.constexpr, HID: tl.constexpr, INT8: tl.constexpr, CG: tl.constexpr):
    # rows [R] of x (+ bf16 delta) → (x · bf16(rsqrt(mean x² + eps))) · w (bf16 rounding as add_rmsnorm_kernel),
    # rotated per 256-group for int8 (all groups of all rows in one `rot_rows`), into scr [R, HID]; store_x: the
    # summed x into xo. Rows are held as RB·GR groups of 256 (HID / 256 = GR a power of two)
    GR: tl.constexpr = HID // 256
    i = tl.arange(0, RB * GR)
    row = i // GR
    c = tl.arange(0, 256)
    r_ok = (row < R)[:, None]
    off = row[:, None] * HID + (i % GR)[:, None] * 256 + c[None, :]
    dt = scr_ptr.dtype.element_ty
    x = tl.load(x_ptr + off, mask=r_ok, other=0.0, cache_modifier=".cg" if CG else "")
    if has_d:
        dd = tl.load(d_ptr + off, mask=r_ok, other=0.0, cache_modifier=".cg" if CG else "")
        x = (x.to(tl.float32) + dd.to(tl.float32)).to(dt)
        if store_x:
            tl.store(xo_ptr + off, x, mask=r_ok)
    xf = x.to(tl.float32)
    ss = tl.sum(tl.reshape(tl.sum(xf * xf, axis=1), (RB, GR)), axis=1)  # [RB]
    r = (1.0 / tl.sqrt(ss / HID + eps)).to(dt).to(tl.float32)
    r = tl.reshape(tl.broadcast_to(r[:, None], (RB, GR)), (RB * GR,))[:, None]
    w = tl.load(w_ptr + (i % GR)[:, None] * 256 + c[None, :]).to(tl.float32)
    y = ((xf * r).to(dt).to(tl.float32) * w).to(dt)
    if INT8:
        y = rot_rows(y.to(tl.float32), RB * GR).to(dt)
    tl.store(scr_ptr + off, y, mask=r_ok)
    tl.debug_barrier()  # the scratch, written by this program's threads, read by all of them next


@triton.jit
def _rotate_to_scratch(a_ptr, scr_ptr, R, RB: tl.constexpr, F: tl.constexpr, AG: tl.constexpr,
                       INT8: tl.constexpr):
    # act [R, F] (other programs wrote it: ".cg") → scr [R, F], rotated per 256-group for int8, AG groups of every
    # row per `rot_rows` (F / 256 a multiple of AG, a power of two)
    i = tl.arange(0, RB * AG)
    row = i // AG
    c = tl.arange(0, 256)
    r_ok = (row < R)[:, None]
    for g0 in tl.static_range(0, F // 256, AG):
        off = row[:, None] * F + (g0 + i % AG)[:, None] * 256 + c[None, :]
        a = tl.load(a_ptr + off, mask=r_ok, other=0.0, cache_modifier=".cg")
        if INT8:
            a = rot_rows(a.to(tl.float32), RB * AG).to(a.dtype)
        tl.store(scr_ptr + off, a, mask=r_ok)
    tl.debug_barrier()


@triton.jit
def _gemv_tiles(x_ptr, w_ptr, s_ptr, out_ptr, R, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, ST: tl.constexpr, INT8: tl.constexpr, CG: tl.constexpr, FLAT: tl.constexpr):
    # out[r, n] = Σ_k x[r, k] · w[n, k] (· s[n] for int8 codes), the N/BN tiles dealt round-robin to the programs;
    # x [R, K] (the rows padded to one 16-row tensor-core tile), rounded to out's dtype. FLAT: one loop over
    # (tile, K step) pairs, so the load pipeline runs across this program's tiles without refilling
    pid = tl.program_id(0)
    npr = tl.num_programs(0)
    m = tl.arange(0, 16)
    m_ok = m < R
    kb = tl.arange(0, BK)
    if FLAT:
        KT: tl.constexpr = K // BK
        mine = (N // BN - pid + npr - 1) // npr
        acc = tl.zeros((16, BN), dtype=tl.float32)
        for i in tl.range(0, mine * KT, num_stages=ST):
            t = pid + (i // KT) * npr
            k0 = (i % KT) * BK
            n = t * BN + tl.arange(0, BN)
            x = tl.load(x_ptr + m[:, None] * K + k0 + kb[None, :], mask=m_ok[:, None], other=0.0,
                        cache_modifier=".cg" if CG else "")
            w = tl.load(w_ptr + n[:, None] * K + k0 + kb[None, :])
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
            if i % KT == KT - 1:
                y = acc
                if INT8:
                    y = y * tl.load(s_ptr + n).to(tl.float32)[None, :]
                tl.store(out_ptr + m[:, None] * N + n[None, :], y.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])
                acc = tl.zeros((16, BN), dtype=tl.float32)
    else:
        for t in range(pid, N // BN, npr):
            n = t * BN + tl.arange(0, BN)
            acc = tl.zeros((16, BN), dtype=tl.float32)
            for k0 in tl.range(0, K, BK, num_stages=ST):
                x = tl.load(x_ptr + m[:, None] * K + k0 + kb[None, :], mask=m_ok[:, None], other=0.0,
                            cache_modifier=".cg" if CG else "")
                w = tl.load(w_ptr + n[:, None] * K + k0 + kb[None, :])
                acc += tl.dot(x, tl.trans(w.to(x.dtype)))
            if INT8:
                acc = acc * tl.load(s_ptr + n).to(tl.float32)[None, :]
            tl.store(out_ptr + m[:, None] * N + n[None, :], acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


@triton.jit
def _silu_up(ag, au, s_ptr, n, F: tl.constexpr, INT8: tl.constexpr, dt: tl.constexpr):
    if INT8:
        ag = ag * tl.load(s_ptr + n).to(tl.float32)[None, :]
        au = au * tl.load(s_ptr + F + n).to(tl.float32)[None, :]
    g = ag.to(dt).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    return (s * au.to(dt).to(tl.float32)).to(dt)


@triton.jit
def _gate_up_tiles(x_ptr, w_ptr, s_ptr, act_ptr, R, F: tl.constexpr, K: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, ST: tl.constexpr, INT8: tl.constexpr, FLAT: tl.constexpr):
    # gate rows [t·BN, +BN) and the matching up rows F + [t·BN, +BN) of gate‖up [2F, K] in one tile;
    # act = bf16(bf16(silu(bf16 gate)) · bf16 up) (silu_mul_kernel's rounding). FLAT as in _gemv_tiles
    pid = tl.program_id(0)
    npr = tl.num_programs(0)
    m = tl.arange(0, 16)
    m_ok = m < R
    kb = tl.arange(0, BK)
    dt = act_ptr.dtype.element_ty
    if FLAT:
        KT: tl.constexpr = K // BK
        mine = (F // BN - pid + npr - 1) // npr
        ag = tl.zeros((16, BN), dtype=tl.float32)
        au = tl.zeros((16, BN), dtype=tl.float32)
        for i in tl.range(0, mine * KT, num_stages=ST):
            t = pid + (i // KT) * npr
            k0 = (i % KT) * BK
            n = t * BN + tl.arange(0, BN)
            x = tl.load(x_ptr + m[:, None] * K + k0 + kb[None, :], mask=m_ok[:, None], other=0.0)
            wg = tl.load(w_ptr + n[:, None] * K + k0 + kb[None, :])
            wu = tl.load(w_ptr + (F + n[:, None]) * K + k0 + kb[None, :])
            ag += tl.dot(x, tl.trans(wg.to(x.dtype)))
            au += tl.dot(x, tl.trans(wu.to(x.dtype)))
            if i % KT == KT - 1:
                tl.store(act_ptr + m[:, None] * F + n[None, :], _silu_up(ag, au, s_ptr, n, F, INT8, dt),
                         mask=m_ok[:, None])
                ag = tl.zeros((16, BN), dtype=tl.float32)
                au = tl.zeros((16, BN), dtype=tl.float32)
    else:
        for t in range(pid, F // BN, npr):
            n = t * BN + tl.arange(0, BN)
            ag = tl.zeros((16, BN), dtype=tl.float32)
            au = tl.zeros((16, BN), dtype=tl.float32)
            for k0 in tl.range(0, K, BK, num_stages=ST):
                x = tl.load(x_ptr + m[:, None] * K + k0 + kb[None, :], mask=m_ok[:, None], other=0.0)
                wg = tl.load(w_ptr + n[:, None] * K + k0 + kb[None, :])
                wu = tl.load(w_ptr + (F + n[:, None]) * K + k0 + kb[None, :])
                ag += tl.dot(x, tl.trans(wg.to(x.dtype)))
                au += tl.dot(x, tl.trans(wu.to(x.dtype)))
            tl.store(act_ptr + m[:, None] * F + n[None, :], _silu_up(ag, au, s_ptr, n, F, INT8, dt),
                     mask=m_ok[:, None])


@triton.jit
def _rope_heads(qkv_ptr, row, h0, nw_ptr, cos_ptr, sin_ptr, eps, HP: tl.constexpr, NHEADS: tl.constexpr,
                QKV: tl.constexpr, D: tl.constexpr, dt: tl.constexpr):
    # heads h0 + [0, NHEADS) (HP ≥ NHEADS rows, the rest zero) of row `row` of qkv [R, QKV]: QK-norm and split-half
    # RoPE with qk_rope_kernel's rounding; returns the two halves [HP, D/2] in dt
    hi = tl.arange(0, HP)
    half = tl.arange(0, D // 2)
    ok = (hi < NHEADS)[:, None]
    off = row * QKV + (h0 + hi[:, None]) * D + half[None, :]
    f1 = tl.load(qkv_ptr + off, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    f2 = tl.load(qkv_ptr + off + D // 2, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    rr = (1.0 / tl.sqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / D + eps)).to(dt).to(tl.float32)
    w1 = tl.load(nw_ptr + half).to(tl.float32)[None, :]
    w2 = tl.load(nw_ptr + D // 2 + half).to(tl.float32)[None, :]
    n1 = ((f1 * rr[:, None]).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
    n2 = ((f2 * rr[:, None]).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
    c = tl.load(cos_ptr + row * (D // 2) + half).to(dt).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + row * (D // 2) + half).to(dt).to(tl.float32)[None, :]
    o1 = ((n1 * c).to(dt).to(tl.float32) - (n2 * s).to(dt).to(tl.float32)).to(dt)
    o2 = ((n2 * c).to(dt).to(tl.float32) + (n1 * s).to(dt).to(tl.float32)).to(dt)
    return o1, o2


@triton.jit
def _attention(qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, kc_ptr, vc_ptr, cache_row, cache_head,
               scr_ptr, m_ptr, l_ptr, o_ptr, cnt_ptr, att_ptr, R, eps, scale, CHUNK, SPLITS, L,
               NH: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, SP: tl.constexpr, BL: tl.constexpr,
               INT8: tl.constexpr, FENCE: tl.constexpr):
    pid = tl.program_id(0)
    npr = tl.num_programs(0)
    G: tl.constexpr = NH // NKV
    GP: tl.constexpr = 16 if G < 16 else G
    QKV: tl.constexpr = (NH + 2 * NKV) * D
    dt = att_ptr.dtype.element_ty
    gi = tl.arange(0, GP)
    d = tl.arange(0, D)
    half = tl.arange(0, D // 2)
    for it in range(pid, R * NKV * SPLITS, npr):
        r = it // (NKV * SPLITS)
        kvh = (it // SPLITS) % NKV
        sp = it % SPLITS
        pos = tl.minimum(tl.load(pos_ptr + r), L - 1)
        q1, q2 = _rope_heads(qkv_ptr, r, kvh * G, qn_ptr, cos_ptr, sin_ptr, eps, GP, G, QKV, D, dt)
        qs = scr_ptr + gi[:, None] * D + half[None, :]  # the query tile through this program's scratch
        tl.store(qs, q1)
        tl.store(qs + D // 2, q2)
        start = sp * CHUNK
        base = r * cache_row + kvh * cache_head
        if (pos >= start) & (pos < start + CHUNK):  # this split holds the new position: k (normed, rotated), v
            k1, k2 = _rope_heads(qkv_ptr, r, NH + kvh, kn_ptr, cos_ptr, sin_ptr, eps, 1, 1, QKV, D, dt)
            dst = base + pos * D + half[None, :]
            tl.store(kc_ptr + dst, k1)
            tl.store(kc_ptr + dst + D // 2, k2)
            voff = r * QKV + (NH + NKV + kvh) * D + d
            tl.store(vc_ptr + base + pos * D + d, tl.load(qkv_ptr + voff, cache_modifier=".cg"))
        tl.debug_barrier()
        q = tl.load(scr_ptr + gi[:, None] * D + d[None, :])
        m_i, l_i, acc = attend_chunk(q, kc_ptr, vc_ptr, base, start, CHUNK, pos, scale, GP, D, BL, False)
        slot = ((r * NKV + kvh) * SPLITS + sp) * G + gi
        tl.store(m_ptr + slot, m_i, mask=gi < G)
        tl.store(l_ptr + slot, l_i, mask=gi < G)
        tl.store(o_ptr + slot[:, None] * D + d[None, :], acc, mask=gi[:, None] < G)
        if arrive(cnt_ptr + r * NKV + kvh, FENCE) == SPLITS - 1:  # the last split of (r, kvh) merges
            tl.debug_barrier()
            si = tl.arange(0, SP)
            g = tl.arange(0, G)
            ms = ((r * NKV + kvh) * SPLITS + si[:, None]) * G + g[None, :]  # [SP, G]
            ok = (si < SPLITS)[:, None]
            mm = tl.load(m_ptr + ms, mask=ok, other=float("-inf"), cache_modifier=".cg")
            ll = tl.load(l_ptr + ms, mask=ok, other=0.0, cache_modifier=".cg")
            oo = tl.load(o_ptr + ms[:, :, None] * D + d[None, None, :], mask=ok[:, :, None], other=0.0,
                         cache_modifier=".cg")
            top = tl.max(mm, 0)
            w = tl.where(mm == float("-inf"), 0.0, tl.exp(mm - top[None, :]))
            out = tl.sum(oo * w[:, :, None], 0) / tl.sum(ll * w, 0)[:, None]  # [G, D]
            if INT8:  # the G heads are one 256-group of the o_proj input: rounded, then rotated
                out = tl.reshape(rot_rows(tl.reshape(out.to(dt).to(tl.float32), (1, G * D)), 1), (G, D))
            tl.store(att_ptr + (r * NH + kvh * G + g[:, None]) * D + d[None, :], out.to(dt))
            depart(cnt_ptr, r * NKV + kvh)
        tl.debug_barrier()  # the scratch's query tile is rewritten by the next item


@triton.jit(do_not_specialize=["CHUNK", "SPLITS", "L", "has_d"])
def layer_kernel(xin_ptr, d_ptr, xm_ptr, xout_ptr, ln1_ptr, ln2_ptr, qn_ptr, kn_ptr,
                 wqkv_ptr, sqkv_ptr, wo_ptr, so_ptr, wgu_ptr, sgu_ptr, wd_ptr, sd_ptr,
                 cos_ptr, sin_ptr, pos_ptr, kc_ptr, vc_ptr, cache_row, cache_head,
                 scr_ptr, qkv_ptr, m_ptr, l_ptr, o_ptr, cnt_ptr, att_ptr, ob_ptr, act_ptr, dout_ptr,
                 bar_ptr, reset_ptr, err_ptr, has_d, eps, scale, CHUNK, SPLITS, L,
                 R: tl.constexpr, RB: tl.constexpr, HID: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr,
                 D: tl.constexpr, F: tl.constexpr, INT8: tl.constexpr, SP: tl.constexpr, BL: tl.constexpr,
                 BN_QKV: tl.constexpr, BK_QKV: tl.constexpr, ST_QKV: tl.constexpr,
                 BN_O: tl.constexpr, BK_O: tl.constexpr, ST_O: tl.constexpr,
                 BN_GU: tl.constexpr, BK_GU: tl.constexpr, ST_GU: tl.constexpr,
                 BN_D: tl.constexpr, BK_D: tl.constexpr, ST_D: tl.constexpr, AG: tl.constexpr,
                 FLAT: tl.constexpr, SCR: tl.constexpr, PH_LO: tl.constexpr, PH_HI: tl.constexpr,
                 SYNC: tl.constexpr, FENCE: tl.constexpr, POLL: tl.constexpr):
    # one decoder layer for R rows (see the module docstring). x: xin [R, HID] (+ d, the previous layer's down_proj
    # output, when has_d) → xm (written when has_d; else xm is xin) → xout = xm + o_proj; dout = down_proj.
    # scr: per-program scratch of SCR ≥ max(R·max(F, HID), 16·D) elements. bar/reset: 4 barrier counters each (SYNC: this launch
    # counts in bar and zeroes reset, the other layer parity's, which no program of this launch uses).
    pid = tl.program_id(0)
    QKV: tl.constexpr = (NH + 2 * NKV) * D
    scr = scr_ptr + pid * SCR
    if SYNC:
        if pid == 0:
            for i in tl.static_range(4):
                tl.store(reset_ptr + i, 0)
    if PH_LO <= 0:
        if 0 <= PH_HI:
            _norm_to_scratch(xin_ptr, d_ptr, has_d, ln1_ptr, xm_ptr, scr, R, eps, pid == 0, RB, HID, INT8, False)
            _gemv_tiles(scr, wqkv_ptr, sqkv_ptr, qkv_ptr, R, QKV, HID, BN_QKV, BK_QKV, ST_QKV, INT8, False, FLAT)
    if SYNC:
        if PH_LO <= 0:
            if 1 <= PH_HI:
                grid_sync(bar_ptr, 0, err_ptr, FENCE, POLL)
    if PH_LO <= 1:
        if 1 <= PH_HI:
            _attention(qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, kc_ptr, vc_ptr, cache_row, cache_head,
                       scr, m_ptr, l_ptr, o_ptr, cnt_ptr, att_ptr, R, eps, scale, CHUNK, SPLITS, L,
                       NH, NKV, D, SP, BL, INT8, FENCE)
    if SYNC:
        if PH_LO <= 1:
            if 2 <= PH_HI:
                grid_sync(bar_ptr, 1, err_ptr, FENCE, POLL)
    if PH_LO <= 2:
        if 2 <= PH_HI:
            _gemv_tiles(att_ptr, wo_ptr, so_ptr, ob_ptr, R, HID, NH * D, BN_O, BK_O, ST_O, INT8, True, FLAT)
    if SYNC:
        if PH_LO <= 2:
            if 3 <= PH_HI:
                grid_sync(bar_ptr, 2, err_ptr, FENCE, POLL)
    if PH_LO <= 3:
        if 3 <= PH_HI:
            _norm_to_scratch(xm_ptr, ob_ptr, True, ln2_ptr, xout_ptr, scr, R, eps, pid == 0, RB, HID, INT8, True)
            _gate_up_tiles(scr, wgu_ptr, sgu_ptr, act_ptr, R, F, HID, BN_GU, BK_GU, ST_GU, INT8, FLAT)
    if SYNC:
        if PH_LO <= 3:
            if 4 <= PH_HI:
                grid_sync(bar_ptr, 3, err_ptr, FENCE, POLL)
    if PH_LO <= 4:
        if 4 <= PH_HI:
            _rotate_to_scratch(act_ptr, scr, R, RB, F, AG, INT8)
            _gemv_tiles(scr, wd_ptr, sd_ptr, dout_ptr, R, HID, F, BN_D, BK_D, ST_D, INT8, False, FLAT)
