"""Triton kernels of the decode step's sampling tail (`fast.sample_kernels.KernelTail`): the work before and after
`torch.topk`, which stays a library call (a multi-block radix select; one program per row selecting over 32,769 or
151,849 columns was measured slower). Imported only when Triton imports (see `fast.triton_modules`).

    scores_kernel   program (row g, column block): scores = fp32(CFG(logits)) + mask, the end column −inf while
                    step < min_tokens, the windowed repetition penalty (count per column from the ring, factor from
                    a table), the temperature — the processed scores `sampler.candidates` computes, bit for bit
    finish_kernel   program (row g) over the top_k + TIE_PAD sorted candidates: top-k ties, top-p, the exponential
                    race with the step's Exp(1) draws, teacher forcing, out / ring / done / next input tokens

ROWS (continuous batching, `fast.refill`): each row reads its own step (step [G]) and its own budget (budget [G, 2]:
min_tokens, max_tokens) instead of the batch's; `orow` is the output's row stride (max_tokens, or + 1 spare slot).
"""
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ._decode_triton import pdl_prologue


# The song's budget and the batch's row count are plain runtime values (no "equals 1" / "divisible by 16"
# specialisation): one compiled variant serves every budget and row count, which the cold-start warm-up relies on
# (warmup.py) — they only enter comparisons and row offsets, where the hint gains nothing.
@triton.jit(do_not_specialize=["G", "min_tokens"])
def scores_kernel(logits_ptr, lrow, mask_ptr, scores_ptr, step_ptr, ring_ptr, ringw_ptr, alpha_ptr, budget_ptr,
                  W, G, P, cfg, min_tokens, end_col, temp,
                  CFG: tl.constexpr, PENALTY: tl.constexpr, SCALE: tl.constexpr, RECIP: tl.constexpr,
                  BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr, ROWS: tl.constexpr = False,
                  PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    g = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < W
    ldt = logits_ptr.dtype.element_ty
    if ROWS:  # continuous batching (`fast.refill`): a step and a budget (min, max tokens) per row
        step = tl.load(step_ptr + g)
        min_tokens = tl.load(budget_ptr + 2 * g)
    else:
        step = tl.load(step_ptr)
    x = tl.load(logits_ptr + g * lrow + c, mask=ok, other=0.0)
    if CFG:  # uncond + (cond − uncond)·cfg in the logits' dtype, rounded after each op as the PyTorch expression
        # (LIBDEVICE, CUDA: the product and the sum as separately rounded libdevice ops — the compiler would fuse
        # `u + d·cfg` into one FMA for fp32 logits, rounding once where PyTorch rounds twice)
        u = tl.load(logits_ptr + (G + g) * lrow + c, mask=ok, other=0.0)
        d = (x.to(tl.float32) - u.to(tl.float32)).to(ldt)
        if LIBDEVICE:
            m = libdevice.mul_rn(d.to(tl.float32), cfg).to(ldt)
            x = libdevice.add_rn(u.to(tl.float32), m.to(tl.float32)).to(ldt)
        else:
            m = (d.to(tl.float32) * cfg).to(ldt)
            x = (u.to(tl.float32) + m.to(tl.float32)).to(ldt)
    s = x.to(tl.float32) + tl.load(mask_ptr + c, mask=ok, other=0.0)
    end_block = tl.where(step < min_tokens, float("-inf"), 0.0)
    s = tl.where(c == end_col, s + end_block, s)  # x + 0.0 as the reference adds it (−0.0 becomes +0.0)
    if PENALTY:  # score·α if score < 0 else score/α, α = penalty^count over the ring (α = 1 leaves it unchanged)
        count = tl.zeros([BLOCK], tl.float32)
        for j in range(0, P):
            count += tl.where(c == tl.load(ring_ptr + g * P + j), tl.load(ringw_ptr + g * P + j), 0.0)
        hit = count > 0
        alpha = tl.load(alpha_ptr + count.to(tl.int32), mask=ok & hit, other=1.0)
        s = tl.where(hit, tl.where(s < 0, s * alpha, tl.math.div_rn(s, alpha)), s)
    if SCALE:  # `temp`: the reciprocal PyTorch multiplies by on this device (RECIP), else fp32(T) it divides by
        if RECIP:
            s = s * temp
        else:
            s = tl.math.div_rn(s, temp)
    tl.store(scores_ptr + g * W + c, s, mask=ok)


@triton.jit
def _softmax(v, valid, LIBDEVICE: tl.constexpr):
    # softmax over the valid entries of v: max subtracted, exp, sum, divide — PyTorch's order, with the same accurate
    # expf (LIBDEVICE, CUDA: tl.exp is the approximate ex2; the CPU interpreter's tl.exp is numpy's); only the
    # summation order differs
    top = tl.max(tl.where(valid, v, float("-inf")), axis=0)
    if LIBDEVICE:
        e = tl.where(valid, libdevice.exp(v - top), 0.0)
    else:
        e = tl.where(valid, tl.exp(v - top), 0.0)
    return tl.math.div_rn(e, tl.sum(e, axis=0))


@triton.jit(do_not_specialize=["orow", "G", "R", "max_tokens"])
def finish_kernel(val_ptr, col_ptr, noise_ptr, step_ptr, forced_ptr, out_ptr, orow, ring_ptr, ringw_ptr, done_ptr,
                  tok_ptr, budget_ptr, K, k, G, R, P, top_p, max_tokens, end_col, start,
                  TOPP: tl.constexpr, KP: tl.constexpr, LIBDEVICE: tl.constexpr, ROWS: tl.constexpr = False,
                  PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    g = tl.program_id(0)
    r = tl.arange(0, KP)
    valid = r < K
    if ROWS:
        step = tl.load(step_ptr + g)
        max_tokens = tl.load(budget_ptr + 2 * g + 1)
    else:
        step = tl.load(step_ptr)
    v = tl.load(val_ptr + g * K + r, mask=valid, other=float("-inf"))
    thr = tl.load(val_ptr + g * K + k - 1)
    v = tl.where(v < thr, float("-inf"), v)  # top-k: ties with the k-th value stay
    if TOPP:  # removed where the mass before an entry exceeds top_p; the first candidate always stays
        prob = _softmax(v, valid, LIBDEVICE)
        removed = (tl.cumsum(prob, axis=0) - prob > top_p) & (r > 0)
        v = tl.where(removed, float("-inf"), v)
    prob = _softmax(v, valid, LIBDEVICE)
    noise = tl.load(noise_ptr + (step * G + g) * K + r, mask=valid, other=1.0)
    race = tl.where(valid, tl.math.div_rn(prob, noise), float("-inf"))
    best = tl.max(race, axis=0)
    pick = tl.min(tl.where(race == best, r, KP), axis=0)
    pick = tl.where(pick < K, pick, 0)  # a row without finite scores (NaN race): the first, as torch.argmax
    col = tl.load(col_ptr + g * K + pick)
    f = tl.load(forced_ptr + step)
    col = tl.where(f >= 0, f - start, col)
    tok = col + start
    tl.store(out_ptr + g * orow + step, tok)
    slot = step % P
    tl.store(ring_ptr + g * P + slot, col)
    tl.store(ringw_ptr + g * P + slot, 1.0)
    fin = (tl.load(done_ptr + g) != 0) | (col == end_col) | (step + 1 >= max_tokens)
    tl.store(done_ptr + g, fin)
    for rr in range(g, R, G):
        tl.store(tok_ptr + rr, tok)
