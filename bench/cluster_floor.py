"""The floor of a decode step partitioned by thread-block clusters (issue #18 item 2): one launch a step, the
int8 step's bytes streamed by a producer warp per block into a shared-memory ring (bulk copies, as
bench/stream_floor.py's `ring`), and the layer's hand-offs placed where a cluster partition puts them.

Why clusters. A one-launch layer so far needed a grid barrier between each of its 5 phases (qkv → attention → o →
gate/up → down → next qkv): 140 a step, ≈ 2–3 µs each over the stream (stream_floor.py). Three of the five are
local to a slice of the model if the blocks are grouped right — one cluster per kv head j (8 clusters):
  - cluster j computes the qkv rows of j's 2 query heads, k_j and v_j (512 rows) and then the attention of those
    heads over j's K/V, each block a range of positions: qkv → attention is a hop inside the cluster;
  - the splits' partial softmax sums merge inside the cluster, and the cluster computes the o_proj over its heads'
    256 input columns (one 256-group of ConvRot's rotation): attention → o is local; the 8 clusters' o partial rows
    meet at a grid barrier (the RMSNorm needs the whole row);
  - cluster j owns ffn columns 768j… (3 rotation groups): their gate/up rows, SiLU·up, then the down_proj over
    those 768 inputs, each block whole output rows: gate/up → down is a hop inside the cluster; the 8 clusters'
    down partial rows meet at the next layer's grid barrier.
So 2 grid barriers a layer and 3 cluster hand-offs (each: the producing blocks push their few values into every
block's shared memory with st.shared::cluster, then arrive on each block's mbarrier with release at cluster scope;
a path that never leaves the GPC). Every block must be resident at once (grid barriers): clusters of 16 need 8 GPCs
with ≥ 16 free SMs each — the first H100 tried fits 7 (`cuOccupancyMaxActiveClusters`), so clusters of 12 (96
blocks) and 8 (64) are measured too, against the same bytes over 132 / 128 / 96 blocks without clusters.

Nothing is computed but an XOR of the loaded bytes, or (`+math`) a cost model of the arithmetic: the products as
rows of int8 codes against the activation's pair codes in shared memory (two dp4a a word, each 256-group summed
over 16 lanes by shuffles, scaled and added to its row's sum by a shared-memory atomic), the K/V rows against two
query heads (bf16 → fp32, 16 FMAs a 16-byte word, a 16-lane reduction and two exp a K row) — the work a real
kernel's consumers do per byte, not its results. Rows are floors of their schedules, comparable within a run:
  stream-N      N blocks without clusters, no hand-off at all: the streaming floor
  grid5-132     a grid barrier after every phase: the one-launch layout measured before (fast/_layer_cuda.cu)
  grid2-cK      clusters of K: only the design's 2 grid barriers a layer (+part: and every block reading the 8
                partial rows of 2,048 fp32 after each)
  cluster-cK    … and the 3 cluster hand-offs with their pushes: the design (+math: with the arithmetic model;
                +lean: with a lighter one — each lane sums its scaled 16-byte products over the stage, one warp
                reduction and one shared-memory atomic a stage, as a GEMV that accumulates over K would)
  empty-*       the same schedule with 0 bytes a phase: the hand-off chain alone
Prints ms a step, TB/s of the bytes the blocks request, and where block 0 of each block's time goes (µs a layer,
mean over blocks): waiting for ring stages, at grid barriers, at cluster hand-offs, reading partials.

    python bench/cluster_floor.py [--reps 30] [--positions 2122 7000] [--stages 11] [--stage-kb 16] [--schedules …]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stream_floor import HEAD, RING_HELPERS, graph_ms  # noqa: E402

KERNEL = r'''
#define NC (NCW * 32)
#define SPIN (1 << 24)
__device__ __forceinline__ u32 cl_rank() { u32 r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ u32 cl_id() { u32 r; asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r)); return r; }
__device__ __forceinline__ u32 mapa(u32 a, u32 rank) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
__device__ __forceinline__ void st_remote(u32 a, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(a), "f"(v) : "memory");
}
__device__ __forceinline__ void cluster_all_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// a ring stage's wait with a poll limit (err set past it: the run is reported invalid instead of hanging)
__device__ __forceinline__ void mb_wait_lim(u32 b, u32 parity, int* err) {
  u32 ok;
  int n = 0;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(ok) : "r"(b), "r"(parity) : "memory");
  } while (!ok && ++n < SPIN);
  if (!ok) atomicOr(err, 1);
}
__device__ __forceinline__ void mb_wait_cluster(u32 b, u32 parity, int* err) {
  u32 ok;
  int n = 0;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}" : "=r"(ok) : "r"(b), "r"(parity) : "memory");
  } while (!ok && ++n < SPIN);
  if (!ok) atomicOr(err, 2);
}
// the consumers of every block meet (cooperative-groups style: fence, release count, acquire polls)
__device__ __forceinline__ void grid_sync(u32* c, int* err, unsigned long long* t) {
  asm volatile("bar.sync 1, %0;" ::"r"(NC) : "memory");
  if (threadIdx.x == 0) {
    const unsigned long long t0 = now();
    __threadfence();
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
    u32 v;
    int n = 0;
    do { asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory"); }
    while (v < gridDim.x && ++n < SPIN);
    if (v < gridDim.x) atomicOr(err, 4);
    *t += now() - t0;
  }
  asm volatile("bar.sync 1, %0;" ::"r"(NC) : "memory");
}
// a cluster hand-off: every consumer thread has pushed its values (st.shared::cluster); the first CL threads each
// arrive, with release at cluster scope, on one block's mbarrier k; thread 0 waits for this block's (parity: the
// layer's, each completes once a layer)
__device__ __forceinline__ void cluster_handoff(unsigned long long* cmb, int k, int layer, int* err,
                                                unsigned long long* t) {
  asm volatile("bar.sync 1, %0;" ::"r"(NC) : "memory");
  const unsigned long long t0 = now();
  if (threadIdx.x < CL) {
    asm volatile("fence.acq_rel.cluster;" ::: "memory");
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];"
                 ::"r"(mapa(sa(cmb + k), threadIdx.x)) : "memory");
  }
  if (threadIdx.x == 0) {
    mb_wait_cluster(sa(cmb + k), layer & 1, err);
    *t += now() - t0;
  }
  asm volatile("bar.sync 1, %0;" ::"r"(NC) : "memory");
}
// every consumer thread's share of the n partial-row floats the clusters wrote (past L1), summed; thread 0 times it
__device__ __forceinline__ float read_partials(const float* part, int n, unsigned long long* t) {
  const unsigned long long t0 = now();
  float a = 0.f;
  for (int i = threadIdx.x * 4; i < n; i += NC * 4) {
    const float4 v = __ldcg((const float4*)(part + i));
    a += v.x + v.y + v.z + v.w;
  }
  if (threadIdx.x == 0) *t += now() - t0;
  return a;
}
// a 16-byte word of int8 weight codes against the activation's two pair-code rows (hi, lo) at the same 16 k
__device__ __forceinline__ void pair_dots(const uint4& v, const signed char* hi, const signed char* lo, int& sh,
                                          int& sl) {
  const uint4 h = *(const uint4*)hi, l = *(const uint4*)lo;
  sh = __dp4a((int)v.x, (int)h.x, 0);
  sl = __dp4a((int)v.x, (int)l.x, 0);
  sh = __dp4a((int)v.y, (int)h.y, sh); sl = __dp4a((int)v.y, (int)l.y, sl);
  sh = __dp4a((int)v.z, (int)h.z, sh); sl = __dp4a((int)v.z, (int)l.z, sl);
  sh = __dp4a((int)v.w, (int)h.w, sh); sl = __dp4a((int)v.w, (int)l.w, sl);
}
// push q values of this block to every block of the cluster: rank s's slot of their buffer rx [CL][q]
__device__ __forceinline__ void push(float* rx, int q, float v) {
  const u32 s = cl_rank();
  for (int i = threadIdx.x; i < CL * q; i += NC) st_remote(mapa(sa(rx + s * q + i % q), i / q), v + i);
}
__device__ __forceinline__ float gather(const float* rx, int q) {
  float a = 0.f;
  for (int i = threadIdx.x; i < CL * q; i += NC) a += rx[i];
  return a;
}
// mode bits: 1 the design's 2 grid barriers a layer, 2 its cluster hand-offs, 4 the partial rows written and read
// around the grid barriers, 8 a grid barrier after every phase instead (grid5), 16 the arithmetic's cost model
// (32: its lean form — each lane sums its scaled groups over the stage, one warp reduction a stage)
// (krow[kind]: a product's row length in bytes)
// segs [6][G][2][2] (kind: qkv, K/V, o, gate/up, down, head; two segments (offset, length) in uint4s, offsets from
// the layer's base, the head's from 0); q1..q4: floats pushed to each rank at the hand-offs after qkv, attention,
// gate/up and down (0: no hand-off; the kv-head partition has none after down); np partial rows of HIDc
// floats read after a grid barrier, ps of them written by each block. tim [G][4] ns: ring waits, grid barriers,
// cluster hand-offs, partial reads.
extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NC + 32, 1)
cstep(const uint4* buf, const int* segs, const int* krow, int layers, int layer_u4, int S, int stage_u4, int mode,
      int q1, int q2, int q3, int q4, int np, int ps, float* part, u32* bar, int* err, u32* out,
      unsigned long long* tim) {
  extern __shared__ uint4 dyn[];
  __shared__ unsigned long long full[32], empty[32], cmb[4];
  uint4* ring = dyn;
  float* rx1 = (float*)(dyn + S * stage_u4);
  float* rx2 = rx1 + CL * q1;
  float* rx3 = rx2 + CL * q2;
  float* rx4 = rx3 + CL * q3;
  float* rowacc = rx4 + CL * q4;                   // 256 row sums of a product phase
  float* xsc = rowacc + 256;                       // 24 group scales of the activation's pair codes
  signed char* xhi = (signed char*)(xsc + 32);     // the activation's pair codes (6,144 each: the ffn width)
  signed char* xlo = xhi + 6144;
  const int G = gridDim.x, b = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) { mb_init(sa(full + i), 1); mb_init(sa(empty + i), NCW); }
    for (int i = 0; i < 4; ++i) mb_init(sa(cmb + i), CL);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  for (int i = threadIdx.x; i < 256; i += blockDim.x) rowacc[i] = 0.f;
  for (int i = threadIdx.x; i < 24; i += blockDim.x) xsc[i] = 1.f / (i + 1);
  for (int i = threadIdx.x; i < 6144; i += blockDim.x) {
    xhi[i] = (signed char)(i * 37);
    xlo[i] = (signed char)(i * 11);
  }
  cluster_all_sync();
  const int nk = 5 * layers + 1;
  if (warp == NCW) {  // the producer: every phase's segments, stage by stage, never waiting for a hand-off
    int k = 0;
    for (int ph = 0; ph < nk; ++ph) {
      const int kind = ph < 5 * layers ? ph % 5 : 5;
      const long long base = kind < 5 ? (long long)(ph / 5) * layer_u4 : 0;
      for (int j = 0; j < 2; ++j) {
        const int off = segs[((kind * G + b) * 2 + j) * 2], len = segs[((kind * G + b) * 2 + j) * 2 + 1];
        for (int c = 0; c < len; c += stage_u4, ++k) {
          const int st = k % S, n = min(stage_u4, len - c);
          if (lane == 0) {
            if (k >= S) mb_wait_lim(sa(empty + st), ((k / S) - 1) & 1, err);
            mb_expect(sa(full + st), (u32)n * 16);
            bulk(sa(ring + st * stage_u4), buf + base + off + c, (u32)n * 16, sa(full + st));
          }
          __syncwarp();
        }
      }
    }
  } else {
    u32 acc = 0;
    float facc = 0.f;
    int k = 0, nb = 0;
    unsigned long long tr = 0, tg = 0, tc = 0, tp = 0;
    const int grid5 = mode & 8, gsy = (mode & 1) && !grid5, csy = (mode & 2) && !grid5, prt = (mode & 4) && !grid5;
    const int math = mode & 48, lean = mode & 32, HIDc = HID_;
    float lsum = 0.f;
    // the two query heads' stand-in values (not q1: a float q1 here hid the push size q1 below, whose
    // pushes then truncated to 0 or less — no values sent at the first hand-off)
    const float qh0 = 0.01f * (b + 1), qh1 = -0.02f * (b + 1);
    for (int ph = 0; ph < nk; ++ph) {
      const int kind = ph < 5 * layers ? ph % 5 : 5, layer = ph / 5;
      if ((kind == 0 && layer > 0 && gsy) || (kind == 5 && gsy)) {
        grid_sync(bar + nb++, err, &tg);
        if (prt) facc += read_partials(part, np * HIDc, &tp);
      }
      for (int j = 0; j < 2; ++j) {
        const int len = segs[((kind * G + b) * 2 + j) * 2 + 1];
        for (int c = 0; c < len; c += stage_u4, ++k) {
          const int st = k % S, n = min(stage_u4, len - c);
          const unsigned long long t0 = threadIdx.x == 0 ? now() : 0;
          mb_wait_lim(sa(full + st), (k / S) & 1, err);
          if (threadIdx.x == 0) tr += now() - t0;
          if (math) {  // warp-uniform trip counts (the shuffles need every lane); lanes past n read zeros
            for (int i0 = warp * 32; i0 < n; i0 += NC) {
              const int i = i0 + lane;
              const uint4 v = i < n ? ring[st * stage_u4 + i] : make_uint4(0, 0, 0, 0);
              const int by = (c + i) * 16;  // byte of this lane's 16 in the segment
              if (kind == 1) {  // K/V rows of 256 B (128 bf16): 2 query heads' dot (K) or weighted sum (V)
                float d0 = 0.f, d1 = 0.f;
                const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                  const float lo = __uint_as_float(w[e] << 16), hi = __uint_as_float(w[e] & 0xffff0000u);
                  d0 = fmaf(lo, qh0, fmaf(hi, qh0, d0));
                  d1 = fmaf(lo, qh1, fmaf(hi, qh1, d1));
                }
                if (j == 0) {
#pragma unroll
                  for (int m = 8; m; m >>= 1) {
                    d0 += __shfl_xor_sync(0xffffffffu, d0, m);
                    d1 += __shfl_xor_sync(0xffffffffu, d1, m);
                  }
                  if ((lane & 15) == 0) facc += __expf(d0 - 8.f) + __expf(d1 - 8.f);
                } else {
                  facc += d0 + d1;
                }
              } else if (lean) {  // a product, summed per lane over the stage and reduced once a warp a stage
                const int kr = krow[kind], kb = by % kr;
                int sh, sl;
                pair_dots(v, xhi + kb, xlo + kb, sh, sl);
                lsum = fmaf(xsc[(kb >> 8) % 24], (float)sh + (float)sl * (1.f / 254), lsum);
                if (i0 + NC >= n) {  // the warp's last word of this stage: one reduction, one atomic
#pragma unroll
                  for (int m = 16; m; m >>= 1) lsum += __shfl_xor_sync(0xffffffffu, lsum, m);
                  if (lane == 0) atomicAdd(rowacc + (by / kr) % 256, lsum);
                  lsum = 0.f;
                }
              } else {  // a product: rows of kr bytes (int8 codes) against the pair codes, 256-groups over 16 lanes
                const int kr = krow[kind], kb = by % kr;
                int sh, sl;
                pair_dots(v, xhi + kb, xlo + kb, sh, sl);
#pragma unroll
                for (int m = 8; m; m >>= 1) {
                  sh += __shfl_xor_sync(0xffffffffu, sh, m);
                  sl += __shfl_xor_sync(0xffffffffu, sl, m);
                }
                if ((lane & 15) == 0 && i < n)
                  atomicAdd(rowacc + (by / kr) % 256, xsc[(kb >> 8) % 24] * ((float)sh + (float)sl * (1.f / 254)));
              }
            }
          } else {
            for (int i = threadIdx.x; i < n; i += NC) {
              const uint4 v = ring[st * stage_u4 + i];
              acc ^= v.x ^ v.y ^ v.z ^ v.w;
            }
          }
          __syncwarp();
          if (lane == 0) mb_arrive(sa(empty + st));
        }
      }
      if (math && kind != 1) {  // the phase's row sums (each output's scale) folded in, the slots cleared
        asm volatile("bar.sync 1, %0;" ::"r"(NC) : "memory");
        if (threadIdx.x < 256) { facc += rowacc[threadIdx.x] * 1e-3f; rowacc[threadIdx.x] = 0.f; }
      }
      if (grid5) {
        if (ph + 1 < nk) grid_sync(bar + nb++, err, &tg);
        continue;
      }
      const float v = (float)(acc & 255) + facc;
      if (kind == 0 && csy) { push(rx1, q1, v); cluster_handoff(cmb, 0, layer, err, &tc); facc += gather(rx1, q1); }
      if (kind == 1 && csy) { push(rx2, q2, v); cluster_handoff(cmb, 1, layer, err, &tc); facc += gather(rx2, q2); }
      if (kind == 2) {
        if (prt) for (int i = threadIdx.x; i < ps; i += NC) part[b * ps + i] = v + i;  // this block's o sums
        if (gsy) {
          grid_sync(bar + nb++, err, &tg);
          if (prt) facc += read_partials(part, np * HIDc, &tp);
        }
      }
      if (kind == 3 && csy) { push(rx3, q3, v); cluster_handoff(cmb, 2, layer, err, &tc); facc += gather(rx3, q3); }
      if (kind == 4) {
        if (csy && q4) { push(rx4, q4, v); cluster_handoff(cmb, 3, layer, err, &tc); facc += gather(rx4, q4); }
        if (prt) for (int i = threadIdx.x; i < ps; i += NC) part[b * ps + i] = facc + i;  // the cluster's down sums
      }
    }
    if (threadIdx.x == 0) {
      tim[b * 4] = tr; tim[b * 4 + 1] = tg; tim[b * 4 + 2] = tc; tim[b * 4 + 3] = tp;
    }
    atomicXor(out, acc ^ __float_as_uint(facc));
  }
  cluster_all_sync();  // no block leaves while another may still write its shared memory
}
extern "C" __global__ void reset(u32* bar, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) bar[i] = 0;
}
'''
SOURCE = HEAD + RING_HELPERS + KERNEL

HID, QKV_ROWS, FF, HEAD_ROWS, KV_HEADS, HEAD_DIM = 2048, 4096, 6144, 32_769, 8, 128  # model.md: int8 rows of 2,048 B
LAYERS = 28
NCW = 16
# the math model's row length (bytes) of each phase kind's products: qkv and gate/up rows of the hidden width, o over
# a cluster's 256 input columns, down over its 768, the head's rows (the K/V kind reads 256-byte positions)
KROW = (HID, 256, 256, HID, 768, HID)  # consumer warps a block


def layer_bytes(positions: int) -> dict:
    """Bytes of one layer's phases in the int8 step at `positions` cached positions (K and V in bf16)."""
    return dict(qkv=QKV_ROWS * HID, kv=2 * KV_HEADS * positions * HEAD_DIM * 2, o=HID * HID, gu=2 * FF * HID,
                down=HID * FF)


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """n items in `parts` nearly equal consecutive runs (the first n % parts one longer): [(start, count)]."""
    q, r = divmod(n, parts)
    out, at = [], 0
    for i in range(parts):
        c = q + (i < r)
        out.append((at, c))
        at += c
    return out


def segments(cl: int, clusters: int, positions: int) -> tuple[torch.Tensor, dict]:
    """The blocks' byte segments of every phase kind [6, blocks, 2, 2] (uint4 offset from the layer's base, length;
    blocks = cl × clusters) and the layout: the layer's size in uint4s, the hand-offs' push sizes.
    clusters 8 (one a kv head j; any cl): cluster j's blocks split by rows the qkv rows of j's 2 query heads, k_j
    and v_j (512 rows), j's K and V positions, the o_proj over j's 256 input columns (2,048 rows of 256 B, the
    weights tiled so at load), the gate/up rows of ffn columns 768j… (768 + 768 rows) and the down_proj over those
    768 inputs (2,048 rows of 768 B); the head's rows over every block. cl 1 (no clusters, any count): every phase
    split by rows over all blocks (K/V by positions of 256 B). Rows are whole, so a segment starts on a row."""
    blocks = cl * clusters
    if cl < 1 or clusters < 1 or (cl > 1 and clusters != KV_HEADS):
        raise ValueError(f"{clusters} clusters of {cl}: expected {KV_HEADS} clusters (one a kv head) of any size, "
                         f"or blocks without clusters (cluster size 1)")
    nb = layer_bytes(positions)
    u = 16
    seg = torch.zeros(6, blocks, 2, 2, dtype=torch.int64)
    base = {}
    at = 0
    for key in ("qkv", "kv", "o", "gu", "down"):
        base[key] = at
        at += nb[key]
    row_b = {"qkv": HID, "kv": HEAD_DIM * 2, "o": 2 * HEAD_DIM, "gu": HID, "down": 3 * 2 * HEAD_DIM}
    per_head = positions * HEAD_DIM * 2  # K (or V) bytes of one kv head
    for b in range(blocks):
        c, r = divmod(b, cl)
        if cl == 1:
            for kind, key in enumerate(("qkv", "kv", "o", "gu", "down")):
                rb = row_b[key] if key != "o" else HID
                start, cnt = _split(nb[key] // rb, blocks)[b]
                seg[kind, b, 0] = torch.tensor([base[key] + start * rb, cnt * rb])
        else:
            start, cnt = _split(4 * HEAD_DIM, cl)[r]  # the kv head's 512 qkv rows (tiled contiguous at load)
            seg[0, b, 0] = torch.tensor([base["qkv"] + (c * 4 * HEAD_DIM + start) * HID, cnt * HID])
            start, cnt = _split(positions, cl)[r]
            for j in range(2):  # K, then V
                seg[1, b, j] = torch.tensor([base["kv"] + (2 * c + j) * per_head + start * HEAD_DIM * 2,
                                             cnt * HEAD_DIM * 2])
            start, cnt = _split(HID, cl)[r]
            seg[2, b, 0] = torch.tensor([base["o"] + (c * HID + start) * row_b["o"], cnt * row_b["o"]])
            start, cnt = _split(2 * FF // KV_HEADS, cl)[r]
            seg[3, b, 0] = torch.tensor([base["gu"] + (c * 2 * FF // KV_HEADS + start) * HID, cnt * HID])
            start, cnt = _split(HID, cl)[r]
            seg[4, b, 0] = torch.tensor([base["down"] + (c * HID + start) * row_b["down"], cnt * row_b["down"]])
        start, cnt = _split(HEAD_ROWS, blocks)[b]
        seg[5, b, 0] = torch.tensor([start * HID, cnt * HID])
    assert bool((seg % u == 0).all()), "every segment 16-byte aligned"
    heads_per = 2 * KV_HEADS // KV_HEADS  # query heads a kv head (a cluster) has
    # pushes to each rank: the block's qkv outputs, its attention split's 2 heads' (max, sum, 128 sums), its
    # SiLU·up values of the cluster's 768 ffn columns; no fourth hand-off (each block owns whole down rows)
    q = dict(q1=-(-4 * HEAD_DIM // cl), q2=heads_per * (HEAD_DIM + 2), q3=-(-FF // KV_HEADS // cl), q4=0)
    if cl * sum(q.values()) % 4:  # the pair codes after the push buffers are read as 16-byte words (+math)
        raise ValueError(f"clusters of {cl}: the push buffers ({cl * sum(q.values())} floats) would misalign the "
                         f"kernel's shared-memory pair codes; sizes 1, 2, 4, 6–8, 12–14 and 16 fit")
    lay = dict(layer_u4=at // u, head_u4=-(-HEAD_ROWS * HID // u), np=KV_HEADS, ps=-(-HID // cl),
               blocks=blocks, **q)
    return (seg // u).to(torch.int32), lay


# name: (cluster size, clusters, mode bits, bytes on). Mode bits: 1 the 2 grid barriers a layer, 2 the cluster
# hand-offs, 4 partial rows around the grid barriers, 8 a grid barrier after every phase, 16 the arithmetic model,
# 32 its lean form
SCHEDULES = {
    "stream-132": (1, 132, 0, True), "stream-128": (1, 128, 0, True), "stream-96": (1, 96, 0, True),
    "grid5-132": (1, 132, 8, True), "grid5-132+math": (1, 132, 24, True), "stream-132+math": (1, 132, 16, True),
    "empty-grid5-132": (1, 132, 8, False),
    "stream-c16": (16, 8, 0, True), "grid2-c16": (16, 8, 1, True), "cluster-c16": (16, 8, 7, True),
    "cluster-c16+math": (16, 8, 23, True), "empty-cluster-c16": (16, 8, 7, False),
    "stream-c12": (12, 8, 0, True), "grid2-c12": (12, 8, 1, True), "grid2+part-c12": (12, 8, 5, True),
    "cluster-c12": (12, 8, 7, True), "cluster-c12+math": (12, 8, 23, True), "grid5-c12": (12, 8, 8, True),
    "empty-cluster-c12": (12, 8, 7, False),
    "stream-132+lean": (1, 132, 32, True), "grid5-132+lean": (1, 132, 40, True),
    "cluster-c16+lean": (16, 8, 39, True), "cluster-c12+lean": (12, 8, 39, True),
    "stream-c8": (8, 8, 0, True), "cluster-c8": (8, 8, 7, True), "cluster-c8+math": (8, 8, 23, True),
}


def kernel_resources(log: str, name: str) -> str:
    """ptxas's "Used N registers, …" line of kernel `name` in an NVRTC -v log ("?" without one). The log lists
    every entry function (`reset` first): the first such line of the log is not cstep's."""
    part = log.split(f"'{name}'", 1)[1] if f"'{name}'" in log else ""
    regs = [ln.split(":", 1)[-1].strip() for ln in part.splitlines() if "registers" in ln]
    return regs[0] if regs else "?"


def max_active_clusters(kern, blocks: int, threads: int, smem: int) -> int:
    """cuOccupancyMaxActiveClusters for a kernel with compile-time cluster dims (-1 where the driver call fails)."""
    from torch.cuda import _utils as cu

    class Config(ctypes.Structure):
        _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint),
                    ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("smem", ctypes.c_uint),
                    ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("nattrs", ctypes.c_uint)]
    lib = cu._get_gpu_runtime_library()
    n = ctypes.c_int(0)
    cfg = Config(blocks, 1, 1, threads, 1, 1, smem, None, None, 0)
    rc = lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), kern.func, ctypes.byref(cfg))
    return n.value if rc == 0 else -1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--positions", type=int, nargs="+", default=[2122, 7000])
    ap.add_argument("--stages", type=int, default=11)
    ap.add_argument("--stage-kb", type=int, default=16)
    ap.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=list(SCHEDULES))
    a = ap.parse_args()
    if not 1 <= a.stages <= 32:  # the kernel's full/empty mbarrier arrays hold 32 stages
        sys.exit(f"--stages {a.stages}: the ring holds 1 to 32 stages")
    if not torch.cuda.is_available():
        sys.exit("bench/cluster_floor.py measures an NVIDIA GPU; none is visible here")
    from torch.cuda import _utils as cu
    from yue2_core.fast._layer_cuda import nvrtc_compile
    dev = torch.device("cuda")
    cc = torch.cuda.get_device_capability(dev)
    if cc[0] < 9:
        sys.exit(f"thread-block clusters need compute capability 9.0 or newer; this GPU has {cc[0]}.{cc[1]}")
    lib = cu._get_gpu_runtime_library()
    threads = NCW * 32 + 32
    mods = {}
    for cl in sorted({SCHEDULES[s][0] for s in a.schedules}):
        cubin, log = nvrtc_compile(SOURCE, dict(CL=cl, NCW=NCW, HID_=HID), f"sm_{cc[0]}{cc[1]}")
        mods[cl] = cu._cuda_load_module(cubin, ["cstep", "reset"])
        print(f"cluster {cl}: cstep {kernel_resources(log, 'cstep')}")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"{torch.cuda.get_device_name()} · {sms} SMs · blocks of {threads} threads, one an SM · ring {a.stages} × "
          f"{a.stage_kb} KB")
    if any(SCHEDULES[s][0] * SCHEDULES[s][1] > sms for s in a.schedules):
        print(f"(schedules of more blocks than the GPU's {sms} SMs are skipped)")
    for positions in a.positions:
        total = LAYERS * sum(layer_bytes(positions).values()) + HEAD_ROWS * HID
        print(f"\n== {positions} cached positions: {total / 1e9:.3f} GB a step (int8 weights, bf16 K/V)")
        print(f"{'schedule':18} {'blocks':>6} {'ms/step':>8} {'TB/s':>6} {'vs grid5-132':>12}   µs a layer: "
              f"{'ring':>6} {'grid':>6} {'cluster':>7} {'partial':>7}")
        res = {}
        for name in a.schedules:
            cl, ncl, mode, on = SCHEDULES[name]
            seg, lay = segments(cl, ncl, positions)
            blocks = lay["blocks"]
            if blocks > sms:
                continue
            if not on:
                seg[..., 1] = 0
            kern, reset = mods[cl]["cstep"], mods[cl]["reset"]
            stage_u4 = a.stage_kb * 1024 // 16
            smem = (a.stages * a.stage_kb * 1024 + 4 * cl * (lay["q1"] + lay["q2"] + lay["q3"] + lay["q4"])
                    + 4 * (256 + 32) + 2 * FF)
            kern.set_shared_memory_config(smem)
            if cl > 8:  # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
                lib.cuFuncSetAttribute(kern.func, 14, 1)
            fit = max_active_clusters(kern, blocks, threads, smem)
            if 0 <= fit < ncl:
                print(f"{name:18} {blocks:6} skipped: {fit} clusters of {cl} fit at once, the schedule needs {ncl}")
                continue
            buf = getattr(main, "_buf", None)
            need = max(lay["layer_u4"] * LAYERS, lay["head_u4"]) * 4
            if buf is None or buf.numel() < need:
                buf = main._buf = torch.randint(0, 2 ** 31 - 1, (need,), dtype=torch.int32, device=dev)
            segs = seg.to(dev)
            krow = torch.tensor(KROW, dtype=torch.int32, device=dev)
            part = torch.zeros(lay["np"] * HID + blocks * lay["ps"], dtype=torch.float32, device=dev)
            bar = torch.zeros(LAYERS * 5 + 2, dtype=torch.int32, device=dev)
            err = torch.zeros(1, dtype=torch.int32, device=dev)
            out = torch.zeros(1, dtype=torch.int32, device=dev)
            tim = torch.zeros(blocks * 4, dtype=torch.int64, device=dev)

            def step():
                reset(grid=(1, 1, 1), block=(256, 1, 1), args=[bar, bar.numel()])
                kern(grid=(blocks, 1, 1), block=(threads, 1, 1),
                     args=[buf, segs, krow, LAYERS, lay["layer_u4"], a.stages, stage_u4, mode,
                           lay["q1"], lay["q2"], lay["q3"], lay["q4"], lay["np"], lay["ps"], part, bar, err, out,
                           tim], shared_mem=smem)
            ms = res[name] = graph_ms(step, a.reps)
            tb = (tim.view(blocks, 4).double().mean(0) / 1e3 / LAYERS).tolist()  # the last replay's stamps
            bad = " INVALID (a wait hit its poll limit)" if int(err.item()) else ""
            ratio = f"{res['grid5-132'] / ms:11.2f}×" if "grid5-132" in res and on else " " * 12
            streamed = total if on else 0
            print(f"{name:18} {blocks:6} {ms:8.3f} {streamed / ms / 1e9:6.2f} {ratio}   {'':12}{tb[0]:6.2f} "
                  f"{tb[1]:6.2f} {tb[2]:7.2f} {tb[3]:7.2f}{bad}")


if __name__ == "__main__":
    main()
