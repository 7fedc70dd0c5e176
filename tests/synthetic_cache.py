"""Synthetic checkpoints written once per test run and shared by every test folder and pytest-xdist worker.

`write_synthetic_checkpoint` is deterministic for a (profile, format, seed), but a `tiny` file costs 5–9 s of CPU
(bf16 ≈ 0.21 GB, int8 ≈ 0.12 GB; 2-core machine, 2026-12-07), and tests/core, batch, edit, robust, nodes and weights
each made their own copies — each worker again. Here the first caller writes it (under a file lock, so two workers
never write the same file twice) into one folder of the run, and later callers get that file:

  cached_checkpoint(profile, fmt, seed=0) -> str   the shared file: read it only (a session fixture's checkpoint)
  synthetic_link(path, profile, fmt, seed=0) -> str the shared file under a name of the test's own (a hard link:
                                                    no bytes copied), which the test may read, delete or replace
                                                    (os.replace), never write into; made atomically
  synthetic_copy(path, profile, fmt, seed=0) -> str a private copy at `path` (a byte-identical file of its own,
                                                    which the test may edit, replace or delete), made atomically
  check_shared()                                   fails when a shared file was written into (a test that edited
                                                    its link instead of a copy); run at every call above and at the
                                                    session's end (tests/conftest.py)
  tokenizers_built_once()                          a context in which an embedded tokenizer JSON is built once
  removed_when_passed(request, folder)             a context for a module fixture's folder of large files it
                                                    wrote: removed at its teardown unless a test failed meanwhile

Disk (stop 58): a run of the suite left 10–16 GB under /tmp/pytest-of-root, most of it copies of these files
(≈ 0.12–0.21 GB each) that their tests only read; `synthetic_link` gives those the shared bytes, and pyproject.toml's
tmp_path_retention_policy = "failed" removes a passing test's tmp_path when it ends, `removed_when_passed` a module
fixture's folder when its module's tests passed (folders of module and session fixtures otherwise stay to the end
of the run, whose peak they make).

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


# path → (size, mtime_ns, sampled digest) of each shared file this process handed out, as first seen
_SHARED: dict[str, tuple] = {}


def _sample(path: str, size: int) -> str:
    """sha256 of 64 reads of 4 KiB spread over the file (milliseconds): what a write into it changes even where
    its size and modification time were kept."""
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        for i in range(64):
            f.seek(size * i // 64)
            digest.update(f.read(4096))
    return digest.hexdigest()


def check_shared(sample: bool = False) -> None:
    """Fail (AssertionError) when a shared file handed out by this process changed since: a test wrote into a
    `synthetic_link` (or into `cached_checkpoint`'s file), which every later test of the run would read. Size and
    modification time at each call; `sample`: also the sampled bytes (the session's end)."""
    for path, (size, mtime_ns, digest) in _SHARED.items():
        try:
            st = os.stat(path)
            now = (st.st_size, st.st_mtime_ns, _sample(path, st.st_size) if sample else digest)
        except OSError as exc:
            now = (None, None, f"unreadable: {exc}")
        if now != (size, mtime_ns, digest):
            raise AssertionError(
                f"the run's shared synthetic checkpoint {path} changed (size, mtime, sampled bytes "
                f"{(size, mtime_ns, digest)} → {now}): a test wrote into it, through synthetic_link or "
                "cached_checkpoint — a test that edits its checkpoint needs synthetic_copy (tests/synthetic_cache.py)")


def cached_checkpoint(profile: str, fmt: str, seed: int = 0) -> str:
    """The shared synthetic checkpoint (profile, fmt, seed), written on first use. Do not modify it."""
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    check_shared()
    folder = run_folder()
    # the names tests/core, batch, edit and robust used for seed 0, so a $YUE2_TEST_CACHE of earlier runs is reused
    path = folder / (f"yue2_{profile}_{fmt}.safetensors" if seed == 0 else f"yue2_{profile}_{fmt}_s{seed}.safetensors")
    if not path.exists():
        with open(folder / f".{path.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not path.exists():  # another worker may have written it while this one waited
                write_synthetic_checkpoint(str(path), profile=profile, fmt=fmt, seed=seed)  # atomic (temp + replace)
    if str(path) not in _SHARED:
        st = path.stat()
        _SHARED[str(path)] = (st.st_size, st.st_mtime_ns, _sample(str(path), st.st_size))
    return str(path)


def _put(src: str, path, how) -> str:
    """`how(src, temp)` beside `path`, then renamed onto it (atomic: `path` is never half there)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.copy-{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)  # a leftover of an interrupted run (os.link does not replace)
        how(src, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return str(path)


def _link_or_copy(src, dst) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system ($YUE2_TEST_CACHE elsewhere), too many links, no hard links there
        shutil.copyfile(src, dst)


def synthetic_link(path, profile: str, fmt: str, seed: int = 0) -> str:
    """`cached_checkpoint(profile, fmt, seed)` at `path` too, as a hard link (a copy where none can be made): for a
    test that needs the file under a name or in a folder of its own but only reads it (≈ 0.2 GB not copied; stop
    58). The test may delete or atomically replace `path` (os.replace, `synthetic_copy`, write_synthetic_checkpoint),
    never write into it: opening it for writing, truncating it or copying over it changes the shared file, which
    `check_shared` then reports. Made atomically, as `synthetic_copy`."""
    return _put(cached_checkpoint(profile, fmt, seed), path, _link_or_copy)


def synthetic_copy(path, profile: str, fmt: str, seed: int = 0) -> str:
    """A private copy of `cached_checkpoint(profile, fmt, seed)` at `path` (its folder made when missing): the bytes
    `write_synthetic_checkpoint(path, profile, fmt, seed)` writes, and replaced atomically as that function does."""
    return _put(cached_checkpoint(profile, fmt, seed), path, shutil.copyfile)


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


@contextlib.contextmanager
def removed_when_passed(request, folder):
    """For a module fixture's folder of large files it wrote (a vendor folder, checkpoints made by the writer under
    test): `with removed_when_passed(request, root): ...; yield value` removes `folder` at the fixture's teardown
    when no test of this worker failed since the fixture was set up (its module's tests: a file's tests run together
    in one worker), as tmp_path_retention_policy = "failed" does for a test's tmp_path; kept when one failed, to be
    looked at. Without it the folder stays until the run ends (stop 58: the run's peak disk use)."""
    failed = request.session.testsfailed
    yield folder
    if request.session.testsfailed == failed:
        shutil.rmtree(folder, ignore_errors=True)
