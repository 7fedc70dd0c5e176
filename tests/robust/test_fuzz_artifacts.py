"""Fuzzing the song-directory loader (issue 6): `load_song` on a valid song directory with mutated files — result.json
edits (types, keys, manifest entries, traversal and odd names), files replaced by random bytes, pickled object
arrays, wrong dtypes/shapes — with the manifest hashes either left stale or recomputed so the parsers behind the
hash check are reached. Only ArtifactError / ScoreError may escape; a pickle is never loaded."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robust_helpers import make_song
from yue2_core.artifacts import load_song, save_song
from yue2_core.errors import ArtifactError, ScoreError

pytestmark = pytest.mark.usefixtures("single_thread")
EXAMPLES = 800
FILES = ["score.abc", "abc_tokens.npy", "prefix.npy", "semantic.npy", "latent.npy", "audio.flac", "request.json",
         "config.json"]
JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(10 ** 20), 10 ** 20), st.floats(),
                                 st.text(max_size=6)),
                       lambda inner: st.one_of(st.lists(inner, max_size=3),
                                               st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                       max_leaves=6)
NAMES = st.one_of(st.sampled_from(FILES + ["../result.json", "/etc/passwd", "..", ".", ".hidden", "a/b", "a\\b",
                                           "C:x", "x\x00y", "CON", "nul.npy", "result.json", "semantic.npy/"]),
                  st.text(max_size=12))


def _npy(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()


ARRAYS = st.sampled_from([
    np.array([{"pickle": 1}, None], dtype=object),  # must be refused (allow_pickle=False)
    np.zeros((2, 3), dtype=np.int32), np.zeros((0,), dtype=np.int32), np.array([1.5, np.nan]), np.array(["ab", "c"]),
    np.zeros((3, 64), dtype=np.float32), np.zeros((8, 63), dtype=np.float32), np.array([2 ** 40], dtype=np.int64),
    np.array([-1, 40000], dtype=np.int32), np.zeros((2,), dtype=[("a", "i4"), ("b", "f4")]),
    np.array([1 + 2j]), np.array(True), np.zeros((8, 64), dtype=np.float16),
]).map(_npy)


@pytest.fixture(scope="module")
def song_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_song")
    return save_song(make_song(), root / "song")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Scratch space for the per-example copies: RAM (/dev/shm) when available, it is rewritten 800 times."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="yue2_fuzz_song.", dir=shm))
        yield path
        shutil.rmtree(path, ignore_errors=True)
    else:
        yield tmp_path_factory.mktemp("fuzz_song_work")


def _rehash(root, result: dict) -> None:
    manifest = result.get("artifacts") if isinstance(result, dict) else None
    if not isinstance(manifest, dict):
        return
    for name in list(manifest):
        path = root / name if isinstance(name, str) and "\x00" not in name and "/" not in name else None
        if path is not None and path.is_file() and isinstance(manifest[name], dict):
            data = path.read_bytes()
            manifest[name]["sha256"] = hashlib.sha256(data).hexdigest()
            if "bytes" in manifest[name]:
                manifest[name]["bytes"] = len(data)  # consistent: the fuzzed content reaches the parsers


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzz_artifact_loader(song_dir, work, tokenizer, data):
    root = work / "case"
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(song_dir, root)
    result = json.loads((root / "result.json").read_text("utf-8"))
    for _ in range(data.draw(st.integers(1, 3))):
        op = data.draw(st.sampled_from(["file_bytes", "file_array", "file_json", "delete_file", "result_key",
                                        "manifest_name", "manifest_entry", "result_root", "result_text"]))
        name = data.draw(st.sampled_from(FILES))
        if op == "file_bytes":
            (root / name).write_bytes(data.draw(st.binary(max_size=64)))
        elif op == "file_array":
            (root / name).write_bytes(data.draw(ARRAYS))
        elif op == "file_json":
            raw = json.dumps(data.draw(JSONISH)) if data.draw(st.booleans()) else data.draw(st.text(max_size=20))
            (root / name).write_text(raw, "utf-8", errors="surrogatepass")
        elif op == "delete_file" and (root / name).exists():
            (root / name).unlink()
        elif op == "result_key" and isinstance(result, dict):
            key = data.draw(st.sampled_from(["artifacts", "score", "semantic", "status", "frames"]))
            if data.draw(st.booleans()):
                result.pop(key, None)
            else:
                result[key] = data.draw(JSONISH)
        elif op == "manifest_name" and isinstance(result, dict) and isinstance(result.get("artifacts"), dict):
            manifest = result["artifacts"]
            entry = manifest.pop(name, {"sha256": "0" * 64, "bytes": 0})
            manifest[data.draw(NAMES)] = entry
        elif op == "manifest_entry" and isinstance(result, dict) and isinstance(result.get("artifacts"), dict):
            result["artifacts"][name] = data.draw(JSONISH)
        elif op == "result_root":
            result = data.draw(JSONISH)
        elif op == "result_text":
            result = None
            (root / "result.json").write_text(data.draw(st.sampled_from(
                ["", "{", "[" * 5000 + "]" * 5000, "null", "\x00", "{\"artifacts\": 1e999}"])), "utf-8")
    if result is not None:
        if data.draw(st.booleans()):
            _rehash(root, result)  # so the parsers after the hash check see the damage
        (root / "result.json").write_text(json.dumps(result, allow_nan=True), "utf-8")
    use_tokenizer = data.draw(st.booleans())
    try:
        saved = load_song(root, tokenizer if use_tokenizer else None)
    except (ArtifactError, ScoreError) as error:
        assert str(error)
    else:
        assert all(0 <= c < 32768 for c in saved.tokens.codes)
        assert all(0 <= i < 151643 for i in saved.score.abc_ids)
        assert saved.latents is None or tuple(saved.latents.shape) == (len(saved.tokens.codes), 64)
