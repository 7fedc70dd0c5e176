"""Can a decode step run as *dataflow* — every product tile a task that loads its weights first and then waits only
for the phase it reads — instead of a chain of kernels (issue #18 item 2)? A probe with the real arithmetic of the
int8 products and the real data dependencies, nothing else: per layer five phases of product tasks

  qkv   4,096 × 2,048        attn  2,048 × 4,096 (a stand-in streaming ≈ the K/V bytes at 2,122 positions)
  o     2,048 × 2,048        gu   12,288 × 2,048        down  2,048 × 6,144

each task a [16, 2,048] int8 weight tile (32 KB; longer K in 2,048-chunks whose fp32 partial sums the next phase
adds up): it reads its input chunk (the previous phase's partial sums, L2), quantizes it to int8 with one scale,
multiplies on the int8 tensor cores (one `tl.dot`, int32) and stores 16 fp32 partial sums. 28 layers = 1.6 GB and
50,176 tasks a step. Schedules (each in one CUDA graph, a step = one replay):

  kernels      one launch per phase (140 a step), programmatic dependent launch (PDL): the per-kernel shape
  kernels-pre  the same, each task loading its weight tile *before* its PDL wait
  dataflow     one launch a step; a task takes a ticket (atomic counter) as its index, loads its weights, waits
               until the phase it reads has counted all its tasks (acquire poll), computes, stores and counts
               itself (release). Tasks wait only on lower tickets, so there is no deadlock whatever the residency
  dataflow-pid the same with the program id as the index (no ticket round trip; relies on in-order dispatch; a
               poll limit turns a stall into a reported error instead of a hang)
  layers       `dataflow` in one launch a layer (28 launches in sequence, without PDL)
  stream       one launch, the same tasks with no waits (inputs as they happen to be): the floor of this task shape

Options: --one (hand-offs by thread 0 alone: an acquire poll, then a block barrier; a barrier, then one fence and
release count — instead of every thread polling and fencing), --fine (one counter per 2,048-wide chunk of a
phase's output: a task waits only for the tiles that made the chunk it reads), --kc (the task's inputs: its tile
16 × kc int8), --warps. Prints ms a step, TB/s over the weight bytes, tok/s with the codec head (67 MB at that
rate) and the sampling tail (`--tail-ms`), and checks that every schedule's final sums equal plain sequential
launches' bit for bit. A probe of a schedule, not a decoder: no norms, RoPE, attention or SiLU. Measured on an
H100 (docs/experiments/dataflow_floor_h100_2026-12-06.log; docs/speed.md "Dataflow instead of kernels").

    python bench/dataflow_floor.py [--reps 20] [--modes kernels,dataflow,...] [--one] [--fine] [--kc 1024]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

LAYERS = 28
BN, KC = 16, 2048  # a task's weight tile: BN output rows × KC inputs (int8)
# (name, N outputs, K inputs) per phase; shapes from shared/reference/model.md (hidden 2048, 32 heads of 128 in
# q‖k‖v, SwiGLU 6144); attn streams 2,048 × 4,096 int8 = 8.4 MB ≈ the bf16 K/V of 8 heads at 2,122 positions
PHASES = (("qkv", 4096, 2048), ("attn", 2048, 4096), ("o", 2048, 2048), ("gu", 12288, 2048), ("down", 2048, 6144))
NMAX = max(n for _, n, _ in PHASES)
POLL_LIMIT = 1 << 17  # polls of a counter before giving up (≈ 0.1 s; a stall is reported, not a hang)

def _kernels():
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    @triton.jit
    def fence():
        tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)

    @triton.jit
    def poll_one(c_ptr, target, err_ptr, LIMIT: tl.constexpr):
        # thread 0 alone polls the counter with acquire loads (the others wait at the block barrier after): one
        # poller a program instead of every thread hammering one L2 line; gives up after LIMIT polls and then sets
        # the error flag, as the every-thread poll does (a stall is reported, not timed as a fast schedule)
        tl.inline_asm_elementwise(
            """{
            .reg .pred %p_skip, %p_wait, %p_lim;
            .reg .u32 %r_tid, %r_cnt, %r_n;
            mov.u32 %r_n, 0;
            mov.u32 %r_tid, %tid.x;
            setp.ne.u32 %p_skip, %r_tid, 0;
            @%p_skip bra DONE${:uid};
            SPIN${:uid}:
            ld.acquire.gpu.global.u32 %r_cnt, [$1];
            setp.lt.u32 %p_wait, %r_cnt, $2;
            @!%p_wait bra DONE${:uid};
            add.u32 %r_n, %r_n, 1;
            setp.lt.u32 %p_lim, %r_n, $3;
            @%p_lim bra SPIN${:uid};
            red.global.or.b32 [$4], 1;
            DONE${:uid}:
            mov.u32 $0, %r_n;
            }""", "=r,l,r,r,l", [c_ptr, target, LIMIT, err_ptr], dtype=tl.int32, is_pure=False, pack=1)
        tl.debug_barrier()

    @triton.jit
    def release_one(c_ptr):
        # every thread's stores, then thread 0 fences at GPU scope and counts with release semantics
        tl.debug_barrier()
        tl.inline_asm_elementwise(
            """{
            .reg .pred %p_skip;
            .reg .u32 %r_tid;
            mov.u32 %r_tid, %tid.x;
            setp.ne.u32 %p_skip, %r_tid, 0;
            @%p_skip bra DONE${:uid};
            fence.acq_rel.gpu;
            red.release.gpu.global.add.u32 [$1], 1;
            DONE${:uid}:
            mov.u32 $0, 0;
            }""", "=r,l", [c_ptr], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def task_kernel(w_ptr, p_ptr, cnt_ptr, ticket_ptr, err_ptr, task_base,
                    T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr, T3: tl.constexpr, T4: tl.constexpr,
                    S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, S3: tl.constexpr, S4: tl.constexpr,
                    MODE: tl.constexpr, TICKET: tl.constexpr, PRE: tl.constexpr, PDL: tl.constexpr,
                    NM: tl.constexpr, LIMIT: tl.constexpr, BN_: tl.constexpr = 16, KC_: tl.constexpr = 2048,
                    ONE: tl.constexpr = False, FINE: tl.constexpr = False, CS: tl.constexpr = 16):
        # MODE 0: per-kernel (task = task_base + program id; PDL wait first unless PRE); 1: dataflow (waits on the
        # phase counters); 2: stream (no waits)
        NTL: tl.constexpr = T0 + T1 + T2 + T3 + T4
        if TICKET:
            t = tl.atomic_add(ticket_ptr, 1) + task_base
        else:
            t = tl.program_id(0) + task_base
        r = tl.arange(0, BN_)
        k = tl.arange(0, KC_)
        w_off = t.to(tl.int64) * (BN_ * KC_) + r[:, None] * KC_ + k[None, :]
        if MODE != 0 or PRE:
            w = tl.load(w_ptr + w_off)
        if MODE == 0 and PDL:
            gdc_wait()
            gdc_launch_dependents()
        if MODE == 0 and not PRE:
            w = tl.load(w_ptr + w_off)
        layer = t // NTL
        u = t % NTL
        phase = ((u >= T0).to(tl.int32) + (u >= T0 + T1).to(tl.int32) + (u >= T0 + T1 + T2).to(tl.int32)
                 + (u >= T0 + T1 + T2 + T3).to(tl.int32))
        start = tl.where(phase == 0, 0, tl.where(phase == 1, T0, tl.where(phase == 2, T0 + T1,
                         tl.where(phase == 3, T0 + T1 + T2, T0 + T1 + T2 + T3))))
        n_tiles = tl.where(phase == 0, T0 // S0, tl.where(phase == 1, T1 // S1, tl.where(phase == 2, T2 // S2,
                           tl.where(phase == 3, T3 // S3, T4 // S4))))
        prev = (phase + 4) % 5
        in_s = tl.where(prev == 0, S0, tl.where(prev == 1, S1, tl.where(prev == 2, S2, tl.where(prev == 3, S3,
                        S4))))
        prev_tasks = tl.where(prev == 0, T0, tl.where(prev == 1, T1, tl.where(prev == 2, T2,
                              tl.where(prev == 3, T3, T4))))
        j = u - start
        tile = j % n_tiles
        chunk = j // n_tiles
        # counters: CS a (layer, phase) (`counter_slots`); FINE: one per KC-wide chunk of the phase's output — a
        # task waits only for the tiles (and splits) that produced the chunk it reads; else one a phase (all its tasks)
        if FINE:
            c_ptr = cnt_ptr + (layer * 5 + phase - 1) * CS + chunk
            target = (KC_ // BN_) * in_s
        else:
            c_ptr = cnt_ptr + (layer * 5 + phase - 1) * CS
            target = prev_tasks
        if MODE == 1:
            if ONE:
                if (layer > 0) | (phase > 0):
                    poll_one(c_ptr, target, err_ptr, LIMIT)
            elif (layer > 0) | (phase > 0):
                c = tl.load(c_ptr, volatile=True)
                spins = 0
                while (c < target) & (spins < LIMIT):
                    c = tl.load(c_ptr, volatile=True)
                    spins += 1
                if spins >= LIMIT:
                    tl.atomic_or(err_ptr, 1)
                fence()
        # the input chunk: Σ of the previous phase's partial sums, quantized to int8 with one scale
        src = p_ptr + prev * (8 * NM) + chunk * KC_ + k
        x = tl.load(src, cache_modifier=".cg")
        for s in range(1, in_s):
            x += tl.load(src + s * NM, cache_modifier=".cg")
        a = tl.max(tl.abs(x), 0)
        xs = tl.where(a > 0, a / 127.0, 1.0)
        xq = tl.minimum(tl.maximum(tl.floor(x / xs + 0.5), -127.0), 127.0).to(tl.int8)
        xq2 = tl.where(r[:, None] == 0, xq[None, :], 0).to(tl.int8)
        acc = tl.dot(xq2, tl.trans(w), out_dtype=tl.int32)
        y = tl.sum(tl.where(r[:, None] == 0, acc, 0), 0).to(tl.float32) * (xs / (127.0 * 45.0))
        tl.store(p_ptr + phase * (8 * NM) + chunk * NM + tile * BN_ + r, y)
        if FINE:
            out_ptr = cnt_ptr + (layer * 5 + phase) * CS + (tile * BN_) // KC_
        else:
            out_ptr = cnt_ptr + (layer * 5 + phase) * CS
        if MODE == 1 and ONE:
            release_one(out_ptr)
        elif MODE == 1:
            tl.debug_barrier()
            fence()
            tl.debug_barrier()
            tl.atomic_add(out_ptr, 1, sem="release", scope="gpu")

    return triton, task_kernel


def plan(kc: int | None = None):
    """(tasks, splits) of each phase for tasks of BN × kc weights (default KC); ValueError for a kc that does not
    divide every phase's N and K (the tasks would leave weights out)."""
    kc = KC if kc is None else kc
    if kc <= 0 or any(n % kc or k % kc for _, n, k in PHASES):
        raise ValueError(f"--kc {kc} must divide every phase's outputs and inputs "
                         f"({', '.join(f'{n} × {k}' for _, n, k in PHASES)})")
    tasks = [(n // BN) * (k // kc) for _, n, k in PHASES]
    splits = [k // kc for _, _, k in PHASES]
    return tasks, splits


def counter_slots(kc: int) -> int:
    """Counters a (layer, phase) takes: with --fine one per kc-wide chunk of the phase's output, so the widest
    output (gate/up, 12,288) needs 12,288 / kc — 24 at kc 512, where 16 slots let gate/up's chunks 16–23 count into
    the down phase's counters and the next layer's qkv start before the down products it reads; at least 16."""
    return max(16, -(-NMAX // kc))


def main() -> int:
    global KC
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--modes", default="kernels,kernels-pre,dataflow,dataflow-pid,layers,stream")
    ap.add_argument("--tail-ms", type=float, default=0.08)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--kc", type=int, default=2048, help="inputs a task multiplies (its weight tile: 16 × kc int8)")
    ap.add_argument("--fine", action="store_true", help="a task waits only for the chunk of the previous phase's "
                    "output it reads (per-chunk counters) instead of the whole phase")
    ap.add_argument("--one", action="store_true", help="dataflow hand-offs by thread 0 alone (acquire poll; "
                    "fence + release count) instead of every thread")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    KC = args.kc
    try:
        tasks, splits = plan()
    except ValueError as exc:
        print(exc)
        return 2
    triton, kern = _kernels()
    dev = torch.device("cuda")
    ntl = sum(tasks)
    total = LAYERS * ntl
    wbytes = total * BN * KC
    print(f"{torch.cuda.get_device_name(dev)} · torch {torch.__version__} · triton {triton.__version__}")
    print(f"warps {args.warps}, hand-offs by {'thread 0' if args.one else 'every thread'}, "
          f"{'per-chunk' if args.fine else 'per-phase'} counters")
    print(f"{LAYERS} layers × {ntl} tasks of [{BN}, {KC}] int8 = {total:,} tasks, {wbytes / 1e9:.3f} GB a step")
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randint(-127, 128, (total * BN * KC,), dtype=torch.int8, device=dev, generator=g)
    p = torch.zeros(5, 8, NMAX, dtype=torch.float32, device=dev)
    x0 = torch.randn(8, NMAX, device=dev, generator=g)
    slots = counter_slots(KC)
    base = LAYERS * 5 * slots  # phase counters (`slots` a phase), then the ticket, the error flag, the layer tickets
    cnt = torch.zeros(base + 2 + LAYERS, dtype=torch.int32, device=dev)
    ticket = cnt[base:base + 1]
    err = cnt[base + 1:base + 2]
    consts = dict(T0=tasks[0], T1=tasks[1], T2=tasks[2], T3=tasks[3], T4=tasks[4], S0=splits[0], S1=splits[1],
                  S2=splits[2], S3=splits[3], S4=splits[4], NM=NMAX, LIMIT=POLL_LIMIT, BN_=BN, KC_=KC,
                  ONE=args.one, FINE=args.fine, CS=slots, num_warps=args.warps)
    starts = [sum(tasks[:i]) for i in range(5)]

    def launch(mode: str):
        cnt.zero_()
        p[4].copy_(x0)
        if mode in ("kernels", "kernels-pre", "seq"):
            pdl = mode != "seq"
            for layer in range(LAYERS):
                for ph in range(5):
                    extra = {"launch_pdl": True} if pdl else {}
                    kern[(tasks[ph],)](w, p, cnt, ticket, err, layer * ntl + starts[ph], MODE=0, TICKET=False,
                                       PRE=mode == "kernels-pre", PDL=pdl, **consts, **extra)
        elif mode in ("dataflow", "dataflow-pid"):
            kern[(total,)](w, p, cnt, ticket, err, 0, MODE=1, TICKET=mode == "dataflow", PRE=True, PDL=False,
                           **consts)
        elif mode == "layers":  # a ticket counter per layer (all zeroed above)
            for layer in range(LAYERS):
                tk = cnt[base + 2 + layer:base + 3 + layer]
                kern[(ntl,)](w, p, cnt, tk, err, layer * ntl, MODE=1, TICKET=True, PRE=True, PDL=False, **consts)
        elif mode == "stream":
            kern[(total,)](w, p, cnt, ticket, err, 0, MODE=2, TICKET=False, PRE=True, PDL=False, **consts)
        else:
            raise SystemExit(f"unknown mode {mode!r}")

    # the reference: plain sequential launches (no PDL), eager
    launch("seq")
    torch.cuda.synchronize()
    ref = p[4].clone()
    rows = []
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        try:
            def step(mode=mode):
                launch(mode)
            step()
            torch.cuda.synchronize()
            bad = int(err.item())
            same = bool(torch.equal(p[4], ref)) if mode != "stream" else None
            graph = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                step()
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                step()
            graph.replay()
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(args.reps):
                graph.replay()
            e1.record()
            torch.cuda.synchronize()
            ms = e0.elapsed_time(e1) / args.reps
            bad = bad or int(err.item())
            if mode != "stream":
                same = same and bool(torch.equal(p[4], ref))
            rows.append((mode, ms, same, bad))
            del graph
        except Exception as exc:  # a schedule that cannot run here: reported, the others go on
            rows.append((mode, float("nan"), None, f"{type(exc).__name__}: {str(exc)[:200]}"))
    stream_ms = next((ms for m, ms, _, _ in rows if m == "stream"), None)
    print(f"{'schedule':14} {'ms/step':>8} {'TB/s':>6} {'tok/s*':>7}  equal  errors")
    for mode, ms, same, bad in rows:
        tbps = wbytes / (ms * 1e-3) / 1e12 if ms == ms else float("nan")
        head = 0.067e9 / (tbps * 1e12) * 1e3 if tbps == tbps else 0.0
        tok = 1e3 / (ms + head + args.tail_ms) if ms == ms else float("nan")
        print(f"{mode:14} {ms:8.3f} {tbps:6.2f} {tok:7.0f}  {str(same):5}  {bad}")
    print(f"* tok/s: 1 / (ms + codec head at that rate + {args.tail_ms} ms tail)"
          + (f"; stream floor {stream_ms:.3f} ms" if stream_ms else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
