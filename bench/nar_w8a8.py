"""The int8 file's NAR with W8A8 products (YUE2_NAR_LINEARS=w8a8: int8 codes × per-row int8 activations, ComfyUI's
`int8_linear` arithmetic, yue2_core/fast/w8a8.py) against the default bf16 linears (dequantized once), in one
process on the full-size synthetic int8 checkpoint:

1. each NAR product shape at the song's rows (5,373): bf16 GEMM vs W8A8 (quantizer + int8 GEMM) vs the int8 GEMM
   alone, TFLOP/s, and the W8A8 result's error against the bf16 product and its agreement with `w8a8.reference`;
2. the whole 32-step midpoint solve (graphed velocity) of a 5,371-frame chunk after 2,000 prompt tokens with each
   NAR, its time, the latents' relative L2 difference between the two and, with --ode, both against a 256-step
   midpoint solution with an fp32 state (bf16 linears).

    python3 bench/nar_w8a8.py [--frames 5371] [--ode] [--json OUT.json] [--shapes-only]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench as B  # noqa: E402  (bench/bench.py: prompt ids, timing, the fp32-state reference)
import nar_attention  # noqa: E402  (its CUDA-event timer)

CKPT = "/tmp/yue2bench/yue2_full_int8.safetensors"
ROWS = []


def row(name, ours, base, unit, note=""):
    ROWS.append({"name": name, "ours": ours, "baseline": base, "unit": unit, "note": note})
    ratio = f"{base / ours:.2f}×" if ours and base and unit == "s" else ""
    print(f"{name:<78} {ours:>10.4g} {'' if base is None else f'{base:>10.4g}'} {unit:<6} {ratio:>7}  {note}",
          flush=True)


def timed_ms(fn, reps=20):
    return nar_attention.timed(fn, reps) * 1e3  # CUDA events around `reps` calls after one warm call


def random_layer():
    """The NAR layer's four ConvRot products at full size with random codes (no checkpoint: --shapes-only)."""
    from yue2_core.weights.quant import ConvRotLinear
    mods = {}
    for name, (n, k) in {"qkv": (4096, 2048), "o": (2048, 2048), "gate_up": (12288, 2048),
                         "down": (2048, 6144)}.items():
        mod = ConvRotLinear(k, n).cuda()
        mod.weight.copy_(torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda"))
        mod.weight_scale.fill_(1 / 2048)
        mods[name] = mod
    return mods


def shapes_part(nar8, m):
    from yue2_core.fast import w8a8
    from yue2_core.weights.quant import ConvRotLinear
    if nar8 is None:
        mods = random_layer()
    else:
        layer = nar8.model.layers[0]
        mods = {"qkv": layer.self_attn.qkv_proj, "o": layer.self_attn.o_proj, "gate_up": layer.mlp.gate_up_proj,
                "down": layer.mlp.down_proj}
    total_bf16 = total_w8 = 0.0
    for name, mod in mods.items():
        assert isinstance(mod, ConvRotLinear), type(mod)
        n, k = mod.out_features, mod.in_features
        x = (torch.randn(m, k, device="cuda") * 0.5).to(torch.bfloat16)
        w = mod.dequantized(torch.bfloat16)
        s = mod.weight_scale.reshape(-1).float().contiguous()
        t_bf = timed_ms(lambda: torch.nn.functional.linear(x, w))
        t_w8 = timed_ms(lambda: w8a8.linear(x, mod.weight, s, None, mod.group))
        codes, sc = w8a8.quantize_rows(x, mod.group)
        t_q = timed_ms(lambda: w8a8.quantize_rows(x, mod.group))
        t_qd = timed_ms(lambda: w8a8.quantize_rows(x, mod.group, kron=False))
        same_q = torch.equal(w8a8.quantize_rows(x, mod.group, kron=False)[0], codes)
        t_g = timed_ms(lambda: w8a8.gemm(codes, sc, mod.weight, s, None))
        try:  # cuBLAS's int8 GEMM (int32 sums, no epilogue) as the library baseline of the Triton one
            wt = mod.weight.t()
            t_cb = f"{timed_ms(lambda: torch._int_mm(codes, wt)):.3f} ms"
        except (RuntimeError, AttributeError) as exc:
            t_cb = f"n/a ({str(exc).splitlines()[0][:60]})"
        flop = 2.0 * m * n * k
        y8, yb, yr = w8a8.linear(x, mod.weight, s, None, mod.group), torch.nn.functional.linear(x, w), \
            w8a8.reference(x, mod.weight, s, None, mod.group)
        err = ((y8.float() - yb.float()).norm() / yb.float().norm()).item()
        same = (y8 == yr).float().mean().item()
        total_bf16 += t_bf
        total_w8 += t_w8
        row(f"NAR {name} [{m}×{k}]·[{k}×{n}]ᵀ: W8A8 vs bf16 GEMM (ms)", t_w8, t_bf, "ms",
            f"int8 GEMM alone {t_g:.3f} ms ({flop / t_g / 1e9:.0f} TOPS; cuBLAS torch._int_mm {t_cb}) + "
            f"quantizer {t_q:.3f} ms (dense "
            f"rotation {t_qd:.3f}, same codes: {same_q}); bf16 "
            f"{flop / t_bf / 1e9:.0f} TFLOP/s; rel. L2 vs bf16 {err:.2e}; equal to w8a8.reference {same:.4f}")
    row("NAR one layer's four products: W8A8 vs bf16 (ms)", total_w8, total_bf16, "ms",
        f"× 28 layers × 64 evaluations: {(total_bf16 - total_w8) * 28 * 64 / 1000:.2f} s a song saved")


def solve_part(eng, nar8, frames, ode):
    from yue2_core.nar import ChunkRenderer, chunk_tokens, solve, song_noise
    prefix = B.prompt_ids(2000, "semantic")
    codes = torch.randint(0, 32768, (frames,), generator=torch.Generator().manual_seed(0)).tolist()
    noise = song_noise(frames, 1)
    kv = eng.ar.layer_kv(chunk_tokens(prefix, codes, 0, frames))
    out = {}
    for label, nar in (("bf16", eng.nar), ("w8a8", nar8)):
        r = ChunkRenderer(nar, kv, frames)
        r.velocity(noise.to("cuda", nar.dtype), 20.0)  # eager warm-up (kernels, autotuning)
        torch.cuda.synchronize()
        best = None
        for _ in range(2):
            sec, lat, _ = B._timed(lambda: solve(r, noise, 32))
            best = sec if best is None else min(best, sec)
        out[label] = (best, lat, r)
    (tb, lb, rb), (t8, l8, r8) = out["bf16"], out["w8a8"]
    rel = ((l8.float() - lb.float()).norm() / lb.float().norm()).item()
    row(f"NAR int8 file {frames} frames, 32 steps, W8A8 vs bf16 linears (s)", t8, tb, "s",
        f"graphed velocity, attention {rb.attention}; latents rel. L2 W8A8 vs bf16 {rel:.2e}; best of 2")
    if ode:
        ref_s, ref, _ = B._timed(lambda: B._midpoint_fp32_state(rb, noise, 256))
        for label, lat in (("bf16", lb), ("w8a8", l8)):
            e = ((lat.float() - ref).norm() / ref.norm()).item()
            row(f"NAR ODE error, midpoint 32 steps, {label} linears vs midpoint-256 fp32 state, bf16 (rel. L2)", e,
                None, "", f"reference {ref_s:.1f} s")
    rb.close()
    r8.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=5371)
    ap.add_argument("--ode", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--checkpoint", default=CKPT)
    ap.add_argument("--shapes-only", action="store_true", help="only part 1, on random codes (no checkpoint)")
    args = ap.parse_args()
    if args.shapes_only:
        print(torch.cuda.get_device_name(), "· torch", torch.__version__, flush=True)
        shapes_part(None, args.frames + 2)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(), "rows": ROWS}, f, indent=1)
        return
    if not os.path.exists(args.checkpoint):
        from yue2_core.weights.synthetic import write_synthetic_checkpoint
        t = time.perf_counter()
        write_synthetic_checkpoint(args.checkpoint, profile="full", fmt="int8", device="cuda")
        print(f"wrote {args.checkpoint} in {time.perf_counter() - t:.0f} s", flush=True)
    print(torch.cuda.get_device_name(), "· torch", torch.__version__, flush=True)
    os.environ.pop("YUE2_NAR_LINEARS", None)
    eng = B.load(args.checkpoint, parts=("ar", "nar"))
    from yue2_core.weights.checkpoint import load_nar
    os.environ["YUE2_NAR_LINEARS"] = "w8a8"
    nar8 = load_nar(eng.info, "cuda", eng.nar.dtype)
    os.environ.pop("YUE2_NAR_LINEARS")
    shapes_part(nar8, args.frames + 2)
    solve_part(eng, nar8, args.frames, args.ode)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": ROWS}, f, indent=1)


if __name__ == "__main__":
    with torch.no_grad():
        main()
