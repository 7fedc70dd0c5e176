"""Device-specific fast paths, chosen automatically: `select_generate(ar)` returns the function that runs an AR
phase for the model's device — the CUDA-graph decoder (`fast.decode`) on NVIDIA GPUs, the portable PyTorch loop
(`yue2_core.sampling.generate`) elsewhere. `select_render(nar)` likewise for the NAR. Set YUE2_FAST=0 to force the
portable paths (the reference implementation the fast ones are tested against)."""
from __future__ import annotations

import functools
import warnings

from ..nar import render as portable_render
from ..sampling import generate as portable_generate
from ..switches import flag


def fast_enabled(device) -> bool:
    """True on a CUDA device unless YUE2_FAST=0 (the switch is validated on every device)."""
    return flag("YUE2_FAST", True) and getattr(device, "type", str(device)) == "cuda"  # validated on any device


def select_generate(ar):
    """The AR phase runner for `ar`'s device: `fast.decode.generate` (CUDA graphs) or `sampling.generate`."""
    if fast_enabled(ar.device):
        from .decode import generate
        return generate
    return portable_generate


def select_render(nar):
    """The NAR render for `nar`: `nar.render` on every device (on CUDA it captures each evaluation in a CUDA
    graph and picks FlashAttention-3 where it loads, `nar.graph_wanted`, `fast.flash_attn`)."""
    return portable_render


@functools.lru_cache(maxsize=1)
def triton_modules():
    """(triton, triton.language), or None — with one warning per process — when Triton cannot be imported (not
    installed, or a broken install): the decode step then uses unfused torch ops, int8 layers the portable path, the
    NAR and VAE their torch ops. Every Triton kernel in `fast` is built through this."""
    try:
        import triton
        import triton.language as tl
    except Exception as exc:  # ImportError, or a broken Triton install raising anything else
        warnings.warn(f"Triton unavailable ({type(exc).__name__}: {exc}); the GPU paths run without fused kernels "
                      "(unfused torch ops, portable int8 layers): correct, but slower")
        return None
    return triton, tl


_PDL: dict = {}


def pdl_enabled(device) -> bool:
    """Whether the decode kernels launch with programmatic dependent launch (PDL) on `device`: an NVIDIA device of
    compute capability ≥ 9.0 (Hopper; not on ROCm builds of torch), a Triton with
    grid dependency control and the `launch_pdl` launch option, and YUE2_PDL not "0". With PDL each kernel's launch
    and block scheduling overlap the previous kernel's tail; every such kernel first waits for the previous one
    (`_decode_triton.pdl_prologue`), so results are unchanged."""
    if getattr(device, "type", None) != "cuda" or not flag("YUE2_PDL", True):
        return False
    key = str(device)
    if key not in _PDL:
        ok = False
        try:
            import torch
            # NVIDIA only: ROCm devices also report capabilities ≥ 9, and griddepcontrol is NVIDIA PTX
            if (torch.version.hip is None and triton_modules() is not None
                    and torch.cuda.get_device_capability(device) >= (9, 0)):
                from triton.backends.nvidia.compiler import CUDAOptions
                from . import _decode_triton
                ok = "launch_pdl" in CUDAOptions.__dataclass_fields__ and _decode_triton.gdc_wait is not None
        except Exception:  # no CUDA backend in this Triton, or a driver query failing: plain launches
            ok = False
        _PDL[key] = ok
    return _PDL[key]
