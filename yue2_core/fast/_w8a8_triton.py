"""Triton kernels of `fast.w8a8` (the W8A8 products of the int8 file's NAR; the arithmetic is described there).
Imported only when Triton imports (`fast.triton_modules`)."""
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ._decode_triton import _max_keep_nan, residual_rms, rot_rows


@triton.jit
def _bf16(x, GPU: tl.constexpr):
    # x fp32 → rounded to bf16 (to nearest, ties to even), returned as fp32. Triton's CPU interpreter (3.8) truncates
    # on a cast, so there the rounding is done on the bits (NaN kept)
    # (if / else, never an early return: Triton's code generator goes on past a return inside a constexpr branch)
    if GPU:
        out = x.to(tl.bfloat16).to(tl.float32)
    else:
        b = x.to(tl.uint32, bitcast=True)
        r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        out = tl.where(x != x, x, r)
    return out


@triton.jit
def _rotated(x, h, GPU: tl.constexpr, KRON: tl.constexpr, BM: tl.constexpr):
    # bf16(x·H) of one [BM, G] tile as fp32 values. KRON (G = 256): H16·X·H16 per row (`rot_rows(LEAN=True)`: two
    # 16-wide tf32 products, ≈ fp32 sums; 8× fewer multiply-adds than the dense product). Otherwise x·H on the
    # tensor cores in bf16 (exact products, fp32 sums); Triton's CPU interpreter multiplies bf16 tiles wrongly
    # (3.8), so there in fp32 (products of bf16 values and H's ±1/16 are exact in fp32 either way)
    if KRON:
        out = _bf16(rot_rows(x.to(tl.float32), BM, LEAN=True), GPU)
    elif GPU:
        out = tl.dot(x, h).to(tl.bfloat16).to(tl.float32)
    else:
        out = _bf16(tl.dot(x.to(tl.float32), h.to(tl.float32)), GPU)
    return out


@triton.jit
def _tile(x_ptr, h_ptr, M, K, BM: tl.constexpr, G: tl.constexpr, LIBDEVICE: tl.constexpr, KRON: tl.constexpr):
    # (rows [BM], in-range mask, bf16(x·H) of this program's [BM, G] tile as fp32): program (i, j) takes rows
    # i·BM… of group j
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    ok = rows < M
    g = tl.arange(0, G)
    if KRON:  # H16 is built in `rot_rows(LEAN=True)`: the dense H (128 KB in bf16) is not loaded
        h = 0.0
    else:
        h = tl.load(h_ptr + g[:, None] * G + g[None, :])
    x = tl.load(x_ptr + rows[:, None] * K + tl.program_id(1) * G + g[None, :], mask=ok[:, None], other=0.0)
    return rows, ok, _rotated(x, h, LIBDEVICE, KRON, BM)


@triton.jit
def _scale_codes(xr, amax, LIBDEVICE: tl.constexpr):
    # xr [BM, C] rotated rows as fp32 bf16 values, amax [BM] their row maxima of |xr| → (row scales a [BM] fp32,
    # codes [BM, C] as fp32 integers in −128…127): a = max(amax / 127, 1e-30), codes = rint(bf16(xr / bf16(a)))
    # (`fast.w8a8`'s docstring). amax / 127 rounded as PyTorch computes it where the kernel runs: on CUDA a division
    # by a scalar is a multiplication by its fp32 reciprocal (ATen's div_true_kernel_cuda; stop 51's first GPU run:
    # with an IEEE division 5–6 % of the row scales were a last bit off `w8a8.reference` on an H100), on the CPU a
    # division. 0.007874015718698502 is fp32(1/127) exactly, so the constant is that float whatever Triton's
    # constant type
    if LIBDEVICE:
        a = amax * 0.007874015718698502
    else:
        a = amax / 127.0
    a = tl.maximum(a, 1e-30)  # NaN stays NaN (maximum with a number returns the number only if
    a = tl.where(amax != amax, amax, a)  # the hardware drops NaN: keep it explicitly)
    ab = _bf16(a, LIBDEVICE)
    if LIBDEVICE:  # bf16 ÷ bf16 in fp32, rounded to nearest (PyTorch's tensor division; Triton's `/` is not IEEE)
        t = libdevice.div_rn(xr, ab[:, None])
    else:
        t = xr / ab[:, None]
    t = _bf16(t, LIBDEVICE)
    t = (t + 12582912.0) - 12582912.0  # round half to even (adding 1.5·2²³; |t| ≤ 128 here)
    t = tl.where(t != t, 0.0, t)  # NaN rows: codes 0, the NaN scale carries it
    return a, tl.minimum(tl.maximum(t, -128.0), 127.0)


@triton.jit(do_not_specialize=["M"])
def group_max_kernel(x_ptr, h_ptr, p_ptr, M, K, G: tl.constexpr, BM: tl.constexpr, LIBDEVICE: tl.constexpr,
                     KRON: tl.constexpr):
    # pass 1 of the quantizer, one program a [BM, G] tile: p [M, K / G] = max over the group of |bf16(x·H)| (NaN
    # kept). Tiles rather than whole rows (stop 51, first GPU run: one program per 32 whole rows, 168 programs for
    # a song's 5,373 rows, took 0.11–0.32 ms a product on an H100)
    rows, ok, xr = _tile(x_ptr, h_ptr, M, K, BM, G, LIBDEVICE, KRON)
    tl.store(p_ptr + rows * (K // G) + tl.program_id(1), tl.reduce(tl.abs(xr), 1, _max_keep_nan), mask=ok)


@triton.jit(do_not_specialize=["M"])
def quantize_kernel(x_ptr, h_ptr, p_ptr, q_ptr, s_ptr, M, K, G: tl.constexpr, NG: tl.constexpr, BM: tl.constexpr,
                    LIBDEVICE: tl.constexpr, KRON: tl.constexpr):
    # pass 2, the same tiles: the row scale from the row's K / G group maxima (NG: that count rounded up to a power
    # of two), then the tile's codes; the programs of group 0 store the scales
    rows, ok, xr = _tile(x_ptr, h_ptr, M, K, BM, G, LIBDEVICE, KRON)
    j = tl.arange(0, NG)
    part = tl.load(p_ptr + rows[:, None] * (K // G) + j[None, :], mask=ok[:, None] & (j[None, :] < K // G),
                   other=0.0)
    a, t = _scale_codes(xr, tl.reduce(part, 1, _max_keep_nan), LIBDEVICE)
    tl.store(s_ptr + rows, a, mask=ok & (tl.program_id(1) == 0))
    g = tl.arange(0, G)
    tl.store(q_ptr + rows[:, None] * K + tl.program_id(1) * G + g[None, :], t.to(tl.int8), mask=ok[:, None])


@triton.jit
def _row_codes(q_ptr, s_ptr, row, y, C: tl.constexpr, N, LIBDEVICE: tl.constexpr, ROT_MODE: tl.constexpr = 0):
    # y fp32 [C] (bf16 values; C a power of two and a multiple of 256, entries from N on zero): one activation row
    # → rotated per 256-group as `quantize_kernel` rotates (H16·X·H16), its row scale and int8 codes stored at
    # s[row] and q[row, :N]. Zero groups past N rotate to zeros and leave the row's maximum alone. ROT_MODE (bench
    # only, bench/w8a8_producers.py): 1 skips the rotation (its cost; wrong codes), 2 rotates by `rot_rows`' tf32x3
    if ROT_MODE == 1:
        xr = _bf16(tl.reshape(y, (C // 256, 256)), LIBDEVICE)
    elif ROT_MODE == 2:
        xr = _bf16(rot_rows(tl.reshape(y, (C // 256, 256)), C // 256), LIBDEVICE)
    else:
        xr = _bf16(rot_rows(tl.reshape(y, (C // 256, 256)), C // 256, LEAN=True), LIBDEVICE)
    xr = tl.reshape(xr, (1, C))
    a, t = _scale_codes(xr, tl.reduce(tl.abs(xr), 1, _max_keep_nan), LIBDEVICE)
    cols = tl.arange(0, C)
    tl.store(q_ptr + row * N + cols, tl.reshape(t, (C,)).to(tl.int8), mask=cols < N)
    tl.store(s_ptr + row + tl.arange(0, 1), a)


@triton.jit
def add_rmsnorm_quant_kernel(x_ptr, d_ptr, w_ptr, xo_ptr, q_ptr, s_ptr, N, eps, HAS_D: tl.constexpr,
                             BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr, ROT_MODE: tl.constexpr = 0):
    # program = one row: x ← x + delta (stored to xo), y = RMSNorm(x)·w with the roundings of
    # `_decode_triton.add_rmsnorm_kernel` (its `residual_rms`, then the same two roundings), then y's W8A8 codes and scale
    # (`_row_codes`) instead of y itself: the quantizer's two reads of y are gone
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < N
    dt = xo_ptr.dtype.element_ty
    x, r = residual_rms(x_ptr, d_ptr, xo_ptr, row, offs, m, N, 0, eps, HAS_D, 1)
    if HAS_D:
        tl.store(xo_ptr + row * N + offs, x, mask=m)
    xf = x.to(tl.float32)
    y = (xf * r).to(dt).to(tl.float32)
    y = (y * tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)).to(dt).to(tl.float32)
    _row_codes(q_ptr, s_ptr, row, y, BLOCK, N, LIBDEVICE, ROT_MODE)


@triton.jit
def silu_mul_quant_kernel(gu_ptr, q_ptr, s_ptr, F, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr,
                          ROT_MODE: tl.constexpr = 0):
    # program = one row of gate‖up [R, 2F]: h = silu(gate)·up with the roundings of `_decode_triton.silu_mul_kernel`,
    # then h's W8A8 codes and scale (`_row_codes`) instead of h itself
    row = tl.program_id(0)
    col = tl.arange(0, BLOCK)
    m = col < F
    dt = gu_ptr.dtype.element_ty
    g = tl.load(gu_ptr + row * 2 * F + col, mask=m, other=0.0).to(tl.float32).to(dt)
    u = tl.load(gu_ptr + row * 2 * F + F + col, mask=m, other=0.0).to(tl.float32).to(dt)
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(dt).to(tl.float32)
    h = (s * u.to(tl.float32)).to(dt).to(tl.float32)
    _row_codes(q_ptr, s_ptr, row, tl.where(m, h, 0.0), BLOCK, F, LIBDEVICE, ROT_MODE)


@triton.jit
def rows_quant_kernel(x_ptr, q_ptr, s_ptr, K, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr):
    # program = one row of x [M, K] (bf16, K ≤ BLOCK, groups of 256): its codes and scale in one read of the row
    # (`quantize_rows` for rows up to 8,192 wide: the o product's input, which FlashAttention writes, stop 52)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * K + cols, mask=cols < K, other=0.0).to(tl.float32)
    _row_codes(q_ptr, s_ptr, row, x, BLOCK, K, LIBDEVICE)


@triton.jit(do_not_specialize=["M", "MB"])
def gemm_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, bias_ptr, c_ptr, M, N, K, MB, HAS_BIAS: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, GPU: tl.constexpr):
    # c [M, N] bf16 = (a [M, K] int8 · b [N, K]ᵀ int8) · (as [M] · bs [N]) (+ bias [N]); MB (M's size class) only
    # keys the autotuner
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    in_group = GROUP_M * num_n  # programs of GROUP_M row blocks sweep the columns together (L2 reuse)
    first_m = (pid // in_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    am = rm % M  # rows past the end read row m − M (their results are never stored): loads without masks
    bn = rn % N
    rk = tl.arange(0, BK)
    a = a_ptr + am[:, None] * K + rk[None, :]
    b = b_ptr + bn[None, :] * K + rk[:, None]
    acc = tl.zeros([BM, BN], tl.int32)
    for _ in range(0, K, BK):  # K is a multiple of BK (the wrapper checks)
        # out_dtype named: Triton 3.6 (the GPU image's) asserts acc's dtype equals out_dtype, whose default is
        # fp32 (stop 51, first GPU run of this kernel); 3.8 infers it from acc
        acc = tl.dot(tl.load(a), tl.load(b), acc, out_dtype=tl.int32)
        a += BK
        b += BK
    sa = tl.load(as_ptr + am)
    sb = tl.load(bs_ptr + bn)
    y = _bf16(acc.to(tl.float32) * (sa[:, None] * sb[None, :]), GPU)
    if HAS_BIAS:
        y = _bf16(y + tl.load(bias_ptr + bn)[None, :].to(tl.float32), GPU)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], y.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))
