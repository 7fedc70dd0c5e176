"""In-memory adapters for tests and benchmarks: a LowRank patch on every layer linear of the chosen experts, the
ai-toolkit way (one A per fused module), without going through a file layout."""
from __future__ import annotations

import torch

from yue2_core.weights.lora.model import Adapter, LowRank, Patch

LEAVES = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def shapes(dims) -> dict:
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    return {"self_attn.qkv_proj": (q + 2 * kv, dims.hidden), "self_attn.o_proj": (dims.hidden, q),
            "mlp.gate_up_proj": (2 * dims.ffn, dims.hidden), "mlp.down_proj": (dims.hidden, dims.ffn)}


def random_adapter(dims, rank: int = 8, experts=("ar", "nar"), seed: int = 0, std: float = 0.02,
                   dtype=torch.bfloat16, device="cpu") -> Adapter:
    """A rank-`rank` LoRA on qkv/o/gate_up/down of every layer of `experts`, A ~ N(0, std) and B ~ N(0, std)·√(in/r)
    (a delta of the order of the weights' own N(0, 0.02)), scale 1."""
    g = torch.Generator(device=device).manual_seed(seed)
    patches = []
    for expert in experts:
        for i in range(dims.layers):
            for leaf, (out, inp) in shapes(dims).items():
                down = (torch.randn(rank, inp, generator=g, device=device) * std).to(dtype)
                up = (torch.randn(out, rank, generator=g, device=device) * std).to(dtype)
                patches.append(Patch(expert, f"model.layers.{i}.{leaf}", LowRank(down, up, 1.0)))
    return Adapter(path=f"random-r{rank}", layout="in-memory", patches=patches, scale_rule="1")
