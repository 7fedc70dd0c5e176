"""Synthetic checkpoints written once per test run and shared by every test folder and pytest-xdist worker.

`write_synthetic_checkpoint` is deterministic for a (profile, format, seed), but a `tiny` file costs 5–9 s of CPU
(bf16 ≈ 0.21 GB, int8 ≈ 0.12 GB; 2-core machine, 2026-12-07), and tests/core, batch, edit, robust, nodes and weights
each made their own copies — each worker again. Here the first caller writes it (under a file lock, so two workers
never write the same file twice) into one folder of the run, and later callers get that file:

  cached_checkpoint(profile, fmt, seed=0) -> str   the shared file: read it only (a session fixture's checkpoint)
  synthetic_copy(path, profile, fmt, seed=0) -> str a private copy at `path` (a byte-identical file of its own,
                                                    which the test may edit, replace or delete), made atomically
  tokenizers_built_once()                          a context in which an embedded tokenizer JSON is built once

The folder is $YUE2_TEST_CACHE when set (reused across runs, as before), otherwise `run_folder()`: under
pytest-xdist the parent of the workers' temporary folders (pytest-N/, one per run), else the session's own. Set by
tests/conftest.py (`pytest_configure`). Only string profile names are cached (a `Profile` object is written
directly by the callers that use one)."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
from pathlib import Path

_RUN_FOLDER: list[Path] = []  # set once by tests/conftest.py


def set_run_folder(path: Path) -> None:
    _RUN_FOLDER[:] = [Path(path)]


def run_folder() -> Path:
    root = os.environ.get("YUE2_TEST_CACHE")
    if root:
        folder = Path(root)
    elif _RUN_FOLDER:
        folder = _RUN_FOLDER[0]
    else:
        raise RuntimeError("synthetic_cache: no folder (tests/conftest.py sets it; or set YUE2_TEST_CACHE)")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cached_checkpoint(profile: str, fmt: str, seed: int = 0) -> str:
    """The shared synthetic checkpoint (profile, fmt, seed), written on first use. Do not modify it."""
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    folder = run_folder()
    # the names tests/core, batch, edit and robust used for seed 0, so a $YUE2_TEST_CACHE of earlier runs is reused
    path = folder / (f"yue2_{profile}_{fmt}.safetensors" if seed == 0 else f"yue2_{profile}_{fmt}_s{seed}.safetensors")
    if path.exists():
        return str(path)
    with open(folder / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not path.exists():  # another worker may have written it while this one waited
            write_synthetic_checkpoint(str(path), profile=profile, fmt=fmt, seed=seed)  # atomic (temp + replace)
    return str(path)


def synthetic_copy(path, profile: str, fmt: str, seed: int = 0) -> str:
    """A private copy of `cached_checkpoint(profile, fmt, seed)` at `path` (its folder made when missing): the bytes
    `write_synthetic_checkpoint(path, profile, fmt, seed)` writes, and replaced atomically as that function does."""
    src = cached_checkpoint(profile, fmt, seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.copy-{os.getpid()}")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return str(path)


@contextlib.contextmanager
def tokenizers_built_once():
    """Within it, `YuE2Tokenizer.from_tensor` builds the tokenizer of an embedded JSON once and gives the same object
    to every later load of the same bytes (every synthetic checkpoint embeds one ≈ 8 MB document, whose parse costs
    ≈ 0.6–1 CPU-s at each engine load). For the modules whose tests load one model many times to check what is done
    with it (LoRAs, renders, records), not how a tokenizer is read (tests/weights/test_qwen_vocab.py, the damaged
    blobs of tests/robust): a blob that fails is not remembered (each load raises again), and the check of the loaded
    tokenizer (`selfcheck.check_tokenizer`) still runs at every load."""
    from yue2_core.weights.tokenizer import YuE2Tokenizer
    original = YuE2Tokenizer.__dict__["from_tensor"]
    built = {}

    def from_tensor(cls, blob):
        import torch
        if blob.dtype != torch.uint8 or blob.ndim != 1:
            return original.__func__(cls, blob)  # its own refusal
        key = (cls, hashlib.sha256(blob.cpu().numpy().tobytes()).digest())
        if key not in built:
            built[key] = original.__func__(cls, blob)
        return built[key]
    YuE2Tokenizer.from_tensor = classmethod(from_tensor)
    try:
        yield
    finally:
        YuE2Tokenizer.from_tensor = original
