"""The fast decode path's pieces that run without a GPU: the device sampler against the parity fixtures, the
graph-free step against the portable loop, batching of candidate songs, and the int8 kernels' maths."""
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from yue2_core.fast import decode as fd
from yue2_core.fast.int8_kernels import convrot_linear
from yue2_core.fast.sampler import SLICES, candidates, choose, dense_scores, static_mask
from yue2_core.protocol import Sampling, SongRequest, negative_prefix, planning_prefix, semantic_prefix
from yue2_core.weights.quant import dequantize, quantize
from yue2_core.sampling import generate as portable_generate

PARITY = os.environ.get("YUE2_PARITY_DIR")


@pytest.mark.skipif(not PARITY, reason="YUE2_PARITY_DIR is not set: parity fixtures unavailable")
def test_device_sampler_matches_reference_fixtures():
    from safetensors.torch import load_file
    cases = json.loads((Path(PARITY) / "cases.json").read_text())["cases"]
    v = load_file(str(Path(PARITY) / "vectors.safetensors"))
    checked = 0
    for name, case in cases.items():
        if not name.startswith("sampling.") or name == "sampling.cfg":
            continue
        inp = case["inputs"]
        s, phase = Sampling(**inp["sampling"]), inp["phase"]
        sl = SLICES[phase]
        logits = v[inp["logits"]][None, sl.start:sl.stop]
        recent = [h - sl.start for h in v[inp["history"]].tolist()[-s.penalty_window:]]
        ring = torch.tensor([recent])
        vals, cols = candidates(logits, s, phase, torch.tensor([inp["step"]]), ring, torch.ones(ring.shape),
                                static_mask(phase, torch.float32, "cpu"), inp["legacy_off"])
        if s.temperature == 0:
            assert int(cols[0, 0]) + sl.start == int(v[name + ".argmax"]), name
        else:
            dense = dense_scores(vals, cols, phase, 184704)[0]
            finite = torch.isfinite(dense).nonzero().flatten()
            assert torch.equal(finite, v[name + ".scores.ids"]), name
            assert torch.equal(dense[finite].to(v[name + ".scores.values"].dtype), v[name + ".scores.values"]), name
        checked += 1
    assert checked >= 10


def test_exponential_race_follows_probabilities():
    vals = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    cols = torch.tensor([[7, 8, 9]])
    g = torch.Generator().manual_seed(0)
    picks = [int(choose(vals, cols, torch.empty(1, 3).exponential_(generator=g))) for _ in range(4000)]
    freq = [picks.count(c) / len(picks) for c in (7, 8, 9)]
    assert abs(freq[0] - 0.6) < 0.03 and abs(freq[1] - 0.3) < 0.03 and abs(freq[2] - 0.1) < 0.02


@pytest.fixture(scope="module")
def fp32(tiny_engine_fp32):
    eng = tiny_engine_fp32
    req = SongRequest("indie pop", "[Verse]\nla la la", cot="full")
    return eng, req


def test_step_equals_portable_loop_greedy(fp32):
    eng, req = fp32
    greedy_abc = Sampling(temperature=0.0, top_p=0.9, top_k=30, repetition_penalty=1.005, penalty_window=100,
                          min_tokens=4, max_tokens=24)
    pp = planning_prefix(req, eng.tokenizer.encode)
    a = portable_generate(eng.ar, pp, greedy_abc, 1, "abc")
    b = fd.generate(eng.ar, pp, greedy_abc, 1, "abc", use_graph=False)
    assert a.tokens == b.tokens and a.ended == b.ended
    greedy = Sampling(temperature=0.0, min_tokens=8, max_tokens=40)
    sp, neg = semantic_prefix(req, a.tokens, eng.tokenizer.encode), negative_prefix(req, a.tokens, eng.tokenizer.encode)
    a = portable_generate(eng.ar, sp, greedy, 1, "semantic", negative=neg, cfg_scale=1.5)
    b = fd.generate(eng.ar, sp, greedy, 1, "semantic", negative=neg, cfg_scale=1.5, use_graph=False)
    assert a.tokens == b.tokens and len(a.tokens) == 40
    forced = [151853 + 11, 151853 + 12, 151853 + 13]
    a = portable_generate(eng.ar, sp, greedy, 1, "semantic", forced=forced)
    b = fd.generate(eng.ar, sp, greedy, 1, "semantic", forced=forced, use_graph=False)
    assert a.tokens == b.tokens and a.tokens[:3] == forced


def test_functional_layers_equal_modules(fp32):
    eng, req = fp32
    pp = planning_prefix(req, eng.tokenizer.encode)
    s = Sampling(temperature=0.0, top_k=30, min_tokens=4, max_tokens=16, repetition_penalty=1.005,
                 penalty_window=100, top_p=0.9)
    a = fd.PhaseDecoder(eng.ar, [pp], s, [1], "abc", use_graph=False)
    b = fd.PhaseDecoder(eng.ar, [pp], s, [1], "abc", use_graph=False)
    b.fns = (fd._pre_attn, fd._post_attn)  # the functions torch.compile wraps on CUDA, run uncompiled
    assert a.run()[0].tokens == b.run()[0].tokens


def test_candidates_batch_equals_single_runs_and_seeds_reproduce(fp32):
    eng, req = fp32
    sp = semantic_prefix(req, [], eng.tokenizer.encode)
    s = Sampling(min_tokens=30, max_tokens=30)
    batch = fd.PhaseDecoder(eng.ar, [sp, sp, sp], s, [5, 6, 7], "semantic", use_graph=False).run()
    singles = [fd.generate(eng.ar, sp, s, seed, "semantic", use_graph=False) for seed in (5, 6, 7)]
    assert [r.tokens for r in batch] == [r.tokens for r in singles]
    assert len({tuple(r.tokens) for r in batch}) == 3  # different seeds, different songs
    assert all(len(r.tokens) == 30 and r.truncated for r in batch)


def test_budget_and_cfg_errors(fp32):
    from yue2_core.errors import BudgetError, RequestError
    eng, req = fp32
    with pytest.raises(BudgetError):
        fd.PhaseDecoder(eng.ar, [[1] * 20000], Sampling(max_tokens=9000), [1], "semantic")
    with pytest.raises(RequestError):
        fd.PhaseDecoder(eng.ar, [[1]], Sampling(), [1], "semantic", cfg_scale=2.0)


def test_int8_paths_agree():
    torch.manual_seed(0)
    w = torch.randn(64, 512) * 0.02
    q, s = quantize(w)
    x = torch.randn(5, 512)
    ref = x @ dequantize(q, s).T
    for path in ("portable", "dequant"):
        assert torch.allclose(convrot_linear(x, q, s, None, 256, force=path), ref, atol=1e-5), path


def _run_ok(code: str, interpret: bool) -> None:
    """Run `code` in a process of its own; it must exit 0 and print ok. With `interpret`, in Triton's CPU interpreter
    in a fork of a process that imported torch and Triton once (tests/core/interpreter_forks.py; a fresh Python where
    that cannot be used), otherwise in a fresh Python."""
    from tests.core import interpreter_forks
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    done = interpreter_forks.run(code, env, timeout=600) if interpret else None
    if done is None:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        done = out.returncode, out.stdout, out.stderr
    returncode, stdout, stderr = done
    assert returncode == 0 and "ok" in stdout, stderr[-3000:]


def test_triton_w8a16_kernel_in_interpreter():
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from yue2_core.fast import int8_kernels as K\n"
        "from yue2_core.weights.quant import quantize, dequantize, rotate\n"
        "torch.manual_seed(0)\n"
        "run = K._kernel()\n"
        "for n, k, m in ((96, 512, 1), (40, 256, 3), (64, 768, 16)):\n"
        "    q, s = quantize(torch.randn(n, k) * 0.02)\n"
        "    x = torch.randn(m, k)\n"
        "    ref = x @ dequantize(q, s).T\n"
        "    got = run(rotate(x).half().contiguous(), q.contiguous(), s.view(-1).contiguous(), torch.float32)\n"
        "    assert (got - ref).abs().max() < 2e-3, (n, k, m, (got - ref).abs().max())\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


@functools.lru_cache(maxsize=None)
def _tiny_prompt(path: str) -> tuple:
    """The semantic prompt of a short request, encoded by the tokenizer of the checkpoint at `path` — here, once per
    test process: building the tokenizer takes ~1 s of CPU, which every interpreter subprocess spent again."""
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_tokenizer
    return tuple(semantic_prefix(SongRequest("pop", "la", cot="off"), [],
                                 load_tokenizer(inspect_checkpoint(path)).encode))


def tiny_fp16_ar(path: str) -> str:
    """Code (for a subprocess) loading the tiny checkpoint at `path` as an fp16 CPU AR `ar`, with a semantic prompt
    `sp` (`_tiny_prompt`), greedy 4-token sampling `s` and the decode module as `fd`."""
    return ("import torch\n"
            "from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar\n"
            "from yue2_core.fast import decode as fd\n"
            "from yue2_core.protocol import Sampling\n"
            f"info = inspect_checkpoint({path!r})\n"
            "ar = load_ar(info, 'cpu', torch.float16)\n"
            f"sp = {list(_tiny_prompt(str(path)))!r}\n"
            "s = Sampling(temperature=0.0, min_tokens=4, max_tokens=4)\n")


def _decoder_pair(path: str) -> str:
    """Code (for a Triton-interpreter subprocess) that builds two identical greedy fp16 decoders `a`, `b` over two
    prompt rows of the tiny checkpoint at `path`, allocated and prefilled; `decs` = [a, b]."""
    return (tiny_fp16_ar(path) +
            "decs = []\n"
            "for _ in range(2):\n"
            "    d = fd.PhaseDecoder(ar, [sp, sp[:-3] + sp[-1:]], s, [1, 2], 'semantic', use_graph=False)\n"
            "    d._allocate(); d._prefill(); decs.append(d)\n"
            "a, b = decs\n")


def test_fused_decode_kernels_in_interpreter(tiny_paths):
    """The fused Triton decode kernels (add+RMSNorm, QK-norm+RoPE+KV store, SiLU·up) run in Triton's CPU
    interpreter in fp16: logits and KV cache must equal the unfused torch step bit for bit (same rounding points)."""
    pytest.importorskip("triton")
    code = (
        _decoder_pair(tiny_paths['bf16']) +
        "b.attn_kernel = False  # the split attention kernel sums in another order (tested below)\n"
        "for step in range(3):\n"
        "    for d in decs: d.tokens.fill_(151853 + 7 * step)\n"
        "    a._forward(a.capacity); b._forward_fused(b.capacity)\n"
        "    for d in decs: d.pos.add_(1)\n"
        "    assert torch.equal(a.logits, b.logits), step\n"
        "    assert all(torch.equal(x, y) for x, y in zip(a.k + a.v, b.k + b.v)), step\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


def test_decode_attention_kernel_in_interpreter(tiny_paths):
    """The split-length decode attention (Triton CPU interpreter) against fp32 softmax attention: rows at
    different positions (0, mid, last), one split and several, fp32 (exact up to summation order) and fp16; then
    inside the fused decode step, whose logits must stay within fp16 rounding of the unfused step."""
    pytest.importorskip("triton")
    code = (
        "import math, torch\n"
        "from yue2_core.fast import fused\n"
        "torch.manual_seed(0)\n"
        "for dt, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):\n"
        "    for sms in (1, 64):\n"
        "        R, nkv, g, D, cap, L = 3, 2, 2, 16, 100, 96\n"
        "        q = torch.randn(R, nkv * g, D).to(dt)\n"
        "        k, v = torch.randn(R, nkv, cap, D).to(dt), torch.randn(R, nkv, cap, D).to(dt)\n"
        "        pos = torch.tensor([0, 37, 95])\n"
        "        got = fused.decode_attention(q, k, v, pos, L, 1 / math.sqrt(D), sms=sms).float()\n"
        "        s = q.float().view(R, nkv, g, D) @ k[:, :, :L].float().transpose(-1, -2) / math.sqrt(D)\n"
        "        s = s.masked_fill(~(torch.arange(L)[None] <= pos[:, None])[:, None, None], float('-inf'))\n"
        "        ref = (s.softmax(-1) @ v[:, :, :L].float()).reshape(R, -1)\n"
        "        err = (got - ref).abs().max().item()\n"
        "        assert err < tol, (dt, sms, err)\n"
        "        assert torch.equal(got[0], v[0, :, 0].float().repeat_interleave(g, 0).reshape(-1)) or dt != torch.float32\n"
        + _decoder_pair(tiny_paths['bf16']) +
        "b.attn_kernel = True  # on CPU the decoder defaults to the torch ops; the kernels run in the interpreter\n"
        "for step in range(2):  # the second step reads the K/V the first one stored\n"
        "    for d in decs: d.tokens.fill_(151853 + 7 * step)\n"
        "    a._forward(a.capacity); b._forward_fused(b.capacity)\n"
        "    for d in decs: d.pos.add_(1)\n"
        "    rel = ((a.logits.float() - b.logits.float()).norm() / a.logits.float().norm()).item()\n"
        "    assert rel < 1e-2, (step, rel)\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


def test_decode_attention_merged_by_its_last_split_in_interpreter(tiny_paths):
    """counters given (the decoder's default, YUE2_ATTN_MERGE=split): the last split program of each (row, kv
    head) merges the splits instead of the merge kernel — same result within the dtype's rounding, with and without
    the int8 rotation and a shared prefix, counters back at zero after every launch; in the fused decode step the
    logits stay within fp16 rounding of the merge-kernel step; bad counters are refused."""
    pytest.importorskip("triton")
    code = (
        "import math, torch\n"
        "from yue2_core.fast import fused\n"
        "torch.manual_seed(0)\n"
        "for dt, tol in ((torch.float32, 1e-6), (torch.float16, 1e-3)):\n"
        "    for R, P, rot, sms in ((1, 0, False, 64), (2, 0, True, 64), (4, 24, True, 8), (3, 0, False, 1)):\n"
        "        nkv, g, D, cap, L = 2, 2, 128, 220, 200  # up to 4 splits of 64 positions\n"
        "        q = torch.randn(R, nkv * g, D).to(dt)\n"
        "        k, v = torch.randn(R, nkv, cap, D).to(dt), torch.randn(R, nkv, cap, D).to(dt)\n"
        "        k[:, :, :P] = k[0:1, :, :P]; v[:, :, :P] = v[0:1, :, :P]\n"
        "        pos = torch.tensor([min(L - 1, 130 + 31 * i) for i in range(R)])\n"
        "        cnt = torch.zeros(R * nkv + 3, dtype=torch.int32)\n"
        "        kw = dict(sms=sms, rot=rot, shared=P)\n"
        "        a = fused.decode_attention(q, k, v, pos, L, 1 / math.sqrt(D), **kw).float()\n"
        "        b = fused.decode_attention(q, k, v, pos, L, 1 / math.sqrt(D), counters=cnt, **kw).float()\n"
        "        err = (a - b).abs().max().item()\n"
        "        assert err <= tol, (dt, R, P, rot, sms, err)\n"
        "        assert not cnt.any(), cnt\n"
        "        if dt == torch.float32:  # (the counting does not depend on the dtype)\n"
        "            cnt[:R * nkv] = 7  # a count that never reaches the last program: nothing merged, left unreset\n"
        "            fused.decode_attention(q, k, v, pos, L, 1 / math.sqrt(D), counters=cnt, **kw)\n"
        "            assert cnt[:R * nkv].gt(7).all() and not cnt[R * nkv:].any(), cnt\n"
        "# long attentions: one kv head (the programs, and the interpreter's time, scale with the kv heads)\n"
        "q, k, v = torch.randn(1, 2, 16), torch.randn(1, 1, 2240, 16), torch.randn(1, 1, 2240, 16)\n"
        "cnt = torch.full((1,), 7, dtype=torch.int32)  # 35 splits > MERGE_MAX_SPLITS: the merge kernel, no count\n"
        "a = fused.decode_attention(q, k, v, torch.tensor([2239]), 2240, 0.25, sms=64)\n"
        "b = fused.decode_attention(q, k, v, torch.tensor([2239]), 2240, 0.25, sms=64, counters=cnt)\n"
        "assert fused.MERGE_MAX_SPLITS == 32 and torch.equal(a, b) and cnt.eq(7).all(), cnt\n"
        "# a shared prefix planned at 32 + 4 splits gets fewer, longer prefix splits so that the split kernel merges;\n"
        "# against fp32 softmax attention (the unshared kernel's reference in the test before this one)\n"
        "q, k, v = torch.randn(4, 2, 16), torch.randn(4, 1, 2240, 16), torch.randn(4, 1, 2240, 16)\n"
        "k[:, :, :2000] = k[0:1, :, :2000]; v[:, :, :2000] = v[0:1, :, :2000]\n"
        "p4 = torch.tensor([2239, 2100, 2001, 2150])\n"
        "att = (q.view(4, 1, 2, 16) @ k.transpose(-1, -2) * 0.25).masked_fill(\n"
        "    ~(torch.arange(2240)[None] <= p4[:, None])[:, None, None], float('-inf'))\n"
        "a = (att.softmax(-1) @ v).reshape(4, -1)\n"
        "cnt = torch.zeros(4, dtype=torch.int32)\n"
        "b = fused.decode_attention(q, k, v, p4, 2240, 0.25, sms=64, shared=2000, counters=cnt)\n"
        "assert (a - b).abs().max() < 1e-5 and not cnt.any(), ((a - b).abs().max(), cnt)\n"
        "cnt.fill_(7)  # merged in the split kernel: every program counts (the merge kernel would leave 7)\n"
        "fused.decode_attention(q, k, v, p4, 2240, 0.25, sms=64, shared=2000, counters=cnt)\n"
        "assert cnt.gt(7).all(), cnt\n"
        "try:\n"
        "    fused.decode_attention(q, k, v, pos, L, 0.1, counters=torch.zeros(R * nkv, dtype=torch.int64))\n"
        "    raise SystemExit('int64 counters accepted')\n"
        "except ValueError as e:\n"
        "    assert 'counters' in str(e)\n"
        + _decoder_pair(tiny_paths['bf16']) +
        "for d in decs: d.attn_kernel = True  # on CPU the decoder defaults to the torch ops\n"
        "assert a.attn_counters is None  # allocated when attn_kernel was off\n"
        "b.attn_counters = torch.zeros(b.R * ar.dims.kv_heads, dtype=torch.int32)\n"
        "for step in range(2):  # the second step reads the K/V the first one stored\n"
        "    for d in decs: d.tokens.fill_(151853 + 7 * step)\n"
        "    for d in decs: d._forward_fused(d.capacity)\n"
        "    for d in decs: d.pos.add_(1)\n"
        "    rel = ((a.logits.float() - b.logits.float()).norm() / a.logits.float().norm()).item()\n"
        "    assert rel < 2e-3 and not b.attn_counters.any(), (step, rel)\n"
        "import os\n"
        "from yue2_core.errors import RequestError\n"
        "d = fd.PhaseDecoder(ar, [sp], s, [1], 'semantic', use_graph=False)\n"
        "d.attn_kernel = True\n"
        "d._allocate(); assert d.attn_counters is not None and d.attn_counters.dtype == torch.int32  # default\n"
        "os.environ['YUE2_ATTN_MERGE'] = 'kernel'\n"
        "d._allocate(); assert d.attn_counters is None\n"
        "os.environ['YUE2_ATTN_MERGE'] = 'last'\n"
        "try:\n"
        "    d._allocate()\n"
        "    raise SystemExit('YUE2_ATTN_MERGE=last accepted')\n"
        "except RequestError as e:\n"
        "    assert 'YUE2_ATTN_MERGE' in str(e)\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


def test_fused_nar_velocity_in_interpreter(tiny_paths):
    """The NAR velocity with fused kernels (Triton CPU interpreter, fp16) equals the torch velocity to 1–2 fp16
    ulps (the attention call sees a transposed q; everything else rounds at the same points)."""
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar\n"
        "from yue2_core import nar as N\n"
        f"info = inspect_checkpoint({tiny_paths['bf16']!r})\n"
        "ar, nar = load_ar(info, 'cpu', torch.float16), load_nar(info, 'cpu', torch.float16)\n"
        "toks = [151643] + list(range(100, 140)) + [151853 + i for i in range(20)] + [151852]\n"
        "a = N.ChunkRenderer(nar, ar.layer_kv(toks), 20, fused=False)\n"
        "b = N.ChunkRenderer(nar, ar.layer_kv(toks), 20, fused=True)\n"
        "st = torch.randn(20, 64, generator=torch.Generator().manual_seed(0)).half()\n"
        "for rt in (20.0, 0.3):\n"
        "    d = (a.velocity(st, rt).float() - b.velocity(st, rt).float()).abs().max().item()\n"
        "    assert d <= 2e-3, (rt, d)\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


def test_float_linears_replaces_every_int8_linear(tiny_paths):
    """float_linears (the NAR on GPUs) swaps each ConvRotLinear for an nn.Linear holding its dequantized weight:
    none is left, the weights equal `dequantized()`, and the velocity equals the int8 module's (whose CPU forward
    multiplies by the same dequantized weight). A `work_device` equal to the module's device takes the same path."""
    import torch
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar
    from yue2_core.nar import ChunkRenderer, float_linears
    from yue2_core.weights.quant import ConvRotLinear
    info = inspect_checkpoint(tiny_paths["int8"])
    ar = load_ar(info, "cpu", torch.float32)
    a, b = load_nar(info, "cpu", torch.float32), load_nar(info, "cpu", torch.float32)
    expect = {n: m.dequantized(torch.float32) for n, m in a.named_modules() if isinstance(m, ConvRotLinear)}
    assert expect, "the int8 NAR must hold ConvRot linears"
    toks = [151643] + list(range(100, 120)) + [151853 + i for i in range(8)] + [151852]
    state = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    before = ChunkRenderer(a, ar.layer_kv(toks), 8, fused=False).velocity(state, 0.5)
    assert float_linears(a) == len(expect) == float_linears(b, work_device="cpu")
    mods = dict(a.named_modules())
    assert not any(isinstance(m, ConvRotLinear) for m in mods.values())
    assert all(torch.equal(mods[n].weight, w) for n, w in expect.items())
    after = ChunkRenderer(a, ar.layer_kv(toks), 8, fused=False).velocity(state, 0.5)
    assert torch.allclose(before, after, atol=1e-5), (before - after).abs().max()


def test_float_linears_falls_back_when_the_work_device_fails(tiny_paths, monkeypatch):
    """When dequantizing on the work device fails (out of memory, a cuBLAS workspace error), float_linears falls back
    to the module's own device with the same result. (The work-device path itself is tested on the GPU:
    tests/core/test_cuda_fast.py::test_float_linears_on_the_gpu_for_a_cpu_module.)"""
    import torch
    import yue2_core.weights.quant as quant
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_nar
    from yue2_core.nar import float_linears
    info = inspect_checkpoint(tiny_paths["int8"])
    ref = load_nar(info, "cpu", torch.float32)
    n = float_linears(ref)
    real = quant.dequantize
    for error in (torch.cuda.OutOfMemoryError("out of memory"), RuntimeError("CUBLAS_STATUS_ALLOC_FAILED")):
        tried = []

        def failing(q, s, group, dtype, _error=error):
            if q.device.type == "meta":  # the work device
                tried.append(1)
                raise _error
            return real(q, s, group, dtype)

        monkeypatch.setattr(quant, "dequantize", failing)
        other = load_nar(info, "cpu", torch.float32)
        assert float_linears(other, work_device="meta") == n == len(tried)
        a, b = dict(ref.named_parameters()), dict(other.named_parameters())
        assert a.keys() == b.keys()
        assert all(b[k].device.type == "cpu" and torch.equal(a[k], b[k]) for k in a)


def test_bf16_on_a_gpu_without_native_bf16_falls_back_to_fp32(monkeypatch):
    """Pre-Ampere GPUs (capability < 8.0) run in float32 with one warning; Ampere and newer, CPUs and fp32 requests
    keep what was asked. (get_device_capability is patched: no GPU is needed to check the rule.)"""
    import warnings
    from yue2_core.pipeline import compute_dtype
    cuda = torch.device("cuda")
    for capability, expect in (((7, 5), torch.float32), ((6, 1), torch.float32), ((8, 0), torch.bfloat16),
                               ((9, 0), torch.bfloat16)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert compute_dtype(cuda, torch.bfloat16) == expect, capability
        assert len(seen) == (1 if expect == torch.float32 else 0)
        if seen:
            assert "no native bfloat16" in str(seen[0].message) and f"{capability[0]}.{capability[1]}" in str(seen[0].message)
        assert compute_dtype(cuda, torch.float32) == torch.float32
    assert compute_dtype(torch.device("cpu"), torch.bfloat16) == torch.bfloat16


def test_graph_capture_failure_falls_back_to_eager_with_one_warning(tiny_paths):
    """A capture that raises (here: CUDA graphs asked for on a CPU) costs one warning and nothing else: the phase
    runs eagerly, reports why, and gives the same tokens as the eager decoder."""
    import warnings
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_tokenizer
    from yue2_core.protocol import Sampling, SongRequest, semantic_prefix
    info = inspect_checkpoint(tiny_paths["bf16"])
    ar = load_ar(info, "cpu", torch.float32)
    sp = semantic_prefix(SongRequest("pop", "la", cot="off"), [], load_tokenizer(info).encode)
    s = Sampling(min_tokens=40, max_tokens=40)
    eager = fd.PhaseDecoder(ar, [sp], s, [3], "semantic", use_graph=False, block=8).run()[0]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        forced = fd.PhaseDecoder(ar, [sp], s, [3], "semantic", use_graph=True, block=8).run()[0]
    graph_warnings = [w for w in seen if "CUDA graph decode unavailable" in str(w.message)]
    assert len(graph_warnings) == 1, [str(w.message) for w in seen]
    assert forced.timing["execution"] == "eager_device_sampler" and forced.timing["graph_fallback_reason"]
    assert forced.tokens == eager.tokens


def test_missing_triton_gives_one_warning_and_the_portable_paths():
    """Without Triton (import fails) the fast modules load, warn once in all, and report no fused or int8 kernels;
    the int8 linear and the decoder's fused switch fall back."""
    code = (
        "import sys, warnings\n"
        "sys.modules['triton'] = None  # `import triton` now raises ImportError\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    from yue2_core.fast import fused, int8_kernels\n"
        "    assert not fused.available() and not int8_kernels.triton_available()\n"
        "    assert not fused.available() and not int8_kernels.triton_available()\n"
        "msgs = [str(w.message) for w in seen if 'Triton unavailable' in str(w.message)]\n"
        "assert len(msgs) == 1, msgs\n"
        "import torch\n"
        "from yue2_core.weights.quant import quantize, dequantize\n"
        "q, s = quantize(torch.randn(8, 256))\n"
        "x = torch.randn(2, 256)\n"
        "y = int8_kernels.convrot_linear(x, q, s, None, 256)\n"
        "assert torch.allclose(y, x @ dequantize(q, s).T, atol=1e-4)\n"
        "print('ok')\n")
    _run_ok(code, interpret=False)


def test_fused_kernels_declare_the_shapes_they_handle():
    """Attention shapes the Triton kernels cannot take (head_dim not a power of two ≥ 16, query heads not a multiple
    of the KV heads) are declared unsupported, so the decoder and the NAR run the torch step instead of failing."""
    from yue2_core.fast import fused
    assert fused.supports(16, 8, 128) and fused.supports(2, 1, 128) and fused.supports(4, 4, 64)
    assert not fused.supports(16, 8, 96) and not fused.supports(16, 8, 8) and not fused.supports(12, 8, 128)


def test_shared_prefix_attention_and_decoder_in_interpreter(tiny_paths):
    """Shared prefix (YUE2_SHARED_PREFIX, default on for ≥ 4 songs): the decode attention reading a common prefix
    once for all rows equals the per-row kernel (fp32 up to summation order, fp16 rounding); a decoder whose rows
    share their prompt prefix (prefilled once, read once per step) gives the unshared decoder's logits within fp16
    rounding, for rows with different and with identical prompts; prefixes shorter than SHARED_MIN or than
    SHARED_MIN_FRACTION of the shortest row, fewer songs than SHARED_MIN_ROWS (CFG rows not counted) and
    YUE2_SHARED_PREFIX=0 leave it off."""
    pytest.importorskip("triton")
    code = (
        "import math, os, torch\n"
        "from yue2_core.fast import fused\n"
        "torch.manual_seed(0)\n"
        "for dt, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):\n"
        "    for R, P in ((2, 40), (9, 33)):\n"
        "        nkv, g, D, cap, L = 2, 2, 32, 160, 128\n"
        "        q = torch.randn(R, nkv * g, D).to(dt)\n"
        "        k, v = torch.randn(R, nkv, cap, D).to(dt), torch.randn(R, nkv, cap, D).to(dt)\n"
        "        k[:, :, :P] = k[0:1, :, :P]; v[:, :, :P] = v[0:1, :, :P]\n"
        "        pos = torch.tensor([P + 5 * i for i in range(R)]).clamp(max=L - 1)\n"
        "        a = fused.decode_attention(q, k, v, pos, L, 1 / math.sqrt(D), sms=8).float()\n"
        "        b = fused.decode_attention(q, k, v, pos, L, 1 / math.sqrt(D), sms=8, shared=P).float()\n"
        "        assert (a - b).abs().max().item() < tol, (dt, R, P)\n"
        "try:\n"
        "    fused.decode_attention(q, k, v, pos, L, 0.1, shared=L)\n"
        "    raise SystemExit('a shared prefix as long as the attention accepted')\n"
        "except ValueError as e:\n"
        "    assert 'shared prefix' in str(e)\n"
        + tiny_fp16_ar(tiny_paths['bf16']) +
        "kw = dict(use_graph=False, fused=True)  # the fused step (Triton attention) is where sharing applies\n"
        "assert fd.SHARED_MIN_ROWS == 4\n"
        "assert fd.PhaseDecoder(ar, [sp] * 4, s, [1, 2, 3, 4], 'semantic', **kw).shared == len(sp)  # default on\n"
        "assert fd.PhaseDecoder(ar, [sp] * 3, s, [1, 2, 3], 'semantic', **kw).shared == 0  # too few rows\n"
        "assert fd.PhaseDecoder(ar, [sp], s, [1], 'semantic', **kw).shared == 0\n"
        "assert fd.PhaseDecoder(ar, [sp] * 3 + [sp[:5] + sp[-1:]], s, [1, 2, 3, 4], 'semantic', **kw).shared == 0\n"
        "tails = [sp[:16] + [151853 + i] * 60 for i in range(4)]  # 16 common positions of 76: under a quarter\n"
        "assert fd.PhaseDecoder(ar, tails, s, [1, 2, 3, 4], 'semantic', **kw).shared == 0\n"
        "neg = [sp[:3] + sp[-1:]] * 2  # 2 songs with CFG = 4 rows: too few songs\n"
        "assert fd.PhaseDecoder(ar, [sp] * 2, s, [1, 2], 'semantic', cfg_scale=1.5, negatives=neg, **kw).shared == 0\n"
        "negs = [sp[:20] + sp[-1:]] * 4  # 4 songs with CFG: all 8 rows share the first 20 positions\n"
        "d = fd.PhaseDecoder(ar, [sp] * 4, s, [1, 2, 3, 4], 'semantic', cfg_scale=1.5, negatives=negs, **kw)\n"
        "assert d.R == 8 and d.shared == fd._common_prefix(d.rows) >= 20, (d.shared, len(sp))\n"
        "os.environ['YUE2_SHARED_PREFIX'] = '0'\n"
        "assert fd.PhaseDecoder(ar, [sp] * 4, s, [1, 2, 3, 4], 'semantic', **kw).shared == 0\n"
        "for rows in ([sp, sp[:-3] + sp[-1:], sp], [sp, sp], [sp + [151853], sp]):\n"
        "    decs = []\n"
        "    for flag in ('0', '1'):  # '0': the unshared decoder, as the portable step\n"
        "        os.environ['YUE2_SHARED_PREFIX'] = flag\n"
        "        d = fd.PhaseDecoder(ar, rows, s, list(range(len(rows))), 'semantic', use_graph=False)\n"
        "        if flag == '1':  # on the CPU the decoder defaults to torch attention, which never shares\n"
        "            assert d.shared == 0\n"
        "            d.fused, d.attn_kernel = True, True\n"
        "            d.shared = fd._common_prefix([list(x) for x in rows])\n"
        "        d._allocate(); d._prefill(); decs.append(d)\n"
        "    a, b = decs\n"
        "    assert a.shared == 0 and b.shared == (len(sp) - 3 if len(rows) == 3 else len(sp)), b.shared\n"
        "    assert ((a.logits.float() - b.logits.float()).norm() / a.logits.float().norm()).item() < 1e-2\n"
        "    for step in range(2):  # the second step reads the K/V the first one stored\n"
        "        for d in decs: d.tokens.fill_(151853 + 7 * step)\n"
        "        a._forward(a.capacity); b._forward_fused(b.capacity)\n"
        "        for d in decs: d.pos.add_(1)\n"
        "        rel = ((a.logits.float() - b.logits.float()).norm() / a.logits.float().norm()).item()\n"
        "        assert rel < 1e-2, (step, rel)\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


def test_prompt_continuing_a_cached_prefix_equals_one_prefill(fp32):
    """ar.hidden over T > 1 tokens after cached positions (what a shared-prefix decoder does for each row's own
    prompt tail) gives the hidden states and K/V of one causal prefill of the whole prompt (fp32)."""
    import torch
    eng, _ = fp32
    ids = torch.tensor([[151643] + [1000 + 7 * i for i in range(40)]])
    full_cache, part_cache = eng.ar.new_cache(1, 64), eng.ar.new_cache(1, 64)
    full = eng.ar.hidden(ids, full_cache)
    eng.ar.hidden(ids[:, :25], part_cache)
    tail = eng.ar.hidden(ids[:, 25:], part_cache)
    assert part_cache.length == full_cache.length == 41
    assert torch.allclose(tail, full[:, 25:], atol=1e-4, rtol=1e-4), (tail - full[:, 25:]).abs().max()
    for i in range(eng.ar.dims.layers):
        assert torch.allclose(part_cache.k[i][:, :, :41], full_cache.k[i][:, :, :41], atol=1e-4, rtol=1e-4)


def test_float_linears_device_work_waits_for_a_graph_capture(monkeypatch):
    """The nodes convert the NAR on a background thread beside the Composer (`nodes.model.YuE2Model.prefetch`), whose
    first-bucket captures run in mode "global": another thread's cudaMalloc, pinned allocation or stream sync then
    invalidates the capture. `_dequantize_on` (one layer) runs under `fast.decode.CAPTURE_LOCK`, which every capture
    holds: while another thread holds it, nothing of a layer's device work starts (review 43: it did at once).
    CPU stand-ins: the staging hands out plain buffers, the stream's sync is recorded."""
    import threading
    import time
    from yue2_core import nar as nar_mod
    from yue2_core.fast.decode import CAPTURE_LOCK
    from yue2_core.weights.quant import ConvRotLinear, quantize
    child = ConvRotLinear(256, 8)
    q, s = quantize(torch.randn(8, 256, generator=torch.Generator().manual_seed(0)))
    child.weight.copy_(q)
    child.weight_scale.copy_(s)
    seen = []

    class Staging(nar_mod._PinnedStaging):
        def get(self, name, nbytes):
            seen.append(("get", name, CAPTURE_LOCK._is_owned()))
            return torch.empty(nbytes, dtype=torch.uint8)

    class Stream:
        def synchronize(self):
            seen.append(("sync", None, CAPTURE_LOCK._is_owned()))

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("w", nar_mod._dequantize_on(
        torch.device("cpu"), child, torch.bfloat16, Staging(torch.device("cpu")))))
    with CAPTURE_LOCK:  # a capture in progress on this thread
        worker.start()
        time.sleep(0.3)
        during = list(seen)
    worker.join(10)
    assert during == [], f"device work began during a capture: {during}"
    assert [k for k, _, _ in seen] == ["get", "get", "get", "sync"] and all(owned for _, _, owned in seen), seen
    assert torch.equal(out["w"], child.dequantized(torch.bfloat16))


def test_float_linears_without_page_locked_memory_takes_the_plain_copies(tiny_paths):
    """Where page-locked memory is refused (a container limiting it), `_PinnedStaging.take` says so once and for
    good, and each layer is converted through the plain copies on the work device — not on the CPU, ~20× slower
    for the full-size NAR (review 43)."""
    import torch
    import yue2_core.nar as N
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_nar
    from yue2_core.weights.quant import ConvRotLinear
    staging = N._PinnedStaging(torch.device("cuda"))
    calls = []

    def refuse(name, nbytes):
        calls.append(name)
        raise RuntimeError("cudaHostAlloc: out of memory")

    staging.get = refuse
    assert staging.take(8, 8, 16) is None and staging.refused and calls == ["codes"]
    assert staging.take(8, 8, 16) is None and calls == ["codes"]  # not asked again
    nar = load_nar(inspect_checkpoint(tiny_paths["int8"]), "cpu", torch.bfloat16, float_linears=False)
    child = next(m for m in nar.modules() if isinstance(m, ConvRotLinear))
    got = N._dequantize_on(torch.device("cpu"), child, torch.bfloat16, staging)  # the work device: this CPU
    assert got.dtype == torch.bfloat16 and torch.equal(got, child.dequantized(torch.bfloat16))


def test_float_linears_pinned_false_uses_no_page_locked_buffers(tiny_paths, monkeypatch):
    """`pinned=False` (the nodes pass ComfyUI's `--disable-pinned-memory`) converts every layer without staging
    buffers; the default stages through them for a CUDA work device."""
    import torch
    import yue2_core.nar as N
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_nar
    seen = []

    def record(work, child, dtype, staging):
        seen.append(staging)
        return child.dequantized(dtype)

    monkeypatch.setattr(N, "_dequantize_on", record)
    info = inspect_checkpoint(tiny_paths["int8"])
    n = N.float_linears(load_nar(info, "cpu", torch.bfloat16, float_linears=False), work_device="cuda", pinned=False)
    assert n == len(seen) > 0 and all(s is None for s in seen)
    seen.clear()
    N.float_linears(load_nar(info, "cpu", torch.bfloat16, float_linears=False), work_device="cuda")
    assert seen and all(isinstance(s, N._PinnedStaging) for s in seen) and len({id(s) for s in seen}) == 1
