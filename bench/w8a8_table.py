"""The W8A8 GEMM's launch configurations for this GPU (`fast.w8a8.HOPPER_TABLE`, YUE2_W8A8_TABLE): the autotuner
run over the NAR's W8A8 products of a checkpoint in both size classes, each choice printed with its time and the
built-in table's entry (if any) timed beside it.

    python3 bench/w8a8_table.py --checkpoint /tmp/yue2bench/yue2_full_int8.safetensors --json table.json

The shapes are those the warm-up tunes (`warmup._nar`: the int8 file's NAR linears marked for W8A8 whose input is
a multiple of 256 wide), at 256 rows (size class 0) and 2,048 rows (class 1), as `w8a8.warm`. The JSON is a
YUE2_W8A8_TABLE file.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    import torch
    os.environ["YUE2_NAR_LINEARS"] = "w8a8"
    os.environ.pop("YUE2_W8A8_TABLE", None)
    from yue2_core.fast import w8a8
    from yue2_core.warmup import _nar_quant, build_shadow
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.quant import ConvRotLinear
    info = inspect_checkpoint(a.checkpoint)
    shadow = build_shadow(info.dims, info.quant_ar, None, "meta", torch.bfloat16, parts=("nar",))
    shapes = sorted({(m.out_features, m.in_features, m.bias is not None) for m in shadow.nar.modules()
                     if isinstance(m, ConvRotLinear) and m.in_features % 256 == 0})  # (on meta: not marked)
    assert _nar_quant(info.quant_ar, info.dims, torch.bfloat16, "cuda"), "not an int8 file"
    builtin = dict(w8a8.HOPPER_TABLE)
    w8a8.HOPPER_TABLE.clear()
    w8a8._table.cache_clear()
    print(torch.cuda.get_device_name(), "· shapes (N, K, bias):", shapes, flush=True)
    w8a8.warm(shapes, "cuda")
    rows = w8a8.tuned_choices()
    from triton.testing import do_bench
    print(f"{'N':>6} {'K':>6} {'class':>5}  {'autotuned config':<28} {'ms':>7}  {'built-in':<28} {'ms':>7}")
    for row in rows:
        n, k, mb = row["n"], row["k"], row["mb"]
        m = 2 * w8a8.LARGE_M if mb else w8a8.LARGE_M // 4
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        q = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
        s = torch.rand(n, device="cuda") / 127
        codes, scales = w8a8.quantize_rows(x, 256)

        def timed(cfg):
            w8a8.HOPPER_TABLE.clear()
            w8a8.HOPPER_TABLE[(n, k, mb)] = tuple(cfg)
            w8a8._table.cache_clear()
            return do_bench(lambda: w8a8.gemm(codes, scales, q, s, None), warmup=25, rep=200)
        t = timed(row["config"])
        old = builtin.get((n, k, mb))
        t_old = timed(old) if old else float("nan")
        print(f"{n:>6} {k:>6} {mb:>5}  {str(row['config']):<28} {t:7.4f}  {str(list(old) if old else '-'):<28} "
              f"{t_old:7.4f}", flush=True)
        row["ms"] = round(t, 5)
    w8a8.HOPPER_TABLE.clear()
    w8a8.HOPPER_TABLE.update(builtin)
    w8a8._table.cache_clear()
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump([{k: r[k] for k in ("n", "k", "mb", "config")} for r in rows], f, indent=1)
    print("HOPPER_TABLE = {" + ", ".join(f"({r['n']}, {r['k']}, {r['mb']}): {tuple(r['config'])}" for r in rows)
          + "}")


if __name__ == "__main__":
    main()
