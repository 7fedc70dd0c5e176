"""Oobleck VAE decoder of YuE2 (runtime.md §6; checkpoint_format.md §3): 64-channel latents at 25 frames/s →
48 kHz stereo, 1920 samples per frame.

decoder.layers: 0 WN-Conv1d(latent→C0, k7) · 1…6 DecoderBlock(cin→cout, stride s: SnakeBeta, WN-ConvTranspose1d
(k 2s, stride s, padding ⌈s/2⌉), ResidualUnits with dilation 1, 3, 9) · 7 SnakeBeta · 8 WN-Conv1d(→2, k7, no bias).
No tanh, no latent scaling. Weight norm is the legacy form (`weight_g`, `weight_v`; w = g·v/‖v‖ over every dim but
0). The output has 1920·T − 64 samples (the stride-5 transposed conv yields 5L − 1). Decoding runs in fp32 with
TF32 disabled for the call only (never a global flag flip).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .constants import HOP, LATENT_DIM, VAE_HALO_FRAMES


@dataclass(frozen=True)
class VAEConfig:
    """Decoder geometry read from the checkpoint: `blocks` = ((c_in, c_out, stride), …) in decoding order
    (release: (2048,1024,6), (1024,512,5), (512,256,4), (256,128,4), (128,64,2), (64,64,2))."""

    latent_dim: int
    first_channels: int
    blocks: tuple
    out_channels: int = 2

    @property
    def hop(self) -> int:
        return math.prod(s for _, _, s in self.blocks)


class SnakeBeta(nn.Module):
    """y = x + sin²(e^α·x) / (e^β + 1e-9), α and β stored in log scale, shape [C]."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels), requires_grad=False)
        self.beta = nn.Parameter(torch.zeros(channels), requires_grad=False)

    fused = None  # class-wide switch: None = fused Triton kernel on CUDA when available

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel_for(x):
            from .fast import fused
            return fused.snake(x, self.alpha, self.beta)
        return self.reference(x)

    @staticmethod
    def kernel_for(x: torch.Tensor) -> bool:
        """Whether the fused Triton snake serves x: fp32 on CUDA, Triton available, `SnakeBeta.fused` not False."""
        if x.is_cuda and x.dtype == torch.float32 and SnakeBeta.fused is not False:
            from .fast import fused
            return fused.available()
        return False

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The reference formula in torch ops (the portable path)."""
        alpha = torch.exp(self.alpha[None, :, None])
        beta = torch.exp(self.beta[None, :, None])
        return x + (1.0 / (beta + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)

    def folded(self, x: torch.Tensor, bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
               keep: bool = False, kernel: bool = False):
        """The snake of pre = residual + (x + bias[c]) (fp32, this order; either term optional): y, or (pre, y) with
        `keep`. `kernel`: one fused Triton pass (`fast.fused.snake`; with `keep`, pre is written over x), else torch
        ops — a bias add, a residual add and `reference`, as the unfolded decoder computes them on a GPU."""
        if kernel:
            from .fast import fused
            return fused.snake(x, self.alpha, self.beta, bias=bias, residual=residual, keep=keep)
        if bias is not None:
            x = x + bias[None, :, None]
        if residual is not None:
            x = residual + x
        y = self.reference(x)
        return (x, y) if keep else y


class WNConv1d(nn.Module):
    """Conv1d (or ConvTranspose1d) with legacy weight-norm parameters `weight_g`, `weight_v` and optional bias."""

    def __init__(self, c_in: int, c_out: int, kernel: int, *, stride: int = 1, padding: int = 0, dilation: int = 1,
                 bias: bool = True, transposed: bool = False):
        super().__init__()
        self.stride, self.padding, self.dilation, self.transposed = stride, padding, dilation, transposed
        shape = (c_in, c_out, kernel) if transposed else (c_out, c_in, kernel)
        self.weight_g = nn.Parameter(torch.ones(shape[0], 1, 1), requires_grad=False)
        self.weight_v = nn.Parameter(torch.zeros(shape), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(c_out), requires_grad=False) if bias else None

    def weight(self) -> torch.Tensor:
        return torch._weight_norm(self.weight_v, self.weight_g, 0)

    def forward(self, x: torch.Tensor, bias: bool = True) -> torch.Tensor:
        """x [B, c_in, L] → [B, c_out, L']; `bias=False` leaves the bias out (the caller adds it, e.g. a folded
        snake)."""
        b = self.bias if bias else None
        if self.transposed:
            return F.conv_transpose1d(x, self.weight(), b, self.stride, self.padding)
        return F.conv1d(x, self.weight(), b, self.stride, self.padding, self.dilation)


class ResidualUnit(nn.Module):
    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.layers = nn.Sequential(SnakeBeta(channels),
                                    WNConv1d(channels, channels, 7, dilation=dilation, padding=3 * dilation),
                                    SnakeBeta(channels), WNConv1d(channels, channels, 1))

    def forward(self, x):
        return x + self.layers(x)


class DecoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.layers = nn.Sequential(
            SnakeBeta(c_in),
            WNConv1d(c_in, c_out, 2 * stride, stride=stride, padding=math.ceil(stride / 2), transposed=True),
            ResidualUnit(c_out, 1), ResidualUnit(c_out, 3), ResidualUnit(c_out, 9))

    def forward(self, x):
        return self.layers(x)


class _Decoder(nn.Module):
    def __init__(self, cfg: VAEConfig):
        super().__init__()
        layers = [WNConv1d(cfg.latent_dim, cfg.first_channels, 7, padding=3)]
        layers += [DecoderBlock(ci, co, s) for ci, co, s in cfg.blocks]
        last = cfg.blocks[-1][1]
        layers += [SnakeBeta(last), WNConv1d(last, cfg.out_channels, 7, padding=3, bias=False)]
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x)

    def foldable(self) -> bool:
        """Whether `forward_folded` knows this tree: exactly the classes built here (no subclass, no other
        layout)."""
        layers = list(self.layers)
        if len(layers) < 3 or type(layers[0]) is not WNConv1d or layers[0].transposed:
            return False
        if type(layers[-2]) is not SnakeBeta or type(layers[-1]) is not WNConv1d:
            return False
        for block in layers[1:-2]:
            parts = list(getattr(block, "layers", ()))
            if (type(block) is not DecoderBlock or len(parts) < 2 or type(parts[0]) is not SnakeBeta
                    or type(parts[1]) is not WNConv1d):
                return False
            for unit in parts[2:]:
                inner = list(getattr(unit, "layers", ()))
                if type(unit) is not ResidualUnit or [type(m) for m in inner] != [SnakeBeta, WNConv1d, SnakeBeta,
                                                                                   WNConv1d]:
                    return False
        return True

    def forward_folded(self, x: torch.Tensor, kernel: bool) -> torch.Tensor:
        """`forward` with every convolution bias, and every residual add, carried into the snake that follows:
        each biased convolution runs without its bias and the next snake computes residual + (conv + bias) first
        (`SnakeBeta.folded`), writing that sum out only where a residual unit needs its input again. Saves the
        separate bias-add kernel PyTorch runs after a cuDNN convolution and the residual-add kernels (on an H200
        43 + 18 elementwise passes per tile, issue 18). Same additions in the same order as `forward` on a GPU;
        on the CPU, where the convolution adds its bias inside, the two differ by fp32 rounding. `kernel`: the
        fused Triton snake, else torch ops. Needs `foldable()`."""
        layers = list(self.layers)
        h, bias, res = layers[0](x, bias=False), layers[0].bias, None
        for block in layers[1:-2]:
            first, up, *units = block.layers
            y = first.folded(h, bias, res, keep=False, kernel=kernel)
            del h, res  # each activation is dropped once read: at most three of a block's size alive at a time
            h, bias, res = up(y, bias=False), up.bias, None
            del y
            for unit in units:
                s1, c7, s2, c1 = unit.layers
                x_in, y = s1.folded(h, bias, res, keep=True, kernel=kernel)
                del h, res
                t = c7(y, bias=False)
                del y
                y = s2.folded(t, c7.bias, kernel=kernel)
                del t
                h, bias, res = c1(y, bias=False), c1.bias, x_in
                del y, x_in
        return layers[-1](layers[-2].folded(h, bias, res, kernel=kernel))


def _upsampled(n: int, stride: int) -> int:
    """Length after a decoder block's transposed convolution (kernel 2s, stride s, padding ⌈s/2⌉) on n samples."""
    return (n - 1) * stride - 2 * math.ceil(stride / 2) + 2 * stride


def output_length(frames: int, cfg: VAEConfig) -> int:
    """Samples produced for T frames by the reference decoder (1920·T − 64 for the release strides)."""
    n = frames
    for _, _, s in cfg.blocks:
        n = _upsampled(n, s)
    return n


def snake_lengths(frames: int, cfg: VAEConfig) -> list:
    """The length T (samples along time) of every SnakeBeta call when `decode` runs on `frames` latent frames, in
    call order: each block's first snake at its input length, its three residual units' two snakes each at its
    output length, the last snake at the decoder's output length. Every T is an affine function of `frames` with
    integer coefficients (`output_length`'s per-block map), so T mod 16 — what the fused snake kernel's Triton
    specialisation sees (`fast.fused.snake`: C, T divisible by 16 or equal to 1) — depends only on frames mod 16
    (`warmup.vae_short_tiles`)."""
    n, out = frames, []
    for _, _, s in cfg.blocks:
        out.append(n)
        n = _upsampled(n, s)
        out += [n] * 6
    out.append(n)
    return out


def length_trim(cfg: VAEConfig) -> int:
    """c in "T frames decode to hop·T − c samples" (64 for the release's strides in their order 6·5·4·4·2·2; the
    same strides in another order give another c). Each block maps n to s·n − k, so the decoder is affine in T and
    one frame tells c."""
    return cfg.hop - output_length(1, cfg)


@contextlib.contextmanager
def strict_fp32(benchmark: bool | None = None):
    """Disable TF32 for matmuls and cuDNN convolutions inside the block only, restoring the caller's settings.
    `benchmark`: cuDNN's algorithm search for the block (None: the caller's setting)."""
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    bench = torch.backends.cudnn.benchmark if benchmark is None else bool(benchmark)
    try:
        with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=False,
                                        benchmark=bench,
                                        deterministic=torch.backends.cudnn.deterministic):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul


_COPY_STREAMS: dict = {}


def _copy_stream(device) -> "torch.cuda.Stream":
    """One side stream per device for the tiles' copies to the CPU (overlapping the next tile's kernels)."""
    key = str(device)
    if key not in _COPY_STREAMS:
        _COPY_STREAMS[key] = torch.cuda.Stream(device)
    return _COPY_STREAMS[key]


class VAEDecoder(nn.Module):
    """The `vae.decoder` tree (keys under `vae.` minus the encoder). Always fp32.

    Class-wide switches (the benchmark flips them; None = the default): `fold_bias` — convolution biases and
    residual adds carried into the next snake (`_Decoder.forward_folded`); None = on where the fused Triton snake
    runs (CUDA), True = also with torch ops (CPU), False = never. `cudnn_benchmark` — cuDNN's algorithm search for
    the decode (False by default: the first tile of every new shape would pay for the search, and the chosen
    algorithms may differ from run to run in fp32 rounding). TF32 stays off either way."""

    fold_bias: bool | None = None
    cudnn_benchmark: bool = False

    def __init__(self, cfg: VAEConfig):
        super().__init__()
        self.cfg = cfg
        self.decoder = _Decoder(cfg)

    @property
    def device(self) -> torch.device:
        return self.decoder.layers[0].weight_v.device

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents [B, 64, T] → raw audio [B, 2, 1920·T − 64] fp32 (unclipped), on the VAE's device."""
        x = latents.to(device=self.device, dtype=torch.float32)
        with strict_fp32(VAEDecoder.cudnn_benchmark or None):
            fold = VAEDecoder.fold_bias
            kernel = SnakeBeta.kernel_for(x)
            if (fold or (fold is None and kernel)) and self.decoder.foldable():
                return self.decoder.forward_folded(x, kernel=kernel)
            return self.decoder(x)

    @torch.inference_mode()
    def decode_tiled(self, latents: torch.Tensor, core: int = 1024, halo: int = VAE_HALO_FRAMES,
                     on_tile=None) -> torch.Tensor:
        """Halo-crop tiled decode (runtime.md §6.3): for each core tile [s, s+core) decode frames
        [s−halo, s+core+halo) and keep its samples. Equals `decode` up to fp32 rounding. latents [B, 64, T] →
        audio [B, 2, 1920·T − 64] on the CPU. `on_tile(done, total)` may raise to cancel. On CUDA each tile's samples
        go to pinned CPU memory on a side stream while the next tile computes (no host wait per tile); the call
        returns once every copy is done."""
        if core < 1 or halo < 0:
            raise ValueError(f"core must be ≥ 1 and halo ≥ 0 frames, got core={core}, halo={halo}")
        b, _, t = latents.shape
        hop = self.cfg.hop
        total = output_length(t, self.cfg)
        latents = latents.to(device=self.device, dtype=torch.float32)  # one upload (a few MB), not one per tile
        cuda = latents.is_cuda
        with torch.inference_mode(False):  # a normal tensor: `to_waveform` clips it in place, callers may too
            out = torch.empty(b, self.cfg.out_channels, total, dtype=torch.float32, pin_memory=cuda)
        copies = _copy_stream(self.device) if cuda else None
        starts = list(range(0, t, core))
        try:
            for i, start in enumerate(starts):
                end = min(t, start + core)
                left, right = max(0, start - halo), min(t, end + halo)
                piece = self.decode(latents[:, :, left:right])
                keep_from = (start - left) * hop
                count = min(end * hop, total) - start * hop
                if cuda:  # one contiguous row per (batch, channel): a plain asynchronous copy into pinned memory
                    copies.wait_stream(torch.cuda.current_stream(self.device))
                    with torch.cuda.stream(copies):
                        for row in range(b):
                            for ch in range(self.cfg.out_channels):
                                out[row, ch, start * hop:start * hop + count].copy_(
                                    piece[row, ch, keep_from:keep_from + count], non_blocking=True)
                    piece.record_stream(copies)  # its memory is not reused before the copy has read it
                else:
                    out[:, :, start * hop:start * hop + count] = piece[:, :, keep_from:keep_from + count]
                del piece
                if on_tile is not None:
                    on_tile(i + 1, len(starts))
        finally:
            if cuda:
                copies.synchronize()
        return out


def to_waveform(audio: torch.Tensor) -> torch.Tensor:
    """Post-processing of the reference pipeline: reject non-finite audio (NumericalError), hard-clip to [−1, 1].
    A float32 `audio` is clipped in place and returned (a song's decode output is 80 MB: a fresh copy costs more
    in page faults than the clipping); other dtypes are converted first. The check is one pass of `aminmax` (NaN
    and ±inf reach the minimum or maximum) instead of a boolean tensor the size of the audio."""
    lo, hi = torch.aminmax(audio)
    if not (torch.isfinite(lo) and torch.isfinite(hi)):
        from .errors import NumericalError
        raise NumericalError("the VAE produced non-finite audio (NaN/inf): the VAE weights look damaged — "
                             "download the checkpoint again")
    audio = audio.float()
    with torch.inference_mode(audio.is_inference()):  # decode_tiled's output is an inference tensor
        return audio.clamp_(-1.0, 1.0)


__all__ = ["VAEConfig", "VAEDecoder", "output_length", "to_waveform", "LATENT_DIM", "HOP"]
