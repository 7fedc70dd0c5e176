"""The decode step's sampling tail in Triton kernels (`fast.sample_kernels.KernelTail`) against the PyTorch tail
(`fast.decode.sample_tail`), in Triton's CPU interpreter: the processed scores handed to `torch.topk` equal bit for
bit, and the sampled tokens and the decoder state (out, ring, ring weights, done, next input tokens) equal over
several steps — CFG, temperatures below / at / above 1, top-p on and off, penalties on and off, the end token
blocked then allowed, forced tokens, the ABC slice with its masked specials, fp32 / fp16 / bf16 logits. Which
decoders use it, and the switch. (On the GPU: tests/core/test_cuda_fast.py.)"""
import pytest

from tests.core.test_fast_path import _run_ok, tiny_fp16_ar

pytest.importorskip("triton")

def test_kernel_tail_equals_torch_tail():
    """Every case of `sample_tail_check.cases` (CFG in fp16: see there), 41 steps in all: processed scores and state
    equal at every step."""
    code = ("import torch\n"
            "from tests.core.sample_tail_check import cases, compare\n"
            "r = compare('cpu', cases(torch.float16))\n"
            "assert r['steps'] == 41 and r['score_mismatches'] == 0 and not r['state_mismatches'], r\n"
            "print('ok')\n")
    _run_ok(code, interpret=True)


def test_decoder_chooses_the_tail(tiny_paths, monkeypatch):
    """A fused decoder with sampling uses the kernel tail and samples the same tokens as with YUE2_SAMPLER=torch;
    greedy decoding, the legacy `off` mode and unfused decoders keep the PyTorch tail; a bad switch value is refused
    before any work."""
    code = (tiny_fp16_ar(tiny_paths["bf16"]) +
            "import os\n"
            "s = Sampling(temperature=1.0, top_p=0.9, top_k=50, min_tokens=2, max_tokens=12)\n"
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
