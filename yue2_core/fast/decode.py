"""AR phases with the whole decode step — model, CFG combine, sampling, stop test — as one replayable unit.

On CUDA the step is captured once per attention-length bucket as a CUDA graph and replayed `block` times between
host reads, so there is no per-token host synchronisation (the vendor loop calls `.item()` every token). Everything
the step needs lives in static device buffers:

    logits [R, W]      phase-sliced logits of each row (R = songs, ×2 with CFG: rows [0, G) cond, [G, 2G) uncond)
    tokens [R], pos [R]  next input token and its position per row; step [1] the shared token index
    ring [G, P], ring_w [G, P]  last P generated columns per song (repetition-penalty window) and their weights
    out [G, max_tokens], done [G]  sampled ids and the per-song stop flag (end token or budget)
    noise [max_tokens, G, K]  Exp(1) draws for the sampler, pre-drawn from one generator per song seed

The same `_step` runs eagerly on any device (CPU tests, or when capture fails: one warning, never a crash).
Sampling follows the reference rules (`fast.sampler`); tokens equal the portable path at temperature 0, and follow
the same distribution otherwise (the draw is an exponential race on the device, not CPU `torch.multinomial`).
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import warnings

import torch
import torch.nn.functional as F

from ..constants import CONTEXT
from ..errors import BudgetError, RequestError, brief
from ..layers import apply_rope, rope_cos_sin
from ..protocol import Sampling
from ..weights.quant import ConvRotLinear
from ..weights.quant import rotate as _rotate
from ..sampling import PhaseResult, cfg_combine
from ..switches import choice, flag
from . import pdl_enabled
from .sampler import SLICES, TIE_PAD, candidates, choose, static_mask

BUCKET = 1024  # attention-length granularity of the captured graphs (positions)


def head_rows(lm_head, start: int, stop: int, rotated: bool = False, gemv: bool = False):
    """The LM head restricted to output rows [start, stop): a function hidden [R, H] → logits [R, stop−start].
    `gemv`: `fast.gemv` for inputs it supports (≤ 16 rows on CUDA; bf16 at one row 1.4× cuBLAS and at eight 3.6×
    on the H200, docs/gemv_sweep_h200.log; int8 ConvRot heads after the Triton rotation `gemv.rotate`, NVIDIA
    only), cuBLAS / the W8A16 kernel of `int8_kernels` otherwise (e.g. the prefill of long prompts). `rotated`
    (int8 ConvRot heads only): the hidden states come already rotated (·H), as `fused.add_rmsnorm` with rot=True
    writes them."""
    from . import gemv as G
    side = getattr(lm_head, "lora_side", None)
    if side is not None:  # an adapter on the LM head (int8): the portable module path, restricted to the rows
        return lambda h: side.apply(h, lambda: lm_head._base(h))[..., start:stop]
    if isinstance(lm_head, ConvRotLinear):
        from .int8_kernels import convrot_linear
        q, s = lm_head.weight[start:stop], lm_head.weight_scale[start:stop]
        if rotated:  # xq: the same hidden states as int8 pair codes (`gemv.QAct`, YUE2_INT8_DOT=int8)
            return lambda h, xq=None: G.gemv(h, q, s.view(-1), xq=xq)
        if gemv and lm_head.group == 256 and s.dtype == torch.float32 and torch.version.hip is None:
            return lambda h: (G.gemv(G.rotate(h), q, s.view(-1)) if G.supported(h, q)
                              else convrot_linear(h, q, s, None, lm_head.group))
        return lambda h: convrot_linear(h, q, s, None, lm_head.group)
    w = lm_head.weight[start:stop]
    if gemv and w.dtype == torch.bfloat16:
        return lambda h: G.gemv(h, w) if G.supported(h, w) else F.linear(h, w)
    return lambda h: F.linear(h, w)


def _scores(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q [R, nkv, g, D] · keysᵀ [R, nkv, L, D] → fp32 scores [R, nkv, g, L], accumulated in fp32 and not rounded to
    bf16 on CUDA (bmm with out_dtype); elsewhere the product is upcast after the matmul."""
    r, h, g, d = q.shape
    if q.is_cuda and q.dtype != torch.float32:
        try:
            return torch.bmm(q.reshape(r * h, g, d), keys.reshape(r * h, -1, d).transpose(1, 2),
                             out_dtype=torch.float32).reshape(r, h, g, -1)
        except (TypeError, RuntimeError):
            pass
    return (q @ keys.transpose(-1, -2)).float()


def _rms(x, w, eps: float):
    """RMSNorm with the reference rounding order (same maths as layers.RMSNorm, as a free function)."""
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * w


def _pre_attn(x, ln_w, qkv_w, qn_w, kn_w, cos, sin, eps: float, heads: int, kv_heads: int, hd: int):
    """input_layernorm → fused qkv → QK-norm → RoPE for decode rows x [R, 1, H] (bf16 weights)."""
    r = x.shape[0]
    q, k, v = F.linear(_rms(x, ln_w, eps), qkv_w).split((heads * hd, kv_heads * hd, kv_heads * hd), dim=-1)
    q = _rms(q.view(r, 1, heads, hd), qn_w, eps)
    k = _rms(k.view(r, 1, kv_heads, hd), kn_w, eps)
    rc, rs = cos.unsqueeze(2), sin.unsqueeze(2)
    return apply_rope(q, rc, rs), apply_rope(k, rc, rs), v.view(r, 1, kv_heads, hd)


def _post_attn(x, h, o_w, ln2_w, gu_w, down_w, eps: float, ffn: int):
    """o_proj + residual, post_attention_layernorm → SwiGLU MLP + residual (bf16 weights)."""
    x = x + F.linear(h, o_w)
    gate, up = F.linear(_rms(x, ln2_w, eps), gu_w).split(ffn, dim=-1)
    return x + F.linear(F.silu(gate) * up, down_w)


_COMPILED: dict = {}
_STREAMS: dict = {}


_THREAD = threading.local()  # .capture: this thread's capture stream (`capture_on`)


@contextlib.contextmanager
def capture_on(stream):
    """While open, this thread's decode graphs (and the NAR's velocity graphs, nar.ChunkRenderer) are warmed up and
    captured on `stream` instead of the per-device side stream: a stream of a CUDA green context, so the captured
    kernels run on that context's SMs when replayed (a graph keeps the context it was captured in — replaying a
    graph captured on an ordinary stream into a green context's stream used every SM; `bench/overlap_split.py`)."""
    old = getattr(_THREAD, "capture", None)
    _THREAD.capture = stream
    try:
        yield
    finally:
        _THREAD.capture = old


def thread_capture_stream():
    """The stream `capture_on` set for this thread, or None."""
    return getattr(_THREAD, "capture", None)


def _capture_stream(device) -> "torch.cuda.Stream":
    """One side stream per device for graph warm-up/capture (PyTorch keeps a cuBLAS workspace per stream for the
    life of the process, so a new stream per capture would leak ~64 MiB per song); `capture_on`'s stream when this
    thread set one."""
    local = thread_capture_stream()
    if local is not None:
        return local
    key = str(device)
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device)
    return _STREAMS[key]


# Another thread doing CUDA work while a decoder captures its graphs (the batch command's render worker,
# batch/runner.py `_RenderStage`): the capture runs in capture_error_mode "thread_local" then (the default "global"
# refuses, and invalidates the capture on, any other thread's cudaMalloc, pageable copy or sync), and under
# CAPTURE_LOCK, which that thread takes around its own device-wide syncs and torch.cuda.empty_cache().
CAPTURE_LOCK = threading.RLock()
_CONCURRENT = [0]  # how many `concurrent_capture` blocks are open


def _capture_beside_worker(graph, pool, stream, fn) -> None:
    """Capture fn() into `graph` on `stream` in capture_error_mode "thread_local", under CAPTURE_LOCK, WITHOUT what
    `torch.cuda.graph` does on entry — a device-wide synchronize and `empty_cache()`: beside the batch command's
    render worker those wait for every kernel it has queued (up to a whole song's NAR solve, seconds; measured on
    an H200 with `bench/overlap_split.py`: the AR batch decode fell to 0.40 of its rate beside a render). The
    stream's earlier work is ordered before by the caller (`stream.wait_stream`), as for `torch.cuda.graph`. Used by
    the AR decoder beside the render worker and by the worker's NAR captures (`nar.ChunkRenderer._capture`)."""
    capture_on_stream(graph, pool, stream, fn, "thread_local")


def capture_on_stream(graph, pool, stream, fn, mode: str, settle: bool = False) -> None:
    """Capture fn() into `graph` on `stream` in capture_error_mode `mode`, under CAPTURE_LOCK. `settle`: first what
    `torch.cuda.graph` does on entry, a device-wide synchronize and `empty_cache()` (alone on the GPU: returns the
    pools of graphs freed before). Unlike `torch.cuda.graph`, an error inside fn() is the one raised — ending a
    broken capture raises "operation failed due to a previous error during capture", which would hide it — and the
    current stream is restored whatever fails."""
    with CAPTURE_LOCK:
        if settle:
            torch.cuda.synchronize(stream.device)
            torch.cuda.empty_cache()
        with torch.cuda.stream(stream):
            graph.capture_begin(*((pool,) if pool is not None else ()), capture_error_mode=mode)
            try:
                fn()
            except BaseException:
                try:
                    graph.capture_end()
                except Exception:  # the capture's follow-up error: the first one says why
                    pass
                raise
            graph.capture_end()


@contextlib.contextmanager
def concurrent_capture():
    """While open, `PhaseDecoder` graph captures use capture_error_mode="thread_local" (only the capturing thread is
    restricted), for a worker thread that launches work on its own stream meanwhile (the caller's part: a
    non-blocking stream the capture never joins, and `CAPTURE_LOCK` around its empty_cache / device syncs)."""
    with CAPTURE_LOCK:
        _CONCURRENT[0] += 1
    try:
        yield
    finally:
        with CAPTURE_LOCK:
            _CONCURRENT[0] -= 1


def compiled_layer_fns():
    """(pre, post) compiled once per process with torch.compile (weights are arguments, so one graph serves all
    28 layers). Returns None when torch.compile is unavailable or fails."""
    if "fns" not in _COMPILED:
        try:
            _COMPILED["fns"] = (torch.compile(_pre_attn, dynamic=False), torch.compile(_post_attn, dynamic=False))
        except Exception as exc:  # no compiler toolchain, unsupported platform
            warnings.warn(f"torch.compile unavailable ({type(exc).__name__}); decode layers run uncompiled")
            _COMPILED["fns"] = None
    return _COMPILED["fns"]


def _plain_bf16(ar) -> bool:
    lin = torch.nn.Linear
    return all(isinstance(l.self_attn.qkv_proj, lin) and isinstance(l.self_attn.o_proj, lin) and
               isinstance(l.mlp.gate_up_proj, lin) and isinstance(l.mlp.down_proj, lin) for l in ar.model.layers)


def _gemv_layers(ar) -> str | None:
    """"bf16" / "int8" when every layer linear of the AR can run through `fast.gemv` (no bias; bf16 weights, or
    int8 ConvRot codes in 256-groups with fp32 row scales), else None."""
    from .gemv import available
    if not available():
        return None
    kinds = set()
    for layer in ar.model.layers:
        for mod in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            if getattr(mod, "bias", None) is not None or mod.weight.shape[1] % 256:
                return None
            if isinstance(mod, ConvRotLinear) and mod.group == 256 and mod.weight_scale.dtype == torch.float32:
                kinds.add("int8")
            elif isinstance(mod, torch.nn.Linear) and mod.weight.dtype in (torch.bfloat16, torch.float16):
                kinds.add("bf16")
            else:
                return None
    return kinds.pop() if len(kinds) == 1 else None


SHARED_MIN = 16  # shortest common prefix worth sharing (positions)
# fewest songs for which the shared-prefix attention pays, on an H200: the kernel alone (bench/decode_parts.py, 4,352
# positions of which 3,264 shared; docs/experiments/decode_parts_h200_2026-11-30.log) ran 0.89× the per-row one at 2
# rows and 1.70× at 8; whole decode steps with 2,000 shared positions (docs/bench_h200.log): 8 songs 4,469 vs 3,990
# tok/s, 4 songs 2,364 vs 2,275
SHARED_MIN_ROWS = 4
# smallest shared part of the shortest row worth the extra kernel (≈ 2–3 µs a layer): an estimate from the numbers
# above, not a measurement (at 8 rows the saving is ≈ the shared fraction × 0.35 ms a step, the cost ≈ 0.07 ms)
SHARED_MIN_FRACTION = 0.25


def _common_prefix(seqs: list[list[int]]) -> int:
    """Length of the longest prefix common to every token list."""
    n = min(len(x) for x in seqs)
    for i in range(n):
        t = seqs[0][i]
        if any(x[i] != t for x in seqs):
            return i
    return n


_WARNED: dict = {}  # one warning per process for each retired / unsupported switch


def _warn_retired_switches() -> None:
    """One warning per process for a retired switch that is still set (it would otherwise be silently ignored)."""
    for name, why in (("YUE2_FUSED_SAMPLER", "the one-kernel sampling tail was slower than the PyTorch tail and "
                                             "was removed; YUE2_SAMPLER=kernels|torch chooses the tail now"),
                      ("YUE2_GEMV_EPILOGUE", "the GEMV epilogues (a product and its consumer in one launch) were "
                                             "slower on an H200 (int8 484 vs 669 tok/s) and were removed")):
        if os.environ.get(name) is not None and not _WARNED.get(name):
            _WARNED[name] = True
            warnings.warn(f"{name} is no longer read: {why}")


def _int8_dot() -> str:
    """How the decode step multiplies int8 ConvRot codes: YUE2_INT8_DOT "convert" (each code converted to bf16 for
    a bf16 tensor-core product with the bf16 activation) or "int8" (the activation as int8 pair codes, `gemv.QAct`,
    one int8 × int8 tensor-core product per 256-group; needs the producers' rotation). Raises RequestError for other
    values."""
    return choice("YUE2_INT8_DOT", ("convert", "int8"), INT8_DOT_DEFAULT)


INT8_DOT_DEFAULT = "int8"  # measured on an H200: +5 % at 1 row, +11 % at 8 (bench/int8_dot.py)


def _int8_rotation() -> str:
    """Where the decode step rotates int8 ConvRot inputs: YUE2_INT8_ROT ("producers" | "cublas"), default
    "producers" on NVIDIA and "cublas" on ROCm. Raises RequestError for other values."""
    value = choice("YUE2_INT8_ROT", ("producers", "cublas"), "")
    if os.environ.get("YUE2_ROT_FUSED") is not None and not _WARNED.get("rot_fused"):
        _WARNED["rot_fused"] = True
        warnings.warn("YUE2_ROT_FUSED is no longer read; use YUE2_INT8_ROT=producers|cublas")
    if torch.version.hip is not None:
        if value == "producers" and not _WARNED.get("rocm"):
            _WARNED["rocm"] = True
            warnings.warn("YUE2_INT8_ROT=producers needs NVIDIA (3-pass tf32 tensor-core products); using cublas")
        return "cublas"
    return value or "producers"


class _RowCache:
    """A KVCache-compatible view of one row of the static buffers, used to prefill that row eagerly."""

    def __init__(self, k_layers, v_layers, row: int, capacity: int):
        self.k = [k[row:row + 1] for k in k_layers]
        self.v = [v[row:row + 1] for v in v_layers]
        self.layers, self.capacity, self.length = len(k_layers), capacity, 0

    def update(self, layer, k, v):
        start, end = self.length, self.length + k.shape[2]
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        if layer == self.layers - 1:
            self.length = end
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


def sample_tail(logits, G: int, cfg: float, s: Sampling, phase: str, step, ring, ring_w, mask, noise, forced_t,
                out, done, tokens, legacy_off: bool = False, budget=None) -> None:
    """The sampling tail of a decode step in PyTorch ops (graph-capturable, no host sync), updating the state in
    place: CFG combine of logits [R, width] (cond rows then uncond rows), `sampler.candidates` + `sampler.choose`
    with the step's Exp(1) draws noise[step] [G, K], teacher forcing (forced_t [max_tokens], −1 = free), then
    out[g, step] ← token, the penalty ring slot step % window ← column, done[g] |= end or budget reached,
    tokens [R] ← the token of each row's song. step [1] long, one step for every row; continuous batching
    (`fast.refill`): step [G], a step per row, and budget [G, 2] long, each row's (min_tokens, max_tokens). (One
    Triton kernel doing the same was measured slower on an H200: 605 vs 628 tok/s at batch 1, 422 vs 607 in the ABC
    phase; docs/experiments/decode_tried_h200.log.)"""
    sl = SLICES[phase]
    logits = logits[:G] if cfg == 1.0 else cfg_combine(logits[:G], logits[G:], cfg)
    vals, cols = candidates(logits, s, phase, step, ring, ring_w, mask, legacy_off,
                            None if budget is None else budget[:, 0])
    if budget is None:  # one step for every row
        col = choose(vals, cols, None if noise is None else noise.index_select(0, step)[0])
        forced = forced_t.index_select(0, step).expand(G)
    else:  # a step per row (`fast.refill`): row g's draws noise[step[g], g], its forced token forced_t[step[g]]
        rows = torch.arange(G, device=step.device)
        col = choose(vals, cols, None if noise is None else noise[step, rows])
        forced = forced_t.index_select(0, step)
    col = torch.where(forced >= 0, forced - sl.start, col)
    tok = col + sl.start
    out.scatter_(1, step.expand(G)[:, None], tok[:, None])
    slot = (step % s.penalty_window).expand(G)[:, None]
    ring.scatter_(1, slot, col[:, None])
    ring_w.scatter_(1, slot, torch.ones(G, 1, device=ring_w.device))
    done.copy_(done | (col == sl.end_col) | (step + 1 >= (s.max_tokens if budget is None else budget[:, 1])))
    tokens.copy_(tok.repeat(tokens.shape[0] // G))


class PhaseDecoder:
    """One AR phase for G songs sampled in one batch (`seeds[g]` per song). `prefixes[g]` / `negatives[g]`: token
    lists; CFG when cfg_scale ≠ 1. `forced` teacher-forces the first tokens of every song. Raises BudgetError when
    a prefix + max_tokens (`row_budgets[g]` when given: each song's own, `fast.refill`) exceeds the context."""

    def __init__(self, ar, prefixes: list[list[int]], sampling: Sampling, seeds: list[int], phase: str, *,
                 negatives: list[list[int]] | None = None, cfg_scale: float = 1.0, legacy_off: bool = False,
                 forced: list[int] | None = None, use_graph: bool | None = None, block: int = 16,
                 compile: bool | None = None, fused: bool | None = None, row_budgets: list[int] | None = None):
        if phase not in SLICES:
            raise RequestError(f"phase must be 'abc' or 'semantic', got {phase!r}")
        self.ar, self.s, self.phase, self.legacy_off = ar, sampling.validate(phase), phase, legacy_off
        self.cfg = float(cfg_scale)
        self.G = len(prefixes)
        if len(seeds) != self.G:
            raise RequestError(f"{self.G} prefixes but {len(seeds)} seeds")
        rows = list(prefixes)
        if self.cfg != 1.0:
            if negatives is None or len(negatives) != self.G:
                raise RequestError("CFG (cfg_scale ≠ 1) needs one negative prefix per song")
            rows += list(negatives)
        budgets = (list(row_budgets) * (len(rows) // self.G) if row_budgets is not None
                   else [sampling.max_tokens] * len(rows))
        for ids, budget in zip(rows, budgets):
            if len(ids) + budget > CONTEXT:
                raise BudgetError(f"prompt ({len(ids)} tokens) + {phase} budget ({budget}) exceeds the "
                                  f"{CONTEXT}-token context; at most {CONTEXT - len(ids)} {phase} tokens fit")
        self.rows, self.R = rows, len(rows)
        self.device, self.dtype = ar.device, ar.dtype
        self.block = block
        self.use_graph = (self.device.type == "cuda") if use_graph is None else use_graph
        self.forced = list(forced or [])
        if len(self.forced) > sampling.max_tokens:
            raise RequestError(f"{len(self.forced)} forced tokens exceed the budget of {sampling.max_tokens}")
        self.slice = sl = SLICES[phase]
        if sl.start + sl.end_col in self.forced:
            raise RequestError("forced tokens cannot contain the end token")
        bad = next((t for t in self.forced if not sl.start <= int(t) < sl.stop), None)
        if bad is not None:
            raise RequestError(f"forced token {bad} is outside the {phase} phase's ids [{sl.start}, {sl.stop})")
        self.seeds = [int(x) for x in seeds]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.capture_s = 0.0
        # the next attention bucket's graph captured on a worker thread while this one replays (`fast.side_capture`)
        from . import side_capture
        self.side_ok = side_capture.enabled()  # validated on every device
        self._side = None  # the pending side_capture.SideCapture
        self.side_captures, self.side_capture_s = 0, 0.0
        self.side_capture_error: str | None = None
        self.graph_error: str | None = None
        self.kernel_error: str | None = None  # set when the fused step failed and the unfused one took over
        from . import fused as fused_mod
        if fused is None:
            fused = self.device.type == "cuda" and flag("YUE2_FUSED", True)
        d = ar.dims
        self.fused = bool(fused) and fused_mod.available() and fused_mod.supports(d.heads, d.kv_heads, d.head_dim)
        # split-length Triton decode attention inside the fused step (YUE2_DECODE_ATTN=torch: bmm + softmax)
        self.attn_kernel = self.fused and choice("YUE2_DECODE_ATTN", ("triton", "torch"), "triton") == "triton"
        # split-K Triton products (`fast.gemv`) for the layer linears, summed inside the consumer kernels
        # (YUE2_GEMV=0: cuBLAS for bf16, the W8A16 kernel of int8_kernels for int8)
        kind = _gemv_layers(ar) if self.fused else None
        self.gemv = (kind is not None and flag("YUE2_GEMV", True) and self.R <= 16
                     and self.dtype in (torch.bfloat16, torch.float16))
        self.int8_layers = self.gemv and kind == "int8"
        if self.gemv:
            from .gemv import _tables
            _tables()  # a bad YUE2_GEMV_TABLE file is reported here, before any work
        # int8 ConvRot products need their input rotated (·H per 256-group). YUE2_INT8_ROT picks where:
        # "producers" (default on NVIDIA): the kernels writing the activations (add+RMSNorm, SiLU·up, the attention
        # merge) write them rotated with tensor-core products in 3-pass tf32 (`_decode_triton.rot_rows`; Triton's
        # AMD backend has no tf32x3, so ROCm builds default to "cublas"); "cublas": one bf16 matmul per product.
        # (Rotating inside the GEMV was measured too: most products 1.3–2.1× slower, docs/decode_parts_h200.log.)
        _warn_retired_switches()
        # the sampling tail: scores kernel + torch.topk + finish kernel (`sample_kernels`, default with the fused
        # step), or the PyTorch ops of `sample_tail` (YUE2_SAMPLER=torch, and whatever `sample_kernels` does not cover)
        self.tail_choice = choice("YUE2_SAMPLER", ("kernels", "torch"), "kernels")
        self.tail = None
        self.tail_error: str | None = None  # set when the sampling-tail kernels failed and the PyTorch tail took over
        rotation = _int8_rotation()  # validated whatever the layers
        self.int8_rot = rotation if self.int8_layers else None
        self.rot_fused = self.int8_rot == "producers"
        # YUE2_INT8_DOT=int8: the producers also write their rotated outputs as int8 pair codes and the layer
        # products and the codec head run int8 × int8 on the tensor cores (`gemv.gemv_q`; ≤ 8 rows)
        from .gemv import MAX_PAIR_ROWS
        dot = _int8_dot()  # validated whatever the layers
        self.int8_dot = self.rot_fused and self.attn_kernel and self.R <= MAX_PAIR_ROWS and dot == "int8"
        self.int8_dot_error: str | None = None
        want = flag("YUE2_COMPILE", False) if compile is None else compile
        self.fns = compiled_layer_fns() if want and self.device.type == "cuda" and _plain_bf16(ar) else None
        # Shared prefix (YUE2_SHARED_PREFIX, on by default; fused step with the Triton attention, ≥ SHARED_MIN_ROWS
        # songs): the prompt prefix common to every row (e.g. candidate songs of one request) is prefilled once and
        # read once per step for all rows (`fused.decode_attention(shared=…)`), when it is at least SHARED_MIN
        # positions and SHARED_MIN_FRACTION of the shortest row. With CFG the rows include the negative prompts, whose
        # common part with the positive ones is short, so CFG batches rarely share. Results differ from the unshared
        # decoder within bf16/fp16 rounding (summation order, the tails' prefill shapes).
        self.shared = 0
        if (flag("YUE2_SHARED_PREFIX", True) and self.G >= SHARED_MIN_ROWS and self.attn_kernel
                and self.fns is None):
            full = [list(r) + self.forced for r in rows]
            common = _common_prefix(full)
            if common >= SHARED_MIN and common >= SHARED_MIN_FRACTION * min(len(r) for r in full):
                self.shared = common
        # weights pulled into L2 ahead of the products on a side branch (`fast.l2_prefetch`, YUE2_L2_PREFETCH,
        # experimental, off by default): parsed on every device, built for the fused per-kernel step on sm_90+
        from . import l2_prefetch
        spec = os.environ.get("YUE2_L2_PREFETCH", "")
        l2_prefetch.parse(spec)
        self.prefetch = None
        wanted = self.device.type == "cuda" and bool(l2_prefetch.parse(spec))
        if wanted and not (self.fused and self.gemv and self.attn_kernel):
            warnings.warn("YUE2_L2_PREFETCH applies to the fused step with the split-K products and the Triton "
                          "attention; this decoder runs without them (YUE2_FUSED / YUE2_GEMV / YUE2_DECODE_ATTN, or "
                          "more than 16 rows), so nothing is prefetched")
        elif wanted:
            try:
                self.prefetch = l2_prefetch.Prefetcher(ar.model.layers, self.device, spec)
            except (RuntimeError, OSError, AttributeError, ImportError) as exc:  # no sm_90, no NVRTC helpers
                warnings.warn(f"L2 weight prefetch unavailable ({brief(exc)}); decoding without it")
        # one launch per layer (`fast.persistent`, YUE2_LAYER_KERNEL): with the split-K products and the Triton
        # attention, no shared prefix, and a model the kernel handles; `fast.refill` keeps the per-kernel step
        from . import persistent
        wanted = persistent.mode(self._layer_default)  # validated on every device
        self.layer_mode = wanted if self.gemv and self.attn_kernel else "off"
        self.layer_kernel = None
        self.layer_reason = None
        if self.layer_mode != "off":
            self.layer_reason = ("a shared prefix" if self.shared else
                                 "continuous batching" if not self._layer_ok else
                                 persistent.unsupported(ar, self.R, self.dtype, self.layer_mode))
            if self.layer_reason is not None:
                self.layer_mode = "off"
        if self.prefetch is not None and self.layer_mode != "off":
            warnings.warn("YUE2_L2_PREFETCH applies to the per-kernel step; the one-launch layers "
                          f"(YUE2_LAYER_KERNEL={self.layer_mode}) run without it")

    # -- buffers ---------------------------------------------------------------------------------------------------
    def _allocate(self):
        d, dev, s = self.ar.dims, self.device, self.s
        self.capacity = self._capacity()
        slots = s.max_tokens + self._spare  # step-indexed buffers: one spare slot where a frozen row's step rests
        shape = (self.R, d.kv_heads, self.capacity, d.head_dim)
        self.k = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in range(d.layers)]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in range(d.layers)]
        self.head = head_rows(self.ar.model.lm_head, self.slice.start, self.slice.stop,
                              gemv=self.gemv and self.int8_rot != "cublas")
        self.head_rot = head_rows(self.ar.model.lm_head, self.slice.start, self.slice.stop, rotated=True)
        self.mask = static_mask(self.phase, torch.float32, dev)
        self.logits = torch.zeros(self.R, self.slice.width, dtype=self.dtype, device=dev)
        self.tokens = torch.zeros(self.R, dtype=torch.long, device=dev)
        self.pos = torch.tensor([len(r) for r in self.rows], dtype=torch.long, device=dev)
        self.step = torch.zeros(self._step_rows, dtype=torch.long, device=dev)
        self.ring = torch.zeros(self.G, s.penalty_window, dtype=torch.long, device=dev)
        self.ring_w = torch.zeros(self.G, s.penalty_window, dtype=torch.float32, device=dev)
        self.out = torch.full((self.G, slots), -1, dtype=torch.long, device=dev)
        self.done = torch.zeros(self.G, dtype=torch.bool, device=dev)
        forced = torch.full((slots,), -1, dtype=torch.long)
        forced[:len(self.forced)] = torch.tensor(self.forced, dtype=torch.long)
        self.forced_t = forced.to(dev)
        self.k_cand = 1 if s.temperature == 0 else min(s.top_k + TIE_PAD, self.slice.width)
        self.noise = None
        if s.temperature != 0:
            self.noise = torch.stack([self._row_draws(g) for g in range(self.G)], dim=1)  # [max_tokens (+ spare), G, K]
        from . import sample_kernels
        if (self.tail_choice == "kernels" and self.fused and self.fns is None
                and sample_kernels.usable(s, self.k_cand, self.legacy_off)):
            from .fused import _pdl
            self.tail = sample_kernels.KernelTail(s, self.phase, self.G, self.k_cand, dev, _pdl(self.logits))
            if self.tail.rule is None:  # this PyTorch divides by T in a way the kernel does not reproduce
                self.tail = None
        self.rows_idx = torch.arange(self.R, device=dev)
        # YUE2_ATTN_MERGE=kernel: the decode attention's splits are merged by a separate kernel; default "split":
        # by the last split program of each (row, kv head), counted in these (zero between launches); not on ROCm
        merge = choice("YUE2_ATTN_MERGE", ("split", "kernel"), "split")
        self.attn_counters = (torch.zeros(self.R * d.kv_heads, dtype=torch.int32, device=dev)
                              if merge == "split" and self.attn_kernel and torch.version.hip is None else None)
        if self.layer_mode != "off":
            from .persistent import LayerKernel
            try:
                self.layer_kernel = LayerKernel(self.ar, self.R, self.k, self.v, self.layer_mode)
            except (torch.cuda.OutOfMemoryError, MemoryError):
                raise
            except Exception as exc:  # the CUDA kernel's compile or residency: the per-kernel step
                self.layer_mode, self.layer_reason = "off", brief(exc)
                warnings.warn(f"one-launch decoder layers unavailable ({self.layer_reason}); running the "
                              "per-kernel fused step")

    # the one-launch layer kernel's default mode, and whether this decoder may use it (`fast.refill` may not)
    _layer_default, _layer_ok = "off", True

    # one step and one budget for every row; `fast.refill.RefillDecoder` keeps a step and a budget per row
    # (`budget` [G, 2]: min_tokens, max_tokens) and a spare slot for finished rows
    _step_rows, _spare, budget = 1, 0, None

    def _capacity(self) -> int:
        """Positions the K/V buffers hold: the longest prompt + the phase's budget."""
        return max(len(r) for r in self.rows) + self.s.max_tokens

    def _row_draws(self, g: int) -> torch.Tensor:
        """Row g's column of the noise buffer: its song's draws, padded to the buffer's slots (unused Exp(1) = 1)."""
        return self._padded(self._draws(self.seeds[g]))

    def _padded(self, e: torch.Tensor) -> torch.Tensor:
        missing = self.s.max_tokens + self._spare - e.shape[0]
        return e if missing == 0 else torch.cat([e, torch.ones(missing, self.k_cand, device=e.device)])

    def _draws(self, seed: int, n: int | None = None) -> torch.Tensor:
        """A song's Exp(1) draws [n, K] fp32 on the device (n: the phase's max_tokens), from a generator seeded with
        its seed (on the device for CPU and CUDA, else on the CPU)."""
        dev = self.device
        gen = torch.Generator(device=dev if dev.type in ("cpu", "cuda") else "cpu").manual_seed(seed)
        e = torch.empty(n or self.s.max_tokens, self.k_cand, dtype=torch.float32, device=gen.device)
        return e.exponential_(1.0, generator=gen).to(dev)

    def _prefill(self):
        """Prefill every row with its prompt plus the teacher-forced tokens in one pass (they are fed, never
        sampled), then set the state as if those tokens had been decoded: out, penalty ring, pos and step."""
        fed = [int(t) for t in self.forced]
        first = len(self.rows[0]) + len(fed)
        for r, ids in enumerate(self.rows):
            cache = _RowCache(self.k, self.v, r, self.capacity)
            seq = list(ids) + fed
            if r and self.shared:  # the common prefix: row 0's K/V, computed once
                for k, v in zip(self.k, self.v):
                    k[r, :, :self.shared] = k[0, :, :self.shared]
                    v[r, :, :self.shared] = v[0, :, :self.shared]
                if len(seq) == self.shared == first:  # the same prompt as row 0: same logits
                    self.logits[r] = self.logits[0]
                    continue
                # this row's tail; a row that is only the prefix recomputes its last position for its logits
                keep = self.shared - (len(seq) == self.shared)
                cache.length = keep
                seq = seq[keep:]
            h = self.ar.hidden(torch.tensor([seq], device=self.device), cache)[:, -1]
            self.logits[r] = self.head(self.ar.model.norm(h))[0]
        n = len(fed)
        if n:
            s, sl = self.s, self.slice
            ids = torch.tensor(fed, dtype=torch.long, device=self.device)
            self.out[:, :n] = ids
            last = torch.arange(max(0, n - s.penalty_window), n, device=self.device)
            self.ring[:, last % s.penalty_window] = (ids[last] - sl.start).expand(self.G, -1)
            self.ring_w[:, last % s.penalty_window] = 1.0
            self.pos.add_(n)
            self.step.fill_(n)

    # -- the step --------------------------------------------------------------------------------------------------
    def _forward(self, attn_len: int):
        """Model forward of `tokens` at `pos` for every row, attending to cache positions [0, attn_len)."""
        ar, d = self.ar, self.ar.dims
        x = ar.model.embed_tokens(self.tokens[:, None])
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        cos, sin = rope_cos_sin(self.pos[:, None], d.head_dim, d.rope_theta)
        visible = (torch.arange(attn_len, device=self.device)[None, :] <= self.pos[:, None])[:, None, None, :]
        groups, scale = d.heads // d.kv_heads, 1.0 / math.sqrt(d.head_dim)
        for i, layer in enumerate(ar.model.layers):
            if self.fns is not None:
                att_mod = layer.self_attn
                q, k, v = self.fns[0](x, layer.input_layernorm.weight, att_mod.qkv_proj.weight, att_mod.q_norm.weight,
                                      att_mod.k_norm.weight, cos, sin, d.eps, d.heads, d.kv_heads, d.head_dim)
            else:
                q, k, v = layer.self_attn.project(layer.input_layernorm(x), cos, sin)
            self.k[i][self.rows_idx, :, self.pos] = k[:, 0]
            self.v[i][self.rows_idx, :, self.pos] = v[:, 0]
            keys, values = self.k[i][:, :, :attn_len], self.v[i][:, :, :attn_len]
            qg = q[:, 0].reshape(self.R, d.kv_heads, groups, d.head_dim)
            att = _scores(qg, keys) * scale
            att = att.masked_fill(~visible, float("-inf")).softmax(-1).to(self.dtype)
            h = (att @ values).reshape(self.R, 1, d.heads * d.head_dim)
            if self.fns is not None:
                x = self.fns[1](x, h, layer.self_attn.o_proj.weight, layer.post_attention_layernorm.weight,
                                layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight, d.eps, d.ffn)
            else:
                x = x + layer.self_attn.o_proj(h)
                x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.logits.copy_(self.head(ar.model.norm(x[:, 0])))

    def _lin(self, mod, x2, rotated: bool, xq=None):
        """One layer linear through `fast.gemv`: x2 [R, K] → `gemv.Partials` or [R, N]. int8: x2 is rotated here
        (Triton kernel with `rot_fused`, else cuBLAS) unless `rotated` (the producing kernel did it); `xq`: x2's
        int8 pair codes (`gemv.QAct`, YUE2_INT8_DOT=int8) — the product then runs int8 × int8."""
        from . import gemv
        if isinstance(mod, ConvRotLinear):
            if not rotated:
                x2 = gemv.rotate(x2) if self.rot_fused else _rotate(x2)
            y = gemv.gemv(x2, mod.weight, mod.weight_scale.view(-1), partial=True, xq=xq)
            side = mod.lora_side
            if side is not None:  # adapters: x̃·Ãᵀ·Bᵀ in fp32 (weights.lora.apply), added to the first partial sum
                if isinstance(y, gemv.Partials):
                    side.add_rotated_(x2, y.t[0], mod.group)
                else:
                    y = side.add_rotated_(x2, y.float(), mod.group).to(y.dtype)
            return y
        return gemv.gemv(x2, mod.weight, partial=True)

    def _forward_fused(self, attn_len: int):
        """Same maths as `_forward` with fused Triton kernels: per layer add+RMSNorm, QK-norm+RoPE+KV store and
        SiLU·up each run as one kernel, and the attention as a split-length decode kernel (`fused.decode_attention`;
        with `attn_kernel` off: bmm + mask + softmax, the mask built once per step). With `gemv`, the four layer
        linears are split-K Triton products whose partial sums the next kernel adds up; for int8 layers with
        `rot_fused` (YUE2_INT8_ROT=producers, the default), the norms and SiLU·up write their outputs already
        rotated for the ConvRot products."""
        from . import fused
        ar, d = self.ar, self.ar.dims
        x = ar.model.embed_tokens(self.tokens[:, None])
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        cos, sin = rope_cos_sin(self.pos, d.head_dim, d.rope_theta)
        bias = None
        if not self.attn_kernel:
            visible = torch.arange(attn_len, device=self.device)[None, :] <= self.pos[:, None]
            bias = torch.zeros(self.R, 1, 1, attn_len, device=self.device).masked_fill_(~visible[:, None, None],
                                                                                        float("-inf"))
        groups, scale = d.heads // d.kv_heads, 1.0 / math.sqrt(d.head_dim)
        rot, R, qd = self.rot_fused, self.R, self.int8_dot
        lin = self._lin if self.gemv else (lambda mod, x2, rotated, xq=None: mod(x2))
        head_rot = (rot and isinstance(ar.model.lm_head, ConvRotLinear) and ar.model.lm_head.group == 256
                    and ar.model.lm_head.lora_side is None)
        delta = None
        layers = ar.model.layers
        if self.layer_kernel is not None:  # every layer in one launch each (`fast.persistent`)
            try:
                x2, delta = self.layer_kernel(x.view(R, -1), cos, sin, self.pos, attn_len)
                x, delta, layers = x2.view(R, 1, -1), delta.view(R, 1, -1), ()
            except (torch.cuda.OutOfMemoryError, MemoryError):
                raise
            except Exception as exc:  # its first call (eager) failed: compile, residency — the per-kernel step
                if self.layer_kernel.proven:
                    raise
                self.layer_kernel, self.layer_mode, self.layer_reason = None, "off", brief(exc)
                warnings.warn(f"one-launch decoder layers unavailable ({self.layer_reason}); running the "
                              "per-kernel fused step")
                delta = None
            else:
                self.layer_kernel.proven = True
        pf = self.prefetch if self.layer_kernel is None else None
        caches = (self.k, self.v)
        at = (lambda point, i: pf.at(point, i, caches, attn_len)) if pf else (lambda point, i: None)
        for i, layer in enumerate(layers):
            att_mod = layer.self_attn
            at("start", i)
            x, y, *pack = fused.add_rmsnorm(x, delta, layer.input_layernorm.weight, d.eps, rot=rot, quant=qd)
            qkv = lin(att_mod.qkv_proj, y.view(R, -1), rot, *pack)  # pack: [QAct] with qd, else []
            at("qkv", i)
            q = fused.qk_norm_rope_store(qkv, att_mod.q_norm.weight, att_mod.k_norm.weight,
                                         cos, sin, self.pos, self.k[i], self.v[i], d.heads, d.kv_heads,
                                         d.head_dim, d.eps)
            if self.attn_kernel:  # int8 (rot): the merge writes the o_proj input rotated
                h = fused.decode_attention(q, self.k[i], self.v[i], self.pos, attn_len, scale, rot=rot,
                                           shared=self.shared, counters=self.attn_counters, quant=qd)
                h, *pack = h if qd else (h,)
            else:
                keys, values = self.k[i][:, :, :attn_len], self.v[i][:, :, :attn_len]
                att = torch.add(bias, _scores(q.view(R, d.kv_heads, groups, d.head_dim), keys), alpha=scale)
                h = (att.softmax(-1).to(self.dtype) @ values).reshape(R, d.heads * d.head_dim)
                pack = []  # (int8 × int8 products need the Triton attention: qd is False here)
            at("attn", i)
            o = lin(att_mod.o_proj, h, rot and self.attn_kernel, *pack)
            at("o", i)
            x, y, *pack = fused.add_rmsnorm(x, o if self.gemv else o[:, None], layer.post_attention_layernorm.weight,
                                            d.eps, rot=rot, quant=qd)
            gu = lin(layer.mlp.gate_up_proj, y.view(R, -1), rot, *pack)
            at("gu", i)
            act = fused.silu_mul(gu, rot=rot, quant=qd)
            act, *pack = act if qd else (act,)
            delta = lin(layer.mlp.down_proj, act, rot, *pack)
            at("down", i)
            if not self.gemv:
                delta = delta[:, None]
        _, y, *pack = fused.add_rmsnorm(x, delta, ar.model.norm.weight, d.eps, rot=head_rot, quant=qd and head_rot)
        self.logits.copy_(self.head_rot(y[:, 0], *pack) if head_rot else self.head(y[:, 0]))
        if pf:
            pf.join()

    def _step(self, attn_len: int):
        state = (self.step, self.ring, self.ring_w, self.mask, self.noise, self.forced_t, self.out, self.done,
                 self.tokens)
        if self.tail is not None:
            self.tail(self.logits, *state, cfg=self.cfg, budget=self.budget)
        else:
            sample_tail(self.logits, self.G, self.cfg, self.s, self.phase, *state, legacy_off=self.legacy_off,
                        budget=self.budget)
        if self.fused and self.fns is None:
            self._forward_fused(attn_len)
        else:
            self._forward(attn_len)
        self._advance()

    def _advance(self):
        """After a step: every row's position and the step move on (`fast.refill` moves only the live rows)."""
        self.pos.add_(1)
        self.step.add_(1)

    # -- graphs ----------------------------------------------------------------------------------------------------
    def _state(self):
        return [self.logits, self.tokens, self.pos, self.step, self.ring, self.ring_w, self.out, self.done]

    def _snapshot(self) -> list:
        """Copies of the decoding state, for `_restore` after a step that must not count (a warm-up, a failure)."""
        return [t.clone() for t in self._state()]

    def _restore(self, saved: list):
        for t, v in zip(self._state(), saved):
            t.copy_(v)

    def _take_side(self) -> None:
        """Wait for the pending side capture, if any, and keep its graph (`fast.side_capture`); its wait counts as
        capture time. A failed one is recorded and turns side captures off for this phase."""
        side, self._side = self._side, None
        if side is None:
            return
        graph = side.take()
        self.capture_s += side.waited
        self.side_capture_s += side.seconds
        if graph is None:
            self.side_capture_error = self.side_capture_error or f"bucket {side.attn_len}: {side.error}"
        elif self.graph_error is None and side.attn_len not in self.graphs:
            self.graphs[side.attn_len] = graph
            self.side_captures += 1

    def _start_side(self, attn_len: int) -> None:
        """Capture `attn_len`'s graph on the worker thread while the graphs already captured replay — once a graph
        of this phase exists (its eager step compiled the step's kernels); with the per-kernel step and none of the
        experimental branches, and not beside the batch command's render worker (`fast.side_capture`). Never a
        phase's first bucket beside its prefill: measured, that stretched the prefill by about the capture's length
        (`fast.side_capture`, "the first bucket")."""
        if (not self.side_ok or self.side_capture_error is not None or self._side is not None
                or attn_len in self.graphs or not self.use_graph or self.graph_error is not None
                or self.device.type != "cuda" or self.layer_kernel is not None or self.prefetch is not None
                or self.fns is not None or _CONCURRENT[0]):
            return
        if not self.graphs:
            return
        from . import side_capture
        pool = next(iter(self.graphs.values())).pool()
        self._side = side_capture.start(self._step, attn_len, self.device, _capture_stream(self.device), pool,
                                        capture_on_stream)

    def _graph(self, attn_len: int):
        if attn_len in self.graphs:  # a pending side capture (the next bucket) goes on while this graph replays
            return self.graphs[attn_len]
        self._take_side()
        if attn_len in self.graphs:
            return self.graphs[attn_len]
        t0 = time.perf_counter()
        saved = self._snapshot()
        stream = _capture_stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._step(attn_len)  # warm-up: kernels chosen, workspaces allocated, Triton autotuned
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self._restore(saved)
        graph = torch.cuda.CUDAGraph()
        pool = next(iter(self.graphs.values())).pool() if self.graphs else None
        # no cyclic collection during the capture (as on the side-capture worker): it could destroy an earlier
        # decoder's graph mid-capture and the phase would go eager; torch.cuda.graph does not collect first
        from .side_capture import _no_collection
        if _CONCURRENT[0]:
            with _no_collection():
                _capture_beside_worker(graph, pool, stream, lambda: self._step(attn_len))
            stream.synchronize()
        else:
            with CAPTURE_LOCK, _no_collection(), torch.cuda.graph(graph, pool=pool, capture_error_mode="global"):
                self._step(attn_len)
            torch.cuda.synchronize(self.device)
        self.graphs[attn_len] = graph
        self.capture_s += time.perf_counter() - t0
        return graph

    def _run_block(self, n: int, attn_len: int):
        if self.use_graph and self.graph_error is None:
            saved = None if attn_len in self.graphs else self._snapshot()
            try:
                graph = self._graph(attn_len)
                for _ in range(n):
                    graph.replay()
                return
            except Exception as exc:  # capture failure or OOM: eager from here on, one warning
                self._take_side()  # a pending side capture ends before the graphs and cache are released
                if saved is not None:  # the warm-up step may have sampled before failing: undo it
                    self._restore(saved)
                self.graph_error = brief(exc)
                warnings.warn(f"CUDA graph decode unavailable ({self.graph_error}); running the step eagerly")
                self.graphs.clear()
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
        for _ in range(n):
            self._eager_step(attn_len)

    def _eager_step(self, attn_len: int):
        """One step outside a graph. When a kernel of the fused step fails — e.g. a GPU this code never ran on refuses
        a Triton launch configuration — the step is undone and run again without the int8 × int8 products (the int8
        codes converted to bf16; kept and one warning if that runs), then with the PyTorch sampling tail instead of
        the sampling-tail kernels (one warning); if it fails again, the decoder switches to the unfused torch step
        (and library products) with one warning, and the step runs again; graphs are tried again from the next
        block. Out-of-memory errors are raised as they are (the unfused step needs more memory, not less)."""
        if not self.fused or self.fns is not None:
            return self._step(attn_len)
        saved = self._snapshot()
        error = self._attempt(attn_len, saved)
        if error is None:
            return
        if self.int8_dot:  # first without the int8 × int8 products (an older Triton, a GPU without int8 MMA)
            self.int8_dot = False
            self.graphs.clear()
            self.graph_error = None
            retry = self._attempt(attn_len, saved)
            if retry is None:
                self.int8_dot_error = brief(error)
                warnings.warn(f"int8 × int8 decode products unavailable ({self.int8_dot_error}); converting the "
                              "int8 codes to bf16 instead")
                return
            self.int8_dot = True  # not their fault: keep them for the next tries
        if self.tail is not None:  # then without the sampling-tail kernels only: the layer kernels may be fine
            self.tail, self.tail_error = None, brief(error)
            warnings.warn(f"sampling-tail kernels unavailable ({self.tail_error}); using the PyTorch sampling tail")
            self.graphs.clear()
            self.graph_error = None
            error = self._attempt(attn_len, saved)
            if error is None:
                return
        self.kernel_error = brief(error)
        warnings.warn(f"fused decode kernels unavailable ({self.kernel_error}); running the unfused torch step")
        self.fused = self.gemv = self.attn_kernel = self.rot_fused = self.int8_dot = False
        self.int8_layers, self.int8_rot, self.attn_counters = False, None, None
        self.head = head_rows(self.ar.model.lm_head, self.slice.start, self.slice.stop)
        self.graphs.clear()
        self.graph_error = None
        self._step(attn_len)

    def _attempt(self, attn_len: int, saved: list) -> Exception | None:
        """One step; on a failure other than out of memory the state is restored from `saved` and the error
        returned (out-of-memory errors are raised)."""
        try:
            self._step(attn_len)
            return None
        except (torch.cuda.OutOfMemoryError, MemoryError):
            raise
        except Exception as exc:
            self._restore(saved)
            return exc

    @torch.inference_mode()
    def run(self, on_token=None) -> list[PhaseResult]:
        """Decode until every song has ended or used its budget. `on_token(phase, step, max_tokens, token)` is
        called for song 0's tokens after each block (and may raise to cancel). Returns one PhaseResult per song."""
        t0 = time.perf_counter()
        self._allocate()
        s, steps, reported = self.s, len(self.forced), 0  # the forced tokens are already in the cache
        max_prefix = max(len(r) for r in self.rows)
        self._prefill()
        if self.device.type == "cuda":  # this stream only: a render worker's queued kernels are not ours to wait for
            torch.cuda.current_stream(self.device).synchronize()
        prefill_s = time.perf_counter() - t0
        first_s = None
        try:
            while steps < s.max_tokens:
                n = min(self.block, s.max_tokens - steps)
                attn_len = min(self.capacity, math.ceil((max_prefix + steps + n) / BUCKET) * BUCKET)
                self._run_block(n, attn_len)
                steps += n
                if max_prefix + s.max_tokens > attn_len:  # the next bucket may be reached: its graph meanwhile
                    self._start_side(min(self.capacity, attn_len + BUCKET))
                flags = torch.stack([self.done.all(), torch.isnan(self.logits).any()]).cpu()  # the block's one sync
                if bool(flags[1]):
                    from ..errors import NumericalError
                    raise NumericalError("the model produced NaN logits: the AR weights look damaged — download the "
                                         "checkpoint again")
                if first_s is None:
                    first_s = time.perf_counter() - t0
                if on_token is not None:
                    row = self.out[0, reported:steps].cpu().tolist()
                    for i, tok in enumerate(row):
                        on_token(self.phase, reported + i, s.max_tokens, tok)
                        if tok == self.slice.start + self.slice.end_col:
                            break
                    reported = steps
                if bool(flags[0]):
                    break
        finally:
            self._take_side()  # a pending side capture ends before the buffers it recorded are freed
        if self.layer_kernel is not None:
            self.layer_kernel.check()  # a grid barrier that gave up means wrong tokens: an error, not a song
        out = self.out[:, :steps].cpu().tolist()
        seconds = time.perf_counter() - t0
        end = self.slice.start + self.slice.end_col
        results = []
        for g in range(self.G):
            seq = out[g]
            ended = end in seq
            content = seq[:seq.index(end)] if ended else seq[:s.max_tokens]
            count = len(content) + int(ended)
            steady = seconds - prefill_s - self.capture_s
            results.append(PhaseResult(content, ended, {
                "seconds": seconds, "prefill_seconds": prefill_s, "ttft_seconds": first_s, "output_tokens": count,
                "graph_capture_seconds": self.capture_s,
                "side_captures": self.side_captures, "side_capture_seconds": round(self.side_capture_s, 4),
                **({"side_capture_fallback_reason": self.side_capture_error} if self.side_capture_error else {}),
                "decode_tokens_per_second": steps / steady if steady > 0 else 0.0,
                "content_tokens": len(content), "tokens_per_second": count / seconds if seconds > 0 else 0.0,
                "prefix_tokens": len(self.rows[g]), "cfg_branches": 2 if self.cfg != 1.0 else 1,
                "batch": self.G, "decoded_steps": steps, "forced_tokens": len(self.forced),
                "execution": "cuda_graph" if self.graphs and self.graph_error is None else "eager_device_sampler",
                "compiled_layers": self.fns is not None, "fused_kernels": self.fused and self.fns is None,
                "decode_attention": "triton_split" if self.fused and self.fns is None and self.attn_kernel else "torch",
                "attention_merge": ("last split program (≤ 32 splits), else kernel"
                                    if getattr(self, "attn_counters", None) is not None else "kernel"),
                "pdl": self.fused and self.fns is None and pdl_enabled(self.device),
                "layer_products": ("gemv_split_k_" + ("int8" if self.int8_layers else "bf16")
                                   if self.gemv and self.fns is None else "library"),
                "int8_rotation": self.int8_rot if self.fns is None else None,
                "int8_products": (("codes converted to bf16 in the layer kernel, int8 x int8 (pair codes) in the "
                                   "head" if self.layer_kernel is not None else "int8 x int8 (pair codes)")
                                  if self.int8_dot else "codes converted to bf16")
                if self.int8_layers and self.fns is None else None,
                **({"int8_products_fallback_reason": self.int8_dot_error} if self.int8_dot_error else {}),
                "shared_prefix_positions": self.shared,
                "layer_kernel": self.layer_mode,
                **({"layer_kernel_off_reason": self.layer_reason} if self.layer_reason else {}),
                "sampling_tail": "kernels" if self.tail is not None else "torch",
                **({"graph_fallback_reason": self.graph_error} if self.graph_error else {}),
                **({"fused_fallback_reason": self.kernel_error} if self.kernel_error else {}),
                **({"sampling_tail_fallback_reason": self.tail_error} if self.tail_error else {})}))
        self.release()
        return results

    def release(self):
        """Free the static buffers and graphs (called at the end of `run`)."""
        self._take_side()
        self.graphs.clear()
        for name in ("k", "v", "logits", "noise", "out", "tail"):
            setattr(self, name, None)


def generate(ar, prefix, sampling, seed, phase, *, negative=None, cfg_scale=1.0, legacy_off=False, on_token=None,
             forced=None, use_graph=None) -> PhaseResult:
    """Drop-in replacement of `yue2_core.sampling.generate` for one song."""
    dec = PhaseDecoder(ar, [prefix], sampling, [seed], phase, negatives=None if negative is None else [negative],
                       cfg_scale=cfg_scale, legacy_off=legacy_off, forced=forced, use_graph=use_graph)
    return dec.run(on_token)[0]
