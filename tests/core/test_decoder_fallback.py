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
