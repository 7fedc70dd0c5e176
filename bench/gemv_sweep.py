"""Sweep of the decode GEMV (`yue2_core.fast.gemv`) against cuBLAS (bf16) and the W8A16 kernel of `int8_kernels`
(int8, rotation by cuBLAS + one program per output block) on the AR expert's four layer shapes and the codec head.

Each measurement captures 28 calls — one per layer, each with its own weights, so they stream from HBM as in a real
step — in one CUDA graph and replays it; µs per call and the achieved weight bandwidth (TB/s) are printed. Split-K
configurations are timed without their reduction (the decode step sums the partials in the consumer kernel) and
the stand-alone reduction is timed apart.

    python bench/gemv_sweep.py [--json out.json] [--quick]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from yue2_core.fast import gemv as G  # noqa: E402
from yue2_core.fast import int8_kernels  # noqa: E402
from yue2_core.quant import quantize, rotate  # noqa: E402

SHAPES = {"qkv": (4096, 2048), "o": (2048, 2048), "gate_up": (12288, 2048), "down": (2048, 6144),
          "head_codec": (32769, 2048)}


def timed(fn, calls: int, reps: int = 20) -> float:
    """µs per call of `fn(i)` for i in range(calls), captured as one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(calls):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000 / (reps * calls)


def configs(quick: bool):
    out = []
    for bn, bk, st in itertools.product((16, 32, 64), (256, 512), (3, 4)):
        if bn * bk * st * 2 > 200_000:  # bf16 tiles that do not fit the shared memory
            continue
        for w in ((4,) if bn <= 32 else (4, 8)):
            out.append(G.Config(bn=bn, bk=bk, warps=w, stages=st))
    return out[::3] if quick else out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=360)
    a = ap.parse_args()
    t_start = time.perf_counter()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "· torch", torch.__version__)
    for n, k in ((4096, 2048), (2048, 6144)):
        w = torch.randn(n, k, device=dev) * 0.02
        q, s = quantize(w)
        for m in (1, 3):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            for cfg in (G.Config(split=1), G.Config(split=4, bn=64, bk=512)):
                yb = G.gemv(x, w.bfloat16(), cfg=cfg).float()
                rb = x.float() @ w.bfloat16().float().T
                yq = G.gemv(G.rotate(x), q, s.view(-1), cfg=cfg).float()
                rq = (rotate(x.float()).bfloat16().float() @ q.float().T) * s.view(1, -1)
                eb = ((yb - rb).norm() / rb.norm()).item()
                eq = ((yq - rq).norm() / rq.norm()).item()
                print(f"check n={n} k={k} m={m} split={cfg.split}: rel err bf16 {eb:.1e} int8 {eq:.1e}")
                assert eb < 1e-2 and eq < 1e-2
    rows = []
    top: dict = {}
    cfgs = configs(a.quick)
    for name, (n, k) in SHAPES.items():
        sets = 4 if name.startswith("head") else 28
        wb = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(sets)]
        wq = [torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8) for _ in range(sets)]
        sc = [torch.rand(n, device=dev) * 1e-3 for _ in range(sets)]
        for m in (1, 2, 8):
            if time.perf_counter() - t_start > a.budget_s:
                print("budget reached; stopping")
                break
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            gb_bf16, gb_int8 = n * k * 2 / 1e9, n * k / 1e9
            base_b = timed(lambda i: F.linear(x, wb[i]), sets)
            base_q = timed(lambda i: int8_kernels.convrot_linear(x, wq[i], sc[i], None, 256, force="triton"), sets)
            rec = {"shape": name, "n": n, "k": k, "m": m, "cublas_bf16_us": base_b, "w8a16_old_us": base_q}
            rec["rotate_cublas_us"] = timed(lambda i: rotate(x, 256), sets)
            rec["rotate_triton_us"] = timed(lambda i: G.rotate(x), sets)
            results = {}
            xr = G.rotate(x)
            for variant, ws in {"bf16": wb, "int8": wq}.items():
                best = []
                cand = cfgs if m == 1 else top.get((name, variant), cfgs)
                for c in cand:
                    for split in (1, 2, 4, 8, 16):
                        if k % (split * c.bk) or (name.startswith("head") and (split > 1 or c.bn < 32 or c.warps > 4)):
                            continue
                        cfg = G.Config(bn=c.bn, bk=c.bk, split=split, warps=c.warps, stages=c.stages)
                        scale = sc if ws is wq else [None] * sets
                        try:
                            xx = xr if ws is wq else x
                            us = timed(lambda i: G.gemv(xx, ws[i], scale[i], partial=True, cfg=cfg), sets)
                        except Exception as exc:  # a config that does not compile (shared memory, registers)
                            print(f"  skip {variant} {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
                            continue
                        best.append((us, cfg))
                best.sort(key=lambda t: t[0])
                if m == 1:
                    top[(name, variant)] = [G.Config(bn=c.bn, bk=c.bk, warps=c.warps, stages=c.stages)
                                            for _, c in best[:6]]
                results[variant] = best[0] if best else None
            if results.get("bf16"):
                split = results["bf16"][1].split
                if split > 1:
                    p = G.Partials(torch.randn(split, m, n, device=dev), torch.bfloat16)
                    rec["reduce_us"] = timed(lambda i: G.reduce(p), 4)
            for variant, best in results.items():
                if best:
                    gb = gb_bf16 if variant == "bf16" else gb_int8  # int8 times exclude the rotation of x
                    rec[variant] = {"us": best[0], "tbps": gb / best[0] * 1e6 / 1e3, "cfg": best[1].__dict__}
            rows.append(rec)
            line = (f"{name:10s} m={m:2d} cuBLAS bf16 {base_b:7.2f} µs ({gb_bf16 / base_b * 1e3:4.2f} TB/s) | "
                    f"old w8a16+rot {base_q:7.2f} µs ({gb_int8 / base_q * 1e3:4.2f}) | rotate cuBLAS "
                    f"{rec['rotate_cublas_us']:5.2f} Triton {rec['rotate_triton_us']:5.2f} µs")
            for variant in ("bf16", "int8"):
                if variant in rec:
                    r = rec[variant]
                    c = r["cfg"]
                    line += (f" | {variant} {r['us']:6.2f} µs ({r['tbps']:4.2f}) "
                             f"bn{c['bn']} bk{c['bk']} s{c['split']} w{c['warps']} st{c['stages']}")
            print(line, flush=True)
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
