"""The W8A8 kernels (`fast._w8a8_triton`) compiled for an H100/H200 (sm_90) on the CPU, as Triton compiles them on the
GPU: the interpreter tests run another path (`GPU`/`LIBDEVICE` false) and never meet the GPU branch's code. Found on
the first GPU run (stop 49, one H100): the quantizer did not compile there — an early `return` inside a constexpr
branch does not end a Triton function, so code past the H16·X·H16 branch's return (the dense product with a scalar H)
was compiled too. Each compile takes a few seconds on one core."""
import pytest

triton = pytest.importorskip("triton")
from test_pdl_ptx import _compiled  # noqa: E402  (tests/core/test_pdl_ptx.py: compile for sm_N without a GPU)


def test_quantizer_compiles_for_sm90_with_the_default_rotation():
    from yue2_core.fast import _w8a8_triton as k
    types = dict(x_ptr="*bf16", h_ptr="*bf16", p_ptr="*fp32", M="i32", K="i32")
    maxima = _compiled(k.group_max_kernel, types, dict(G=256, BM=32, LIBDEVICE=True, KRON=True),
                       aligned=("x_ptr", "K")).asm["ptx"]
    assert "mma" in maxima  # pass 1 rotates on the tensor cores too
    types = dict(x_ptr="*bf16", h_ptr="*bf16", p_ptr="*fp32", q_ptr="*i8", s_ptr="*fp32", M="i32", K="i32")
    ptx = _compiled(k.quantize_kernel, types, dict(G=256, NG=8, BM=32, LIBDEVICE=True, KRON=True),
                    aligned=("x_ptr", "q_ptr", "K")).asm["ptx"]
    assert "mma" in ptx  # H16·X·H16 on the tensor cores
    # the codes' IEEE division (libdevice.div_rn), never Triton's `/`; the row scale a multiplication by fp32(1/127),
    # as PyTorch on CUDA divides by a scalar
    assert "div.rn" in ptx and "div.full" not in ptx
    assert "cvt.rn.bf16" in ptx  # the hardware's round-to-nearest-even bf16 cast, not the interpreter's bit rounding


def test_gemm_compiles_for_sm90_with_bias():
    from yue2_core.fast import _w8a8_triton as k
    types = dict(a_ptr="*i8", as_ptr="*fp32", b_ptr="*i8", bs_ptr="*fp32", bias_ptr="*bf16", c_ptr="*bf16",
                 M="i32", N="i32", K="i32", MB="i32")
    consts = dict(HAS_BIAS=True, BM=128, BN=128, BK=128, GROUP_M=8, GPU=True)
    ptx = _compiled(k.gemm_kernel, types, consts, aligned=("a_ptr", "b_ptr", "c_ptr", "N", "K"),
                    num_warps=8, num_stages=3).asm["ptx"]
    assert "wgmma" in ptx and ".s8" in ptx  # int8 × int8 on Hopper's warpgroup tensor cores
    assert "cvt.rn.bf16" in ptx


def test_producers_compile_for_sm90():
    """Stop 52: add+RMSNorm and SiLU·up writing W8A8 codes (`fast.w8a8.add_rmsnorm_quantize` /
    `silu_mul_quantize`) at the NAR's widths (2,048 and 6,144 padded to 8,192), with the GPU's roundings."""
    from yue2_core.fast import _w8a8_triton as k
    types = dict(x_ptr="*bf16", d_ptr="*bf16", w_ptr="*bf16", xo_ptr="*bf16", q_ptr="*i8", s_ptr="*fp32", N="i32",
                 eps="fp32")
    ptx = _compiled(k.add_rmsnorm_quant_kernel, types, dict(HAS_D=True, BLOCK=2048, LIBDEVICE=True),
                    aligned=("x_ptr", "d_ptr", "xo_ptr", "q_ptr", "N"), num_warps=4).asm["ptx"]
    assert "mma" in ptx and "div.rn" in ptx and "cvt.rn.bf16" in ptx
    types = dict(gu_ptr="*bf16", q_ptr="*i8", s_ptr="*fp32", F="i32")
    ptx = _compiled(k.silu_mul_quant_kernel, types, dict(BLOCK=8192, LIBDEVICE=True),
                    aligned=("gu_ptr", "q_ptr", "F"), num_warps=8).asm["ptx"]
    assert "mma" in ptx and "div.rn" in ptx
