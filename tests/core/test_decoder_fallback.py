"""The decoder's last line of defence on GPUs it never ran on: when a kernel of the fused step fails (Triton refusing
a launch configuration, say), the step is undone and rerun with the unfused torch step, one warning, and the song
comes out as if it had been decoded unfused — in Triton's CPU interpreter, with the failure injected."""
from __future__ import annotations

import textwrap

import pytest

from tests.core.test_fast_path import _run_ok, tiny_fp16_ar


def test_fused_kernel_failure_falls_back_to_the_unfused_step(tiny_paths):
    pytest.importorskip("triton")
    code = tiny_fp16_ar(str(tiny_paths["bf16"])) + textwrap.dedent("""
        import warnings
        import torch
        from yue2_core.fast import fused
        s = Sampling(temperature=0.0, min_tokens=5, max_tokens=5)
        rows = [sp, sp[:-3] + sp[-1:]]

        def run(fail_at=None, error=RuntimeError("out of resource: shared memory, Required: 122880")):
            d = fd.PhaseDecoder(ar, rows, s, [1, 2], 'semantic', use_graph=False, fused=fail_at is not None)
            if fail_at is not None:
                d.fused, d.attn_kernel, d.gemv = True, True, False  # the fused step (library products), interpreted
                calls, real = [0], fused.qk_norm_rope_store
                def flaky(*a, **kw):
                    calls[0] += 1
                    if calls[0] == fail_at:
                        raise error
                    return real(*a, **kw)
                fused.qk_norm_rope_store = flaky
            try:
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter('always')
                    res = d.run()
            finally:
                if fail_at is not None:
                    fused.qk_norm_rope_store = real
            return d, res, [str(w.message) for w in seen]

        _, plain, _ = run()
        # the first fused call fails (layer 0 of the first decoded step): everything after runs unfused
        d, res, msgs = run(fail_at=1)
        assert not d.fused and d.kernel_error.startswith('RuntimeError: out of resource'), d.kernel_error
        assert sum('fused decode kernels unavailable' in m for m in msgs) == 1, msgs
        assert [r.tokens for r in res] == [r.tokens for r in plain], ([r.tokens for r in res], [r.tokens for r in plain])
        assert res[0].timing['fused_fallback_reason'] == d.kernel_error and not res[0].timing['fused_kernels']
        # a failure in the middle of a step (layer 1 of step 2): that step is undone and redone unfused; five tokens
        d, res, msgs = run(fail_at=4)
        assert d.kernel_error and all(len(r.tokens) == 5 for r in res), [r.tokens for r in res]
        # out of memory is not a kernel problem: it is raised, not hidden behind a slower path
        try:
            run(fail_at=2, error=torch.cuda.OutOfMemoryError('CUDA out of memory'))
            raise SystemExit('the OOM was swallowed')
        except torch.cuda.OutOfMemoryError:
            pass
        print('ok')
    """)
    _run_ok(code, interpret=True)


def test_int8_pair_code_failure_keeps_the_other_kernels(tiny_paths):
    """The int8 × int8 products (YUE2_INT8_DOT=int8) are the newest path, so they go first: when one fails, the
    step is redone with the int8 codes converted to bf16 — one warning, the sampling-tail and layer kernels kept —
    and the tokens are those of a decoder started with YUE2_INT8_DOT=convert. With the torch decode attention
    (YUE2_DECODE_ATTN=torch) the pair codes are not used and the fused int8 step runs without any fallback
    (review finding: an empty code list was passed on as codes there)."""
    pytest.importorskip("triton")
    code = tiny_fp16_ar(str(tiny_paths["int8"])) + textwrap.dedent("""
        import os, warnings
        from yue2_core.fast import gemv as G
        s = Sampling(temperature=0.0, min_tokens=2, max_tokens=2)
        # wide blocks (the layers' 128 outputs, the codec head's 2,048 of 32,769 rows): the interpreter's cost is
        # mostly per program
        G.choose = lambda n, k, m, int8: G.Config(bn=128, bk=256, split=2) if n < 4096 else G.Config(bn=2048)
        G.choose_q = lambda n, k: (G.choose(n, k, 1, True), False)

        def run(dot, attn='triton', fail=False):  # one row, two tokens: interpreted steps are slow
            os.environ['YUE2_INT8_DOT'], os.environ['YUE2_DECODE_ATTN'] = dot, attn
            d = fd.PhaseDecoder(ar, [sp], s, [1], 'semantic', use_graph=False, fused=True)
            real = G.gemv_q
            if fail:
                def broken(*a, **kw):
                    raise RuntimeError('int8 MMA not supported on this target')
                G.gemv_q = broken
            try:
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter('always')
                    res = d.run()
            finally:
                G.gemv_q = real
            return d, res, [str(w.message) for w in seen]

        ref, ref_res, _ = run('convert')
        assert ref.fused and ref.gemv and ref.int8_layers and not ref.int8_dot
        d, res, msgs = run('int8', fail=True)
        assert d.fused and d.gemv and not d.int8_dot and d.kernel_error is None and d.tail_error is None, msgs
        assert d.int8_dot_error.startswith('RuntimeError: int8 MMA'), d.int8_dot_error
        assert sum('int8 × int8 decode products unavailable' in m for m in msgs) == 1, msgs
        assert [r.tokens for r in res] == [r.tokens for r in ref_res]
        assert res[0].timing['int8_products'] == 'codes converted to bf16'
        assert res[0].timing['int8_products_fallback_reason'] == d.int8_dot_error
        d, res, msgs = run('int8', attn='torch')
        assert d.fused and d.gemv and not d.int8_dot and d.kernel_error is None and d.tail_error is None, msgs
        assert not any('unavailable' in m for m in msgs), msgs
        d, res, msgs = run('int8')
        assert d.int8_dot and d.kernel_error is None and d.int8_dot_error is None and d.tail_error is None, msgs
        assert res[0].timing['int8_products'] == 'int8 x int8 (pair codes)'
        print('ok')
    """)
    _run_ok(code, interpret=True)
