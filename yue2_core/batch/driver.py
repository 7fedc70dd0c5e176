"""The driver side of `python -m yue2_core batch`: the output folder, resume decisions, the context and memory checks,
batch.json and the terminal — everything but running songs (`runner.iter_songs` does that, given an engine).

Order: read the rows (`requests.read_requests`) → check the output folder (only batch.json, this file's song
folders and our own hidden temporaries may be there; songs already there need --resume) → decide per row: verified
song (skipped), damaged song (removed and redone), absent (run) → refuse rows whose prompt + budget exceeds the
context → size the batch against the budget → load the engine (the factory is called only when a song must run) →
run, writing each song with `artifacts.save_song` and batch.json after each.
"""
from __future__ import annotations

import json
import re
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..constants import FRAMES_PER_SECOND
from ..errors import ArtifactError, RequestError, YuE2Error, brief
from .requests import BatchRequest, check_context, read_requests
from .summary import BATCH_FILE, BatchProgress, BatchSummary, failure_line


@dataclass
class BatchOptions:
    """The command's options. `budget_gib`: memory the batch may use on the device, weights included (None:
    what is free now); `max_batch`: songs per AR batch (None: min(8, what fits)); `overlap`: render a batch's songs
    while the next batch's AR phases run (None: `runner.default_overlap`, on CUDA only); `continuous`: each AR
    phase decodes the whole queue on `max_batch` rows, refilling a row as soon as its song ends (not with Ray;
    None: `choose_batching`)."""

    requests: str
    output: str
    max_batch: int | None = None
    budget_gib: float | None = None
    resume: bool = False
    steps: int = 32
    max_seconds: float | None = None
    max_abc_tokens: int | None = None
    overlap: bool | None = None
    method: str = "midpoint"  # the ODE solver of the render: "midpoint" (the release's) or the opt-in "ab2"
    continuous: bool | None = None  # continuous batching: a finished song's row takes the next song (`continuous.py`)
    run: dict | None = None  # what made the songs beyond these options (the CLI: checkpoint, device, dtype, adapters,
    #                          VAE), recorded in batch.json `settings` as given


_TEMP = re.compile(r"\.(.+)\.[A-Za-z0-9_]{8}\.partial|\.batch\.json\..+\.tmp|\.(.+)\.set-aside-\d{8}T\d{6}(-\d+)?"
                   r"|\.yue2-lock"  # the claim inside the folder (`artifacts.reserve_output`, inside_ok)
                   r"|\.yue2-room-[a-z0-9_]{8}")  # a killed quota probe's file (`artifacts.ROOM_FILE`)


_FILE_MANAGER_FILES = {".DS_Store", "Thumbs.db", "desktop.ini", ".directory"}


def _file_manager_file(name: str) -> bool:
    """Whether `name` is what a file manager leaves in folders it shows: Finder's .DS_Store and AppleDouble `._NAME`
    siblings (on exFAT / network volumes), Explorer's Thumbs.db and desktop.ini, KDE's .directory."""
    return name in _FILE_MANAGER_FILES or name.startswith("._")


def check_output(out: Path, ids: set[str], resume: bool) -> None:
    """The batch folder may be new, or hold only batch.json, folders named after this file's ids and our hidden
    temporaries; songs already there need `resume` (batch.json alone, no song folder, does not: a run that started
    no song may run again). Raises ArtifactError naming the foreign entries, saying to add
    --resume, or naming a name on the path longer than the file system takes (`artifacts.check_name_limits`)."""
    from ..artifacts import batch_folder_above, check_name_limits, song_folder_above
    check_name_limits(out)  # a name over NAME_MAX on the way: said with the limit, not "File name too long"
    try:
        if out.is_symlink():  # its claim would lie beside the link, not beside the folder another run names
            target = Path(os.path.realpath(out))  # (break-it, stop 57: was "is not a folder; give a new folder",
            where = (f"the folder {target}" if target.is_dir() else  # which abandoned a batch reached by a link)
                     f"{target}, which {'does not exist' if not os.path.lexists(target) else 'is not a folder'}")
            raise ArtifactError(f"--output {out} is a symbolic link (to {where}); a batch writes into a real folder: "
                                + (f"give that folder itself (--output {target}) or a new folder" if target.is_dir()
                                   else "give the path of a new folder"))
        if out.exists() and not out.is_dir():
            raise ArtifactError(f"--output {out} is not a folder; give a new folder for the batch")
        batch = batch_folder_above(out)
        if batch is not None:  # as `generate` (break-it, stop 39: that batch's; stop 42: at any depth)
            raise ArtifactError(f"--output {out} is inside a batch output folder ({batch} holds "
                                f"{BATCH_FILE}): its --resume would then refuse the folder as not its own; give a "
                                "path outside it")  # --resume then refused the nested folder)
        song = song_folder_above(out)
        if song is not None:  # as `generate` (break-it review 52)
            raise ArtifactError(f"--output {out} is inside the song folder {song} (it holds result.json): a song "
                                "folder holds only its own files — give a path outside it")
        if not out.exists():
            return
        names = sorted(p.name for p in out.iterdir())
    except OSError as exc:
        raise ArtifactError(f"cannot use --output {out}: {exc.strerror or exc}") from None
    # what file managers leave in any folder they show (Finder, Explorer): never a reason to give up a batch folder
    # (break-it, stop 39: a .DS_Store made --resume say "choose a new folder", abandoning every finished song)
    names = [n for n in names if not _file_manager_file(n)]
    foreign = [n for n in names if n != BATCH_FILE and n not in ids and not _TEMP.fullmatch(n)]
    foreign += [n for n in names if n in ids and not (out / n).is_dir()]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        try:
            songs = BATCH_FILE in names and all((out / n / "result.json").is_file() for n in foreign)
        except OSError:
            songs = False
        if songs:  # a batch's own songs whose rows this request file lacks (break-it: "not this batch's")
            raise ArtifactError(f"output folder {out} holds songs whose ids are not rows of this request file: "
                                f"{shown}. Resume with the request file the batch was made with (rows may be added, "
                                "not removed), or choose a new folder")
        raise ArtifactError(f"output folder {out} holds files that are not this batch's: {shown}. A batch folder "
                            "holds only batch.json and one folder per request id; choose a new folder")
    mine = [n for n in names if n == BATCH_FILE or n in ids]
    if mine == [BATCH_FILE] and not resume:  # a record, no song: a run refused at load (a LoRA stack), or one whose
        return  # rows all failed validation — the same command runs again (nothing to lose; was: "add --resume")
    if mine and not resume:
        if BATCH_FILE not in names:  # folders named like this file's ids, but no batch ever ran here
            raise ArtifactError(f"output folder {out} holds folders named like this file's ids ("
                                f"{', '.join(mine[:3])}{' …' if len(mine) > 3 else ''}) but no {BATCH_FILE}: they "
                                "were not written by `batch` (or its record was removed). Choose a new folder; "
                                "--resume would keep the ones that verify as this file's songs and refuse the rest")
        raise ArtifactError(f"output folder {out} already holds a batch ({len(mine)} entries: "
                            f"{', '.join(mine[:3])}{' …' if len(mine) > 3 else ''}); add --resume to finish it, or "
                            "choose a new folder")
    if resume and (out / BATCH_FILE).is_file():  # it will be rewritten: refuse one that cannot be read, not lose it
        try:
            with open(out / BATCH_FILE, "rb"):
                pass
        except OSError as exc:
            raise ArtifactError(f"cannot read {out / BATCH_FILE} ({exc.strerror or exc}); resuming would replace "
                                "it: fix its permissions or move it away first") from None


def set_aside(folder: Path) -> Path:
    """Rename a damaged song folder to a hidden sibling `.ID.set-aside-YYYYMMDDTHHMMSS[-n]` (which the batch folder
    check accepts) instead of deleting it: a resumed batch never destroys files. Returns the new path; OSError when
    the rename fails."""
    import time
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(100):
        target = folder.with_name(f".{folder.name}.set-aside-{stamp}" + (f"-{n}" if n else ""))
        if not target.exists():
            os.rename(folder, target)
            return target
    raise OSError(f"no free name to set {folder} aside")


def _song_names() -> set:
    """Every file name a song folder of this pack may hold."""
    from ..artifacts import FILES, PARTIAL_MARKER, PLAN_FILES
    return {*FILES, *PLAN_FILES, "plan_manifest.json", "result.json", PARTIAL_MARKER}


def _unreadable(folder: Path) -> str | None:
    """The first file of `folder` that cannot be opened for reading ("name (reason)"), None when all can."""
    for p in folder.iterdir():
        try:
            with open(p, "rb"):
                pass
        except OSError as exc:
            return f"{p.name} ({exc.strerror or exc})"
    return None


def _score_edited(folder: Path) -> bool:
    """Whether the song in `folder` verifies except for a score.abc the user edited (`render` re-renders it)."""
    from ..artifacts import load_song
    try:
        return load_song(folder, edited_ok=True).score_edited
    except (YuE2Error, OSError):
        return False


def resume_state(folder: Path, item: BatchRequest, steps: int,
                 method: str = "midpoint", run: dict | None = None) -> tuple[str, str | None]:
    """What --resume does with the song folder of `item`: ("run", None) when there is none, ("done", None) when it
    verifies (every file's sha256, status complete) and holds this request with these budgets, steps and solver,
    made with this run's weights (`run`: `BatchOptions.run`, compared by `_made_otherwise` where given),
    ("redo", why) when it is a song of this pack (result.json) that is incomplete or damaged and holds only song
    files (it is set aside, renamed `.ID.set-aside-<time>`, never deleted), ("refuse", why) otherwise (another
    request's song, a folder without result.json, or files that are not a song's: left alone, the row fails)."""
    from ..artifacts import load_song
    from ..pipeline import request_dict
    if folder.is_symlink():  # never removed or trusted: the song it points to is not this batch folder's
        return "refuse", f"{folder} is a symbolic link; a batch's song folders are real folders — move it away"
    if not folder.exists():
        return "run", None
    try:
        saved = load_song(folder)
        if saved.result.get("status") != "complete" or "audio.flac" not in saved.result.get("artifacts", {}):
            raise ArtifactError(f"{folder}: the song has no audio (status {saved.result.get('status')!r})")
    except YuE2Error as exc:
        try:
            names = {p.name for p in folder.iterdir()}
        except OSError as err:  # an unreadable folder is not damage: never redo what could not be checked
            return "refuse", (f"{folder} cannot be checked: {err.strerror or err}; fix it (permissions, storage) "
                              "or move the folder away to redo this song")
        if "result.json" not in names:  # not a song this pack wrote (our saves are atomic): never ours to redo
            return "refuse", (f"{folder} holds no result.json, so it is not a song this pack wrote (or its record "
                              "is gone); move it away to make this song")
        if {n for n in names if not _file_manager_file(n)} <= _song_names():
            unreadable = _unreadable(folder)
            if unreadable:  # a read error is not damage: never remove what could not be checked
                return "refuse", (f"{folder} cannot be checked: cannot read {unreadable}; fix it (permissions, "
                                  "storage) or move the folder away to redo this song")
            if _score_edited(folder):
                return "refuse", (f"{folder}: its score.abc was edited after the song was saved (render it with "
                                  "`python -m yue2_core render`); move the folder away to redo this song")
            edited = _metadata_edited(folder)
            if edited:  # the tokens and latents verify: an edit of a settings file or the audio never costs the song
                return "refuse", (f"{folder}: its {' and '.join(edited)} changed after the song was saved (the "
                                  "latents and tokens still verify"
                                  + ("; a tag editor rewrites audio.flac" if "audio.flac" in edited else "")
                                  + "); restore the file, or move the folder away to redo this song")
            return "redo", str(exc)
        return "refuse", (f"{folder} does not verify ({exc}) and holds files that are not a song's "
                          f"({', '.join(sorted(names - _song_names())[:3])}); move it away to redo this song")
    want = request_dict(item.request)
    b = item.budgets
    cfg = saved.config
    differ = []
    if saved.tokens.request != want:
        differ.append("its request.json is another request than this row "
                      f"({_request_changes(saved.tokens.request, want)})")
    if cfg.get("ode_steps") != steps:
        differ.append(f"it was rendered with --steps {cfg.get('ode_steps')!r}, this run uses {steps}")
    if cfg.get("ode_method", "midpoint") != method:
        differ.append(f"it was rendered with --ode-method {cfg.get('ode_method')!r}, this run uses {method}")
    changed = []
    for label, saved_s, wanted in (("music", cfg.get("semantic_sampling"), b.semantic_sampling().to_dict()),
                                   ("lead sheet", cfg.get("abc_sampling"), b.abc_sampling().to_dict())):
        saved_s = saved_s if isinstance(saved_s, dict) else {}
        changed += [f"{label} {key} {saved_s.get(key)!r} (this run: {wanted.get(key)!r})"
                    for key in sorted(set(saved_s) | set(wanted)) if saved_s.get(key) != wanted.get(key)]
    if changed:
        differ.append(f"its sampling settings differ from this row's: {', '.join(changed[:4])}"
                      f"{' …' if len(changed) > 4 else ''} (set by --max-seconds: 25 music tokens a second, "
                      "--max-abc-tokens, and the row's sampling fields)")
    differ += _made_otherwise(cfg, run or {})
    if differ:
        return "refuse", (f"{folder} holds a verified song made otherwise: {'; '.join(differ)}. Resume with the "
                          "song's settings, give the row another id, or move the folder away")
    return "done", None


def _request_changes(saved: dict, want: dict) -> str:
    """The request fields in which a verified song (`saved`, its request.json) and this row (`want`) differ, each
    with the song's value and the row's when short (break-it, stop 57: "another request than this row" named none —
    a seed changed in the request file read like a damaged folder)."""
    from ..errors import quoted
    names = {"abc": "score (abc / abc_path)"}
    parts = []
    for key in want:
        old, new = saved.get(key) if isinstance(saved, dict) else None, want[key]
        if old == new:
            continue
        if key == "abc" or (isinstance(old, str) and isinstance(new, str) and max(len(old), len(new)) > 40):
            parts.append(f"its {names.get(key, key)} differs")
        else:
            parts.append(f"{names.get(key, key)}: the song's {quoted(old, limit=40)}, this row's "
                         f"{quoted(new, limit=40)}")
    return "; ".join(parts) or "it does not record one"


def _made_otherwise(cfg: dict, run: dict) -> list[str]:
    """How a verified song's config.json says it was made otherwise than this run (`BatchOptions.run`: checkpoint,
    dtype, LoRAs, VAE file): another checkpoint path, another file at the same path (its sample hash,
    `weights.checkpoint.content_sample`), another --dtype, other adapters or strengths, another way of applying them
    to int8 layers (YUE2_LORA_INT8, "weights"."lora_int8"), another VAE file, another vendor VAE folder (`run`
    "vendor_vae": `_vendor_vae_differs`). Each song
    is checked, not only batch.json's record: a batch stopped before its record counted a song, or a record lost,
    let a resume with another model finish an album made by two (break-it review, stop 39)."""
    from ..weights.checkpoint import content_sample
    differ = []
    recorded = cfg.get("checkpoint") if isinstance(cfg.get("checkpoint"), dict) else {}
    path = run.get("checkpoint")
    if isinstance(path, str) and isinstance(recorded.get("path"), str):
        if os.path.abspath(recorded["path"]) != os.path.abspath(path):
            differ.append(f"it was made with the checkpoint {recorded['path']}, this run uses {path}")
        elif recorded.get("sample_sha256") and content_sample(path) not in (None, recorded["sample_sha256"]):
            differ.append(f"the checkpoint {path} is not the file it was made with (the same path, other contents)")
    dtype, made = {"bf16": "bfloat16", "fp32": "float32"}.get(run.get("dtype")), cfg.get("model_dtype")
    # bf16 asked and float32 recorded on a GPU: what a GPU without native bf16 runs (`pipeline.compute_dtype`)
    fallback = dtype == "bfloat16" and made == "float32" and str(cfg.get("device", "")).startswith("cuda")
    if dtype and isinstance(made, str) and made != dtype and not fallback:
        differ.append(f"it was made in {made}, this run uses --dtype {run['dtype']}")
    weights = cfg.get("weights") if isinstance(cfg.get("weights"), dict) else None
    if weights is not None and isinstance(run.get("loras"), (list, tuple)):
        def _lora(path, ar, nar):
            return os.path.abspath(str(path)), float(ar), float(nar)
        try:
            had = sorted(_lora(r.get("path", r.get("file", "?")), r.get("strength_ar", 1.0), r.get("strength_nar", 1.0))
                         for r in weights.get("loras") or [])
            now = sorted(_lora(*entry) for entry in run["loras"])
        except (AttributeError, TypeError, ValueError):
            had, now = None, []
        if had != now:
            shown = ", ".join(f"{os.path.basename(p)}:{a:g}:{n:g}" for p, a, n in (had or [])) or "none"
            differ.append(f"it was made with the LoRAs {shown}, this run's --lora differ")
    if weights is not None and run.get("loras") and isinstance(weights.get("lora_int8"), str) \
            and ("lora_int8" not in run or run["lora_int8"] is not None):  # None: this run's LoRAs reach no
        # int8 layer (stop 41), the mode changes nothing
        from ..weights.lora.apply import int8_mode  # how LoRAs go onto int8 layers decides the numbers
        if weights["lora_int8"] != int8_mode(run.get("lora_int8")):
            differ.append(f"its LoRAs were applied to the int8 layers as {weights['lora_int8']!r}, this run applies "
                          f"them as {int8_mode(run.get('lora_int8'))!r} (YUE2_LORA_INT8)")
    differ += _vendor_vae_differs(recorded, weights, run)
    if weights is not None and "vae" in run:
        old = weights.get("vae").get("path") if isinstance(weights.get("vae"), dict) else None
        new = os.path.abspath(run["vae"]) if isinstance(run["vae"], str) else None
        if (os.path.abspath(old) if isinstance(old, str) else None) != new:
            differ.append(f"it was decoded with {'the VAE ' + old if old else 'the checkpoint VAE'}, this run uses "
                          f"{'--vae ' + str(run['vae']) if new else 'the checkpoint VAE'}")
    return differ


def vendor_vae_record(info, vae_flag=None) -> dict | None:
    """The VAE folder a run from the vendor model folder of `info` (`CheckpointInfo`, layout "vendor") decodes with
    — {"path": absolute path, "sample_sha256": `vendor.vae_folder_sample` or None} —, None for an all-in-one file or
    when `vae_flag` (--vae) decodes instead. What `BatchOptions.run` "vendor_vae" holds: a batch compares it with the
    one its songs (and batch.json) record, since `find_vae_folder` may pick another folder later (one put beside
    the model)."""
    files = getattr(info, "files", None) or {}
    if getattr(info, "layout", "comfy") != "vendor" or vae_flag or not files.get("vae"):
        return None
    from ..weights.vendor import vae_folder_sample
    return {"path": os.path.abspath(files["vae"]), "sample_sha256": vae_folder_sample(files["vae"])}


def _same_vendor_vae(old: dict, new: dict) -> bool:
    """Whether two vendor VAE records name the same weights: by sample hash when both have one, else by path."""
    if isinstance(old.get("sample_sha256"), str) and isinstance(new.get("sample_sha256"), str):
        return old["sample_sha256"] == new["sample_sha256"]
    return os.path.abspath(str(old.get("path"))) == os.path.abspath(str(new.get("path")))


def _vendor_vae_differs(recorded: dict, weights: dict | None, run: dict) -> list[str]:
    """`_made_otherwise`'s VAE-folder part: a song made from a vendor model folder (config.json "checkpoint":
    layout "vendor", files.vae, vae_sample_sha256) decoded with its VAE folder, while this run (`run`
    "vendor_vae", `vendor_vae_record`) would decode with another one (break-it: a VAE folder put beside the model
    later is preferred by `find_vae_folder`, and a resume finished the album with two VAEs)."""
    now = run.get("vendor_vae")
    files = recorded.get("files") if isinstance(recorded.get("files"), dict) else {}
    if (not isinstance(now, dict) or recorded.get("layout") != "vendor" or not isinstance(files.get("vae"), str)
            or (weights is not None and weights.get("vae"))):  # a VAE file decoded it: the --vae check says so
        return []
    made = {"path": files["vae"], "sample_sha256": recorded.get("vae_sample_sha256")}
    if _same_vendor_vae(made, now):
        return []
    return [f"it was decoded with the VAE folder {made['path']}, this run would decode with {now['path']} "
            f"({'other weights' if made['path'] == now['path'] else 'found beside the model now'})"]


# what a user may edit by hand without touching the song's tokens and latents: the settings, and the audio (a tag
# editor rewrites a FLAC's metadata block) — a folder where only these changed is kept and refused, never redone
_SETTINGS_FILES = ("config.json", "request.json", "audio.flac")


def _metadata_edited(folder: Path) -> list[str]:
    """The user-editable files (config.json, request.json, audio.flac) of `folder` whose sha256 no longer matches
    result.json's manifest while every other listed file does — [] when that is not the case (unreadable, others
    damaged too)."""
    import hashlib
    try:
        listed = json.loads((folder / "result.json").read_text("utf-8")).get("artifacts") or {}
        bad = []
        for name, entry in listed.items():
            if Path(name).name != name:
                return []
            digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
            if digest != (entry or {}).get("sha256"):
                bad.append(name)
    except (OSError, ValueError, AttributeError, TypeError):
        return []
    return bad if bad and all(n in _SETTINGS_FILES for n in bad) else []


def _check_resume_settings(out: Path, options: "BatchOptions", ids: set) -> tuple[bool | None, dict | None]:
    """What a --resume must keep of the batch in `out`: (the batching that made its songs — True: continuous —, the
    saved settings), checked before any work. The record is the folder's batch.json `settings`, whenever the folder
    holds song folders of this request file (None, None when it holds none: nothing to stay consistent with). Raises
    RequestError when `--steps` / `--ode-method` / the caps `--max-seconds` / `--max-abc-tokens` / the weights
    `--checkpoint` / `--dtype` / `--lora` / `--vae` (when recorded: `_run_differs`) / an explicit `--continuous` /
    `--no-continuous` differ from it (finishing it so would leave an album made two ways),
    when a recorded value is not of its kind (e.g.
    `"continuous": "no"`). When batch.json is missing, unreadable, holds no settings (e.g. a folder another
    program wrote) or no completed song, the songs say how they were made (`songs_batching`); songs made both ways,
    or made otherwise than an explicit option asks, are refused too."""
    from .summary import load_summary
    if not any((out / i).is_dir() for i in ids):
        return None, None
    path = out / BATCH_FILE
    saved = load_summary(out)
    settings = (saved or {}).get("settings")
    if not isinstance(settings, dict) or not saved.get("complete"):  # no record of how songs were made (a run
        modes = songs_batching(out, ids)  # that completed none records its own options, not theirs)
        if len(modes) > 1:
            raise RequestError(f"the songs in {out} were made both with continuous and with static batches, and "
                               f"{path} is missing or damaged: give a new --output folder (or move the songs of "
                               "one kind away)")
        made = modes.pop() if modes else None
        if made is not None and options.continuous is not None and made != options.continuous:
            raise RequestError(f"the songs in {out} were made with "
                               f"{'--continuous' if made else 'static batches (--no-continuous)'} (their "
                               "result.json); resume it with the same option, or give a new --output folder")
        return made, None
    kinds = {"steps": int, "ode_method": str, "continuous": bool}
    for key, kind in kinds.items():
        value = settings.get(key)
        if value is not None and type(value) is not kind:
            raise RequestError(f"{path}: settings.{key} is {json.dumps(value)}, not "
                               f"{'true or false' if kind is bool else 'an integer' if kind is int else 'a name'} — "
                               "the file was edited or damaged; restore it (or give a new --output folder)")
    for key in ("max_seconds", "max_abc_tokens"):  # recorded since 2026-12-04: a number, or null for no cap
        value = settings.get(key)
        kinds_ok = (int,) if key == "max_abc_tokens" else (int, float)
        if value is not None and type(value) not in kinds_ok:
            raise RequestError(f"{path}: settings.{key} is {json.dumps(value)}, not a number or null — the file was "
                               "edited or damaged; restore it (or give a new --output folder)")
    _check_recorded_values(path, settings)
    wanted = {"--steps": (settings.get("steps"), options.steps),
              "--ode-method": (settings.get("ode_method", "midpoint"), options.method)}
    differ = [f"{flag} {old}" for flag, (old, new) in wanted.items() if old is not None and old != new]
    for key, flag, new in (("max_seconds", "--max-seconds", options.max_seconds),
                           ("max_abc_tokens", "--max-abc-tokens", options.max_abc_tokens)):
        if key in settings and settings[key] != new:  # the caps every song's budgets came from
            differ.append(f"{flag} {settings[key]}" if settings[key] is not None else f"no {flag}")
    differ += _run_differs(settings, options.run or {})
    made = settings.get("continuous") is True  # absent (batch.json before continuous batching): static
    if options.continuous is not None and made != options.continuous:  # other rows: other songs
        differ.append("--continuous" if made else "static batches (--no-continuous)")
    if differ:
        raise RequestError(f"{out} was made with {' '.join(differ)} (its batch.json); resume it with the same "
                           f"option{'s' if len(differ) > 1 else ''}, or give a new --output folder")
    _vendor_vae_refused(out, settings, options.run or {})
    return made, settings


def _nar_linears_note(out: Path, settings: dict | None, run: dict) -> str | None:
    """A --resume's note when the songs in `out` (batch.json `settings`) and this run multiply the NAR otherwise
    ("nar_linears": "w8a8" or null, recorded since stop 53 by a batch without Ray, which knows its device). A note,
    not a refusal as for YUE2_LORA_INT8: the device is not compared either, and under YUE2_NAR_LINEARS=auto (the
    default) the arithmetic follows the GPU (W8A8 on Hopper GPUs), so an album resumed on another GPU kind would be
    refused for a switch its maker never set; a `--ray` run whose workers are GPUs of several kinds mixes both in one
    run; W8A8 and the bf16 layers differ by ≈ 1 % a product, and each song's config.json records its own."""
    if settings is None or "nar_linears" not in settings or "nar_linears" not in run:
        return None
    from ..cli.song_weights import nar_linears_note
    return nar_linears_note(settings, run["nar_linears"], now="this run uses",
                            goal="make the rest as they were made", whose=f"the NAR of the songs in {out} (its "
                            f"{BATCH_FILE})")


def _vendor_vae_refused(out: Path, settings: dict, run: dict) -> None:
    """RequestError, before any work, when batch.json records the vendor VAE folder its songs were decoded with
    (`settings` "vendor_vae", `vendor_vae_record`) and this run would decode with another one — a VAE folder put
    beside the vendor model later, which `find_vae_folder` prefers — or other weights at its path: the rows left
    would be decoded by another VAE. A record without the key (older batch.json) compares nothing."""
    old, new = settings.get("vendor_vae"), run.get("vendor_vae")
    if "vendor_vae" not in settings or "vendor_vae" not in run or old == new:
        return
    if isinstance(old, dict) and isinstance(new, dict) and _same_vendor_vae(old, new):
        return
    if not isinstance(old, dict) or not isinstance(new, dict):  # a VAE file, an all-in-one file: --vae /
        return  # --checkpoint differ (`_run_differs`)
    now = ("other weights at that path" if old.get("path") == new["path"]
           else f"this run would decode with {new['path']}")
    raise RequestError(f"{out} was decoded with the VAE folder {old.get('path')} (its batch.json), {now}: "
                       "put that VAE folder back beside the model (or move the new one away), or give a new "
                       "--output folder")


def _check_recorded_values(path: Path, settings: dict) -> None:
    """RequestError when a value batch.json `settings` records could not have come from a command line (steps
    outside 1–MAX_ODE_STEPS, an unknown ODE method, a cap that is not a positive finite number, a weights path that
    is not text): the file was edited or damaged — said so, instead of asking the user to resume "with the same
    option" --steps 10^30 (break-it review, stop 32)."""
    import math
    from ..constants import MAX_ODE_STEPS
    from ..nar import ODE_METHODS
    problems = []
    steps, method = settings.get("steps"), settings.get("ode_method")
    if steps is not None and not 1 <= steps <= MAX_ODE_STEPS:
        problems.append(f"settings.steps is {steps}, outside 1–{MAX_ODE_STEPS}")
    if method is not None and method not in ODE_METHODS:
        problems.append(f"settings.ode_method is {json.dumps(method)}, not one of {', '.join(ODE_METHODS)}")
    for key in ("max_seconds", "max_abc_tokens"):
        value = settings.get(key)
        if value is not None and not (math.isfinite(value) and value > 0):
            problems.append(f"settings.{key} is {json.dumps(value)}, not a positive number")
    # each weights field named with what it holds and what a command line writes there (stop 42: `"dtype": [1]`
    # was called "not a path or name", `"loras": "x"` an option to resume "with")
    for key in ("checkpoint", "vae"):
        value = settings.get(key)
        if value is not None and not isinstance(value, str):
            problems.append(f"settings.{key} is {json.dumps(value)[:80]}, not a path (text)"
                            + (" or null" if key == "vae" else ""))
    from ..weights.lora.apply import INT8_MODES
    for key, names, none_ok in (("dtype", ("bf16", "fp32"), False), ("lora_int8", INT8_MODES, True)):
        value = settings.get(key)
        if value is not None and value not in names:  # (a list or dict is never `in` a tuple of str: no TypeError)
            problems.append(f"settings.{key} is {json.dumps(value)[:80]}, not one of "
                            f"{', '.join(json.dumps(n) for n in names)}{' or null' if none_ok else ''}")
    loras = settings.get("loras")
    if loras is not None and not _lora_triples(loras):
        problems.append(f"settings.loras is {json.dumps(loras)[:80]}, not a list of [path, AR strength, NAR "
                        "strength] entries")
    vendor = settings.get("vendor_vae")
    if vendor is not None and not (isinstance(vendor, dict) and isinstance(vendor.get("path"), str)):
        problems.append(f"settings.vendor_vae is {json.dumps(vendor)[:80]}, not a VAE folder record")
    if problems:
        raise RequestError(f"{path}: {'; '.join(problems)} — the file was edited or damaged; restore it (or give a "
                           "new --output folder)")


def _lora_triples(loras) -> bool:
    """Whether batch.json `settings.loras` is as the command line records it: a list of [path, AR, NAR] (a path
    text, two numbers)."""
    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool)
    return isinstance(loras, list) and all(isinstance(e, list) and len(e) == 3 and isinstance(e[0], str)
                                           and number(e[1]) and number(e[2]) for e in loras)


def _lora_text(loras) -> str:
    return " ".join(f"--lora {p}:{a:g}:{n:g}" if isinstance(a, (int, float)) and isinstance(n, (int, float))
                    else f"--lora {p}" for p, a, n in loras) if loras else "no --lora"


def _run_differs(settings: dict, run: dict) -> list[str]:
    """The weights options of this run (`BatchOptions.run`: --checkpoint, --dtype, --lora, --vae) that differ from
    those batch.json `settings` recorded (a key recorded since 2026-12-04, compared when both sides have it): the
    songs of one batch come from one model. The device is not compared (the same model on another device). Also
    `lora_int8` (YUE2_LORA_INT8's mode, recorded when --lora reaches int8 layers: side and bf16 give other
    numbers; a batch.json without it, or either side None, compares nothing). The vendor VAE folder:
    `_vendor_vae_refused`."""
    differ = []
    for key, flag in (("checkpoint", "--checkpoint"), ("dtype", "--dtype"), ("vae", "--vae"), ("loras", "--lora"),
                      ("lora_int8", "YUE2_LORA_INT8")):
        if key not in settings or key not in run:
            continue
        old, new = settings[key], run[key]
        if key == "lora_int8":  # the mode LoRAs go onto int8 layers with: an environment switch, not an option;
            # compared only when both runs put LoRAs on int8 layers (stop 41: None — float layers only, or a
            # batch.json that recorded a mode for float layers — the mode changes nothing)
            if old != new and old is not None and new is not None:
                differ.append(f"YUE2_LORA_INT8={old}")
        elif key == "loras":  # JSON gives lists of [path, AR, NAR]
            new = [list(x) for x in new]
            triples = isinstance(old, list) and all(isinstance(x, list) and len(x) == 3 for x in old)
            if old != new:
                differ.append(_lora_text(old) if triples else f"--lora {json.dumps(old)}")
        elif old != new:
            differ.append(f"{flag} {old}" if old is not None else f"no {flag}")
    return differ


def songs_batching(out: Path, ids) -> set:
    """How the songs in `out` named by `ids` were batched, as their result.json records it: {True} continuous (the
    refill decoder marks its phases' timing `continuous_batching`), {False} static, both, or set() when no song's
    result.json can be read."""
    modes = set()
    for i in ids:
        try:
            record = json.loads((out / i / "result.json").read_text("utf-8"))
        except (OSError, ValueError):
            continue
        modes.add(_marked(record))
    return modes


def _marked(node) -> bool:
    if isinstance(node, dict):
        return node.get("continuous_batching") is True or any(_marked(v) for v in node.values())
    if isinstance(node, list):
        return any(_marked(v) for v in node)
    return False


def choose_batching(continuous: bool | None, *, made: bool | None = None, on_cuda: bool, ray: bool,
                    batched: bool | None = None) -> bool:
    """Whether the batch decodes with continuous batching: `continuous` when given (True/False); else the mode a
    resumed folder was `made` with; else on CUDA with the fast decoder (YUE2_FAST on, `batched` not False) and
    without Ray — on the H200 continuous batching made 16 songs of 16 different lengths 1.46× faster than static
    batches (86.7 vs 126.7 s), and songs of one length about as fast (docs/batch.md); with real weights songs end when
    the music does, so lengths differ even under one budget. On the CPU static batches (rows one at a time: the songs
    of `generate`'s portable sampler), with Ray static chunks per worker."""
    if continuous is not None:
        return bool(continuous)
    if made is not None:
        if made and ray:  # as `--continuous --ray` (run_batch), before any work
            raise RequestError("this batch folder was made with continuous batching (its batch.json or songs say "
                               "so), which --ray cannot do (each worker decodes chunks of --max-batch songs): resume "
                               "it without --ray")
        if made and on_cuda and batched is not False:
            from ..fast import fast_enabled
            if not fast_enabled("cuda"):
                raise RequestError("this batch folder was made with continuous batching (its batch.json or songs "
                                   "say so), which needs the fast GPU decoder that YUE2_FAST=0 turns off: resume it "
                                   "without YUE2_FAST=0")
        return made
    if ray or not on_cuda or batched is False:
        return False
    from ..fast import fast_enabled
    return fast_enabled("cuda")


def _encode_once(encode, keep: int = 16):
    """`encode` remembering its last `keep` texts' token ids (a fresh list each call): the context check of 10,000
    rows naming one 200,000-character score file tokenized that score 10,000 times (stop 58)."""
    from collections import OrderedDict
    seen: OrderedDict = OrderedDict()

    def cached(text):
        if not isinstance(text, str) or len(text) < 256:
            return encode(text)
        if text in seen:
            seen.move_to_end(text)
            return list(seen[text])
        ids = list(encode(text))
        seen[text] = tuple(ids)
        if len(seen) > keep:
            seen.popitem(last=False)
        return ids
    return cached


def run_batch(options: BatchOptions, **kw) -> int:
    """`_run_batch` (below) while this process holds the batch folder (`artifacts.reserve_output`): a second batch
    on the same folder at the same time — two `--resume`s, say — stops at once with an ArtifactError naming the
    first (its pid) instead of computing the same songs twice and overwriting batch.json. A name on the --output
    path longer than the file system takes is refused first (`artifacts.check_name_limits`, as `generate` does):
    the claim asked the OS about that path and failed with a traceback (`OSError: File name too long`)."""
    from ..artifacts import check_name_limits, reserve_output
    if str(options.output).strip():
        check_name_limits(options.output)
    with reserve_output(options.output, "batch folder", inside_ok=True) as claim:
        if claim.note:  # a file system that takes no locks: no claim
            print(f"warning: {claim.note}", file=kw.get("stream") or sys.stderr)
        return _run_batch(options, **kw)


def _run_batch(options: BatchOptions, *, tokenizer, dims, engine_factory, weights_bytes: int = 0,
              on_cuda: bool = False, dtype_bytes: int = 2, free_bytes: int | None = None,
              batched: bool | None = None, stream=None, runner=None, vae=None,
              on_batching: Callable[[int, bool], None] | None = None) -> int:
    """Run a batch; returns the exit status: 0 all rows complete, 1 when any row failed. batch.json is written in
    `options.output` after every song and at the end (also on Ctrl-C / SIGTERM, which is re-raised as
    KeyboardInterrupt after it). `tokenizer` / `dims`: the checkpoint's (read before loading the weights);
    `engine_factory()` loads the engine; `weights_bytes`, `on_cuda`, `dtype_bytes`, `free_bytes` (what is free
    when no --budget is given) and `vae` (the checkpoint's `VAEConfig`, for the render stage's share; None: the NAR
    part only) size the batch (`memory.size_batch`). Whole-batch problems (the request file, the
    output folder, --max-batch over budget) raise YuE2Error before any song runs. `runner`: runs the songs instead
    of `iter_songs` on `engine_factory()` (`ray_runner.RayRunner`: `prepare()` → (free bytes, on CUDA) of its
    workers for the sizing, `songs(todo, out, …)` yields outcomes of songs it wrote, `settings` → batch.json).
    `on_batching(rows, continuous)`: called once the batch is sized, before `engine_factory` (the CLI's engine then
    warms up the kernels of that decoder while it loads)."""
    from ..artifacts import save_song, signals_held
    from ..candidates import GIB
    from .memory import size_batch, song_bytes, stage_bytes
    from .runner import default_overlap, iter_songs
    stream = stream or sys.stderr
    items, bad = read_requests(options.requests, max_seconds=options.max_seconds,
                               max_abc_tokens=options.max_abc_tokens)
    out = Path(options.output)
    ids = {i.id for i in items} | {b.id for b in bad if b.id}
    check_output(out, ids, options.resume)
    made, saved_settings = _check_resume_settings(out, options, ids) if options.resume else (None, None)
    if note := _nar_linears_note(out, saved_settings, options.run or {}):
        print(f"note: {note}", file=stream)
    summary = BatchSummary({"requests": str(options.requests), "max_batch": options.max_batch,
                            "budget_gib": options.budget_gib, "steps": options.steps, "ode_method": options.method,
                            "max_seconds": options.max_seconds, "max_abc_tokens": options.max_abc_tokens,
                            "resume": options.resume, **(options.run or {})})
    for b in bad:
        summary.add(b.line, b.id, "failed", stage="validate", error=b.message)
    if options.budget_gib is not None and not (0 < options.budget_gib < float("inf")):
        raise RequestError(f"--budget must be a positive, finite number of GiB, got {options.budget_gib}")
    if options.max_batch is not None and (type(options.max_batch) is not int or options.max_batch < 1):
        raise RequestError(f"--max-batch must be a positive integer, got {options.max_batch!r}")
    if options.continuous is True and runner is not None:
        raise RequestError("--continuous refills the rows of one device's decoder; with --ray each worker decodes "
                           "chunks of --max-batch songs (one AR batch each), so there is nothing to refill: leave "
                           "out --continuous or --ray")
    todo, sizes, stages, redo = [], [], [], []
    from ..artifacts import check_file_size_limit, check_path_limits, free_space_note
    encode = _encode_once(tokenizer.encode)  # rows sharing one score file (or style, lyrics) encode it once
    for item in items:
        try:
            counts = check_context(item, encode)
            check_path_limits(out / item.id)  # a path past PATH_MAX / NAME_MAX: now, not when the song is saved
        except YuE2Error as exc:
            summary.add(item.line, item.id, "failed", stage="validate", error=f"line {item.line}: {exc}")
            continue
        state, why = (resume_state(out / item.id, item, options.steps, options.method, options.run)
                      if options.resume else ("run", None))
        if state == "done":
            summary.add(item.line, item.id, "complete", resumed=True, stage="complete", output=str(out / item.id),
                        **_earlier_result(out / item.id))
            continue
        if state == "refuse":
            summary.add(item.line, item.id, "failed", stage="resume", error=why)
            continue
        try:  # this process writes every song folder, with --ray too (the workers send the files' bytes back:
            # `RayRunner._store`): one past its file-size limit (`ulimit -f`) fails now, not at its save after minutes
            # of work (stop-47 review; stop 49: --ray rows were not checked). The workers' own limits are theirs
            # (they write no song file; Ray's object spilling and logs are Ray's)
            check_file_size_limit(item.budgets.semantic_sampling().max_tokens, f"row {item.id!r}",
                                  "--max-seconds (or the row's semantic_sampling max_tokens)")
        except YuE2Error as exc:
            summary.add(item.line, item.id, "failed", stage="validate", error=f"line {item.line}: {exc}")
            continue
        if state == "redo":  # removed only once every check of the whole batch passed (below)
            redo.append((item, why))
        summary.add(item.line, item.id, "pending")
        todo.append(item)
        sizes.append(song_bytes(dims, dtype_bytes, counts, item))
        stages.append((counts, item))
    max_batch = 1
    overlap = options.overlap
    continuous = choose_batching(options.continuous, made=made, on_cuda=on_cuda, ray=runner is not None,
                                 batched=batched)
    if todo:
        if runner is not None:  # the workers' devices, not the driver's, size the batch
            free_bytes, on_cuda = runner.prepare()
            summary.settings["ray"] = runner.settings
        if overlap is None:  # the workers' device decides (the CLI's default; a forced `batched` says nothing)
            overlap = default_overlap("cuda" if on_cuda else "cpu")
        budget = int(options.budget_gib * GIB) if options.budget_gib is not None else free_bytes
        if budget is None:  # nothing measurable: the requested size, or 8
            max_batch = min(options.max_batch or 8, len(todo))
        else:
            stage = max(stage_bytes(dims, vae, dtype_bytes, c, i, on_cuda) for c, i in stages)
            max_batch = size_batch(max(sizes), budget_bytes=budget, weights_bytes=weights_bytes,
                                   max_batch=options.max_batch, on_cuda=on_cuda, stage=stage, songs=len(todo),
                                   overlap=bool(overlap) and runner is None
                                   and len(todo) > (1 if continuous else options.max_batch or 1))
    if (todo and options.max_batch is None and runner is None and not continuous
            and not _rows_batched(batched, on_cuda)):
        max_batch = 1  # rows run one at a time anyway: a larger batch would only hold songs back from the disk
    summary.settings["max_batch"] = max_batch
    summary.settings["overlap"] = overlap
    summary.settings["continuous"] = continuous
    if not todo and saved_settings is not None:  # nothing ran (all verified or refused): the record of how the
        summary.settings = {**saved_settings, "resume": True}  # songs were made stays (a later resume reads it)
    if not todo and not summary.count("complete") and not os.path.lexists(out):  # every row failed before any
        # work (read, validated): nothing ran, so no folder is made for a batch.json of errors (leftover, stop 46:
        # a folder holding only batch.json, the last line saying "finish it with --resume"); an existing folder
        # still gets its record (a --resume's refusals name what to fix in each song folder)
        print(summary.table(written=False), file=stream)
        print(f"nothing ran: every row failed before any work, so no batch folder was made ({out}); fix the rows "
              "above and run the same command again", file=stream)
        return 1
    if on_batching is not None and todo and runner is None:
        on_batching(max_batch, continuous)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArtifactError(f"cannot create the batch folder {out}: {exc.strerror or exc}") from None
    summary.write(out)  # the folder is writable before any damaged song is removed
    home = _identity(out)  # the folder this batch writes: a save never makes it again (`_check_home`)
    if todo:
        print(f"batching: {_batching_line(continuous, max_batch, on_cuda, batched, runner is not None)}"
              + _overlap_note(overlap, continuous, max_batch, len(todo), runner is not None)
              + (" (kept from the folder's batch.json)" if made is not None and options.continuous is None else ""),
              file=stream)
    room = free_space_note(out, [item.budgets.semantic_sampling().max_tokens for item in todo])
    if room:
        print(f"warning: {room}", file=stream)
    from .requests import budget_notes
    for item in todo:  # as `generate` prints them (result.json keeps them too)
        for note in item.request.input_warnings() + budget_notes(item):
            print(f"[{item.id}] warning: {note}", file=stream)
        if item.request.abc is not None:  # a given score: the same check as `generate --abc-file` (used as given)
            from ..protocol import score_notes
            seconds = item.budgets.semantic_sampling().max_tokens / FRAMES_PER_SECOND
            for note in score_notes(item.request.abc, seconds, limit=5, cot=item.request.cot,
                                    duration_setting="--max-seconds, or the row's semantic_sampling max_tokens"):
                print(f"[{item.id}] warning: {note}", file=stream)
    for item, why in redo:
        try:
            kept = set_aside(out / item.id)
        except OSError as exc:
            summary.add(item.line, item.id, "failed", stage="resume", error=f"cannot set the damaged song "
                        f"folder {out / item.id} aside to redo it: {exc.strerror or exc}")
            todo.remove(item)
            continue
        print(f"[{item.id}] redoing: {why}; the damaged folder is kept as {kept} (delete it when you no longer "
              "need it)", file=stream)

    progress = BatchProgress(stream)

    def record(result) -> None:
        fields = result.to_dict()
        fields.pop("id"), fields.pop("line"), fields.pop("disk_full", None)
        status = fields.pop("status")
        if status == "failed" and result.id not in progress.failed:  # once: the progress line said it already
            print(failure_line(result.id, result.stage, result.error), file=stream)  # (stop 40 review: twice)
        summary.add(result.line, result.id, status, **fields)

    songs = full = gone = None
    jobs: dict = {}  # each song's job by id (`iter_songs`): how far the songs a stopped run did not yield got
    try:
        if todo:
            kw = dict(max_batch=max_batch, steps=options.steps, on_event=progress, batched=batched,
                      overlap=overlap, method=options.method)
            if runner is None:
                def deliver(item, song):
                    _check_home(out, home, summary)  # save_song would make a moved or removed folder again
                    return save_song(song, out / item.id)
                songs = iter_songs(engine_factory, todo, deliver=deliver, continuous=continuous, jobs=jobs, **kw)
            else:  # the driver writes the workers' songs too (`RayRunner._store`): the same check before each
                songs = runner.songs(todo, out, before_save=lambda: _check_home(out, home, summary), **kw)
            for result in songs:
                record(result)
                if getattr(result, "disk_full", False):
                    full = result
                    break
                gone = _moved(out, home, summary)
                if gone:
                    break
                summary.write(out)
        if gone:  # moved or removed by someone while the batch ran: stop as a Ctrl-C does, write nothing more
            _drain(songs, record, stream)
            summary.stopped = "the batch folder was moved or removed"
            _account_left(summary, jobs, record, summary.stopped, tracked=runner is None)
            print(summary.table(written=False), file=stream)
            raise _gone_error(out, gone)
        if full is not None:  # no room to save songs: compute no more (stop 40 review: every later song was
            _stop_on_full_disk(songs, record, summary, full, stream, jobs,  # computed, then failed at its save)
                               tracked=runner is None, out=out)
    except KeyboardInterrupt:
        if songs is not None:  # a Ctrl-C between two songs (e.g. while writing batch.json) reaches the generator
            _drain(songs, record, stream)  # too (one that came from inside it has ended it: this returns at once)
        try:  # the record of how the run ended, with further interrupts held until it is written: a second Ctrl-C
            with signals_held():  # here left batch.json as it was before the songs the drain recorded (review)
                _account_left(summary, jobs, record, "interrupted", tracked=runner is None, out=out)
                summary.interrupted = True
                summary.write(out)
        except KeyboardInterrupt:  # one held meanwhile, delivered now: the run is ending anyway
            pass
        print(summary.table(), file=stream)
        raise
    summary.write(out)
    print(summary.table(), file=stream)
    again = ("finish it with --resume" if summary.count("complete") or options.resume else  # no song saved: the
             "run the same command again")  # folder holds only batch.json, which a new run may replace
    print(f"songs: {out}/<id>/ (audio.flac, score.abc, …); summary: {out / BATCH_FILE}"
          + (f"; after fixing the failed rows, {again}" if summary.count("failed") else ""), file=stream)
    return 1 if summary.count("failed") else 0


def _identity(folder: Path) -> tuple | None:
    """(device, inode) of `folder`, None when it is gone (or no longer a folder); a folder that cannot be looked at
    for another reason (a transient error) counts as unchanged."""
    import errno
    import stat
    try:
        st = os.lstat(folder)
    except OSError as exc:
        return None if exc.errno in (errno.ENOENT, errno.ENOTDIR) else _UNKNOWN
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


_UNKNOWN = ("unknown",)


def _moved(out: Path, home: tuple | None, summary: BatchSummary | None = None) -> str | None:
    """How the batch folder `out` is no longer the folder this batch made or took (`home`, `_identity`): "removed
    or moved away", "replaced by another folder", or None when it is the same (or cannot be told). Other numbers
    with `summary`'s last batch.json there are the same folder (stop-57 diff review: a FUSE file system without
    use_ino — sshfs, rclone — numbers a folder anew once the kernel forgets it, a CIFS mount with noserverino too,
    and an NFS automount remounted after its idle timeout has another device number; a link put where the folder
    was leads to it: each stopped a healthy batch as "replaced by another folder")."""
    now = _identity(out)
    if now == home or _UNKNOWN in (now, home):
        return None
    if summary is not None and summary.holds_mine(out):
        return None
    return "removed or moved away" if now is None else "replaced by another folder"


def _gone_error(out: Path, what: str) -> ArtifactError:
    return ArtifactError(f"the batch folder {out} was {what} while the batch ran: no more songs are saved and its "
                         f"{BATCH_FILE} is not written (the songs saved before are where that folder went). Put the "
                         "folder back, or give its new path as --output, and run the same command with --resume")


def _check_home(out: Path, home: tuple | None, summary: BatchSummary | None = None) -> None:
    """ArtifactError (`_gone_error`) when the batch folder `out` was moved, removed or replaced while the batch ran
    (`_moved`; break-it, stop 57: the next song's save made the folder again and the batch ended "6 of 6 complete"
    over a folder holding 3 of them, the rest where the folder went). Nothing more is written there."""
    what = _moved(out, home, summary)
    if what:
        raise _gone_error(out, what)


def _stop_on_full_disk(songs, record, summary: BatchSummary, full, stream, jobs: dict, tracked: bool = True,
                       out: Path | None = None) -> None:
    """After a song's save failed for lack of space (`full`: its outcome, `errors.DiskFullError`): stop the songs as
    a Ctrl-C does (`_drain`: the render worker stops, songs written meanwhile are recorded, nothing half-written),
    record how far every song not yielded got (`_account_left`), mark the batch `stopped` and say how many songs
    are left, which were saved, failed and are left, and that --resume continues."""
    _drain(songs, record, stream)
    _account_left(summary, jobs, record, "the disk is full", tracked, out)
    summary.stopped = "the disk is full"
    left = summary.count("pending")
    print(f"stopped: the disk is full (the save of {full.id!r} failed); {left} song{'s' if left != 1 else ''} left "
          f"not computed, the {summary.count('complete')} saved stay as they are: free space, then run the same "
          "command with --resume to continue", file=stream)
    print(summary.outcome_lines(), file=stream)


def _account_left(summary: BatchSummary, jobs: dict, record, why: str, tracked: bool = True,
                  out: Path | None = None) -> None:
    """After a run stopped early (`why`: "the disk is full", "interrupted"): the rows still "pending" whose song
    the run had started get their real outcome (`runner.left_outcome`, printed like any other through `record`):
    a song that had failed before the stop is failed with its stage and error, one saved is complete (was: both
    left "pending"), and one whose AR phases ran but that was not rendered stays pending with the last phase it
    finished and a note saying so; every pending row says that --resume computes it. `tracked` False (--ray: the
    workers report no job, `jobs` stays empty): a row without a job says that how far it got is not known — it may
    have been running on a worker (break-it, stop 41: "not started" for songs the workers were computing). A row
    whose song this run started and whose folder `out`/ID now holds a result.json (a save renames the whole folder
    into place, so it is complete) is complete, though the stop came between the rename and its outcome (stop-47
    review: "computed but it was not rendered or saved" beside the complete song folder)."""
    from .runner import left_outcome
    for row in list(summary.rows.values()):
        if row["status"] != "pending" or row["id"] is None:
            continue
        job = jobs.get(row["id"])
        if job is not None and out is not None and _saved_now(out / row["id"]):
            summary.add(row["line"], row["id"], "complete", stage="complete", output=str(out / row["id"]),
                        **_earlier_result(out / row["id"]))
            continue
        outcome = left_outcome(job) if job is not None else None
        if outcome is not None and outcome.status != "pending":
            record(outcome)
            continue
        stage = outcome.stage if outcome is not None else None
        done = {"plan": "its lead sheet was written", "semantic": "its lead sheet and music tokens were computed"}
        untold = "not saved; how far the Ray workers got with it is not known here"
        note = (f"{done[stage]} but it was not rendered or saved" if stage else
                "not started" if tracked or outcome is not None else untold) + (
            f" ({why}); --resume computes it from the start")
        summary.add(row["line"], row["id"], "pending", stage=stage, note=note,
                    **({"timing": outcome.timing} if outcome is not None and outcome.timing else {}))


def _saved_now(folder: Path) -> bool:
    """Whether a song folder is in place at `folder` (its result.json: saves are atomic)."""
    try:
        return not folder.is_symlink() and (folder / "result.json").is_file()
    except OSError:
        return False


def _drain(songs, record, stream) -> None:
    """After a Ctrl-C outside the songs' generator: raise it inside (its own interrupt handling stops the render
    worker and yields the songs already written) and `record` what it yields. A further Ctrl-C stops draining; an
    error while draining is printed to `stream` (the interrupt goes on; `--resume` finds what was written)."""
    try:
        result = songs.throw(KeyboardInterrupt())
        while True:
            record(result)
            result = next(songs)
    except (KeyboardInterrupt, StopIteration):
        pass
    except Exception as exc:  # noqa: BLE001 - the interrupt goes on; what could not be drained, --resume finds
        print(f"after the interrupt: {brief(exc)}", file=stream)
    close = getattr(songs, "close", None)
    while close is not None:  # a further Ctrl-C that stopped the draining left the generator at a yield: closing it
        try:  # ends its render stage, whose writer then renames no more song folders (`runner._Saver.seal`), so the
            close()  # record made next holds every folder it ever writes (review: one renamed after it stayed
            break  # "pending"); a generator that raised is closed already, so this ends
        except KeyboardInterrupt:
            continue
        except Exception as exc:  # noqa: BLE001
            print(f"after the interrupt: {brief(exc)}", file=stream)
            break


def _rows_batched(batched: bool | None, on_cuda: bool) -> bool:
    """Whether a static batch's rows decode together (`runner.default_batched` when not forced)."""
    from ..fast import fast_enabled
    return bool(batched) if batched is not None else on_cuda and fast_enabled("cuda")


def _batching_line(continuous: bool, rows: int, on_cuda: bool, batched: bool | None, ray: bool) -> str:
    """What the terminal says of the batching that runs (`run_batch`)."""
    if ray:
        return f"Ray workers, chunks of {rows} song{'s' if rows > 1 else ''} (one AR batch each)"
    if continuous:
        return f"continuous on {rows} row{'s' if rows > 1 else ''} (a row takes the next song as soon as its song ends)"
    if not _rows_batched(batched, on_cuda):
        when = "each saved before the next starts" if rows == 1 else f"in batches of {rows}"
        return f"songs one at a time, {when} (rows are not batched here: each song is the one `generate` makes)"
    return f"static batches of up to {rows} songs (each lasts as long as its longest song)"


def _overlap_note(overlap: bool | None, continuous: bool, rows: int, songs: int, ray: bool) -> str:
    """The overlap's part of the batching line: on, or asked for with nothing to overlap (one batch)."""
    if not overlap or ray:
        return ""
    if not continuous and songs <= rows:
        return "; --overlap has nothing to overlap: the queue is one batch"
    return "; renders overlap the next songs' AR phases"


__all__ = ["BatchOptions", "run_batch", "check_output", "resume_state", "vendor_vae_record"]


def _earlier_result(folder: Path) -> dict:
    """What a verified song folder's result.json says of the run that made it (audio seconds, music tokens, the
    truncation record and stage timings), for a resumed row of batch.json and the table; {} when unreadable."""
    try:
        with open(folder / "result.json", encoding="utf-8") as fh:
            r = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(r, dict):
        return {}
    out = {"audio_seconds": r.get("audio_seconds"), "semantic_tokens": r.get("frames"),
           "abc_tokens": _abc_count(folder), "truncated": r.get("truncated"), "timing": r.get("timing") or {}}
    return {k: v for k, v in out.items() if v is not None}


def _abc_count(folder: Path) -> int | None:
    """The lead-sheet tokens of a verified song folder (its abc_tokens.npy), None when unreadable."""
    try:
        import numpy as np
        return int(np.load(folder / "abc_tokens.npy", allow_pickle=False).size)
    except (OSError, ValueError):
        return None
