"""Why a render through the nodes can be slower than through the engine (GPU, in-process; not collected by pytest):

    PYTHONPATH=tests/nodes/gpu_stubs python3 tests/nodes/gpu_render_profile.py --comfy .comfyhost/comfyui

Composes 20 s of music on a full-size synthetic int8 checkpoint, then times the same render (32 steps) through the
YuE2 Renderer node (ComfyUI model management) and through the engine alone, and prints torch.profiler's top ops
for the node's render.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_nodes_check as g  # noqa: E402


def timed(label, fn):
    import torch
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    print(f"{label}: {time.perf_counter() - t:.2f} s", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfy", required=True)
    ap.add_argument("--seconds", type=float, default=20.0)
    a = ap.parse_args()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "yue2_gpu_check"
    pack = g.setup_comfy(Path(a.comfy).resolve(), work, None)
    import torch
    from yue2_core.pipeline import YuE2Engine, render
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    name = "full_int8.safetensors"
    path = work / "ckpt" / name
    if not path.exists():
        write_synthetic_checkpoint(str(path), "full", "int8", device="cuda")
    n = {c.__name__: c for c in pack.NODE_LIST}
    model = n["YuE2CheckpointLoader"].execute(name).args[0]
    _, tokens, _, _ = n["YuE2Composer"].execute(model, "pop", "[verse]\nla la", "full", 7, a.seconds,
                                                max_abc_tokens=64).args
    print(f"{len(tokens.codes)} frames, prefix {len(tokens.prefix)}")
    import cProfile
    import pstats
    prof0 = cProfile.Profile()
    prof0.enable()
    timed("node render #1 (cProfile)", lambda: n["YuE2Renderer"].execute(model, tokens, 32, 1))
    prof0.disable()
    pstats.Stats(prof0).sort_stats("cumulative").print_stats(35)
    timed("node render #2", lambda: n["YuE2Renderer"].execute(model, tokens, 32, 1))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        timed("node render (profiled)", lambda: n["YuE2Renderer"].execute(model, tokens, 32, 1))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60))
    eng = YuE2Engine.load(str(path), device="cuda", parts=("ar", "nar"))
    for i in range(2):
        timed(f"engine render #{i + 1}", lambda: render(eng.ar, eng.nar, tokens, 32, 1))
    ar, nar = model.load(("ar", "nar"), 0)
    print("node NAR module types:", sorted({type(m).__name__ for m in nar.modules()})[:20])
    print("engine NAR module types:", sorted({type(m).__name__ for m in eng.nar.modules()})[:20])
    print("node AR/NAR dtype+device:", ar.dtype, ar.device, nar.dtype, nar.device,
          "| engine:", eng.ar.dtype, eng.nar.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
