"""How the AR batch decode and the render (NAR + VAE) share one GPU (issue #19): each alone, then both at once with
the render on (a) a low-priority stream beside the AR's high-priority one (what `batch --overlap` did until
2026-12-03) and (b) a CUDA green context holding K of the GPU's SMs (`torch.cuda.green_contexts`), the AR on the
rest or on all SMs.

    python bench/overlap_split.py [--checkpoint F] [--rows 8] [--tokens 1024] [--render-sms 96,112,120]

Prints one table: AR steps/s, render seconds per song, and the work done per second relative to each stage alone
(AR share + render share; above 1.0 the overlap gains, 1.0 = the two time-slice the GPU). Full-size synthetic int8
weights (random; the numbers say nothing about audio).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from yue2_core.constants import EOD, MUSIC_START  # noqa: E402
from yue2_core.fast import decode as fd  # noqa: E402
from yue2_core.protocol import Sampling  # noqa: E402


def prompt(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [EOD] + torch.randint(0, 150000, (n - 2,), generator=g).tolist() + [MUSIC_START]


def fixed(n):
    s = Sampling()
    return Sampling(s.temperature, s.top_p, s.top_k, s.repetition_penalty, s.penalty_window, n, n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default="/tmp/yue2bench/yue2_full_int8.safetensors")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--frames", type=int, default=5371)
    ap.add_argument("--render-sms", default="96,112,120")
    args = ap.parse_args()
    from yue2_core.pipeline import SemanticTokens, YuE2Engine, decode, render
    if not os.path.exists(args.checkpoint):
        from yue2_core.weights.synthetic import write_synthetic_checkpoint
        os.makedirs(os.path.dirname(args.checkpoint), exist_ok=True)
        write_synthetic_checkpoint(args.checkpoint, profile="full", fmt="int8", seed=0, device="cuda")
    eng = YuE2Engine.load(args.checkpoint, device="cuda")
    dev = eng.ar.device
    props = torch.cuda.get_device_properties(dev)
    print(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}")
    try:
        import cuda.bindings  # noqa: F401
        have_green = True
    except ImportError as exc:
        have_green = False
        print("no green contexts:", exc)
    prefixes = [prompt(args.prefix, i) for i in range(args.rows)]
    tokens = SemanticTokens(codes=torch.randint(0, 32768, (args.frames,)).tolist(), prefix=prompt(args.prefix, 99),
                            score=None, request={}, seed=1, cfg_scale=1.0, sampling={}, ended=True)

    def ar_once(n=args.tokens):
        dec = fd.PhaseDecoder(eng.ar, prefixes, fixed(n), list(range(1, args.rows + 1)), "semantic")
        t = time.perf_counter()
        res = dec.run()
        return n, time.perf_counter() - t, res[0].timing

    def song():
        t = time.perf_counter()
        lat = render(eng.ar, eng.nar, tokens, 32)
        decode(eng.vae, lat)
        return time.perf_counter() - t

    import contextlib

    class Place:
        """Where a stage runs: a stream, and the stream its graphs are captured on (a green context's own)."""

        def __init__(self, label, stream, capture=None):
            self.label, self.stream, self.capture = label, stream, capture

        def __enter__(self):
            self.ctx = contextlib.ExitStack()
            self.ctx.enter_context(torch.cuda.stream(self.stream))
            if self.capture is not None:
                self.ctx.enter_context(fd.capture_on(self.capture))

        def __exit__(self, *exc):
            self.ctx.close()

    def green(k):
        from torch.cuda.green_contexts import GreenContext
        ctx = GreenContext.create(num_sms=k, device_id=dev.index or 0)
        place = Place(f"green {k} SMs", ctx.Stream(), ctx.Stream())
        place.keep = ctx
        return place

    hi = Place("all SMs, high priority", torch.cuda.Stream(dev, priority=-1))
    lo = Place("all SMs, low priority", torch.cuda.Stream(dev, priority=0))
    with hi:
        ar_once(64)
    with lo:
        song()
    torch.cuda.synchronize()
    rows = []

    def steady(n, s, tm):
        busy = s - tm["prefill_seconds"] - tm["graph_capture_seconds"]
        return n / busy if busy > 0 else 0.0

    def ar_alone(place):
        with place:
            ar_once(64)
            n, s, tm = ar_once()
        torch.cuda.synchronize()
        rate = n / s
        print(f"AR alone [{place.label}]: {n} steps × {args.rows} rows in {s:.2f} s = {rate:.0f} steps/s "
              f"(prefill {tm['prefill_seconds']:.2f} s, capture {tm['graph_capture_seconds']:.2f} s, steady "
              f"{steady(n, s, tm):.0f} steps/s)", flush=True)
        return rate, steady(n, s, tm)

    def song_alone(place):
        with place:
            song()
            s = song()
        print(f"render+VAE alone [{place.label}]: {s:.2f} s/song", flush=True)
        return s

    base_ar, base_steady = ar_alone(hi)
    base_song = song_alone(lo)
    rows.append(("AR alone, all SMs", base_ar, base_steady, None, 1.0))
    rows.append(("render alone, all SMs", None, None, base_song, 1.0))

    def both(r_place, a_place, songs=2):
        label = f"render {r_place.label}, AR {a_place.label}"
        done = threading.Event()
        times, err = [], []

        def worker():
            try:
                with r_place:
                    for _ in range(songs):
                        times.append(song())
            except BaseException as exc:  # noqa: BLE001
                err.append(exc)
            finally:
                done.set()
        with fd.concurrent_capture():
            th = threading.Thread(target=worker)
            th.start()
            steps, ar_s, busy = 0, 0.0, 0.0
            while not done.is_set():
                with a_place:
                    n, s, tm = ar_once()
                steps, ar_s, busy = steps + n, ar_s + s, busy + n / max(steady(n, s, tm), 1e-9)
            th.join()
        if err:
            print(f"{label}: failed: {err[0]!r}")
            return
        rate, st = steps / ar_s, steps / busy
        per = sum(times) / len(times)
        share = rate / base_ar + base_song / per
        rows.append((label, rate, st, per, share))
        print(f"both [{label}]: AR {rate:.0f} steps/s ({rate / base_ar:.2f} of alone; steady {st:.0f}), render "
              f"{per:.2f} s/song ({base_song / per:.2f} of alone) → work/s {share:.2f}", flush=True)

    both(lo, hi)
    total = props.multi_processor_count
    if have_green:
        for k in [int(x) for x in args.render_sms.split(",") if x]:
            try:
                g_render = green(k)
                g_ar = green(total - k)
            except Exception as exc:  # noqa: BLE001
                print(f"green contexts of {k} + {total - k} SMs refused: {exc!r}")
                continue
            s_k = song_alone(g_render)
            rows.append((f"render alone, green {k} SMs", None, None, s_k, base_song / s_k))
            r_k, st_k = ar_alone(g_ar)
            rows.append((f"AR alone, green {total - k} SMs", r_k, st_k, None, r_k / base_ar))
            both(g_render, g_ar)
            both(g_render, hi)
    print()
    print(f"| case ({props.name}, {args.rows} rows × {args.tokens} semantic steps after {args.prefix}; song "
          f"{args.frames} frames, 32 midpoint steps + VAE) | AR steps/s | AR steady steps/s | render s/song | "
          "work per second vs alone |")
    print("|---|---|---|---|---|")
    for label, rate, st, per, share in rows:
        print(f"| {label} | {'' if rate is None else f'{rate:.0f}'} | {'' if st is None else f'{st:.0f}'} | "
              f"{'' if per is None else f'{per:.2f}'} | {share:.2f} |")


if __name__ == "__main__":
    main()
