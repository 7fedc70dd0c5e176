"""Song requests, sampling presets and the exact prompt protocol of the official runtime (runtime.md §1–§2).

Token sequences (runtime.md §1.4, §1.5):

    base              = [EOD] + encode(f"{INSTRUCTION}\\n[Tags]\\n{style}\\n[Lyrics]\\n{lyrics}\\n")
    planning prefix   = base + [ABC_START]                         (cot full/melody; the model writes the ABC)
    semantic prefix   = base + [ABC_START] + abc_ids + [ABC_END, MUSIC_START]   (full/melody)
                      = base + [ABC_START, ABC_END, MUSIC_START]                 (off)
    negative (CFG)    = [EOD] + encode(INSTRUCTION) + [ABC_START] + abc_ids + [ABC_END, MUSIC_START]  (full/melody)
                      = [EOD] + encode(INSTRUCTION["off"]) + [MUSIC_START]      (off: no ABC pair)
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace

from .constants import (ABC_END, ABC_START, CODEC_OFFSET, CODEC_SIZE, CONTEXT, COT_MODES, DEFAULT_CFG,
                        DEFAULT_SEED, EOD, FRAMES_PER_SECOND, INSTRUCTIONS, MUSIC_END, MUSIC_START)
from .errors import BudgetError, RequestError, ScoreError

SEED_MAX = 2 ** 63 - 1
MAX_TEXT_CHARS = 200_000  # style / lyrics / score: ~8× the whole context even at one character per token
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,179}")
#: Windows device names: a file or folder called CON, nul.txt, … cannot be created there (or talks to a device).
RESERVED_NAMES = frozenset({"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)),
                            *(f"LPT{i}" for i in range(1, 10))})


def valid_song_id(name) -> bool:
    """A song id usable as a folder name everywhere: 1–180 characters from A–Z a–z 0–9 _ . -, starting with a letter
    or digit, not ending with '.' (Windows drops it), not a reserved device name (CON, NUL.txt, COM1, …)."""
    return (isinstance(name, str) and _ID_RE.fullmatch(name) is not None and not name.endswith(".")
            and name.split(".")[0].upper() not in RESERVED_NAMES)


def _is_int(value) -> bool:
    return type(value) is int  # exactly int: bool and numpy ints are rejected, as the reference does


def _check_text(name: str, text: str) -> None:
    """Text must be valid Unicode (encodable as UTF-8): a lone surrogate, e.g. from a JSON "\\ud800" escape, cannot
    be tokenized."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{name} contains an unpaired surrogate U+{ord(text[exc.start]):04X} at character "
                           f"{exc.start}; it is not valid Unicode text — remove it") from None


def blank_score(text: str) -> bool:
    """Whether a score holds nothing but whitespace and byte-order marks: `str.strip` keeps U+FEFF, so an editor's
    "empty" file saved as UTF-8 with a BOM counted as a score of one invisible character (break-it review, stop 42)."""
    return not text.replace("\ufeff", "").strip()


def silent_vocal(abc: str | None) -> bool:
    """Whether `abc` is a lead sheet whose Vocal voice has bars and sounds no note (rests, chord symbols over them):
    the instrumental score the dialect asks for [U 1–2]. False for no score, a blank one, or one without Vocal
    bars."""
    if not isinstance(abc, str) or blank_score(abc):
        return False
    from .abc.parser import scan  # the ABC package is torch-free and never imports this module
    parsed = scan(abc)
    return bool(parsed.voices.get("Vocal")) and not any(n.kind == "note" for _, n in parsed.notes("Vocal"))


def _finite_number(value) -> bool:
    """An int or float (not bool) with a finite value. An int too large for a float is not finite (math.isfinite
    would raise OverflowError on it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True)
class Sampling:
    """Per-phase sampling settings; defaults are the semantic preset (runtime.md §2.1).

    temperature in [0, 5] (0 = argmax), top_p in (0, 1], top_k ≥ 1, repetition_penalty > 0 (count-exponentiated over
    the last `penalty_window` generated tokens, window in [1, 100]), 0 ≤ min_tokens ≤ max_tokens, max_tokens ≥ 1.
    `validate()` raises RequestError naming the field and the accepted range."""

    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 100
    repetition_penalty: float = 1.2
    penalty_window: int = 50
    min_tokens: int = 200
    max_tokens: int = 9000

    def validate(self, phase: str = "") -> "Sampling":
        where = f"{phase} sampling" if phase else "sampling"
        for name in ("top_k", "penalty_window", "min_tokens", "max_tokens"):
            if not _is_int(getattr(self, name)):
                raise RequestError(f"{where}: {name} must be an integer, got {getattr(self, name)!r}")
        for name in ("temperature", "top_p", "repetition_penalty"):
            value = getattr(self, name)
            if not _finite_number(value):
                raise RequestError(f"{where}: {name} must be a finite number, got {value!r}")
        if not 0 <= self.temperature <= 5:
            raise RequestError(f"{where}: temperature must be in [0, 5], got {self.temperature}")
        if 0 < self.temperature < 1e-3:
            raise RequestError(f"{where}: temperature {self.temperature} is too small to sample with (the scores "
                               "overflow); use 0 for greedy decoding or a value ≥ 0.001")
        if not 0 < self.top_p <= 1:
            raise RequestError(f"{where}: top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 1:
            raise RequestError(f"{where}: top_k must be ≥ 1, got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise RequestError(f"{where}: repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not 1 <= self.penalty_window <= 100:
            raise RequestError(f"{where}: penalty_window must be in [1, 100], got {self.penalty_window}")
        if self.max_tokens < 1:
            raise RequestError(f"{where}: max_tokens must be ≥ 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise RequestError(f"{where}: min_tokens must be in [0, max_tokens={self.max_tokens}], "
                               f"got {self.min_tokens}")
        return self

    def merged(self, overrides: dict | None) -> "Sampling":
        """A copy with the given fields replaced (unknown fields raise RequestError)."""
        if not overrides:
            return self
        unknown = set(overrides) - set(asdict(self))
        if unknown:
            raise RequestError(f"unknown sampling fields {sorted(unknown)}; accepted: {sorted(asdict(self))}")
        return replace(self, **overrides)

    def to_dict(self) -> dict:
        return asdict(self)


ABC_PRESET = Sampling(0.7, 0.9, 30, 1.005, 100, 32, 4096)  # runtime.md §2.2 GenerationConfig.abc
SEMANTIC_PRESET = Sampling()  # runtime.md §2.1 class defaults


@dataclass(frozen=True)
class SongRequest:
    """What the user asks for (runtime.md §2.3). `abc` supplies a score (planning is skipped); `cfg_scale` None means
    the mode default (1.01 off, 1.0 full/melody)."""

    style: str
    lyrics: str
    cot: str = "full"
    seed: int = DEFAULT_SEED
    abc: str | None = None
    cfg_scale: float | None = None
    id: str = "song"
    warnings: tuple = field(default=(), compare=False)

    def validate(self) -> "SongRequest":
        if self.cot not in COT_MODES:
            raise RequestError(f"cot must be one of {', '.join(COT_MODES)}; got {self.cot!r}")
        for name in ("style", "lyrics"):
            if not isinstance(getattr(self, name), str):
                raise RequestError(f"{name} must be text, got {type(getattr(self, name)).__name__}")
            if len(getattr(self, name)) > MAX_TEXT_CHARS:
                raise BudgetError(f"{name} is {len(getattr(self, name)):,} characters: far beyond what the "
                                  f"{CONTEXT}-token context holds (at most {MAX_TEXT_CHARS:,} characters are accepted)")
            _check_text(name, getattr(self, name))
        if not _is_int(self.seed) or not 0 <= self.seed <= SEED_MAX:
            raise RequestError(f"seed must be an integer in [0, 2^63−1], got {self.seed!r}")
        if not valid_song_id(self.id):
            raise RequestError(f"song id {self.id!r} is not allowed: use 1–180 characters from A–Z a–z 0–9 _ . -, "
                               "starting with a letter or digit, not ending with '.', not a reserved name like CON")
        if self.abc is not None:
            if not isinstance(self.abc, str):
                raise RequestError(f"abc must be text, got {type(self.abc).__name__}")
            _check_text("the ABC score", self.abc)
            if self.cot == "off":
                raise RequestError("an ABC score was given with cot='off'; off mode has no score — "
                                   "use cot='full' or 'melody', or remove the score")
            if len(self.abc) > MAX_TEXT_CHARS:
                raise BudgetError(f"the ABC score is {len(self.abc):,} characters: far beyond what the {CONTEXT}-token "
                                  f"context holds (at most {MAX_TEXT_CHARS:,} characters are accepted)")
            if blank_score(self.abc):
                raise ScoreError("the ABC score is empty or whitespace; give a score or leave it unset to let the "
                                 "model write one")
        if self.cfg_scale is not None:
            c = self.cfg_scale
            if not _finite_number(c) or not 0 <= c <= 20:
                raise RequestError(f"cfg_scale must be a finite number in [0, 20], got {c!r}")
        return self

    @property
    def guidance(self) -> float:
        """Effective CFG scale: `cfg_scale`, else 1.01 for off and 1.0 for full/melody (runtime.md §2.3)."""
        return float(self.cfg_scale) if self.cfg_scale is not None else DEFAULT_CFG[self.cot]

    def text(self) -> str:
        """The prompt text, exact (runtime.md §1.3)."""
        return f"{INSTRUCTIONS[self.cot]}\n[Tags]\n{self.style}\n[Lyrics]\n{self.lyrics}\n"

    def input_warnings(self, score: str | None = None) -> list[str]:
        """Advisory notes about the inputs (never changes the request): empty style/lyrics, stage directions, NUL and
        other control characters, and `[Tags]` / `[Lyrics]` typed into the text (the prompt template puts exactly
        these lines around the style and the lyrics, runtime.md §1.3, so a typed one fakes a section). `score`: the
        ABC text the music follows when it is not the request's own `abc` (the Composer's connected score). Empty
        lyrics under a score whose Vocal voice is silent — the instrumental the note itself advises — get no "not an
        instrumental switch" note (new-user review 58: `--lyrics "" --abc-file` of a silenced score was told to use
        a silenced score)."""
        notes = []
        for name in ("style", "lyrics"):
            notes += control_notes(name, getattr(self, name))
        for marker in SECTION_MARKERS:
            if marker.lower() in self.style.lower():
                notes.append(f"style contains {marker!r}: the prompt puts exactly '[Tags]' before the style and "
                             "'[Lyrics]' before the lyrics, so this fakes a section of the prompt — remove it (the "
                             "model gets the text verbatim)")
            if any(ln.strip().lower() == marker.lower() for ln in self.lyrics.splitlines()):
                notes.append(f"lyrics contain a {marker!r} line: the prompt already puts '[Lyrics]' before the "
                             "lyrics, so this fakes a section of the prompt — remove it")
        if not self.style.strip():
            notes.append("style is empty: the model gets no genre/voice/instrument description")
        if not self.lyrics.strip():
            if not silent_vocal(self.abc if self.abc is not None else score):
                notes.append("lyrics are empty: this is NOT an instrumental switch — the model may still sing "
                             "(use an instrumental score, e.g. a silenced Vocal voice, for instrumentals)")
        else:
            lines = [ln.strip() for ln in self.lyrics.splitlines() if ln.strip()]
            if lines and all(re.fullmatch(r"\[[^\]]*\]", ln) for ln in lines):
                notes.append("lyrics contain only section tags and no words to sing")
            if any(re.search(r"\(\s*x\s*\d+\s*\)|\bx\d+\b", ln, re.I) for ln in lines):
                notes.append("lyrics use repeat shorthands like '(x2)': the model sings them literally — write "
                             "repeated lines out")
            if any(re.fullmatch(r"\((?!.*\bx\d).*\)", ln) for ln in lines):
                notes.append("lyrics contain parenthesised lines (stage directions?): the model may sing them")
        for name in ("style", "lyrics"):  # new-user finding: '[verse]\nla' typed in a shell is one line
            text = getattr(self, name)
            # one rule for inline text and --*-file text (break-it review, stop 46: CR from a node or a batch row
            # was not named): a byte-order mark and CR / CRLF line ends, and line breaks the model reads as a
            # character, U+2028 / U+2029, which an editor shows as new lines
            notes += form_notes(f"{name} text", text)
            seps = [f"U+{ord(ch):04X} ({n})" for ch, n in (("\u2028", "LINE SEPARATOR"),
                                                           ("\u2029", "PARAGRAPH SEPARATOR")) if ch in text]
            if seps:
                notes.append(f"the {name} text has {' and '.join(seps)} characters: an editor shows a line break, "
                             "but the model reads one character, not a new line; use LF (Unix) line breaks")
            if "\\n" in text and "\n" not in text:
                notes.append(f"{name} contains the two characters \\n but no line break: the model gets them as "
                             "typed, not as a new line (a shell passes '\\n' literally, where a JSON request file "
                             f"makes it a line break) — use real line breaks: --{name}-file, or $'…\\n…' in bash")
        if "\n" in self.style.strip():  # e.g. 'pop\n\n[verse]\nrock' looks like lyrics structure inside the tags
            notes.append(f"style spans {self.style.strip().count(chr(10)) + 1} lines: the prompt has one line for "
                         "the style (after '[Tags]'), so the model gets its line breaks inside the tags — write the "
                         "style on one line")
        return notes


SECTION_MARKERS = ("[Tags]", "[Lyrics]")  # the prompt template's section lines (runtime.md §1.3)
_CONTROL_NAMES = {0: "NUL", 7: "BEL", 8: "BS", 11: "VT", 12: "FF", 27: "ESC", 127: "DEL"}
# invisible format characters that change how text looks or reads without being seen: bidirectional embeddings,
# overrides and isolates (U+202A–U+202E, U+2066–U+2069: "Trojan Source" reordering), zero-width space, word joiner,
# and a byte-order mark after the start. ZWJ/ZWNJ (U+200C/U+200D) and LRM/RLM are left alone: scripts and emoji
# sequences need them.
_FORMAT_NAMES = {0x200B: "ZERO WIDTH SPACE", 0x2060: "WORD JOINER", 0xFEFF: "BYTE-ORDER MARK inside the text",
                 0x202A: "LEFT-TO-RIGHT EMBEDDING", 0x202B: "RIGHT-TO-LEFT EMBEDDING",
                 0x202C: "POP DIRECTIONAL FORMATTING", 0x202D: "LEFT-TO-RIGHT OVERRIDE",
                 0x202E: "RIGHT-TO-LEFT OVERRIDE", 0x2066: "LEFT-TO-RIGHT ISOLATE", 0x2067: "RIGHT-TO-LEFT ISOLATE",
                 0x2068: "FIRST STRONG ISOLATE", 0x2069: "POP DIRECTIONAL ISOLATE"}


def control_notes(what: str, text: str, limit: int = 3) -> list[str]:
    """One note per control character in `text` (Unicode category Cc other than tab, LF and CR; NUL included) and
    per invisible format character of `_FORMAT_NAMES` (a byte-order mark only after the first character: a leading
    one is `form_notes`' case), with its line and column: invisible in an editor, read by the model as text. At most
    `limit` notes plus a count."""
    import unicodedata
    found = []
    line, col = 1, 0
    for i, ch in enumerate(text):
        col += 1
        if ch == "\n":
            line, col = line + 1, 0
            continue
        if (ch not in "\t\r" and unicodedata.category(ch) == "Cc") or (ord(ch) in _FORMAT_NAMES
                                                                       and not (i == 0 and ch == "\ufeff")):
            found.append((line, col, ch))
    notes = [f"{what} line {ln} column {c}: "
             + (f"invisible format character U+{ord(ch):04X} ({_FORMAT_NAMES[ord(ch)]})" if ord(ch) in _FORMAT_NAMES
                else f"control character U+{ord(ch):04X}"
                + (f" ({_CONTROL_NAMES[ord(ch)]})" if ord(ch) in _CONTROL_NAMES else ""))
             + " — invisible, but the model reads it as text; remove it" for ln, c, ch in found[:limit]]
    if len(found) > limit:
        notes.append(f"{what}: {len(found) - limit} more control characters")
    return notes


def score_notes(text: str, max_seconds: float | None = None, limit: int = 20, cot: str | None = None,
                duration_setting: str | None = None) -> list[str]:
    """What the pack says about a score given from outside (CLI --abc-file, an edited score.abc, the Composer's
    score / abc_text inputs) — one rule everywhere: the score is used verbatim, as the vendor runtime uses it (the
    model reads any text), and every finding of the dialect check (`abc.validate`, with `max_seconds` for the
    too-long check; default the semantic preset's 360 s) and every control character is reported as a note
    "score line N column C: message [severity]" (the format control_notes uses too; `abc.errors.place`); with cot
    "melody", chord symbols are named too (the melody mode's lead sheet is melody-only and the vendor does not strip
    a given score's chords, runtime.md §1.4). Only what the engine cannot run is refused, elsewhere: an empty score,
    a score with cot off, a score over the context. The ABC Editor node, where scores are written, is stricter: it
    does not emit a score with errors. `duration_setting`: how the caller sets the music's duration
    ("--max-seconds", the Composer's max_seconds input), named in the too-long advice."""
    from .abc import validate
    seconds = max_seconds if max_seconds is not None else SEMANTIC_PRESET.max_tokens / FRAMES_PER_SECOND
    issues = [i for i in validate(text, max_seconds=seconds, duration_setting=duration_setting)
              if i.code not in ("line-ends", "control-character", "byte-order-mark")]
    # ↑ said once, by form_notes / control_notes (new-user finding: the same CRLF warning came twice in two wordings)
    # one format for every place in a score (stop-50 leftover): "score line N column C: message [severity]", as
    # control_notes writes its own ("score line N column C: control character …")
    lines = [f"score {i.located()} [{i.severity}]" if i.line else f"score: {i.message} [{i.severity}]"
             for i in issues[:limit]]
    if len(issues) > limit:
        lines.append(f"score: {len(issues) - limit} more findings not shown")
    return lines + melody_notes(text, cot) + form_notes("score", text) + control_notes("score", text)


def melody_notes(text: str, cot: str | None) -> list[str]:
    """With cot "melody", a note naming the score's chord symbols (break-it finding, stop 38: none was given); []
    otherwise, or when the score does not parse into bars."""
    if cot != "melody":
        return []
    from .abc import parse
    try:
        score = parse(text)
        chords = sum(len(bar.chords) for bars in score.voices.values() for bar in bars)
    except Exception:  # noqa: BLE001 - a score the dialect check already reports; this note is an extra
        return []
    if not chords:
        return []
    return [f"the score has {chords} chord symbol{'s' if chords > 1 else ''}, but cot is \"melody\": that mode's "
            "instruction asks for a melody-only transcription without chord symbols, and a given score is used as "
            "written, chords included; strip them (the ABC Editor's \"Strip chords\" button, "
            "abc.tools.strip_chords) or use cot \"full\" [warning]"]


def form_notes(what: str, text: str) -> list[str]:
    """A byte-order mark and CR line endings in a text given from outside: kept as they are (the vendor reads the
    same ids), each named once, since the model reads the mark as a character and was trained on LF."""
    notes = []
    if text.startswith("\ufeff"):
        notes.append(f"the {what} starts with a byte-order mark (U+FEFF): it is kept, as `yue2 generate` keeps it, and "
                     "the model reads it as a character; save it as UTF-8 without BOM to drop it")
    crlf, lone_cr = text.count("\r\n"), text.count("\r") - text.count("\r\n")
    if crlf or lone_cr:
        kinds = " and ".join(k for k, n in (("CRLF (Windows)", crlf), ("lone CR (old Mac)", lone_cr)) if n)
        notes.append(f"the {what} has {kinds} line endings: kept as they are (the same ids as `yue2 generate`), but "
                     "the model was trained on LF line endings; save it with LF (Unix) line endings")
    return notes


def validate_abc_ids(abc_ids) -> list[int]:
    """Every ABC id must be an int in [0, EOD=151643) (runtime.md §1.4); raises ScoreError otherwise."""
    out = []
    for i, value in enumerate(abc_ids):
        try:
            v = int(value)
        except (TypeError, ValueError):
            raise ScoreError(f"ABC token #{i} is not an integer: {value!r}") from None
        if v != value or not 0 <= v < EOD:
            raise ScoreError(f"ABC token #{i} = {value!r} is outside the text range [0, {EOD}); "
                             "protocol or codec ids cannot appear inside a score")
        out.append(v)
    return out


def base_ids(request: SongRequest, encode) -> list[int]:
    """The prompt every phase starts from: EOD, then the encoded instruction + [Tags] style + [Lyrics] text
    (`SongRequest.text`, runtime.md §1.3). `encode`: str → list of text token ids."""
    return [EOD] + list(encode(request.text()))


def planning_prefix(request: SongRequest, encode) -> list[int]:
    """Prefix the model continues with ABC ids (cot full/melody)."""
    if request.cot == "off":
        raise RequestError("cot='off' has no planning stage")
    return base_ids(request, encode) + [ABC_START]


def semantic_prefix(request: SongRequest, abc_ids, encode) -> list[int]:
    """Prefix the model continues with semantic codec tokens (ends with MUSIC_START)."""
    if request.cot == "off":
        return base_ids(request, encode) + [ABC_START, ABC_END, MUSIC_START]
    return base_ids(request, encode) + [ABC_START] + validate_abc_ids(abc_ids) + [ABC_END, MUSIC_START]


def negative_prefix(request: SongRequest, abc_ids, encode) -> list[int]:
    """Unconditional CFG prefix: instruction only (no newline, tags or lyrics) plus the same exact ABC ids."""
    instr = [EOD] + list(encode(INSTRUCTIONS[request.cot]))
    if request.cot == "off":
        return instr + [MUSIC_START]
    return instr + [ABC_START] + validate_abc_ids(abc_ids) + [ABC_END, MUSIC_START]


def check_budget(prefix_len: int, max_tokens: int, what: str = "semantic", per_second: float = FRAMES_PER_SECOND):
    """`prefix_len + max_tokens ≤ CONTEXT` or BudgetError saying how many tokens (and seconds) fit."""
    if prefix_len + max_tokens > CONTEXT:
        room = CONTEXT - prefix_len
        if what == "semantic":
            fits = (f"at most {max(room, 0)} music tokens = {max(room, 0) / per_second:.2f} s of music fit after "
                    f"this {prefix_len}-token prompt")
        else:
            fits = f"at most {max(room, 0)} {what} tokens fit after this {prefix_len}-token prompt"
        raise BudgetError(f"prompt ({prefix_len} tokens) + {what} budget ({max_tokens} tokens) exceeds the "
                          f"{CONTEXT}-token context: {fits}. Shorten the lyrics/score or lower the budget; "
                          "nothing is truncated silently.")


_CLOCK = re.compile(r"(?:(\d+):)?(\d+):(\d+(?:\.\d*)?)", re.ASCII)  # [h:]m:ss(.f)
_UNITS = re.compile(r"(?:(\d+(?:\.\d*)?) ?(?:h|hrs?|hours?))? ?(?:(\d+(?:\.\d*)?) ?(?:m|mins?|minutes?))? ?"
                    r"(?:(\d+(?:\.\d*)?) ?(?:s|secs?|seconds?))?", re.ASCII | re.IGNORECASE)


def duration_seconds(text: str) -> float | None:
    """The seconds a duration written with a clock or units means (1:30, 0:45.5, 1:02:00, 2m, 90s, 1m30s, 3 min),
    or None for anything else: for the messages that refuse such a length where seconds are asked for, saying the
    number to give (`--max-seconds 1:30`, a Regenerate cut "1:05"; new-user review 58). Never used to accept one."""
    if match := _CLOCK.fullmatch(text):
        hours, minutes, secs = match.groups()
        if float(secs) >= 60 or (hours and int(minutes) >= 60):
            return None  # not a clock time (1:75)
        return (int(hours or 0) * 60 + int(minutes)) * 60 + float(secs)
    match = _UNITS.fullmatch(text)
    if not match or not any(match.groups()):
        return None
    hours, minutes, secs = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + secs


def seconds_to_tokens(seconds: float) -> int:
    """Semantic token budget for a duration: round(seconds · 25), at least 1 (25 tokens per second of audio)."""
    if not _finite_number(seconds):
        raise RequestError(f"max duration must be a finite number of seconds, got {seconds!r}")
    if seconds <= 0:
        raise RequestError(f"max duration must be > 0 seconds, got {seconds}")
    tokens = seconds * FRAMES_PER_SECOND
    if not math.isfinite(tokens):
        raise RequestError(f"max duration {seconds} s is far beyond the {CONTEXT}-token context (at most "
                           f"{CONTEXT / FRAMES_PER_SECOND:.2f} s of music fit)")
    return max(1, round(tokens))


def semantic_budget(max_seconds: float | None, base: Sampling = SEMANTIC_PRESET) -> Sampling:
    """The semantic preset with max_tokens capped by `max_seconds` and min_tokens shrunk to fit."""
    if max_seconds is None:
        return base
    cap = seconds_to_tokens(max_seconds)
    return replace(base, max_tokens=cap, min_tokens=min(base.min_tokens, cap))


def codes_from_ids(ids) -> list[int]:
    """Semantic token ids → codes 0 … 32767 (id − 151853)."""
    codes = []
    for t in ids:
        c = int(t) - CODEC_OFFSET
        if not 0 <= c < CODEC_SIZE:
            raise RequestError(f"token {t} is not a semantic codec token")
        codes.append(c)
    return codes


def validate_codes(codes) -> list[int]:
    """Semantic codes as plain ints, each in [0, 32768) (CODEC_SIZE: codec ids relative to the codec offset).
    Raises RequestError naming the first code outside that range, or when there are none."""
    out = []
    for i, c in enumerate(codes):
        v = int(c)
        if v != c or not 0 <= v < CODEC_SIZE:
            raise RequestError(f"semantic code #{i} = {c!r} is outside [0, {CODEC_SIZE})")
        out.append(v)
    if not out:
        raise RequestError("there are no semantic codes to render (the semantic stage produced 0 tokens)")
    return out


__all__ = [
    "Sampling", "ABC_PRESET", "SEMANTIC_PRESET", "SongRequest", "validate_abc_ids", "planning_prefix",
    "semantic_prefix", "negative_prefix", "check_budget", "seconds_to_tokens", "semantic_budget", "codes_from_ids",
    "validate_codes", "MUSIC_END", "ABC_END", "score_notes", "control_notes",
]
