"""What a CUDA-graph capture of the decode step costs in a warm process (issue #18): a warm int8 song captures one
graph per 1,024-position attention bucket and phase — 8 in the bench's song (2 lead-sheet, 6 music), 0.66 s of its
15.0 s on an H200. For a music-phase decoder (prompt 3,500 positions, 5,400 tokens) this times, per bucket:

  eager step   one step outside a graph with a sync (what `_graph`'s warm-up step costs)
  capture A    `PhaseDecoder._graph` as it is: warm-up step, then `torch.cuda.graph` (device sync, empty_cache and
               the pinned host cache emptied on entry)
  capture B    the same with `fast.decode.capture_on_stream(..., "global")` (capture_begin on the side stream, no
               sync or cache emptying)

each on a fresh decoder after one process-wide warm-up, so every kernel is compiled before.

    python bench/capture_cost.py [--checkpoint /tmp/yue2bench/yue2_full_int8.safetensors] [--buckets 6]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from yue2_core.fast import decode as fd  # noqa: E402
from yue2_core.protocol import Sampling  # noqa: E402


def decoder(ar, prompt: int, tokens: int):
    s = Sampling(min_tokens=tokens, max_tokens=tokens)
    ids = [151643] + [1000 + i % 5000 for i in range(prompt - 2)] + [151851]
    dec = fd.PhaseDecoder(ar, [ids], s, [1], "semantic")
    dec._allocate()
    dec._prefill()
    torch.cuda.synchronize()
    return dec


@contextlib.contextmanager
def light_graph():
    """torch.cuda.graph replaced by capture_begin/capture_end on the current (side) stream."""
    real = torch.cuda.graph

    @contextlib.contextmanager
    def graph(g, pool=None, capture_error_mode="global", **_):
        stream = torch.cuda.current_stream()
        side = fd._capture_stream(stream.device)
        side.wait_stream(stream)
        with torch.cuda.stream(side):
            g.capture_begin(*((pool,) if pool is not None else ()), capture_error_mode=capture_error_mode)
            try:
                yield
            finally:
                g.capture_end()
        stream.wait_stream(side)
    torch.cuda.graph = graph
    try:
        yield
    finally:
        torch.cuda.graph = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="/tmp/yue2bench/yue2_full_int8.safetensors")
    ap.add_argument("--prompt", type=int, default=3500)
    ap.add_argument("--tokens", type=int, default=5400)
    ap.add_argument("--buckets", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("capture_cost.py needs a CUDA GPU")
    from yue2_core.pipeline import YuE2Engine
    eng = YuE2Engine.load(args.checkpoint, device="cuda", parts=("ar",))
    first = -(-(args.prompt + 16) // fd.BUCKET) * fd.BUCKET
    buckets = [first + i * fd.BUCKET for i in range(args.buckets)]
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · prompt {args.prompt}, buckets {buckets}")
    with torch.inference_mode():
        dec = decoder(eng.ar, args.prompt, args.tokens)  # process warm-up: every bucket's kernels compiled
        buckets = [min(dec.capacity, b) for b in buckets]  # as `PhaseDecoder.run` caps the last bucket
        for b in buckets:
            dec._graph(b).replay()
        torch.cuda.synchronize()
        del dec
        for r in range(args.rounds):
            dec = decoder(eng.ar, args.prompt, args.tokens)
            eager = []
            for b in buckets:
                t = time.perf_counter()
                dec._step(b)
                torch.cuda.synchronize()
                eager.append(time.perf_counter() - t)
            for style in ("A", "B"):
                dec = decoder(eng.ar, args.prompt, args.tokens)
                times = []
                with (light_graph() if style == "B" else contextlib.nullcontext()):
                    for b in buckets:
                        t = time.perf_counter()
                        dec._graph(b)
                        times.append(time.perf_counter() - t)
                print(f"round {r} capture {style}: " + " ".join(f"{1e3 * x:6.1f}" for x in times)
                      + f" ms · sum {sum(times):.3f} s")
                del dec
                torch.cuda.synchronize()
            print(f"round {r} eager step:  " + " ".join(f"{1e3 * x:6.1f}" for x in eager) + " ms")


if __name__ == "__main__":
    main()
