"""batch.json and what the terminal shows (driver side).

batch.json (the vendor's summary, runtime.md §7.4, plus our details), rewritten atomically after every song:

    {"complete": int, "expected": int, "failed": int, "pending": int, "interrupted": bool,
     "stopped": why the run stopped before its pending rows (only then: "the disk is full"),
     "left_for_resume": [ids --resume computes: the pending rows and those failed at a computing stage, in file
                         order] (only when the run stopped or was interrupted),
     "settings": {...the command's options...},
     "results": [{"id", "line", "status": "complete" | "failed" | "pending", "resumed", "stage", "output", "error",
                  "audio_seconds", "semantic_tokens", "abc_tokens", "truncated", "rows", "timing"}, … in file order]}

A "pending" row of a run that stopped early has "stage": the last AR phase its song finished ("plan", "semantic";
null: not started) and "note": what became of it (e.g. "its lead sheet and music tokens were computed but it was
not rendered or saved (the disk is full); --resume computes it from the start").

A row without a readable id (not JSON, no id) has "id": null and is found by its line.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

BATCH_FILE = "batch.json"
FULL_ERROR_LINES = 300  # the most lines of "errors in full" the table prints


class BatchSummary:
    """The per-row results of one batch run, in request-file order (keyed by line)."""

    def __init__(self, settings: dict | None = None):
        self.rows: dict[int, dict] = {}
        self.settings = dict(settings or {})
        self.interrupted = False
        self.stopped: str | None = None  # why the run stopped before its pending rows (the disk is full)
        self._written: tuple[bytes | None, bytes | None] = (None, None)  # batch.json's bytes: on disk, being written

    def add(self, line: int, id: str | None, status: str, **fields) -> None:
        """Record (or replace) the result of the row on `line`."""
        self.rows[line] = {"id": id, "line": line, "status": status, "resumed": False, "stage": None, "output": None,
                           "error": None, **fields}

    def count(self, status: str) -> int:
        return sum(1 for r in self.rows.values() if r["status"] == status)

    def to_dict(self) -> dict:
        """batch.json's content (module docstring); "stopped" only when the run stopped early (the disk is full)."""
        out = {"complete": self.count("complete"), "expected": len(self.rows), "failed": self.count("failed"),
               "pending": self.count("pending"), "interrupted": self.interrupted, "settings": self.settings,
               "results": [self.rows[k] for k in sorted(self.rows)]}
        if self.stopped:
            out["stopped"] = self.stopped
        if self.stopped or self.interrupted:
            out["left_for_resume"] = self.left_for_resume()
        return out

    def left_for_resume(self) -> list:
        """Ids of the rows `--resume` computes: pending, or failed at a stage that computes (not a row refused as
        read — "validate" — or by the resume checks, which fail the same way again until fixed)."""
        return [r["id"] for r in (self.rows[k] for k in sorted(self.rows)) if r["id"] is not None and (
            r["status"] == "pending" or (r["status"] == "failed" and r.get("stage") not in ("validate", "resume")))]

    def outcome_lines(self) -> str:
        """Which songs were saved, which failed (at which stage) and which are left for --resume, one line each."""
        rows = [self.rows[k] for k in sorted(self.rows)]
        saved = [r["id"] or f"line {r['line']}" for r in rows if r["status"] == "complete"]
        failed = [f"{r['id'] or 'line ' + str(r['line'])} (at {r.get('stage') or '?'})" for r in rows
                  if r["status"] == "failed"]
        left = [r["id"] + (f" (after {r['stage']}, not rendered)" if r.get("stage") else "") for r in rows
                if r["status"] == "pending" and r["id"] is not None]
        return "\n".join([f"  saved: {', '.join(saved) or 'none'}", f"  failed: {', '.join(failed) or 'none'}",
                          f"  left for --resume: {', '.join(self.left_for_resume()) or 'none'}"
                          + (f" — not computed: {', '.join(left)}" if left else "")])

    def write(self, folder: str | os.PathLike) -> Path:
        """Write batch.json into `folder` atomically (temporary file fsynced + os.replace, then the folder fsynced):
        a reader sees the previous or the new summary, never half of one, and the rename outlives a crash."""
        from ..artifacts import _json_bytes, signals_held
        folder = Path(folder)
        data = _json_bytes(self.to_dict())
        self._written = (self._written[0], data)  # before the rename: `holds_mine` on another thread sees either
        with signals_held():  # a Ctrl+C between the temporary file's creation and its cleanup left it (break-it,
            path = self._write(folder, data)  # stop 39): delivered once the file is in place or removed
        self._written = (data, data)
        return path

    def holds_mine(self, folder: str | os.PathLike) -> bool:
        """Whether `folder`'s batch.json holds what this summary last wrote (or is writing): the folder is the one
        this run writes, whatever its device and inode numbers say now (driver `_moved`)."""
        if self._written[1] is None:
            return False
        try:
            with open(Path(folder) / BATCH_FILE, "rb") as fh:
                data = fh.read(max(len(d or b"") for d in self._written) + 1)
        except OSError:
            return False
        return data in self._written

    def _advice(self, exc: OSError) -> str:
        """What to do when batch.json could not be written, by the error: free space (ENOSPC / EDQUOT), a shorter
        --output (a name or path too long), the folder's permissions, else fix the folder — and whether saved
        songs wait for --resume (was: "the songs already saved are intact; free space …" for any error, also
        before any song and for a path too long)."""
        import errno
        from ..artifacts import FULL_ERRNOS
        saved = self.count("complete")
        if exc.errno in FULL_ERRNOS:
            fix = "free space"
        elif exc.errno == errno.ENAMETOOLONG:
            fix = "the path is longer than this file system takes: give a shorter --output"
        elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            fix = "make the folder writable"
        else:
            fix = "fix the folder"
        if exc.errno == errno.ENAMETOOLONG:
            return f" ({fix}{'; the songs already saved are intact' if saved else ''})"
        if saved:
            return (f" (the {saved} song{'s' if saved != 1 else ''} already saved {'are' if saved != 1 else 'is'} "
                    f"intact; {fix}, then run the same command with --resume)")
        if self.settings.get("resume"):  # the folder's songs (refused, set aside, pending) stay as they were
            return f" (the song folders there are left as they were; {fix}, then run the same command with --resume)"
        return f" (no song of it is saved yet; {fix}, then run the same command again)"

    def _write(self, folder: Path, data: bytes) -> Path:
        from ..artifacts import UMASK, fsync_file, fsync_folder, write_error
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{BATCH_FILE}.", suffix=".tmp", dir=folder)
        except OSError as exc:
            raise write_error(exc, f"cannot write {folder / BATCH_FILE}", self._advice(exc)) from None
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                fsync_file(fh.fileno())
            os.chmod(tmp, 0o644 & ~UMASK)  # mkstemp makes it 0600; readable like the song files
            os.replace(tmp, folder / BATCH_FILE)
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise write_error(exc, f"cannot write {folder / BATCH_FILE}", self._advice(exc)) from None
            raise
        try:  # the rename itself, as a song folder's (artifacts.write_song_dir): batch.json outlives a crash or power
            fsync_folder(folder)  # cut soon after it; the file is in place, so never an error now
        except OSError:
            pass
        return folder / BATCH_FILE

    def table(self, written: bool = True) -> str:
        """A plain-text table of every row: id, status, stage, audio seconds, lead-sheet (ABC) and music tokens, rows
        decoded together and the error (first line, shortened). `written`: whether batch.json holds these rows (not
        when every row failed before any work: the pointer past the capped "errors in full" then says so)."""
        head = ("line", "id", "status", "stage", "audio s", "abc", "music", "rows", "note")
        lines = []
        for r in (self.rows[k] for k in sorted(self.rows)):
            note = (r.get("error") or "").splitlines()[0][:90] if r.get("error") else (
                "resumed (verified)" if r.get("resumed") else (r.get("note") or "")[:90])
            audio = r.get("audio_seconds")
            lines.append((str(r["line"]), str(r["id"] or "-"), r["status"], str(r.get("stage") or "-"),
                          f"{audio:.2f}" if isinstance(audio, (int, float)) else "-",
                          str(r.get("abc_tokens") if r.get("abc_tokens") is not None else "-"),
                          str(r.get("semantic_tokens") if r.get("semantic_tokens") is not None else "-"),
                          str(r.get("rows") or "-"), note))
        widths = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h) for i, h in enumerate(head)]
        fmt = lambda cols: "  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()  # noqa: E731
        d = self.to_dict()
        foot = f"{d['complete']} of {d['expected']} complete, {d['failed']} failed" + (
            f", {d['pending']} not run ({self.stopped or 'interrupted'})" if d["pending"] else "")
        # errors cut in the table come whole below it (batch.json has them too)
        cut = [f"line {r['line']} ({r['id'] or '-'}): {_without_line(r['error'], r['line'])}"
               for r in (self.rows[k] for k in sorted(self.rows))
               if r.get("error") and r["error"].splitlines()[0][:90] != r["error"]]
        errors = ["", "errors in full:"] if cut else []
        shown = 0
        for entry in cut:  # at most FULL_ERROR_LINES lines (break-it review, stop 46: 200,000 bad rows printed
            size = entry.count("\n") + 1  # 400,000 lines); batch.json keeps every error whole
            if shown + size > FULL_ERROR_LINES and entry is not cut[0]:
                rest = len(cut) - (len(errors) - 2)
                errors.append(f"… {rest:,} more error{'s' if rest != 1 else ''} not shown here: " + (
                    f"every row's error is whole in {BATCH_FILE} (\"results\": \"error\")" if written else
                    f"nothing ran, so no {BATCH_FILE} keeps them; fix the rows above and run again to see the rest"))
                break
            errors.append(entry)
            shown += size
        return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, lines), foot, *errors])


def _without_line(error: str, line) -> str:
    """A row's error without its own "line N: " prefix (the full-error list names the line already)."""
    return error.removeprefix(f"line {line}: ")


class BatchProgress:
    """Progress on a stream: a line when a song enters a stage and when it ends it (count = total), and at most every
    0.2 s (terminal) / 5 s (log) an update with its count; the AR stages (plan, semantic) with the aggregate AR
    rate (tokens per second over all songs). A "failed" event (info "at": the stage, "error") is one line
    `failure_line`, and its song is remembered in `failed` so that the driver does not print it again."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.stage: dict[str, str] = {}
        self.last = 0.0
        self.failed: set[str] = set()  # songs whose failure is printed (the driver does not print it again)

    def __call__(self, song_id: str, stage: str, info: dict) -> None:
        if info.get("note"):  # a line about the whole batch (e.g. where the overlapped stages run)
            self.stream.write(f"{info['note']}\n")
            self.stream.flush()
            return
        if stage == "failed":  # as soon as it happens, once (stop 40 review: this line and the driver's, twice)
            self.failed.add(song_id)
            self.stage[song_id] = stage
            self.stream.write(failure_line(song_id, info.get("at"), info.get("error")) + "\n")
            self.stream.flush()
            return
        now = time.time()
        done, total, rows = info.get("done"), info.get("total"), info.get("rows", 1)
        new = self.stage.get(song_id) != stage
        last = done is not None and bool(total) and done >= total
        if not (new or last or now - self.last > (0.2 if self.tty else 5.0)):
            return
        self.stage[song_id], self.last = stage, now
        count = f" {done}/{total}" if done is not None and total else ""
        batch = f" · {rows} songs in the batch" if rows and rows > 1 else ""
        error = f": {info['error']}" if info.get("error") else ""
        rate = (f" · {info.get('aggregate_tokens_per_second') or 0.0:.1f} tok/s aggregate"
                if stage in ("plan", "semantic") else "")
        self.stream.write(f"[{song_id}] {stage}{count}{batch}{error}{rate}\n")
        self.stream.flush()


def failure_line(song_id: str, stage: str | None, error: str | None) -> str:
    """How the terminal says that a song failed: "[id] failed at STAGE: error"."""
    return f"[{song_id}] failed" + (f" at {stage}" if stage else "") + (f": {error}" if error else "")


# the largest batch.json read back: a request file holds at most 64 MiB of rows, and a row's record is well under
# 16 times its request line; a batch.json padded to 3 GB (zeros after a crash) held 6.9 GB of memory at --resume
# before it was found unreadable (break-it review, stop 48)
MAX_SUMMARY_BYTES = 1 << 30


def load_summary(folder: str | os.PathLike) -> dict | None:
    """A batch.json read back (None when absent, unreadable or larger than MAX_SUMMARY_BYTES: --resume then
    rebuilds it from the songs, as for a damaged one)."""
    path = Path(folder) / BATCH_FILE
    try:
        if path.stat().st_size > MAX_SUMMARY_BYTES:
            return None
        obj = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


__all__ = ["BatchSummary", "BatchProgress", "load_summary", "failure_line", "BATCH_FILE"]

