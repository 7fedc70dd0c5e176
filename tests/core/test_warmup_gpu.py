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


def test_warm_up_leaves_nothing_to_compile_for_a_song(tiny_paths, monkeypatch, tmp_path):
    """With an EMPTY Triton cache directory: child processes compile (YUE2_WARMUP_PROCS unset: ≥ 1 child, none
    failed, the marker written), then the real song compiles no kernel variant the warm-up did not. First in this
    file, so this process has compiled nothing yet (its in-process steps read what the children wrote)."""
    from yue2_core import warmup
    from yue2_core.pipeline import Budgets, YuE2Engine
    from yue2_core.protocol import Sampling, SongRequest
    monkeypatch.delenv("YUE2_WARMUP", raising=False)
    monkeypatch.delenv("YUE2_WARMUP_PROCS", raising=False)
    cache = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    monkeypatch.setattr(warmup, "_CACHE_CHECKED", {})
    path = os.environ.get("YUE2_BENCH_INT8") or tiny_paths["int8"]
    full = "YUE2_BENCH_INT8" in os.environ
    eng = YuE2Engine.load(path, device="cuda", warm_up=True)
    report = eng.wait_warm_up()
    print(f"warm-up on {os.path.basename(path)}: {report}")
    assert report.get("skipped") is None and report.get("steps", 0) > 0, report
    children = report["children"]
    assert report["marker"] == "miss" and report["marker_written"], report
    assert children["count"] >= 1 and children["failed"] == 0 and children["variants"] >= 10, children
    kernels = [d for d in os.listdir(cache) if d != "yue2-warmup"]
    assert len(kernels) >= children["variants"] // 2, (len(kernels), children)  # on disk, for the next process
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


def test_marker_hit_starts_no_children(tiny_paths, monkeypatch, tmp_path):
    """The same plan again in a cache that holds it: the marker is found and no child process starts."""
    from yue2_core import warmup
    from yue2_core.weights.checkpoint import inspect_checkpoint
    monkeypatch.delenv("YUE2_WARMUP", raising=False)
    monkeypatch.delenv("YUE2_WARMUP_PROCS", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(warmup, "_CACHE_CHECKED", {})
    plan = warmup.Plan.from_info(inspect_checkpoint(tiny_paths["int8"]), parts=("ar",), phases=("abc",))
    first = warmup.warm_up(plan, "cuda")
    again = warmup.warm_up(plan, "cuda")
    print(f"first {first['children']} marker {first['marker']}; again {again['children']} marker {again['marker']}")
    assert first["marker"] == "miss" and first["marker_written"] and first["children"]["count"] >= 1
    assert first["children"]["failed"] == 0, first["children"]  # a bare "cuda" device once failed every child
    assert again["marker"] == "hit" and again["children"]["count"] == 0


@pytest.mark.parametrize("refill", [True, False], ids=["continuous", "static"])
def test_warm_up_leaves_nothing_to_compile_for_the_batch_decoder(tiny_paths, monkeypatch, tmp_path, refill):
    """A warm-up told the `batch` command's decoder (4 rows; continuous or static) leaves nothing to compile for a
    real 4-row decoder with CUDA graphs: continuous, six songs of different budgets refilling the rows; static, four
    songs of one budget, in both phases."""
    from dataclasses import replace
    from yue2_core import warmup
    from yue2_core.fast.decode import PhaseDecoder
    from yue2_core.fast.refill import QueuedSong, RefillDecoder
    from yue2_core.fast.sampler import SLICES
    from yue2_core.pipeline import Budgets, YuE2Engine
    monkeypatch.delenv("YUE2_WARMUP", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    monkeypatch.setattr(warmup, "_CACHE_CHECKED", {})
    path = os.environ.get("YUE2_BENCH_INT8") or tiny_paths["int8"]
    eng = YuE2Engine.load(path, device="cuda", parts=("ar",), warm_up=True, batch_rows=4, batch_refill=refill)
    report = eng.wait_warm_up()
    assert report.get("skipped") is None and report["children"].get("failed", 0) == 0, report
    before = _variants()
    budgets = Budgets()
    for phase, preset in (("abc", budgets.abc_sampling()), ("semantic", budgets.semantic_sampling())):
        sl = SLICES[phase]
        prompts = [[sl.start + (5 * j + 3 * i) % 97 for i in range(30 + 11 * j)] for j in range(6)]
        if refill:
            lengths = (40, 57, 64, 23, 81, 33)  # both residues mod 16 among the budgets
            queue = [QueuedSong(j, p, 10 + j, min_tokens=0, max_tokens=n) for j, (p, n) in enumerate(zip(prompts,
                                                                                                      lengths))]
            dec = RefillDecoder(eng.ar, queue, 4, preset, phase)
            results = list(dec.iter_queue())
            assert len(results) == 6 and dec.totals["execution"] == "cuda_graph", dec.totals
        else:
            dec = PhaseDecoder(eng.ar, prompts[:4], replace(preset, min_tokens=min(preset.min_tokens, 50),
                                                            max_tokens=50), [1, 2, 3, 4], phase)
            dec.run()
    after = _variants()
    new = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    print(f"batch decoder ({'continuous' if refill else 'static'}) after its warm-up {report['seconds']:.1f} s: "
          f"new kernel variants: {new or 'none'}")
    assert not new, f"the batch decoder compiled kernel variants the warm-up did not: {new}"


def test_warm_ups_one_after_another_keep_cuda_memory_flat():
    """Each Checkpoint Loader run starts a warm-up thread; PyTorch keeps a cuBLAS workspace per (handle, stream) for
    the process, so a new stream per warm-up grew allocated memory by 32 MiB a run (H100, stop 42). Five warm-ups
    whose work is a cuBLAS product: allocated bytes after the second equal those after the fifth."""
    from yue2_core import warmup

    def work(plan, device, should_stop):
        a = torch.ones(256, 256, device=device, dtype=torch.bfloat16)
        (a @ a).sum().item()
        return {"seconds": 0.0}

    after = []
    for _ in range(5):
        w = warmup.WarmUp(plan=None, device=torch.device("cuda", torch.cuda.current_device()), work=work).start()
        w.wait()
        assert w.error is None, w.error
        torch.cuda.synchronize()
        after.append(torch.cuda.memory_allocated())
    assert after[1] == after[-1], [round(b / 2 ** 20, 1) for b in after]
