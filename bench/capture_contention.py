"""Does a CUDA-graph capture on another thread slow the graph replays of the main thread? (issue #18, the side
capture of `fast/side_capture.py`: on an H100 the captures left the song's path, 0.35–0.46 s, but the song gained
≈ 0–0.04 s of it — docs/speed.md.)

The main thread replays a graph of N small dependent kernels in blocks of 16 followed by a host sync (the decode
loop's shape) for a fixed time and counts replays per second, (a) alone and beside a worker thread that
(capture) captures graphs of N kernels on its own stream in capture_error_mode "thread_local" back to back, timing
the recording (launches into the capture) and `capture_end` (graph instantiation) apart, (capture_pause) the same
with 50 ms between captures, (python) only runs a pure-Python loop (the interpreter lock alone, no CUDA),
(triton) captures graphs of N trivial Triton kernel launches; `_short`: with the interpreter's switch interval at
0.5 ms instead of 5 ms while the worker runs. The
replay rate beside a capturing worker against (python) separates the driver from the interpreter lock.

    python bench/capture_contention.py [--kernels 300] [--seconds 3]
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

import torch


def make_step(x: torch.Tensor, n: int):
    def step():
        for _ in range(n):
            x.mul_(1.0000001).add_(1e-7)
    return step


def make_triton_step(x: torch.Tensor, n: int):
    """n launches of a trivial Triton kernel: the Python side of a Triton launch (argument binding, the
    specialisation key, the cache look-up) is what the decode step's capture spends its time in."""
    import triton
    import triton.language as tl

    @triton.jit
    def bump(ptr, n_el, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n_el
        tl.store(ptr + offs, tl.load(ptr + offs, mask=m) * 1.0000001 + 1e-7, mask=m)

    def step():
        for _ in range(2 * n):
            bump[(triton.cdiv(x.numel(), 1024),)](x, x.numel(), BLOCK=1024)
    return step


def capture(step, stream) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        g.capture_begin(capture_error_mode="thread_local")
        step()
        g.capture_end()
    return g


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=150, help="kernel pairs per graph (2 launches each)")
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), torch.__version__)
    main_x = torch.zeros(1 << 16, device=dev)
    main_graph = capture(make_step(main_x, a.kernels), torch.cuda.Stream())
    torch.cuda.synchronize()
    for _ in range(20):
        main_graph.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(50):
        main_graph.replay()
    torch.cuda.synchronize()
    replay_ms = (time.perf_counter() - t) / 50 * 1e3
    print(f"graph of {2 * a.kernels} kernels: {replay_ms:.3f} ms a replay alone")

    def run_main(stop_after: float) -> float:
        n, t0 = 0, time.perf_counter()
        flag = torch.zeros(1, device=dev)
        while time.perf_counter() - t0 < stop_after:
            for _ in range(16):
                main_graph.replay()
            flag.add_(1).cpu()  # the block's sync
            n += 16
        return n / (time.perf_counter() - t0)

    def worker(mode: str, stop: threading.Event, stats: dict):
        x = torch.zeros(1 << 16, device=dev)
        s = torch.cuda.Stream()
        step = (make_triton_step if mode.startswith("triton") else make_step)(x, a.kernels)
        with torch.cuda.stream(s):
            step()
        s.synchronize()
        while not stop.is_set():
            if mode.startswith("python"):
                t = time.perf_counter()
                k = 0
                while time.perf_counter() - t < 0.05:
                    k += 1
                stats.setdefault("busy", []).append(time.perf_counter() - t)
                continue
            g = torch.cuda.CUDAGraph()
            with torch.cuda.stream(s):
                t0 = time.perf_counter()
                g.capture_begin(capture_error_mode="thread_local")
                step()
                t1 = time.perf_counter()
                g.capture_end()
                t2 = time.perf_counter()
            stats.setdefault("record", []).append(t1 - t0)
            stats.setdefault("end", []).append(t2 - t1)
            if mode == "capture_pause":
                time.sleep(0.05)
            del g

    base = run_main(a.seconds)
    print(f"(a) alone:                              {base:8.1f} replays/s")
    for mode in ("capture", "capture_pause", "python", "python_short", "triton", "triton_short"):
        stop, stats = threading.Event(), {}
        interval = sys.getswitchinterval()
        if mode.endswith("_short"):
            sys.setswitchinterval(0.0005)
        th = threading.Thread(target=worker, args=(mode, stop, stats))
        th.start()
        time.sleep(0.2)
        rate = run_main(a.seconds)
        stop.set()
        th.join()
        sys.setswitchinterval(interval)
        extra = ""
        if "record" in stats:
            r, e = stats["record"], stats["end"]
            extra = (f"; {len(r)} captures, recording {sum(r) / len(r) * 1e3:.1f} ms, capture_end "
                     f"{sum(e) / len(e) * 1e3:.1f} ms each")
        print(f"({mode}) beside a worker: {rate:8.1f} replays/s = {rate / base:.3f} of alone{extra}")


if __name__ == "__main__":
    main()
