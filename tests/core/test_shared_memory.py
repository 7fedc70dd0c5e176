"""Shared memory per block of the decode kernels, from Triton's compiler run on the CPU for NVIDIA targets (no GPU
needed): the estimates `gemv.shared_bytes` / `fused.attention_shared_bytes` bound what the kernels really take, and
the configurations fitted to a GPU with 99 KB per block (RTX 30/40/50: sm_86/89/120) or 64 KB (T4: sm_75) fit.
The H200-tuned table takes up to 120 KB (bf16 qkv and down_proj with 4 stages): Triton refuses such a launch on
those GPUs ("out of resource: shared memory"), and the eager fallback would hit the same refusal."""
import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia.compiler", reason="this Triton has no CUDA backend to compile for")

from tests.core.test_pdl_ptx import _compiled  # noqa: E402

GEMV_TYPES = dict(x_ptr="*bf16", w_ptr="*bf16", s_ptr="*fp32", out_ptr="*fp32", M="i32", N="i32", K="i32",
                  KS="i32", stride_xm="i32")
GEMV_ALIGNED = ("x_ptr", "w_ptr", "s_ptr", "out_ptr", "N", "K", "KS", "stride_xm")
LIMITS = {89: 101_376, 75: 65_536}  # cudaDevAttrMaxSharedMemoryPerBlockOptin of an RTX 4090 and a T4


def _gemv_shared(cfg, int8: bool, cap: int, half: str) -> int:
    from yue2_core.fast import _decode_triton as k
    types = {**GEMV_TYPES, "x_ptr": f"*{half}", **({"w_ptr": "*i8"} if int8 else {"w_ptr": f"*{half}"})}
    kern = _compiled(k.gemv_kernel, types, dict(BM=16, BN=cfg.bn, BK=cfg.bk, INT8=int8, PARTIAL=True,
                                                PDL=cap >= 90, DOT=cfg.dot), cap=cap, aligned=GEMV_ALIGNED,
                     num_warps=cfg.warps, num_stages=cfg.stages)
    return kern.metadata.shared


def test_gemv_table_estimate_and_fit():
    """For every configuration of the table: the estimate equals the compiled kernel's shared memory on sm_90, and
    the configuration fitted to 99 KB (sm_89, bf16) and 64 KB (sm_75, fp16: no bf16 there) compiles within it."""
    from yue2_core.fast import gemv as G
    big = 0
    for (n, k, int8), cfg in G._TABLE.items():
        got = _gemv_shared(cfg, int8, 90, "bf16")
        assert got <= G.shared_bytes(cfg, int8) <= got + 1024, ((n, k, int8), cfg, got)
        big += got > LIMITS[89]
        for cap, half in ((89, "bf16"), (75, "fp16")):
            fitted = G.fit_shared(cfg, int8, LIMITS[cap])
            assert fitted.split == cfg.split and fitted.bk == cfg.bk
            shared = _gemv_shared(fitted, int8, cap, half)
            assert shared <= LIMITS[cap], ((n, k, int8), cap, fitted, shared)
    assert big, "no table entry exceeds 99 KB any more: the fitting is untested against a real overflow"


def _gemv_q_shared(cfg, swap: bool, cap: int) -> int:
    from yue2_core.fast import _decode_triton as k
    types = dict(q_ptr="*i8", xs_ptr="*fp32", w_ptr="*i8", s_ptr="*fp32", out_ptr="*fp32", M="i32", N="i32",
                 K="i32", KS="i32")
    kern = _compiled(k.gemv_q_kernel, types, dict(BN=cfg.bn, PARTIAL=True, SWAP=swap, PDL=cap >= 90), cap=cap,
                     aligned=("q_ptr", "xs_ptr", "w_ptr", "s_ptr", "out_ptr", "N", "K", "KS"),
                     num_warps=cfg.warps, num_stages=cfg.stages)
    return kern.metadata.shared


def test_gemv_pair_code_estimate_and_fit():
    """The int8 × int8 pair-code products (`gemv.gemv_q`, YUE2_INT8_DOT=int8), both operand orders: the estimate
    `shared_bytes_q` bounds the compiled kernel on sm_90 (Hopper's asynchronous tensor-core path keeps every stage),
    and a 128-wide 4-stage configuration fitted to 99 KB (sm_89) compiles within it."""
    from yue2_core.fast import gemv as G
    big = 0
    for bn in (32, 64, 128):
        for stages in (2, 3, 4):
            cfg = G.Config(bn=bn, bk=256, stages=stages)
            for swap in (False, True):
                got = _gemv_q_shared(cfg, swap, 90)
                assert got <= G.shared_bytes_q(cfg), (cfg, swap, got)
                big += got > LIMITS[89]
    assert big, "no pair-code configuration exceeds 99 KB: the fitting is untested against a real overflow"
    fitted = G.fit_shared(G.Config(bn=128, bk=256, stages=4), True, LIMITS[89], G.shared_bytes_q)
    for swap in (False, True):
        assert _gemv_q_shared(fitted, swap, 89) <= LIMITS[89], (fitted, swap)


def test_attention_estimate_and_fit():
    """The decode-attention split kernel and the shared-prefix kernel: the estimate bounds the compiled size, and the
    default configuration fitted to 64 KB (a T4) compiles within it (unfitted it takes 70 KB)."""
    from yue2_core.fast import fused
    _, split_k, _, shared_k = fused._attention_kernels()
    types = dict(q_ptr="*fp16", k_ptr="*fp16", v_ptr="*fp16", pos_ptr="*i64", m_ptr="*fp32", l_ptr="*fp32",
                 o_ptr="*fp32", cache_row="i32", cache_head="i32", scale="fp32", CHUNK="i32", L="i32", START="i32",
                 SP0="i32", splits="i32", P="i32", R="i32")
    aligned = ("q_ptr", "k_ptr", "v_ptr", "pos_ptr", "m_ptr", "l_ptr", "o_ptr", "cache_row", "cache_head")

    def size(kernel, cfg, q_rows, cap):
        consts = (dict(NKV=8, G=2, QP=q_rows, D=128, BL=cfg.bl, IEEE=False) if kernel is shared_k
                  else dict(NKV=8, G=2, GP=q_rows, D=128, BL=cfg.bl, IEEE=False))
        warps = min(32, max(cfg.warps, q_rows // 8)) if kernel is shared_k else cfg.warps
        return _compiled(kernel, types, consts, cap=cap, aligned=aligned, num_warps=warps,
                         num_stages=cfg.stages).metadata.shared

    cfg = fused.ATTN_CONFIG
    for kernel, q_rows in ((split_k, 16), (shared_k, 16), (shared_k, 32), (shared_k, 64)):
        got = size(kernel, cfg, q_rows, 90)
        assert got <= fused.attention_shared_bytes(cfg, 128, q_rows, 2) <= got + 4096, (q_rows, got)
        fitted = fused.fit_attention(cfg, 128, q_rows, 2, LIMITS[75])
        assert fitted != cfg or got <= LIMITS[75]
        assert size(kernel, fitted, q_rows, 75) <= LIMITS[75], (q_rows, fitted)
    assert size(split_k, cfg, 16, 90) > LIMITS[75], "the default no longer exceeds a T4: the fit is untested"
