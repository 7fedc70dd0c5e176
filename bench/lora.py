"""What a LoRA costs on the fast path: decode tok/s at batch 1 and the NAR render, without and with one rank-64
adapter on both experts (every qkv/o/gate_up/down of the 28 layers), bf16 and int8 full-size synthetic files, in one
process (ratios, not timers). Issue targets: decode ≥ 90 % of without, NAR ≤ 110 %.

    python bench/lora.py --workdir /tmp/yue2bench --json lora.json [--file ADAPTER.safetensors]

bf16 layers take the adapter merged into their weights (same kernels afterwards); int8 ConvRot layers keep their
codes and add the fp32 side delta (two small products per layer linear inside the CUDA graph). With --file, the
adapter is read from that file (any layout, e.g. one written by yue2_core.weights.lora.synthetic) instead of the
in-memory random one. --dry-run-cpu checks the script on the tiny profile.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "weights"))

import bench as B  # noqa: E402  (bench/bench.py: checkpoints, decode rate, NAR timing)
from lora_testlib import random_adapter  # noqa: E402

from yue2_core.weights.lora.apply import Applied, apply_stack  # noqa: E402


def decode_rate(eng, n):
    sem_p = B.prompt_ids(2000, "semantic")
    s = B.fixed_len(B.SEM, n)
    B.warm(eng.ar, [[sem_p]], s, "semantic")
    rates = [B.ours_rate(eng.ar, [sem_p], s, "semantic")[0] for _ in range(3)]
    return max(rates)


def nar_seconds(eng, frames):
    from yue2_core.nar import ChunkRenderer, chunk_tokens, solve, song_noise
    prefix = B.prompt_ids(2000, "semantic")
    codes = torch.randint(0, 32768, (frames,), generator=torch.Generator().manual_seed(0)).tolist()
    noise = song_noise(frames, 1)
    kv = eng.ar.layer_kv(chunk_tokens(prefix, codes, 0, frames))
    r = ChunkRenderer(eng.nar, kv, frames)
    r.velocity(noise.to(B.DEVICE, eng.nar.dtype), 20.0)
    B.sync()
    best = None
    for _ in range(2):
        t = time.perf_counter()
        solve(r, noise, 32)
        B.sync()
        best = min(best or 1e9, time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/yue2bench")
    ap.add_argument("--json", default="lora.json")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--frames", type=int, default=1500, help="NAR chunk length (frames at 25/s)")
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument("--file", default="", help="adapter file to apply instead of the in-memory random one")
    ap.add_argument("--formats", default="int8,bf16")
    ap.add_argument("--dry-run-cpu", action="store_true")
    args = ap.parse_args()
    if args.dry_run_cpu:
        B.DEVICE, B.PROFILE = "cpu", "tiny"
    paths = B.make_checkpoints(args.workdir)
    rows, out = [], {"machine": {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                                 "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                                 "commit": os.environ.get("YUE2_COMMIT", "")}, "metrics": {}}
    for fmt in args.formats.split(","):
        eng = B.load(paths[fmt], parts=("ar", "nar"))
        base_tok = decode_rate(eng, args.tokens)
        base_nar = nar_seconds(eng, args.frames)
        if args.file:
            from yue2_core.weights.lora.layouts import read_adapter
            adapter = read_adapter(args.file, eng.ar.dims)
        else:
            adapter = random_adapter(eng.ar.dims, rank=args.rank)
        t = time.perf_counter()
        counts = {e: apply_stack(m, [Applied(adapter, 1.0, 1.0)], e) for e, m in (("ar", eng.ar), ("nar", eng.nar))}
        B.sync()
        apply_s = time.perf_counter() - t
        lora_tok = decode_rate(eng, args.tokens)
        lora_nar = nar_seconds(eng, args.frames)
        rows.append((f"decode batch 1 {fmt} (tok/s)", base_tok, lora_tok, lora_tok / base_tok))
        if fmt == "int8" and not args.file:  # the opt-in: int8 AR layers dequantized to bf16, adapter merged
            del eng
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            os.environ["YUE2_LORA_INT8"] = "bf16"
            try:
                eng = B.load(paths[fmt], parts=("ar",))
                apply_stack(eng.ar, [Applied(adapter, 1.0, 1.0)], "ar")
                merged_tok = decode_rate(eng, args.tokens)
            finally:
                os.environ.pop("YUE2_LORA_INT8", None)
            rows.append(("decode batch 1 int8, YUE2_LORA_INT8=bf16 (tok/s)", base_tok, merged_tok,
                         merged_tok / base_tok))
            out["metrics"]["int8_lora_bf16_merge_tok_s"] = merged_tok
        rows.append((f"NAR {args.frames} frames × 32 steps {fmt} (s)", base_nar, lora_nar, lora_nar / base_nar))
        out["metrics"][fmt] = {"decode_tok_s": [base_tok, lora_tok], "nar_s": [base_nar, lora_nar],
                               "apply_s": apply_s, "patched": counts, "rank": args.rank}
        print(f"{fmt}: applied in {apply_s:.2f} s ({counts})", flush=True)
        del eng
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(f"\n| {out['machine']['gpu']} | without LoRA | with rank-{args.rank} LoRA on both experts | ratio |")
    print("|---|---|---|---|")
    for name, a, b, r in rows:
        print(f"| {name} | {a:.3f} | {b:.3f} | {r:.3f} |")
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
