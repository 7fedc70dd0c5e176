"""The render stages on an NVIDIA GPU (marked `gpu`; skipped with a visible reason elsewhere): the NAR velocity
replayed from a CUDA graph against the eager fused path (bit for bit), its memory, its fallback when capture fails;
the VAE with its biases folded into the snake against the unfolded decoder. (CPU checks: test_solver.py,
test_vae_bias_fold.py.)"""
import warnings

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

from yue2_core import nar as N  # noqa: E402
from yue2_core.vae import SnakeBeta, VAEDecoder  # noqa: E402

FRAMES = 50
TOKENS = [151643] + list(range(100, 400)) + [151853 + i for i in range(FRAMES)] + [151852]


@pytest.fixture(scope="module")
def engine(tiny_paths):
    from yue2_core.pipeline import YuE2Engine
    return YuE2Engine.load(tiny_paths["bf16"], device="cuda", warm_up=False)


def _renderer(eng, graph):
    return N.ChunkRenderer(eng.nar, eng.ar.layer_kv(TOKENS, extra=FRAMES + 2), FRAMES, ar_len=len(TOKENS),
                           fused=True, graph=graph)


def _peak(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return out, torch.cuda.max_memory_allocated() - before


@pytest.mark.parametrize("method", ["midpoint", "ab2"])
def test_graph_velocity_equals_eager_bit_for_bit(engine, method):
    noise = N.song_noise(FRAMES, 3)
    first = _renderer(engine, graph=True)  # the side stream's cuBLAS workspace (kept for the process) made here,
    N.solve(first, noise, 2, method=method)  # outside the measured peaks
    first.close()
    eager = _renderer(engine, graph=False)
    ref, eager_peak = _peak(lambda: N.solve(eager, noise, 4, method=method))
    graphed = _renderer(engine, graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: the capture must work here
        got, graph_peak = _peak(lambda: N.solve(graphed, noise, 4, method=method))
    assert graphed.graphed and graphed._graph is not None  # replayed, not eager
    assert graphed.evaluations == (8 if method == "midpoint" else 4)
    print(f"{method}: graph vs eager max |Δ| {(got - ref).abs().max().item():.2e}; allocator peak eager "
          f"{eager_peak / 2 ** 20:.1f} MiB, graph {graph_peak / 2 ** 20:.1f} MiB")
    assert torch.equal(got, ref)
    # the graph's private pool holds one evaluation's activations, as the eager call does: no second copy on top
    assert graph_peak <= 1.25 * eager_peak + 8 * 2 ** 20
    graphed.close()
    assert graphed._graph is None and not graphed.graphed


def test_graph_velocity_single_calls_equal(engine):
    """velocity() itself (warm-up, capture, replays at different timesteps and states) against eager calls."""
    eager, graphed = _renderer(engine, graph=False), _renderer(engine, graph=True)
    gen = torch.Generator().manual_seed(0)
    for raw in (20.0, 1.3, -0.7, 1.3, -20.0):
        state = torch.randn(FRAMES, 64, generator=gen).to("cuda", torch.bfloat16)
        a, b = eager.velocity(state, raw), graphed.velocity(state, raw)
        assert torch.equal(a, b), raw
    assert graphed._graph is not None


def test_capture_failure_falls_back_with_one_warning(engine, monkeypatch):
    monkeypatch.setattr(N, "_GRAPH_FAILED", {})

    class Broken:  # a graph whose capture is refused (the renderer captures with capture_begin/capture_end)
        def capture_begin(self, *a, **k):
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Broken)
    noise = N.song_noise(FRAMES, 4)
    ref = N.solve(_renderer(engine, graph=False), noise, 3)
    with pytest.warns(UserWarning, match="CUDA graph of the NAR velocity unavailable") as caught:
        r = _renderer(engine, graph=None)
        got = N.solve(r, noise, 3)
        got2 = N.solve(_renderer(engine, graph=None), noise, 3)  # not tried again: no second warning
    assert len([w for w in caught if "NAR velocity" in str(w.message)]) == 1
    assert not r.graphed and torch.equal(got, ref) and torch.equal(got2, ref)
    assert "cuda" in next(iter(N._GRAPH_FAILED))


@pytest.mark.parametrize("beside_worker", [False, True])
def test_error_inside_the_capture_is_the_one_reported(engine, monkeypatch, beside_worker):
    """An evaluation that breaks its capture (a host read) — alone on the GPU or beside the batch worker
    (`fast.decode._capture_beside_worker`, no device sync) — leaves the renderer eager with one warning that names
    the original error (not capture_end's "operation failed due to a previous error during capture"), the same
    latents as an eager solve, and the current stream as it was."""
    from yue2_core.fast import decode as fd
    monkeypatch.setattr(N, "_GRAPH_FAILED", {})
    if beside_worker:
        monkeypatch.setattr(fd, "_CONCURRENT", [1])
    noise = N.song_noise(FRAMES, 5)
    ref = N.solve(_renderer(engine, graph=False), noise, 3)
    r = _renderer(engine, graph=None)
    real = r._velocity

    def failing(state, raw_t):
        if torch.cuda.is_current_stream_capturing():
            out = real(state, raw_t)  # kernels recorded into the capture first, then a host read that breaks it
            out.sum().item()
        return real(state, raw_t)

    monkeypatch.setattr(r, "_velocity", failing)
    stream = torch.cuda.current_stream()
    with pytest.warns(UserWarning, match="NAR velocity unavailable") as caught:
        got = N.solve(r, noise, 3)
    message = next(str(w.message) for w in caught if "NAR velocity" in str(w.message))
    assert "previous error during capture" not in message, message  # the first error, not capture_end's
    assert not r.graphed and torch.equal(got, ref) and torch.cuda.current_stream() == stream


def test_vae_folded_equals_unfolded(engine, monkeypatch):
    """Folding on CUDA (the default) vs the same fused snake with the biases added by PyTorch: the same fp32
    additions in the same order, so ≤ 1e-6 (expected 0); vs the portable torch snake ≤ 1e-5, as the fused snake
    alone (test_cuda_fast.py)."""
    vae = engine.vae
    lat = torch.randn(1, 64, 40, generator=torch.Generator().manual_seed(0))
    calls = []
    real = type(vae.decoder).forward_folded
    monkeypatch.setattr(type(vae.decoder), "forward_folded", lambda self, x, kernel: calls.append(kernel)
                        or real(self, x, kernel))
    folded = vae.decode(lat)
    assert calls == [True]
    monkeypatch.setattr(VAEDecoder, "fold_bias", False)
    unfolded = vae.decode(lat)
    monkeypatch.setattr(SnakeBeta, "fused", False)
    portable = vae.decode(lat)
    d_fold, d_port = (folded - unfolded).abs().max().item(), (folded - portable).abs().max().item()
    print(f"VAE folded vs unfolded max |Δ| {d_fold:.1e} (equal: {torch.equal(folded, unfolded)}), vs portable "
          f"snake {d_port:.1e}")
    assert d_fold <= 1e-6 and d_port < 1e-5


def test_vae_folded_peak_is_not_above_unfolded(engine, monkeypatch):
    """The folded decoder drops each activation once read (`_Decoder.forward_folded`): its allocator peak over the
    input must not exceed the unfolded decoder's (it was 1.43x on the release VAE, 2.42 vs 1.69 GiB, before)."""
    vae = engine.vae
    lat = torch.randn(1, 64, 600, generator=torch.Generator().manual_seed(1)).cuda()
    peaks = {}
    for fold in (True, False):
        monkeypatch.setattr(VAEDecoder, "fold_bias", fold)
        vae.decode(lat)  # kernels compiled, workspaces made
        _, peaks[fold] = _peak(lambda: vae.decode(lat))
    print(f"VAE activations peak: folded {peaks[True] / 2 ** 20:.1f} MiB, unfolded {peaks[False] / 2 ** 20:.1f} MiB")
    assert peaks[True] <= 1.05 * peaks[False]


def test_vae_tiled_pinned_copies(engine):
    """decode_tiled on CUDA (tiles copied to pinned memory on a side stream) equals the one-piece decode."""
    vae = engine.vae
    lat = torch.randn(1, 64, 70, generator=torch.Generator().manual_seed(2))
    whole = vae.decode(lat).cpu()
    tiled = vae.decode_tiled(lat, core=16, halo=16)
    assert tiled.is_pinned() and tiled.shape == whole.shape
    assert (tiled - whole).abs().max().item() < 1e-5
