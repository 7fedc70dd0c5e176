"""Progress, Cancel and error translation between the engine and ComfyUI.

`StageProgress` is the engine's progress callback (stage, done, total, info): it checks ComfyUI's Cancel flag on every
call (every sampled token, ODE step and VAE tile) and feeds one ComfyUI ProgressBar per stage. The engine lets the
InterruptProcessingException through, so a cancelled stage leaves nothing behind (song directories are only
written by YuE2 Save Song, atomically).

`user_errors()` turns the engine's typed errors (YuE2Error: messages written for users) into plain ValueErrors with
the same text, so ComfyUI shows the message without a traceback from inside the engine. `surrogate_safe(node)` makes
the messages of everything a node raises printable (nodes/__init__.py applies it to every node).
"""
from __future__ import annotations

import functools
import logging
import re
import time
from contextlib import contextmanager
from typing import ClassVar

import comfy.model_management as mm
import comfy.utils

from yue2_core.errors import YuE2Error, release_frames

log = logging.getLogger("ComfyUI-YuE2")


def check_cancel() -> None:
    """Raise ComfyUI's InterruptProcessingException when the user pressed Cancel."""
    mm.throw_exception_if_processing_interrupted()


class StageProgress:
    """Callback for yue2_core stages: `progress(stage, done, total, info)`. `rates[stage]` keeps the last tokens/s."""

    UNITS: ClassVar[dict] = {"plan": "ABC tokens", "semantic": "music tokens", "render": "ODE steps",
                             "decode": "VAE tiles"}

    def __init__(self, node: str):
        self.node = node
        self.stage = None
        self.bar = None
        self.rates: dict[str, float] = {}
        self._logged = 0.0

    def start(self, stage: str, total: int, what: str) -> None:
        """Announce a stage (one log line, a fresh bar) and check Cancel before it allocates anything."""
        check_cancel()
        log.info("[YuE2] %s: %s", self.node, what)
        self.stage, self.bar = stage, comfy.utils.ProgressBar(max(1, int(total)))

    def __call__(self, stage: str, done: int, total: int, info: dict) -> None:
        check_cancel()
        if stage != self.stage or self.bar is None:
            self.stage, self.bar = stage, comfy.utils.ProgressBar(max(1, int(total)))
        self.bar.update_absolute(done, total)
        rate = info.get("tokens_per_second")
        if rate:
            self.rates[stage] = rate
            now = time.monotonic()
            if now - self._logged > 10:  # a console heartbeat for long phases
                self._logged = now
                log.info("[YuE2] %s: %s %d/%d %s, %.1f tok/s", self.node, stage, done, total,
                         self.UNITS.get(stage, ""), rate)


_WARNED: set = set()  # switch warnings already logged by this process


def busy_cpu_notes(device, node: str) -> list[str]:
    """[a note, also logged before the work] when the model samples on a CPU that other jobs already keep busy and
    ComfyUI was started without OMP_NUM_THREADS — as the command line says it (new-user review, stop 48: a ComfyUI
    server on a shared 2-core machine sampled 3–5 tokens/s, 33 once started with OMP_NUM_THREADS=1, and neither the
    node nor docs/comfyui.md said so). The server's own earlier songs are no reason: the cores' counters decide, this
    process's own time taken out (`busy_cpu_reason(own_load=True)`)."""
    if getattr(device, "type", None) != "cpu":
        return []
    from yue2_core.cli.busy_cpu import busy_cpu_reason
    said = busy_cpu_reason(own_load=True)
    if not said:
        return []
    note = (f"this CPU is busy ({said}) and ComfyUI was started without OMP_NUM_THREADS: PyTorch's threads then "
            "compete with the other jobs, which can make sampling several times slower; start ComfyUI as "
            "`OMP_NUM_THREADS=1 python main.py …` (docs/comfyui.md, \"A CPU other jobs share\")")
    log.warning("[YuE2] %s: %s", node, note)
    return [note]


def check_switches(device) -> None:
    """The YUE2_* environment switches checked before a node's work (`switch_check.check_environment`, as the command
    line does): a bad value raises ValueError naming it and what it accepts — before a Composer decodes, not when the
    Renderer meets it (break-it finding); a warning (an unknown YUE2_ variable, a GPU-only switch on a CPU model) is
    logged once per process."""
    from yue2_core.switch_check import check_environment
    with user_errors():
        warnings = check_environment(str(device))
    for warning in warnings:
        if warning not in _WARNED:
            _WARNED.add(warning)
            log.warning(warning)


@contextmanager
def user_errors():
    """Re-raise yue2_core's YuE2Error as a plain ValueError carrying only the engine's message; any exception
    (Cancel's InterruptProcessingException, out-of-memory) leaves with the engine's frames released."""
    try:
        yield
    except YuE2Error as exc:
        release_frames(exc)
        raise ValueError(str(exc)) from None
    except BaseException as exc:
        release_frames(exc)
        raise


_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_surrogates(exc: BaseException | None) -> None:
    """Write every unpaired surrogate (U+D800–U+DFFF) in the text arguments of `exc` and of the exceptions it was
    raised from or during as its escape, `\\ud800`: the messages then print and encode as UTF-8."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any(isinstance(a, str) and _SURROGATE.search(a) for a in exc.args):
            exc.args = tuple(_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", a) if isinstance(a, str) else a
                             for a in exc.args)
        exc = exc.__cause__ or exc.__context__


def surrogate_safe(node: type) -> type:
    """Wrap the node's `execute` so that what it raises carries no unpaired surrogate (`escape_surrogates`).

    ComfyUI 0.3.75 logs a node's error in its except block, to a stderr wrapper that encodes UTF-8 strictly: a message
    holding one (a score with a JSON "\\ud800" escape in the ABC Editor quotes `K:C\\ud800`) failed that write, the
    logging module's report of the failure printed the node's error again and failed again, and that error ended
    ComfyUI's prompt worker thread — the queue stopped for good, every later prompt waiting until a restart (break-it
    review, stop 55)."""
    execute = node.__dict__["execute"].__func__

    @functools.wraps(execute)
    def guarded(cls, *args, **kwargs):
        try:
            return execute(cls, *args, **kwargs)
        except Exception as exc:
            escape_surrogates(exc)
            raise

    node.execute = classmethod(guarded)
    return node
