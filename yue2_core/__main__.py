"""Command line: `python -m yue2_core {generate,render,inspect,make-synthetic,batch} …` (see --help of each); its
parts live in `yue2_core/cli/`."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .cli.busy_cpu import _note_busy_cpu
from .cli.inspect_cmd import cmd_inspect
from .cli.options import _Parser, _named, parse_lora, parse_vae, plain_number, seconds, whole_number
from .cli.progress import ProgressLine
from .cli.song_weights import (_note_old_stack_rule, _note_replaced_vae, _recorded_checkpoint, _say_lora_int8,
                               _say_nar_linears,
                               _song_checkpoint, _song_lora_int8, _song_vendor_vae, _song_weights)
from .cli.text_input import _read_text
from .constants import DEFAULT_SEED, FRAMES_PER_SECOND
from .errors import YuE2Error


def _check_device(device: str) -> None:
    """--device must name a device torch has here: auto, cpu, cuda, cuda:N (N < device count), mps."""
    import torch
    if device == "auto":
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise YuE2Error(f"--device {device!r} is not a device name; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cpu" and dev.index is not None:  # cpu:0 too: the safetensors reader refuses it later
        raise YuE2Error(f"--device {device}: the CPU has no numbered devices; use --device cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise YuE2Error(f"--device {device}: no CUDA GPU is available here; use --device cpu (or auto)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise YuE2Error(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise YuE2Error(f"--device {device}: MPS is not available here; use --device cpu (or auto)")
    elif dev.type != "cpu":
        raise YuE2Error(f"--device {device}: only cpu, cuda and mps are supported")


def _load_engine(args, checkpoint=None, how=None, loras=None, vae=None, **load):
    """Find/load the checkpoint (with `loras` / `vae`, default: --lora / --vae; `load`: more `YuE2Engine.load`
    arguments) and say which file it is, what adapters were applied and whether its weights are synthetic
    (stderr)."""
    import torch
    from .pipeline import YuE2Engine
    if checkpoint is None:
        checkpoint, how = _find_checkpoint(args)
    print(f"checkpoint: {checkpoint} ({how})", file=sys.stderr)
    device = getattr(args, "device", "auto")
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        _note_busy_cpu()
    loras = args.lora if loras is None else loras
    vae = args.vae if vae is None else vae
    engine = YuE2Engine.load(checkpoint, device=args.device,
                             dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype], loras=loras, vae=vae,
                             **load)
    print(engine.info.summary(), file=sys.stderr)
    from .weights.own import carried
    patched = {(os.path.abspath(e[1]), e[2]) for m in (engine.ar, engine.nar) for e in carried(m) if e[0] == "lora"}
    for rec in engine.weights["loras"]:
        # an expert the file has no patch for (or at strength 0) is said as such (new-user finding, stop 40: an
        # AR-only file printed "NAR ×1")
        parts = [f"{e.upper()} ×{rec['strength_' + e]:g}" if (rec["path"], e) in patched else
                 f"{e.upper()} not patched" + (" (strength 0)" if rec["strength_" + e] == 0 else " (no patch for it)")
                 for e in ("ar", "nar")]
        print(f"LoRA: {rec['path']} ({rec['layout']}) {', '.join(parts)}", file=sys.stderr)
    for note in engine.notes:  # adapter keys that name no module: not applied
        print(f"warning: {note}", file=sys.stderr)
    if engine.weights["vae"]:
        print(f"VAE: {engine.weights['vae'].get('path')} ({engine.weights['vae'].get('variant', '?')})",
              file=sys.stderr)
    synthetic = "yue2_synthetic" in engine.info.metadata
    if synthetic:
        print("NOTE: these are SYNTHETIC random weights — the audio is noise-like, not music.", file=sys.stderr)
    return engine, synthetic


def _find_checkpoint(args) -> tuple[str, str]:
    """(checkpoint path, how it was found) for --checkpoint / $YUE2_CHECKPOINT / the usual search
    (`locate.find_checkpoint`; never a download with --offline). CheckpointError when none is found."""
    from .weights.locate import find_checkpoint
    checkpoint, how = find_checkpoint(args.checkpoint, download=not args.offline)
    if args.checkpoint and getattr(args, "checkpoint_how", None):
        how = args.checkpoint_how  # scripts/song.sh says which file it picked, not "given path"
    return checkpoint, how


def _warn_score(text: str, what: str, max_seconds: float | None = None, cot: str | None = None) -> None:
    """Print what the pack says of a user-supplied score (`protocol.score_notes`: the dialect check with the run's
    music budget, control characters). The score is used as given — the rule the Composer node follows too
    (docs/bad_inputs.md)."""
    import re
    from .protocol import score_notes
    notes = score_notes(text, max_seconds, cot=cot, duration_setting="--max-seconds")
    if not notes:
        return
    grouped: dict[str, list[str]] = {}  # one line per finding, its places gathered (new-user finding)
    for note in notes:  # "score line N column C: message" (one format everywhere, stop-50 leftover)
        m = re.match(r"score (line \d+(?: column \d+)?): (.*)", note, re.S)
        grouped.setdefault(m.group(2) if m else note, []).extend([m.group(1)] if m else [])
    print(f"warning: what the ABC check found in {what} (the score is used as written; the model reads any text):",
          file=sys.stderr)  # no count: a "N more …" line stands for many (new-user finding)
    for message, places in grouped.items():
        where = f"score {', '.join(places[:8])}{' …' if len(places) > 8 else ''}: " if places else ""
        print(f"  {where}{message.replace(' [error]', ' (error)').replace(' [warning]', '')}", file=sys.stderr)


SYNTHETIC_ABC_TOKENS = 256  # a random-weights lead sheet never ends; 256 tokens take seconds on a CPU


def _note_synthetic_music(max_tokens: int) -> None:
    """Say up front that random weights never end the music (no MUSIC_END is ever likely): a song without
    --max-seconds runs to its whole music budget (new-user finding: a batch on a CPU seemed to hang)."""
    print(f"NOTE: synthetic weights never end the music by themselves: without --max-seconds each song decodes its "
          f"whole music budget (up to {max_tokens:,} tokens = {max_tokens / FRAMES_PER_SECOND:g} s of audio; on a CPU "
          "≈ 33–85 tokens/s with the tiny model on 2 cores, i.e. minutes a song); --max-seconds 2 makes a quick test",
          file=sys.stderr)


def _check_switches(device: str | None = None) -> None:
    """Every YUE2_* environment switch checked before any work (`switch_check.check_environment`): RequestError naming
    a bad value; its warnings (an unknown YUE2_ variable, a GPU-only switch on a CPU run) printed to stderr."""
    from .switch_check import check_environment
    for warning in check_environment(device):
        print(f"warning: {warning}", file=sys.stderr)


def _check_budget_fits(max_seconds, max_abc_tokens) -> None:
    """Budgets no prompt can leave room for, refused before loading: even the shortest prompt takes tokens of the
    24,576-token context (BudgetError with the most that can fit); a --max-seconds below half a frame gets a note
    (it is rounded up to one frame, 0.04 s)."""
    from .constants import CONTEXT
    from .errors import BudgetError
    if type(max_abc_tokens) is int and max_abc_tokens > CONTEXT - 2:
        raise BudgetError(f"--max-abc-tokens {max_abc_tokens:,} cannot fit the {CONTEXT}-token context (the prompt "
                          "comes first, and the music after the score); lead sheets are a few hundred to ~4,096 "
                          "tokens (the release budget)")
    if max_seconds is not None:
        from .protocol import seconds_to_tokens
        tokens = seconds_to_tokens(max_seconds)
        if tokens > CONTEXT - 4:
            raise BudgetError(f"--max-seconds {max_seconds:g} is {tokens:,} music tokens: more than the {CONTEXT}-"
                              f"token context holds with any prompt (at most {(CONTEXT - 4) / FRAMES_PER_SECOND:.2f} "
                              "s, less the prompt and the score)")
        if max_seconds * FRAMES_PER_SECOND < 0.5:  # rounds to no frame: one is made (seconds_to_tokens' minimum)
            print(f"note: --max-seconds {max_seconds:g} is less than half a music frame (a frame is 1/"
                  f"{FRAMES_PER_SECOND} s = {1 / FRAMES_PER_SECOND:g} s); the song gets the minimum, one frame "
                  f"({1 / FRAMES_PER_SECOND:g} s of audio)", file=sys.stderr)


def _int_or_none(value):
    """A recorded seed as an int (a song's request.json holds a JSON integer; anything else: None)."""
    return value if type(value) is int else None


def _say_where(folder, synthetic: bool = False) -> None:
    """The last lines of a run: the song folder and its audio file (stderr, after the JSON summary on stdout), after
    the synthetic-weights note again when the model was synthetic (new-user review 58: the note came only before the
    progress lines, hundreds of lines up in a log, and the last lines named an audio file to play)."""
    sys.stdout.flush()
    folder = Path(folder).resolve()
    if synthetic:
        print("NOTE: made with SYNTHETIC random weights — this audio is noise-like, not music (README, \"Read this "
              "first\")", file=sys.stderr)
    print(f"song folder: {folder}", file=sys.stderr)
    if (folder / "audio.flac").is_file():
        print(f"audio: {folder / 'audio.flac'}", file=sys.stderr)


def cmd_generate(args) -> int:
    from .artifacts import reserve_output, save_song
    from .pipeline import Budgets
    from .protocol import SongRequest

    out = _check_output(args.output)
    _check_device(args.device)
    _check_switches(args.device)
    claim = _DONE["claim"] = reserve_output(out)  # a second run with the same --output stops here, not after
    # computing a song (released after the save, or by main when the command ends otherwise)
    if claim.note:  # a file system that takes no locks: no claim
        print(f"warning: {claim.note}", file=sys.stderr)
    notes = []
    request = SongRequest(style=_read_text(args.style_file, args.style, "style", notes),
                          lyrics=_read_text(args.lyrics_file, args.lyrics, "lyrics", notes), cot=args.cot,
                          seed=args.seed, abc=_read_text(args.abc_file, None, "ABC", notes) if args.abc_file else None,
                          cfg_scale=args.cfg_scale, id=_song_id(out)).validate()
    budgets = Budgets(args.max_seconds, args.max_abc_tokens)
    budgets.abc_sampling(), budgets.semantic_sampling()  # bad --max-seconds / --max-abc-tokens: fail before loading
    _check_budget_fits(args.max_seconds, args.max_abc_tokens)
    _check_steps(args.steps)
    _check_room(out, budgets.semantic_sampling().max_tokens, "--max-seconds")
    for note in notes + request.input_warnings():
        print(f"warning: {note}", file=sys.stderr)
    if request.abc is not None:
        _warn_score(request.abc, "--abc-file", budgets.semantic_sampling().max_tokens / FRAMES_PER_SECOND,
                    cot=request.cot)
        if args.max_abc_tokens is not None:  # new-user review, stop 50: ignored without a word
            print("warning: --max-abc-tokens has no effect with --abc-file: the given lead sheet is used as it is, "
                  "no ABC is sampled", file=sys.stderr)
    engine, synthetic = _load_engine(args)
    if synthetic and args.max_seconds is None:
        _note_synthetic_music(budgets.semantic_sampling().max_tokens)
    if synthetic and args.max_abc_tokens is None and request.cot != "off" and request.abc is None:
        budgets.max_abc_tokens = SYNTHETIC_ABC_TOKENS
        print(f"NOTE: synthetic weights never end a lead sheet by themselves: it is capped at {SYNTHETIC_ABC_TOKENS} "
              "ABC tokens (the release budget, 4,096, takes minutes on a CPU); --max-abc-tokens sets another cap",
              file=sys.stderr)
    progress = ProgressLine()
    song = engine.generate(request, budgets, steps=args.steps, progress=progress, method=args.ode_method)
    progress.close()
    from .pipeline import plan_notes
    for note in plan_notes(song.score):
        print(f"warning: {note}", file=sys.stderr)
    folder = save_song(song, out, on_saved=_saved)  # an interrupt from the rename on cancels nothing (main)
    claim.release()
    summary = {"output": str(Path(folder).resolve()), "seed": request.seed,
               "audio_seconds": round(song.audio.shape[-1] / song.sample_rate, 3),
               "semantic_tokens": len(song.tokens.codes), "abc_tokens": len(song.score.abc_ids),
               "truncated": song.truncated, "truncated_means": "the phase hit its token budget before its end token",
               "synthetic_weights": synthetic,
               "timing_s": {k: round(v, 3) for k, v in song.timing.items()}}
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    _say_where(folder, synthetic)
    return 0


def _check_room(out, music_tokens: int, lower: str | None) -> None:
    """Before any work: refuse a song whose audio.flac cannot be written under this process's file-size limit
    (`ulimit -f`: "File too large" at the save, after the song was computed — stop-47 review), and warn when the
    output's disk has less free space than the song may take (`artifacts.check_song_room`, which YuE2 Regenerate
    and Continue call too). `music_tokens`: the song's length (its budget, or the saved tokens' count); `lower`: the
    option that shortens it (None: fixed)."""
    from .artifacts import check_song_room
    note = check_song_room(Path(out).absolute().parent, music_tokens, lower)
    if note:
        print(f"warning: {note}", file=sys.stderr)


def _check_output(output: str) -> Path:
    """The output directory must be new or empty (songs are never overwritten), a folder of its own (not "" or ".",
    not a mount point: `artifacts.check_output_dir`) and its parent writable (a test folder is made and removed
    there); checked before any work. Raises YuE2Error saying which; a long path is quoted by its start and end
    (`errors.quoted`, as a batch row's abc_path: a 6,000-character --output was quoted whole, stop 46)."""
    from .artifacts import batch_folder_above, check_output_dir, song_folder_above
    from .errors import quoted
    from .protocol import RESERVED_NAMES
    out = Path(output)
    shown = quoted(out, quote=False)
    try:
        if out.is_symlink():
            raise YuE2Error(f"--output {shown} is a symbolic link; give the path of a new folder")
        if out.name.split(".")[0].upper() in RESERVED_NAMES:
            raise YuE2Error(f"--output {shown}: {out.name} is a reserved device name on Windows; songs keep names "
                            "that copy everywhere")
        if out.exists() and not out.is_dir():
            raise YuE2Error(f"--output {shown} is a file, not a folder; a song is saved as a new folder of its own "
                            "(give a new path, e.g. songs/my-song)")
        if out.exists() and any(out.iterdir()):
            raise YuE2Error(f"output directory {shown} exists and is not empty; choose a new one")
        batch = batch_folder_above(out)
        if batch is not None:  # break-it finding: a running batch then lost that song (stop 42: at any depth)
            raise YuE2Error(f"--output {shown} is inside a batch output folder ({quoted(batch, quote=False)} holds "
                            "batch.json): the batch command writes its songs there, one folder per request id; give "
                            "a path outside it")
        song = song_folder_above(out)
        if song is not None:  # break-it review 52: the new song was written inside another song's folder
            raise YuE2Error(f"--output {shown} is inside the song folder {quoted(song, quote=False)} (it holds "
                            "result.json): a song folder holds only its own files, and a song inside it is hidden "
                            "from every song list and deleted with it — give a folder outside it")
        out = check_output_dir(output)  # "", ".", a mount point: refused before any work
        shown = quoted(out, quote=False)
        parent = out.absolute().parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise YuE2Error(f"cannot create {shown}: {quoted(parent, False)} is not a writable folder")
        try:  # os.access can say yes where a write fails (read-only mounts seen by root, ACLs, quotas, FUSE)
            import tempfile
            os.rmdir(tempfile.mkdtemp(prefix=".yue2-write-test.", dir=parent))
        except OSError as exc:
            raise YuE2Error(f"cannot create {shown}: a test folder in {quoted(parent, False)} could not be made "
                            f"({exc.strerror or exc})") from None
    except OSError as exc:  # a name too long for the file system, a path through a file, …
        raise YuE2Error(f"cannot use --output {quoted(output, quote=False)}: {exc.strerror or exc}") from None
    return out


def _song_id(out: Path) -> str:
    """The song id recorded in the song: the output folder's name when it is a valid id, else "song" (any folder
    name the file system takes is fine for --output)."""
    from .artifacts import valid_song_id
    return out.name if out.name and valid_song_id(out.name) else "song"


def _check_steps(steps) -> None:
    from .constants import MAX_ODE_STEPS
    from .errors import RequestError
    if not 1 <= steps <= MAX_ODE_STEPS:
        raise RequestError(f"--steps must be between 1 and {MAX_ODE_STEPS} (the release uses 32), got {steps}")


def _render_seconds(given: float | None, parent_sampling: dict) -> float | None:
    """--max-seconds of a re-render that samples new tokens: the given value, else the parent song's own music budget
    (its max_tokens / 25, as result.json records it), else the release budget."""
    if given is not None:
        return given
    cap = parent_sampling.get("max_tokens") if isinstance(parent_sampling, dict) else None
    return cap / FRAMES_PER_SECOND if type(cap) is int and cap >= 1 else None


def cmd_render(args) -> int:
    import time
    from .artifacts import load_song, save_song
    from .errors import RequestError
    from .constants import PROTOCOL_VERSION
    from .pipeline import Budgets, Song, decode, render, semantic
    from .protocol import SongRequest

    from .artifacts import with_tokenizer
    _check_output(args.output)
    _check_not_inside(args.output, args.song)
    _check_device(args.device)
    _check_switches(args.device)
    from .artifacts import reserve_output
    claim = _DONE["claim"] = reserve_output(args.output)  # a second run with the same --output stops here
    if claim.note:  # a file system that takes no locks: no claim
        print(f"warning: {claim.note}", file=sys.stderr)
    if args.steps is not None:
        _check_steps(args.steps)
    from .protocol import SEED_MAX
    if args.seed is not None and not 0 <= args.seed <= SEED_MAX:  # before loading, as generate's (break-it)
        raise RequestError(f"--seed must be an integer in [0, {SEED_MAX}], got {args.seed}")
    Budgets(args.max_seconds).semantic_sampling()  # a bad --max-seconds fails before loading
    _check_budget_fits(args.max_seconds, None)
    saved = load_song(args.song, edited_ok=True, audio_ok=True)  # the song folder checked before any checkpoint is
    # looked for; its audio.flac is not read (a tag editor's rewrite, a file moved away: stop-47 review)
    if saved.audio_changed in ("missing", "changed"):  # "tagged": the saved samples, nothing to say
        how = ("is missing" if saved.audio_changed == "missing"
               else "has changed since the song was saved (a tag editor?)")
        print(f"note: {Path(args.song) / 'audio.flac'} {how}; render does not use it: the music tokens, score and "
              "latents it renders from verify", file=sys.stderr)
    if saved.config.get("audio_source") == "given":  # Save Song of audio that is not the decode (stop-47 review)
        print(f"note: {Path(args.song) / 'audio.flac'} was saved as given (processed or made by another node, "
              "config.json audio_source \"given\"), not as the decode of the song's latents: render makes the audio "
              "from the music tokens, without what was done to it", file=sys.stderr)
    if args.steps is None or args.ode_method is None:  # the song's own render settings: unchanged, the same audio
        from .constants import ODE_STEPS
        args.steps = saved.config.get("ode_steps") or ODE_STEPS if args.steps is None else args.steps
        args.ode_method = saved.config.get("ode_method") or "midpoint" if args.ode_method is None else args.ode_method
        print(f"render: {args.steps} ODE steps, {args.ode_method} (the song's own unless given; --steps / "
              "--ode-method change them)", file=sys.stderr)
    stray = Path(args.song) / "score.abc"
    if "score.abc" not in saved.result.get("artifacts", {}) and (stray.exists() or stray.is_symlink()):
        print(f"warning: {stray} is not part of this song (it was made with cot off, without a lead sheet), so render "
              "does not read it; to make a song from that score: generate --abc-file "
              f"{stray} with the song's style and lyrics", file=sys.stderr)
    resample = saved.score_edited or args.seed is not None
    edit = saved.config.get("edit")
    if isinstance(edit, dict) and not resample:  # break-it: the re-render of a spliced song differed without a word
        cut = edit.get("cut_seconds")
        at = f"{cut:.2f} s" if type(cut) in (int, float) else "the cut"
        print(f"warning: this song was made by {edit.get('operation') or 'an edit'} of "
              f"{edit.get('parent') or 'another song'}: its audio.flac keeps that song's render up to {at} and "
              "crossfades into a new render; render makes one fresh render of all its music tokens (the same "
              "tokens), so the audio before the cut will differ from its audio.flac", file=sys.stderr)
    if args.max_seconds is not None and not resample:
        raise RequestError("--max-seconds only applies when new music tokens are sampled (with --seed or an edited "
                           "score.abc); without them the saved tokens are re-rendered exactly as they are")
    _check_room(args.output, Budgets(_render_seconds(args.max_seconds, saved.tokens.sampling)).semantic_sampling()
                .max_tokens if resample else len(saved.tokens.codes), "--max-seconds" if resample else None)
    # the checkpoint: --checkpoint, else the one the song records (when it still exists), else $YUE2_CHECKPOINT and
    # the usual search (new-user finding: $YUE2_CHECKPOINT used to win over the song's own file)
    recorded = None if args.checkpoint else _song_checkpoint(args.song, saved.config)
    env = os.environ.get("YUE2_CHECKPOINT", "").strip()
    if recorded and env and os.path.realpath(env) != os.path.realpath(recorded):
        print(f"note: rendering with the checkpoint the song records ({recorded}), not $YUE2_CHECKPOINT ({env}); "
              "--checkpoint picks another file", file=sys.stderr)
    if not (args.checkpoint or recorded):
        gone = _recorded_checkpoint(args.song, saved.config)
        print(f"warning: the checkpoint recorded in {args.song}/config.json "
              f"{f'({gone}) is gone' if gone else 'is missing'}; looking for a YuE2 checkpoint elsewhere — it must "
              "be the same model: pass --checkpoint with that model's file where it lies now", file=sys.stderr)
    loras, vae = _song_weights(args, saved.config)
    checkpoint, how = (recorded, "recorded in the song's config.json") if recorded else _find_checkpoint(args)
    # a vendor folder's VAE: the one the song was decoded with, not the one the folder prefers now (break-it, stop 40)
    vendor_vae = _song_vendor_vae(saved.config.get("checkpoint"), checkpoint) if vae is None else None
    engine, synthetic = _load_engine(args, checkpoint, how, loras=loras, vae=vae, vendor_vae=vendor_vae,
                                     lora_int8=_song_lora_int8(saved.config.get("weights")))
    _say_lora_int8(saved.config.get("weights"), (engine.weights or {}).get("lora_int8"))
    _say_nar_linears(saved.config.get("weights"), (engine.weights or {}).get("nar_linears"))
    if not args.lora and not args.no_lora:  # the song's own stack: a rule older than the song's record?
        _note_old_stack_rule(saved.config.get("weights"), getattr(engine, "old_rule", []), loras)
    if args.vae:
        _note_replaced_vae(saved.config, engine.weights.get("vae") or {}, args.vae)
    if not args.lora and not args.no_lora:  # the song's own adapters, read again: the same files as when it was made
        from .weights.lora.record import check_reread, recorded_weights
        song_loras, _ = recorded_weights(saved.config.get("weights"))
        check_reread([rec for rec, _, _ in song_loras], (engine.weights or {}).get("loras") or [])
    saved = with_tokenizer(saved, engine.tokenizer)
    from .edit import check_checkpoint
    for warning in check_checkpoint(saved.config.get("checkpoint"), engine.info,  # another model: refused
                                    checkpoint_vae=not engine.weights.get("vae")):
        print(f"warning: {warning}", file=sys.stderr)
    if saved.score_edited:
        _warn_score(saved.score.abc or "", "edited score.abc",
                    Budgets(_render_seconds(args.max_seconds, saved.tokens.sampling)).semantic_sampling().max_tokens
                    / FRAMES_PER_SECOND, cot=saved.tokens.request.get("cot"))
    req = saved.tokens.request
    request = SongRequest(style=req["style"], lyrics=req["lyrics"], cot=req["cot"],
                          seed=args.seed if args.seed is not None else int(req["seed"]),
                          abc=saved.score.abc if saved.score_edited else None, cfg_scale=req.get("cfg_scale"),
                          id=_song_id(Path(args.output))).validate()
    progress = ProgressLine()
    tokens = saved.tokens
    timing = {}
    t = time.perf_counter()
    if resample:
        if saved.score_edited:
            print("score.abc was edited: sampling new music tokens for it", file=sys.stderr)
        elif args.seed == _int_or_none(req.get("seed")):  # new-user review 58: "new seed" for the song's own seed
            print(f"note: --seed {args.seed} is this song's own seed: sampling its music tokens again gives the "
                  "song's own tokens where it was made (the same device and weights); another --seed gives new "
                  "music", file=sys.stderr)
        else:
            print("new seed: sampling new music tokens", file=sys.stderr)
        if _render_seconds(args.max_seconds, saved.tokens.sampling) is None:  # break-it: silently 9,000 tokens
            cap = Budgets(None).semantic_sampling().max_tokens
            print(f"note: the song records no music budget (result.json semantic.sampling); sampling up to the "
                  f"release's {cap:,} tokens ({cap // FRAMES_PER_SECOND} s) — --max-seconds sets one", file=sys.stderr)
        tokens = semantic(engine.ar, engine.tokenizer, request, saved.score,
                          Budgets(_render_seconds(args.max_seconds, saved.tokens.sampling)).semantic_sampling(),
                          progress)
        timing["semantic_seconds"] = time.perf_counter() - t
        t = time.perf_counter()
    latents = render(engine.ar, engine.nar, tokens, args.steps, progress=progress, method=args.ode_method)
    timing["render_seconds"] = time.perf_counter() - t
    t = time.perf_counter()
    audio = decode(engine.vae, latents, progress=progress)
    timing["decode_seconds"] = time.perf_counter() - t
    progress.close()
    parent = str(Path(saved.path).absolute())  # absolute: the lineage points at the parent from any folder
    own = {k: v for k, v in saved.config.items() if k != "audio_source"}  # this render's audio is the decode
    settings = {**own, "rendered_from": parent, "protocol": PROTOCOL_VERSION,
                "cfg_scale": request.guidance, "ode_steps": args.steps, "ode_method": args.ode_method,
                "model_dtype": str(engine.ar.dtype).split(".")[-1], "vae_dtype": "float32", "vae_decode": "halo_crop",
                "device": str(engine.ar.device), "checkpoint": engine.info.to_dict(), "weights": engine.weights}
    if resample:  # the music tokens' sampling is this run's; otherwise the parent's tokens (and record) stay
        settings["semantic_sampling"] = tokens.sampling if tokens.sampling else settings.get("semantic_sampling")
    song = Song(request=request, score=tokens.score, tokens=tokens, latents=latents, audio=audio, timing=timing,
                settings=settings)
    # "parent_score_edited": the parent's score.abc was edited, so this song's music was sampled for that edit (was
    # "score_edited", which `inspect` showed beside the song's own, opposite-looking score_edited: stop 40 review)
    folder = save_song(song, args.output, lineage={"parent": parent, "parent_score_edited": saved.score_edited},
                       on_saved=_saved)  # an interrupt from the rename on cancels nothing (main)
    claim.release()
    print(json.dumps({"output": str(Path(folder).resolve()), "seed": request.seed,
                      "semantic_tokens": len(tokens.codes),
                      "resampled": resample, "audio_seconds": round(audio.shape[-1] / song.sample_rate, 3),
                      "synthetic_weights": synthetic, "timing_s": {k: round(v, 3) for k, v in timing.items()}},
                     indent=2, ensure_ascii=False))
    _say_where(folder, synthetic)
    return 0


def _check_not_inside(output: str, song: str) -> None:
    """A run never writes its output inside the song folder it reads (nor over it)."""
    try:
        out, src = Path(output).resolve(), Path(song).resolve()
    except (OSError, RuntimeError):
        return
    if (out == src or src in out.parents) and (src / "result.json").is_file():  # not a song: load_song says so
        from .errors import quoted
        raise YuE2Error(f"--output {quoted(output, False)} is inside the song folder {quoted(song, False)} that "
                        "render reads; a song folder holds only its own files — give a folder outside it")


def cmd_make_synthetic(args) -> int:
    from .errors import RequestError
    from .protocol import SEED_MAX
    from .weights.synthetic import write_synthetic_checkpoint
    if not 0 <= args.seed <= SEED_MAX:  # the range every --seed takes (stop 42: -1 — "random" in ComfyUI — and
        # 10**23 were accepted; the weights hash the seed, so any integer gave some file, never a random one)
        raise RequestError(f"--seed must be an integer in [0, {SEED_MAX}], got {args.seed}")
    from .weights.synthetic import refuse_special
    if not args.output.strip():  # break-it review, stop 48: '' was called "a folder" (pathlib reads it as ".")
        raise YuE2Error(f"--output {args.output!r} names no file (an unset shell variable?); give the path of the "
                        ".safetensors file to write")
    try:  # Python 3.11's pathlib raises for a name too long or a folder without permission (break-it finding)
        if Path(args.output).is_dir():
            raise YuE2Error(f"--output {args.output} is a folder; give the path of the .safetensors file to write")
        if args.output.endswith(("/", os.sep)):  # was "cannot write X/: Not a directory"
            raise YuE2Error(f"--output {args.output} ends in '/', so it names a folder; give the path of the "
                            f".safetensors file to write, e.g. {args.output}yue2_{args.profile}_{args.format}"
                            ".safetensors")
        special = refuse_special(args.output)  # even with --force: it would replace a device node (/dev/null)
        if special:
            raise YuE2Error(special)
        parent = next((p for p in Path(args.output).absolute().parents if p.exists() or p.is_symlink()), None)
        if parent is not None and not parent.is_dir():  # break-it: "cannot write …: File exists"
            raise YuE2Error(f"--output {args.output}: {parent} is a file, not a folder; give a path in a folder")
        if (Path(args.output).exists() or Path(args.output).is_symlink()) and not args.force:
            raise YuE2Error(f"--output {args.output} exists; a synthetic checkpoint (random weights) never replaces "
                            "a file unless --force is given")
        # the first folder of the path that does not exist yet: the writer creates it (new-user finding, stop 45:
        # `../../models/checkpoints/…` run inside a pack folder that is a symbolic link made /models/checkpoints
        # without a word, and ComfyUI never listed the file)
        missing = next((p for p in reversed(Path(args.output).absolute().parents) if not p.exists()), None)
    except OSError as exc:
        shown = args.output if len(args.output) <= 120 else args.output[:100] + "…"
        raise YuE2Error(f"--output {shown}: cannot use this path ({exc.strerror or exc})") from None
    try:
        report = write_synthetic_checkpoint(args.output, profile=args.profile, fmt=args.format, seed=args.seed)
    except OSError as exc:
        from .artifacts import file_size_hint
        raise YuE2Error(f"cannot write {args.output}: {exc.strerror or exc}{file_size_hint(exc)}") from None
    print(json.dumps(report, indent=2, default=str))
    if missing is not None:
        print(f"note: created the folder {missing.resolve()}, which did not exist, for {Path(report['path']).name}; "
              "for ComfyUI the file belongs in its models/checkpoints folder", file=sys.stderr)
    return 0


def cmd_batch(args) -> int:
    """`batch REQUESTS.jsonl --output DIR`: many songs, their AR phases decoded together (yue2_core/batch,
    docs/batch.md). Exit status 0 when every row completed, 1 when any failed, 2 for a problem of the whole batch."""
    import torch
    from .batch import BatchOptions, run_batch
    from .batch.memory import weights_bytes
    from .candidates import device_free_bytes
    from .pipeline import Budgets
    from .weights.checkpoint import inspect_checkpoint, load_tokenizer
    from .weights.locate import find_checkpoint
    if not args.output.strip():  # `--output "$UNSET"` ran the batch in the current folder (break-it, stop 32)
        raise YuE2Error(f"--output {args.output!r} names no folder (an unset shell variable?); give the batch's "
                        "folder, e.g. runs/album")
    from .artifacts import check_name_limits
    check_name_limits(args.output)  # a name over NAME_MAX: the limit said now (was: a traceback from the claim)
    if args.ray is None:
        _check_device(args.device)
        if args.ray_cpu_workers is not None:
            raise YuE2Error("--ray-cpu-workers needs --ray auto|ADDRESS (it sets how many CPU engine actors Ray runs)")
    else:  # Ray installed, a well-formed address, a --device the actors can honour (before any other work)
        from .batch.ray_runner import check_options
        check_options(args.ray, args.ray_cpu_workers, args.device)
    _check_switches(args.device if args.ray is None else None)
    _check_steps(args.steps)
    Budgets(args.max_seconds, args.max_abc_tokens).semantic_sampling()  # bad caps fail before loading
    Budgets(args.max_seconds, args.max_abc_tokens).abc_sampling()
    _check_budget_fits(args.max_seconds, args.max_abc_tokens)
    # a problem of the whole request file (missing, not UTF-8, no request) is the error before the checkpoint search,
    # which may download 3.7 GB (new-user review 57: `batch nope.jsonl` tried the download first); its rows decide
    # the synthetic notes below (new-user / break-it findings: notes for caps no row reaches)
    from .batch.requests import read_requests
    rows, _ = read_requests(args.requests)
    checkpoint, how = find_checkpoint(args.checkpoint, download=not args.offline)
    # with --vae, a vendor folder's own VAE is not looked for (it may have none: new-user review, stop 46)
    info = inspect_checkpoint(checkpoint, own_vae="skip" if args.vae else "required")
    stack, vae_cfg = [], info.vae
    if args.lora or args.vae:  # own weights checked before batch.json is written (else a rerun needs --resume);
        # the engine reads the adapters again when it loads: once per batch, the price of failing before any output
        from .weights.lora.apply import Applied
        from .weights.lora.layouts import read_adapter
        stack = [Applied(read_adapter(path, info.dims), a, n) for path, a, n in args.lora]
        if args.vae:
            from .weights.vae_files import open_vae
            vae_cfg = open_vae(args.vae).config
    synthetic = "yue2_synthetic" in info.metadata
    abc_cap = args.max_abc_tokens
    if abc_cap is None and synthetic:
        abc_cap = SYNTHETIC_ABC_TOKENS  # as generate: random weights never end a lead sheet
        if any(r.request.cot != "off" and r.request.abc is None
               and r.budgets.abc_sampling().max_tokens > SYNTHETIC_ABC_TOKENS for r in rows):
            print(f"NOTE: synthetic weights never end a lead sheet by themselves: each one the model writes is capped "
                  f"at {SYNTHETIC_ABC_TOKENS} tokens (--max-abc-tokens sets another cap)", file=sys.stderr)
    if synthetic and args.max_seconds is None:
        largest = max((r.budgets.semantic_sampling().max_tokens for r in rows), default=0)
        if largest > 10 * FRAMES_PER_SECOND:
            _note_synthetic_music(largest)
    fp32 = args.dtype == "fp32"
    from .batch.driver import vendor_vae_record
    from .weights.lora.apply import int8_mode, reaches_int8
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    # the NAR keeps int8 layers only on a CPU (Ray: CPU actors with --ray-cpu-workers, else one GPU each), or on a
    # GPU with YUE2_NAR_LINEARS=w8a8 in bf16 (`nar.prepare_linears`; stop-48 diff review: a NAR-only LoRA recorded
    # no mode there, so a --resume under the other YUE2_LORA_INT8 mixed songs of both). Ray's GPUs are the workers',
    # not this process's: any of them may keep them (`nar.may_keep_int8`, stop-53 review). "auto" (the default) gives
    # adapters the bf16 layers (`nar.adapters_want_bf16`), so for them the NAR is float on any GPU
    from .nar import auto_mode, keeps_int8, may_keep_int8
    nar_dtype = torch.float32 if fp32 else torch.bfloat16
    nar_float = (args.ray_cpu_workers is None and (auto_mode() or not may_keep_int8(nar_dtype))) \
        if args.ray is not None else device.type == "cuda" and (auto_mode() or not keeps_int8(nar_dtype, device))
    # how this run's NAR multiplies, as each song records it (a --resume notes another: driver._nar_linears_note);
    # under Ray the workers' GPUs decide, so none is recorded
    nar_linears = {} if args.ray is not None else {"nar_linears": "w8a8" if device.type == "cuda" and info.quant_nar
                                                   and keeps_int8(nar_dtype, device) and not (
                                                       auto_mode() and reaches_int8(info, stack, False, ("nar",)))
                                                   else None}
    options = BatchOptions(args.requests, args.output, args.max_batch, args.budget, args.resume, args.steps,
                           args.max_seconds, abc_cap, overlap=args.overlap, method=args.ode_method,
                           continuous=args.continuous,
                           run={"checkpoint": os.path.abspath(checkpoint), "device": args.device, "dtype": args.dtype,
                                "loras": [[os.path.abspath(p), a, n] for p, a, n in args.lora],
                                "vae": os.path.abspath(args.vae) if args.vae else None,
                                # how LoRAs go onto int8 layers (YUE2_LORA_INT8): recorded when they reach one
                                # (stop 41: not for adapters on float layers only); a --resume compares it
                                "lora_int8": int8_mode() if reaches_int8(info, stack, nar_float) else None,
                                "vendor_vae": vendor_vae_record(info, args.vae), **nar_linears})
    shape = {}  # the batch decoder's rows, known once run_batch sized the batch: the warm-up compiles its kernels
    vendor_vae = options.run["vendor_vae"]  # the VAE folder batch.json records is the one the engines decode with
    kw = dict(tokenizer=load_tokenizer(info), dims=info.dims, engine_factory=lambda: _load_engine(
              args, checkpoint, how, batch_rows=shape.get("rows", 0), batch_refill=shape.get("refill", False),
              vendor_vae=vendor_vae["path"] if vendor_vae else None)[0],
              weights_bytes=weights_bytes(info, fp32), dtype_bytes=4 if fp32 else 2, vae=vae_cfg,
              on_batching=lambda rows, refill: shape.update(rows=rows, refill=refill))
    if args.ray is not None:  # docs/batch.md "Ray": the workers' devices size the batch (runner.prepare)
        from .batch.ray_runner import EngineSpec, RayRunner, yue2_env
        print(f"checkpoint: {checkpoint} ({how})", file=sys.stderr)
        absolute = os.path.abspath  # the workers may run in another folder, or on another node
        spec = EngineSpec(absolute(checkpoint), args.dtype, tuple((absolute(p), a, n) for p, a, n in args.lora),
                          absolute(args.vae) if args.vae else None, yue2_env(), vendor_vae=vendor_vae)
        runner = RayRunner(args.ray, spec, cpu_workers=args.ray_cpu_workers)
        try:
            return run_batch(options, runner=runner, **kw)
        finally:
            runner.close()
    return run_batch(options, on_cuda=device.type == "cuda", free_bytes=device_free_bytes(device), **kw)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m yue2_core", description="YuE2-3B songs from a style and lyrics.", allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True)
    add_parser = sub.add_parser
    sub.add_parser = lambda *a, **kw: add_parser(*a, allow_abbrev=False, **kw)  # --check is not --checkpoint

    def common(sp, render: bool = False):
        sp.add_argument("--checkpoint", type=_named("checkpoint file"),
                        help="YuE2 all-in-one .safetensors, or the vendor's m-a-p/YuE2-3B folder; a name not "
                        "found here is looked for in ComfyUI's models/checkpoints, as the Checkpoint Loader lists it "
                        "(default: " + (
                            "the checkpoint the song's config.json records, when it still exists; else "
                            if render else "") +
                        "$YUE2_CHECKPOINT, ComfyUI models/checkpoints when this pack sits in ComfyUI/custom_nodes "
                        "or $COMFYUI_PATH is set, the vendor's m-a-p/YuE2-3B in the Hugging Face cache, else "
                        "download Comfy-Org/YuE2's int8 file, 3.7 GB)")
        sp.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:1 …")
        sp.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"],
                        help="LM compute dtype (default bf16, the release's; the VAE is always fp32)")
        sp.add_argument("--steps", type=whole_number, default=None if render else 32,
                        help="ODE steps of the renderer (default " + ("the song's own, from its config.json: the same "
                             "audio as the song" if render else "32, the release's") + "; 2 model evaluations each "
                             "with the midpoint solver, 1 with --ode-method ab2)")
        sp.add_argument("--offline", action="store_true", help="never download")
        sp.add_argument_group("required").add_argument("--output", required=True,
                                                       help="new song directory (must not exist or be empty)")
        sp.add_argument("--lora", action="append", default=[], metavar="PATH[:AR[:NAR]]", type=parse_lora,
                        help="apply a LoRA/LoKr adapter (any published YuE2 layout; repeat to stack); one number sets "
                             "both strengths, two set AR then NAR (default 1); a name not found here is looked for in "
                             "ComfyUI's models/loras (the ComfyUI the checkpoint search uses)"
                             + ("; replaces the adapters the song was made with" if render else ""))
        if render:
            sp.add_argument("--no-lora", action="store_true",
                            help="render without any adapter, not the ones the song was made with")
        sp.add_argument("--checkpoint-how", help=argparse.SUPPRESS)  # scripts/song.sh: how it picked --checkpoint
        sp.add_argument("--vae", metavar="PATH", type=parse_vae,
                        help="a VAE decoder file or vendor VAE folder to use instead of "
                        + ("the one the song was made with" if render else "the checkpoint's")
                        + "; a name not found here is looked for in ComfyUI's models/vae")

    def ode_method(sp, render: bool = False):
        sp.add_argument("--ode-method", default=None if render else "midpoint", choices=["midpoint", "ab2"],
                        help="ODE solver of the renderer: midpoint (the release's, 2 model evaluations per step) or "
                             "ab2 (opt-in Adams–Bashforth, 1 evaluation per step: about half the render time)"
                             + ("; default: the song's own" if render else ""))

    g = sub.add_parser("generate", help="style + lyrics → song directory (score, tokens, latents, audio.flac)",
                       description="Make a song: the model writes an ABC lead sheet for the style and lyrics (or "
                                   "takes --abc-file), samples music tokens (25 a second) after it, renders them into "
                                   "latents and decodes 48 kHz stereo audio. Writes a new song directory: score.abc, "
                                   "the token and latent arrays, audio.flac, request/config/result JSON with hashes.")
    style = g.add_mutually_exclusive_group()  # both given: argparse refuses, rather than one silently winning
    style.add_argument("--style", help="style line, e.g. 'upbeat indie pop, warm female vocals'")
    style.add_argument("--style-file", type=_named("style file"), help="UTF-8 text file holding the style line")
    lyrics = g.add_mutually_exclusive_group()
    lyrics.add_argument("--lyrics", help="lyrics text (use --lyrics-file for multi-line lyrics)")
    lyrics.add_argument("--lyrics-file", type=_named("lyrics file"), help="UTF-8 text file holding the lyrics")
    g.add_argument("--cot", default="full", choices=["full", "melody", "off"],
                   help="full: melody + chords lead sheet; melody: melody-only; off: no lead sheet")
    g.add_argument("--seed", type=whole_number, default=DEFAULT_SEED,
                   help=f"seed of the lead sheet, the music tokens and the render (default {DEFAULT_SEED}, the "
                        "release's: the same inputs and seed give the same song every run — pass another seed for "
                        "another take; the seed used is printed)")
    g.add_argument("--abc-file", type=_named("ABC file"), help="use this ABC lead sheet (UTF-8) instead of letting the model write one; it "
                                      "is used as given, the dialect check's findings are printed as warnings")
    g.add_argument("--cfg-scale", type=plain_number, default=None,
                   help="classifier-free guidance of the music (default: the release's 1.0; 1.01 with --cot off)")
    g.add_argument("--max-seconds", type=seconds, default=None, help="cap the music length (25 tokens per second; "
                   "default: the release's 9,000 tokens = 360 s, a long wait on a CPU)")
    g.add_argument("--max-abc-tokens", type=whole_number, default=None,
                   help="cap the lead-sheet length in tokens (default: the release's 4,096; with synthetic weights "
                        f"{SYNTHETIC_ABC_TOKENS}, since a random model never ends its lead sheet)")
    common(g)
    ode_method(g)
    g.set_defaults(func=cmd_generate)

    r = sub.add_parser("render", help="re-render a saved song directory (exact ids, or an edited score.abc)",
                       description="Render a saved song again into a new directory. Unchanged, its saved music tokens "
                                   "are rendered as they are (the same audio with the same seed and weights — on a "
                                   "CPU bit for bit with the same thread count: another OMP_NUM_THREADS changes the "
                                   "last bits of the VAE decode, not the tokens or latents; a song "
                                   "made by the Regenerate / Continue nodes gets one fresh render of its tokens, not "
                                   "their splice); with "
                                   "--seed, new music tokens are sampled after the same lead sheet; if you edited its "
                                   "score.abc, new music tokens are sampled after your score (--max-seconds caps "
                                   "them). --lora/--vae swap the adapters or the VAE the song was made with.")
    r.add_argument("song", type=_named("song folder"), help="a song directory (from generate, render, batch, or the "
                   "nodes' Save Song / Regenerate / Continue)")
    r.add_argument("--seed", type=whole_number, default=None, help="new seed (samples new music tokens; the song's "
                   "own seed gives its own tokens again)")
    r.add_argument("--max-seconds", type=seconds, default=None,
                   help="cap the new music when tokens are resampled (default: the song's own budget)")
    common(r, render=True)
    ode_method(r, render=True)
    r.set_defaults(func=cmd_render)

    i = sub.add_parser("inspect", help="identify a checkpoint, a LoRA adapter, a VAE file, a song folder or an "
                                       "ABC lead sheet and describe it",
                       description="Identify a checkpoint (file or vendor folder), a LoRA/LoKr adapter, a VAE "
                                   "file/folder, a song folder or an ABC lead sheet (score.abc) and describe it: the "
                                   "details as JSON on stdout (a summary line, for an adapter its report, for a lead "
                                   "sheet the dialect check's findings, on stderr). Exit status 2 when it is none of "
                                   "these or an adapter does not fit the model; a lead sheet with errors is "
                                   "described with exit status 0 and \"ok\": false (generate and render use a "
                                   "score as written, so its findings are warnings, not a refusal).")
    i.add_argument("checkpoint", metavar="PATH", type=_named("file or folder"),
                   help="a checkpoint file or vendor folder, a LoRA/LoKr adapter, a VAE file/folder, "
                        "a song folder (its files are verified against result.json), or an ABC lead sheet")
    i.add_argument("--model", metavar="CHECKPOINT", type=_named("checkpoint file"), help="check an adapter against this checkpoint's geometry "
                                                         "(default: the release YuE2-3B geometry)")
    i.set_defaults(func=cmd_inspect)

    m = sub.add_parser("make-synthetic", help="write a synthetic checkpoint with random weights (for tests)",
                       description="Write a synthetic YuE2 checkpoint: the real file's layout, random weights (its "
                                   "songs are noise). Synthetic adapters, VAEs and the vendor folder have writers of "
                                   "their own: python -m yue2_core.weights.lora.synthetic DIR --profile tiny, "
                                   "python -m yue2_core.weights.synthetic_vae, python -m "
                                   "yue2_core.weights.synthetic_vendor (docs/lora.md, \"Try it without real files\").")
    m.add_argument("--output", required=True, metavar="FILE.safetensors",
                   help="the checkpoint file to write (an existing file needs --force)")
    m.add_argument("--profile", default="tiny", choices=["tiny", "full"],
                   help="tiny: a small model for CPU tests (default); full: the release geometry (7.8 GB bf16)")
    m.add_argument("--format", default="bf16", choices=["bf16", "int8"],
                   help="bf16 (default) or the int8 ConvRot layout of yue2_3b_int8_convrot.safetensors")
    m.add_argument("--seed", type=whole_number, default=0, help="the random weights' seed (default 0)")
    m.add_argument("--force", action="store_true", help="replace an existing file at --output (a regular file; never "
                   "a device, FIFO or socket)")
    m.set_defaults(func=cmd_make_synthetic)

    b = sub.add_parser("batch", help="many songs from a request JSONL (one JSON object per line) → DIR/<id>/ song "
                                     "folders + DIR/batch.json; AR phases decoded together (docs/batch.md)",
                       description="Make many songs from a request file (JSONL, one request a line: the vendor's "
                                   "fields). Each song is the folder DIR/<id> that generate would write for that "
                                   "request and seed; DIR/batch.json lists every row's outcome. The AR phases of "
                                   "several songs decode together on a GPU (--max-batch), one after another on a "
                                   "CPU; --resume finishes an interrupted batch. docs/batch.md says more.")
    b.add_argument("requests", type=_named("request file"), help="the request file (the vendor's JSONL: id, style/tags, lyrics, cot, seed, abc or "
                                    "abc_path, cfg_scale, abc_sampling, semantic_sampling)")
    b.add_argument("--max-batch", type=whole_number, default=None,
                   help="songs per AR batch (default on CUDA: 8, or fewer when --budget holds fewer; on the CPU, "
                        "where rows are not batched: 1, each song saved before the next starts — but with "
                        "--continuous the CPU decodes up to 8 rows too, or the queue's length if shorter)")
    b.add_argument("--budget", type=plain_number, default=None, metavar="GiB", help="device memory the batch may use, "
                   "weights included (default: what is free now); sizes the batch")
    b.add_argument("--resume", action="store_true", help="finish a batch in --output: songs that verify are "
                                                         "skipped, damaged ones redone")
    b.add_argument("--max-seconds", type=seconds, default=None,
                   help="cap every song's music (25 tokens per second; a row asking for less keeps its own; "
                        "uncapped, a row gets its semantic_sampling.max_tokens, else the release's 9,000 tokens = "
                        "360 s)")
    b.add_argument("--max-abc-tokens", type=whole_number, default=None,
                   help="cap every lead sheet, in tokens (a row asking for less keeps its own; uncapped: its "
                        "abc_sampling.max_tokens, else the release's 4,096; with synthetic weights "
                        f"{SYNTHETIC_ABC_TOKENS}, as for generate, since a random model never ends its lead sheet)")
    b.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None, help="render and decode a "
                   "batch's songs on a worker thread while the next batch's AR phases run (default: on with CUDA, "
                   "off on the CPU; the songs are the same either way)")
    b.add_argument("--continuous", action=argparse.BooleanOptionalAction, default=None, help="continuous "
                   "batching: each AR phase decodes the whole queue on --max-batch rows and a row whose song ended "
                   "takes the next song at once, instead of static batches that last as long as their longest song "
                   "(each song as the GPU decoder makes it alone). Default: on with CUDA (1.46x faster on songs of "
                   "different lengths, H200), off on the CPU (rows one at a time: generate's songs) and with --ray; "
                   "--resume keeps the folder's. On the CPU --continuous gives other songs than static batches "
                   "(docs/batch.md)")
    b.add_argument("--ray", metavar="auto|ADDRESS", default=None, help="spread the queue over a Ray cluster, one "
                   "engine actor per GPU (auto: the cluster this machine is in, else a new local one; ADDRESS: "
                   "HOST:PORT of the head node or ray://HOST:PORT); needs pip install .[ray] (docs/batch.md)")
    b.add_argument("--ray-cpu-workers", type=whole_number, default=None, metavar="N",
                   help="with --ray: N CPU engine actors instead of one per GPU (tests, dry runs)")
    common(b)
    ode_method(b)
    next(a for a in b._actions if a.dest == "output").help = "the batch folder (new, or one to --resume)"
    b.set_defaults(func=cmd_batch)
    return p


def _flush_and_exit(status: int) -> None:
    """Flush stdout/stderr (a closed pipe is ignored) and end the process with `status` at once, without the
    interpreter's teardown."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # a closed pipe, a closed file, no stream
            pass
    os._exit(status)


def _exit_on_next_interrupt(status: int = 130) -> None:
    """From now on a Ctrl-C ends the process at once with `status`: after a handled Ctrl-C (130), or once a command
    has finished (its own status — not 130, which wrappers read as cancelled), instead of Python's "Exception ignored
    in threading._shutdown" traceback while the interpreter joins its threads."""
    import signal
    try:
        signal.signal(signal.SIGINT, lambda signum, frame: _flush_and_exit(status))
    except (ValueError, AttributeError):  # not the main thread
        pass


_DONE: dict = {}  # set by generate / render once the song is saved: a later Ctrl-C ends the command with 0; "status":
# the command's exit status once it returned


def _saved(folder) -> None:
    """`save_song`'s `on_saved` for generate / render: the song is in place, so a later Ctrl-C ends the command with
    0 (main). Called with the interrupts held from the rename on (stop-47 review: one landing just after the rename
    ended the command with 130, "cancelled", beside the complete song)."""
    _DONE["folder"] = folder


def _terminate(signum, frame):
    raise KeyboardInterrupt  # SIGTERM / SIGHUP (kill, timeout, a closed terminal) clean up like Ctrl-C: no partial song


def main(argv=None) -> int:
    _DONE.clear()
    for name in ("stdout", "stderr"):  # a closed descriptor (`>&-`, `2>&-`) or a host without one (pythonw): None
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))
    args = build_parser().parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):  # a console that cannot show a path's characters gets escapes, not a crash
        sys.stdout.reconfigure(errors="backslashreplace")
    import signal
    for name in ("SIGTERM", "SIGHUP"):  # a closed terminal (SIGHUP) cleans up like kill and Ctrl-C
        try:
            signal.signal(getattr(signal, name), _terminate)
        except (ValueError, AttributeError):  # not the main thread, or no SIGHUP (Windows): keep the host's handler
            pass
    try:
        status = args.func(args)
        _DONE["status"] = status
        return status
    except YuE2Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        if "folder" in _DONE:
            return _stdout_failed_after_save(EPIPE_TEXT)
        # the reader of standard output went away (`inspect … | head`): its choice, not an error (review finding:
        # a BrokenPipeError traceback); the descriptor points at /dev/null so the exit flush cannot fail again
        _silence_stdout()
        return 0
    except OSError as exc:
        if "folder" not in _DONE:
            raise
        return _stdout_failed_after_save(exc.strerror or str(exc))
    except KeyboardInterrupt:
        if "status" in _DONE:  # the command had finished (break-it: a batch's summary, then exit 130)
            return _DONE["status"]
        if "folder" in _DONE:  # the song was saved before the interrupt (break-it: a wrapper read 130 as cancelled)
            print(f"interrupted after the song was saved: {Path(_DONE['folder']).resolve()} is complete",
                  file=sys.stderr)
            return 0
        print("cancelled" + (" (nothing half-written; add --resume to finish the batch)"
                             if getattr(args, "func", None) is cmd_batch else ""), file=sys.stderr)
        return 130
    finally:
        claim = _DONE.pop("claim", None)  # the output claimed by generate / render is free again
        if claim is not None:
            claim.release()


EPIPE_TEXT = "Broken pipe"


def _silence_stdout() -> None:
    """Point standard output (the Python object and its descriptor) at /dev/null: nothing more is written to a
    reader that went away, and the interpreter's exit flush cannot raise again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):  # no descriptor (a host's stream object)
        pass
    sys.stdout = open(os.devnull, "w")


def _stdout_failed_after_save(reason: str) -> int:
    """The song is saved; writing what follows (the summary on standard output, `| head`, `> /dev/full`) failed:
    the run still made its song (break-it: a wrapper saw exit 1 and a traceback for a complete song). Returns 0."""
    _silence_stdout()
    try:
        print(f"warning: could not write to standard output ({reason}); the song is saved: "
              f"{Path(_DONE['folder']).resolve()}", file=sys.stderr)
    except (OSError, ValueError):
        pass
    _DONE["status"] = 0
    return 0


def _end_finished(status: int) -> None:
    """End a finished command with its status: a Ctrl-C from here on ends it at once with that status; the other
    threads are joined and the exit handlers run, then the process ends without the interpreter's teardown (a
    Ctrl-C during that teardown — unloading torch takes a second — killed the process with 130 after the song was
    saved: wrappers read that as cancelled)."""
    import atexit
    import threading
    _exit_on_next_interrupt(status)
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    _flush_and_exit(status)


def _end_cancelled() -> None:
    """End a cancelled run with 130: a further Ctrl-C ends it at once, quietly; the exit handlers run (warm-up
    children killed, temporary cache removed), then the process ends without the interpreter's teardown — after a
    Ctrl-C that landed inside a torch operation, that teardown could end in a C++ "terminate called without an
    active exception" abort (exit 134) instead of 130."""
    _exit_on_next_interrupt()
    import atexit
    atexit._run_exitfuncs()
    _flush_and_exit(130)


if __name__ == "__main__":
    try:
        status = main()
    except KeyboardInterrupt:  # a second Ctrl-C while main reported the first (break-it: a traceback, 50 ms apart),
        status = _DONE.get("status", 130)  # or one just after a finished command returned
    while status != 130:  # finished: the process's own SIGINT handler (not main's: tests and hosts call main in-process)
        try:
            _end_finished(status)
        except KeyboardInterrupt:  # it landed before the quiet handler was in place: once more
            continue
    if status == 130:  # cancelled (everything written is complete: songs and batch.json are saved atomically)
        while True:
            try:
                _end_cancelled()
            except KeyboardInterrupt:  # it landed before the quiet handler was in place: once more
                continue
    sys.exit(status)
