"""Edit a finished song without re-making it: regenerate from a cut point, or continue past its end.

Both work at the token level (runtime.md §3.5, §5): the semantic stage is prefilled with the (possibly edited) score's
prefix and then *teacher-forced* through the original codes before the cut (`forced`: fed, not sampled; they count in
the budget and the repetition-penalty window exactly as if sampled), and sampling resumes after them with the song's
own sampling settings. The whole new code stream is rendered with the parent's noise (rows before the cut are the
parent's noise rows bit for bit), decoded, and spliced into the parent:

    audio    = parent[: e − x]  ‖  crossfade(parent[e − x : e] → new[e − x : e])  ‖  new[e :]
    latents  = parent[: k]      ‖  new[k :]

with k = the cut's token (frame) index, e = 1920·k samples (for a continuation, the parent's last sample), x = the
crossfade length in samples, ending exactly at the cut. Everything before e − x is the parent's samples bit for bit
(for a saved song: the samples of its audio.flac, which re-save losslessly as PCM_24). Equal-power fade by default:
w_out = cos(π/2·τ), w_in = sin(π/2·τ), τ = (i + ½)/x. The two sides of the fade render the same codes from the same
noise, so they are strongly correlated and an equal-power fade can rise up to +3 dB mid-fade (clipped to [−1, 1]);
`crossfade_shape="linear"` (equal gain) avoids that. The spliced latents are not the latents of the spliced audio:
decoding latent.npy reproduces the audio except within the VAE's receptive field around the cut (and the fade).

Cut points (`resolve_cut`): a time in seconds (k = round(t·25)), a bar of the score ({"bar": n}, "bar 9", "b9"), or a
token index ({"token": k}). A bar maps to seconds through the score's header tempo (Q:) and meter: its start is the
summed actual lengths of the Vocal voice's earlier bars × seconds per L: unit (`yue2_core.abc.timing`). This assumes
the audio follows the score's tempo from t = 0 (no pickup silence, no drift), which the model does not guarantee;
the lineage records the cut actually used (cut_token, cut_seconds) so the UI can show where it fell. The parent's own
score is used for the mapping (that is the timeline the kept audio follows), not an edited one.

The regenerated song is a normal `Song` (save it with `artifacts.save_song(song, dir, lineage=lineage)`); its settings
record `render_seed` (the noise seed, always the parent's) and an `edit` entry.
"""
from __future__ import annotations

import hashlib
import inspect
import math
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from .constants import (CODEC_OFFSET, CODEC_SIZE, CONTEXT, FRAMES_PER_SECOND, HOP, LATENT_DIM, MAX_ODE_STEPS,
                        ODE_STEPS, PROTOCOL_VERSION, SAMPLE_RATE, VAE_LENGTH_TRIM)
from .errors import ArtifactError, BudgetError, RequestError, ScoreError
from .weights.own import carried
from .protocol import (SEED_MAX, _finite_number, duration_seconds, SEMANTIC_PRESET, Sampling, SongRequest,
                       negative_prefix, seconds_to_tokens, semantic_prefix)

CROSSFADE_SHAPES = ("equal_power", "linear")
MAX_CROSSFADE_S = 5.0


class CheckpointMismatch(RequestError):
    """The song was made with a different model (other dimensions, VAE, or tokenizer) than the one loaded."""


# ---------------------------------------------------------------------------------------------------------------------
# inputs: model parts and the parent song
# ---------------------------------------------------------------------------------------------------------------------

def model_parts(engine_or_parts, need=("ar", "nar", "vae", "tokenizer")) -> SimpleNamespace:
    """A YuE2Engine, any object with .ar/.nar/.vae/.tokenizer (.info, .weights optional), a dict with those keys, or
    a tuple (ar, nar, vae, tokenizer[, info]) → namespace(ar, nar, vae, tokenizer, info, weights). `weights` is the
    config.json "weights" record of the run's own LoRAs and VAE file (`YuE2Engine.weights`, the nodes'
    `YuE2Model.weights_record()`), None when not given. RequestError names a missing part."""
    names = ("ar", "nar", "vae", "tokenizer", "info")
    if isinstance(engine_or_parts, dict):
        got = {n: engine_or_parts.get(n) for n in names + ("weights",)}
    elif isinstance(engine_or_parts, (tuple, list)):
        got = dict(zip(names, list(engine_or_parts) + [None] * (5 - len(engine_or_parts))))
        got["weights"] = None
    else:
        got = {n: getattr(engine_or_parts, n, None) for n in names + ("weights",)}
    if not isinstance(got["weights"], dict):  # what config.json records of the user's own weights, when known
        got["weights"] = None
    missing = [n for n in need if got.get(n) is None]
    if missing:
        raise RequestError(f"this needs the model's {', '.join(missing)} loaded (got none); load the full checkpoint")
    return SimpleNamespace(**got)


@dataclass
class Parent:
    """The song being edited, normalised from a Song, a SavedSong, a song directory or a (score, tokens, latents,
    audio, request) tuple. `audio`/`latents` may be None (then made from the codes); `settings` = its config.json."""

    request: SongRequest
    score: object
    tokens: object
    latents: torch.Tensor | None
    audio: torch.Tensor | None
    settings: dict
    name: str
    path: Path | None = None
    edited_score: object = None  # a SavedSong whose score.abc was edited on disk: the edited Score
    notes: list = field(default_factory=list)  # what normalising it changed (an audio that does not fit: dropped)

    @property
    def codes(self) -> list[int]:
        return list(self.tokens.codes)

    @property
    def render_seed(self) -> int:
        """config.json render_seed (absent — `generate` records none —, or null with no latents: the tokens'
        seed): an integer in [0, SEED_MAX]; ArtifactError otherwise, and for latents saved with a null one."""
        seed = self.settings.get("render_seed", self.tokens.seed)  # not recorded (generate): the tokens' seed
        if seed is None and self.latents is None:  # null and nothing rendered (a tokens-only save): the same
            seed = self.tokens.seed
        if seed is None:  # break-it finding (stop 38): latents without a render record; the message read as damage
            raise ArtifactError(f"{self.name}: config.json render_seed must be an integer in [0, {SEED_MAX}], got "
                                "null: the song was saved without a render record (a YuE2 Save Song whose latent "
                                "carried none), so the noise its latents were rendered from is unknown and an edit "
                                "cannot keep it; render its tokens with YuE2 Renderer, save that song, and edit the "
                                "new one")
        if type(seed) is not int or not 0 <= seed <= SEED_MAX:
            raise ArtifactError(f"{self.name}: config.json render_seed must be an integer in [0, {SEED_MAX}], "
                                f"got {seed!r}")
        return seed

    @property
    def steps(self) -> int:
        """config.json ode_steps (else the release's 32): an integer in [1, MAX_ODE_STEPS]; ArtifactError otherwise."""
        steps = self.settings.get("ode_steps")
        steps = ODE_STEPS if steps is None else steps  # not recorded (a tokens-only save): the release's 32
        if type(steps) is not int or not 1 <= steps <= MAX_ODE_STEPS:
            raise ArtifactError(f"{self.name}: config.json ode_steps must be an integer in [1, {MAX_ODE_STEPS}], "
                                f"got {steps!r}")
        return steps

    @property
    def method(self) -> str:
        """config.json ode_method (else the release's "midpoint"): one of `nar.ODE_METHODS`; ArtifactError
        otherwise. The child renders with it, so an "ab2" song stays an "ab2" song."""
        from .nar import ODE_METHODS
        method = self.settings.get("ode_method") or "midpoint"
        if method not in ODE_METHODS:
            raise ArtifactError(f"{self.name}: config.json ode_method must be one of {', '.join(ODE_METHODS)}, "
                                f"got {method!r}")
        return method


def request_from_dict(d: dict) -> SongRequest:
    """SongRequest from a request.json / SemanticTokens.request dict."""
    try:
        return SongRequest(style=d["style"], lyrics=d["lyrics"], cot=d.get("cot", "full"),
                           seed=int(d.get("seed", 0)), abc=d.get("abc"), cfg_scale=d.get("cfg_scale"),
                           id=d.get("id") or "song").validate()
    except (KeyError, TypeError) as exc:
        raise RequestError(f"the song's request record is incomplete ({exc}); it needs style, lyrics and cot") from None


def read_audio(path: Path) -> torch.Tensor:
    """audio.flac → [channels, samples] float32 (the exact PCM_24 values, which re-save losslessly)."""
    import soundfile as sf
    from .errors import ArtifactError
    try:
        data, _ = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as exc:  # libsndfile raises its own error types
        raise ArtifactError(f"{path} is not readable audio ({exc})") from None
    return torch.from_numpy(np.ascontiguousarray(data.T))


def as_parent(song, tokenizer=None, name: str | None = None) -> Parent:
    """Normalise the song argument of `regenerate` / `continue_song` (see `Parent`)."""
    from .artifacts import SavedSong, load_song
    from .pipeline import Song
    if isinstance(song, (str, Path)):
        song = load_song(song, tokenizer)
    if isinstance(getattr(song, "song", None), Song):  # a candidates.Take
        song = song.song
    if isinstance(song, SavedSong):
        request = request_from_dict(song.tokens.request)
        audio = read_audio(song.path / "audio.flac") if (song.path / "audio.flac").is_file() else None
        sample_rate = song.result.get("sample_rate", SAMPLE_RATE)
        if sample_rate != SAMPLE_RATE:
            raise RequestError(f"{song.path}: sample rate {sample_rate} Hz, expected {SAMPLE_RATE}")
        parent = Parent(request, song.score, song.tokens, song.latents, audio, dict(song.config),
                        name or str(song.path), song.path, song.score if song.score_edited else None)
    elif isinstance(song, Song):
        parent = Parent(song.request, song.score, song.tokens, song.latents, song.audio, dict(song.settings),
                        name or song.request.id)
    elif isinstance(song, (tuple, list)) and len(song) in (5, 6):
        score, tokens, latents, audio, request = song[:5]
        settings = dict(song[5]) if len(song) == 6 and song[5] else {}
        if isinstance(request, dict):
            request = request_from_dict(request)
        parent = Parent(request, score, tokens, latents, audio, settings, name or request.id)
    else:
        raise RequestError("the song must be a Song, a saved song (load_song or its directory) or a tuple "
                           f"(score, tokens, latents, audio, request); got {type(song).__name__}")
    _check_parent(parent)
    return parent


def _timeline_abc(p: Parent) -> str | None:
    """The ABC whose bars the parent's audio follows: the score its codes were sampled after (`tokens.score`), not a
    score.abc edited since (bar N of the edit may lie elsewhere in time)."""
    sampled_after = getattr(p.tokens, "score", None)
    return sampled_after.abc if sampled_after is not None and sampled_after.abc else p.score.abc


def _check_parent(p: Parent):
    from .weights.lora.record import recorded_weights
    p.render_seed, p.steps, p.method  # noqa: B018 — config.json values checked before any work (ArtifactError)
    # the weights record as render / Load Song check it (break-it, stop 42: `"loras": true` ended the edit in a
    # TypeError after the model work)
    recorded_weights(p.settings.get("weights"))
    n = len(p.tokens.codes)
    if n < 1:
        raise RequestError("the song has no semantic codes to keep")
    if any(not 0 <= int(c) < CODEC_SIZE for c in p.tokens.codes):
        raise RequestError(f"the song's semantic codes must be in [0, {CODEC_SIZE})")
    if p.latents is not None and tuple(p.latents.shape) != (n, LATENT_DIM):
        raise RequestError(f"the song's latents are {list(p.latents.shape)}, expected [{n}, {LATENT_DIM}]")
    want = [2, n * HOP - VAE_LENGTH_TRIM]
    if p.audio is not None and p.settings.get("audio_source") == "given" and list(p.audio.shape) == want:
        # stop-47 review: Save Song stores audio that is not the song's decode (a gain, an effect, another node's
        # audio) and records it as "given"; splicing it would join that audio before the cut to an unprocessed
        # render after it. The kept part is decoded again from the latents, as for audio of another length.
        p.notes.append("the song's audio.flac was saved as given (config.json audio_source \"given\": processed or "
                       "made by another node, not the decode of its latents), so the part before the cut is made "
                       "again from its latents (rendered first where the song has none): what was done to that "
                       "audio is not in the new song")
        p.audio = None
    if p.audio is not None and list(p.audio.shape) != want:
        # break-it (stop 39): YuE2 Save Song stores any 48 kHz stereo audio it is given (with a warning); an edit of
        # such a song was refused with no way on. The kept part is decoded again from the latents instead.
        p.notes.append(f"the song's audio is {list(p.audio.shape)} (channels, samples), not the {want} its {n} "
                       "frames decode to — it was not decoded from this song's latents —, so the part before the "
                       "cut is made again from its latents (rendered first where the song has none)")
        p.audio = None


def check_checkpoint(recorded: dict | None, info=None, dims=None, checkpoint_vae: bool = True) -> list[str]:
    """Refuse a song made with another model. `recorded` = the song's config.json "checkpoint" entry; compared with
    the loaded model's `info` (CheckpointInfo) or, without one, its `dims` (ModelDims): every ModelDims field, the
    VAE blocks and synthetic-vs-release must match; the file format may differ (the bf16 and int8 files of one model
    are the same model). Raises CheckpointMismatch naming each difference; returns warnings (e.g. nothing recorded,
    another file of the same layout, a vendor folder's VAE folder with other weights than the song's — the latter
    only when `checkpoint_vae`, i.e. that VAE decodes, not a VAE file the caller loaded instead)."""
    if not recorded:
        return ["the song does not record its checkpoint; assuming it was made with the loaded model"]
    if not isinstance(recorded, dict) or not isinstance(recorded.get("dims", {}), dict):
        raise CheckpointMismatch("the song's config.json has a malformed 'checkpoint' entry (expected the object the "
                                 "pack writes); it cannot be checked against the loaded model")
    current = info.to_dict() if info is not None else {"dims": dict(dims.__dict__) if dims is not None else {}}
    diffs = []
    old_dims, new_dims = recorded.get("dims") or {}, current.get("dims") or {}
    for key in sorted(set(old_dims) & set(new_dims)):
        if old_dims[key] != new_dims[key]:
            diffs.append(f"{key} {old_dims[key]} (song) vs {new_dims[key]} (loaded)")
    for key, label in (("vae_blocks", "VAE blocks"), ("synthetic", "synthetic weights")):
        if key in recorded and key in current and recorded[key] != current[key]:
            diffs.append(f"{label} {recorded[key]} (song) vs {current[key]} (loaded)")
    if diffs:
        raise CheckpointMismatch(
            f"this song was made with a different model ({recorded.get('path', '?')}, {recorded.get('format', '?')}):"
            f" {'; '.join(diffs)}. Load the checkpoint it was made with (its bf16 or int8 file) to edit it.")
    notes = []
    if info is not None and recorded.get("format") not in (None, current.get("format")):
        notes.append(f"the song was made with the {recorded.get('format')} file of this model and is now run with the "
                     f"{current.get('format')} file: what is computed anew follows this file's numerics (saved tokens "
                     "are kept as they are)")
    elif info is not None and None not in (recorded.get("sample_sha256"), current.get("sample_sha256")) \
            and recorded["sample_sha256"] != current["sample_sha256"]:  # break-it (stop 38): a swap went unnoticed
        notes.append(f"the checkpoint {current.get('path')} is not the file this song was made with: its format and "
                     "dimensions match, but its contents differ (another download, a fine-tune or merge, a re-made "
                     "synthetic file?), so what is computed anew (render, new music tokens) follows these weights "
                     "and the audio will differ from the song's; --checkpoint picks the file it was made with")
    old_vae, new_vae = recorded.get("vae_sample_sha256"), current.get("vae_sample_sha256")
    was_vae = (recorded.get("files") or {}).get("vae") if isinstance(recorded.get("files"), dict) else None
    if checkpoint_vae and info is not None and recorded.get("layout") == "vendor" and isinstance(was_vae, str) \
            and current.get("layout") != "vendor":  # break-it review (stop 40): the VAE changed without a word
        notes.append(f"the song was decoded with the vendor VAE folder {was_vae}; the checkpoint "
                     f"{current.get('path')} decodes with its own VAE, so audio decoded anew will differ unless they "
                     f"hold the same weights — --vae {was_vae} keeps the song's")
    elif checkpoint_vae and info is not None and None not in (old_vae, new_vae) and old_vae != new_vae:
        was = (recorded.get("files") or {}).get("vae", "?") if isinstance(recorded.get("files"), dict) else "?"
        notes.append(f"the VAE folder {(current.get('files') or {}).get('vae', '?')} holds other weights than the one "
                     f"this song was decoded with ({was}): audio decoded anew follows this VAE and will differ from "
                     "the song's; `python -m yue2_core render` finds the recorded VAE folder again")
    return notes


# ---------------------------------------------------------------------------------------------------------------------
# cut points
# ---------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CutPoint:
    """A resolved cut: token (frame) index k, its time k/25 s, its first sample, and the score bar it falls in (None
    when the score has no parseable bars). `requested` = what the caller passed."""

    token: int
    seconds: float
    sample: int
    bar: int | None
    requested: object


def bar_starts(abc: str | None) -> list[tuple[int, float]]:
    """[(bar number, start seconds)] of the score's Vocal voice (Ins when Vocal has no bars), at the header tempo:
    start = sum of the actual lengths of the earlier bars × seconds per L: unit. [] when there is no score; AbcError
    (a ScoreError) when it does not parse."""
    return _bar_times(abc)[0]


def _bar_times(abc: str | None) -> tuple[list[tuple[int, float]], float, str | None, float]:
    """(`bar_starts`, the seconds its last bar ends at, the tempo as written "Q:1/4=120", seconds a whole note lasts)
    from one parse; ([], 0.0, None, 0.0) when there is no score."""
    if not abc:
        return [], 0.0, None, 0.0
    from .abc import parse
    from .abc.timing import seconds_per_unit
    score = parse(abc)
    header = score.header
    per_unit = seconds_per_unit(header)
    bars = score.voices.get("Vocal") or score.voices.get("Ins") or []
    end = float((bars[-1].start + bars[-1].length) * per_unit) if bars else 0.0
    tempo = f"Q:{header.tempo_beat.numerator}/{header.tempo_beat.denominator}={float(header.bpm):g}"
    return [(bar.number, float(bar.start * per_unit)) for bar in bars], end, tempo, float(per_unit / header.unit)


# ASCII digits only (re.ASCII): "token ١٢" or "٣s" were read as 12 and 3 (break-it finding, as --lora FILE:٣)
_BAR_RE = re.compile(r"\s*(?:bar|b|m)\s*[:#=]?\s*(\d+)\s*", re.I | re.ASCII)
_SEC_FULL = re.compile(r"\s*((?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?)\s*(?:s|sec|seconds)?\s*", re.I | re.ASCII)
MAX_CUT_TEXT = 64  # a cut is a short text; longer ones are refused before any matching
_TOK_RE = re.compile(r"\s*(?:token|tok|t)\s*[:#=]?\s*(-?\d+)\s*", re.I | re.ASCII)


def _parse_cut(cut) -> tuple[str, float]:
    """cut → ("seconds" | "bar" | "token", value)."""
    if isinstance(cut, CutPoint):
        return "token", cut.token
    if isinstance(cut, bool):
        raise RequestError(f"a cut must be seconds, a bar or a token index, got {cut!r}")
    if isinstance(cut, (int, float)):
        if not _finite_number(cut):
            raise RequestError(f"the cut must be a finite number of seconds, got {cut!r}")
        return "seconds", float(cut)
    if isinstance(cut, dict) and len(cut) == 1:
        (kind, value), = cut.items()
        if kind in ("seconds", "bar", "token") and _finite_number(value):
            if kind != "seconds" and value != int(value):
                raise RequestError(f"a {kind} cut must be a whole number, got {value!r}")
            return kind, value
    if isinstance(cut, str):
        if len(cut) > MAX_CUT_TEXT:
            raise RequestError(f"the cut is {len(cut)} characters long; give seconds (\"12.5s\"), a bar (\"bar 9\") "
                               f"or a token index (\"token 312\") in at most {MAX_CUT_TEXT} characters")
        for kind, rx in (("bar", _BAR_RE), ("token", _TOK_RE), ("seconds", _SEC_FULL)):
            m = rx.fullmatch(cut)
            if m:
                return kind, float(m.group(1)) if kind == "seconds" else int(m.group(1))
    clock = duration_seconds(cut.strip()) if isinstance(cut, str) else None  # "1:05": say "65s" (review 58)
    raise RequestError(f"cannot read the cut {cut!r}: give seconds (12.5 or \"12.5s\"), a bar ({{\"bar\": 9}} or "
                       f"\"bar 9\") or a token index ({{\"token\": 312}})"
                       + (f"; for {cut.strip()} write \"{clock:g}s\"" if clock is not None else ""))


def retimed_note(sampled_after: str | None, edited: str | None, seconds: float) -> str | None:
    """A note when an edited score times the music before a cut (at `seconds`) otherwise than the score the song was
    sampled after — a tempo, meter or bar-length change, a bar added or removed before it: the kept audio follows the
    old bars, the new part is sampled after the edit, so it does not take the edit up at the bar the cut names
    (break-it review, stop 56: "bar 2" of a song whose edit quartered the tempo cut at 1.0 s, in the edit's bar 1,
    without a word). None when the bars before the cut start at the same times and the tempo is the same (in
    seconds a whole note: Q:1/8=480 is Q:1/4=240), or a score does not parse (its dialect notes say so). Bars the edit
    adds after the end of the song's score are no retime (diff review, stop 56: bars appended for Continue, which
    cuts at the song's end, were said to retime the bars before it)."""
    try:
        (old, old_end, old_tempo, old_whole), (new, new_end, new_tempo, new_whole) = \
            _bar_times(sampled_after), _bar_times(edited)
    except ScoreError:
        return None
    if not old or not new:
        return None
    end = round(old_end, 3)

    def before(bars):  # the bars that start before the cut within the song score's span
        return [(n, round(t, 3)) for n, t in bars if t <= seconds + 1e-9 and round(t, 3) < end]

    retempo = abs(old_whole - new_whole) > 1e-9 * max(old_whole, new_whole)
    if before(old) == before(new) and not retempo:
        return None
    old_bar, new_bar = _bar_at(old, seconds), _bar_at(new, seconds)
    where = {n: t for n, t in new}
    moved = (f"its bar {old_bar} starts at {where[old_bar]:.2f} s" if old_bar in where
             else f"it has no bar {old_bar}")
    if seconds >= old_end - 1e-9:
        was = f"after the last bar of the song's score (bar {old_bar}, which ends at {old_end:.2f} s)"
    else:
        was = f"in bar {old_bar} of the song's score"
    now = (f"after its last bar (bar {new_bar}, which ends at {new_end:.2f} s)" if seconds >= new_end - 1e-9
           else f"in its bar {new_bar}")
    tempo = f" ({new_tempo} against the song's {old_tempo})" if retempo else ""
    return (f"the edited score times its bars before the cut otherwise than the score the song was sampled after (a "
            f"tempo, meter or bar change there): the cut at {seconds:.2f} s falls {was}, which the kept audio "
            f"follows, but in the edited score{tempo} {moved} and {seconds:.2f} s falls {now} — the new part is "
            "sampled after the edited score as a whole and need not take it up at the bar you cut at; to have an "
            "edit followed, change only the bars after the cut (and keep the tempo)")


def _bar_at(starts: list[tuple[int, float]], seconds: float) -> int | None:
    bar = None
    for number, start in starts:
        if start <= seconds + 1e-9:
            bar = number
    return bar


def resolve_cut(cut, frames: int, abc: str | None = None) -> CutPoint:
    """Cut (seconds, bar or token) → CutPoint with 0 < token < frames; RequestError stating the valid range in
    seconds, tokens and bars otherwise. Bars need a score that parses (`bar_starts`)."""
    kind, value = _parse_cut(cut)
    starts: list = []
    score_problem = None
    try:
        starts = bar_starts(abc)
    except RequestError as exc:
        score_problem = str(exc).splitlines()[0]
    if kind == "bar":
        if not starts:
            if score_problem:
                why = (f"the song's score does not parse, so its bars have no times ({score_problem.rstrip('.')}). "
                       "A song made with synthetic weights has random token soup there, not a lead sheet; a real "
                       "model writes its lead sheet token by token, and that may not parse either")
            else:
                why = "the song has no score (made with cot off, which writes no lead sheet)"
            raise RequestError(f"cannot cut at bar {int(value)}: {why}. Give the cut in seconds instead (\"12.5s\"): "
                               "a cut in seconds works on any song")
        table = dict(starts)
        if int(value) not in table:
            raise RequestError(f"bar {int(value)} is not in the score (bars 1 … {starts[-1][0]}); "
                               f"{_valid_range(frames, starts)}")
        seconds = table[int(value)]
        if not math.isfinite(seconds):
            raise RequestError(f"bar {int(value)} has no finite start time")
        token = round(seconds * FRAMES_PER_SECOND)
    elif kind == "token":
        token = int(value)
    else:
        if not math.isfinite(value):
            raise RequestError(f"the cut must be a finite number of seconds, got {value!r}")
        token = round(value * FRAMES_PER_SECOND)
    if not 0 < token < frames:
        where = ("at or before the start of the music (that is the prompt/prefix, which cannot be cut)"
                 if token <= 0 else f"at or past the end of the music ({frames / FRAMES_PER_SECOND:.2f} s)")
        label = {"bar": f"bar {int(value)} (starts at {token / FRAMES_PER_SECOND:.2f} s, token {token})",
                 "token": f"token {token}", "seconds": f"{value:g} s (token {token})"}[kind]
        raise RequestError(f"the cut {label} lies {where}; {_valid_range(frames, starts)}")
    seconds = token / FRAMES_PER_SECOND
    return CutPoint(token, seconds, token * HOP, _bar_at(starts, seconds), cut)


def _valid_range(frames: int, starts) -> str:
    if frames < 2:
        return "this song is a single frame long and has no inner cut point"
    text = (f"choose a cut inside the music: {1 / FRAMES_PER_SECOND:.2f} … {(frames - 1) / FRAMES_PER_SECOND:.2f} s "
            f"(tokens 1 … {frames - 1} of {frames}, {FRAMES_PER_SECOND} per second)")
    inside = [b for b, s in starts if 0 < round(s * FRAMES_PER_SECOND) < frames]
    if inside:
        text += f", or bars {inside[0]} … {inside[-1]} of the score"
    elif starts:
        text += "; no bar of the score starts inside the music"
    return text


# ---------------------------------------------------------------------------------------------------------------------
# splicing
# ---------------------------------------------------------------------------------------------------------------------

def crossfade_weights(samples: int, shape: str = "equal_power") -> tuple[torch.Tensor, torch.Tensor]:
    """(w_out, w_in) float64 [samples]: equal power cos/sin(π/2·τ) or linear 1 − τ / τ, τ = (i + ½)/samples."""
    if shape not in CROSSFADE_SHAPES:
        raise RequestError(f"crossfade shape must be one of {', '.join(CROSSFADE_SHAPES)}; got {shape!r}")
    tau = (torch.arange(samples, dtype=torch.float64) + 0.5) / max(samples, 1)
    if shape == "linear":
        return 1 - tau, tau
    return torch.cos(tau * (math.pi / 2)), torch.sin(tau * (math.pi / 2))


def splice_audio(original: torch.Tensor, new: torch.Tensor, cut_sample: int, fade_samples: int,
                 shape: str = "equal_power") -> torch.Tensor:
    """[C, B] audio: original[:, :e−x] bit for bit, a crossfade original → new over [e−x, e), then new[:, e:], with
    e = cut_sample and x = min(fade_samples, e). Length = new's. When new ends at or before e, the result is the
    original's first B samples (nothing new to fade into)."""
    if original.ndim != 2 or new.ndim != 2 or original.shape[0] != new.shape[0]:
        raise RequestError(f"audio shapes do not match: {list(original.shape)} and {list(new.shape)}")
    e = int(cut_sample)
    if not 0 <= e <= original.shape[1]:
        raise RequestError(f"cut sample {e} outside the original audio (0 … {original.shape[1]})")
    length = new.shape[1]
    if length <= e:
        return original[:, :length].clone()
    x = max(0, min(int(fade_samples), e))
    out = torch.empty_like(new)
    out[:, :e - x] = original[:, :e - x]
    if x:
        w_out, w_in = crossfade_weights(x, shape)
        mixed = original[:, e - x:e].double() * w_out + new[:, e - x:e].double() * w_in
        out[:, e - x:e] = mixed.clamp(-1.0, 1.0).to(new.dtype)
    out[:, e:] = new[:, e:]
    return out


def _crossfade_samples(crossfade_s) -> int:
    if not _finite_number(crossfade_s) or not 0 <= crossfade_s <= MAX_CROSSFADE_S:
        raise RequestError(f"crossfade must be a number of seconds in [0, {MAX_CROSSFADE_S}], got {crossfade_s!r}")
    return round(crossfade_s * SAMPLE_RATE)


# ---------------------------------------------------------------------------------------------------------------------
# the shared edit procedure
# ---------------------------------------------------------------------------------------------------------------------

def _codes_digest(codes) -> str:
    return hashlib.sha256(np.asarray(codes, dtype=np.int32).tobytes()).hexdigest()


def _new_score(parent: Parent, new_score, tokenizer):
    """(score to use, changed?) from `new_score` (None, ABC text or a Score)."""
    from .pipeline import Score
    if new_score is None and parent.edited_score is not None:
        new_score = parent.edited_score
    if new_score is None:
        return parent.score, False
    if parent.request.cot == "off":
        raise RequestError("this song was made with cot='off' and has no score; a new score needs a song made with "
                           "cot='full' or 'melody'")
    if isinstance(new_score, str):
        score = parent.score.with_text(new_score, tokenizer) if parent.edited_score is None else \
            Score.from_text(new_score, tokenizer, parent.request.cot, parent.score.seed)
    elif isinstance(new_score, Score):
        score = new_score
    else:
        raise RequestError(f"new_score must be ABC text or a Score, got {type(new_score).__name__}")
    if score.cot == "off":
        raise RequestError("the new score is empty (cot off); give ABC text")
    return score, list(score.abc_ids) != list(parent.score.abc_ids) or parent.edited_score is not None


def _child_request(parent: Parent, score, changed: bool, seed) -> SongRequest:
    req = parent.request
    if seed is not None:
        if type(seed) is not int or not 0 <= seed <= SEED_MAX:
            raise RequestError(f"seed must be an integer in [0, 2^63−1], got {seed!r}")
        req = replace(req, seed=seed)
    if changed:
        req = replace(req, abc=score.abc if score.source == "user" else req.abc)
    return req.validate()


def _prompt_lengths(request: SongRequest, score, tokenizer) -> tuple[list[int], int]:
    """(semantic prefix, the longest branch's length: the negative prefix counts too when CFG is on)."""
    prefix = semantic_prefix(request, score.abc_ids, tokenizer.encode)
    longest = len(prefix)
    if request.guidance != 1.0:
        longest = max(longest, len(negative_prefix(request, score.abc_ids, tokenizer.encode)))
    return prefix, longest


def _render_noise(parent: Parent, frames: int, keep: int, render_seed: int) -> torch.Tensor:
    """Noise for the child: song_noise(frames, render_seed) with rows [0, keep) replaced by the parent's own rows, so
    every kept frame starts from exactly the parent's noise (torch's randn recomputes the last <16 values for a
    length that is not a multiple of 16, so a prefix of a longer draw is not always identical)."""
    from .nar import song_noise
    noise = song_noise(frames, render_seed)
    noise[:keep] = song_noise(len(parent.tokens.codes), parent.render_seed)[:keep]
    return noise


def _render(parts, prefix, codes, seed, steps, noise, progress, method: str = "midpoint"):
    from .fast import select_render
    from .nar import render as portable_render
    fn = select_render(parts.nar)
    if "noise" not in inspect.signature(fn).parameters:
        fn = portable_render
    on_step = None if progress is None else (lambda done, total: progress("render", done, total, {}))
    return fn(parts.ar, parts.nar, list(prefix), list(codes), seed, steps, on_step, noise=noise, method=method)


def _parent_media(parts, parent: Parent, steps: int, progress):
    """The parent's latents and audio, made from its codes when the caller had none."""
    from .pipeline import decode
    latents, audio = parent.latents, parent.audio
    if latents is None:
        from .nar import song_noise
        latents = _render(parts, parent.tokens.prefix, parent.codes, parent.render_seed, steps,
                          song_noise(len(parent.codes), parent.render_seed), progress, parent.method)
    if audio is None:
        audio = decode(parts.vae, latents, progress=progress)
    return latents.float().cpu(), audio.float().cpu()


def _edit(parts, parent: Parent, score, changed: bool, request: SongRequest, sampling: Sampling, keep: int,
          cut_sample: int, lineage: dict, crossfade_s, crossfade_shape: str, progress, notes: list[str]):
    """Teacher-force parent codes [0, keep), sample the rest, render all frames with the parent's noise, splice."""
    from .pipeline import decode, semantic
    fade = _crossfade_samples(crossfade_s)
    codes = parent.codes
    steps = parent.steps
    timing = {}
    t = time.perf_counter()
    forced = [CODEC_OFFSET + int(c) for c in codes[:keep]]
    tokens = semantic(parts.ar, parts.tokenizer, request, score, sampling, progress, forced=forced)
    if tokens.codes[:keep] != codes[:keep]:  # the decoders guarantee this; a failure is an engine bug
        raise RuntimeError("teacher forcing did not keep the codes before the cut")
    timing["semantic_seconds"] = time.perf_counter() - t
    frames = len(tokens.codes)
    t = time.perf_counter()
    parent_latents, parent_audio = _parent_media(parts, parent, steps, progress)
    render_seed = parent.render_seed
    if frames > keep:
        noise = _render_noise(parent, frames, keep, render_seed)
        new_latents = _render(parts, tokens.prefix, tokens.codes, render_seed, steps, noise, progress,
                              parent.method)
        timing["render_seconds"] = time.perf_counter() - t
        t = time.perf_counter()
        new_audio = decode(parts.vae, new_latents, progress=progress)
        timing["decode_seconds"] = time.perf_counter() - t
        latents = torch.cat([parent_latents[:keep], new_latents[keep:].float().cpu()], dim=0)
        audio = splice_audio(parent_audio, new_audio.float().cpu(), cut_sample, fade, crossfade_shape)
    else:  # the model ended right at the cut: the song is the parent's first `keep` frames
        notes.append("the regenerated part ended on its end token right at the cut: the song is the original up to "
                     "the cut")
        latents = parent_latents[:keep].clone()
        audio = parent_audio[:, :keep * HOP - VAE_LENGTH_TRIM].clone()
        timing["render_seconds"] = timing["decode_seconds"] = 0.0
    timing["total_seconds"] = sum(timing.values())
    lineage.update({"seed": request.seed, "parent_seed": int(parent.tokens.seed), "render_seed": render_seed,
                    "crossfade_s": min(fade, cut_sample) / SAMPLE_RATE if frames > keep else 0.0,
                    "crossfade_shape": crossfade_shape, "score_changed": changed, "parent_frames": len(codes),
                    "frames": frames, "kept_frames": keep, "ended": tokens.ended, "protocol": PROTOCOL_VERSION})
    settings = {k: v for k, v in parent.settings.items() if k not in ("take", "audio_source")}  # its own audio
    settings.update({
        "protocol": PROTOCOL_VERSION, "cot": request.cot, "cfg_scale": request.guidance,
        "semantic_sampling": sampling.to_dict(), "ode_steps": steps, "ode_method": parent.method,
        "model_dtype": str(parts.ar.dtype).split(".")[-1], "vae_dtype": "float32", "vae_decode": "halo_crop",
        "device": str(parts.ar.device), "render_seed": render_seed,
        "edit": {k: lineage[k] for k in ("operation", "parent", "cut_token", "cut_seconds", "kept_frames",
                                         "crossfade_s", "crossfade_shape", "score_changed")}})
    if parts.info is not None:
        settings["checkpoint"] = parts.info.to_dict()
    if parts.weights is not None:  # the weights this run used, not the parent's (break-it finding, stop 38)
        settings["weights"] = parts.weights
        if _weights_key(parent.settings.get("weights")) != _weights_key(parts.weights):
            notes.append(f"the original was made with {_weights_words(parent.settings.get('weights'))} and this run "
                         f"uses {_weights_words(parts.weights)}: the kept part keeps the original's sound, the new "
                         "part follows this run's weights; the song records this run's")
        was = parent.settings.get("weights") if isinstance(parent.settings.get("weights"), dict) else {}
        made, now = was.get("lora_int8"), parts.weights.get("lora_int8")
        if isinstance(made, str) and isinstance(now, str) and made != now:  # review, stop 41
            notes.append(f"the original's LoRAs went onto int8 layers as {made} (YUE2_LORA_INT8), this run's as "
                         f"{now}: the new part's numbers differ slightly from what the original's way would give; "
                         "the song records this run's")
    from .pipeline import Song
    song = Song(request=request, score=score, tokens=tokens, latents=latents, audio=audio, timing=timing,
                settings=settings, warnings=request.input_warnings(getattr(score, "abc", None)) + notes)
    return song, lineage


def _weights_key(weights) -> tuple:
    """What decides the sound in a "weights" record: each LoRA's sha256 and strengths, the VAE file's sha256."""
    weights = weights if isinstance(weights, dict) else {}
    loras = tuple((w.get("sha256"), w.get("strength_ar"), w.get("strength_nar"))
                  for w in weights.get("loras") or [] if isinstance(w, dict))
    vae = weights.get("vae") if isinstance(weights.get("vae"), dict) else {}
    return loras, vae.get("sha256")


def _weights_words(weights) -> str:
    weights = weights if isinstance(weights, dict) else {}
    loras = [w.get("file", "?") for w in weights.get("loras") or [] if isinstance(w, dict)]
    vae = weights.get("vae") if isinstance(weights.get("vae"), dict) else None
    return ((f"LoRA {', '.join(loras)}" if loras else "no LoRA") + " and "
            + (f"the VAE {vae.get('file', '?')}" if vae else "the checkpoint's VAE"))


def _prepare(engine_or_parts, song, new_score, seed, parent_name, operation, crossfade_s, crossfade_shape):
    _crossfade_samples(crossfade_s)  # validate the cheap arguments before any work
    crossfade_weights(1, crossfade_shape)
    parts = model_parts(engine_or_parts)
    parent = as_parent(song, parts.tokenizer, parent_name)
    notes = parent.notes + check_checkpoint(parent.settings.get("checkpoint"), parts.info,
                                            getattr(parts.ar, "dims", None),
                                            checkpoint_vae=not any(e[0] == "vae" for e in carried(parts.vae)))
    score, changed = _new_score(parent, new_score, parts.tokenizer)
    request = _child_request(parent, score, changed, seed)
    prefix, longest = _prompt_lengths(request, score, parts.tokenizer)
    if not changed and list(prefix) != list(parent.tokens.prefix):
        raise CheckpointMismatch("the song's prompt does not re-tokenize to the prefix it was made with (another "
                                 "tokenizer, or an edited request.json); load the checkpoint it was made with")
    if seed is None and not changed and operation == "regenerate":
        notes.append("same score and seed as the original: after the cut the original's random stream is reused (on "
                     "the CUDA fast path, whose draws are indexed by token position, the new part can repeat the "
                     "original); pass a new seed for a different take")
    return parts, parent, score, changed, request, prefix, longest, notes


def _base_lineage(operation: str, parent: Parent) -> dict:
    return {"operation": operation, "parent": parent.name, "parent_codes_sha256": _codes_digest(parent.codes)}


# ---------------------------------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------------------------------

def regenerate(engine_or_parts, song, cut, *, new_score=None, seed: int | None = None, crossfade_s: float = 0.05,
               budgets=None, progress=None, crossfade_shape: str = "equal_power", parent_name: str | None = None):
    """Keep a song up to `cut` and sample a new continuation from there (optionally under an edited score).

    song: a Song, a SavedSong / song directory, or (score, tokens, latents, audio, request[, settings]).
    cut: seconds (float/int or "12.5s"), a bar of the song's score ({"bar": 9} or "bar 9"), or {"token": k};
    must satisfy 0 < k < len(codes) (RequestError with the valid range in seconds and bars otherwise).
    new_score: ABC text or Score (None = keep); seed: sampling seed after the cut (None = the song's seed); the
    render noise is always the parent's. budgets: `Budgets(max_seconds=…)` caps the whole song's length; default =
    the song's own semantic sampling settings. Raises BudgetError (with the seconds that fit) when the (new) prompt +
    budget exceeds the 24,576-token context, CheckpointMismatch when the song is from another model.
    Returns (Song, lineage dict) — save with `artifacts.save_song(song, dir, lineage=lineage)`."""
    parts, parent, score, changed, request, prefix, longest, notes = _prepare(engine_or_parts, song, new_score,
                                                                             seed, parent_name, "regenerate",
                                                                             crossfade_s, crossfade_shape)
    frames = len(parent.codes)
    point = resolve_cut(cut, frames, _timeline_abc(parent))
    sampling = SEMANTIC_PRESET.merged(parent.tokens.sampling)
    if budgets is not None and budgets.max_seconds is not None:
        cap = seconds_to_tokens(budgets.max_seconds)
        sampling = replace(sampling, max_tokens=cap, min_tokens=min(sampling.min_tokens, cap))
    sampling = sampling.validate("semantic")
    k = point.token
    room = CONTEXT - longest
    if sampling.max_tokens > room or room <= k:
        fit = max(room, 0)
        raise BudgetError(
            f"the {'new ' if changed else ''}prompt is {longest} tokens, so at most {fit} music tokens = "
            f"{fit / FRAMES_PER_SECOND:.2f} s fit the {CONTEXT}-token context; the song keeps {k} tokens "
            f"({point.seconds:.2f} s) before the cut, leaving room for "
            f"{max(fit - k, 0) / FRAMES_PER_SECOND:.2f} s after it, but the budget is {sampling.max_tokens} tokens "
            f"({sampling.max_tokens / FRAMES_PER_SECOND:.2f} s). "
            + ("Shorten the score or lyrics, or " if fit > k else "Shorten the score or lyrics; ")
            + (f"set max seconds ≤ {fit / FRAMES_PER_SECOND:.2f}." if fit > k else "nothing fits after this cut."))
    if sampling.max_tokens <= k:
        raise BudgetError(f"the budget of {sampling.max_tokens} tokens ({sampling.max_tokens / FRAMES_PER_SECOND:.2f}"
                          f" s) ends at or before the cut at {point.seconds:.2f} s; raise max seconds above "
                          f"{point.seconds:.2f}")
    lineage = _base_lineage("regenerate", parent)
    lineage.update({"cut_seconds": point.seconds, "cut_token": k, "cut_bar": point.bar, "cut_sample": point.sample,
                    "cut_requested": cut if isinstance(cut, (int, float, str, dict)) else str(cut)})
    if changed and (note := retimed_note(_timeline_abc(parent), score.abc, point.seconds)):
        notes.append(note)
    return _edit(parts, parent, score, changed, request, sampling, k, point.sample, lineage, crossfade_s,
                 crossfade_shape, progress, notes)


def max_continuation_seconds(engine_or_parts, song, new_score=None) -> float:
    """The longest continuation the context allows: (24,576 − prompt − len(codes)) / 25 seconds, with the prompt of
    `new_score` when given (the negative prompt counts when CFG is on). 0 when nothing fits."""
    parts = model_parts(engine_or_parts, need=("tokenizer",))
    parent = as_parent(song, parts.tokenizer)
    score, changed = _new_score(parent, new_score, parts.tokenizer)
    request = _child_request(parent, score, changed, None)
    _, longest = _prompt_lengths(request, score, parts.tokenizer)
    return max(CONTEXT - longest - len(parent.codes), 0) / FRAMES_PER_SECOND


def continue_song(engine_or_parts, song, extra_seconds: float, *, new_score=None, seed: int | None = None,
                  crossfade_s: float = 0.05, min_extra_seconds: float | None = None, progress=None,
                  crossfade_shape: str = "equal_power", parent_name: str | None = None):
    """Extend a song by up to `extra_seconds`: every original code is teacher-forced, the model samples on, and the
    new audio is crossfaded in over the last `crossfade_s` of the original (which otherwise stays bit for bit).

    The end token is blocked for the first `min_extra_seconds` of new music (default min(extra, 8 s) — the release's
    `min_tokens` of 200 music tokens, which block it at the start of every song (runtime.md §2.1, §2.4): a song that
    ended on its own would otherwise usually end again at once). The context bounds the continuation: at most
    (24,576 − prompt − len(codes)) / 25 s (`max_continuation_seconds`); asking for more raises BudgetError saying
    that maximum. Returns (Song, lineage)."""
    if not _finite_number(extra_seconds) or extra_seconds <= 0:
        raise RequestError(f"extra seconds must be a positive number, got {extra_seconds!r}")
    parts, parent, score, changed, request, prefix, longest, notes = _prepare(engine_or_parts, song, new_score,
                                                                             seed, parent_name, "continue",
                                                                             crossfade_s, crossfade_shape)
    frames = len(parent.codes)
    extra = seconds_to_tokens(extra_seconds)
    if extra_seconds * FRAMES_PER_SECOND < 0.5:  # as generate's --max-seconds note (break-it finding, stop 38)
        notes.append(f"continuing by {extra_seconds:g} s is less than half a frame: rounded up to one frame "
                     f"({1 / FRAMES_PER_SECOND:g} s), the smallest continuation")
    room = CONTEXT - longest - frames
    if extra > room:
        most = max(room, 0)
        raise BudgetError(
            f"continuing by {extra / FRAMES_PER_SECOND:.2f} s ({extra} tokens) exceeds the {CONTEXT}-token context: "
            f"prompt {longest} + song {frames} tokens leave {most} tokens, so at most {most / FRAMES_PER_SECOND:.2f} s "
            f"of continuation are possible" + ("" if most else " (none: this song already fills the context)")
            + (" with the new score" if changed else "") + ".")
    if min_extra_seconds is None:
        min_extra = min(extra, SEMANTIC_PRESET.min_tokens)  # 200 tokens = 8 s, the release's minimum
    else:
        if not _finite_number(min_extra_seconds) or not 0 <= min_extra_seconds <= extra_seconds:
            raise RequestError(f"min extra seconds must be in [0, {extra_seconds}], got {min_extra_seconds!r}")
        min_extra = round(min_extra_seconds * FRAMES_PER_SECOND)
    base = SEMANTIC_PRESET.merged(parent.tokens.sampling)
    sampling = replace(base, max_tokens=frames + extra,
                       min_tokens=min(max(base.min_tokens, frames + min_extra), frames + extra)).validate("semantic")
    if parent.tokens.ended:
        notes.append(f"the original ended on its own end token; the end token is blocked for the first "
                     f"{min_extra / FRAMES_PER_SECOND:.2f} s of the continuation")
    cut_sample = frames * HOP - VAE_LENGTH_TRIM  # the parent's last sample: the crossfade ends there
    lineage = _base_lineage("continue", parent)
    lineage.update({"cut_seconds": frames / FRAMES_PER_SECOND, "cut_token": frames,
                    "cut_bar": None, "cut_sample": cut_sample, "extra_seconds_requested": float(extra_seconds),
                    "max_continuation_seconds": max(room, 0) / FRAMES_PER_SECOND})
    try:
        lineage["cut_bar"] = _bar_at(bar_starts(_timeline_abc(parent)), frames / FRAMES_PER_SECOND)
    except RequestError:
        pass
    if changed and (note := retimed_note(_timeline_abc(parent), score.abc, frames / FRAMES_PER_SECOND)):
        notes.append(note)
    song_out, lineage = _edit(parts, parent, score, changed, request, sampling, frames, cut_sample, lineage,
                              crossfade_s, crossfade_shape, progress, notes)
    lineage["added_seconds"] = (lineage["frames"] - frames) / FRAMES_PER_SECOND
    return song_out, lineage


__all__ = ["regenerate", "continue_song", "max_continuation_seconds", "resolve_cut", "bar_starts", "CutPoint",
           "splice_audio", "crossfade_weights", "check_checkpoint", "CheckpointMismatch", "as_parent", "model_parts",
           "Parent"]
