"""`python -m yue2_core inspect`: what a checkpoint, vendor folder, LoRA, VAE file, song folder or ABC lead sheet
holds."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..errors import YuE2Error


_AUDIO_WORDS = {"tagged": "has other bytes than the one saved (tags rewritten?) but the saved samples",
                "missing": "is missing (moved away?): `render` makes it again from the tokens",
                "changed": "differs from the one saved (other samples, or new tags on a song saved before 2026-12-06, "
                           "which records no digest of its samples): `render` makes it again from the tokens; "
                           "ComfyUI's Load Song needs the original"}


def _song_report(path: str) -> dict:
    """What `inspect` says of a song folder (generate/render/batch output): its files verified against their hashes
    (`artifacts.load_song`, ArtifactError naming a damaged file), the request, the lengths (ABC tokens; music frames
    at 25/s and seconds; audio samples at 48 kHz), whether budgets cut it, the weights it was made with.
    `score_edited`: this folder's score.abc was edited after the song was saved (render samples new music for it);
    `lineage.parent_score_edited`: the song was rendered from a parent whose score.abc had been edited (a song saved
    before 2026-12-06 records it as lineage "score_edited", shown under the new name). `audio_changed`: audio.flac
    is "tagged" (other bytes, the saved samples), "missing" or "changed" since the save — said, not refused, as
    `render` takes such a song (stop-47 review); every other file is still verified."""
    from ..artifacts import load_song
    saved = load_song(path, edited_ok=True, audio_ok=True)
    r, request = saved.result, saved.tokens.request
    weights = r.get("weights") or {}
    mot = weights.get("mot") or {}
    lineage = dict(r["lineage"]) if isinstance(r.get("lineage"), dict) else {}
    if "score_edited" in lineage and "parent_score_edited" not in lineage:  # `render`'s record before 2026-12-06
        lineage["parent_score_edited"] = lineage.pop("score_edited")
    from_edit = lineage.get("parent_score_edited") is True and isinstance(lineage.get("parent"), str)
    # the checkpoint's own record (config.json → checkpoint.synthetic, as generate, batch and the nodes write it): a
    # song found later says it is noise (new-user review 58: inspect said nothing of it)
    checkpoint = saved.config.get("checkpoint")
    synthetic = isinstance(checkpoint, dict) and checkpoint.get("synthetic") is True
    return {"kind": "song", "path": str(saved.path), "status": r.get("status"), "synthetic_weights": synthetic,
            "request": {"style": request.get("style"), "lyrics_chars": len(request.get("lyrics") or ""),
                        "cot": request.get("cot"), "seed": request.get("seed"), "cfg_scale": request.get("cfg_scale"),
                        "id": request.get("id")},
            "abc_tokens": len(saved.tokens.score.abc_ids), "score_edited": saved.score_edited,
            "audio_changed": saved.audio_changed, "audio_source": saved.config.get("audio_source"),
            "music_frames": r.get("frames"), "audio_seconds": r.get("audio_seconds"),
            "sample_rate": r.get("sample_rate"), "truncated_by_budget": r.get("truncated"),
            "checkpoint": {"path": mot.get("path"), "format": mot.get("format"), "layout": mot.get("layout")},
            "loras": weights.get("loras") or [], "lineage": lineage, "warnings": r.get("warnings") or [],
            "files": sorted((r.get("artifacts") or {}).keys()),
            # the folder's name (new-user review, stop 39: an edit's child read "song 'song'", its request id)
            "summary": (f"song {saved.path.absolute().name!r}"
                        + (f" (request id {request.get('id')!r})"
                           if request.get("id") not in (None, saved.path.absolute().name)
                           else "")
                        + f": {r.get('audio_seconds', 0):.2f} s of audio "
                        f"({r.get('frames')} frames), {len(saved.tokens.score.abc_ids)} ABC tokens, cot "
                        f"{request.get('cot')}, seed {request.get('seed')}; "
                        + (f"audio.flac {_AUDIO_WORDS[saved.audio_changed]}; the other files verified against "
                           "result.json" if saved.audio_changed else "files verified against result.json")
                        + ("; its audio.flac was saved as given by ComfyUI's Save Song (processed or made by "
                           "another node), not as the decode of latent.npy"
                           if saved.config.get("audio_source") == "given" else "")
                        + ("; score.abc edited since the song was made (render samples new music for it)"
                           if saved.score_edited else "")
                        + (f"; rendered from {lineage['parent']}, whose edited score.abc it sampled its music for"
                           if from_edit else "")
                        + ("; made with SYNTHETIC random weights: its audio is noise-like, not music"
                           if synthetic else ""))}


def _base_model_keys(path: str) -> bool:
    """Whether the safetensors file at `path` holds the embedded tokenizer or a base tensor of the AR/NAR experts
    (exact checkpoint names, as no adapter has them): then it is an all-in-one checkpoint, damaged if it does not
    load — not a VAE decoder because its vae.* tensors are there (break-it: `inspect` said "VAE decoder", exit 0)."""
    import re
    from ..weights.checkpoint import TOKENIZER_KEY, read_header
    if not os.path.isfile(path):
        return False
    try:
        entries = read_header(path)[0]
    except YuE2Error:
        return False
    base = re.compile(r"(text_encoders\.model|model\.diffusion_model)\."
                      r"(layers\.\d+\.(self_attn|mlp)\.[a-z_]+|embed_tokens)\.weight")
    return TOKENIZER_KEY in entries or any(base.fullmatch(k) for k in entries)


def cmd_inspect(args) -> int:
    from ..errors import CheckpointError
    from ..weights.checkpoint import dtype_histogram, inspect_checkpoint, load_tokenizer
    if os.path.isdir(args.checkpoint) and (os.path.isfile(os.path.join(args.checkpoint, "result.json"))
                                           or os.path.isfile(os.path.join(args.checkpoint, "batch.json"))):
        if not os.path.isfile(os.path.join(args.checkpoint, "result.json")):  # a batch folder: name its songs
            from ..artifacts import batch_folder_hint
            raise YuE2Error(f"{args.checkpoint} is not a song folder{batch_folder_hint(Path(args.checkpoint))}; "
                            "inspect one of those")
        report = _song_report(args.checkpoint)
        print(report["summary"], file=sys.stderr)
        print(_json_lines(report))
        return 0
    if not os.path.exists(args.checkpoint):
        args.checkpoint = _in_comfy(args.checkpoint, ("checkpoints", "loras", "vae"))
    dims = None
    if getattr(args, "model", None):
        if not os.path.exists(args.model):
            args.model = _in_comfy(args.model, ("checkpoints",), "--model ")
        dims = inspect_checkpoint(args.model, own_vae="optional").dims
    try:  # a vendor folder without a VAE folder is described, the VAE said missing (new-user review, stop 46)
        info = inspect_checkpoint(args.checkpoint, own_vae="optional")
    except CheckpointError as exc:
        from ..errors import DamagedWeightsError
        # a damaged all-in-one file or vendor folder, not a VAE or adapter (break-it: inspect said "VAE decoder")
        if isinstance(exc, DamagedWeightsError) or _base_model_keys(args.checkpoint):
            raise CheckpointError(f"{args.checkpoint} is a YuE2 checkpoint that does not load: {exc}") from None
        other, reasons = _inspect_other(args.checkpoint, dims)  # a LoRA or a VAE file?
        if other is None and reasons.get("vae_damaged"):  # break-it: "neither …", the reason on a later line
            raise CheckpointError(f"{args.checkpoint} is a YuE2 VAE decoder that is refused: "
                                  f"{reasons['vae']}") from None
        if other is None and _vae_weights(args.checkpoint):  # own-weights review, stop 58: "neither …", and the
            # checkpoint and LoRA readers' "give it as --vae" for a VAE that --vae refuses
            kind = "folder (config.json model_type yue2_vae)" if os.path.isdir(args.checkpoint) else "file"
            raise CheckpointError(f"{args.checkpoint} is a VAE {kind} that is refused: {reasons['vae']}") from None
        if other is None:
            score = None if os.path.isdir(args.checkpoint) else _abc_report(args.checkpoint)
            if score is not None:  # a lead sheet (new-user review, stop 51: `inspect score.abc` said "not a
                # safetensors file (header length 5551313623310219864 …)" three times)
                print(score["summary"], file=sys.stderr)
                print(_json_lines(score))
                return 0
            if _looks_like_adapter(args.checkpoint):
                why = reasons["lora"]
                if not reasons.get("lora_geometry"):  # the file's own fault, not another model's geometry
                    raise CheckpointError(f"{args.checkpoint} looks like a LoRA adapter but is refused: "
                                          f"{why}") from None
                geometry = "--model's geometry" if dims is not None else (
                    "the release geometry (hidden 2048, 28 layers; pass --model CHECKPOINT to check it against "
                    "another model, e.g. a synthetic one)")
                raise CheckpointError(f"{args.checkpoint} looks like a LoRA adapter but does not fit {geometry}: "
                                      f"{why}") from None
            folder = os.path.isdir(args.checkpoint)  # a folder may also be a song (new-user finding: not named)
            text = str(exc)
            lora_tail = reasons["lora"].partition(text)[2] if text in reasons["lora"] else None
            if not folder and reasons["vae"] == text and lora_tail is not None:  # one reason three times (a header
                # every reader refuses: stop-51 break-it review) → said once
                raise CheckpointError(f"{args.checkpoint} is neither a YuE2 checkpoint, a VAE decoder nor a LoRA "
                                      f"adapter: every reader refuses it the same way — {text}{lora_tail}") from None
            raise CheckpointError(f"{args.checkpoint} is neither a YuE2 checkpoint, a VAE decoder"
                                  f"{', a LoRA adapter nor a song folder' if folder else ' nor a LoRA adapter'}:"
                                  f"\n  as a checkpoint: {exc}\n  as a VAE decoder: {reasons['vae']}\n"
                                  f"  as a LoRA adapter: {reasons['lora']}"
                                  + ("\n  as a song folder: it holds no result.json" if folder else "")) from None
        if other.get("report") or other.get("summary"):  # the human-readable report (a LoRA's) or summary (a
            # VAE's: new-user review, stop 50, it printed only JSON); JSON on stdout, as for checkpoints and songs
            print(other.get("report") or other["summary"], file=sys.stderr)
        print(_json_lines(other))
        return 0
    tok = load_tokenizer(info)
    if info.vae is None:
        print(f"warning: the VAE is missing: {args.checkpoint} has no VAE folder (looked for its vae/, a "
              "m-a-p/YuE2-Vae folder beside it and the Hugging Face cache); to make songs with it give one with "
              "--vae PATH (a VAE folder or file), or put m-a-p/YuE2-Vae next to it or into its vae/ subfolder",
              file=sys.stderr)
    report = {"kind": "checkpoint", **info.to_dict()}
    report["dtype_histogram"] = dtype_histogram(info)
    report["tokenizer_vocab"] = tok.vocab_size
    report["summary"] = info.summary()
    print(report["summary"], file=sys.stderr)  # as for a LoRA, a VAE and a song (new-user review, stop 51: a
    # checkpoint printed only the JSON, though the stop-50 fix said all four kinds print a line here)
    print(_json_lines(report))
    return 0


def _in_comfy(name: str, kinds: tuple[str, ...], option: str = "") -> str:
    """The path of `name`, which is no path here, in the `models/<kind>` folders of the ComfyUI the checkpoint search
    uses — as generate's `--checkpoint` / `--lora` / `--vae` names are found (`locate.comfy_model_path`), with the
    same note (new-user review, stop 54: README's `inspect yue2_3b_int8_convrot.safetensors` said "not found" where
    `generate --checkpoint` of that name found the file in ComfyUI/models/checkpoints). CheckpointError when none
    holds it."""
    from ..errors import CheckpointError
    from ..weights.locate import HF_FILE, HF_REPO, _near_miss, comfy_model_folders, comfy_model_path
    for kind in kinds:
        found = comfy_model_path(name, kind)
        if found is not None:
            print(f"note: {option}{name}: {found[0]} (ComfyUI folder {found[1]})", file=sys.stderr)
            return found[0]
    folders = [f for kind in kinds for f in comfy_model_folders(kind)]
    where = f" (nor in ComfyUI's {', '.join(folders)})" if folders else ""
    what = ("inspect takes the path of a checkpoint (or the vendor's folder), a LoRA, a VAE file or folder, a song "
            "folder or an ABC lead sheet" if not option else "--model takes a checkpoint")
    # a lead sheet or a song folder is no "checkpoint" (new-user review 57: `inspect out/my_song/score.ab`)
    head = ("checkpoint not found" if option or name.lower().endswith((".safetensors", ".pt", ".bin", ".json"))
            else "lead sheet not found" if name.lower().endswith(".abc") else "not found")
    raise CheckpointError(f"{head}: {name} — no such file or folder here{where}{_near_miss(name)}; {what} (the "
                          f"release file is {HF_FILE} from https://huggingface.co/{HF_REPO})")


def _abc_report(path: str) -> dict | None:
    """`inspect` of a UTF-8 text file named `*.abc` or with ABC header fields (an edited score.abc, an --abc-file):
    the dialect check `generate --abc-file` and `render` print (without the run's --max-seconds) and the score's
    structure; None for anything else (not UTF-8 text, neither that name nor field lines, over the editor's 100 kB
    limit). A file named `*.abc` that is over the limit or not UTF-8 is said so (YuE2Error): it is a lead sheet,
    and the three "not a safetensors file (header length …)" reasons the other kinds give are no answer (stop-51
    diff review)."""
    import re
    from ..abc.errors import place
    from ..abc.service import MAX_ABC_BYTES, analyze
    named = path.lower().endswith(".abc")
    try:
        size = os.path.getsize(path)
        if size > MAX_ABC_BYTES:
            if named:
                raise YuE2Error(f"{path} is an ABC lead sheet of {size:,} bytes; inspect checks at most "
                                f"{MAX_ABC_BYTES:,} (the ABC Editor's limit; a 6-minute lead sheet is about 10 kB)")
            return None
        with open(path, "rb") as fh:
            raw = fh.read(MAX_ABC_BYTES + 1)
        text = raw.decode("utf-8")
    except OSError:
        return None
    except UnicodeDecodeError as exc:
        if named:
            raise YuE2Error(f"{path} is an ABC lead sheet that is not UTF-8 (byte {exc.start:,} is "
                            f"0x{raw[exc.start]:02X}: a Latin-1 or Windows-1252 file?); save it as UTF-8 — "
                            "generate --abc-file and render read it as UTF-8 too") from None
        return None
    if not (named or re.search(r"(?m)^\ufeff?[XTMLQKV]:", text)):
        return None
    found = analyze({"abc": text})
    if "error" in found:
        return None
    issues, st = found["issues"], found["structure"]
    errors = sum(i["severity"] == "error" for i in issues)
    counts = f"{errors} error(s), {len(issues) - errors} warning(s)"
    if st:
        tempo = st.get("tempo") or {}
        bars = ", ".join(f"{v} {n}" for v, n in (st.get("bars") or {}).items())
        sections = ", ".join(s["label"] for s in st.get("sections") or [])
        head = (f"ABC lead sheet {path}: key {st.get('key')}, {st.get('meter')}, "
                + (f"{tempo['beat']}={tempo['bpm']:g} BPM, " if tempo.get("bpm") else "")
                + f"bars {bars or 'none'}, about {st.get('duration_s') or 0:.1f} s at its tempo"
                + (f", sections: {sections}" if sections else "") + f" — {counts}")
    else:
        head = f"ABC lead sheet {path}: does not parse — {counts}"
    # each place as every score message writes it, "line 3 column 19" (`abc.errors.place`; stop-51 diff review: this
    # report, new in stop 51, still wrote "line 3:" beside the one format of §40c)
    lines = [f"  {place(i.get('line'), i.get('column'))}: {i['message']} [{i['severity']}]" if i.get("line") else
             f"  {i['message']} [{i['severity']}]" for i in issues]
    tail = ("  (generate --abc-file, or render of an edited score.abc, uses it as written and prints these "
            "findings, with the run's --max-seconds for the length check)")
    return {"kind": "ABC lead sheet", "path": os.path.abspath(path), "ok": found["ok"], "issues": issues,
            "structure": st, "summary": "\n".join([head, *lines, tail])}


def _json_lines(obj) -> str:
    """JSON with indent 2, lists of plain numbers kept on one line (the VAE's block geometry took 40 lines)."""
    import re
    text = json.dumps(obj, indent=2, ensure_ascii=False, default=str)
    return re.sub(r"\[\s*(-?[\d.eE+-]+(?:,\s*-?[\d.eE+-]+)*)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)


def _vae_weights(path: str) -> bool:
    """A folder whose config.json says model_type "yue2_vae", or a safetensors file holding only encoder / decoder
    tensors (optionally under `vae.`): what the VAE reader alone may take, so its refusal is the one to say."""
    if os.path.isdir(path):
        from ..weights.vendor import VAE_MODEL_TYPE, folder_model_type
        return folder_model_type(path) == VAE_MODEL_TYPE
    try:
        from ..weights.checkpoint import read_header
        from ..weights.lora.layouts_io import weights_kind
        entries, _, _ = read_header(path)
    except Exception:  # noqa: BLE001 - only a choice of message
        return False
    kind = weights_kind(entries)
    return kind is not None and kind[0] == "vae"


def _looks_like_adapter(path: str) -> bool:
    """A folder with adapter_config.json, or a safetensors file whose keys carry LoRA/LoKr/diff roles."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, "adapter_config.json"))
    try:
        from ..weights.checkpoint import read_header
        entries, _, _ = read_header(path)
    except Exception:  # noqa: BLE001 - only a hint for the message
        return False
    roles = ("lora_A", "lora_B", "lora_down", "lora_up", "lokr_w1", "lokr_w2", ".diff")
    return any(role in k for k in entries for role in roles)


def _inspect_other(path: str, dims=None) -> tuple[dict | None, dict]:
    """`inspect` of a file that is not a checkpoint: a VAE decoder (layout, variant) or a LoRA/LoKr adapter (layout,
    ranks, modules, scale rule, checked against the release geometry). Returns (description or None, {"vae": why
    not, "lora": why not})."""
    from ..errors import YuE2Error as _Err
    reasons = {}
    try:
        from ..weights.vae_files import open_vae
        vae = open_vae(path)
        return {"kind": "VAE decoder", "summary": vae.describe(), **vae.record()}, reasons
    except _Err as exc:
        from ..errors import DamagedWeightsError
        reasons["vae"] = str(exc)
        reasons["vae_damaged"] = isinstance(exc, DamagedWeightsError)  # a VAE, with unusable values
    try:
        from ..weights.lora.layouts import RELEASE_DIMS, describe_adapter, read_adapter
        from ..weights.lora.apply import Applied, check_magnitude
        adapter = read_adapter(path, dims or RELEASE_DIMS)
        check_magnitude([Applied(adapter, 1.0, 1.0)])  # damaged factors refused as `generate` refuses them
    except _Err as exc:
        from ..errors import AdapterGeometryError
        reasons["lora"] = str(exc)
        reasons["lora_geometry"] = isinstance(exc, AdapterGeometryError)
        return None, reasons
    return {"kind": "LoRA adapter", "layout": adapter.layout, "ranks": adapter.ranks(),
            "scale_rule": adapter.scale_rule, "scales": adapter.scales,
            "modules": {e: len(adapter.modules(e)) for e in ("ar", "nar")}, "replacements": adapter.replacements(),
            "unmatched": adapter.unmatched, "notes": adapter.notes,  # e.g. an expert that cannot be told
            "report": "".join(f"warning: {n}\n" for n in adapter.notes) + describe_adapter(adapter)}, reasons
