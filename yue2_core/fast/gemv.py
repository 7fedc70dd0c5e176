"""Skinny matrix–vector products for the decode step (CUDA, Triton): y [M, N] = x [M, K] · Wᵀ for M ≤ 16 rows and
weights W [N, K] in bf16, or int8 ConvRot codes q [N, K] with row scales s [N] (y = s · ((x·H) · qᵀ), H the
256-wide regular Hadamard of `quant.hadamard`; x comes already rotated: `rotate`, or a producer kernel with rot=True).

Why not cuBLAS / the dot-per-row-block kernel of `int8_kernels`: at batch 1 a decode step is one pass over 1.4 G
weights, so each product must keep enough bytes in flight to run near the memory bandwidth. For the narrow layers
(o_proj and down_proj: N = 2048) one program per output block gives too few programs; here the K axis is split as
well (`split` programs per output block), and each program writes an fp32 partial sum.

    partials P [split, M, N] fp32,   y = bf16(Σ_split P)   (summed in a fixed order: deterministic)

The consumer kernels (`fused.add_rmsnorm`, `fused.qk_norm_rope_store`, `fused.silu_mul`) read P directly and do
the sum, so a split costs no extra launch; `reduce` is the stand-alone sum for other callers. With split = 1 the
kernel writes y in the output dtype directly.

The configuration (block sizes, split, warps, stages) per weight shape comes from `bench/gemv_sweep.py` run on an
H200 (its table: docs/gemv_sweep_h200.log); `choose(n, k, m)` holds the result.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class Config:
    """Block of outputs per program (bn), K tile (bk), K splits (split), warps, pipeline stages; `dot`: tensor-core
    tiles of 16 rows (any M ≤ 16), else CUDA-core products for M ≤ `SMALL_ROWS` (larger M falls back to a dot
    configuration)."""
    bn: int = 32
    bk: int = 256
    split: int = 1
    warps: int = 4
    stages: int = 3
    dot: bool = True


class Partials:
    """fp32 partial sums P [split, M, N] of one product (sum over the first axis, round to `dtype`, gives y)."""
    __slots__ = ("t", "dtype")

    def __init__(self, t: torch.Tensor, dtype: torch.dtype):
        self.t, self.dtype = t, dtype

    @property
    def split(self) -> int:
        return self.t.shape[0]


class QAct:
    """An activation row block in the rotated basis as int8 *pair codes*, for the int8 × int8 products of
    `gemv(xq=…)`: q [2M, K] int8 (row 2m: hi, row 2m + 1: lo of activation row m) and s [M, K/256] fp32, one per
    256-group, so that x·H ≈ s · (hi + lo / 254) to within s/508 (s = the group's max |x·H| / 127; about 16 bits
    of the group's range: a smaller RMS error than the bf16 activation's 8 bits per value, though bf16's is smaller
    for values below 1/126 of the group's max). A NaN in a group makes its s NaN. Written by the producer kernels
    with quant=True (`fused.add_rmsnorm`, `fused.silu_mul`, `fused.decode_attention`) or by `rotate(x, quant=True)`."""
    __slots__ = ("q", "s")

    def __init__(self, q: torch.Tensor, s: torch.Tensor):
        self.q, self.s = q, s

    @property
    def rows(self) -> int:
        return self.s.shape[0]


MAX_PAIR_ROWS = 8  # pair codes take two rows of the 16-row tensor-core tile per activation row


def new_pack(m: int, k: int, device) -> QAct:
    """Uninitialised pair codes for m ≤ 8 rows of K (K % 256 == 0). Raises ValueError otherwise."""
    if not 0 < m <= MAX_PAIR_ROWS or k % 256:
        raise ValueError(f"int8 pair codes hold 1–{MAX_PAIR_ROWS} rows of a multiple of 256; got {m} × {k}")
    return QAct(torch.empty(2 * m, k, dtype=torch.int8, device=device),
                torch.empty(m, k // 256, dtype=torch.float32, device=device))


@functools.lru_cache(maxsize=1)
def _kernels():
    from . import triton_modules
    if triton_modules() is None:
        return None
    triton, tl = triton_modules()
    from . import _decode_triton as k
    return triton, tl, k.gemv_kernel, k.reduce_kernel, k.rotate_kernel, k.gemv_q_kernel


def available() -> bool:
    return _kernels() is not None


MAX_ROWS = 16  # one tensor-core tile of rows; more rows use cuBLAS (bf16) or dequantize + GEMM (int8)
SMALL_ROWS = 2  # most rows of a CUDA-core (dot=False) configuration: batch 1 and a CFG pair

# per weight shape (N, K, int8): the fastest configuration at M = 1 in bench/gemv_sweep.py on an H200
# (docs/gemv_sweep_h200.log, 2026-11-29; the same ones won at M = 2 and 8 within 2 %). YuE2-3B AR shapes.
_TABLE: dict[tuple[int, int, bool], Config] = {
    (4096, 2048, False): Config(bn=64, bk=256, split=2, stages=4),    # qkv_proj
    (2048, 2048, False): Config(bn=64, bk=256, split=8, stages=3),    # o_proj
    (12288, 2048, False): Config(bn=32, bk=256, split=1, stages=3),   # gate_up_proj
    (2048, 6144, False): Config(bn=64, bk=256, split=4, stages=4),    # down_proj
    (32769, 2048, False): Config(bn=64, bk=256, split=1, stages=3),   # LM head, codec slice
    (4096, 2048, True): Config(bn=32, bk=256, split=4, stages=3),
    (2048, 2048, True): Config(bn=32, bk=256, split=8, stages=3),
    (12288, 2048, True): Config(bn=64, bk=256, split=2, stages=3),
    (2048, 6144, True): Config(bn=64, bk=256, split=8, stages=3),
    (32769, 2048, True): Config(bn=64, bk=256, split=1, stages=3),
}


# per (N, K, int8, M) for M = 1 and 2: where a CUDA-core configuration beat the tensor-core one in the sweep
_SMALL_TABLE: dict[tuple[int, int, bool, int], Config] = {}


def _tables() -> tuple[dict, dict]:
    """(_TABLE, _SMALL_TABLE) with the current YUE2_GEMV_TABLE's entries on top (read at every call: a process may
    change it)."""
    return _tables_from(os.environ.get("YUE2_GEMV_TABLE", "").strip())[:2]


def _pair_table() -> dict:
    """_Q_TABLE with the current YUE2_GEMV_TABLE's pair-code entries on top."""
    return _tables_from(os.environ.get("YUE2_GEMV_TABLE", "").strip())[2]


MAX_TABLE_BYTES = 4 * 2 ** 20  # a YUE2_GEMV_TABLE file is a few kB; anything past this is not one
# what a YUE2_GEMV_TABLE entry may hold (bench/gemv_sweep.py --json writes n, k, int8, m, cfg, us;
# bench/split_tables.py pair and swap) and the largest values a launch configuration may take there
ENTRY_KEYS = ("n", "k", "int8", "m", "cfg", "pair", "swap", "us", "tbps", "note")
MAX_STAGES, MAX_BLOCK, MAX_SPLIT = 8, 1024, 64


@functools.lru_cache(maxsize=4)
def _tables_from(path: str) -> tuple[dict, dict, dict]:
    """(_TABLE, _SMALL_TABLE, _Q_TABLE), with the entries of the JSON file named by YUE2_GEMV_TABLE on top (the
    "configs" list that `bench/gemv_sweep.py --json` writes: {"n", "k", "int8", "m" (1, 2, or 0 for any row count),
    "cfg": {bn, bk, split, warps, stages, dot}}; with "pair": true (int8, m 0, tensor cores, bk 256) an entry of
    the int8 × int8 pair-code products, "swap": true putting the weights on the left) — tuning for another GPU
    without editing the code. Raises RequestError for a file that cannot be read or holds other entries."""
    table, small, pairs = dict(_TABLE), dict(_SMALL_TABLE), dict(_Q_TABLE)
    if path:
        import json
        from pathlib import Path
        from ..errors import RequestError
        try:
            size = Path(path).stat().st_size
            if size > MAX_TABLE_BYTES:  # break-it finding: a multi-GB file (a checkpoint by mistake) was read whole
                raise ValueError(f"the file is {size:,} bytes; a table is a few kB (at most {MAX_TABLE_BYTES:,} "
                                 "are read)")
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
            if not isinstance(doc, dict):
                raise ValueError(f"the file holds a JSON {_json_kind(doc)}, not an object")
            if "configs" not in doc:
                raise ValueError("the object has no \"configs\" key")
            entries = doc["configs"]
            if not isinstance(entries, list):
                raise ValueError(f"\"configs\" is a JSON {_json_kind(entries)}, not a list")
            for i, e in enumerate(entries):
                try:
                    if not isinstance(e, dict):
                        raise ValueError(f"a JSON {_json_kind(e)}, not an object with n, k, int8, m and cfg")
                    missing = [f for f in ("n", "k", "int8", "m", "cfg") if f not in e]
                    if missing:
                        raise ValueError(f"no {', '.join(missing)}")
                    unknown = sorted(str(f) for f in e if f not in ENTRY_KEYS)
                    if unknown:  # break-it finding: "Pair": true was read as a plain W8A16 entry
                        raise ValueError(f"unknown key(s) {', '.join(unknown)}; an entry takes "
                                         f"{', '.join(ENTRY_KEYS)}")
                    if not isinstance(e["cfg"], dict):
                        raise ValueError(f"cfg is a JSON {_json_kind(e['cfg'])}, not an object")
                    cfg = Config(**e["cfg"])
                    problem = _config_problem(cfg, e["int8"], e["m"])
                    pair, swap = e.get("pair", False), e.get("swap", False)
                    if not problem and (not isinstance(pair, bool) or not isinstance(swap, bool)):
                        problem = f"pair and swap must be true or false; got {pair!r}, {swap!r}"
                    if not problem and swap and not pair:
                        problem = "swap (the weights as the left operand) is an option of pair-code entries"
                    if not problem and pair and not (e["int8"] and e["m"] == 0 and cfg.dot and cfg.bk == 256):
                        problem = ("a pair-code entry (int8 × int8 products) needs int8 true, m 0, dot true and bk "
                                   f"256; got int8 {e['int8']!r}, m {e['m']!r}, {cfg}")
                    if not all(isinstance(e[d], int) and not isinstance(e[d], bool) and e[d] > 0 for d in "nk"):
                        problem = f"n and k must be positive integers; got {e['n']!r}, {e['k']!r}"
                    elif not problem and e["k"] % (cfg.split * cfg.bk):
                        # break-it finding: the products then quietly ran one split instead
                        problem = (f"split × bk must divide k: {cfg.split} × {cfg.bk} does not divide {e['k']} "
                                   f"(K tiles of one split: k / (split · bk))")
                except ValueError as exc:
                    problem = str(exc)
                except TypeError as exc:  # a cfg field that Config does not have
                    problem = f"cfg: {exc}".replace("Config.__init__() ", "")
                if problem:
                    raise ValueError(f"entry {i}: {problem}")
                key = (e["n"], e["k"], e["int8"])
                if pair:
                    pairs[(e["n"], e["k"])] = (cfg, swap)
                elif e["m"] == 0:
                    table[key] = cfg
                else:
                    small[key + (e["m"],)] = cfg
        except RecursionError:  # JSON nested past the parser's depth (break-it finding)
            raise RequestError(f"YUE2_GEMV_TABLE file {path}: the JSON is nested too deeply to be a table written by "
                               "bench/gemv_sweep.py --json") from None
        except OSError as exc:
            raise RequestError(f"YUE2_GEMV_TABLE={path!r}: cannot read the file ({exc.strerror or exc})") from None
        except (ValueError, KeyError, TypeError) as exc:
            what = f"not JSON ({exc})" if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise RequestError(f"YUE2_GEMV_TABLE={path!r}: expected a JSON file with a \"configs\" list as "
                               f"bench/gemv_sweep.py --json or bench/split_tables.py writes it; {what}") from None
    return table, small, pairs


def _json_kind(value) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _config_problem(cfg: Config, int8, m) -> str | None:
    """What is wrong with a table entry, or None: powers of two for bn, bk, split, warps (bn ≥ 16 with dot),
    stages ≥ 1, booleans for int8 and dot, m 0 (any rows) or 1–2 (CUDA-core entries only for 1–2 rows)."""
    def pow2(v, lo):
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo and v & (v - 1) == 0
    if not isinstance(int8, bool) or not isinstance(cfg.dot, bool):
        return "int8 and dot must be true or false"
    if type(m) is not int or m not in (0, 1, 2):
        return f"m must be the integer 0 (any row count), 1 or 2; got {m!r}"
    if not (pow2(cfg.bn, 16 if cfg.dot else 1) and pow2(cfg.bk, 16) and pow2(cfg.split, 1)
            and pow2(cfg.warps, 1) and cfg.warps <= 16 and isinstance(cfg.stages, int)
            and not isinstance(cfg.stages, bool) and 1 <= cfg.stages <= MAX_STAGES
            and cfg.bn <= MAX_BLOCK and cfg.bk <= MAX_BLOCK and cfg.split <= MAX_SPLIT):
        # break-it finding: stages 10⁹ made fit_shared step down a billion times on a GPU
        return (f"bn, bk, split and warps must be powers of two (16 ≤ bn ≤ {MAX_BLOCK} for tensor cores, "
                f"16 ≤ bk ≤ {MAX_BLOCK}, split ≤ {MAX_SPLIT}, warps ≤ 16) and stages an integer in 1–{MAX_STAGES}; "
                f"got {cfg}")
    if not cfg.dot and m == 0:
        return "a CUDA-core (dot false) configuration serves 1–2 rows: give m 1 or 2"
    if not cfg.dot and m * cfg.bn * cfg.bk > 128 * 32 * cfg.warps:
        return (f"a CUDA-core configuration keeps m·bn·bk fp32 sums in registers: at most 128 per thread "
                f"(32·warps threads); got {m}·{cfg.bn}·{cfg.bk} over {32 * cfg.warps} threads")
    return None


def choose(n: int, k: int, m: int, int8: bool) -> Config:
    """The launch configuration for an [m ≤ 16, k] × [n, k]ᵀ product: the swept tables when they have the shape
    (`_SMALL_TABLE` for 1 and 2 rows, then `_TABLE`; YUE2_GEMV_TABLE adds entries), otherwise a rule: 64-row
    blocks, K split until there are about two programs per multiprocessor of an H200 (132)."""
    table, small = _tables()
    cfg = small.get((n, k, int8, m)) or table.get((n, k, int8))
    if cfg is not None:
        return cfg
    bn, bk = 64, 256
    blocks = -(-n // bn)
    split = 1
    while blocks * split < 264 and k % (bk * split * 2) == 0:
        split *= 2
    return Config(bn=bn, bk=bk, split=split)


def usable(cfg: Config, n: int, k: int, m: int, int8: bool, device=None) -> Config:
    """cfg, or for a CUDA-core configuration given more than SMALL_ROWS rows the tensor-core one of the table (or
    64-row blocks with cfg's split); on a CUDA `device`, fitted to its shared memory per block (`fit_shared`)."""
    if not cfg.dot and m > SMALL_ROWS:
        fallback = _tables()[0].get((n, k, int8))
        cfg = fallback if fallback is not None and fallback.dot else Config(bn=64, bk=256, split=cfg.split)
    limit = shared_limit(device)
    return fit_shared(cfg, int8, limit) if limit else cfg


def shared_bytes(cfg: Config, int8: bool) -> int:
    """Shared memory a configuration's kernel takes, an upper bound (equal for the tensor-core configurations of
    the table, compiled for sm_86–sm_90: tests/core/test_pdl_ptx.py): Triton's pipeline keeps stages − 1 copies
    of the weight tile [bn, bk] and the 16-row activation tile [16, bk]; CUDA-core configurations ≤ 2 KB."""
    if not cfg.dot:
        return 2048
    return max(1, cfg.stages - 1) * cfg.bk * (cfg.bn * (1 if int8 else 2) + 16 * 2)


def shared_bytes_q(cfg: Config) -> int:
    """Shared memory of an int8 × int8 pair-code product (`gemv_q`), an upper bound (tests/core/test_shared_memory.py):
    `stages` copies of the int8 weight tile [bn, 256] and the pair-code tile [16, 256] (the weights-left order, on
    Hopper's asynchronous tensor-core instructions, keeps all `stages`; the other order stages − 1)."""
    return max(1, cfg.stages) * 256 * (cfg.bn + 16)


def fit_shared(cfg: Config, int8: bool, limit: int, estimate=None) -> Config:
    """cfg with fewer pipeline stages (down to 2), then narrower output blocks (down to 16), until its kernel fits
    `limit` bytes of shared memory per block less 1 KB of headroom. The table's H200 configurations take up to
    120 KB (bf16 qkv and down_proj, 4 stages): more than GPUs with 99 KB per block (RTX 30/40/50, sm_86/89/120)
    or 64 KB (T4, sm_75) can give, where Triton would refuse the launch. `estimate`: the bytes of a configuration
    (default `shared_bytes` of the W8A16/bf16 kernel; `shared_bytes_q` for the pair-code products)."""
    size = estimate or (lambda c: shared_bytes(c, int8))
    budget = limit - 1024
    while size(cfg) > budget and cfg.stages > 2:
        cfg = replace(cfg, stages=cfg.stages - 1)
    while size(cfg) > budget and cfg.bn > 16:
        cfg = replace(cfg, bn=cfg.bn // 2)
    return cfg


def shared_limit(device) -> int | None:
    """Opt-in shared memory per block of a CUDA device in bytes (None for other devices and the interpreter)."""
    if device is None or torch.device(device).type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return _shared_limit(torch.device(device).index or 0)


@functools.lru_cache(maxsize=None)
def _shared_limit(index: int) -> int:
    props = torch.cuda.get_device_properties(index)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or props.shared_memory_per_block)


def supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `gemv` handles x [M, K] and w [N, K]: CUDA, Triton present, x bf16/fp16 with ≤ 16 rows, K a
    multiple of 256 (ConvRot groups; every YuE2 linear), w bf16/fp16 or int8, row-major with rows of K, on x's
    device."""
    on_device = x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"  # CPU interpreter: the tests
    return (on_device and available() and x.device == w.device and x.dim() == 2 and w.dim() == 2
            and w.stride() == (w.shape[1], 1) and x.dtype in (torch.bfloat16, torch.float16)
            and x.shape[0] <= MAX_ROWS and x.shape[1] % 256 == 0 and w.shape[1] == x.shape[1]
            and w.dtype in (torch.bfloat16, torch.float16, torch.int8))


def gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, *, partial: bool = False,
         cfg: Config | None = None, xq: QAct | None = None, pre: bool | None = None) -> torch.Tensor | Partials:
    """x [M ≤ 16, K] bf16 · w [N, K]ᵀ → y [M, N] bf16. w bf16, or int8 ConvRot codes with `scale` [N] fp32 —
    then x must already be rotated (`rotate`, or a producing kernel with rot=True). With `partial`, returns
    `Partials` (P [split, M, N] fp32) when the configuration (`choose`, made `usable`) splits K, else y.
    `xq` (int8 w, M ≤ 8): the same x as int8 pair codes (`QAct`); the product then runs int8 × int8 on the tensor
    cores (`_decode_triton.gemv_q_kernel`, `YUE2_INT8_DOT=int8` in the decode step) instead of converting every
    weight to bf16 — y differs from the bf16-activation product by x's rounding (finer here).
    `pre`: a tensor-core configuration's first weight tile loaded before the PDL wait (the same sums; None:
    YUE2_GEMV_PRE where PDL is on). K % 256 == 0 (see `supported`). Raises ValueError for unsupported inputs."""
    x = x.contiguous()
    if not supported(x, w):
        raise ValueError(f"gemv needs CUDA bf16 x [M ≤ {MAX_ROWS}, K % 256 == 0] and bf16/int8 w [N, K]; got x "
                         f"{tuple(x.shape)} {x.dtype} on {x.device}, w {tuple(w.shape)} {w.dtype}")
    if xq is not None:
        return gemv_q(xq, w, scale, partial=partial, out_dtype=x.dtype, cfg=cfg, pre=pre)
    triton, _, kern, _, _, _ = _kernels()
    m, k = x.shape
    n = w.shape[0]
    int8 = w.dtype == torch.int8
    if int8 and (scale is None or scale.numel() != n or not scale.is_contiguous() or scale.device != x.device
                 or scale.dtype != torch.float32):
        raise ValueError(f"gemv: int8 weights need their fp32 row scales, one per output row, contiguous on "
                         f"{x.device}; got "
                         f"{None if scale is None else (tuple(scale.shape), scale.dtype, str(scale.device))}")
    cfg = usable(cfg or choose(n, k, m, int8), n, k, m, int8, x.device)
    split = cfg.split if k % (cfg.split * cfg.bk) == 0 else 1
    ks = triton.cdiv(triton.cdiv(k, split), cfg.bk) * cfg.bk
    out = (torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1
           else torch.empty(m, n, dtype=x.dtype, device=x.device))
    kern[(triton.cdiv(n, cfg.bn), split)](x, w, scale.view(-1) if int8 else x, out, m, n, k, ks, x.stride(0),
                                          BM=16 if cfg.dot else triton.next_power_of_2(m), BN=cfg.bn, BK=cfg.bk,
                                          INT8=int8, PARTIAL=split > 1, DOT=cfg.dot, num_warps=cfg.warps,
                                          num_stages=cfg.stages, **_launch(x, pre, cfg.dot))
    if split == 1:
        return out
    p = Partials(out, x.dtype)
    return p if partial else reduce(p)


# per weight shape (N, K): the int8 × int8 products' configuration (bk is always one 256-group; `swap`: weights
# as the left operand), from bench/int8_dot.py on an H200 (docs/experiments/int8_dot_shapes_h200_2026-12-05.log).
# YUE2_GEMV_TABLE's "pair" entries replace these (bench/split_tables.py); its plain int8 entries tune the converting
# products (YUE2_INT8_DOT=convert) and, with 256-wide K tiles, the pair-code shapes not listed here.
_Q_TABLE: dict[tuple[int, int], tuple[Config, bool]] = {
    (4096, 2048): (Config(bn=128, bk=256, split=4, stages=3), False),   # qkv_proj
    (2048, 2048): (Config(bn=64, bk=256, split=8, stages=4), True),     # o_proj
    (12288, 2048): (Config(bn=64, bk=256, split=2, stages=3), True),    # gate_up_proj
    (2048, 6144): (Config(bn=128, bk=256, split=8, stages=3), False),   # down_proj
    (32769, 2048): (Config(bn=128, bk=256, split=1, stages=3), True),   # LM head, codec slice
}


def choose_q(n: int, k: int) -> tuple[Config, bool]:
    """(configuration, swap) of an int8 × int8 pair-code product: `_Q_TABLE` (YUE2_GEMV_TABLE's "pair" entries on
    top), else the W8A16 table's blocks and split with 256-wide K tiles, weights on the right."""
    pairs = _pair_table()
    if (n, k) in pairs:
        return pairs[(n, k)]
    base = _tables()[0].get((n, k, True)) or choose(n, k, 1, True)
    return replace(base, bk=256, dot=True, bn=max(16, base.bn)), False


def gemv_q(xq: QAct, w: torch.Tensor, scale: torch.Tensor, *, partial: bool = False,
           out_dtype: torch.dtype = torch.bfloat16, cfg: Config | None = None,
           swap: bool | None = None, pre: bool | None = None) -> torch.Tensor | Partials:
    """xq (`QAct`: M ≤ 8 rows of K as int8 pair codes) · int8 ConvRot codes w [N, K]ᵀ · scale [N] → y [M, N] in
    `out_dtype`, or `Partials` with `partial` when the configuration splits K. Each 256-group is one int8 × int8
    tensor-core product with int32 sums (exact), scaled by the group's activation scale; no weight is converted.
    `pre`: the first weight group loaded before the PDL wait (same sums; None: YUE2_GEMV_PRE where PDL is on).
    Raises ValueError for other shapes, dtypes or devices."""
    m, k = xq.rows, xq.q.shape[1]
    if (w.dtype != torch.int8 or w.dim() != 2 or w.shape[1] != k or w.stride() != (k, 1) or k % 256
            or xq.q.dtype != torch.int8 or xq.s.dtype != torch.float32 or not xq.q.is_contiguous()
            or not xq.s.is_contiguous() or xq.q.shape[0] != 2 * m or not 0 < m <= MAX_PAIR_ROWS
            or xq.s.shape != (m, k // 256)
            or xq.q.device != w.device or xq.s.device != w.device or scale is None or scale.numel() != w.shape[0]
            or scale.dtype != torch.float32 or not scale.is_contiguous() or scale.device != w.device):
        raise ValueError(f"gemv_q needs pair codes of ≤ {MAX_PAIR_ROWS} rows and K % 256 == 0, int8 w [N, K] "
                         f"row-major and fp32 row scales [N], all on one device; got codes {tuple(xq.q.shape)}, "
                         f"scales {tuple(xq.s.shape)}, w {tuple(w.shape)} {w.dtype}, "
                         f"row scales {None if scale is None else tuple(scale.shape)}")
    triton, _, _, _, _, kern = _kernels()
    n = w.shape[0]
    chosen, chosen_swap = choose_q(n, k)
    cfg = cfg or chosen
    swap = chosen_swap if swap is None else swap
    limit = shared_limit(w.device)
    if limit:
        cfg = fit_shared(replace(cfg, bk=256), True, limit, shared_bytes_q)
    split = cfg.split if k % (cfg.split * 256) == 0 else 1
    ks = k // split
    out = (torch.empty(split, m, n, dtype=torch.float32, device=w.device) if split > 1
           else torch.empty(m, n, dtype=out_dtype, device=w.device))
    kern[(triton.cdiv(n, cfg.bn), split)](xq.q, xq.s, w, scale.view(-1), out, m, n, k, ks, BN=cfg.bn,
                                          PARTIAL=split > 1, SWAP=swap, num_warps=cfg.warps,
                                          num_stages=cfg.stages, **_launch(w, pre))
    if split == 1:
        return out
    p = Partials(out, out_dtype)
    return p if partial else reduce(p)


def pre_wait() -> bool:
    """YUE2_GEMV_PRE (0 / 1, default 0): whether the decode GEMVs' programs (`gemv_q`, and `gemv`'s tensor-core
    configurations) load their first weight tile before the PDL wait (`_decode_triton.gemv_q_kernel` /
    `gemv_kernel` PRE: the same sums; only when PDL is on). Read at each call, so a decode
    graph keeps the setting it was captured with. RequestError for another value."""
    from ..switches import flag
    return flag("YUE2_GEMV_PRE", False)


def _launch(t: torch.Tensor, pre: bool | None, dot: bool = True) -> dict:
    """A GEMV's launch arguments on t's device: PDL where it is on (`_pdl`), and PRE for a tensor-core (`dot`)
    configuration when `pre` is true, or when it is None and YUE2_GEMV_PRE asks for it with PDL on."""
    pdl = _pdl(t)
    if pre is None:
        pre = bool(pdl) and pre_wait()  # YUE2_GEMV_PRE (experimental, off)
    return {**pdl, "PRE": True} if pre and dot else pdl


def _pdl(t: torch.Tensor) -> dict:
    from .fused import _pdl as pdl
    return pdl(t)


def reduce(p: Partials) -> torch.Tensor:
    """Σ over the split axis of P [split, M, N] → [M, N] in p.dtype."""
    triton, _, _, kern, _, _ = _kernels()
    s, m, n = p.t.shape
    y = torch.empty(m, n, dtype=p.dtype, device=p.t.device)
    block = 1024
    kern[(triton.cdiv(m * n, block),)](p.t, y, m * n, S=s, BLOCK=block)
    return y


def rotate(x: torch.Tensor, quant: bool = False):
    """x [M, K] (K % 256 == 0) → x·H per 256-group, in x's dtype, one kernel (H = H16 ⊗ H16 applied as two
    16-wide tensor-core products, `_decode_triton.rot_rows`; ≈ fp32 accuracy). `quant` (M ≤ 8): returns (x·H,
    `QAct` of its int8 pair codes, made from the fp32 rotation). Raises ValueError when K is not a multiple of 256
    (or, with quant, M > 8)."""
    triton, _, _, _, kern, _ = _kernels()
    m, k = x.shape
    if k % 256:
        raise ValueError(f"rotate works on 256-wide groups; the last axis is {k}")
    y = torch.empty_like(x)
    pack = new_pack(m, k, x.device) if quant else None
    extra = dict(q_ptr=pack.q, s_ptr=pack.s, QUANT=True) if quant else {}
    kern[(m, triton.cdiv(k, 256))](x.contiguous(), y, k, BK=256, **extra, **_pdl(x))
    return (y, pack) if quant else y
