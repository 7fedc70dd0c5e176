"""The AR expert (runtime.md §4): a Qwen3-shaped causal LM over text, ABC and semantic codec tokens.

Module tree = checkpoint keys under `text_encoders.`: `model.embed_tokens`, `model.layers.{i}.…`, `model.norm`,
`model.lm_head`. Stages: `prefill` (one causal forward over a prompt into a preallocated `KVCache`) and `decode`
(one token per row), each returning last-position logits [B, vocab]. `layer_kv` returns every layer's K/V for the
NAR's per-chunk prefill (runtime.md §5.3).
"""
from __future__ import annotations

import torch
from torch import nn

from .layers import Block, ModelDims, RMSNorm, make_embedding, make_linear, rope_cos_sin, sdpa


class KVCache:
    """Append-only static cache: per layer K and V of shape [B, nkv, capacity, D] (zero-initialised).
    `update` writes slots [length, length+T) and returns views of [0, length+T); `length` advances after the last
    layer. Raises ValueError when the capacity would be exceeded (generation is never shortened silently)."""

    def __init__(self, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int, dtype, device):
        self.layers, self.capacity, self.length = layers, capacity, 0
        shape = (batch, kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v [B, nkv, T, D] at positions [length, length+T) of `layer`; returns K, V views
        [B, nkv, length+T, D]. Raises ValueError when length+T exceeds the capacity."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"KV cache capacity {self.capacity} exceeded ({end} positions)")
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        if layer == self.layers - 1:
            self.length = end
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


class _Backbone(nn.Module):
    def __init__(self, dims: ModelDims, quant: dict, dtype):
        super().__init__()
        self.embed_tokens = make_embedding(dims.vocab, dims.hidden, quant_group=quant.get("model.embed_tokens"),
                                           dtype=dtype)
        self.layers = nn.ModuleList(Block(dims, quant, f"model.layers.{i}.", dtype) for i in range(dims.layers))
        self.norm = RMSNorm(dims.hidden, dims.eps, dtype)
        self.lm_head = make_linear(dims.hidden, dims.vocab, bias=False, quant_group=quant.get("model.lm_head"),
                                   dtype=dtype)


class ARModel(nn.Module):
    """AR expert. `dims` from the checkpoint; `quant` maps module names (e.g. "model.layers.0.self_attn.qkv_proj")
    to a ConvRot group size for int8 files; `dtype` is the compute dtype of float weights and activations."""

    def __init__(self, dims: ModelDims, quant: dict | None = None, dtype=torch.bfloat16):
        super().__init__()
        self.dims = dims
        self.model = _Backbone(dims, quant or {}, dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty KVCache for `batch` rows of `capacity` positions in the model's dtype and device."""
        d = self.dims
        return KVCache(d.layers, batch, d.kv_heads, capacity, d.head_dim, self.dtype, self.device)

    def hidden(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run all layers over ids [B, T] at cache positions [cache.length, cache.length+T); returns the last
        hidden states [B, T, H] before the final norm. T > 1 with an empty cache is a causal prefill; T == 1 attends
        to every cached position (no mask), as the reference's eager path; T > 1 after cached positions (a prompt
        continuing a cached prefix, as the GPU decoder's shared prefixes do) attends causally with an explicit mask."""
        b, t = ids.shape
        start = cache.length
        positions = torch.arange(start, start + t, device=ids.device)[None]
        cos, sin = rope_cos_sin(positions, self.dims.head_dim, self.dims.rope_theta)
        x = self.model.embed_tokens(ids)
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        causal = t > 1 and start == 0
        mask = None
        if t > 1 and start > 0:  # query i (position start + i) sees keys 0 … start + i
            mask = torch.arange(start + t, device=ids.device)[None, :] <= positions[0, :, None]
        for i, layer in enumerate(self.model.layers):
            q, k, v = layer.self_attn.project(layer.input_layernorm(x), cos, sin)
            k_all, v_all = cache.update(i, k.transpose(1, 2), v.transpose(1, 2))
            h = sdpa(q.transpose(1, 2), k_all, v_all, causal=causal, mask=mask)
            x = x + layer.self_attn.o_proj(h.transpose(1, 2).reshape(b, t, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: hidden [..., H] → logits [..., vocab] in the model dtype."""
        return self.model.lm_head(self.model.norm(hidden))

    def prefill(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """ids [B, T] into an empty cache → logits of the last position [B, vocab]."""
        return self.logits(self.hidden(ids, cache)[:, -1])

    def decode(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One token per row, ids [B, 1] → next-token logits [B, vocab]."""
        return self.logits(self.hidden(ids, cache)[:, -1])

    @torch.inference_mode()
    def layer_kv(self, ids: list[int] | torch.Tensor, extra: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Causal pass over one sequence of A tokens (RoPE positions 0 … A−1); returns per layer (K, V), each
        [1, nkv, A + extra, D] with positions [0, A) filled (K after QK-norm and RoPE, V raw) and `extra` free slots
        (the NAR writes its own K/V there). The final norm and LM head are skipped (runtime.md §5.3)."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device).reshape(1, -1)
        cache = self.new_cache(1, ids.shape[1] + extra)
        self.hidden(ids, cache)
        return list(zip(cache.k, cache.v))
