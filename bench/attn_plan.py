"""The decode attention's launch configuration timed in the step's own call, outside the step (issue #18).

`bench/decode_parts.py` tuned `fused.ATTN_CONFIG` (64 positions an iteration, 2 warps, 3 stages, 2 programs an SM)
with the splits merged by a separate kernel and a plain output. Here the step's call instead — counters (the last
program merges when there are ≤ 32 splits), the int8 output rotated with its pair codes, the candidates' shared
prompt — for 28 layers of random K/V in one CUDA graph, at 1 row, a CFG pair and 8 candidates and at the 2,256 /
4,352 / 7,424 / 9,216-position buckets: ATTN_CONFIG, three alternatives and (--sweep) bl 16/32 × warps × stages ×
programs per SM with the 6 fastest shown; µs per layer, the K/V read rate, the speed-up over ATTN_CONFIG. Every
configuration is first checked against an fp32 torch reference.

Measured on 2026-12-05 (docs/experiments/attn_plan_2026-12-05.log): gains of up to 1.37× here did **not** carry
into the step — `bench/profile_decode.py --attn-cfg` times a configuration in the decode step itself, which is
what counts.

    python bench/attn_plan.py [--sweep] [--reps 50] [--budget-s 480]
"""
from __future__ import annotations

import argparse
import itertools
import math
import time
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import torch  # noqa: E402

NH, NKV, D, LAYERS = 16, 8, 128, 28  # YuE2-3B attention (reference/model.md)
SWEEP = False


def plans(fused):
    """ATTN_CONFIG (the speed-ups' base), the alternatives the sweep found fastest here, and with --sweep bl 16/32 ×
    warps × stages × programs per SM."""
    out = [("ATTN_CONFIG", fused.ATTN_CONFIG),
           ("bl16 w1 st3 sm4", fused.AttnConfig(bl=16, warps=1, stages=3, per_sm=4)),
           ("bl16 w1 st3 sm2", fused.AttnConfig(bl=16, warps=1, stages=3, per_sm=2)),
           ("bl32 w2 st3 sm2", fused.AttnConfig(bl=32, warps=2, stages=3, per_sm=2))]
    if SWEEP:
        for bl in (32, 16):
            for warps, stages, per_sm in itertools.product((1, 2, 4), (2, 3, 4), (1, 2, 3, 4)):
                out.append((f"bl{bl} w{warps} st{stages} sm{per_sm}",
                            fused.AttnConfig(bl=bl, warps=warps, stages=stages, per_sm=per_sm)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--sweep", action="store_true", help="every bl 16/32 plan (warps, stages, programs per SM); "
                    "prints the 6 fastest per case")
    ap.add_argument("--budget-s", type=float, default=480, help="stop starting new cases after this many seconds")
    a = ap.parse_args(argv)
    global SWEEP
    SWEEP = a.sweep
    if not 1 <= a.reps <= 100_000:
        ap.error(f"--reps takes 1 to 100,000 graph replays; got {a.reps}")
    if not (0 < a.budget_s < math.inf):  # also refuses nan (break-it finding: -1, 0, nan, inf were taken)
        ap.error(f"--budget-s takes a positive, finite number of seconds; got {a.budget_s}")
    if not torch.cuda.is_available():
        print("attn_plan.py needs a CUDA GPU", file=sys.stderr)
        return 1
    t_end = time.perf_counter() + a.budget_s
    from decode_parts import attn_reference  # the fp32 torch reference of the decode attention
    from gemv_sweep import captured, replay_us
    from yue2_core.fast import fused
    dev = torch.device("cuda")
    scale = 1 / math.sqrt(D)
    torch.manual_seed(0)
    cnt = torch.zeros(64, dtype=torch.int32, device=dev)
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · {LAYERS} layers a graph")
    # correctness of every plan, merged by the last program, unrotated, at 1 and 8 rows (8: shared prefix)
    for r, length, shared in ((1, 2256, 0), (2, 2256, 0), (8, 2256, 2000)):
        q = torch.randn(r, NH, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(r, NKV, length, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        if shared:
            k[:, :, :shared] = k[:1, :, :shared]
            v[:, :, :shared] = v[:1, :, :shared]
        pos = torch.tensor([2121 - 7 * i for i in range(r)], device=dev)
        ref = attn_reference(q, k, v, pos, scale)
        worst = 0.0
        for _, cfg in plans(fused):
            out = fused.decode_attention(q, k, v, pos, length, scale, cfg=cfg, counters=cnt, shared=shared).float()
            worst = max(worst, ((out - ref).norm() / ref.norm()).item())
        assert int(cnt.abs().sum()) == 0, "merge counters not back at zero"
        print(f"check rows={r} shared={shared}: {len(plans(fused))} plans vs fp32 torch, worst rel. error "
              f"{worst:.1e}")
        if worst > 1e-2:
            print("FAILED: a plan disagrees with the reference", file=sys.stderr)
            return 1
    print(f"{'rows':>4} {'bucket':>6} {'plan':<30} {'splits':>6} {'µs/layer':>9} {'TB/s':>6} {'vs ATTN':>8}")
    cases = ((1, 7424, 0), (1, 4352, 0), (1, 2256, 0), (2, 4352, 0), (8, 2256, 2000), (1, 9216, 0), (8, 4352, 2000),
             (2, 2256, 0))
    overall: dict = {}
    for r, length, shared in cases:
        if time.perf_counter() > t_end:
            print(f"--budget-s reached: cases from rows={r} bucket={length} on not run")
            break
        last = length - 135
        ks = [torch.randn(r, NKV, length, D, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
        vs = [torch.randn_like(x) for x in ks]
        if shared:
            for x in ks + vs:
                x[:, :, :shared] = x[:1, :, :shared]
        qs = torch.randn(r, NH, D, device=dev, dtype=torch.bfloat16)
        pos = torch.full((r,), last, device=dev)
        read = 2 * NKV * D * 2 * (shared + r * (last + 1 - shared))  # bytes of K/V a layer reads
        base = None
        res = []
        for name, cfg in plans(fused):
            g = captured(lambda i: fused.decode_attention(qs, ks[i], vs[i], pos, length, scale, cfg=cfg, rot=True,
                                                          quant=True, counters=cnt, shared=shared), LAYERS)
            us = replay_us(g, a.reps) / LAYERS
            base = base or us
            res.append((us, name, cfg))
        for us, name, _ in res:
            overall.setdefault(name, []).append(base / us)
        shown = res[:4] + sorted(res[4:], key=lambda t: t[0])[:6]
        for us, name, cfg in shown:
            splits = _splits(fused, cfg, r, length, shared)
            print(f"{r:>4} {length:>6} {name:<30} {splits:>6} {us:9.2f} {read / us / 1e6:6.2f} {base / us:8.3f}")
        ks = vs = None
        torch.cuda.empty_cache()
    if not overall:
        return 0
    n = max(len(v) for v in overall.values())
    ranked = sorted(((math.exp(sum(map(math.log, v)) / n), k) for k, v in overall.items() if len(v) == n),
                    reverse=True)
    print(f"over the {n} cases run (geometric mean of the speed-ups against ATTN_CONFIG):")
    for gm, name in ranked[:8]:
        print(f"   {gm:6.3f}  {name}  ({' '.join(f'{x:.2f}' for x in overall[name])})")
    return 0


def _splits(fused, cfg, r, length, shared) -> str:
    """The plan's splits per (row, kv head), as decode_attention computes them (`warmup_jobs.split_count` for the
    prefix and the per-row part; prefix+suffix with a shared prefix, whose splits are capped so the kernel merges)."""
    from yue2_core.warmup_jobs import split_count
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bl, most = cfg.bl, fused.MERGE_MAX_SPLITS
    p = shared if r > 1 else 0
    sp_p = split_count(p, 1, NKV, sms, bl, cfg.per_sm) if p else 0
    sp_s = split_count(length - p, r, NKV, sms, bl, cfg.per_sm)
    if p and sp_p + sp_s > most and sp_s < most:
        chunk_p = max(bl, -(-(-(-p // (most - sp_s))) // bl) * bl)
        sp_p = -(-p // chunk_p)
    return f"{sp_p}+{sp_s}" if p else str(sp_s)


if __name__ == "__main__":
    sys.exit(main())
