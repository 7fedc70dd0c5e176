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
import importlib.metadata
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Interface:
    """One FlashAttention package: the module holding `flash_attn_func`, the name to install, the compute-capability
    majors it has kernels for, the dtypes its build takes, the largest head size, and the distributions one of which
    must be installed before the module is imported (flash-attn-4 lives in flash-attn 2's `flash_attn` package: importing
    `flash_attn.cute` would otherwise run flash-attn 2's `__init__` and blame its failures on flash-attn-4)."""
    module: str
    package: str
    majors: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]
    max_head: int
    distributions: tuple[str, ...] = ()  # any one of them installed (empty: no check)


INTERFACES = (
    Interface("flash_attn_interface", "FlashAttention-3 (flash-attention hopper/ build)", (9,),
              (torch.bfloat16, torch.float16), 256),
    # the fa3-fwd wheel is built without fp16 kernels (its fa3_fwd_config.py: FLASHATTENTION_DISABLE_FP16)
    Interface("fa3_fwd_interface", "fa3-fwd", (9,), (torch.bfloat16,), 256),
    # flash-attn-4 asserts head sizes <= 128 on some GPUs (sm100); 128 is the model's
    # (older source builds of flash_attn/cute were distributed as flash-attn-cute)
    Interface("flash_attn.cute", "flash-attn-4", (9, 10), (torch.bfloat16, torch.float16), 128,
              ("flash-attn-4", "flash-attn-cute")),
)

_FOUND: list = []  # [(Interface, flash_attn_func) | None] once looked up
_WHY_NOT: dict[str, str] = {}  # module → why it did not import (ImportError, a broken build's OSError, …)
_BROKEN: dict[str, str] = {}  # the part of _WHY_NOT where the package is installed but failed (package → reason)


def find() -> tuple[Interface, Callable] | None:
    """(Interface, flash_attn_func) of the first interface that imports, looked up once per process; None when none
    does (`why_not()` says why, `broken()` which of them are installed but fail)."""
    if not _FOUND:
        hit = None
        for it in INTERFACES:
            if it.distributions and not any(_installed(d) for d in it.distributions):
                _WHY_NOT[it.module] = f"{' / '.join(it.distributions)} not installed"
                continue
            try:
                fn = importlib.import_module(it.module).flash_attn_func
            except Exception as exc:  # not installed, or built for another torch/CUDA (undefined symbol, …)
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                _WHY_NOT[it.module] = reason
                name = getattr(exc, "name", None)
                absent = isinstance(exc, ModuleNotFoundError) and name is not None and (
                    name == it.module or it.module.startswith(name + "."))  # the module (or its package) itself
                if not absent:
                    _BROKEN[it.package] = reason
                continue
            hit = (it, fn)
            break
        _FOUND.append(hit)
    return _FOUND[0]


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def why_not() -> str:
    """One line: the interfaces tried and why each failed to import (empty when one imported)."""
    return "; ".join(f"{m}: {r}" for m, r in _WHY_NOT.items())


def broken() -> str:
    """One line naming the interfaces that are installed but fail to import (built for another torch or CUDA, a
    missing dependency), with the error; empty when none is. Calls `find()`."""
    find()
    return "; ".join(f"{p} ({r})" for p, r in _BROKEN.items())


def unusable_for(device: torch.device | str, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why the kernel cannot run for attention on `device` in `dtype` with heads of `head_dim`, or None: no interface
    installed (or one installed that fails to import: named with its error), not an NVIDIA CUDA device (ROCm builds
    report capabilities too), a GPU generation the found package has no kernels for, a dtype its build lacks, a
    head size not a multiple of 8 or above its limit."""
    found = find()
    if found is None:
        if _BROKEN:
            return f"installed but not importable: {broken()}"
        return ("no FlashAttention-3 interface is installed (pip install fa3-fwd on Hopper with torch >= 2.10, or "
                "flash-attn-4)")
    it = found[0]
    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip is not None:
        return f"{it.package} needs an NVIDIA CUDA device, not {'ROCm' if device.type == 'cuda' else device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if major not in it.majors:
        return f"{it.package} has no kernels for compute capability {major}.{minor} (has {it.majors})"
    if dtype not in it.dtypes:
        return f"{it.package} takes {'/'.join(str(d).replace('torch.', '') for d in it.dtypes)} q/k/v, not {dtype}"
    if head_dim % 8 or head_dim > it.max_head:
        return f"{it.package} takes head sizes that are multiples of 8 up to {it.max_head}, not {head_dim}"
    return None


def unusable(q: torch.Tensor, k: torch.Tensor) -> str | None:
    """`unusable_for` of these inputs (q [B, H, T, D], k [B, KV, S, D]; k must have q's dtype)."""
    if k.dtype != q.dtype:
        return f"q and k/v must share a dtype, not {q.dtype}/{k.dtype}"
    return unusable_for(q.device, q.dtype, q.shape[-1])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q·kᵀ/√D)·v without a mask: q [B, H, T, D], k/v [B, KV, S, D] (H a multiple of KV) → [B, H, T, D] in
    q's dtype (a transposed view of the kernel's [B, T, H, D] output). Call only when `unusable` is None; errors of
    the kernel itself propagate to `layers.unmasked_attention`, which falls back. Only q, k, v are passed
    (positionally; the scale 1/√D and non-causal are every interface's defaults — flash-attn-4's 4th positional
    parameter is not the scale)."""
    fn = find()[1]
    out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    if isinstance(out, tuple):  # flash-attn-4 returns (out, lse)
        out = out[0]
    return out.transpose(1, 2)
