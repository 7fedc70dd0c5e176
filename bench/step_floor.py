"""The *per-kernel* decode step without its arithmetic (issue #18 item 2): the launches of one batch-1 decode step —
the same grids, warps and order as `fast.decode.PhaseDecoder`'s step, each kernel streaming the bytes its real
counterpart reads (weights, K/V cache, partial sums) and computing nothing — captured in one CUDA graph with
programmatic dependent launch, as the step is. What such a schedule costs before any arithmetic, latency chain or
sampling:

  step        the step's 9 kernels a layer (add+RMSNorm, qkv, QK-norm+RoPE, attention, o, add+RMSNorm, gate/up,
              SiLU·up, down) + the final norm and the codec head: 254 launches, the real bytes
  step-empty  the same launches reading nothing: the chain's cost per launch alone
  step-nopdl  `step` without programmatic dependent launch
  products    5 kernels a layer (the four products and the attention; norms, RoPE and SiLU fused into them) + head
  layer       1 kernel a layer + head (the bytes of a layer in one launch, no barriers)
  one         every byte of the step in one launch of 4 programs per SM
  step-pre    `step` with every big kernel (products, attention) loading its first block of bytes *before* its PDL
              wait — the weights (and most of the K/V cache) do not depend on the previous kernel, so a kernel made
              resident early by PDL can stream them while its predecessor finishes
  step-early  `step-pre` with every kernel also releasing the next one before its own wait (a deeper chain resident)
  products-pre `products` with the preload

Prints per schedule the launches, the MB streamed from memory (the small kernels' L2 reads not counted), ms a step,
TB/s, the tok/s it would allow with the sampling tail's measured time added (`--tail-ms`, from
bench/profile_decode.py: ≈ 0.08 ms on an H200) and µs a launch on average. Compare rows within a run: they share
one streaming kernel, which is weaker than the tuned products (its first version's `step` row took 1.60 ms on an
H200 where the real step takes 1.31; this one, with 8× the loads in flight a thread, was measured on an H100 only),
so a row is not a floor of the real kernels. `step-empty` is the PDL launch chain alone; `step` minus `products` is
what the small kernels cost for their launch, wait and one read of their inputs (docs/speed.md, "The per-kernel
schedule without its arithmetic").

    python bench/step_floor.py [--fmt int8|bf16] [--positions 2121] [--bucket 2256] [--reps 30] [--tail-ms 0.08]
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/gemv_sweep.py's graph timing

import torch  # noqa: E402

# the model (shared/reference/model.md: hidden 2048, 16 q / 8 kv heads of 128, SwiGLU 6144, 28 layers; the
# codec head is the 32,769-row semantic slice the decode step computes, fast/decode.py)
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, HEAD_ROWS = 2048, 16, 8, 128, 6144, 28, 32769
SMALL = 1 << 20  # bytes of the region the small kernels read (partial sums, written just before: L2-resident)


class Launch(NamedTuple):
    """One kernel of a schedule: name, programs, warps, bytes read (from the stream, or from the small L2 region
    when `small`)."""
    name: str
    programs: int
    warps: int
    nbytes: int
    small: bool = False
    pre: bool = False  # load the first block before the PDL wait (big kernels of the *-pre/-early schedules)


def _product(name: str, n: int, k: int, int8: bool) -> Launch:
    from yue2_core.fast import gemv as G
    if int8:
        cfg = G.choose_q(n, k)[0]
    else:
        cfg = G.choose(n, k, 1, False)
    split = cfg.split if k % (cfg.split * cfg.bk) == 0 else 1
    return Launch(name, -(-n // cfg.bn) * split, cfg.warps, n * k * (1 if int8 else 2) + (4 * n if int8 else 0))


def _split(n: int, k: int, int8: bool) -> int:
    from yue2_core.fast import gemv as G
    cfg = G.choose_q(n, k)[0] if int8 else G.choose(n, k, 1, False)
    return cfg.split if k % (cfg.split * cfg.bk) == 0 else 1


def attention_launch(positions: int, bucket: int, sms: int) -> Launch:
    """The split decode attention of one row (`fused.decode_attention`'s plan with `fused.ATTN_CONFIG`, through
    `warmup_jobs.split_count`, which tests/core/test_warmup.py checks against it): kv heads × splits programs over
    the bucket; K and V of `positions` + 1 cached positions read (bf16). Raises ValueError unless positions <
    bucket."""
    from yue2_core.fast.fused import ATTN_CONFIG as C
    from yue2_core.warmup_jobs import split_count
    if not 0 <= positions < bucket:
        raise ValueError(f"the cached positions ({positions}) must lie in the attention bucket [0, {bucket})")
    splits = split_count(bucket, 1, KV_HEADS, sms, C.bl, C.per_sm)
    return Launch("attention", KV_HEADS * splits, C.warps, (positions + 1) * KV_HEADS * HEAD_DIM * 2 * 2)


def _partials(split: int, n: int) -> int:
    """Bytes of a product's output row that its consumer reads: `split` fp32 partial rows, or one bf16 row."""
    return split * n * 4 if split > 1 else n * 2


def step_launches(int8: bool, positions: int, bucket: int, sms: int) -> list[Launch]:
    """The per-kernel step's launches, in order (the sampling tail excluded)."""
    qkv_n = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    s_qkv, s_o = _split(qkv_n, HIDDEN, int8), _split(HIDDEN, HIDDEN, int8)
    s_gu, s_down = _split(2 * FFN, HIDDEN, int8), _split(HIDDEN, FFN, int8)
    norm_programs = HIDDEN // 256 if int8 else 1  # rotated: one program per 256-group, each reading the whole row

    def norm(splits: int | None) -> Launch:  # None: layer 0's norm of the embedding (no residual delta)
        if splits is None:
            return Launch("RMSNorm", norm_programs, 4, norm_programs * HIDDEN * 2, small=True)
        return Launch("add+RMSNorm", norm_programs, 8 if splits > 1 else 4,
                      norm_programs * (_partials(splits, HIDDEN) + HIDDEN * 2), small=True)

    out: list[Launch] = []
    for i in range(LAYERS):
        out += [norm(s_down if i else None), _product("qkv", qkv_n, HIDDEN, int8),
                Launch("QK-norm+RoPE", HEADS + 2 * KV_HEADS, 4, _partials(s_qkv, qkv_n), small=True),
                attention_launch(positions, bucket, sms), _product("o", HIDDEN, HIDDEN, int8), norm(s_o),
                _product("gate_up", 2 * FFN, HIDDEN, int8),
                # `fused.silu_mul`: 256-wide blocks when rotated (int8), else 1,024
                Launch("SiLU·up", FFN // (256 if int8 else 1024), 4, _partials(s_gu, 2 * FFN), small=True),
                _product("down", HIDDEN, FFN, int8)]
    return out + [norm(s_down), _product("head", HEAD_ROWS, HIDDEN, int8)]


def schedule(name: str, steps: list[Launch], sms: int) -> list[Launch]:
    """A named schedule (module docstring) made of the step's launches."""
    big = [x for x in steps if not x.small]
    if name in ("step", "step-nopdl"):
        return steps
    if name in ("step-pre", "step-early"):
        return [x._replace(pre=not x.small) for x in steps]
    if name == "products-pre":
        return [x._replace(pre=True) for x in big]
    if name == "step-empty":
        return [Launch(x.name, x.programs, x.warps, 0, x.small) for x in steps]
    if name == "products":
        return big
    if name == "layer":
        per = 5  # qkv, attention, o, gate_up, down
        layers = [big[i:i + per] for i in range(0, per * LAYERS, per)]
        return [Launch("layer", 4 * sms, 4, sum(x.nbytes for x in g)) for g in layers] + big[per * LAYERS:]
    if name == "one":
        return [Launch("one", 4 * sms, 4, sum(x.nbytes for x in big))]
    raise ValueError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")


SCHEDULES = ("step", "step-empty", "step-nopdl", "step-pre", "step-early", "products", "products-pre", "layer", "one")

_KERNEL = None


def _kernel():
    global _KERNEL, pdl_prologue, gdc_wait, gdc_launch_dependents  # callees resolve from this module's globals
    if _KERNEL is None:
        import triton
        import triton.language as tl
        from yue2_core.fast._decode_triton import gdc_launch_dependents, gdc_wait, pdl_prologue

        @triton.jit(do_not_specialize=["start", "per", "n"])
        def floor_kernel(buf_ptr, out_ptr, start, per, n, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
                         PRE: tl.constexpr = False, EARLY: tl.constexpr = False):
            # program i: XOR of the int32 words [start + i·per, start + min((i+1)·per, n)) into out[i]; a block of
            # BLOCK words loaded at once (BLOCK·4 bytes in flight a program, as a pipelined product's stages hold),
            # read once (evict-first). PRE: the first block is loaded before the PDL wait (bytes that no earlier
            # kernel writes); EARLY: the next kernel is released before this one's wait.
            i = tl.program_id(0)
            lo = i * per
            hi = tl.minimum(lo + per, n)
            acc = tl.zeros([BLOCK], tl.int32)
            first = lo
            if PRE:
                o = lo + tl.arange(0, BLOCK)
                acc = tl.load(buf_ptr + start + o, mask=o < hi, other=0, eviction_policy="evict_first")
                first = lo + BLOCK
            if EARLY and PDL:
                gdc_launch_dependents()
                gdc_wait()
            else:
                pdl_prologue(PDL)
            for j in range(first, hi, BLOCK):
                o = j + tl.arange(0, BLOCK)
                acc = acc ^ tl.load(buf_ptr + start + o, mask=o < hi, other=0, eviction_policy="evict_first")
            tl.store(out_ptr + i, tl.xor_sum(acc, 0))

        _KERNEL = floor_kernel
    return _KERNEL


def plan(launches: list[Launch], stream_words: int) -> list[tuple[Launch, int, int]]:
    """(launch, first word, words per program) of each launch: the big kernels read consecutive, disjoint ranges of
    the stream (nothing re-read within a step), the small ones the first SMALL bytes (recently written, as the
    partial sums they stand for). Raises ValueError if the stream is too short."""
    out, at = [], SMALL // 4
    for x in launches:
        words = x.nbytes // 4
        start = 0 if x.small else at
        if not x.small:
            at += words
        out.append((x, start, -(-words // x.programs) if words else 0))
    if at > stream_words:
        raise ValueError(f"the schedule reads {4 * at} bytes; the stream holds {4 * stream_words}")
    return out


def launch_all(buf: torch.Tensor, out: torch.Tensor, planned, pdl: bool, per_thread: int = 128,
               early: bool = False) -> None:
    """Launch every kernel of a planned schedule on the current stream; each thread loads `per_thread` words at
    once (128 × 4 B = 512 B in flight a thread by default). `early`: every kernel releases the next before its
    wait."""
    kern = _kernel()
    extra = {"PDL": True, "launch_pdl": True, "EARLY": early} if pdl else {}
    for x, start, per in planned:
        words = x.nbytes // 4
        kern[(x.programs,)](buf, out, start, per, words, BLOCK=per_thread * 32 * x.warps, num_warps=x.warps,
                            num_stages=1, PRE=x.pre, **extra)


def replay_ms(buf, out, planned, pdl: bool, reps: int, early: bool = False) -> float:
    """ms per replay of the schedule captured as one CUDA graph (bench/gemv_sweep.py's `timed`)."""
    from gemv_sweep import timed
    return timed(lambda _: launch_all(buf, out, planned, pdl, early=early), 1, reps) / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fmt", choices=("int8", "bf16"), default="int8")
    ap.add_argument("--positions", type=int, default=2121, help="cached positions the attention reads (default: "
                    "the profile's 2,121 of the 2,256-position bucket)")
    ap.add_argument("--bucket", type=int, default=2256)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--tail-ms", type=float, default=0.08, help="the sampling tail's time a step (profile_decode)")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("step_floor.py needs a CUDA GPU")
    from yue2_core.fast import pdl_enabled
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    pdl = pdl_enabled(dev)
    from yue2_core.errors import YuE2Error
    try:
        steps = step_launches(args.fmt == "int8", args.positions, args.bucket, sms)
        for name in args.schedules.split(","):
            schedule(name, steps, sms)
    except (ValueError, YuE2Error) as exc:  # a bad --positions/--bucket/--schedules or YUE2_GEMV_TABLE: one line
        sys.exit(f"step_floor.py: {exc}")
    total = sum(x.nbytes for x in steps if not x.small)
    buf = torch.randint(-2**31, 2**31 - 1, (total // 4 + SMALL // 4 + 4096,), dtype=torch.int32, device=dev)
    out = torch.zeros(max(x.programs for x in steps) + 4 * sms, dtype=torch.int32, device=dev)
    print(f"{torch.cuda.get_device_name()} · {sms} SMs · {args.fmt} step, {args.positions + 1} cached positions "
          f"(bucket {args.bucket}) · PDL {'on' if pdl else 'unavailable'}")
    print(f"{'schedule':12s} {'launches':>8s} {'MB':>8s} {'ms/step':>8s} {'TB/s':>6s} {'+tail tok/s':>11s} "
          f"{'µs a launch':>11s}")
    rows = {}
    for name in args.schedules.split(","):
        launches = schedule(name, steps, sms)
        planned = plan(launches, buf.numel())
        ms = replay_ms(buf, out, planned, pdl and name != "step-nopdl", args.reps, early=name == "step-early")
        mb = sum(x.nbytes for x in launches if not x.small) / 1e6
        rows[name] = (len(launches), mb, ms)
    for name, (n, mb, ms) in rows.items():
        print(f"{name:12s} {n:8d} {mb:8.1f} {ms:8.3f} {mb / 1e3 / ms:6.2f} {1000 / (ms + args.tail_ms):11.0f} "
              f"{ms * 1000 / n:11.2f}")


if __name__ == "__main__":
    main()
