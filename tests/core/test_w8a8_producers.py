"""The W8A8 NAR's producers (stop 52, `fast.w8a8.add_rmsnorm_quantize` / `silu_mul_quantize`): add+RMSNorm and
SiLU·up writing the next product's int8 codes and row scales in one kernel, in Triton's CPU interpreter, bit for bit
against the two-step way they replace (`fast.fused.add_rmsnorm` / `silu_mul`, then `fast.w8a8.quantize_rows`); and
the NAR's fused velocity taking them (and not taking them where it must not). GPU: tests/core/test_w8a8_gpu.py."""
from __future__ import annotations

import pytest
import torch

from tests.core.test_fast_path import _run_ok


def test_producers_equal_the_separate_quantizer_in_interpreter():
    """Rows of 512 and 768 (a width that is not a power of two: the kernel pads its rotation to 1,024), with and
    without a residual delta; a NaN row gives a NaN scale and zero codes and leaves the other rows; a zero row of
    SiLU·up gives scale 1e-30. Codes, scales and the new residual equal the two-step results exactly."""
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from yue2_core.fast import fused, w8a8\n"
        "torch.manual_seed(0)\n"
        "for n in (512, 768):\n"
        "    x = (torch.randn(1, 3, n) * 2).to(torch.bfloat16)\n"
        "    d = torch.randn(1, 3, n).to(torch.bfloat16)\n"
        "    w = (1 + torch.randn(n) * 0.1).to(torch.bfloat16)\n"
        "    x[0, 1, 7] = float('nan') if n == 768 else x[0, 1, 7]\n"
        "    for delta in (d, None):\n"
        "        xo, codes, scales = w8a8.add_rmsnorm_quantize(x, delta, w, 1e-6)\n"
        "        x2, y = fused.add_rmsnorm(x, delta, w, 1e-6)\n"
        "        c2, s2 = w8a8.quantize_rows(y.reshape(3, n), 256)\n"
        "        assert torch.equal(xo.view(torch.int16), x2.view(torch.int16)), n\n"
        "        assert torch.equal(codes, c2), (n, (codes != c2).sum())\n"
        "        assert torch.equal(scales.isnan(), s2.isnan()) and torch.equal(scales.nan_to_num(), s2.nan_to_num())\n"
        "        assert (delta is None) == (xo is x)\n"
        "        if n == 768:\n"
        "            assert scales[1].isnan() and (codes[1] == 0).all() and scales[[0, 2]].isfinite().all()\n"
        "    gu = (torch.randn(4, 2 * n) * 3).to(torch.bfloat16)\n"
        "    gu[2] = 0\n"
        "    codes, scales = w8a8.silu_mul_quantize(gu)\n"
        "    c2, s2 = w8a8.quantize_rows(fused.silu_mul(gu), 256)\n"
        "    assert torch.equal(codes, c2) and torch.equal(scales, s2), n\n"
        "    assert scales[2] == torch.tensor(1e-30) and (codes[2] == 0).all() and (codes[0] != 0).any()\n"
        "for bad in (lambda: w8a8.add_rmsnorm_quantize(torch.zeros(2, 300, dtype=torch.bfloat16), None,\n"
        "                                              torch.ones(300), 1e-6),\n"
        "            lambda: w8a8.silu_mul_quantize(torch.zeros(2, 512)),\n"
        "            lambda: w8a8.silu_mul_quantize(torch.zeros(2, 256, dtype=torch.bfloat16))):\n"
        "    try:\n"
        "        bad()\n"
        "    except ValueError as e:\n"
        "        assert 'multiple of 256' in str(e), e\n"
        "    else:\n"
        "        raise AssertionError('accepted')\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


def test_fused_velocity_takes_the_producers_in_interpreter(tiny_paths):
    """The tiny int8 NAR marked for W8A8 (`int8_linears`), its fused velocity in bf16 (Triton's CPU interpreter):
    with `nar.W8A8_PRODUCERS` every layer's qkv, gate_up, down and the output head multiply codes written by the
    norm / SiLU·up kernels, and the velocity equals the one with the quantizer apart bit for bit; an adapter on a
    layer (`lora_side`) sends that layer back to the bf16 producer (its delta needs the unrotated input), and so do
    ConvRot groups other than 256 and a layer not marked for W8A8."""
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar\n"
        "from yue2_core import nar as N\n"
        "from yue2_core.fast import int8_kernels as K, w8a8\n"
        "from yue2_core.weights.quant import ConvRotLinear\n"
        "plain = ConvRotLinear._base\n"
        "def base(self, x):\n"  # the CPU forward keeps a dequantized copy; the CUDA one calls convrot_linear
        "    if self.w8a8 and x.reshape(-1, x.shape[-1]).shape[0] > K.MAX_ROWS:\n"
        "        return K.convrot_linear(x, self.weight, self.weight_scale, self.bias, self.group, force='w8a8')\n"
        "    return plain(self, x)\n"
        "ConvRotLinear._base = base\n"
        "made = []\n"
        "for name in ('add_rmsnorm_quantize', 'silu_mul_quantize'):\n"
        "    f = getattr(w8a8, name)\n"
        "    setattr(w8a8, name, lambda *a, f=f, name=name: made.append(name) or f(*a))\n"
        f"info = inspect_checkpoint({tiny_paths['int8']!r})\n"
        "ar, nar = load_ar(info, 'cpu', torch.bfloat16), load_nar(info, 'cpu', torch.bfloat16)\n"
        "assert N.int8_linears(nar) > 0\n"
        "toks = [151643] + list(range(100, 120)) + [151853 + i for i in range(30)] + [151852]\n"
        "st = torch.randn(30, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)\n"
        "kv = ar.layer_kv(toks)\n"
        "v1 = N.ChunkRenderer(nar, kv, 30, fused=True).velocity(st, 0.4)\n"
        "layers = nar.dims.layers\n"
        "assert made.count('add_rmsnorm_quantize') == 2 * layers + 1 and made.count('silu_mul_quantize') == layers\n"
        "N.W8A8_PRODUCERS = False\n"
        "made.clear()\n"
        "v2 = N.ChunkRenderer(nar, kv, 30, fused=True).velocity(st, 0.4)\n"
        "assert not made and torch.equal(v1, v2), (v1.float() - v2.float()).abs().max()\n"
        "N.W8A8_PRODUCERS = True\n"
        "nar.model.layers[0].mlp.down_proj.lora_side = object()\n"
        "assert not N._takes_codes(nar.model.layers[0].mlp.down_proj, 32)\n"
        "assert N._takes_codes(nar.model.layers[0].mlp.gate_up_proj, 32)\n"
        "assert not N._takes_codes(nar.model.layers[0].mlp.gate_up_proj, K.MAX_ROWS)\n"
        "gu = nar.model.layers[0].mlp.gate_up_proj\n"
        "for name, off, on in (('group', 64, 256), ('w8a8', False, True)):  # other ConvRot groups, unmarked\n"
        "    setattr(gu, name, off)\n"
        "    assert not N._takes_codes(gu, 32), name\n"
        "    setattr(gu, name, on)\n"
        "    assert N._takes_codes(gu, 32), name\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)
