"""Triton kernel of the fused sampler (`fast.sampler.sample_fused`): the whole sampling tail of one decode step —
CFG combine, allow-mask, end-token block, windowed repetition penalty, temperature, top-k with ties, top-p, the
exponential race, teacher forcing and the state updates — in one launch instead of ~45 small PyTorch kernels.
Imported only when Triton imports (see `fast.triton_modules`).

One program per song row g (the phase's vocabulary slice, W columns, lives in `scratch[g]` as fp32):

    1. scratch ← float(cfg(logits)) + mask, end column −inf while step < min_tokens        (one pass over W)
    2. repetition penalty on the ≤ 100 ring columns (count per column, α from a host table) (gather/scatter)
    3. scratch ← scratch / T                                                              (one pass, T ≠ 1)
    4. k-th largest value by radix select on order-preserving int keys, 4 digits of 8 bits  (four passes)
    5. entries ≥ that value compacted (at most K = top_k + TIE_PAD), sorted by (value ↓, column ↑) (one pass)
    6. top-p on the sorted candidates, then argmax(p / E) with E the step's Exp(1) draws by rank
    7. forced token, out[g, step], ring slot, done flag, next input tokens

Temperature 0 replaces 3–6 by a first-index argmax. Steps 1–3 write scratch and later steps read it back, so the
program synchronises its threads between them (`tl.debug_barrier`).
"""
import triton
import triton.language as tl

from ._decode_triton import pdl_prologue


@triton.jit
def _key(v):
    # fp32 → int32 whose signed order is the float order (−0.0 canonicalised to +0.0 first)
    b = (v + 0.0).to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


@triton.jit
def sample_kernel(logits_ptr, lrow, mask_ptr, scratch_ptr, cand_ptr, step_ptr, ring_ptr, ringw_ptr, alpha_ptr,
                  noise_ptr, forced_ptr, out_ptr, done_ptr, tok_ptr,
                  W, G, R, cfg, min_tokens, max_tokens, end_col, start, P, temperature, inv_temperature, top_k,
                  top_p, K,
                  CFG: tl.constexpr, PENALTY: tl.constexpr, GREEDY: tl.constexpr, SCALE: tl.constexpr,
                  TOPP: tl.constexpr, RECIP: tl.constexpr, BLOCK: tl.constexpr, PP: tl.constexpr, KP: tl.constexpr,
                  PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    g = tl.program_id(0)
    step = tl.load(step_ptr)
    cols = tl.arange(0, BLOCK)
    row = scratch_ptr + g * W
    ldt = logits_ptr.dtype.element_ty
    block_end = step < min_tokens
    # 1. scores in fp32 (CFG in the logits' dtype, rounding after each op as the PyTorch expression does)
    for c0 in range(0, W, BLOCK):
        c = c0 + cols
        ok = c < W
        x = tl.load(logits_ptr + g * lrow + c, mask=ok, other=0.0)
        if CFG:
            u = tl.load(logits_ptr + (G + g) * lrow + c, mask=ok, other=0.0)
            d = (x.to(tl.float32) - u.to(tl.float32)).to(ldt)
            m = (d.to(tl.float32) * cfg).to(ldt)
            x = (u.to(tl.float32) + m.to(tl.float32)).to(ldt)
        s = x.to(tl.float32) + tl.load(mask_ptr + c, mask=ok, other=0.0)
        s = tl.where((c == end_col) & block_end, float("-inf"), s)
        tl.store(row + c, s, mask=ok)
    tl.debug_barrier()
    # 2. windowed count-exponent penalty: score·α if score < 0 else score/α, α = penalty^count (host table)
    if PENALTY:
        j = tl.arange(0, PP)
        rc = tl.load(ring_ptr + g * P + j, mask=j < P, other=0)
        rw = tl.load(ringw_ptr + g * P + j, mask=j < P, other=0.0)
        same = (rc[:, None] == rc[None, :]) & (j[None, :] < P)
        freq = tl.sum(tl.where(same, rw[None, :], 0.0), axis=1)
        alpha = tl.load(alpha_ptr + freq.to(tl.int32), mask=j < P, other=1.0)
        v = tl.load(row + rc, mask=j < P, other=0.0)
        tl.debug_barrier()  # every slot read its column before any slot writes (slots may share a column)
        v = tl.where(v < 0, v * alpha, tl.math.div_rn(v, alpha))
        tl.store(row + rc, v, mask=(j < P) & (freq > 0))
        tl.debug_barrier()
    if GREEDY:
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        bidx = tl.zeros([BLOCK], tl.int32)  # a row without any finite score still yields a column of the slice
        for c0 in range(0, W, BLOCK):
            c = c0 + cols
            s = tl.load(row + c, mask=c < W, other=float("-inf"))
            better = s > best
            bidx = tl.where(better, c, bidx)
            best = tl.where(better, s, best)
        top = tl.max(best, axis=0)
        col = tl.minimum(tl.min(tl.where(best == top, bidx, 2147483647), axis=0), W - 1)
    else:
        # 3. temperature
        if SCALE:
            for c0 in range(0, W, BLOCK):
                c = c0 + cols
                s = tl.load(row + c, mask=c < W, other=0.0)
                if RECIP:  # what PyTorch's CUDA division by a Python scalar computes: x · fl(1/T)
                    s = s * inv_temperature
                else:
                    s = tl.math.div_rn(s, temperature)
                tl.store(row + c, s, mask=c < W)
            tl.debug_barrier()
        # 4. the top_k-th largest key, one 8-bit digit per pass (most significant first); keys as unsigned
        #    digits: u = key + 2^31, bins 0..255, entries outside the current prefix go to bin 256
        k = tl.minimum(top_k, W)
        prefix = 0  # the chosen digits so far, as u >> shift
        remaining = k
        bins = tl.arange(0, 512)
        for p in tl.static_range(4):
            shift = 24 - 8 * p
            hist = tl.zeros([512], tl.int32)
            for c0 in range(0, W, BLOCK):
                c = c0 + cols
                u = (_key(tl.load(row + c, mask=c < W, other=0.0)).to(tl.int64) + 2147483648)
                inside = (c < W) & ((u >> (shift + 8)) == prefix)
                digit = tl.where(inside, (u >> shift) & 255, 256).to(tl.int32)
                hist += tl.histogram(digit, 512)
            hist = tl.where(bins < 256, hist, 0)
            ge = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist  # entries with digit ≥ bin
            d = tl.max(tl.where((ge >= remaining) & (bins < 256), bins, -1), axis=0)
            above = tl.sum(tl.where(bins > d, hist, 0), axis=0)
            remaining = remaining - above
            prefix = prefix * 256 + d.to(tl.int64)
        thr = (prefix - 2147483648).to(tl.int32)  # the k-th largest key
        # 5. compaction, packed (key, ~column) for one sort: every entry above the threshold (fewer than k), then
        #    entries equal to it while slots remain (ties beyond K are dropped, as topk(K) drops them)
        above = k - remaining
        low32 = tl.full([BLOCK], 4294967295, tl.int64)  # packed low half: 2^32 − 1 − column
        n_gt = 0
        n_eq = 0
        for c0 in range(0, W, BLOCK):
            c = c0 + cols
            key = _key(tl.load(row + c, mask=c < W, other=0.0))
            gt = (c < W) & (key > thr)
            eq = (c < W) & (key == thr)
            at_eq = above + n_eq + tl.cumsum(eq.to(tl.int32), axis=0) - 1
            at = tl.where(gt, n_gt + tl.cumsum(gt.to(tl.int32), axis=0) - 1, at_eq)
            packed = (key.to(tl.int64) << 32) | (low32 - c.to(tl.int64))
            tl.store(cand_ptr + g * KP + at, packed, mask=gt | (eq & (at_eq < K)))
            n_gt += tl.sum(gt.to(tl.int32), axis=0)
            n_eq += tl.sum(eq.to(tl.int32), axis=0)
        n = tl.minimum(above + n_eq, K)
        tl.debug_barrier()
        r = tl.arange(0, KP)
        packed = tl.load(cand_ptr + g * KP + r, mask=r < n, other=-9223372036854775807)  # below every real one
        packed = tl.sort(packed, descending=True)
        m32 = tl.full([KP], 4294967295, tl.int64)
        ccol = (m32 - (packed & m32)).to(tl.int32)
        valid = r < n
        v = tl.load(row + ccol, mask=valid, other=float("-inf"))
        # 6. top-p (the first candidate always stays), then the exponential race over ranks
        if TOPP:
            e = tl.where(valid, tl.exp(v - tl.max(v, axis=0)), 0.0)
            prob = e / tl.sum(e, axis=0)
            removed = (tl.cumsum(prob, axis=0) - prob > top_p) & (r > 0)
            v = tl.where(removed, float("-inf"), v)
        e = tl.where(v > float("-inf"), tl.exp(v - tl.max(v, axis=0)), 0.0)
        prob = e / tl.sum(e, axis=0)
        noise = tl.load(noise_ptr + (step * G + g) * K + r, mask=r < K, other=1.0)
        race = tl.where(valid, tl.math.div_rn(prob, noise), -1.0)
        best = tl.max(race, axis=0)
        pick = tl.minimum(tl.min(tl.where(race == best, r, KP), axis=0), tl.maximum(n, 1) - 1)  # NaN rows too
        col = tl.sum(tl.where(r == pick, ccol, 0), axis=0)
    # 7. teacher forcing and the state of the next step
    f = tl.load(forced_ptr + step)
    col = tl.where(f >= 0, f - start, col).to(tl.int64)
    tok = col + start
    tl.store(out_ptr + g * max_tokens + step, tok)
    slot = step % P
    tl.store(ring_ptr + g * P + slot, col)
    tl.store(ringw_ptr + g * P + slot, 1.0)
    fin = (tl.load(done_ptr + g) != 0) | (col == end_col) | (step + 1 >= max_tokens)
    tl.store(done_ptr + g, fin)
    for rr in range(g, R, G):
        tl.store(tok_ptr + rr, tok)
