"""The L2 weight prefetch branch (`fast/l2_prefetch.py`, YUE2_L2_PREFETCH; experimental, off by default) without a
GPU: the spec and grid parse or are refused with what is accepted, the prefetch kernel compiles with NVRTC for Hopper
to the bulk L2 prefetch instruction, and a CPU decoder validates the switch but builds no branch. Its effect on the
logits (none, bit for bit) is a GPU test (tests/core/test_cuda_fast.py); its speed is `bench/gpu_session.sh l2`."""
import pytest

from yue2_core.errors import RequestError
from yue2_core.fast import l2_prefetch as lp


def test_spec_parses_points_and_next_layer_weights():
    assert lp.parse("off") == {} and lp.parse("") == {} and lp.parse(" 0 ") == {}
    assert lp.parse("qkv:o,gu;o:down,qkv+") == {"qkv": [("o", 0), ("gu", 0)], "o": [("down", 0), ("qkv", 1)]}
    assert lp.parse(" start : gu ; start:down+ ;") == {"start": [("gu", 0), ("down", 1)]}


@pytest.mark.parametrize("spec,named", [("qkv", "'qkv'"), ("middle:o", "'middle:o'"), ("qkv:", "'qkv:'"),
                                        ("qkv:up", "'up'"), ("qkv:o++", "'o++'"), ("qkv:o,", "''"), ("1", "'1'"),
                                        ("on", "'on'")])
def test_bad_spec_names_the_part(spec, named):
    with pytest.raises(RequestError, match="the environment variable YUE2_L2_PREFETCH must be off, or POINT") as err:
        lp.parse(spec)
    assert named in str(err.value) and "gu" in str(err.value)


def test_grid_default_and_refusals(monkeypatch):
    monkeypatch.delenv("YUE2_L2_PREFETCH_GRID", raising=False)
    assert lp.grid() == (8, 64 * 1024)
    monkeypatch.setenv("YUE2_L2_PREFETCH_GRID", "32:16")
    assert lp.grid() == (32, 16 * 1024)
    monkeypatch.setenv("YUE2_L2_PREFETCH_GRID", " 8 : 64 ")
    assert lp.grid() == (8, 64 * 1024)
    for bad in ("32", "0:64", "8:4096", "a:b", "8:64:1", "٨:٦٤", "８:６４", "1_0:6_4", ":64"):
        monkeypatch.setenv("YUE2_L2_PREFETCH_GRID", bad)
        with pytest.raises(RequestError, match="BLOCKS:PIECE_KB"):
            lp.grid()


def test_kernel_compiles_to_the_bulk_l2_prefetch_for_hopper():
    try:
        from torch.cuda._utils import _get_gpu_rtc_library
        lib = _get_gpu_rtc_library()
    except Exception as exc:  # noqa: BLE001 - a CPU-only PyTorch build ships no NVRTC
        pytest.skip(f"no NVRTC in this PyTorch ({type(exc).__name__}: {exc})")
    from yue2_core.fast._layer_cuda import nvrtc_compile
    cubin, log = nvrtc_compile(lp.SOURCE, {}, "sm_90", lib=lib)
    assert cubin[:4] == b"\x7fELF" and "0 bytes spill stores" in log, log
    assert "cp.async.bulk.prefetch.L2.global" in lp.SOURCE
    # the instruction needs sm_90: an Ampere target refuses it, which is why the Prefetcher checks the capability
    with pytest.raises(RuntimeError):
        nvrtc_compile(lp.SOURCE, {}, "sm_80", lib=lib)


def test_cpu_decoder_validates_the_switch_and_builds_no_branch(tiny_paths, monkeypatch):
    from yue2_core.fast import decode as fd
    from yue2_core.pipeline import YuE2Engine
    from yue2_core.protocol import Sampling
    eng = YuE2Engine.load(tiny_paths["bf16"], device="cpu", parts=("ar",))
    s = Sampling(min_tokens=2, max_tokens=2)
    monkeypatch.setenv("YUE2_L2_PREFETCH", "qkv:gate")
    with pytest.raises(RequestError, match="'gate'"):
        fd.PhaseDecoder(eng.ar, [[1, 2, 3]], s, [1], "semantic")
    monkeypatch.setenv("YUE2_L2_PREFETCH", "qkv:o,gu")
    assert fd.PhaseDecoder(eng.ar, [[1, 2, 3]], s, [1], "semantic").prefetch is None


def _profile_decode():
    from bench_scripts import load
    return load("profile_decode")


def test_replay_gaps_count_only_time_no_kernel_covers():
    """bench/profile_decode.py --gaps (where the 8-row step's unattributed time lies): overlapping kernels (PDL, the
    prefetch branch) leave no gap; a gap is charged to the kernel that ended last and the one that started next."""
    pd = _profile_decode()
    # two steps: a(0–10), b(8–20) overlapping a, c(25–30), d(41–50), and a side kernel s(12–40) that covers b→c
    step = [("a", 0, 10), ("b", 8, 20), ("c", 25, 30), ("s", 12, 40), ("d", 41, 50)]
    spans = step + [(n, t0 + 100, t1 + 100) for n, t0, t1 in step]
    idle, ranked = pd.kernel_gaps(spans, steps=2)
    # per step: c starts inside s (no gap), s→d 1 µs; between the two steps d(50)→a(100) 50 µs, once
    assert ranked[0][:2] == ("d", "a") and abs(ranked[0][3] - 0.025) < 1e-12
    assert [r[:2] for r in ranked[1:]] == [("s", "d")] and abs(ranked[1][2] - 1.0) < 1e-12
    assert abs(idle - (50 + 2 * 1) / 1e3 / 2) < 1e-12


def test_kv_runs_cover_each_row_and_heads_positions_up_to_the_attention_length():
    """`kv` prefetches, per (row, kv head), the first attn_len positions of the layer's K and V caches
    [rows, kv heads, capacity, head dim]: one run each, a head's capacity apart; weights are one run."""
    import torch
    pf = object.__new__(lp.Prefetcher)
    k = [torch.zeros(2, 8, 64, 128, dtype=torch.bfloat16) for _ in range(3)]
    v = [torch.zeros(2, 8, 64, 128, dtype=torch.bfloat16) for _ in range(3)]
    runs = pf._runs("kv", 1, (k, v), attn_len=32)
    assert [(t.data_ptr(), n, c, s) for t, n, c, s in runs] == [
        (k[1].data_ptr(), 32 * 128 * 2, 16, 64 * 128 * 2), (v[1].data_ptr(), 32 * 128 * 2, 16, 64 * 128 * 2)]
    assert pf._runs("kv", 0, (k, v), attn_len=1000)[0][1] == 64 * 128 * 2  # never past the capacity
