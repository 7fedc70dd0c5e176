"""Weights pulled into the GPU's L2 cache ahead of the decode step's products, on a side branch of the step
(`YUE2_L2_PREFETCH`, experimental, off by default).

A batch-1 decode step streams every layer weight once (1.48 GB int8) but its DRAM is busy only about a third of the
step: between two products come the norms, QK-norm/RoPE, the attention and SiLU·up, chains of dependent latency that
move few bytes (`bench/profile_decode.py`'s bandwidth table). A `Prefetcher` launches, on a second stream forked from
the step at chosen points, a tiny kernel whose threads issue `cp.async.bulk.prefetch.L2` (Hopper, sm_90+) over the
weights of the products to come — e.g. after the qkv product, the o_proj and gate/up weights — so the DRAM works
during those chains and the products read L2. The forks are ordinary stream dependencies, so CUDA-graph capture
records them as a parallel branch; `join()` merges the branch back before the step ends. Nothing is computed on the
branch: results are bit-identical whether it runs or not.

Measured on an H200 (2026-12-05, int8, batch 1; docs/experiments/l2_prefetch_h200_2026-12-05.log): slower at every
plan tried — 1.65–3.5 ms a step against 1.37 without the branch. The prefetch kernels take 10–27 µs a launch of GPU
time and crowd the memory system the GEMVs stream from, which gain only 5–6 %. Kept, off, as the measured record and
for other GPUs; not a default.

The spec (`YUE2_L2_PREFETCH`): `off` (default), or `POINT:W[,W…][;POINT:W…]` — POINT one of `start` (before a
layer's first norm), `qkv`, `attn`, `o`, `gu`, `down` (after that kernel is launched), W one of `qkv o gu down`
(this layer's weight; `kv`: its K and V cache up to the step's attention length) or the same with `+` (the next
layer's). `YUE2_L2_PREFETCH_GRID=BLOCKS:PIECE_KB` sets the
prefetch kernel's grid (default 8 blocks of 32 threads, 64 KB a prefetch instruction).
"""
from __future__ import annotations

import os

import torch

from ..errors import RequestError

POINTS = ("start", "qkv", "attn", "o", "gu", "down")
WEIGHTS = ("qkv", "o", "gu", "down", "kv")
_MODULES = {"qkv": ("self_attn", "qkv_proj"), "o": ("self_attn", "o_proj"), "gu": ("mlp", "gate_up_proj"),
            "down": ("mlp", "down_proj")}

SOURCE = r"""
// `count` runs of `bytes` bytes, `stride` bytes apart from `base`, in pieces of `piece` bytes (all multiples of 16),
// one cp.async.bulk.prefetch.L2 a piece, the pieces dealt round robin to every thread of the grid.
extern "C" __global__ void yue2_l2_prefetch(const char* base, int bytes, int piece, int count, int stride) {
  long long per_run = ((long long)bytes + piece - 1) / piece;
  long long pieces = per_run * count;
  for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < pieces; j += (long long)gridDim.x * blockDim.x) {
    long long run = j / per_run, off = (j % per_run) * piece;
    long long left = (long long)bytes - off;
    int n = (int)(left < piece ? left : piece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(base + run * stride + off), "r"(n) : "memory");
  }
}
"""


def parse(spec: str) -> dict[str, list[tuple[str, int]]]:
    """`YUE2_L2_PREFETCH`'s value → {point: [(weight, layer offset 0 or 1), …]}; {} for off/empty. RequestError
    naming the bad part otherwise."""
    spec = spec.strip()
    if spec in ("", "off", "0"):
        return {}
    plan: dict[str, list[tuple[str, int]]] = {}
    form = (f"off, or POINT:W[,W…][;POINT:W…] with POINT one of {', '.join(POINTS)} and W one of "
            f"{', '.join(WEIGHTS)} (+ for the next layer's)")
    for part in filter(str.strip, spec.split(";")):  # empty parts (a trailing ';') are nothing
        point, sep, names = part.partition(":")
        point = point.strip()
        if not sep or point not in POINTS or not names.strip():
            raise RequestError(f"the environment variable YUE2_L2_PREFETCH must be {form}; {part.strip()!r} is not "
                               "POINT:WEIGHTS")
        for w in names.split(","):
            w = w.strip()
            base = w.rstrip("+")
            if base not in WEIGHTS or len(w) - len(base) > 1:
                raise RequestError(f"the environment variable YUE2_L2_PREFETCH must be {form}; weight {w!r} is not "
                                   "one of them")
            plan.setdefault(point, []).append((base, len(w) - len(base)))
    return plan


DEFAULT_GRID = (8, 64 * 1024)  # (blocks of 32 threads, bytes a prefetch instruction)


def grid() -> tuple[int, int]:
    """(blocks, piece bytes) from YUE2_L2_PREFETCH_GRID (BLOCKS:PIECE_KB in ASCII digits; default 8:64)."""
    value = os.environ.get("YUE2_L2_PREFETCH_GRID", "").strip()
    if not value:
        return DEFAULT_GRID
    parts = [p.strip() for p in value.split(":")]
    if (len(parts) != 2 or not all(p.isascii() and p.isdigit() and len(p) <= 4 for p in parts)
            or not all(1 <= int(p) <= 1024 for p in parts)):
        raise RequestError(f"the environment variable YUE2_L2_PREFETCH_GRID must be BLOCKS:PIECE_KB (decimal "
                           f"integers 1–1024 each), got {value!r}")
    return int(parts[0]), int(parts[1]) * 1024


_KERNELS: dict = {}


def _kernel(device: torch.device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _KERNELS:
        from torch.cuda import _utils as cu
        from ._layer_cuda import nvrtc_compile
        cc = torch.cuda.get_device_capability(index)
        cubin, _ = nvrtc_compile(SOURCE, {}, f"sm_{cc[0]}{cc[1]}")
        with torch.cuda.device(index):
            _KERNELS[index] = cu._cuda_load_module(cubin, ["yue2_l2_prefetch"])["yue2_l2_prefetch"]
    return _KERNELS[index]


class Prefetcher:
    """Issues the spec's L2 prefetches for `layers` (the AR decoder layers) on a side stream of `device`. `at(point,
    i)` forks the side stream from the current one and launches the prefetches named for `point` of layer i; `join()`
    makes the current stream wait for the branch (call it before the step ends, inside a graph capture too). Raises
    RequestError for a bad spec, RuntimeError when the kernel cannot be built (no sm_90, no NVRTC)."""

    def __init__(self, layers, device: torch.device, spec: str):
        self.plan = parse(spec)
        self.layers, self.device = list(layers), device
        if not self.plan:
            return
        if torch.cuda.get_device_capability(device) < (9, 0):
            raise RuntimeError("L2 bulk prefetch needs an sm_90+ GPU")
        self.kernel = _kernel(device)
        self.blocks, self.piece = grid()
        self.side = torch.cuda.Stream(device)
        self.forked = False

    def __bool__(self) -> bool:
        return bool(self.plan)

    def _weight(self, name: str, i: int):
        outer, inner = _MODULES[name]
        return getattr(getattr(self.layers[i], outer), inner).weight

    def _runs(self, name: str, i: int, caches, attn_len: int) -> list:
        """[(tensor, bytes a run, runs, stride bytes)] to prefetch for weight `name` of layer i."""
        if name != "kv":
            w = self._weight(name, i)
            return [(w, w.numel() * w.element_size(), 1, 0)]
        out = []
        for cache in caches:  # [rows, kv heads, capacity, head dim]: the first attn_len positions of each (row, head)
            t = cache[i]
            row = t.stride(2) * t.element_size()
            out.append((t, min(attn_len, t.shape[2]) * row, t.shape[0] * t.shape[1], t.stride(1) * t.element_size()))
        return out

    def at(self, point: str, i: int, caches=(), attn_len: int = 0) -> None:
        """Fork the side stream here and prefetch what the plan names for `point` of layer i; `caches` = (K layers,
        V layers) and the step's `attn_len` for `kv`."""
        todo = [(w, i + off) for w, off in self.plan.get(point, ()) if i + off < len(self.layers)
                and (w != "kv" or caches)]
        if not todo:
            return
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side):
            for name, layer in todo:
                for t, nbytes, runs, stride in self._runs(name, layer, caches, attn_len):
                    self.kernel(grid=(self.blocks, 1, 1), block=(32, 1, 1),
                                args=[t, nbytes, self.piece, runs, stride])
        self.forked = True

    def join(self) -> None:
        if self.forked:
            torch.cuda.current_stream(self.device).wait_stream(self.side)
            self.forked = False
