"""The weights a `render` of a song folder uses again: its recorded checkpoint, LoRA stack, VAE and int8 LoRA mode,
checked against what is given on the command line."""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path


def _num(x: float) -> str:
    """A strength as typed on the command line: 0.8, 1, -0.5."""
    return f"{x:g}"


def _recorded_checkpoint(song_dir: str, config: dict | None = None) -> str | None:
    """The checkpoint path recorded in a song directory's config.json (existing or not), or None. `config`: the
    config.json `load_song` verified (render passes it: the file is not read again)."""
    try:
        if config is None:
            config = json.loads((Path(song_dir) / "config.json").read_text("utf-8"))
        path = config.get("checkpoint", {}).get("path")
    except (OSError, ValueError, AttributeError):
        return None
    return path if isinstance(path, str) and path else None


def _song_checkpoint(song_dir: str, config: dict | None = None) -> str | None:
    """The checkpoint path recorded in a song directory's config.json, when that file still exists."""
    path = _recorded_checkpoint(song_dir, config)
    return path if path and Path(path).exists() else None  # a file, or a vendor folder


def _song_weights(args, config: dict | None = None) -> tuple[list, str | None]:
    """The adapters and VAE a re-render uses: --lora / --vae when given, else those the song's config.json records
    (found by name and sha256, companions included: their recorded path, then the ComfyUI loras / vae folders).
    AdapterError names a recorded file or companion that is missing or changed (with several recorded adapters:
    the --lora options that give them all), or a malformed "weights" entry or recorded strength. --lora given for a
    song that recorded other adapters or strengths: a warning on stderr (they replace the record)."""
    from ..errors import AdapterError
    from ..weights.locate import comfy_checkpoint_dirs
    from ..weights.lora.record import find_recorded, recorded_weights
    if config is None:  # render passes the config.json load_song verified: a file saved since is not read
        try:
            config = json.loads((Path(args.song) / "config.json").read_text("utf-8"))
        except (OSError, ValueError):
            config = {}
    loras, vae = args.lora, args.vae
    if getattr(args, "no_lora", False):  # the song without its adapters (new-user finding, stop 40: no way but :0)
        if loras:
            raise AdapterError("--no-lora and --lora exclude each other: --no-lora renders without any adapter, "
                               "--lora with the ones given")
        loras = []
        if vae is not None:
            return loras, vae
    elif loras and vae is not None:  # both given: the record is not used
        return loras, vae
    # a malformed "weights" entry (a string, `loras` not a list, an entry not an object, a strength "abc") is an
    # AdapterError naming it, never "no adapters"
    recorded, recorded_vae = recorded_weights(config.get("weights") if isinstance(config, dict) else None)
    models = [d.parent for d in comfy_checkpoint_dirs()]
    as_given = [f"{rec.get('file')}:{_num(ar)}:{_num(nar)}" for rec, ar, nar in recorded]
    if getattr(args, "no_lora", False):
        if recorded:
            print(f"note: --no-lora renders without the adapters this song was made with ({', '.join(as_given)}): "
                  "the audio will differ", file=sys.stderr)
    elif not loras and recorded:
        found, missing = [], None
        for rec, ar, nar in recorded:
            try:
                found.append((find_recorded(rec, [m / "loras" for m in models]), ar, nar))
            except AdapterError as exc:
                found.append((rec.get("path") or rec.get("file"), ar, nar))
                missing = missing or exc
        if missing is not None:
            if len(recorded) < 2:
                raise missing
            # review finding: giving only the missing file with --lora dropped the other adapters silently; the
            # options as paths (new-user finding, stop 40: bare names could not be pasted) — the missing one where
            # the song had it
            options = " ".join(shlex.quote(f"--lora={p}:{_num(ar)}:{_num(nar)}") for p, ar, nar in found)
            raise AdapterError(f"{missing} --lora replaces every recorded adapter: give all {len(recorded)} with "
                               f"their strengths, as the song has them (the missing one where it lies now): "
                               f"{options}") from None
        loras = found
        _refuse_old_fl_stack(recorded, found)
    elif loras and recorded:
        given = [f"{Path(p).name}:{_num(ar)}:{_num(nar)}" for p, ar, nar in loras]
        same = _same_adapters(recorded, loras)
        if same is None:  # review finding: a partial --lora changed the song without a word
            print(f"warning: --lora replaces the adapters this song was made with ({', '.join(as_given)}; now "
                  f"{', '.join(given)}): the music will differ unless these are the same files and strengths",
                  file=sys.stderr)
        elif not same:  # break-it review (stop 40): deltas are summed in stack order
            print(f"warning: --lora gives the song's adapters in another order ({', '.join(given)}; the song: "
                  f"{', '.join(as_given)}): their deltas are summed in the order given, so the weights differ by "
                  "rounding and the music may differ — give them in the song's order, or leave --lora out",
                  file=sys.stderr)
    if vae is None and recorded_vae:
        vae = find_recorded(recorded_vae, [m / "vae" for m in models], what="VAE")
    return loras, vae


def _same_adapters(recorded: list, given: list) -> bool | None:
    """Whether --lora entries `given` [(path, AR, NAR)] are the song's recorded adapters [(record, AR, NAR)]: the
    same weights files (sha256 of the file a song records — the file itself, or the weights file a folder adapter
    reads) with the same strengths under any name (new-user finding, stop 40: a byte-identical copy under another
    name was warned about) — True in the song's order, False in another order (the deltas are summed in stack
    order: the weights then differ by rounding), None when they are other adapters or strengths."""
    from ..errors import AdapterError
    from ..weights.lora.layouts_io import _dir_weights
    from ..weights.lora.record import file_sha256

    def sha(path) -> str | None:
        try:
            path = _dir_weights(str(path)) if os.path.isdir(path) else str(path)
            return file_sha256(path) if os.path.isfile(path) else None
        except (AdapterError, OSError):
            return None
    had = [(str(rec.get("sha256")), float(ar), float(nar)) for rec, ar, nar in recorded]
    now = [(str(sha(p)), float(ar), float(nar)) for p, ar, nar in given]
    if sorted(had) != sorted(now) or "None" in {h for h, _, _ in had}:
        return None
    return had == now


def _song_vendor_vae(record, checkpoint: str):
    """The VAE folder of the vendor model folder `checkpoint` for a re-render of a song whose config.json
    "checkpoint" entry is `record`: the one the song was decoded with, found again by its sample hash
    (`vendor.recorded_vae_folder`: its recorded path, the folders beside the model, ComfyUI's vae folders), with a
    note when the model folder alone would now take another; None for a checkpoint file or a song not made from a
    vendor folder (the folder's usual choice, `vendor.find_vae_folder`). Raises CheckpointError naming the recorded
    folder when it is gone or holds other weights; an older song without the sample hash gets a warning instead."""
    from ..errors import CheckpointError
    from ..weights.locate import comfy_checkpoint_dirs
    from ..weights.vendor import find_vae_folder, recorded_vae_folder
    if not os.path.isdir(checkpoint):
        return None
    found, note = recorded_vae_folder(record, checkpoint, [d.parent / "vae" for d in comfy_checkpoint_dirs()])
    if note:
        print(f"warning: {note}", file=sys.stderr)
    if found is not None:
        try:
            usual = find_vae_folder(checkpoint)
        except CheckpointError:
            usual = None
        if usual is None or os.path.realpath(usual) != os.path.realpath(found):
            now = f"not {usual}, which the model folder would take now" if usual else "the model folder finds none"
            print(f"note: decoding with the VAE folder the song was made with ({found}), {now}; --vae picks another",
                  file=sys.stderr)
    return found


def _note_replaced_vae(config: dict, used: dict, given: str) -> None:
    """`render --vae`: a note naming the VAE the song was decoded with (its VAE file, its vendor VAE folder or the
    checkpoint's own decoder) and the one `used` now (`VAEFile.record()` of `given`), when they are not the same
    weights (same sha256; a vendor folder: same sample hash or path). The new song records the new one."""
    weights = config.get("weights") if isinstance(config.get("weights"), dict) else {}
    old = weights.get("vae") if isinstance(weights.get("vae"), dict) else None
    ckpt = config.get("checkpoint") if isinstance(config.get("checkpoint"), dict) else {}
    folder = (ckpt.get("files") or {}).get("vae") if isinstance(ckpt.get("files"), dict) else None
    if old:
        if old.get("sha256") == used.get("sha256"):
            return
        was = f"the VAE {old.get('path') or old.get('file')}" + (f" ({old['variant']})" if old.get("variant") else "")
    elif ckpt.get("layout") == "vendor" and isinstance(folder, str):
        from ..weights.vendor import vae_folder_sample
        sample = ckpt.get("vae_sample_sha256")
        if (os.path.realpath(given) == os.path.realpath(folder) and not sample) or (
                sample and os.path.isdir(given) and vae_folder_sample(given) == sample):
            return
        was = f"the vendor VAE folder {folder}"
    else:
        was = f"the checkpoint's own VAE ({ckpt.get('path') or 'the checkpoint'})"
    print(f"note: --vae replaces the VAE this song was decoded with — {was} — by {used.get('path') or given}"
          f"{' (' + used['variant'] + ')' if used.get('variant') else ''}: the audio will differ unless they hold "
          "the same weights; the new song records the new one", file=sys.stderr)


def _note_old_stack_rule(weights, old_rule: list, loras: list) -> None:
    """A note on stderr when a re-render with the song's own adapters (`loras`: (path, AR, NAR) in the song's
    order) meets a stack where the rule before 2026-12-06 gave other weights (`engine.old_rule`: a replacement
    erased the deltas of an entry before it) and the song may come from that rule (`record.may_predate_stack_rules`:
    no "stack_rules" / "lora_int8" recorded): what changed, and the --lora options that give the old weights when
    one entry's deltas on that expert were all erased (review, stop 41)."""
    from ..weights.lora.record import may_predate_stack_rules
    if not old_rule or not may_predate_stack_rules(weights):
        return
    for item in old_rule:
        e, rep, gone = item["expert"], loras[item["replacer"]][0], loras[item["erased"]][0]
        how = "no --lora gives the old weights exactly: keep its audio.flac"
        if len(old_rule) == 1 and item["whole"]:
            options = [shlex.quote(f"--lora={p}:{_num(0.0 if k == item['erased'] and e == 'ar' else ar)}:"
                                   f"{_num(0.0 if k == item['erased'] and e == 'nar' else nar)}")
                       for k, (p, ar, nar) in enumerate(loras)]
            how = f"{' '.join(options)} renders it as the old rule did"
        print(f"note: this song records no stacking rule (saved before 2026-12-06, or that day): if it was made "
              f"before then, {rep} replaced {e.upper()} {', '.join(item['modules'])} and erased the deltas {gone}, "
              "before it in the stack, had put on them; replacements now apply first and those deltas add to them "
              f"(docs/lora.md, Stacking), so this render differs from its audio.flac — {how}", file=sys.stderr)


def _refuse_old_fl_stack(recorded: list, found: list) -> None:
    """AdapterError, before any weight is read, for a song made before 2026-12-06 with an FL AR file and its own NAR
    file as two adapters (`record.fl_companion_twice`): the NAR deltas applied twice then, the stack is refused now
    — said as such, with the --lora options that give the same NAR deltas once (their NAR strengths summed) where
    that fits ±5 (review, stop 41: refused with the general message only). `found`: (path, AR, NAR) where the
    song's adapters lie now."""
    from ..errors import AdapterError
    from ..weights.lora.apply import STRENGTH_RANGE
    from ..weights.lora.record import fl_companion_twice
    pair = fl_companion_twice(recorded)
    if pair is None:
        return
    i, j = pair
    (a, a_ar, a_nar), (b, _, b_nar) = found[i], found[j]
    total = a_nar + b_nar
    if abs(total) <= STRENGTH_RANGE:
        options = [shlex.quote(f"--lora={p}:{_num(ar)}:{_num(nar)}") for p, ar, nar in
                   [(a, a_ar, 0.0) if k == i else (b, 0.0, total) if k == j else e for k, e in enumerate(found)]]
        how = (f"{' '.join(options)} applies the same NAR deltas once, at their summed strength (the same song up "
               "to rounding)")
    else:
        how = f"their NAR strengths add up to {_num(total)}, past ±{STRENGTH_RANGE:g}: no --lora renders it as made"
    raise AdapterError(f"this song was made before 2026-12-06 with the FL adapter {a} and its own NAR file {b} as "
                       f"two LoRAs: both reached the NAR, so that file's deltas applied twice (×{_num(a_nar)} as the "
                       f"companion, ×{_num(b_nar)} as its own entry); the stacking rules changed and refuse that "
                       f"stack now — {how}; or give the --lora stack you want, or --no-lora")


def _song_lora_int8(weights) -> str | None:
    """How a re-render applies LoRAs to int8 layers (`YuE2Engine.load`'s `lora_int8`): the mode the song records
    (config.json "weights"."lora_int8", "side" | "bf16"); when $YUE2_LORA_INT8 asks for the other one, that one (a
    choice, as --steps is) — the new song records it. None when the song records no mode ($YUE2_LORA_INT8, else
    "side"). AdapterError for a malformed record. What is said of it comes after the load (`_say_lora_int8`): only
    when int8 layers got LoRAs."""
    from ..weights.lora.record import recorded_int8_mode
    made = recorded_int8_mode(weights)
    asked = os.environ.get("YUE2_LORA_INT8", "").strip()  # checked by _check_switches
    return asked if made is not None and asked and asked != made else made


_INT8_WORDS = {"side": "as exact side deltas beside the int8 codes", "bf16": "merged into layers dequantized to bf16"}


def nar_linears_note(weights, used: str | None, now: str = "this render uses", goal: str = "render it as it was made",
                     whose: str = "this song's NAR") -> str | None:
    """The note when NAR arithmetic `used` (an engine's or model's record, `weights["nar_linears"]`: "w8a8", None for
    the bf16 layers) differs from the song's: `weights` its config.json "weights" ("nar_linears": "w8a8" when W8A8
    took effect — YUE2_NAR_LINEARS w8a8, or auto, the default since stop 53, on a Hopper GPU —; absent: bf16
    layers, as every song before); None when they agree. `now`: what uses `used` ("this render uses"); `goal`: what
    setting the switch gives back; `whose`: the NAR the record is of. W8A8 differs from the bf16 layers by ≈ 1 % a
    product, so the audio differs slightly; nothing is refused (the command line's `render`, Load Song, a
    `batch --resume`)."""
    made = weights.get("nar_linears") if isinstance(weights, dict) else None
    made = made if made in ("w8a8", None) else str(made)[:40]
    if made == used:
        return None
    was = "W8A8 products (YUE2_NAR_LINEARS: w8a8, or auto on a Hopper GPU)" if made == "w8a8" else \
        "bf16 layers" if made is None else f"an unknown setting {made!r}"
    # (stop-53 review: "W8A8 applies to a bf16 NAR on CUDA only" was all it said, also on a non-Hopper CUDA GPU,
    # where it is YUE2_NAR_LINEARS=auto, the default, that keeps the bf16 layers)
    with_now = "W8A8 products" if used == "w8a8" else ("bf16 layers (W8A8 takes a bf16 NAR on CUDA; "
                                                      "YUE2_NAR_LINEARS=auto, the default, takes it on Hopper GPUs "
                                                      "only)")
    how = "set YUE2_NAR_LINEARS=w8a8 on a CUDA device" if made == "w8a8" else "set YUE2_NAR_LINEARS=bf16"
    return (f"{whose} multiplied with {was}; {now} {with_now}: the audio will differ slightly — {how} to "
            f"{goal}")


def _say_nar_linears(weights, used: str | None) -> None:
    """Say on stderr when a re-render's NAR multiplies otherwise than the song's did (`nar_linears_note`): `weights`
    its config.json "weights", `used` the loaded engine's record (`engine.weights["nar_linears"]`)."""
    note = nar_linears_note(weights, used)
    if note:
        print(f"note: {note}", file=sys.stderr)


def _say_lora_int8(weights, used: str | None) -> None:
    """Say on stderr how a re-render applied the LoRAs to int8 layers against what the song records (`weights`, its
    config.json "weights"): `used` is the mode the loaded engine records (`engine.weights["lora_int8"]`), None when
    no int8 layer got a LoRA — a bf16 checkpoint, adapters on float layers only, --no-lora —, where the mode changes
    nothing and nothing is said (review, stop 41: "LoRAs on int8 layers merged …" was said for a bf16 checkpoint)."""
    if used is None:
        return
    from ..weights.lora.record import recorded_int8_mode
    made = recorded_int8_mode(weights)
    asked = os.environ.get("YUE2_LORA_INT8", "").strip()
    if made is None:
        if asked == "bf16" and isinstance(weights, dict) and weights.get("loras"):  # stop 40: older songs
            print("note: this song does not record how its LoRAs went onto int8 layers (earlier versions, the "
                  "ComfyUI nodes' included, applied them as side deltas, the default); "
                  "YUE2_LORA_INT8=bf16 merges them into layers dequantized to bf16: the audio will differ slightly "
                  "— unset YUE2_LORA_INT8 to render it as it was most likely made", file=sys.stderr)
        return
    if used != made:
        print(f"note: YUE2_LORA_INT8={used} applies the LoRAs to int8 layers {_INT8_WORDS[used]}; this song was made "
              f"with {made} ({_INT8_WORDS[made]}): the audio will differ slightly — unset YUE2_LORA_INT8 to render "
              f"it as it was made; the new song records {used}", file=sys.stderr)
    elif made == "bf16":
        print(f"render: LoRAs on int8 layers {_INT8_WORDS[made]} (YUE2_LORA_INT8=bf16, the song's own)",
              file=sys.stderr)
