"""YuE2 Composer: style + lyrics (+ an optional score) → ABC lead sheet → semantic music tokens (the AR expert)."""
from __future__ import annotations

from dataclasses import replace

import comfy.model_management as mm
from comfy_api.latest import io, ui
from comfy_execution.graph_utils import ExecutionBlocker

from yue2_core.constants import CONTEXT, DEFAULT_CFG, DEFAULT_SEED, FRAMES_PER_SECOND
from yue2_core.pipeline import Budgets, Score, music_budget, plan, plan_notes, semantic
from yue2_core.protocol import ABC_PRESET, SEED_MAX, SEMANTIC_PRESET, SongRequest, planning_prefix
from yue2_core.weights.checkpoint import is_synthetic

from . import inputs, memory, scores, takes, types
from .progress import StageProgress, busy_cpu_notes, check_cancel, check_switches, log, user_errors

# the whole context (983.04 s), as Regenerate's max_seconds and Continue's extra_seconds: the node says what really
# fits after the prompt (review, stop 44: 900, below the "room for 971.92 s" its own report stated)
MAX_SECONDS = CONTEXT / FRAMES_PER_SECOND
DEFAULT_MAX_SECONDS = 120.0  # this pack's default, a third of the release's 9,000-token (360 s) music budget


def _release(value, preset: str) -> str:
    """The tooltip sentence that names a sampling default and its source (runtime.md §2.1–2.2: the vendor runtime's
    `Sampling` presets, which the release uses)."""
    return f" Default {value:g}: the release's {preset} preset."


def _sampling_inputs() -> list:
    a, s = ABC_PRESET, SEMANTIC_PRESET
    abc, music = (lambda v: _release(v, "lead-sheet")), (lambda v: _release(v, "music"))
    return [
        io.Boolean.Input("sample_music", default=True, optional=True, label_on="score + music",
                         label_off="score only",
                         tooltip="Off: write the lead sheet only and stop (the tokens output is blocked) — for a "
                                 "first Composer whose score you edit before a second Composer samples the music."),
        io.Int.Input("max_abc_tokens", default=a.max_tokens, min=1, max=CONTEXT, optional=True,
                     tooltip=f"Budget of the lead sheet in tokens (default {a.max_tokens}, the release's). For "
                             "scale: the 16-bar example lead sheet, examples/text2music_lead_sheet.abc, is 364 "
                             "tokens. A score that reaches it is cut off (the report says so). Ignored when a score "
                             "is connected or cot is off."),
        io.Float.Input("abc_temperature", default=a.temperature, min=0.0, max=5.0, step=0.05, optional=True,
                       tooltip="Lead-sheet sampling temperature (0 = always the most likely token)."
                               + abc(a.temperature)),
        io.Float.Input("abc_top_p", default=a.top_p, min=0.01, max=1.0, step=0.01, optional=True,
                       tooltip="Lead-sheet nucleus sampling: keep the smallest set of tokens whose probability "
                               "sums to top_p." + abc(a.top_p)),
        io.Int.Input("abc_top_k", default=a.top_k, min=1, max=32768, optional=True,
                     tooltip="Lead-sheet sampling: keep the k most likely tokens." + abc(a.top_k)),
        io.Float.Input("abc_repetition_penalty", default=a.repetition_penalty, min=0.01, max=10.0, step=0.005,
                       optional=True, tooltip="Lead-sheet repetition penalty (1 = none), applied per repeat over "
                                              "the last abc_penalty_window tokens." + abc(a.repetition_penalty)),
        io.Int.Input("abc_penalty_window", default=a.penalty_window, min=1, max=100, optional=True,
                     tooltip="How many of the last lead-sheet tokens the repetition penalty looks at (tokens)."
                             + abc(a.penalty_window)),
        io.Float.Input("music_temperature", default=s.temperature, min=0.0, max=5.0, step=0.05, optional=True,
                       tooltip="Music (semantic token) sampling temperature (0 = most likely token)."
                               + music(s.temperature)),
        io.Float.Input("music_top_p", default=s.top_p, min=0.01, max=1.0, step=0.01, optional=True,
                       tooltip="Music sampling: nucleus probability mass kept." + music(s.top_p)),
        io.Int.Input("music_top_k", default=s.top_k, min=1, max=32768, optional=True,
                     tooltip="Music sampling: keep the k most likely codec tokens." + music(s.top_k)),
        io.Float.Input("music_repetition_penalty", default=s.repetition_penalty, min=0.01, max=10.0, step=0.005,
                       optional=True, tooltip="Music repetition penalty (1 = none) over the last "
                                              "music_penalty_window tokens." + music(s.repetition_penalty)),
        io.Int.Input("music_penalty_window", default=s.penalty_window, min=1, max=100, optional=True,
                     tooltip="How many of the last music tokens the repetition penalty looks at (tokens; "
                             "25 tokens = 1 second)." + music(s.penalty_window)),
        io.Float.Input("cfg_scale", default=-1.0, min=-1.0, max=20.0, step=0.01, optional=True,
                       tooltip=f"Classifier-free guidance of the music stage. −1 = auto: "
                               f"{DEFAULT_CFG['off']} for cot off, {DEFAULT_CFG['full']} for full/melody (the "
                               "release defaults). Any value ≠ 1 runs a second, unconditioned branch (twice the "
                               "compute and KV memory)."),
        # last, so that workflows saved before it existed keep their widget values in place
        io.Int.Input("candidates", default=1, min=1, max=types.MAX_CANDIDATES, optional=True,
                     tooltip="N songs sampled together in one batch (on a large GPU, N cost little more time "
                             "than one). Take i uses seed + i for its lead sheet, its music and (with the "
                             "Renderer's seed −1) its render (the report lists them). On a GPU, candidates 1 with "
                             "seed + i gives take i again, up to rounding (which can change a draw among "
                             "near-equal tokens); on a CPU, candidates 1 samples with another decoder and gives "
                             "another song for the same seed — Pick Take keeps the take itself. Memory ≈ N × one "
                             "song's token memory (its K/V cache: ≈ 0.11 MB per token, twice that with "
                             "cfg_scale ≠ 1, on the release model): when N does not fit, the node stops and says "
                             "the most that fit. The tokens output is then a batch of N takes: Renderer → VAE "
                             "Decode → YuE2 Pick Take chooses one. 1 = one song (as before)."),
    ]


class YuE2Composer(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="YuE2Composer",
            display_name="YuE2 Composer",
            category=types.CATEGORY,
            description="The AR expert (the half of the model that writes one token after another). Writes an "
                        "ABC lead sheet from style and lyrics (cot full: melody + chords; "
                        "melody: melody only; off: no lead sheet), then samples the song's semantic music tokens "
                        "(25 per second). With a score connected (from the ABC Editor, Load Song or another "
                        "Composer) or an ABC text connected (e.g. from SheetSage2), planning is skipped and that "
                        "score is used. The node shows the token budget, whether each phase ended on its own "
                        "end token or hit its budget, and tokens/s.",
            inputs=[
                types.Model.Input("model", tooltip="From YuE2 Checkpoint Loader."),
                io.String.Input("style", multiline=True, default="",
                                tooltip="Genre, instruments, voice, mood, tempo — everything musical. Not sung."),
                io.String.Input("lyrics", multiline=True, default="",
                                tooltip="Only the words to sing, with section tags like [Verse] and [Chorus]. "
                                        "Empty lyrics are NOT an instrumental switch (the model may still sing)."),
                io.Combo.Input("cot", options=["full", "melody", "off"], default="full",
                               tooltip="full: the model first writes a lead sheet with melody and chords; melody: "
                                       "melody only; off: no lead sheet (music directly from the text)."),
                io.Int.Input("seed", default=DEFAULT_SEED, min=0, max=SEED_MAX, control_after_generate=True,
                             tooltip="Seed of both the lead sheet and the music tokens (the Renderer reuses it "
                                     "by default). Same inputs + same seed = same song. Default "
                                     f"{DEFAULT_SEED}, the release's."),
                io.Float.Input("max_seconds", default=DEFAULT_MAX_SECONDS, min=1.0, max=float(MAX_SECONDS), step=1.0,
                               tooltip="Upper bound of the song length in seconds (25 music tokens per second). "
                                       "The song ends earlier when the model ends it. If lyrics + score leave less "
                                       "room in the 24,576-token context, the node fails and says the maximum. "
                                       f"Default {DEFAULT_MAX_SECONDS:g} s, this pack's (the release's music budget "
                                       f"is {SEMANTIC_PRESET.max_tokens:,} tokens = "
                                       f"{SEMANTIC_PRESET.max_tokens // FRAMES_PER_SECOND} s)."),
                types.Score.Input("score", optional=True,
                                  tooltip="A lead sheet to use instead of writing one (from YuE2 ABC Editor, YuE2 "
                                          "Load Song or another Composer). Its exact token ids are used unless its "
                                          "text was edited. Needs cot full or melody."),
                io.String.Input("abc_text", optional=True, force_input=True, multiline=True,
                                tooltip="A lead sheet as plain ABC text (a text node, SheetSage2 Audio to ABC, …) "
                                        "instead of writing one; tokenized verbatim. Needs cot full or melody."),
                *_sampling_inputs(),
            ],
            outputs=[
                types.Score.Output("score_out", display_name="score",
                                   tooltip="The lead sheet the music follows (cot off: an empty score)."),
                types.Tokens.Output("tokens", display_name="tokens",
                                    tooltip="Semantic music tokens, 25 per second, for YuE2 Renderer and YuE2 Save "
                                            "Song."),
                io.String.Output("abc", display_name="abc", tooltip="The lead sheet as ABC text (empty in cot off)."),
                io.String.Output("report", display_name="report",
                                 tooltip="Token budget, end-of-phase status and speed (also shown on the node)."),
            ],
        )

    @classmethod
    def execute(cls, model, style, lyrics, cot, seed, max_seconds, score=None, abc_text=None, sample_music=True,
                candidates=1, **sampling) -> io.NodeOutput:
        check_switches(model.device)
        # one music token at least (the widget starts at 1 s; direct callers use less)
        max_seconds = inputs.number("max_seconds", max_seconds, 1 / FRAMES_PER_SECOND, MAX_SECONDS)
        _refuse_conflicts(cot, score, abc_text, sample_music)
        if candidates != 1:
            return _execute_candidates(model, style, lyrics, cot, seed, max_seconds, score, abc_text, sample_music,
                                       candidates, sampling)
        tok = model.tokenizer
        request, abc_sampling, music_sampling, given, given_how = _prepare(model, style, lyrics, cot, seed,
                                                                           max_seconds, score, abc_text, sampling)
        if sample_music:
            _check_music_budget(request, given or Score(None, [], cot, seed, "none"), tok, max_seconds,
                                music_sampling.max_tokens, planned=given is None and cot != "off")
        progress = StageProgress("YuE2 Composer")
        notes = list(request.input_warnings(given.abc if given is not None else None))
        notes += _synthetic_note(model, request, given, abc_sampling.max_tokens,
                                 music_sampling.max_tokens if sample_music else 0)
        notes += busy_cpu_notes(model.device, "YuE2 Composer")
        on_cuda = model.device.type == "cuda"
        with user_errors():
            the_score = given or _plan(model, request, abc_sampling, music_sampling.max_tokens if sample_music else 0,
                                       progress)
            if not sample_music:
                check_cancel()
                budget = music_budget(request, the_score, tok)
                report = _report(request, the_score, None, budget, abc_sampling, music_sampling, given_how, notes)
                blocked = ExecutionBlocker("this YuE2 Composer has sample_music off ('score only'): it wrote the "
                                           "lead sheet but no music tokens; connect its score to a second Composer")
                return io.NodeOutput(the_score, blocked, the_score.abc or "", report, ui=ui.PreviewText(report))
            budget = _check_music_budget(request, the_score, tok, max_seconds, music_sampling.max_tokens,
                                         planned=False)
            rows = 1 if request.guidance == 1.0 else 2
            need = memory.ar_phase(model.dims, model.dtype, budget["prefix_tokens"], music_sampling.max_tokens, rows,
                                   on_cuda=on_cuda)
            progress.start("semantic", music_sampling.max_tokens,
                           f"sampling music tokens (≤ {music_sampling.max_tokens} = {max_seconds:g} s)")
            (ar,) = model.load(("ar",), need)
            tokens = semantic(ar, tok, request, the_score, music_sampling, progress)
            del ar
            mm.soft_empty_cache()
        check_cancel()
        notes += plan_notes(the_score)  # a lead sheet budget lowered so the music fits
        if the_score.abc and given is not None and the_score.source == "user":
            notes += scores.given_score_notes(the_score.abc, max_seconds, request.cot)  # the CLI's rule
        report = _report(request, the_score, tokens, budget, abc_sampling, music_sampling, given_how, notes)
        return io.NodeOutput(the_score, tokens, the_score.abc or "", report, ui=ui.PreviewText(report))


def _prepare(model, style, lyrics, cot, seed, max_seconds, score, abc_text, sampling):
    """The checked request, both phases' sampling settings and the given score (or None) with how it was given —
    shared by the single-song and the candidates paths. Engine errors become ValueErrors with their message."""
    model.check_protocol()
    with user_errors():
        cfg_scale = _cfg(sampling.get("cfg_scale", -1.0))
        request = SongRequest(style=style, lyrics=lyrics, cot=cot, seed=seed, cfg_scale=cfg_scale).validate()
        abc_sampling, music_sampling = _budgets(max_seconds, sampling)
        given, given_how = _given_score(score, abc_text, model.tokenizer, cot, seed)
    return request, abc_sampling, music_sampling, given, given_how


def _execute_candidates(model, style, lyrics, cot, seed, max_seconds, score, abc_text, sample_music, n: int,
                        sampling: dict) -> io.NodeOutput:
    """candidates = N > 1: N takes in one AR batch per phase (nodes/takes.py); tokens = a TakeBatch."""
    if type(n) is not int or not 1 <= n <= types.MAX_CANDIDATES:
        raise ValueError(f"candidates must be an integer in [1, {types.MAX_CANDIDATES}], got {n!r}")
    if not sample_music:
        raise ValueError(f"candidates = {n} needs sample_music on: 'score only' writes one lead sheet; set "
                         "candidates to 1 for a score-only Composer")
    request, abc_sampling, music_sampling, given, given_how = _prepare(model, style, lyrics, cot, seed, max_seconds,
                                                                       score, abc_text, sampling)
    tok = model.tokenizer
    progress = StageProgress("YuE2 Composer")
    notes = list(request.input_warnings(given.abc if given is not None else None))
    notes += _synthetic_note(model, request, given, abc_sampling.max_tokens, music_sampling.max_tokens)
    notes += busy_cpu_notes(model.device, "YuE2 Composer")
    with user_errors():
        batch = takes.compose_takes(model, request, given, n, abc_sampling, music_sampling, max_seconds, progress)
    check_cancel()
    first = batch.takes[0]
    budget = music_budget(replace(request, seed=first.seed), first.score, tok)
    report = _takes_report(request, batch, budget, abc_sampling, music_sampling, given_how, notes)
    return io.NodeOutput(first.score, batch, first.score.abc or "", report, ui=ui.PreviewText(report))


def _takes_report(request, batch, budget, abc_sampling, music_sampling, given: str, notes: list) -> str:
    n = len(batch)
    cfg = request.guidance
    seconds = batch.info.get("semantic_seconds", 0.0)
    total = sum(len(t.codes) for t in batch.takes)
    lines = [f"cot {request.cot} · seeds {batch.seeds[0]} … {batch.seeds[-1]} (seed + take) · cfg {cfg:g}"
             + (" (auto)" if request.cfg_scale is None else ""),
             f"candidates: {n} takes sampled in one batch"
             + (f" in {seconds:.1f} s ({total / seconds:.1f} music tok/s over the batch)" if seconds > 0 else ""),
             (f"prompt (take 0): {budget['prefix_tokens']} tokens before the music (lead sheet "
              f"{budget['score_tokens']}); room for {budget['music_seconds_max']:.2f} s of music in the "
              f"{CONTEXT}-token context")]
    if request.cot == "off":
        lines.append("lead sheets: none (cot off)")
    elif given:
        lines.append(f"lead sheet: given and shared by every take ({len(batch.takes[0].score.abc_ids)} ABC tokens, "
                     f"{given}; planning skipped)")
    else:
        lines.append(f"lead sheets: one per take (budget {abc_sampling.max_tokens} ABC tokens); the score and abc "
                     "outputs are take 0's — YuE2 Pick Take gives the picked take's")
    for i, t in enumerate(batch.takes):
        frames = len(t.codes)
        end = "ended on its end token" if t.ended else f"hit the `max_seconds` budget ({music_sampling.max_tokens})"
        sheet = ""
        if request.cot != "off" and not given:
            sheet = (f"; lead sheet {len(t.score.abc_ids)} ABC tokens"
                     + (" (cut off by `max_abc_tokens`)" if t.score.truncated else ""))
        lines.append(f"take {i}: seed {t.seed} · {frames} tokens = {frames / FRAMES_PER_SECOND:.2f} s; {end}{sheet}")
    lines += [f"warning: {note}" for note in notes]
    return _bullets(lines)


QUICK_ABC_TOKENS, QUICK_SECONDS = 64, 10  # a quick try on synthetic weights (docs/comfyui.md)


def _synthetic_note(model, request, given, abc_tokens: int, music_tokens: int) -> list[str]:
    """[a note, also logged before the work] for a synthetic checkpoint, whose random weights never end a phase by
    themselves — as the command line says it (review, stop 44: the shipped workflows on the tiny synthetic file ran
    4,096 + 3,000 tokens, minutes on a CPU, with nothing saying why)."""
    if not is_synthetic(model.info):
        return []
    plans = request.cot != "off" and given is None
    phases = [f"the lead sheet to {abc_tokens} tokens (`max_abc_tokens`)"] if plans else []
    phases += [f"the music to {music_tokens} tokens (`max_seconds`)"] if music_tokens else []
    if not phases:
        return []
    # advice only for a budget a quick try would lower (new-user finding, stop 45: "lower max_abc_tokens (≈ 64)"
    # was said at 32 tokens, and with a connected score, where no lead sheet is written)
    lower = [f"max_abc_tokens (≈ {QUICK_ABC_TOKENS})"] if plans and abc_tokens > QUICK_ABC_TOKENS else []
    lower += [f"max_seconds (≈ {QUICK_SECONDS})"] if music_tokens > QUICK_SECONDS * FRAMES_PER_SECOND else []
    note = ("synthetic (random) weights never end a lead sheet or the music on their own end token, so each phase "
            "runs to its budget: " + " and ".join(phases)
            + ("; for a quick try lower " + " and ".join(lower) if lower else ""))
    log.warning("[YuE2] YuE2 Composer: %s", note)
    return [note]


def _refuse_conflicts(cot, score, abc_text, sample_music) -> None:
    if score is not None and abc_text is not None:
        raise ValueError("both a score and an abc_text are connected; connect only one of them")
    if cot == "off" and (score is not None or abc_text is not None):
        raise ValueError("cot is off, which uses no lead sheet, but a score/abc_text is connected: choose cot "
                         "full or melody to use it, or disconnect it")
    if not sample_music and cot == "off":
        raise ValueError("cot off writes no lead sheet, so 'score only' has nothing to do: turn sample_music on "
                         "or choose cot full/melody")


def _cfg(value) -> float | None:
    """cfg_scale widget → the request's value: exactly −1 means auto (the mode default); any other negative value, NaN
    or ±inf is refused (ValueError) rather than silently turned into auto."""
    value = inputs.number("cfg_scale", value, 0.0, 20.0, auto=-1.0,
                          auto_means="auto: 1.01 in cot off, 1.0 otherwise")
    return None if value == -1 else value


def _budgets(max_seconds: float, sampling: dict):
    """(ABC sampling, music sampling) from the node's advanced inputs; a missing input keeps the preset value."""
    def pick(prefix: str, preset):
        return replace(preset, **{f: sampling[f"{prefix}_{f}"] for f in
                                  ("temperature", "top_p", "top_k", "repetition_penalty", "penalty_window")
                                  if f"{prefix}_{f}" in sampling})
    budgets = Budgets(max_seconds=max_seconds, max_abc_tokens=sampling.get("max_abc_tokens", ABC_PRESET.max_tokens),
                      abc=pick("abc", ABC_PRESET), semantic=pick("music", SEMANTIC_PRESET))
    return budgets.abc_sampling(), budgets.semantic_sampling()


def _given_score(score, abc_text, tok, cot: str, seed: int):
    """(the connected lead sheet as the music stage will read it, how it was taken) or (None, "")."""
    if score is not None:
        how = "edited text, tokenized here" if scores.needs_tokens(score) else "exact ids kept"
        return scores.tokenized(score, tok, cot), how
    if abc_text is not None:
        return Score.from_text(abc_text, tok, cot, seed), "ABC text, tokenized here"
    return None, ""


def _plan(model, request, abc_sampling, music_tokens: int, progress) -> Score:
    """The planning stage (cot off: the empty "none" score, no model work)."""
    tok = model.tokenizer
    if request.cot == "off":
        return plan(None, tok, request)
    prefix = len(planning_prefix(request, tok.encode))
    need = memory.ar_phase(model.dims, model.dtype, prefix, abc_sampling.max_tokens,
                           on_cuda=model.device.type == "cuda")
    progress.start("plan", abc_sampling.max_tokens,
                   f"writing the lead sheet (≤ {abc_sampling.max_tokens} ABC tokens after a {prefix}-token prompt)")
    (ar,) = model.load(("ar",), need)
    the_score = plan(ar, tok, request, abc_sampling, progress, music_tokens)
    del ar
    mm.soft_empty_cache()
    return the_score


def _check_music_budget(request, score, tok, max_seconds, music_tokens, planned: bool) -> dict:
    """music_budget(...) or ValueError saying the most seconds that fit after this prompt (and this score)."""
    budget = music_budget(request, score, tok)
    if music_tokens > budget["music_tokens_max"]:
        fit = budget["music_seconds_max"]
        what = ("after this prompt, before any lead sheet is written (the lead sheet takes more)" if planned else
                f"after this {budget['prefix_tokens']}-token prompt"
                + (f" (of which {budget['score_tokens']} are the lead sheet)" if budget["score_tokens"] else ""))
        over = budget["prefix_tokens"] + FRAMES_PER_SECOND - CONTEXT  # what to cut for one second of music
        raise ValueError(f"max_seconds = {max_seconds:g} s ({music_tokens} music tokens) does not fit the "
                         f"{CONTEXT}-token context: at most {fit:.2f} s ({budget['music_tokens_max']} tokens) fit "
                         f"{what}. " + (f"Lower max_seconds to {int(fit)} or less, or shorten the lyrics/style/score."
                                         if fit >= 1 else "Not even 1 s of music fits: the prompt alone is "
                                         f"{budget['prefix_tokens']:,} tokens; shorten the lyrics, style or score by "
                                         f"at least {over:,} tokens."))
    return budget


def _rate(timing: dict) -> str:
    seconds, rate = timing.get("seconds"), timing.get("tokens_per_second")
    return f" in {seconds:.1f} s ({rate:.1f} tok/s)" if seconds and rate else ""


def _report(request, score, tokens, budget, abc_sampling, music_sampling, given: str, notes: list) -> str:
    """The text shown on the node; `given` says how a connected score was used ("" when the node planned it)."""
    cfg = request.guidance
    lines = [f"cot {request.cot} · seed {request.seed} · cfg {cfg:g}"
             + (" (auto)" if request.cfg_scale is None else ""),
             (f"prompt: {budget['prefix_tokens']} tokens before the music (lead sheet {budget['score_tokens']}); "
              f"room for {budget['music_seconds_max']:.2f} s of music in the {CONTEXT}-token context")]
    if request.cot == "off":
        lines.append("lead sheet: none (cot off)")
    elif given:
        lines.append(f"lead sheet: given ({len(score.abc_ids)} ABC tokens, {given}; planning skipped)")
    else:
        end = (f"hit its budget of {abc_sampling.max_tokens} tokens (`max_abc_tokens`): the score is cut off"
               if score.truncated else "ended on its end token `</abc>`")
        lines.append(f"lead sheet: {len(score.abc_ids)} ABC tokens{_rate(score.timing)}; {end}")
    if score.truncated and given:
        lines.append("warning: this score was cut off by its planner's token budget")
    if tokens is None:
        lines.append("music: not sampled (`sample_music` off: score only)")
        lines += [f"warning: {n}" for n in notes]
        return _bullets(lines)
    frames = len(tokens.codes)
    end = (f"hit the `max_seconds` budget ({music_sampling.max_tokens} tokens)" if tokens.truncated
           else "ended on its end token")
    lines.append(f"music: {frames} tokens = {frames / FRAMES_PER_SECOND:.2f} s of "
                 f"{music_sampling.max_tokens / FRAMES_PER_SECOND:.2f} s allowed{_rate(tokens.timing)}; {end}")
    lines += [f"warning: {n}" for n in notes]
    return _bullets(lines)


def _bullets(lines: list[str]) -> str:
    """One "- " line per fact: plain text that also reads as a list where it is rendered as Markdown (ComfyUI's
    Preview as Text node)."""
    return "\n".join(f"- {line}" for line in lines)
