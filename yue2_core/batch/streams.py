"""Where the batch command's two stages run on a GPU while they overlap (`runner._RenderStage`): the AR batch decode
on the main thread, the render (NAR + VAE) on the worker.

The AR always runs on a high-priority stream over every SM. Its step is a chain of ~300 short, bandwidth-bound
kernels; the render's are long and compute-bound, so an AR kernel waits for render blocks to leave an SM whatever
the priority. `YUE2_RENDER_SMS=K` confines the render to a CUDA green context of K SMs
(`torch.cuda.green_contexts`; needs the `cuda-bindings` package and a driver ≥ 12.8), so the other SMs are free
for the AR's kernels whenever they arrive. The render's CUDA graphs are captured on a stream of that context
(`fast.decode.capture_on`): a graph keeps the context it was captured in.

Measured on an H200 (`bench/overlap_split.py`, docs/experiments/overlap_split_h200_2026-12-03.log; 8-row AR beside
3.6-minute renders), as work per second relative to each stage alone: priority streams 1.12; render on 96 SMs with
the AR on all 1.21; both stages in green contexts (render 96, AR 36) 0.89 — the AR's prefill is slow on few SMs
and the two still slowed each other — and in the whole 16-song batch that split took 153.6 s against 121.8 s.

    YUE2_RENDER_SMS=auto   see AUTO below (default)
    YUE2_RENDER_SMS=0      no green context: the render on a low-priority stream
    YUE2_RENDER_SMS=K      the render on K SMs (8 ≤ K ≤ SMs − 8, else one warning and no context); the AR keeps
                           every SM; ignored without a GPU or without the overlap
"""
from __future__ import annotations

import contextlib
import warnings

SWITCH = "YUE2_RENDER_SMS"
AUTO = 0  # what `auto` gives the render: 0 = no green context (see the module docstring for the measurements)
_WARNED: set = set()


def render_sms_setting() -> str:
    """YUE2_RENDER_SMS as given: "auto" (unset), "0" or a decimal count. RequestError otherwise."""
    import os
    from ..errors import RequestError
    value = os.environ.get(SWITCH, "").strip() or "auto"
    if value != "auto" and not (value.isascii() and value.isdigit() and len(value) <= 4):
        raise RequestError(f"the environment variable {SWITCH} must be 'auto', 0 or a number of SMs (or unset), "
                           f"got {value[:40]!r}{' …' if len(value) > 40 else ''}")
    return value


class Place:
    """Where a stage runs: its stream and, in a green context, the stream its graphs are captured on. A context
    manager for the thread that runs the stage."""

    def __init__(self, stream, capture=None, label: str = "", keep=None):
        self.stream, self.capture, self.label, self.keep = stream, capture, label, keep
        self._stack = None

    def __enter__(self):
        import torch
        from ..fast.decode import capture_on
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(torch.cuda.stream(self.stream))
        if self.capture is not None:
            self._stack.enter_context(capture_on(self.capture))
        return self

    def __exit__(self, *exc):
        stack, self._stack = self._stack, None
        stack.close()


def _green(sms: int, device_index: int, label: str) -> Place:
    from torch.cuda.green_contexts import GreenContext
    ctx = GreenContext.create(num_sms=sms, device_id=device_index)
    return Place(ctx.Stream(), ctx.Stream(), label, keep=ctx)


_PLAIN: dict = {}  # (device, priority) → the process's stream of that priority


def _stream(device, priority: int):
    """One stream per (device, priority) for the process: PyTorch keeps a cuBLAS workspace per (handle, stream) for
    the life of the process (32 MiB each on Hopper), so new streams per batch run would leave one behind each time
    (as the warm-up's did: `warmup.side_stream`)."""
    import torch
    key = (str(device), priority)
    if key not in _PLAIN:
        _PLAIN[key] = torch.cuda.Stream(device, priority=priority)
    return _PLAIN[key]


def placements(device) -> tuple[Place, Place, str]:
    """(AR place, render place, a line saying which) for the overlap on CUDA `device`. A green context that cannot
    be made (a K outside 8 … SMs − 8, no cuda-bindings, an old driver or torch) falls back to the low-priority
    stream with one warning per process — never an error in the middle of a batch. RequestError for a
    YUE2_RENDER_SMS that is not 'auto' or a number (the CLI checks that before any work)."""
    import torch
    setting = render_sms_setting()
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).multi_processor_count
    ar = Place(_stream(device, -1), label="high-priority stream")
    k = AUTO if setting == "auto" else int(setting)
    if k:
        why = None
        if not 8 <= k <= total - 8:
            why = f"this GPU has {total} SMs: give the render 8 … {total - 8} of them, or 0"
        else:
            try:
                render = _green(k, index, f"green context of {k} SMs")
                return ar, render, f"render on {k} of {total} SMs (a CUDA green context), AR on all of them"
            except Exception as exc:  # noqa: BLE001 - no cuda-bindings, driver < 12.8, torch without GreenContext
                why = f"no CUDA green context here ({type(exc).__name__}: {exc})"
        if "split" not in _WARNED:
            _WARNED.add("split")
            warnings.warn(f"{SWITCH}={setting}: {why}; the render runs on a low-priority stream over every SM")
    render = Place(_stream(device, 0), label="low-priority stream")
    return ar, render, "render and AR share every SM (streams of low and high priority)"


def check_switch() -> None:
    """Validate YUE2_RENDER_SMS up front (the CLI's switch check)."""
    render_sms_setting()


__all__ = ["Place", "placements", "render_sms_setting", "check_switch", "SWITCH", "AUTO"]
