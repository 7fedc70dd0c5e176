"""The W8A8 quantizer (yue2_core/fast/w8a8.py) on this GPU, its two rotations apart: H16·X·H16 in 3-pass tf32
(`_decode_triton.rot_rows`, the default) and x·H as one bf16 tensor-core product (`quantize_rows(kron=False)`).

Written for the first GPU run of the W8A8 tests (stop 51, one H100, Triton 3.6): 5–6 % of the row scales differed
from `w8a8.reference`, even for inputs whose rotation is exact in any summation order (small integers). This script
showed both rotations exact there and both scales off alike: the cause was the scale's rounding (an IEEE division,
where PyTorch on CUDA multiplies by fp32(1/127)), fixed since. It prints:

1. `rot_rows` alone in a small kernel (3-pass tf32 as used, and the same products in IEEE fp32) against the exact
   rotation (float64) on integer and Gaussian rows: the share of values that differ and the largest difference;
2. `quantize_rows` with each rotation against `w8a8.reference`'s arithmetic: the share of row scales and codes that
   differ (on integer rows both must be 0).

    python3 bench/w8a8_rotation.py
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from yue2_core.fast._decode_triton import rot_rows  # noqa: E402


@triton.jit
def _rot_ieee(x, BM: tl.constexpr):
    # rot_rows' products in IEEE fp32 (the tensor cores not used): the reference for the 3-pass tf32 ones
    i = tl.arange(0, 16)
    a = i[:, None]
    b = i[None, :]
    h = tl.where((a // 4 + b // 4) == 3, -0.25, 0.25) * tl.where((a % 4 + b % 4) == 3, -1.0, 1.0)
    y = tl.dot(tl.reshape(x, (BM * 16, 16)), h, input_precision="ieee")
    y = tl.reshape(tl.permute(tl.reshape(y, (BM, 16, 16)), (0, 2, 1)), (BM * 16, 16))
    z = tl.dot(y, h, input_precision="ieee")
    return tl.reshape(tl.permute(tl.reshape(z, (BM, 16, 16)), (0, 2, 1)), (BM, 256))


@triton.jit
def _rotate_kernel(x_ptr, y_ptr, IEEE: tl.constexpr, BM: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    g = tl.arange(0, 256)
    x = tl.load(x_ptr + rows[:, None] * 256 + g[None, :])
    if IEEE:
        y = _rot_ieee(x, BM)
    else:
        y = rot_rows(x, BM)
    tl.store(y_ptr + rows[:, None] * 256 + g[None, :], y)


def rotation_alone(x: torch.Tensor) -> None:
    from yue2_core.weights.quant import hadamard
    exact = (x.double() @ hadamard(256, torch.float64, x.device)).float()
    for ieee in (False, True):
        y = torch.empty_like(x)
        _rotate_kernel[(x.shape[0] // 32,)](x, y, IEEE=ieee, BM=32, num_warps=4)
        diff = (y != exact)
        print(f"  rot_rows {'ieee fp32' if ieee else 'tf32x3  '}: {diff.float().mean().item():8.4%} of values differ "
              f"from the exact rotation, max |Δ| {(y - exact).abs().max().item():.3e}, rows with any "
              f"{diff.any(-1).float().mean().item():7.3%}", flush=True)


def quantizer(x: torch.Tensor, label: str) -> dict:
    from yue2_core.fast import w8a8
    from yue2_core.weights.quant import rotate
    xb = x.to(torch.bfloat16)
    xr = rotate(xb.float(), 256).to(torch.bfloat16)  # fp32 sums (no tf32 here), rounded once to bf16
    a = (xr.abs().amax(-1).float() / 127).clamp(min=1e-30)
    want = (xr / a[:, None].to(xr.dtype)).round().clamp(-128, 127).to(torch.int8)
    out = {}
    for kron in (True, False):
        codes, scales = w8a8.quantize_rows(xb.contiguous(), 256, kron=kron)
        s_off = (scales != a).float().mean().item()
        c_off = (codes != want).float().mean().item()
        out[kron] = (s_off, c_off)
        print(f"  {label:<9} quantizer {'kron ' if kron else 'dense'}: scales differ {s_off:8.4%}, codes differ "
              f"{c_off:8.4%}", flush=True)
    return out


def main() -> int:
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · triton {triton.__version__}")
    g = torch.Generator(device=dev).manual_seed(7)
    m = 4096
    ints = torch.randint(-8, 9, (m, 2048), device=dev, generator=g).float()
    ints[:, 0] += torch.arange(m, device=dev).remainder(97).float()
    gauss = torch.randn(m, 2048, device=dev, generator=g).to(torch.bfloat16).float()
    print("== the rotation alone (one 256-group a row)")
    for label, x in (("integers", ints[:, :256].contiguous()), ("gaussian", gauss[:, :256].contiguous())):
        print(f" {label}:")
        rotation_alone(x)
    print("== the quantizer against w8a8.reference's arithmetic")
    exact_rows = quantizer(ints, "integers")
    quantizer(gauss, "gaussian")
    verdict = {kron: "equal" if exact_rows[kron] == (0.0, 0.0) else "NOT equal" for kron in (True, False)}
    print(f"integer rows, scales and codes vs the reference: kron {verdict[True]}, dense {verdict[False]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
