"""What a song remembers of its adapters, and finding them again (config.json "weights", issue "bring your own
weights" part 7).

    lora_record(applied) -> dict            {"file", "path", "sha256", "bytes", "layout", "strength_ar", "strength_nar",
                                             "weights_file" (a folder adapter: the file inside it that was hashed),
                                             "companions": [{"file", "path", "relpath", "sha256"}]}
    file_sha256(path) -> str                hex digest, cached per (path, size, mtime) for the process
    recorded_weights(weights) -> (loras, vae)   config.json "weights" checked: [(record, strength_ar, strength_nar)]
                                            and the VAE record or None; AdapterError naming what is malformed
    recorded_int8_mode(weights) -> str | None   "weights"."lora_int8": how the song's LoRAs were applied to int8
                                            layers ("side" | "bf16"), None when it records none
    find_recorded(record, search_dirs) -> str   the recorded file: its path if it still holds the same bytes (and
                                            its companions theirs), else a file of that name and hash in
                                            `search_dirs`; AdapterError naming the file (or companion), its sha256
                                            and the folders searched when none is found
"""
from __future__ import annotations

import hashlib
import os

from ...errors import AdapterError
from ..checkpoint import stat_identity

_HASHES: dict = {}


def file_sha256(path: str) -> str:
    """sha256 of a file's bytes (for a directory adapter, of its weights file), cached for the process by
    (absolute path, `stat_identity`)."""
    path = os.path.abspath(path)
    st = os.stat(path)
    key = (path, *stat_identity(st))
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
    """config.json entry of one `apply.Applied` (file name, absolute path, sha256, size, layout, strengths; for a
    folder adapter `weights_file`, the name inside the folder of the file that was hashed; the companion files the
    adapter read — an FL NAR file, adapter_config.json — with their hashes and `relpath`, their path relative to the
    adapter's folder (a folder adapter: the folder; a file: the folder it is in), where `find_recorded` checks them)."""
    a = applied.adapter
    main = _weights_file(a)
    base = a.path if os.path.isdir(a.path) else os.path.dirname(os.path.abspath(a.path))
    companions = [{"file": os.path.basename(f), "path": os.path.abspath(f), "relpath": os.path.relpath(f, base),
                   "sha256": file_sha256(f)}
                  for f in a.files if os.path.abspath(f) != os.path.abspath(main) and os.path.isfile(f)]
    out = {"file": os.path.basename(os.path.abspath(a.path)), "path": os.path.abspath(a.path),
           "sha256": file_sha256(main), "bytes": os.path.getsize(main), "layout": a.layout,
           "strength_ar": applied.strength_ar, "strength_nar": applied.strength_nar, "companions": companions}
    if os.path.isdir(a.path):
        out["weights_file"] = os.path.relpath(main, a.path)
    return out


def check_reread(recorded: list, now: list) -> None:
    """Refuse adapters read again for a song (render, Load Song) whose files are not what the song recorded:
    `recorded` = the song's config.json "weights"."loras" entries, `now` = `lora_record` of the adapters as read
    again, in the same order. A folder adapter that now reads another weights file than the recorded
    `weights_file` (a lora.safetensors added beside it is read first), or an adapter that now reads a companion the
    song was made without (an adapter_config.json added later changes the scale lora_alpha / r) or no longer reads
    one, renders other music: AdapterError naming the file and what changed (break-it review, stop 39: both
    re-rendered differently without a word)."""
    for old, new in zip(recorded, now):
        name = old.get("file") or new.get("file")
        if old.get("weights_file") and new.get("weights_file") and old["weights_file"] != new["weights_file"]:
            raise AdapterError(f"the LoRA folder {name} now reads {new['weights_file']}, not the "
                               f"{old['weights_file']} the song was made with (another weights file was added to "
                               "the folder); move it away, or give the file itself with --lora")
        if old.get("sha256") and new.get("sha256") and old["sha256"] != new["sha256"]:
            raise AdapterError(f"the LoRA {name} now reads other weights than the song was made with (sha256 "
                               f"{new['sha256'][:12]}… against {old['sha256'][:12]}…); restore the file the song "
                               "records")
        had = {c.get("relpath", c.get("file")) for c in old.get("companions") or [] if isinstance(c, dict)}
        has = {c.get("relpath", c.get("file")) for c in new.get("companions") or [] if isinstance(c, dict)}
        if "companions" in old and had != has:
            added, gone = sorted(has - had), sorted(had - has)
            raise AdapterError(f"the LoRA {name} now reads "
                               + (f"{', '.join(added)}, which the song was made without" if added else "")
                               + (" and " if added and gone else "")
                               + (f"no longer {', '.join(gone)}" if gone else "")
                               + " (a sidecar such as adapter_config.json sets the adapter's scale): the music would "
                               "differ; put the files back as they were when the song was made")


def recorded_weights(weights) -> tuple[list, dict | None]:
    """A song's config.json "weights" entry, checked: ([(lora record, strength_ar, strength_nar)], VAE record or
    None). None / absent means no own weights (a song made without any, or before they were recorded). Raises
    AdapterError naming what is malformed — "weights" not an object, "loras" not a list, an entry not an object, a
    strength that is not a number in [−5, 5] (`apply.check_strength`), "vae" not an object, a "stack_rules" other
    than `STACK_RULES` (a newer pack's rule, an edit) — instead of silently re-rendering otherwise."""
    from .apply import check_strength
    if weights is None:
        return [], None
    if not isinstance(weights, dict):
        raise AdapterError(f"the song's config.json \"weights\" must be an object {{\"loras\": [...], \"vae\": "
                           f"...}}; found {type(weights).__name__} {str(weights)[:80]!r}")
    loras = weights.get("loras")
    if loras is None:
        loras = []
    if not isinstance(loras, list):
        raise AdapterError(f"the song's config.json \"weights\": `loras` must be a list of adapter entries; found "
                           f"{type(loras).__name__} {str(loras)[:80]!r}")
    out = []
    for i, rec in enumerate(loras):
        if not isinstance(rec, dict):
            raise AdapterError(f"the song's config.json \"weights\": loras[{i}] must be an object {{\"file\", "
                               f"\"sha256\", \"strength_ar\", …}}; found {type(rec).__name__} {str(rec)[:80]!r}")
        name = rec.get("file", f"loras[{i}]")
        for key in ("strength_ar", "strength_nar"):  # JSON numbers only: true or "1" are not what the pack writes
            if key in rec and (isinstance(rec[key], bool) or not isinstance(rec[key], (int, float))):
                raise AdapterError(f"the song's config.json \"weights\": recorded {key} of {name} must be a number "
                                   f"between -5 and 5 (as the pack writes it); found {type(rec[key]).__name__} "
                                   f"{str(rec[key])[:40]!r}")
        out.append((rec, check_strength(rec.get("strength_ar", 1.0), f"recorded strength_ar of {name}"),
                    check_strength(rec.get("strength_nar", 1.0), f"recorded strength_nar of {name}")))
    rules = weights.get("stack_rules", STACK_RULES)
    if type(rules) is not int or rules != STACK_RULES:  # break-it (stop 41): any value was read as today's rule
        raise AdapterError(f"the song's config.json \"weights\": `stack_rules` must be {STACK_RULES} (the LoRA "
                           f"stacking rule the song was made under: a replacement first, every delta added to it); "
                           f"found {type(rules).__name__} {str(rules)[:40]!r} — a song of a newer version of the "
                           "pack (update it), or an edited record (remove the key for a song made before "
                           "2026-12-06)")
    vae = weights.get("vae")
    if vae is not None and not isinstance(vae, dict):
        raise AdapterError(f"the song's config.json \"weights\": `vae` must be an object {{\"file\", \"sha256\", "
                           f"…}} or null; found {type(vae).__name__} {str(vae)[:80]!r}")
    return out, vae or None


STACK_RULES = 2  # config.json "weights"."stack_rules" (since 2026-12-06, stop 41): how the stack was applied — a
# replacement first, every delta added to it; an FL file's NAR companion given again as its own entry refused. Rule 1
# (before 2026-12-06, unrecorded): each patch in stack order, a replacement erasing the deltas before it.


def may_predate_stack_rules(weights) -> bool:
    """Whether a song with LoRAs may have been made under the stacking rule before 2026-12-06: it records neither
    "stack_rules" nor "lora_int8" (both written only since that day's change). Such a song can still come from the
    same day (the command line recorded no marker on a bf16 checkpoint until stop 41): callers say "if"."""
    return (isinstance(weights, dict) and bool(weights.get("loras")) and "stack_rules" not in weights
            and "lora_int8" not in weights)


def fl_companion_twice(recorded: list) -> tuple[int, int] | None:
    """(i, j) when entry i of a song's adapters (`recorded_weights`' [(record, strength_ar, strength_nar)]) is an FL
    AR file whose NAR companion is entry j too (its sha256 among i's companions), both at a NAR strength other than
    0: a stack made before 2026-12-06, when both reached the NAR (the companion's deltas applied twice), refused
    since (`apply.check_unique`). None otherwise."""
    for i, (a, _, a_nar) in enumerate(recorded):
        shas = {c.get("sha256") for c in a.get("companions") or []
                if isinstance(c, dict) and isinstance(c.get("sha256"), str) and c.get("sha256")}
        if not shas or a_nar == 0.0:
            continue
        for j, (b, _, b_nar) in enumerate(recorded):
            if j != i and b_nar != 0.0 and isinstance(b.get("sha256"), str) and b.get("sha256") in shas:
                return i, j
    return None


def recorded_int8_mode(weights) -> str | None:
    """How a song's adapters were applied to int8 layers: config.json "weights"."lora_int8" ("side": exact side
    deltas, "bf16": merged into layers dequantized to bf16 — `apply.apply_stack`, YUE2_LORA_INT8), written when
    LoRAs were applied to an int8 checkpoint. None when the song records none (no LoRA, a bf16 checkpoint, a song
    saved before the field). AdapterError naming the value when it is neither."""
    from .apply import INT8_MODES
    mode = weights.get("lora_int8") if isinstance(weights, dict) else None
    if mode is None:
        return None
    if not isinstance(mode, str) or mode not in INT8_MODES:
        raise AdapterError(f"the song's config.json \"weights\": `lora_int8` must be "
                           f"{' or '.join(repr(m) for m in INT8_MODES)} (how its LoRAs were applied to int8 layers); "
                           f"found {str(mode)[:80]!r}")
    return mode


def _inside(rel) -> bool:
    """A recorded relative name that stays inside its folder (no absolute path, no `..`)."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel):
        return False
    norm = os.path.normpath(rel)
    return norm != ".." and not norm.startswith(".." + os.sep)


def _same(path: str, sha: str) -> bool:
    try:
        return os.path.isfile(path) and file_sha256(path) == sha
    except OSError:
        return False


def _check_at(record: dict, candidate: str, want: str) -> tuple[bool, str | None]:
    """(main file matches, the first companion / shard that is missing or changed, or None)."""
    try:
        target = candidate
        if os.path.isdir(candidate):
            rel = record.get("weights_file")
            if _inside(rel):
                target = os.path.join(candidate, rel)
            else:  # records written before weights_file
                cands = [os.path.join(candidate, n) for n in ("adapter_model.safetensors", "lora.safetensors",
                                                              "model.safetensors", "model.safetensors.index.json")]
                target = next((c for c in cands if os.path.isfile(c)), None)
                if target is None:
                    return False, None
        if not _same(target, want):
            return False, None
        base = candidate if os.path.isdir(candidate) else os.path.dirname(os.path.abspath(candidate))
        others = [c for c in record.get("companions") or [] if isinstance(c, dict)]
        if os.path.isdir(candidate):
            others += [s for s in record.get("shards") or [] if isinstance(s, dict)]
        for c in others:
            sha, rel = c.get("sha256"), c.get("relpath", c.get("file"))
            name = c.get("file") or rel
            if not isinstance(sha, str) or not _inside(rel):
                return True, f"{name!r} (a malformed companion entry)"
            if _same(os.path.join(base, rel), sha):
                continue
            if candidate == record.get("path") and isinstance(c.get("path"), str) and _same(c["path"], sha):
                continue
            return True, f"{name} (sha256 {sha[:16]}…, expected at {os.path.join(base, rel)})"
        return True, None
    except OSError:
        return False, None


def files_of_size(folders, size: int):
    """(path, mtime_ns) of every file of exactly `size` bytes under `folders` (searched recursively; unreadable
    entries skipped): where a recorded adapter or VAE file may sit renamed (`find_recorded`, Load Song's
    fingerprint)."""
    for folder in folders:
        for dirpath, _, names in os.walk(folder):
            for n in names:
                path = os.path.join(dirpath, n)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if st.st_size == size:
                    yield path, st.st_mtime_ns


def find_recorded(record: dict, search_dirs=(), what: str = "LoRA") -> str:
    """The adapter a song recorded: `record["path"]` when it still has the recorded sha256 (for a directory
    adapter: its recorded `weights_file`, or for older records adapter_model / lora / model .safetensors) and every
    recorded companion (FL NAR file, adapter_config.json) and shard still has its sha256 at its recorded place
    relative to it, else the first file named `record["file"]` under `search_dirs` (searched recursively) for which
    all of that holds, else (a single-file record with its `bytes`) the first file of that size under `search_dirs`
    for which it holds — the same file renamed. AdapterError saying exactly which file is missing or changed — the
    weights file, or the companion (name, sha256, where it was, the folders searched) — otherwise."""
    if not isinstance(record, dict) or not isinstance(record.get("file"), str) or not isinstance(
            record.get("sha256"), str):
        raise AdapterError(f"the song's config.json has a malformed {what} entry: {str(record)[:200]!r}")
    want, name = record["sha256"], record["file"]
    bad_companion = None

    def matches(path: str) -> bool:
        nonlocal bad_companion
        main_ok, companion = _check_at(record, path, want)
        if main_ok and companion is not None:
            bad_companion = bad_companion or companion
        return main_ok and companion is None

    recorded = record.get("path")
    if isinstance(recorded, str) and matches(recorded):
        return recorded
    for folder in search_dirs:
        for dirpath, dirnames, filenames in os.walk(folder):
            for n in (*filenames, *dirnames):
                if n == name and matches(os.path.join(dirpath, n)):
                    return os.path.join(dirpath, n)
    size = record.get("bytes")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0 and not record.get("weights_file") \
            and not (isinstance(recorded, str) and os.path.isdir(recorded)):
        # renamed (or moved under another name): a file of the recorded size whose sha256 and companions match —
        # only files of that exact size are hashed (ComfyUI-user review, stop 44: a renamed LoRA was "missing")
        for path, _ in files_of_size(search_dirs, size):
            if matches(path):
                return path
    where = f" (it was at {recorded})" if isinstance(recorded, str) else ""
    searched = ", ".join(str(d) for d in search_dirs) or "no other folder"
    if bad_companion is not None:
        raise AdapterError(f"this song was made with the {what} {name} (sha256 {want[:16]}…){where}; the file is "
                           f"there, but its companion {bad_companion} is missing or has changed; searched "
                           f"{searched}. Put the same companion back: a song is re-rendered only with the weights "
                           f"it was made with.")
    raise AdapterError(f"this song was made with the {what} {name} (sha256 {want[:16]}…){where}, which is missing or "
                       f"has changed; searched {searched} (by name, and by size and sha256). Put the same file back "
                       f"(the command line also takes it with --{'lora' if what == 'LoRA' else 'vae'} PATH): a song "
                       "is re-rendered only with the weights it was made with.")
