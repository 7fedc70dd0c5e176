"""FlashAttention-3-class kernels for the NAR's unmasked attention, from an optional package (none is a dependency).

On an H200 (torch 2.11, cuDNN 9.19) FlashAttention-3's Hopper kernel runs the NAR's attention (5,373 queries × 12,745
keys, 16 query / 8 kv heads of 128, bf16) in 0.868 ms at 646 TFLOP/s against 1.019 ms / 551 TFLOP/s for PyTorch's
choice (cuDNN), with the same error against fp32 (2.1e-3 relative; docs/experiments/nar_fa3_h200_2026-12-04.log).
PyTorch ships no such kernel, so it is taken from the first of these interfaces that imports:

  `flash_attn_interface`  FlashAttention-3 built from Dao-AILab/flash-attention's `hopper/` folder (sm90)
  `fa3_fwd_interface`     PyPI `fa3-fwd`: FlashAttention-3's forward as a wheel (sm90; torch ≥ 2.10, its stable ABI)
  `flash_attn.cute`       PyPI `flash-attn-4`: FlashAttention in the CuTe DSL (sm90 and sm100; compiles at first use)

All three take q [B, T, H, D] and k/v [B, S, KV, D] with any batch/sequence/head strides (last dim contiguous) and
read query head h from kv head h // (H / KV), the same grouping as `layers.sdpa`, so the NAR's [B, KV, S, D] key
buffers are passed as transposed views without a copy."""
from __future__ import annotations

import importlib
from typing import Callable

import torch

INTERFACES = (  # (module, package to install, compute capabilities majors it has kernels for)
    ("flash_attn_interface", "FlashAttention-3 (flash-attention hopper/ build)", (9,)),
    ("fa3_fwd_interface", "fa3-fwd", (9,)),
    ("flash_attn.cute", "flash-attn-4", (9, 10)),
)

_FOUND: list = []  # [(module name, package, majors, flash_attn_func) | None] once looked up
_WHY_NOT: dict[str, str] = {}  # module → why it did not import (ImportError, a broken build's OSError, …)
_BROKEN: dict[str, str] = {}  # the part of _WHY_NOT where the module exists but failed (package → reason)


def find() -> tuple[str, str, tuple[int, ...], Callable] | None:
    """(module, package, capability majors, flash_attn_func) of the first interface that imports, looked up once per
    process; None when none does (`why_not()` says why, `broken()` which of them are installed but fail)."""
    if not _FOUND:
        hit = None
        for module, package, majors in INTERFACES:
            try:
                fn = importlib.import_module(module).flash_attn_func
            except Exception as exc:  # not installed, or built for another torch/CUDA (undefined symbol, …)
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                _WHY_NOT[module] = reason
                missing = isinstance(exc, ModuleNotFoundError) and exc.name is not None \
                    and module.startswith(exc.name)  # the module itself (or its package) is absent
                if not missing:
                    _BROKEN[package] = reason
                continue
            hit = (module, package, majors, fn)
            break
        _FOUND.append(hit)
    return _FOUND[0]


def why_not() -> str:
    """One line: the interfaces tried and why each failed to import (empty when one imported)."""
    return "; ".join(f"{m}: {r}" for m, r in _WHY_NOT.items())


def broken() -> str:
    """One line naming the interfaces that are installed but fail to import (built for another torch or CUDA, a
    missing dependency), with the error; empty when none is. Calls `find()`."""
    find()
    return "; ".join(f"{p} ({r})" for p, r in _BROKEN.items())


def unusable(q: torch.Tensor, k: torch.Tensor) -> str | None:
    """Why the kernel cannot run on these inputs (q [B, H, T, D], k [B, KV, S, D]), or None: no interface
    installed (or one installed that fails to import: named with its error), not a CUDA tensor, a GPU generation
    the found package has no kernels for, a dtype other than bf16/fp16, a head size not a multiple of 8 or above
    256 (FlashAttention-3's limits)."""
    found = find()
    if found is None:
        if _BROKEN:
            return f"installed but not importable: {broken()}"
        return ("no FlashAttention-3 interface is installed (pip install fa3-fwd on Hopper with torch >= 2.10, or "
                "flash-attn-4)")
    module, package, majors, _ = found
    if q.device.type != "cuda":
        return f"{package} needs a CUDA tensor, not {q.device.type}"
    major, minor = torch.cuda.get_device_capability(q.device)
    if major not in majors:
        return f"{package} has no kernels for compute capability {major}.{minor} (has {majors})"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype:
        return f"{package} takes bf16/fp16 q/k/v, not {q.dtype}/{k.dtype}"
    d = q.shape[-1]
    if d % 8 or d > 256:
        return f"{package} takes head sizes that are multiples of 8 up to 256, not {d}"
    return None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q·kᵀ/√D)·v without a mask: q [B, H, T, D], k/v [B, KV, S, D] (H a multiple of KV) → [B, H, T, D] in
    q's dtype (a transposed view of the kernel's [B, T, H, D] output). Call only when `unusable` is None; errors of
    the kernel itself (RuntimeError) propagate to `layers.unmasked_attention`, which falls back."""
    fn = find()[3]
    out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    if isinstance(out, tuple):  # flash-attn-4 returns (out, lse)
        out = out[0]
    return out.transpose(1, 2)
