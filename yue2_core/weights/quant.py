"""int8 "ConvRot" weights of the Comfy-Org int8 checkpoint (checkpoint_format.md §1.5, §2).

A quantized module stores `weight` I8 [out, in] = round(Ŵ / s) with Ŵ = W·H applied to every contiguous group of
`group` (256) input columns, and `weight_scale` F32 [out, 1] = row absmax(Ŵ) / 127. H is the regular Hadamard
matrix (R4 ⊗ R4 ⊗ R4 ⊗ R4) / 16: symmetric and its own inverse, so

    x · Wᵀ = (x·H) · Ŵᵀ            (rotate the activation, multiply by the stored codes — what `ConvRotLinear` does)
    W      = (q·s) · H              (dequantize — what `dequantize` does; the parity fixtures use this form)

Everything here is pure torch; the fast CUDA path (`yue2_core/fast/`) swaps in a fused kernel for the same maths.
"""
from __future__ import annotations

import functools
import json

import torch
import torch.nn.functional as F
from torch import nn

from ..constants import CONVROT_GROUP, CONVROT_MARKER
from ..errors import CheckpointError, DuplicateJSONKey, json_number_too_long, unique_keys

R4 = ((1, 1, 1, -1), (1, 1, -1, 1), (1, -1, 1, 1), (-1, 1, 1, 1))  # regular 4×4 Hadamard (checkpoint_format.md §2.1)


# the largest ConvRot group whose Hadamard matrix is ever built (4^6: a 4,096² matrix, 128 MB in float64 while it is
# made). The release uses 256; a group must also divide the layer's input columns (checked at inspect). A marker
# saying 4^8 or 4^20 had the check build the matrix itself: 34 GB and more (break-it review, stop 44).
MAX_GROUP = 4 ** 6
RELEASE_MARKER = CONVROT_MARKER.decode()  # every quantized module's marker in the Comfy-Org int8 file


def check_group(group: int, key: str = "", limit: bool = True) -> int:
    """`group` when it is a power of 4 from 4 (to MAX_GROUP with `limit`), by arithmetic alone (no matrix is built);
    else CheckpointError naming `key` (the marker) and the value. `parse_marker` leaves the limit to inspect, which
    names the layer's input columns the group must divide."""
    where = f"{key}: " if key else ""
    if group < 4 or group & (group - 1) or (group.bit_length() - 1) % 2:
        raise CheckpointError(f"{where}convrot_groupsize must be a power of 4 (≥ 4); got {group}")
    if limit and group > MAX_GROUP:
        raise CheckpointError(f"{where}convrot_groupsize {group} is larger than any layer's group can be (at most "
                              f"{MAX_GROUP:,}; the Comfy-Org int8 file uses {CONVROT_GROUP}): a damaged or foreign "
                              "quantization marker")
    return group


@functools.lru_cache(maxsize=16)
def _hadamard_cpu(group: int) -> torch.Tensor:
    check_group(group)
    r4 = torch.tensor(R4, dtype=torch.float64)
    h = r4
    while h.shape[0] < group:
        h = torch.kron(h, r4)
    return (h / group ** 0.5).to(torch.float32)


_DEVICE_H: dict = {}


def hadamard(group: int = CONVROT_GROUP, dtype=torch.float32, device=None) -> torch.Tensor:
    """Regular Hadamard matrix [group, group] = R4^{⊗k} / √group (entries ±1/16 for 256, exact in bf16).
    Cached per (group, dtype, device), so no host→device copy happens after the first use (CUDA-graph safe)."""
    key = (int(group), dtype, str(torch.device(device)) if device is not None else "cpu")
    h = _DEVICE_H.get(key)
    if h is None:
        h = _DEVICE_H[key] = _hadamard_cpu(int(group)).to(dtype=dtype, device=device)
    return h


def rotate(x: torch.Tensor, group: int = CONVROT_GROUP) -> torch.Tensor:
    """Multiply every contiguous `group`-wide slice of the last axis of x [..., K] by H; K % group must be 0.
    Returns a tensor of x's shape and dtype (self-inverse: rotate(rotate(x)) == x up to rounding)."""
    k = x.shape[-1]
    if k % group:
        raise CheckpointError(f"cannot rotate a last axis of {k} in groups of {group}")
    h = hadamard(group, x.dtype, x.device)
    return (x.reshape(*x.shape[:-1], k // group, group) @ h).reshape(x.shape)


def quantize(weight: torch.Tensor, group: int = CONVROT_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a float weight [out, in] the way the Comfy-Org int8 file was made (checkpoint_format.md §2.4):
    rotate in fp32, s = row absmax / 127 (floor 1e-30), q = round-half-even(Ŵ / s) clamped to ±127.
    Returns (q int8 [out, in], s float32 [out, 1])."""
    w = rotate(weight.float(), group)
    scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(1e-30)
    q = torch.round(w / scale).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, group: int = CONVROT_GROUP,
               dtype=torch.float32) -> torch.Tensor:
    """W = (q·s)·H per group, computed in fp32 and cast to `dtype`. q int8 [out, in], scale [out, 1] / [out] / []."""
    w = q.float() * scale.float().reshape(-1, 1) if scale.numel() > 1 else q.float() * scale.float().reshape(())
    return rotate(w, group).to(dtype)


def parse_marker(raw: bytes | torch.Tensor, key: str = "") -> int:
    """Read a `.comfy_quant` marker (UTF-8 JSON bytes) and return the ConvRot group size.

    Accepted: `{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": G}` with `convrot` and
    `convrot_groupsize` at top level or under `params` (how ComfyUI reads it, comfyui_builtin.md §9.1); G defaults
    to 256. Raises CheckpointError naming the key for any other format."""
    if isinstance(raw, torch.Tensor):
        raw = bytes(raw.to(torch.uint8).cpu().tolist())
    try:
        marker = json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys)
    except DuplicateJSONKey as exc:  # json.loads keeps the last; another reader the first (break-it review, stop 52)
        raise CheckpointError(f"{key}: the comfy_quant marker names {exc.name!r} twice, so it does not say which "
                              "value holds (readers differ in which of the two they take) — a damaged or edited "
                              f"marker; the Comfy-Org file's marker reads {RELEASE_MARKER}") from None
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors; also a
        if too_long := json_number_too_long(exc):
            raise CheckpointError(f"{key}: the comfy_quant marker holds {too_long}") from None
        raise CheckpointError(f"{key}: the comfy_quant marker is not JSON "  # number past Python's digit cap
                              f"({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(marker, dict):
        raise CheckpointError(f"{key}: the comfy_quant marker is not a JSON object")
    fmt = marker.get("format")
    params = marker.get("params") if isinstance(marker.get("params"), dict) else {}
    for name in ("convrot", "convrot_groupsize"):  # both places, disagreeing: which one a reader takes differs
        top, under = marker.get(name), params.get(name)
        if name in marker and name in params and (top != under or type(top) is not type(under)):
            raise CheckpointError(f"{key}: the comfy_quant marker gives {name} twice, {json.dumps(top)} at its top "
                                  f"level and {json.dumps(under)} under \"params\": a reader takes one or the "
                                  "other (this pack the top level), so the marker does not say how the codes were "
                                  "made — a damaged or edited marker; the Comfy-Org file's marker reads "
                                  f"{RELEASE_MARKER}")
    convrot = marker.get("convrot", params.get("convrot", False))
    group = marker.get("convrot_groupsize", params.get("convrot_groupsize", CONVROT_GROUP))
    if fmt != "int8_tensorwise" or convrot is not True:
        raise CheckpointError(
            f"{key}: unsupported quantization marker {marker!r}; this pack reads only "
            '{"format": "int8_tensorwise", "convrot": true} (the Comfy-Org int8 ConvRot file)')
    if not isinstance(group, int) or isinstance(group, bool):
        raise CheckpointError(f"{key}: convrot_groupsize must be an integer, got {group!r}")
    return check_group(group, key, limit=False)  # arithmetic only: building H to check it took 34 GB for 4^8


class ConvRotLinear(nn.Module):
    """Linear layer over ConvRot int8 codes: y = ((x·H) · qᵀ) · s + b (W8A16 in the rotated basis).

    Buffers keep the checkpoint names: `weight` int8 [out, in], `weight_scale` float32 [out, 1], optional `bias`.
    x [..., in] in any float dtype → y [..., out] in x's dtype. On CUDA a Triton W8A16 kernel (decode) or
    dequantize + GEMM (large inputs) runs (`fast.int8_kernels`); on the CPU a dequantized copy in the activation
    dtype is kept after the first call (CPU memory for speed; the codes stay the module's state). `lora_side`
    (None, or a `weights.lora.apply.SideDelta`) adds adapters' deltas without touching the codes."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, group: int = CONVROT_GROUP,
                 dtype=torch.bfloat16):
        super().__init__()
        self.in_features, self.out_features, self.group = in_features, out_features, group
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features, 1, dtype=torch.float32))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype), requires_grad=False) if bias else None
        self._cpu_cache = None
        self.lora_side = None  # adapters' runtime delta (weights.lora.apply.SideDelta), set per model by its loader
        self.w8a8 = False  # large CUDA inputs through int8 × int8 products (`nar.int8_linears`, fast.w8a8)

    def dequantized(self, dtype=torch.float32) -> torch.Tensor:
        """The float weight W = (q·s)·H [out, in] (for self-checks and for paths that prefer a float GEMM)."""
        return dequantize(self.weight, self.weight_scale, self.group, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        side = self.lora_side
        if side is not None:  # LoRA/LoKr on the unrotated input, fp32 (weights.lora.apply, reference §3 option R)
            return side.apply(x, lambda: self._base(x))
        return self._base(x)

    def _base(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":
            # CPU: keep one dequantized copy (made on first use, dropped when the module moves) — a plain float
            # GEMM is several times faster there than converting the codes on every call.
            key = (self.weight.data_ptr(), x.dtype)
            if self._cpu_cache is None or self._cpu_cache[0] != key:
                self._cpu_cache = (key, self.dequantized(x.dtype))
            y = F.linear(x, self._cpu_cache[1])
            return y if self.bias is None else y + self.bias.to(y.dtype)
        from ..fast.int8_kernels import convrot_linear
        return convrot_linear(x, self.weight, self.weight_scale, self.bias, self.group, w8a8=self.w8a8)

    def _apply(self, fn, *args, **kwargs):
        self._cpu_cache = None
        return super()._apply(fn, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, convrot_group={self.group}, bias={self.bias is not None}"


class ConvRotEmbedding(nn.Module):
    """Embedding table stored as ConvRot int8 rows: e(id) = ((q[id]·s[id])·H) per group, un-rotated after the gather
    (checkpoint_format.md §2.3). ids [...] int64 → [..., dim] in `dtype`."""

    def __init__(self, num_embeddings: int, dim: int, group: int = CONVROT_GROUP, dtype=torch.bfloat16):
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.group, self.dtype = num_embeddings, dim, group, dtype
        self.register_buffer("weight", torch.zeros(num_embeddings, dim, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(num_embeddings, 1, dtype=torch.float32))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight[ids].float() * self.weight_scale[ids].float()
        return rotate(rows, self.group).to(self.dtype)
