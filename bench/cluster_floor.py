"""The floor of a decode step partitioned by thread-block clusters (issue #18 item 2): one launch a step, the
int8 step's bytes streamed by a producer warp per block into a shared-memory ring (bulk copies, as
bench/stream_floor.py's `ring`), and the layer's hand-offs placed where a cluster partition puts them.

Why clusters. A one-launch layer so far needed a grid barrier between each of its 5 phases (qkv → attention → o →
gate/up → down → next qkv): 140 a step, ≈ 2–3 µs each over the stream (stream_floor.py). Three of the five are
local to a slice of the model if the blocks are grouped right:
  - a cluster of CL blocks per kv head j (CL = 16: 8 clusters × 16 = 128 blocks) computes the qkv rows of j's
    2 query heads, k_j and v_j, and then the attention of those heads: qkv → attention is a hop inside the cluster;
  - the attention's splits (each block a range of positions) merge inside the cluster, and the cluster computes
    the o_proj partial over its heads' 256 input columns (one 256-group of ConvRot's rotation): attention → o is
    local too; the o partials of the 8 clusters meet at a grid barrier (the RMSNorm needs the whole row);
  - every block owns 48 ffn columns: gate/up and then down_proj over those 48 inputs, the down partials summed
    inside the cluster (and the int8 input's 256-groups rotated from the cluster's blocks): gate/up → down is local;
    the 8 cluster partials meet at the next layer's grid barrier.
So 2 grid barriers a layer and 4 cluster hand-offs (each: the producing blocks push their few values into the
consumers' shared memory with st.shared::cluster, then arrive on each block's mbarrier with release at cluster
scope; a hardware path that never leaves the GPC). With CL = 8 (the portable cluster size) a cluster is one query
head: its blocks compute k_j / v_j and stream j's K/V as the sibling cluster does (the same addresses at about the
same time: L2 hits, not DRAM), 16 clusters.

Nothing is computed but an XOR of the loaded bytes, or (`+math`) a cost model of the arithmetic: the products as
rows of int8 codes against the activation's pair codes in shared memory (two dp4a a word, each 256-group summed
over 16 lanes by shuffles, scaled and added to its row's sum by a shared-memory atomic), the K/V rows against two
query heads (bf16 → fp32, 16 FMAs a 16-byte word, a 16-lane reduction and two exp a K row) — the work a real
kernel's consumers do per byte, not its results. Rows are floors of their schedules, comparable within a run:
  stream        no hand-off at all: the streaming floor
  grid5         a grid barrier after every phase: the one-launch layout measured before (fast/_layer_cuda.cu)
  grid2         only the cluster design's 2 grid barriers a layer
  grid2+part    … and every block reading the clusters' partial rows (8 × 2,048 fp32) after each
  cluster       … and the 4 cluster hand-offs with their pushes: the design
  cluster+math  … with the arithmetic's cost model
  cluster8      the design with clusters of 8 (one query head each, 16 clusters)
  empty-*       the same schedule with 0 bytes a phase: the hand-off chain alone
Prints ms a step, TB/s of the bytes the blocks request, and where block time goes (µs a layer, mean over blocks):
waiting for ring stages, at grid barriers, at cluster hand-offs, reading partials.

    python bench/cluster_floor.py [--reps 30] [--positions 2122 7000] [--stages 11] [--stage-kb 16] [--schedules …]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stream_floor import HEAD, RING_HELPERS  # noqa: E402

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
// mode bits: 1 the design's 2 grid barriers a layer, 2 its 4 cluster hand-offs, 4 the partial rows written and read
// around the grid barriers, 8 a grid barrier after every phase instead (grid5), 16 the arithmetic's cost model
// (krow[kind]: a product's row length in bytes)
// segs [6][G][2][2] (kind: qkv, K/V, o, gate/up, down, head; two segments (offset, length) in uint4s, offsets from
// the layer's base, the head's from 0); q[4]: floats pushed to each rank at the 4 hand-offs; np partial rows of HIDc
// floats read after a grid barrier, ps of them written by each block. tim [G][4] ns: ring waits, grid barriers,
// cluster hand-offs, partial reads.
extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NC + 32, 1)
cstep(const uint4* buf, const int* segs, const int* krow, int layers, int layer_u4, int S, int stage_u4, int mode, int q1, int q2,
      int q3, int q4, int np, int ps, float* part, u32* bar, int* err, u32* out, unsigned long long* tim) {
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
  for (int i = threadIdx.x; i < 6144; i += blockDim.x) { xhi[i] = (signed char)(i * 37); xlo[i] = (signed char)(i * 11); }
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
    const int math = mode & 16, HIDc = HID_;
    const float q0 = 0.01f * (b + 1), q1 = -0.02f * (b + 1);
    for (int ph = 0; ph < nk; ++ph) {
      const int kind = ph < 5 * layers ? ph % 5 : 5, layer = ph / 5;
      if ((kind == 0 && layer > 0 && gsy) || (kind == 5 && gsy)) {
        grid_sync(bar + nb++, err, &tg);
        if (prt) {
          const unsigned long long t0 = now();
          for (int i = threadIdx.x * 4; i < np * HIDc; i += NC * 4) {
            const float4 v = __ldcg((const float4*)(part + i));
            facc += v.x + v.y + v.z + v.w;
          }
          if (threadIdx.x == 0) tp += now() - t0;
        }
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
                  d0 = fmaf(lo, q0, fmaf(hi, q0, d0));
                  d1 = fmaf(lo, q1, fmaf(hi, q1, d1));
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
              } else {  // a product: rows of kr bytes (int8 codes) against the pair codes, 256-groups over 16 lanes
                const int kr = krow[kind], kb = by % kr;
                const uint4 h = *(const uint4*)(xhi + kb), l = *(const uint4*)(xlo + kb);
                int sh = __dp4a((int)v.x, (int)h.x, 0), sl = __dp4a((int)v.x, (int)l.x, 0);
                sh = __dp4a((int)v.y, (int)h.y, sh); sl = __dp4a((int)v.y, (int)l.y, sl);
                sh = __dp4a((int)v.z, (int)h.z, sh); sl = __dp4a((int)v.z, (int)l.z, sl);
                sh = __dp4a((int)v.w, (int)h.w, sh); sl = __dp4a((int)v.w, (int)l.w, sl);
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
          if (prt) {
            const unsigned long long t0 = now();
            for (int i = threadIdx.x * 4; i < np * HIDc; i += NC * 4) {
              const float4 w = __ldcg((const float4*)(part + i));
              facc += w.x + w.y + w.z + w.w;
            }
            if (threadIdx.x == 0) tp += now() - t0;
          }
        }
      }
      if (kind == 3 && csy) { push(rx3, q3, v); cluster_handoff(cmb, 2, layer, err, &tc); facc += gather(rx3, q3); }
      if (kind == 4) {
        if (csy) { push(rx4, q4, v); cluster_handoff(cmb, 3, layer, err, &tc); facc += gather(rx4, q4); }
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


def segments(cl: int, blocks: int, positions: int) -> tuple[torch.Tensor, dict]:
    """The blocks' byte segments of every phase kind [6, blocks, 2, 2] (uint4 offset from the layer's base, length)
    and the layout (the layer's size in uint4s, the hand-offs' push sizes). cl 16: cluster = kv head (8 × 16
    blocks), its qkv rows and K/V split over its blocks; cl 8: cluster = query head (16 × 8), its q rows plus its
    kv head's k/v rows and K/V (the same bytes as the sibling cluster's). o, gate/up, down, head: a block's equal
    share, contiguous (the weights tiled so at load)."""
    if (cl, blocks) not in ((16, 128), (8, 128)):
        raise ValueError(f"cluster size {cl} with {blocks} blocks: expected 16 or 8 with 128 blocks")
    nb = layer_bytes(positions)
    u = 16
    seg = torch.zeros(6, blocks, 2, 2, dtype=torch.int64)
    qkv0, kv0 = 0, nb["qkv"]
    o0 = kv0 + nb["kv"]
    gu0 = o0 + nb["o"]
    dn0 = gu0 + nb["gu"]
    end = dn0 + nb["down"]
    per_head = positions * HEAD_DIM * 2  # K (or V) bytes of one kv head
    for b in range(blocks):
        c, r = divmod(b, cl)
        if cl == 16:
            grp = c
            seg[0, b, 0] = torch.tensor([qkv0 + b * (nb["qkv"] // blocks), nb["qkv"] // blocks])
        else:
            grp = c // 2
            q_rows = HID // (2 * KV_HEADS)  # 128 rows: one query head
            own = q_rows * HID // cl
            kvw = 2 * HEAD_DIM * HID // cl
            seg[0, b, 0] = torch.tensor([qkv0 + c * q_rows * HID + r * own, own])
            seg[0, b, 1] = torch.tensor([qkv0 + HID * HID + grp * 2 * HEAD_DIM * HID + r * kvw, kvw])
        pos = -(-positions // cl)
        lo, hi = r * pos, min(positions, (r + 1) * pos)
        ln = max(0, hi - lo) * HEAD_DIM * 2
        seg[1, b, 0] = torch.tensor([kv0 + grp * 2 * per_head + lo * HEAD_DIM * 2, ln])
        seg[1, b, 1] = torch.tensor([kv0 + grp * 2 * per_head + per_head + lo * HEAD_DIM * 2, ln])
        for kind, base, n in ((2, o0, nb["o"]), (3, gu0, nb["gu"]), (4, dn0, nb["down"])):
            seg[kind, b, 0] = torch.tensor([base + b * (n // blocks), n // blocks])
        hb = -(-HEAD_ROWS * HID // blocks // u) * u
        seg[5, b, 0] = torch.tensor([b * hb, max(0, min(hb, HEAD_ROWS * HID - b * hb))])
    assert bool((seg % u == 0).all()), "every segment 16-byte aligned"
    heads_per = 2 * KV_HEADS // (blocks // cl)  # query heads a cluster owns
    q = dict(q1=(heads_per + 2) * HEAD_DIM // cl, q2=heads_per * (HEAD_DIM + 2), q3=FF // blocks, q4=HID // cl)
    lay = dict(layer_u4=end // u, head_u4=-(-HEAD_ROWS * HID // u), np=blocks // cl, ps=HID // cl, **q)
    return (seg // u).to(torch.int32), lay


SCHEDULES = {  # name: (cluster size, mode bits, bytes on)
    "stream": (16, 0, True), "grid5": (16, 8, True), "grid2": (16, 1, True), "grid2+part": (16, 5, True),
    "cluster": (16, 7, True), "stream+math": (16, 16, True), "grid5+math": (16, 24, True),
    "cluster+math": (16, 23, True), "cluster8": (8, 7, True), "cluster8+math": (8, 23, True),
    "empty-grid5": (16, 8, False), "empty-cluster": (16, 7, False), "empty-cluster8": (8, 7, False),
}


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
    if not torch.cuda.is_available():
        sys.exit("bench/cluster_floor.py measures an NVIDIA GPU; none is visible here")
    from torch.cuda import _utils as cu
    from yue2_core.fast._layer_cuda import nvrtc_compile
    dev = torch.device("cuda")
    cc = torch.cuda.get_device_capability(dev)
    if cc[0] < 9:
        sys.exit(f"thread-block clusters need compute capability 9.0 or newer; this GPU has {cc[0]}.{cc[1]}")
    lib = cu._get_gpu_runtime_library()
    blocks, threads = 128, NCW * 32 + 32
    mods = {}
    for cl in sorted({SCHEDULES[s][0] for s in a.schedules}):
        cubin, log = nvrtc_compile(SOURCE, dict(CL=cl, NCW=NCW, HID_=HID), f"sm_{cc[0]}{cc[1]}")
        mods[cl] = cu._cuda_load_module(cubin, ["cstep", "reset"])
        regs = [ln.strip() for ln in log.splitlines() if "registers" in ln]
        print(f"cluster {cl}: {regs[:1]}")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"{torch.cuda.get_device_name()} · {sms} SMs · {blocks} blocks of {threads} threads · ring {a.stages} × "
          f"{a.stage_kb} KB")
    for positions in a.positions:
        total = LAYERS * sum(layer_bytes(positions).values()) + HEAD_ROWS * HID
        print(f"\n== {positions} cached positions: {total / 1e9:.3f} GB a step (int8 weights, bf16 K/V)")
        print(f"{'schedule':15} {'ms/step':>8} {'TB/s':>6} {'vs grid5':>8}   µs a layer: {'ring':>6} {'grid':>6} "
              f"{'cluster':>7} {'partial':>7}")
        res = {}
        for name in a.schedules:
            cl, mode, on = SCHEDULES[name]
            seg, lay = segments(cl, blocks, positions)
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
            if 0 <= fit < blocks // cl:
                print(f"{name:15} skipped: {fit} clusters of {cl} fit at once, the schedule needs {blocks // cl}")
                continue
            buf = getattr(main, "_buf", None)
            need = max(lay["layer_u4"] * LAYERS, lay["head_u4"]) * 4
            if buf is None or buf.numel() < need:
                buf = main._buf = torch.randint(0, 2 ** 31 - 1, (need,), dtype=torch.int32, device=dev)
            segs = seg.to(dev)
            krow = torch.tensor(KROW, dtype=torch.int32, device=dev)
            part = torch.zeros(lay["np"] * HID, dtype=torch.float32, device=dev)
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
            step()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            g.replay()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(a.reps):
                g.replay()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) / a.reps * 1e3
            res[name] = ms
            tb = (tim.view(blocks, 4).double().mean(0) / 1e3 / LAYERS).tolist()  # the last replay's stamps
            bad = " INVALID (a wait hit its poll limit)" if int(err.item()) else ""
            ratio = f"{res['grid5'] / ms:7.2f}×" if "grid5" in res and not name.startswith("empty") else " " * 8
            streamed = total if on else 0
            print(f"{name:15} {ms:8.3f} {streamed / ms / 1e9:6.2f} {ratio}   {'':12}{tb[0]:6.2f} {tb[1]:6.2f} "
                  f"{tb[2]:7.2f} {tb[3]:7.2f}{bad}")


if __name__ == "__main__":
    main()
