"""add+RMSNorm folded into the int8 product that consumes it (issue #18, an experiment): the two norms of each
decoder layer are separate kernels today (57 launches a step, 0.21–0.23 ms on an H200/H100), each between a
split-K product and the next product. `gemv.norm_gemv_q` makes the residual sum, the norm weight, the rotation and
the int8 pair codes inside the consuming product's K loop instead, leaving only the row's 1/RMS (a scalar) to
the consumer. Here the chains

    unfused: down product → add+RMSNorm → qkv product;  o product → add+RMSNorm → gate/up product
    fused:   down product → qkv product with the norm;  o product → gate/up product with the norm

run for 28 layers of full-size random int8 weights in one CUDA graph with PDL (the decode step's launch mode) at
1, 2 and 8 rows; the fused products are swept over launch configurations. Prints µs per layer and the error of the
fused result (times 1/RMS) against the unfused one. The consumers' extra work (the 1/RMS from the new residual
row: one 4 KB load per program) is not in the chain.

    python bench/norm_gemv.py [--rows 1,2,8] [--reps 50] [--quick]
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import torch  # noqa: E402

H, F, QKV, LAYERS, EPS = 2048, 6144, 4096, 28, 1e-6  # YuE2-3B AR shapes (reference/model.md)


def weights(n: int, k: int, dev):
    return [(torch.randint(-127, 128, (n, k), dtype=torch.int8, device=dev),
             torch.rand(n, device=dev) * 2e-3) for _ in range(LAYERS)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,8")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="fewer launch configurations")
    a = ap.parse_args(argv)
    try:
        rows = [int(v) for v in a.rows.split(",")]
        if not rows or any(not 1 <= r <= 8 for r in rows):
            raise ValueError
    except ValueError:
        ap.error(f"--rows takes comma-separated row counts from 1 to 8; got {a.rows!r}")
    if not torch.cuda.is_available():
        print("norm_gemv.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from gemv_sweep import captured, replay_us
    from yue2_core.fast import fused, gemv as G
    dev = torch.device("cuda")
    torch.manual_seed(0)
    wd, wq, wo, wg = weights(H, F, dev), weights(QKV, H, dev), weights(H, H, dev), weights(2 * F, H, dev)
    nw1 = [(1 + 0.1 * torch.randn(H, device=dev)).bfloat16() for _ in range(LAYERS)]
    nw2 = [(1 + 0.1 * torch.randn(H, device=dev)).bfloat16() for _ in range(LAYERS)]
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · {LAYERS} layers · PDL "
          f"{'on' if fused._pdl(wd[0][0]) else 'off'}")

    def run_chain(m: int, fused_norm: bool, cq=None, cg=None, keep=None):
        x0 = torch.randn(m, H, device=dev).bfloat16()
        _, xd = G.rotate(torch.randn(m, F, device=dev).bfloat16(), quant=True)
        _, xo_ = G.rotate(torch.randn(m, H, device=dev).bfloat16(), quant=True)
        state = {}

        def chain(_i):
            x = x0
            for li in range(LAYERS):
                pd = G.gemv_q(xd, *wd[li], partial=True)
                if fused_norm:
                    x, pq = G.norm_gemv_q(x, pd, nw1[li], *wq[li], partial=True, cfg=cq)
                else:
                    x, _, pack = fused.add_rmsnorm(x, pd, nw1[li], EPS, rot=True, quant=True)
                    pq = G.gemv_q(pack, *wq[li], partial=True)
                po = G.gemv_q(xo_, *wo[li], partial=True)
                if fused_norm:
                    x1, pg = G.norm_gemv_q(x, po, nw2[li], *wg[li], partial=True, cfg=cg)
                else:
                    x1, _, pack = fused.add_rmsnorm(x, po, nw2[li], EPS, rot=True, quant=True)
                    pg = G.gemv_q(pack, *wg[li], partial=True)
                if li == 0:
                    state.update(xq=x, pq=pq, xg=x1, pg=pg)
                x = x1
        g = captured(chain)
        us = replay_us(g, a.reps) / LAYERS
        g.replay()
        torch.cuda.synchronize()
        out = {}
        for name, xk, pk in (("qkv", "xq", "pq"), ("gate_up", "xg", "pg")):
            p = state[pk]
            z = G.reduce(p).float() if isinstance(p, G.Partials) else p.float()
            if fused_norm:
                xf = state[xk].float()
                z = z * (1.0 / torch.sqrt((xf * xf).mean(-1, keepdim=True) + EPS)).bfloat16().float()
            out[name] = z
        return us, out

    def err(a_, b_):
        return max(((a_[k] - b_[k]).norm() / b_[k].norm()).item() for k in a_)

    qcfgs = [None]
    gcfgs = [None]
    for bn, split, st, w in itertools.product((64, 128), (1, 2, 4, 8), (2, 3, 4), (4, 8)):
        if a.quick and (st != 3 or w != 4):
            continue
        qcfgs.append(G.Config(bn=bn, bk=256, split=split, stages=st, warps=w))
        gcfgs.append(G.Config(bn=bn, bk=256, split=split, stages=st, warps=w))
    print(f"{'rows':>4} {'variant':<44} {'µs/layer':>9} {'vs unfused':>10} {'rel. error':>10}")
    for m in rows:
        base_us, base = run_chain(m, False)
        print(f"{m:>4} {'unfused (add+RMSNorm kernels, default tables)':<44} {base_us:9.2f} {1.0:10.3f} {'':>10}")
        us, out = run_chain(m, True)
        print(f"{m:>4} {'fused, default tables':<44} {us:9.2f} {base_us / us:10.3f} {err(out, base):10.2e}")
        best_q = (us, None)
        for c in qcfgs[1:]:
            try:
                u, _ = run_chain(m, True, cq=c)
            except Exception as e:  # a configuration past the shared memory: skipped, said
                print(f"{m:>4}   qkv {c.bn}/{c.split}/{c.stages}/{c.warps}: {type(e).__name__}")
                continue
            if u < best_q[0]:
                best_q = (u, c)
        best_g = (best_q[0], None)
        for c in gcfgs[1:]:
            try:
                u, _ = run_chain(m, True, cq=best_q[1], cg=c)
            except Exception as e:
                print(f"{m:>4}   gate_up {c.bn}/{c.split}/{c.stages}/{c.warps}: {type(e).__name__}")
                continue
            if u < best_g[0]:
                best_g = (u, c)
        u, out = run_chain(m, True, cq=best_q[1], cg=best_g[1])
        name = (f"fused, best qkv {_cfg(best_q[1])} gate_up {_cfg(best_g[1])}")
        print(f"{m:>4} {name:<44} {u:9.2f} {base_us / u:10.3f} {err(out, base):10.2e}")
        u2, _ = run_chain(m, False)
        print(f"{m:>4} {'unfused again':<44} {u2:9.2f} {base_us / u2:10.3f}")
    return 0


def _cfg(c) -> str:
    return "table" if c is None else f"bn{c.bn}/s{c.split}/st{c.stages}/w{c.warps}"


if __name__ == "__main__":
    sys.exit(main())
