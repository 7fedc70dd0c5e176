"""bench/cluster_floor.py (issue #18): the cluster-partitioned step's probe compiles for Hopper, and its byte
segments are the step's bytes — each phase's blocks cover the layer's region exactly once (clusters of 16), or
the shared k/v rows and K/V exactly twice (clusters of 8, sibling clusters reading the same addresses)."""
from __future__ import annotations

import pytest
import torch

from yue2_core.fast import _layer_cuda as lc


def _cf():
    from bench_scripts import load
    return load("cluster_floor")


def _coverage(seg: torch.Tensor, kind: int, lo: int, hi: int) -> torch.Tensor:
    """How often each uint4 of [lo, hi) is read by the blocks' segments of `kind`."""
    cnt = torch.zeros(hi - lo, dtype=torch.int32)
    for b in range(seg.shape[1]):
        for j in range(2):
            off, n = int(seg[kind, b, j, 0]), int(seg[kind, b, j, 1])
            if n:
                assert lo <= off and off + n <= hi, (kind, b, j, off, n, lo, hi)
                cnt[off - lo:off - lo + n] += 1
    return cnt


@pytest.mark.parametrize("positions", [2122, 7000, 5])
def test_clusters_of_16_read_every_byte_once(positions):
    cf = _cf()
    seg, lay = cf.segments(16, 128, positions)
    nb = {k: v // 16 for k, v in cf.layer_bytes(positions).items()}
    lo = 0
    for kind, key in enumerate(("qkv", "kv", "o", "gu", "down")):
        cov = _coverage(seg, kind, lo, lo + nb[key])
        assert bool((cov == 1).all()), (key, int(cov.min()), int(cov.max()))
        lo += nb[key]
    assert lay["layer_u4"] == lo
    head = _coverage(seg, 5, 0, lay["head_u4"])
    assert bool((head == 1).all())
    # the hand-offs' pushes: a kv head's 2 query heads + k + v over 16 blocks; 2 heads' outputs and (max, sum)
    assert (lay["q1"], lay["q2"], lay["q3"], lay["q4"], lay["np"], lay["ps"]) == (32, 260, 48, 128, 8, 128)


def test_clusters_of_8_share_the_kv_heads_bytes():
    cf = _cf()
    positions = 2122
    seg, lay = cf.segments(8, 128, positions)
    nb = {k: v // 16 for k, v in cf.layer_bytes(positions).items()}
    qkv = _coverage(seg, 0, 0, nb["qkv"])
    q_u4 = cf.HID * cf.HID // 16  # the 16 query heads' rows: read once; the k/v rows after them: twice
    assert bool((qkv[:q_u4] == 1).all()) and bool((qkv[q_u4:] == 2).all())
    kv = _coverage(seg, 1, nb["qkv"], nb["qkv"] + nb["kv"])
    assert bool((kv == 2).all())
    for c in range(0, 16, 2):  # sibling clusters c, c + 1 (query heads 2j, 2j + 1) read the same K/V
        assert torch.equal(seg[1, c * 8:(c + 1) * 8], seg[1, (c + 1) * 8:(c + 2) * 8])
    assert (lay["q1"], lay["q2"], lay["np"], lay["ps"]) == (48, 130, 16, 256)


def test_bad_partition_is_refused():
    with pytest.raises(ValueError, match="expected 16 or 8 with 128 blocks"):
        _cf().segments(4, 128, 100)


def test_cluster_kernel_compiles_for_hopper_without_spills():
    """The kernel (cluster dims fixed at compile time, DSMEM pushes, cluster-scope mbarrier hand-offs, bulk-copy
    ring) compiles with NVRTC for sm_90 at both cluster sizes, in one 544-thread block a multiprocessor."""
    try:
        from torch.cuda._utils import _get_gpu_rtc_library
        lib = _get_gpu_rtc_library()
    except Exception as exc:  # a CPU-only PyTorch build ships no NVRTC
        pytest.skip(f"no NVRTC in this PyTorch ({type(exc).__name__}: {exc})")
    cf = _cf()
    for cl in (16, 8):
        cubin, log = lc.nvrtc_compile(cf.SOURCE, dict(CL=cl, NCW=cf.NCW, HID_=cf.HID), "sm_90", lib=lib)
        assert cubin[:4] == b"\x7fELF"
        body = log.split("'cstep'")[1]
        assert " 0 bytes spill stores" in body.split("Compile time")[0], log
