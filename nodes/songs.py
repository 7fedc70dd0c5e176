"""YuE2 Save Song / YuE2 Load Song: song directories (yue2_core.artifacts layout) under ComfyUI's output folder.

Songs live in <output>/yue2/<name>_<NNNNN>/: score.abc, abc_tokens.npy, prefix.npy, semantic.npy, latent.npy,
audio.flac, request.json, config.json, result.json (sha256 of every file). Writing is atomic (a hidden temporary
sibling renamed into place), so a failed or cancelled run never leaves a partial song, and an existing song is never
overwritten: each save takes the next free number.
"""
from __future__ import annotations

import re
from pathlib import Path

import folder_paths
import torch
from comfy_api.latest import io
from comfy_execution.graph_utils import ExecutionBlocker

from yue2_core.artifacts import expected_samples, load_song, safe_name, save_song, write_error
from yue2_core.constants import FRAMES_PER_SECOND, HOP, LATENT_DIM, PROTOCOL_VERSION, SAMPLE_RATE
from yue2_core.errors import ArtifactError
from yue2_core.pipeline import Song
from yue2_core.protocol import SongRequest

from . import inputs, records, types
from .progress import user_errors

SUBFOLDER = "yue2"
GIVEN_AUDIO = ("its audio.flac was saved as given (processed or made by another node), not as the decode of its "
               "latent.npy: YuE2 Regenerate / Continue make the part they keep again from the latent")
SAVE_KIND = "YuE2 Save Song"  # `note_saved` / `saves_lost`
NAME_MAX = 160  # leaves room for "_NNNNN" within the 180 characters safe_name accepts


def songs_root() -> Path:
    return Path(folder_paths.get_output_directory()).resolve() / SUBFOLDER


def clean_name(name: str) -> str:
    """A name prefix usable as a folder name: runs of characters outside A–Z a–z 0–9 _ . - become "_", no leading
    dots/dashes/underscores, at most 160 characters; "song" when nothing is left."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name).strip())
    cleaned = cleaned.lstrip("._-")[:NAME_MAX].rstrip(".") or "song"
    try:
        safe_name(f"{cleaned}_00001")
    except ArtifactError:  # a reserved device name such as CON.x
        cleaned = f"song_{cleaned}"[:NAME_MAX]
    return cleaned


def next_song_dir(root: Path, prefix: str) -> Path:
    """<root>/<prefix>_<NNNNN> with the next number after every existing one of that prefix."""
    pattern = re.compile(re.escape(prefix) + r"_(\d{5,})")
    try:
        numbers = [int(m.group(1)) for d in (root.iterdir() if root.is_dir() else ())
                   if (m := pattern.fullmatch(d.name))]
        n = max(numbers, default=0) + 1
        while (root / f"{prefix}_{n:05d}").exists():
            n += 1
    except OSError as exc:  # a folder that cannot be listed (its read permission gone): a failed save as a full disk
        # is, said plainly (review of stop 53: a bare PermissionError, and Regenerate / Continue lost their music)
        raise write_error(exc, f"could not save the song: cannot list {root} to number the new folder") from None
    try:
        return root / safe_name(f"{prefix}_{n:05d}")
    except ArtifactError:  # a folder numbered past 10^15 makes the next number outgrow the name limit
        raise ArtifactError(f"no free song number for the name {prefix[:40]!r}… in {root}: the next one, {n}, makes "
                            "the folder name longer than 180 characters; choose a shorter name") from None


# The last song folder each saving node (Save Song, Regenerate, Continue) wrote in this server process, by (node type,
# ComfyUI's node id): [folder, identity of its result.json, how many of its songs were found gone]. ComfyUI answers
# an output node whose inputs are unchanged from its cache, with the ui of the run that saved: a song deleted or moved
# away since was not saved again, and the report named a folder that was gone (stop-54 cache review). Their
# `fingerprint_inputs` (`saves_lost`) counts one more when that song is gone, so such a node runs again; once its song
# is saved again the count stays, so the prompt queued again is answered from the cache again.
_SAVED: dict[tuple, list] = {}


def _executing_node() -> str | None:
    """ComfyUI's id of the node whose `execute` or `fingerprint_inputs` runs now (the executor's context, set for
    both); None outside ComfyUI's executor."""
    try:
        from comfy_execution.utils import get_executing_context
    except ImportError:
        return None
    context = get_executing_context()
    return None if context is None else str(context.node_id)


def _identity(path: Path):
    """(inode, mtime) of the song folder's result.json; None when it is not there (deleted, moved or renamed). A
    folder that cannot be searched counts as there: ComfyUI would take an error of the fingerprint as "never
    cached" and save at every queue."""
    try:
        st = (path / "result.json").stat()
    except FileNotFoundError:
        return None
    except OSError:
        return "unknown"
    return st.st_ino, st.st_mtime_ns


def _last_gone(last) -> bool:
    return last is not None and _identity(last[0]) not in (last[1], "unknown")


def saves_lost(kind: str) -> int:
    """The fingerprint of the saving node running now (of type `kind`): how many of its songs were found gone, one
    more when the last one it saved is gone now (deleted, moved, or another song in its folder)."""
    last = _SAVED.get((kind, _executing_node()))
    return 0 if last is None else last[2] + _last_gone(last)


def note_saved(kind: str, path: Path) -> list[str]:
    """Record that the node running now (of type `kind`) saved the song folder `path`; a report line when the song
    it saved before is gone (what made ComfyUI run it again)."""
    key = (kind, _executing_node())
    last = _SAVED.get(key)
    gone = _last_gone(last)
    _SAVED[key] = [Path(path), _identity(Path(path)), (last[2] if last else 0) + gone]
    if not gone:
        return []
    return [f"{SUBFOLDER}/{last[0].name}, the last song this node saved, is no longer in {last[0].parent} (deleted or "
            "moved): this run saved its song anew"]


def list_songs() -> list[str]:
    """Song directories under <output>/yue2 (those with a result.json), newest first."""
    root = songs_root()
    if not root.is_dir():
        return []
    found = [d for d in root.iterdir()  # a symbolic link is not listed: song_path refuses it (break-it, stop 39)
             if d.is_dir() and not d.is_symlink() and _is_safe(d.name) and (d / "result.json").is_file()]
    return [d.name for d in sorted(found, key=lambda d: (d.stat().st_mtime, d.name), reverse=True)]


def _is_safe(name: str) -> bool:
    try:
        safe_name(name)
        return True
    except ArtifactError:
        return False


def song_path(name: str) -> Path:
    """The directory of a listed song; never anything outside <output>/yue2."""
    root = songs_root()
    path = (root / safe_name(name)).resolve()
    if path.parent != root:
        raise ValueError(f"song {name!r} is not a folder directly inside {root}")
    return path


def _latents(latent, frames: int) -> torch.Tensor | None:
    """[T, 64] float32 from a LATENT dict, checked against the tokens' frame count."""
    if latent is None:
        return None
    samples = latent.get("samples") if isinstance(latent, dict) else None
    if not isinstance(samples, torch.Tensor) or samples.ndim != 3 or samples.shape[1] != LATENT_DIM:
        shape = list(samples.shape) if isinstance(samples, torch.Tensor) else type(samples).__name__
        raise ValueError(f"latent must be a YuE2 audio latent [1, {LATENT_DIM}, frames]; got {shape}")
    if samples.shape[0] != 1:
        raise ValueError(f"YuE2 Save Song saves one song; the latent is a batch of {samples.shape[0]}")
    if samples.shape[2] != frames:
        raise ValueError(f"the latent has {samples.shape[2]} frames but the tokens have {frames}: connect the "
                         "latent rendered from these tokens")
    return samples[0].T.float().cpu().contiguous()


def _waveform(audio, frames: int, warnings: list) -> torch.Tensor | None:
    """[2, samples] float32 from an AUDIO dict (48 kHz stereo, one item)."""
    if audio is None:
        return None
    wave, rate = audio.get("waveform"), audio.get("sample_rate")
    if not isinstance(wave, torch.Tensor) or wave.ndim != 3:
        raise ValueError(f"audio must be ComfyUI AUDIO with waveform [B, channels, samples]; got "
                         f"{list(wave.shape) if isinstance(wave, torch.Tensor) else type(wave).__name__}")
    if rate != SAMPLE_RATE or wave.shape[0] != 1 or wave.shape[1] != 2:
        raise ValueError(f"YuE2 Save Song stores one 48 kHz stereo song; got {wave.shape[0]} item(s), "
                         f"{wave.shape[1]} channel(s) at {rate} Hz")
    if wave.shape[2] != expected_samples(frames):
        warnings.append(f"audio has {wave.shape[2]} samples; {frames} frames decode to {expected_samples(frames)} "
                        "(was it decoded by another VAE node?): it is saved as given (config.json audio_source "
                        "\"given\"), and YuE2 Regenerate / Continue will make the part they keep again from the "
                        "song's latent (or its tokens)")
    return wave[0].float().cpu().clamp(-1.0, 1.0)


def _render_record(config: dict) -> dict:
    """A saved song's render record as a latent carries it ("yue2_render": steps, seed, method, checkpoint, weights),
    so that Save Song of Load Song's latent keeps it (break-it finding, stop 38: it saved nulls, and Regenerate /
    Continue then refused the copy)."""
    record = {"steps": config.get("ode_steps"), "seed": config.get("render_seed"),
              "method": config.get("ode_method") or "midpoint"}
    for key in ("checkpoint", "weights"):
        if isinstance(config.get(key), dict):
            record[key] = config[key]
    return record


def _settings(tokens, render: dict | None, has_latent: bool, audio=None) -> dict:
    """config.json of a saved song: the tokens' settings, the render record `render` (None: the latent carried none
    it still matches, `records.render_record`) and the VAE of the VAE Decode that made `audio`."""
    render = render or {}
    settings = {"protocol": PROTOCOL_VERSION, "cot": tokens.score.cot, "cfg_scale": tokens.cfg_scale,
                "semantic_sampling": tokens.sampling, "ode_steps": render.get("steps"),
                "render_seed": render.get("seed"), "ode_method": render.get("method") or "midpoint",
                "vae_dtype": "float32",
                "vae_decode": "halo_crop", "saved_by": "ComfyUI-YuE2"}
    if isinstance(render.get("checkpoint"), dict):  # the Renderer's model: YuE2 Regenerate/Continue check it
        settings["checkpoint"] = render["checkpoint"]
    if render and render.get("weights"):
        settings["weights"] = dict(render["weights"])
    if isinstance(audio, dict) and "yue2_vae" in audio:  # the VAE of the VAE Decode that made the audio
        settings.setdefault("weights", {"loras": [], "vae": None})["vae"] = audio["yue2_vae"]
    if not has_latent:  # tokens only: nothing was rendered, so no render record (an edit renders them anew)
        for key in ("ode_steps", "render_seed"):
            if settings[key] is None:
                del settings[key]
    return settings


class YuE2SaveSong(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="YuE2SaveSong",
            display_name="YuE2 Save Song",
            category=types.CATEGORY,
            description="Saves a song directory under ComfyUI's output folder, output/yue2/<name>_<NNNNN>: the score "
                        "(score.abc + exact ids), the music tokens, the latents, audio.flac (48 kHz, 24-bit) and "
                        "the settings, each with its sha256. Never overwrites; nothing partial is left on failure. "
                        "Load it again with YuE2 Load Song to re-render or decode.",
            is_output_node=True,
            inputs=[
                types.Tokens.Input("tokens", tooltip="The music tokens (they carry their score and request)."),
                io.String.Input("name", default="song",
                                tooltip="Folder name prefix; characters outside A–Z a–z 0–9 _ . - become '_'. A "
                                        "number is appended: song_00001, song_00002, …"),
                io.Latent.Input("latent", optional=True,
                                tooltip="The latents rendered from these tokens ([1, 64, frames], 25 per second)."),
                io.Audio.Input("audio", optional=True,
                               tooltip="The decoded song (48 kHz stereo, 1920·frames − 64 samples)."),
                types.AudioPlayer.Input("audioUI", optional=True,
                                        tooltip="Player for the saved audio.flac (shown by the frontend)."),
            ],
            outputs=[io.String.Output("song_dir", display_name="song_dir",
                                      tooltip="The folder written, relative to ComfyUI's output folder "
                                              "(yue2/<name>_<NNNNN>).")],
        )

    @classmethod
    def fingerprint_inputs(cls, **kwargs):
        """How many songs this node saved are gone (`saves_lost`): the same prompt queued again saves the song again
        instead of answering from ComfyUI's cache with a folder that is not there."""
        return saves_lost(SAVE_KIND)

    @classmethod
    def execute(cls, tokens, name, latent=None, audio=None, audioUI=None) -> io.NodeOutput:
        root = songs_root()
        if root.exists() and not root.is_dir():  # break-it (stop 39): was "cannot write into …: File exists"
            raise ValueError(f"{root} is a file, not a folder: YuE2 Save Song writes each song as a folder inside "
                             "it; move or rename that file")
        frames = len(tokens.codes)
        warnings: list[str] = []
        latents = _latents(latent, frames)
        wave = _waveform(audio, frames, warnings)
        render, why = records.render_record(latent) if latent is not None else (None, None)
        if records.other_tokens(render, tokens):  # same length, other tokens: _latents cannot tell (break-it, stop 51)
            raise ValueError(f"{records.OTHER_TOKENS}: connect the latent rendered from these tokens (the Renderer, "
                             "Load Song, Regenerate or Continue whose tokens go to this node); nothing was saved")
        if why:
            warnings.append(why)
        if audio is not None and (note := records.decoder_warning(render, audio)):
            warnings.append(note)
        given = records.audio_of_latent(audio, latent) if audio is not None else None
        if given and wave.shape[-1] == expected_samples(frames):  # (another length was warned of above)
            warnings.append(f"the audio is saved as given, not as this song's own decode: {given}. The song records "
                            "so (config.json audio_source \"given\"): YuE2 Regenerate / Continue make the part they "
                            "keep again from the latent — what was done to the audio is not in their song: do it "
                            "again after them — and Load Song and `render` say so")
        req = tokens.request
        prefix = clean_name(name)
        request = SongRequest(style=req.get("style", ""), lyrics=req.get("lyrics", ""), cot=req.get("cot", "full"),
                              seed=int(req.get("seed", tokens.seed)), abc=req.get("abc"),
                              cfg_scale=req.get("cfg_scale"), id=prefix)
        song = Song(request=request, score=tokens.score, tokens=tokens,
                    latents=latents, audio=wave,
                    settings={**_settings(tokens, render, latent is not None, audio),
                              **({"audio_source": "given" if given else "decoded"} if audio is not None else {})},
                    warnings=request.input_warnings(getattr(tokens.score, "abc", None)) + warnings)
        with user_errors():
            for _ in range(3):  # another save may take the number between the scan and the rename: the finished
                out = next_song_dir(root, prefix)  # song then goes to the next free one (break-it review 52: each
                try:  # collision wrote it again, and the third lost it)
                    path = save_song(song, out, next_free=lambda: next_song_dir(root, prefix))
                    break
                except ArtifactError:
                    if not out.exists():
                        raise
            else:
                raise ArtifactError(f"could not find a free song folder for {prefix!r} in {root}")
        again = note_saved(SAVE_KIND, path)
        rel = f"{SUBFOLDER}/{path.name}"
        saved = sorted(f.name for f in path.iterdir())
        text = (f"saved {rel} ({frames} frames = {frames / FRAMES_PER_SECOND:.2f} s"
                + (f", {wave.shape[-1]} samples" if wave is not None else ", no audio")
                + f")\n{path}\nfiles: {', '.join(saved)}" + "".join(f"\nwarning: {w}" for w in warnings)
                + "".join(f"\nnote: {n}" for n in again))
        ui_out = {"text": [text], "song_dir": [rel]}
        if wave is not None:
            ui_out["audio"] = [{"filename": "audio.flac", "subfolder": rel, "type": "output"}]
        return io.NodeOutput(rel, ui=ui_out)


class YuE2LoadSong(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="YuE2LoadSong",
            display_name="YuE2 Load Song",
            category=types.CATEGORY,
            description="Loads a song saved by YuE2 Save Song (output/yue2/…), checking every file's sha256. An "
                        "edited score.abc is accepted: it is re-tokenized with the model's tokenizer — connect "
                        "`score` to a YuE2 Composer to sample new music for it. Press R to refresh the list.",
            inputs=[
                types.Model.Input("model", tooltip="From YuE2 Checkpoint Loader (its tokenizer reads an edited "
                                                   "score.abc)."),
                io.Combo.Input("song", options=list_songs(),
                               tooltip="A song folder in ComfyUI's output/yue2, newest first."),
            ],
            outputs=[
                types.Score.Output("score", display_name="score",
                                   tooltip="The saved lead sheet (re-tokenized if score.abc was edited)."),
                types.Tokens.Output("tokens", display_name="tokens",
                                    tooltip="The saved music tokens (25 per second), to render again."),
                io.Latent.Output("latent", display_name="latent",
                                 tooltip="The saved latents [1, 64, frames], to decode again."),
                types.Song.Output("song_out", display_name="song",
                                  tooltip="The whole saved song (codes, latents, audio.flac, settings) for YuE2 "
                                          "Regenerate and YuE2 Continue."),
                types.Model.Output("song_model", display_name="model",
                                   tooltip="The input model's checkpoint with the LoRAs (same files by sha256, same "
                                           "strengths) and VAE the song was made with, found in ComfyUI's loras "
                                           "and vae folders; the input model itself for a song that recorded "
                                           "none. Render or decode with it to reproduce the song. When such a "
                                           "file is missing, Load Song stops and names it only if this output is "
                                           "connected; the other outputs work without it."),
            ],
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],
        )

    @classmethod
    def validate_inputs(cls, song=inputs.MISSING) -> bool | str:
        if song is inputs.MISSING:  # absent from the prompt: ComfyUI's "Required input is missing" names it
            return True
        if bad := inputs.entry_name("song", song, "a saved song from the list"):
            return bad
        songs = list_songs()
        if song in songs:
            return True
        return (f"no saved song {song!r} in {songs_root()} "
                + (f"(saved songs: {', '.join(songs[:10])}{' …' if len(songs) > 10 else ''}); press R to refresh"
                   if songs else "— it has no saved songs yet; save one with YuE2 Save Song first"))

    @classmethod
    def fingerprint_inputs(cls, song, **kwargs):
        """Re-run when the folder's files change (e.g. score.abc edited on disk)."""
        try:
            path = song_path(song)
            files = tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir()))
        except (OSError, ValueError, ArtifactError):
            return song
        return files + _recorded_weights_state(path)

    @classmethod
    def execute(cls, model, song) -> io.NodeOutput:
        with user_errors():
            saved = load_song(song_path(song), model.tokenizer)
        model.check_tokens(saved.tokens)
        frames = len(saved.tokens.codes)
        if saved.latents is not None:
            samples = saved.latents.T.unsqueeze(0).contiguous()
            latent = {"samples": samples, "type": "audio", "downscale_ratio_temporal": HOP,
                      "yue2_render": records.stamp(_render_record(saved.config), samples, saved.tokens)}
        else:
            latent = ExecutionBlocker(f"song {song} was saved without latents (latent.npy): render its tokens with "
                                      "YuE2 Renderer instead")
        lines = [(f"{SUBFOLDER}/{song}: {frames} frames = {frames / FRAMES_PER_SECOND:.2f} s, "
                  f"cot {saved.score.cot}, seed {saved.tokens.seed}, {len(saved.score.abc_ids)} ABC tokens")]
        lines += [f"note: {n}" for n in _checkpoint_notes(saved.config.get("checkpoint"), model)]
        if saved.config.get("audio_source") == "given":
            lines.append(f"note: {GIVEN_AUDIO}")
        if saved.score_edited:
            lines.append("score.abc was edited: `score` is the edited text, re-tokenized; the saved `tokens` were "
                         "sampled from the original — connect `score` to a YuE2 Composer for music that follows "
                         "the edit")
        try:
            with user_errors():
                song_model = model_with_song_weights(model, saved.config.get("weights"))
                lines += int8_mode_notes(saved.config.get("weights"), song_model)
                lines += stacking_notes(saved.config.get("weights"), song_model)
                lines += nar_linears_notes(saved.config.get("weights"), song_model)
        except ValueError as exc:
            # only the model output needs the song's LoRA / VAE files: a moved or deleted one stops the node only when
            # that output is connected (review, stop 44: the whole node failed, so the score, tokens and latent of a
            # song whose LoRA was gone could not be rendered with the plain checkpoint, continued or regenerated)
            hidden = getattr(cls, "hidden", None)  # set by ComfyUI's executor
            prompt, node_id = getattr(hidden, "prompt", None), getattr(hidden, "unique_id", None)
            if _output_linked(prompt, node_id, MODEL_SLOT):
                raise ValueError(f"{exc}{_model_output_hint(prompt, node_id)}") from None
            lines.append(f"warning: no model output — {exc}")
            blocked = ExecutionBlocker(f"YuE2 Load Song's model output (the song's own weights) is unavailable: "
                                       f"{exc}")
            return io.NodeOutput(saved.score, saved.tokens, latent, saved, blocked, ui={"text": ["\n".join(lines)]})
        if song_model is not model:
            lines.append(f"model output: the checkpoint with the song's {len(song_model.adapters)} LoRA(s)"
                         + (" and its VAE file" if song_model.vae_file is not None else ""))
        return io.NodeOutput(saved.score, saved.tokens, latent, saved, song_model,
                             ui={"text": ["\n".join(lines)]})


def int8_mode_notes(weights, model) -> list[str]:
    """A note when the song's LoRAs went onto int8 layers merged into bf16 (config.json "weights"."lora_int8"
    "bf16": YUE2_LORA_INT8=bf16 on the command line) and `model` (an int8 checkpoint with adapters) applies them as
    the nodes always do, as exact side deltas: what it renders anew differs slightly (review, stop 41). AdapterError
    for a malformed record, as `render` refuses it."""
    from yue2_core.weights.lora.record import recorded_int8_mode
    if recorded_int8_mode(weights) != "bf16" or not model.adapters or model.info.format != "int8":
        return []
    return ["note: this song's LoRAs were merged into its int8 layers dequantized to bf16 (YUE2_LORA_INT8=bf16 on "
            "the command line); the nodes apply them as exact side deltas beside the int8 codes, so what the model "
            "output renders anew differs slightly from the song — `python -m yue2_core render` renders it as it "
            "was made"]


def nar_linears_notes(weights, model) -> list[str]:
    """A note when the song's NAR multiplied otherwise (config.json "weights"."nar_linears": W8A8 or bf16 layers)
    than `model`'s will (`YuE2Model.nar_linears`), in the command line `render`'s words (stop-53 review: Load Song
    said nothing)."""
    from yue2_core.cli.song_weights import nar_linears_note
    note = nar_linears_note(weights, model.nar_linears(), now="the model output renders with",
                            goal="render it as it was made (before ComfyUI starts)")
    return [f"note: {note}"] if note else []


def stacking_notes(weights, model) -> list[str]:
    """Notes for a song whose LoRA stack the stacking rules of 2026-12-06 treat otherwise (review, stop 41): an FL AR
    file and its own NAR file as two adapters (both reached the NAR then; refused now — the Renderer refuses the
    model output), or, for a song that may come from the rule before (`record.may_predate_stack_rules`), a
    replacement after another adapter's deltas on its module (it erased them then; they add to it now).
    `model`: the song's model (`model_with_song_weights`, its adapters in the song's order)."""
    from yue2_core.weights.lora.apply import STRENGTH_RANGE, old_rule_summary
    from yue2_core.weights.lora.record import fl_companion_twice, may_predate_stack_rules, recorded_weights
    recorded, _ = recorded_weights(weights)
    notes = []
    pair = fl_companion_twice(recorded)
    if pair is not None:
        (a, _, a_nar), (b, _, b_nar) = recorded[pair[0]], recorded[pair[1]]
        total = a_nar + b_nar
        notes.append(f"note: this song was made before 2026-12-06 with the FL adapter {a.get('file')} and its own NAR "
                     f"file {b.get('file')} as two LoRAs: both reached the NAR, so its deltas applied twice; the "
                     "stacking rules refuse that stack now (the Renderer refuses the model output) — "
                     + (f"chain {a.get('file')} with strength_nar 0 and {b.get('file')} with strength_nar "
                        f"{total:g}: the same NAR deltas once (the same song up to rounding)"
                        if abs(total) <= STRENGTH_RANGE else
                        f"their NAR strengths add up to {total:g}, past ±{STRENGTH_RANGE:g}: no stack renders it "
                        "as it was made"))
    adapters = list(getattr(model, "adapters", ()))
    if may_predate_stack_rules(weights) and len(adapters) == len(recorded):
        for item in old_rule_summary(adapters):
            rep, gone = recorded[item["replacer"]][0].get("file"), recorded[item["erased"]][0].get("file")
            e = item["expert"]
            notes.append(f"note: this song records no stacking rule (saved before 2026-12-06, or that day): if it was "
                         f"made before then, {rep} replaced {e.upper()} {', '.join(item['modules'])} and erased the "
                         f"deltas {gone}, before it in the stack, had put on them; replacements now apply first and "
                         "those deltas add to them, so what the model output renders differs from the song"
                         + (f" — {gone} at strength_{e} 0 renders it as the old rule did"
                            if len(old_rule_summary(adapters)) == 1 and item["whole"] else ""))
    return notes


def _checkpoint_notes(recorded, model) -> list[str]:
    """What YuE2 Regenerate / Continue (and the command line's render) say of the song's recorded checkpoint against
    `model`'s — another file of the same layout, the other format, another model — as notes: Load Song's outputs
    are also used with other models (its score, for new music), so nothing is refused here (break-it, stop 39: a
    render of Load Song's tokens with another same-layout file was silent)."""
    from yue2_core.edit import CheckpointMismatch, check_checkpoint
    if not recorded:
        return []
    try:
        return check_checkpoint(recorded, model.info)
    except CheckpointMismatch as exc:
        return [f"{exc} (Regenerate and Continue refuse it; its score can still be composed anew)"]


MODEL_SLOT = 4  # Load Song's `model` output


def _output_linked(prompt, node_id, slot: int) -> bool:
    """Whether a node of the API prompt takes output `slot` of node `node_id`; True when the prompt is unknown."""
    if not isinstance(prompt, dict) or node_id is None:
        return True
    for node in prompt.values():
        inputs = node.get("inputs") if isinstance(node, dict) else None
        for value in (inputs or {}).values() if isinstance(inputs, dict) else ():
            if isinstance(value, list) and len(value) == 2 and str(value[0]) == str(node_id) and value[1] == slot:
                return True
    return False


def _model_output_hint(prompt, node_id) -> str:
    """What a missing song weights file stops, and the way on without it: the nodes of the API prompt that take Load
    Song's model output, by title and id (the shipped Renderer / VAE Decode / Regenerate / Continue take it since the
    review of stop 54, so a song whose adapter is gone stops there where it went on before without the adapter)."""
    import nodes as comfy_nodes  # ComfyUI's: the display names of the node types
    takers, edits = [], False
    for nid, node in (prompt.items() if isinstance(prompt, dict) else ()):
        given = node.get("inputs") if isinstance(node, dict) else None
        if isinstance(given, dict) and any(isinstance(v, list) and len(v) == 2 and str(v[0]) == str(node_id)
                                           and v[1] == MODEL_SLOT for v in given.values()):
            meta = node.get("_meta") if isinstance(node.get("_meta"), dict) else {}
            kind = str(node.get("class_type", "?"))
            title = meta.get("title") if isinstance(meta.get("title"), str) else \
                comfy_nodes.NODE_DISPLAY_NAME_MAPPINGS.get(kind, kind)
            takers.append(f"{title} (#{nid})")
            edits = edits or kind in ("YuE2Regenerate", "YuE2Continue")
    if not takers:
        return ""
    then = ("the new part is then made with the checkpoint's own weights, not the song's (the report says so)"
            if edits else "it then renders with the checkpoint's own weights: other audio than the song's")
    return (f" — YuE2 Load Song's model output (the checkpoint with the song's own weights) feeds "
            f"{', '.join(takers)}. To go on without that file, connect YuE2 Checkpoint Loader's model to "
            f"{'it' if len(takers) == 1 else 'them'} instead; {then}.")


def _recorded_weights_state(path: Path) -> tuple:
    """(file, exists, size, mtime) of the adapters and VAE a song's config.json records at their recorded paths, so
    Load Song re-runs (and says what is missing) when one of them moves or changes; for one missing there, the
    (path, mtime) of every file of its recorded size in ComfyUI's loras / vae folders — where `find_recorded` finds
    it renamed —, so a renamed copy moved away again is noticed too."""
    import json
    import os
    try:
        weights = json.loads((path / "config.json").read_text("utf-8")).get("weights") or {}
        recs = [(r, "loras") for r in list(weights.get("loras") or [])]
        recs += [(weights["vae"], "vae")] if weights.get("vae") else []
    except (OSError, ValueError, AttributeError, TypeError):
        return ()
    state = []
    for rec, kind in recs:
        p = rec.get("path") if isinstance(rec, dict) else None
        if isinstance(p, str):
            try:
                st = os.stat(p)
                state.append((p, True, st.st_size, st.st_mtime_ns))
            except OSError:
                state.append((p, False, 0, 0))
                size = rec.get("bytes")
                if isinstance(size, int) and size > 0:
                    from yue2_core.weights.lora.record import files_of_size
                    state.append(tuple(files_of_size(folder_paths.get_folder_paths(kind), size)))
    return tuple(state)


def model_with_song_weights(model, weights):
    """`model`'s checkpoint with the adapters and VAE a song's config.json "weights" entry records, each found by
    file name and sha256 (its recorded path first, then ComfyUI's loras / vae folders); `model` itself when the song
    recorded none. Raises AdapterError naming a missing or changed file or companion, or a malformed "weights"
    entry (not an object, `loras` not a list, an entry not an object, a bad strength)."""
    from yue2_core.weights.lora.apply import Applied
    from yue2_core.weights.lora.record import check_reread, find_recorded, lora_record, recorded_weights

    from .lora import cached_adapter
    loras, vae = recorded_weights(weights)  # AdapterError naming a malformed entry, never "no adapters"
    if not loras and not vae:
        return model
    out = model.root
    for rec, strength_ar, strength_nar in loras:
        path = find_recorded(rec, folder_paths.get_folder_paths("loras"))
        applied = Applied(cached_adapter(path, model.dims), strength_ar, strength_nar)
        check_reread([rec], [lora_record(applied)])  # the same files as when the song was made (stop 39)
        out = out.derive(adapter=applied)
    if vae:
        from yue2_core.weights.vae_files import open_vae
        out = out.derive(vae_file=open_vae(find_recorded(vae, folder_paths.get_folder_paths("vae"), what="VAE")))
    return out

