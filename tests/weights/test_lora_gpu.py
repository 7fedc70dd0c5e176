"""Adapters on the fast GPU path (marked `gpu`): the CUDA-graph decode step with fused kernels carries the LoRA delta
— int8 through the side delta in the rotated basis (Ã = A·H), bf16 merged — equal to the portable path's."""
from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

sys.path.insert(0, os.path.dirname(__file__))
from lora_testlib import random_adapter  # noqa: E402

from yue2_core.fast import decode as fd  # noqa: E402
from yue2_core.protocol import Sampling, SongRequest, semantic_prefix  # noqa: E402
from yue2_core.weights.lora.apply import Applied, apply_stack  # noqa: E402

PHASE = slice(151852, 184621)  # semantic phase columns


@pytest.fixture(scope="module")
def lora_paths(tmp_path_factory):
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    root = tmp_path_factory.mktemp("lora_gpu")
    paths = {}
    for fmt in ("bf16", "int8"):
        paths[fmt] = str(root / f"tiny_{fmt}.safetensors")
        write_synthetic_checkpoint(paths[fmt], profile="tiny", fmt=fmt, seed=0)
    return paths


def _logits(eng, prefix, forced, graph: bool):
    """Semantic-phase logits [len(forced), W] after the prefix and each forced token: graph decoder or portable."""
    if graph:
        s = Sampling(temperature=0.0, min_tokens=len(forced) + 1, max_tokens=len(forced) + 1)
        dec = fd.PhaseDecoder(eng.ar, [prefix], s, [1], "semantic", use_graph=True)
        assert dec.fused, "the fused step must run for this test to mean anything"
        dec._allocate()
        dec._prefill()
        rows = [dec.logits[0].float().clone()]
        g = dec._graph(min(1024, dec.capacity))
        for t in forced[:-1]:
            dec.forced_t[dec.step] = t
            g.replay()
            rows.append(dec.logits[0].float().clone())
        return torch.stack(rows), dec
    cache = eng.ar.new_cache(1, len(prefix) + len(forced) + 1)
    rows = [eng.ar.prefill(torch.tensor([prefix], device="cuda"), cache)[0, PHASE].float()]
    for t in forced[:-1]:
        rows.append(eng.ar.decode(torch.tensor([[t]], device="cuda"), cache)[0, PHASE].float())
    return torch.stack(rows), None


@pytest.mark.parametrize("fmt", ["int8", "bf16"])
def test_lora_under_cuda_graph_equals_portable(lora_paths, fmt):
    from yue2_core.pipeline import YuE2Engine
    eng = YuE2Engine.load(lora_paths[fmt], device="cuda", parts=("ar",))
    sp = semantic_prefix(SongRequest("pop", "la la", cot="full"), [], eng.tokenizer.encode)
    forced = [151853 + t for t in (3, 77, 1000, 5, 31000, 12, 9, 400)]
    base_g, _ = _logits(eng, sp, forced, True)
    base_p, _ = _logits(eng, sp, forced, False)
    apply_stack(eng.ar, [Applied(random_adapter(eng.ar.dims, rank=8, experts=("ar",), device="cpu"), 1.0, 1.0)],
                "ar")
    lora_g, dec = _logits(eng, sp, forced, True)
    lora_p, _ = _logits(eng, sp, forced, False)
    if fmt == "int8":
        assert dec.int8_layers and dec.gemv, "int8 layers must go through the W8A16 GEMV + side delta"
    rel = (lora_g - lora_p).abs().max() / lora_p.abs().max()
    moved = (lora_p - base_p).abs().max() / base_p.abs().max()
    base_rel = (base_g - base_p).abs().max() / base_p.abs().max()
    dg, dp = (lora_g - base_g).flatten(), (lora_p - base_p).flatten()
    cos = torch.dot(dg, dp) / (dg.norm() * dp.norm())
    print(f"{fmt}: graph vs portable rel {base_rel:.2e} without, {rel:.2e} with the LoRA; the LoRA moved the logits "
          f"by {moved:.2e}; cosine of its change graph vs portable {cos:.5f}")
    assert moved > 0.05, "the adapter must change the logits visibly, else the comparison is vacuous"
    assert rel < 1e-2  # the fast path's usual tolerance (tests/core/test_cuda_fast.py)
    assert cos > 0.99  # the graph applies the same change (what is left is the base path's own rounding)


def test_cuda_hilo_side_delta_matches_fp32():
    """The two-launch CUDA form (bf16 hi ‖ lo rows of Ã, fp32 output) equals the fp32 side delta to ~1e-5."""
    from yue2_core.weights.lora.apply import SideDelta
    from yue2_core.weights.lora.model import LowRank, Patch
    from yue2_core.weights.quant import rotate
    g = torch.Generator().manual_seed(0)
    lr = LowRank(torch.randn(64, 2048, generator=g) * 0.02, torch.randn(4096, 64, generator=g) * 0.02, 1.0)
    side = SideDelta.build([(1.0, Patch("ar", "x", lr))], 4096, 2048, device="cuda")
    xr = rotate(torch.randn(2, 2048, generator=g)).to(torch.bfloat16).cuda()
    fast = side.add_rotated_(xr, torch.zeros(2, 4096, device="cuda"), 256)
    ref = xr.double() @ rotate(lr.down.double()).cuda().T @ lr.up.double().cuda().T
    assert side._rotated[("hilo", 256)] is not None, "the bf16 GEMM with fp32 output should exist on CUDA"
    assert ((fast.double() - ref).norm() / ref.norm()) < 1e-4
