"""Song directories in the official runtime's layout (runtime.md §7.3), written atomically.

    score.abc        UTF-8 ABC text (absent in cot off)
    abc_tokens.npy   int32 exact ABC ids
    prefix.npy       int32 semantic-stage prefix (ends with MUSIC_START)
    semantic.npy     int32 codes 0 … 32767 (25 per second)
    latent.npy       float32 [T, 64]
    audio.flac       48 kHz stereo PCM_24
    request.json     the request; config.json the effective settings
    plan.json        the vendor's plan: {request, timing, truncated, prefix, abc_ids, abc} (runtime.md §7.3)
    plan_manifest.json  {plan file: sha256} of plan.json, abc_tokens.npy, prefix.npy (and score.abc), so the
                     vendor's `SymbolicPlan.load(dir)` restores the exact ids from our folders
    result.json      status, identity (sha256 of the canonical request/config/weights JSON, the vendor's rule),
                     weights (the vendor's {"mot", "vae"} entries, plus our "loras"), timings, truncation flags,
                     {file: {sha256, bytes}} for every other file (audio.flac also `samples_sha256`, its decoded
                     samples' hash: a retagged file still loads), and `result_sha256`: the hash of result.json's
                     values (all but the manifest and itself; an edited seed or budget is refused at load)

Everything is written into a temporary sibling directory and renamed into place, so a failed or cancelled save
leaves nothing partial and never touches an existing song; a non-empty target directory is refused. The vendor's
`verify_result` / `--resume` check the same manifest; folders written before plan.json existed load as before.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .constants import FRAMES_PER_SECOND, MAX_ODE_STEPS, SAMPLE_RATE
from .errors import NO_LOCKS, ArtifactError, DiskFullError, json_number_too_long
from .pipeline import Score, SemanticTokens, Song
from .protocol import _finite_number, blank_score, valid_song_id

FILES = ("score.abc", "abc_tokens.npy", "prefix.npy", "semantic.npy", "latent.npy", "audio.flac", "request.json",
         "config.json")


def safe_name(name: str) -> str:
    """Validate a song id / folder name: 1–180 chars of A–Z a–z 0–9 _ . -, starting with a letter or digit, not a
    reserved device name, no path separators. Raises ArtifactError otherwise."""
    if not valid_song_id(name):
        raise ArtifactError(f"song name {name!r} is not allowed: use 1–180 characters from A–Z a–z 0–9 _ . -, "
                            "starting with a letter or digit, not ending with '.' (no '/', '..', or reserved names "
                            "like CON)")
    return name


def text_of(value: str) -> str:
    """`value` as text every JSON writer takes: a path holding bytes that are not UTF-8 (Python keeps them as lone
    surrogates U+DC80–U+DCFF, "surrogateescape") gets each such byte written as `\\xNN` instead; valid text is
    returned unchanged."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape" if _only_escapes(value) else "backslashreplace") \
            .decode("utf-8", "backslashreplace")


def _only_escapes(value: str) -> bool:
    return all(not 0xD800 <= ord(c) <= 0xDFFF or 0xDC80 <= ord(c) <= 0xDCFF for c in value)


def json_safe(obj, fs_names: bool = False):
    """A copy of a JSON-able object whose strings (keys included) are all valid UTF-8 (`text_of`) and whose numpy
    scalars are Python numbers (an np.int64 setting would otherwise stop the save after the work: break-it).
    `fs_names`: a string whose only non-UTF-8 characters are the surrogate escapes of file-system bytes (a path
    with a Latin-1 name, os.fsdecode) is kept as it is, for `_json_bytes` to write losslessly."""
    if isinstance(obj, str):
        return obj if fs_names and _only_escapes(obj) else text_of(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {json_safe(k, fs_names) if isinstance(k, str) else k: json_safe(v, fs_names) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v, fs_names) for v in obj]
    return obj


def _json_bytes(obj) -> bytes:
    """Indent 2, ensure_ascii=False, allow_nan=False, trailing newline (runtime.md §7.3). A path holding bytes that
    are not UTF-8 (Python keeps each as a surrogate escape U+DC80–U+DCFF) is written with a JSON `\\udcNN` escape
    per such byte, so `json.loads` gives back the same string and the os functions the same bytes (review, stop 41:
    `\\xNN` text named another file, reported missing on render); other text that is not valid Unicode gets
    `\\xNN` escapes (`text_of`) instead of failing after the song was computed. Everything else is UTF-8."""
    text = json.dumps(json_safe(obj, fs_names=True), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    return text.encode("utf-8", "backslashreplace")  # only a lone surrogate fails: written as its \\uXXXX escape


def canonical_sha256(obj) -> str:
    """sha256 of the canonical JSON of `obj` (sorted keys, compact separators, ensure_ascii=False, allow_nan=False):
    the vendor's request identity rule (runtime.md §7.1)."""
    return hashlib.sha256(json.dumps(json_safe(obj), ensure_ascii=False, sort_keys=True, separators=(",", ":"),
                                     allow_nan=False).encode("utf-8")).hexdigest()


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def flac_bytes(audio: torch.Tensor, sample_rate: int = SAMPLE_RATE) -> bytes:
    """audio [channels, samples] float in [−1, 1] → FLAC PCM_24 bytes, decoded back once to check them. Raises
    ArtifactError when libsndfile wrote something that does not decode to the same frames and channels.

    soundfile writes into memory through Python callbacks (cffi), and cffi prints and drops an exception raised
    inside one — so a Ctrl+C or SIGTERM whose handler raised there was lost, and the encode could return broken bytes
    that were then sealed as a complete song (break-it review, stop 39: 52 of 60 signals swallowed). On the main
    thread SIGINT / SIGTERM / SIGHUP are held during the encode and delivered, to the program's own handlers, after
    it."""
    import soundfile as sf
    data = audio.detach().float().cpu().numpy().T
    buf = io.BytesIO()
    with signals_held():
        sf.write(buf, data, sample_rate, format="FLAC", subtype="PCM_24")
    encoded = buf.getvalue()
    try:
        with signals_held(), sf.SoundFile(io.BytesIO(encoded)) as check:
            info = check
            frames = sum(len(block) for block in check.blocks(blocksize=1 << 16, dtype="int32", always_2d=True))
    except Exception as exc:  # libsndfile's own error types
        raise ArtifactError(f"the FLAC encoder wrote audio that does not decode ({exc}); nothing was saved") from None
    if (frames, info.channels, info.samplerate) != (data.shape[0], data.shape[1], sample_rate):
        raise ArtifactError(f"the FLAC encoder wrote {frames} frames × {info.channels} channels at "
                            f"{info.samplerate} Hz for {data.shape[0]} × {data.shape[1]} at {sample_rate}; nothing "
                            "was saved")
    return encoded



def flac_samples_sha256(source) -> str | None:
    """sha256 of the samples a FLAC holds — its channel count, rate and every frame's int32 values (PCM_24 scaled,
    exact: FLAC is lossless) — from `source`, its bytes or a path; None when it does not decode. What a song's
    manifest records beside audio.flac's file hash (`samples_sha256`), so a file whose tags or container a player
    or tag editor rewrote is told from different audio (stop 47: such a song was refused by Load Song, Regenerate
    and Continue, which read its samples)."""
    import soundfile as sf
    h = hashlib.sha256()
    try:
        with signals_held(), sf.SoundFile(io.BytesIO(source) if isinstance(source, bytes) else str(source)) as f:
            h.update(f"{f.channels}:{f.samplerate}:".encode())
            for block in f.blocks(blocksize=1 << 16, dtype="int32", always_2d=True):
                h.update(block.astype("<i4", copy=False).tobytes())
    except Exception:  # libsndfile's own error types: not a FLAC (any more)
        return None
    return h.hexdigest()

@contextlib.contextmanager
def signals_held():
    """Hold SIGINT, SIGTERM and SIGHUP while the block runs (main thread only: elsewhere Python runs no signal
    handler), then deliver any that came to the handlers the program had (`signal.raise_signal`)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list = []
    held = {}
    for name in ("SIGTERM", "SIGHUP", "SIGINT"):  # delivered in this order: a KeyboardInterrupt ends the delivery
        sig = getattr(signal, name, None)
        if sig is None or signal.getsignal(sig) is None:  # a handler installed from C cannot be put back: not held
            continue
        try:
            held[sig] = signal.signal(sig, lambda signum, frame: caught.append(signum))
        except (ValueError, OSError, TypeError):  # not settable here
            continue
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for sig in sorted(set(caught), key=list(held).index):
            signal.raise_signal(sig)


def _check_savable(song: Song) -> None:
    """What load_song would refuse in the settings, refused before writing (break-it finding: Save Song wrote a
    LATENT's ode_steps of 10⁹, which Load Song then refused): ode_steps an integer in [1, MAX_ODE_STEPS]."""
    import numbers
    steps = (song.settings or {}).get("ode_steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, numbers.Integral)
                              or not 1 <= steps <= MAX_ODE_STEPS):  # numpy integers are integers (break-it)
        raise ArtifactError(f"ode_steps must be an integer in [1, {MAX_ODE_STEPS}] to be saved (a song folder with "
                            f"another value could not be loaded back), got {steps!r}")


def song_files(song: Song, extra: dict | None = None) -> dict[str, bytes]:
    """Serialise a Song into {file name: bytes} (no disk access). A Song without latents or audio (None) is saved
    without latent.npy / audio.flac (e.g. tokens kept right after composing)."""
    _check_savable(song)
    files = {}
    if song.score.abc is not None:
        files["score.abc"] = song.score.abc.encode("utf-8")
    files["abc_tokens.npy"] = _npy_bytes(np.asarray(song.score.abc_ids, dtype=np.int32))
    files["prefix.npy"] = _npy_bytes(np.asarray(song.tokens.prefix, dtype=np.int32))
    files["semantic.npy"] = _npy_bytes(np.asarray(song.tokens.codes, dtype=np.int32))
    if song.latents is not None:
        latents = song.latents.detach().float().cpu().numpy().astype(np.float32)
        if not np.isfinite(latents).all():  # load_song refuses such a folder: never write one (break-it finding)
            raise ArtifactError("the latents hold NaN or infinite values (in float32, as latent.npy stores them); a "
                                "song folder with them could not be loaded back — render the tokens again")
        files["latent.npy"] = _npy_bytes(latents)
    if song.audio is not None:
        if not torch.isfinite(song.audio).all():  # soundfile failed with an empty AssertionError (break-it finding)
            raise ArtifactError("the audio holds NaN or infinite samples; it cannot be written as FLAC — decode the "
                                "latents again (or remove the node that produced them)")
        files["audio.flac"] = flac_bytes(song.audio, song.sample_rate)
    for name, obj in (("request.json", song.tokens.request), ("config.json", song.settings)):
        try:
            files[name] = _json_bytes(obj)
        except ValueError as exc:  # allow_nan=False: an inf/NaN setting (break-it: a model config's inf rope_theta)
            raise ArtifactError(f"{name} cannot be written: {exc} (a setting is NaN or infinite)") from None
    files.update(plan_files(song, files))
    return files


PLAN_FILES = ("plan.json", "abc_tokens.npy", "prefix.npy", "score.abc")


def plan_files(song: Song, files: dict[str, bytes]) -> dict[str, bytes]:
    """plan.json and plan_manifest.json as the vendor's `SymbolicPlan.save` writes them (runtime.md §7.3): plan.json
    = {request, timing, truncated, prefix, abc_ids, abc} (the song's score: abc_ids = abc_tokens.npy, abc =
    score.abc's text; prefix = prefix.npy, the semantic-stage prefix the codes were sampled after), plan_manifest.json = {name: sha256 hex} of plan.json, abc_tokens.npy, prefix.npy
    and score.abc when there is one. `files` must already hold the .npy files and score.abc."""
    score = song.score
    plan = {"request": song.tokens.request, "timing": score.timing, "truncated": bool(score.truncated),
            "prefix": [int(t) for t in song.tokens.prefix], "abc_ids": [int(t) for t in score.abc_ids],
            "abc": score.abc}
    out = {"plan.json": _json_bytes(plan)}
    names = [n for n in PLAN_FILES if n in out or n in files]
    out["plan_manifest.json"] = _json_bytes({n: hashlib.sha256(out.get(n, files.get(n))).hexdigest()
                                             for n in names})
    return out


def _read_umask() -> int:
    """The process's umask, read once at import: reading it means setting it, and a transient umask 0 in one thread
    (the batch's render worker saves songs beside the main thread) would let another thread create files 0666."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _read_umask()  # for chmod of what mkdtemp/mkstemp create 0700/0600 (song folders, batch.json)
STALE_PARTIAL_SECONDS = 3600  # a save takes seconds; a hidden .partial folder this old was left by a killed process
PARTIAL_MARKER = ".yue2-partial"  # written first into every temporary save folder: {"pid", "host", "created"}


def _marker_bytes() -> bytes:
    import socket
    return _json_bytes({"pid": os.getpid(), "host": socket.gethostname(), "created": time.time()})


def _abandoned(folder: Path, now: float) -> bool:
    """True for a temporary folder of a save that can no longer finish: it carries our marker, holds nothing but
    song files, and its writer (same host) is gone — or it is older than STALE_PARTIAL_SECONDS, as is an empty one
    (a save killed between making the folder and writing its marker) or one whose marker cannot be read (a power
    cut before the marker reached the disk): break-it review 52, those were kept forever."""
    import socket
    try:
        if folder.is_symlink() or not folder.is_dir():
            return False
        names = {p.name for p in folder.iterdir()}
        old = now - folder.stat().st_mtime > STALE_PARTIAL_SECONDS
        if not names:  # nothing in it to lose: a save that just made it writes its marker within milliseconds
            return old
        if PARTIAL_MARKER not in names or not names <= {PARTIAL_MARKER, *FILES, *PLAN_FILES, "plan_manifest.json",
                                                          "result.json"}:
            return False
        if old:  # before reading the marker: one left empty or half-written by a crash is still ours
            return True
        marker = json.loads((folder / PARTIAL_MARKER).read_text("utf-8"))
        if marker.get("host") != socket.gethostname() or type(marker.get("pid")) is not int:
            return False
        os.kill(marker["pid"], 0)
        return False
    except ProcessLookupError:
        return True
    except (OSError, ValueError, AttributeError):
        return False


def _sweep_stale_partials(parent: Path) -> None:
    """Remove hidden `.NAME.XXXXXXXX.partial` folders in `parent` that a save of this pack was killed in the middle
    of (SIGKILL, a power cut): only folders carrying our marker file and nothing but song files, whose process is
    gone (or that are over an hour old). A look-alike folder of anyone else is never touched."""
    now = time.time()
    for p in parent.glob(".*.partial"):
        if re.fullmatch(r"\..+\.[A-Za-z0-9_]{8}\.partial", p.name) and _abandoned(p, now):
            shutil.rmtree(p, ignore_errors=True)


class Reservation:
    """A claim on an output path by this process: an advisory lock (flock) held on the file `.NAME.yue2-lock` beside
    it, which holds {"pid", "host", "created"} for the messages. The kernel drops the lock when the process ends in
    any way (SIGKILL, OOM, a container stop), so a claim never outlives its run. `release()` removes the file and
    drops the lock (once; also at interpreter exit). `note`: why there is no claim, for the caller to print as a
    warning (a file system that takes no locks), else None."""

    def __init__(self, lock: Path | None, fd: int | None = None, made: tuple[Path, ...] = (), note: str | None = None):
        self.lock, self.fd, self.made, self.note = lock, fd, made, note
        if fd is not None:
            import atexit
            atexit.register(self.release)

    def release(self) -> None:
        """Drop the claim; the parent folders the claim made are removed again when they stayed empty (a refused or
        failed run leaves no new folders — break-it finding)."""
        lock, fd, made, self.lock, self.fd, self.made = self.lock, self.fd, self.made, None, None, ()
        if fd is None:
            return
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:  # still ours (not replaced): remove it while locked
                lock.unlink()
        except OSError:
            pass
        finally:
            os.close(fd)  # drops the lock
        _remove_empty(made)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _remove_empty(folders: tuple[Path, ...]) -> None:
    """rmdir each of `folders` (deepest first) until one is not empty (a saved song) or cannot be removed."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break


def _holder(fd: int) -> str:
    """'pid N' (or 'pid N on host H') of the run holding the lock file `fd`, as its content says."""
    try:
        marker = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        pid, host = marker["pid"], marker["host"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return "a run that has not written its pid yet"
    import socket
    return f"pid {pid}" if host == socket.gethostname() else f"pid {pid} on host {host}"


INSIDE_LOCK = ".yue2-lock"  # the claim file inside an existing batch folder whose parent cannot be written


def _claim_files(out: Path, inside_ok: bool) -> list[Path]:
    """Where the claim on `out` may lie, in order: `.NAME.yue2-lock` beside it; for a name too long for that (the
    lock adds 11 bytes), `.yue2-lock-<sha256 of the name>` beside it; with `inside_ok`, an existing folder's own
    `.yue2-lock` (a parent the user cannot write). Break-it review, stop 39: in both cases the claim was skipped and
    two `batch --resume` on one folder computed the same songs."""
    digest = hashlib.sha256(os.fsencode(out.name)).hexdigest()[:24]
    files = [out.parent / f".{out.name}.yue2-lock", out.parent / f".yue2-lock-{digest}"]
    if inside_ok:
        files.append(out / INSIDE_LOCK)
    return files


def _claim_full(exc: OSError, folder: Path, what: str) -> DiskFullError:
    """The DiskFullError of a claim whose folder or file could not be made, or file written, in `folder` for a full
    disk or quota (ENOSPC / EDQUOT; `reserve_output`)."""
    quota = exc.errno != errno.ENOSPC
    return DiskFullError(f"cannot write into {folder} ({exc.strerror}): "
                         f"{'your disk quota there is used up' if quota else 'its disk is full'}, so no "
                         f"song could be saved there; free space{' (`quota -s` shows the quota)' * quota}"
                         f", or give the {what} a place on another disk (nothing was computed)")


def no_lock_note(exc: OSError, folder: Path, what: str) -> str:
    """The warning of a claim in `folder` whose flock failed with one of NO_LOCKS (the file system takes no locks)."""
    return (f"{folder}'s file system takes no file locks ({exc.strerror or exc}: an NFS mount without its lock daemon, "
            f"or an SMB / FUSE mount?), so this run does not claim its {what}: another run given the same one at the "
            f"same time is not stopped before its work. A save never replaces a song: the later of two such runs "
            f"is refused when it saves. Give each run its own {what}")


def reserve_output(path: str | os.PathLike, what: str = "output directory", inside_ok: bool = False) -> Reservation:
    """Claim `path` (a song folder or a batch folder, existing or not) for this process before any work, so that a
    second run given the same path at the same time stops at once instead of computing a song it cannot save. The
    claim is an flock on `.NAME.yue2-lock` in the path's parent (made if missing; `_claim_files` gives the places
    for a name too long for it and, with `inside_ok`, inside an existing folder whose parent cannot be written); the
    kernel releases it when its process ends, so a killed run's file is simply taken over. Raises ArtifactError
    naming the other run (its pid) while it lives, or when the lock file cannot be used (a folder of that name);
    DiskFullError when its small write, synced (so an NFS quota shows too), meets a full disk or quota — the early
    write probe: before any work, not at the first save (stop 49) — and when making the file or its parent folders
    does (no inode or quota left; diff review, stop 49: the claim was skipped and the song computed). A path that
    names no folder ("", "/", "..") or one with no place for a claim (a parent that cannot be written, and no folder
    yet) gives no claim (the output checks report those), as does a system without flock, and a file system whose
    flock fails with one of NO_LOCKS (ENOLCK: NFS without its lock daemon; EOPNOTSUPP …) — its Reservation's `note`
    says so, to print as a warning (stop-51 leftover "SMB flock": such a failure was read as "being written by
    another run", so every run there was refused); the synced write, the early write probe, is made all the same."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory file locks here; the save's own checks still never overwrite a song
        return Reservation(None)
    text = os.fspath(path)
    if not text.strip() or os.path.basename(os.path.normpath(text)) in ("", ".", ".."):
        return Reservation(None)
    out = _without_dotdot(Path(text)).absolute()
    made = tuple(p for p in (out.parent, *out.parent.parents) if not os.path.lexists(p))  # deepest first
    for _ in range(5):
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a read-only or missing parent: the output checks that follow say what is wrong
            _remove_empty(made)
            if exc.errno in FULL_ERRNOS:  # a full disk or quota: said now, as for the claim file below
                raise _claim_full(exc, next(p for p in out.parent.parents if p.is_dir()), what) from None
            return Reservation(None)
        fd = None
        try:
            inside = inside_ok and out.is_dir() and not out.is_symlink()
        except OSError:  # e.g. a name too long for the file system: no folder there to claim inside
            inside = False
        for lock in _claim_files(out, inside):
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
                break
            except IsADirectoryError:
                raise ArtifactError(f"cannot claim {what} {Path(path)}: {lock} is a folder; remove it (it is in the "
                                    "way of the claim file of that name)") from None
            except OSError as exc:  # a name too long, a parent that cannot be written: the next place
                if exc.errno in FULL_ERRNOS:  # no inode or quota left for a new file: as the synced write below
                    _remove_empty(made)
                    raise _claim_full(exc, lock.parent, what) from None
                continue
        if fd is None:  # nowhere (a read-only parent and no folder yet): the output checks that follow say why
            _remove_empty(made)
            return Reservation(None)
        note = None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in NO_LOCKS:
                holder = _holder(fd)
                os.close(fd)
                raise ArtifactError(f"{what} {Path(path)} is being written by another run ({holder}; its claim is "
                                    f"{lock}); wait for it to end or choose another name") from None
            note = no_lock_note(exc, lock.parent, what)
        try:
            if os.stat(lock).st_ino != os.fstat(fd).st_ino:  # removed / replaced by its last holder meanwhile
                os.close(fd)
                continue
            data = _marker_bytes()
            os.ftruncate(fd, 0)
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError("short write")
            fsync_file(fd)  # the early write probe: a network file system (NFS) reports a full quota at the sync
            if note is not None:  # no lock to hold: the write probe was all the file was for
                lock.unlink()
                os.close(fd)
                return Reservation(None, note=note)
        except FileNotFoundError:
            os.close(fd)
            continue
        except OSError as exc:
            try:
                lock.unlink()
            except OSError:
                pass
            os.close(fd)
            _remove_empty(made)  # the parent folders the claim made (a refused run leaves no new folders)
            if exc.errno in FULL_ERRNOS:  # said before any work (was: at the first save, after the song)
                raise _claim_full(exc, lock.parent, what) from None
            raise ArtifactError(f"cannot claim {what} {Path(path)}: writing {lock} failed "
                                f"({exc.strerror or exc})") from None
        return Reservation(lock, fd, made)
    raise ArtifactError(f"cannot claim {what} {Path(path)}: its claim file {lock} keeps being replaced")


SAVE_NAME_EXTRA = len(".") + len(".XXXXXXXX.partial")  # the hidden sibling a save writes first (write_song_dir)


def _check_name_length(out: Path) -> None:
    """ArtifactError when the folder's name leaves no room for the save's hidden sibling `.NAME.XXXXXXXX.partial`
    within the file system's name limit (break-it finding: a 238–255-byte name passed every check, the song was
    computed, and the save failed)."""
    size = len(os.fsencode(out.name))
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        limit = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows) or no answer: the usual limit
        limit = 255
    if size + SAVE_NAME_EXTRA > limit:
        raise ArtifactError(f"output folder name {out.name[:40]}… is {size} bytes: the save first writes it as a "
                            f"hidden sibling .NAME.XXXXXXXX.partial ({size + SAVE_NAME_EXTRA} bytes), more than this "
                            f"file system's {limit}-byte limit for a name; give a name of at most "
                            f"{limit - SAVE_NAME_EXTRA} bytes")


def _limit(folder: Path, name: str, default: int) -> int:
    """`os.pathconf(folder, name)` (PC_NAME_MAX, PC_PATH_MAX), or `default` where there is no answer (Windows)."""
    try:
        return int(os.pathconf(folder, name))
    except (OSError, ValueError, AttributeError, TypeError):
        return default


def _shown(path: Path | str, keep: int = 50) -> str:
    """A path for a one-line message: whole when short, else its start and end around "…"."""
    text = str(path)
    return text if len(text) <= 2 * keep + 1 else f"{text[:keep]}…{text[-keep:]}"


def _existing(path: Path) -> Path:
    """`path` or its nearest folder above that exists (what pathconf can be asked about)."""
    while not os.path.exists(path) and path != path.parent:  # os.path: False for a name too long too, no OSError
        path = path.parent
    return path


def check_name_limits(path: str | os.PathLike) -> Path:
    """The absolute `path` when every name on it (its folders and its own) fits the file system's NAME_MAX (255 bytes
    on most); ArtifactError naming the first that does not and the limit (was: "File name too long", or nothing
    until a save failed)."""
    absolute = _without_dotdot(Path(path)).absolute()
    name_max = _limit(_existing(absolute), "PC_NAME_MAX", 255)
    for part in absolute.parts[1:]:
        if len(os.fsencode(part)) > name_max:
            raise ArtifactError(f"the path {_shown(absolute)} holds a name of {len(os.fsencode(part))} bytes "
                                f"({part[:30]}…), more than this file system's {name_max}-byte limit for a name; "
                                "give a shorter path")
    return absolute


def check_path_limits(out: str | os.PathLike) -> None:
    """ArtifactError when saving a song as the folder `out` would pass a limit of the file system it goes to: a
    folder name on its way longer than NAME_MAX bytes (`check_name_limits`), its own name with the save's hidden
    sibling `.NAME.XXXXXXXX.partial` (`_check_name_length`), or the longest path the save writes — a song file inside
    that sibling, absolute (Python 3.12's `tempfile.mkdtemp` makes it so) — of PATH_MAX bytes or more (4096 on
    Linux, the ending NUL included). For `check_output_dir` and `batch`'s per-row checks, before any work (stop 40
    review: a batch found a path too long only when the computed song was saved)."""
    absolute = _without_dotdot(Path(out)).absolute()
    check_name_limits(absolute.parent)
    longest = max((*FILES, *PLAN_FILES, "plan_manifest.json", "result.json", PARTIAL_MARKER), key=len)
    size = len(os.fsencode(str(absolute.parent / f".{absolute.name}.XXXXXXXX.partial" / longest)))
    path_max = _limit(_existing(absolute), "PC_PATH_MAX", 4096)
    if size >= path_max:
        room = max(0, len(os.fsencode(str(absolute))) - (size - path_max + 1))
        raise ArtifactError(f"song folder {_shown(absolute)}: the save writes paths of up to {size} bytes (its files "
                            f"in the hidden .NAME.XXXXXXXX.partial folder beside it), more than this file system's "
                            f"limit of {path_max - 1} bytes for a path (PATH_MAX {path_max}); a song folder's "
                            f"absolute path may be at most {room} bytes here — give a shorter path")
    _check_name_length(absolute)


def _without_dotdot(path: Path) -> Path:
    """`path` with a ".." in its folders resolved (`os.path.realpath` of the parent, symlinks followed as the OS
    would): "new/../song" names ./song, and making its parents as written would leave an empty "new" behind
    (break-it finding). Other paths are returned as given."""
    if ".." not in path.parts[:-1]:
        return path
    return Path(os.path.realpath(path.parent)) / path.name


def check_output_dir(out_dir: str | os.PathLike) -> Path:
    """The folder a song will be saved as, checked before any work: it must be named (not "", ".", ".." or a root:
    the song is written into a hidden sibling and renamed into place), new or empty (songs are never overwritten),
    and, when it exists, on the same file system as its parent and not a mount point (the rename cannot replace
    one); its names and paths within the file system's limits (`check_path_limits`). Raises ArtifactError saying
    which and what to give instead."""
    text = os.fspath(out_dir)
    if os.path.basename(os.path.normpath(text)) in ("", ".", "..") if text else True:
        raise ArtifactError(f"output {text!r} names no new folder (an empty path, '.', '..' or a root): a song is "
                            "saved as a folder of its own; give one, e.g. songs/my-song")
    out = _without_dotdot(Path(text))
    try:
        check_path_limits(out)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise ArtifactError(f"output directory {out} exists and is not empty; choose a new name (songs are "
                                "never overwritten)")
        if out.is_dir() and (os.path.ismount(out) or out.stat().st_dev != out.absolute().parent.stat().st_dev):
            raise ArtifactError(f"output directory {out} is a mount point (another file system than its parent): a "
                                "song is written beside its folder and renamed into place, which cannot replace a "
                                f"mount point; give a new folder inside it, e.g. {out / 'my-song'}")
    except OSError as exc:
        raise ArtifactError(f"cannot use the output {out}: {exc.strerror or exc}") from None
    return out


FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}  # no space left; the user's quota exceeded


def write_error(exc: OSError, what: str, after: str = "") -> ArtifactError:
    """The error of a failed write: "`what`: reason`after`", a `DiskFullError` when the device or the user's quota is
    full (`FULL_ERRNOS`; `batch` stops computing songs then), else an ArtifactError. EFBIG ("File too large": a
    file past this process's file-size limit — Python ignores SIGXFSZ, so the write raises) names the limit and how
    to raise it (`file_size_hint`)."""
    kind = DiskFullError if exc.errno in FULL_ERRNOS else ArtifactError
    return kind(f"{what}: {exc.strerror or exc}{file_size_hint(exc)}{after}")


def file_size_limit() -> int | None:
    """This process's file-size limit in bytes (RLIMIT_FSIZE's soft limit: `ulimit -f` in KiB), None when there is
    none (unlimited, or no such limit on this system: Windows)."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def file_size_hint(exc: OSError) -> str:
    """For a write that failed with EFBIG: " (this process's file-size limit, `ulimit -f`, is N bytes: raise it,
    e.g. `ulimit -f unlimited`, and run again)"; "" for any other error."""
    if getattr(exc, "errno", None) != errno.EFBIG:
        return ""
    limit = file_size_limit()
    shown = f"{limit:,} bytes (`ulimit -f` {limit // 1024:,})" if limit is not None else "set"
    return f" (this process's file-size limit, `ulimit -f`, is {shown}: raise it, e.g. `ulimit -f unlimited`)"


FLAC_SLACK = 8192  # bytes: FLAC's stream header and seek/padding blocks above its frames (≈ 100 bytes seen)


def song_bytes_bound(music_tokens: int) -> tuple[int, int]:
    """(the largest file, all files) a song folder of `music_tokens` music tokens can take at most, from the length
    alone (no checkpoint, before any work): audio.flac holds 1920·T − 64 samples of 48 kHz stereo 24-bit FLAC — at
    most the raw PCM (6 bytes a stereo sample; FLAC stores a block it cannot shrink verbatim, as for the synthetic
    model's noise: measured 0.06 % above it) with 1 % and FLAC_SLACK to spare —, latent.npy 64 float32 values a
    token, semantic.npy 4 bytes a token, and at most 4 MiB for the score, the other ids and the JSON files (the
    style and lyrics are capped at 1 MiB each)."""
    from .constants import AUDIO_CHANNELS, HOP, LATENT_DIM, VAE_LENGTH_TRIM
    tokens = max(int(music_tokens), 1)
    samples = tokens * HOP - VAE_LENGTH_TRIM
    flac = int(samples * AUDIO_CHANNELS * 3 * 1.01) + FLAC_SLACK
    latent = tokens * LATENT_DIM * 4 + 128
    return max(flac, latent), flac + latent + tokens * 4 + 128 + (4 << 20)


def tokens_within(limit: int) -> int:
    """The most music tokens whose song folder's largest file fits `limit` bytes (`song_bytes_bound`); 0: none.
    The first guess inverts the FLAC bound in floats and may land one token off either way (the bound rounds its
    bytes down: a limit of exactly a song's bound guessed one token short), so it is walked to the exact answer."""
    from .constants import AUDIO_CHANNELS, HOP, VAE_LENGTH_TRIM
    tokens = max(int(((limit - FLAC_SLACK) / (AUDIO_CHANNELS * 3 * 1.01) + VAE_LENGTH_TRIM) // HOP), 0)
    while tokens > 0 and song_bytes_bound(tokens)[0] > limit:
        tokens -= 1
    while song_bytes_bound(tokens + 1)[0] <= limit:
        tokens += 1
    return tokens


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def check_file_size_limit(music_tokens: int, what: str, lower: str | None, kept: int = 0) -> None:
    """Refuse, before any work, a song whose largest file (audio.flac, `song_bytes_bound`) cannot be written under
    this process's file-size limit (`ulimit -f`, RLIMIT_FSIZE): the save would fail with "File too large" after
    the song was computed (stop-47 review: a batch computed every row, then each failed at its save). `what`: the
    song, e.g. "the song (--max-seconds 60)"; `lower`: the option that shortens it (None: its length is fixed);
    `kept`: the tokens of the song that `lower` does not count (Continue's original song). Raises ArtifactError
    with the limit, the estimate and what to do."""
    limit = file_size_limit()
    if limit is None:
        return
    largest, _ = song_bytes_bound(music_tokens)
    if largest <= limit:
        return
    fits = max(tokens_within(limit) - kept, 0)
    shorter = (f", or lower {lower} to at most {fits / FRAMES_PER_SECOND:g} s" if lower and fits else
               f" ({'no song fits it' if not fits else 'its length is fixed: the saved music tokens'})")
    raise ArtifactError(f"this process's file-size limit (`ulimit -f` {limit // 1024:,}: {limit:,} bytes) is below "
                        f"what {what} needs: its audio.flac ({music_tokens:,} music tokens = "
                        f"{music_tokens / FRAMES_PER_SECOND:g} s of 48 kHz stereo 24-bit FLAC) can take up to "
                        f"{largest:,} bytes, so its save would fail with \"File too large\" after the song was "
                        f"computed. Raise the limit (`ulimit -f unlimited`, or at least `ulimit -f "
                        f"{-(-largest // 1024):,}`){shorter}")


def _fs_type(folder: Path) -> str | None:
    """The file-system type ("ext4", "tmpfs" …) of the mount that holds `folder`, from /proc/self/mountinfo (the line
    whose major:minor is the folder's st_dev), or None where it cannot be told (not Linux, no /proc, no match)."""
    try:
        dev = os.stat(folder).st_dev
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = f"{os.major(dev)}:{os.minor(dev)}"
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[2] == want and " - " in line:
            return line.split(" - ", 1)[1].split()[0]
    return None


# file systems whose fallocate(2) takes memory, page by page (review 50: a 1 GB probe on tmpfs took 1 GB of RAM for
# 0.4 s — the model's RAM, or an OOM kill; their room is their size, which statvfs shows)
_MEMORY_FS = ("tmpfs", "ramfs", "devtmpfs", "hugetlbfs")


ROOM_PROBE_FILES = 64  # at most this many nameless files hold a probe's room at once (one descriptor each)
# What the disk must keep free beside the room a probe holds: ROOM_PROBE_SPARE + a quarter of that room
# (`probe_spare`). Measured on ext4: 2 GiB held for 72 ms (fallocate to close), 512 MiB for 24 ms; another writer
# filling the page cache at 4 GB/s meanwhile writes ≈ 0.15 × the room + a few MB.
ROOM_PROBE_SPARE = 64 << 20
ROOM_PROBE_MIN_PIECE = 1 << 20  # a file system that refuses 1 MiB as "too large" (EFBIG) cannot be probed


@dataclass(frozen=True)
class RoomProbe:
    """What `probe_room` learnt. refused: the errno (ENOSPC / EDQUOT) with which the file system refused the room,
    else None (given, or it cannot be told: see `probe_room`). asked: the bytes asked for before the answer (all of
    them when given in full). capped: the room was given, but only `asked` bytes of it were asked for — the rest
    would have needed more than ROOM_PROBE_FILES files of the largest size this file system and `ulimit -f` allow.
    piece: the largest piece asked for in one file."""

    refused: int | None
    asked: int
    capped: bool = False
    piece: int = 0


ROOM_FILE = r"\.yue2-room-[a-z0-9_]{8}"  # a probe's file where there is no O_TMPFILE (`tempfile.mkstemp`'s names)
ROOM_FILE_STALE_SECONDS = 60  # such a file has its name for microseconds; one this old was left by a kill


def _sweep_room_files(folder: Path) -> None:
    """Remove the empty `.yue2-room-XXXXXXXX` files a probe left in `folder` (stop-51 leftover: a kill between the
    file's creation and its unlink, on a file system without O_TMPFILE — NFS, SMB, FAT — left it for ever, and in a
    batch folder it made `batch --resume` refuse the folder as holding files not its own). Only empty regular files
    of that name older than ROOM_FILE_STALE_SECONDS: a probe unlinks its file before it asks for any room."""
    now = time.time()
    for p in folder.glob(".yue2-room-*"):
        try:
            st = p.lstat()
            if re.fullmatch(ROOM_FILE, p.name) and stat.S_ISREG(st.st_mode) and st.st_size == 0 \
                    and now - st.st_mtime > ROOM_FILE_STALE_SECONDS:
                p.unlink()
        except OSError:
            pass


def _nameless_file(folder: Path) -> int:
    """A descriptor of a new file in `folder` that has no name: O_TMPFILE, else a hidden file unlinked at once (NFS,
    FAT, older kernels; what a kill in that moment left is swept first). OSError when neither can be made."""
    try:
        return os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o600)
    except OSError as exc:
        if exc.errno in FULL_ERRNOS:
            raise
    _sweep_room_files(folder)
    fd, name = tempfile.mkstemp(prefix=".yue2-room-", dir=folder)
    try:
        os.unlink(name)
    except OSError:
        os.close(fd)
        raise
    return fd


def probe_spare(nbytes: int) -> int:
    """The free space beyond `nbytes` a disk must have for `free_space_note` to probe it for `nbytes`."""
    return ROOM_PROBE_SPARE + nbytes // 4


def room_refused(folder: Path, nbytes: int) -> int | None:
    """The errno (ENOSPC / EDQUOT) with which the file system refuses `nbytes` of room in `folder` for this user
    now, else None (`probe_room(...).refused`)."""
    return probe_room(folder, nbytes).refused


def probe_room(folder: Path, nbytes: int) -> RoomProbe:
    """Asks the file system for `nbytes` of room in `folder` for this user now: nameless files there (O_TMPFILE;
    else hidden ones, unlinked before any room is asked) are given that room with Linux's fallocate(2) — metadata
    only, no data written — and closed at once, so nothing is left even if the process is killed meanwhile (review
    50: a named file outlived a kill during the fallocate, holding the room). It sees a used-up or small user /
    group / project quota, which the disk's free space (statvfs) does not show (stop-49 leftover: a quota with some
    room, but less than the song, failed only at the save). The room is held only between the fallocate and the
    close (24 ms for 512 MiB, 72 ms for 2 GiB on ext4): another writer that needs it then could see the disk full
    for that long, so `free_space_note` asks only where the disk keeps `probe_spare` free beside it.

    In pieces (stop-50 leftover: a batch's total in one file past the largest file a file system or `ulimit -f`
    allows gave EFBIG, and no note): each file asks for at most the `ulimit -f` limit; a piece refused with EFBIG
    is halved and asked again (down to ROOM_PROBE_MIN_PIECE); all files are held until the last answer, so the
    total is asked at once. More than ROOM_PROBE_FILES pieces are not asked for: the answer is then `capped`.

    `refused` is None also where it cannot be told, and never mistaken for "no room": not Linux, a file system
    without fallocate (EOPNOTSUPP; no emulation by writing is tried), a memory-backed one (tmpfs: fallocate takes
    RAM — review 50), a folder this user cannot write in (the output checks say so), any errno of fallocate other
    than ENOSPC / EDQUOT (EFBIG even for ROOM_PROBE_MIN_PIECE, EIO, EPERM …)."""
    import ctypes
    if not sys.platform.startswith("linux") or not 0 < nbytes < 1 << 63 or _fs_type(folder) in _MEMORY_FS:
        return RoomProbe(None, 0)
    try:  # the process's own symbols hold libc's (find_library ran `ldconfig -p`: 20 ms a call)
        fallocate = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return RoomProbe(None, 0)
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]  # off_t: 64-bit on 64-bit Linux
    fallocate.restype = ctypes.c_int
    limit = file_size_limit()  # `ulimit -f`: a larger piece would be refused with EFBIG (and SIGXFSZ)
    piece, asked, fds = min(int(nbytes), limit or int(nbytes)), 0, []
    try:
        while asked < nbytes:
            if len(fds) == ROOM_PROBE_FILES:
                return RoomProbe(None, asked, capped=True, piece=piece)
            try:
                fds.append(_nameless_file(folder))
            except OSError as exc:
                return RoomProbe(exc.errno if exc.errno in FULL_ERRNOS else None, asked, piece=piece)
            size = min(piece, int(nbytes) - asked)
            while fallocate(fds[-1], 0, 0, size) != 0:
                code = ctypes.get_errno()
                if code == errno.EFBIG and size > ROOM_PROBE_MIN_PIECE:  # past the largest file here: halve it
                    size = piece = max(size // 2, ROOM_PROBE_MIN_PIECE)
                    continue
                return RoomProbe(code if code in FULL_ERRNOS else None, asked, piece=piece)
            asked += size
        return RoomProbe(None, asked, piece=piece)
    finally:
        for fd in fds:
            os.close(fd)


def free_space_note(folder: str | os.PathLike, music_tokens: list[int]) -> str | None:
    """A note when the file system of `folder` (or of its nearest existing parent) has less free space than the
    songs of `music_tokens` may take (`song_bytes_bound`'s totals: an upper bound — FLAC of real music is smaller,
    and a song may end before its budget) — or when the disk has that space but this user's quota does not
    (`room_refused`) —, else None. Not a refusal: space changes while songs are computed, and a
    full disk fails a song's save cleanly (`batch` then stops). The quota is not asked where the disk's free space
    beyond the songs is under `probe_spare` of them (stop-51 leftover: the probe holds the room it asks for, for up
    to 0.1 s, and a writer beside it — another run's save — then met "No space left on device", its song lost)."""
    if not music_tokens:
        return None
    place = Path(os.path.abspath(folder))
    while not place.exists() and place != place.parent:
        place = place.parent
    try:
        free = shutil.disk_usage(place).free
    except OSError:
        return None
    need = sum(song_bytes_bound(t)[1] for t in music_tokens)
    songs = "the song" if len(music_tokens) == 1 else f"the {len(music_tokens)} songs"
    if free >= need:
        if free - need < probe_spare(need):  # no probe: while it held the room, others could meet a full disk
            return None
        probe = probe_room(place, need)
        if probe.capped:  # a total past ROOM_PROBE_FILES of the largest files allowed here: said, not guessed
            return (f"{place} has {_mb(free)} free on its disk, and the file system gave room for {_mb(probe.asked)}"
                    f" of the {_mb(need)} {songs} may take at most; the rest was not asked for (the check holds at "
                    f"most {ROOM_PROBE_FILES} files of {_mb(probe.piece)}, the largest this file system and "
                    "`ulimit -f` allow it): a disk quota smaller than the total would fail a save after the song was "
                    "computed (`quota -s` shows the quota)")
        refused = probe.refused
        if refused is None:
            return None
        quota = refused != errno.ENOSPC
        return (f"{place} has {_mb(free)} free on its disk, but {'your disk quota' if quota else 'the file system'} "
                f"there gave no room for {_mb(need)}, what {songs} may take at most (48 kHz stereo FLAC at its "
                "length budget; real music compresses, and a song may end earlier): a save that meets the "
                f"{'quota' if quota else 'limit'} fails after the song was computed — free space"
                f"{' (`quota -s` shows the quota)' * quota}, or make shorter songs")
    return (f"{place} has {_mb(free)} free, and {songs} may take up to {_mb(need)} (48 kHz stereo FLAC at its "
            "length budget, at most; real music compresses, and a song may end earlier): a full disk fails a save "
            "after the song was computed — free space first, or make shorter songs")


def check_song_room(folder: str | os.PathLike, music_tokens: int, lower: str | None, kept: int = 0) -> str | None:
    """Before any work on a song of at most `music_tokens` music tokens to be saved into `folder` (the song folder's
    parent): ArtifactError when its audio.flac cannot be written under `ulimit -f` (`check_file_size_limit`; `lower`
    and `kept` as there); the note when the disk or the quota there has less room than it may take
    (`free_space_note`), else None. `generate` and `render` warn with the note; YuE2 Regenerate and Continue, whose
    warning nobody would read before the save, refuse with it (docs/bad_inputs.md §46)."""
    check_file_size_limit(music_tokens, "the song", lower, kept)
    return free_space_note(folder, [music_tokens])


def write_song_dir(out_dir: str | os.PathLike, files: dict[str, bytes], result: dict,
                   on_saved: Callable[[Path], None] | None = None,
                   next_free: Callable[[], Path] | None = None) -> Path:
    """Write `files` + result.json (with sha256 of each file) into `out_dir` atomically. Refuses an output that
    cannot receive it (`check_output_dir`: a non-empty folder, ".", a mount point …); on any error (disk full,
    read-only) nothing is left behind (`DiskFullError` when the disk or quota is full). Returns the directory path.
    `on_saved(path)` is called right after the rename into place, with Ctrl-C / SIGTERM / SIGHUP held from the rename
    until it returns (`signals_held`), so a caller always knows of a song that is in place: an interrupt landing just
    after the rename reached the caller as "cancelled" while the complete song was there (stop-47 review).
    `next_free()`: another folder in the same parent to use when another writer took `out_dir` since it was chosen
    (the nodes' numbered names), before the save or at its rename (`_rename_into_place`); without it that save
    fails."""
    for _ in range(100):
        try:
            out = check_output_dir(out_dir)
            break
        except ArtifactError:
            if next_free is None or not os.path.lexists(out_dir):
                raise
            out_dir = next_free()  # taken while the song's files were encoded (a FLAC takes a while)
    else:
        raise ArtifactError(f"no free folder name beside {out_dir} after 100 tries (other writers took them)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _sweep_stale_partials(out.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    except OSError as exc:
        raise write_error(exc, f"cannot write into {out.parent}") from None
    try:
        (tmp / PARTIAL_MARKER).write_bytes(_marker_bytes())
        manifest = {}
        for name, data in files.items():
            (tmp / name).write_bytes(data)
            manifest[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            if name == "audio.flac" and (samples := flac_samples_sha256(data)) is not None:
                manifest[name]["samples_sha256"] = samples
        (tmp / "result.json").write_bytes(_json_bytes(seal_result({**result, "artifacts": manifest})))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                fsync_file(fh.fileno())
        os.chmod(tmp, 0o777 & ~UMASK)  # mkdtemp makes 0700; a song folder gets the usual permissions
        fsync_folder(tmp)  # the folder's entries, as the files' data: the rename must not publish a folder lost later
        with signals_held(), _rename_gate():  # an interrupt is delivered once the caller knows the song is in
            # place and its rename is synced (was: the sync came after the delivery, so never ran then); a writer
            # thread's gate may refuse the rename (`rename_gate`)
            out = _rename_into_place(tmp, out, next_free)
            try:  # the marker goes only now (break-it review 52: removed before the rename, a save killed in
                (out / PARTIAL_MARKER).unlink()  # between left a hidden complete song no sweep ever removed)
            except OSError:  # a marker left in a saved song is harmless: load_song reads only the listed files
                pass
            try:  # the rename itself, so the song outlives a crash or power cut (in place: never an error now)
                fsync_folder(out.parent)
            except OSError:
                pass
            if on_saved is not None:
                on_saved(out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(exc, f"could not save the song to {out}", " (nothing was written)") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _rename_into_place(tmp: Path, out: Path, next_free: Callable[[], Path] | None) -> Path:
    """Rename the finished temporary folder `tmp` to `out` (replacing only an empty folder there) and return where it
    went. When another writer took `out` since it was chosen (a song folder is there now: two ComfyUI servers saving
    into one output folder) and `next_free` is given, the song goes to `next_free()` instead, up to 100 times;
    before (break-it review 52), each such collision wrote the whole song again and the third one lost it."""
    for _ in range(100):
        try:
            if out.exists():
                out.rmdir()  # an empty folder (check_output_dir accepted it); a song there fails with ENOTEMPTY
            os.rename(tmp, out)
            return out
        except OSError:
            if next_free is None or not os.path.lexists(out):
                raise
            out = next_free()
    raise OSError(errno.EEXIST, f"no free folder name beside {out} after 100 tries (other writers took them)")


_GATE = threading.local()


def _rename_gate():
    """The context `write_song_dir` renames a song folder into place in: this thread's `rename_gate`, if any."""
    gate = getattr(_GATE, "gate", None)
    return gate() if gate is not None else contextlib.nullcontext()


@contextlib.contextmanager
def rename_gate(gate: Callable[[], contextlib.AbstractContextManager]):
    """Within this block, on this thread, `write_song_dir` renames each finished song folder into place (and calls
    its `on_saved`) inside `gate()`, a context manager that may raise on entry to keep the folder from appearing
    (its temporary copy is then removed, nothing is written). For a writer thread, where `signals_held` holds
    nothing (Python runs signal handlers on the main thread only): `batch`'s song writer (`runner._Saver`) takes
    a lock in it, so the main thread can end the renames — after one in progress — before it records how the
    interrupted batch ended (stop-47 review: a rename after that record left the song "pending" in batch.json)."""
    before = getattr(_GATE, "gate", None)
    _GATE.gate = gate
    try:
        yield
    finally:
        _GATE.gate = before


def fsync_file(fd: int) -> None:
    """fsync an open file's data. A file system that cannot sync files (some FUSE and network file systems answer
    EINVAL or ENOTSUP, as `fsync_folder` meets for folders) gets its data written unsynced: diff review, stop 49 —
    the output claim's synced write (`reserve_output`) refused every run there with "writing … failed (Invalid
    argument)", and the save failed the same way after the song was computed. Other errors (EIO, ENOSPC, EDQUOT: a
    full quota on NFS shows here) are raised as OSError."""
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise


def fsync_folder(folder: Path) -> None:
    """fsync a folder: its entries (files made in it, a rename into it) reach the disk as fsync of a file's data
    does. Without it a crash or power cut soon after a save could lose the renamed song folder — or leave it without
    its files — although every file's data had been synced (break-it review, stop 45). Where a folder cannot be opened
    or synced (Windows, some network file systems: EINVAL, ENOTSUP, EACCES on open) nothing is done; other errors
    (EIO) are raised as OSError."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except (PermissionError, IsADirectoryError):  # Windows opens no folder
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


RESULT_SEAL = "result_sha256"


def _sealed_part(result: dict) -> dict:
    """What RESULT_SEAL covers: every value of result.json except the seal and the artifact manifest (whose entries
    are checked against the files themselves)."""
    return {k: v for k, v in result.items() if k not in (RESULT_SEAL, "artifacts")}


def seal_result(result: dict) -> dict:
    """`result` with RESULT_SEAL = canonical_sha256 of its values (`_sealed_part`): result.json cannot list its own
    hash in the manifest, so it carries it — an edited seed, budget or flag is refused at load."""
    body = {k: v for k, v in result.items() if k != RESULT_SEAL}
    return {**body, RESULT_SEAL: canonical_sha256(_sealed_part(result))}


def vendor_weights(settings: dict) -> dict:
    """result.json "weights" in the vendor's shape (runtime.md §7.1: {"mot": {"files": {name: {sha256, bytes}},
    "config_sha256"}, "vae": {…}}) from what config.json records: "mot" = the checkpoint (one all-in-one file, or
    the vendor folder's weight files with the sha256 of its weights_manifest.json), "vae" = the VAE file the song
    was decoded with (`weights.vae`) or, without one, the checkpoint's own decoder ("embedded": true, the same
    files); "loras" = the adapters (`weights.loras`). A sha256 is null where none was computed: hashing a 3.7 GB
    checkpoint for every song would cost seconds, and the pack identifies it by path, size, dimensions and a
    sample hash (config.json "checkpoint"."sample_sha256", `weights.checkpoint.content_sample`)."""
    ckpt = settings.get("checkpoint") if isinstance(settings.get("checkpoint"), dict) else {}
    mine = settings.get("weights") if isinstance(settings.get("weights"), dict) else {}
    paths = ckpt.get("files") if isinstance(ckpt.get("files"), dict) and ckpt.get("files") else (
        {"checkpoint": ckpt["path"]} if isinstance(ckpt.get("path"), str) else {})
    vendor = ckpt.get("layout") not in (None, "comfy") and isinstance(ckpt.get("path"), str)

    def manifest_files(folder) -> dict:
        """A vendor folder's files with the sha256 and size its weights_manifest.json records ({} without one)."""
        try:
            from .weights.vendor import read_manifest
            return {name: {"sha256": e["sha256"], "bytes": e["bytes"]}
                    for name, e in (read_manifest(folder) or {}).items()}
        except Exception:  # noqa: BLE001 - a record, never a reason to lose the song
            return {}

    files = {}
    if vendor:  # the folder's weight files, hashes from its manifest (the paths recorded are folders)
        files = manifest_files(ckpt["path"])
    else:
        for path in paths.values():
            if not isinstance(path, str):
                continue
            try:
                size = os.path.getsize(path)
            except OSError:
                size = None
            files[os.path.basename(path)] = {"sha256": None, "bytes": size}
    mot = {"files": files, "config_sha256": None, "path": ckpt.get("path"), "layout": ckpt.get("layout"),
           "format": ckpt.get("format")}
    vae = mine.get("vae")
    if isinstance(vae, dict) and vae:
        vfiles = {vae.get("file", "vae"): {"sha256": vae.get("sha256"), "bytes": vae.get("bytes")}}
        for shard in vae.get("shards") or []:
            if isinstance(shard, dict):
                vfiles[shard.get("file")] = {"sha256": shard.get("sha256"), "bytes": None}
        vae_entry = {"files": vfiles, "config_sha256": None, "path": vae.get("path"), "variant": vae.get("variant")}
    elif vendor and isinstance(paths.get("vae"), str):  # the vendor's own VAE folder
        vae_entry = {"files": manifest_files(paths["vae"]), "config_sha256": None, "path": paths["vae"]}
    else:
        vae_entry = {"files": files, "config_sha256": None, "embedded": True}
    return {"mot": mot, "vae": vae_entry, "loras": list(mine.get("loras") or [])}


def song_result(song: Song, lineage: dict | None = None) -> dict:
    """The result.json content of a Song (without the artifact manifest, which `write_song_dir` adds, and the seal).
    `status` is "complete" with audio, else "latents" or "tokens". `identity` and `weights` follow the vendor
    (runtime.md §7.1, §7.3): identity = canonical_sha256({"request", "config", "weights"})."""
    status = "complete" if song.audio is not None else "latents" if song.latents is not None else "tokens"
    weights = vendor_weights(song.settings)
    return {
        "status": status, "identity": canonical_sha256({"request": song.tokens.request, "config": song.settings,
                                                         "weights": weights}),
        "weights": weights,
        "protocol": song.settings.get("protocol"), "sample_rate": song.sample_rate,
        "audio_seconds": song.audio.shape[-1] / song.sample_rate if song.audio is not None else None,
        "frames": len(song.tokens.codes),
        "truncated": song.truncated, "timing": song.timing, "warnings": list(song.warnings),
        "score": {"cot": song.score.cot, "source": song.score.source, "truncated": song.score.truncated,
                  "seed": song.score.seed, "timing": song.score.timing},
        "semantic": {"seed": song.tokens.seed, "cfg_scale": song.tokens.cfg_scale, "sampling": song.tokens.sampling,
                     "ended": song.tokens.ended, "timing": song.tokens.timing},
        "lineage": lineage or {},
    }


def save_song(song: Song, out_dir: str | os.PathLike, lineage: dict | None = None,
              on_saved: Callable[[Path], None] | None = None,
              next_free: Callable[[], Path] | None = None) -> Path:
    """Save a Song as a song directory (layout in the module docstring; latents/audio may be None). Raises
    ArtifactError when `out_dir` is not empty or cannot be written; nothing partial is ever left. `on_saved`,
    `next_free`: `write_song_dir`'s."""
    extra = {k: v for k, v in (("on_saved", on_saved), ("next_free", next_free)) if v is not None}
    return write_song_dir(out_dir, song_files(song), song_result(song, lineage), **extra)


@dataclass
class SavedSong:
    """A song directory read back. `score_edited` = score.abc differs from what was saved: `score` is then the
    edited text tokenized afresh (re-render it through the semantic stage); `tokens` are the saved codes with the
    score they were sampled after (`tokens.score`, text decoded from the saved ids)."""

    path: Path
    score: Score
    tokens: SemanticTokens
    latents: torch.Tensor | None
    result: dict
    config: dict
    score_edited: bool = False
    audio_changed: str | None = None  # audio.flac "tagged" (other bytes, the saved samples; any load), "missing" /
    # "changed" (with `load_song(audio_ok=True)`), else None


def _same_samples(path: Path, meta: dict) -> bool:
    """Whether audio.flac at `path`, whose bytes differ from the saved file's, holds the saved samples (its manifest
    entry's `samples_sha256`, recorded since stop 47; an older song's entry has none: False)."""
    want = meta.get("samples_sha256")
    return isinstance(want, str) and flac_samples_sha256(path) == want


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_npy(path: Path, data: bytes | None = None) -> np.ndarray:
    """A .npy array (never unpickled), after checking that its header's shape × dtype fits the file's size (a damaged
    header cannot make the reader allocate terabytes). `data`: the file's bytes, already read (`load_song` parses
    the bytes it hashed)."""
    try:
        with (io.BytesIO(data) if data is not None else open(path, "rb")) as fh:
            version = np.lib.format.read_magic(fh)
            shape, _, dtype = (np.lib.format.read_array_header_1_0(fh) if version == (1, 0)
                               else np.lib.format.read_array_header_2_0(fh))
            need = int(np.prod(shape, dtype=object)) * dtype.itemsize
            have = (len(data) if data is not None else path.stat().st_size) - fh.tell()
        if dtype.hasobject or need != have:
            raise ValueError(f"its header describes {dtype} {list(shape)} ({need:,} bytes) but {have:,} bytes follow"
                             if not dtype.hasobject else "object arrays are not accepted")
        return np.load(io.BytesIO(data) if data is not None else path, allow_pickle=False)
    except (OSError, ValueError, EOFError, MemoryError) as exc:
        raise ArtifactError(f"{path.name} is not a readable .npy array ({exc})") from None


def _load_ids(path: Path, low: int, high: int, data: bytes | None = None) -> list[int]:
    """A 1-D integer array with every value in [low, high) → list of int."""
    arr = _load_npy(path, data)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ArtifactError(f"{path.name} must be a 1-D integer array, got {arr.dtype} {list(arr.shape)}")
    if arr.size and (int(arr.min()) < low or int(arr.max()) >= high):
        raise ArtifactError(f"{path.name} holds values outside [{low}, {high}): damaged or not written by this pack")
    return [int(x) for x in arr.tolist()]


MAX_SONG_FILE_BYTES = 2 ** 31  # an hour of 48 kHz stereo PCM_24 FLAC is < 1.1 GB; nothing larger is a song file
MAX_JSON_BYTES = 16 * 2 ** 20  # request/config/result files are a few kB; anything this large is not ours


def _load_json(path: Path, what: str, data: bytes | None = None) -> dict:
    """The JSON object in `path` (or in `data`, its bytes already read)."""
    try:
        if data is None:
            if path.is_symlink():
                raise ArtifactError(f"{path} is a symbolic link; a song directory holds plain files only")
            if path.stat().st_size > MAX_JSON_BYTES:
                raise ArtifactError(f"{path} is {path.stat().st_size:,} bytes: too large to be {what}")
        text = path.read_text("utf-8") if data is None else data.decode("utf-8")
        obj = json.loads(text, parse_constant=_no_constant)
    except _NotFinite as exc:  # written with allow_nan=False (ours and the vendor's): an edit or damage
        raise ArtifactError(f"{path} holds {exc} where a number belongs; song files hold finite numbers only "
                            "(restore the file)") from None
    except OSError as exc:  # unreadable (permissions, I/O) is not damage: say which
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # ValueError covers JSON and UTF-8 decoding errors
        # song files hold seeds and budgets of a few digits: an edit or damage
        if too_long := json_number_too_long(exc):
            raise ArtifactError(f"{path} is damaged or not {what}: it holds {too_long}") from None
        raise ArtifactError(f"{path} is damaged or not {what} ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise ArtifactError(f"{path} is not {what} (a JSON object was expected)")
    return obj


class _NotFinite(Exception):
    pass


def _no_constant(name: str):
    raise _NotFinite(name)  # NaN, Infinity, -Infinity: json.loads accepts them, json.dumps(allow_nan=False) does not


_DTYPES = ("bfloat16", "float16", "float32")


def _check_config(config: dict, root: Path) -> None:
    """The settings of config.json that a re-render carries over, each of its kind when present and not null
    (vendor folders have more keys, and fewer of ours; null = not recorded): cfg_scale a finite number,
    ode_steps an integer 1–MAX_ODE_STEPS, ode_method one of nar.ODE_METHODS, model_dtype / vae_dtype a float dtype
    name, vae_decode "halo_crop" (runtime.md §7.3), protocol / device text, abc_sampling / semantic_sampling /
    checkpoint / weights objects.
    Raises ArtifactError naming the key, its value and what is accepted."""
    from .constants import MAX_ODE_STEPS
    from .nar import ODE_METHODS
    # _finite_number: an int past 2**64 made np.isfinite raise TypeError (break-it finding, stop 42)
    rules = {"cfg_scale": (lambda v: _finite_number(v), "a finite number or null"),
             "ode_steps": (lambda v: type(v) is int and 1 <= v <= MAX_ODE_STEPS, f"an integer 1–{MAX_ODE_STEPS}"),
             "ode_method": (lambda v: v in ODE_METHODS, " or ".join(ODE_METHODS)),
             "model_dtype": (lambda v: v in _DTYPES, ", ".join(_DTYPES)),
             "vae_dtype": (lambda v: v in _DTYPES, ", ".join(_DTYPES)),
             "vae_decode": (lambda v: v == "halo_crop", "halo_crop"),
             "protocol": (lambda v: isinstance(v, str), "text"), "device": (lambda v: isinstance(v, str), "text"),
             "audio_source": (lambda v: v in ("decoded", "given"), "decoded or given")}
    rules.update({k: (lambda v: isinstance(v, dict), "an object")
                  for k in ("abc_sampling", "semantic_sampling", "checkpoint", "weights")})
    for key, (ok, accepted) in rules.items():  # null: not recorded (a tokens-only song of the nodes: no ode_steps)
        if config.get(key) is not None and not ok(config[key]):
            raise ArtifactError(f"{root}/config.json {key} must be {accepted}, got "
                                f"{json.dumps(config[key], ensure_ascii=False)[:80]} — the file was edited or damaged; "
                                "restore it")


def _section(result: dict, key: str) -> dict:
    value = result.get(key, {})
    if not isinstance(value, dict):
        raise ArtifactError(f"result.json: '{key}' must be an object")
    return value


def _int_field(value, what: str, high: int = 2 ** 63 - 1) -> int:
    if type(value) is not int or not 0 <= value <= high:
        raise ArtifactError(f"{what} must be an integer in [0, {high}], got {value!r}")
    return value


def _check_request(request: dict, root: Path) -> None:
    """request.json must describe a valid request (style/lyrics text, cot, seed, cfg) — a tampered one is refused
    here instead of failing later in another node."""
    from .errors import RequestError
    from .protocol import SongRequest
    try:
        SongRequest(style=request.get("style", ""), lyrics=request.get("lyrics", ""), cot=request.get("cot", "full"),
                    seed=request.get("seed", 0), abc=None, cfg_scale=request.get("cfg_scale")).validate()
    except RequestError as exc:
        raise ArtifactError(f"{root}/request.json is not a valid request: {exc}") from None
    abc = request.get("abc")
    if abc is not None and not isinstance(abc, str):
        raise ArtifactError(f"{root}/request.json: 'abc' must be text or null")


def _restore_hint(root: Path, name: str, manifest: dict) -> str:
    """What a user can do about a song file found missing or changed (new-user findings): request.json holds the
    style and lyrics the music was sampled for — a new style or lyrics is a new song from the same lead sheet;
    score.abc's text is kept in plan.json (`abc`) when the folder has one."""
    if name == "request.json":
        return (f". Restore the original request.json to use this song; to change its style or lyrics, make a new "
                f"song from its lead sheet: generate --abc-file {root}/score.abc --style … --lyrics …")
    if name == "score.abc" and "plan.json" in manifest:
        return (f". The lead sheet the model wrote is kept in {root}/plan.json (its \"abc\" text): write that text "
                "back to score.abc")
    return ""


REQUIRED_FILES = ("abc_tokens.npy", "prefix.npy", "semantic.npy", "request.json", "config.json")


def _max_score_bytes() -> int:
    from .protocol import MAX_TEXT_CHARS
    return 4 * MAX_TEXT_CHARS  # UTF-8 takes at most 4 bytes a character


def _check_result_seal(root: Path, result: dict, manifest: dict) -> None:
    """result.json's own hash (RESULT_SEAL) must match its content; our folders with plan_manifest.json (written
    since the seal exists) must carry one. Older folders have neither and load as before; a vendor-written folder
    has no seal and none of our score / semantic sections (its values come from the hashed files)."""
    seal = result.get(RESULT_SEAL)
    if seal is None:
        if "plan_manifest.json" in manifest and ("score" in result or "semantic" in result):
            raise ArtifactError(f"{root}/result.json has lost its {RESULT_SEAL} entry (it was edited): its seeds, "
                                "budgets and flags cannot be trusted. Save the song again from its source, or edit "
                                "score.abc (the one file meant to be edited)")
        return
    if seal != canonical_sha256(_sealed_part(result)):
        raise ArtifactError(f"{root}/result.json does not match its {RESULT_SEAL} (modified or damaged): an edited "
                            "seed, budget or flag would silently change a re-render. To change the music, edit "
                            "score.abc or pass --seed / --max-seconds to render")


def _check_prefix(root: Path, prefix: list[int], codes: list[int], abc_ids: list[int], cot: str) -> None:
    """prefix.npy must be a semantic-stage prefix: [EOD] … [MUSIC_START], only text and protocol ids (no MUSIC_END
    or codec ids), the score's ids before [ABC_END, MUSIC_START] (cot full/melody), and room for the codes in the
    context. ArtifactError naming what is wrong."""
    from .constants import ABC_END, ABC_START, CONTEXT, EOD, MUSIC_END, MUSIC_START
    if not prefix:
        raise ArtifactError(f"{root}: prefix.npy is empty; a song's prefix holds at least [EOD] … [MUSIC_START]")
    if len(prefix) + len(codes) > CONTEXT:
        raise ArtifactError(f"{root}: prefix.npy holds {len(prefix):,} tokens; with the {len(codes):,} music tokens "
                            f"that is more than the {CONTEXT}-token context (too long: damaged or not a song prefix)")
    bad = [t for t in prefix if t >= MUSIC_END]
    if bad:
        raise ArtifactError(f"{root}: prefix.npy holds codec or end-of-music ids (first: {bad[0]}); a prefix holds "
                            f"text and protocol ids only (< {MUSIC_END})")
    if prefix[0] != EOD or prefix[-1] != MUSIC_START:
        raise ArtifactError(f"{root}: prefix.npy must start with EOD ({EOD}) and end with MUSIC_START "
                            f"({MUSIC_START}); it starts with {prefix[0]} and ends with {prefix[-1]}")
    if cot != "off":
        tail = [ABC_START, *abc_ids, ABC_END, MUSIC_START]
        if prefix[-len(tail):] != tail:
            raise ArtifactError(f"{root}: prefix.npy does not end with the score's {len(abc_ids)} ABC ids "
                                "(abc_tokens.npy) between ABC_START and ABC_END: the files do not belong together")


def batch_folder_above(path: Path) -> Path | None:
    """The folder above `path` that holds a batch's batch.json, or None: the parent when it holds a batch.json file,
    a folder further up when its batch.json is a batch summary (a JSON object with "settings" and "results"; other
    files named so are not ours). Break-it (stop 42): only the parent was looked at, so `--output B/ID/take` made
    the folder of song ID inside the batch folder B — where a running batch then could not save that song. The
    path as given and with its symlinks resolved are both looked at (review 42: `songs/take` with `songs` a link
    to B/ID was accepted)."""
    for absolute in dict.fromkeys((Path(os.path.abspath(path)), Path(os.path.realpath(path)))):
        for depth, folder in enumerate(absolute.parents):
            summary = folder / "batch.json"
            try:
                if not summary.is_file():
                    continue
                if depth == 0:
                    return folder
                if summary.stat().st_size <= 64 * 2 ** 20:
                    doc = json.loads(summary.read_bytes())
                    if isinstance(doc, dict) and "settings" in doc and "results" in doc:
                        return folder
            except (OSError, ValueError, RecursionError):
                continue
    return None


def song_folder_above(path: str | os.PathLike) -> Path | None:
    """The song folder (one holding result.json and every file load_song requires: `REQUIRED_FILES`; a project
    folder with a config.json and a result.json of another tool is none) that `path` lies inside, at any depth, or
    None; the path as given and with its symbolic links resolved are both looked at, as `batch_folder_above` does.
    Break-it review 52: `render A --output B/v2` (or through a link to B) wrote a new song inside the folder of
    song B, where no song list shows it and deleting the take B deletes it too."""
    for absolute in dict.fromkeys((Path(os.path.abspath(path)), Path(os.path.realpath(path)))):
        for folder in absolute.parents:
            try:
                if all((folder / name).is_file() for name in ("result.json", *REQUIRED_FILES)):
                    return folder
            except OSError:
                continue
    return None


def _songs_hint(root: Path) -> str:
    """What to give instead of `root`, which is no song folder (new-user review 43: `render out` and `render
    x.safetensors` said only "no result.json"): the song folders directly inside it, else what a song folder is."""
    try:
        songs = sorted(p.name for p in root.iterdir() if (p / "result.json").is_file()) if root.is_dir() else []
    except OSError:
        songs = []
    if songs:
        shown = ", ".join(str(root / name) for name in songs[:3]) + (f" … ({len(songs)} in all)" if len(songs) > 3
                                                                       else "")
        return f"; it holds song folders, give one of them: {shown}"
    return "; give the folder generate or render wrote, the one holding result.json" + (
        ", not a file" if root.is_file() else "")


def batch_folder_hint(root: Path) -> str:
    """For a folder the batch command wrote (it holds batch.json): the sentence naming its song subfolders (one per
    request id) to use instead; "" for any other path."""
    try:
        if not (root / "batch.json").is_file():
            return ""
        songs = sorted(p.name for p in root.iterdir() if (p / "result.json").is_file())
    except OSError:
        return ""
    if not songs:
        return "; it is a batch output folder (batch.json) with no finished song yet"
    shown = ", ".join(songs[:5]) + (f" … ({len(songs)} in all)" if len(songs) > 5 else "")
    return (f"; it is a batch output folder (batch.json): each song is the subfolder named by its request id, "
            f"e.g. {root / songs[0]} (songs here: {shown})")


def load_song(song_dir: str | os.PathLike, tokenizer=None, edited_ok: bool = False,
              audio_ok: bool = False) -> SavedSong:
    """Read a song directory, verifying every file against the sha256 in result.json (and result.json against its
    own `result_sha256`).

    An edited score.abc is accepted when a `tokenizer` is given (the score is re-tokenized and `score_edited` is
    set) or `edited_ok` is set (then `score` is an untokenized user score — ids [] — and `tokens.score.abc` is None
    until `with_tokenizer`); any other mismatch, a missing file, a file not listed in result.json, an unsafe name,
    a malformed array or JSON file, a prefix that is empty, too long or holds codec ids, a request whose cot
    contradicts the score raises ArtifactError naming the file. Sizes are checked before anything is read: a
    score.abc over 800,000 bytes (or 200,000 characters) raises BudgetError at once. score.abc is read as its exact
    bytes decoded as UTF-8 (CRLF kept), so it tokenizes to the ids saved with it. Arrays are read with
    allow_pickle=False; only files listed in the manifest are read. `audio_ok` (for `render`, which never reads the
    audio): an audio.flac that is missing or changed — a tag editor rewrites it, a user moves it into a DAW project —
    is no error; `audio_changed` says which (stop-47 review: such a song could not be re-rendered, though its tokens,
    score and latents verify). An audio.flac whose bytes differ but whose samples are the saved ones (the manifest's
    `samples_sha256`: a player or tag editor rewrote its tags) is accepted by every load, `audio_changed` "tagged"."""
    from .constants import CODEC_SIZE, CONTEXT, COT_MODES, DEFAULT_CFG, EOD, LATENT_DIM, VOCAB_SIZE
    from .errors import BudgetError, ScoreError
    from .protocol import MAX_TEXT_CHARS, SEED_MAX
    root = Path(song_dir)
    try:
        is_song = (root / "result.json").is_file()  # Python 3.11's pathlib raises for an unreadable folder
    except OSError as exc:
        raise ArtifactError(f"cannot read the song folder {root}: {exc.strerror or exc}") from None
    if not is_song:
        if not os.path.lexists(root):  # review finding: a mistyped path was called "not a song directory"
            raise ArtifactError(f"song folder {root} does not exist (give the folder generate or render wrote, the "
                                "one holding result.json)")
        hint = batch_folder_hint(root) or _songs_hint(root)
        raise ArtifactError(f"{root} is not a song directory (no result.json){hint}")
    result = _load_json(root / "result.json", "a song result")
    manifest = result.get("artifacts")
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{root}/result.json is damaged or not a song result (no artifacts manifest)")
    for name in REQUIRED_FILES:
        if name not in manifest:
            raise ArtifactError(f"{root}/result.json does not list {name}: the song directory is incomplete")
    edited = False
    audio_changed = None
    # every listed file but the audio is read once, hashed and parsed from those bytes: a file saved meanwhile (an
    # editor saving score.abc while render checks the folder) is never parsed unhashed (break-it, stop 43: the new
    # score.abc was read after the old one's hash matched, and a re-render sealed it beside the old score's ids)
    read: dict[str, bytes] = {}
    for name, meta in manifest.items():
        if not valid_song_id(name):
            raise ArtifactError(f"result.json lists an unsafe file name {name!r}")
        if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str):
            raise ArtifactError(f"result.json: the entry for {name} has no sha256")
        path = root / name
        if audio_ok and name == "audio.flac" and (path.is_symlink() or not path.is_file()):
            audio_changed = "missing"
            continue
        if path.is_symlink() or not path.is_file():
            what = ("missing (a symbolic link is not accepted)" if path.is_symlink() else
                    "a folder, not a file (restore the file)" if path.is_dir() else
                    "not a regular file (a pipe, socket or device; restore the file)" if path.exists() else "missing")
            raise ArtifactError(f"{root}: {name} is {what}{_restore_hint(root, name, manifest)}")
        try:
            size = path.stat().st_size
            if name == "score.abc" and size > _max_score_bytes():
                raise BudgetError(f"{root}: score.abc is {size:,} bytes: more than a score can be (at most "
                                  f"{MAX_TEXT_CHARS:,} characters = {_max_score_bytes():,} bytes of UTF-8 are "
                                  "accepted; the 24,576-token context holds far less). Nothing was read")
            cap = MAX_JSON_BYTES if name.endswith(".json") else MAX_SONG_FILE_BYTES
            if size > cap:
                raise ArtifactError(f"{root}: {name} is {size:,} bytes, more than such a file can be ({cap:,})")
            if name == "audio.flac" and type(meta.get("bytes")) is int and meta["bytes"] != size:
                if _same_samples(path, meta):
                    audio_changed = "tagged"
                    continue
                if audio_ok:
                    audio_changed = "changed"
                    continue
            if name != "score.abc" and type(meta.get("bytes")) is int and meta["bytes"] != size:
                raise ArtifactError(f"{root}: {name} is {size:,} bytes but result.json lists {meta['bytes']:,} "
                                    f"(modified or damaged){_restore_hint(root, name, manifest)}")
            if name == "audio.flac":  # not parsed here: streamed, never the whole file in memory
                digest = _sha256_file(path)
            else:
                limit = _max_score_bytes() if name == "score.abc" else cap
                with open(path, "rb") as fh:
                    read[name] = fh.read(limit + 1)
                if len(read[name]) > limit:
                    raise ArtifactError(f"{root}: {name} grew past {limit:,} bytes while it was read; read it again")
                digest = hashlib.sha256(read[name]).hexdigest()
        except OSError as exc:
            raise ArtifactError(f"{root}: cannot read {name} ({exc.strerror or exc})") from None
        if digest != meta["sha256"]:
            if name == "score.abc" and (tokenizer is not None or edited_ok):
                edited = True
                continue
            if name == "audio.flac" and _same_samples(path, meta):
                audio_changed = "tagged"
                continue
            if name == "audio.flac" and audio_ok:
                audio_changed = "changed"
                continue
            raise ArtifactError(f"{root}: {name} does not match its sha256 in result.json (modified or damaged)"
                                + (_restore_hint(root, name, manifest) or ". To use an edited score, edit score.abc "
                                   "and load with the model's tokenizer."))
    request = _load_json(root / "request.json", "a song request", read.get("request.json"))
    _check_request(request, root)
    config = _load_json(root / "config.json", "a song config", read.get("config.json"))
    _check_config(config, root)
    missing = [k for k in ("style", "lyrics", "cot", "seed") if k not in request]
    if missing:
        raise ArtifactError(f"{root}/request.json lacks {', '.join(missing)}")
    sc, sem = _section(result, "score"), _section(result, "semantic")
    if not sc and not sem and "plan.json" in manifest:  # a vendor-written folder: its plan says what was cut off
        plan = _load_json(root / "plan.json", "a song plan", read.get("plan.json"))
        sc = {"truncated": plan.get("truncated") is True}
        cut = result.get("truncated") if isinstance(result.get("truncated"), dict) else {}
        sem = {"ended": cut.get("semantic") is not True}
    cot = sc.get("cot", request.get("cot", "full"))
    if cot not in COT_MODES:
        raise ArtifactError(f"{root}: cot {cot!r} is not one of {', '.join(COT_MODES)}")
    abc = None
    if "score.abc" in manifest:
        data = read["score.abc"]  # the bytes hashed above
        try:
            abc = data.decode("utf-8")  # exact: CRLF stays CRLF (runtime.md §7.3)
        except UnicodeDecodeError as exc:
            raise ArtifactError(f"{root}: score.abc is not UTF-8 text: byte 0x{data[exc.start]:02X} at offset "
                                f"{exc.start} (an editor that saved it as Latin-1 or Windows-1252?); save the file "
                                "as UTF-8") from None
        if len(abc) > MAX_TEXT_CHARS:
            raise BudgetError(f"{root}: score.abc is {len(abc):,} characters: far beyond what the 24,576-token "
                              f"context holds (at most {MAX_TEXT_CHARS:,} characters are accepted)")
        if edited and blank_score(abc):  # a byte-order mark and whitespace: nothing (stop 42)
            raise ScoreError(f"the ABC score is empty: {root}/score.abc was edited to nothing; write a score (or "
                             "restore the saved one)")
    abc_ids = _load_ids(root / "abc_tokens.npy", 0, EOD, read.get("abc_tokens.npy"))
    has_score = abc is not None or bool(abc_ids)
    if request.get("cot") == "off" and (cot != "off" or has_score):
        raise ArtifactError(f"{root}: request.json says cot 'off' but the song has a score (score.abc / "
                            f"{len(abc_ids)} ABC ids, result.json score.cot {cot!r}): the files do not belong "
                            "together")
    if cot == "off" and request.get("cot") != "off":
        raise ArtifactError(f"{root}: result.json says cot 'off' but request.json says {request.get('cot')!r}")
    seed = _int_field(sc.get("seed", request.get("seed", 0)), "the score seed", SEED_MAX)
    source = sc.get("source", "model")
    score = Score(abc=abc, abc_ids=abc_ids, cot=cot, seed=seed, source=source if isinstance(source, str) else "model",
                  truncated=bool(sc.get("truncated", False)),
                  timing=sc.get("timing") if isinstance(sc.get("timing"), dict) else {})
    original = score
    if edited:  # the codes were sampled after the saved ids: keep that score on the tokens (text from the ids)
        original = replace(score, abc=None)
        score = Score(abc=abc, abc_ids=[], cot=score.cot if score.cot != "off" else "full", seed=score.seed,
                      source="user", timing={"edited": True})
    codes = _load_ids(root / "semantic.npy", 0, CODEC_SIZE, read.get("semantic.npy"))
    prefix = _load_ids(root / "prefix.npy", 0, VOCAB_SIZE, read.get("prefix.npy"))
    _check_prefix(root, prefix, codes, abc_ids, cot)
    cfg = sem.get("cfg_scale", request.get("cfg_scale") if request.get("cfg_scale") is not None else
                  DEFAULT_CFG.get(cot, 1.0))
    if not _finite_number(cfg):  # an int past 2**64: np.isfinite raised TypeError (break-it finding, stop 42)
        raise ArtifactError(f"{root}: result.json semantic.cfg_scale must be a finite number, got {cfg!r}")
    sampling = sem.get("sampling")  # absent or null: not recorded; anything else must be what save_song writes
    cap = sampling.get("max_tokens") if isinstance(sampling, dict) else None
    if (sampling is not None and not isinstance(sampling, dict)) or (
            cap is not None and (type(cap) is not int or not 1 <= cap <= CONTEXT)):  # break-it: was taken as absent
        raise ArtifactError(f"{root}: result.json semantic.sampling must be an object with max_tokens an integer in "
                            f"[1, {CONTEXT}], got {json.dumps(sampling, ensure_ascii=False)[:80]} — the file was "
                            "edited or damaged; restore it")
    tokens = SemanticTokens(codes=codes, prefix=prefix, score=original, request=request,
                            seed=_int_field(sem.get("seed", request.get("seed", 0)), "the semantic seed", SEED_MAX),
                            cfg_scale=float(cfg), sampling=sampling or {},
                            ended=bool(sem.get("ended", True)),
                            timing=sem.get("timing") if isinstance(sem.get("timing"), dict) else {})
    latents = None
    if "latent.npy" in manifest:
        arr = _load_npy(root / "latent.npy", read.get("latent.npy"))
        if arr.ndim != 2 or arr.shape != (len(codes), LATENT_DIM) or not np.issubdtype(arr.dtype, np.floating):
            raise ArtifactError(f"{root}: latent.npy has {arr.dtype} {list(arr.shape)}, expected float "
                                f"[{len(codes)}, {LATENT_DIM}]")
        if not np.isfinite(arr).all():
            raise ArtifactError(f"{root}: latent.npy holds NaN or infinite values")
        latents = torch.from_numpy(arr.astype(np.float32))
    _check_result_seal(root, result, manifest)  # last: a value of the wrong type is named by its own check first
    saved = SavedSong(root, score, tokens, latents, result, config, edited, audio_changed)
    return with_tokenizer(saved, tokenizer) if tokenizer is not None else saved


def with_tokenizer(saved: SavedSong, tokenizer) -> SavedSong:
    """A song loaded with `edited_ok` (no tokenizer yet) completed with the model's tokenizer: an edited score is
    tokenized (`Score.from_text`, ScoreError when it is empty) and the score the codes were sampled after gets its
    text decoded from the saved ids. Unedited songs are returned unchanged."""
    if not saved.score_edited or saved.score.abc_ids:
        return saved
    original = replace(saved.tokens.score, abc=tokenizer.decode(saved.tokens.score.abc_ids))
    score = Score.from_text(saved.score.abc or "", tokenizer, saved.score.cot, saved.score.seed)
    return replace(saved, score=score, tokens=replace(saved.tokens, score=original))


def expected_samples(frames: int) -> int:
    """Audio samples of a song with `frames` semantic tokens (1920·T − 64)."""
    return frames * (SAMPLE_RATE // FRAMES_PER_SECOND) - 64
