"""Where the W8A8 NAR's producers spend their time (stop 52; diagnostic, one GPU, no checkpoint): add+RMSNorm and
SiLU·up writing int8 codes (`fast.w8a8.add_rmsnorm_quantize` / `silu_mul_quantize`) at a song's 5,373 rows, for
each rotation (ROT_MODE 0: `rot_rows(LEAN=True)`, one tf32 pass then hi + lo, the default since stop 52; 1: none —
the rest's cost, wrong codes; 2: `rot_rows`' tf32x3, the default before) and warps a program, against the bf16
producers (what the bf16 linears need) and the separate quantizer; the share of codes equal to the default's.

    python3 bench/w8a8_producers.py [--rows 5373]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import nar_attention  # noqa: E402  (its CUDA-event timer)


def ms(fn, reps=20):
    return nar_attention.timed(fn, reps) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=5373)
    m = ap.parse_args().rows
    from yue2_core.fast import _w8a8_triton as kt, fused, w8a8
    print(torch.cuda.get_device_name(), "· torch", torch.__version__, flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(1, m, 2048, device="cuda", generator=g) * 2).to(torch.bfloat16)
    d = torch.randn(1, m, 2048, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.ones(2048, device="cuda", dtype=torch.bfloat16)
    gu = (torch.randn(m, 12288, device="cuda", generator=g) * 2).to(torch.bfloat16)
    ref_n = w8a8.add_rmsnorm_quantize(x, d, w, 1e-6)[1]
    ref_s = w8a8.silu_mul_quantize(gu)[0]
    print(f"bf16 add+RMSNorm {ms(lambda: fused.add_rmsnorm(x, d, w, 1e-6)):.4f} ms · + quantize_rows "
          f"{ms(lambda: w8a8.quantize_rows(fused.add_rmsnorm(x, d, w, 1e-6)[1].reshape(m, 2048), 256)):.4f}")
    print(f"bf16 SiLU·up {ms(lambda: fused.silu_mul(gu)):.4f} ms · + quantize_rows "
          f"{ms(lambda: w8a8.quantize_rows(fused.silu_mul(gu), 256)):.4f}")
    print(f"quantize_rows [{m}×2048] (the o product's) {ms(lambda: w8a8.quantize_rows(x[0], 256)):.4f} ms")
    xo = torch.empty_like(x)
    q_n = torch.empty(m, 2048, dtype=torch.int8, device="cuda")
    q_s = torch.empty(m, 6144, dtype=torch.int8, device="cuda")
    sc = torch.empty(m, device="cuda")
    print(f"{'kernel':<10} {'rot':>4} {'warps':>5} {'ms':>8} {'codes = default':>16}")
    for mode in (0, 1, 2):
        for warps in (2, 4, 8, 16):
            for name, run, ref, q in (
                    ("norm", lambda: kt.add_rmsnorm_quant_kernel[(m,)](
                        x, d, w, xo, q_n, sc, 2048, 1e-6, HAS_D=True, BLOCK=2048, LIBDEVICE=True, ROT_MODE=mode,
                        num_warps=warps), ref_n, q_n),
                    ("silu", lambda: kt.silu_mul_quant_kernel[(m,)](
                        gu, q_s, sc, 6144, BLOCK=8192, LIBDEVICE=True, ROT_MODE=mode, num_warps=warps), ref_s, q_s)):
                try:
                    t = ms(run)
                except Exception as exc:  # a configuration that does not compile (shared memory, registers)
                    print(f"{name:<10} {mode:>4} {warps:>5} failed: {str(exc).splitlines()[0][:80]}")
                    continue
                same = (q == ref).float().mean().item()
                print(f"{name:<10} {mode:>4} {warps:>5} {t:>8.4f} {same:>16.6f}", flush=True)


if __name__ == "__main__":
    with torch.no_grad():
        main()
