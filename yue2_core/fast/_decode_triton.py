"""Triton kernels of the decode step: the split-K GEMV, reduction and rotation of `fast.gemv`, and the
add+RMSNorm, QK-norm+RoPE+KV store and SiLU·up kernels of `fast.fused` that consume its partial sums; all start with
the programmatic-dependent-launch prologue. Shared jit helpers: `rot_rows` (the ConvRot Hadamard on 256-wide rows)
and `attend_chunk` (the online-softmax loop of the decode-attention kernels in `fast.fused`). Imported only when
Triton imports (see `fast.triton_modules`)."""
import triton
import triton.language as tl

try:  # grid dependency control (programmatic dependent launch, Hopper+); see `fast.pdl_enabled`
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # older Triton: kernels are always launched with PDL=False
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    # With programmatic dependent launch, this grid may start while the previous kernel still runs: wait for it
    # (its writes become visible) before touching memory, then let the next kernel launch early in turn.
    # The wait must stay the first thing every PDL kernel does: no load or store may move above it. That is what
    # makes reading data of kernels further back safe (each earlier kernel finished before its successor's wait
    # returned) and what makes buffer reuse by the CUDA-graph allocator safe (no early write over a buffer the
    # previous kernel still reads). The one exception: PRE of `gemv_kernel` / `gemv_q_kernel` (YUE2_GEMV_PRE) loads
    # the first weight tile before it — weights, which no kernel of a step writes and the allocator never hands out.
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def rot_rows(x, BM: tl.constexpr, LEAN: tl.constexpr = False):
    # x fp32 [BM, 256] → every row times H = H16 ⊗ H16 (H16 = R4 ⊗ R4 / 4, symmetric): with a row viewed as
    # X [16, 16] (index 16a + b), x·H is H16·X·H16 — two 16-wide tensor-core products and two transposes, each
    # in 3-pass tf32 (≈ fp32 accuracy for any fp32 input; H16's ±1/4 are exact).
    # LEAN (x of bf16 values; the W8A8 quantizers, stop 52): fewer passes — X·H16 in one tf32 pass (bf16 values and
    # ±1/4 are exact in tf32, so tf32x3's two other passes add zeros), then (X·H16)·H16 as hi + lo tf32 parts (H16
    # exact: tf32x3's third pass adds zero; lo rounded to 11 of its ≤ 13 significant bits: ≤ 2⁻²⁰ of the value).
    # One H100, a song's 5,373 rows: SiLU·up writing W8A8 codes 0.154–0.172 ms against 0.249 without LEAN, the
    # same codes (bench/w8a8_producers.py)
    i = tl.arange(0, 16)
    a = i[:, None]
    b = i[None, :]
    h = tl.where((a // 4 + b // 4) == 3, -0.25, 0.25) * tl.where((a % 4 + b % 4) == 3, -1.0, 1.0)
    if LEAN:
        y = tl.dot(tl.reshape(x, (BM * 16, 16)), h, input_precision="tf32")
    else:
        y = tl.dot(tl.reshape(x, (BM * 16, 16)), h, input_precision="tf32x3")      # rows (m, a): X·H16
    y = tl.reshape(tl.permute(tl.reshape(y, (BM, 16, 16)), (0, 2, 1)), (BM * 16, 16))  # rows (m, b')
    if LEAN:
        hi = (y.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)  # tf32: 10 mantissa bits
        z = tl.dot(hi, h, tl.dot(y - hi, h, input_precision="tf32"), input_precision="tf32")
    else:
        z = tl.dot(y, h, input_precision="tf32x3")                                  # (H16·X·H16)ᵀ
    return tl.reshape(tl.permute(tl.reshape(z, (BM, 16, 16)), (0, 2, 1)), (BM, 256))


@triton.jit
def _max_keep_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def quant_store(q_ptr, s_ptr, y, row, group, K, NG):
    # y fp32 [256]: one rotated 256-group of activation row `row` → its int8 pair codes (`gemv.QAct`): with
    # s = max|y| / 127, hi = rint(y / s) and lo = rint((y / s − hi) · 254), so y ≈ s · (hi + lo / 254) to within
    # s / 508 (≈ 16 bits of the group's range; bf16 keeps 8 bits of each value). Row 2·row of q [2M, K] gets hi,
    # row 2·row + 1 gets lo, s_ptr[row · NG + group] gets s (fp32). A NaN in the group makes s NaN (the max keeps
    # NaN, which the hardware's plain max drops), so the products — and the logits' NaN check — see it as the
    # bf16 activation would (the codes themselves are finite)
    a = tl.reduce(tl.abs(y), 0, _max_keep_nan)
    inv = tl.where(a > 0, 127.0 / tl.maximum(a, 1e-30), 0.0)
    t = y * inv
    hi = tl.minimum(tl.maximum(tl.floor(t + 0.5), -127.0), 127.0)
    lo = tl.minimum(tl.maximum(tl.floor((t - hi) * 254.0 + 0.5), -127.0), 127.0)
    offs = group * 256 + tl.arange(0, 256)
    tl.store(q_ptr + (2 * row) * K + offs, hi.to(tl.int8))
    tl.store(q_ptr + (2 * row + 1) * K + offs, lo.to(tl.int8))
    tl.store(s_ptr + row * NG + group, a / 127.0)


@triton.jit
def attend_chunk(q, k_ptr, v_ptr, base, start, CHUNK, last, scale, QN: tl.constexpr, D: tl.constexpr,
                 BL: tl.constexpr, IEEE: tl.constexpr):
    # online softmax of the query tile q [QN, D] against cache positions [start, start + CHUNK) ∩ [0, last] of the
    # [positions, D] block at k_ptr/v_ptr + base (nothing read when start > last); returns the running max m [QN],
    # sum l [QN] and the unnormalised output [QN, D] (fp32), as the decode-attention kernels store them
    d = tl.arange(0, D)
    m_i = tl.full([QN], float("-inf"), tl.float32)
    l_i = tl.zeros([QN], tl.float32)
    acc = tl.zeros([QN, D], tl.float32)
    hi = tl.minimum(CHUNK, last + 1 - start)
    for j in range(0, hi, BL):
        t = start + j + tl.arange(0, BL)
        ok = t <= last
        k = tl.load(k_ptr + base + t[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(ok[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + base + t[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _weights_f32(w, INT8: tl.constexpr):
    # a weight tile in fp32. int8 codes without the int→float conversion instruction (a quarter-rate unit on the
    # CUDA cores): the sign-extended code plus 0x4B000080 is the bit pattern of the float 2²³ + 128 + code (the
    # code sits in the low mantissa bits), so subtracting 2²³ + 128 gives the code exactly
    if INT8:
        return (w.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
    else:
        return w.to(tl.float32)


@triton.jit(do_not_specialize=["M"])
def gemv_kernel(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, KS, stride_xm,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, INT8: tl.constexpr, PARTIAL: tl.constexpr,
                PDL: tl.constexpr = False, DOT: tl.constexpr = True, PRE: tl.constexpr = False):
    # program (n block pid_n, K split pid_k): out[split, m, n] (PARTIAL) or out[m, n] = Σ_{k in split} x[m, k] · w[n, k]
    # (· s[n] for int8 codes; x is already in the rotated basis). DOT: tensor-core tiles (BM = 16 rows, padded);
    # otherwise (BM = 1 or 2 rows) fp32 products on the CUDA cores, summed over K once after the loop — no shared
    # memory round trip of the converted int8 tile and no padded rows. PRE (DOT; YUE2_GEMV_PRE, `gemv.gemv`): the
    # first weight tile loaded before the PDL wait, as `gemv_q_kernel` says; the same sums in the same order
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_kb = tl.arange(0, BK)
    m_ok = offs_m < M
    n_ok = offs_n < N
    k_lo = pid_k * KS
    if PRE:
        tl.static_assert(DOT, "PRE is an option of the tensor-core configurations")
        k_ok0 = (k_lo + offs_kb) < K
        w_first = tl.load(w_ptr + offs_n[:, None] * K + (k_lo + offs_kb)[None, :], mask=n_ok[:, None] & k_ok0[None, :],
                          other=0)
    pdl_prologue(PDL)
    if DOT:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        k_start = k_lo
        if PRE:  # the first tile, peeled: its weights are already here
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k_lo + offs_kb)[None, :],
                        mask=m_ok[:, None] & k_ok0[None, :], other=0.0)
            acc += tl.dot(x, tl.trans(w_first.to(x.dtype)))
            k_start = k_lo + BK
        for k0 in range(k_start, k_lo + KS, BK):
            offs_k = k0 + offs_kb
            k_ok = offs_k < K
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :],
                        other=0.0)
            w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    elif BM == 1:
        acc2 = tl.zeros((BN, BK), dtype=tl.float32)
        for k0 in range(k_lo, k_lo + KS, BK):
            offs_k = k0 + offs_kb
            k_ok = offs_k < K
            x = tl.load(x_ptr + offs_k, mask=k_ok & (M > 0), other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
            acc2 += _weights_f32(w, INT8) * x[None, :]
        acc = tl.reshape(tl.sum(acc2, 1), (1, BN))
    else:
        tl.static_assert(BM <= 2, "CUDA-core GEMV configurations take 1 or 2 rows (gemv.usable)")
        acc3 = tl.zeros((BM, BN, BK), dtype=tl.float32)
        for k0 in range(k_lo, k_lo + KS, BK):
            offs_k = k0 + offs_kb
            k_ok = offs_k < K
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :],
                        other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
            acc3 += x[:, None, :] * _weights_f32(w, INT8)[None, :, :]
        acc = tl.sum(acc3, 2)
    if INT8:
        acc = acc * tl.load(s_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    if PARTIAL:
        tl.store(out_ptr + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :], acc, mask=mask)
    else:
        tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _q_group(acc, xq_ptrs, j_ok, w, sc, k_ok, SWAP: tl.constexpr):
    # one 256-group of `gemv_q_kernel`: the pair codes' int8 × int8 product with the weight tile w [BN, 256], int32
    # (exact), scaled by the group's activation scales sc [16] and added to acc ([BN, 16] with SWAP, else [16, BN])
    xq = tl.load(xq_ptrs, mask=j_ok[:, None] & k_ok[None, :], other=0)
    if SWAP:
        acc += tl.dot(w, tl.trans(xq), out_dtype=tl.int32).to(tl.float32) * sc[None, :]
    else:
        acc += tl.dot(xq, tl.trans(w), out_dtype=tl.int32).to(tl.float32) * sc[:, None]
    return acc


@triton.jit(do_not_specialize=["M"])
def gemv_q_kernel(q_ptr, xs_ptr, w_ptr, s_ptr, out_ptr, M, N, K, KS, BN: tl.constexpr, PARTIAL: tl.constexpr,
                  SWAP: tl.constexpr = False, PDL: tl.constexpr = False, PRE: tl.constexpr = False):
    # int8 ConvRot codes w [N, K] times an activation given as int8 pair codes (`gemv.QAct`: q [2M ≤ 16, K], row
    # 2m = hi and 2m + 1 = lo of row m, scales xs [M, K/256]): per 256-group one int8 × int8 tensor-core product
    # (int32, exact: |Σ| ≤ 256·127² < 2²⁴), scaled in fp32 by the group's s (hi rows) or s/254 (lo rows); the two
    # rows of each m are added at the end, times the weight row scales s_ptr[n]. No weight element is converted.
    # SWAP: the weights are the product's left operand ([BN, 256] · [256, 16]), else its right one. Writes
    # out[split, m, n] fp32 (PARTIAL) or out[m, n] in out's dtype.
    # PRE (YUE2_GEMV_PRE, `gemv.gemv_q`): the program's first weight group is loaded *before* the PDL wait — the
    # weights never depend on the previous kernel (nor does any buffer the CUDA-graph allocator reuses alias them),
    # so a grid made resident early by PDL fetches them while its predecessor finishes; everything else (the pair
    # codes, the scales, every store) stays after the wait. The same sums in the same order as without it.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    j = tl.arange(0, 16)
    j_ok = j < 2 * M
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_ok = offs_n < N
    offs_kb = tl.arange(0, 256)
    k_lo = pid_k * KS
    if PRE:
        k_ok0 = (k_lo + offs_kb) < K
        w_first = tl.load(w_ptr + offs_n[:, None] * K + (k_lo + offs_kb)[None, :], mask=n_ok[:, None] & k_ok0[None, :],
                          other=0)
    pdl_prologue(PDL)
    ng = K // 256
    part = tl.where(j % 2 == 0, 1.0, 1.0 / 254.0)
    if SWAP:
        acc = tl.zeros((BN, 16), dtype=tl.float32)
    else:
        acc = tl.zeros((16, BN), dtype=tl.float32)
    k_start = k_lo
    if PRE:  # the first group, peeled: its weights are already here
        sc = tl.load(xs_ptr + (j // 2) * ng + k_lo // 256, mask=j_ok & (k_lo < K), other=0.0) * part
        acc = _q_group(acc, q_ptr + j[:, None] * K + (k_lo + offs_kb)[None, :], j_ok, w_first, sc, k_ok0, SWAP)
        k_start = k_lo + 256
    for k0 in range(k_start, k_lo + KS, 256):
        offs_k = k0 + offs_kb
        k_ok = offs_k < K
        w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
        sc = tl.load(xs_ptr + (j // 2) * ng + k0 // 256, mask=j_ok & (k0 < K), other=0.0) * part
        acc = _q_group(acc, q_ptr + j[:, None] * K + offs_k[None, :], j_ok, w, sc, k_ok, SWAP)
    if SWAP:
        acc = tl.trans(acc)
    y = tl.sum(tl.reshape(acc, (8, 2, BN)), 1) * tl.load(s_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    offs_m = tl.arange(0, 8)
    mask = (offs_m < M)[:, None] & n_ok[None, :]
    if PARTIAL:
        tl.store(out_ptr + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :], y, mask=mask)
    else:
        tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def reduce_kernel(p_ptr, y_ptr, MN, S: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.load(p_ptr + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, S):
        acc += tl.load(p_ptr + s * MN + offs, mask=ok, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def rotate_kernel(x_ptr, y_ptr, K, BK: tl.constexpr, q_ptr=None, s_ptr=None, QUANT: tl.constexpr = False,
                  PDL: tl.constexpr = False):
    # y = x·H per 256-group, one program per (row, BK block); fp32 maths, rounded to y's dtype. QUANT (BK = 256):
    # the rotated group's int8 pair codes and scale too (`quant_store`)
    pdl_prologue(PDL)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BK + tl.arange(0, BK)
    x = tl.load(x_ptr + row * K + offs, mask=offs < K, other=0.0).to(tl.float32)
    y = tl.reshape(rot_rows(tl.reshape(x, (BK // 256, 256)), BK // 256), (BK,))
    tl.store(y_ptr + row * K + offs, y.to(y_ptr.dtype.element_ty), mask=offs < K)
    if QUANT:
        quant_store(q_ptr, s_ptr, y, row, tl.program_id(1), K, K // 256)


# -- consumers of the products: they take y either as a plain tensor (S = 1) or as S ≥ 2 fp32 partial sums --------

@triton.jit
def _load_sum(ptr, offs, mask, PS, S: tl.constexpr):
    # Σ_{s < S} ptr[s·PS + offs] in fp32 (S = 1: one plain load, any dtype)
    acc = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for s in tl.static_range(1, S):
        acc += tl.load(ptr + s * PS + offs, mask=mask, other=0.0)
    return acc


@triton.jit
def residual_rms(x_ptr, d_ptr, y_ptr, row, offs, m, N, PS, eps, HAS_D: tl.constexpr, S: tl.constexpr):
    # (x, r) of row `row`: x ← x + delta rounded to y's dtype (delta: S partial sums, `_load_sum`), and
    # r = rsqrt(mean x² + eps) rounded to that dtype, as fp32 — the add+RMSNorm roundings every producer shares
    # (this kernel and `_w8a8_triton.add_rmsnorm_quant_kernel`, so their y are the same bits)
    dt = y_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * N + offs, mask=m, other=0.0)
    if HAS_D:
        x = (x.to(tl.float32) + _load_sum(d_ptr, row * N + offs, m, PS, S).to(dt).to(tl.float32)).to(dt)
    xf = x.to(tl.float32)
    return x, (1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)).to(dt).to(tl.float32)


@triton.jit
def add_rmsnorm_kernel(x_ptr, d_ptr, w_ptr, xo_ptr, y_ptr, N, PS, eps, HAS_D: tl.constexpr, S: tl.constexpr,
                       BLOCK: tl.constexpr, ROT: tl.constexpr, PDL: tl.constexpr = False, q_ptr=None, qs_ptr=None,
                       QUANT: tl.constexpr = False):
    # program (row, g): x ← x + bf16(delta); y = (x · bf16(rsqrt(mean x² + eps))) · w, rounded as the reference.
    # ROT: program g writes only the 256-slice g of xo and y, y rotated (·H) for an int8 ConvRot product; QUANT
    # (with ROT): the rotated slice's int8 pair codes too (`quant_store`)
    pdl_prologue(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < N
    dt = y_ptr.dtype.element_ty
    x, r = residual_rms(x_ptr, d_ptr, y_ptr, row, offs, m, N, PS, eps, HAS_D, S)
    xf = x.to(tl.float32)
    if ROT:
        so = tl.program_id(1) * 256 + tl.arange(0, 256)
        xs = tl.load(x_ptr + row * N + so)
        if HAS_D:
            xs = (xs.to(tl.float32) + _load_sum(d_ptr, row * N + so, so < N, PS, S).to(dt).to(tl.float32)).to(dt)
            tl.store(xo_ptr + row * N + so, xs)
        ys = (xs.to(tl.float32) * r).to(dt).to(tl.float32)
        ys = (ys * tl.load(w_ptr + so).to(tl.float32)).to(dt).to(tl.float32)
        yr = tl.reshape(rot_rows(tl.reshape(ys, (1, 256)), 1), (256,))
        tl.store(y_ptr + row * N + so, yr.to(dt))
        if QUANT:
            quant_store(q_ptr, qs_ptr, yr, row, tl.program_id(1), N, N // 256)
    else:
        if HAS_D:
            tl.store(xo_ptr + row * N + offs, x, mask=m)
        y = (xf * r).to(dt).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * N + offs, (y * w).to(dt), mask=m)


@triton.jit(do_not_specialize=["R"])  # R: the NAR's frames + 2, new with every song length
def qk_rope_kernel(qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_ptr, v_ptr,
                   row_stride, cache_row, cache_head, PS, R, NH: tl.constexpr, NKV: tl.constexpr,
                   D: tl.constexpr, eps, S: tl.constexpr, BR: tl.constexpr = 1, PDL: tl.constexpr = False):
    # program (rows [BR·i, BR·i + BR) ∩ [0, R), head h of q‖k‖v): QK-norm + split-half RoPE; k and v stored into the
    # cache at pos[r]. BR = 1 in the decode step (one short program per head); a block of rows for the NAR's
    # thousands of rows (one row per program there spent ~8× the memory time on launching programs)
    pdl_prologue(PDL)
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    h = tl.program_id(1)
    half = tl.arange(0, D // 2)
    r_ok = rows < R
    m = r_ok[:, None] & (half < D)[None, :]
    dt = q_ptr.dtype.element_ty
    off = rows[:, None] * row_stride + h * D + half[None, :]  # [BR, D/2]
    x1 = _load_sum(qkv_ptr, off, m, PS, S).to(dt)
    x2 = _load_sum(qkv_ptr, off + D // 2, m, PS, S).to(dt)
    pos = tl.load(pos_ptr + rows, mask=r_ok, other=0)[:, None]
    if h < NH + NKV:
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        rr = (1.0 / tl.sqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / D + eps)).to(dt)
        rr = rr.to(tl.float32)[:, None]
        if h < NH:
            w1 = tl.load(qn_ptr + half).to(tl.float32)[None, :]
            w2 = tl.load(qn_ptr + D // 2 + half).to(tl.float32)[None, :]
        else:
            w1 = tl.load(kn_ptr + half).to(tl.float32)[None, :]
            w2 = tl.load(kn_ptr + D // 2 + half).to(tl.float32)[None, :]
        n1 = ((f1 * rr).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
        n2 = ((f2 * rr).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
        cs = rows[:, None] * (D // 2) + half[None, :]
        c = tl.load(cos_ptr + cs, mask=m, other=0.0).to(dt).to(tl.float32)
        s = tl.load(sin_ptr + cs, mask=m, other=0.0).to(dt).to(tl.float32)
        o1 = ((n1 * c).to(dt).to(tl.float32) - (n2 * s).to(dt).to(tl.float32)).to(dt)
        o2 = ((n2 * c).to(dt).to(tl.float32) + (n1 * s).to(dt).to(tl.float32)).to(dt)
        if h < NH:
            dst = q_ptr + (rows[:, None] * NH + h) * D + half[None, :]
        else:
            dst = k_ptr + rows[:, None] * cache_row + (h - NH) * cache_head + pos * D + half[None, :]
        tl.store(dst, o1, mask=m)
        tl.store(dst + D // 2, o2, mask=m)
    else:
        dst = v_ptr + rows[:, None] * cache_row + (h - NH - NKV) * cache_head + pos * D + half[None, :]
        tl.store(dst, x1, mask=m)
        tl.store(dst + D // 2, x2, mask=m)


@triton.jit
def silu_mul_kernel(gu_ptr, out_ptr, F, PS, S: tl.constexpr, BLOCK: tl.constexpr, ROT: tl.constexpr,
                    PDL: tl.constexpr = False, q_ptr=None, qs_ptr=None, QUANT: tl.constexpr = False):
    # program (row, block): silu(gate) · up from gate‖up [R, 2F]; ROT (BLOCK % 256 == 0): the block rotated (·H);
    # QUANT (ROT, BLOCK = 256): its int8 pair codes too (`quant_store`)
    pdl_prologue(PDL)
    row = tl.program_id(0)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = col < F
    dt = out_ptr.dtype.element_ty
    g = _load_sum(gu_ptr, row * 2 * F + col, m, PS, S).to(dt)
    u = _load_sum(gu_ptr, row * 2 * F + F + col, m, PS, S).to(dt)
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(dt).to(tl.float32)
    out = (s * u.to(tl.float32)).to(dt)
    if ROT:
        yr = tl.reshape(rot_rows(tl.reshape(out.to(tl.float32), (BLOCK // 256, 256)), BLOCK // 256), (BLOCK,))
        out = yr.to(dt)
        if QUANT:
            quant_store(q_ptr, qs_ptr, yr, row, tl.program_id(1), F, F // 256)
    tl.store(out_ptr + row * F + col, out, mask=m)


# -- counting the programs of one grid: the last program of a group consumes the others' results ----------------
# Every program stores its results, then counts itself in the group's counter (int32, zero before the launch, zero
# again after it): a GPU-scope fence (FENCE) and a barrier order all of the program's stores before the acq_rel
# atomic; the program that counts last acquires every other program's stores and reads them from L2 (".cg").
# Used by `fused.attn_split_kernel` (the last split program of a (row, kv head) merges the splits).

@triton.jit
def arrive(cnt_ptr, FENCE: tl.constexpr):
    # this program's arrival at the counter after its stores; returns the count before it. Every thread's stores
    # happen before the count (barrier), which releases them at GPU scope; the program that counts last acquires
    # everyone's. FENCE (CUDA): every thread also fences its stores at GPU scope first (the CUDA "threadfence
    # reduction" pattern; not in the CPU interpreter)
    if FENCE:
        tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False,
                                  pack=1)
    tl.debug_barrier()
    return tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")


@triton.jit
def depart(cnt_ptr, group):
    # the counting-last program, its consumer done: counter `group` back to zero for the next launch
    tl.store(cnt_ptr + group, 0)
