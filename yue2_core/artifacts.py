"""Song directories in the official runtime's layout (runtime.md §7.3), written atomically.

    score.abc        UTF-8 ABC text (absent in cot off)
    abc_tokens.npy   int32 exact ABC ids
    prefix.npy       int32 semantic-stage prefix (ends with MUSIC_START)
    semantic.npy     int32 codes 0 … 32767 (25 per second)
    latent.npy       float32 [T, 64]
    audio.flac       48 kHz stereo PCM_24
    request.json     the request; config.json the effective settings
    result.json      status, timings, truncation flags, and {file: {sha256, bytes}} for every other file

Everything is written into a temporary sibling directory and renamed into place, so a failed or cancelled save
leaves nothing partial and never touches an existing song; a non-empty target directory is refused.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from .constants import FRAMES_PER_SECOND, SAMPLE_RATE
from .errors import ArtifactError
from .pipeline import Score, SemanticTokens, Song
from .protocol import valid_song_id

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


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def flac_bytes(audio: torch.Tensor, sample_rate: int = SAMPLE_RATE) -> bytes:
    """audio [channels, samples] float in [−1, 1] → FLAC PCM_24 bytes."""
    import soundfile as sf
    buf = io.BytesIO()
    sf.write(buf, audio.detach().float().cpu().numpy().T, sample_rate, format="FLAC", subtype="PCM_24")
    return buf.getvalue()


def song_files(song: Song, extra: dict | None = None) -> dict[str, bytes]:
    """Serialise a Song into {file name: bytes} (no disk access). A Song without latents or audio (None) is saved
    without latent.npy / audio.flac (e.g. tokens kept right after composing)."""
    files = {}
    if song.score.abc is not None:
        files["score.abc"] = song.score.abc.encode("utf-8")
    files["abc_tokens.npy"] = _npy_bytes(np.asarray(song.score.abc_ids, dtype=np.int32))
    files["prefix.npy"] = _npy_bytes(np.asarray(song.tokens.prefix, dtype=np.int32))
    files["semantic.npy"] = _npy_bytes(np.asarray(song.tokens.codes, dtype=np.int32))
    if song.latents is not None:
        files["latent.npy"] = _npy_bytes(song.latents.detach().float().cpu().numpy().astype(np.float32))
    if song.audio is not None:
        files["audio.flac"] = flac_bytes(song.audio, song.sample_rate)
    files["request.json"] = _json_bytes(song.tokens.request)
    files["config.json"] = _json_bytes(song.settings)
    return files


STALE_PARTIAL_SECONDS = 3600  # a save takes seconds; a hidden .partial folder this old was left by a killed process


def _sweep_stale_partials(parent: Path) -> None:
    """Remove hidden `.NAME.XXXX.partial` folders older than STALE_PARTIAL_SECONDS in `parent`: what a process killed
    mid-save (SIGKILL, a power cut) leaves; nothing else ever names a folder so."""
    now = time.time()
    for p in parent.glob(".*.partial"):
        if not re.fullmatch(r"\..+\.[A-Za-z0-9_]{8}\.partial", p.name):  # only what write_song_dir's mkdtemp names
            continue
        try:
            if p.is_dir() and not p.is_symlink() and now - p.stat().st_mtime > STALE_PARTIAL_SECONDS:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def write_song_dir(out_dir: str | os.PathLike, files: dict[str, bytes], result: dict) -> Path:
    """Write `files` + result.json (with sha256 of each file) into `out_dir` atomically. Refuses a non-empty
    `out_dir`; on any error (disk full, read-only) nothing is left behind. Returns the directory path."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ArtifactError(f"output directory {out} exists and is not empty; choose a new name (songs are never "
                            "overwritten)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _sweep_stale_partials(out.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    except OSError as exc:
        raise ArtifactError(f"cannot write into {out.parent}: {exc.strerror or exc}") from None
    try:
        manifest = {}
        for name, data in files.items():
            (tmp / name).write_bytes(data)
            manifest[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        (tmp / "result.json").write_bytes(_json_bytes({**result, "artifacts": manifest}))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; a song folder gets the usual permissions
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ArtifactError(f"could not save the song to {out}: {exc.strerror or exc} (nothing was written)") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def song_result(song: Song, lineage: dict | None = None) -> dict:
    """The result.json content of a Song (without the artifact manifest, which `write_song_dir` adds). `status` is
    "complete" with audio, else "latents" or "tokens"."""
    status = "complete" if song.audio is not None else "latents" if song.latents is not None else "tokens"
    return {
        "status": status, "protocol": song.settings.get("protocol"), "sample_rate": song.sample_rate,
        "audio_seconds": song.audio.shape[-1] / song.sample_rate if song.audio is not None else None,
        "frames": len(song.tokens.codes),
        "truncated": song.truncated, "timing": song.timing, "warnings": list(song.warnings),
        "score": {"cot": song.score.cot, "source": song.score.source, "truncated": song.score.truncated,
                  "seed": song.score.seed, "timing": song.score.timing},
        "semantic": {"seed": song.tokens.seed, "cfg_scale": song.tokens.cfg_scale, "sampling": song.tokens.sampling,
                     "ended": song.tokens.ended, "timing": song.tokens.timing},
        "lineage": lineage or {},
    }


def save_song(song: Song, out_dir: str | os.PathLike, lineage: dict | None = None) -> Path:
    """Save a Song as a song directory (layout in the module docstring; latents/audio may be None). Raises
    ArtifactError when `out_dir` is not empty or cannot be written; nothing partial is ever left."""
    return write_song_dir(out_dir, song_files(song), song_result(song, lineage))


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


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_npy(path: Path) -> np.ndarray:
    """A .npy array (never unpickled), after checking that its header's shape × dtype fits the file's size (a damaged
    header cannot make the reader allocate terabytes)."""
    try:
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            shape, _, dtype = (np.lib.format.read_array_header_1_0(fh) if version == (1, 0)
                               else np.lib.format.read_array_header_2_0(fh))
            need = int(np.prod(shape, dtype=object)) * dtype.itemsize
            have = path.stat().st_size - fh.tell()
        if dtype.hasobject or need != have:
            raise ValueError(f"its header describes {dtype} {list(shape)} ({need:,} bytes) but {have:,} bytes follow"
                             if not dtype.hasobject else "object arrays are not accepted")
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, MemoryError) as exc:
        raise ArtifactError(f"{path.name} is not a readable .npy array ({exc})") from None


def _load_ids(path: Path, low: int, high: int) -> list[int]:
    """A 1-D integer array with every value in [low, high) → list of int."""
    arr = _load_npy(path)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ArtifactError(f"{path.name} must be a 1-D integer array, got {arr.dtype} {list(arr.shape)}")
    if arr.size and (int(arr.min()) < low or int(arr.max()) >= high):
        raise ArtifactError(f"{path.name} holds values outside [{low}, {high}): damaged or not written by this pack")
    return [int(x) for x in arr.tolist()]


MAX_SONG_FILE_BYTES = 2 ** 31  # an hour of 48 kHz stereo PCM_24 FLAC is < 1.1 GB; nothing larger is a song file
MAX_JSON_BYTES = 16 * 2 ** 20  # request/config/result files are a few kB; anything this large is not ours


def _load_json(path: Path, what: str) -> dict:
    try:
        if path.is_symlink():
            raise ArtifactError(f"{path} is a symbolic link; a song directory holds plain files only")
        if path.stat().st_size > MAX_JSON_BYTES:
            raise ArtifactError(f"{path} is {path.stat().st_size:,} bytes: too large to be {what}")
        obj = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError covers JSON and UTF-8 decoding errors
        raise ArtifactError(f"{path} is damaged or not {what} ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise ArtifactError(f"{path} is not {what} (a JSON object was expected)")
    return obj


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


REQUIRED_FILES = ("abc_tokens.npy", "prefix.npy", "semantic.npy", "request.json", "config.json")


def load_song(song_dir: str | os.PathLike, tokenizer=None) -> SavedSong:
    """Read a song directory, verifying every file against the sha256 in result.json.

    An edited score.abc is accepted when a `tokenizer` is given (the score is re-tokenized and `score_edited` is
    set); any other mismatch, a missing file, a file not listed in result.json, an unsafe name, a malformed array
    or JSON file raises ArtifactError naming the file (an empty edited score raises ScoreError). Arrays are read
    with allow_pickle=False; only files listed in the manifest are read."""
    from .constants import CODEC_SIZE, COT_MODES, EOD, LATENT_DIM, VOCAB_SIZE
    from .protocol import SEED_MAX
    root = Path(song_dir)
    if not (root / "result.json").is_file():
        raise ArtifactError(f"{root} is not a song directory (no result.json)")
    result = _load_json(root / "result.json", "a song result")
    manifest = result.get("artifacts")
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{root}/result.json is damaged or not a song result (no artifacts manifest)")
    for name in REQUIRED_FILES:
        if name not in manifest:
            raise ArtifactError(f"{root}/result.json does not list {name}: the song directory is incomplete")
    edited = False
    for name, meta in manifest.items():
        if not valid_song_id(name):
            raise ArtifactError(f"result.json lists an unsafe file name {name!r}")
        if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str):
            raise ArtifactError(f"result.json: the entry for {name} has no sha256")
        path = root / name
        if path.is_symlink() or not path.is_file():
            raise ArtifactError(f"{root}: {name} is missing" + (" (a symbolic link is not accepted)"
                                                                 if path.is_symlink() else ""))
        try:
            size = path.stat().st_size
            cap = MAX_JSON_BYTES if name == "score.abc" or name.endswith(".json") else MAX_SONG_FILE_BYTES
            if size > cap:
                raise ArtifactError(f"{root}: {name} is {size:,} bytes, more than such a file can be ({cap:,})")
            if name != "score.abc" and type(meta.get("bytes")) is int and meta["bytes"] != size:
                raise ArtifactError(f"{root}: {name} is {size:,} bytes but result.json lists {meta['bytes']:,} "
                                    "(modified or damaged)")
            digest = _sha256_file(path)  # streamed: never the whole file in memory
        except OSError as exc:
            raise ArtifactError(f"{root}: cannot read {name} ({exc.strerror or exc})") from None
        if digest != meta["sha256"]:
            if name == "score.abc" and tokenizer is not None:
                edited = True
                continue
            raise ArtifactError(f"{root}: {name} does not match its sha256 in result.json (modified or damaged). "
                                "To use an edited score, edit score.abc and load with the model's tokenizer.")
    request = _load_json(root / "request.json", "a song request")
    _check_request(request, root)
    config = _load_json(root / "config.json", "a song config")
    missing = [k for k in ("style", "lyrics", "cot", "seed") if k not in request]
    if missing:
        raise ArtifactError(f"{root}/request.json lacks {', '.join(missing)}")
    sc, sem = _section(result, "score"), _section(result, "semantic")
    cot = sc.get("cot", request.get("cot", "full"))
    if cot not in COT_MODES:
        raise ArtifactError(f"{root}: cot {cot!r} is not one of {', '.join(COT_MODES)}")
    abc = None
    if "score.abc" in manifest:
        try:
            abc = (root / "score.abc").read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{root}: score.abc is not UTF-8 text ({exc})") from None
    abc_ids = _load_ids(root / "abc_tokens.npy", 0, EOD)
    seed = _int_field(sc.get("seed", request.get("seed", 0)), "the score seed", SEED_MAX)
    source = sc.get("source", "model")
    score = Score(abc=abc, abc_ids=abc_ids, cot=cot, seed=seed, source=source if isinstance(source, str) else "model",
                  truncated=bool(sc.get("truncated", False)),
                  timing=sc.get("timing") if isinstance(sc.get("timing"), dict) else {})
    original = score
    if edited:  # the codes were sampled after the saved ids: keep that score on the tokens (text from the ids)
        original = replace(score, abc=tokenizer.decode(abc_ids))
        score = Score.from_text(abc or "", tokenizer, score.cot if score.cot != "off" else "full", score.seed)
    codes = _load_ids(root / "semantic.npy", 0, CODEC_SIZE)
    prefix = _load_ids(root / "prefix.npy", 0, VOCAB_SIZE)
    cfg = sem.get("cfg_scale", 1.0)
    if isinstance(cfg, bool) or not isinstance(cfg, (int, float)) or not np.isfinite(cfg):
        raise ArtifactError(f"{root}: result.json semantic.cfg_scale must be a finite number, got {cfg!r}")
    tokens = SemanticTokens(codes=codes, prefix=prefix, score=original, request=request,
                            seed=_int_field(sem.get("seed", request.get("seed", 0)), "the semantic seed", SEED_MAX),
                            cfg_scale=float(cfg), sampling=sem.get("sampling") if isinstance(sem.get("sampling"),
                                                                                              dict) else {},
                            ended=bool(sem.get("ended", True)),
                            timing=sem.get("timing") if isinstance(sem.get("timing"), dict) else {})
    latents = None
    if "latent.npy" in manifest:
        arr = _load_npy(root / "latent.npy")
        if arr.ndim != 2 or arr.shape != (len(codes), LATENT_DIM) or not np.issubdtype(arr.dtype, np.floating):
            raise ArtifactError(f"{root}: latent.npy has {arr.dtype} {list(arr.shape)}, expected float "
                                f"[{len(codes)}, {LATENT_DIM}]")
        if not np.isfinite(arr).all():
            raise ArtifactError(f"{root}: latent.npy holds NaN or infinite values")
        latents = torch.from_numpy(arr.astype(np.float32))
    return SavedSong(root, score, tokens, latents, result, config, edited)


def expected_samples(frames: int) -> int:
    """Audio samples of a song with `frames` semantic tokens (1920·T − 64)."""
    return frames * (SAMPLE_RATE // FRAMES_PER_SECOND) - 64
