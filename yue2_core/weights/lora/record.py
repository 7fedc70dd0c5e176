"""What a song remembers of its adapters, and finding them again (config.json "weights", issue "bring your own
weights" part 7).

    lora_record(applied) -> dict            {"file", "path", "sha256", "bytes", "layout", "strength_ar", "strength_nar"}
    file_sha256(path) -> str                hex digest, cached per (path, size, mtime) for the process
    find_recorded(record, search_dirs) -> str   the recorded file: its path if it still holds the same bytes, else a
                                            file of that name and hash in `search_dirs`; AdapterError naming the file,
                                            its sha256 and the folders searched when none is found
"""
from __future__ import annotations

import hashlib
import os

from ...errors import AdapterError

_HASHES: dict = {}


def file_sha256(path: str) -> str:
    """sha256 of a file's bytes (for a directory adapter, of its weights file), cached for the process by
    (absolute path, size, mtime_ns)."""
    path = os.path.abspath(path)
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def _weights_file(adapter) -> str:
    files = [f for f in (adapter.files or [adapter.path]) if os.path.isfile(f) and not f.endswith(".json")]
    return files[0] if files else adapter.path


def lora_record(applied) -> dict:
    """config.json entry of one `apply.Applied` (file name, absolute path, sha256, size, layout, strengths; the
    companion files an adapter read — an FL NAR file, adapter_config.json — with their hashes)."""
    a = applied.adapter
    main = _weights_file(a)
    companions = [{"file": os.path.basename(f), "path": os.path.abspath(f), "sha256": file_sha256(f)}
                  for f in a.files if os.path.abspath(f) != os.path.abspath(main) and os.path.isfile(f)]
    return {"file": os.path.basename(a.path.rstrip("/")), "path": os.path.abspath(a.path), "sha256": file_sha256(main),
            "bytes": os.path.getsize(main), "layout": a.layout, "strength_ar": applied.strength_ar,
            "strength_nar": applied.strength_nar, "companions": companions}


def find_recorded(record: dict, search_dirs=(), what: str = "LoRA") -> str:
    """The adapter a song recorded: `record["path"]` when it still has the recorded sha256 (for a directory
    adapter: its weights file), else the first file named `record["file"]` with that hash under `search_dirs`
    (searched recursively). AdapterError saying exactly which file is missing (name, sha256, where it was, the
    folders searched) otherwise."""
    if not isinstance(record, dict) or not isinstance(record.get("file"), str) or not isinstance(
            record.get("sha256"), str):
        raise AdapterError(f"the song's config.json has a malformed {what} entry: {record!r}")
    want, name = record["sha256"], record["file"]

    def matches(path: str) -> bool:
        try:
            target = path
            if os.path.isdir(path):
                cands = [os.path.join(path, n) for n in ("adapter_model.safetensors", "lora.safetensors", "model.safetensors",
                                                      "model.safetensors.index.json")]
                target = next((c for c in cands if os.path.isfile(c)), None)
                if target is None:
                    return False
            return os.path.isfile(target) and file_sha256(target) == want
        except OSError:
            return False

    recorded = record.get("path")
    if isinstance(recorded, str) and matches(recorded):
        return recorded
    for folder in search_dirs:
        for dirpath, dirnames, filenames in os.walk(folder):
            for n in (*filenames, *dirnames):
                if n == name and matches(os.path.join(dirpath, n)):
                    return os.path.join(dirpath, n)
    where = f" (it was at {recorded})" if isinstance(recorded, str) else ""
    searched = ", ".join(str(d) for d in search_dirs) or "no other folder"
    raise AdapterError(f"this song was made with the {what} {name} (sha256 {want[:16]}…){where}, which is missing or "
                       f"has changed; searched {searched}. Put the same file back (the command line also takes it "
                       f"with --{'lora' if what == 'LoRA' else 'vae'} PATH): a song is re-rendered only with the "
                       "weights it was made with.")
