"""Numerical rules of the engine against independent float64 / pure-Python computations (runtime.md §3–§5,
checkpoint_format.md §2)."""
import math

import pytest
import torch

from yue2_core.constants import ABC_END, CODEC_OFFSET, EOD, MUSIC_END, VOCAB_SIZE
from yue2_core.layers import RMSNorm, apply_rope, rope_cos_sin
from yue2_core.nar import chunk_ranges, raw_timesteps, song_noise
from yue2_core.protocol import Sampling
from yue2_core.weights.quant import ConvRotEmbedding, ConvRotLinear, dequantize, hadamard, quantize, rotate
from yue2_core.sampling import allowed_mask, process_logits, window_penalty
from yue2_core.vae import VAEConfig, output_length


def test_hadamard_is_symmetric_orthogonal_pm_1_16():
    h = hadamard(256, torch.float64)
    assert torch.equal(h, h.T)
    assert torch.allclose(h @ h, torch.eye(256, dtype=torch.float64), atol=0)
    assert set(h.abs().unique().tolist()) == {1 / 16}
    r4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float64)
    assert torch.equal(hadamard(4, torch.float64), r4 / 2)


def test_convrot_linear_equals_dequantized_matmul():
    torch.manual_seed(0)
    w = torch.randn(48, 512) * 0.02
    q, s = quantize(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127 and s.shape == (48, 1) and (s > 0).all()
    deq = dequantize(q, s)
    rel = (deq - w).norm() / w.norm()
    assert rel < 0.01
    lin = ConvRotLinear(512, 48, dtype=torch.float32)
    lin.weight.copy_(q)
    lin.weight_scale.copy_(s)
    x = torch.randn(3, 512)
    assert torch.allclose(lin(x), x @ deq.T, atol=1e-5)
    emb = ConvRotEmbedding(48, 512, dtype=torch.float32)
    emb.weight.copy_(q)
    emb.weight_scale.copy_(s)
    assert torch.allclose(emb(torch.tensor([3, 7])), deq[[3, 7]], atol=1e-6)


def test_rotate_is_blockwise():
    x = torch.randn(2, 512, dtype=torch.float64)
    h = hadamard(256, torch.float64)
    expect = torch.cat([x[:, :256] @ h, x[:, 256:] @ h], dim=1)
    assert torch.allclose(rotate(x), expect)


def test_rmsnorm_bf16_rounding_order():
    torch.manual_seed(1)
    x = torch.randn(4, 64).bfloat16()
    n = RMSNorm(64, 1e-6, torch.bfloat16)
    n.weight.data = (1 + 0.1 * torch.randn(64)).bfloat16()
    r = (x.double().pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt().float().bfloat16()
    expect = (x * r) * n.weight  # two bf16 multiplies, in this order
    assert torch.equal(n(x), expect)


def test_rope_split_half_theta_1e6():
    pos = torch.arange(5)[None]
    cos, sin = rope_cos_sin(pos, 8, 1_000_000.0)
    x = torch.randn(1, 5, 1, 8, dtype=torch.float64)
    got = apply_rope(x, cos.unsqueeze(2).double(), sin.unsqueeze(2).double())
    for p in range(5):
        for i in range(4):
            ang = p / (1_000_000.0 ** (2 * i / 8))
            x1, x2 = x[0, p, 0, i].item(), x[0, p, 0, i + 4].item()
            assert math.isclose(got[0, p, 0, i].item(), x1 * math.cos(ang) - x2 * math.sin(ang), abs_tol=1e-6)
            assert math.isclose(got[0, p, 0, i + 4].item(), x2 * math.cos(ang) + x1 * math.sin(ang), abs_tol=1e-6)


def test_allowed_masks():
    m = allowed_mask(VOCAB_SIZE, "abc", torch.float32, "cpu")
    ok = torch.isfinite(m).nonzero().flatten().tolist()
    assert ok == list(range(EOD)) + [ABC_END]
    m = allowed_mask(VOCAB_SIZE, "semantic", torch.float32, "cpu")
    ok = torch.isfinite(m).nonzero().flatten().tolist()
    assert ok == [MUSIC_END] + list(range(CODEC_OFFSET, CODEC_OFFSET + 32768))


def test_window_penalty_counts():
    scores = torch.tensor([2.0, -2.0, 1.0, -1.0, 0.5])
    got = window_penalty(scores.clone(), [0, 0, 1, 3, 3, 3], 1.2)
    expect = [2.0 / 1.2 ** 2, -2.0 * 1.2, 1.0, -1.0 * 1.2 ** 3, 0.5]
    assert torch.allclose(got, torch.tensor(expect))
    assert torch.equal(window_penalty(scores, [], 1.2), scores)


def _row(values: dict):
    row = torch.full((VOCAB_SIZE,), -5.0)
    for k, v in values.items():
        row[k] = v
    return row


def test_min_tokens_blocks_end_token():
    s = Sampling(temperature=0.0, min_tokens=10, penalty_window=1, repetition_penalty=1.0)
    row = _row({MUSIC_END: 9.0, CODEC_OFFSET + 5: 1.0})
    assert int(process_logits(row, s, [], 3, "semantic").argmax()) == CODEC_OFFSET + 5
    assert int(process_logits(row, s, [], 10, "semantic").argmax()) == MUSIC_END


def test_topk_keeps_ties_and_top_p_keeps_first():
    ids = [CODEC_OFFSET + i for i in range(6)]
    row = _row({ids[0]: 5.0, ids[1]: 3.0, ids[2]: 3.0, ids[3]: 3.0, ids[4]: 1.0})
    s = Sampling(temperature=1.0, top_p=1.0, top_k=2, repetition_penalty=1.0, min_tokens=0)
    finite = torch.isfinite(process_logits(row, s, [], 0, "semantic")).nonzero().flatten().tolist()
    assert finite == ids[:4]  # k = 2 but the three tied at 3.0 all survive
    s = Sampling(temperature=1.0, top_p=0.01, top_k=100, repetition_penalty=1.0, min_tokens=0)
    finite = torch.isfinite(process_logits(row, s, [], 0, "semantic")).nonzero().flatten().tolist()
    assert finite == [ids[0]]
    # legacy off keeps three
    fin = torch.isfinite(process_logits(row.bfloat16(), s, [], 0, "semantic", legacy_off=True)).nonzero()
    assert len(fin) == 3


def test_top_p_mass_rule():
    # probabilities 0.5, 0.3, 0.2 with top_p 0.75: preceding mass 0, 0.5, 0.8 → keep the first two
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    row = _row({CODEC_OFFSET + i: float(v) for i, v in enumerate(logits)})
    row[CODEC_OFFSET + 3:CODEC_OFFSET + 32768] = float("-inf")
    row[MUSIC_END] = float("-inf")
    s = Sampling(temperature=1.0, top_p=0.75, top_k=100, repetition_penalty=1.0, min_tokens=0)
    fin = torch.isfinite(process_logits(row, s, [], 0, "semantic")).nonzero().flatten().tolist()
    assert fin == [CODEC_OFFSET, CODEC_OFFSET + 1]


def test_raw_timesteps_and_noise():
    pairs = raw_timesteps(32)
    assert pairs[0][0] == 20.0 and len(pairs) == 32
    for k, (a, b) in enumerate(pairs):
        t = 1 - k / 32
        if k:
            assert math.isclose(a, math.log(t / (1 - t)), rel_tol=1e-12)
        tm = t - 1 / 64
        assert math.isclose(b, max(-20, min(20, math.log(tm / (1 - tm)))), rel_tol=1e-12)
    n = song_noise(10, 7)
    g = torch.Generator().manual_seed(7)
    assert torch.equal(n, torch.randn((10, 64), generator=g))
    assert torch.equal(song_noise(4, 7), n[:4])  # drawn once: a shorter song is a prefix


def test_chunk_ranges_rule():
    assert chunk_ranges(9000, 1000) == [(0, 9000)]
    size = (24576 - 7000 - 3) // 2
    assert chunk_ranges(9000, 7000) == [(0, size), (size, 9000)]
    with pytest.raises(ValueError):
        chunk_ranges(0, 10)


def test_vae_length_rule():
    cfg = VAEConfig(64, 2048, ((2048, 1024, 6), (1024, 512, 5), (512, 256, 4), (256, 128, 4), (128, 64, 2),
                               (64, 64, 2)))
    for t in (1, 40, 5371):
        assert output_length(t, cfg) == 1920 * t - 64
