"""Which SDPA backend for the NAR's unmasked attention (`layers.unmasked_attention`, switch YUE2_NAR_ATTN), on one
NVIDIA GPU:

    python bench/nar_attention.py [--frames 5371] [--prefix 2000] [--json nar_attention.json]

1. The attention alone at the song's shapes (queries = frames + 2 NAR slots, 16 heads of 128; keys = prefix + codes
   + MUSIC_END + the NAR slots, 8 kv heads): PyTorch's GQA call and each backend with the query heads folded onto
   their kv head — ms, TFLOP/s (4·T·S·D·heads flops), the kernel that ran, max |Δ| vs an fp32 reference on the
   first 256 query rows of every head.
2. The whole NAR solve (32 midpoint steps) on a full-size synthetic bf16 checkpoint (random weights of the real
   shapes, written to --workdir like bench/bench.py) per backend, and the velocity's max |Δ| vs the GQA call.
3. Where one velocity evaluation's time goes (torch.profiler, kernels grouped), GQA call vs cuDNN.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from yue2_core import layers  # noqa: E402
from yue2_core.layers import UNMASKED_BACKENDS, unmasked_attention  # noqa: E402

BACKENDS = [b for b in UNMASKED_BACKENDS if b != "math"]  # math: an fp32 score matrix of 4.4 GB, minutes


def log(*a):
    print(*a, flush=True)


def timed(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps / 1e3


def kernels_of(fn, top: int = 3) -> list[tuple[str, float]]:
    """(kernel name, ms) of one call of fn, longest first."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = sorted(((e.key, e.device_time_total / 1e3) for e in prof.key_averages() if e.device_time_total > 0),
                  key=lambda r: -r[1])
    return rows[:top]


def attention_alone(t: int, s: int, reps: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(t, 16, 128, device="cuda", generator=gen, dtype=torch.bfloat16).transpose(0, 1)[None]
    k = torch.randn(1, 8, s, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    v = torch.randn(1, 8, s, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    rows = 256
    ref = torch.softmax(q[:, :, :rows].float() @ k.float().repeat_interleave(2, 1).transpose(-1, -2)
                        / math.sqrt(128), -1) @ v.float().repeat_interleave(2, 1)
    flops = 4 * t * s * 128 * 16
    out = {}
    log(f"== attention alone: q [1, 16, {t}, 128] (a transposed view, as the NAR passes it), k/v [1, 8, {s}, 128] "
        "bf16")
    for b in BACKENDS:
        try:
            y = unmasked_attention(q, k, v, b)
            err = (y[:, :, :rows].float() - ref).abs().max().item()
            sec = timed(lambda: unmasked_attention(q, k, v, b), reps)
            kern = kernels_of(lambda: unmasked_attention(q, k, v, b), 1)
        except Exception as exc:  # report and go on with the others
            log(f"  {b:10s} failed: {type(exc).__name__}: {str(exc)[:200]}")
            out[b] = {"error": str(exc)[:300]}
            continue
        fell = (b, str(q.device), q.dtype, 128) in layers._BACKEND_FAILED
        out[b] = {"ms": sec * 1e3, "tflops": flops / sec / 1e12, "max_abs_err": err,
                  "kernel": ("FELL BACK to gqa: " if fell else "") + (kern[0][0] if kern else "")}
        log(f"  {b:10s} {sec * 1e3:7.3f} ms  {flops / sec / 1e12:6.0f} TFLOP/s  max|Δ| {err:.2e}  "
            f"{out[b]['kernel'][:90]}")
    return out


def nar_solve(workdir: str, frames: int, prefix_len: int, backends: list[str]) -> dict:
    from yue2_core.nar import ChunkRenderer, chunk_tokens, solve, song_noise
    from yue2_core.pipeline import YuE2Engine
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    path = os.path.join(workdir, "yue2_full_bf16.safetensors")  # the same file bench/bench.py writes
    if not os.path.exists(path):
        os.makedirs(workdir, exist_ok=True)
        t = time.perf_counter()
        write_synthetic_checkpoint(path, profile="full", fmt="bf16", seed=0, device="cuda")
        log(f"  wrote {path} ({time.perf_counter() - t:.1f} s)")
    eng = YuE2Engine.load(path, device="cuda", parts=("ar", "nar"))
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(100, 150000, (prefix_len,), generator=gen).tolist()
    codes = torch.randint(0, 32768, (frames,), generator=gen).tolist()
    noise = song_noise(frames, 1)
    kv = eng.ar.layer_kv(chunk_tokens(prefix, codes, 0, frames))
    state = noise.to("cuda", eng.nar.dtype)
    out, first = {}, None
    log(f"== NAR solve, {frames} frames, 32 midpoint steps, AR part {kv[0][0].shape[2]} positions (full-size bf16)")
    for b in backends:
        os.environ["YUE2_NAR_ATTN"] = b
        r = ChunkRenderer(eng.nar, kv, frames)
        vel = r.velocity(state, 0.3).float()
        torch.cuda.synchronize()
        t = time.perf_counter()
        solve(r, noise, 32)
        torch.cuda.synchronize()
        sec = time.perf_counter() - t
        first = vel if first is None else first
        d = (vel - first).abs().max().item()
        rel = d / first.abs().max().item()
        fell = any(key[0] == b for key in layers._BACKEND_FAILED)
        out[b] = {"solve_s": sec, "velocity_max_abs_diff_vs_first": d, "relative": rel, "fell_back": fell}
        log(f"  {b:10s} solve {sec:6.3f} s   velocity max|Δ| vs {backends[0]} {d:.3e} (rel. to max |v| {rel:.1e})"
            + ("  FELL BACK to gqa" if fell else ""))
        if b in ("gqa", "cudnn"):
            groups: dict = defaultdict(float)
            for name, ms in kernels_of(lambda: r.velocity(state, 0.3), 60):
                low = name.lower()
                kind = ("attention" if any(w in low for w in ("flash", "fmha", "attention", "sdpa", "cudnn"))
                        else "GEMM" if any(w in low for w in ("gemm", "nvjet", "cutlass", "sm90_xmma"))
                        else "fused Triton" if low.endswith("_kernel") and "at::" not in low else "other")
                groups[kind] += ms
            out[b]["velocity_ms_by_kind"] = dict(groups)
            log("    one velocity evaluation: " + ", ".join(f"{k} {v:.1f} ms" for k, v in
                                                             sorted(groups.items(), key=lambda kv_: -kv_[1])))
    os.environ.pop("YUE2_NAR_ATTN", None)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=5371)
    ap.add_argument("--prefix", type=int, default=2000)
    ap.add_argument("--workdir", default="/tmp/yue2bench")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="nar_attention.json")
    ap.add_argument("--skip-solve", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/nar_attention.py needs a CUDA GPU")
    log(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · cuDNN {torch.backends.cudnn.version()}")
    t = args.frames + 2
    s = args.prefix + args.frames + 1 + t
    res = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "commit": os.environ.get("YUE2_COMMIT", "")},
           "attention": attention_alone(t, s, args.reps)}
    if not args.skip_solve:
        res["solve"] = nar_solve(args.workdir, args.frames, args.prefix, ["gqa"] + [b for b in BACKENDS
                                                                                   if b != "gqa"])
    with open(args.json, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
