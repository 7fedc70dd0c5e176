"""Every Triton kernel of the pack's GPU path, in the launch configurations the GPU compiles by default (and the
experimental switches' ones), compiled for an H100/H200 (sm_90) on the CPU by whatever Triton imports.

Run as a script (`python tests/core/gpu_kernel_variants.py`) it compiles them all, one JSON line per variant
({"variant", "kernel", "ok", "s", "error"}) and a last line {"triton": version, "file": where it was imported from,
"launched": every launched kernel found in yue2_core's source}; exit status 0. tests/core/test_triton_gpu_image.py
runs it under the GPU machine image's Triton (an older one than CI's; its front end refused code CI's accepted).

The configurations come from the code's own tables where it has them (`gemv._TABLE`, `gemv._Q_TABLE`, the
autotuners' configurations of `w8a8` and `int8_kernels`, `fused.ATTN_CONFIG`, `persistent.TILES`), with the release
model's dimensions (`weights.lora.layouts.RELEASE_DIMS`); the rest mirror the launch sites (`fast.fused`,
`fast.gemv`, `fast.sample_kernels`, `fast.w8a8`, `fast.persistent`): programmatic dependent launch on (sm_90),
16-byte-aligned pointers and integers as the runtime specialises torch's allocations.
"""
from __future__ import annotations

import ast
import inspect
import json
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "yue2_core"


@dataclass
class Variant:
    name: str
    fn: object  # a triton JITFunction
    types: dict
    consts: dict
    opts: dict = field(default_factory=dict)  # num_warps, num_stages
    ints: dict = field(default_factory=dict)  # values of integer arguments: those divisible by 16 are specialised

    def key(self) -> tuple:
        return (self.fn.__name__, tuple(sorted(self.types.items())), tuple(sorted(self.consts.items(), key=str)),
                tuple(sorted(self.opts.items())), self.aligned())

    def aligned(self) -> tuple:
        pointers = [a for a, t in self.types.items() if t.startswith("*")]
        return tuple(pointers + sorted(a for a, v in self.ints.items() if a in self.types and v % 16 == 0))


def _jit_defs(tree) -> list:
    def is_jit(dec):
        target = dec.func if isinstance(dec, ast.Call) else dec
        return isinstance(target, ast.Attribute) and target.attr == "jit"
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and any(is_jit(d) for d in n.decorator_list)]


def launched_kernels() -> list:
    """Names of the @triton.jit functions in yue2_core that no jit function refers to: the kernels the host
    launches (the others are helpers that kernels call or pass to `tl.reduce`)."""
    defs, used = {}, set()
    for path in sorted(CORE.rglob("*.py")):
        for d in _jit_defs(ast.parse(path.read_text(encoding="utf-8"))):
            defs[d.name] = d
    for d in defs.values():
        for node in ast.walk(d):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name in defs and name != d.name:
                used.add(name)
    return sorted(set(defs) - used)


def _modes(G, dims) -> list:
    """The decode step's three ways of running the AR's products, each with the split of its four layer products
    as `gemv.choose` / `gemv.choose_q` give them for the release model: (name, rot, quant, splits)."""
    h, kv, d, hid, f = dims.heads, dims.kv_heads, dims.head_dim, dims.hidden, dims.ffn
    shapes = dict(qkv=((h + 2 * kv) * d, hid), o=(hid, h * d), gu=(2 * f, hid), down=(hid, f))
    return [("bf16", False, False, {p: G.choose(n, k, 1, False).split for p, (n, k) in shapes.items()}),
            ("int8 (YUE2_INT8_DOT=convert)", True, False,
             {p: G.choose(n, k, 1, True).split for p, (n, k) in shapes.items()}),
            ("int8 pair codes (YUE2_INT8_DOT=int8, default)", True, True,
             {p: G.choose_q(n, k)[0].split for p, (n, k) in shapes.items()})]


def _gemv_variants(k, G) -> list:
    out = []
    gtypes = dict(x_ptr="*bf16", w_ptr="*bf16", s_ptr="*bf16", out_ptr="*fp32", M="i32", N="i32", K="i32",
                  KS="i32", stride_xm="i32")
    for (n, kk, int8), cfg in sorted(G._TABLE.items()):
        partial = cfg.split > 1
        types = {**gtypes, "out_ptr": "*fp32" if partial else "*bf16",
                 **(dict(w_ptr="*i8", s_ptr="*fp32") if int8 else {})}
        ks = -(-(-(-kk // cfg.split)) // cfg.bk) * cfg.bk
        out.append(Variant(f"gemv {'int8' if int8 else 'bf16'} {n}x{kk} (split {cfg.split})", k.gemv_kernel, types,
                           dict(BM=16, BN=cfg.bn, BK=cfg.bk, INT8=int8, PARTIAL=partial, DOT=cfg.dot, PDL=True),
                           dict(num_warps=cfg.warps, num_stages=cfg.stages), dict(N=n, K=kk, KS=ks, stride_xm=kk)))
    for int8 in (False, True):  # YUE2_GEMV_PRE=1 (experimental): the first weight tile before the PDL wait
        v = next(v for v in out if v.consts["INT8"] == int8 and v.consts["PARTIAL"])
        out.append(Variant(v.name + ", PRE", v.fn, v.types, {**v.consts, "PRE": True}, v.opts, v.ints))
    # CUDA-core products for 1–2 rows (YUE2_GEMV_TABLE entries with dot false; BM the rows' power of two)
    out.append(Variant("gemv bf16, CUDA cores, 1 row", k.gemv_kernel, gtypes,
                       dict(BM=1, BN=16, BK=256, INT8=False, PARTIAL=True, DOT=False, PDL=True)))
    out.append(Variant("gemv int8, CUDA cores, 2 rows", k.gemv_kernel, {**gtypes, "w_ptr": "*i8", "s_ptr": "*fp32"},
                       dict(BM=2, BN=16, BK=128, INT8=True, PARTIAL=True, DOT=False, PDL=True)))
    qtypes = dict(q_ptr="*i8", xs_ptr="*fp32", w_ptr="*i8", s_ptr="*fp32", out_ptr="*fp32", M="i32", N="i32",
                  K="i32", KS="i32")
    for (n, kk), (cfg, swap) in sorted(G._Q_TABLE.items()):
        partial = cfg.split > 1
        out.append(Variant(f"gemv int8 x int8 pair codes {n}x{kk} (split {cfg.split}, swap {swap})",
                           k.gemv_q_kernel, {**qtypes, "out_ptr": "*fp32" if partial else "*bf16"},
                           dict(BN=cfg.bn, PARTIAL=partial, SWAP=swap, PDL=True),
                           dict(num_warps=cfg.warps, num_stages=cfg.stages), dict(N=n, K=kk, KS=kk // cfg.split)))
    v = out[-1]
    out.append(Variant(v.name + ", PRE", v.fn, v.types, {**v.consts, "PRE": True}, v.opts, v.ints))
    splits = sorted({c.split for c in G._TABLE.values()} - {1})
    for s in splits:  # gemv.reduce: the stand-alone sum of a split product's partials
        out.append(Variant(f"reduce {s} splits", k.reduce_kernel, dict(p_ptr="*fp32", y_ptr="*bf16", MN="i32"),
                           dict(S=s, BLOCK=1024)))
    for quant in (False, True):  # gemv.rotate
        types = dict(x_ptr="*bf16", y_ptr="*bf16", K="i32", **(dict(q_ptr="*i8", s_ptr="*fp32") if quant else {}))
        out.append(Variant(f"rotate{' (pair codes)' if quant else ''}", k.rotate_kernel, types,
                           dict(BK=256, QUANT=quant, PDL=True), ints=dict(K=2048)))
    return out


def _fused_variants(k, G, fused, dims) -> list:
    out = []
    hid, f = dims.hidden, dims.ffn
    pack = dict(q_ptr="*i8", qs_ptr="*fp32")
    rope = dict(qn_ptr="*bf16", kn_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32", pos_ptr="*i64", q_ptr="*bf16",
                k_ptr="*bf16", v_ptr="*bf16", row_stride="i32", cache_row="i32", cache_head="i32", PS="i32",
                R="i32", eps="fp32")
    rc = dict(NH=dims.heads, NKV=dims.kv_heads, D=dims.head_dim, PDL=True)
    # the decode step's producers in each mode (the NAR: no splits, bf16 deltas, a block of rows for the RoPE)
    for mode, rot, quant, sp in _modes(G, dims) + [("the NAR", False, False, dict(qkv=1, o=1, gu=1, down=1))]:
        for what, s in (("first layer", 0), ("after o_proj", sp["o"]), ("after down_proj", sp["down"])):
            types = dict(x_ptr="*bf16", d_ptr="*fp32" if s > 1 else "*bf16", w_ptr="*bf16", xo_ptr="*bf16",
                         y_ptr="*bf16", N="i32", PS="i32", eps="fp32", **(pack if quant else {}))
            out.append(Variant(f"add+RMSNorm, {mode}, {what}", k.add_rmsnorm_kernel, types,
                               dict(HAS_D=s > 0, S=max(1, s), BLOCK=1 << (hid - 1).bit_length(), ROT=rot,
                                    QUANT=quant, PDL=True), dict(num_warps=8 if s > 1 else 4),
                               dict(N=hid, PS=16 * hid)))
        s = sp["qkv"]
        nar = mode == "the NAR"
        out.append(Variant(f"QK-norm + RoPE + KV store, {mode}", k.qk_rope_kernel,
                           dict(qkv_ptr="*fp32" if s > 1 else "*bf16", **rope),
                           dict(S=s, BR=fused.ROPE_ROW_BLOCK if nar else 1, **rc),
                           ints=dict(row_stride=(dims.heads + 2 * dims.kv_heads) * dims.head_dim)))
        s = sp["gu"]
        out.append(Variant(f"SiLU·up, {mode}", k.silu_mul_kernel,
                           dict(gu_ptr="*fp32" if s > 1 else "*bf16", out_ptr="*bf16", F="i32", PS="i32",
                                **(pack if quant else {})),
                           dict(S=s, BLOCK=256 if rot else 1024, ROT=rot, QUANT=quant, PDL=True),
                           ints=dict(F=f, PS=32 * f)))
    # decode attention (fused.decode_attention) with ATTN_CONFIG, bf16 caches
    _, split_k, merge_k, shared_k = fused._attention_kernels()
    cfg, nkv, g, d = fused.ATTN_CONFIG, dims.kv_heads, dims.heads // dims.kv_heads, dims.head_dim
    gp = max(16, 1 << (g - 1).bit_length())
    attn = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", pos_ptr="*i64", m_ptr="*fp32", l_ptr="*fp32",
                o_ptr="*fp32", cache_row="i32", cache_head="i32", scale="fp32", CHUNK="i32", L="i32", START="i32",
                SP0="i32", splits="i32")
    ac = dict(NKV=nkv, G=g, D=d, BL=cfg.bl, IEEE=False, PDL=True)
    aopts = dict(num_warps=cfg.warps, num_stages=cfg.stages)
    aints = dict(cache_row=nkv * 4096 * d, cache_head=4096 * d)
    rq = ((False, False), (True, False), (True, True))  # the three modes' (rot, quant)
    out.append(Variant("attention split", split_k, attn, dict(GP=gp, **ac), aopts, aints))
    for sp in (1, fused.MERGE_MAX_SPLITS):  # SP: the next power of two of the splits, 1 … MERGE_MAX_SPLITS
        for rot, quant in rq if sp > 1 else rq[:1]:
            types = {**attn, "cnt_ptr": "*i32", "out_ptr": "*bf16", **(dict(q8_ptr="*i8", qs_ptr="*fp32")
                                                                          if quant else {})}
            out.append(Variant(f"attention split, merged by its last program ({sp} splits, rot {rot}, pair codes "
                               f"{quant})", split_k, types,
                               dict(GP=gp, MERGE=True, SP=sp, ROT=rot, FENCE=True, QUANT=quant, **ac), aopts, aints))
    shared_types = {a: t for a, t in attn.items() if a not in ("pos_ptr", "cache_row", "L", "START", "SP0")}
    for rows in (8, 16):  # a shared prompt prefix (≥ 4 rows): QP = max(16, next power of two of rows · G)
        qp = max(16, 1 << (rows * g - 1).bit_length())
        out.append(Variant(f"attention shared prefix, {rows} rows (QP {qp})", shared_k,
                           {**shared_types, "P": "i32", "R": "i32"}, dict(QP=qp, **ac),
                           dict(num_warps=min(32, max(cfg.warps, qp // 8)), num_stages=cfg.stages), aints))
    merge = dict(m_ptr="*fp32", l_ptr="*fp32", o_ptr="*fp32", out_ptr="*bf16", splits="i32")
    for sp in (64, 128):  # more splits than the split kernel merges itself (a shared prefix's, up to 2 · 33)
        for rot, quant in rq if sp > 64 else rq[:1]:
            out.append(Variant(f"attention merge ({sp} splits, rot {rot}, pair codes {quant})", merge_k,
                               {**merge, **(dict(q8_ptr="*i8", qs_ptr="*fp32") if quant else {})},
                               dict(NKV=nkv, G=g, D=d, SP=sp, HG=256 // d if rot else 1, ROT=rot, QUANT=quant,
                                    PDL=True)))
    # the VAE's SnakeBeta (fused.snake; fp32, no PDL): plain, and with its folded bias and residual kept
    _, snake_k = fused._snake_kernel()
    for folded in (False, True):
        types = dict(x_ptr="*fp32", inv_ptr="*fp32", alpha_ptr="*fp32", y_ptr="*fp32", C="i32", T="i32",
                     **(dict(bias_ptr="*fp32", res_ptr="*fp32", pre_ptr="*fp32") if folded else {}))
        out.append(Variant(f"snake{' (bias, residual, kept)' if folded else ''}", snake_k, types,
                           dict(BLOCK=1024, HAS_BIAS=folded, HAS_RES=folded, KEEP=folded)))
    return out


def _sample_variants(sk) -> list:
    from yue2_core.fast.sample_kernels import MAX_CANDIDATES
    from yue2_core.fast.sampler import TIE_PAD
    from yue2_core.protocol import Sampling
    out = []
    scores = dict(logits_ptr="*bf16", lrow="i32", mask_ptr="*fp32", scores_ptr="*fp32", step_ptr="*i64",
                  ring_ptr="*i64", ringw_ptr="*fp32", alpha_ptr="*fp32", budget_ptr="*i64", W="i32", G="i32",
                  P="i32", cfg="fp32", min_tokens="i32", end_col="i32", temp="fp32")
    finish = dict(val_ptr="*fp32", col_ptr="*i64", noise_ptr="*fp32", step_ptr="*i64", forced_ptr="*i64",
                  out_ptr="*i64", orow="i32", ring_ptr="*i64", ringw_ptr="*fp32", done_ptr="*i1", tok_ptr="*i64",
                  budget_ptr="*i64", K="i32", k="i32", G="i32", R="i32", P="i32", top_p="fp32", max_tokens="i32",
                  end_col="i32", start="i32")
    kp = max(16, 1 << (Sampling().top_k + TIE_PAD - 1).bit_length())  # the default top_k's candidates
    for rows in (False, True):  # True: continuous batching (fast.refill), a step and a budget per row
        for cfg, pen, scale, recip in ((True, True, True, True), (False, False, False, False),
                                       (True, False, True, False)):
            out.append(Variant(f"sampling scores (CFG {cfg}, penalty {pen}, temperature {scale}, reciprocal "
                               f"{recip}, a step per row {rows})", sk.scores_kernel, scores,
                               dict(CFG=cfg, PENALTY=pen, SCALE=scale, RECIP=recip, BLOCK=1024, LIBDEVICE=True,
                                    ROWS=rows, PDL=True), dict(num_warps=4)))
        for topp in (True, False):
            out.append(Variant(f"sampling finish (top-p {topp}, KP {kp}, a step per row {rows})", sk.finish_kernel,
                               finish, dict(TOPP=topp, KP=kp, LIBDEVICE=True, ROWS=rows, PDL=True),
                               dict(num_warps=4)))
    out.append(Variant(f"sampling finish (KP {MAX_CANDIDATES})", sk.finish_kernel, finish,
                       dict(TOPP=True, KP=MAX_CANDIDATES, LIBDEVICE=True, PDL=True), dict(num_warps=4)))
    return out


def _w8a8_variants(w8a8, dims) -> list:
    from yue2_core.fast import _w8a8_triton as k
    out = []
    _, _, _, tuned, _ = w8a8._kernels()
    for group in (256, 64, 16):  # the ConvRot groups the quantizer takes (256: H16·X·H16)
        kron = group == 256
        for kk in (dims.hidden, dims.ffn) if kron else (dims.hidden,):
            ng = 1 << (kk // group - 1).bit_length()
            base = dict(x_ptr="*bf16", h_ptr="*bf16", p_ptr="*fp32", M="i32", K="i32")
            c = dict(G=group, BM=w8a8.ROWS, LIBDEVICE=True, KRON=kron)
            if kk == dims.hidden:
                out.append(Variant(f"W8A8 group maxima (G {group})", k.group_max_kernel, base, c,
                                   dict(num_warps=4), dict(K=kk)))
            out.append(Variant(f"W8A8 quantizer (G {group}, K {kk})", k.quantize_kernel,
                               {**base, "q_ptr": "*i8", "s_ptr": "*fp32"}, dict(NG=ng, **c), dict(num_warps=4),
                               dict(K=kk)))
    types = dict(a_ptr="*i8", as_ptr="*fp32", b_ptr="*i8", bs_ptr="*fp32", bias_ptr="*bf16", c_ptr="*bf16",
                 M="i32", N="i32", K="i32", MB="i32")
    for i, conf in enumerate(tuned.configs):  # every configuration the autotuner compiles and times on the GPU
        for bias in (True, False) if i == 0 else (True,):
            kw = conf.kwargs
            out.append(Variant(f"W8A8 GEMM {kw['BM']}x{kw['BN']}x{kw['BK']} w{conf.num_warps} s{conf.num_stages} "
                               f"(bias {bias})", k.gemm_kernel, types, dict(HAS_BIAS=bias, GPU=True, **kw),
                               dict(num_warps=conf.num_warps, num_stages=conf.num_stages),
                               dict(N=dims.hidden, K=dims.hidden)))
    # the producers writing codes (stop 52): the NAR's add+RMSNorm (hidden) and SiLU·up (ffn, padded to a power of 2)
    norm = dict(x_ptr="*bf16", d_ptr="*bf16", w_ptr="*bf16", xo_ptr="*bf16", q_ptr="*i8", s_ptr="*fp32", N="i32",
                eps="fp32")
    for has_d in (True, False):
        out.append(Variant(f"W8A8 add+RMSNorm writing codes (delta {has_d})", k.add_rmsnorm_quant_kernel, norm,
                           dict(HAS_D=has_d, BLOCK=1 << (dims.hidden - 1).bit_length(), LIBDEVICE=True),
                           dict(num_warps=4), dict(N=dims.hidden)))
    for kk, warps in ((dims.hidden, 4), (dims.ffn, 16)):  # `quantize_rows`' one-program-a-row kernel
        out.append(Variant(f"W8A8 row quantizer (K {kk})", k.rows_quant_kernel,
                           dict(x_ptr="*bf16", q_ptr="*i8", s_ptr="*fp32", K="i32"),
                           dict(BLOCK=1 << (kk - 1).bit_length(), LIBDEVICE=True), dict(num_warps=warps), dict(K=kk)))
    out.append(Variant("W8A8 SiLU·up writing codes", k.silu_mul_quant_kernel,
                       dict(gu_ptr="*bf16", q_ptr="*i8", s_ptr="*fp32", F="i32"),
                       dict(BLOCK=1 << (dims.ffn - 1).bit_length(), LIBDEVICE=True), dict(num_warps=16),
                       dict(F=dims.ffn)))
    return out


def _w8a16_variants(int8_kernels, dims) -> list:
    free = inspect.getclosurevars(int8_kernels._kernel()).nonlocals  # the kernel and its autotuner, in `run`'s closure
    fn, tuned = free["w8a16"], free["tuned"]
    types = dict(x_ptr="*bf16", q_ptr="*i8", s_ptr="*fp32", y_ptr="*bf16", M="i32", N="i32", K="i32")
    return [Variant(f"W8A16 {c.kwargs['BLOCK_N']}x{c.kwargs['BLOCK_K']} w{c.num_warps} s{c.num_stages}", fn, types,
                    dict(BLOCK_M=int8_kernels.MAX_ROWS, **c.kwargs),
                    dict(num_warps=c.num_warps, num_stages=c.num_stages), dict(N=dims.hidden, K=dims.hidden))
            for c in tuned.configs]


def _layer_variants(persistent, dims) -> list:
    """YUE2_LAYER_KERNEL=grid (experimental, off by default): the one-launch layer for 1 row of an int8 model on a
    GPU of 132 multiprocessors (an H100 or H200; its bf16 build takes the plain branches of the same code; 3–6 s a
    compile)."""
    from yue2_core.fast import _layer_triton as lk
    t = persistent.TILES
    names = list(inspect.signature(lk.layer_kernel.fn).parameters)
    args = names[:names.index("R")]  # the runtime arguments; constexprs from R on
    fp32 = {"cos_ptr", "sin_ptr", "m_ptr", "l_ptr", "o_ptr", "sqkv_ptr", "so_ptr", "sgu_ptr", "sd_ptr", "eps", "scale"}
    i32 = {"cnt_ptr", "bar_ptr", "reset_ptr", "err_ptr"}
    int8 = {"wqkv_ptr", "wo_ptr", "wgu_ptr", "wd_ptr"}
    types = {n: ("*i8" if n in int8 else "*i64" if n == "pos_ptr" else "*i32" if n in i32 else "*fp32" if n in fp32
                 else "*bf16") if n.endswith("_ptr") else "fp32" if n in fp32 else "i32" for n in args}
    g = dims.heads // dims.kv_heads
    splits = max(1, min(32, 132 * t["per_sm"] // dims.kv_heads))
    groups = dims.ffn // 256
    consts = dict(R=1, RB=1, HID=dims.hidden, NH=dims.heads, NKV=dims.kv_heads, D=dims.head_dim, F=dims.ffn,
                  INT8=True, SP=1 << (splits - 1).bit_length(), BL=t["bl"],
                  **{f"{a.upper()}_{p.upper()}": t[f"{a}_{p}"] for p in ("qkv", "o", "gu", "d")
                     for a in ("bn", "bk", "st")},
                  AG=min(8, groups & -groups), FLAT=bool(t["flat"]),
                  SCR=max(dims.ffn, dims.hidden, max(16, g) * dims.head_dim), PH_LO=0, PH_HI=persistent.PHASES - 1,
                  SYNC=True, FENCE=True, POLL=bool(t["poll"]))
    return [Variant("one-launch decoder layer (int8, 1 row)", lk.layer_kernel, types, consts,
                    dict(num_warps=t["warps"], num_stages=t["stages"]))]


def variants() -> list:
    """Every variant, without duplicates (first name kept)."""
    from yue2_core.fast import _decode_triton as k, _sample_triton as sk, fused, gemv as G, int8_kernels, persistent
    from yue2_core.fast import w8a8
    from yue2_core.weights.lora.layouts import RELEASE_DIMS as dims
    found = (_gemv_variants(k, G) + _fused_variants(k, G, fused, dims) + _sample_variants(sk)
             + _w8a8_variants(w8a8, dims) + _w8a16_variants(int8_kernels, dims) + _layer_variants(persistent, dims))
    unique = {}
    for v in found:
        unique.setdefault(v.key(), v)
    return list(unique.values())


def compile_variant(v: Variant):
    """The kernel compiled for sm_90 (tests/core/test_pdl_ptx.py's `_compiled`, PDL on)."""
    from test_pdl_ptx import _compiled  # this folder is on sys.path (run as a script, or under pytest)
    return _compiled(v.fn, v.types, v.consts, cap=90, aligned=v.aligned(), **v.opts)


def _message(exc: BaseException) -> str:
    """The exception's text (a CompilationError's ends with the kernel's source up to the refused line) and its
    causes' (the front end's bare `assert` behind it, e.g.)."""
    parts = ["".join(traceback.format_exception_only(type(exc), exc)).strip()[-3000:]]
    cause = exc.__cause__ or exc.__context__
    while cause is not None and len(parts) < 4:
        parts.append(f"caused by {type(cause).__name__}: {str(cause)[-500:] or '(no message)'}")
        cause = cause.__cause__ or cause.__context__
    return "\n".join(parts)


def main() -> int:
    import triton
    for v in variants():
        t0 = time.perf_counter()
        try:
            kern = compile_variant(v)
            ok, error = "cubin" in kern.asm, None if "cubin" in kern.asm else "no cubin in the compiled kernel"
        except Exception as exc:  # Triton's CompilationError and anything its passes or ptxas raise
            ok, error = False, _message(exc)
        print(json.dumps(dict(variant=v.name, kernel=v.fn.__name__, ok=ok, s=round(time.perf_counter() - t0, 2),
                              error=error)), flush=True)
    print(json.dumps(dict(triton=triton.__version__, file=triton.__file__, launched=launched_kernels())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
