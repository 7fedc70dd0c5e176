"""bench/dataflow_floor.py (a GPU probe): the pure parts of its plan, on the CPU."""
from __future__ import annotations

import pytest

from tests.core.bench_scripts import load


@pytest.mark.parametrize("kc", [512, 1024, 2048])
def test_every_fine_chunk_has_its_own_counter(kc):
    """--fine counts each kc-wide chunk of a phase's output in its own slot of the (layer, phase) counters. With 16
    slots a phase, gate/up's 12,288 outputs at --kc 512 (24 chunks) counted chunks 16–23 into the down phase's
    counters, so the next layer's qkv tasks could pass their wait before the down products they read were done
    (the logged --kc 512 --fine timing was of a schedule short of its waits)."""
    df = load("dataflow_floor")
    slots = df.counter_slots(kc)
    for _, n, _ in df.PHASES:
        assert -(-n // kc) <= slots, (kc, n, slots)
    tasks, splits = df.plan(kc)
    assert tasks[3] == 12288 // 16 * splits[3] and splits[4] == 6144 // kc


def test_a_task_width_that_leaves_weights_out_is_refused():
    """--kc 4096 does not divide down's 6,144 inputs (nor o's 2,048): the tasks would skip weights."""
    df = load("dataflow_floor")
    with pytest.raises(ValueError, match="must divide"):
        df.plan(4096)


def test_a_stalled_thread_zero_poll_is_reported():
    """--one: thread 0's acquire poll gave up after POLL_LIMIT polls and let the task go on with what it read, the
    error flag untouched — a stalled schedule was timed and shown with 0 errors. Now the poll sets the flag (a
    `red.global.or` in its sm_90 code; the every-thread poll already did, with an atomic or)."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="this Triton has no CUDA backend to compile for")
    from tests.core.test_pdl_ptx import _compiled
    df = load("dataflow_floor")
    df.KC = 1024
    _, kern = df._kernels()
    tasks, splits = df.plan(1024)
    types = dict(w_ptr="*i8", p_ptr="*fp32", cnt_ptr="*i32", ticket_ptr="*i32", err_ptr="*i32", task_base="i32")
    consts = dict(MODE=1, TICKET=True, PRE=True, PDL=False, NM=df.NMAX, LIMIT=df.POLL_LIMIT, BN_=16, KC_=1024,
                  ONE=True, FINE=True, CS=df.counter_slots(1024),
                  **{f"T{i}": t for i, t in enumerate(tasks)}, **{f"S{i}": s for i, s in enumerate(splits)})
    ptx = _compiled(kern, types, consts, num_warps=2).asm["ptx"]
    assert "ld.acquire.gpu.global.u32" in ptx and "red.global.or.b32" in ptx
