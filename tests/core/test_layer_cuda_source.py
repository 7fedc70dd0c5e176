"""The CUDA C++ layer kernel (`fast/_layer_cuda.cu`, YUE2_LAYER_KERNEL=cuda; experimental, off by default) without a
GPU: its source compiles with NVRTC (the runtime compiler PyTorch's CUDA wheels ship) for Hopper at the release's and
the tiny model's dims, within one block per multiprocessor's registers and without spills; its shared memory and tile
sums fit; the Python side refuses what it cannot run. Its numerics are GPU tests (tests/core/test_cuda_fast.py)."""
import pytest
import torch

from yue2_core.fast import _layer_cuda as lc
from yue2_core.layers import ModelDims

FULL = ModelDims(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=6144, vocab=184704, latent_dim=64,
                 time_freq=256, pe_rows=24576, rope_theta=1e6, eps=1e-6)
TINY = ModelDims(hidden=256, layers=2, heads=2, kv_heads=1, head_dim=128, ffn=512, vocab=184704, latent_dim=64,
                 time_freq=256, pe_rows=24576, rope_theta=1e6, eps=1e-6)


def _nvrtc():
    """PyTorch's NVRTC library, or a skip naming why (a CPU-only PyTorch build ships none)."""
    try:
        from torch.cuda._utils import _get_gpu_rtc_library
        return _get_gpu_rtc_library()
    except Exception as exc:  # noqa: BLE001 - any loader failure means: no NVRTC here
        pytest.skip(f"no NVRTC in this PyTorch ({type(exc).__name__}: {exc})")


# experimental (off by default): the release dims at the smallest and largest row counts int8 and once bf16, the
# tiny dims once (two-row FULL cases and TINY int8 dropped from CI for time, 2026-12-05: ≈ 3.5 s each)
@pytest.mark.parametrize("dims,rows,int8", [(FULL, 1, True), (FULL, 4, True), (FULL, 2, False), (TINY, 3, False)])
def test_source_compiles_for_hopper_within_registers(dims, rows, int8):
    lib = _nvrtc()
    with open(lc.SOURCE) as f:
        src = f.read()
    cubin, log = lc.nvrtc_compile(src, lc.defines(rows, dims, int8), "sm_90", lib=lib)
    regs, spill = lc.registers(log)
    assert cubin[:4] == b"\x7fELF"
    # __launch_bounds__(512, 1): ≤ 128 registers a thread; the release's dims must not spill at all (the products'
    # weights would go to the stack), other dims within what the decoder accepts (persistent.SPILL_LIMIT)
    from yue2_core.fast.persistent import SPILL_LIMIT
    assert 0 < regs <= 128 and 0 <= spill <= (0 if dims is FULL else SPILL_LIMIT), log


def test_the_experimental_switches_compile_without_spills(monkeypatch):
    """YUE2_LAYER_CUDA_OPTS=pipe,fexp (experimental): the attention holds two cache batches in registers; the
    release's dims must still fit one block per multiprocessor's registers without a spill (the GPU tests check
    the numbers); an unknown switch is named."""
    from yue2_core.errors import RequestError
    lib = _nvrtc()
    monkeypatch.setenv("YUE2_LAYER_CUDA_OPTS", "pipe, fexp")
    macros = lc.defines(1, FULL, True)
    assert macros["ATT_PIPE"] == 1 and macros["FAST_EXP"] == 1
    monkeypatch.setenv("YUE2_LAYER_CUDA_OPTS", "")
    assert lc.defines(1, FULL, True)["ATT_PIPE"] == 0 == lc.defines(1, FULL, True)["FAST_EXP"]
    monkeypatch.setenv("YUE2_LAYER_CUDA_OPTS", "pipe,turbo")
    with pytest.raises(RequestError, match="unknown 'turbo'; accepted: pipe, fexp"):
        lc.defines(1, FULL, True)
    with open(lc.SOURCE) as f:
        src = f.read()
    cubin, log = lc.nvrtc_compile(src, macros, "sm_90", lib=lib)
    regs, spill = lc.registers(log)
    assert cubin[:4] == b"\x7fELF" and 0 < regs <= 128 and spill == 0, log


def test_a_compile_error_names_the_macros():
    lib = _nvrtc()
    with open(lc.SOURCE) as f:
        src = f.read()
    bad = dict(lc.defines(1, FULL, True), HD=64)  # the attention's lanes hold 4 dims of a 128-wide head
    with pytest.raises(RuntimeError, match="could not compile the layer kernel.*HD"):
        lc.nvrtc_compile(src, bad, "sm_90", lib=lib)


def test_shared_memory_and_tile_sums_fit():
    for rows in (1, 2, 3, 4):
        assert lc.shared_bytes(rows, FULL) <= 227 * 1024  # an H100/H200 block's opt-in maximum
        assert lc.sums_problem(rows, FULL, 132) is None
    assert lc.shared_bytes(2, FULL) > lc.shared_bytes(1, FULL)
    why = lc.sums_problem(4, FULL, 8)  # 8 blocks: 48 gate/up tiles a block
    assert why is not None and "8 blocks" in why


def test_ptxas_log_parsing():
    assert lc.registers("ptxas info : Used 97 registers, used 1 barriers\n 8 bytes spill stores") == (97, 8)
    assert lc.registers("nothing") == (-1, -1)


def test_cuda_mode_refuses_what_it_cannot_run(tiny_paths):
    from yue2_core.fast import persistent
    from yue2_core.pipeline import YuE2Engine
    eng = YuE2Engine.load(tiny_paths["bf16"], device="cpu", parts=("ar",))
    why = persistent.unsupported(eng.ar, 2, torch.float16, "cuda")
    assert why is not None and "bf16" in why
    assert persistent.unsupported(eng.ar, 2, torch.bfloat16, "cuda") is None
    with pytest.raises(RuntimeError, match="NVIDIA GPU"):
        lc.compile_layer(2, eng.ar.dims, False, torch.device("cpu"))
    assert "cuda" in persistent.MODES


def _stream_floor():
    from bench_scripts import load
    return load("stream_floor")


def test_stream_floor_kernels_compile_for_hopper():
    """bench/stream_floor.py's schedules (register streams, the bulk-copy ring with mbarriers, the barrier variants)
    compile with NVRTC for sm_90, each kernel within one 512- or 544-thread block a multiprocessor."""
    lib = _nvrtc()
    sf = _stream_floor()
    cubin, log = lc.nvrtc_compile(sf.SOURCE, {}, "sm_90", lib=lib)
    assert cubin[:4] == b"\x7fELF"
    for name in ("stream", "ring", "reset"):
        assert f"Compiling entry function '{name}'" in log, log
    assert "spill stores" in log and " 0 bytes spill stores" in log.split("'ring'")[1].split("Compile time")[0]


def test_stream_floor_anatomy_reads_arrivals_and_releases():
    """The barrier anatomy: 3 barriers × 2 blocks arriving 200 ns apart, both released 1,000 ns after the last
    arrival, the next barrier's first arrival 500 ns after a release → arrival spread 0.2 µs, release latency 1.0 µs,
    between barriers 0.6 µs (the mean of block 0's 0.5 and block 1's 0.7)."""
    sf = _stream_floor()
    t = torch.zeros(3, 2, 2, dtype=torch.int64)
    base = 10_000
    for p in range(3):
        arr = (base, base + 200)
        rel = base + 200 + 1000
        t[p, 0] = torch.tensor([arr[0], rel])
        t[p, 1] = torch.tensor([arr[1], rel])
        base = rel + 500
    out = sf.anatomy_table(t.view(-1), 2, 3)
    assert "3 barriers: arrival spread 0.20 µs, release latency 1.00, release spread 0.00, between barriers 0.60" \
        in out, out


def test_stream_floor_scales_only_the_kv_phase_for_multi_row_floors():
    """--kv-scale (stop 56: the CFG pair's and the candidates' floors were never measured) multiplies the K/V phase
    alone: 2 caches of a CFG pair add 9.2 MB a layer, the weights stay; a scale outside (0, 64] is refused by name."""
    sf = _stream_floor()
    one, two = sf.phase_bytes_mb(1.0), sf.phase_bytes_mb(2.0)
    assert one == sf.PHASE_MB
    assert [b - a for a, b in zip(one, two)] == [0.0, sf.PHASE_MB[1], 0.0, 0.0, 0.0]
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, str(sf.__file__), "--kv-scale", "0"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "--kv-scale 0.0: expected a number in (0, 64]" in proc.stderr, proc.stderr


def test_stream_floor_weight_scale_doubles_the_weights_for_the_bf16_floor():
    """--weight-scale (stop 57: no bf16 floor had been measured) multiplies the four weight phases and leaves the K/V
    phase (bf16 in both files) alone; a scale outside (0, 4] is refused by name."""
    sf = _stream_floor()
    bf16 = sf.phase_bytes_mb(1.0, 2.0)
    assert bf16[1] == sf.PHASE_MB[1]
    assert [b / a for i, (a, b) in enumerate(zip(sf.PHASE_MB, bf16)) if i != 1] == [2.0] * 4
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, str(sf.__file__), "--weight-scale", "5"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "--weight-scale 5.0: expected a number in (0, 4]" in proc.stderr, proc.stderr


def test_every_bench_decoder_gets_the_modes_switches(monkeypatch):
    """bench/layer_kernel.py: a mode such as "cuda:pipe+fexp" is YUE2_LAYER_KERNEL=cuda with YUE2_LAYER_CUDA_OPTS=
    pipe,fexp for every decoder it builds — the timed ones, and --diag's and the phase check's, which set
    YUE2_LAYER_KERNEL=cuda:pipe (no such kernel) before (diff review 58)."""
    import importlib.util
    import os
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "bench" / "layer_kernel.py"
    spec = importlib.util.spec_from_file_location("bench_layer_kernel", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    seen = []
    monkeypatch.setattr(bench.fd, "PhaseDecoder", lambda *a, **k: seen.append(
        (os.environ["YUE2_LAYER_KERNEL"], os.environ["YUE2_LAYER_CUDA_OPTS"])))
    monkeypatch.setenv("YUE2_LAYER_KERNEL", "off")
    monkeypatch.setenv("YUE2_LAYER_CUDA_OPTS", "")
    s = bench.Sampling(min_tokens=4, max_tokens=4)
    for mode in ("cuda:pipe+fexp", "cuda:fexp", "cuda", "off", "cuda:nopf"):
        bench.decoder(None, 1, 64, s, mode)
    assert seen == [("cuda", "pipe,fexp"), ("cuda", "fexp"), ("cuda", ""), ("off", ""), ("cuda", "")], seen
