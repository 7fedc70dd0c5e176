"""Where the render stages' time goes on one NVIDIA GPU (torch.profiler, kernels by name): one NAR velocity
evaluation at the song's shapes and one tiled fp32 VAE decode, on the full-size synthetic bf16 checkpoint that
bench/bench.py writes (random weights of the real shapes).

    python bench/profile_render.py [--frames 5371] [--prefix 2000] [--top 15]

The velocity is replayed from its CUDA graph (the default on CUDA); YUE2_NAR_GRAPH=0 profiles the eager launches.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def table(fn, label: str, top: int) -> None:
    from torch.profiler import ProfilerActivity, profile
    fn()
    fn()  # a graphed NAR velocity: the first call runs eagerly, the second captures; then replays are measured
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = sorted(((e.key, e.count, e.device_time_total / 1e3) for e in prof.key_averages()
                   if e.device_time_total > 0), key=lambda r: -r[2])
    busy = sum(r[2] for r in rows)
    print(f"== {label}: wall {wall * 1e3:.1f} ms, kernels busy {busy:.1f} ms", flush=True)
    print(f"   {'kernel':80s} {'calls':>6s} {'ms':>8s}")
    for name, count, ms in rows[:top]:
        print(f"   {name[:80]:80s} {count:6d} {ms:8.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=5371)
    ap.add_argument("--prefix", type=int, default=2000)
    ap.add_argument("--workdir", default="/tmp/yue2bench")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    from yue2_core.nar import ChunkRenderer, chunk_tokens, song_noise
    from yue2_core.pipeline import YuE2Engine, decode
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    path = os.path.join(args.workdir, "yue2_full_bf16.safetensors")
    if not os.path.exists(path):
        os.makedirs(args.workdir, exist_ok=True)
        write_synthetic_checkpoint(path, profile="full", fmt="bf16", seed=0, device="cuda")
    eng = YuE2Engine.load(path, device="cuda")
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__}", flush=True)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(100, 150000, (args.prefix,), generator=gen).tolist()
    codes = torch.randint(0, 32768, (args.frames,), generator=gen).tolist()
    r = ChunkRenderer(eng.nar, eng.ar.layer_kv(chunk_tokens(prefix, codes, 0, args.frames)), args.frames)
    state = song_noise(args.frames, 1).to("cuda", eng.nar.dtype)
    table(lambda: r.velocity(state, 0.3), f"NAR velocity, {args.frames} frames (fused={r.fused}, attention "
          f"{r.attention}, CUDA graph={r.graphed})", args.top)
    lat = torch.randn(args.frames, 64, generator=gen) * 0.5
    table(lambda: decode(eng.vae, lat), f"VAE decode fp32, {args.frames} frames", args.top)


if __name__ == "__main__":
    main()
