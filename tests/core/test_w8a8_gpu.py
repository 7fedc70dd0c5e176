"""W8A8 products of the int8 NAR on an NVIDIA GPU (marked `gpu`; skipped with a visible reason elsewhere): the
kernels against `w8a8.reference` (the same arithmetic in PyTorch ops: cuBLAS may order the rotation's sums
differently, a last-bit difference in a rotated value, so near-equality rather than equality), the automatic path
choice, and whole renders with YUE2_NAR_LINEARS=w8a8 (graphed = eager, close to the bf16 layers' render).
CPU interpreter tests: tests/core/test_w8a8.py; speed: bench/nar_w8a8.py."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("m,k,n", [(40, 512, 96), (5373, 2048, 4096), (300, 6144, 2048), (1500, 2048, 12288)])
def test_kernels_close_to_reference(m, k, n):
    from yue2_core.fast import w8a8
    from yue2_core.weights.quant import quantize, rotate
    g = torch.Generator(device="cuda").manual_seed(m)
    q, s = quantize(torch.randn(n, k, device="cuda", generator=g))
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
    codes, scales = w8a8.quantize_rows(x, 256)
    xr = rotate(x, 256)
    a = (xr.abs().amax(-1).float() / 127).clamp(min=1e-30)
    assert (scales == a).float().mean().item() > 0.99
    assert torch.allclose(scales, a, rtol=1e-2)
    y, ref = w8a8.linear(x, q, s, b, 256), w8a8.reference(x, q, s, b, 256)
    assert (y == ref).float().mean().item() > 0.95, (m, k, n)
    assert ((y.float() - ref.float()).norm() / ref.float().norm()).item() < 2e-3
    # given the same codes the GEMM is exact up to the output rounding: equal to the reference's epilogue
    acc = codes.double() @ q.double().t()
    want = ((acc.float() * (scales[:, None] * s.reshape(1, -1).float())).to(torch.bfloat16) + b)
    assert torch.equal(w8a8.gemm(codes, scales, q, s.reshape(-1).float(), b), want)


def test_exact_inputs_bit_equal_to_the_reference():
    """Inputs whose rotation is exact in any summation order (small integers: every partial sum a multiple of 1/16
    below 2⁸), so cuBLAS and the kernel see the same x̂: codes, row scales and outputs must then be the reference's
    bits. The row scale max|x̂|/127 rounded as PyTorch computes it on CUDA: times fp32(1/127), ATen's division by a
    scalar there (stop 51, the first GPU run: an IEEE division left 6 % of the scales a last bit off; Triton's `/` is
    div.full.f32, within 2 ulp, stop-48 diff review)."""
    from yue2_core.fast import w8a8
    from yue2_core.weights.quant import quantize, rotate
    g = torch.Generator(device="cuda").manual_seed(7)
    for m, k, n in ((4000, 2048, 256), (300, 6144, 64)):
        q, s = quantize(torch.randn(n, k, device="cuda", generator=g))
        x = torch.randint(-8, 9, (m, k), device="cuda", generator=g).to(torch.bfloat16)
        x[:, 0] += torch.arange(m, device="cuda").remainder(97).to(torch.bfloat16)  # many different row maxima
        b = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
        xr = rotate(x.float(), 256).to(torch.bfloat16)  # fp32 sums: exact here, whatever cuBLAS does with bf16
        a = (xr.abs().amax(-1).float() / 127).clamp(min=1e-30)
        want = (xr / a[:, None].to(xr.dtype)).round().clamp(-128, 127).to(torch.int8)
        codes, scales = w8a8.quantize_rows(x, 256)
        assert torch.equal(scales, a), (scales != a).float().mean().item()
        assert torch.equal(codes, want)
        acc = want.double() @ q.double().t()
        y = (acc.float() * (a[:, None] * s.reshape(1, -1).float())).to(torch.bfloat16) + b
        assert torch.equal(w8a8.linear(x, q, s, b, 256), y)


def test_automatic_choice_on_cuda():
    """convrot_linear takes W8A8 for a marked layer's bf16 input of more than 16 rows only."""
    from yue2_core.fast import int8_kernels as K, w8a8
    from yue2_core.weights.quant import quantize
    q, s = quantize(torch.randn(64, 256, device="cuda"))
    big = torch.randn(40, 256, device="cuda").to(torch.bfloat16)
    assert torch.equal(K.convrot_linear(big, q, s, None, 256, w8a8=True), w8a8.linear(big, q, s, None, 256))
    assert torch.equal(K.convrot_linear(big, q, s, None, 256), K.convrot_linear(big, q, s, None, 256, force="dequant"))
    small = big[:8]
    assert torch.equal(K.convrot_linear(small, q, s, None, 256, w8a8=True), K.convrot_linear(small, q, s, None, 256))


def test_render_w8a8_graphed_equals_eager_and_close_to_bf16(tiny_paths, monkeypatch):
    """A tiny int8 song's NAR render with YUE2_NAR_LINEARS=w8a8: the graphed velocity gives the eager one's bits,
    and the latents stay within W8A8's error of the bf16-layer render (and differ from it: the path ran)."""
    from yue2_core.nar import ChunkRenderer, chunk_tokens, solve, song_noise
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar
    from yue2_core.weights.quant import ConvRotLinear
    info = inspect_checkpoint(tiny_paths["int8"])
    ar = load_ar(info, "cuda", torch.bfloat16)
    monkeypatch.setenv("YUE2_NAR_LINEARS", "bf16")  # (unset: auto, W8A8 on Hopper)
    nar_b = load_nar(info, "cuda", torch.bfloat16)
    monkeypatch.setenv("YUE2_NAR_LINEARS", "w8a8")
    nar_8 = load_nar(info, "cuda", torch.bfloat16)
    assert not any(isinstance(m, ConvRotLinear) for m in nar_b.modules())
    assert all(m.w8a8 for m in nar_8.modules() if isinstance(m, ConvRotLinear))
    frames = 300
    codes = torch.randint(0, 32768, (frames,), generator=torch.Generator().manual_seed(0)).tolist()
    kv = ar.layer_kv(chunk_tokens([151643] + list(range(100, 140)), codes, 0, frames))
    noise = song_noise(frames, 3)
    graphed = solve(ChunkRenderer(nar_8, kv, frames), noise, 8)
    eager = solve(ChunkRenderer(nar_8, kv, frames, graph=False), noise, 8)
    plain = solve(ChunkRenderer(nar_b, kv, frames), noise, 8)
    assert torch.equal(graphed, eager)
    assert graphed.isfinite().all()
    rel = ((graphed.float() - plain.float()).norm() / plain.float().norm()).item()
    assert 0 < rel < 5e-2, rel


def test_producers_equal_the_separate_quantizer(monkeypatch, tiny_paths):
    """Stop 52: add+RMSNorm and SiLU·up writing the W8A8 codes themselves give the bits of the two-step way
    (`fused.add_rmsnorm` / `silu_mul`, then `quantize_rows`) at a song's shapes on the GPU, and a tiny int8 NAR's
    render through them equals its render with the quantizer apart (`nar.W8A8_PRODUCERS`)."""
    from yue2_core import nar as N
    from yue2_core.fast import fused, w8a8
    g = torch.Generator(device="cuda").manual_seed(5)
    x = (torch.randn(1, 5373, 2048, device="cuda", generator=g) * 3).to(torch.bfloat16)
    d = torch.randn(1, 5373, 2048, device="cuda", generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(2048, device="cuda", generator=g)).to(torch.bfloat16)
    for delta in (d, None):
        xo, codes, scales = w8a8.add_rmsnorm_quantize(x, delta, w, 1e-6)
        x2, y = fused.add_rmsnorm(x, delta, w, 1e-6)
        c2, s2 = w8a8.quantize_rows(y.reshape(-1, 2048), 256)
        assert torch.equal(xo, x2) and torch.equal(scales, s2)
        assert torch.equal(codes, c2), (codes != c2).float().mean().item()
    gu = (torch.randn(5373, 12288, device="cuda", generator=g) * 3).to(torch.bfloat16)
    codes, scales = w8a8.silu_mul_quantize(gu)
    c2, s2 = w8a8.quantize_rows(fused.silu_mul(gu), 256)
    assert torch.equal(scales, s2) and torch.equal(codes, c2), (codes != c2).float().mean().item()

    from yue2_core.nar import ChunkRenderer, chunk_tokens, solve, song_noise
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar
    info = inspect_checkpoint(tiny_paths["int8"])
    ar = load_ar(info, "cuda", torch.bfloat16)
    monkeypatch.setenv("YUE2_NAR_LINEARS", "w8a8")
    nar_8 = load_nar(info, "cuda", torch.bfloat16)
    frames = 300
    toks = torch.randint(0, 32768, (frames,), generator=torch.Generator().manual_seed(1)).tolist()
    kv = ar.layer_kv(chunk_tokens([151643] + list(range(100, 140)), toks, 0, frames))
    noise = song_noise(frames, 4)
    calls = []
    monkeypatch.setattr(w8a8, "silu_mul_quantize", lambda gu, f=w8a8.silu_mul_quantize: calls.append(1) or f(gu))
    fused_way = solve(ChunkRenderer(nar_8, kv, frames), noise, 8)
    assert calls, "the render did not take the producers"
    monkeypatch.setattr(N, "W8A8_PRODUCERS", False)
    apart = solve(ChunkRenderer(nar_8, kv, frames), noise, 8)
    assert torch.equal(fused_way, apart)
