"""Sweep of the decode GEMV (`yue2_core.fast.gemv`) against cuBLAS (bf16) and the W8A16 kernel of `int8_kernels`
(int8, rotation by cuBLAS + one program per output block) on the AR expert's four layer shapes and the codec head.

Each measurement captures 28 calls — one per layer, each with its own weights, so they stream from HBM as in a real
step — in one CUDA graph and replays it; µs per call and the achieved weight bandwidth (TB/s) are printed. Split-K
configurations are timed without their reduction (the decode step sums the partials in the consumer kernel) and
the stand-alone reduction is timed apart. At 1–2 rows the CUDA-core configurations (dot=False) are swept too
(columns bf16_cc / int8_cc) beside the tensor-core ones.

    python bench/gemv_sweep.py [--json out.json] [--quick] [--shapes qkv,o] [--rows 1,2]
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
from yue2_core.weights.quant import quantize, rotate  # noqa: E402

SHAPES = {"qkv": (4096, 2048), "o": (2048, 2048), "gate_up": (12288, 2048), "down": (2048, 6144),
          "head_codec": (32769, 2048)}


def captured(fn, calls: int = 1) -> torch.cuda.CUDAGraph:
    """`fn(i)` for i in range(calls), run once on a side stream (compilation, allocations), then captured as one
    CUDA graph."""
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
    return g


def replay_us(g: torch.cuda.CUDAGraph, reps: int = 20, warm: int = 3) -> float:
    """µs per replay of a captured graph (after `warm` untimed replays)."""
    for _ in range(warm):
        g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000 / reps


def timed(fn, calls: int, reps: int = 20) -> float:
    """µs per call of `fn(i)` for i in range(calls), captured as one CUDA graph."""
    return replay_us(captured(fn, calls), reps) / calls


def configs(quick: bool):
    out = []
    for bn, bk, st in itertools.product((16, 32, 64), (256, 512), (3, 4)):
        if bn * bk * st * 2 > 200_000:  # bf16 tiles that do not fit the shared memory
            continue
        for w in ((4,) if bn <= 32 else (4, 8)):
            out.append(G.Config(bn=bn, bk=bk, warps=w, stages=st))
    return out[::3] if quick else out


def small_configs(quick: bool):
    """CUDA-core (dot=False) configurations for 1–2 rows: ≤ 64 fp32 accumulators per thread."""
    out = []
    for bn, bk, w in itertools.product((8, 16, 32, 64), (128, 256, 512), (2, 4, 8)):
        if bn * bk // (32 * w) > 64 or bn * bk // (32 * w) < 8:
            continue
        out.append(G.Config(bn=bn, bk=bk, warps=w, stages=3, dot=False))
    return out[::2] if quick else out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=360)
    ap.add_argument("--shapes", default="", help="comma-separated subset of " + ",".join(SHAPES))
    ap.add_argument("--rows", default="1,2,8", help="batch rows to time, comma-separated")
    ap.add_argument("--cc-only", action="store_true",
                    help="sweep only the CUDA-core configurations; the tensor-core side times the current table")
    a = ap.parse_args()
    t_start = time.perf_counter()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "· torch", torch.__version__)
    for n, k in ((4096, 2048), (2048, 6144)):
        w = torch.randn(n, k, device=dev) * 0.02
        q, s = quantize(w)
        for m in (1, 2, 3):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            for cfg in (G.Config(split=1), G.Config(split=4, bn=64, bk=512), G.Config(split=4, bn=16, dot=False),
                        G.Config(split=1, bn=32, bk=128, dot=False)):
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
    small = small_configs(a.quick)
    shapes = {k: v for k, v in SHAPES.items() if not a.shapes or k in a.shapes.split(",")}
    for name, (n, k) in shapes.items():
        sets = 4 if name.startswith("head") else 28
        wb = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(sets)]
        wq = [torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8) for _ in range(sets)]
        sc = [torch.rand(n, device=dev) * 1e-3 for _ in range(sets)]
        for m in [int(v) for v in a.rows.split(",")]:
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
            variants = {"bf16": wb, "int8": wq}
            if m <= G.SMALL_ROWS:
                variants.update({"bf16_cc": wb, "int8_cc": wq})
            for variant, ws in variants.items():
                best = []
                base_cfgs = small if variant.endswith("_cc") else cfgs
                cand = base_cfgs if m == 1 else top.get((name, variant), base_cfgs)
                if a.cc_only and not variant.endswith("_cc"):  # the tensor-core side: the current table's entry
                    cand = [G.choose(n, k, m, variant == "int8")]
                for c in cand:
                    for split in ((c.split,) if a.cc_only and c.dot else (1, 2, 4, 8, 16)):
                        if k % (split * c.bk) or (name.startswith("head") and (split > 1 or (c.dot and (c.bn < 32 or c.warps > 4)))):
                            continue
                        cfg = G.Config(bn=c.bn, bk=c.bk, split=split, warps=c.warps, stages=c.stages, dot=c.dot)
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
                    top[(name, variant)] = [G.Config(bn=c.bn, bk=c.bk, warps=c.warps, stages=c.stages, dot=c.dot)
                                            for _, c in best[:6]]
                results[variant] = best[0] if best else None
            if results.get("bf16"):
                split = results["bf16"][1].split
                if split > 1:
                    p = G.Partials(torch.randn(split, m, n, device=dev), torch.bfloat16)
                    rec["reduce_us"] = timed(lambda i: G.reduce(p), 4)
            for variant, best in results.items():
                if best:
                    gb = gb_int8 if variant.startswith("int8") else gb_bf16  # int8 times exclude the rotation
                    rec[variant] = {"us": best[0], "tbps": gb / best[0] * 1e6 / 1e3, "cfg": best[1].__dict__}
            rows.append(rec)
            line = (f"{name:10s} m={m:2d} cuBLAS bf16 {base_b:7.2f} µs ({gb_bf16 / base_b * 1e3:4.2f} TB/s) | "
                    f"old w8a16+rot {base_q:7.2f} µs ({gb_int8 / base_q * 1e3:4.2f}) | rotate cuBLAS "
                    f"{rec['rotate_cublas_us']:5.2f} Triton {rec['rotate_triton_us']:5.2f} µs")
            for variant in ("bf16", "bf16_cc", "int8", "int8_cc"):
                if variant in rec:
                    r = rec[variant]
                    c = r["cfg"]
                    line += (f" | {variant} {r['us']:6.2f} µs ({r['tbps']:4.2f}) "
                             f"bn{c['bn']} bk{c['bk']} s{c['split']} w{c['warps']} st{c['stages']}")
            line += "" if m > G.SMALL_ROWS else "  (_cc: CUDA cores, dot=False)"
            print(line, flush=True)
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if a.json:  # "configs": the winners in the format of YUE2_GEMV_TABLE (yue2_core/fast/gemv.py)
        winners = []
        for rec in rows:
            for dtype in ("bf16", "int8"):
                cands = [rec[v] for v in (dtype, dtype + "_cc") if v in rec]
                if cands:
                    best = min(cands, key=lambda r: r["us"])
                    winners.append({"n": rec["n"], "k": rec["k"], "int8": dtype == "int8",
                                    "m": rec["m"] if rec["m"] <= G.SMALL_ROWS else 0, "cfg": best["cfg"],
                                    "us": best["us"]})
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows,
                                            "configs": winners}, indent=1))
    # entries for gemv._SMALL_TABLE: shapes where a CUDA-core configuration beat the tensor-core one by ≥ 2 %
    names = {v: k for k, v in SHAPES.items()}
    for rec in rows:
        for dtype in ("bf16", "int8"):
            cc, tc = rec.get(dtype + "_cc"), rec.get(dtype)
            if cc and tc and cc["us"] < 0.98 * tc["us"]:
                c = cc["cfg"]
                print(f"    ({rec['n']}, {rec['k']}, {dtype == 'int8'}, {rec['m']}): Config(bn={c['bn']}, bk={c['bk']}, "
                      f"split={c['split']}, warps={c['warps']}, stages={c['stages']}, dot=False),  "
                      f"# {names.get((rec['n'], rec['k']), '?')}: {cc['us']:.2f} vs {tc['us']:.2f} µs")


if __name__ == "__main__":
    main()
