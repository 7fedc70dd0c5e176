"""The check of every YUE2_* environment switch before any work (`check_environment`), shared by the command line
and the ComfyUI nodes. Each switch's own reader (switches.py and the modules it names) holds its rules; this module
only calls them all up front and names what it does not know."""
from __future__ import annotations

import os

# switches that change only the CUDA paths (the decode step's kernels, the render's graph and its SMs): set on a run
# that decodes on the CPU they do nothing, and a user trying one there is told so (break-it finding; YUE2_COMPILE and
# YUE2_FUSED too since break-it review 53b: both are read only by the CUDA decoder and the CUDA render)
GPU_ONLY_SWITCHES = ("YUE2_COMPILE", "YUE2_FUSED", "YUE2_GEMV", "YUE2_PDL", "YUE2_SHARED_PREFIX", "YUE2_NAR_GRAPH",
                     "YUE2_DECODE_ATTN", "YUE2_INT8_ROT", "YUE2_INT8_DOT", "YUE2_ATTN_MERGE", "YUE2_SAMPLER", "YUE2_LAYER_KERNEL",
                     "YUE2_GEMV_TABLE", "YUE2_LAYER_TILES", "YUE2_RENDER_SMS", "YUE2_L2_PREFETCH",
                     "YUE2_L2_PREFETCH_GRID", "YUE2_SIDE_CAPTURE", "YUE2_GEMV_PRE", "YUE2_NAR_LINEARS",
                     "YUE2_W8A8_TABLE", "YUE2_LAYER_CUDA_OPTS")
# the boolean switches whose default is off (the others' is on): for the CPU-run warning, "changed" is from this
FLAGS_OFF_BY_DEFAULT = ("YUE2_COMPILE", "YUE2_GEMV_PRE")


def check_environment(device: str | None = None) -> list[str]:
    """Every YUE2_* environment switch checked before any work (switches.py; most are read only when a GPU stage
    starts) → the warnings to show: a YUE2_ variable the pack does not know, a GPU-only switch (GPU_ONLY_SWITCHES)
    changed on a run whose `device` ("auto", "cpu", "cuda:1" …; None: not checked) resolves to no CUDA GPU, and
    there YUE2_NAR_ATTN naming a backend of CUDA GPUs only (`layers.CUDA_ONLY_BACKENDS`: the NAR uses gqa). Raises
    RequestError naming a bad value and what it accepts. The command line calls it before loading anything, the
    ComfyUI nodes before their work (break-it finding: the nodes met a bad switch only mid-run)."""
    warnings = []
    from .switches import choice, flag
    from .layers import CUDA_ONLY_BACKENDS, UNMASKED_BACKENDS
    from .nar import NAR_LINEARS
    flags = ("YUE2_FAST", "YUE2_FUSED", "YUE2_GEMV", "YUE2_PDL", "YUE2_COMPILE", "YUE2_SHARED_PREFIX",
             "YUE2_NAR_GRAPH", "YUE2_VERIFY_HASHES", "YUE2_WARMUP", "YUE2_SIDE_CAPTURE", "YUE2_GEMV_PRE")
    choices = {"YUE2_DECODE_ATTN": ("triton", "torch"), "YUE2_INT8_ROT": ("producers", "cublas"),
               "YUE2_INT8_DOT": ("convert", "int8"),
               "YUE2_ATTN_MERGE": ("split", "kernel"), "YUE2_SAMPLER": ("kernels", "torch"),
               "YUE2_NAR_ATTN": ("auto",) + UNMASKED_BACKENDS, "YUE2_LORA_INT8": ("side", "bf16"),
               "YUE2_LAYER_KERNEL": ("off", "grid", "phased", "cuda"), "YUE2_NAR_LINEARS": NAR_LINEARS}
    for name in flags:
        flag(name, True)
    from .warmup_jobs import PROCS_SWITCH, procs
    procs()  # YUE2_WARMUP_PROCS: an integer ≥ 0 (RequestError otherwise)
    for name, allowed in choices.items():
        choice(name, allowed, allowed[0])
    table = os.environ.get("YUE2_GEMV_TABLE", "").strip()
    if table and not os.path.isfile(table):
        from .errors import RequestError
        raise RequestError(f"the environment variable YUE2_GEMV_TABLE names {table!r}, which is not a file (a JSON "
                           "table written by bench/gemv_sweep.py --json)")
    if table:  # its entries too (read otherwise only when a GPU decode starts)
        from .fast.gemv import _tables_from
        _tables_from(table)
    w8a8_table = os.environ.get("YUE2_W8A8_TABLE", "").strip()
    if w8a8_table:  # its entries (read otherwise only by the first W8A8 product of a render)
        from .fast.w8a8 import read_table
        read_table(w8a8_table)
    from .fast.persistent import tiles
    tiles()  # YUE2_LAYER_TILES: a JSON object of the layer kernel's tiles
    from .fast._layer_cuda import options
    options()  # YUE2_LAYER_CUDA_OPTS: the CUDA layer kernel's experimental switches
    from .fast import l2_prefetch
    l2_prefetch.parse(os.environ.get("YUE2_L2_PREFETCH", ""))  # a plan of fork points and weights
    l2_prefetch.grid()
    from .batch.streams import SWITCH as RENDER_SMS, check_switch
    check_switch()  # YUE2_RENDER_SMS: auto, 0 or a number of SMs
    known = {*flags, *choices, PROCS_SWITCH, RENDER_SMS, "YUE2_GEMV_TABLE", "YUE2_W8A8_TABLE", "YUE2_LAYER_TILES",
             "YUE2_LAYER_CUDA_OPTS",
             "YUE2_L2_PREFETCH",
             "YUE2_L2_PREFETCH_GRID", "YUE2_CHECKPOINT", "YUE2_ROT_FUSED", "YUE2_TEST_CACHE",
             "YUE2_HASH_CACHE", "YUE2_COMMIT", "YUE2_ARTIFACTS", "YUE2_PARITY_DIR", "YUE2_REQUIRE_HOST",
             "YUE2_SKIP_BROWSER", "YUE2_CHROMIUM", "YUE2_COMFY_CLI", "YUE2_COMFY_PYTHON", "YUE2_COMFY_VERSION",
             "YUE2_E2E_DIR", "YUE2_FRONTEND_NEWEST", "YUE2_REQUIRE_BROWSER", "YUE2_TEST_WORKERS", "YUE2_BENCH_INT8",
             "YUE2_BENCH_BF16", "YUE2_TRITON_GPU_IMAGE"}
    # ↑ the benchmarks' and the test set-up's own variables (scripts/test.sh exports them:
    # tests/robust/test_break_stop52.py checks every YUE2_ name it exports is here)
    for name in sorted(os.environ):
        if name.startswith("YUE2_") and name not in known:
            warnings.append(f"the environment variable {name} is not a switch of this pack (switches.py); it is "
                            "ignored")
    if device is None:
        return warnings
    import torch
    on_cuda = torch.cuda.is_available() if device == "auto" else torch.device(device).type == "cuda"
    from .fast.decode import INT8_DOT_DEFAULT
    from .nar import DEFAULT_NAR_LINEARS
    # the choices whose default is not the first value listed
    defaults = {"YUE2_INT8_DOT": INT8_DOT_DEFAULT, "YUE2_NAR_LINEARS": DEFAULT_NAR_LINEARS}
    place = 'the CPU (no CUDA GPU here)' if device == 'auto' else device
    for name in GPU_ONLY_SWITCHES:
        value = os.environ.get(name, "").strip()
        if name in flags:
            default = name not in FLAGS_OFF_BY_DEFAULT
            changed = flag(name, default) != default
        elif name in choices:
            changed = value not in ("", defaults.get(name, choices[name][0]))
        elif name == "YUE2_L2_PREFETCH":
            changed = bool(l2_prefetch.parse(value))
        elif name == "YUE2_L2_PREFETCH_GRID":
            changed = bool(value) and l2_prefetch.grid() != l2_prefetch.DEFAULT_GRID
        else:
            changed = value not in ("", "auto", "off")
        if not on_cuda and changed:
            warnings.append(f"{name}={value} changes only the CUDA decode and render paths; this run is on "
                            f"{place}, where it has no effect")
    attention = os.environ.get("YUE2_NAR_ATTN", "").strip()
    if not on_cuda and attention in CUDA_ONLY_BACKENDS:  # gqa, flash and math do run on the CPU: not GPU_ONLY
        warnings.append(f"YUE2_NAR_ATTN={attention} names an attention backend of CUDA GPUs only "
                        f"({', '.join(CUDA_ONLY_BACKENDS)}); this run is on {place}, where the NAR uses PyTorch's "
                        "own choice (gqa, as unset) — the switch has no effect")
    return warnings
