"""The candidate selection of the decode step's sampling tail, alone in a CUDA graph: the kernel tail with its finish
kernel selecting the candidates itself (YUE2_TOPK=kernel, opt-in, the semantic slice) against the same tail with
`torch.topk` (YUE2_TOPK=torch, the default), for 1, 2 and 8 songs; with --two-level also `torch.topk` over a whole row
against a two-level `torch.topk` (chunks of C columns, each chunk's top min(K, C) unsorted, then the top K of those
lists) with an exact equality check on tie-heavy rows (measured slower on an H200: docs/experiments).

    python bench/topk_tail.py [--rows 1,2,8] [--two-level [--widths 32769,151849] [--chunks 1024,2048,4096,8192]]

Why the two-level top-k is exact: PyTorch's CUDA top-k writes the entries above the k-th value in index order, then
those equal to it in index order, and its sort of the K results is stable, so equal values come out in ascending
column order; a chunk's list keeps that order, the chunks are concatenated in column order, and the second top-k
keeps it again. K = top_k + TIE_PAD (100 + 256 by default, `fast.sampler`); widths are the semantic and ABC slices
(`fast.sampler.SLICES`).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402


def two_level(buf: torch.Tensor, G: int, n: int, C: int, K: int, W: int):
    """buf [G, n·C] fp32 scores, −inf past W. Returns (values [G, K], columns [G, K]) as `torch.topk` would."""
    K1 = min(K, C)
    v1, i1 = buf.view(G * n, C).topk(K1, dim=1, sorted=False)
    v2, j = v1.view(G, n * K1).topk(K, dim=1)
    cols = torch.div(j, K1, rounding_mode="floor") * C + i1.view(G, n * K1).gather(1, j)
    return v2, cols


def graph_ms(fn, reps: int = 200) -> float:
    """ms a replay of `fn()` captured alone as a CUDA graph (`gemv_sweep.timed`)."""
    from gemv_sweep import timed  # (bench/ is the script's own folder, first on sys.path)
    return timed(lambda i: fn(), 1, reps) / 1e3


def rows(G: int, W: int, kind: str, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "bf16":  # bf16 logits as fp32 scores / T: many exact ties among 32k columns
        x = torch.randn(G, W, device="cuda", generator=g).mul_(4).bfloat16().float().mul_(1 / 0.9)
    elif kind == "ints":  # few distinct values: tie groups far larger than K
        x = torch.randint(-3, 4, (G, W), device="cuda", generator=g).float()
    else:  # a masked row: most columns −inf, the rest tied
        x = torch.full((G, W), float("-inf"), device="cuda")
        x[:, ::97] = torch.randint(0, 2, (G, len(range(0, W, 97))), device="cuda", generator=g).float()
    return x


def kernel_tail(G: int, choice: str, cfg: float = 1.0) -> float:
    """µs a replay of the kernel tail (default semantic sampling, one step) for G songs, YUE2_TOPK=`choice`."""
    from yue2_core.fast import sample_kernels as sk
    from yue2_core.fast.sampler import SLICES, TIE_PAD, static_mask
    from yue2_core.protocol import Sampling
    os.environ["YUE2_TOPK"] = choice
    s, sl, dev = Sampling(), SLICES["semantic"], "cuda"
    K, R = min(s.top_k + TIE_PAD, sl.width), G * (2 if cfg != 1.0 else 1)
    tail = sk.KernelTail(s, "semantic", G, K, dev)
    assert (tail.blocks is not None) == (choice == "kernel")
    logits = (torch.randn(R, sl.width, device=dev) * 4).bfloat16()
    st = dict(step=torch.full((1,), 5, dtype=torch.long, device=dev),
              ring=torch.zeros(G, s.penalty_window, dtype=torch.long, device=dev),
              ring_w=torch.zeros(G, s.penalty_window, device=dev), mask=static_mask("semantic", torch.float32, dev),
              noise=torch.empty(s.max_tokens, G, K, device=dev).exponential_(),
              forced=torch.full((s.max_tokens,), -1, dtype=torch.long, device=dev),
              out=torch.full((G, s.max_tokens), -1, dtype=torch.long, device=dev),
              done=torch.zeros(G, dtype=torch.bool, device=dev), tokens=torch.zeros(R, dtype=torch.long, device=dev))
    ms = graph_ms(lambda: tail(logits, st["step"], st["ring"], st["ring_w"], st["mask"], st["noise"], st["forced"],
                               st["out"], st["done"], st["tokens"], cfg=cfg))
    os.environ.pop("YUE2_TOPK", None)
    return ms * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,2,8")
    ap.add_argument("--two-level", action="store_true")
    ap.add_argument("--widths", default="32769,151849")
    ap.add_argument("--chunks", default="1024,2048,4096,8192")
    ap.add_argument("--k", type=int, default=356)
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), "· torch", torch.__version__)
    print("kernel sampling tail, semantic slice, default sampling (one step in a CUDA graph, µs):")
    print("  songs  CFG   finish kernel selects   torch.topk selects   ratio")
    for G in map(int, a.rows.split(",")):
        for cfg in (1.0, 1.5):
            mine, theirs = kernel_tail(G, "kernel", cfg), kernel_tail(G, "torch", cfg)
            print(f"  {G:>5}  {'on ' if cfg != 1 else 'off'}   {mine:>20.1f}   {theirs:>18.1f}   {theirs / mine:5.2f}×",
                  flush=True)
    if not a.two_level:
        return
    K = a.k
    for W in map(int, a.widths.split(",")):
        for G in map(int, a.rows.split(",")):
            scores = rows(G, W, "bf16", 0)
            base = graph_ms(lambda: scores.topk(K, dim=1))
            line = [f"W={W:>6} G={G}: torch.topk {base * 1e3:6.1f} µs"]
            for C in map(int, a.chunks.split(",")):
                n = -(-W // C)
                buf = torch.full((G, n * C), float("-inf"), device="cuda")
                ok = True
                for i, kind in enumerate(("bf16", "ints", "masked")):
                    x = rows(G, W, kind, i + 1)
                    buf[:, :W] = x
                    rv, rc = x.topk(K, dim=1)
                    tv, tc = two_level(buf, G, n, C, K, W)
                    ok &= torch.equal(rv, tv) and torch.equal(rc, tc)
                buf[:, :W] = scores
                t = graph_ms(lambda: two_level(buf, G, n, C, K, W))
                K1 = min(K, C)
                t_nomap = graph_ms(lambda: buf.view(G * n, C).topk(K1, dim=1, sorted=False)[0].view(G, n * K1)
                                   .topk(K, dim=1))
                line.append(f"C={C}: {t * 1e3:6.1f} µs (no column map {t_nomap * 1e3:6.1f}) "
                            f"{'equal' if ok else 'DIFFERENT'}")
            print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
