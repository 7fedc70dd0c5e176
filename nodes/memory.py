"""Working-memory estimates (bytes) that each stage passes to ComfyUI's `load_models_gpu(memory_required=...)`, so
ComfyUI frees (offloads) other models before the stage instead of running out of memory inside it. Weights are not
included: ComfyUI adds the size of the models it loads. Pure arithmetic over `ModelDims` / `VAEConfig`."""
from __future__ import annotations

from yue2_core.constants import LATENT_DIM
from yue2_core.nar import chunk_ranges

MiB = 2 ** 20
SAMPLER_CANDIDATES = 128  # top-k candidates (+ tie padding) the sampler keeps per row and step, fp32
# What a CUDA stage needs on top of its tensors: cuBLAS/cuBLASLt workspaces, CUDA-graph pools, Triton scratch.
# Measured on an H200 through these nodes: 220–400 MiB for the tiny and the full-size model alike.
CUDA_OVERHEAD = 384 * MiB


def dtype_bytes(dtype) -> int:
    return getattr(dtype, "itemsize", 2)


def kv_bytes_per_position(dims, dtype) -> int:
    """K and V of every layer for one position of one row: 2 · layers · kv_heads · head_dim · dtype bytes."""
    return 2 * dims.layers * dims.kv_heads * dims.head_dim * dtype_bytes(dtype)


def _layer_activations(dims, dtype, positions: int) -> int:
    """Live tensors of one transformer layer over `positions` tokens: q‖k‖v, attention output, gate‖up, the SwiGLU
    product and two residual-stream copies (one layer at a time: layers run sequentially)."""
    qkv = (dims.heads + 2 * dims.kv_heads) * dims.head_dim
    per_token = qkv + dims.heads * dims.head_dim + 3 * dims.ffn + 2 * dims.hidden
    return positions * per_token * dtype_bytes(dtype)


def ar_phase(dims, dtype, prefix_tokens: int, max_tokens: int, rows: int = 1, on_cuda: bool = False) -> int:
    """One AR phase (planning or music): the static KV cache for prefix + budget positions per row (rows = 2 with
    CFG), the prefill activations of the longest prefix, the logits and sampler buffers (+ CUDA_OVERHEAD)."""
    kv = kv_bytes_per_position(dims, dtype) * (prefix_tokens + max_tokens) * rows
    prefill = _layer_activations(dims, dtype, prefix_tokens)
    logits = rows * dims.vocab * 4 * 4  # fp32 logits + penalty / mask / sort temporaries
    sampler = max_tokens * rows * SAMPLER_CANDIDATES * 4 + max_tokens * rows * 8
    return kv + prefill + logits + sampler + (CUDA_OVERHEAD if on_cuda else 0)


def render(dims, dtype, prefix_tokens: int, frames: int, on_cuda: bool) -> int:
    """The NAR render of the largest chunk: the AR K/V of prefix + chunk codes (every layer, kept for all ODE steps),
    the NAR's own layer activations over chunk + 2 frames, and, off CUDA (no fused attention), the attention score
    matrix of one layer."""
    chunk = max(b - a for a, b in chunk_ranges(frames, prefix_tokens))
    ar_positions = prefix_tokens + chunk + 1
    ar_kv = kv_bytes_per_position(dims, dtype) * ar_positions
    prefill = _layer_activations(dims, dtype, ar_positions)
    nar = _layer_activations(dims, dtype, chunk + 2) + kv_bytes_per_position(dims, dtype) // dims.layers * (chunk + 2)
    scores = 0 if on_cuda else dims.heads * (chunk + 2) * (ar_positions + chunk + 2) * 4
    ode = chunk * LATENT_DIM * 4 * 6  # state, noise, two velocities, midpoint, output (fp32)
    return ar_kv + max(prefill, nar + scores) + ode + (CUDA_OVERHEAD if on_cuda else 0)


def vae_bytes_per_frame(cfg) -> int:
    """fp32 activations of the VAE decoder per latent frame at its widest point: a block's input plus six live
    tensors of its upsampled output (residual input, snake temporaries, convolution output). Measured on the CPU
    with the release VAE config: 2.9 MB per frame marginal; this gives 3.05 MB."""
    rate, peak = 1, cfg.latent_dim + cfg.first_channels
    for c_in, c_out, stride in cfg.blocks:
        peak = max(peak, c_in * rate + 6 * c_out * rate * stride)
        rate *= stride
    peak = max(peak, 2 * cfg.blocks[-1][1] * rate + cfg.out_channels * rate)
    return peak * 4


def vae_fixed_bytes(cfg) -> int:
    """Per-call memory that does not grow with the tile: the weight-normalised copy of the largest convolution
    (weight = g · v / ‖v‖ is recomputed in every forward) and its input-gradient-free workspace (≈ 2 copies)."""
    largest = max(c_in * c_out * 2 * stride for c_in, c_out, stride in cfg.blocks)
    return 2 * largest * 4


def vae_tile(cfg, frames: int, core: int, halo: int) -> int:
    """Memory of one halo-crop tile of `core` frames (clipped to the song) plus its halo on both sides."""
    return vae_fixed_bytes(cfg) + vae_bytes_per_frame(cfg) * (min(core, frames) + 2 * halo)
