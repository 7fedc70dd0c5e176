"""The VAE's bias folding (`vae._Decoder.forward_folded`): every convolution bias and residual add carried into the
next snake. The snake+bias kernel in Triton's interpreter against bias-then-snake, the folded tiny decoder against
the unfolded one (torch ops on the CPU, and with the kernel in the interpreter), the fallback for a tree it does not
know, and `to_waveform`. (On CUDA: tests/core/test_render_gpu.py.)"""
import pytest
import torch

from tests.core.test_fast_path import _run_ok
from yue2_core.errors import NumericalError
from yue2_core.vae import SnakeBeta, VAEDecoder, to_waveform

# fp32 tolerance on the tiny decoder's audio (|audio| ≲ 1): the CPU's convolution adds its bias inside the
# accumulation, the folded path after it — a few ulps per layer (measured 3.6e-7 on 40 frames)
FOLD_TOL = 1e-5


def _latents(frames=40, seed=0):
    return torch.randn(1, 64, frames, generator=torch.Generator().manual_seed(seed))


def test_folded_decoder_equals_unfolded_on_cpu(tiny_engine_fp32, monkeypatch):
    vae = tiny_engine_fp32.vae
    assert vae.decoder.foldable()
    lat = _latents()
    ref = vae.decode(lat)  # fold_bias None: not folded on the CPU
    calls = []
    real = type(vae.decoder).forward_folded
    monkeypatch.setattr(type(vae.decoder), "forward_folded", lambda self, x, kernel: calls.append(kernel)
                        or real(self, x, kernel))
    monkeypatch.setattr(VAEDecoder, "fold_bias", True)
    got = vae.decode(lat)
    assert calls == [False]  # folded, with torch ops (no CUDA here)
    err = (got - ref).abs().max().item()
    print(f"folded vs unfolded (CPU torch ops): max |Δ| {err:.1e}")
    assert got.shape == ref.shape and err < FOLD_TOL
    tiled = vae.decode_tiled(lat, core=16, halo=16)
    assert (tiled - ref).abs().max().item() < FOLD_TOL


def test_folding_carries_every_bias(tiny_engine_fp32, monkeypatch):
    """The folded path must add each bias exactly once: with one convolution's bias changed, its output moves as
    much as the unfolded decoder's does (a bias dropped or added twice would not)."""
    vae = tiny_engine_fp32.vae
    lat = _latents(12)
    units = [m for m in vae.decoder.modules() if type(m).__name__ == "WNConv1d" and m.bias is not None]
    assert len(units) >= 20
    monkeypatch.setattr(VAEDecoder, "fold_bias", True)
    for conv in (units[0], units[1], units[3], units[4], units[-1]):  # first conv, convT, k7, k1, the last one
        saved = conv.bias.detach().clone()
        try:
            base_f = vae.decode(lat)
            monkeypatch.setattr(VAEDecoder, "fold_bias", False)
            base_u = vae.decode(lat)
            conv.bias.data += 0.25
            moved_u = vae.decode(lat)
            monkeypatch.setattr(VAEDecoder, "fold_bias", True)
            moved_f = vae.decode(lat)
        finally:
            conv.bias.data.copy_(saved)
        assert (moved_u - base_u).abs().max() > 1e-3
        assert ((moved_f - base_f) - (moved_u - base_u)).abs().max() < FOLD_TOL


def test_unknown_tree_is_not_folded(tiny_engine_fp32, monkeypatch):
    """A decoder tree with a module the folded walk does not know (here a SnakeBeta subclass) runs `forward`."""
    vae = tiny_engine_fp32.vae

    class OtherSnake(SnakeBeta):
        pass

    last = vae.decoder.layers[-2]
    other = OtherSnake(last.alpha.numel())
    other.load_state_dict(last.state_dict())
    monkeypatch.setitem(vae.decoder.layers._modules, str(len(vae.decoder.layers) - 2), other)
    assert not vae.decoder.foldable()
    monkeypatch.setattr(VAEDecoder, "fold_bias", True)
    monkeypatch.setattr(type(vae.decoder), "forward_folded", lambda *a: pytest.fail("folded an unknown tree"))
    assert torch.isfinite(vae.decode(_latents(8))).all()


def test_snake_bias_kernel_in_interpreter():
    """fast.fused.snake with bias / residual / keep in Triton's interpreter: bit-equal to the same kernel on the
    input summed beforehand (bias-then-snake), within 1e-6 of the torch formula, pre written over x with keep."""
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from yue2_core.fast import fused\n"
        "from yue2_core.vae import SnakeBeta\n"
        "g = torch.Generator().manual_seed(0)\n"
        "for b, c, t in ((1, 3, 1500), (2, 5, 77)):\n"
        "    x = torch.randn(b, c, t, generator=g) * 2\n"
        "    res = torch.randn(b, c, t, generator=g)\n"
        "    bias = torch.randn(c, generator=g)\n"
        "    m = SnakeBeta(c)\n"
        "    m.alpha.data = torch.randn(c, generator=g) * 0.5\n"
        "    m.beta.data = torch.randn(c, generator=g) * 0.5\n"
        "    pre = res + (x + bias[None, :, None])\n"
        "    ref = m.reference(pre)\n"
        "    same = fused.snake(pre.clone(), m.alpha, m.beta)\n"
        "    y = fused.snake(x.clone(), m.alpha, m.beta, bias=bias, residual=res)\n"
        "    assert torch.equal(y, same), (y - same).abs().max()\n"
        "    assert (y - ref).abs().max() < 1e-6 * max(1.0, ref.abs().max().item()), (y - ref).abs().max()\n"
        "    xk = x.clone()\n"
        "    kept, yk = fused.snake(xk, m.alpha, m.beta, bias=bias, residual=res, keep=True)\n"
        "    assert kept.data_ptr() == xk.data_ptr() and torch.equal(kept, pre) and torch.equal(yk, y)\n"
        "    yb = fused.snake(x.clone(), m.alpha, m.beta, bias=bias)\n"
        "    assert torch.equal(yb, fused.snake(x + bias[None, :, None], m.alpha, m.beta))\n"
        "    assert torch.equal(fused.snake(x.clone(), m.alpha, m.beta), fused.snake(x, m.alpha, m.beta, None))\n"
        "    assert not torch.equal(yb, fused.snake(x.clone(), m.alpha, m.beta))\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


def test_folded_decoder_with_kernel_in_interpreter(tiny_paths):
    """The tiny decoder folded with the Triton snake (interpreter, CPU tensors) against the reference forward."""
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from yue2_core.weights.checkpoint import inspect_checkpoint, load_vae\n"
        "from yue2_core.vae import strict_fp32\n"
        f"vae = load_vae(inspect_checkpoint({tiny_paths['bf16']!r}), 'cpu')\n"
        "# 8 frames (15,296 samples: 15 snake blocks a channel, the last partial; the interpreter's time: per block)\n"
        "lat = torch.randn(1, 64, 8, generator=torch.Generator().manual_seed(1))\n"
        "with torch.inference_mode():\n"
        "    ref = vae.decoder(lat)\n"
        "    got = vae.decoder.forward_folded(lat, kernel=True)\n"
        "    torch_ops = vae.decoder.forward_folded(lat, kernel=False)\n"
        "err = (got - ref).abs().max().item()\n"
        f"assert got.shape == ref.shape and err < {FOLD_TOL}, err\n"
        "assert (got - torch_ops).abs().max().item() < 1e-6\n"
        "print('ok', err)\n")
    _run_ok(code, interpret=True)


def test_to_waveform_rejects_non_finite_and_clips_in_place():
    audio = torch.tensor([[0.5, -2.0, 3.0], [0.0, 1.5, -0.25]])
    out = to_waveform(audio)
    assert out.data_ptr() == audio.data_ptr()
    assert out.tolist() == [[0.5, -1.0, 1.0], [0.0, 1.0, -0.25]]
    for bad in (float("nan"), float("inf"), float("-inf")):
        a = torch.zeros(2, 5)
        a[1, 3] = bad
        with pytest.raises(NumericalError, match="non-finite"):
            to_waveform(a)
    assert to_waveform(torch.tensor([[0.5, 2.0]], dtype=torch.float64)).dtype == torch.float32


def test_decoded_song_audio_is_a_normal_clipped_tensor(tiny_engine_fp32):
    """pipeline.decode: to_waveform clips decode_tiled's output in place, outside inference mode — which works only
    because that output is a normal tensor (callers may modify the song's audio in place too)."""
    from yue2_core.pipeline import decode
    audio = decode(tiny_engine_fp32.vae, torch.randn(20, 64, generator=torch.Generator().manual_seed(3)) * 3)
    assert not audio.is_inference() and audio.abs().max().item() == 1.0
    audio.mul_(0.5)
