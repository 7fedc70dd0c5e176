"""The one-launch decoder layer in CUDA C++ (`_layer_cuda.cu`; `fast.persistent`, YUE2_LAYER_KERNEL=cuda).

The source is compiled at first use by NVRTC — the runtime compiler that ships with PyTorch's CUDA wheels
(nvidia-cuda-nvrtc), so no CUDA toolkit is needed — for the GPU's architecture, with the model's dims, the row
count and the weight format as macros, and loaded through PyTorch's driver helpers (`torch.cuda._utils`). Both
are private PyTorch APIs: where they are missing or fail, `compile_layer` raises RuntimeError with the reason and
the decoder runs its per-kernel step (one warning).
"""
from __future__ import annotations

import ctypes
import os

import torch

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_layer_cuda.cu")
THREADS = 512  # a block: 16 warps, one block per multiprocessor (__launch_bounds__(NT, 1): ≤ 128 registers a thread)


def defines(rows: int, dims, int8: bool) -> dict:
    """The macros of one compilation: R_ rows, HID, NH, NKV, HD, FF (model dims), INT8, NT threads a block, and
    the experimental switches of `options` (ATT_PIPE, FAST_EXP)."""
    return dict(R_=rows, HID=dims.hidden, NH=dims.heads, NKV=dims.kv_heads, HD=dims.head_dim, FF=dims.ffn,
                INT8=int(int8), NT=THREADS, **options())


OPTIONS = {"pipe": "ATT_PIPE", "fexp": "FAST_EXP"}


def options() -> dict:
    """The experimental switches of YUE2_LAYER_CUDA_OPTS (comma-separated; stop 58, not yet measured on a GPU):
    "pipe" = ATT_PIPE (the attention's next cache batch loaded while this one is computed), "fexp" = FAST_EXP (the
    attention loop's exponentials by ex2.approx, as Triton's). Raises RequestError for an unknown name."""
    from ..errors import RequestError
    names = [n.strip() for n in os.environ.get("YUE2_LAYER_CUDA_OPTS", "").split(",") if n.strip()]
    bad = [n for n in names if n not in OPTIONS]
    if bad:
        raise RequestError(f"YUE2_LAYER_CUDA_OPTS: unknown {', '.join(map(repr, bad))}; accepted: "
                           f"{', '.join(OPTIONS)} (comma-separated)")
    return {macro: int(name in names) for name, macro in OPTIONS.items()}


ACC = 4096  # floats of a block's product tile sums (the kernel's ACC)


def shared_bytes(rows: int, dims) -> int:
    """Dynamic shared memory a block uses (bytes): the products' 16-bit input rows and fp32 work rows [rows, max(hidden, ffn)], 32·rows floats of reductions, ACC
    floats of tile sums, the attention's query, per-warp partials and merge."""
    xs = max(dims.hidden, dims.ffn)
    g, nw = dims.heads // dims.kv_heads, THREADS // 32
    floats = rows * xs + 32 * rows + ACC + g * dims.head_dim * 2 + 2 * nw * g + nw * g * dims.head_dim + 4
    return rows * xs * 2 + floats * 4


def sums_problem(rows: int, dims, blocks: int) -> str | None:
    """Why a block's tile sums would not fit ACC floats with `blocks` blocks (each owns ⌈tiles / blocks⌉ 16-row
    tiles of a product, two slots a gate/up tile), or None."""
    qkv = (dims.heads + 2 * dims.kv_heads) * dims.head_dim
    need = max(-(-qkv // 16 // blocks), -(-dims.hidden // 16 // blocks), 2 * -(-dims.ffn // 16 // blocks)) * 16 * rows
    return None if need <= ACC else f"{need} floats of tile sums a block with {blocks} blocks (room for {ACC})"


def nvrtc_compile(source: str, macros: dict, arch: str, lib=None) -> tuple[bytes, str]:
    """Compiles `source` with NVRTC for `arch` ("sm_90"); returns (cubin, ptxas log). lib: a loaded libnvrtc
    (default PyTorch's). Raises RuntimeError with NVRTC's log when the source does not compile."""
    if lib is None:
        from torch.cuda._utils import _get_gpu_rtc_library
        lib = _get_gpu_rtc_library()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"_layer_cuda.cu", 0, None, None) != 0:
        raise RuntimeError("NVRTC could not create a program")
    try:
        opts = [f"--gpu-architecture={arch}", "-std=c++17", "--ptxas-options=-v"]
        opts += [f"-D{k}={v}" for k, v in macros.items()]
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        res = lib.nvrtcCompileProgram(prog, len(opts), arr)
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        text = log.value.decode(errors="replace")
        if res != 0:
            raise RuntimeError(f"NVRTC could not compile the layer kernel ({macros}):\n{text[-2000:]}")
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        cubin = ctypes.create_string_buffer(n.value)
        if lib.nvrtcGetCUBIN(prog, cubin) != 0:
            raise RuntimeError("NVRTC gave no cubin")
        return cubin.raw, text
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def registers(log: str) -> tuple[int, int]:
    """(registers a thread, spilled bytes) from a ptxas -v log; (-1, -1) when absent."""
    import re
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores", log)
    return (int(regs.group(1)) if regs else -1, int(spill.group(1)) if spill else -1)


class CompiledLayer:
    """A loaded `yue2_layer` kernel for one (rows, dims, format, device): `launch(args, blocks)` on the current
    stream (capturable in a CUDA graph); `regs`, `spill` (bytes), `smem`, `resident` (blocks a
    multiprocessor holds at once)."""

    def __init__(self, rows: int, dims, int8: bool, device: torch.device):
        from torch.cuda import _utils as cu
        cc = torch.cuda.get_device_capability(device)
        with open(SOURCE) as f:
            src = f.read()
        cubin, log = nvrtc_compile(src, defines(rows, dims, int8), f"sm_{cc[0]}{cc[1]}")
        self.regs, self.spill = registers(log)
        with torch.cuda.device(device):
            self.kernel = cu._cuda_load_module(cubin, ["yue2_layer"])["yue2_layer"]
            self.smem = shared_bytes(rows, dims)
            self.kernel.set_shared_memory_config(self.smem)
            libcuda = cu._get_gpu_runtime_library()
            n = ctypes.c_int()
            err = libcuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), self.kernel.func, THREADS,
                                                                       self.smem)
            self.resident = n.value if err == 0 else -1

    def launch(self, args: list, blocks: int) -> None:
        self.kernel(grid=(blocks, 1, 1), block=(THREADS, 1, 1), args=args, shared_mem=self.smem)


_BUILT: dict = {}  # (macros, device index) → CompiledLayer, or the RuntimeError it failed with (not retried)


def _compiled(rows: int, dims, int8: bool, device_index: int) -> CompiledLayer:
    key = (tuple(sorted(defines(rows, dims, int8).items())), device_index)
    if key not in _BUILT:
        try:
            _BUILT[key] = CompiledLayer(rows, dims, int8, torch.device("cuda", device_index))
        except (RuntimeError, OSError, AttributeError, TypeError) as exc:
            _BUILT[key] = RuntimeError(f"the CUDA layer kernel could not be built: {type(exc).__name__}: {exc}")
    if isinstance(_BUILT[key], Exception):
        raise _BUILT[key]
    return _BUILT[key]


def compile_layer(rows: int, dims, int8: bool, device: torch.device) -> CompiledLayer:
    """The compiled kernel for these rows/dims/format on `device` (cached per process by its macros, failures too: a
    failed build is not retried). Raises RuntimeError naming what is missing (no CUDA, a PyTorch without the NVRTC
    helpers, a compile error)."""
    if device.type != "cuda" or torch.version.hip is not None:
        raise RuntimeError("the CUDA layer kernel needs an NVIDIA GPU")
    try:
        from torch.cuda import _utils as cu
        for name in ("_get_gpu_rtc_library", "_cuda_load_module", "_get_gpu_runtime_library"):
            getattr(cu, name)
    except (ImportError, AttributeError) as exc:
        raise RuntimeError(f"this PyTorch ({torch.__version__}) lacks the NVRTC helpers the CUDA layer kernel uses "
                           f"({exc})") from None
    return _compiled(rows, dims, int8, device.index if device.index is not None else torch.cuda.current_device())
