"""After `warmup.warm_up` on a shadow model, a real song's decode + NAR + VAE compile NO new Triton kernel variant
(issue #18 item 1). Full-size dims when $YUE2_BENCH_INT8 names a full-size synthetic int8 file, else the tiny one.
Marked gpu; skipped without CUDA."""
import os
import types

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


def _jit_functions() -> list:
    """Every Triton JIT function reachable from yue2_core.fast's modules (module globals and lru-cached builders)."""
    import triton
    from yue2_core.fast import _decode_triton, fused, gemv, int8_kernels, sample_kernels  # noqa: F401
    seen, out = set(), []
    mods = [m for name, m in list(__import__("sys").modules.items()) if name.startswith("yue2_core.fast")]
    objs = []
    for m in mods:
        objs += [getattr(m, n) for n in dir(m)]
    for builder in (fused._kernels, fused._attention_kernels, fused._snake_kernel, gemv._kernels):
        got = builder()
        objs += list(got) if isinstance(got, tuple) else [got]
    for o in objs:
        fn = o
        while hasattr(fn, "fn") and not isinstance(fn, triton.runtime.jit.JITFunction):
            fn = fn.fn  # autotuner / heuristics wrappers
        if isinstance(fn, triton.runtime.jit.JITFunction) and id(fn) not in seen:
            seen.add(id(fn))
            out.append(fn)
    return out


def _variants() -> dict:
    return {f.__name__: sum(len(c[0]) for c in f.device_caches.values()) for f in _jit_functions()}


def test_warm_up_leaves_nothing_to_compile_for_a_song(tiny_paths, monkeypatch):
    from yue2_core import warmup
    from yue2_core.pipeline import Budgets, YuE2Engine
    from yue2_core.protocol import Sampling, SongRequest
    monkeypatch.delenv("YUE2_WARMUP", raising=False)
    path = os.environ.get("YUE2_BENCH_INT8") or tiny_paths["int8"]
    full = "YUE2_BENCH_INT8" in os.environ
    eng = YuE2Engine.load(path, device="cuda", warm_up=True)
    report = eng.wait_warm_up()
    print(f"warm-up on {os.path.basename(path)}: {report}")
    assert report.get("skipped") is None and report.get("steps", 0) > 0, report
    before = _variants()
    assert sum(before.values()) > 10, before
    abc_n, sem_n = (300, 1000) if full else (40, 120)
    abc = Sampling(0.7, 0.9, 30, 1.005, 100, abc_n, abc_n)
    sem = Sampling(min_tokens=sem_n, max_tokens=sem_n)
    song = eng.generate(SongRequest("warm-up check", "[Verse]\nla la", cot="full", seed=3),
                        Budgets(abc=abc, semantic=sem))
    after = _variants()
    new = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    print(f"song {song.timing}; new kernel variants: {new or 'none'}")
    assert song.score.timing.get("fused_kernels") and song.tokens.timing.get("execution") == "cuda_graph"
    assert not new, f"the song compiled kernel variants the warm-up did not: {new}"
