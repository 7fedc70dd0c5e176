"""Environment switches of the engine, read and validated in one place. Each takes "0" or "1" (a choice switch: one
of its listed values); unset means the default; any other value raises RequestError naming the variable and what it
accepts — "false" or "off" are not silently read as on.

    YUE2_FAST=0           portable PyTorch paths instead of the CUDA fast paths (fast/__init__.py)
    YUE2_FUSED=0          unfused torch ops instead of the fused Triton decode/NAR kernels
    YUE2_GEMV=0           library products (cuBLAS / W8A16) instead of the split-K Triton GEMV
    YUE2_PDL=0            no programmatic dependent launch
    YUE2_GEMV_PRE=1       the decode GEMVs load their first weight tile before the PDL wait (experimental, off:
                          fast/_decode_triton.py PRE; bench/profile_decode.py --gemv-pre)
    YUE2_COMPILE=1        torch.compile'd layer halves in the decode step (plain bf16 only)
    YUE2_SHARED_PREFIX=0  no shared-prompt decode attention for candidate batches (default on for ≥ 4 rows)
    YUE2_DECODE_ATTN      triton (default) | torch: decode attention of the fused step
    YUE2_INT8_ROT         producers | cublas: where int8 ConvRot inputs are rotated (fast/decode.py)
    YUE2_INT8_DOT         convert | int8: int8 decode products with the codes converted to bf16, or int8 × int8
                          with the activations as int8 pair codes (fast/gemv.py QAct; ≤ 8 rows)
    YUE2_LAYER_KERNEL     off (default) | grid | phased | cuda: one launch per decoder layer, experimental and slower
                          today (fast/persistent.py; cuda: the CUDA C++ kernel fast/_layer_cuda.cu, bf16 decoders)
    YUE2_LAYER_TILES      a JSON object of that kernel's tiles over fast/persistent.py's TILES (tuning)
    YUE2_LAYER_CUDA_OPTS  pipe,fexp (comma-separated, experimental, stop 58): the CUDA layer kernel's attention loop
                          software-pipelined / with ex2.approx exponentials (fast/_layer_cuda.py options)
    YUE2_ATTN_MERGE       split (default) | kernel: who merges the decode attention's splits (fast/fused.py)
    YUE2_SAMPLER          kernels (default) | torch: the decode step's sampling tail (fast/sample_kernels.py)
    YUE2_NAR_ATTN         auto (fa3 on Hopper when installed, else gqa) | gqa | fa3 | cudnn | flash | efficient | math:
                          attention backend of the NAR (nar.py, fast/flash_attn.py); fa3, cudnn and efficient have
                          no CPU kernel: on a CPU run the NAR uses gqa, and the switch check warns before the work
    YUE2_NAR_LINEARS      auto (default) | bf16 | w8a8: the int8 file's NAR on CUDA with its linears dequantized once to
                          bf16, or with the int8 codes kept and int8 × int8 products as ComfyUI's int8_linear computes
                          them (activations rotated and quantized per row; nar.int8_linears, fast/w8a8.py); auto: w8a8
                          on Hopper GPUs, where it was measured faster, bf16 elsewhere (nar.w8a8_pays); a NAR in fp32
                          (--dtype fp32, a GPU without bf16) or without Triton keeps the bf16 way's float layers
    YUE2_W8A8_TABLE       a JSON file of W8A8 GEMM launch configurations (bench/w8a8_table.py --json) over the built-in
                          Hopper table (fast/w8a8.py HOPPER_TABLE); products of other shapes are autotuned
    YUE2_NAR_GRAPH=0      the NAR velocity eagerly instead of replayed from a CUDA graph per chunk (nar.py)
    YUE2_SIDE_CAPTURE=0   every decode graph captured in the main thread (default: the next attention bucket's graph is
                          captured on a worker thread while the current one replays; fast/side_capture.py)
    YUE2_L2_PREFETCH      off (default) | POINT:W[,W…][;…]: weights pulled into L2 ahead of the decode products on a
                          side branch of the step; experimental, not yet measured (fast/l2_prefetch.py)
    YUE2_L2_PREFETCH_GRID BLOCKS:PIECE_KB of that prefetch kernel (default 8:64)
    YUE2_GEMV_TABLE       a JSON file of GEMV launch configurations (bench/gemv_sweep.py --json) over the built-in ones
                          ("pair": true entries for the int8 × int8 pair-code products; bench/split_tables.py)
    YUE2_LORA_INT8        side (default) | bf16: adapters on int8 AR layers as an exact fp32 side delta, or merged into
                          layers dequantized to bf16 (bf16 decode speed, bf16 rounding; weights.lora.apply, CLI/engine);
                          songs record the mode (weights.lora_int8), `render` applies it unless this asks otherwise
    YUE2_WARMUP=0         no background compilation of the fast path's kernels while a model loads (warmup.py; default
                          on for CUDA with the fast path)
    YUE2_WARMUP_PROCS     an integer in [0, 64]: child processes that compile the warm-up's kernels when Triton's cache lacks
                          them (0 = in the warm-up thread only; default min(6, max(1, CPUs // 2)); warmup_jobs.py)
    YUE2_RENDER_SMS       auto (default) | 0 | K: the batch command's overlap — the render confined to a CUDA green
                          context of K SMs (the AR keeps all), or 0: a low-priority stream (batch/streams.py)
    YUE2_VERIFY_HASHES=0  skip the sha256 check of a vendor folder's files against weights_manifest.json (sizes are
                          still checked; weights/vendor.py)
"""
from __future__ import annotations

import os

from .errors import RequestError


def flag(name: str, default: bool) -> bool:
    """The boolean switch `name`: "1" on, "0" off, unset (or empty) the default. RequestError otherwise."""
    value = os.environ.get(name, "").strip()
    if value == "":
        return default
    if value not in ("0", "1"):
        raise RequestError(f"the environment variable {name} must be 0 or 1 (or unset), got {value!r}")
    return value == "1"


def choice(name: str, allowed: tuple[str, ...], default: str) -> str:
    """The switch `name`: one of `allowed`, unset (or empty) the default. RequestError otherwise."""
    value = os.environ.get(name, "").strip()
    if value == "":
        return default
    if value not in allowed:
        raise RequestError(f"the environment variable {name} must be {' or '.join(repr(a) for a in allowed)} "
                           f"(or unset), got {value!r}")
    return value


def integer(name: str, default: int | None, minimum: int = 0, maximum: int | None = None) -> int | None:
    """The integer switch `name` (decimal digits, in [`minimum`, `maximum`]), unset (or empty) the default.
    RequestError otherwise."""
    value = os.environ.get(name, "").strip()
    if value == "":
        return default
    bounds = f"≥ {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    if (not (value.isascii() and value.isdigit()) or len(value) > 18 or int(value) < minimum
            or (maximum is not None and int(value) > maximum)):
        raise RequestError(f"the environment variable {name} must be an integer {bounds} (or unset), "
                           f"got {value!r}")
    return int(value)
