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
        if x.is_cuda and x.dtype == torch.float32 and SnakeBeta.fused is not False:
            from .fast import fused
            if fused.available():
                return fused.snake(x, self.alpha, self.beta)
        alpha = torch.exp(self.alpha[None, :, None])
        beta = torch.exp(self.beta[None, :, None])
        return x + (1.0 / (beta + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.transposed:
            return F.conv_transpose1d(x, self.weight(), self.bias, self.stride, self.padding)
        return F.conv1d(x, self.weight(), self.bias, self.stride, self.padding, self.dilation)


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


def output_length(frames: int, cfg: VAEConfig) -> int:
    """Samples produced for T frames by the reference decoder (1920·T − 64 for the release strides)."""
    n = frames
    for _, _, s in cfg.blocks:
        n = (n - 1) * s - 2 * math.ceil(s / 2) + 2 * s
    return n


@contextlib.contextmanager
def strict_fp32():
    """Disable TF32 for matmuls and cuDNN convolutions inside the block only, restoring the caller's settings."""
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=False,
                                        benchmark=torch.backends.cudnn.benchmark,
                                        deterministic=torch.backends.cudnn.deterministic):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul


class VAEDecoder(nn.Module):
    """The `vae.decoder` tree (keys under `vae.` minus the encoder). Always fp32."""

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
        with strict_fp32():
            return self.decoder(latents.to(device=self.device, dtype=torch.float32))

    @torch.inference_mode()
    def decode_tiled(self, latents: torch.Tensor, core: int = 1024, halo: int = VAE_HALO_FRAMES,
                     on_tile=None) -> torch.Tensor:
        """Halo-crop tiled decode (runtime.md §6.3): for each core tile [s, s+core) decode frames
        [s−halo, s+core+halo) and keep its samples. Equals `decode` up to fp32 rounding. latents [B, 64, T] →
        audio [B, 2, 1920·T − 64] on the CPU. `on_tile(done, total)` may raise to cancel."""
        if core < 1 or halo < 0:
            raise ValueError(f"core must be ≥ 1 and halo ≥ 0 frames, got core={core}, halo={halo}")
        b, _, t = latents.shape
        hop = self.cfg.hop
        total = output_length(t, self.cfg)
        latents = latents.to(device=self.device, dtype=torch.float32)  # one upload (a few MB), not one per tile
        out = torch.empty(b, self.cfg.out_channels, total, dtype=torch.float32)
        starts = list(range(0, t, core))
        for i, start in enumerate(starts):
            end = min(t, start + core)
            left, right = max(0, start - halo), min(t, end + halo)
            piece = self.decode(latents[:, :, left:right])
            keep_from = (start - left) * hop
            count = min(end * hop, total) - start * hop
            out[:, :, start * hop:start * hop + count] = piece[:, :, keep_from:keep_from + count].cpu()
            if on_tile is not None:
                on_tile(i + 1, len(starts))
        return out


def to_waveform(audio: torch.Tensor) -> torch.Tensor:
    """Post-processing of the reference pipeline: reject non-finite audio, hard-clip to [−1, 1]."""
    if not torch.isfinite(audio).all():
        from .errors import NumericalError
        raise NumericalError("the VAE produced non-finite audio (NaN/inf): the VAE weights look damaged — "
                             "download the checkpoint again")
    return audio.float().clamp(-1.0, 1.0)


__all__ = ["VAEConfig", "VAEDecoder", "output_length", "to_waveform", "LATENT_DIM", "HOP"]
