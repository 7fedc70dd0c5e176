// The one-launch decoder layer in CUDA C++ (fast/persistent.py, YUE2_LAYER_KERNEL=cuda; issue #18 item 2).
// Compiled at run time by NVRTC (fast/_layer_cuda.py, PyTorch's own libnvrtc) with the model's dims as macros:
//   R_ rows (1–4), HID hidden, NH query heads, NKV kv heads, HD head dim (128), FF ffn, INT8 (ConvRot int8 codes
//   with fp32 row scales, or bf16 weights), NT threads a block (512).
// One block per multiprocessor (every block resident at once: grid barriers are counters in global memory).
// The same five phases, rounding points and buffers as the Triton layer kernel (fast/_layer_triton.py):
//   0  every block: x (+ delta) → RMSNorm (→ ·H for int8) into shared memory; qkv_proj tiles    → qkv [R, QKV]
//   1  (row, kv head, split) per block: QK-norm + RoPE, the new k/v into the cache, flash-decoding over the
//      split's chunk; the last split of a (row, kv head) merges (→ ·H for int8)                  → att [R, NH·HD]
//   2  o_proj tiles                                                                             → ob [R, HID]
//   3  every block: x + o → RMSNorm (→ ·H); gate/up tiles, SiLU·up in the epilogue               → act [R, FF]
//   4  every block: act (→ ·H) into shared memory; down_proj tiles                              → dout [R, HID]
// What differs from the Triton kernel: the products run on the tensor cores (mma.m16n8k16; int8 codes → f16 exactly
// by a byte permute, x in f16 for int8 decoders, bf16 as is), each block owning 16-row tiles whose column items its
// 16 warps stream with the next item's loads in flight, the sums meeting in shared memory; every phase's first
// weights (and the attention's first cache positions) are loaded before the barrier that precedes it (they do not
// depend on the step); loads of what other blocks wrote in this launch go past L1 (__ldcg).
// Measured on an H200 (docs/experiments/layer_kernel_cuda_h200_2026-12-04.log): correct (GPU tests) but slower than
// the per-kernel step (int8 batch 1: 1.60 vs 1.38 ms a step). Block 0's clock per layer: grid barriers 2–6 µs each,
// the attention's flash loop 6.9 µs for 144 positions (three dependent load → shuffle/exp rounds), product phases
// 2–9 µs — the step is a chain of memory round trips, not a stream. bench/layer_kernel.py --modes off,cuda
// --phase-times prints the same.

#define G (NH / NKV)
#define QKV ((NH + 2 * NKV) * HD)
#define NW (NT / 32)
#define XS (HID > FF ? HID : FF)
#define SPIN_LIMIT (1 << 22)
#define SB 1  // cache position slots a lane reads at a time in the attention (4 positions a warp a slot; 2 spill)
// experimental switches (fast/_layer_cuda.py: YUE2_LAYER_CUDA_OPTS=pipe,fexp; stop 58, not yet measured on a GPU):
#ifndef ATT_PIPE
#define ATT_PIPE 0  // 1: the attention loads cache batch b + 1 before computing batch b
#endif
#ifndef FAST_EXP
#define FAST_EXP 0  // 1: the attention loop's exponentials by ex2.approx (__expf), as Triton's tl.exp
#endif
#define AEXP(x) (FAST_EXP ? __expf(x) : expf(x))
#define ACC 4096  // floats of shared memory for a product phase's tile sums (fast/_layer_cuda.py checks the fit)

typedef unsigned short bf16_t;
typedef unsigned int u32;
#define NEG_INF __int_as_float(0xff800000)
template <bool C, class A, class B> struct pick_t { typedef A type; };
template <class A, class B> struct pick_t<false, A, B> { typedef B type; };
static_assert(HD == 128, "a lane holds 4 dims of a 128-wide head in the attention");
static_assert(HID % 256 == 0 && FF % 256 == 0 && NH * HD == HID, "Qwen3 shapes in 256-groups");

__device__ __forceinline__ float bf(u32 h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ bf16_t f2bf(float f) {  // round to nearest even (as torch), NaN stays NaN
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_t)(u >> 16);
}
__device__ __forceinline__ float rbf(float f) { return bf(f2bf(f)); }

// loads of data other blocks wrote in this launch go past L1 (not coherent across blocks): __ldcg, after the barrier
// (grid_sync ends in __syncthreads). Loaded 16 bytes at a time where they are rows: one round trip for a row, not one
// per element (volatile asm scalar loads in a loop cost 12 L2 round trips a thread for the act rows).
__device__ __forceinline__ float ldcg_bf(const bf16_t* p) { return bf(__ldcg(p)); }
// weight loads: read-only for the whole launch, streamed once (no L1 allocation)
__device__ __forceinline__ uint4 ldw(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ldw(const uint2* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ void words(const uint4& v, u32* w) { w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w; }
__device__ __forceinline__ void words(const uint2& v, u32* w) { w[0] = v.x; w[1] = v.y; }
__device__ __forceinline__ void unpack8(const uint4& v, float* f) {  // 8 bf16 → fp32
  f[0] = bf(v.x & 0xffffu); f[1] = bf(v.x >> 16); f[2] = bf(v.y & 0xffffu); f[3] = bf(v.y >> 16);
  f[4] = bf(v.z & 0xffffu); f[5] = bf(v.z >> 16); f[6] = bf(v.w & 0xffffu); f[7] = bf(v.w >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// every block of the grid arrives at *c and waits until all have (cooperative-groups style: thread 0 fences, counts
// with release semantics and polls with acquire loads); err set after SPIN_LIMIT polls (a block never resident)
__device__ __forceinline__ void grid_sync(u32* c, int* err) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
    u32 v;
    int spins = 0;
    while (true) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
      if (v >= gridDim.x) break;
      if (++spins > SPIN_LIMIT) { atomicOr(err, 1); break; }
    }
    __threadfence();
  }
  __syncthreads();
}

// block 0's clock (ns, %globaltimer) at point k (0–9 phases, 10–14 inside its first attention item) of this layer,
// when timing (bench/layer_kernel.py --phase-times)
__device__ __forceinline__ void stamp(unsigned long long* tim, int timing, int layer, int k) {
  if (timing && blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    tim[layer * 16 + k] = t;
  }
}

// sums of R_ per-thread values over the block; red: 32·R_ floats of shared memory
__device__ __forceinline__ void block_sums(float* v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < R_; ++r) {
    float s = warp_sum(v[r]);
    if (lane == 0) red[r * 32 + warp] = s;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < R_; ++r) {
    float s = 0.f;
    for (int w = 0; w < NW; ++w) s += red[r * 32 + w];
    v[r] = s;
  }
  __syncthreads();
}

// t: R_ rows at stride XS, each [0, len) in 256-groups → every group times (R4⊗R4⊗R4⊗R4) (the /16 is left to the
// caller); four radix-4 stages over digit strides 1, 4, 16, 64
__device__ __forceinline__ void rotate(float* t, int len) {
  const int per_row = len / 256, groups = R_ * per_row;
#pragma unroll 1
  for (int st = 1; st <= 64; st *= 4) {
    for (int q = threadIdx.x; q < groups * 64; q += NT) {
      const int g = q >> 6, j = q & 63;
      float* p = t + (g / per_row) * XS + (g % per_row) * 256 + (j / st) * st * 4 + (j % st);
      const float a0 = p[0], a1 = p[st], a2 = p[2 * st], a3 = p[3 * st];
      const float s = (a0 + a1) + (a2 + a3);
      p[0] = s - 2.f * a3;
      p[st] = s - 2.f * a2;
      p[2 * st] = s - 2.f * a1;
      p[3 * st] = s - 2.f * a0;
    }
    __syncthreads();
  }
}

// ---- the products on the tensor cores ----------------------------------------------------------------------------
// A product phase is out[r, n] = Σ_k xs[r, k] · W[n, k] (· s[n]) over tiles of 16 weight rows. Each block owns the
// tiles b, b + blocks, …; its warps split them into items of (tile, KUNIT columns), stream an item's weights (a lane:
// 16 bytes of row g and of row g + 8 for each of NC chunks, g = lane / 4) and multiply them with mma.m16n8k16, the
// rows of x as the 8 columns of B (R_ used), the fp32 sums of the items meeting in shared memory. The k order inside
// an mma is a permutation of the physical one, the same for A and B: lane t = lane % 4 feeds the slots 2t, 2t+1,
// 2t+8, 2t+9 with 4 consecutive weights of its 16 bytes. int8: codes → f16 exactly (a byte permute into the mantissa
// of 1024, minus 1152) and x in f16 (xs holds f16 for int8 decoders: bf16 values are exact in f16's normal range);
// bf16: weights and x as they are. Products are exact, sums fp32, as the reference's bf16 GEMM.
__device__ __forceinline__ u32 f2h(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ u32 code2(u32 w, u32 sel) {  // two int8 codes of w (flipped sign bits) → f16x2, exact
  u32 h = __byte_perm(w, 0x64646464u, sel), o;
  asm("sub.f16x2 %0, %1, %2;" : "=r"(o) : "r"(h), "r"(0x64806480u));
  return o;
}
__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if INT8
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}
// the bits xs holds for one activation: f16 of the bf16-rounded value (int8 decoders; exact for |v| in f16's normal
// range 6.1e-5 … 65504 — an activation beyond 65504 would become Inf, one below loses low bits) or bf16
__device__ __forceinline__ bf16_t xbits(float v) { return INT8 ? (bf16_t)f2h(rbf(v)) : f2bf(v); }

// One item's weights: NC chunks × (row g, row g + 8) × 16 bytes a lane
template <int K, int NC>
struct Item {
  static constexpr int ES = INT8 ? 1 : 2;       // bytes a weight
  static constexpr int E = 16 / ES;             // weights in a lane's 16 bytes
  static constexpr int KCH = 4 * E;             // columns a chunk (4 lanes side by side)
  static constexpr int KUNIT = NC * KCH;        // columns an item
  static constexpr int KU = K / KUNIT;          // items a tile
  static_assert(K % KUNIT == 0, "K a multiple of an item's columns");
  uint4 w[NC][2];

  __device__ __forceinline__ void load(const void* W, int row0, int ku) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        w[c][h] = ldw(reinterpret_cast<const uint4*>((const unsigned char*)W +
                      ((size_t)(row0 + g + 8 * h) * K + ku * KUNIT + c * KCH + t * E) * ES));
  }

  // acc (this lane's C fragment) += W[row0 + 16 rows, item ku] · xs[rows, same columns]ᵀ
  __device__ __forceinline__ void mma(const bf16_t* xs, int ku, float* acc) const {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int k0 = ku * KUNIT + c * KCH + t * E;
      u32 xb[E / 2];  // B: this lane's column g (= row g of x), its E columns, as 16-bit pairs
      if (g < R_) {
        const uint4* xp = reinterpret_cast<const uint4*>(xs + g * XS + k0);
#pragma unroll
        for (int q = 0; q < E / 8; ++q) {
          const uint4 v = xp[q];
          xb[4 * q] = v.x; xb[4 * q + 1] = v.y; xb[4 * q + 2] = v.z; xb[4 * q + 3] = v.w;
        }
      } else {
#pragma unroll
        for (int q = 0; q < E / 2; ++q) xb[q] = 0u;
      }
      const u32 lo[4] = {w[c][0].x, w[c][0].y, w[c][0].z, w[c][0].w};
      const u32 hi[4] = {w[c][1].x, w[c][1].y, w[c][1].z, w[c][1].w};
#if INT8
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // word j: 4 codes → slots (2t, 2t+1) and (2t+8, 2t+9)
        const u32 a = lo[j] ^ 0x80808080u, b = hi[j] ^ 0x80808080u;
        mma16816(acc, code2(a, 0x5140u), code2(b, 0x5140u), code2(a, 0x5342u), code2(b, 0x5342u), xb[2 * j],
                 xb[2 * j + 1]);
      }
#else
#pragma unroll
      for (int j = 0; j < 2; ++j) mma16816(acc, lo[2 * j], hi[2 * j], lo[2 * j + 1], hi[2 * j + 1], xb[2 * j], xb[2 * j + 1]);
#endif
    }
  }
};

// A product phase's geometry: N rows of W [*, K] in 16-row tiles (PAIR: gate/up — tile i is rows 16i… of gate and of
// up, FF rows on: 2·KU items a tile), NC chunks an item. This block's tiles are b, b + blocks, …
template <int N, int K, int NC, bool PAIR>
struct Phase {
  typedef Item<K, NC> It;
  static constexpr int T = N / 16, PER = (PAIR ? 2 : 1) * It::KU;  // tiles, items a tile
  static_assert(N % 16 == 0, "rows in 16-row tiles");
  __device__ __forceinline__ static int tiles() { return ((int)blockIdx.x < T) ? (T - 1 - blockIdx.x) / gridDim.x + 1 : 0; }
  // item i of this block → its tile's first weight row, its column unit, and its accumulator slot (local tile, half)
  __device__ __forceinline__ static void where(int i, int& row0, int& ku, int& slot) {
    const int tl = i / PER, rest = i % PER, half = PAIR ? rest / It::KU : 0;
    ku = rest % It::KU;
    row0 = half * FF + (blockIdx.x + tl * gridDim.x) * 16;
    slot = tl * (PAIR ? 2 : 1) + half;
  }
  __device__ __forceinline__ static bool preload(It& it, const void* W) {
    const int i = threadIdx.x >> 5;
    if (i >= tiles() * PER) return false;
    int row0, ku, slot;
    where(i, row0, ku, slot);
    it.load(W, row0, ku);
    return true;
  }
  // every item of this warp (i = warp, + NW, …), the next one's loads in flight during an mma; sums into
  // red [slots][16][R_] (zeroed here), then epi(tile index, row in tile, r, v) for every (tile, row, r) of this block,
  // v pointing at the sum (gate/up: the up half's sum at v[16·R_])
  template <class Epi>
  __device__ __forceinline__ static void run(It& cur, bool have, const void* W, const bf16_t* xs, float* red, Epi epi) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int n_items = tiles() * PER, slots = tiles() * (PAIR ? 2 : 1);
    for (int i = threadIdx.x; i < slots * 16 * R_; i += NT) red[i] = 0.f;
    __syncthreads();
    if (have) {
      int i = threadIdx.x >> 5;
      while (true) {
        const int in = i + NW;
        It nxt;
        if (in < n_items) {
          int row0, ku, slot;
          where(in, row0, ku, slot);
          nxt.load(W, row0, ku);
        }
        int row0, ku, slot;
        where(i, row0, ku, slot);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        cur.mma(xs, ku, acc);
        // C: (row g, columns 2t, 2t+1), (row g + 8, the same)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = 2 * t + (e & 1), row = g + 8 * (e >> 1);
          if (col < R_) atomicAdd(red + (slot * 16 + row) * R_ + col, acc[e]);
        }
        if (in >= n_items) break;
        cur = nxt;
        i = in;
      }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < tiles() * 16 * R_; j += NT) {
      const int tl = j / (16 * R_), row = (j / R_) % 16, r = j % R_;
      epi(blockIdx.x + tl * gridDim.x, row, r, red + ((tl * (PAIR ? 2 : 1)) * 16 + row) * R_ + r);
    }
  }
};

// tmp rows [R_, len] (fp32, bf16-valued) → (·H for int8) → xs (xbits)
__device__ __forceinline__ void to_xs(float* tmp, bf16_t* xs, int len) {
#if INT8
  rotate(tmp, len);
#endif
  for (int r = 0; r < R_; ++r)
    for (int i = threadIdx.x; i < len; i += NT) xs[r * XS + i] = xbits(INT8 ? tmp[r * XS + i] * 0.0625f : tmp[r * XS + i]);
  __syncthreads();
}

// rows of x (+ d) → bf16 RMSNorm · w (→ ·H for int8) into xs [R_, HID] (xbits); xstore: the summed x
// (block 0 only). The add_rmsnorm_kernel's rounding: x = bf16(x + d), r = bf16(1/√(mean x² + eps)),
// y = bf16(bf16(x·r)·w). cg: x and d were written in this launch. 8 elements a thread at a time (16-byte loads).
__device__ __forceinline__ void norm_rows(const bf16_t* x, const bf16_t* d, bool cg, const bf16_t* w, bf16_t* xstore,
                                          float* tmp, bf16_t* xs, float eps, float* red) {
  float part[R_];
#pragma unroll
  for (int r = 0; r < R_; ++r) {
    part[r] = 0.f;
    for (int i = threadIdx.x * 8; i < HID; i += NT * 8) {
      const uint4* xp = reinterpret_cast<const uint4*>(x + r * HID + i);
      float v[8];
      unpack8(cg ? __ldcg(xp) : *xp, v);
      if (d != nullptr) {
        const uint4* dp = reinterpret_cast<const uint4*>(d + r * HID + i);
        float dv[8];
        unpack8(cg ? __ldcg(dp) : *dp, dv);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = rbf(v[e] + dv[e]);
        if (xstore != nullptr) {
          uint4 o;
          o.x = f2bf(v[0]) | ((u32)f2bf(v[1]) << 16); o.y = f2bf(v[2]) | ((u32)f2bf(v[3]) << 16);
          o.z = f2bf(v[4]) | ((u32)f2bf(v[5]) << 16); o.w = f2bf(v[6]) | ((u32)f2bf(v[7]) << 16);
          *reinterpret_cast<uint4*>(xstore + r * HID + i) = o;
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        tmp[r * XS + i + e] = v[e];
        part[r] += v[e] * v[e];
      }
    }
  }
  block_sums(part, red);
#pragma unroll
  for (int r = 0; r < R_; ++r) {
    const float rr = rbf(1.0f / sqrtf(part[r] / HID + eps));
    for (int i = threadIdx.x; i < HID; i += NT) tmp[r * XS + i] = rbf(rbf(tmp[r * XS + i] * rr) * bf(w[i]));
  }
  __syncthreads();
  to_xs(tmp, xs, HID);
}

// QK-norm + split-half RoPE of head `h` of row r of qkv, by one warp (lane: pairs i = lane, lane + 32, …), with
// qk_rope_kernel's rounding; returns the head's 2·(HD/2) values in o1/o2 [HD/64] (bf16-valued floats)
__device__ __forceinline__ void rope_head(const bf16_t* qkv, int r, int h, const bf16_t* nw, const float* cosb,
                                          const float* sinb, float eps, float* o1, float* o2) {
  const int lane = threadIdx.x & 31;
  constexpr int P = HD / 64;
  float f1[P], f2[P], ss = 0.f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int i = lane + 32 * p;
    f1[p] = ldcg_bf(qkv + r * QKV + h * HD + i);
    f2[p] = ldcg_bf(qkv + r * QKV + h * HD + HD / 2 + i);
    ss += f1[p] * f1[p] + f2[p] * f2[p];
  }
  ss = warp_sum(ss);
  const float rr = rbf(1.0f / sqrtf(ss / HD + eps));
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int i = lane + 32 * p;
    const float n1 = rbf(rbf(f1[p] * rr) * bf(nw[i])), n2 = rbf(rbf(f2[p] * rr) * bf(nw[HD / 2 + i]));
    const float c = rbf(cosb[r * (HD / 2) + i]), sn = rbf(sinb[r * (HD / 2) + i]);
    o1[p] = rbf(rbf(n1 * c) - rbf(n2 * sn));
    o2[p] = rbf(rbf(n2 * c) + rbf(n1 * sn));
  }
}

// The attention's item it: (row, kv head, split) and its cache geometry
struct AttItem {
  int r, kvh, sp, pos, start, hi;  // hi: positions of the chunk at or before pos
  size_t base;
  __device__ __forceinline__ AttItem(int it, const long long* posb, int cache_row, int cache_head, int chunk,
                                     int splits, int L) {
    r = it / (NKV * splits);
    kvh = (it / splits) % NKV;
    sp = it % splits;
    const long long pl = posb[r];
    pos = (int)(pl < L - 1 ? pl : L - 1);
    start = sp * chunk;
    hi = pos + 1 - start;
    hi = hi < chunk ? hi : chunk;
    base = (size_t)r * cache_row + (size_t)kvh * cache_head;
  }
};

// A batch of cache positions a lane reads: SB slots × (16 dims of a K row, of a V row). Lane = 4 position groups
// (pg = lane / 8) × 8 dim groups (dl = lane % 8, dims 16·dl…); slot u of batch b, warp w: position
// start + ((b·SB + u)·NW + w)·4 + pg
struct KVBatch {
  uint4 k[SB][2], v[SB][2];
  __device__ __forceinline__ static int pos_of(int b, int u) {
    return ((b * SB + u) * NW + (threadIdx.x >> 5)) * 4 + ((threadIdx.x & 31) >> 3);
  }
  __device__ __forceinline__ void load_slot(const bf16_t* kc, const bf16_t* vc, const AttItem& a, int u, int j) {
    const size_t off = a.base + (size_t)(a.start + j) * HD + (threadIdx.x & 7) * 16;
    k[u][0] = *reinterpret_cast<const uint4*>(kc + off);
    k[u][1] = *reinterpret_cast<const uint4*>(kc + off + 8);
    v[u][0] = *reinterpret_cast<const uint4*>(vc + off);
    v[u][1] = *reinterpret_cast<const uint4*>(vc + off + 8);
  }
  // the slots of batch b below `limit` (chunk positions); the others keep stale bits, which the attention never
  // adds (0 · Inf or NaN bits would be NaN: the masked slot's product is selected away)
  __device__ __forceinline__ void load(const bf16_t* kc, const bf16_t* vc, const AttItem& a, int b, int limit) {
#pragma unroll
    for (int u = 0; u < SB; ++u) {
      const int j = pos_of(b, u);
      if (j < limit) load_slot(kc, vc, a, u, j);
    }
  }
};

// one item of the attention: QK-norm + RoPE, the new k/v, flash-decoding over its chunk (pre: its first batch,
// read before the barrier; nullptr: read here), the block's partial (m, l, o) for the item's split; the last split
// of a (row, kv head) merges them all into att
__device__ __forceinline__ void att_item(int it, const KVBatch* pre, const bf16_t* qkv, const bf16_t* qn,
                                         const bf16_t* kn, const float* cosb, const float* sinb, const long long* posb,
                                         bf16_t* kc, bf16_t* vc, int cache_row, int cache_head, float* mbuf,
                                         float* lbuf, float* obuf, int* cnt, bf16_t* att, float eps, float scale,
                                         int chunk, int splits, int L, float* sm, unsigned long long* tim,
                                         int timing, int layer) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, dl = lane & 7;
  timing = timing && pre != nullptr;  // stamps: the first item only
  float* qsm = sm;                    // [G][HD]
  float* wm = qsm + G * HD;           // [NW][G]
  float* wl = wm + NW * G;            // [NW][G]
  float* wacc = wl + NW * G;          // [NW][G][HD]
  float* rot = wacc + NW * G * HD;    // [G·HD] the merged heads (one 256-group for int8)
  int* flag = (int*)(rot + G * HD);
  {
    const AttItem a(it, posb, cache_row, cache_head, chunk, splits, L);
    if (warp < G) {
      float o1[HD / 64], o2[HD / 64];
      rope_head(qkv, a.r, a.kvh * G + warp, qn, cosb, sinb, eps, o1, o2);
#pragma unroll
      for (int p = 0; p < HD / 64; ++p) {
        qsm[warp * HD + lane + 32 * p] = o1[p];
        qsm[warp * HD + HD / 2 + lane + 32 * p] = o2[p];
      }
    } else if (warp == G && a.pos >= a.start && a.pos < a.start + chunk) {  // this split holds the new position
      float o1[HD / 64], o2[HD / 64];
      rope_head(qkv, a.r, NH + a.kvh, kn, cosb, sinb, eps, o1, o2);
#pragma unroll
      for (int p = 0; p < HD / 64; ++p) {
        kc[a.base + (size_t)a.pos * HD + lane + 32 * p] = f2bf(o1[p]);
        kc[a.base + (size_t)a.pos * HD + HD / 2 + lane + 32 * p] = f2bf(o2[p]);
      }
      for (int i = lane; i < HD; i += 32)
        vc[a.base + (size_t)a.pos * HD + i] = f2bf(ldcg_bf(qkv + a.r * QKV + (NH + NKV + a.kvh) * HD + i));
    }
    __syncthreads();
    stamp(tim, timing, layer, 10);
    u32 q[G][8];  // this lane's 16 query dims of each head, bf16 pairs (the values are bf16)
    float m[G], l[G], acc[G][16];
#pragma unroll
    for (int h = 0; h < G; ++h) {
      m[h] = NEG_INF;
      l[h] = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        q[h][e] = f2bf(qsm[h * HD + dl * 16 + 2 * e]) | ((u32)f2bf(qsm[h * HD + dl * 16 + 2 * e + 1]) << 16);
#pragma unroll
      for (int e = 0; e < 16; ++e) acc[h][e] = 0.f;
    }
#if ATT_PIPE
    // software pipeline: batch b + 1's loads are in flight while batch b is computed (one memory round trip for
    // the chunk instead of one a batch; twice the K/V registers)
    KVBatch nxt;
    if (pre != nullptr) {  // preloaded before the barrier (older positions); the new one read now
      nxt = *pre;
#pragma unroll
      for (int u = 0; u < SB; ++u)
        if (KVBatch::pos_of(0, u) == a.pos - a.start) nxt.load_slot(kc, vc, a, u, a.pos - a.start);
    } else {
      nxt.load(kc, vc, a, 0, a.hi);
    }
#endif
    for (int b = 0; b * SB * NW * 4 < a.hi; ++b) {
#if ATT_PIPE
      const KVBatch kv = nxt;
      if ((b + 1) * SB * NW * 4 < a.hi) nxt.load(kc, vc, a, b + 1, a.hi);
#else
      KVBatch kv;
      if (pre != nullptr && b == 0) {  // preloaded before the barrier (older positions); the new one read now
        kv = *pre;
#pragma unroll
        for (int u = 0; u < SB; ++u)
          if (KVBatch::pos_of(0, u) == a.pos - a.start) kv.load_slot(kc, vc, a, u, a.pos - a.start);
      } else {
        kv.load(kc, vc, a, b, a.hi);
      }
#endif
      float sc[SB][G];
#pragma unroll
      for (int u = 0; u < SB; ++u) {
        float kf[16];
        unpack8(kv.k[u][0], kf);
        unpack8(kv.k[u][1], kf + 8);
#pragma unroll
        for (int h = 0; h < G; ++h) {
          float d = 0.f;
#pragma unroll
          for (int e = 0; e < 16; ++e) d = fmaf((e & 1) ? __uint_as_float(q[h][e >> 1] & 0xffff0000u)
                                                       : __uint_as_float(q[h][e >> 1] << 16), kf[e], d);
          d += __shfl_xor_sync(0xffffffffu, d, 1);
          d += __shfl_xor_sync(0xffffffffu, d, 2);
          d += __shfl_xor_sync(0xffffffffu, d, 4);
          sc[u][h] = KVBatch::pos_of(b, u) < a.hi ? d * scale : NEG_INF;
        }
      }
#pragma unroll
      for (int h = 0; h < G; ++h) {
        float mb = sc[0][h];
#pragma unroll
        for (int u = 1; u < SB; ++u) mb = fmaxf(mb, sc[u][h]);
        const float mn = fmaxf(m[h], mb);
        if (mn == NEG_INF) continue;  // nothing of this position group yet
        const float alpha = AEXP(m[h] - mn);
        float ps = 0.f;
#pragma unroll
        for (int e = 0; e < 16; ++e) acc[h][e] *= alpha;
#pragma unroll
        for (int u = 0; u < SB; ++u) {
          const float p = AEXP(sc[u][h] - mn);  // 0 for a masked slot
          ps += p;
          const float pb = rbf(p);
          float vf[16];
          unpack8(kv.v[u][0], vf);
          unpack8(kv.v[u][1], vf + 8);
          const bool live = KVBatch::pos_of(b, u) < a.hi;  // a masked slot's V registers hold stale bits
#pragma unroll
          for (int e = 0; e < 16; ++e) acc[h][e] = live ? fmaf(pb, vf[e], acc[h][e]) : acc[h][e];
        }
        l[h] = l[h] * alpha + ps;
        m[h] = mn;
      }
    }
    // the 4 position groups of the warp → one (m, l, acc) a head, on lanes 0–7
#pragma unroll
    for (int off = 8; off <= 16; off *= 2)
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float mo = __shfl_xor_sync(0xffffffffu, m[h], off), lo = __shfl_xor_sync(0xffffffffu, l[h], off);
        const float mn = fmaxf(m[h], mo);
        const float ea = m[h] == NEG_INF ? 0.f : AEXP(m[h] - mn), eb = mo == NEG_INF ? 0.f : AEXP(mo - mn);
        l[h] = l[h] * ea + lo * eb;
#pragma unroll
        for (int e = 0; e < 16; ++e) acc[h][e] = acc[h][e] * ea + __shfl_xor_sync(0xffffffffu, acc[h][e], off) * eb;
        m[h] = mn;
      }
    stamp(tim, timing, layer, 11);
    if (lane < 8) {
#pragma unroll
      for (int h = 0; h < G; ++h) {
        if (lane == 0) { wm[warp * G + h] = m[h]; wl[warp * G + h] = l[h]; }
#pragma unroll
        for (int e = 0; e < 16; ++e) wacc[(warp * G + h) * HD + dl * 16 + e] = acc[h][e];
      }
    }
    __syncthreads();
    const int r = a.r, kvh = a.kvh, sp = a.sp;
    const int slot0 = ((r * NKV + kvh) * splits + sp) * G;
    for (int t = threadIdx.x; t < G * HD; t += NT) {
      const int h = t / HD, dd = t % HD;
      float top = NEG_INF;
      for (int w = 0; w < NW; ++w) top = fmaxf(top, wm[w * G + h]);
      float o = 0.f, ls = 0.f;
      if (top != NEG_INF)
        for (int w = 0; w < NW; ++w) {
          const float mw = wm[w * G + h];
          const float e = mw == NEG_INF ? 0.f : expf(mw - top);
          o += wacc[(w * G + h) * HD + dd] * e;
          ls += wl[w * G + h] * e;
        }
      obuf[(size_t)(slot0 + h) * HD + dd] = o;
      if (dd == 0) { mbuf[slot0 + h] = top; lbuf[slot0 + h] = ls; }
    }
    __syncthreads();
    stamp(tim, timing, layer, 12);
    if (threadIdx.x == 0) {
      __threadfence();
      *flag = atomicAdd(cnt + r * NKV + kvh, 1);
    }
    __syncthreads();
    stamp(tim, timing, layer, 13);
    if (*flag == splits - 1) {  // the last split of (r, kvh): merge every split's (m, l, o)
      __threadfence();
      for (int t = threadIdx.x; t < G * HD; t += NT) {
        const int h = t / HD, dd = t % HD;
        const int s0 = (r * NKV + kvh) * splits * G + h;
        float top = NEG_INF;
        for (int s = 0; s < splits; ++s) top = fmaxf(top, __ldcg(mbuf + s0 + s * G));
        float num = 0.f, den = 0.f;
        for (int s = 0; s < splits; ++s) {
          const float ms = __ldcg(mbuf + s0 + s * G);
          const float e = ms == NEG_INF ? 0.f : expf(ms - top);
          num += __ldcg(obuf + (size_t)(s0 + s * G) * HD + dd) * e;
          den += __ldcg(lbuf + s0 + s * G) * e;
        }
        rot[t] = rbf(num / den);
      }
      __syncthreads();
#if INT8
      {  // the G heads are one 256-group of the o_proj input: rounded, then rotated (G·HD = 256)
        for (int st = 1; st <= 64; st *= 4) {
          for (int q2 = threadIdx.x; q2 < 64; q2 += NT) {
            float* p = rot + (q2 / st) * st * 4 + (q2 % st);
            const float a0 = p[0], a1 = p[st], a2 = p[2 * st], a3 = p[3 * st];
            const float s = (a0 + a1) + (a2 + a3);
            p[0] = s - 2.f * a3; p[st] = s - 2.f * a2; p[2 * st] = s - 2.f * a1; p[3 * st] = s - 2.f * a0;
          }
          __syncthreads();
        }
      }
#endif
      for (int t = threadIdx.x; t < G * HD; t += NT)
        att[r * NH * HD + kvh * G * HD + t] = f2bf(INT8 ? rot[t] * 0.0625f : rot[t]);
      if (threadIdx.x == 0) cnt[r * NKV + kvh] = 0;
    }
    __syncthreads();
    stamp(tim, timing, layer, 14);
    if (timing && blockIdx.x == 0 && threadIdx.x == 0) tim[layer * 16 + 15] = *flag == splits - 1;
  }
}


__device__ __forceinline__ void attention(const bf16_t* qkv, const bf16_t* qn, const bf16_t* kn, const float* cosb,
                                          const float* sinb, const long long* posb, bf16_t* kc, bf16_t* vc,
                                          int cache_row, int cache_head, float* mbuf, float* lbuf, float* obuf,
                                          int* cnt, bf16_t* att, float eps, float scale, int chunk, int splits, int L,
                                          float* sm, const KVBatch& pre, unsigned long long* tim, int timing,
                                          int layer) {
  const int items = R_ * NKV * splits;
  if ((int)blockIdx.x < items)
    att_item(blockIdx.x, &pre, qkv, qn, kn, cosb, sinb, posb, kc, vc, cache_row, cache_head, mbuf, lbuf, obuf, cnt,
             att, eps, scale, chunk, splits, L, sm, tim, timing, layer);
  for (int it = blockIdx.x + gridDim.x; it < items; it += gridDim.x)
    att_item(it, nullptr, qkv, qn, kn, cosb, sinb, posb, kc, vc, cache_row, cache_head, mbuf, lbuf, obuf, cnt, att,
             eps, scale, chunk, splits, L, sm, tim, timing, layer);
}

extern "C" __global__ void __launch_bounds__(NT, 1) yue2_layer(
    const bf16_t* xin, const bf16_t* dprev, bf16_t* xm, bf16_t* xout, const bf16_t* ln1, const bf16_t* ln2,
    const bf16_t* qn, const bf16_t* kn, const void* wqkv, const float* sqkv, const void* wo, const float* so,
    const void* wgu, const float* sgu, const void* wd, const float* sd, const float* cosb, const float* sinb,
    const long long* posb, bf16_t* kc, bf16_t* vc, int cache_row, int cache_head, bf16_t* qkv, float* mbuf,
    float* lbuf, float* obuf, int* cnt, bf16_t* att, bf16_t* ob, bf16_t* act, bf16_t* dout, u32* bar, u32* reset,
    int* err, int has_d, double eps_d, double scale_d, int chunk, int splits, int L, unsigned long long* tim,
    int timing, int layer) {
  extern __shared__ float4 smem4[];
  bf16_t* xs = reinterpret_cast<bf16_t*>(smem4);                  // [R_][XS] the products' input (xbits)
  float* tmp = reinterpret_cast<float*>(xs + R_ * XS);            // [R_][XS] fp32 work rows
  float* red = tmp + R_ * XS;                                     // [R_][32] block sums
  float* sums = red + 32 * R_;                                    // [ACC] the products' tile sums
  float* asm_ = sums + ACC;                                       // the attention's scratch
  const float eps = (float)eps_d, scale = (float)scale_d;
  if (blockIdx.x == 0 && threadIdx.x < 4) reset[threadIdx.x] = 0;
  stamp(tim, timing, layer, 0);
  {
    // phase 0: norm + qkv_proj (the first weights in flight during the norm)
    typedef Phase<QKV, HID, 4, false> P;
    P::It it;
    const bool have = P::preload(it, wqkv);
    norm_rows(xin, has_d ? dprev : nullptr, false, ln1, (has_d && blockIdx.x == 0) ? xm : nullptr, tmp, xs, eps, red);
    P::run(it, have, wqkv, xs, sums, [&](int tile, int row, int r, const float* v) {
      const int n = tile * 16 + row;
      qkv[r * QKV + n] = f2bf(INT8 ? v[0] * sqkv[n] : v[0]);
    });
  }
  stamp(tim, timing, layer, 1);
  KVBatch kv;  // this block's first attention batch: cache positions before the new one, read across the barrier
  if ((int)blockIdx.x < R_ * NKV * splits) {
    const AttItem a(blockIdx.x, posb, cache_row, cache_head, chunk, splits, L);
    kv.load(kc, vc, a, 0, a.pos - a.start);
  }
  grid_sync(bar + 0, err);
  stamp(tim, timing, layer, 2);
  // phase 1: attention
  attention(qkv, qn, kn, cosb, sinb, posb, kc, vc, cache_row, cache_head, mbuf, lbuf, obuf, cnt, att, eps, scale,
            chunk, splits, L, asm_, kv, tim, timing, layer);
  stamp(tim, timing, layer, 3);
  {
    // phase 2: o_proj (att is already rotated for int8); its first weights in flight across the barrier
    typedef Phase<HID, NH * HD, 2, false> P;
    P::It it;
    const bool have = P::preload(it, wo);
    grid_sync(bar + 1, err);
    stamp(tim, timing, layer, 4);
    for (int r = 0; r < R_; ++r)
      for (int i = threadIdx.x * 8; i < NH * HD; i += NT * 8) {
        const uint4 v = __ldcg(reinterpret_cast<const uint4*>(att + r * NH * HD + i));
#if INT8
        float f[8];
        unpack8(v, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) xs[r * XS + i + e] = (bf16_t)f2h(f[e]);
#else
        *reinterpret_cast<uint4*>(xs + r * XS + i) = v;
#endif
      }
    __syncthreads();
    P::run(it, have, wo, xs, sums, [&](int tile, int row, int r, const float* v) {
      const int n = tile * 16 + row;
      ob[r * HID + n] = f2bf(INT8 ? v[0] * so[n] : v[0]);
    });
  }
  stamp(tim, timing, layer, 5);
  {
    // phase 3: x + o → norm → gate/up tiles, SiLU·up
    typedef Phase<FF, HID, 4, true> P;
    P::It it;
    const bool have = P::preload(it, wgu);
    grid_sync(bar + 2, err);
    stamp(tim, timing, layer, 6);
    norm_rows(has_d ? xm : xin, ob, true, ln2, blockIdx.x == 0 ? xout : nullptr, tmp, xs, eps, red);
    P::run(it, have, wgu, xs, sums, [&](int tile, int row, int r, const float* v) {
      const int n = tile * 16 + row;  // act = bf16(bf16(silu(bf16 g)) · bf16 u) (silu_mul_kernel's rounding)
      const float ag = INT8 ? v[0] * sgu[n] : v[0];
      const float au = INT8 ? v[16 * R_] * sgu[FF + n] : v[16 * R_];
      const float gg = rbf(ag);
      const float sl = rbf(gg / (1.0f + expf(-gg)));
      act[r * FF + n] = f2bf(sl * rbf(au));
    });
  }
  stamp(tim, timing, layer, 7);
  {
    // phase 4: act (→ ·H) → down_proj
    typedef Phase<HID, FF, 2, false> P;
    P::It it;
    const bool have = P::preload(it, wd);
    grid_sync(bar + 3, err);
    stamp(tim, timing, layer, 8);
    for (int r = 0; r < R_; ++r)
      for (int i = threadIdx.x * 8; i < FF; i += NT * 8) {
        float v[8];
        unpack8(__ldcg(reinterpret_cast<const uint4*>(act + r * FF + i)), v);
#pragma unroll
        for (int e = 0; e < 8; ++e) tmp[r * XS + i + e] = v[e];
      }
    __syncthreads();
    to_xs(tmp, xs, FF);
    P::run(it, have, wd, xs, sums, [&](int tile, int row, int r, const float* v) {
      const int n = tile * 16 + row;
      dout[r * HID + n] = f2bf(INT8 ? v[0] * sd[n] : v[0]);
    });
  }
  stamp(tim, timing, layer, 9);
}
