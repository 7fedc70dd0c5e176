"""W8A8 products for the int8 file's NAR: ComfyUI's own int8 computation of a ConvRot linear (comfy-kitchen
`int8_linear`; ../shared/reference/comfyui_builtin.md §9.3, checkpoint_format.md §2.3 way C), as two Triton kernels.

For x [M, K] (bf16), codes q [N, K] (int8) and row scales s [N] (fp32) of a ConvRot linear with group G (256):

    x̂ = bf16(x·H) per G-wide group                       (rotation: bf16 in, fp32 sums, bf16 out)
    a_m = max(max_k |x̂[m, k]| / 127, 1e-30)               (fp32, one scale per row; on CUDA × fp32(1/127), as
                                                           PyTorch divides by a scalar there)
    xq[m, k] = clamp(rint(bf16(x̂[m, k] / bf16(a_m))), −128, 127)   (int8; the division in bf16, as kitchen's)
    y = bf16(fp32(Σ_k xq·q) · (a_m · s_n))  (+ b in bf16)  (int32 sums, exact)

`quantize_rows` (groups of 256 and rows up to ROW_KERNEL_MAX_K wide: one program a row, rotated on the tensor
cores; otherwise two passes over [32, G] tiles, the groups' maxima, then the row scales from them and the codes)
and `gemm` (int8 × int8 → int32 tiles on the tensor cores, the scale epilogue fused) replace the bf16 GEMM of the
dequantized weight that `nar.float_linears` leaves: half the weight bytes, twice the tensor-core rate. `reference`
is the same arithmetic in PyTorch (the tests' definition; on CUDA the rotation's sums may be ordered differently by
cuBLAS, a last-bit difference in x̂ at most).

NaN: a NaN in a row makes its scale NaN (the maxima keep NaN), so that row of y is NaN and the renderer's
non-finite check sees it, as with the bf16 products.

Used by `quant.ConvRotLinear` when its `w8a8` attribute is set (`nar.int8_linears`; YUE2_NAR_LINEARS=w8a8, or
auto — the default — on Hopper GPUs) and the input has more than `int8_kernels.MAX_ROWS` rows on CUDA; the fused
NAR velocity's add+RMSNorm and SiLU·up write such a layer's codes themselves (`add_rmsnorm_quantize`,
`silu_mul_quantize`, `nar._takes_codes`).
"""
from __future__ import annotations

import functools
import inspect
import json
import os

import torch

from ..weights.quant import hadamard, rotate

ROWS = 32  # rows per program of the two-pass quantizer
ROW_KERNEL_MAX_K = 8192  # widest rows `quantize_rows` quantizes with one program a row (groups of 256)
MIN_GROUP = 16  # smallest ConvRot group the quantizer takes (a tensor-core product's side; ConvRot groups of 4 are not)
# GEMM launch configurations (BM, BN, BK, warps, stages) tried by the autotuner on the first product of each (N, K)
# and size class of M: up to LARGE_M rows, or more (the chunk's frames are not part of the key, so songs of any
# length share two choices per shape; the warm-up tunes both, `warm`)
LARGE_M = 1024
# (stop 51: the first six reached 609–964 int8 TOPS on an H100 at a song's rows, under half its peak; the deeper
# pipelines and 256-wide K steps after them are tried too, each stage ≤ 192 KB of shared memory)
# The autotuner's choices for the NAR's shapes on a Hopper GPU, (N, K, size class) → (BM, BN, BK, warps, stages):
# taken from this table instead of tuning (the tuning of ten configurations a shape made a fresh process's first
# song 4.35× its second on an H100 with an empty Triton cache, 2026-12-07, stop 53,
# docs/experiments/cold_start_w8a8_h100_2026-12-07_stop53.log); shapes or GPUs not in it are tuned as before.
# YUE2_W8A8_TABLE names a JSON file of more entries (bench/w8a8_table.py writes one from the autotuner's choices).
# The entries: the full-size NAR's shapes (qkv 4096 × 2048, o 2048², gate_up 12288 × 2048, down 2048 × 6144, the time
# embedder 2048 × 256 and 2048², llm2vae 64 × 2048) as the autotuner chose them on an H100 80GB HBM3 (Triton 3.6;
# docs/experiments/w8a8_table_h100_2026-12-07_stop53.log); with them a fresh process's first song is 1.02× its second
# (empty Triton cache) and the warm song's render 3.28–3.30 s against 3.41–3.43 with the bf16 layers on the same GPU
# (docs/experiments/cold_start_w8a8_table_h100_2026-12-07_stop53.log, cold_start_bf16_same_h100_2026-12-07_stop53.log)
HOPPER_TABLE: dict = {(64, 2048, 0): (128, 64, 128, 4, 4), (64, 2048, 1): (64, 128, 128, 4, 4),
                       (2048, 256, 0): (64, 128, 128, 4, 4), (2048, 256, 1): (128, 128, 64, 4, 4),
                       (2048, 2048, 0): (64, 128, 128, 4, 4), (2048, 2048, 1): (128, 128, 64, 4, 4),
                       (2048, 6144, 0): (64, 128, 128, 4, 4), (2048, 6144, 1): (256, 128, 128, 8, 4),
                       (4096, 2048, 0): (64, 128, 128, 4, 4), (4096, 2048, 1): (128, 128, 64, 4, 4),
                       (12288, 2048, 0): (256, 128, 128, 8, 4), (12288, 2048, 1): (128, 128, 64, 4, 4)}
TABLE_SWITCH = "YUE2_W8A8_TABLE"
TUNE_HERE = [True]  # False in a warm-up child that leaves the tuning to another (warmup_jobs.install_shard)
TUNING = [False]  # True while the autotuner times configurations (a warm-up child skips none of them meanwhile)
CONFIGS = [(128, 128, 128, 8, 4), (128, 256, 128, 8, 3), (256, 128, 128, 8, 3), (128, 128, 64, 4, 4),
           (64, 128, 128, 4, 4), (128, 64, 128, 4, 4),
           (128, 256, 128, 8, 4), (256, 128, 128, 8, 4), (128, 128, 256, 8, 3), (128, 256, 256, 8, 2)]


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=1)
def _kernels():
    from . import triton_modules
    if triton_modules() is None:
        return None
    triton, _ = triton_modules()
    from . import _w8a8_triton as kt
    persist = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
    configs = [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8}, num_warps=w, num_stages=st)
               for bm, bn, bk, w, st in CONFIGS]
    tuned = None if _interpret() else triton.autotune(configs=configs, key=["N", "K", "MB"], **persist)(kt.gemm_kernel)
    return triton, (kt.group_max_kernel, kt.quantize_kernel), kt.gemm_kernel, tuned, not _interpret()


def read_table(path: str) -> dict:
    """The entries of a YUE2_W8A8_TABLE file: a JSON list of {"n", "k", "mb", "config": [BM, BN, BK, warps,
    stages]} → {(n, k, mb): config}. RequestError naming the file and what is wrong."""
    from ..errors import RequestError
    try:
        with open(path, encoding="utf-8") as f:
            rows = json.load(f)
    except (OSError, ValueError) as e:
        raise RequestError(f"{TABLE_SWITCH}={path!r} is not a readable JSON file ({e})") from None
    out = {}
    for row in rows if isinstance(rows, list) else [rows]:
        ok = isinstance(row, dict) and all(isinstance(row.get(x), int) and not isinstance(row.get(x), bool)
                                           for x in ("n", "k", "mb"))
        cfg = row.get("config") if isinstance(row, dict) else None
        ok = ok and isinstance(cfg, list) and len(cfg) == 5 and all(type(v) is int and v > 0 for v in cfg)
        # BM, BN and warps powers of two: the kernel's tl.arange(0, BM) and Triton's num_warps take no other (review,
        # stop 53: BM 48 passed this check and failed to compile in the render's first product)
        if not ok or any(v & (v - 1) for v in cfg[:4]) or min(cfg[:2]) < 16 or cfg[2] < 32 or cfg[2] > 256 \
                or row["mb"] not in (0, 1):
            raise RequestError(f"{TABLE_SWITCH}={path!r}: an entry must be {{\"n\", \"k\", \"mb\" (0 or 1), "
                               f"\"config\": [BM, BN, BK, warps, stages]}} with BM, BN powers of two from 16, BK "
                               f"32, 64, 128 or 256 and warps a power of two, got {str(row)[:200]}")
        out[(row["n"], row["k"], row["mb"])] = tuple(cfg)
    return out


@functools.lru_cache(maxsize=8)
def _table(path: str, hopper: bool) -> dict:
    table = dict(HOPPER_TABLE) if hopper else {}
    if path:
        table.update(read_table(path))
    return table


def config_for(n: int, k: int, mb: int, device) -> tuple | None:
    """The launch configuration of the (n, k, size class mb) product on `device` from HOPPER_TABLE (compute
    capability 9.x on CUDA; not ROCm, where an MI300 reports 9.4 and has 64 KB of LDS, under the table's stages:
    review, stop 53) and YUE2_W8A8_TABLE, or None (the autotuner chooses)."""
    hopper = torch.device(device).type == "cuda" and torch.version.hip is None \
        and torch.cuda.get_device_capability(device)[0] == 9
    return _table(os.environ.get(TABLE_SWITCH, "").strip(), hopper).get((n, k, mb))


def tuned_choices() -> list[dict]:
    """The autotuner's choices made in this process, as YUE2_W8A8_TABLE entries (bench/w8a8_table.py)."""
    kernels = _kernels()
    tuned = kernels[3] if kernels else None
    out = []
    for key, cfg in sorted(getattr(tuned, "cache", {}).items(), key=str):
        kw = cfg.kwargs
        out.append({"n": int(key[0]), "k": int(key[1]), "mb": int(key[2]),
                    "config": [kw["BM"], kw["BN"], kw["BK"], cfg.num_warps, cfg.num_stages]})
    return out


def available() -> bool:
    """True when Triton imports (the kernels are built lazily; CUDA, or Triton's CPU interpreter in tests)."""
    return _kernels() is not None


def quantize_rows(x: torch.Tensor, group: int = 256, kron: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] bf16 (contiguous; K a multiple of `group`, `group` 16, 64 or 256) → (codes int8 [M, K], scales fp32
    [M]) as the module docstring says: rotated per group, one scale per row. Triton (CUDA or the interpreter).
    `kron` (default: for groups of 256) rotates by H16·X·H16 instead of the dense 256 × 256 product
    (bench/nar_w8a8.py and bench/w8a8_rotation.py compare); with it and K ≤ ROW_KERNEL_MAX_K one program a row
    quantizes the row in one read (`_w8a8_triton.rows_quant_kernel`, stop 52: 0.061 → ≈ 0.04 ms at 5,373 × 2,048
    on an H100), otherwise two passes over [32, G] tiles. ValueError for another group."""
    triton, (max_kernel, quantize_kernel), _, _, libdev = _kernels()
    m, k = x.shape
    if not MIN_GROUP <= group <= 256 or k % group:
        raise ValueError(f"the W8A8 quantizer takes ConvRot groups of {MIN_GROUP} to 256 dividing K, got group {group} "
                         f"for K {k}")
    codes = torch.empty(m, k, dtype=torch.int8, device=x.device)
    scales = torch.empty(m, dtype=torch.float32, device=x.device)
    kron = group == 256 if kron is None else kron and group == 256
    if m and kron and k <= ROW_KERNEL_MAX_K:  # one program a row, one read (stop 52)
        _producers()[2][(m,)](x, codes, scales, k, BLOCK=triton.next_power_of_2(k), LIBDEVICE=libdev,
                              num_warps=4 if k <= 2048 else 16)
    elif m:
        h = hadamard(group, torch.bfloat16, x.device)
        ng = k // group
        part = torch.empty(m, ng, dtype=torch.float32, device=x.device)  # each row's group maxima
        grid = (triton.cdiv(m, ROWS), ng)
        max_kernel[grid](x, h, part, m, k, G=group, BM=ROWS, LIBDEVICE=libdev, KRON=kron, num_warps=4)
        quantize_kernel[grid](x, h, part, codes, scales, m, k, G=group, NG=triton.next_power_of_2(ng), BM=ROWS,
                              LIBDEVICE=libdev, KRON=kron, num_warps=4)
    return codes, scales


def gemm(codes: torch.Tensor, scales: torch.Tensor, q: torch.Tensor, s: torch.Tensor,
         bias: torch.Tensor | None) -> torch.Tensor:
    """codes int8 [M, K], scales fp32 [M], q int8 [N, K], s fp32 [N], bias [N] bf16 or None → y [M, N] bf16:
    y = (Σ_k codes·q)·(scales_m·s_n) (+ bias), int32 sums. K must be a multiple of 256 (every YuE2 linear's is)."""
    triton, _, gemm_kernel, tuned, _ = _kernels()
    m, k = codes.shape
    n = q.shape[0]
    if k % 256:
        raise ValueError(f"W8A8 GEMM needs K a multiple of 256, got {k}")
    y = torch.empty(m, n, dtype=torch.bfloat16, device=codes.device)
    if m == 0:
        return y
    # without a bias any bf16 pointer (never read): the autotuner's key holds every tensor argument's dtype, so a
    # pointer of another dtype made the biased and unbiased products of one shape two keys, and the warm-up's
    # tuning of one left the other to the song (stop-48 diff review)
    b = bias if bias is not None else y
    mb = int(m > LARGE_M)
    args = (codes, scales, q, s, b, y, m, n, k, mb)
    cfg = None if tuned is None else config_for(n, k, mb, codes.device)
    if cfg is not None:
        bm, bn, bk, warps, stages = cfg
        gemm_kernel[(triton.cdiv(m, bm) * triton.cdiv(n, bn),)](*args, HAS_BIAS=bias is not None, BM=bm, BN=bn, BK=bk,
                                                                 GROUP_M=8, GPU=True, num_warps=warps,
                                                                 num_stages=stages)
    elif tuned is None:  # the interpreter: one small configuration
        gemm_kernel[(triton.cdiv(m, 32) * triton.cdiv(n, 32),)](*args, HAS_BIAS=bias is not None, BM=32, BN=32,
                                                                 BK=256, GROUP_M=4, GPU=False)
    elif TUNE_HERE[0]:
        grid = lambda meta: (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)  # noqa: E731
        TUNING[0] = True
        try:
            tuned[grid](*args, HAS_BIAS=bias is not None, GPU=True)
        finally:
            TUNING[0] = False
    return y


@functools.lru_cache(maxsize=1)
def _producers():
    _kernels()  # Triton imported (or None)
    from . import _w8a8_triton as kt
    return kt.add_rmsnorm_quant_kernel, kt.silu_mul_quant_kernel, kt.rows_quant_kernel


def _check_rows(t: torch.Tensor, name: str, width: int) -> None:
    if t.dtype != torch.bfloat16 or not t.is_contiguous() or t.shape[-1] != width or width % 256:
        raise ValueError(f"{name}: a contiguous bf16 tensor [..., {width}] with {width} a multiple of 256 is needed, "
                         f"got {t.dtype} {tuple(t.shape)}{'' if t.is_contiguous() else ' (not contiguous)'}")


def add_rmsnorm_quantize(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor,
                         eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The NAR's add+RMSNorm writing the next product's W8A8 input (stop 52): x [..., N] bf16 (+ delta, the same
    shape, or None) → (new x [..., N] bf16 — x itself when delta is None —, codes int8 [rows, N], scales fp32
    [rows]) where (codes, scales) = `quantize_rows(y, 256)` of y = `fused.add_rmsnorm(x, delta, w, eps)[1]`: the
    same roundings in one kernel, one program a row, y itself never written (equal bits in the tests — Triton's
    interpreter, and an H100 at a song's 5,373 rows and in one eager velocity; yet a 32-step solve through either
    way ended 1.6e-2 apart, the solver's bf16 noise floor: a last-bit difference somewhere, e.g. the row's sum of
    squares reduced in another register layout in another kernel, stop 52: docs/speed.md). N a multiple of 256
    (the ConvRot group of every YuE2 linear, checkpoint_format.md §2.3); ValueError otherwise."""
    n = x.shape[-1]
    _check_rows(x, "add_rmsnorm_quantize x", n)
    if delta is not None:
        _check_rows(delta, "add_rmsnorm_quantize delta", n)
    triton, _, _, _, libdev = _kernels()
    rows = x.numel() // n
    xo = torch.empty_like(x) if delta is not None else x
    codes = torch.empty(rows, n, dtype=torch.int8, device=x.device)
    scales = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows:
        _producers()[0][(rows,)](x, delta if delta is not None else x, w, xo, codes, scales, n, eps,
                                 HAS_D=delta is not None, BLOCK=triton.next_power_of_2(n), LIBDEVICE=libdev,
                                 num_warps=4)  # 0.041 ms at 2,048 × 5,373 on an H100 (2 warps 0.043, 8 0.045)
    return xo, codes, scales


def silu_mul_quantize(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The NAR's SiLU·up writing the down product's W8A8 input (stop 52): gate‖up [R, 2F] bf16 → (codes int8 [R, F],
    scales fp32 [R]) = `quantize_rows(fused.silu_mul(gate_up), 256)` in one kernel (one program a row; silu·up
    itself is never written; equal bits as `add_rmsnorm_quantize` says). F a multiple of 256; ValueError
    otherwise."""
    _check_rows(gate_up, "silu_mul_quantize gate_up", gate_up.shape[-1])
    if gate_up.dim() != 2 or gate_up.shape[-1] % 512:
        raise ValueError(f"silu_mul_quantize takes gate‖up [R, 2F] with F a multiple of 256, got "
                         f"{tuple(gate_up.shape)}")
    triton, _, _, _, libdev = _kernels()
    r, f = gate_up.shape[0], gate_up.shape[1] // 2
    codes = torch.empty(r, f, dtype=torch.int8, device=gate_up.device)
    scales = torch.empty(r, dtype=torch.float32, device=gate_up.device)
    if r:
        _producers()[1][(r,)](gate_up, codes, scales, f, BLOCK=triton.next_power_of_2(f), LIBDEVICE=libdev,
                              num_warps=16)  # 0.154 ms at 6,144 × 5,373 on an H100 (8 warps 0.172, 4 0.226)
    return codes, scales


def linear_from_codes(module, codes: torch.Tensor, scales: torch.Tensor, lead: tuple) -> torch.Tensor:
    """A W8A8-marked `quant.ConvRotLinear` applied to an input already quantized (`add_rmsnorm_quantize`,
    `silu_mul_quantize`): codes [M, K] int8, scales [M] → y [*lead, N] bf16, as `module(x)` computes from them."""
    b = module.bias
    y = gemm(codes, scales, module.weight.contiguous(), module.weight_scale.reshape(-1).float().contiguous(),
             None if b is None else b.to(torch.bfloat16).contiguous())
    return y.reshape(*lead, module.out_features)


def warm(shapes, device, rows: tuple = (LARGE_M // 4, 2 * LARGE_M)) -> None:
    """Compile and tune the kernels for chunks of each of `rows` (one per size class of the autotuner's key: up to
    LARGE_M rows, and more) on each (N, K, bias) of `shapes` (`bias`: the layer has one, which the GEMM compiles
    apart): zero inputs, results discarded."""
    for n, k, bias in shapes:
        q, s = torch.zeros(n, k, dtype=torch.int8, device=device), torch.ones(n, device=device)
        b = torch.zeros(n, dtype=torch.bfloat16, device=device) if bias else None
        for m in rows:
            linear(torch.zeros(m, k, dtype=torch.bfloat16, device=device), q, s, b, 256)


def linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
           group: int) -> torch.Tensor:
    """x [..., K] → y [..., N] in x's dtype: the W8A8 product of a ConvRot linear (codes q [N, K] int8, row scales
    `scale` [N, 1] or [N] fp32, optional bias [N]) for bf16 x (ComfyUI's activation dtype; the caller keeps other
    dtypes on the dequantizing path)."""
    lead, k = x.shape[:-1], x.shape[-1]
    if x.dtype != torch.bfloat16:
        raise ValueError(f"W8A8 products take bf16 activations, got {x.dtype}")
    codes, scales = quantize_rows(x.reshape(-1, k).contiguous(), group)
    y = gemm(codes, scales, q.contiguous(), scale.reshape(-1).float().contiguous(),
             None if bias is None else bias.to(torch.bfloat16).contiguous())
    return y.reshape(*lead, q.shape[0])


def reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
              group: int) -> torch.Tensor:
    """The same product in PyTorch ops (comfy-kitchen's eager arithmetic: bf16 rotation, per-row scale, the division
    in bf16, round half to even, int32 GEMM, fp32 scaling, bf16 output, bias added in bf16)."""
    lead, k = x.shape[:-1], x.shape[-1]
    xb = rotate(x.reshape(-1, k).to(torch.bfloat16), group)
    a = (xb.abs().amax(dim=-1, keepdim=True).float() / 127.0).clamp(min=1e-30)
    codes = (xb / a.to(xb.dtype)).round().clamp(-128, 127).to(torch.int8)
    acc = codes.double() @ q.double().t()  # exact: |Σ| < 2⁵³; its float rounding = the int32 sums'
    y = (acc.float() * (a * scale.reshape(1, -1).float())).to(x.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.reshape(*lead, q.shape[0])
