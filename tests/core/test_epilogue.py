"""`fast.epilogue` (a layer product and its consumer kernel in one launch, the consumer run by the last program of
each output group) in Triton's CPU interpreter: equal to `gemv.gemv` followed by the separate `fast.fused` kernel,
for tensor-core and CUDA-core configurations, split or not, fp16 and int8 (rotated outputs), 1–3 rows, with the
counters back at zero; then a decoder with YUE2_GEMV_EPILOGUE=1 against the same decoder without it. The kernels'
PTX for sm_90 is checked in tests/core/test_pdl_ptx.py; GPU timing: bench/gpu_session.sh."""
from __future__ import annotations

import textwrap

import pytest

from tests.core.test_fast_path import _run_ok, tiny_fp16_ar

PAIRS = textwrap.dedent("""
    import torch
    from yue2_core.fast import gemv as G, fused, epilogue as E
    from yue2_core.quant import quantize
    torch.manual_seed(0)
    NH, NKV, D, H, F, EPS = 2, 1, 128, 512, 512, 1e-6  # H = 512: two 256-groups in the rotated row norm
    cnt = E.counters(NH, NKV, F, 'cpu')
    checked = 0
    for cfg in (G.Config(bn=32, bk=128, split=2), G.Config(bn=64, bk=256, split=1),
                G.Config(bn=16, bk=128, split=2, dot=False), G.Config(bn=32, bk=256, split=1, dot=False)):
        G.choose = lambda n, k, m, int8, cfg=cfg: cfg
        for int8 in (False, True):
            def weight(n, k):
                w = torch.randn(n, k) * 0.05
                if not int8:
                    return w.half(), None
                q, s = quantize(w)
                return q, s.view(-1).contiguous()
            wqkv, wo, wgu, wd = weight((NH + 2 * NKV) * D, H), weight(H, NH * D), weight(2 * F, H), weight(H, F)
            qn, kn, nw = [(1 + 0.1 * torch.randn(n)).half() for n in (D, D, H)]
            for m in (1, 2, 3):
                assert E.fits(H, NH, NKV, D, F, m, int8, 'cpu')
                y = torch.randn(m, H).half()
                pos = torch.tensor([3, 9, 14][:m])
                cos, sin = torch.randn(m, D // 2), torch.randn(m, D // 2)
                caches = [torch.zeros(m, NKV, 16, D).half() for _ in range(4)]
                q1 = fused.qk_norm_rope_store(G.gemv(y, *wqkv, partial=True), qn, kn, cos, sin, pos, caches[0],
                                              caches[1], NH, NKV, D, EPS)
                runs = torch.zeros(64, dtype=torch.int32)  # each group's consumer must run exactly once
                q2 = E.qkv_rope_store(y, *wqkv, cnt, qn, kn, cos, sin, pos, caches[2], caches[3], NH, NKV, D, EPS,
                                      runs=runs)
                assert runs[:NH + 2 * NKV].eq(1).all() and not runs[NH + 2 * NKV:].any(), runs
                assert torch.equal(q1, q2) and torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
                assert caches[2].abs().sum() > 0 and caches[3].abs().sum() > 0  # k and v were stored
                a1 = fused.silu_mul(G.gemv(y, *wgu, partial=True), rot=int8)
                runs.zero_()
                a2 = E.gate_up_silu(y, *wgu, cnt, rot=int8, runs=runs)
                assert runs[:F // 256].eq(1).all() and not runs[F // 256:].any(), runs
                assert torch.equal(a1, a2), (cfg, int8, m, (a1.float() - a2.float()).abs().max())
                x = torch.randn(m, 1, H).half()
                for h, w in ((torch.randn(m, NH * D).half(), wo), (a1, wd)):
                    x1, n1 = fused.add_rmsnorm(x, G.gemv(h, *w, partial=True), nw, EPS, rot=int8)
                    runs.zero_()
                    x2, n2 = E.add_rmsnorm(h, *w, cnt, x, nw, EPS, rot=int8, runs=runs)
                    assert runs[0] == 1 and not runs[1:].any(), runs
                    assert torch.equal(x1, x2) and torch.equal(n1, n2), (cfg, int8, m)
                assert not cnt.any(), cnt
                checked += 1
    assert checked == 24
    # what the decoder must not use: a GPU without NVIDIA PTX, sizes that are not powers of two, blocks wider than
    # a head
    assert not E.fits(384, NH, NKV, D, F, 1, False, 'cpu') and not E.fits(H, NH, NKV, D, 320, 1, False, 'cpu')
    G.choose = lambda n, k, m, int8: G.Config(bn=256)
    assert not E.fits(H, NH, NKV, D, F, 1, False, 'cpu')
    # inputs the kernels do not take: a clear ValueError, not a wrong result
    G.choose = lambda n, k, m, int8: G.Config(bn=32, bk=128, split=2)
    y = torch.randn(1, H).half()
    wq, sq = quantize(torch.randn(2 * F, H) * 0.05)
    for bad in (lambda: E.gate_up_silu(y, wq, None, cnt, rot=True),                       # int8 without scales
                lambda: E.gate_up_silu(y, wq, sq.view(-1), cnt.long(), rot=True),          # int64 counters
                lambda: E.gate_up_silu(y, wq[:, :256].contiguous(), sq.view(-1), cnt[:1], rot=True),  # 1 counter
                lambda: E.gate_up_silu(y, torch.randn(640, H).half(), None, cnt, rot=False),  # F = 320
                lambda: E.add_rmsnorm(y, torch.randn(384, H).half(), None, cnt, torch.randn(1, 1, 384).half(),
                                      torch.ones(384).half(), EPS, rot=False),              # N not a power of 2
                lambda: E.qkv_rope_store(y, torch.randn(5 * D, H).half(), None, cnt, qn, kn, torch.randn(1, 64),
                                         torch.randn(1, 64), torch.tensor([1]), torch.zeros(1, 1, 8, D).half(),
                                         torch.zeros(1, 1, 8, D).half(), NH, NKV, D, EPS)):  # 5 heads for 2 + 2·1
        try:
            bad()
            raise SystemExit('accepted')
        except ValueError as e:
            assert 'epilogue' in str(e) or 'gate_up_silu' in str(e), e
    print('ok')
""")


def test_product_and_consumer_in_one_launch_in_interpreter():
    pytest.importorskip("triton")
    _run_ok(PAIRS, interpret=True)


@pytest.mark.parametrize("int8", [False, True], ids=["fp16", "int8"])
def test_decoder_with_epilogues_in_interpreter(tiny_paths, int8, monkeypatch):
    """Two steps of two prompt rows: the decoder with YUE2_GEMV_EPILOGUE=1 (one launch fewer for each
    product's consumer) gives the same logits and KV cache as the one without (int8: the rotated norms within fp16
    rounding), and really takes the epilogue path."""
    pytest.importorskip("triton")
    path = str(tiny_paths["int8" if int8 else "bf16"])
    code = (tiny_fp16_ar(path) + textwrap.dedent(f"""
        import os
        from yue2_core.fast import gemv as G, epilogue as E
        # layer products split in two; the codec head (32,769 rows) in wide blocks: fewer interpreted programs
        G.choose = lambda n, k, m, int8: G.Config(bn=32, bk=128, split=2) if n < 4096 else G.Config(bn=256)
        calls = []
        for name in ('qkv_rope_store', 'gate_up_silu', 'add_rmsnorm'):
            f = getattr(E, name)
            setattr(E, name, lambda *a, f=f, name=name, **kw: calls.append(name) or f(*a, **kw))
        decs = []
        for on in ('0', '1'):
            os.environ['YUE2_GEMV_EPILOGUE'] = on
            d = fd.PhaseDecoder(ar, [sp, sp[:-3] + sp[-1:]], s, [1, 2], 'semantic', use_graph=False)
            d.fused, d.attn_kernel, d.gemv = True, True, True
            d.int8_layers = {int8}
            d.int8_rot, d.rot_fused = ('producers', True) if {int8} else (None, False)
            d.epilogue = on == '1'
            d._allocate(); d._prefill(); decs.append(d)
        assert decs[1].epilogue and not decs[0].epilogue
        for step in range(2):
            for d in decs:
                d.tokens.fill_(151853 + 7 * step)
                d._forward_fused(d.capacity)
                d.pos.add_(1)
            a, b = (d.logits.float() for d in decs)
            if {int8}:
                assert ((a - b).norm() / a.norm()).item() < 2e-3, step
            else:
                assert torch.equal(a, b), step
                assert all(torch.equal(x, y) for x, y in zip(decs[0].k + decs[0].v, decs[1].k + decs[1].v))
        layers = len(ar.model.layers)
        assert calls.count('qkv_rope_store') == 2 * layers and calls.count('add_rmsnorm') == 4 * layers, calls
        assert not decs[1].epi_counters.any()
        print('ok')
    """))
    monkeypatch.delenv("YUE2_GEMV_EPILOGUE", raising=False)
    _run_ok(code, interpret=True)


def test_epilogue_switch_is_validated_on_any_device(tiny_paths, monkeypatch):
    """YUE2_GEMV_EPILOGUE takes 0 or 1: another value is a RequestError naming it even where the epilogues would
    not be used (a CPU decoder), and 1 on a CPU leaves the decoder on its portable products."""
    import torch

    from yue2_core.checkpoint import inspect_checkpoint, load_ar, load_tokenizer
    from yue2_core.errors import RequestError
    from yue2_core.fast import decode as fd
    from yue2_core.protocol import Sampling, SongRequest, semantic_prefix
    info = inspect_checkpoint(str(tiny_paths["bf16"]))
    ar = load_ar(info, "cpu", torch.float32)
    sp = semantic_prefix(SongRequest("pop", "la", cot="off"), [], load_tokenizer(info).encode)
    s = Sampling(temperature=0.0, min_tokens=2, max_tokens=2)
    monkeypatch.setenv("YUE2_GEMV_EPILOGUE", "yes")
    with pytest.raises(RequestError, match="YUE2_GEMV_EPILOGUE must be 0 or 1"):
        fd.PhaseDecoder(ar, [sp], s, [1], "semantic", use_graph=False)
    monkeypatch.setenv("YUE2_GEMV_EPILOGUE", "1")
    assert not fd.PhaseDecoder(ar, [sp], s, [1], "semantic", use_graph=False).epilogue
