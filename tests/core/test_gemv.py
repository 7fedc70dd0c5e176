"""The split-K decode products (`fast.gemv`) and the consumer kernels that sum their partials, in Triton's CPU
interpreter (fp16: numpy has no bf16), against torch; then inside the decode step for bf16- and int8-shaped tiny
checkpoints. GPU numbers: tests/core/test_cuda_fast.py and bench/gemv_sweep.py."""
from __future__ import annotations

import pytest

from tests.core.test_fast_path import _run_ok, tiny_fp16_ar


def test_gemv_and_partial_consumers_in_interpreter():
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from yue2_core.fast import gemv as G, fused\n"
        "from yue2_core.weights.quant import quantize, rotate\n"
        "torch.manual_seed(0)\n"
        "for n, k, m in ((96, 512, 1), (64, 1024, 3), (40, 256, 16), (48, 512, 2)):\n"
        "    x = torch.randn(m, k).half()\n"
        "    w = torch.randn(n, k) * 0.05\n"
        "    q, s = quantize(w)\n"
        "    rb = x.float() @ w.half().float().T\n"
        "    rq = (rotate(x.float()).half().float() @ q.float().T) * s.view(1, -1)\n"
        "    xh = G.rotate(x)  # x·H, the int8 products' input (the same for every configuration)\n"
        "    for cfg in (G.Config(bn=32, bk=256, split=1), G.Config(bn=16, bk=256, split=2),\n"
        "                G.Config(bn=64, bk=512, split=2), G.Config(bn=16, bk=256, split=4),\n"
        # CUDA-core configurations (1–2 rows; more rows fall back to a tensor-core one)
        "                G.Config(bn=32, bk=256, split=1, dot=False), G.Config(bn=16, bk=128, split=4, dot=False)):\n"
        "        yb = G.gemv(x, w.half(), cfg=cfg)\n"
        "        yq = G.gemv(xh, q, s.view(-1), cfg=cfg)\n"
        "        assert yb.shape == (m, n) and yb.dtype == torch.float16\n"
        "        assert (yb.float() - rb).abs().max() / rb.abs().max() < 2e-3, (n, k, m, cfg)\n"
        "        assert (yq.float() - rq).abs().max() / rq.abs().max() < 2e-3, (n, k, m, cfg)\n"
        # YUE2_GEMV_PRE: the first weight tile loaded before the PDL wait gives the same bits (tensor cores)
        "        if cfg.dot:\n"
        "            assert torch.equal(G.gemv(x, w.half(), cfg=cfg, pre=True), yb), (n, k, m, cfg)\n"
        "            assert torch.equal(G.gemv(xh, q, s.view(-1), cfg=cfg, pre=True), yq), (n, k, m, cfg)\n"
        "        p = G.gemv(x, w.half(), cfg=cfg, partial=True)\n"
        "        split = cfg.split if k % (cfg.split * cfg.bk) == 0 else 1\n"
        "        assert isinstance(p, G.Partials) == (split > 1), (cfg, type(p))\n"
        "        if split > 1:\n"
        "            assert p.t.shape == (split, m, n) and torch.equal(G.reduce(p), yb)\n"
        # every int8 code converts exactly on the CUDA-core path (the float bit-pattern trick of _weights_f32)
        "qa = torch.arange(-128, 128, dtype=torch.int8).repeat(16, 1).contiguous()\n"
        "for j in (0, 1, 127, 128, 200, 255):\n"
        "    xa = torch.zeros(1, 256).half(); xa[0, j] = 1\n"
        "    for cfg in (G.Config(bn=16, bk=256, dot=False), G.Config(bn=16, bk=128, split=2, dot=False)):\n"
        "        ya = G.gemv(xa, qa, torch.ones(16), cfg=cfg)\n"
        "        assert torch.equal(ya.float(), torch.full((1, 16), float(j - 128))), (j, cfg, ya)\n"
        "xr = torch.randn(5, 768).half()\n"
        "assert (G.rotate(xr).float() - rotate(xr.float())).abs().max() < 4e-3  # fp16 output rounding only\n"
        "for bad in (lambda: G.rotate(torch.randn(1, 320).half()),\n"
        "            lambda: fused.add_rmsnorm(torch.randn(2, 1, 320).half(), None, torch.ones(320).half(), 1e-6, rot=True),\n"
        "            lambda: fused.silu_mul(torch.randn(2, 640).half(), rot=True),\n"
        "            lambda: G.gemv(torch.randn(1, 256).half(), q[:, :256].contiguous(), None),\n"
        "            lambda: G.gemv(torch.randn(1, 256).half(), q[:, :256].contiguous(), s.view(-1)[:5])):\n"
        "    try:\n"
        "        bad()\n"
        "        raise SystemExit('accepted')\n"
        "    except ValueError as e:\n"
        "        assert '256' in str(e) or 'scales' in str(e), e\n"
        "assert not G.supported(torch.randn(1, 256).half(), torch.randn(8, 512).half()[:, :256])  # strided rows\n"
        "try:\n"
        "    G.gemv(torch.randn(17, 256).half(), w[:, :256].half())\n"
        "    raise SystemExit('17 rows accepted')\n"
        "except ValueError as e:\n"
        "    assert '16' in str(e)\n"
        # consumers: partial sums give the same result as the reduced tensor; rot = rotate(plain)
        "R, H, F = 3, 512, 512\n"
        "x = torch.randn(R, 1, H).half(); wn = (1 + 0.1 * torch.randn(H)).half()\n"
        "p = G.Partials(torch.randn(4, R, H) * 0.3, torch.float16)\n"
        "x1, y1 = fused.add_rmsnorm(x, p, wn, 1e-6)\n"
        "x2, y2 = fused.add_rmsnorm(x, G.reduce(p).view(R, 1, H), wn, 1e-6)\n"
        "assert torch.equal(x1, x2) and torch.equal(y1, y2)\n"
        "x3, y3 = fused.add_rmsnorm(x, p, wn, 1e-6, rot=True)\n"
        "assert torch.equal(x3, x1)\n"
        "assert (y3.float() - rotate(y1.float())).abs().max() < 4e-3, (y3.float() - rotate(y1.float())).abs().max()\n"
        "_, y4 = fused.add_rmsnorm(x, None, wn, 1e-6, rot=True)\n"
        "_, y5 = fused.add_rmsnorm(x, None, wn, 1e-6)\n"
        "assert (y4.float() - rotate(y5.float())).abs().max() < 4e-3\n"
        "nh, nkv, D, cap = 4, 2, 128, 8\n"
        "qkv = G.Partials(torch.randn(3, R, (nh + 2 * nkv) * D) * 0.5, torch.float16)\n"
        "cos, sin = torch.randn(R, D // 2).cos(), torch.randn(R, D // 2).sin()\n"
        "pos = torch.tensor([0, 3, 7])\n"
        "qn, kn = (1 + 0.1 * torch.randn(D)).half(), (1 + 0.1 * torch.randn(D)).half()\n"
        "out = []\n"
        "for t in (qkv, G.reduce(qkv)):\n"
        "    kc, vc = torch.zeros(R, nkv, cap, D).half(), torch.zeros(R, nkv, cap, D).half()\n"
        "    out.append((fused.qk_norm_rope_store(t, qn, kn, cos, sin, pos, kc, vc, nh, nkv, D, 1e-6), kc, vc))\n"
        "assert all(torch.equal(a, b) for a, b in zip(*out)) and out[0][1].abs().sum() > 0\n"
        "gu = G.Partials(torch.randn(2, R, 2 * F), torch.float16)\n"
        "a1, a2 = fused.silu_mul(gu), fused.silu_mul(G.reduce(gu))\n"
        "assert torch.equal(a1, a2)\n"
        "a3 = fused.silu_mul(gu, rot=True)\n"
        "assert (a3.float() - rotate(a1.float())).abs().max() < 4e-3\n"
        # the attention merge writing the o_proj input rotated = rotating the plain output
        "import math\n"
        "for dt in (torch.float32, torch.float16):\n"
        "    q = torch.randn(2, 4, 128).to(dt)\n"
        "    kc, vc = torch.randn(2, 2, 40, 128).to(dt), torch.randn(2, 2, 40, 128).to(dt)\n"
        "    pos = torch.tensor([5, 39])\n"
        "    plain = fused.decode_attention(q, kc, vc, pos, 40, 1 / math.sqrt(128), sms=4)\n"
        "    rotd = fused.decode_attention(q, kc, vc, pos, 40, 1 / math.sqrt(128), sms=4, rot=True)\n"
        "    err = (rotd.float() - rotate(plain.float())).abs().max().item()\n"
        "    assert err < (1e-5 if dt == torch.float32 else 4e-3), (dt, err)\n"
        "try:\n"
        "    fused.decode_attention(torch.randn(1, 4, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16),\n"
        "                           torch.tensor([3]), 8, 0.25, rot=True)\n"
        "    raise SystemExit('rot accepted for 64-wide outputs')\n"
        "except ValueError as e:\n"
        "    assert '256' in str(e), e\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


def test_int8_pair_codes_and_products_in_interpreter():
    """YUE2_INT8_DOT=int8's pieces in Triton's CPU interpreter: the pair codes (`gemv.QAct`) written by
    `gemv.rotate(quant=True)`, add+RMSNorm, SiLU·up and both attention merges decode to the fp64 rotation of the
    same (fp16-rounded) values within 2e-5 of each group's range — ≈ 16 bits, where the fp16/bf16 activation keeps
    11/8 —, codes in [−127, 127], a group of zeros gives zero codes and scale; `gemv_q` (split or not, either
    operand order) matches fp64 products of the decoded codes to fp32 rounding, and bit for bit with its first weight
    group loaded before the PDL wait (YUE2_GEMV_PRE); refusals are ValueErrors."""
    pytest.importorskip("triton")
    code = (
        "import math, torch\n"
        "from yue2_core.fast import gemv as G, fused\n"
        "from yue2_core.weights.quant import quantize, rotate\n"
        "torch.manual_seed(0)\n"
        "def decoded(p):\n"
        "    m, k = p.s.shape[0], p.q.shape[1]\n"
        "    c = p.q.view(m, 2, k).double()\n"
        "    return ((c[:, 0] + c[:, 1] / 254).view(m, -1, 256) * p.s.double()[..., None]).view(m, k)\n"
        "def check(y_plain, pack, what):\n"
        "    want = rotate(y_plain.double())\n"
        "    rng = want.view(want.shape[0], -1, 256).abs().amax(-1, keepdim=True).clamp_min(1e-30)\n"
        "    err = ((decoded(pack) - want).view(rng.shape[0], -1, 256).abs() / rng).max().item()\n"
        "    assert err < 2e-5, (what, err)\n"
        "    assert pack.q.abs().max() <= 127 and pack.q.dtype == torch.int8, what\n"
        "x = torch.randn(3, 768).half()\n"
        "x[1, 256:512] = 0\n"
        "y, pack = G.rotate(x, quant=True)\n"
        "check(x, pack, 'rotate')\n"
        "assert pack.q[2:4, 256:512].abs().max() == 0 and pack.s[1, 1] == 0\n"
        "assert (y.float() - rotate(x.float())).abs().max() < 4e-3\n"
        "for n, k, m in ((96, 512, 1), (64, 1024, 3), (40, 256, 8)):\n"
        "    q, s = quantize(torch.randn(n, k) * 0.05)\n"
        "    s = s.view(-1).float().contiguous()\n"
        "    _, pk = G.rotate(torch.randn(m, k).half(), quant=True)\n"
        "    ref = (decoded(pk) @ q.double().T) * s.double()\n"
        "    for cfg in (G.Config(bn=32, bk=256, split=1), G.Config(bn=16, bk=256, split=2), None):\n"
        "        for swap in (False, True):\n"
        "            out = G.gemv_q(pk, q, s, cfg=cfg, swap=swap, out_dtype=torch.float32)\n"
        "            assert out.shape == (m, n)\n"
        "            assert ((out.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5, (n, k, m, cfg, swap)\n"
        "            pre = G.gemv_q(pk, q, s, cfg=cfg, swap=swap, out_dtype=torch.float32, pre=True)\n"
        "            assert torch.equal(pre, out), ('first group before the wait', n, k, m, cfg, swap)\n"
        "            part = G.gemv_q(pk, q, s, cfg=cfg, swap=swap, partial=True, out_dtype=torch.float16)\n"
        "            if isinstance(part, G.Partials):\n"
        "                assert ((part.t.sum(0).double() - ref).abs().max() / ref.abs().max()).item() < 1e-5\n"
        "    via = G.gemv(torch.zeros(m, k).half(), q, s, xq=pk)\n"  # gemv(xq=) dispatches to gemv_q
        "    assert via.dtype == torch.float16 and ((via.double() - ref).abs().max() / ref.abs().max()) < 2e-3\n"
        "R, H, F = 3, 512, 512\n"
        "xx = torch.randn(R, 1, H).half(); wn = (1 + 0.1 * torch.randn(H)).half()\n"
        "p = G.Partials(torch.randn(4, R, H) * 0.3, torch.float16)\n"
        "x1, y1 = fused.add_rmsnorm(xx, p, wn, 1e-6)\n"
        "x3, y3, pk3 = fused.add_rmsnorm(xx, p, wn, 1e-6, rot=True, quant=True)\n"
        "assert torch.equal(x3, x1) and (y3.float() - rotate(y1.float())).abs().max() < 4e-3\n"
        "check(y1.view(R, H), pk3, 'add_rmsnorm')\n"
        "gu = G.Partials(torch.randn(2, R, 2 * F), torch.float16)\n"
        "a1 = fused.silu_mul(gu)\n"
        "a3, pk4 = fused.silu_mul(gu, rot=True, quant=True)\n"
        "assert (a3.float() - rotate(a1.float())).abs().max() < 4e-3\n"
        "check(a1, pk4, 'silu_mul')\n"
        "q = torch.randn(2, 4, 128).half()\n"
        "kc, vc = torch.randn(2, 2, 40, 128).half(), torch.randn(2, 2, 40, 128).half()\n"
        "pos = torch.tensor([5, 39])\n"
        "plain = fused.decode_attention(q, kc, vc, pos, 40, 1 / math.sqrt(128), sms=4)\n"
        "for counters in (None, torch.zeros(16, dtype=torch.int32)):  # merge kernel / merged by the last split\n"
        "    o, pk5 = fused.decode_attention(q, kc, vc, pos, 40, 1 / math.sqrt(128), sms=4, rot=True, quant=True,\n"
        "                                    counters=counters)\n"
        "    assert (o.float() - rotate(plain.float())).abs().max() < 4e-3\n"
        "    check(plain, pk5, 'attention merge')\n"
        # a NaN activation reaches the products (and so the logits' NaN check) through its group's scale
        "xn = torch.randn(2, 512).half(); xn[1, 300] = float('nan')\n"
        "_, pn = G.rotate(xn, quant=True)\n"
        "assert torch.isnan(pn.s[1, 1]) and not torch.isnan(pn.s[1, 0]) and not torch.isnan(pn.s[0]).any(), pn.s\n"
        "qn, sn = quantize(torch.randn(32, 512) * 0.05)\n"
        "yn = G.gemv_q(pn, qn, sn.view(-1).float(), cfg=G.Config(bn=32, bk=256, split=2))\n"
        "assert torch.isnan(yn[1]).all() and torch.isfinite(yn[0]).all(), yn\n"
        "qq, ss = quantize(torch.randn(64, 512) * 0.05)\n"
        "for bad, words in ((lambda: G.new_pack(9, 512, 'cpu'), '1–8 rows'),\n"
        "                   (lambda: G.rotate(torch.randn(9, 256).half(), quant=True), '1–8 rows'),\n"
        "                   (lambda: fused.silu_mul(torch.randn(2, 512).half(), quant=True), 'rot=True'),\n"
        "                   (lambda: G.gemv_q(pack, qq, ss.view(-1).float()), 'pair codes'),\n"
        "                   (lambda: G.gemv_q(G.rotate(torch.randn(1, 512).half(), quant=True)[1], qq, None), 'scales')):\n"
        "    try:\n"
        "        bad()\n"
        "        raise SystemExit(f'accepted: {words}')\n"
        "    except ValueError as e:\n"
        "        assert words in str(e), (words, e)\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


def _decoders(path: str, int8: bool) -> str:
    return (tiny_fp16_ar(path) +
            "kind = fd._gemv_layers(ar)\n"
            "from yue2_core.fast import gemv as G\n"
            "# every layer product split in two (the tiny model's shapes alone would split only down_proj), in blocks\n"
            "# of 128 outputs; the codec head (32,769 rows = 16 · 2,048 + 1: a one-row last block) in blocks of 2,048\n"
            "# (the interpreter's cost is mostly per program: wide blocks, few programs)\n"
            "G.choose = lambda n, k, m, int8: G.Config(bn=128, bk=128, split=2) if n < 4096 else G.Config(bn=2048)\n"
            "seen = []\n"
            "_gemv = G.gemv\n"
            "G.gemv = lambda *a, **kw: seen.append(1) or _gemv(*a, **kw)\n"
            "seen_q = []\n"
            "_gemv_q = G.gemv_q\n"
            "G.gemv_q = lambda *a, **kw: seen_q.append(1) or _gemv_q(*a, **kw)\n"
            f"assert kind == {'int8' if int8 else 'bf16'!r}, kind\n"
            "decs = []\n"
            f"modes = {['producers', 'cublas', 'int8'] if int8 else [None]!r}  # where the int8 inputs are rotated\n"
            "# ('int8': rotated by the producers, which also write int8 pair codes for int8 x int8 products)\n"
            "for mode in [None] + modes:\n"
            "    d = fd.PhaseDecoder(ar, [sp, sp[:-3] + sp[-1:]], s, [1, 2], 'semantic', use_graph=False)\n"
            "    d._allocate(); d._prefill(); decs.append(d)\n"
            "    if d is not decs[0]:\n"
            "        d.fused, d.attn_kernel, d.gemv = True, True, True\n"
            f"        d.int8_layers = {int8}\n"
            "        d.int8_rot, d.rot_fused = ('producers', True) if mode == 'int8' else (mode, mode == 'producers')\n"
            "        d.int8_dot = mode == 'int8'\n"
            "ref = decs[0]\n"
            "for step in range(2):\n"
            "    for d in decs: d.tokens.fill_(151853 + 7 * step)\n"
            "    ref._forward(ref.capacity)\n"
            "    for d in decs[1:]: d._forward_fused(d.capacity)\n"
            "    for d in decs: d.pos.add_(1)\n"
            "    for mode, d in zip(modes, decs[1:]):\n"
            "        rel = ((ref.logits.float() - d.logits.float()).norm() / ref.logits.float().norm()).item()\n"
            "        assert rel < 1e-2, (mode, step, rel)\n"
            "        kv = max(((a.float() - b.float()).norm() / a.float().norm()).item()\n"
            "                 for a, b in zip(ref.k + ref.v, d.k + d.v))\n"
            "        assert kv < 1e-2, (mode, step, kv)\n"
            "assert seen, 'the split-K products were not used'\n"
            "assert not any(d.int8_dot for d in decs) or seen_q, 'the int8 x int8 products were not used'\n"
            "print('ok')\n")


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_decode_step_with_gemv_in_interpreter(tiny_paths, fmt):
    """The decode step with the split-K products (for int8 with the inputs rotated by the producing kernels and
    by cuBLAS) against the portable step: logits and KV cache within fp16 rounding (summation order differs)."""
    pytest.importorskip("triton")
    _run_ok(_decoders(tiny_paths[fmt], fmt == "int8"), interpret=True)


def test_pdl_only_on_cuda_and_switchable(monkeypatch):
    """Programmatic dependent launch is never requested for CPU tensors, and YUE2_PDL=0 turns it off."""
    import torch

    from yue2_core.fast import pdl_enabled
    from yue2_core.fast.fused import _pdl
    assert pdl_enabled(torch.device("cpu")) is False
    assert _pdl(torch.zeros(1)) == {}
    monkeypatch.setenv("YUE2_PDL", "0")
    assert pdl_enabled(torch.device("cuda")) is False


def test_decoder_uses_gemv_only_for_half_precision_steps(tiny_paths):
    """The split-K products take bf16/fp16 activations: a decoder computing in fp32 (GPUs without bf16, or the
    fp32 test model) keeps the library products, for bf16 and int8 files alike."""
    pytest.importorskip("triton")
    import torch

    from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar
    from yue2_core.fast import decode as fd
    from yue2_core.protocol import Sampling
    s = Sampling(temperature=0.0, min_tokens=2, max_tokens=2)
    for fmt in ("bf16", "int8"):
        info = inspect_checkpoint(tiny_paths[fmt])
        for dtype, want in ((torch.float32, False), (torch.float16, True)):
            ar = load_ar(info, "cpu", dtype)
            dec = fd.PhaseDecoder(ar, [[151643, 151852]], s, [1], "semantic", use_graph=False, fused=True)
            assert dec.gemv is want, (fmt, dtype, dec.gemv)
            assert dec.int8_layers is (want and fmt == "int8")


def test_int8_rotation_switch(monkeypatch):
    """YUE2_INT8_ROT: unset → the producing kernels rotate (NVIDIA builds), 'cublas' accepted, anything else a
    RequestError naming the accepted values; the retired YUE2_ROT_FUSED only warns."""
    import torch

    from yue2_core.errors import RequestError
    from yue2_core.fast import decode as fd
    monkeypatch.delenv("YUE2_INT8_ROT", raising=False)
    monkeypatch.delenv("YUE2_ROT_FUSED", raising=False)
    assert fd._int8_rotation() == ("producers" if torch.version.hip is None else "cublas")
    monkeypatch.setenv("YUE2_INT8_ROT", "cublas")
    assert fd._int8_rotation() == "cublas"
    monkeypatch.setenv("YUE2_INT8_ROT", "gemv")
    with pytest.raises(RequestError, match="producers' or 'cublas'"):
        fd._int8_rotation()
    monkeypatch.setenv("YUE2_INT8_ROT", "producers")
    monkeypatch.setenv("YUE2_ROT_FUSED", "1")
    monkeypatch.setattr(fd, "_WARNED", {})
    with pytest.warns(UserWarning, match="YUE2_ROT_FUSED is no longer read"):
        fd._int8_rotation()


def test_int8_dot_switch(monkeypatch, tiny_paths):
    """YUE2_INT8_DOT: 'convert' or 'int8' (unset: the default), anything else a RequestError naming both — from the
    decoder and from the up-front environment check; the decoder uses the pair-code products only for int8 layers
    whose inputs the producing kernels rotate, with the Triton attention and ≤ 8 rows."""
    pytest.importorskip("triton")
    import torch

    from yue2_core.errors import RequestError
    from yue2_core.fast import decode as fd
    from yue2_core.protocol import Sampling
    from yue2_core.switch_check import check_environment
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar
    monkeypatch.delenv("YUE2_INT8_DOT", raising=False)
    assert fd._int8_dot() == fd.INT8_DOT_DEFAULT
    for value in ("convert", "int8"):
        monkeypatch.setenv("YUE2_INT8_DOT", value)
        assert fd._int8_dot() == value
    monkeypatch.setenv("YUE2_INT8_DOT", "w8a8")
    for call in (fd._int8_dot, check_environment):
        with pytest.raises(RequestError, match="YUE2_INT8_DOT must be 'convert' or 'int8'"):
            call()
    ar = load_ar(inspect_checkpoint(tiny_paths["int8"]), "cpu", torch.float16)
    s = Sampling(temperature=0.0, min_tokens=2, max_tokens=2)
    monkeypatch.setenv("YUE2_INT8_DOT", "int8")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the decoder takes the GPU kernels' decisions on the CPU
    for rows, rot, want in ((1, "producers", True), (8, "producers", True), (9, "producers", False),
                            (1, "cublas", False)):
        monkeypatch.setenv("YUE2_INT8_ROT", rot)
        dec = fd.PhaseDecoder(ar, [[151643, 151852]] * rows, s, list(range(rows)), "semantic", use_graph=False,
                              fused=True)
        assert dec.int8_layers and dec.attn_kernel and dec.int8_dot is want, (rows, rot, dec.int8_dot)


@pytest.mark.parametrize("name", ["YUE2_FUSED_SAMPLER", "YUE2_GEMV_EPILOGUE"])
def test_retired_switch_warns_once(monkeypatch, name):
    """A switch of a removed path (the fused sampling kernel, the GEMV epilogues) is not silently ignored: one
    warning per process, saying why it went."""
    import warnings

    from yue2_core.fast import decode as fd
    monkeypatch.setattr(fd, "_WARNED", {})
    monkeypatch.setenv(name, "1")
    with pytest.warns(UserWarning, match=f"{name} is no longer read: .*(slower)"):
        fd._warn_retired_switches()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fd._warn_retired_switches()  # the second time: silent


def test_gemv_table_file_overrides_the_built_in_configurations(monkeypatch, tmp_path):
    """YUE2_GEMV_TABLE (the "configs" list of bench/gemv_sweep.py --json) replaces entries per shape and row count;
    a file that is missing or holds other entries is a RequestError naming the variable."""
    from yue2_core.errors import RequestError
    from yue2_core.fast import gemv as G
    built_in = G.choose(4096, 2048, 1, False)
    f = tmp_path / "sweep.json"
    f.write_text('{"configs": [{"n": 4096, "k": 2048, "int8": false, "m": 1, "us": 3.0,'
                 ' "cfg": {"bn": 16, "bk": 128, "split": 8, "warps": 2, "stages": 3, "dot": false}},'
                 ' {"n": 2048, "k": 6144, "int8": true, "m": 0,'
                 ' "cfg": {"bn": 32, "bk": 512, "split": 2, "warps": 8, "stages": 4, "dot": true}}]}')
    monkeypatch.setenv("YUE2_GEMV_TABLE", str(f))
    G._tables_from.cache_clear()
    try:
        assert G.choose(4096, 2048, 1, False) == G.Config(bn=16, bk=128, split=8, warps=2, stages=3, dot=False)
        assert G.choose(4096, 2048, 2, False) == built_in  # only M = 1 was given
        assert G.choose(2048, 6144, 8, True) == G.Config(bn=32, bk=512, split=2, warps=8, stages=4)
        assert G.choose_q(2048, 6144) == G._Q_TABLE[(2048, 6144)]  # a W8A16 entry leaves the pair-code table
        # "pair" entries tune the int8 × int8 pair-code products (YUE2_INT8_DOT=int8), "swap" their operand order
        f.write_text('{"configs": [{"n": 2048, "k": 6144, "int8": true, "m": 0, "pair": true, "swap": true,'
                     ' "cfg": {"bn": 64, "bk": 256, "split": 2, "warps": 4, "stages": 4, "dot": true}}]}')
        G._tables_from.cache_clear()
        assert G.choose_q(2048, 6144) == (G.Config(bn=64, bk=256, split=2, warps=4, stages=4), True)
        assert G.choose_q(2048, 2048) == G._Q_TABLE[(2048, 2048)] and G.choose(2048, 6144, 1, True) == G._TABLE.get(
            (2048, 6144, True), G.choose(2048, 6144, 1, True))
        pair = ('{"configs": [{"n": 2048, "k": 6144, "int8": %s, "m": %s, "pair": %s, "swap": %s,'
                ' "cfg": {"bn": 64, "bk": %s, "split": 2, "warps": 4, "stages": 4, "dot": true}}]}')
        for text in (pair % ("true", 0, "true", "false", 512),   # pair codes take 256-wide K tiles
                     pair % ("false", 0, "true", "false", 256),  # bf16 weights have no pair-code product
                     pair % ("true", 1, "true", "false", 256),   # m 1: pair entries serve 1–8 rows
                     pair % ("true", 0, '"yes"', "false", 256),  # pair as a string
                     pair % ("true", 0, "false", "true", 256)):  # swap without pair
            f.write_text(text)
            G._tables_from.cache_clear()
            with pytest.raises(RequestError, match="entry 0: (a pair-code entry|pair and swap|swap)"):
                G.choose_q(2048, 6144)
        # break-it findings: values a launch would have changed silently or spent hours on, a mistyped key
        ok = pair % ("true", 0, "true", "false", 256)
        for text, words in ((ok.replace('"split": 2', '"split": 32'), "does not divide 6144"),
                            (ok.replace('"stages": 4', '"stages": 1000000000'), "stages an integer in 1–8"),
                            (ok.replace('"bn": 64', '"bn": 4096'), "16 ≤ bn ≤ 1024"),
                            (ok.replace('"pair"', '"Pair"'), "unknown key(s) Pair"),
                            (pair % ("true", "0.0", "true", "false", 256), "m must be the integer 0")):
            f.write_text(text)
            G._tables_from.cache_clear()
            with pytest.raises(RequestError) as e:
                G.choose_q(2048, 6144)
            assert "entry 0" in str(e.value) and words in str(e.value), str(e.value)
        f.write_text('{"configs": [{"n": 4096, "k": 2048, "int8": false, "m": 1, "us": 3.0,'
                     ' "cfg": {"bn": 16, "bk": 128, "split": 8, "warps": 2, "stages": 3, "dot": false}},'
                     ' {"n": 2048, "k": 6144, "int8": true, "m": 0,'
                     ' "cfg": {"bn": 32, "bk": 512, "split": 2, "warps": 8, "stages": 4, "dot": true}}]}')
        G._tables_from.cache_clear()
        # a CUDA-core entry never serves more than 2 rows: the tensor-core table entry (or 64-row blocks) does
        assert G.usable(G.choose(4096, 2048, 1, False), 4096, 2048, 3, False).dot
        entry = ('{"configs": [{"n": 4096, "k": 2048, "int8": %s, "m": %s, "cfg": {"bn": %s, "bk": 256, "split": %s,'
                 ' "warps": 4, "stages": 3, "dot": %s}}]}')
        bad_values = [entry % ("false", 0, 32, 0, "true"),      # split 0
                      entry % ("false", 1, 24, 1, "false"),     # bn not a power of two
                      entry % ("false", 1, 8, 1, "true"),       # tensor cores with 8-row blocks
                      entry % ('"false"', 1, 32, 1, "true"),    # int8 as a string
                      entry % ("false", 3, 32, 1, "false"),     # m outside 0–2
                      entry % ("false", 0, 32, 1, "false"),     # CUDA cores for any row count
                      (entry % ("false", 2, 64, 1, "false")).replace('"warps": 4', '"warps": 1'),  # 1,024 sums/thread
                      (entry % ("false", 1, 32, 1, "true")).replace('"n": 4096', '"n": "4096"'),   # n as a string
                      (entry % ("false", 1, 32, 1, "true")).replace('"stages": 3', '"stages": 3, "tile": 1')]  # key
        for text in ['{"configs": [{"n": 1}]}', "[1, 2]", "not json"] + bad_values:
            f.write_text(text)
            G._tables_from.cache_clear()
            with pytest.raises(RequestError, match="YUE2_GEMV_TABLE"):
                G.choose(4096, 2048, 1, False)
            with pytest.raises(RequestError, match="entry 0" if text in bad_values else "YUE2_GEMV_TABLE"):
                G._tables()
        # the file's shape named in words, not Python's ("list indices must be integers", "KeyError: 'configs'")
        for text, words in (("[1, 2]", "holds a JSON list, not an object"), ('{"a": NaN}', 'no "configs" key'),
                            ('{"configs": {}}', '"configs" is a JSON object, not a list'),
                            ('{"configs": [1]}', "entry 0: a JSON number, not an object"),
                            ('{"configs": [{"n": 1}]}', "entry 0: no k, int8, m, cfg"), ("not json", "not JSON")):
            f.write_text(text)
            G._tables_from.cache_clear()
            with pytest.raises(RequestError) as e:
                G._tables()
            assert words in str(e.value) and "Error:" not in str(e.value), str(e.value)
        monkeypatch.setenv("YUE2_GEMV_TABLE", str(tmp_path / "missing.json"))
        G._tables_from.cache_clear()
        with pytest.raises(RequestError, match="missing.json"):
            G.choose(4096, 2048, 1, False)
    finally:
        monkeypatch.delenv("YUE2_GEMV_TABLE")
        G._tables_from.cache_clear()
    assert G.choose(4096, 2048, 1, False) == built_in


def test_qk_rope_row_blocks_equal_single_rows():
    """qk_norm_rope_store with more rows than `fused.ROPE_ROW_BLOCK` runs blocks of rows per program (the NAR's
    frames + 2 slots, one sequence: shared_row; and batch rows with their own cache rows): q, k and v stored equal
    one call per row (the decode step's one-row programs), including the ragged last block (21 = 16 + 5 rows) and
    fp32 partial sums as input."""
    code = (
        "import torch\n"
        "from yue2_core.fast import fused, gemv as G\n"
        "assert fused.ROPE_ROW_BLOCK == 16\n"
        "torch.manual_seed(0)\n"
        "nh, nkv, D = 2, 1, 128  # the tiny model's heads (the programs, and the interpreter's time, scale with them)\n"
        "qn, kn = (1 + 0.1 * torch.randn(D)).half(), (1 + 0.1 * torch.randn(D)).half()\n"
        "for R, shared in ((21, True), (18, False)):\n"
        "    plain = torch.randn(R, (nh + 2 * nkv) * D).half()\n"
        "    parts = G.Partials(torch.randn(2, R, (nh + 2 * nkv) * D) * 0.5, torch.float16)\n"
        "    cos, sin = torch.randn(R, D // 2).cos(), torch.randn(R, D // 2).sin()\n"
        "    cap = R + 9 if shared else 12\n"
        "    pos = torch.randperm(cap)[:R] if shared else torch.randint(0, cap, (R,))\n"
        "    for qkv in (plain, parts):\n"
        "        rows = 1 if shared else R\n"
        "        kb, vb = torch.zeros(rows, nkv, cap, D).half(), torch.zeros(rows, nkv, cap, D).half()\n"
        "        q = fused.qk_norm_rope_store(qkv, qn, kn, cos, sin, pos, kb, vb, nh, nkv, D, 1e-6, shared_row=shared)\n"
        "        k1, v1 = torch.zeros_like(kb), torch.zeros_like(vb)\n"
        "        q1 = []\n"
        "        for r in range(R):\n"
        "            one = (G.Partials(qkv.t[:, r:r + 1].contiguous(), torch.float16) if isinstance(qkv, G.Partials)\n"
        "                   else qkv[r:r + 1])\n"
        "            kr, vr = (k1, v1) if shared else (k1[r:r + 1], v1[r:r + 1])\n"
        "            q1.append(fused.qk_norm_rope_store(one, qn, kn, cos[r:r + 1], sin[r:r + 1], pos[r:r + 1], kr, vr,\n"
        "                                               nh, nkv, D, 1e-6, shared_row=True))\n"
        "        assert torch.equal(q, torch.cat(q1)), (R, (q - torch.cat(q1)).abs().max())\n"
        "        assert torch.equal(kb, k1) and torch.equal(vb, v1), R\n"
        "        assert kb.abs().sum() > 0 and vb.abs().sum() > 0\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)
