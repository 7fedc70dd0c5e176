"""The decode step's sampling tail in Triton kernels (`fast.sample_kernels.KernelTail`) against the PyTorch tail
(`fast.decode.sample_tail`), in Triton's CPU interpreter: the processed scores handed to `torch.topk` equal bit for
bit, and the sampled tokens and the decoder state (out, ring, ring weights, done, next input tokens) equal over
several steps — CFG, temperatures below / at / above 1, top-p on and off, penalties on and off, the end token
blocked then allowed, forced tokens, the ABC slice with its masked specials, fp32 / fp16 / bf16 logits. Which
decoders use it, and the switch. (On the GPU: tests/core/test_cuda_fast.py.)"""
import pytest

from tests.core.test_fast_path import _run_ok, tiny_fp16_ar

pytest.importorskip("triton")

# The interpreter's cost is per program, not per column: with `sample_kernels.BLOCK` (1024, the GPU's) the 151,849-column
# ABC slice is 149 programs a row and a step. `scores_kernel` is elementwise, so the block size changes only how the
# columns are cut: 32,768 keeps several blocks a row and a partial last one (32,769 = 32,768 + 1 semantic columns,
# 151,849 = 4·32,768 + 20,777 ABC ones) at ~1/32 of the programs (each of which loops over the penalty window). The GPU
# test (test_cuda_fast.py) runs BLOCK = 1024.
# YUE2_GEMV=0 and YUE2_DECODE_ATTN=torch: the decoders' products and attention through torch instead of the GEMV and
# attention kernels (half of an interpreted step; the same for both tails compared here; the fused step's GEMV and
# attention have their own tests in test_gemv.py and test_fast_path.py).
INTERPRETER_BLOCK = ("import os\n"
                     "os.environ['YUE2_GEMV'] = '0'\n"
                     "os.environ['YUE2_DECODE_ATTN'] = 'torch'\n"
                     "from yue2_core.fast import sample_kernels as _sk\n"
                     "_sk.BLOCK = 32768\n")

def test_kernel_tail_equals_torch_tail():
    """Every case of `sample_tail_check.cases` (CFG in fp16: see there), 41 steps in all: processed scores and state
    equal at every step."""
    code = (INTERPRETER_BLOCK +
            "import torch\n"
            "from tests.core.sample_tail_check import cases, compare\n"
            "r = compare('cpu', cases(torch.float16))\n"
            "assert r['steps'] == 41 and r['score_mismatches'] == 0 and not r['state_mismatches'], r\n"
            "print('ok')\n")
    _run_ok(code, interpret=True)


def test_kernel_tail_with_a_step_per_row_equals_torch_tail():
    """Continuous batching (`fast.refill`) gives each row its own step (step [G], the out/noise/forced buffers one
    slot longer): the cases of several songs with rows at different steps — draws, outputs, penalty-ring slots,
    min_tokens and the budget test each read at the row's own step — equal between the two tails."""
    code = (INTERPRETER_BLOCK +
            "import torch\n"
            "from tests.core.sample_tail_check import cases, compare\n"
            "r = compare('cpu', cases(torch.float16), per_row=True)\n"
            "assert r['steps'] == 17 and r['score_mismatches'] == 0 and not r['state_mismatches'], r\n"
            "print('ok')\n")
    _run_ok(code, interpret=True)


def test_decoder_chooses_the_tail(tiny_paths, monkeypatch):
    """A fused decoder with sampling uses the kernel tail and samples the same tokens as with YUE2_SAMPLER=torch;
    greedy decoding, the legacy `off` mode and unfused decoders keep the PyTorch tail; a bad switch value is refused
    before any work."""
    code = (INTERPRETER_BLOCK + tiny_fp16_ar(tiny_paths["bf16"]) +
            "import os\n"
            "s = Sampling(temperature=1.0, top_p=0.9, top_k=50, min_tokens=2, max_tokens=4)\n"
            "runs = {}\n"
            "for choice in ('kernels', 'torch'):\n"
            "    os.environ['YUE2_SAMPLER'] = choice\n"
            "    d = fd.PhaseDecoder(ar, [sp, sp[:-2] + sp[-1:]], s, [3, 4], 'semantic', use_graph=False, fused=True)\n"
            "    res = d.run()\n"
            "    runs[choice] = [r.tokens for r in res]\n"
            "    assert res[0].timing['sampling_tail'] == choice, (choice, res[0].timing['sampling_tail'])\n"
            "assert runs['kernels'] == runs['torch'], runs\n"
            "os.environ['YUE2_SAMPLER'] = 'kernels'\n"
            "for kw in (dict(sampling=Sampling(temperature=0.0, min_tokens=0, max_tokens=4)), dict(legacy_off=True),\n"
            "           dict(fused=False)):\n"
            "    sam = kw.pop('sampling', s)\n"
            "    d = fd.PhaseDecoder(ar, [sp], sam, [3], 'semantic', use_graph=False, **{'fused': True, **kw})\n"
            "    d._allocate()\n"
            "    assert d.tail is None, kw\n"
            "d = fd.PhaseDecoder(ar, [sp], s, [3], 'semantic', use_graph=False, fused=True)\n"
            "d._allocate()\n"
            "assert d.tail is not None\n"
            "os.environ['YUE2_SAMPLER'] = 'triton'\n"
            "from yue2_core.errors import RequestError\n"
            "try:\n"
            "    fd.PhaseDecoder(ar, [sp], s, [3], 'semantic', use_graph=False, fused=True)\n"
            "    raise SystemExit('YUE2_SAMPLER=triton accepted')\n"
            "except RequestError as e:\n"
            "    assert 'YUE2_SAMPLER' in str(e) and 'kernels' in str(e), e\n"
            "print('ok')\n")
    _run_ok(code, interpret=True)


def test_temperature_rule_on_the_cpu():
    """On the CPU PyTorch divides the scores by T (correctly rounded): the rule says so, with T in fp32, and is
    remembered per (T, device); T = 0.85 is one where the reciprocal rules would differ (1 ulp in most scores)."""
    import torch

    from yue2_core.fast import sample_kernels as sk
    t32 = float(torch.tensor(0.85, dtype=torch.float32))
    assert sk.temperature_rule(0.85, "cpu") == ("div", t32)
    assert sk._RULES[(0.85, "cpu")] == ("div", t32)
    x = torch.randn(4096) * 10
    inv = float(torch.tensor(1 / 0.85, dtype=torch.float32))
    assert not torch.equal(x / 0.85, x * inv)  # so the probe can tell the rules apart at this T


def test_tail_kernel_failure_keeps_the_fused_step(tiny_paths):
    """When only the sampling-tail kernels fail (injected), the step is undone and rerun with the PyTorch tail — one
    warning, the layer kernels stay on — and the songs equal a YUE2_SAMPLER=torch run; when `temperature_rule` finds
    no rule the PyTorch tail is used from the start; forced ids outside the phase's slice are refused."""
    code = (INTERPRETER_BLOCK + tiny_fp16_ar(tiny_paths["bf16"]) +
            "import os, warnings\n"
            "from yue2_core.fast import sample_kernels as sk\n"
            "from yue2_core.errors import RequestError\n"
            "s = Sampling(temperature=0.9, top_p=0.9, top_k=50, min_tokens=2, max_tokens=5)\n"
            "rows = [sp, sp[:-2] + sp[-1:]]\n"
            "os.environ['YUE2_SAMPLER'] = 'torch'\n"
            "ref = [r.tokens for r in fd.PhaseDecoder(ar, rows, s, [3, 4], 'semantic', use_graph=False,\n"
            "                                         fused=True).run()]\n"
            "os.environ['YUE2_SAMPLER'] = 'kernels'\n"
            "def broken(self, *a, **kw):\n"
            "    raise RuntimeError('out of resource: shared memory (injected)')\n"
            "real = sk.KernelTail.__call__\n"
            "sk.KernelTail.__call__ = broken\n"
            "d = fd.PhaseDecoder(ar, rows, s, [3, 4], 'semantic', use_graph=False, fused=True)\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            "    res = d.run()\n"
            "sk.KernelTail.__call__ = real\n"
            "msgs = [str(w.message) for w in seen]\n"
            "assert sum('sampling-tail kernels unavailable' in m for m in msgs) == 1, msgs\n"
            "assert not any('fused decode kernels unavailable' in m for m in msgs), msgs\n"
            "t = res[0].timing\n"
            "assert d.fused and t['fused_kernels'] and t['sampling_tail'] == 'torch', t\n"
            "assert t['sampling_tail_fallback_reason'].startswith('RuntimeError: out of resource'), t\n"
            "assert [r.tokens for r in res] == ref, ([r.tokens for r in res], ref)\n"
            "sk.temperature_rule = lambda t, device: None\n"
            "d = fd.PhaseDecoder(ar, rows, s, [3, 4], 'semantic', use_graph=False, fused=True)\n"
            "d._allocate()\n"
            "assert d.tail is None\n"
            "for bad in ([5], [sp[0]], [184700]):\n"
            "    try:\n"
            "        fd.PhaseDecoder(ar, rows, s, [3, 4], 'semantic', use_graph=False, forced=bad)\n"
            "        raise SystemExit(f'forced {bad} accepted')\n"
            "    except RequestError as e:\n"
            "        assert 'outside the semantic phase' in str(e), e\n"
            "print('ok')\n")
    _run_ok(code, interpret=True)
