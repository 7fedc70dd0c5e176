"""The fused sampling tail (`fast.fused_sampler`, YUE2_FUSED_SAMPLER=1) in Triton's CPU interpreter: the same
tokens, penalty ring, done flags and processed scores as the PyTorch tail on constructed logits (every case of
fused_sampler_check.py: CFG, temperatures, top-k/top-p, penalties, greedy, forcing, the ABC slice), and a decoder
using it gives the default decoder's greedy tokens. The same check runs on the GPU in test_cuda_fast.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_fast_path import _run_ok, tiny_fp16_ar

HERE = Path(__file__).resolve().parent


def test_fused_sampling_tail_equals_the_torch_tail_in_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, PYTHONPATH=str(HERE.parents[1]), TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, str(HERE / "fused_sampler_check.py"), "cpu"], env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), (out.stdout[-2000:], out.stderr[-3000:])
    assert out.stdout.count("steps equal") == 6, out.stdout


def test_decoder_with_fused_sampler_in_interpreter(tiny_paths):
    """Greedy with a repetition penalty (the only mode where a tie in fp16 logits cannot reorder candidates): the
    decoder with YUE2_FUSED_SAMPLER=1 writes the same tokens as with the PyTorch tail; a bad value is refused."""
    pytest.importorskip("triton")
    code = (
        "import os\nfrom yue2_core.errors import RequestError\n" + tiny_fp16_ar(tiny_paths["bf16"]) +
        "s = Sampling(temperature=0.0, repetition_penalty=1.3, min_tokens=6, max_tokens=6)\n"
        "runs = []\n"
        "for flag in ('0', '1'):\n"
        "    os.environ['YUE2_FUSED_SAMPLER'] = flag\n"
        "    d = fd.PhaseDecoder(ar, [sp, sp[:-3] + sp[-1:]], s, [1, 2], 'semantic', use_graph=False, fused=True)\n"
        "    assert (d.sampler is None) and d.fused_sampler == (flag == '1')\n"
        "    runs.append([r.tokens for r in d.run()])\n"
        "    assert (d.sampler is not None) == (flag == '1')\n"
        "assert runs[0] == runs[1] and len(runs[0][0]) == 6, runs\n"
        "os.environ['YUE2_FUSED_SAMPLER'] = 'yes'\n"
        "try:\n"
        "    fd.PhaseDecoder(ar, [sp], s, [1], 'semantic', use_graph=False, fused=True)\n"
        "    raise SystemExit('YUE2_FUSED_SAMPLER=yes accepted')\n"
        "except RequestError as e:\n"
        "    assert 'YUE2_FUSED_SAMPLER' in str(e)\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)
