"""Command line: `python -m yue2_core {generate,render,inspect,make-synthetic} …` (see --help of each)."""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

from .constants import DEFAULT_SEED, FRAMES_PER_SECOND
from .errors import YuE2Error
from .text_encoding import utf16_kind as _utf16_kind


class ProgressLine:
    """One status line per stage on stderr: stage, done/total and tokens/s (updated in place on a terminal)."""

    def __init__(self, stream=None):
        stream = stream or sys.stderr  # looked up now: sys.stderr may have been replaced since the import
        self.stream, self.tty, self.last, self.stage, self.t0 = stream, stream.isatty(), 0.0, None, time.time()

    def __call__(self, stage, done, total, info):
        now = time.time()
        if stage != self.stage:
            if self.stage is not None and self.tty:
                self.stream.write("\n")
            self.stage, self.t0 = stage, now
        if not (done == total or now - self.last > (0.1 if self.tty else 5.0)):
            return
        self.last = now
        rate = info.get("tokens_per_second")
        unit = {"plan": "ABC tokens", "semantic": "music tokens", "render": "ODE steps",
                "decode": "VAE tiles"}.get(stage, "")
        text = f"[{stage}] {done}/{total} {unit}" + (f" · {rate:.1f} tok/s" if rate else "")
        self.stream.write(("\r" + text) if self.tty else (text + "\n"))
        self.stream.flush()

    def close(self):
        if self.tty and self.stage is not None:
            self.stream.write("\n")


MAX_TEXT_FILE = 1 << 20  # style, lyrics and score files: 1 MiB is ~40× what the context can hold


def read_text_file(path: str, what: str) -> tuple[str, list[str]]:
    """A --style-file / --lyrics-file / --abc-file as the vendor's CLI reads it (runtime.md §7.4): the file's bytes
    decoded as UTF-8, nothing rewritten — CRLF and lone CR line endings and a byte-order mark stay in the text, so the
    same file gives the same token ids as `yue2 generate`. Returns (text, warnings); warnings is empty: CR line
    endings, a byte-order mark and NUL characters are named, not changed, by the checks of the text itself
    (`SongRequest.input_warnings`, `protocol.score_notes`), inline or from a file alike.

    Raises YuE2Error before reading anything for a path that is not a regular file or is over MAX_TEXT_FILE bytes;
    for UTF-16 and UTF-32 text (with or without a byte-order mark — NUL-interleaved text is never taken as lyrics) and for bytes
    that are not UTF-8 (the offset and byte named), each with "save the file as UTF-8"."""
    p = Path(path)
    try:
        if not p.is_file():  # what the path is instead (review 43: "not a regular file (or does not exist)")
            from .weights.checkpoint import not_a_file
            other = not_a_file(path)
            raise YuE2Error(f"cannot read the {what} file {path}: " + (
                f"it is {other}, not a regular file" if other else f"no such file ({p.absolute()})")
                + "; give the path of a UTF-8 text file")
        size = p.stat().st_size
        if size > MAX_TEXT_FILE:
            raise YuE2Error(f"the {what} file {path} is {size:,} bytes; at most {MAX_TEXT_FILE:,} are accepted (the "
                            "24,576-token context holds far less)")
        with open(p, "rb") as fh:
            data = fh.read(MAX_TEXT_FILE + 1)
    except OSError as exc:
        raise YuE2Error(f"cannot read the {what} file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_TEXT_FILE:
        raise YuE2Error(f"the {what} file {path} holds more than {MAX_TEXT_FILE:,} bytes")
    kind = _utf16_kind(data)
    if kind:
        raise YuE2Error(f"the {what} file {path} is {kind} text (bytes of 0 between the characters); the model "
                        "reads UTF-8: save the file as UTF-8")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YuE2Error(f"cannot read the {what} file {path}: byte 0x{data[exc.start]:02X} at offset {exc.start} is "
                        "not UTF-8 (a Latin-1 or Windows-1252 file?); save the file as UTF-8") from None
    # a mark and CR line endings are named once, by the score check or SongRequest.input_warnings
    # (`protocol.form_notes`), which see inline text too (break-it review, stop 46)
    return text, []


def _read_text(path: str | None, inline: str | None, what: str, notes: list | None = None) -> str:
    """The text of a --*-file option (`read_text_file`; its warnings appended to `notes`), else the inline value
    (`_arg_text`)."""
    if path:
        text, found = read_text_file(path, what)
        if notes is not None:
            notes.extend(found)
        return text
    return _arg_text(inline, f"--{what}") if inline else ""


def _arg_text(value: str, option: str) -> str:
    """A text argument as typed. Bytes that are not UTF-8 (Python keeps them as U+DC80–U+DCFF) are reported as the
    bytes they are, not as "unpaired surrogates"."""
    import os as _os
    bad = next((i for i, c in enumerate(value) if 0xDC80 <= ord(c) <= 0xDCFF), None)
    if bad is not None:
        raw = _os.fsencode(value) if all(not 0xD800 <= ord(c) <= 0xDFFF or 0xDC80 <= ord(c) <= 0xDCFF
                                         for c in value) else None
        byte = f"0x{ord(value[bad]) - 0xDC00:02X}"
        raise YuE2Error(f"{option} is not valid UTF-8: byte {byte} at character {bad}"
                        + (f" of {raw!r}" if raw is not None and len(raw) <= 80 else "")
                        + "; the terminal passed text in another encoding — set a UTF-8 locale, or put the text in "
                          "a UTF-8 file (--" + option.lstrip("-") + "-file)")
    return value


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
    grouped: dict[str, list[str]] = {}  # one line per finding, its line numbers gathered (new-user finding)
    for note in notes:
        m = re.match(r"line (\d+): (.*)", note, re.S)
        grouped.setdefault(m.group(2) if m else note, []).extend([m.group(1)] if m else [])
    print(f"warning: what the ABC check found in {what} (the score is used as written; the model reads any text):",
          file=sys.stderr)  # no count: a "N more …" line stands for many (new-user finding)
    for message, lines in grouped.items():
        where = (f"line{'s' if len(lines) > 1 else ''} {', '.join(lines[:8])}{' …' if len(lines) > 8 else ''}: "
                 if lines else "")
        print(f"  {where}{message.replace(' [error]', ' (error)').replace(' [warning]', '')}", file=sys.stderr)


SYNTHETIC_ABC_TOKENS = 256  # a random-weights lead sheet never ends; 256 tokens take seconds on a CPU


BUSY_SAMPLE_S = 0.2  # how long the per-core counters of /proc/stat are watched under an affinity limit
BUSY_SHARE = 0.75  # the share of the usable cores' time other jobs must take for the note (2 cores: 1.5 of them)


def _cpu_ticks(path: str = "/proc/stat") -> dict[int, tuple[int, int]]:
    """Each CPU's (busy, total) clock ticks since boot from /proc/stat's `cpuN` lines (busy: all but idle and
    iowait; steal counts as busy, time the hypervisor gave to others); {} where the file cannot be read."""
    ticks = {}
    try:
        with open(path) as f:
            for line in f:
                m = re.match(r"cpu(\d+)\s+(.*)", line)
                if m:
                    v = [int(x) for x in m.group(2).split()[:8]]  # user nice system idle iowait irq softirq steal
                    idle = v[3] + (v[4] if len(v) > 4 else 0)
                    ticks[int(m.group(1))] = (sum(v) - idle, sum(v))
    except (OSError, ValueError, IndexError):
        return {}
    return ticks


def _busy_share(cpus: set[int]) -> float | None:
    """The share of `cpus`' time that other jobs took over BUSY_SAMPLE_S (this process's own CPU time taken out),
    from /proc/stat; None where that cannot be read. A container whose /proc/stat lists only its own cores,
    renumbered (lxcfs), is read whole when it lists as many cores as the affinity mask holds."""
    import resource

    def sample():
        ticks = _cpu_ticks()
        if cpus <= ticks.keys():
            ticks = {c: ticks[c] for c in cpus}
        elif len(ticks) != len(cpus):  # neither the host's numbering nor a container's own list of its cores
            return None
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return (sum(b for b, _ in ticks.values()), sum(t for _, t in ticks.values()), usage.ru_utime + usage.ru_stime)

    first = sample()
    if first is None:
        return None
    time.sleep(BUSY_SAMPLE_S)
    second = sample()
    if second is None or second[1] <= first[1]:
        return None
    (busy0, total0, own0), (busy1, total1, own1) = first, second
    try:
        hz = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        hz = 100
    return min(1.0, max(0.0, (busy1 - busy0 - (own1 - own0) * hz) / (total1 - total0)))


def _note_busy_cpu() -> None:
    """On a CPU other jobs already keep busy, without OMP_NUM_THREADS: say that PyTorch's threads will fight them
    (new-user finding, stop 45: `bash scripts/song.sh` beside the test suite sampled 6 tokens/s, 221 s for the
    default song, with nothing pointing at the README's `OMP_NUM_THREADS=1`, which makes it several times faster).
    Read before this run's work, so it counts the other jobs only.

    The 1-minute load average counts the runnable tasks of the whole host (a container's too), so it is compared
    with the host's cores (`os.cpu_count`). Under an affinity limit (`taskset`, a cpuset such as `docker
    --cpuset-cpus`: `os.sched_getaffinity` smaller than the host) a load below the host's cores says nothing of the
    cores this process may use — 3 jobs on a 64-core host may run on them or on the 62 others — so their own
    counters in /proc/stat are watched for BUSY_SAMPLE_S instead (leftover of stop 46: the load compared with the
    2 usable cores printed a false note in a container pinned to 2 of 64 cores whenever the host ran 2 jobs)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # no load average on this platform
        return
    host = os.cpu_count() or 1
    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        cpus = set()
    if not cpus or len(cpus) >= host:
        if load < host:
            return
        said = f"load {load:.1f} on {host} cores"
    elif load >= host:  # every core of the host is busy, so are this process's
        said = f"load {load:.1f} on the host's {host} cores, {len(cpus)} of which this process may use"
    else:
        share = _busy_share(cpus)
        if share is None or share < BUSY_SHARE:
            return
        said = (f"other jobs kept the {len(cpus)} cores this process may use {share:.0%} busy; load {load:.1f} on "
                f"the host's {host} cores")
    print(f"NOTE: this CPU is busy ({said}) and OMP_NUM_THREADS is not set: PyTorch's threads then compete with the "
          "other jobs, which can make sampling several times slower; put OMP_NUM_THREADS=1 before the command "
          "(README, \"A CPU another job shares?\")", file=sys.stderr)


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


def _say_where(folder) -> None:
    """The last lines of a run: the song folder and its audio file (stderr, after the JSON summary on stdout)."""
    sys.stdout.flush()
    folder = Path(folder).resolve()
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
    notes = []
    request = SongRequest(style=_read_text(args.style_file, args.style, "style", notes),
                          lyrics=_read_text(args.lyrics_file, args.lyrics, "lyrics", notes), cot=args.cot,
                          seed=args.seed, abc=_read_text(args.abc_file, None, "ABC", notes) if args.abc_file else None,
                          cfg_scale=args.cfg_scale, id=_song_id(out)).validate()
    budgets = Budgets(args.max_seconds, args.max_abc_tokens)
    budgets.abc_sampling(), budgets.semantic_sampling()  # bad --max-seconds / --max-abc-tokens: fail before loading
    _check_budget_fits(args.max_seconds, args.max_abc_tokens)
    _check_steps(args.steps)
    for note in notes + request.input_warnings():
        print(f"warning: {note}", file=sys.stderr)
    if request.abc is not None:
        _warn_score(request.abc, "--abc-file", budgets.semantic_sampling().max_tokens / FRAMES_PER_SECOND,
                    cot=request.cot)
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
    _say_where(folder)
    return 0


def _check_output(output: str) -> Path:
    """The output directory must be new or empty (songs are never overwritten), a folder of its own (not "" or ".",
    not a mount point: `artifacts.check_output_dir`) and its parent writable (a test folder is made and removed
    there); checked before any work. Raises YuE2Error saying which; a long path is quoted by its start and end
    (`errors.quoted`, as a batch row's abc_path: a 6,000-character --output was quoted whole, stop 46)."""
    from .artifacts import batch_folder_above, check_output_dir
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


def _render_seconds(given: float | None, parent_sampling: dict) -> float | None:
    """--max-seconds of a re-render that samples new tokens: the given value, else the parent song's own music budget
    (its max_tokens / 25, as result.json records it), else the release budget."""
    if given is not None:
        return given
    cap = parent_sampling.get("max_tokens") if isinstance(parent_sampling, dict) else None
    return cap / FRAMES_PER_SECOND if type(cap) is int and cap >= 1 else None


def _song_weights(args, config: dict | None = None) -> tuple[list, str | None]:
    """The adapters and VAE a re-render uses: --lora / --vae when given, else those the song's config.json records
    (found by name and sha256, companions included: their recorded path, then the ComfyUI loras / vae folders).
    AdapterError names a recorded file or companion that is missing or changed (with several recorded adapters:
    the --lora options that give them all), or a malformed "weights" entry or recorded strength. --lora given for a
    song that recorded other adapters or strengths: a warning on stderr (they replace the record)."""
    from .errors import AdapterError
    from .weights.locate import comfy_checkpoint_dirs
    from .weights.lora.record import find_recorded, recorded_weights
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
                  "the music will differ", file=sys.stderr)
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
    from .errors import AdapterError
    from .weights.lora.layouts_io import _dir_weights
    from .weights.lora.record import file_sha256

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
    from .errors import CheckpointError
    from .weights.locate import comfy_checkpoint_dirs
    from .weights.vendor import find_vae_folder, recorded_vae_folder
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
        from .weights.vendor import vae_folder_sample
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
    from .weights.lora.record import may_predate_stack_rules
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
    from .errors import AdapterError
    from .weights.lora.apply import STRENGTH_RANGE
    from .weights.lora.record import fl_companion_twice
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
    from .weights.lora.record import recorded_int8_mode
    made = recorded_int8_mode(weights)
    asked = os.environ.get("YUE2_LORA_INT8", "").strip()  # checked by _check_switches
    return asked if made is not None and asked and asked != made else made


_INT8_WORDS = {"side": "as exact side deltas beside the int8 codes", "bf16": "merged into layers dequantized to bf16"}


def _say_lora_int8(weights, used: str | None) -> None:
    """Say on stderr how a re-render applied the LoRAs to int8 layers against what the song records (`weights`, its
    config.json "weights"): `used` is the mode the loaded engine records (`engine.weights["lora_int8"]`), None when
    no int8 layer got a LoRA — a bf16 checkpoint, adapters on float layers only, --no-lora —, where the mode changes
    nothing and nothing is said (review, stop 41: "LoRAs on int8 layers merged …" was said for a bf16 checkpoint)."""
    if used is None:
        return
    from .weights.lora.record import recorded_int8_mode
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


def _num(x: float) -> str:
    """A strength as typed on the command line: 0.8, 1, -0.5."""
    return f"{x:g}"


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
    if args.steps is not None:
        _check_steps(args.steps)
    from .protocol import SEED_MAX
    if args.seed is not None and not 0 <= args.seed <= SEED_MAX:  # before loading, as generate's (break-it)
        raise RequestError(f"--seed must be an integer in [0, {SEED_MAX}], got {args.seed}")
    Budgets(args.max_seconds).semantic_sampling()  # a bad --max-seconds fails before loading
    _check_budget_fits(args.max_seconds, None)
    saved = load_song(args.song, edited_ok=True, audio_ok=True)  # the song folder checked before any checkpoint is
    # looked for; its audio.flac is not read (a tag editor's rewrite, a file moved away: stop-47 review)
    if saved.audio_changed:
        how = ("is missing" if saved.audio_changed == "missing"
               else "has changed since the song was saved (a tag editor?)")
        print(f"note: {Path(args.song) / 'audio.flac'} {how}; render does not use it: the music tokens, score and "
              "latents it renders from verify", file=sys.stderr)
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
        print("score.abc was edited: sampling new music tokens for it" if saved.score_edited else
              "new seed: sampling new music tokens", file=sys.stderr)
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
    settings = {**saved.config, "rendered_from": parent, "protocol": PROTOCOL_VERSION,
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
    _say_where(folder)
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


def _song_report(path: str) -> dict:
    """What `inspect` says of a song folder (generate/render/batch output): its files verified against their hashes
    (`artifacts.load_song`, ArtifactError naming a damaged file), the request, the lengths (ABC tokens; music frames
    at 25/s and seconds; audio samples at 48 kHz), whether budgets cut it, the weights it was made with.
    `score_edited`: this folder's score.abc was edited after the song was saved (render samples new music for it);
    `lineage.parent_score_edited`: the song was rendered from a parent whose score.abc had been edited (a song saved
    before 2026-12-06 records it as lineage "score_edited", shown under the new name)."""
    from .artifacts import load_song
    saved = load_song(path, edited_ok=True)
    r, request = saved.result, saved.tokens.request
    weights = r.get("weights") or {}
    mot = weights.get("mot") or {}
    lineage = dict(r["lineage"]) if isinstance(r.get("lineage"), dict) else {}
    if "score_edited" in lineage and "parent_score_edited" not in lineage:  # `render`'s record before 2026-12-06
        lineage["parent_score_edited"] = lineage.pop("score_edited")
    from_edit = lineage.get("parent_score_edited") is True and isinstance(lineage.get("parent"), str)
    return {"kind": "song", "path": str(saved.path), "status": r.get("status"),
            "request": {"style": request.get("style"), "lyrics_chars": len(request.get("lyrics") or ""),
                        "cot": request.get("cot"), "seed": request.get("seed"), "cfg_scale": request.get("cfg_scale"),
                        "id": request.get("id")},
            "abc_tokens": len(saved.tokens.score.abc_ids), "score_edited": saved.score_edited,
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
                        f"{request.get('cot')}, seed {request.get('seed')}; files verified against result.json"
                        + ("; score.abc edited since the song was made (render samples new music for it)"
                           if saved.score_edited else "")
                        + (f"; rendered from {lineage['parent']}, whose edited score.abc it sampled its music for"
                           if from_edit else ""))}


def _base_model_keys(path: str) -> bool:
    """Whether the safetensors file at `path` holds the embedded tokenizer or a base tensor of the AR/NAR experts
    (exact checkpoint names, as no adapter has them): then it is an all-in-one checkpoint, damaged if it does not
    load — not a VAE decoder because its vae.* tensors are there (break-it: `inspect` said "VAE decoder", exit 0)."""
    import re
    from .weights.checkpoint import TOKENIZER_KEY, read_header
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
    from .errors import CheckpointError
    from .weights.checkpoint import dtype_histogram, inspect_checkpoint, load_tokenizer
    if os.path.isdir(args.checkpoint) and (os.path.isfile(os.path.join(args.checkpoint, "result.json"))
                                           or os.path.isfile(os.path.join(args.checkpoint, "batch.json"))):
        if not os.path.isfile(os.path.join(args.checkpoint, "result.json")):  # a batch folder: name its songs
            from .artifacts import batch_folder_hint
            raise YuE2Error(f"{args.checkpoint} is not a song folder{batch_folder_hint(Path(args.checkpoint))}; "
                            "inspect one of those")
        report = _song_report(args.checkpoint)
        print(report["summary"], file=sys.stderr)
        print(_json_lines(report))
        return 0
    if not os.path.exists(args.checkpoint):
        from .weights.locate import HF_FILE, HF_REPO
        raise CheckpointError(f"checkpoint not found: {args.checkpoint} — no such file or folder; inspect takes the "
                              "path of a checkpoint (or the vendor's folder), a LoRA, a VAE file or folder, or a song "
                              f"folder (the release file is {HF_FILE} from https://huggingface.co/{HF_REPO})")
    dims = None
    if getattr(args, "model", None):
        dims = inspect_checkpoint(args.model, own_vae="optional").dims
    try:  # a vendor folder without a VAE folder is described, the VAE said missing (new-user review, stop 46)
        info = inspect_checkpoint(args.checkpoint, own_vae="optional")
    except CheckpointError as exc:
        from .errors import DamagedWeightsError
        # a damaged all-in-one file or vendor folder, not a VAE or adapter (break-it: inspect said "VAE decoder")
        if isinstance(exc, DamagedWeightsError) or _base_model_keys(args.checkpoint):
            raise CheckpointError(f"{args.checkpoint} is a YuE2 checkpoint that does not load: {exc}") from None
        other, reasons = _inspect_other(args.checkpoint, dims)  # a LoRA or a VAE file?
        if other is None and reasons.get("vae_damaged"):  # break-it: "neither …", the reason on a later line
            raise CheckpointError(f"{args.checkpoint} is a YuE2 VAE decoder that is refused: "
                                  f"{reasons['vae']}") from None
        if other is None:
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
            raise CheckpointError(f"{args.checkpoint} is neither a YuE2 checkpoint, a VAE decoder"
                                  f"{', a LoRA adapter nor a song folder' if folder else ' nor a LoRA adapter'}:"
                                  f"\n  as a checkpoint: {exc}\n  as a VAE decoder: {reasons['vae']}\n"
                                  f"  as a LoRA adapter: {reasons['lora']}"
                                  + ("\n  as a song folder: it holds no result.json" if folder else "")) from None
        if other.get("report"):
            print(other["report"], file=sys.stderr)  # the human-readable report; JSON on stdout
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
    print(_json_lines(report))
    return 0


def _json_lines(obj) -> str:
    """JSON with indent 2, lists of plain numbers kept on one line (the VAE's block geometry took 40 lines)."""
    import re
    text = json.dumps(obj, indent=2, ensure_ascii=False, default=str)
    return re.sub(r"\[\s*(-?[\d.eE+-]+(?:,\s*-?[\d.eE+-]+)*)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)


def _looks_like_adapter(path: str) -> bool:
    """A folder with adapter_config.json, or a safetensors file whose keys carry LoRA/LoKr/diff roles."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, "adapter_config.json"))
    try:
        from .weights.checkpoint import read_header
        entries, _, _ = read_header(path)
    except Exception:  # noqa: BLE001 - only a hint for the message
        return False
    roles = ("lora_A", "lora_B", "lora_down", "lora_up", "lokr_w1", "lokr_w2", ".diff")
    return any(role in k for k in entries for role in roles)


def _inspect_other(path: str, dims=None) -> tuple[dict | None, dict]:
    """`inspect` of a file that is not a checkpoint: a VAE decoder (layout, variant) or a LoRA/LoKr adapter (layout,
    ranks, modules, scale rule, checked against the release geometry). Returns (description or None, {"vae": why
    not, "lora": why not})."""
    from .errors import YuE2Error as _Err
    reasons = {}
    try:
        from .weights.vae_files import open_vae
        vae = open_vae(path)
        return {"kind": "VAE decoder", "summary": vae.describe(), **vae.record()}, reasons
    except _Err as exc:
        from .errors import DamagedWeightsError
        reasons["vae"] = str(exc)
        reasons["vae_damaged"] = isinstance(exc, DamagedWeightsError)  # a VAE, with unusable values
    try:
        from .weights.lora.layouts import RELEASE_DIMS, describe_adapter, read_adapter
        from .weights.lora.apply import Applied, check_magnitude
        adapter = read_adapter(path, dims or RELEASE_DIMS)
        check_magnitude([Applied(adapter, 1.0, 1.0)])  # damaged factors refused as `generate` refuses them
    except _Err as exc:
        from .errors import AdapterGeometryError
        reasons["lora"] = str(exc)
        reasons["lora_geometry"] = isinstance(exc, AdapterGeometryError)
        return None, reasons
    return {"kind": "LoRA adapter", "layout": adapter.layout, "ranks": adapter.ranks(),
            "scale_rule": adapter.scale_rule, "scales": adapter.scales,
            "modules": {e: len(adapter.modules(e)) for e in ("ar", "nar")}, "replacements": adapter.replacements(),
            "unmatched": adapter.unmatched, "report": describe_adapter(adapter)}, reasons


def cmd_make_synthetic(args) -> int:
    from .errors import RequestError
    from .protocol import SEED_MAX
    from .weights.synthetic import write_synthetic_checkpoint
    if not 0 <= args.seed <= SEED_MAX:  # the range every --seed takes (stop 42: -1 — "random" in ComfyUI — and
        # 10**23 were accepted; the weights hash the seed, so any integer gave some file, never a random one)
        raise RequestError(f"--seed must be an integer in [0, {SEED_MAX}], got {args.seed}")
    try:  # Python 3.11's pathlib raises for a name too long or a folder without permission (break-it finding)
        if Path(args.output).is_dir():
            raise YuE2Error(f"--output {args.output} is a folder; give the path of the .safetensors file to write")
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
        raise YuE2Error(f"cannot write {args.output}: {exc.strerror or exc}") from None
    print(json.dumps(report, indent=2, default=str))
    if missing is not None:
        print(f"note: created the folder {missing.resolve()}, which did not exist, for {Path(report['path']).name}; "
              "for ComfyUI the file belongs in its models/checkpoints folder", file=sys.stderr)
    return 0


def _ascii_number(text: str) -> float:
    """float(text) for a plain ASCII decimal (1, -0.5, 2e-1, .5): ValueError for what float() also takes but nobody
    types as a strength — other scripts' digits (٣), underscores (1_0), surrounding spaces (break-it finding:
    FILE:٣ became strength 3). inf and nan pass, for `check_strength` to refuse by name."""
    if not re.fullmatch(r"[+-]?((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|inf|infinity|nan)", text,
                        flags=re.ASCII | re.IGNORECASE):
        raise ValueError(f"not a number: {text!r}")
    return float(text)


def _is_number(text: str) -> bool:
    try:
        _ascii_number(text)
    except ValueError:
        return False
    return True


def parse_lora(value: str) -> tuple[str, float, float]:
    """--lora PATH[:AR[:NAR]] → (path, strength_ar, strength_nar). Strengths are read from the right, so a path with
    colons (C:\\x.safetensors) works; one number sets both. Raises argparse.ArgumentTypeError for a strength outside
    ±5, a strength that is not a number or is empty (PATH:1:), more than two strengths, a missing file, or a path
    that is a FIFO / device / socket (named: reading one would block)."""
    from .errors import AdapterError
    from .weights.lora.apply import check_strength
    parts, nums = value.split(":"), []
    while len(parts) > 1 and len(nums) < 2:
        try:
            _ascii_number(parts[-1])
            nums.insert(0, parts[-1])  # the text: check_strength tells 1e-400 (underflows to 0) from 0
        except ValueError:
            break
        parts.pop()
    path = ":".join(parts)
    try:
        ar = check_strength(nums[0], "--lora AR strength") if nums else 1.0
        nar = check_strength(nums[1], "--lora NAR strength") if len(nums) > 1 else ar
    except AdapterError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    from .weights.checkpoint import not_a_file
    kind = not_a_file(path)
    if kind is not None and kind != "a directory":  # a directory may be a PEFT folder
        raise argparse.ArgumentTypeError(f"LoRA {path!r} is {kind}, not a file (an adapter is a .safetensors or .pt "
                                         f"file, or a PEFT folder)")
    if not os.path.exists(path):
        cut = value.split(":")
        for k in range(1, len(cut)):  # PATH:abc, PATH:1:, PATH:1:2:3 — the strengths are wrong, not the file
            if not os.path.exists(":".join(cut[:-k])):
                continue
            fields = cut[-k:]
            bad = next((f for f in fields if f and not _is_number(f)), None)
            if k > 2 and bad is None and "" not in fields:
                why = "more than two strengths (at most AR and NAR)"
            elif bad is not None:
                why = f"strength {bad!r} is not a number"
            elif "" in fields:  # break-it (stop 40): PATH:1: was looked for as a file named "PATH:1:"
                why = "a strength after ':' is empty"
            else:
                continue  # PATH:1 where "PATH:1" exists too: said below
            raise argparse.ArgumentTypeError(f"--lora {value!r}: {why} (forms: PATH, PATH:S for both experts, "
                                             "PATH:AR:NAR; e.g. adapter.safetensors:0.8 or "
                                             "adapter.safetensors:1:0.5)")
        for n in range(1, len(nums) + 1):  # a file whose own name ends in ":<number>" (x:1)
            longer = ":".join(cut[:len(cut) - len(nums) + n])
            if os.path.exists(longer):
                raise argparse.ArgumentTypeError(
                    f"LoRA file {path!r} not found, but {longer!r} exists: the text after its last ':' was read as "
                    f"a strength; give the strengths too, e.g. {longer}:1:1 (form: PATH[:AR[:NAR]])")
        raise argparse.ArgumentTypeError(f"LoRA file {path!r} not found (form: PATH[:AR[:NAR]])")
    return path, ar, nar


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
    rows = []
    if synthetic and (args.max_abc_tokens is None or args.max_seconds is None):
        # the rows' own budgets decide the notes below (new-user / break-it findings: notes for caps no row reaches);
        # a problem of the whole file (missing, not UTF-8, no request) is the error here, before any note
        from .batch.requests import read_requests
        rows, _ = read_requests(args.requests)
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
    # the NAR keeps int8 layers only on a CPU (Ray: CPU actors with --ray-cpu-workers, else one GPU each)
    nar_float = args.ray_cpu_workers is None if args.ray is not None else device.type == "cuda"
    options = BatchOptions(args.requests, args.output, args.max_batch, args.budget, args.resume, args.steps,
                           args.max_seconds, abc_cap, overlap=args.overlap, method=args.ode_method,
                           continuous=args.continuous,
                           run={"checkpoint": os.path.abspath(checkpoint), "device": args.device, "dtype": args.dtype,
                                "loras": [[os.path.abspath(p), a, n] for p, a, n in args.lora],
                                "vae": os.path.abspath(args.vae) if args.vae else None,
                                # how LoRAs go onto int8 layers (YUE2_LORA_INT8): recorded when they reach one
                                # (stop 41: not for adapters on float layers only); a --resume compares it
                                "lora_int8": int8_mode() if reaches_int8(info, stack, nar_float) else None,
                                "vendor_vae": vendor_vae_record(info, args.vae)})
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


def _named(what: str):
    """An argparse type: the text as given, refusing an empty one — `--abc-file ""` (an unset shell variable) was
    read as "option not given" and silently changed the request (the model wrote its own lead sheet; the checkpoint
    search fell through to a download)."""
    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{text!r} names no {what} (an unset shell variable?); give its path, or "
                                             "leave the option out")
        return text
    return check


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (new-user review 43: a mistyped option printed the top-level usage and
    "unrecognized arguments: --max-second 5", naming neither the subcommand nor the option meant; `--cot ful`
    printed ten lines of usage before its error). The error names the subcommand, the closest option for an
    unknown one, and where the accepted options are listed."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; {self.prog} --help lists what is accepted\n")

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:  # reported by the subcommand's parser (its prog, its options), not the top-level one
            parser = self
            for action in self._actions:
                if isinstance(action, argparse._SubParsersAction):
                    parser = action.choices.get(getattr(parsed, action.dest, None), self)
            parser.error(_unrecognized(parser, extra))
        return parsed


def _unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """argparse's "unrecognized arguments: …", with the closest option of `parser` for each unknown one."""
    import difflib
    known = [s for a in parser._actions for s in a.option_strings if a.help != argparse.SUPPRESS]
    hints = []
    for word in extra:
        if word.startswith("-"):
            close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=0.6)
            if close and close[0] not in hints:
                hints.append(close[0])
    text = "unrecognized arguments: " + " ".join(extra)
    return text + (f" (did you mean {' / '.join(hints)}?)" if hints else "")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m yue2_core", description="YuE2-3B songs from a style and lyrics.", allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True)
    add_parser = sub.add_parser
    sub.add_parser = lambda *a, **kw: add_parser(*a, allow_abbrev=False, **kw)  # --check is not --checkpoint

    def common(sp, render: bool = False):
        sp.add_argument("--checkpoint", type=_named("checkpoint file"),
                        help="YuE2 all-in-one .safetensors, or the vendor's m-a-p/YuE2-3B folder (default: " + (
                            "the checkpoint the song's config.json records, when it still exists; else "
                            if render else "") +
                        "$YUE2_CHECKPOINT, ComfyUI models/checkpoints when this pack sits in ComfyUI/custom_nodes "
                        "or $COMFYUI_PATH is set, the vendor's m-a-p/YuE2-3B in the Hugging Face cache, else "
                        "download Comfy-Org/YuE2's int8 file, 3.7 GB)")
        sp.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:1 …")
        sp.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"],
                        help="LM compute dtype (default bf16, the release's; the VAE is always fp32)")
        sp.add_argument("--steps", type=int, default=None if render else 32,
                        help="ODE steps of the renderer (default " + ("the song's own, from its config.json: the same "
                             "audio as the song" if render else "32") + "; 2 model evaluations each with the midpoint "
                             "solver, 1 with --ode-method ab2)")
        sp.add_argument("--offline", action="store_true", help="never download")
        sp.add_argument_group("required").add_argument("--output", required=True,
                                                       help="new song directory (must not exist or be empty)")
        sp.add_argument("--lora", action="append", default=[], metavar="PATH[:AR[:NAR]]", type=parse_lora,
                        help="apply a LoRA/LoKr adapter (any published YuE2 layout; repeat to stack); one number sets "
                             "both strengths, two set AR then NAR (default 1)"
                             + ("; replaces the adapters the song was made with" if render else ""))
        if render:
            sp.add_argument("--no-lora", action="store_true",
                            help="render without any adapter, not the ones the song was made with")
        sp.add_argument("--checkpoint-how", help=argparse.SUPPRESS)  # scripts/song.sh: how it picked --checkpoint
        sp.add_argument("--vae", metavar="PATH", help="a VAE decoder file or vendor VAE folder to use instead of "
                        + ("the one the song was made with" if render else "the checkpoint's"))

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
    g.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"seed of the lead sheet, the music tokens and the render (default {DEFAULT_SEED}, the "
                        "release's: the same inputs and seed give the same song every run — pass another seed for "
                        "another take; the seed used is printed)")
    g.add_argument("--abc-file", type=_named("ABC file"), help="use this ABC lead sheet (UTF-8) instead of letting the model write one; it "
                                      "is used as given, the dialect check's findings are printed as warnings")
    g.add_argument("--cfg-scale", type=float, default=None, help="guidance (default 1.0; 1.01 in off mode)")
    g.add_argument("--max-seconds", type=float, default=None, help="cap the music length (25 tokens per second; "
                   "default: the release's 9,000 tokens = 360 s, a long wait on a CPU)")
    g.add_argument("--max-abc-tokens", type=int, default=None,
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
    r.add_argument("song", type=_named("song folder"), help="song directory written by generate")
    r.add_argument("--seed", type=int, default=None, help="new seed (samples new music tokens)")
    r.add_argument("--max-seconds", type=float, default=None,
                   help="cap the new music when tokens are resampled (default: the song's own budget)")
    common(r, render=True)
    ode_method(r, render=True)
    r.set_defaults(func=cmd_render)

    i = sub.add_parser("inspect", help="identify a checkpoint, a LoRA adapter, a VAE file or a song folder and "
                                       "describe it")
    i.add_argument("checkpoint", type=_named("file or folder"), help="a checkpoint file or vendor folder, a LoRA/LoKr adapter, a VAE file/folder, "
                                      "or a song folder (its files are verified against result.json)")
    i.add_argument("--model", metavar="CHECKPOINT", type=_named("checkpoint file"), help="check an adapter against this checkpoint's geometry "
                                                         "(default: the release YuE2-3B geometry)")
    i.set_defaults(func=cmd_inspect)

    m = sub.add_parser("make-synthetic", help="write a synthetic checkpoint with random weights (for tests)")
    m.add_argument("--output", required=True, metavar="FILE.safetensors",
                   help="the checkpoint file to write (an existing file needs --force)")
    m.add_argument("--profile", default="tiny", choices=["tiny", "full"],
                   help="tiny: a small model for CPU tests (default); full: the release geometry (7.8 GB bf16)")
    m.add_argument("--format", default="bf16", choices=["bf16", "int8"],
                   help="bf16 (default) or the int8 ConvRot layout of yue2_3b_int8_convrot.safetensors")
    m.add_argument("--seed", type=int, default=0, help="the random weights' seed (default 0)")
    m.add_argument("--force", action="store_true", help="replace an existing file at --output")
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
    b.add_argument("--max-batch", type=int, default=None, help="songs per AR batch (default on CUDA: 8, or fewer "
                                                                 "when --budget holds fewer; on the CPU, where rows "
                                                                 "are not batched: 1, each song saved before the next "
                                                                 "starts — but with --continuous the CPU decodes up to "
                                                                 "8 rows too, or the queue's length if shorter)")
    b.add_argument("--budget", type=float, default=None, metavar="GiB", help="device memory the batch may use, "
                   "weights included (default: what is free now); sizes the batch")
    b.add_argument("--resume", action="store_true", help="finish a batch in --output: songs that verify are "
                                                         "skipped, damaged ones redone")
    b.add_argument("--max-seconds", type=float, default=None, help="cap every song's music (25 tokens per second; a "
                   "row asking for less keeps its own; uncapped, a row gets its semantic_sampling.max_tokens, else "
                   "the release's 9,000 tokens = 360 s)")
    b.add_argument("--max-abc-tokens", type=int, default=None, help="cap every lead sheet, in tokens (a row asking "
                   "for less keeps its own; uncapped: its abc_sampling.max_tokens, else the release's 4,096)")
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
    b.add_argument("--ray-cpu-workers", type=int, default=None, metavar="N", help="with --ray: N CPU engine actors "
                   "instead of one per GPU (tests, dry runs)")
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
