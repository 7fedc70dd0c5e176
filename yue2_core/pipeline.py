"""The song pipeline: plan (ABC lead sheet) → semantic (codec tokens) → render (latents) → decode (audio)
(runtime.md §7.1). Each stage is a plain function over loaded modules, so the ComfyUI nodes can call them on models
that ComfyUI's model management has placed; `YuE2Engine` bundles them for the command line and scripts.

Data: style + lyrics → prefix ids → ABC ids (Score) → semantic codes (SemanticTokens, 25 per second) → latents
[T, 64] fp32 → audio [2, 1920·T − 64] fp32 at 48 kHz, clipped to [−1, 1].
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch

from .constants import (CONTEXT, FRAMES_PER_SECOND, ODE_STEPS, PROTOCOL_VERSION, SAMPLE_RATE, VAE_CORE_FRAMES,
                        VAE_HALO_FRAMES)
from .errors import BudgetError, NumericalError, RequestError, ScoreError
from .protocol import (ABC_PRESET, SEMANTIC_PRESET, Sampling, SongRequest, blank_score, check_budget,
                       negative_prefix, planning_prefix, semantic_prefix, validate_abc_ids, validate_codes)
from .vae import to_waveform

Progress = Callable[[str, int, int, dict], None]  # (stage, done, total, info); may raise to cancel


@dataclass
class Score:
    """An ABC lead sheet and the exact ids the semantic stage will read. `source`: "model" (sampled ids, `abc` is
    their decoded text), "user" (ids = encode(abc), text verbatim) or "none" (cot off). `truncated`: the planner hit
    its token budget before ABC_END (the score is cut off)."""

    abc: str | None
    abc_ids: list[int]
    cot: str
    seed: int
    source: str = "model"
    truncated: bool = False
    timing: dict = field(default_factory=dict)

    @classmethod
    def from_text(cls, text: str, tokenizer, cot: str = "full", seed: int = 0) -> "Score":
        """A user-supplied score: tokenized verbatim (NFC, no stripping). Raises ScoreError for empty text."""
        if not isinstance(text, str) or blank_score(text):  # whitespace and byte-order marks only
            raise ScoreError("the ABC score is empty; write a score or connect the composer's score")
        if cot == "off":
            raise RequestError("a score cannot be used with cot='off'; choose full or melody")
        ids = validate_abc_ids(tokenizer.encode(text))
        return cls(abc=text, abc_ids=ids, cot=cot, seed=seed, source="user",
                   timing={"seconds": 0.0, "output_tokens": 0, "external_prefix_tokens": len(ids)})

    def with_text(self, text: str, tokenizer) -> "Score":
        """This score if `text` equals its text (exact ids kept, so an unchanged score re-renders identically),
        otherwise a user score tokenized from `text`."""
        if self.abc is not None and text == self.abc:
            return self
        return Score.from_text(text, tokenizer, self.cot if self.cot != "off" else "full", self.seed)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SemanticTokens:
    """Semantic codec tokens (codes 0 … 32767, 25 per second) with everything needed to render them again: the
    semantic-stage prefix they were sampled after, the score, the seed and the sampling settings."""

    codes: list[int]
    prefix: list[int]
    score: Score
    request: dict
    seed: int
    cfg_scale: float
    sampling: dict
    ended: bool
    timing: dict = field(default_factory=dict)

    @property
    def truncated(self) -> bool:
        return not self.ended

    @property
    def seconds(self) -> float:
        """Duration of the codes in seconds (25 codec frames per second, constants.FRAMES_PER_SECOND)."""
        return len(self.codes) / FRAMES_PER_SECOND

    def to_dict(self) -> dict:
        d = asdict(self)
        d["seconds"] = self.seconds
        return d


@dataclass
class Song:
    """A finished song. `latents` [T, 64] fp32, `audio` [2, 1920·T − 64] fp32 in [−1, 1] at `sample_rate` Hz."""

    request: SongRequest
    score: Score
    tokens: SemanticTokens
    latents: torch.Tensor
    audio: torch.Tensor
    sample_rate: int = SAMPLE_RATE
    timing: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)

    @property
    def truncated(self) -> dict:
        return {"abc": self.score.truncated, "semantic": self.tokens.truncated}


@contextlib.contextmanager
def _own_weights_named(*modules):
    """A NumericalError inside names the adapters / VAE file the `modules` carry as its likely cause instead of only
    the checkpoint (`weights.own.blame`; the fast paths' messages included)."""
    try:
        yield
    except NumericalError as exc:
        from .weights.own import blame
        text = blame(str(exc), *modules)
        if text == str(exc):
            raise
        raise NumericalError(text) from None


def _phase(ar, prefix, sampling, seed, phase, **kw):
    """Run one AR phase on the best available decoder for the model's device (CUDA graphs on GPUs)."""
    from .constants import CODEC_OFFSET, CODEC_SIZE
    if ar.dims.vocab < CODEC_OFFSET + CODEC_SIZE:
        raise RequestError(f"this checkpoint's vocabulary has {ar.dims.vocab} rows; YuE2's protocol and codec ids "
                           f"need at least {CODEC_OFFSET + CODEC_SIZE} (a test-only or foreign file?)")
    from .fast import select_generate
    with _own_weights_named(ar):
        return select_generate(ar)(ar, prefix, sampling, seed, phase, **kw)


def _token_progress(progress: Progress | None, stage: str, t0: float):
    if progress is None:
        return None

    def on_token(phase, step, total, token):
        elapsed = time.perf_counter() - t0
        progress(stage, step + 1, total, {"tokens_per_second": (step + 1) / elapsed if elapsed > 0 else 0.0})
    return on_token


def plan(ar, tokenizer, request: SongRequest, sampling: Sampling = ABC_PRESET,
         progress: Progress | None = None, semantic_max_tokens: int = 0) -> Score:
    """Stage 1: the lead sheet. cot off → an empty "none" score; a request with `abc` → that text tokenized
    verbatim; otherwise the model writes ABC ids after the planning prefix with the ABC preset (no CFG).
    `semantic_max_tokens` (optional): the music budget that must fit after the lead sheet. Even an empty score
    leaving no room for it raises BudgetError before any work; a lead sheet budget that could leave too little is
    lowered to what leaves room (`timing["abc_budget_lowered_from"]`, said by `plan_notes`) — before, a lead sheet
    written to its full budget could make the music stage refuse after minutes of planning, and the score was lost
    (break-it finding, stop 38). BudgetError when not even the ABC preset's minimum fits."""
    request.validate()
    if request.cot == "off":
        return Score(abc=None, abc_ids=[], cot="off", seed=request.seed, source="none")
    if request.abc is not None:
        return Score.from_text(request.abc, tokenizer, request.cot, request.seed)
    sampling = sampling.validate("abc")
    prefix = planning_prefix(request, tokenizer.encode)
    check_budget(len(prefix), sampling.max_tokens, "ABC")
    asked = sampling.max_tokens
    if semantic_max_tokens:
        check_budget(len(prefix) + 2, semantic_max_tokens, "semantic")
        sampling = fit_abc_budget(len(prefix), sampling, semantic_max_tokens)
    t0 = time.perf_counter()
    result = _phase(ar, prefix, sampling, request.seed, "abc", on_token=_token_progress(progress, "plan", t0))
    return Score(abc=tokenizer.decode(result.tokens), abc_ids=result.tokens, cot=request.cot, seed=request.seed,
                 source="model", truncated=result.truncated, timing=abc_timing(result.timing, asked, sampling))


def fit_abc_budget(prefix_len: int, sampling: Sampling, semantic_max_tokens: int) -> Sampling:
    """`sampling` with max_tokens lowered, where needed, so that a lead sheet of that many tokens after a
    `prefix_len`-token planning prompt still leaves `semantic_max_tokens` music tokens in the context (the semantic
    prefix is the planning prompt + the ids + ABC_END, MUSIC_START). BudgetError when that leaves less than the
    sampling's min_tokens (at least 1)."""
    room = CONTEXT - prefix_len - 2 - semantic_max_tokens
    if room >= sampling.max_tokens:
        return sampling
    if room < max(1, sampling.min_tokens):
        raise BudgetError(f"{semantic_max_tokens} music tokens ({semantic_max_tokens / FRAMES_PER_SECOND:.2f} s) after "
                          f"this {prefix_len}-token prompt leave {max(room, 0)} tokens of the {CONTEXT}-token context "
                          f"for the lead sheet, below its minimum of {max(1, sampling.min_tokens)}; lower the music "
                          "duration or shorten the lyrics")
    return replace(sampling, max_tokens=room)


def abc_timing(timing: dict, asked: int, sampling: Sampling) -> dict:
    """A planning phase's timing, with the budget `fit_abc_budget` lowered from `asked` (what `plan_notes` says)."""
    timing = dict(timing)
    if sampling.max_tokens < asked:
        timing["abc_budget_lowered_from"] = asked
        timing["abc_budget"] = sampling.max_tokens
    return timing


def plan_notes(score: Score) -> list[str]:
    """What a run says of its lead sheet budget: the note when `plan` lowered it so the music fits, [] otherwise."""
    asked, used = score.timing.get("abc_budget_lowered_from"), score.timing.get("abc_budget")
    if asked is None or used is None:
        return []
    return [f"the lead sheet budget was lowered from {asked} to {used} ABC tokens so that the music asked for fits "
            f"the {CONTEXT}-token context after it" + ("; the lead sheet hit that budget and is cut off" if
                                                       score.truncated else "; the lead sheet ended before it")]


def music_budget(request: SongRequest, score: Score, tokenizer) -> dict:
    """Token accounting for the semantic stage: prefix tokens (prompt + score + markers), the score's tokens and the
    most music that fits the context, in tokens and seconds (25 tokens per second)."""
    prefix = semantic_prefix(request, score.abc_ids, tokenizer.encode)
    room = max(0, CONTEXT - len(prefix))
    return {"prefix_tokens": len(prefix), "score_tokens": len(score.abc_ids), "music_tokens_max": room,
            "music_seconds_max": room / FRAMES_PER_SECOND}


def semantic(ar, tokenizer, request: SongRequest, score: Score, sampling: Sampling = SEMANTIC_PRESET,
             progress: Progress | None = None, forced: list[int] | None = None) -> SemanticTokens:
    """Stage 2: semantic codec tokens after the semantic prefix, with CFG against the negative prefix when the
    guidance is ≠ 1 (default 1.01 in off mode). Raises BudgetError (saying how many seconds fit) when the prefix +
    `sampling.max_tokens` exceeds 24,576."""
    request.validate()
    if score.cot != request.cot and not (score.source == "user" and request.cot != "off"):
        raise RequestError(f"the score was made for cot={score.cot!r} but the request says cot={request.cot!r}")
    sampling = sampling.validate("semantic")
    prefix = semantic_prefix(request, score.abc_ids, tokenizer.encode)
    check_budget(len(prefix), sampling.max_tokens, "semantic")
    cfg = request.guidance
    negative = negative_prefix(request, score.abc_ids, tokenizer.encode) if cfg != 1.0 else None
    t0 = time.perf_counter()
    result = _phase(ar, prefix, sampling, request.seed, "semantic", negative=negative, cfg_scale=cfg,
                    legacy_off=request.cot == "off", on_token=_token_progress(progress, "semantic", t0),
                    forced=forced)
    from .protocol import codes_from_ids
    return SemanticTokens(codes=codes_from_ids(result.tokens), prefix=prefix, score=score,
                          request=request_dict(request), seed=request.seed, cfg_scale=cfg,
                          sampling=sampling.to_dict(), ended=result.ended, timing=result.timing)


def request_dict(request: SongRequest) -> dict:
    """The request as recorded in result.json / request.json: style, lyrics, cot, seed, abc (a given lead sheet or
    None), cfg_scale and id — the fields `SongRequest` is rebuilt from when a song is loaded."""
    return {"style": request.style, "lyrics": request.lyrics, "cot": request.cot, "seed": request.seed,
            "abc": request.abc, "cfg_scale": request.cfg_scale, "id": request.id}


def render(ar, nar, tokens: SemanticTokens, steps: int = ODE_STEPS, seed: int | None = None,
           progress: Progress | None = None, method: str = "midpoint") -> torch.Tensor:
    """Stage 3: flow-matching render of the codes → latents [T, 64] fp32 (CPU). `seed` defaults to the tokens'
    seed (the noise is `randn((T, 64))` from a CPU generator with that seed). `method`: the ODE solver, "midpoint"
    (the release's) or the opt-in one-evaluation "ab2" (`nar.solve`); RequestError for another."""
    from .nar import check_method, check_steps
    codes = validate_codes(tokens.codes)
    steps, method = check_steps(steps), check_method(method)
    seed = tokens.seed if seed is None else seed
    on_step = None if progress is None else (lambda done, total: progress("render", done, total, {}))
    from .fast import select_render
    with _own_weights_named(ar, nar):  # the AR's keys and values feed the render too
        return select_render(nar)(ar, nar, list(tokens.prefix), codes, seed, steps, on_step, method=method)


def compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The AR/NAR compute dtype for `device`: bf16 is kept where the GPU has native bf16 arithmetic (NVIDIA compute
    capability ≥ 8.0: Ampere and newer; AMD Instinct/RDNA3 report ≥ 9); older GPUs (T4, V100, GTX 10/16, RTX 20) get
    float32 with one warning — the reference's bf16 rounding is then not reproduced, but the model runs at full
    precision instead of failing in the bf16 Triton kernels. CPUs and other dtypes pass unchanged."""
    if dtype != torch.bfloat16 or device.type != "cuda":
        return dtype
    major, minor = torch.cuda.get_device_capability(device)
    if major >= 8:
        return dtype
    import warnings
    warnings.warn(f"this GPU (compute capability {major}.{minor}) has no native bfloat16: YuE2 runs in float32 "
                  "(twice the weight memory; results differ from the bf16 reference by rounding)")
    return torch.float32


def vae_core_frames(device: torch.device) -> int:
    """Tile size for the VAE: 1024 frames, 512 on GPUs with ≤ 12 GiB free (runtime.md §6.3)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return VAE_CORE_FRAMES if free > 12 * 2 ** 30 else 512
    return VAE_CORE_FRAMES


def decode(vae, latents: torch.Tensor, core: int | None = None, progress: Progress | None = None) -> torch.Tensor:
    """Stage 4: latents [T, 64] (or [1, 64, T]) → audio [2, 1920·T − 64] fp32 in [−1, 1], halo-crop tiled."""
    lat = latents.T[None] if latents.ndim == 2 else latents
    if lat.ndim != 3 or lat.shape[0] != 1 or lat.shape[1] != vae.cfg.latent_dim:
        raise RequestError(f"latents must be one song, [T, {vae.cfg.latent_dim}] or [1, {vae.cfg.latent_dim}, T]; "
                           f"got {list(latents.shape)} (decode a batch song by song)")
    if lat.shape[2] < 1:
        raise RequestError("latents hold no frames: nothing to decode (a song has at least one frame, 1/25 s)")
    core = core or vae_core_frames(vae.device)
    on_tile = None if progress is None else (lambda d, t: progress("decode", d, t, {}))
    audio = vae.decode_tiled(lat, core=core, halo=VAE_HALO_FRAMES, on_tile=on_tile)
    with _own_weights_named(vae):
        return to_waveform(audio[0])


@dataclass
class Budgets:
    """User-facing limits: `max_seconds` caps the music (25 tokens/s; min_tokens shrinks to fit),
    `max_abc_tokens` caps the lead sheet."""

    max_seconds: float | None = None
    max_abc_tokens: int | None = None
    abc: Sampling = ABC_PRESET
    semantic: Sampling = SEMANTIC_PRESET

    def abc_sampling(self) -> Sampling:
        """The lead sheet's sampling with `max_abc_tokens` applied (min_tokens lowered to fit). Raises RequestError
        for a budget that is not a positive integer or settings `Sampling.validate` refuses."""
        s = self.abc
        if self.max_abc_tokens is not None:
            if type(self.max_abc_tokens) is not int or self.max_abc_tokens < 1:
                raise RequestError(f"max ABC tokens must be a positive integer, got {self.max_abc_tokens!r}")
            s = replace(s, max_tokens=self.max_abc_tokens, min_tokens=min(s.min_tokens, self.max_abc_tokens))
        return s.validate("abc")

    def semantic_sampling(self) -> Sampling:
        """The music's sampling with `max_seconds` turned into tokens at 25 per second (`protocol.semantic_budget`).
        Raises RequestError for a duration or settings outside the accepted ranges."""
        from .protocol import semantic_budget
        return semantic_budget(self.max_seconds, self.semantic).validate("semantic")


def _release_cached_memory(module):
    """Return the CUDA caching allocator's free blocks between stages (each stage's working set differs)."""
    if module is not None and module.device.type == "cuda":
        torch.cuda.empty_cache()


class YuE2Engine:
    """Loaded YuE2 model (AR expert, NAR expert, VAE decoder, tokenizer) with the four stages and `generate`.

    `YuE2Engine.load(path, device="auto", dtype=torch.bfloat16)`; device "auto" = CUDA when available, else CPU."""

    def __init__(self, info, tokenizer, ar=None, nar=None, vae=None, weights=None, warm=None):
        self.notes: list[str] = []  # load-time warnings for the caller to show (adapter keys that patch nothing)
        self.old_rule: list[dict] = []  # `apply.old_rule_summary` of the LoRA stack (render's note on older songs)
        self.warm = warm  # a running `warmup.WarmUp` (set by `load`), or None
        self.info, self.tokenizer, self.ar, self.nar, self.vae = info, tokenizer, ar, nar, vae
        self.weights = weights or {"loras": [], "vae": None}  # what config.json records of the user's own weights

    # The parts wait for a background warm-up before anyone gets them, so no song kernel (nor a graph capture) runs
    # beside it, whichever entry point (generate, the stages, edit, candidates, batch) uses the engine.
    ar = property(lambda self: self._part("_ar"), lambda self, m: setattr(self, "_ar", m))
    nar = property(lambda self: self._part("_nar"), lambda self, m: setattr(self, "_nar", m))
    vae = property(lambda self: self._part("_vae"), lambda self, m: setattr(self, "_vae", m))

    def _part(self, name):
        if self.warm is not None:
            self.wait_warm_up()
        return getattr(self, name)

    def wait_warm_up(self) -> dict:
        """Wait for the background warm-up started by `load` (if any) and return its report ({} when none ran):
        "seconds", "steps", "stages" or "cancelled" / "error" (a failed warm-up was one warning, never an error)."""
        warm = self.warm
        if warm is None:
            return getattr(self, "warm_up_report", {})
        self.warm_up_report = warm.wait()
        self.warm = None
        return self.warm_up_report

    def cancel_warm_up(self) -> None:
        """Stop the background warm-up at its next step and wait for it; the engine stays usable (a song then
        compiles what the warm-up did not)."""
        if self.warm is not None:
            self.warm.cancel()
            self.wait_warm_up()

    @classmethod
    def load(cls, path, device="auto", dtype=torch.bfloat16, parts=("ar", "nar", "vae"), loras=(),
             vae=None, warm_up: bool | None = None, budgets: "Budgets | None" = None, batch_rows: int = 0,
             batch_refill: bool = False, vendor_vae=None, lora_int8: str | None = None) -> "YuE2Engine":
        """Read the parts of the checkpoint at `path` onto `device` ("auto": CUDA when available) in `dtype` (the AR
        and NAR; the VAE is always float32). bf16 on a GPU without native bf16 becomes float32 (`compute_dtype`).
        `loras`: (adapter path, strength_ar, strength_nar) tuples, applied in order (`weights.lora.apply`: float
        layers merged, int8 layers with an exact side delta — or, `lora_int8` "bf16", merged into int8 layers
        dequantized to bf16; default: $YUE2_LORA_INT8, else "side"; `weights["lora_int8"]` records the mode used when
        int8 layers were patched); `vae`: a VAE file or folder replacing the checkpoint's decoder
        (`weights.vae_files`; a vendor model folder's own VAE is then not looked for: it may have none);
        `vendor_vae`: the VAE folder of a vendor model folder `path` (default: found by `vendor.find_vae_folder`;
        render passes the one the song recorded). `warm_up` (default: on for CUDA with the
        fast path, unless YUE2_WARMUP=0): compile the fast path's kernels for `budgets` (default presets) in a
        background thread while the weights load (`warmup.py`); the parts wait for it on first use (`wait_warm_up`,
        `cancel_warm_up`); `batch_rows` > 1 (the `batch` command): also the kernels of its decoder of that many rows
        (`batch_refill`: continuous batching's `fast.refill.RefillDecoder`, else static batches). Raises
        CheckpointError / TokenizerError for files that are not a valid YuE2 checkpoint, AdapterError for adapters
        that do not apply (also the same adapter file twice past ±5, an FL NAR file given beside the AR file that
        reads it, two different replacements of one module, or a merged delta that overflows: `apply.check_stack`),
        RequestError for a bad YUE2_WARMUP, YUE2_LORA_INT8 or `lora_int8`. `engine.notes`: what the caller should
        say (unmatched keys, `apply.stack_notes`)."""
        from .errors import AdapterError, CheckpointError
        from .weights.checkpoint import (checkpoint_state, inspect_checkpoint, load_ar, load_nar, load_tokenizer,
                                         load_vae)
        from .weights.lora.apply import (Applied, apply_stack, check_stack, check_strength, int8_mode,
                                         nar_layers_for, reaches_int8)
        from .weights.lora.record import lora_record
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = compute_dtype(torch.device(device), dtype)
        # a vendor folder's own VAE is not looked for when another one decodes (new-user review, stop 46: a folder
        # without vae/ failed even with --vae), nor needed when no part decodes
        own_vae = "skip" if vae is not None and vendor_vae is None else "required" if "vae" in parts else "optional"
        info = inspect_checkpoint(path, vae_path=vendor_vae, own_vae=own_vae)
        # the file(s) as they are now, and their content samples (`to_dict`) taken now: the parts are read from this
        # file and a song records it, not one put at its path while the parts load or the song is made (break-it,
        # stop 43: the sample was taken when the song was saved, and a replaced file was recorded as the one used)
        state = checkpoint_state(info)
        info.to_dict()
        mode = int8_mode(lora_int8) if loras else None  # a bad value fails before any weight is read
        stack, records = [], []
        if loras:  # bad adapters fail here, before the weights load
            from .weights.lora.layouts import read_adapter
            from .weights.lora.layouts_io import read_state
            for p, a, n in loras:
                before = read_state(p)
                stack.append(Applied(read_adapter(p, info.dims), check_strength(a, "AR strength"),
                                     check_strength(n, "NAR strength")))
                # its record (sha256 …) taken now, from the files as read: one replaced while the checkpoint loads
                # is not recorded beside the weights read before (break-it, stop 43; the nodes' `derive` does so)
                try:
                    records.append(lora_record(stack[-1]))
                except OSError as exc:
                    raise AdapterError(f"LoRA {p} can no longer be read ({exc.strerror or exc}): it was moved or "
                                       "deleted while it was being read; put it back and run again") from None
                if read_state(p) != before:
                    raise AdapterError(f"LoRA {p} changed on disk while it was being read (its size, times or inode "
                                       "differ); run again once it is written")
            check_stack(stack)  # the same file twice, a companion twice, …: refused before any weight is read
        vae_file = None
        if vae is not None and "vae" in parts:
            from .weights.vae_files import open_vae
            vae_file = open_vae(vae)
        tok = load_tokenizer(info)
        warm = None
        from . import warmup
        if warmup.skip_reason(torch.device(device)) is None and warm_up is not False:  # before any weight is read
            import os
            # the shadow gets the layers the adapters will leave (stop-53 review: the AR's bf16 for any stack under
            # YUE2_LORA_INT8=bf16, the NAR's W8A8 where adapters were to take its bf16 layers)
            bf16_layers = mode == "bf16" and reaches_int8(info, stack, True, ("ar",))
            plan = warmup.Plan.from_info(info, dtype, parts, vae_cfg=getattr(vae_file, "config", None),
                                         budgets=budgets, int8_layers=not bf16_layers,
                                         nar_linears=nar_layers_for(info, stack, mode, dtype, device),
                                         batch_rows=batch_rows if batch_rows > 1 else 0, batch_refill=batch_refill,
                                         source={"path": info.path, "bytes": info.data_bytes,
                                                 "vae": os.fspath(vae) if vae_file is not None
                                                 and isinstance(vae, (str, os.PathLike)) else None})
            warm = warmup.start(plan, device)
        try:
            ar = load_ar(info, device, dtype) if "ar" in parts else None
            nar = load_nar(info, device, dtype) if "nar" in parts else None
            used = []  # the int8 mode of each expert whose int8 layers got adapters
            if stack:
                if ar is not None:
                    used.append(apply_stack(ar, stack, "ar", mode)["int8_mode"])
                if nar is not None:
                    used.append(apply_stack(nar, stack, "nar", mode)["int8_mode"])
            vae_mod = (vae_file.load(device) if vae_file is not None else load_vae(info, device)) \
                if "vae" in parts else None
            if checkpoint_state(info) != state:  # replaced while its parts were read: they may come from two files
                raise CheckpointError(f"the checkpoint {info.path} changed on disk while it was being loaded (its size, "
                                      "modification time, inode or sampled bytes differ), so its parts may come from "
                                      "two files; run again once it is written")
        except BaseException:
            if warm is not None:  # a load that fails (or is interrupted) leaves no warm-up behind
                warm.cancel()
            raise
        weights = {"loras": records, "vae": None if vae_file is None else vae_file.record()}
        if any(used):  # LoRAs on int8 layers: how they were applied decides the numbers (a re-render applies it)
            weights["lora_int8"] = mode
        if nar is not None:
            from .nar import keeps_w8a8
            if keeps_w8a8(nar):  # W8A8 took effect (YUE2_NAR_LINEARS): ≈ 1 % a product off the bf16 layers' (noted)
                weights["nar_linears"] = "w8a8"
        if stack:  # the stacking rule (a replacement first): a re-render can tell a song of the rule before
            from .weights.lora.record import STACK_RULES
            weights["stack_rules"] = STACK_RULES
        engine = cls(info, tok, ar, nar, vae_mod, weights, warm=warm)
        from .weights.lora.apply import old_rule_summary
        engine.old_rule = old_rule_summary(stack)  # where the rule before 2026-12-06 gave other weights
        from .weights.lora.layouts import adapter_notes
        from .weights.lora.apply import stack_notes
        engine.notes = ([n for a in stack for n in adapter_notes(a.adapter)]  # the caller shows them
                        + stack_notes(stack))
        return engine

    def generate(self, request: SongRequest, budgets: Budgets | None = None, steps: int = ODE_STEPS,
                 progress: Progress | None = None, method: str = "midpoint") -> Song:
        """Style + lyrics (+ optional score) → Song. Every stage's time is in `Song.timing`. `method`: the render's
        ODE solver (`render`), recorded as the song's ode_method."""
        budgets = budgets or Budgets()
        request = request.validate()
        from .nar import check_method, check_steps
        check_method(method)  # a bad method or step count fails before the AR phases, not after them
        steps = check_steps(steps)
        sem = budgets.semantic_sampling()
        timing = {}
        t = time.perf_counter()
        self.wait_warm_up()  # a warm-up still running when the song starts is waited for inside it
        timing["warm_up_wait_seconds"] = time.perf_counter() - t
        t = time.perf_counter()
        score = plan(self.ar, self.tokenizer, request, budgets.abc_sampling(), progress, sem.max_tokens)
        timing["plan_seconds"] = time.perf_counter() - t
        t = time.perf_counter()
        tokens = semantic(self.ar, self.tokenizer, request, score, sem, progress)
        timing["semantic_seconds"] = time.perf_counter() - t
        _release_cached_memory(self.ar)
        t = time.perf_counter()
        latents = render(self.ar, self.nar, tokens, steps, progress=progress, method=method)
        timing["render_seconds"] = time.perf_counter() - t
        _release_cached_memory(self.nar)
        t = time.perf_counter()
        audio = decode(self.vae, latents, progress=progress)
        timing["decode_seconds"] = time.perf_counter() - t
        timing["total_seconds"] = sum(timing.values())
        settings = {"protocol": PROTOCOL_VERSION, "cot": request.cot, "cfg_scale": request.guidance,
                    "abc_sampling": budgets.abc_sampling().to_dict(), "semantic_sampling": sem.to_dict(),
                    "ode_steps": steps, "ode_method": method, "model_dtype": str(self.ar.dtype).split(".")[-1],
                    "vae_dtype": "float32", "vae_decode": "halo_crop", "device": str(self.ar.device),
                    "checkpoint": self.info.to_dict(), "weights": self.weights}
        return Song(request=request, score=score, tokens=tokens, latents=latents, audio=audio, timing=timing,
                    settings=settings, warnings=request.input_warnings(getattr(score, "abc", None)) + plan_notes(score))


__all__ = ["Score", "SemanticTokens", "Song", "plan", "plan_notes", "semantic", "render", "decode", "music_budget",
           "Budgets",
           "YuE2Engine", "BudgetError"]
