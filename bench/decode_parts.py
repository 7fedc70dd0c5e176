"""Pieces of the decode step timed apart on a CUDA GPU, each as 28 calls (one per layer, own weights / KV cache, so
data streams from HBM as in a real step) captured in one CUDA graph:

1. decode attention (`fused.decode_attention`): launch configurations (positions per iteration, warps, stages,
   split programs per SM) at several attention lengths and row counts, vs the current `ATTN_CONFIG`; µs per layer
   and the KV bandwidth (TB/s). Each block size is first checked against an fp32 torch reference. For several
   rows also the shared-prefix variant (a common prompt prefix read once for all rows, YUE2_SHARED_PREFIX).
2. the rotation of int8 ConvRot inputs: cuBLAS vs the Triton kernel, and the producers (add+RMSNorm, SiLU·up)
   with and without writing rotated outputs.

    python bench/decode_parts.py [--json out.json] [--budget-s 300] [--skip-attn] [--skip-products]
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemv_sweep import timed  # noqa: E402
from yue2_core.fast import fused  # noqa: E402
from yue2_core.fast import gemv as G  # noqa: E402
from yue2_core.weights.quant import rotate  # noqa: E402

NKV, NH, D, LAYERS = 8, 16, 128, 28


def attn_reference(q, k, v, pos, scale):
    r = q.shape[0]
    out = []
    for i in range(r):
        n = int(pos[i]) + 1
        kk = k[i, :, :n].float().repeat_interleave(NH // NKV, 0)
        vv = v[i, :, :n].float().repeat_interleave(NH // NKV, 0)
        p = torch.softmax((q[i].float()[:, None] @ kk.transpose(1, 2))[:, 0] * scale, -1)
        out.append((p[:, None] @ vv)[:, 0].reshape(-1))
    return torch.stack(out)


def attention(budget_end: float, rows_json: list):
    dev = torch.device("cuda")
    scale = 1 / math.sqrt(D)
    grid = [fused.AttnConfig(bl=bl, warps=w, stages=st, per_sm=ps)
            for bl, w, st, ps in itertools.product((32, 64, 128), (2, 4, 8), (1, 2, 3), (2, 4, 8))]
    # correctness of each block size / warps / stages once (small cache)
    q = torch.randn(2, NH, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(2, NKV, 1500, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    pos = torch.tensor([1499, 700], device=dev)
    ref = attn_reference(q, k, v, pos, scale)
    worst = 0.0
    for cfg in grid:
        if cfg.per_sm != 2:
            continue
        out = fused.decode_attention(q, k, v, pos, 1500, scale, cfg=cfg).float()
        worst = max(worst, ((out - ref).norm() / ref.norm()).item())
    print(f"attention check: 27 configurations vs fp32 torch, worst rel. err {worst:.1e}")
    assert worst < 1e-2
    for r, length in ((1, 2256), (1, 4352), (1, 7424), (2, 4352), (8, 4352)):
        if time.perf_counter() > budget_end:
            print("budget reached; attention sweep stopped")
            return
        ks = [torch.randn(r, NKV, length, D, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
        vs = [torch.randn_like(x) for x in ks]
        qs = torch.randn(r, NH, D, device=dev, dtype=torch.bfloat16)
        pos = torch.full((r,), length - 1, device=dev)
        gb = 2 * r * NKV * length * D * 2 / 1e9
        res = []
        for cfg in grid:
            us = timed(lambda i: fused.decode_attention(qs, ks[i], vs[i], pos, length, scale, cfg=cfg), LAYERS)
            res.append((us, cfg))
        res.sort(key=lambda t: t[0])
        cur = next(us for us, c in res if c == fused.ATTN_CONFIG)
        best_us, best = res[0]
        top3 = "  ".join(f"{us:.2f} µs bl{c.bl} w{c.warps} st{c.stages} sm{c.per_sm}" for us, c in res[:3])
        print(f"attention R={r} L={length}: current {cur:.2f} µs ({gb / cur * 1e6 / 1e3:.2f} TB/s) | best "
              f"{best_us:.2f} µs ({gb / best_us * 1e6 / 1e3:.2f} TB/s) | top: {top3}")
        rows_json.append({"rows": r, "length": length, "current_us": cur, "results": [
            {"us": us, **c.__dict__} for us, c in res]})
        if r > 1:  # candidates of one request: the prompt prefix (here 3/4 of the cache) read once for all rows
            shared = length * 3 // 4
            for x in ks + vs:
                x[:, :, :shared] = x[:1, :, :shared]
            per_row = timed(lambda i: fused.decode_attention(qs, ks[i], vs[i], pos, length, scale), LAYERS)
            once = timed(lambda i: fused.decode_attention(qs, ks[i], vs[i], pos, length, scale, shared=shared),
                         LAYERS)
            print(f"attention R={r} L={length}, {shared} positions shared: per row {per_row:.2f} µs → prefix read "
                  f"once {once:.2f} µs ({per_row / once:.2f}×)")
            rows_json[-1].update({"shared_positions": shared, "per_row_us": per_row, "shared_us": once})
        ks = vs = None
        torch.cuda.empty_cache()


def products(rows_json: list):
    """Where int8 ConvRot inputs get rotated: a cuBLAS matmul, the Triton rotation kernel (`gemv.rotate`), or the
    producing kernels (add+RMSNorm, SiLU·up) writing rotated outputs; each next to its plain counterpart."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    for m in (1, 2, 8):
        rec = {"m": m}
        xs = [torch.randn(m, 2048, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
        rec["rotate_cublas_2048_us"] = timed(lambda i: rotate(xs[i]), LAYERS)
        rec["rotate_triton_2048_us"] = timed(lambda i: G.rotate(xs[i]), LAYERS)
        err = ((G.rotate(xs[0]).float() - rotate(xs[0].float())).norm() / rotate(xs[0].float()).norm()).item()
        res = [torch.randn(m, 1, 2048, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
        part = G.Partials(torch.randn(8, m, 2048, device=dev), torch.bfloat16)
        wn = torch.ones(2048, device=dev, dtype=torch.bfloat16)
        rec["add_rmsnorm_us"] = timed(lambda i: fused.add_rmsnorm(res[i], part, wn, 1e-6), LAYERS)
        rec["add_rmsnorm_rot_us"] = timed(lambda i: fused.add_rmsnorm(res[i], part, wn, 1e-6, rot=True), LAYERS)
        gu = G.Partials(torch.randn(2, m, 2 * 6144, device=dev), torch.bfloat16)
        rec["silu_mul_us"] = timed(lambda i: fused.silu_mul(gu), LAYERS)
        rec["silu_mul_rot_us"] = timed(lambda i: fused.silu_mul(gu, rot=True), LAYERS)
        print(f"m={m}: rotate 2048 cuBLAS {rec['rotate_cublas_2048_us']:.2f} / Triton {rec['rotate_triton_2048_us']:.2f} µs "
              f"(rel. err vs fp32 {err:.1e}) | add+RMSNorm (8 partials) {rec['add_rmsnorm_us']:.2f} → rotated "
              f"{rec['add_rmsnorm_rot_us']:.2f} µs | SiLU·up (2 partials) {rec['silu_mul_us']:.2f} → rotated "
              f"{rec['silu_mul_rot_us']:.2f} µs")
        rows_json.append(rec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--skip-attn", action="store_true")
    ap.add_argument("--skip-products", action="store_true")
    a = ap.parse_args()
    t0 = time.perf_counter()
    print(torch.cuda.get_device_name(), "· torch", torch.__version__)
    out = {"attention": [], "products": []}
    if not a.skip_products:
        products(out["products"])
        print(f"products done at {time.perf_counter() - t0:.0f} s")
    if not a.skip_attn:
        attention(t0 + a.budget_s, out["attention"])
    print(f"total {time.perf_counter() - t0:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
