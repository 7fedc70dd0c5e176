"""bench/cluster_floor.py (issue #18): the cluster-partitioned step's probe compiles for Hopper, and its byte
segments are the step's bytes — each phase's blocks read the layer's region exactly once, whole rows each, for
every cluster size and for blocks without clusters."""
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


@pytest.mark.parametrize("cl,clusters,positions", [(16, 8, 2122), (12, 8, 7000), (8, 8, 5), (1, 132, 2122),
                                                   (1, 96, 7000)])
def test_every_byte_is_read_once(cl, clusters, positions):
    cf = _cf()
    seg, lay = cf.segments(cl, clusters, positions)
    assert seg.shape == (6, cl * clusters, 2, 2) and lay["blocks"] == cl * clusters
    nb = {k: v // 16 for k, v in cf.layer_bytes(positions).items()}
    lo = 0
    for kind, key in enumerate(("qkv", "kv", "o", "gu", "down")):
        cov = _coverage(seg, kind, lo, lo + nb[key])
        assert bool((cov == 1).all()), (key, int(cov.min()), int(cov.max()))
        lo += nb[key]
    assert lay["layer_u4"] == lo
    assert bool((_coverage(seg, 5, 0, lay["head_u4"]) == 1).all())


def test_a_cluster_reads_its_kv_heads_rows():
    """Cluster j (of 16 blocks): qkv rows 512j… (j's two query heads, k_j, v_j as tiled at load), j's K and V
    positions, o_proj rows over its 256 inputs, gate/up rows of ffn columns 768j…, down rows over those 768."""
    cf = _cf()
    seg, lay = cf.segments(16, 8, 2122)
    j = 3
    blk = seg[:, 16 * j:16 * (j + 1)]
    qkv_rows = blk[0, :, 0, 1].sum() * 16 // cf.HID
    assert int(qkv_rows) == 512 and int(blk[0, 0, 0, 0]) * 16 == 512 * j * cf.HID
    kv = blk[1, :, :, 1].sum() * 16
    assert int(kv) == 2 * 2122 * cf.HEAD_DIM * 2
    assert (lay["q1"], lay["q2"], lay["q3"], lay["q4"], lay["np"], lay["ps"]) == (32, 260, 48, 0, 8, 128)


def test_bad_partition_is_refused():
    with pytest.raises(ValueError, match="expected 8 clusters"):
        _cf().segments(16, 4, 100)


def test_cluster_kernel_compiles_for_hopper_without_spills():
    """The kernel (cluster dims fixed at compile time, DSMEM pushes, cluster-scope mbarrier hand-offs, bulk-copy
    ring, the arithmetic model) compiles with NVRTC for sm_90 at cluster sizes 1, 8, 12, 16, one 544-thread block
    a multiprocessor, without register spills."""
    try:
        from torch.cuda._utils import _get_gpu_rtc_library
        lib = _get_gpu_rtc_library()
    except Exception as exc:  # a CPU-only PyTorch build ships no NVRTC
        pytest.skip(f"no NVRTC in this PyTorch ({type(exc).__name__}: {exc})")
    cf = _cf()
    for cl in (1, 8, 12, 16):
        cubin, log = lc.nvrtc_compile(cf.SOURCE, dict(CL=cl, NCW=cf.NCW, HID_=cf.HID), "sm_90", lib=lib)
        assert cubin[:4] == b"\x7fELF"
        body = log.split("'cstep'")[1]
        assert " 0 bytes spill stores" in body.split("Compile time")[0], log


def test_no_kernel_parameter_is_declared_again_in_its_body():
    """Review finding (stop 46): `const float q0 = …, q1 = …` in the consumers' block hid the parameter q1 (the
    first hand-off's floats pushed to each rank), so push(rx1, q1, …) and gather(rx1, q1) took the float truncated
    to 0 or less: the measured cluster rows sent no values at their first hand-off."""
    import re
    cf = _cf()
    head, body = cf.KERNEL.split("cstep(", 1)[1].split(")", 1)[0], cf.KERNEL.split("cstep(", 1)[1].split("{", 1)[1]
    params = [p.split()[-1].lstrip("*") for p in head.replace("\n", " ").split(",")]
    assert "q1" in params and "S" in params, params
    again = [p for p in params if re.search(rf"(?:\b(?:int|float|u32|long)\b[^;(]*?[\s,*]|,\s*){p}\s*=(?!=)", body)]
    assert not again, again


def test_the_printed_register_line_is_cstep_s():
    """The probe printed the log's first 'Used N registers' line, which is `reset`'s (10 registers, 0 barriers),
    as each cluster size's kernel resources."""
    cf = _cf()
    log = ("ptxas info    : Compiling entry function 'reset' for 'sm_90'\n"
           "ptxas info    : Used 10 registers, used 0 barriers\n"
           "ptxas info    : Compiling entry function 'cstep' for 'sm_90'\n"
           "ptxas info    : Used 96 registers, used 2 barriers, 544 bytes smem\n")
    assert cf.kernel_resources(log, "cstep") == "Used 96 registers, used 2 barriers, 544 bytes smem"
    assert cf.kernel_resources(log, "nope") == "?"


def test_a_cluster_size_that_misaligns_the_pair_codes_is_refused():
    """The +math consumers read the pair codes after the push buffers as 16-byte words: a cluster size whose push
    floats are not a multiple of 4 (3, 5, 9–11, 15) would fault there."""
    cf = _cf()
    with pytest.raises(ValueError, match="misalign"):
        cf.segments(3, 8, 100)
    for cl in (1, 8, 12, 16):
        seg, lay = cf.segments(cl, 8 if cl > 1 else 132, 100)
        assert cl * (lay["q1"] + lay["q2"] + lay["q3"] + lay["q4"]) % 4 == 0
