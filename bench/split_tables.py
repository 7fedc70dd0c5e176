"""YUE2_GEMV_TABLE files that change how many ways the int8 × int8 pair-code products of the decode step split K
(issue #18): each split-K product hands its consumer kernel (add+RMSNorm after o_proj and down_proj, QK-norm+RoPE
after qkv_proj, SiLU·up after gate_up) S partial rows that the consumer sums — add+RMSNorm reads all S × 2,048 fp32
in each of its programs —, and `fast.gemv._Q_TABLE` was swept on the products alone (bench/int8_dot.py). Measured
without their arithmetic, the 113 consumer kernels cost 2.2–2.8 µs each for their launch, wait and that read
(bench/step_floor.py, docs/speed.md), so fewer splits may win in the step even where the product alone loses.

Writes one table per variant (the built-in configuration of every other shape kept) into --out and prints the
bench/profile_decode.py command that profiles the int8 step with each of them against the default in one process.
`--family pipeline`: instead, the built-in blocks and splits with other warps and pipeline stages (the products'
launch configurations in the step, where the attention's isolated sweep did not carry over; docs/speed.md).

    python bench/split_tables.py --out /tmp/split_tables [--family splits|pipeline]
    python bench/profile_decode.py --checkpoint /tmp/yue2bench/yue2_full_int8.safetensors --only-l2 \
        --gemv-table /tmp/split_tables/down_bn64_s4.json ...
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = {"qkv": (4096, 2048), "o": (2048, 2048), "gate_up": (12288, 2048), "down": (2048, 6144),
          "head": (32769, 2048)}  # head: the codec head's slice
# (shape, bn, split, stages, swap): about 128–256 programs each, fewer partial rows than the built-in table's
VARIANTS = [("o", 32, 4, 4, True), ("o", 32, 2, 4, True), ("o", 16, 4, 4, True),
            ("down", 64, 4, 3, False), ("down", 32, 4, 3, False), ("down", 32, 2, 3, False),
            ("qkv", 64, 2, 3, False), ("gate_up", 32, 1, 3, True)]
# --family pipeline: (shape, bn, split, stages, swap, warps) — `fast.gemv._Q_TABLE`'s blocks and splits, other
# stages and warps (the built-in ones: 4 warps; stages qkv 3, o 4, gate_up 3, down 3, head 3)
PIPELINE = [("qkv", 128, 4, 4, False, 4), ("qkv", 128, 4, 3, False, 8), ("o", 64, 8, 3, True, 4),
            ("o", 64, 8, 4, True, 8), ("gate_up", 64, 2, 4, True, 4), ("gate_up", 64, 2, 3, True, 8),
            ("down", 128, 8, 4, False, 4), ("down", 128, 8, 3, False, 8), ("head", 128, 1, 4, True, 4),
            ("head", 128, 1, 3, True, 8)]


def table(name: str, bn: int, split: int, stages: int, swap: bool, warps: int = 4) -> dict:
    """A YUE2_GEMV_TABLE document with one pair-code entry (`fast.gemv._tables_from`)."""
    n, k = SHAPES[name]
    return {"configs": [{"n": n, "k": k, "int8": True, "m": 0, "pair": True, "swap": swap,
                         "cfg": {"bn": bn, "bk": 256, "split": split, "warps": warps, "stages": stages,
                                 "dot": True}}],
            "note": f"{name}: bn {bn}, split {split}, stages {stages}, swap {swap}, warps {warps} "
                    "(bench/split_tables.py)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/split_tables")
    ap.add_argument("--family", choices=("splits", "pipeline"), default="splits",
                    help="splits: fewer partial sums (the default); pipeline: other warps and stages")
    args = ap.parse_args()
    paths = []
    variants = ([(*v, 4) for v in VARIANTS] if args.family == "splits" else PIPELINE)
    try:
        os.makedirs(args.out, exist_ok=True)
        for name, bn, split, stages, swap, warps in variants:
            tail = "" if args.family == "splits" else f"_st{stages}_w{warps}"
            path = os.path.join(args.out, f"{name}_bn{bn}_s{split}{tail}.json")
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(table(name, bn, split, stages, swap, warps), f, indent=1)
            os.replace(tmp, path)
            paths.append(path)
    except OSError as exc:  # break-it finding: a file or an unwritable place as --out gave a traceback
        sys.exit(f"split_tables.py: cannot write the tables into --out {args.out!r}: "
                 f"{exc.strerror or exc}{' (' + exc.filename + ')' if getattr(exc, 'filename', None) else ''}")
    print(" ".join(f"--gemv-table {p}" for p in paths))


if __name__ == "__main__":
    main()
