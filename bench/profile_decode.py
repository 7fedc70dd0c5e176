"""Where a decode step's time goes (CUDA): graph replay time per token vs the sum of its kernels' GPU time, the
kernel count, and the kernels ranked by GPU time — for each decode configuration given.

    python bench/profile_decode.py --checkpoint /tmp/yue2bench/yue2_full_bf16.safetensors [--rows 1] [--top 15]

The checkpoint is any YuE2 all-in-one file (bench/bench.py writes full-size synthetic ones to /tmp/yue2bench).
Configurations: the default fused step, the attention merged by a separate kernel, int8 inputs rotated by cuBLAS,
the default without programmatic dependent launch, library GEMVs; with --gemv-table a GEMV configuration file too,
with --all also the unfused torch-ops step; with --l2 SPEC[@BLOCKS:KB] (repeatable) the step with that L2 weight
prefetch plan (YUE2_L2_PREFETCH, fast/l2_prefetch.py), --only-l2 for the default and those alone.
Kernel times come from torch.profiler on eager steps (same kernels as the graph); the gap between the replay time
and the kernel sum is launch/idle time that only fewer or longer kernels remove.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from yue2_core.fast import decode as fd  # noqa: E402
from yue2_core.protocol import Sampling  # noqa: E402


def _dev_time(evt) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(evt, name):
            return float(getattr(evt, name))
    return 0.0


SWITCHES = ("YUE2_DECODE_ATTN", "YUE2_GEMV", "YUE2_PDL", "YUE2_GEMV_PRE", "YUE2_INT8_ROT", "YUE2_INT8_DOT",
            "YUE2_ATTN_MERGE",
            "YUE2_GEMV_TABLE", "YUE2_SAMPLER", "YUE2_L2_PREFETCH", "YUE2_L2_PREFETCH_GRID")


def kernel_gaps(spans, steps: int, top: int = 8):
    """Idle time between the kernels of `steps` graph replays: spans = [(name, start µs, end µs)] of every kernel.
    Sorted by start, a gap is the time from the latest end so far to the next start (overlapping kernels — PDL, a
    side branch — leave none). Returns (idle ms a step, [(before, after, gaps a step, ms a step)] largest first), the
    gap charged to the kernel that ended last before it and the kernel that started after it."""
    idle, pairs = 0.0, {}
    latest_end, latest_name = None, None
    for name, start, end in sorted(spans, key=lambda s: (s[1], s[2])):
        if latest_end is not None and start > latest_end:
            gap = start - latest_end
            idle += gap
            n, t = pairs.get((latest_name, name), (0, 0.0))
            pairs[(latest_name, name)] = (n + 1, t + gap)
        if latest_end is None or end >= latest_end:
            latest_end, latest_name = end, name
    ranked = sorted(((a, b, n / steps, t / 1e3 / steps) for (a, b), (n, t) in pairs.items()),
                    key=lambda r: r[3], reverse=True)
    return idle / 1e3 / steps, ranked[:top]


def replay_gaps(graph, steps: int, top: int) -> list[str]:
    """Lines telling where a graph replay's idle time lies (`kernel_gaps` of `steps` replays traced by torch.profiler)."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            graph.replay()
        torch.cuda.synchronize()
    spans = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start]
    if not spans:
        return ["   replay trace: the profiler saw no kernels inside the graph replays"]
    first = min(s[1] for s in spans)
    last = max(s[2] for s in spans)
    idle, ranked = kernel_gaps(spans, steps, top)
    lines = [f"   replay trace: {len(spans) / steps:.0f} kernels a step, span {(last - first) / 1e3 / steps:.3f} ms a "
             f"step, idle between kernels {idle:.3f} ms a step; largest gaps (before → after, gaps a step, ms a step):"]
    return lines + [f"     {a[:44]:44s} → {b[:44]:44s} {n:5.1f} {ms:7.4f}" for a, b, n, ms in ranked]


def profile(ar, rows: int, prompt: int, label: str, top: int, fused: bool, env: dict, gaps: bool = False):
    for key in SWITCHES:
        os.environ.pop(key, None)
    os.environ.update(env)
    s = Sampling(min_tokens=256, max_tokens=256)
    ids = [151643] + [1000 + i % 5000 for i in range(prompt - 2)] + [151851]
    dec = fd.PhaseDecoder(ar, [ids] * rows, s, list(range(1, rows + 1)), "semantic", fused=fused)
    with torch.inference_mode():
        dec._allocate()
        dec._prefill()
        attn_len = min(dec.capacity, -(-(prompt + 64) // fd.BUCKET) * fd.BUCKET)
        graph = dec._graph(attn_len)
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
        n = 100
        t = time.perf_counter()
        for _ in range(n):
            graph.replay()
        torch.cuda.synchronize()
        replay_ms = (time.perf_counter() - t) / n * 1e3
        steps = 10
        gap_lines = replay_gaps(graph, steps, top) if gaps else []
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                dec._step(attn_len)
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    positions = int(dec.pos.max().item()) + 1  # cache positions the attention actually reads (≤ attn_len)
    busy_ms = sum(e.device_time if hasattr(e, "device_time") else e.cuda_time for e in kernels) / 1e3 / steps
    print(f"\n== {label}: rows={rows}, prompt {prompt}, attention length bucket {attn_len}")
    print(f"   graph replay {replay_ms:.3f} ms/step ({rows * 1e3 / replay_ms:.0f} tok/s total); kernels "
          f"{len(kernels) / steps:.0f} per step, GPU-busy {busy_ms:.3f} ms/step; idle/launch "
          f"{max(0.0, replay_ms - busy_ms):.3f} ms/step")
    avgs = sorted(prof.key_averages(), key=_dev_time, reverse=True)[:top]
    print(f"   {'kernel':70s} {'calls/step':>10s} {'ms/step':>8s}")
    for e in avgs:
        print(f"   {e.key[:70]:70s} {e.count / steps:10.1f} {_dev_time(e) / 1e3 / steps:8.3f}")
    for line in gap_lines:
        print(line)
    if fused and (not env or "YUE2_L2_PREFETCH" in env or "YUE2_INT8_DOT" in env):
        bandwidth_table(ar, rows, positions, prof, steps, dec.slice)
    dec.release()
    return replay_ms, busy_ms


STREAM_TBS = 3.5  # the issue's target for streaming weights (≈ 80 % of the H200's 4.8 TB/s; performance.md §2.3)


def _weight_bytes(module) -> int:
    """Bytes a decode step reads from one linear: bf16 weight, or int8 codes + fp32 row scales."""
    total = module.weight.numel() * module.weight.element_size()
    scale = getattr(module, "weight_scale", None)
    return total + (scale.numel() * scale.element_size() if scale is not None else 0)


def bandwidth_table(ar, rows: int, positions: int, prof, steps: int, sl) -> None:
    """Bandwidth achieved per kernel class of one decode step, and the fixed cost per launch it implies: the GEMVs
    stream every layer linear and the phase's LM-head rows once per step; the attention reads K and V of every layer
    for `positions` cache positions per row (114,688 B per position at full size, performance.md §2.1). "fixed
    µs/launch" = (measured − bytes / 3.5 TB/s) / launches: what a kernel costs beyond moving its bytes at the issue's
    streaming target — the part that only fewer launches (a persistent kernel) remove."""
    layers = ar.model.layers
    lin = sum(_weight_bytes(m) for l in layers for m in (l.self_attn.qkv_proj, l.self_attn.o_proj,
                                                         l.mlp.gate_up_proj, l.mlp.down_proj))
    head = ar.model.lm_head
    per_row = _weight_bytes(head) / head.weight.shape[0]
    gemv_bytes = lin + per_row * (sl.stop - sl.start)
    d = ar.dims
    kv_bytes = len(layers) * 2 * d.kv_heads * d.head_dim * 2 * positions * rows
    by_name: dict = {}
    for e in prof.key_averages():
        by_name[e.key] = (e.count / steps, _dev_time(e) / 1e3 / steps)
    print(f"   bandwidth per kernel class ({positions} cache positions × {rows} rows; target {STREAM_TBS} TB/s"
          + ("; the attention's bytes count every row's prompt, which a shared prefix reads once" if rows > 1 else "")
          + "):")
    print(f"   {'class':22s} {'launches':>9s} {'ms/step':>8s} {'MB/step':>9s} {'TB/s':>6s} {'ms at target':>13s} "
          f"{'fixed µs/launch':>16s}")
    total_ms = total_target = 0.0
    for cls, names, nbytes in (("GEMV (weights)", ("gemv_kernel", "gemv_q_kernel"), gemv_bytes),
                               ("attention (KV cache)",
                                ("attn_split_kernel", "attn_merge_kernel", "attn_shared_kernel"), kv_bytes),
                               ("add+RMSNorm", ("add_rmsnorm_kernel",), 0),
                               ("QK-norm+RoPE+KV store", ("qk_rope_kernel",), 0),
                               ("SiLU·up", ("silu_mul_kernel",), 0)):
        calls = sum(by_name.get(n, (0, 0))[0] for n in names)
        ms = sum(by_name.get(n, (0, 0))[1] for n in names)
        if not calls:
            continue
        target = nbytes / (STREAM_TBS * 1e12) * 1e3
        tbs = nbytes / (ms * 1e-3) / 1e12 if ms and nbytes else 0.0
        fixed = (ms - target) / calls * 1e3
        total_ms, total_target = total_ms + ms, total_target + target
        print(f"   {cls:22s} {calls:9.0f} {ms:8.3f} {nbytes / 1e6:9.1f} {tbs:6.2f} {target:13.3f} {fixed:16.2f}")
    print(f"   these classes: {total_ms:.3f} ms/step measured, {total_target:.3f} ms if they only streamed their bytes "
          f"at {STREAM_TBS} TB/s → {rows * 1e3 / max(total_target, 1e-9):.0f} tok/s bound for this part")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="/tmp/yue2bench/yue2_full_bf16.safetensors")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=2000, help="prompt tokens (sets the attention length)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--all", action="store_true", help="also profile the unfused torch-ops step")
    ap.add_argument("--gemv-table", action="append", default=[],
                    help="also profile with these GEMV configurations (YUE2_GEMV_TABLE); repeatable")
    ap.add_argument("--l2", action="append", default=[], metavar="SPEC[@BLOCKS:KB]",
                    help="also profile with this YUE2_L2_PREFETCH spec (and grid); repeatable")
    ap.add_argument("--gaps", action="store_true",
                    help="also trace graph replays and rank the idle gaps between kernels by the kernels around them")
    ap.add_argument("--only-l2", action="store_true",
                    help="profile the default and the --l2, --gemv-table and --attn-cfg variants only")
    ap.add_argument("--attn-merge", action="store_true",
                    help="profile the default and the splits merged by a separate kernel (YUE2_ATTN_MERGE=kernel) only")
    ap.add_argument("--attn-cfg", action="append", default=[], metavar="BL,WARPS,STAGES,PER_SM",
                    help="also profile with this decode-attention launch configuration (fused.ATTN_CONFIG replaced "
                         "in this process; repeatable; bench/attn_plan.py times them outside the step)")
    ap.add_argument("--gemv-pre", action="store_true",
                    help="profile the default and the GEMVs loading their first weight tile before the PDL wait "
                         "(YUE2_GEMV_PRE=1) only")
    ap.add_argument("--int8-dot", action="store_true",
                    help="profile the default and the int8 × int8 products (YUE2_INT8_DOT=int8) only")
    args = ap.parse_args()
    # break-it findings: rows, prompt and top were not checked, and --attn-cfg had no upper bounds (64 warps would
    # have failed inside Triton after the checkpoint loaded; a huge BL or PER_SM was quietly fitted or capped)
    if not 1 <= args.rows <= 64:
        ap.error(f"--rows takes 1 to 64 rows; got {args.rows}")
    if not 2 <= args.prompt <= 24000:
        ap.error(f"--prompt takes 2 to 24,000 tokens (the context is 24,576 with 256 decoded after it); got "
                 f"{args.prompt}")
    if args.top < 1:
        ap.error(f"--top takes a positive count of kernels to list; got {args.top}")
    from yue2_core.fast import fused as fused_mod
    attn_cfgs = []
    for spec in args.attn_cfg:
        try:
            bl, warps, stages, per_sm = (int(v) for v in spec.split(","))
            if (not (16 <= bl <= 256 and 1 <= warps <= 32 and 1 <= stages <= 8 and 1 <= per_sm <= 32)
                    or bl & (bl - 1) or warps & (warps - 1)):
                raise ValueError
        except ValueError:
            ap.error(f"--attn-cfg takes BL,WARPS,STAGES,PER_SM: BL a power of two from 16 to 256, warps a power of "
                     f"two from 1 to 32, stages 1–8, programs per SM 1–32 (e.g. 64,2,3,2); got {spec!r}")
        attn_cfgs.append(fused_mod.AttnConfig(bl=bl, warps=warps, stages=stages, per_sm=per_sm))
    if not torch.cuda.is_available():
        sys.exit("profile_decode.py needs a CUDA GPU")
    from yue2_core.pipeline import YuE2Engine
    eng = YuE2Engine.load(args.checkpoint, device="cuda", parts=("ar",))
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · {os.path.basename(args.checkpoint)}")
    variants = [
        ("default: fused + split attention + split-K GEMV + PDL (int8: inputs rotated by the producers) + sampling "
         "tail in kernels", True, {}),
        ("default with the PyTorch sampling tail (previous default)", True, {"YUE2_SAMPLER": "torch"}),
        ("attention splits merged by a separate kernel", True, {"YUE2_ATTN_MERGE": "kernel"}),
        ("int8 inputs rotated by cuBLAS", True, {"YUE2_INT8_ROT": "cublas"}),
        ("int8 × int8 products on pair codes (YUE2_INT8_DOT=int8)", True, {"YUE2_INT8_DOT": "int8"}),
        ("default without PDL", True, {"YUE2_PDL": "0"}),
        ("GEMVs loading their first weight tile before the PDL wait (YUE2_GEMV_PRE=1)", True,
         {"YUE2_GEMV_PRE": "1"}),
        ("fused + split attention, library GEMV", True, {"YUE2_GEMV": "0", "YUE2_PDL": "0"})]
    if args.only_l2:
        variants = variants[:1]
    if args.attn_merge:
        variants = [v for v in variants if not v[2] or v[2].get("YUE2_ATTN_MERGE")]
    if args.gemv_pre:
        variants = [v for v in variants if not v[2] or v[2].get("YUE2_GEMV_PRE")]
    if args.int8_dot:
        variants = [v for v in variants if not v[2] or v[2].get("YUE2_INT8_DOT")]
    for spec in args.l2:
        spec_, _, grid_ = spec.partition("@")
        env = {"YUE2_L2_PREFETCH": spec_, **({"YUE2_L2_PREFETCH_GRID": grid_} if grid_ else {})}
        variants.append((f"L2 prefetch {spec}", True, env))
    for table in args.gemv_table:
        variants.append((f"GEMV table {os.path.basename(table)}", True, {"YUE2_GEMV_TABLE": table}))
    if args.all:
        variants.append(("torch ops", False, {"YUE2_DECODE_ATTN": "torch", "YUE2_GEMV": "0", "YUE2_PDL": "0"}))
    for cfg in attn_cfgs:
        variants.append((f"attention bl {cfg.bl}, {cfg.warps} warps, {cfg.stages} stages, {cfg.per_sm} programs/SM",
                         True, {"__attn_cfg": cfg}))
    saved = fused_mod.ATTN_CONFIG
    for label, fused, env in variants:
        env = dict(env)
        fused_mod.ATTN_CONFIG = env.pop("__attn_cfg", saved)  # decode_attention reads it at each call
        try:
            profile(eng.ar, args.rows, args.prompt, label, args.top, fused, env, args.gaps)
        finally:
            fused_mod.ATTN_CONFIG = saved
    for key in SWITCHES:
        os.environ.pop(key, None)

if __name__ == "__main__":
    main()
