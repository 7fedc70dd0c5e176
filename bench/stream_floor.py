"""What a one-launch decode layer could reach on this GPU at best (issue #18 item 2): the bytes of one int8 decode
step (28 layers × qkv 8.4 MB, K/V 9.2 MB at 2,256 positions, o 4.2 MB, gate/up 25.2 MB, down 12.6 MB = 1.67 GB)
streamed by one block per multiprocessor with 16-byte loads, and nothing else computed, in three schedules:

  stream      one launch, no barrier: the streaming floor of a persistent kernel
  barriers    a launch per layer, a grid barrier between its 5 phases (the layout of fast/_layer_cuda.cu)
  preloaded   the same, each thread's first loads of the next phase issued before the barrier
  one-launch  one launch for the step, a barrier between every two phases (139), preloaded

Prints ms a step, TB/s, and the µs a barrier costs over the stream (barriers − stream over 28 × 4 barriers).

    python bench/stream_floor.py [--reps 20]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

SOURCE = r'''
typedef unsigned int u32;
__device__ __forceinline__ uint4 ldw(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void grid_sync(u32* c) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
    u32 v;
    do { asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory"); } while (v < gridDim.x);
    __threadfence();
  }
  __syncthreads();
}
// phases [p0, p1) of the step's byte ranges (ends[], in uint4 units); each block streams its contiguous share of a
// phase, 8 loads a thread in flight; barrier between phases when sync; preload: the next phase's first 8 loads
// are issued before that barrier. bar: counters (one a phase, zeroed by the host between replays: see reset)
extern "C" __global__ void __launch_bounds__(512, 1) stream(const uint4* buf, const int* ends, int p0, int p1,
                                                             int sync, int preload, u32* bar, u32* out) {
  u32 acc = 0;
  uint4 pre[8];
  bool have = false;
  for (int p = p0; p < p1; ++p) {
    const int lo = p ? ends[p - 1] : 0, n = ends[p] - lo;
    const int per = (n + gridDim.x - 1) / gridDim.x;
    const int s = lo + blockIdx.x * per, e = min(lo + n, s + per);
    int i = s + threadIdx.x;
    if (have) {
#pragma unroll
      for (int u = 0; u < 8; ++u) acc ^= pre[u].x ^ pre[u].y ^ pre[u].z ^ pre[u].w;
      i += 8 * 512;
      have = false;
    }
    for (; i < e; i += 8 * 512) {
      uint4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = i + u * 512 < e ? ldw(buf + i + u * 512) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (sync && p + 1 < p1) {
      if (preload) {
        const int lo2 = ends[p], n2 = ends[p + 1] - lo2, per2 = (n2 + gridDim.x - 1) / gridDim.x;
        const int s2 = lo2 + blockIdx.x * per2, e2 = min(lo2 + n2, s2 + per2);
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int j = s2 + threadIdx.x + u * 512;
          pre[u] = j < e2 ? ldw(buf + j) : make_uint4(0, 0, 0, 0);
        }
        have = true;
      }
      grid_sync(bar + p);
    }
  }
  atomicXor(out, acc);
}
extern "C" __global__ void reset(u32* bar, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) bar[i] = 0;
}
'''

PHASE_MB = (8.4, 9.2, 4.2, 25.2, 12.6)  # qkv, K/V, o, gate/up, down (int8 step at 2,256 positions)
LAYERS = 28


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    from torch.cuda import _utils as cu
    from yue2_core.fast._layer_cuda import nvrtc_compile
    dev = torch.device("cuda")
    cc = torch.cuda.get_device_capability(dev)
    cubin, _ = nvrtc_compile(SOURCE, {}, f"sm_{cc[0]}{cc[1]}")
    mod = cu._cuda_load_module(cubin, ["stream", "reset"])
    kern, reset = mod["stream"], mod["reset"]
    sizes = [int(mb * 1e6) // 16 for _ in range(LAYERS) for mb in PHASE_MB]
    ends = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(dev)
    total = int(ends[-1]) * 16
    buf = torch.randint(0, 2 ** 31 - 1, (total // 4,), dtype=torch.int32, device=dev)
    bar = torch.zeros(len(sizes), dtype=torch.int32, device=dev)
    out = torch.zeros(1, dtype=torch.int32, device=dev)
    blocks = torch.cuda.get_device_properties(dev).multi_processor_count
    P = len(PHASE_MB)

    def step(mode):
        reset(grid=(1, 1, 1), block=(256, 1, 1), args=[bar, len(sizes)])
        if mode in ("stream", "one-launch"):
            sync = int(mode == "one-launch")
            kern(grid=(blocks, 1, 1), block=(512, 1, 1), args=[buf, ends, 0, len(sizes), sync, sync, bar, out])
        else:
            for layer in range(LAYERS):
                kern(grid=(blocks, 1, 1), block=(512, 1, 1),
                     args=[buf, ends, layer * P, (layer + 1) * P, 1, int(mode == "preloaded"), bar, out])

    print(f"{torch.cuda.get_device_name()} · {blocks} blocks of 512 threads · {total / 1e9:.2f} GB a step "
          f"({LAYERS} layers × {sum(PHASE_MB):.1f} MB)")
    print(f"{'schedule':10} {'ms/step':>8} {'TB/s':>6} {'µs/barrier':>10}")
    res = {}
    for mode in ("stream", "barriers", "preloaded", "one-launch"):
        step(mode)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step(mode)
        g.replay()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(a.reps):
            g.replay()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) / a.reps * 1e3
        res[mode] = ms
        n_bar = LAYERS * P - 1 if mode == "one-launch" else LAYERS * (P - 1)
        extra = "" if mode == "stream" else f"{(ms - res['stream']) * 1e3 / n_bar:10.2f}"
        print(f"{mode:10} {ms:8.3f} {total / ms / 1e9:6.2f} {extra}")


if __name__ == "__main__":
    main()
