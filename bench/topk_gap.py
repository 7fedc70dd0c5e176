"""Where the idle time of the sampling tail's `torch.topk` comes from in a CUDA graph (issue #18): the 8-row decode
step's graph replay had one 0.070 ms gap a step between a memset and the first kernel of torch.topk's multi-block
radix select (docs/experiments/decode_gaps_rows8_h200_2026-12-05.log), none at one row. Here `scores.topk(K)` of
the tail's [rows, 32,769] fp32 scores alone, after a PDL Triton kernel writing them (as the scores kernel does), in
one graph: replay µs and the largest gaps, at 1, 2, 4 and 8 rows, and for the variants that could avoid the gap
(one topk per row; the scores written by a non-PDL kernel; a row width padded to a multiple of 1,024).

    python bench/topk_gap.py [--k K] [--reps 50]
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import torch  # noqa: E402

WIDTH = 32769  # the semantic slice's columns (fast/sample_kernels.py SLICES)


def _writer():
    import triton
    import triton.language as tl
    global pdl_prologue  # the kernel's callee is resolved from this module's globals
    from yue2_core.fast._decode_triton import pdl_prologue

    @triton.jit
    def write_scores(x_ptr, y_ptr, N, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
        pdl_prologue(PDL)
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + o, tl.load(x_ptr + o, mask=o < N) * 1.0001, mask=o < N)
    return triton, write_scores


def run(rows: int, k: int, variant: str, reps: int, gaps: bool):
    from gemv_sweep import captured, replay_us
    from profile_decode import replay_gaps
    from yue2_core.fast import pdl_enabled
    triton, write = _writer()
    width = WIDTH if variant != "padded" else -(-WIDTH // 1024) * 1024
    x = torch.randn(rows, width, device="cuda")
    if variant == "padded":
        x[:, WIDTH:] = float("-inf")
    y = torch.empty_like(x)
    pdl = {"PDL": True, "launch_pdl": True} if pdl_enabled(x.device) and variant != "no-pdl" else {}

    def tail():
        write[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024, **pdl)
        if variant == "per-row":
            return [y[r:r + 1].topk(k, dim=1) for r in range(rows)]
        return y.topk(k, dim=1)

    g = captured(lambda _: tail())
    us = replay_us(g, reps, warm=5)
    lines = replay_gaps(g, 10, 3) if gaps else []
    return us, lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=0, help="candidates (default: the tail's K at the default sampling, "
                    "top_k + TIE_PAD, as fast/decode.py takes them)")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("topk_gap.py needs a CUDA GPU")
    if args.k <= 0:
        from yue2_core.fast.sampler import TIE_PAD
        from yue2_core.protocol import Sampling
        args.k = min(Sampling().top_k + TIE_PAD, WIDTH)
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · topk k={args.k} of {WIDTH} fp32 per row")
    for variant in ("default", "no-pdl", "padded", "per-row"):
        for rows in (1, 2, 4, 8):
            us, lines = run(rows, args.k, variant, args.reps, gaps=True)
            print(f"\n{variant:8s} rows={rows}: graph replay {us:7.1f} µs")
            for line in lines:
                print(line)


if __name__ == "__main__":
    main()
