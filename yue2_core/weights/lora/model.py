"""What a LoRA-style adapter file says, in one form for every layout (weights_and_lora.md §1).

A layout parser (`layouts.py`) turns a file into an `Adapter`: a list of `Patch`es, each aimed at one module of one
expert by its engine name (the checkpoint key without the part prefix and without `.weight`), e.g.
`model.layers.3.self_attn.qkv_proj` of the AR (`text_encoders.model.layers.3.self_attn.qkv_proj.weight` in the
all-in-one file), `vae2llm` or `time_embedder.mlp.0` of the NAR (`model.diffusion_model.vae2llm.weight`). A split
q/k/v or gate/up key becomes a patch of the fused module with `rows` = (first row, row count) (§1.3):
q (0, heads·head_dim), k (heads·head_dim, kv), v (heads·head_dim + kv, kv) with kv = kv_heads·head_dim,
gate (0, ffn), up (ffn, ffn). The applier (`apply.py`) adds every patch as
`W[rows] += strength · delta` where `strength` is the user's per-expert strength and `delta` already holds the
layout's scale (alpha/rank, metadata alpha/rank, sidecar lora_alpha/r or /√r, or 1: §1.2); a `Replace` sets the
weight first and the deltas add to it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

EXPERTS = ("ar", "nar")


@dataclass
class LowRank:
    """ΔW = scale · up @ down: down (A) [r, in], up (B) [rows, r], tensors as stored in the file (any float dtype)."""
    down: torch.Tensor
    up: torch.Tensor
    scale: float

    @property
    def rank(self) -> int:
        return int(self.down.shape[0])

    def dense(self, dtype=torch.float64) -> torch.Tensor:
        return (self.up.to(dtype) @ self.down.to(dtype)) * self.scale


@dataclass
class Kron:
    """ΔW = scale · kron(w1, w2) (LoKr, §1.1 E): w1 [a, b], w2 [c, d] with a·c = rows, b·d = in."""
    w1: torch.Tensor
    w2: torch.Tensor
    scale: float

    @property
    def rank(self) -> int:
        return int(min(self.w1.shape) * min(self.w2.shape))

    def dense(self, dtype=torch.float64) -> torch.Tensor:
        return torch.kron(self.w1.to(dtype), self.w2.to(dtype)) * self.scale


@dataclass
class Diff:
    """ΔW = scale · delta [rows, in] (a `.diff` full-rank difference)."""
    delta: torch.Tensor
    scale: float = 1.0

    @property
    def rank(self) -> int:
        return int(min(self.delta.shape))

    def dense(self, dtype=torch.float64) -> torch.Tensor:
        return self.delta.to(dtype) * self.scale


@dataclass
class BiasDiff:
    """Δb = scale · delta [rows] (`.diff_b`)."""
    delta: torch.Tensor
    scale: float = 1.0


@dataclass
class Replace:
    """The module's weight (and bias, when given) replaced outright — Mothersuperior's `vae2llm` / `llm2vae`
    (§1.1 F): applied at full strength whatever the strength, unless the strength is 0, which disables it. It is
    applied before every delta on the same module, which then adds to it (whatever the order of the stack)."""
    weight: torch.Tensor
    bias: torch.Tensor | None = None


@dataclass
class Patch:
    """One change to one module. `expert` "ar" | "nar"; `module` the engine module name (see the module docstring);
    `rows` (start, count) of a fused weight, or None for all rows; `keys` the file keys it came from; `source` the
    file it was read from when that is not the adapter's own weights file (an FL AR file's NAR companion), else
    None."""
    expert: str
    module: str
    delta: LowRank | Kron | Diff | BiasDiff | Replace
    rows: tuple[int, int] | None = None
    keys: tuple[str, ...] = ()
    source: str | None = None


@dataclass
class Adapter:
    """A parsed adapter file. `layout` a short id (e.g. "ai-toolkit", "comfy-native", "peft"); `scale_rule` says in
    words where the scale came from ("alpha tensor / rank", "metadata alpha/rank", "adapter_config.json
    lora_alpha/r", "1 (no alpha)", …) and `scales` the distinct values it gave; `unmatched` every file key that
    matched no module (never dropped silently: the report lists them); `files` every file read (the adapter and
    companions such as adapter_config.json or an FL NAR file); `notes` warnings of the reading the caller shows (a
    file whose expert could not be told: `layouts.unsaid_expert_note`; metadata naming the other expert:
    `layouts.other_expert_note`)."""
    path: str
    layout: str
    patches: list[Patch]
    scale_rule: str
    scales: list[float] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def ranks(self) -> dict:
        """expert → sorted distinct ranks of its LowRank/Kron patches."""
        out: dict = {}
        for p in self.patches:
            if isinstance(p.delta, (LowRank, Kron)):
                out.setdefault(p.expert, set()).add(p.delta.rank)
        return {k: sorted(v) for k, v in out.items()}

    def modules(self, expert: str) -> list[str]:
        return sorted({p.module for p in self.patches if p.expert == expert})

    def replacements(self) -> list[str]:
        return sorted({f"{p.expert}:{p.module}" for p in self.patches if isinstance(p.delta, Replace)})
