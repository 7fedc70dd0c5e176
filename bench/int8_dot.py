"""int8 × int8 decode products (`YUE2_INT8_DOT=int8`: the activation as int8 pair codes, `fast.gemv.QAct`, one
int8 tensor-core product per 256-group, `gemv.gemv_q`) against the W8A16 products that convert every int8 code to
bf16 (`YUE2_INT8_DOT=convert`), on a CUDA GPU.

    python bench/int8_dot.py [--checkpoint /tmp/yue2bench/yue2_full_int8.safetensors] [--json out.json]
                             [--skip-shapes] [--skip-decode]

1. Per AR weight shape and row count (1, 2, 8): µs per call of each product — 28 calls with their own weights in
   one CUDA graph, as in a step (`bench/gemv_sweep.py`'s `timed`) — for the W8A16 split-K GEMV at its table
   configuration and for the int8 × int8 product over a sweep (block, split, stages, which operand the weights
   are); the best configuration, its weight bandwidth and the error of both against fp64.
2. The decode step on the full-size int8 checkpoint (written by bench/bench.py's `make_checkpoints` when absent):
   graph replay per step at 1 row, the CFG pair and 8 rows (2,000-token prompt, 2,048-position attention bucket),
   both modes in one process; first-step logits of both against the unfused torch step; greedy 256-token streams of
   both modes compared with each other and with the unfused step.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from gemv_sweep import SHAPES, timed  # noqa: E402  (bench/gemv_sweep.py: the AR shapes, graph timing)
from yue2_core.fast import gemv as G  # noqa: E402

RESULTS: dict = {"shapes": [], "decode": [], "numerics": []}


def q_configs(n: int, k: int):
    base = G.choose_q(n, k)[0]
    splits = sorted({base.split, max(1, base.split // 2), base.split * 2, 1 if n > 8192 else 4})
    for bn in (32, 64, 128):
        for split in splits:
            if k % (256 * split):
                continue
            for stages in (3, 4):
                for swap in (False, True):
                    yield G.Config(bn=bn, bk=256, split=split, stages=stages), swap


def shapes_part(layers: int = 28):
    from yue2_core.weights.quant import quantize, rotate as rot_ref
    print(f"\n== products per shape: µs per call ({layers} weight sets per graph), weight TB/s, rel. error vs fp64")
    print(f"{'shape':10s} {'rows':>4s} {'W8A16 µs':>9s} {'TB/s':>5s} {'err':>8s} | {'int8×int8 µs':>12s} "
          f"{'TB/s':>5s} {'err':>8s} {'speed-up':>8s}  best configuration")
    for name, (n, k) in SHAPES.items():
        torch.manual_seed(0)
        ws = []
        for _ in range(layers):
            q, s = quantize(torch.randn(n, k, device="cuda") * 0.02)
            ws.append((q.contiguous(), s.view(-1).float().contiguous()))
        wbytes = n * k + 4 * n
        for m in (1, 2, 8):
            x = torch.randn(m, k, device="cuda").bfloat16()
            xr, pack = G.rotate(x, quant=True)
            xr64 = rot_ref(x.double().cpu()).cuda()
            q0, s0 = ws[0]
            exact = (xr64 @ q0.double().T) * s0.double()
            old_cfg = G.usable(G.choose(n, k, m, True), n, k, m, True, x.device)
            t_old = timed(lambda i: G.gemv(xr, ws[i][0], ws[i][1], partial=True), layers)
            e_old = ((G.gemv(xr, q0, s0).double() - exact).norm() / exact.norm()).item()
            best = None
            for cfg, swap in q_configs(n, k):
                try:
                    t = timed(lambda i: G.gemv_q(pack, ws[i][0], ws[i][1], partial=True, cfg=cfg, swap=swap), layers)
                except Exception as exc:  # a configuration Triton refuses (shared memory, registers)
                    print(f"   {name} m={m} {cfg} swap={swap}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                if best is None or t < best[0]:
                    best = (t, cfg, swap)
            t_new, cfg, swap = best
            y = G.gemv_q(pack, q0, s0, cfg=cfg, swap=swap)
            e_new = ((y.double() - exact).norm() / exact.norm()).item()
            tb = lambda us: wbytes / (us * 1e-6) / 1e12  # noqa: E731
            print(f"{name:10s} {m:4d} {t_old:9.2f} {tb(t_old):5.2f} {e_old:8.1e} | {t_new:12.2f} {tb(t_new):5.2f} "
                  f"{e_new:8.1e} {t_old / t_new:7.2f}×  bn={cfg.bn} split={cfg.split} stages={cfg.stages} "
                  f"swap={swap} (W8A16: bn={old_cfg.bn} split={old_cfg.split} stages={old_cfg.stages})")
            RESULTS["shapes"].append({"shape": name, "n": n, "k": k, "rows": m, "w8a16_us": t_old,
                                      "int8_us": t_new, "w8a16_err": e_old, "int8_err": e_new,
                                      "cfg": {"bn": cfg.bn, "split": cfg.split, "stages": cfg.stages,
                                              "warps": cfg.warps}, "swap": swap})
        ws = None  # noqa: F841 (frees the weights before the next shape)
        torch.cuda.empty_cache()


def _decoder(ar, rows, cfg_pair: bool, mode: str, fused=True, s=None):
    from yue2_core.fast import decode as fd
    from yue2_core.protocol import Sampling
    os.environ["YUE2_INT8_DOT"] = mode
    s = s or Sampling(min_tokens=256, max_tokens=256)
    ids = [151643] + [1000 + (7 * i) % 5000 for i in range(1998)] + [151851]
    neg = [151643] + [2000 + i for i in range(38)] + [151851]
    return fd.PhaseDecoder(ar, [ids] * rows, s, list(range(1, rows + 1)), "semantic", fused=fused,
                           cfg_scale=1.5 if cfg_pair else 1.0, negatives=[neg] * rows if cfg_pair else None)


def replay_ms(ar, rows, cfg_pair, mode) -> tuple[float, dict]:
    from yue2_core.fast import decode as fd
    dec = _decoder(ar, rows, cfg_pair, mode)
    with torch.inference_mode():
        dec._allocate()
        dec._prefill()
        attn_len = min(dec.capacity, -(-(2000 + 64) // fd.BUCKET) * fd.BUCKET)
        graph = dec._graph(attn_len)
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
        n = 200
        t = time.perf_counter()
        for _ in range(n):
            graph.replay()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) / n * 1e3
    info = {"int8_dot": dec.int8_dot, "fallback": dec.int8_dot_error}
    dec.release()
    return ms, info


def first_logits(ar, mode, fused=True):
    dec = _decoder(ar, 1, False, mode, fused=fused)
    with torch.inference_mode():
        dec._allocate()
        dec._prefill()
        dec._forward_fused(dec.capacity) if fused else dec._forward(dec.capacity)
        out = dec.logits.float().clone()
    dec.release()
    return out


def greedy(ar, mode, fused=True, n=256):
    from yue2_core.protocol import Sampling
    s = Sampling(temperature=0.0, min_tokens=n, max_tokens=n)
    dec = _decoder(ar, 1, False, mode, fused=fused, s=s)
    return list(dec.run()[0].tokens)


def decode_part(path: str):
    from yue2_core.pipeline import YuE2Engine
    if not os.path.exists(path):
        import bench as B  # bench/bench.py: the full-size synthetic checkpoints
        B.make_checkpoints(os.path.dirname(path), fmts=("int8",))
    eng = YuE2Engine.load(path, device="cuda", parts=("ar",))
    ar = eng.ar
    print(f"\n== decode step, {os.path.basename(path)}: graph replay per step (2,000-token prompt)")
    print(f"{'rows':22s} {'convert ms':>10s} {'tok/s':>7s} | {'int8×int8 ms':>12s} {'tok/s':>7s} {'gain':>6s}")
    for label, rows, cfg_pair in (("batch 1", 1, False), ("CFG pair (2 rows)", 1, True), ("8 rows", 8, False),
                                  ("2 rows", 2, False), ("4 rows", 4, False)):
        r = rows * (2 if cfg_pair else 1)
        songs = rows
        ms_c, _ = replay_ms(ar, rows, cfg_pair, "convert")
        ms_q, info = replay_ms(ar, rows, cfg_pair, "int8")
        tc, tq = songs * 1e3 / ms_c, songs * 1e3 / ms_q
        print(f"{label:22s} {ms_c:10.3f} {tc:7.0f} | {ms_q:12.3f} {tq:7.0f} {tq / tc:5.2f}×  {info}")
        RESULTS["decode"].append({"rows": label, "decoder_rows": r, "convert_ms": ms_c, "int8_ms": ms_q,
                                  "convert_tok_s": tc, "int8_tok_s": tq, "int8_info": info})
    ref = first_logits(ar, "convert", fused=False)
    for mode in ("convert", "int8"):
        got = first_logits(ar, mode)
        rel = ((got - ref).norm() / ref.norm()).item()
        print(f"first-step logits, fused {mode} vs unfused torch step: rel. error {rel:.2e}")
        RESULTS["numerics"].append({"what": f"logits fused {mode} vs unfused", "rel": rel})
    streams = {m: greedy(ar, m) for m in ("convert", "int8")}
    streams["unfused"] = greedy(ar, "convert", fused=False)

    def agree(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    for a, b in (("int8", "convert"), ("int8", "unfused"), ("convert", "unfused")):
        same = agree(streams[a], streams[b])
        print(f"greedy streams {a} vs {b}: first {same} of {len(streams[a])} tokens equal")
        RESULTS["numerics"].append({"what": f"greedy {a} vs {b}", "equal_prefix": same, "tokens": len(streams[a])})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="/tmp/yue2bench/yue2_full_int8.safetensors")
    ap.add_argument("--json", default="")
    ap.add_argument("--skip-shapes", action="store_true")
    ap.add_argument("--skip-decode", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("int8_dot.py needs a CUDA GPU")
    import triton
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · triton {triton.__version__} · commit "
          f"{os.environ.get('YUE2_COMMIT', '?')}")
    RESULTS["machine"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                          "triton": triton.__version__, "commit": os.environ.get("YUE2_COMMIT")}
    if not args.skip_shapes:
        shapes_part()
    if not args.skip_decode:
        decode_part(args.checkpoint)
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=1))


if __name__ == "__main__":
    main()
