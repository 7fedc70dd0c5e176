"""The one-launch decoder layer (`yue2_core.fast.persistent`, YUE2_LAYER_KERNEL) against the per-kernel fused step,
in the same process on full-size synthetic weights (CUDA): correctness (first-step logits, greedy token streams)
and speed (CUDA-graph replay per step, and a whole decode phase through `PhaseDecoder.run`).

    python bench/layer_kernel.py [--workdir /tmp/yue2bench] [--fmts int8,bf16] [--rows 1,2] [--prompt 2200]
        [--modes off,grid,phased,cuda] [--json OUT.json] [--diag] [--sweep] [--tiles JSON;JSON] [--phase-tiles JSON;JSON]

--diag: layer 0 alone against PyTorch modules, eager steps against "off" and the unfused torch step, phase times;
--sweep: each product phase alone over a few tilings (4 and 8 warps), then the grid mode with the fastest.

Prints a table: rows × format × mode → ms/step, tok/s, ratio to "off" (the per-kernel step of the same run),
greedy tokens equal to "off" out of 256 (random full-size weights: near ties part streams within a few tokens
even between "off" and the unfused torch step), logits rel. error after one decode step vs "off".
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from yue2_core.fast import decode as fd  # noqa: E402
from yue2_core.protocol import Sampling  # noqa: E402


def ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [151643] + torch.randint(0, 150000, (n - 2,), generator=g).tolist() + [151851]


def decoder(ar, rows: int, prompt: int, s: Sampling, mode: str):
    """A PhaseDecoder of bench mode `mode` ("cuda:pipe+fexp": YUE2_LAYER_KERNEL=cuda with its switches, through
    `cuda_switches`; diff review 58: --diag and the phase check set YUE2_LAYER_KERNEL=cuda:pipe, no kernel)."""
    os.environ["YUE2_LAYER_KERNEL"] = cuda_switches(mode)
    if rows == 2:  # a CFG pair: one song, its negative prompt
        return fd.PhaseDecoder(ar, [ids(prompt, 1)], s, [1], "semantic", negatives=[ids(prompt - 40, 2)],
                               cfg_scale=1.5)
    return fd.PhaseDecoder(ar, [ids(prompt, 1 + r) for r in range(rows)], s, list(range(1, rows + 1)), "semantic")


def replay_time(graph, n: int, warm: int = 1) -> float:
    """Seconds per replay of a CUDA graph over n replays, after `warm` untimed ones."""
    for _ in range(warm):
        graph.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n


STAMPS = ("qkv", "bar0", "attn", "bar1", "o", "bar2", "gate_up", "bar3", "down")


def cuda_switches(mode: str) -> str:
    """The YUE2_LAYER_KERNEL value of a bench mode ("cuda:…" variants are "cuda"); sets the variant's switches:
    "cuda:pipe+fexp" = YUE2_LAYER_CUDA_OPTS=pipe,fexp (`fast._layer_cuda.options`; "cuda:nopf" and other names
    that are no switch set none)."""
    from yue2_core.fast._layer_cuda import OPTIONS
    opts = [o for o in (mode.split(":", 1)[1].split("+") if ":" in mode else []) if o in OPTIONS]
    os.environ["YUE2_LAYER_CUDA_OPTS"] = ",".join(opts)
    return mode.split(":")[0]


def replay_ms(ar, rows, prompt, mode, n=200):
    s = Sampling(min_tokens=512, max_tokens=512)
    dec = decoder(ar, rows, prompt, s, mode)
    with torch.inference_mode():
        dec._allocate()
        dec._prefill()
        attn_len = min(dec.capacity, -(-(prompt + 64) // fd.BUCKET) * fd.BUCKET)
        graph = dec._graph(attn_len)
        graph.replay()
        first = dec.logits.float().clone()  # after one step from the same state and sampled token
        ms = replay_time(graph, n, warm=10) * 1e3
        if dec.layer_kernel is not None:
            dec.layer_kernel.check()
            if getattr(dec.layer_kernel, "timing", 0):  # block 0's clock: µs per layer between the stamps
                t = dec.layer_kernel.tim.view(-1, 16).double()
                dt = (t[:, 1:10] - t[:, :9]).mean(0) / 1e3
                gaps = (t[1:, 0] - t[:-1, 9]).mean() / 1e3
                print(f"  {mode} rows {rows} phase µs/layer (block 0): " + ", ".join(
                    f"{k} {v:.2f}" for k, v in zip(STAMPS, dt.tolist())) + f"; launch gap {gaps:.2f}; "
                      f"layer {((t[:, 9] - t[:, 0]).mean() / 1e3):.2f}")
                sub = torch.stack([t[:, 10] - t[:, 2], t[:, 11] - t[:, 10], t[:, 12] - t[:, 11],
                                   t[:, 13] - t[:, 12], t[:, 14] - t[:, 13]], 1).mean(0) / 1e3
                print(f"  {mode} rows {rows} attention item of block 0 (µs): " + ", ".join(
                    f"{k} {v:.2f}" for k, v in zip(("rope+new k/v", "flash loop", "partials", "fence+count",
                                                      "merge"), sub.tolist()))
                      + f"; block 0 merged in {int(t[:, 15].sum())} of {t.shape[0]} layers")
        return ms, first, dec.layer_mode, dec.layer_reason


def greedy(ar, rows, prompt, mode, n=256):
    s = Sampling(temperature=0.0, min_tokens=n, max_tokens=n)
    dec = decoder(ar, rows, prompt, s, mode)
    res = dec.run()
    return res[0].tokens, res[0].timing["decode_tokens_per_second"]


def diag(ar, rows, prompt, mode, steps=4):
    """Eager steps of "off" and `mode` side by side with the same fed tokens: per step the logits' rel. error and
    the first layer whose K/V cache (all positions so far) differs by more than 2e-2; then where the layer kernel's
    time goes (torch.profiler, phased mode: one launch per phase)."""
    s = Sampling(temperature=0.0, min_tokens=64, max_tokens=64)
    a, b = decoder(ar, rows, prompt, s, "off"), decoder(ar, rows, prompt, s, mode)
    c = fd.PhaseDecoder(ar, [ids(prompt, 1 + r) for r in range(rows)], s, list(range(1, rows + 1)), "semantic",
                        fused=False)
    with torch.inference_mode():
        c._allocate()
        c._prefill()
        for d in (a, b):
            d._allocate()
            d._prefill()
        for step in range(steps):
            for d in (a, b):
                d.tokens.fill_(151853 + 7 * step)
                d._forward_fused(a.capacity if step % 2 else min(a.capacity, -(-(prompt + 64) // fd.BUCKET) * fd.BUCKET))
            c.tokens.fill_(151853 + 7 * step)
            c._forward(a.capacity)
            c.pos.add_(1)
            torch.cuda.synchronize()
            ref = ((a.logits.float() - c.logits.float()).norm() / c.logits.float().norm()).item()
            print(f"  off vs unfused torch step: logits rel {ref:.2e}; {mode} vs unfused "
                  f"{((b.logits.float() - c.logits.float()).norm() / c.logits.float().norm()).item():.2e}")
            rel = ((a.logits.float() - b.logits.float()).norm() / a.logits.float().norm()).item()
            bad = []
            for i, (ka, kb, va, vb) in enumerate(zip(a.k, b.k, a.v, b.v)):
                hi = int(a.pos.max()) + 1
                ek = ((ka[..., :hi, :].float() - kb[..., :hi, :].float()).norm() / ka[..., :hi, :].float().norm()).item()
                ev = ((va[..., :hi, :].float() - vb[..., :hi, :].float()).norm() / va[..., :hi, :].float().norm()).item()
                if max(ek, ev) > 2e-2:
                    bad.append((i, round(ek, 4), round(ev, 4)))
            print(f"  diag {mode} rows {rows} step {step}: logits rel {rel:.2e}; layers with K/V off: {bad[:4]}")
            for d in (a, b):
                d.pos.add_(1)
        if b.layer_kernel is not None:
            b.layer_kernel.check()
            print(f"  kernel: {getattr(b.layer_kernel, 'n_regs', '?')} registers, "
                  f"{getattr(b.layer_kernel, 'shared', '?')} B shared, {b.layer_kernel.np} programs")
    if mode != "phased":
        return
    for tiles in TIMED_TILES:
        os.environ["YUE2_LAYER_TILES"] = tiles
        b = decoder(ar, rows, prompt, s, "phased")
        with torch.inference_mode():
            b._allocate()
            b._prefill()
            phase_times(b, tiles)
        os.environ.pop("YUE2_LAYER_TILES")


TIMED_TILES = ["{}"]


def phase_times(b, label):
    from torch.profiler import ProfilerActivity, profile
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            b._forward_fused(b.capacity)
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type.name == "CUDA" and "layer_kernel" in e.name]
    per = [0.0] * 5
    for j, e in enumerate(ev):
        per[j % 5] += e.device_time / 3 if hasattr(e, "device_time") else e.cuda_time / 3
    print(f"  {label}: phase µs per step (28 layers): " + ", ".join(f"{n} {v:.0f}" for n, v in
                                                           zip(("qkv", "attn", "o", "gate_up", "down"), per)))


def phase_check(ar, prompt, mode):
    """Layer 0 of one step through the layer kernel alone, each buffer against PyTorch modules on the same input:
    which phase is off (rel. errors; fp32 references of bf16 maths sit near 1e-3)."""
    import torch.nn.functional as F
    from yue2_core.layers import rope_cos_sin
    d = ar.dims
    s = Sampling(temperature=0.0, min_tokens=64, max_tokens=64)
    dec = decoder(ar, 1, prompt, s, mode)
    rel = lambda a, b: ((a.float().reshape(-1) - b.float().reshape(-1)).norm() / b.float().norm()).item()
    with torch.inference_mode():
        dec._allocate()
        dec._prefill()
        lk = dec.layer_kernel
        lk.layers = lk.layers[:1]
        layer = ar.model.layers[0]
        dec.tokens.fill_(151853)
        x0 = ar.model.embed_tokens(dec.tokens[:, None]).to(dec.dtype)
        attn_len = min(dec.capacity, -(-(prompt + 64) // fd.BUCKET) * fd.BUCKET)
        cos, sin = rope_cos_sin(dec.pos, d.head_dim, d.rope_theta)
        lk(x0.view(1, -1), cos, sin, dec.pos, attn_len)
        torch.cuda.synchronize()
        y = layer.input_layernorm(x0)
        out = {"qkv": rel(lk.qkv, layer.self_attn.qkv_proj(y))}
        c2, s2 = rope_cos_sin(dec.pos[:, None], d.head_dim, d.rope_theta)
        q, k, v = layer.self_attn.project(y, c2, s2)
        p = int(dec.pos[0])
        out["k@pos"] = rel(dec.k[0][0, :, p], k[0, 0])
        out["v@pos"] = rel(dec.v[0][0, :, p], v[0, 0])
        keys, values = dec.k[0][:, :, :p + 1], dec.v[0][:, :, :p + 1]
        qg = q[:, 0].reshape(1, d.kv_heads, d.heads // d.kv_heads, d.head_dim)
        att = (fd._scores(qg, keys) / d.head_dim ** 0.5).softmax(-1).to(dec.dtype)
        h = (att @ values).reshape(1, 1, d.hidden)
        o = layer.self_attn.o_proj(h)
        out["o"] = rel(lk.ob, o)
        x1 = x0 + o
        out["x"] = rel(lk.x, x1)
        gu = layer.mlp.gate_up_proj(layer.post_attention_layernorm(x1))
        g, u = gu.chunk(2, -1)
        act = F.silu(g) * u
        out["act"] = rel(lk.act, act)
        out["delta"] = rel(lk.delta, layer.mlp.down_proj(act))
        out["delta(own act)"] = rel(lk.delta, layer.mlp.down_proj(lk.act.view(1, 1, -1)))
        out["o(own h)"] = None
    print(f"  phase check {mode}: " + ", ".join(f"{k} {v:.2e}" for k, v in out.items() if v is not None))


SWEEP = {  # phase index → (key, candidate (bn, bk, st) tiles)
    0: ("qkv", [(32, 1024, 3), (32, 2048, 2), (16, 1024, 3), (64, 512, 3), (32, 512, 4), (16, 2048, 2)]),
    2: ("o", [(16, 1024, 2), (16, 2048, 2), (16, 512, 3), (32, 1024, 2), (16, 256, 4), (32, 512, 3)]),
    3: ("gu", [(16, 512, 3), (16, 1024, 2), (16, 1024, 3), (32, 512, 3), (16, 256, 4), (32, 256, 3)]),
    4: ("d", [(16, 1024, 3), (16, 2048, 2), (16, 512, 4), (32, 1024, 3), (16, 1024, 4), (32, 512, 3)]),
}


def phase_us(ar, prompt, tiles: dict, phase: int, n=20) -> float:
    """µs per layer of one phase alone (28 launches in a CUDA graph, replayed n times), phased mode."""
    os.environ["YUE2_LAYER_TILES"] = json.dumps(tiles)
    try:
        s = Sampling(temperature=0.0, min_tokens=64, max_tokens=64)
        dec = decoder(ar, 1, prompt, s, "phased")
        with torch.inference_mode():
            dec._allocate()
            dec._prefill()
            lk = dec.layer_kernel
            lk.only = phase
            from yue2_core.layers import rope_cos_sin
            x = ar.model.embed_tokens(dec.tokens[:, None]).to(dec.dtype).view(1, -1)
            cos, sin = rope_cos_sin(dec.pos, ar.dims.head_dim, ar.dims.rope_theta)
            attn_len = min(dec.capacity, -(-(prompt + 64) // fd.BUCKET) * fd.BUCKET)
            lk(x, cos, sin, dec.pos, attn_len)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                lk(x, cos, sin, dec.pos, attn_len)
            return replay_time(g, n) / len(lk.layers) * 1e6
    finally:
        os.environ.pop("YUE2_LAYER_TILES", None)


def sweep(ar, prompt, warps=(4, 8)) -> dict:
    """Each product phase alone over SWEEP's tiles (and the warps given): the fastest per phase → tiles dict."""
    best = {}
    for w in warps:
        for phase, (key, cands) in SWEEP.items():
            for bn, bk, st in cands:
                tiles = {f"bn_{key}": bn, f"bk_{key}": bk, f"st_{key}": st, "warps": w}
                try:
                    us = phase_us(ar, prompt, tiles, phase)
                except Exception as exc:
                    print(f"  sweep {key} {tiles} failed: {type(exc).__name__}: {str(exc)[:200]}")
                    continue
                print(f"  sweep {key:3} warps {w} bn {bn:3} bk {bk:5} st {st}: {us:6.2f} µs/layer")
                if (w, key) not in best or us < best[(w, key)][0]:
                    best[(w, key)] = (us, tiles)
    totals = {}
    for w in warps:
        tiles = {"warps": w}
        tot = 0.0
        for key in ("qkv", "o", "gu", "d"):
            if (w, key) in best:
                tiles.update({k: v for k, v in best[(w, key)][1].items() if k != "warps"})
                tot += best[(w, key)][0]
        totals[w] = (tot, tiles)
        print(f"  best with {w} warps: {tot:.1f} µs/layer of products: {json.dumps(tiles)}")
    w = min(totals, key=lambda k: totals[k][0])
    try:
        print(f"  attention phase alone: {phase_us(ar, prompt, totals[w][1], 1):.2f} µs/layer")
    except Exception as exc:
        print(f"  attention phase failed: {exc}")
    return totals[w][1]


def tiny_check(workdir: str, prompt: int = 300, n: int = 128):
    """Tiny synthetic model (bf16, int8), sharpened head as the GPU tests: greedy agreement of the per-kernel step
    ("off"), each layer kernel and the portable (unfused, eager) loop with one another, two rows; and per-step
    logits errors of eager steps with the same fed tokens."""
    from yue2_core.pipeline import YuE2Engine
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    agree = lambda a, b: next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    for fmt in ("bf16", "int8"):
        path = os.path.join(workdir, f"yue2_tiny_{fmt}.safetensors")
        if not os.path.exists(path):
            write_synthetic_checkpoint(path, profile="tiny", fmt=fmt, seed=0)
        eng = YuE2Engine.load(path, device="cuda", parts=("ar",))
        eng.wait_warm_up()
        head = eng.ar.model.lm_head
        (head.weight_scale if head.weight.dtype == torch.int8 else head.weight).data.mul_(40.0)
        rows = [ids(prompt, 1), ids(prompt - 3, 2)]
        s = Sampling(temperature=0.0, min_tokens=n, max_tokens=n)
        streams = {}
        for mode in ("off", "grid", "cuda", "portable"):
            os.environ["YUE2_LAYER_KERNEL"] = "off" if mode == "portable" else mode
            dec = fd.PhaseDecoder(eng.ar, rows, s, [1, 2], "semantic",
                                  **({"fused": False, "use_graph": False} if mode == "portable" else {}))
            res = dec.run()
            streams[mode] = [r.tokens for r in res]
            print(f"  tiny {fmt} {mode}: ran {res[0].timing.get('layer_kernel')} "
                  f"{res[0].timing.get('layer_kernel_off_reason', '')}")
        names = list(streams)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                print(f"  tiny {fmt} greedy agreement {a} vs {b}: "
                      f"{[agree(x, y) for x, y in zip(streams[a], streams[b])]} of {n}")
        s2 = Sampling(temperature=0.0, min_tokens=64, max_tokens=64)
        decs = {}
        for mode in ("off", "cuda"):
            os.environ["YUE2_LAYER_KERNEL"] = mode
            decs[mode] = fd.PhaseDecoder(eng.ar, rows, s2, [1, 2], "semantic")
        c = fd.PhaseDecoder(eng.ar, rows, s2, [1, 2], "semantic", fused=False)
        with torch.inference_mode():
            for d in (*decs.values(), c):
                d._allocate()
                d._prefill()
            errs = []
            for step in range(24):
                tok = 151853 + (7 * step) % 900
                for d in decs.values():
                    d.tokens.fill_(tok)
                    d._forward_fused(min(d.capacity, -(-(prompt + 64) // fd.BUCKET) * fd.BUCKET))
                    d.pos.add_(1)
                c.tokens.fill_(tok)
                c._forward(c.capacity)
                c.pos.add_(1)
                ref = c.logits.float()
                e = {m: ((d.logits.float() - ref).norm() / ref.norm()).item() for m, d in decs.items()}
                errs.append(f"{e['off']:.1e}/{e['cuda']:.1e}")
            print(f"  tiny {fmt} eager steps, logits rel. error vs portable (off/cuda): {' '.join(errs)}")
        del eng
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default="/tmp/yue2bench")
    ap.add_argument("--fmts", default="int8,bf16")
    ap.add_argument("--rows", default="1,2")
    ap.add_argument("--prompt", type=int, default=2200)
    ap.add_argument("--modes", default="off,grid,phased")
    ap.add_argument("--json")
    ap.add_argument("--diag", action="store_true", help="per-step comparison and phase times first")
    ap.add_argument("--sweep", action="store_true", help="tune each product phase alone, then time grid with the best")
    ap.add_argument("--phase-tiles", default="{}", help="';'-separated tiles to time phase by phase (phased)")
    ap.add_argument("--tiles", default="", help="';'-separated YUE2_LAYER_TILES JSON objects to time (grid mode)")
    ap.add_argument("--tiny", action="store_true", help="only the tiny-model agreement check (tiny_check)")
    ap.add_argument("--phase-times", action="store_true", help="CUDA kernel: block 0's µs per phase")
    a = ap.parse_args()
    if a.phase_times:
        from yue2_core.fast import persistent
        persistent.CUDA_TIMING = 1
    if a.tiny:
        os.makedirs(a.workdir, exist_ok=True)
        tiny_check(a.workdir)
        return
    from yue2_core.pipeline import YuE2Engine
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    os.makedirs(a.workdir, exist_ok=True)
    TIMED_TILES[:] = a.phase_tiles.split(";")
    rows_out = []
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__}")
    print(f"{'fmt':5} {'rows':>4} {'mode':12} {'ms/step':>8} {'tok/s':>7} {'vs off':>7} {'greedy=':>8} "
          f"{'step rel':>9} {'run tok/s':>9}")
    for fmt in a.fmts.split(","):
        path = os.path.join(a.workdir, f"yue2_full_{fmt}.safetensors")
        if not os.path.exists(path):
            t = time.perf_counter()
            write_synthetic_checkpoint(path, profile="full", fmt=fmt, seed=0, device="cuda")
            print(f"wrote {path} in {time.perf_counter() - t:.0f} s")
        eng = YuE2Engine.load(path, device="cuda", parts=("ar",))
        if hasattr(eng, "wait_warm_up"):
            eng.wait_warm_up()
        checked = [m for m in a.modes.split(",") if m != "off"]
        if a.diag:
            for mode in checked:
                try:
                    phase_check(eng.ar, a.prompt, mode)
                except Exception as exc:
                    print(f"  phase check {mode} failed: {type(exc).__name__}: {str(exc)[:400]}")
            for mode in checked:
                try:
                    diag(eng.ar, 1, a.prompt, mode)
                except Exception as exc:
                    print(f"  diag {mode} failed: {type(exc).__name__}: {str(exc)[:400]}")
        tile_list = list(filter(None, a.tiles.split(";")))
        if a.sweep:
            best = sweep(eng.ar, a.prompt)
            tile_list = [json.dumps(best), json.dumps({**best, "poll": 0})] + tile_list
            os.environ["YUE2_LAYER_TILES_BEST"] = json.dumps(best)
        for tiles in tile_list:
            os.environ["YUE2_LAYER_TILES"] = tiles
            try:
                ms, _, used, why = replay_ms(eng.ar, 1, a.prompt, "grid", n=100)
                print(f"  tiles {tiles}: {ms:.3f} ms/step ({1e3 / ms:.0f} tok/s)" + ("" if used == "grid" else f" ran {used}: {why}"))
            except Exception as exc:
                print(f"  tiles {tiles} failed: {type(exc).__name__}: {str(exc)[:300]}")
            os.environ.pop("YUE2_LAYER_TILES")
        if os.environ.get("YUE2_LAYER_TILES_BEST"):
            os.environ["YUE2_LAYER_TILES"] = os.environ["YUE2_LAYER_TILES_BEST"]
        for rows in (int(r) for r in a.rows.split(",")):
            base = None
            for mode in a.modes.split(","):
                try:
                    ms, first, used, why = replay_ms(eng.ar, rows, a.prompt, mode)
                    toks, run_rate = greedy(eng.ar, rows, a.prompt, mode)
                except Exception as exc:  # report and go on with the other configurations
                    print(f"{fmt:5} {rows:>4} {mode:7} failed: {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                if base is None:
                    base = (ms, first, toks)
                rel = ((first - base[1]).norm() / base[1].norm()).item()
                same = next((i for i, (x, y) in enumerate(zip(toks, base[2])) if x != y), len(toks))
                tok_s = 1e3 / ms
                print(f"{fmt:5} {rows:>4} {mode:12} {ms:8.3f} {tok_s:7.0f} {base[0] / ms:7.2f} {same:>8} "
                      f"{rel:9.2e} {run_rate:9.0f}" + ("" if used == mode.split(":")[0] else f"  (ran {used}: {why})"))
                rows_out.append(dict(fmt=fmt, rows=rows, mode=mode, ran=used, reason=why, ms_per_step=ms,
                                     tok_s=tok_s, vs_off=base[0] / ms, greedy_equal=same, logits_rel=rel,
                                     run_tok_s=run_rate))
        del eng
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "prompt": a.prompt,
                       "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
