"""The command line's progress line: one rewritten stderr line on a terminal, plain lines elsewhere."""
from __future__ import annotations

import sys
import time


class ProgressLine:
    """One status line per stage on stderr: stage, done/total and tokens/s (updated in place on a terminal)."""

    def __init__(self, stream=None):
        stream = stream or sys.stderr  # looked up now: sys.stderr may have been replaced since the import
        self.stream, self.tty, self.last, self.stage, self.t0 = stream, stream.isatty(), 0.0, None, time.time()

    def __call__(self, stage, done, total, info):
        now = time.time()
        if stage != self.stage:
            if self.stage is not None and self.tty:
                self.stream.write("\n")
            self.stage, self.t0 = stage, now
        if not (done == total or now - self.last > (0.1 if self.tty else 5.0)):
            return
        self.last = now
        rate = info.get("tokens_per_second")
        unit = {"plan": "ABC tokens", "semantic": "music tokens", "render": "ODE steps",
                "decode": "VAE tiles"}.get(stage, "")
        text = f"[{stage}] {done}/{total} {unit}" + (f" · {rate:.1f} tok/s" if rate else "")
        self.stream.write(("\r" + text) if self.tty else (text + "\n"))
        self.stream.flush()

    def close(self):
        if self.tty and self.stage is not None:
            self.stream.write("\n")
