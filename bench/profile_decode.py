"""Where a decode step's time goes (CUDA): graph replay time per token vs the sum of its kernels' GPU time, the
kernel count, and the kernels ranked by GPU time — for each decode configuration given.

    python bench/profile_decode.py --checkpoint /tmp/yue2bench/yue2_full_bf16.safetensors [--rows 1] [--top 15]

The checkpoint is any YuE2 all-in-one file (bench/bench.py writes full-size synthetic ones to /tmp/yue2bench).
Configurations: the default fused step, the attention merged by a separate kernel, int8 inputs rotated by cuBLAS,
the default without programmatic dependent launch, library GEMVs; with --gemv-table a GEMV configuration file too,
with --all also the unfused torch-ops step.
Kernel times come from torch.profiler on eager steps (same kernels as the graph); the gap between the replay time
and the kernel sum is launch/idle time that only fewer or longer kernels remove.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from yue2_core.fast import decode as fd  # noqa: E402
from yue2_core.protocol import Sampling  # noqa: E402


def _dev_time(evt) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(evt, name):
            return float(getattr(evt, name))
    return 0.0


SWITCHES = ("YUE2_DECODE_ATTN", "YUE2_GEMV", "YUE2_PDL", "YUE2_INT8_ROT", "YUE2_ATTN_MERGE",
            "YUE2_GEMV_TABLE", "YUE2_SAMPLER")


def profile(ar, rows: int, prompt: int, label: str, top: int, fused: bool, env: dict):
    for key in SWITCHES:
        os.environ.pop(key, None)
    os.environ.update(env)
    s = Sampling(min_tokens=256, max_tokens=256)
    ids = [151643] + [1000 + i % 5000 for i in range(prompt - 2)] + [151851]
    dec = fd.PhaseDecoder(ar, [ids] * rows, s, list(range(1, rows + 1)), "semantic", fused=fused)
    with torch.inference_mode():
        dec._allocate()
        dec._prefill()
        attn_len = min(dec.capacity, -(-(prompt + 64) // fd.BUCKET) * fd.BUCKET)
        graph = dec._graph(attn_len)
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
        n = 100
        t = time.perf_counter()
        for _ in range(n):
            graph.replay()
        torch.cuda.synchronize()
        replay_ms = (time.perf_counter() - t) / n * 1e3
        steps = 10
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                dec._step(attn_len)
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_ms = sum(e.device_time if hasattr(e, "device_time") else e.cuda_time for e in kernels) / 1e3 / steps
    print(f"\n== {label}: rows={rows}, prompt {prompt}, attention length bucket {attn_len}")
    print(f"   graph replay {replay_ms:.3f} ms/step ({rows * 1e3 / replay_ms:.0f} tok/s total); kernels "
          f"{len(kernels) / steps:.0f} per step, GPU-busy {busy_ms:.3f} ms/step; idle/launch "
          f"{max(0.0, replay_ms - busy_ms):.3f} ms/step")
    avgs = sorted(prof.key_averages(), key=_dev_time, reverse=True)[:top]
    print(f"   {'kernel':70s} {'calls/step':>10s} {'ms/step':>8s}")
    for e in avgs:
        print(f"   {e.key[:70]:70s} {e.count / steps:10.1f} {_dev_time(e) / 1e3 / steps:8.3f}")
    dec.release()
    return replay_ms, busy_ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="/tmp/yue2bench/yue2_full_bf16.safetensors")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=2000, help="prompt tokens (sets the attention length)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--all", action="store_true", help="also profile the unfused torch-ops step")
    ap.add_argument("--gemv-table", default="", help="also profile with these GEMV configurations (YUE2_GEMV_TABLE)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("profile_decode.py needs a CUDA GPU")
    from yue2_core.pipeline import YuE2Engine
    eng = YuE2Engine.load(args.checkpoint, device="cuda", parts=("ar",))
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · {os.path.basename(args.checkpoint)}")
    variants = [
        ("default: fused + split attention + split-K GEMV + PDL (int8: inputs rotated by the producers) + sampling "
         "tail in kernels", True, {}),
        ("default with the PyTorch sampling tail (previous default)", True, {"YUE2_SAMPLER": "torch"}),
        ("attention splits merged by a separate kernel", True, {"YUE2_ATTN_MERGE": "kernel"}),
        ("int8 inputs rotated by cuBLAS", True, {"YUE2_INT8_ROT": "cublas"}),
        ("default without PDL", True, {"YUE2_PDL": "0"}),
        ("fused + split attention, library GEMV", True, {"YUE2_GEMV": "0", "YUE2_PDL": "0"})]
    if args.gemv_table:
        variants.append((f"GEMV table {os.path.basename(args.gemv_table)}", True, {"YUE2_GEMV_TABLE": args.gemv_table}))
    if args.all:
        variants.append(("torch ops", False, {"YUE2_DECODE_ATTN": "torch", "YUE2_GEMV": "0", "YUE2_PDL": "0"}))
    for label, fused, env in variants:
        profile(eng.ar, args.rows, args.prompt, label, args.top, fused, env)
    for key in SWITCHES:
        os.environ.pop(key, None)

if __name__ == "__main__":
    main()
