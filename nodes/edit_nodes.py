"""YuE2 Regenerate (keep a saved song up to a cut, sample a new rest) and YuE2 Continue (extend it past its end).

Both are thin wrappers of `yue2_core.edit.regenerate` / `continue_song` on a song from YuE2 Load Song (its `song`
output: codes, latents, audio.flac, settings). The codes before the cut are teacher-forced (kept bit for bit), the
new part is sampled with the song's own sampling settings, rendered with the song's own noise, decoded and spliced
into the original audio with a short crossfade that ends at the cut, so every sample before the crossfade is the
original's. The child song is saved like YuE2 Save Song does (output/yue2/<name>_NNNNN, atomically, never
overwriting) with its lineage (parent, cut, seeds, crossfade) in result.json.

Before any weights are loaded the node runs the engine once without the model (`_dry_run`): the cut, the checkpoint
record, the new score and the context budget are all checked by the engine itself, so a bad input fails at once
with the engine's own message; then the room for the new song in output/yue2 is checked as `generate` checks it
(`_check_room`: refused, not warned of — a full disk would fail the save after the music was computed); a save that
fails all the same (the disk filled meanwhile) keeps the computed song for the same inputs queued again (`_Unsaved`).
The edit itself needs the AR expert, the NAR expert and the VAE together (one engine call samples, renders and
decodes): they are loaded as one ComfyUI request with the largest stage's working memory.
"""
from __future__ import annotations

import re
import time
import weakref

import comfy.model_management as mm
from comfy_api.latest import io

from yue2_core.artifacts import check_song_room, save_song
from yue2_core.constants import CONTEXT, FRAMES_PER_SECOND, HOP, VAE_CORE_FRAMES, VAE_HALO_FRAMES
from yue2_core.edit import MAX_CROSSFADE_S, continue_song, max_continuation_seconds, regenerate
from yue2_core.errors import ArtifactError
from yue2_core.pipeline import Budgets
from yue2_core.protocol import SEED_MAX, SEMANTIC_PRESET, seconds_to_tokens

from . import inputs, memory, records, scores, types
from .progress import StageProgress, busy_cpu_notes, check_cancel, check_switches, user_errors
from .songs import SUBFOLDER, clean_name, next_song_dir, note_saved, saves_lost, songs_root

FRAME_S = 1 / FRAMES_PER_SECOND  # 0.04 s: one music token
MAX_EXTRA_SECONDS = CONTEXT / FRAMES_PER_SECOND  # 983.04: the context itself; the node says what really fits

CUT_TOOLTIP = ("Where the new part starts: seconds (\"12.5s\" or \"12.5\"), a bar of the song's score (\"bar 9\" "
               "or \"b9\") or a token index (\"token 312\"; 25 tokens per second). A bar is mapped to seconds with "
               "the score's header tempo (Q:) and meter: its start = the summed lengths of the Vocal voice's "
               "earlier bars. That assumes the audio follows the score's tempo from 0 s (no pickup silence, no "
               "drift), which the model does not guarantee — the report and the saved lineage say where the cut "
               "fell (token, seconds, bar). The cut must lie inside the music: after its first token and before "
               "its last.")


class _ReachedModel(AttributeError):
    """The dry run got as far as the model: every input check passed."""


class _Unloaded:
    """Stands in for a model part during the dry run; touching it ends the run (an AttributeError subclass, so the
    engine's `getattr(part, "dims", None)` sees no dims, as for a part without them)."""

    def __getattr__(self, name):
        raise _ReachedModel(name)


def _dry_run(fn, model, *args, **kwargs) -> None:
    """Run an edit with no model loaded: the engine validates the cut, the checkpoint record, the score and the
    budget before it first touches a model part, so its own errors (YuE2Error) come out here, before any load."""
    parts = {"ar": _Unloaded(), "nar": _Unloaded(), "vae": _Unloaded(), "tokenizer": model.tokenizer,
             "info": model.info}
    try:
        fn(parts, *args, **kwargs)
    except _ReachedModel:
        return


def _new_score(score, song):
    """The connected score as the engine reads it (an edited one is tokenized by the engine from its text)."""
    if score is None:
        return None
    if score.cot == "off" and not (score.abc or "").strip() and song.score.cot == "off":
        return None  # a cot-off song's own empty score, passed on by an ABC Editor: no new score (review, stop 44)
    if scores.needs_tokens(score):
        return score.abc
    return score


def _child_prefix(name: str, song, suffix: str) -> str:
    if name.strip():
        return clean_name(name)
    base = re.sub(r"_\d{5,}$", "", song.path.name)
    return clean_name(base if base.endswith(suffix) else f"{base}{suffix}")


def _memory(model, song, max_tokens: int) -> int:
    """The largest stage of the edit: the AR phase for prompt + budget, the render and the VAE tile."""
    on_cuda = model.device.type == "cuda"
    prefix = len(song.tokens.prefix)
    rows = 2 if song.tokens.cfg_scale != 1.0 else 1
    frames = max(max_tokens, len(song.tokens.codes))
    return max(memory.ar_phase(model.dims, model.dtype, prefix, max_tokens, rows, on_cuda=on_cuda),
               memory.render(model.dims, model.dtype, prefix, frames, on_cuda),
               memory.vae_tile(model.decoder_config(), frames, VAE_CORE_FRAMES, VAE_HALO_FRAMES))


def _parts(model, need: int) -> dict:
    ar, nar, vae = model.load(("ar", "nar", "vae"), need)
    return {"ar": ar, "nar": nar, "vae": vae, "tokenizer": model.tokenizer, "info": model.info,
            "weights": model.weights_record()}


def _check_room(node: str, max_tokens: int, lower: str, kept: int = 0) -> None:
    """Before the model is loaded: room in output/yue2 for the new song of at most `max_tokens` music tokens
    (`artifacts.check_song_room`, generate's own check: `ulimit -f`, the disk's free space, the quota). Where
    `generate` warns and goes on, the node refuses: its warning would be read only after the run, when a full disk
    had failed the save and the music computed was lost (API break-it review, stop 53). `lower`: the input that
    shortens the song; `kept`: the original's tokens it does not count (Continue)."""
    with user_errors():
        note = check_song_room(songs_root(), max_tokens, lower, kept)
    if note:
        raise ValueError(f"{node} did not start, nothing was computed: {note} (here: a lower {lower})")


class _Unsaved:
    """The song a Regenerate or Continue run computed but could not save (the disk filled while it computed, after
    `_check_room` found room; the folder became unwritable or unlistable), kept so that the same inputs queued again
    save it without computing it again — these nodes compute and save in one step, so ComfyUI's cache, which keeps
    the outputs of the nodes before a failed YuE2 Save Song, has nothing of theirs (API break-it review, stop 53).
    One per node of the graph (ComfyUI's node id: another Regenerate of the same graph, run first when the prompt is
    queued again, does not drop it — review of stop 53), in memory (the song's audio, latents and tokens); it matches
    only the very same model, song and score objects — what ComfyUI's cache hands on while the nodes before are
    unchanged: held weakly, so a changed checkpoint or song ends the match instead of keeping the old one alive, and
    lets the kept song go (`_drop`: it could never match again) — and equal other inputs; any run of that node with
    other inputs, a successful save, or a restart drops it."""

    def __init__(self, objects: tuple, values: tuple, result: tuple):
        me = weakref.ref(self)  # the callbacks hold the entry weakly: no cycle keeps a dropped one's audio
        self.refs = tuple(None if o is None else weakref.ref(o, lambda _, me=me: _Unsaved._drop(me))
                          for o in objects)
        self.values, self.result = values, result

    @staticmethod
    def _drop(me) -> None:
        """One of the objects matched is gone: the kept song can never match again, its memory is let go (the entry
        itself, a few bytes, stays until its node runs again; only the entry is touched, so a callback run from
        another thread's collection races with nothing)."""
        entry = me()
        if entry is not None:
            entry.result = None

    def matches(self, objects: tuple, values: tuple) -> bool:
        return self.result is not None and values == self.values and all(
            (ref is None) if o is None else (ref is not None and ref() is o) for ref, o in zip(self.refs, objects))


_UNSAVED: dict[tuple, _Unsaved] = {}  # (node type, ComfyUI's node id) → its run whose save failed


def _node_key(cls, node: str) -> tuple:
    """`_UNSAVED`'s key of a run of `cls` (the node type's `node` name, the node's id: the hidden UNIQUE_ID input,
    None where `execute` is called without ComfyUI's executor)."""
    return node, getattr(getattr(cls, "hidden", None), "unique_id", None)


def _kept(key: tuple, objects: tuple, values: tuple):
    """The result kept by the last run of the node `key` whose save failed, when these are its inputs (`_Unsaved`),
    else None; a run with other inputs drops it."""
    unsaved = _UNSAVED.pop(key, None)
    if unsaved is not None and unsaved.matches(objects, values):
        return unsaved.result
    return None


def _save_kept(key: tuple, objects: tuple, values: tuple, prefix: str) -> io.NodeOutput | None:
    """The node's outputs when the last run of the node `key` computed a song for these inputs whose save failed
    (`_kept`): that song saved now (kept again if the save fails again), not computed again; else None."""
    kept = _kept(key, objects, values)
    if kept is None:
        return None
    path = _save_or_keep(key, objects, values, kept, prefix)
    child, lineage, lines, notes = kept
    return _outputs(child, lineage, path, [*lines, "not computed again: the music of the run whose save failed"],
                    notes)


def _save_or_keep(key: tuple, objects: tuple, values: tuple, result: tuple, prefix: str):
    """`_save` the computed `result` (child, lineage, report lines, notes); when the save fails (a ValueError: the
    disk or quota full, an unwritable or unlistable folder), the result is kept for the same inputs queued again at
    the node `key` (`_Unsaved`) and the error says so, naming the seed (`values[1]`: the frontend's seed control,
    'randomize' in the shipped workflows, changes it after every queue)."""
    child, lineage = result[:2]
    node = key[0]
    try:
        path = _save(child, lineage, prefix)
        result[2].extend(note_saved(node, path))  # the report's lines
        return path
    except ValueError as exc:
        try:
            _UNSAVED[key] = _Unsaved(objects, values, result)
        except TypeError:  # an input that takes no weak reference (not the pack's own types): nothing kept
            raise exc from None
        raise ValueError(f"{exc} — the music computed is kept in memory: once the folder can take it, queue the "
                         f"same prompt again and {node} saves it without computing it again (until it runs with "
                         f"other inputs or ComfyUI restarts; the same inputs include seed {values[1]}, which a seed "
                         "control other than 'fixed' has changed after this queue: set it back)") from None


def _save(child, lineage: dict, prefix: str):
    root = songs_root()
    with user_errors():
        for _ in range(3):  # another save may take the number between the scan and the rename (then the song
            out = next_song_dir(root, prefix)  # goes to the next free one: `save_song`'s next_free)
            try:
                return save_song(child, out, lineage=lineage, next_free=lambda: next_song_dir(root, prefix))
            except ArtifactError:
                if not out.exists():
                    raise
        raise ArtifactError(f"could not find a free song folder for {prefix!r} in {root}")


def _outputs(child, lineage: dict, path, report_lines: list[str], notes: list[str] = ()) -> io.NodeOutput:
    rel = f"{SUBFOLDER}/{path.name}"
    report_lines.append(f"saved {rel}")
    report_lines += [f"warning: {w}" for w in [*child.warnings, *notes]]
    report = "\n".join(f"- {line}" for line in report_lines)
    checkpoint = child.settings.get("checkpoint")
    audio = {"waveform": child.audio.unsqueeze(0).float().contiguous(), "sample_rate": child.sample_rate,
             **({"yue2_decoded_by": records.identity(checkpoint)} if isinstance(checkpoint, dict) else {})}
    samples = child.latents.T.unsqueeze(0).float().contiguous()
    audio.update(records.stamp_audio(audio["waveform"], samples))  # the song's own audio for this latent
    latent = {"samples": samples, "type": "audio", "downscale_ratio_temporal": HOP,
              "yue2_render": records.stamp({"steps": child.settings.get("ode_steps"), "seed": lineage["render_seed"],
                                            "method": child.settings.get("ode_method") or "midpoint",
                                            **{k: child.settings[k] for k in ("checkpoint", "weights")
                                               if isinstance(child.settings.get(k), dict)}}, samples,
                                           child.tokens)}
    ui = {"text": [report], "song_dir": [rel],
          "audio": [{"filename": "audio.flac", "subfolder": rel, "type": "output"}]}
    return io.NodeOutput(audio, child.tokens, latent, child.score, rel, report, ui=ui)


def _common_inputs() -> list:
    return [
        types.Model.Input("model", tooltip="From YuE2 Load Song's model output (as in the shipped workflows): the "
                                           "checkpoint with the LoRAs and VAE the song was made with, so the new "
                                           "part is made with them too. Another model of the same checkpoint "
                                           "(YuE2 Checkpoint Loader, YuE2 LoRA) works as well: the report then "
                                           "says the new part follows its weights. A song from another model (its "
                                           "bf16 or int8 file is the same model) is refused."),
        types.Song.Input("song", tooltip="From YuE2 Load Song (its song output): the saved song to edit."),
    ]


def _tail_inputs(default_name: str, fade_end: str) -> list:
    """`fade_end`: where the crossfade ends, in the node's own words (Regenerate: the cut; Continue, which has no cut
    input: the original's end — stop-56 new-user review: Continue's tooltip spoke of a cut it does not have)."""
    return [
        io.Int.Input("seed", default=-1, min=-1, max=SEED_MAX, control_after_generate=True,
                     tooltip="Seed of the new part's music tokens. −1 = keep the song's seed (with an unchanged "
                             "score the new part may then repeat the original). The render noise is always the "
                             "song's own, so the kept part renders exactly as before."),
        io.Float.Input("crossfade_s", default=0.05, min=0.0, max=MAX_CROSSFADE_S, step=0.01,
                       tooltip="Length of the equal-power crossfade from the original into the new audio, in "
                               f"seconds; it ends at {fade_end}, so everything before it is the original's samples. "
                               "0 = a hard splice. Default 0.05 s (50 ms), this pack's choice: the release has no "
                               "regenerate or continue."),
        io.String.Input("name", default="",
                        tooltip=f"Folder name prefix of the new song in output/yue2 (a number is appended). Empty = "
                                f"the parent's name + '{default_name}'."),
        types.Score.Input("score", optional=True,
                          tooltip="An edited lead sheet (e.g. Load Song's score through YuE2 ABC Editor): the new "
                                  "part follows it; the kept part stays as it was. Not for songs made with cot "
                                  "off. Unconnected or unchanged = the song's own score."),
        types.AudioPlayer.Input("audioUI", optional=True, tooltip="Player for the saved audio.flac."),
    ]


def _outputs_schema(kept: str, report: str) -> list:
    """`kept`: which of the original's tokens the new song keeps; `report`: what the report tells (Continue has no
    cut: stop-56 new-user review)."""
    return [
        io.Audio.Output("audio", display_name="audio",
                        tooltip="The new song, 48 kHz stereo: the original's samples up to the crossfade, then the "
                                "new part."),
        types.Tokens.Output("tokens", display_name="tokens",
                            tooltip=f"Its music tokens ({kept}, bit for bit, then the new part's)."),
        io.Latent.Output("latent", display_name="latent",
                         tooltip=f"Its latents [1, 64, frames], 25 per second: {kept}, then the new render's "
                                 "(decoding them differs from `audio` only near the crossfade)."),
        types.Score.Output("score_out", display_name="score", tooltip="The lead sheet the new part followed."),
        io.String.Output("song_dir", display_name="song_dir",
                         tooltip="The folder written, relative to ComfyUI's output folder (yue2/<name>_NNNNN)."),
        io.String.Output("report", display_name="report",
                         tooltip=report),
    ]


def _ending(tokens, max_tokens: int) -> str:
    # the budget is the whole song's, kept part included (new-user review, stop 48: "the new part hit its budget
    # (250 tokens)" read as 250 new tokens beside "new part 225 tokens")
    return ("ended on its end token" if tokens.ended else
            f"hit the song's budget ({max_tokens} tokens = {max_tokens / FRAMES_PER_SECOND:.2f} s, the kept part "
            "included)")


def _edited_score_notes(child, lineage: dict, max_tokens: int, duration_setting: str) -> list[str]:
    """An edited score's notes, as the Composer gives a connected one (`scores.given_score_notes`): every dialect
    finding and the too-long check against the whole song's budget (new-user review, stop 48: the 16-bar example
    lead sheet, 38.4 s at its tempo, regenerated a 10 s song without a word — the Composer said it for the same
    score)."""
    if not lineage.get("score_changed") or not (child.score.abc or "").strip():
        return []
    return scores.given_score_notes(child.score.abc, max_tokens / FRAMES_PER_SECOND, child.request.cot,
                                    duration_setting=duration_setting)


class YuE2Regenerate(io.ComfyNode):
    @classmethod
    def fingerprint_inputs(cls, **kwargs):
        """How many songs this node saved are gone (`songs.saves_lost`): queued again, it makes the song again
        instead of answering from ComfyUI's cache with a folder that is not there."""
        return saves_lost("YuE2 Regenerate")

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="YuE2Regenerate",
            display_name="YuE2 Regenerate",
            category=types.CATEGORY,
            description="Keeps a saved song up to a cut (a bar of its score or a time) and samples a new rest from "
                        "there — optionally under an edited score — then renders it and splices it in with a short "
                        "crossfade: the codes before the cut stay bit-identical and the audio before the crossfade "
                        "is the original's samples. Saves the new song (output/yue2) with a record of its parent "
                        "and cut.",
            is_output_node=True,
            hidden=[io.Hidden.unique_id],  # the node's id: its kept song is its own (`_Unsaved`)
            inputs=[
                *_common_inputs(),
                io.String.Input("cut", default="bar 9", tooltip=CUT_TOOLTIP),
                *_tail_inputs("_regen", "the cut"),
                io.Float.Input("max_seconds", default=0.0, min=0.0, max=MAX_EXTRA_SECONDS, step=1.0, optional=True,
                               tooltip="Upper bound of the whole new song's length in seconds (25 tokens per "
                                       "second). 0 = the song's own budget (its max_seconds)."),
            ],
            outputs=_outputs_schema("the original's before the cut",
                                    "Where the cut fell, what was kept and made, the seeds, the saved folder."),
        )

    @classmethod
    def execute(cls, model, song, cut, seed, crossfade_s, name, score=None, audioUI=None,
                max_seconds=0.0) -> io.NodeOutput:
        check_switches(model.device)
        if not isinstance(cut, str) or not cut.strip():
            raise ValueError("cut is empty: give seconds (\"12.5s\"), a bar (\"bar 9\") or a token (\"token 312\")")
        max_seconds = inputs.number("max_seconds", max_seconds, 0.0, MAX_EXTRA_SECONDS)  # 0 = the song's own budget
        crossfade_s = inputs.number("crossfade_s", crossfade_s, 0.0, MAX_CROSSFADE_S)
        busy = busy_cpu_notes(model.device, "YuE2 Regenerate")
        parent_name = f"{SUBFOLDER}/{song.path.name}"
        args = dict(new_score=_new_score(score, song), seed=None if seed < 0 else seed, crossfade_s=crossfade_s,
                    budgets=Budgets(max_seconds=max_seconds) if max_seconds > 0 else None, parent_name=parent_name)
        with user_errors():
            _dry_run(regenerate, model, song, cut.strip(), **args)
        sampling = SEMANTIC_PRESET.merged(song.tokens.sampling)
        max_tokens = seconds_to_tokens(max_seconds) if max_seconds > 0 else sampling.max_tokens
        prefix = _child_prefix(name, song, "_regen")
        objects, values = (model, song, score), (cut.strip(), seed, crossfade_s, prefix, max_seconds)
        key = _node_key(cls, "YuE2 Regenerate")
        if (done := _save_kept(key, objects, values, prefix)) is not None:  # its save failed: saved now
            return done
        _check_room("YuE2 Regenerate", max_tokens, "max_seconds")
        progress = StageProgress("YuE2 Regenerate")
        progress.start("semantic", max_tokens, f"regenerating {parent_name} from {cut.strip()}")
        t0 = time.perf_counter()
        with user_errors():
            parts = _parts(model, _memory(model, song, max_tokens))
            child, lineage = regenerate(parts, song, cut.strip(), progress=progress, **args)
            del parts
        mm.soft_empty_cache()
        check_cancel()
        k, frames = lineage["cut_token"], lineage["frames"]
        bar = f", bar {lineage['cut_bar']}" if lineage.get("cut_bar") is not None else ""
        lines = [f"regenerated {parent_name} from {lineage['cut_requested']!s} = {lineage['cut_seconds']:.2f} s "
                 f"(token {k}{bar})",
                 f"kept {k} tokens ({k / FRAMES_PER_SECOND:.2f} s) of the original's {lineage['parent_frames']}; "
                 f"new part {frames - k} tokens ({(frames - k) / FRAMES_PER_SECOND:.2f} s), song {frames} tokens = "
                 f"{frames / FRAMES_PER_SECOND:.2f} s; the new part {_ending(child.tokens, max_tokens)}",
                 f"seed {lineage['seed']} (original {lineage['parent_seed']}), render seed {lineage['render_seed']}, "
                 f"crossfade {lineage['crossfade_s']:.3f} s {lineage['crossfade_shape'].replace('_', ' ')}, score "
                 f"{'edited' if lineage['score_changed'] else 'unchanged'}",
                 f"took {time.perf_counter() - t0:.1f} s"]
        notes = _edited_score_notes(child, lineage, max_tokens, "Regenerate's max_seconds input") + busy
        path = _save_or_keep(key, objects, values, (child, lineage, lines, notes), prefix)
        return _outputs(child, lineage, path, lines, notes)


class YuE2Continue(io.ComfyNode):
    @classmethod
    def fingerprint_inputs(cls, **kwargs):
        """How many songs this node saved are gone (`songs.saves_lost`): queued again, it makes the song again
        instead of answering from ComfyUI's cache with a folder that is not there."""
        return saves_lost("YuE2 Continue")

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="YuE2Continue",
            display_name="YuE2 Continue",
            category=types.CATEGORY,
            description="Extends a saved song: every original code is kept, the model samples on for up to "
                        "extra_seconds, and the new audio is crossfaded in over the original's last moments (all "
                        "earlier samples are the original's). The 24,576-token context bounds the continuation: "
                        "the node states the most that fits and refuses more. Saves the new song (output/yue2) with "
                        "a record of its parent.",
            is_output_node=True,
            hidden=[io.Hidden.unique_id],  # the node's id: its kept song is its own (`_Unsaved`)
            inputs=[
                *_common_inputs(),
                # one frame (0.04 s) for min, step and round: the frontend rounds what is typed or stepped to
                # `round` (else to the step's decimals: 0.1 s = 2.5 frames, so 0.1 asked made 2 frames and 0.3 made
                # 8; break-it review, stop 52); values saved off this grid still run (ComfyUI checks min / max only)
                io.Float.Input("extra_seconds", default=30.0, min=FRAME_S, max=MAX_EXTRA_SECONDS, step=FRAME_S,
                               round=FRAME_S,
                               tooltip="How much music to add at most, in seconds, in frames of 0.04 s (25 tokens "
                                       "per second). At most (24,576 − prompt − the song's tokens) / 25 s fit; the "
                                       "node says that maximum and refuses more."),
                *_tail_inputs("_cont", "the original's end"),
                io.Float.Input("min_extra_seconds", default=-1.0, min=-1.0, max=MAX_EXTRA_SECONDS, step=FRAME_S,
                               round=FRAME_S, optional=True,  # whole frames, as extra_seconds
                               tooltip="The song cannot end during this many seconds of new music (the model's end "
                                       "token is blocked: a song that ended on its own would otherwise often end "
                                       "again at once). −1 = "
                                       "min(extra_seconds, 8 s): 8 s = the 200 music tokens the release blocks the "
                                       "end token for at the start of every song (its min_tokens)."),
            ],
            outputs=_outputs_schema("every one of the original's",
                                    "How much was added and the most that fits, the seeds, the saved folder."),
        )

    @classmethod
    def execute(cls, model, song, extra_seconds, seed, crossfade_s, name, score=None, audioUI=None,
                min_extra_seconds=-1.0) -> io.NodeOutput:
        check_switches(model.device)
        extra_seconds = inputs.number("extra_seconds", extra_seconds, FRAME_S, MAX_EXTRA_SECONDS)
        crossfade_s = inputs.number("crossfade_s", crossfade_s, 0.0, MAX_CROSSFADE_S)
        # −0.5 was taken as −1 (auto) without a word, as cfg_scale's −0.5 is refused
        min_extra_seconds = inputs.number("min_extra_seconds", min_extra_seconds, 0.0, MAX_EXTRA_SECONDS, auto=-1.0,
                                          auto_means="auto: min(extra_seconds, 8 s)")
        busy = busy_cpu_notes(model.device, "YuE2 Continue")
        parent_name = f"{SUBFOLDER}/{song.path.name}"
        new_score = _new_score(score, song)
        args = dict(new_score=new_score, seed=None if seed < 0 else seed, crossfade_s=crossfade_s,
                    min_extra_seconds=None if min_extra_seconds < 0 else min_extra_seconds, parent_name=parent_name)
        with user_errors():
            most = max_continuation_seconds({"tokenizer": model.tokenizer}, song, new_score)
            _dry_run(continue_song, model, song, extra_seconds, **args)
        frames0 = len(song.tokens.codes)
        max_tokens = frames0 + seconds_to_tokens(extra_seconds)
        prefix = _child_prefix(name, song, "_cont")
        objects, values = (model, song, score), (extra_seconds, seed, crossfade_s, prefix, min_extra_seconds)
        key = _node_key(cls, "YuE2 Continue")
        if (done := _save_kept(key, objects, values, prefix)) is not None:  # its save failed: saved now
            return done
        _check_room("YuE2 Continue", max_tokens, "extra_seconds", kept=frames0)
        progress = StageProgress("YuE2 Continue")
        progress.start("semantic", max_tokens, f"continuing {parent_name} by up to {extra_seconds:g} s "
                                               f"(at most {most:.2f} s fit)")
        t0 = time.perf_counter()
        with user_errors():
            parts = _parts(model, _memory(model, song, max_tokens))
            child, lineage = continue_song(parts, song, extra_seconds, progress=progress, **args)
            del parts
        mm.soft_empty_cache()
        check_cancel()
        frames = lineage["frames"]
        lines = [f"continued {parent_name} ({frames0} tokens = {frames0 / FRAMES_PER_SECOND:.2f} s) by "
                 f"{lineage['added_seconds']:.2f} s of the {extra_seconds:g} s asked; the continuation "
                 f"{_ending(child.tokens, max_tokens)}",
                 f"maximum continuation that fits the {CONTEXT}-token context: {most:.2f} s "
                 f"(prompt {len(child.tokens.prefix)} + song {frames0} tokens)",
                 f"song {frames} tokens = {frames / FRAMES_PER_SECOND:.2f} s; prompt + music = "
                 f"{len(child.tokens.prefix) + frames} of {CONTEXT} tokens",
                 f"seed {lineage['seed']} (original {lineage['parent_seed']}), render seed {lineage['render_seed']}, "
                 f"crossfade {lineage['crossfade_s']:.3f} s into the original's end, score "
                 f"{'edited' if lineage['score_changed'] else 'unchanged'}",
                 f"took {time.perf_counter() - t0:.1f} s"]
        notes = _edited_score_notes(child, lineage, max_tokens, "Continue's extra_seconds input") + busy
        path = _save_or_keep(key, objects, values, (child, lineage, lines, notes), prefix)
        return _outputs(child, lineage, path, lines, notes)
