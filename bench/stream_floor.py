"""What a one-launch decode layer could reach on this GPU at best (issue #18 item 2): the bytes of one int8 decode
step (28 layers × qkv 8.4 MB, K/V 9.2 MB at 2,256 positions, o 4.2 MB, gate/up 25.2 MB, down 12.6 MB = 1.67 GB)
streamed by one block per multiprocessor, and nothing else computed, in these schedules:

  stream      one launch, no barrier: the streaming floor of a persistent kernel
  barriers    a launch per layer, a grid barrier between its 5 phases (the layout of fast/_layer_cuda.cu)
  preloaded   the same, each thread's first loads of the next phase issued before the barrier
  split       the same, those loads issued between the barrier's arrival (its fence and count) and its wait
  one-launch  one launch for the step, a barrier between every two phases (139), preloaded (-split: as split;
              -relaxed: as split with no fences, which orders nothing — a floor only)
  ring        one launch; a producer warp bulk-copies (cp.async.bulk + mbarriers) the block's shares of every phase
              into a shared-memory ring that the 16 consumer warps read and free; the consumers meet at a grid
              barrier between phases (all, or those a mask names), the producer never waits for one — the weight
              stream decoupled from the barriers, as a producer/consumer decode kernel would have it
  empty       the ring kernel with 0 bytes a phase: the barriers alone

Prints ms a step, TB/s, and the µs a barrier costs over the stream (barriers − stream over the barrier count);
then, for --anatomy schedules, every block's arrival and release time at every barrier: how far apart the blocks
arrive (a convoy waiting for the slowest) and how long the release takes after the last arrival (latency).

    python bench/stream_floor.py [--reps 20] [--ring ...] [--anatomy ...] [--kv-scale 1.0] [--weight-scale 1.0]

--kv-scale multiplies the K/V phase's bytes: 2 for a CFG pair (two prompts, two caches), 8 for 8 candidates with a
cache each (their shared 2,000-position prompt read once: ≈ 1.1 at the start, ≈ 1.8 averaged over
the bench's 512 tokens a row), so the same schedules bound the multi-row steps'
floors (no arithmetic at any row count); --weight-scale 2 gives the bf16 file's step (weights twice the bytes).
Fewer barriers a layer: MASK 23 = every phase but gate/up (a block owning whole ffn columns runs gate/up, SiLU·up and
its down-projection partial without a barrier between them), 21, 20.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

SOURCE = r'''
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
// the same barrier in two halves: arrive (the fence and the count) … other work … wait; relaxed: no fences
__device__ __forceinline__ void grid_arrive(u32* c, bool relaxed) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (relaxed) {
      asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
    } else {
      __threadfence();
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
    }
  }
}
__device__ __forceinline__ void grid_wait(u32* c, bool relaxed) {
  if (threadIdx.x == 0) {
    u32 v;
    if (relaxed)
      do { asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory"); } while (v < gridDim.x);
    else
      do { asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory"); } while (v < gridDim.x);
  }
  __syncthreads();
}
// phases [p0, p1) of the step's byte ranges (ends[], in uint4 units); each block streams its contiguous share of a
// phase, 8 loads a thread in flight; barrier between phases when sync; preload: the next phase's first 8 loads
// are issued before that barrier (preload 1), or between its arrival and its wait (2: the fence then does not wait
// for them; 3: the same with a relaxed barrier, no fences — a floor only). bar: counters (one a phase, zeroed by
// the host between replays: see reset)
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
      if (preload >= 2) grid_arrive(bar + p, preload == 3);
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
      if (preload >= 2) grid_wait(bar + p, preload == 3);
      else grid_sync(bar + p);
    }
  }
  atomicXor(out, acc);
}
'''

# typedef u32 and the bulk-copy ring's helpers (also bench/cluster_floor.py's)
HEAD = r'''
typedef unsigned int u32;
'''
RING_HELPERS = r'''
__device__ __forceinline__ u32 sa(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mb_init(u32 b, u32 n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(n) : "memory");
}
__device__ __forceinline__ void mb_expect(u32 b, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mb_arrive(u32 b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(b) : "memory");
}
__device__ __forceinline__ void mb_wait(u32 b, u32 parity) {
  u32 ok;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(ok) : "r"(b), "r"(parity) : "memory");
  } while (!ok);
}
__device__ __forceinline__ void bulk(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
'''

SOURCE = HEAD + SOURCE + r'''
// ---- the ring schedule: a producer thread streams the block's shares of every phase into a shared-memory ring of
// S stages × STAGE bytes by bulk copies (cp.async.bulk, completion counted on an mbarrier a stage); the consumer
// warps read each stage from shared memory, free it, and meet the other blocks at a grid barrier between phases.
// The producer never waits for a barrier, only for a free stage: the stream runs ahead across the barriers.
''' + RING_HELPERS + r'''
// tim (when given): this block's arrival and release times (ns) at the barrier. backoff: ns slept between polls.
// flags (spread): the last block to arrive writes `gen` into every block's own release flag (a 128-byte line
// each), which that block polls — no line polled by all 132 blocks at once; else every block polls the counter.
// fence: 1 __threadfence() then a release add (cooperative-groups style), 2 the release add alone, 0 a relaxed add
// and relaxed polls (no ordering: enough for a floor whose consumers write nothing)
__device__ __forceinline__ void consumers_sync(u32* c, int nthreads, unsigned long long* tim, int backoff,
                                               u32* flags, u32 gen, int fence) {
  __shared__ u32 last;
  asm volatile("bar.sync 1, %0;" ::"r"(nthreads) : "memory");
  if (threadIdx.x == 0 && !flags && fence != 1) {
    if (tim) tim[2 * blockIdx.x] = now();
    if (fence == 2) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
    else asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
    u32 v;
    while (true) {
      if (fence == 2) asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
      else asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
      if (v >= gridDim.x) break;
      if (backoff) __nanosleep(backoff);
    }
    if (tim) tim[2 * blockIdx.x + 1] = now();
  }
  if (!flags && fence != 1) {
    asm volatile("bar.sync 1, %0;" ::"r"(nthreads) : "memory");
    return;
  }
  if (threadIdx.x == 0) {
    if (tim) tim[2 * blockIdx.x] = now();
    __threadfence();
    if (flags) {
      u32 old;
      asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(c) : "memory");
      last = old == gridDim.x - 1;
    } else {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
    }
  }
  if (flags) {
    asm volatile("bar.sync 1, %0;" ::"r"(nthreads) : "memory");
    if (last)
      for (int b = threadIdx.x; b < gridDim.x; b += nthreads)
        asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + 32 * b), "r"(gen) : "memory");
  }
  if (threadIdx.x == 0) {
    const u32* f = flags ? flags + 32 * blockIdx.x : c;
    const u32 want = flags ? gen : gridDim.x;
    u32 v;
    while (true) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(f) : "memory");
      if (v >= want) break;
      if (backoff) __nanosleep(backoff);
    }
    if (tim) tim[2 * blockIdx.x + 1] = now();
  }
  asm volatile("bar.sync 1, %0;" ::"r"(nthreads) : "memory");
}
__device__ __forceinline__ void share(const int* ends, int p, int& s, int& e) {
  const int lo = p ? ends[p - 1] : 0, n = ends[p] - lo, per = (n + gridDim.x - 1) / gridDim.x;
  s = lo + blockIdx.x * per;
  e = min(lo + n, s + per);
}
// this block's chunks of phase p: c = s, s + step, … < e, each min(ch, e − c) uint4s: a contiguous share
// (inter 0), or every gridDim-th chunk of the phase (inter 1: the blocks read neighbouring chunks at once, as
// 16-row weight tiles dealt round robin are read)
__device__ __forceinline__ void chunks(const int* ends, int p, int ch, int inter, int& s, int& step, int& e) {
  if (inter) {
    const int lo = p ? ends[p - 1] : 0;
    s = lo + blockIdx.x * ch;
    step = gridDim.x * ch;
    e = ends[p];
  } else {
    share(ends, p, s, e);
    step = ch;
  }
}
extern "C" __global__ void __launch_bounds__(544, 1) ring(const uint4* buf, const int* ends, int p0, int p1, int sync,
                                                           int S, int stage, int piece, int mask, int backoff,
                                                           int spread, int inter, int fence, u32* flags, u32* bar,
                                                           u32* out, unsigned long long* tim) {
  extern __shared__ uint4 ringbuf[];
  __shared__ unsigned long long full[32], empty[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, NC = blockDim.x - 32, CH = stage / 16;
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) { mb_init(sa(full + i), 1); mb_init(sa(empty + i), NC / 32); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == (int)(blockDim.x >> 5) - 1) {  // the producer
    // piece > 0: a stage copied as pieces of `piece` bytes, one a lane (rows of a weight tile), else one copy
    const int PC = piece > 0 ? piece / 16 : CH;
    int k = 0;
    for (int p = p0; p < p1; ++p) {
      int s, step, e;
      chunks(ends, p, CH, inter, s, step, e);
      for (int c = s; c < e; c += step, ++k) {
        const int st = k % S, n = min(CH, e - c);
        if (lane == 0) {
          if (k >= S) mb_wait(sa(empty + st), ((k / S) - 1) & 1);
          mb_expect(sa(full + st), (u32)n * 16);
        }
        __syncwarp();
        for (int q = lane * PC; q < n; q += 32 * PC)
          bulk(sa(ringbuf + st * CH + q), buf + c + q, (u32)min(PC, n - q) * 16, sa(full + st));
      }
    }
    return;
  }
  u32 acc = 0;
  int k = 0;
  for (int p = p0; p < p1; ++p) {
    int s, step, e;
    chunks(ends, p, CH, inter, s, step, e);
    for (int c = s; c < e; c += step, ++k) {
      const int st = k % S, n = min(CH, e - c);
      mb_wait(sa(full + st), (k / S) & 1);
      for (int i = threadIdx.x; i < n; i += NC) {
        const uint4 v = ringbuf[st * CH + i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
      __syncwarp();
      if (lane == 0) mb_arrive(sa(empty + st));
    }
    // mask: bit i → a barrier after every layer's phase i (31: all five)
    if (sync && p + 1 < p1 && ((mask >> (p % 5)) & 1))
      consumers_sync(bar + p, NC, tim ? tim + (size_t)p * 2 * gridDim.x : nullptr, backoff,
                     spread ? flags : nullptr, p + 1, fence);
  }
  atomicXor(out, acc);
}
extern "C" __global__ void reset(u32* bar, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) bar[i] = 0;
}
'''

PHASE_MB = (8.4, 9.2, 4.2, 25.2, 12.6)  # qkv, K/V, o, gate/up, down (int8 step at 2,256 positions)
LAYERS = 28


def phase_bytes_mb(kv_scale: float = 1.0, weight_scale: float = 1.0) -> tuple:
    """PHASE_MB with the K/V phase (index 1) scaled by `kv_scale` and the four weight phases by `weight_scale`
    (2: the bf16 file's weights, twice the int8 codes' bytes) — MB a layer: qkv, K/V, o, gate/up, down."""
    return tuple(mb * (kv_scale if i == 1 else weight_scale) for i, mb in enumerate(PHASE_MB))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--ring", nargs="*",
                    default=["ring-nosync:12:16", "ring:12:16", "ring:12:16:0:21", "ring:12:16:0:16",
                             "ring:12:16:0:31:0:0:0:2", "ring:12:16:0:31:0:0:0:0", "empty:1:16:0:31",
                             "empty:1:16:0:31:0:0:0:0"],
                    help="ring schedules to add, ring[-nosync]:STAGES:KB[:PIECE_KB[:MASK[:BACKOFF[:SPREAD[:INTER"
                         "[:FENCE]]]]]] "
                         "(STAGES ≤ 32, STAGES × KB ≤ 227 KB; a stage copied in PIECE_KB pieces, one a lane, as a weight tile's "
                         "rows would be, 0 = one copy; MASK: bit i = a barrier after every layer's phase i, 31 all "
                         "five; BACKOFF: ns slept between polls; SPREAD 1: per-block release flags written by the "
                         "last block; INTER 1: stages dealt to the blocks round robin instead of a contiguous share "
                         "each; FENCE: 1 __threadfence + release add (default), 2 release add alone, 0 relaxed), "
                         "or empty:… (no bytes: the barriers alone)")
    ap.add_argument("--anatomy", nargs="*", default=["ring:12:16", "ring:12:16:0:31:0:0:0:0", "empty:1:16:0:31"],
                    help="ring schedules whose barriers are timed block by block (arrival spread, release latency)")
    ap.add_argument("--kv-scale", type=float, default=1.0,
                    help="K/V bytes × this (2: a CFG pair's two caches; 8: 8 candidates with a cache each)")
    ap.add_argument("--weight-scale", type=float, default=1.0,
                    help="the four weight phases' bytes × this (2: the bf16 file; the int8 codes' scales are "
                         "ignored at 1)")
    a = ap.parse_args()
    if not 0 < a.kv_scale <= 64:
        ap.error(f"--kv-scale {a.kv_scale}: expected a number in (0, 64]")
    if not 0 < a.weight_scale <= 4:
        ap.error(f"--weight-scale {a.weight_scale}: expected a number in (0, 4]")
    import re
    for m in a.ring + a.anatomy:
        v = [int(x) for x in m.split(":")[1:]] if re.fullmatch(r"(ring|ring-nosync|empty)(:\d+){2,8}", m) else []
        if not v or not 1 <= v[0] <= 32 or not 1 <= v[0] * v[1] <= 227:
            ap.error(f"schedule {m!r}: expected ring[-nosync]:STAGES:KB[:…] or empty:… with 1 ≤ STAGES ≤ 32 and "
                     f"STAGES × KB ≤ 227 (see --help)")
    if not torch.cuda.is_available():
        sys.exit("bench/stream_floor.py measures an NVIDIA GPU; none is visible here (torch.cuda.is_available() is "
                 "False)")
    from torch.cuda import _utils as cu
    from yue2_core.fast._layer_cuda import nvrtc_compile
    dev = torch.device("cuda")
    cc = torch.cuda.get_device_capability(dev)
    cubin, _ = nvrtc_compile(SOURCE, {}, f"sm_{cc[0]}{cc[1]}")
    mod = cu._cuda_load_module(cubin, ["stream", "reset", "ring"])
    kern, reset, ring = mod["stream"], mod["reset"], mod["ring"]
    ring.set_shared_memory_config(max([int(m.split(":")[1]) * int(m.split(":")[2]) * 1024 for m in a.ring
                                       + a.anatomy] + [0]))
    phase_mb = phase_bytes_mb(a.kv_scale, a.weight_scale)
    sizes = [int(mb * 1e6) // 16 for _ in range(LAYERS) for mb in phase_mb]
    ends = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(dev)
    total = int(ends[-1]) * 16
    buf = torch.randint(0, 2 ** 31 - 1, (total // 4,), dtype=torch.int32, device=dev)
    bar = torch.zeros(len(sizes), dtype=torch.int32, device=dev)
    out = torch.zeros(1, dtype=torch.int32, device=dev)
    blocks = torch.cuda.get_device_properties(dev).multi_processor_count
    P = len(PHASE_MB)

    empty_ends = torch.zeros_like(ends)  # every phase 0 bytes: the barriers alone
    tim = torch.zeros(len(sizes) * 2 * blocks, dtype=torch.int64, device=dev)
    nul = torch.zeros(1, dtype=torch.int64, device=dev)
    timed = [False]

    flags = torch.zeros(blocks * 32, dtype=torch.int32, device=dev)

    def ring_args(mode):  # ring[-nosync]:STAGES:KB[:PIECE_KB[:MASK[:BACKOFF_NS[:SPREAD[:INTER[:FENCE]]]]]]
        v = list(map(int, mode.split(":")[1:]))
        v += [0, 31, 0, 0, 0, 1][len(v) - 2:]
        return v

    def step(mode):
        reset(grid=(1, 1, 1), block=(256, 1, 1), args=[bar, len(sizes)])
        if mode.startswith(("ring", "empty")):
            n_st, kb, pc, mask, backoff, spread, inter, fence = ring_args(mode)
            if spread:
                reset(grid=(1, 1, 1), block=(256, 1, 1), args=[flags, flags.numel()])
            sync = int(not mode.startswith("ring-nosync"))
            data = empty_ends if mode.startswith("empty") else ends
            ring(grid=(blocks, 1, 1), block=(544, 1, 1), args=[buf, data, 0, len(sizes), sync, n_st, kb * 1024,
                                                                pc * 1024, mask, backoff, spread, inter, fence, flags,
                                                                bar, out, tim if timed[0] else nul],
                 shared_mem=n_st * kb * 1024)
        elif mode in ("stream", "one-launch", "one-launch-split", "one-launch-relaxed"):
            sync = int(mode != "stream")
            pre = {"stream": 0, "one-launch": 1, "one-launch-split": 2, "one-launch-relaxed": 3}[mode]
            kern(grid=(blocks, 1, 1), block=(512, 1, 1), args=[buf, ends, 0, len(sizes), sync, pre, bar, out])
        else:
            pre = {"barriers": 0, "preloaded": 1, "split": 2}[mode]
            for layer in range(LAYERS):
                kern(grid=(blocks, 1, 1), block=(512, 1, 1),
                     args=[buf, ends, layer * P, (layer + 1) * P, 1, pre, bar, out])

    print(f"{torch.cuda.get_device_name()} · {blocks} blocks of 512 threads · {total / 1e9:.2f} GB a step "
          f"({LAYERS} layers × {sum(phase_mb):.1f} MB; K/V × {a.kv_scale:g}, weights × {a.weight_scale:g})")
    print(f"{'schedule':22} {'ms/step':>8} {'TB/s':>6} {'µs/barrier':>10}")
    res = {}
    for mode in ("stream", "barriers", "preloaded", "split", "one-launch", "one-launch-split", "one-launch-relaxed",
                 *a.ring):
        ms = res[mode] = graph_ms(lambda: step(mode), a.reps)
        n_bar = LAYERS * P - 1 if mode.startswith(("one-launch", "ring", "empty")) else LAYERS * (P - 1)
        if mode.startswith(("ring", "empty")):
            n_bar = sum(1 for p in range(LAYERS * P - 1) if (ring_args(mode)[3] >> (p % P)) & 1)
        base = 0.0 if mode.startswith("empty") else res["stream"]
        extra = "" if mode in ("stream",) or "nosync" in mode else f"{(ms - base) * 1e3 / n_bar:10.2f}"
        print(f"{mode:22} {ms:8.3f} {total / ms / 1e9:6.2f} {extra}")
    timed[0] = True
    for mode in a.anatomy:
        for _ in range(3):  # the last run's stamps stand
            tim.zero_()
            step(mode)
        torch.cuda.synchronize()
        print(f"{mode:22} {anatomy_table(tim, blocks, len(sizes))}")


def graph_ms(step, reps: int) -> float:
    """ms of one replay of `step` captured in a CUDA graph (after an eager run and one warm replay; mean of reps)."""
    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3


def anatomy_table(t: torch.Tensor, blocks: int, n_phases: int) -> str:
    """Per barrier (arrival, release) ns of every block → mean µs of: arrival spread (last − first block),
    release latency (first release − last arrival), release spread, and the work between a block's release and
    its next arrival."""
    t = t.view(n_phases, blocks, 2).double().cpu()
    used = t[:, :, 0].gt(0).all(1) & t[:, :, 1].gt(0).all(1)
    t = t[used]
    if len(t) < 2:
        return "no barrier recorded"
    arr, rel = t[:, :, 0], t[:, :, 1]
    spread = (arr.max(1).values - arr.min(1).values).mean() / 1e3
    lat = (rel.min(1).values - arr.max(1).values).mean() / 1e3
    rspread = (rel.max(1).values - rel.min(1).values).mean() / 1e3
    work = (arr[1:] - rel[:-1]).mean() / 1e3
    slowest = arr.argmax(1)
    top = torch.bincount(slowest, minlength=blocks).max().item()
    return (f"{len(t)} barriers: arrival spread {spread:.2f} µs, release latency {lat:.2f}, release spread "
            f"{rspread:.2f}, between barriers {work:.2f} µs a block; the most often last block was last "
            f"{top} times")


if __name__ == "__main__":
    main()
