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
    d_rel = ((lora_g - base_g) - (lora_p - base_p)).norm() / (lora_p - base_p).norm()
    print(f"{fmt}: graph vs portable with LoRA rel {rel:.2e}; LoRA moved logits by {moved:.2e}; "
          f"delta graph vs portable rel {d_rel:.2e}")
    assert moved > 0.05, "the adapter must change the logits visibly, else the comparison is vacuous"
    assert rel < 1e-2
    assert d_rel < 5e-2
