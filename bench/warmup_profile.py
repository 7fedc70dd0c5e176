"""Where the in-process warm-up's time goes when Triton's cache already holds its kernels (the kept-cache start of
issue #18: the first song waited ≈ 0.8 s for it on an H100, stop 53/54).

    python bench/warmup_profile.py [--path FILE] [--top 25]

Process 1 (a child) fills an empty TRITON_CACHE_DIR (`warmup.warm_up`, children compiling); process 2, fresh, runs
`warmup.run_plan` alone in its main thread (as a kept-cache start's warm-up thread does, without the loader beside
it) under cProfile, one profile per stage (build = the shadow model and the process's first CUDA work), and prints
each stage's seconds and its top functions by cumulative and by own time."""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _plan(path):
    from yue2_core import warmup
    from yue2_core.weights.checkpoint import inspect_checkpoint
    return warmup.Plan.from_info(inspect_checkpoint(path))


def fill(path):
    from yue2_core import warmup
    report = warmup.warm_up(_plan(path), "cuda")
    print("fill:", {k: report.get(k) for k in ("seconds", "stages", "marker", "marker_written")}, flush=True)


def profile(path, top):
    t0 = time.perf_counter()
    import torch
    from yue2_core import warmup
    print(f"imports {time.perf_counter() - t0:.2f} s", flush=True)
    plan = _plan(path)
    profs, current = {}, {}

    def start(name):
        p = cProfile.Profile()
        profs[name] = p
        current["p"] = p
        p.enable()

    def stop(name):
        current["p"].disable()
    real_shadow = warmup.plan_shadow

    def shadow(plan, device):
        start("build")
        try:
            return real_shadow(plan, device)
        finally:
            torch.cuda.synchronize()
            stop("build")
    warmup.plan_shadow = shadow
    t = time.perf_counter()
    report = warmup.run_plan(plan, "cuda", before_stage=start, after_stage=stop)
    print(f"run_plan {time.perf_counter() - t:.2f} s; stages {report['stages']}", flush=True)
    for name, p in profs.items():
        for key in ("cumulative", "tottime"):
            out = io.StringIO()
            pstats.Stats(p, stream=out).sort_stats(key).print_stats(top)
            lines = [l for l in out.getvalue().splitlines() if l.strip()]
            print(f"\n== {name}: by {key} ==")
            print("\n".join(lines[2:top + 8]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/tmp/yue2bench/yue2_full_int8.safetensors")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--role", default="")
    a = ap.parse_args()
    if a.role == "fill":
        return fill(a.path)
    if a.role == "profile":
        return profile(a.path, a.top)
    if not os.path.exists(a.path):
        from yue2_core.weights.synthetic import write_synthetic_checkpoint
        os.makedirs(os.path.dirname(a.path), exist_ok=True)
        write_synthetic_checkpoint(a.path, profile="full", fmt="int8", seed=0, device="cuda")
    env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="yue2-wprof-"))
    for role in ("fill", "profile"):
        subprocess.run([sys.executable, __file__, "--role", role, "--path", a.path, "--top", str(a.top)], env=env,
                       check=True, timeout=300)


if __name__ == "__main__":
    main()
