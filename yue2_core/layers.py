"""Transformer building blocks shared by the AR and NAR experts (runtime.md §4.2), with the reference's exact
rounding order. Parameter names follow the checkpoint keys (`self_attn.qkv_proj.weight`, `mlp.gate_up_proj.weight`,
…) so weight patches keyed like the file apply directly.

Shapes: B batch rows, T tokens, H hidden, nh query heads, nkv key/value heads, D head dim (128 in the release).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .weights.quant import ConvRotLinear, ConvRotEmbedding


@dataclass(frozen=True)
class ModelDims:
    """Transformer geometry, read from tensor shapes (never assumed). Release: hidden 2048, 28 layers, 16 q / 8 kv
    heads of 128, FFN 6144, vocab 184,704, latent 64, time frequencies 256, pe rows 24,576 (runtime.md §4.1)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    latent_dim: int = 64
    time_freq: int = 256
    pe_rows: int = 24576
    rope_theta: float = 1_000_000.0  # runtime.md §4.1 (not stored in the Comfy file)
    eps: float = 1e-6  # runtime.md §4.1 rms_norm_eps


def make_linear(in_f: int, out_f: int, *, bias: bool, quant_group: int | None, dtype) -> nn.Module:
    """nn.Linear in `dtype`, or a ConvRotLinear over int8 codes when the checkpoint quantizes this module."""
    if quant_group:
        return ConvRotLinear(in_f, out_f, bias=bias, group=quant_group, dtype=dtype)
    return nn.Linear(in_f, out_f, bias=bias, dtype=dtype)


def make_embedding(num: int, dim: int, *, quant_group: int | None, dtype) -> nn.Module:
    """nn.Embedding [num, dim] in `dtype` with its table left uninitialised (the checkpoint fills it), or a
    ConvRotEmbedding over int8 codes. No random init: `nn.Embedding`'s normal_ on the meta device (where the
    models are built, `weights.checkpoint.load_ar`) goes through a PyTorch reference that imports torch._dynamo —
    about 2 s of every start on a CPU."""
    if quant_group:
        return ConvRotEmbedding(num, dim, group=quant_group, dtype=dtype)
    return nn.Embedding(num, dim, dtype=dtype, _weight=torch.empty(num, dim, dtype=dtype))


class RMSNorm(nn.Module):
    """y = (x · rsqrt(mean(x²) + eps)) · w, with the mean of squares in fp32, the rsqrt cast back to x's dtype and
    both multiplies in x's dtype (bf16) — the reference order, not HF Qwen3's (runtime.md §4.2)."""

    def __init__(self, dim: int, eps: float = 1e-6, dtype=torch.bfloat16):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype)
        return x * r * self.weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables for integer positions [..., T]: cos/sin [..., T, D/2] in fp32.
    inv_freq[i] = 1 / θ^(2i/D) and angles position·inv_freq both in fp32 (runtime.md §4.2)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device)
                                / head_dim))
    angles = positions.float().unsqueeze(-1) * inv_freq
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Split-half (NeoX/Qwen) rotation of x [B, T, heads, D] with cos/sin [B or 1, T, 1, D/2] cast to x's dtype:
    [x1·cos − x2·sin, x2·cos + x1·sin], x1 = dims 0…D/2−1, x2 = the rest."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    """Fused q‖k‖v projection (rows q nh·D, k nkv·D, v nkv·D), per-head QK-norm before RoPE, output o_proj."""

    def __init__(self, dims: ModelDims, quant: dict, prefix: str, dtype):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = dims.heads, dims.kv_heads, dims.head_dim
        q_rows, kv_rows = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
        self.split = (q_rows, kv_rows, kv_rows)
        self.qkv_proj = make_linear(dims.hidden, q_rows + 2 * kv_rows, bias=False,
                                    quant_group=quant.get(prefix + "qkv_proj"), dtype=dtype)
        self.o_proj = make_linear(q_rows, dims.hidden, bias=False, quant_group=quant.get(prefix + "o_proj"),
                                  dtype=dtype)
        self.q_norm = RMSNorm(dims.head_dim, dims.eps, dtype)
        self.k_norm = RMSNorm(dims.head_dim, dims.eps, dtype)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, H] (already normed) → q [B, T, nh, D], k [B, T, nkv, D] (QK-normed, rotated), v [B, T, nkv, D].
        cos/sin [B or 1, T, D/2]."""
        b, t, _ = x.shape
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = self.q_norm(q.view(b, t, self.heads, self.head_dim))
        k = self.k_norm(k.view(b, t, self.kv_heads, self.head_dim))
        v = v.view(b, t, self.kv_heads, self.head_dim)
        rc, rs = cos.unsqueeze(2), sin.unsqueeze(2)
        return apply_rope(q, rc, rs), apply_rope(k, rc, rs), v


class MLP(nn.Module):
    """SwiGLU with fused gate‖up rows: down(silu(gate(x)) · up(x))."""

    def __init__(self, dims: ModelDims, quant: dict, prefix: str, dtype):
        super().__init__()
        self.ffn = dims.ffn
        self.gate_up_proj = make_linear(dims.hidden, 2 * dims.ffn, bias=False,
                                        quant_group=quant.get(prefix + "gate_up_proj"), dtype=dtype)
        self.down_proj = make_linear(dims.ffn, dims.hidden, bias=False, quant_group=quant.get(prefix + "down_proj"),
                                     dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.ffn, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    """One decoder layer of either expert: input_layernorm → self_attn; post_attention_layernorm → mlp.
    (In the NAR tree `post_attention_layernorm` is the upstream `nar_pre_mlp_layernorm`.)"""

    def __init__(self, dims: ModelDims, quant: dict, prefix: str, dtype):
        super().__init__()
        self.input_layernorm = RMSNorm(dims.hidden, dims.eps, dtype)
        self.self_attn = Attention(dims, quant, prefix + "self_attn.", dtype)
        self.post_attention_layernorm = RMSNorm(dims.hidden, dims.eps, dtype)
        self.mlp = MLP(dims, quant, prefix + "mlp.", dtype)


UNMASKED_BACKENDS = ("gqa", "fa3", "cudnn", "flash", "efficient", "math")
# the backends with no CPU kernel (PyTorch's flash and math kernels, and its GQA call, run on the CPU too): named for a
# model on the CPU they are not tried — the NAR uses "gqa" (`nar.attention_backend`), and the switch check says so
# before the work (`switch_check.check_environment`; was: a UserWarning from `_fall_back` mid-run, stop-53 review)
CUDA_ONLY_BACKENDS = ("fa3", "cudnn", "efficient")
_BACKEND_FAILED: dict = {}


def unmasked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "gqa") -> torch.Tensor:
    """Attention without a mask (the NAR's: every query sees every key), scale 1/√D.

    q [B, H, T, D], k/v [B, KV, S, D] with H = KV·G (query head h reads kv head h // G) → [B, H, T, D] in q's dtype.
    `backend` "gqa": `F.scaled_dot_product_attention(..., enable_gqa=True)`, PyTorch choosing the kernel (cuDNN's on
    an H200 with torch 2.11). "cudnn" / "flash" / "efficient" / "math": the G query heads of each kv head are stacked
    along the query axis (q viewed as [B, KV, G·T, D]) and plain multi-head attention runs with that SDPA backend —
    exact, since without a mask every query row is independent, and no K/V copy is made (backends without GQA
    support apply). "fa3": FlashAttention-3's Hopper kernel from an optional package (`fast.flash_attn`: fa3-fwd,
    flash-attn-4 or a flash-attention hopper/ build), native GQA, q/k/v passed as transposed views.
    A backend that cannot run (fa3: no package, not a Hopper GPU, another dtype) or fails on the inputs (SDPA: a
    RuntimeError such as "No available kernel", cuDNN attention on a GPU or cuDNN build without it; fa3: any
    exception) is reported once with a warning and the "gqa" call is used instead — for every later call with the
    same backend, device, dtype and head size (`_BACKEND_FAILED`). Out-of-memory errors propagate, and so does any
    error raised while a CUDA graph is being captured (the graph's owner falls back to eager evaluation).
    Raises ValueError for H not a multiple of KV or an unknown backend."""
    b, h, t, d = q.shape
    kv = k.shape[1]
    if h % kv:
        raise ValueError(f"{h} query heads cannot share {kv} key/value heads")
    key = (backend, str(q.device), q.dtype, d)
    if backend == "gqa" or key in _BACKEND_FAILED:
        return sdpa(q, k, v, causal=False)
    if backend not in UNMASKED_BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; one of {', '.join(UNMASKED_BACKENDS)}")
    if backend == "fa3":
        from .fast import flash_attn
        reason = flash_attn.unusable(q, k)
        if reason is not None:
            return _fall_back(key, reason, q, k, v)
        try:
            return flash_attn.attention(q, k, v)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # third-party code: asserts, its compiler's own exception classes, RuntimeError
            if _capturing(q):  # a capture problem, not the kernel's: the renderer falls back to eager
                raise
            from .errors import brief
            return _fall_back(key, brief(exc), q, k, v)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    kind = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
    folded = q.reshape(b, kv, (h // kv) * t, d)
    try:
        with sdpa_kernel([kind]):
            out = F.scaled_dot_product_attention(folded, k, v)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as exc:  # "No available kernel", or the backend rejecting these shapes
        if _capturing(q):
            raise
        from .errors import brief
        return _fall_back(key, brief(exc), q, k, v)
    return out.reshape(b, h, t, d)


def _capturing(q: torch.Tensor) -> bool:
    """Whether q's device is capturing a CUDA graph on the current stream: an error then belongs to the capture (the
    caller falls back to eager evaluation), and marking the backend failed or launching another kernel into the
    broken capture would be wrong."""
    return q.is_cuda and torch.cuda.is_current_stream_capturing()


def _fall_back(key: tuple, reason: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Record why backend key[0] cannot serve (key = backend, device, dtype, head size), warn once, run the GQA call."""
    import warnings
    _BACKEND_FAILED[key] = reason
    warnings.warn(f"attention backend {key[0]!r} unavailable for the NAR attention on {key[1]} ({reason}); "
                  "using PyTorch's default choice")
    return sdpa(q, k, v, causal=False)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
         mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention over [B, heads, T, D] tensors with native GQA (query head h reads kv head h // group), scale 1/√D.
    `mask`: optional boolean [T, S] (True = attend), e.g. causal queries after cached keys."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          enable_gqa=q.shape[1] != k.shape[1])
