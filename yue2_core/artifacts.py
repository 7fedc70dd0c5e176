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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .constants import FRAMES_PER_SECOND, SAMPLE_RATE
from .errors import ArtifactError
from .pipeline import Score, SemanticTokens, Song

FILES = ("score.abc", "abc_tokens.npy", "prefix.npy", "semantic.npy", "latent.npy", "audio.flac", "request.json",
         "config.json")
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,179}")
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


def safe_name(name: str) -> str:
    """Validate a song id / folder name: 1–180 chars of A–Z a–z 0–9 _ . -, starting with a letter or digit, not a
    reserved device name, no path separators. Raises ArtifactError otherwise."""
    if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name) or name in (".", "..") or \
            name.split(".")[0].upper() in _RESERVED:
        raise ArtifactError(f"song name {name!r} is not allowed: use 1–180 characters from A–Z a–z 0–9 _ . -, "
                            "starting with a letter or digit (no '/', '..', or reserved names like CON)")
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
    """Serialise a Song into {file name: bytes} (no disk access)."""
    files = {}
    if song.score.abc is not None:
        files["score.abc"] = song.score.abc.encode("utf-8")
    files["abc_tokens.npy"] = _npy_bytes(np.asarray(song.score.abc_ids, dtype=np.int32))
    files["prefix.npy"] = _npy_bytes(np.asarray(song.tokens.prefix, dtype=np.int32))
    files["semantic.npy"] = _npy_bytes(np.asarray(song.tokens.codes, dtype=np.int32))
    files["latent.npy"] = _npy_bytes(song.latents.detach().float().cpu().numpy().astype(np.float32))
    files["audio.flac"] = flac_bytes(song.audio, song.sample_rate)
    files["request.json"] = _json_bytes(song.tokens.request)
    files["config.json"] = _json_bytes(song.settings)
    return files


def write_song_dir(out_dir: str | os.PathLike, files: dict[str, bytes], result: dict) -> Path:
    """Write `files` + result.json (with sha256 of each file) into `out_dir` atomically. Refuses a non-empty
    `out_dir`; on any error (disk full, read-only) nothing is left behind. Returns the directory path."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ArtifactError(f"output directory {out} exists and is not empty; choose a new name (songs are never "
                            "overwritten)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
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


def save_song(song: Song, out_dir: str | os.PathLike, lineage: dict | None = None) -> Path:
    """Save a Song as a song directory (layout in the module docstring). Raises ArtifactError when `out_dir` is
    not empty or cannot be written; nothing partial is ever left."""
    result = {
        "status": "complete", "protocol": song.settings.get("protocol"), "sample_rate": song.sample_rate,
        "audio_seconds": song.audio.shape[-1] / song.sample_rate, "frames": len(song.tokens.codes),
        "truncated": song.truncated, "timing": song.timing, "warnings": list(song.warnings),
        "score": {"cot": song.score.cot, "source": song.score.source, "truncated": song.score.truncated,
                  "seed": song.score.seed, "timing": song.score.timing},
        "semantic": {"seed": song.tokens.seed, "cfg_scale": song.tokens.cfg_scale, "sampling": song.tokens.sampling,
                     "ended": song.tokens.ended, "timing": song.tokens.timing},
        "lineage": lineage or {},
    }
    return write_song_dir(out_dir, song_files(song), result)


@dataclass
class SavedSong:
    """A song directory read back. `score_edited` = score.abc differs from what was saved: `score` is then the
    edited text tokenized afresh (re-render it through the semantic stage); `tokens` are the saved codes."""

    path: Path
    score: Score
    tokens: SemanticTokens
    latents: torch.Tensor | None
    result: dict
    config: dict
    score_edited: bool = False


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path.name} is not a readable .npy array ({exc})") from None


def load_song(song_dir: str | os.PathLike, tokenizer=None) -> SavedSong:
    """Read a song directory, verifying every file against the sha256 in result.json.

    An edited score.abc is accepted when a `tokenizer` is given (the score is re-tokenized and `score_edited` is
    set); any other mismatch, a missing file or a malformed array raises ArtifactError naming the file."""
    root = Path(song_dir)
    if not (root / "result.json").is_file():
        raise ArtifactError(f"{root} is not a song directory (no result.json)")
    try:
        result = json.loads((root / "result.json").read_text("utf-8"))
        manifest = result["artifacts"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ArtifactError(f"{root}/result.json is damaged or not a song result") from None
    edited = False
    for name, meta in manifest.items():
        if "/" in name or "\\" in name or name.startswith("."):
            raise ArtifactError(f"result.json lists an unsafe file name {name!r}")
        path = root / name
        if not path.is_file():
            raise ArtifactError(f"{root}: {name} is missing")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != meta.get("sha256"):
            if name == "score.abc" and tokenizer is not None:
                edited = True
                continue
            raise ArtifactError(f"{root}: {name} does not match its sha256 in result.json (modified or damaged). "
                                "To use an edited score, edit score.abc and load with the model's tokenizer.")
    request = json.loads((root / "request.json").read_text("utf-8"))
    config = json.loads((root / "config.json").read_text("utf-8"))
    sc = result.get("score", {})
    abc = (root / "score.abc").read_text("utf-8") if (root / "score.abc").is_file() else None
    abc_ids = [int(x) for x in _load_npy(root / "abc_tokens.npy").tolist()]
    score = Score(abc=abc, abc_ids=abc_ids, cot=sc.get("cot", request.get("cot", "full")),
                  seed=int(sc.get("seed", request.get("seed", 0))), source=sc.get("source", "model"),
                  truncated=bool(sc.get("truncated", False)), timing=sc.get("timing", {}))
    if edited:
        score = Score.from_text(abc or "", tokenizer, score.cot if score.cot != "off" else "full", score.seed)
    sem = result.get("semantic", {})
    codes = [int(x) for x in _load_npy(root / "semantic.npy").tolist()]
    prefix = [int(x) for x in _load_npy(root / "prefix.npy").tolist()]
    tokens = SemanticTokens(codes=codes, prefix=prefix, score=score, request=request,
                            seed=int(sem.get("seed", request.get("seed", 0))),
                            cfg_scale=float(sem.get("cfg_scale", 1.0)), sampling=sem.get("sampling", {}),
                            ended=bool(sem.get("ended", True)), timing=sem.get("timing", {}))
    latents = None
    if (root / "latent.npy").is_file():
        arr = _load_npy(root / "latent.npy")
        if arr.ndim != 2 or arr.shape[0] != len(codes):
            raise ArtifactError(f"{root}: latent.npy has shape {arr.shape}, expected [{len(codes)}, 64]")
        latents = torch.from_numpy(arr.astype(np.float32))
    return SavedSong(root, score, tokens, latents, result, config, edited)


def expected_samples(frames: int) -> int:
    """Audio samples of a song with `frames` semantic tokens (1920·T − 64)."""
    return frames * (SAMPLE_RATE // FRAMES_PER_SECOND) - 64
