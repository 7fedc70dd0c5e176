"""YuE2 speed benchmark on one NVIDIA GPU: ours vs a vendor-style baseline, in the same run, on full-size synthetic
checkpoints (random weights of the real shapes; numbers say nothing about audio quality).

    python bench/bench.py --workdir /tmp/yue2bench --json bench.json

Prints one table (metric, ours, baseline, ratio) and writes JSON. Baseline = the vendor runtime's design
(runtime.md §8, performance.md §5.1): the model step graphed with the full 184,704-row LM head, eager
full-vocabulary sampling, one `.item()` host sync per token; eager NAR with a `torch.cat` of the AR K/V per layer
and evaluation; fp32 VAE. Ours = `yue2_core.fast` (whole step + sampling in one CUDA graph, phase-sliced head,
no per-token sync, int8 W8A16 Triton GEMV) and the engine's NAR/VAE.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from yue2_core.constants import ABC_START, EOD, MUSIC_START, VOCAB_SIZE  # noqa: E402
from yue2_core.fast import decode as fd  # noqa: E402
from yue2_core.fast.sampler import PhaseSlice  # noqa: E402
from yue2_core.protocol import Sampling  # noqa: E402
from yue2_core.sampling import process_logits  # noqa: E402

RESULTS: dict = {"machine": {}, "metrics": {}, "errors": {}}


def log(*a):
    print(*a, flush=True)


ARGS = argparse.Namespace(gemv_table="")  # set by main()


def record(name, ours=None, base=None, unit="", note=""):
    RESULTS["metrics"][name] = {"ours": ours, "baseline": base, "unit": unit, "note": note}
    ratio = f"{ours / base:.2f}x" if ours and base and unit.endswith("/s") else (
        f"{base / ours:.2f}x" if ours and base else "")
    log(f"  {name:42s} ours={_fmt(ours)} base={_fmt(base)} {unit} {ratio} {note}")


def _fmt(v):
    return "-" if v is None else (f"{v:.2e}" if 0 < abs(v) < 0.01 else f"{v:.3f}" if v < 100 else f"{v:.0f}")


def section(name):
    def wrap(fn):
        def run(*a, **k):
            log(f"== {name}")
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            except Exception as exc:  # keep going: one broken section must not lose the others
                RESULTS["errors"][name] = f"{type(exc).__name__}: {exc}"
                log(traceback.format_exc())
            finally:
                log(f"   ({time.perf_counter() - t:.1f} s)")
        return run
    return wrap


DEVICE = "cuda"
PROFILE = "full"


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def prompt_ids(n, phase, seed=0):
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(0, 150000, (n - 2,), generator=g).tolist()
    return [EOD] + body + [ABC_START if phase == "abc" else MUSIC_START]


def fixed_len(preset: Sampling, n: int) -> Sampling:
    """The preset with the end token blocked for exactly n tokens (min = max = n)."""
    return Sampling(preset.temperature, preset.top_p, preset.top_k, preset.repetition_penalty,
                    preset.penalty_window, n, n)


SEM = Sampling()
ABC = Sampling(0.7, 0.9, 30, 1.005, 100, 32, 4096)


def ours_rate(ar, prefixes, s, phase, cfg=1.0, negatives=None, compile=None, fused=None):
    dec = fd.PhaseDecoder(ar, prefixes, s, list(range(1, len(prefixes) + 1)), phase, negatives=negatives,
                          cfg_scale=cfg, compile=compile, fused=fused)
    res = dec.run()
    t = res[0].timing
    return t["decode_tokens_per_second"], t


@contextlib.contextmanager
def env(**values):
    """Set environment switches of the fast path (YUE2_GEMV, YUE2_INT8_ROT, …) for a block."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def warm(ar, prefixes_list, s, phase, **kw):
    """One short run per configuration first: Triton JIT compilation and autotuning are one-time per process."""
    short = fixed_len(s, 48)
    for prefixes in prefixes_list:
        ours_rate(ar, prefixes, short, phase, **kw)


class VendorBaseline(fd.PhaseDecoder):
    """Vendor-style loop: graph of the model step with the full LM head; sampling eager on the full vocabulary
    (reference processor) with torch.multinomial; `.item()` every token."""

    def __init__(self, ar, prefixes, s, phase, **kw):
        super().__init__(ar, prefixes, s, [1], phase, **kw)
        end = 151848 if phase == "abc" else 151852
        self.slice = PhaseSlice(0, VOCAB_SIZE, end, None)

    def _fwd(self, attn_len):
        self._forward(attn_len)
        self.pos.add_(1)

    def run_baseline(self):
        self._allocate()
        self._prefill()
        sync()
        gen = torch.Generator(device=DEVICE).manual_seed(1)
        graphs = {}
        s, hist = self.s, []
        t0 = time.perf_counter()
        max_prefix = max(len(r) for r in self.rows)
        for step in range(s.max_tokens):
            logits = self.logits[0] if self.cfg == 1.0 else self.logits[1] + self.cfg * (self.logits[0] - self.logits[1])
            scores = process_logits(logits, s, hist, step, self.phase, False)
            tok = int(torch.multinomial(scores.softmax(-1), 1, generator=gen).item())
            hist.append(tok)
            self.tokens.fill_(tok)
            attn_len = min(self.capacity, math.ceil((max_prefix + step + 1) / fd.BUCKET) * fd.BUCKET)
            if DEVICE != "cuda":
                self._fwd(attn_len)
                continue
            if attn_len not in graphs:
                saved = [t.clone() for t in self._state()]
                self._fwd(attn_len)
                for a, b in zip(self._state(), saved):
                    a.copy_(b)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    self._fwd(attn_len)
                graphs[attn_len] = g
            graphs[attn_len].replay()
        sync()
        return s.max_tokens / (time.perf_counter() - t0)


def baseline_rate(ar, prefix, s, phase, cfg=1.0, negative=None):
    b = VendorBaseline(ar, [prefix], s, phase, cfg_scale=cfg, negatives=None if negative is None else [negative])
    return b.run_baseline()


@section("checkpoints")
def make_checkpoints(workdir, fmts=("bf16", "int8")):
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    os.makedirs(workdir, exist_ok=True)
    paths = {}
    for fmt in fmts:
        p = os.path.join(workdir, f"yue2_{PROFILE}_{fmt}.safetensors")
        if not os.path.exists(p):
            t = time.perf_counter()
            rep = write_synthetic_checkpoint(p, profile=PROFILE, fmt=fmt, seed=0, device=DEVICE)
            log(f"  wrote {p}: {rep['elements']:,} elements, {rep['data_bytes']:,} bytes, "
                f"matches release totals: {rep.get('matches_release')} ({time.perf_counter() - t:.1f} s)")
            RESULTS["machine"][f"checkpoint_{fmt}"] = {"elements": rep["elements"], "data_bytes": rep["data_bytes"],
                                                      "matches_release": rep.get("matches_release")}
        paths[fmt] = p
    return paths


def load(path, parts=("ar", "nar", "vae")):
    from yue2_core.pipeline import YuE2Engine
    t = time.perf_counter()
    eng = YuE2Engine.load(path, device=DEVICE, parts=parts)
    sync()
    log(f"  loaded {os.path.basename(path)} {parts} in {time.perf_counter() - t:.1f} s")
    return eng


@section("AR bf16")
def ar_bf16(eng, n, compile_ok):
    sem_p, abc_p, neg = prompt_ids(2000, "semantic"), prompt_ids(500, "abc", 1), prompt_ids(40, "semantic", 2)
    s = fixed_len(SEM, n)
    t = time.perf_counter()
    cache = eng.ar.new_cache(1, 2000)
    eng.ar.prefill(torch.tensor([sem_p], device=DEVICE), cache)
    sync()
    t = time.perf_counter()
    eng.ar.prefill(torch.tensor([sem_p], device=DEVICE), eng.ar.new_cache(1, 2000))
    sync()
    record("prefill 2000 tokens (s)", time.perf_counter() - t, None, "s")
    warm(eng.ar, [[sem_p], [sem_p] * 4, [sem_p] * 8], s, "semantic")
    warm(eng.ar, [[sem_p]], s, "semantic", cfg=1.5, negatives=[neg])
    warm(eng.ar, [[sem_p]], s, "semantic", fused=False)
    warm(eng.ar, [[abc_p]], fixed_len(ABC, 48), "abc")
    base1 = baseline_rate(eng.ar, sem_p, s, "semantic")
    ours_plain, _ = ours_rate(eng.ar, [sem_p], s, "semantic", compile=False, fused=False)
    record("AR decode bf16 batch 1 (graph, torch ops)", ours_plain, base1, "tok/s")
    os.environ["YUE2_DECODE_ATTN"] = "torch"
    try:
        warm(eng.ar, [[sem_p]], s, "semantic")
        ours_ta, _ = ours_rate(eng.ar, [sem_p], s, "semantic", compile=False)
    finally:
        os.environ.pop("YUE2_DECODE_ATTN")
    record("AR decode bf16 batch 1 (graph + fused kernels, torch attention)", ours_ta, base1, "tok/s")
    with env(YUE2_GEMV="0", YUE2_PDL="0"):
        warm(eng.ar, [[sem_p]], s, "semantic")
        ours_lib, _ = ours_rate(eng.ar, [sem_p], s, "semantic", compile=False)
    record("AR decode bf16 batch 1 (graph + fused kernels + split attention, cuBLAS GEMV)", ours_lib, base1, "tok/s")
    with env(YUE2_PDL="0"):
        warm(eng.ar, [[sem_p]], s, "semantic")
        ours_nopdl, _ = ours_rate(eng.ar, [sem_p], s, "semantic", compile=False)
    record("AR decode bf16 batch 1 (graph + fused kernels + split attention + split-K GEMV)", ours_nopdl, base1,
           "tok/s")
    ours1, t1 = ours_rate(eng.ar, [sem_p], s, "semantic", compile=False)
    record("AR decode bf16 batch 1 (… + split-K GEMV + programmatic dependent launch)", ours1, base1, "tok/s",
           f"fused={t1.get('fused_kernels')}, attention={t1.get('decode_attention')}, "
           f"products={t1.get('layer_products')}, pdl={t1.get('pdl')}, sampling_tail={t1.get('sampling_tail')}; "
           f"capture {t1.get('graph_capture_seconds', 0):.2f} s per phase excl.")
    with env(YUE2_ATTN_MERGE="kernel"):  # the decode attention's splits merged by a separate kernel
        warm(eng.ar, [[sem_p]], s, "semantic")
        ours_mk, _ = ours_rate(eng.ar, [sem_p], s, "semantic", compile=False)
    record("AR decode bf16 batch 1, attention merged by a separate kernel", ours_mk, base1, "tok/s",
           "YUE2_ATTN_MERGE=kernel")
    variants(eng.ar, "bf16", sem_p, neg, s, base1)
    torch_tail(eng.ar, "bf16", sem_p, neg, s, base1)
    best = ours1
    if compile_ok:
        ours1c, _ = ours_rate(eng.ar, [sem_p], s, "semantic", compile=True)
        record("AR decode bf16 batch 1 (graph + torch.compile)", ours1c, base1, "tok/s")
        best = max(best, ours1c)
    use_compile = compile_ok and best > ours1
    RESULTS["machine"]["compile_used"] = use_compile
    basec = baseline_rate(eng.ar, sem_p, s, "semantic", cfg=1.5, negative=neg)
    oursc, _ = ours_rate(eng.ar, [sem_p], s, "semantic", cfg=1.5, negatives=[neg], compile=use_compile)
    record("AR decode bf16 CFG pair (song tok/s)", oursc, basec, "tok/s")
    ours8, t8 = ours_rate(eng.ar, [sem_p] * 8, s, "semantic", compile=use_compile)
    record("AR decode bf16 8 candidates (total)", ours8 * 8, base1, "tok/s",
           f"baseline = 1 song at a time; shared-prefix attention over {t8.get('shared_prefix_positions')} positions")
    with env(YUE2_SHARED_PREFIX="0"):  # each row reads the common prompt from its own cache
        warm(eng.ar, [[sem_p] * 8, [sem_p] * 4], s, "semantic")
        ours8u, _ = ours_rate(eng.ar, [sem_p] * 8, s, "semantic", compile=use_compile)
        ours4u, _ = ours_rate(eng.ar, [sem_p] * 4, s, "semantic", compile=use_compile)
    record("AR decode bf16 8 candidates, per-row attention (total)", ours8u * 8, base1, "tok/s",
           "YUE2_SHARED_PREFIX=0")
    ours4, _ = ours_rate(eng.ar, [sem_p] * 4, s, "semantic", compile=use_compile)
    record("AR decode bf16 4 candidates (total)", ours4 * 4, base1, "tok/s", "shared-prefix attention")
    record("AR decode bf16 4 candidates, per-row attention (total)", ours4u * 4, base1, "tok/s",
           "YUE2_SHARED_PREFIX=0")
    sa = fixed_len(ABC, min(n, 512))
    basea = baseline_rate(eng.ar, abc_p, sa, "abc")
    oursa, _ = ours_rate(eng.ar, [abc_p], sa, "abc", compile=use_compile)
    record("AR decode bf16 ABC phase", oursa, basea, "tok/s")
    return {"b1": best, "base1": base1, "cfg": oursc, "basec": basec, "b4": ours4, "b8": ours8, "abc": oursa,
            "base_abc": basea, "compile": use_compile}


def torch_tail(ar, fmt: str, sem_p, neg, s, base1):
    """The same configurations with the PyTorch sampling tail (`decode.sample_tail`, YUE2_SAMPLER=torch) instead of
    the default kernels (`fast.sample_kernels`): batch 1, the CFG pair, 8 candidates and the ABC phase."""
    abc_p, sa = prompt_ids(500, "abc", 1), fixed_len(ABC, min(s.max_tokens, 512))
    with env(YUE2_SAMPLER="torch"):
        warm(ar, [[sem_p], [sem_p] * 8], s, "semantic")
        warm(ar, [[sem_p]], s, "semantic", cfg=1.5, negatives=[neg])
        warm(ar, [[abc_p]], fixed_len(ABC, 48), "abc")
        rate, t = ours_rate(ar, [sem_p], s, "semantic")
        rate_cfg, _ = ours_rate(ar, [sem_p], s, "semantic", cfg=1.5, negatives=[neg])
        rate8, _ = ours_rate(ar, [sem_p] * 8, s, "semantic")
        rate_abc, _ = ours_rate(ar, [abc_p], sa, "abc")
    note = f"YUE2_SAMPLER=torch; sampling_tail={t.get('sampling_tail')}"
    record(f"AR decode {fmt} batch 1, PyTorch sampling tail", rate, base1, "tok/s", note)
    record(f"AR decode {fmt} CFG pair, PyTorch sampling tail", rate_cfg, None, "tok/s", note)
    record(f"AR decode {fmt} 8 candidates, PyTorch sampling tail (total)", rate8 * 8, base1, "tok/s", note)
    record(f"AR decode {fmt} ABC phase, PyTorch sampling tail", rate_abc, None, "tok/s", note)


def variants(ar, fmt: str, sem_p, neg, s, base1):
    """Batch 1 and the CFG pair with the GEMV configurations of --gemv-table (YUE2_GEMV_TABLE, e.g. the CUDA-core
    ones bench/gemv_sweep.py --json found); nothing without it."""
    opts = []
    if ARGS.gemv_table:
        opts.append((f"GEMV table {Path(ARGS.gemv_table).name}", {"YUE2_GEMV_TABLE": ARGS.gemv_table}))
    for label, switches in opts:
        with env(**switches):
            warm(ar, [[sem_p]], s, "semantic")
            warm(ar, [[sem_p]], s, "semantic", cfg=1.5, negatives=[neg])
            rate, t = ours_rate(ar, [sem_p], s, "semantic")
            rate_cfg, _ = ours_rate(ar, [sem_p], s, "semantic", cfg=1.5, negatives=[neg])
        note = " ".join(f"{k}={v}" for k, v in switches.items()) + f"; {t.get('layer_products')}"
        record(f"AR decode {fmt} batch 1, {label}", rate, base1, "tok/s", note)
        record(f"AR decode {fmt} CFG pair, {label}", rate_cfg, None, "tok/s", note)


@section("AR int8")
def ar_int8(eng, n, base_rates):
    sem_p, neg = prompt_ids(2000, "semantic"), prompt_ids(40, "semantic", 2)
    s = fixed_len(SEM, n)
    warm(eng.ar, [[sem_p], [sem_p] * 8], s, "semantic")
    warm(eng.ar, [[sem_p]], s, "semantic", cfg=1.5, negatives=[neg])
    warm(eng.ar, [[prompt_ids(500, "abc", 1)]], fixed_len(ABC, 48), "abc")
    with env(YUE2_GEMV="0", YUE2_PDL="0"):
        warm(eng.ar, [[sem_p]], s, "semantic")
        ours_old, _ = ours_rate(eng.ar, [sem_p], s, "semantic")
    record("AR decode int8 batch 1 (W8A16 per output block, rotation by cuBLAS)", ours_old, base_rates.get("base1"),
           "tok/s")
    with env(YUE2_PDL="0", YUE2_INT8_ROT="cublas"):
        warm(eng.ar, [[sem_p]], s, "semantic")
        ours_nopdl, _ = ours_rate(eng.ar, [sem_p], s, "semantic")
    record("AR decode int8 batch 1 (split-K GEMV, rotation by cuBLAS, no PDL)", ours_nopdl, base_rates.get("base1"),
           "tok/s")
    with env(YUE2_INT8_ROT="cublas"):
        warm(eng.ar, [[sem_p]], s, "semantic")
        ours_cub, _ = ours_rate(eng.ar, [sem_p], s, "semantic")
    record("AR decode int8 batch 1 (split-K GEMV, rotation by cuBLAS, PDL)", ours_cub, base_rates.get("base1"),
           "tok/s")
    ours1, t = ours_rate(eng.ar, [sem_p], s, "semantic")
    record("AR decode int8 batch 1", ours1, base_rates.get("base1"), "tok/s",
           f"baseline = bf16 vendor loop; {t.get('execution')}; products={t.get('layer_products')} "
           f"({t.get('int8_products')}), rotation by {t.get('int8_rotation')}, pdl={t.get('pdl')}")
    with env(YUE2_ATTN_MERGE="kernel"):
        warm(eng.ar, [[sem_p]], s, "semantic")
        ours_mk, _ = ours_rate(eng.ar, [sem_p], s, "semantic")
    record("AR decode int8 batch 1, attention merged by a separate kernel", ours_mk, base_rates.get("base1"),
           "tok/s", "YUE2_ATTN_MERGE=kernel")
    variants(eng.ar, "int8", sem_p, neg, s, base_rates.get("base1"))
    torch_tail(eng.ar, "int8", sem_p, neg, s, base_rates.get("base1"))
    oursc, _ = ours_rate(eng.ar, [sem_p], s, "semantic", cfg=1.5, negatives=[neg])
    record("AR decode int8 CFG pair", oursc, base_rates.get("basec"), "tok/s")
    ours8, _ = ours_rate(eng.ar, [sem_p] * 8, s, "semantic")
    record("AR decode int8 8 candidates (total)", ours8 * 8, base_rates.get("base1"), "tok/s",
           "shared-prefix attention")
    with env(YUE2_SHARED_PREFIX="0"):
        warm(eng.ar, [[sem_p] * 8], s, "semantic")
        ours8u, _ = ours_rate(eng.ar, [sem_p] * 8, s, "semantic")
    record("AR decode int8 8 candidates, per-row attention (total)", ours8u * 8, base_rates.get("base1"),
           "tok/s", "YUE2_SHARED_PREFIX=0")
    sa = fixed_len(ABC, min(n, 512))
    oursa, _ = ours_rate(eng.ar, [prompt_ids(500, "abc", 1)], sa, "abc")
    record("AR decode int8 ABC phase", oursa, base_rates.get("base_abc"), "tok/s")
    # the previous products: every int8 code converted to bf16 for a bf16 tensor-core product (YUE2_INT8_DOT=convert)
    # against the default int8 × int8 products on the activations' pair codes, same run
    with env(YUE2_INT8_DOT="convert"):
        warm(eng.ar, [[sem_p], [sem_p] * 8], s, "semantic")
        warm(eng.ar, [[sem_p]], s, "semantic", cfg=1.5, negatives=[neg])
        conv1, _ = ours_rate(eng.ar, [sem_p], s, "semantic")
        convc, _ = ours_rate(eng.ar, [sem_p], s, "semantic", cfg=1.5, negatives=[neg])
        conv8, _ = ours_rate(eng.ar, [sem_p] * 8, s, "semantic")
    note = "YUE2_INT8_DOT=convert (the products before 2026-12-05)"
    record("AR decode int8 batch 1, codes converted to bf16", conv1, base_rates.get("base1"), "tok/s", note)
    record("AR decode int8 CFG pair, codes converted to bf16", convc, base_rates.get("basec"), "tok/s", note)
    record("AR decode int8 8 candidates (total), codes converted to bf16", conv8 * 8, base_rates.get("base1"),
           "tok/s", note)
    return {"b1": ours1, "cfg": oursc, "b8": ours8, "abc": oursa}


class CatRenderer:
    """Vendor-style velocity: torch.cat of the AR K/V and the NAR K/V in every layer and evaluation."""

    def __init__(self, nar, ar_kv, frames):
        from yue2_core.nar import ChunkRenderer
        self.inner = ChunkRenderer(nar, ar_kv, frames)
        self.ar_kv = [(k.clone(), v.clone()) for k, v in ar_kv]
        self.nar, self.frames = nar, frames

    def velocity(self, state, raw_t):
        from yue2_core.layers import sdpa
        r, nar = self.inner, self.nar
        x = nar.vae2llm(torch.nn.functional.pad(state, (0, 0, 1, 1))[None])
        x = x + nar.time_embedder(nar.shifted_t(raw_t).expand(r.length), nar.dtype)[None]
        x = x + r.pos_emb
        b, t, _ = x.shape
        for layer, (ak, av) in zip(nar.model.layers, self.ar_kv):
            q, k, v = layer.self_attn.project(layer.input_layernorm(x), r.cos, r.sin)
            keys, values = torch.cat((ak, k.transpose(1, 2)), 2), torch.cat((av, v.transpose(1, 2)), 2)
            h = sdpa(q.transpose(1, 2), keys, values, causal=False)
            x = x + layer.self_attn.o_proj(h.transpose(1, 2).reshape(b, t, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return nar.llm2vae(nar.model.norm(x))[0, 1:-1]

    @property
    def nar_(self):
        return self.nar


def _timed(fn):
    """(seconds, result, allocator peak above the start in GiB) of fn() on the device."""
    sync()
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if DEVICE == "cuda" else 0
    t = time.perf_counter()
    out = fn()
    sync()
    seconds = time.perf_counter() - t
    peak = (torch.cuda.max_memory_allocated() - before) / 2 ** 30 if DEVICE == "cuda" else 0.0
    return seconds, out, peak


def _midpoint_fp32_state(renderer, noise, steps):
    """The midpoint ODE with an fp32 state (the model's input rounded to its dtype): the bench's reference."""
    from yue2_core.nar import raw_timesteps
    dtype, state, dt = renderer.nar.dtype, noise.to(DEVICE, torch.float32), 1.0 / steps
    for raw, raw_mid in raw_timesteps(steps):
        mid = state - renderer.velocity(state.to(dtype), raw).float() * (dt / 2)
        state = state - renderer.velocity(mid.to(dtype), raw_mid).float() * dt
    return state.cpu()


@section("NAR")
def nar_bench(eng, frames, label, baseline=True, ode=False):
    """32 midpoint steps (graphed velocity, the default) vs the vendor-style velocity, vs the eager velocity
    (YUE2_NAR_GRAPH=0); with `ode`: the opt-in AB2 at 32 and 64 steps and midpoint-32, their time and the relative
    L2 error of the final latents against a 256-step midpoint solution (issue 18 item 3)."""
    from yue2_core.nar import ChunkRenderer, chunk_tokens, solve, song_noise
    prefix = prompt_ids(2000, "semantic")
    codes = torch.randint(0, 32768, (frames,)).tolist()
    noise = song_noise(frames, 1)
    t = time.perf_counter()
    kv = eng.ar.layer_kv(chunk_tokens(prefix, codes, 0, frames))
    eager = ChunkRenderer(eng.nar, kv, frames, graph=False)
    r = ChunkRenderer(eng.nar, kv, frames)
    sync()
    prefill = time.perf_counter() - t
    for warm in (eager, r):  # Triton/cuDNN first use; the graphed renderer's eager warm-up evaluation
        warm.velocity(noise.to(DEVICE, eng.nar.dtype), 20.0)
    sync()
    ours, latents, peak = _timed(lambda: solve(r, noise, 32))  # includes the graph capture (once per chunk)
    eager_s, eager_latents, eager_peak = _timed(lambda: solve(eager, noise, 32))
    base = None
    if baseline:
        cr = CatRenderer(eng.nar, kv, frames)
        cr.nar = eng.nar
        cr.velocity(noise.to(DEVICE, eng.nar.dtype), 20.0)
        sync()
        t = time.perf_counter()
        # same solver, vendor-style velocity
        state, dt = noise.to(DEVICE, eng.nar.dtype), 1 / 32
        from yue2_core.nar import raw_timesteps
        for raw, raw_mid in raw_timesteps(32):
            mid = state - cr.velocity(state, raw) * (dt / 2)
            state = state - cr.velocity(mid, raw_mid) * dt
        state.float().cpu()
        sync()
        base = time.perf_counter() - t
    record(f"NAR {label} {frames} frames, 32 steps (s)", ours, base, "s",
           f"AR prefill {prefill:.2f} s not incl.; velocity in a CUDA graph (graphed={r.graphed})")
    if r.attention != "gqa":  # the automatic choice took FlashAttention-3 (fast/flash_attn.py): its gain, same run
        plain = ChunkRenderer(eng.nar, kv, frames)
        plain.attention = "gqa"  # before its first evaluation (the graph is captured from the second)
        plain.velocity(noise.to(DEVICE, eng.nar.dtype), 20.0)
        sync()
        plain_s, plain_latents, _ = _timed(lambda: solve(plain, noise, 32))
        plain.close()
        rel = ((latents - plain_latents).norm() / plain_latents.norm()).item()
        record(f"NAR {label} {frames} frames, 32 steps, attention {r.attention} vs PyTorch's choice (s)", ours,
               plain_s, "s", f"latents rel. L2 difference {rel:.1e} (bf16 rounding of another kernel)")
    same = torch.equal(latents, eager_latents)
    record(f"NAR {label} {frames} frames, 32 steps, CUDA graph vs eager velocity (s)", ours, eager_s, "s",
           f"latents bit-equal: {same} (max |Δ| {(latents - eager_latents).abs().max().item():.1e}); allocator "
           f"peak above the weights and K/V: graph {peak:.2f} GiB (capture incl.), eager {eager_peak:.2f} GiB")
    if ode:
        # the reference keeps its state in fp32: a bf16 state rounds away much of a 256-step increment v·dt (the
        # tiny model on a CPU: bf16 midpoint-256 and -32 differ by 0.26 relative, fp32 ones by 1e-6)
        ref_s, ref, _ = _timed(lambda: _midpoint_fp32_state(r, noise, 256))

        def err(x):
            return ((x - ref).norm() / ref.norm()).item()
        e_mid = err(latents)
        record("NAR ODE error, midpoint 32 steps (64 evaluations) vs midpoint-256 fp32 state (rel. L2)", e_mid,
               None, "",
               f"{frames} frames; midpoint state bf16 (the release's), AB2 and the reference fp32; the "
               f"reference took {ref_s:.1f} s")
        for steps in (32, 64):
            ab2_s, x, _ = _timed(lambda: solve(r, noise, steps, method="ab2"))
            e = err(x)
            record(f"NAR ODE error, AB2 {steps} steps ({steps} evaluations) vs midpoint-256 fp32 state (rel. L2)", e,
                   None, "",
                   f"midpoint-32: {e_mid:.2e}")
            record(f"NAR {label} {frames} frames, AB2 {steps} steps (s)", ab2_s, ours, "s",
                   f"baseline: midpoint 32 steps (graphed); rel. L2 vs midpoint-256 {e:.2e} (midpoint-32 "
                   f"{e_mid:.2e}); opt-in (--ode-method ab2)")
    r.close()
    return ours + prefill


@section("VAE")
def vae_bench(eng, frames):
    """Baseline: unfused snake, biases added by PyTorch, 1024-frame tiles. Ours: fused snake with the biases and
    residual adds folded in (the default), the same unfolded, cudnn.benchmark on, 2048-frame tiles. Every output is
    compared with the baseline's and then dropped (the pinned output buffer is reused)."""
    from yue2_core.pipeline import decode, vae_core_frames
    from yue2_core.vae import SnakeBeta, VAEDecoder
    lat = torch.randn(frames, 64) * 0.5
    default_core = vae_core_frames(eng.vae.device)
    configs = {"baseline": (False, False, False, 1024), "unfolded": (None, False, False, 1024),
               "default": (None, None, False, default_core), "folded 1024": (None, None, False, 1024),
               "cudnn.benchmark": (None, None, True, default_core), "2048 tiles": (None, None, False, 2048)}
    times, ref = {}, None
    try:
        for name, (fused, fold, bench, core) in configs.items():
            SnakeBeta.fused, VAEDecoder.fold_bias, VAEDecoder.cudnn_benchmark = fused, fold, bench
            first = _timed(lambda: decode(eng.vae, lat, core=core))[0]  # warm-up at the measured tile shapes
            seconds, out, peak = _timed(lambda: decode(eng.vae, lat, core=core))
            if ref is None:
                ref = out
            times[name] = (seconds, (out - ref).abs().max().item(), peak, first)
            del out
    finally:
        SnakeBeta.fused, VAEDecoder.fold_bias, VAEDecoder.cudnn_benchmark = None, None, False
    base = times["baseline"]

    def note(name):
        s, d, p, first = times[name]
        return f"max |Δaudio| vs baseline {d:.1e}; VAE activations peak {p:.2f} GiB; first call {first:.2f} s"
    for core in sorted({1024, default_core}):
        name = "default" if core == default_core else "folded 1024"
        record(f"VAE fp32 tiled {frames} frames, {core}-frame tiles (s)", times[name][0], base[0], "s",
               f"ours: fused Triton snake with the conv biases and residual adds folded in, tile copies overlapped"
               f"{' (default tile on this GPU)' if core == default_core else ''}; baseline: unfused, biases added "
               f"by PyTorch, 1024-frame tiles; " + note(name))
    record(f"VAE fp32 tiled {frames} frames, biases folded vs not (s)", times["folded 1024"][0],
           times["unfolded"][0], "s", "1024-frame tiles, fused snake both; " + note("folded 1024") +
           f"; unfolded: {note('unfolded')}")
    record(f"VAE fp32 tiled {frames} frames, cudnn.benchmark on vs off (s)", times["cudnn.benchmark"][0],
           times["default"][0], "s", "opt-in (VAEDecoder.cudnn_benchmark; TF32 stays off); first call = the "
           "algorithm search; " + note("cudnn.benchmark"))
    record(f"VAE fp32 tiled {frames} frames, 2048- vs {default_core}-frame tiles (s)", times["2048 tiles"][0],
           times["default"][0], "s", note("2048 tiles"))
    return times["default"][0]


@section("whole song int8")
def whole_song(path, abc_n, sem_n):
    from yue2_core.pipeline import Budgets, YuE2Engine
    from yue2_core.protocol import SongRequest
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    nvml_peak = [0]
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        base_used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    except Exception:
        handle = None
    t0 = time.perf_counter()
    eng = YuE2Engine.load(path, device=DEVICE)
    sync()
    load_s = time.perf_counter() - t0
    b = Budgets(abc=fixed_len(ABC, abc_n), semantic=fixed_len(SEM, sem_n))

    def progress(stage, done, total, info):
        if handle is not None:
            nvml_peak[0] = max(nvml_peak[0], pynvml.nvmlDeviceGetMemoryInfo(handle).used - base_used)
    t = time.perf_counter()
    song = eng.generate(SongRequest("synthetic benchmark", "[Verse]\nla la", cot="full", seed=1), b,
                        progress=progress)
    sync()
    wall = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if DEVICE == "cuda" else None
    phases = [f"{name}: prefill {ph.get('prefill_seconds', 0):.2f} s, graph capture "
              f"{ph.get('graph_capture_seconds', 0):.2f} s, steady {ph.get('decode_tokens_per_second', 0):.0f} tok/s, "
              f"phase {ph.get('seconds', 0):.2f} s"
              for name, ph in (("ABC", song.score.timing), ("music", song.tokens.timing)) if ph]
    record("whole song int8 cot full (s)", wall, None, "s",
           f"ABC {abc_n} + music {sem_n} tokens; load {load_s:.1f} s not incl.; stages "
           + ", ".join(f"{k} {v:.2f}" for k, v in song.timing.items()) + "".join(f"; {p}" for p in phases))
    record("peak VRAM whole song int8 (GiB, allocator)", peak, None, "GiB")
    if handle is not None:
        record("peak VRAM whole song int8 (GiB, NVML)", nvml_peak[0] / 2 ** 30, None, "GiB", "sampled per progress")
    # the next attention bucket's graph captured on a worker thread while the current one replays (fast/side_capture)
    # vs every capture in the main thread (YUE2_SIDE_CAPTURE=0): two more warm songs, off then on
    again = {}
    for side in ("0", "1"):
        old_env = os.environ.get("YUE2_SIDE_CAPTURE")
        os.environ["YUE2_SIDE_CAPTURE"] = side
        try:
            t = time.perf_counter()
            got = eng.generate(SongRequest("synthetic benchmark", "[Verse]\nla la", cot="full", seed=1), b)
            sync()
            again[side] = (time.perf_counter() - t, got)
        finally:
            if old_env is None:
                os.environ.pop("YUE2_SIDE_CAPTURE", None)
            else:
                os.environ["YUE2_SIDE_CAPTURE"] = old_env

    def captures(got):
        parts = []
        for name, ph in (("ABC", got.score.timing), ("music", got.tokens.timing)):
            if ph:
                why = ph.get("side_capture_fallback_reason")
                parts.append(f"{name} capture on the path {ph.get('graph_capture_seconds', 0):.3f} s, "
                             f"{ph.get('side_captures', 0)} side captures ({ph.get('side_capture_seconds', 0):.3f} "
                             f"s on the worker){', fallback: ' + why if why else ''}, phase "
                             f"{ph.get('seconds', 0):.3f} s (prefill {ph.get('prefill_seconds', 0):.3f} s, steady "
                             f"{ph.get('decode_tokens_per_second', 0):.1f} tok/s over {ph.get('decoded_steps', 0)} "
                             "steps)")
        stages = ", ".join(f"{k} {v:.3f}" for k, v in got.timing.items())
        return "; ".join(parts) + f"; stages {stages}"
    record("whole song int8, next bucket's graph captured beside the replays vs in the main thread (s)",
           again["1"][0], again["0"][0], "s", f"same process, warm; side: {captures(again['1'][1])}; main thread: "
           f"{captures(again['0'][1])}")
    del eng
    torch.cuda.empty_cache()
    return wall


def _triton_version() -> str | None:
    try:
        import triton
        return triton.__version__
    except Exception:  # not installed or broken: the fast path then runs without Triton kernels
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/yue2bench")
    ap.add_argument("--json", default="bench.json")
    ap.add_argument("--tokens", type=int, default=512, help="decode tokens per AR measurement")
    ap.add_argument("--frames", type=int, default=5371, help="song length for NAR/VAE (3.6 min = 5371)")
    ap.add_argument("--abc-tokens", type=int, default=1500)
    ap.add_argument("--compile", action="store_true", help="also measure torch.compile'd decode layers")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: bf16,int8,nar,vae,song")
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny profile on the CPU (checks the script only)")
    ap.add_argument("--gemv-table", default="",
                    help="also measure batch 1 / CFG with these GEMV configurations (bench/gemv_sweep.py --json)")
    args = ap.parse_args()
    global DEVICE, PROFILE, ARGS
    ARGS = args
    if args.dry_run_cpu:
        DEVICE, PROFILE = "cpu", "tiny"
        torch.cuda.empty_cache = lambda: None
    skip = set(filter(None, args.skip.split(",")))
    props = torch.cuda.get_device_properties(0) if DEVICE == "cuda" else None
    RESULTS["machine"].update({"gpu": props.name if props else "cpu",
                               "memory_gib": round(props.total_memory / 2 ** 30, 1) if props else None,
                               "torch": torch.__version__, "triton": _triton_version(),
                               "date": time.strftime("%Y-%m-%d"), "commit": os.environ.get("YUE2_COMMIT", "")})
    log(json.dumps(RESULTS["machine"]))
    paths = make_checkpoints(args.workdir)
    rates, nar_s, vae_s = {}, None, None
    if "bf16" not in skip or "nar" not in skip or "vae" not in skip:
        eng = load(paths["bf16"])
        if "bf16" not in skip:
            rates = ar_bf16(eng, args.tokens, args.compile) or {}
        if "nar" not in skip:
            nar_s = nar_bench(eng, args.frames, "bf16", ode=True)
        if "vae" not in skip:
            vae_s = vae_bench(eng, args.frames)
        del eng
        torch.cuda.empty_cache()
    if "int8" not in skip:
        eng8 = load(paths["int8"], parts=("ar", "nar"))
        ar_int8(eng8, args.tokens, rates)
        if "nar" not in skip:
            from yue2_core.nar import keeps_w8a8
            nar_bench(eng8, args.frames, "int8 file (W8A8 products, the default on Hopper)" if keeps_w8a8(eng8.nar)
                      else "int8 file (bf16 GEMMs after dequantizing once)", baseline=False)
        del eng8
        torch.cuda.empty_cache()
    if "song" not in skip:
        wall = whole_song(paths["int8"], args.abc_tokens, args.frames)
        if wall and rates.get("base1") and nar_s and vae_s:
            m = RESULTS["metrics"]
            base_nar = m.get(f"NAR bf16 {args.frames} frames, 32 steps (s)", {}).get("baseline") or nar_s
            base_song = args.abc_tokens / rates["base_abc"] + args.frames / rates["base1"] + base_nar + vae_s
            record("whole song: ours int8 vs vendor-style bf16 (s)", wall, base_song, "s",
                   "baseline derived from its measured per-token rates, NAR and VAE times")
    if rates.get("b1") and nar_s and vae_s:
        for n, key in ((1, "b1"), (4, "b4"), (8, "b8")):
            ar_s = args.frames / rates[key] + args.abc_tokens / rates["abc"]
            per_min = 60 * n / (ar_s + n * (nar_s + vae_s))
            record(f"candidates per minute, N={n} (3.6-min songs, bf16)", per_min, None, "songs/min")
    with open(args.json, "w") as f:
        json.dump(RESULTS, f, indent=2)
    log("\n| metric | ours | vendor-style baseline | ratio |\n|---|---|---|---|")
    for name, m in RESULTS["metrics"].items():
        o, b, u = m["ours"], m["baseline"], m["unit"]
        ratio = "" if not (o and b) else (f"{o / b:.2f}×" if u.endswith("/s") else f"{b / o:.2f}×")
        log(f"| {name} | {_fmt(o)} {u} | {_fmt(b) if b else '-'} | {ratio} |")
    if RESULTS["errors"]:
        log("errors: " + json.dumps(RESULTS["errors"], indent=1))


if __name__ == "__main__":
    main()
