"""Adding adapters to engine modules (yue2_core.weights.lora.apply): merged float weights, the int8 side delta, the
rotated form the fused decode step uses, strength 0, stacking and replacements — against independent fp64 maths."""
from __future__ import annotations

import pytest
import torch

from yue2_core.errors import AdapterError
from yue2_core.weights.lora.apply import (Applied, SideDelta, apply_stack, check_strength, merge_into, plan_expert,
                                          set_side)
from yue2_core.weights.lora.model import Adapter, BiasDiff, Diff, Kron, LowRank, Patch, Replace
from yue2_core.weights.quant import ConvRotLinear, dequantize, quantize


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _lowrank(out_rows, inp, r, seed, scale=1.0, dtype=torch.float16):
    g = _gen(seed)
    return LowRank(down=(torch.randn(r, inp, generator=g) * 0.05).to(dtype),
                   up=(torch.randn(out_rows, r, generator=g) * 0.05).to(dtype), scale=scale)


class TwoLinears(torch.nn.Module):
    """A float and an int8 linear, named like engine modules."""

    def __init__(self, out=512, inp=256, bias=False):
        super().__init__()
        g = _gen(0)
        w = torch.randn(out, inp, generator=g) * 0.02
        self.fl = torch.nn.Linear(inp, out, bias=bias, dtype=torch.bfloat16)
        self.fl.weight.data = w.to(torch.bfloat16)
        if bias:
            self.fl.bias.data = (torch.randn(out, generator=g) * 0.02).to(torch.bfloat16)
        self.q = ConvRotLinear(inp, out, bias=bias)
        q, s = quantize(w)
        self.q.weight.copy_(q)
        self.q.weight_scale.copy_(s)
        if bias:
            self.q.bias.data = self.fl.bias.data.clone()


def _adapter(patches):
    return Adapter(path="mem", layout="test", patches=patches, scale_rule="test")


def test_merge_equals_fp64_within_bf16_rounding():
    m = TwoLinears()
    w0 = m.fl.weight.detach().double().clone()
    q_rows = _lowrank(256, 256, 4, 1, scale=0.5)  # rows 0..255 (a "q" slice)
    v_rows = _lowrank(128, 256, 2, 2, scale=2.0)  # rows 384..511
    a = _adapter([Patch("ar", "fl", q_rows, rows=(0, 256)), Patch("ar", "fl", v_rows, rows=(384, 128))])
    apply_stack(m, [Applied(a, 0.7, 0.0)], "ar")
    want = w0.clone()
    want[0:256] += 0.7 * q_rows.dense()
    want[384:512] += 0.7 * v_rows.dense()
    got = m.fl.weight.double()
    # round-to-nearest bf16 of the fp32 sum: within half an ulp of bf16 (2^-8 relative) plus fp32 error
    assert torch.allclose(got, want, rtol=2 ** -8, atol=1e-7)
    assert not torch.equal(got, w0)
    x = torch.randn(3, 256, generator=_gen(5)).to(torch.bfloat16)
    ref = x.double() @ want.T
    assert ((m.fl(x).double() - ref).abs().max() / ref.abs().max()) < 1e-2


def test_side_delta_equals_exact_delta_on_int8():
    m = TwoLinears()
    lr = _lowrank(512, 256, 8, 3, scale=1.5)
    a = _adapter([Patch("ar", "q", lr)])
    x = torch.randn(4, 256, generator=_gen(6)).to(torch.bfloat16)
    base = m.q(x).float()
    apply_stack(m, [Applied(a, 1.0, 1.0)], "ar")
    assert isinstance(m.q.lora_side, SideDelta)
    d = m.q.lora_side.delta(x).double()
    exact = x.double() @ lr.dense().T
    assert ((d - exact).norm() / exact.norm()) < 1e-3  # the int8 rule of the issue: the bf16 delta within 1e-3
    # module output = base int8 output + the delta (rounded once to bf16)
    out = m.q(x).float()
    assert torch.allclose(out, (base + d.float()).to(torch.bfloat16).float(), rtol=0, atol=1e-2)
    # the codes are untouched
    assert m.q.weight.dtype == torch.int8


def test_int8_delta_equals_bf16_delta():
    """The same patch on the float and the int8 layer of the same weight: equal deltas (int8: side path)."""
    m = TwoLinears()
    lr = _lowrank(512, 256, 4, 7)
    x = torch.randn(2, 256, generator=_gen(8)).to(torch.bfloat16)
    a = _adapter([Patch("ar", "fl", lr), Patch("ar", "q", lr)])
    fw0 = m.fl.weight.float().clone()
    apply_stack(m, [Applied(a, 1.0, 1.0)], "ar")
    bf16_delta = x.double() @ (m.fl.weight.double() - fw0.double()).T  # the merged delta, as the bf16 model holds it
    int8_delta = m.q.lora_side.delta(x).double()
    assert ((int8_delta - bf16_delta).norm() / bf16_delta.norm()) < 1e-2  # bf16 merge rounding on the float side
    exact = x.double() @ lr.dense().T
    assert ((int8_delta - exact).norm() / exact.norm()) < 1e-3


def test_rotated_side_delta_matches_unrotated():
    """The fused decode step only has x̃ = x·H (bf16): Ã = A·H gives the same delta within bf16 input rounding."""
    from yue2_core.weights.quant import rotate
    m = TwoLinears()
    lr = _lowrank(512, 256, 4, 9)
    kr = Kron(w1=torch.randn(8, 4, generator=_gen(10)) * 0.1, w2=torch.randn(64, 64, generator=_gen(11)) * 0.1,
              scale=0.3)
    side = SideDelta.build([(1.0, Patch("ar", "q", lr)), (0.5, Patch("ar", "q", kr))], 512, 256)
    x = torch.randn(3, 256, generator=_gen(12)).to(torch.bfloat16)
    xr = rotate(x.float()).to(torch.bfloat16)
    a, b = side.delta(x).double(), side.delta_rotated(xr, 256).double()
    assert ((a - b).norm() / a.norm()) < 1e-2
    exact = x.double() @ (lr.dense() + 0.5 * kr.dense()).T
    assert ((a - exact).norm() / exact.norm()) < 1e-3


def test_strength_zero_is_bit_identical():
    m, ref = TwoLinears(bias=True), TwoLinears(bias=True)
    x = torch.randn(2, 256, generator=_gen(13)).to(torch.bfloat16)
    a = _adapter([Patch("nar", "fl", _lowrank(512, 256, 4, 1)), Patch("nar", "q", _lowrank(512, 256, 4, 2)),
                  Patch("nar", "fl", Replace(torch.zeros(512, 256), torch.zeros(512)))])
    apply_stack(m, [Applied(a, 1.0, 0.0)], "nar")
    assert torch.equal(m.fl.weight, ref.fl.weight) and torch.equal(m.fl.bias, ref.fl.bias)
    assert m.q.lora_side is None
    assert torch.equal(m.q(x), ref.q(x)) and torch.equal(m.fl(x), ref.fl(x))


def test_two_adapters_add():
    m = TwoLinears()
    l1, l2 = _lowrank(512, 256, 4, 21), _lowrank(512, 256, 2, 22, scale=3.0)
    x = torch.randn(2, 256, generator=_gen(23)).to(torch.bfloat16)
    stack = [Applied(_adapter([Patch("ar", "q", l1)]), 0.5, 1.0), Applied(_adapter([Patch("ar", "q", l2)]), -1.2, 1.0)]
    apply_stack(m, stack, "ar")
    assert m.q.lora_side.down.shape[0] == 6  # one concatenated pair for both adapters
    d = m.q.lora_side.delta(x).double()
    exact = x.double() @ (0.5 * l1.dense() - 1.2 * l2.dense()).T
    assert ((d - exact).norm() / exact.norm()) < 1e-3


def test_replacement_full_strength_and_diffs():
    m = TwoLinears(bias=True)
    g = _gen(30)
    new_w, new_b = torch.randn(512, 256, generator=g) * 0.01, torch.randn(512, generator=g) * 0.01
    bias_d = torch.randn(512, generator=g) * 0.01
    diff = torch.randn(512, 256, generator=g) * 0.001
    a = _adapter([Patch("nar", "fl", Replace(new_w, new_b)), Patch("nar", "q", Replace(new_w, new_b)),
                  Patch("nar", "fl", BiasDiff(bias_d)), Patch("nar", "fl", Diff(diff))])
    apply_stack(m, [Applied(a, 1.0, 0.25)], "nar")  # replacement ignores the strength; diffs scale
    want_w = (new_w.double() + 0.25 * diff.double())
    assert torch.allclose(m.fl.weight.double(), want_w, rtol=2 ** -8, atol=1e-6)
    assert torch.allclose(m.fl.bias.double(), new_b.double() + 0.25 * bias_d.double(), rtol=2 ** -8, atol=1e-6)
    x = torch.randn(2, 256, generator=g).to(torch.bfloat16)
    want = (x.double() @ new_w.double().T + new_b.double())
    assert torch.allclose(m.q(x).double(), want, atol=2e-3)


def test_bad_targets_and_shapes_are_refused():
    m = TwoLinears()
    with pytest.raises(AdapterError, match="no linear layer"):
        plan_expert(m, [Applied(_adapter([Patch("ar", "nothing.here", _lowrank(4, 256, 2, 0))]))], "ar")
    with pytest.raises(AdapterError, match=r"needs \[512, 256\]"):
        plan_expert(m, [Applied(_adapter([Patch("ar", "fl", _lowrank(512, 128, 2, 0), keys=("k.lora_A",))]))], "ar")
    with pytest.raises(AdapterError, match="do not fit"):
        plan_expert(m, [Applied(_adapter([Patch("ar", "fl", _lowrank(128, 256, 2, 0), rows=(448, 128))]))], "ar")
    with pytest.raises(AdapterError, match="has no bias"):
        plan_expert(m, [Applied(_adapter([Patch("ar", "fl", BiasDiff(torch.zeros(512)))]))], "ar")
    for bad in (float("nan"), 5.5, "x", None):
        with pytest.raises(AdapterError):
            check_strength(bad, "strength_ar")


def test_set_side_clears_and_moves():
    m = TwoLinears()
    side = SideDelta.build([(1.0, Patch("ar", "q", _lowrank(512, 256, 2, 0)))], 512, 256)
    assert set_side(m, {"q": side}) == 1 and m.q.lora_side is not None
    assert set_side(m, {}) == 0 and m.q.lora_side is None


def test_merge_into_matches_comfy_arithmetic():
    """ComfyUI 0.3.75 adds each patch to an fp32 copy in order and casts back (round to nearest): merge_into does
    exactly that, so the nodes (through ModelPatcher) and the command line hold the same weights."""
    w = (torch.randn(64, 256, generator=_gen(40)) * 0.02).to(torch.bfloat16)
    lr = _lowrank(64, 256, 4, 41, scale=0.5)
    ours = merge_into(w.float().clone(), [(0.8, Patch("ar", "x", lr))]).to(torch.bfloat16)
    comfy = w.float().clone()
    comfy += (0.8 * 0.5) * torch.mm(lr.up.float(), lr.down.float())
    assert torch.equal(ours, comfy.to(torch.bfloat16)) or \
        (ours.float() - comfy.to(torch.bfloat16).float()).abs().max() <= 2 ** -14


def test_add_rotated_in_place_equals_delta_rotated():
    from yue2_core.weights.quant import rotate
    lr = _lowrank(512, 256, 4, 50)
    side = SideDelta.build([(0.9, Patch("ar", "q", lr)), (1.0, Patch("ar", "q", Diff(torch.randn(512, 256) * 1e-3))),
                            (1.0, Patch("ar", "q", BiasDiff(torch.randn(512) * 1e-3)))], 512, 256)
    xr = rotate(torch.randn(2, 256, generator=_gen(51))).to(torch.bfloat16)
    base = torch.randn(2, 512, generator=_gen(52))
    got = side.add_rotated_(xr, base.clone(), 256)
    assert torch.allclose(got, base + side.delta_rotated(xr, 256), atol=1e-6)


def test_opt_in_bf16_merge_of_int8_layers(monkeypatch):
    """YUE2_LORA_INT8=bf16: every int8 layer linear becomes a bf16 nn.Linear (dequantized), the adapter merged."""
    class Layers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([TwoLinears(), TwoLinears()])

    m = Layers()
    lr = _lowrank(512, 256, 4, 60)
    w_deq = m.model.layers[0].q.dequantized(torch.float64)
    monkeypatch.setenv("YUE2_LORA_INT8", "bf16")
    counts = apply_stack(m, [Applied(_adapter([Patch("ar", "model.layers.0.q", lr)]), 1.0, 1.0)], "ar")
    assert counts == {"merged": 1, "side": 0, "int8_mode": "bf16"}
    assert all(not isinstance(l.q, ConvRotLinear) for l in m.model.layers)  # both layers: one kernel kind
    want = w_deq + lr.dense()
    err = (m.model.layers[0].q.weight.double() - want).abs()
    assert (err <= 2 ** -8 * want.abs() + 2 ** -8 * w_deq.abs() + 1e-9).all()  # two bf16 roundings: W, then W + ΔW
    monkeypatch.setenv("YUE2_LORA_INT8", "merge")
    with pytest.raises(Exception, match="YUE2_LORA_INT8"):
        apply_stack(TwoLinears(), [Applied(_adapter([Patch("ar", "q", lr)]), 1.0, 1.0)], "ar")
