"""One launch per decoder layer in the decode step (CUDA, Triton; issue #18 item 2).

The fused step (`decode.PhaseDecoder._forward_fused`) runs ~10 kernels a layer (add+RMSNorm, the split-K GEMVs and
their consumers, QK-norm+RoPE, the attention); at batch 1 a third of its time is per-kernel fixed cost
(docs/experiments/profile_decode_int8_bandwidth_h200_2026-12-03.log: 298 kernels, 2.84 µs a GEMV launch). Here
one kernel (`_layer_triton.layer_kernel`) runs a whole layer: one program per multiprocessor, five phases (norm +
qkv_proj, attention, o_proj, norm + gate/up + SiLU·up, down_proj) separated by grid barriers — atomic counters
in global memory, so every program must be resident at once (grid = the SM count, one block each). The norms and
the ConvRot rotations are recomputed by every program instead of launched; SiLU·up is the gate/up tiles' epilogue.

Modes (YUE2_LAYER_KERNEL): "grid" (one launch a layer, barriers), "phased" (the same kernel, one launch per phase:
the CPU interpreter's mode — it runs programs one after another, so a barrier would never open — and a check of the
grid mode's arithmetic), "cuda" (the same phases and buffers in CUDA C++, `_layer_cuda.cu`, compiled by NVRTC at
first use: products on the tensor cores, 16 warps a multiprocessor, bf16 decoders only), "off". Same arithmetic and
rounding points as the fused step's kernels; only summation order differs (each product sums its whole K in one
program instead of split-K partial sums). All are slower than the per-kernel step on an H200
(docs/experiments/layer_kernel_h200_2026-12-04.log, layer_kernel_cuda_h200_2026-12-04.log).
"""
from __future__ import annotations

import functools
import os

import torch

from ..switches import choice

PHASES = 5
MODES = ("grid", "phased", "cuda", "off")
# the CUDA kernel's measurement switch (bench/layer_kernel.py --phase-times): block 0's clock stamps at 15 points of
# every layer (`LayerKernel.tim`); read when a LayerKernel is made
CUDA_TIMING = 0
# register spill (bytes a thread) the CUDA kernel may have and still run: a few words stay in L1 (the tiny test
# model's int8 build at 2 rows spills 4 B); beyond, the kernel is refused
SPILL_LIMIT = 64


@functools.lru_cache(maxsize=1)
def _kernel():
    from . import triton_modules
    if triton_modules() is None:
        return None
    from . import _layer_triton
    return triton_modules()[0], _layer_triton.layer_kernel


def mode(default: str = "off") -> str:
    """YUE2_LAYER_KERNEL, validated ("grid", "phased", "cuda" or "off"; RequestError otherwise)."""
    return choice("YUE2_LAYER_KERNEL", MODES, default)


def unsupported(ar, rows: int, dtype: torch.dtype, how: str = "grid") -> str | None:
    """Why the layer kernel cannot run this model's decode step for `rows` rows, or None when it can: Qwen3 shapes
    with heads·head_dim = hidden, hidden a power-of-two multiple of 256, ffn a multiple of 256, 1–16 query heads per kv head (power of two; int8:
    G·head_dim = 256), ≤ 4 rows, fp16/bf16, every layer linear of one kind (bf16, or int8 ConvRot with 256-wide
    groups and no LoRA side delta). how="cuda" also: bf16 only, head_dim 128, ≤ 8 query heads per kv head."""
    from ..weights.quant import ConvRotLinear
    d = ar.dims
    if how == "cuda":
        if dtype != torch.bfloat16:
            return f"dtype {dtype} (the CUDA layer kernel takes bf16)"
        if d.head_dim != 128 or d.heads // max(1, d.kv_heads) > 8:
            return f"dims {d} (the CUDA layer kernel takes head_dim 128, ≤ 8 query heads per kv head)"
        for layer in ar.model.layers:  # the kernel reads the norms as bf16, the ConvRot scales as fp32, rows packed
            norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                     layer.self_attn.q_norm.weight, layer.self_attn.k_norm.weight)
            if any(w.dtype != torch.bfloat16 for w in norms):
                return "norm weights that are not bf16 (the CUDA layer kernel reads bf16)"
            for mod in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                        layer.mlp.down_proj):
                scale = getattr(mod, "weight_scale", None)
                if not mod.weight.is_contiguous() or (scale is not None and scale.dtype != torch.float32):
                    return "a layer linear with strided weights or non-fp32 scales"
    elif _kernel() is None:
        return "Triton is not available"
    if not 1 <= rows <= 4:
        return f"{rows} rows (1–4)"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {dtype}"
    g = d.heads // d.kv_heads
    groups = d.hidden // 256
    if (d.heads * d.head_dim != d.hidden or d.hidden % 256 or d.ffn % 256 or groups & (groups - 1) or d.heads % d.kv_heads
            or g & (g - 1) or g > 16 or d.head_dim & (d.head_dim - 1)):
        return f"dims {d}"
    kinds = set()
    for layer in ar.model.layers:
        for mod in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            if isinstance(mod, ConvRotLinear):
                if mod.group != 256 or mod.lora_side is not None or g * d.head_dim != 256:
                    return "an int8 layer with another rotation group or a LoRA side delta"
                kinds.add("int8")
            elif isinstance(mod, torch.nn.Linear) and mod.bias is None and mod.weight.dtype == dtype:
                kinds.add("float")
            else:
                return f"a {type(mod).__name__} layer"
    if len(kinds) != 1:
        return "mixed int8 and float layers"
    return None


def _weights(mod):
    """(weights, scales) of a layer linear as the kernel reads them (float layers: scales = weights, unused)."""
    from ..weights.quant import ConvRotLinear
    if isinstance(mod, ConvRotLinear):
        return mod.weight, mod.weight_scale.view(-1)
    return mod.weight, mod.weight


# per product: tile width (rows of the weight per tile, bn_*), K step (bk_*) and pipeline stages (st_*); each phase
# deals 64–192 tiles to 132 programs on an H200; the fastest of bench/layer_kernel.py --sweep (each product
# phase alone, docs/experiments/layer_kernel_h200_2026-12-04.log). bl: cache
# positions per attention step; warps; stages: the attention loop's; per_sm: programs per multiprocessor; flat: one
# loop over (tile, K step) pairs per program; poll: the barrier's polling (1 PTX thread-0 spin, 0 every thread)
TILES = dict(bn_qkv=32, bk_qkv=512, st_qkv=4, bn_o=16, bk_o=256, st_o=4, bn_gu=32, bk_gu=512, st_gu=3,
             bn_d=32, bk_d=512, st_d=3, bl=64, warps=4, stages=3, per_sm=1, flat=0, poll=1)


def _tile_problem(key: str, v) -> str | None:
    """What is wrong with one YUE2_LAYER_TILES entry, or None: bn_*, bk_* and bl powers of two ≥ 16 (the products'
    and attention's tl.dot tiles), st_* and stages 1–8, warps a power of two 1–16, per_sm 1–64, flat and poll 0 or 1."""
    if key not in TILES:
        return "not a key of the layer kernel's tiles"
    if type(v) is not int:
        return f"{v!r} is not an integer"
    if key.startswith(("bn_", "bk_")) or key == "bl":
        ok, rule = v >= 16 and v & (v - 1) == 0, "a power of two ≥ 16"
    elif key.startswith("st_") or key == "stages":
        ok, rule = 1 <= v <= 8, "1 to 8"
    elif key == "warps":
        ok, rule = 1 <= v <= 16 and v & (v - 1) == 0, "a power of two from 1 to 16"
    elif key == "per_sm":
        ok, rule = 1 <= v <= 64, "1 to 64"
    else:  # flat, poll
        ok, rule = v in (0, 1), "0 or 1"
    return None if ok else f"{v} is not {rule}"


def tiles() -> dict:
    """TILES, with the entries of the JSON object in YUE2_LAYER_TILES on top (for tuning: bench/layer_kernel.py).
    Raises RequestError for text that is not a JSON object, an unknown key or a value outside its rule
    (`_tile_problem`), naming each."""
    raw = os.environ.get("YUE2_LAYER_TILES", "").strip()
    t = dict(TILES)
    if raw:
        import json
        from ..errors import RequestError
        try:
            extra = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested past the parser's depth (break-it)
            raise RequestError(f"YUE2_LAYER_TILES: expected a JSON object of {sorted(TILES)}; "
                               f"{exc if isinstance(exc, ValueError) else 'the JSON is nested too deeply'}") from None
        if not isinstance(extra, dict):
            raise RequestError(f"YUE2_LAYER_TILES: expected a JSON object of {sorted(TILES)}, not "
                               f"{type(extra).__name__}")
        bad = [f"{k}: {why}" for k, v in extra.items() if (why := _tile_problem(k, v))]
        if bad:
            raise RequestError(f"YUE2_LAYER_TILES: {'; '.join(bad)} (accepted keys {sorted(TILES)})")
        t.update(extra)
    return t


def occupancy(compiled, warps: int) -> int:
    """Blocks of a compiled Triton kernel that fit on one multiprocessor of an sm_90-class GPU at once (registers
    in 256-register warp units of 64 K, shared memory of 228 KB less 1 KB per block, 2,048 threads, 32 blocks)."""
    regs = max(1, compiled.n_regs)
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = 65536 // (per_warp * warps)
    shared = compiled.metadata.shared if hasattr(compiled, "metadata") else 0
    by_smem = (228 * 1024) // (shared + 1024)
    return max(0, min(by_regs, by_smem, 2048 // (32 * warps), 32))


class _PowerOfTwo:
    """`triton.next_power_of_2` for the CUDA mode, which needs no Triton."""

    @staticmethod
    def next_power_of_2(n: int) -> int:
        return 1 << max(0, int(n) - 1).bit_length()


class LayerKernel:
    """The decode step's layers for one `PhaseDecoder` (its R ≤ 4 rows, K/V caches, dtype): `__call__(x, cos, sin, pos,
    attn_len)` runs every layer and returns (x, delta) — the residual stream after the last layer's attention
    block [R, hidden] and its MLP output [R, hidden], both in the decoder dtype, for the final add+RMSNorm.
    Buffers are allocated once (graph capture reuses them). Raises RuntimeError when a grid barrier timed out
    (`check`)."""

    def __init__(self, ar, rows: int, k_cache: list, v_cache: list, how: str, programs: int | None = None):
        self.cu = None
        if how == "cuda":
            from ._layer_cuda import compile_layer
            triton, self.kern = _PowerOfTwo, None
            int8 = ar.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.int8
            self.cu = compile_layer(rows, ar.dims, int8, k_cache[0].device)  # RuntimeError: why not
        else:
            triton, self.kern = _kernel()
        self.t = tiles()
        d, dev, dt = ar.dims, k_cache[0].device, k_cache[0].dtype
        self.ar, self.d, self.R, self.k, self.v, self.how = ar, d, rows, k_cache, v_cache, how
        self.interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        if programs is None:
            programs = (torch.cuda.get_device_properties(dev).multi_processor_count
                        * (1 if self.cu is not None else self.t["per_sm"]) if dev.type == "cuda" else 8)
        self.np = programs
        self.layers = [(layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                        layer.self_attn.q_norm.weight, layer.self_attn.k_norm.weight,
                        *_weights(layer.self_attn.qkv_proj), *_weights(layer.self_attn.o_proj),
                        *_weights(layer.mlp.gate_up_proj), *_weights(layer.mlp.down_proj))
                       for layer in ar.model.layers]
        self.int8 = self.layers[0][4].dtype == torch.int8
        g = d.heads // d.kv_heads
        self.g = g
        self.splits = max(1, min(32, programs // (rows * d.kv_heads)))
        self.sp = triton.next_power_of_2(self.splits)
        groups = d.ffn // 256
        self.ag = min(8, groups & -groups)  # 256-groups of act rotated together: a power of two dividing ffn/256
        for key, n, k in (("qkv", (d.heads + 2 * d.kv_heads) * d.head_dim, d.hidden), ("o", d.hidden, d.hidden),
                          ("gu", d.ffn, d.hidden), ("d", d.hidden, d.ffn)):
            # tiles no wider than the product (the tiny test model), K steps no longer than K
            self.t[f"bk_{key}"] = min(self.t[f"bk_{key}"], k & -k)
            self.t[f"bn_{key}"] = min(self.t[f"bn_{key}"], n & -n)
        self.scr_stride = max(rows * max(d.ffn, d.hidden), max(16, g) * d.head_dim)
        z = functools.partial(torch.zeros, device=dev)
        self.x = z(rows, d.hidden, dtype=dt)
        self.xm = z(rows, d.hidden, dtype=dt)
        self.delta = z(rows, d.hidden, dtype=dt)
        self.scr = z(programs * self.scr_stride if self.cu is None else 1, dtype=dt)  # the CUDA kernel: shared memory
        self.qkv = z(rows, (d.heads + 2 * d.kv_heads) * d.head_dim, dtype=dt)
        self.m = z(rows, d.kv_heads, self.splits, g, dtype=torch.float32)
        self.l = torch.zeros_like(self.m)
        self.o = z(rows, d.kv_heads, self.splits, g, d.head_dim, dtype=torch.float32)
        self.cnt = z(rows * d.kv_heads, dtype=torch.int32)
        self.att = z(rows, d.hidden, dtype=dt)
        self.ob = z(rows, d.hidden, dtype=dt)
        self.act = z(rows, d.ffn, dtype=dt)
        self.bars = z(2, 4, dtype=torch.int32)
        self.err = z(1, dtype=torch.int32)
        self.fence = dev.type == "cuda" and not self.interpreted and torch.version.hip is None
        self.triton = triton
        self.only = None
        self.proven = False  # set by the decoder after a first call that ran (it falls back when that one fails)
        self.resident = None if how == "grid" and dev.type == "cuda" and not self.interpreted else -1
        if self.cu is not None:
            sms = torch.cuda.get_device_properties(dev).multi_processor_count
            self.n_regs, self.shared, self.resident = self.cu.regs, self.cu.smem, self.cu.resident
            # block 0's clock at 15 points of each layer, 16 a layer (bench/layer_kernel.py --phase-times)
            self.tim = torch.zeros(len(self.layers) * 16, dtype=torch.int64, device=dev)
            self.timing = CUDA_TIMING
            from ._layer_cuda import sums_problem
            why = sums_problem(rows, d, self.np)
            if self.cu.spill > SPILL_LIMIT:  # heavy spilling (e.g. 8 query heads a kv head): slower still
                why = f"its compilation spills {self.cu.spill} B of registers for these dims ({self.cu.regs} used)"
            tensors = [t for w in self.layers for t in w] + list(k_cache) + list(v_cache)
            if any(t.data_ptr() % 16 for t in tensors):  # 16-byte loads; a misaligned one would end the context
                why = "a weight or cache tensor not 16-byte aligned"
            if why:
                raise RuntimeError(f"the CUDA layer kernel cannot run here: {why}")
            if self.cu.resident >= 0 and self.cu.resident * sms < self.np:
                raise RuntimeError(f"the CUDA layer kernel needs {self.np} resident blocks; this GPU holds "
                                   f"{self.cu.resident} per multiprocessor × {sms} ({self.cu.regs} registers, "
                                   f"{self.cu.smem} B shared memory a block)")

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, attn_len: int):
        """x [R, hidden] (the embedded tokens), cos/sin [R, head_dim/2] fp32, pos [R] int64; every row attends to
        cache positions [0, min(pos, attn_len − 1)]. Returns (x, delta) as the class says."""
        d, t = self.d, self.t
        bl = t["bl"]
        chunk = max(bl, -(-(-(-attn_len // self.splits)) // bl) * bl)
        scale = 1.0 / (d.head_dim ** 0.5)
        x = x.reshape(self.R, d.hidden)
        # every layer counts in bars[i % 2] and zeroes the other parity's counters for the next layer; zeroed here as
        # well, so a step starts from zero whatever the layer count's parity (one memset in the graph)
        self.bars.zero_()
        if self.cu is not None:
            return self._call_cuda(x, cos, sin, pos, attn_len, chunk, scale)
        phases = [(0, PHASES - 1)] if self.how == "grid" else [(p, p) for p in range(PHASES)]
        if self.only is not None:  # benchmarks: one phase alone
            phases = [(self.only, self.only)]
        for i, w in enumerate(self.layers):
            ln1, ln2, qn, kn, wqkv, sqkv, wo, so, wgu, sgu, wd, sd = w
            first = i == 0
            xin = x if first else self.x
            xm = xin if first else self.xm
            for lo, hi in phases:
                args = (xin, self.delta, xm, self.x, ln1, ln2, qn, kn, wqkv, sqkv, wo, so, wgu, sgu, wd, sd,
                        cos, sin, pos, self.k[i], self.v[i], self.k[i].stride(0), self.k[i].stride(1),
                        self.scr, self.qkv, self.m, self.l, self.o, self.cnt, self.att, self.ob, self.act,
                        self.delta, self.bars[i % 2], self.bars[(i + 1) % 2], self.err, 0 if first else 1, d.eps,
                        scale, chunk, self.splits, attn_len)
                kw = dict(R=self.R, RB=self.triton.next_power_of_2(self.R), HID=d.hidden, NH=d.heads,
                          NKV=d.kv_heads, D=d.head_dim, F=d.ffn, INT8=self.int8, SP=self.sp, BL=bl,
                          BN_QKV=t["bn_qkv"], BK_QKV=t["bk_qkv"], ST_QKV=t["st_qkv"], BN_O=t["bn_o"],
                          BK_O=t["bk_o"], ST_O=t["st_o"], BN_GU=t["bn_gu"], BK_GU=t["bk_gu"], ST_GU=t["st_gu"],
                          BN_D=t["bn_d"], BK_D=t["bk_d"], ST_D=t["st_d"], AG=self.ag, FLAT=bool(t["flat"]),
                          SCR=self.scr_stride, PH_LO=lo, PH_HI=hi, SYNC=self.how == "grid", FENCE=self.fence,
                          POLL=bool(t["poll"]) and self.fence,
                          num_warps=t["warps"], num_stages=t["stages"])
                if self.how == "grid" and self.resident is None:
                    self._check_resident(args, kw)
                self.kern[(self.np,)](*args, **kw)
        return self.x, self.delta

    def _call_cuda(self, x, cos, sin, pos, attn_len, chunk, scale):
        d = self.d
        cos, sin = cos.contiguous(), sin.contiguous()
        for i, w in enumerate(self.layers):
            ln1, ln2, qn, kn, wqkv, sqkv, wo, so, wgu, sgu, wd, sd = w
            first = i == 0
            xin = x if first else self.x
            xm = xin if first else self.xm
            self.cu.launch([xin, self.delta, xm, self.x, ln1, ln2, qn, kn, wqkv, sqkv, wo, so, wgu, sgu, wd, sd,
                            cos, sin, pos, self.k[i], self.v[i], int(self.k[i].stride(0)), int(self.k[i].stride(1)),
                            self.qkv, self.m, self.l, self.o, self.cnt, self.att, self.ob, self.act, self.delta,
                            self.bars[i % 2], self.bars[(i + 1) % 2], self.err, 0 if first else 1, float(d.eps),
                            float(scale), int(chunk), int(self.splits), int(attn_len), self.tim, int(self.timing),
                            i], self.np)
        return self.x, self.delta

    def _check_resident(self, args, kw) -> None:
        """Compiles the grid-mode kernel without launching it and checks that all its programs fit on the GPU at
        once (`occupancy`); raises RuntimeError otherwise (a launch would wait at the first barrier for programs
        that never start)."""
        sms = torch.cuda.get_device_properties(self.x.device).multi_processor_count
        try:
            compiled = self.kern.warmup(*args, grid=(self.np,), **kw)
            if hasattr(compiled, "_init_handles"):  # n_regs is read from the loaded module
                compiled._init_handles()
        except (AttributeError, TypeError) as exc:  # a Triton without warmup(grid=...): trust one per SM
            self.warm_error = f"{type(exc).__name__}: {exc}"
            self.resident = -1
            return
        self.n_regs, self.shared = getattr(compiled, "n_regs", None), getattr(compiled.metadata, "shared", 0)
        if self.n_regs is None:
            self.resident = -1
            return
        self.resident = occupancy(compiled, kw["num_warps"])
        if self.resident * sms < self.np:
            raise RuntimeError(f"the one-launch decoder layer needs {self.np} resident programs; this GPU holds "
                               f"{self.resident} per multiprocessor × {sms} ({compiled.n_regs} registers, "
                               f"{self.shared} B shared memory a program)")

    def check(self) -> None:
        """Raises RuntimeError if a grid barrier gave up waiting (some program was never resident): the step's
        results are then wrong. One host sync."""
        if int(self.err.item()):
            raise RuntimeError("the one-launch decoder layer's grid barrier timed out (not every program was "
                               "resident at once); set YUE2_LAYER_KERNEL=off")
