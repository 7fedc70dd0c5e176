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
    producers_part(mods, m)


def producers_part(mods, m):
    """Stop 52: the producers writing the codes (add+RMSNorm → qkv / gate_up codes, SiLU·up → down codes) against
    the bf16 producers (what the bf16 linears need) and the bf16 producers + the separate quantizer."""
    from yue2_core.fast import fused, w8a8
    x = (torch.randn(1, m, 2048, device="cuda") * 2).to(torch.bfloat16)
    d = torch.randn(1, m, 2048, device="cuda").to(torch.bfloat16)
    w = torch.ones(2048, device="cuda", dtype=torch.bfloat16)
    gu = torch.randn(m, 12288, device="cuda").to(torch.bfloat16)
    t_n = timed_ms(lambda: fused.add_rmsnorm(x, d, w, 1e-6))
    t_nq = timed_ms(lambda: w8a8.add_rmsnorm_quantize(x, d, w, 1e-6))
    t_napart = timed_ms(lambda: w8a8.quantize_rows(fused.add_rmsnorm(x, d, w, 1e-6)[1].reshape(m, 2048), 256))
    t_s = timed_ms(lambda: fused.silu_mul(gu))
    t_sq = timed_ms(lambda: w8a8.silu_mul_quantize(gu))
    t_sapart = timed_ms(lambda: w8a8.quantize_rows(fused.silu_mul(gu), 256))
    row(f"NAR add+RMSNorm [{m}×2048] writing W8A8 codes vs writing bf16 (ms)", t_nq, t_n, "ms",
        f"bf16 + separate quantizer {t_napart:.3f} ms")
    row(f"NAR SiLU·up [{m}×6144] writing W8A8 codes vs writing bf16 (ms)", t_sq, t_s, "ms",
        f"bf16 + separate quantizer {t_sapart:.3f} ms")
    h = (torch.randn(m, 2048, device="cuda")).to(torch.bfloat16)
    t_oq = timed_ms(lambda: w8a8.quantize_rows(h, 256))
    gemms = 0.0
    for mod in mods.values():
        codes = torch.zeros(m, mod.in_features, dtype=torch.int8, device="cuda")
        sc = torch.ones(m, device="cuda")
        s = mod.weight_scale.reshape(-1).float().contiguous()
        gemms += timed_ms(lambda: w8a8.gemm(codes, sc, mod.weight, s, None))
    bf = 0.0
    for mod in mods.values():
        wt = mod.dequantized(torch.bfloat16)
        xi = torch.zeros(m, mod.in_features, device="cuda", dtype=torch.bfloat16)
        bf += timed_ms(lambda: torch.nn.functional.linear(xi, wt))
    ours = 2 * t_nq + t_sq + t_oq + gemms
    base = 2 * t_n + t_s + bf
    row("NAR one layer, producers + products: W8A8 with producers vs bf16 linears (ms)", ours, base, "ms",
        f"2 norms + SiLU·up + o quantizer ({t_oq:.3f}) + 4 int8 GEMMs ({gemms:.3f}); W8A8 with the quantizer apart "
        f"{2 * t_napart + t_sapart + t_oq + gemms:.3f} ms; × 28 × 64: {(base - ours) * 28 * 64 / 1000:.2f} s a song "
        f"saved")


def solve_part(eng, nar8, frames, ode):
    from yue2_core.nar import ChunkRenderer, chunk_tokens, solve, song_noise
    prefix = B.prompt_ids(2000, "semantic")
    codes = torch.randint(0, 32768, (frames,), generator=torch.Generator().manual_seed(0)).tolist()
    noise = song_noise(frames, 1)
    kv = eng.ar.layer_kv(chunk_tokens(prefix, codes, 0, frames))
    from yue2_core import nar as N
    st = noise.to("cuda", torch.bfloat16)
    eager = {}
    for producers in (True, False, True):  # one eager velocity each way, twice with the producers
        N.W8A8_PRODUCERS = producers
        eager.setdefault(producers, []).append(ChunkRenderer(nar8, kv, frames, graph=False).velocity(st, 0.3))
    v1, v2, va = eager[True][0], eager[True][1], eager[False][0]
    print(f"  one eager W8A8 velocity: producers twice equal {torch.equal(v1, v2)}; producers vs apart equal "
          f"{torch.equal(v1, va)} (rel. L2 {((v1.float() - va.float()).norm() / va.float().norm()).item():.1e})",
          flush=True)
    for producers in (True, False):  # the graphed velocity (warm-up, capture, replay) against the eager one
        N.W8A8_PRODUCERS = producers
        r = ChunkRenderer(nar8, kv, frames)
        got = [r.velocity(st, 0.3) for _ in range(3)]
        want = eager[producers][0]
        print(f"  producers {producers}: graphed calls equal to eager: {[torch.equal(g, want) for g in got]} "
              f"(rel. L2 {[round(((g.float() - want.float()).norm() / want.float().norm()).item(), 6) for g in got]})"
              f"; graphed: {r.graphed}", flush=True)
        r.close()
    out = {}
    for label, nar, producers in (("bf16", eng.nar, True), ("w8a8", nar8, True), ("w8a8-apart", nar8, False)):
        N.W8A8_PRODUCERS = producers  # read while the velocity is captured (stop 52: codes written by producers)
        r = ChunkRenderer(nar, kv, frames)
        r.velocity(noise.to("cuda", nar.dtype), 20.0)  # eager warm-up (kernels, autotuning)
        torch.cuda.synchronize()
        best, lats = None, []
        for _ in range(2):
            sec, lat, _ = B._timed(lambda: solve(r, noise, 32))
            best = sec if best is None else min(best, sec)
            lats.append(lat)
        out[label] = (best, lat, r)
        print(f"  {label}: the two solves' latents equal: {torch.equal(*lats)}", flush=True)
    N.W8A8_PRODUCERS = True
    for label, nar in (("bf16", eng.nar), ("w8a8", nar8)):  # a second renderer of the same NAR: the same latents?
        r2 = ChunkRenderer(nar, kv, frames)
        again = solve(r2, noise, 32)
        print(f"  {label}: a second renderer's solve equal to the first's: {torch.equal(again, out[label][1])}",
              flush=True)
        r2.close()
    (tb, lb, rb), (t8, l8, r8), (ta, la, ra) = out["bf16"], out["w8a8"], out["w8a8-apart"]
    rel = ((l8.float() - lb.float()).norm() / lb.float().norm()).item()
    rel_a = ((l8.float() - la.float()).norm() / la.float().norm()).item()
    row(f"NAR int8 file {frames} frames, 32 steps, W8A8 (producers write codes) vs bf16 linears (s)", t8, tb, "s",
        f"graphed velocity, attention {rb.attention}; latents rel. L2 W8A8 vs bf16 {rel:.2e}; best of 2; "
        f"W8A8 with the quantizer apart {ta:.3f} s, its latents equal: {torch.equal(l8, la)} (rel. L2 {rel_a:.1e})")
    if ode:
        ref_s, ref, _ = B._timed(lambda: B._midpoint_fp32_state(rb, noise, 256))
        for label, lat in (("bf16", lb), ("w8a8", l8)):
            e = ((lat.float() - ref).norm() / ref.norm()).item()
            row(f"NAR ODE error, midpoint 32 steps, {label} linears vs midpoint-256 fp32 state, bf16 (rel. L2)", e,
                None, "", f"reference {ref_s:.1f} s")
    for r in (rb, r8, ra):
        r.close()


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
    os.environ["YUE2_NAR_LINEARS"] = "bf16"  # the bf16 layers (not the default "auto", W8A8 on Hopper since stop 53)
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
