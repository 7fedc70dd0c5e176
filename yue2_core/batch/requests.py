"""The vendor's request JSONL (runtime.md §7.4), parsed and validated row by row (driver side, no torch work).

One JSON object per line (blank lines and lines starting with `#` are skipped). Fields:

    id                 required, unique in the file, a safe folder name (`protocol.valid_song_id`)
    style | tags       the style line; `tags` is an alias of `style`, both given must be equal (runtime.md §1.3)
    lyrics, cot, seed, cfg_scale, abc      as `SongRequest` (defaults: "", "full", 831001, mode default, none)
    abc_path           a UTF-8 score file, relative to the request file, inside its folder tree; not with `abc`
    abc_sampling, semantic_sampling        objects overriding fields of the ABC / semantic preset (`Sampling`)
    lang, clip_id, eval_*                  metadata, ignored
    prompt             metadata, but when present it must equal the request's prompt text (`SongRequest.text()`)

Anything else is refused for that row only. A bad row becomes a `RowError` (line number, id when readable, message);
the others run. `check_context` refuses a row whose prompt plus budget cannot fit the 24,576-token context, saying
how many seconds fit.
"""
from __future__ import annotations

import json
import os
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from ..constants import DEFAULT_SEED
from ..errors import BudgetError, RequestError, YuE2Error, quoted as _quoted
from ..protocol import (ABC_PRESET, SEMANTIC_PRESET, SongRequest, check_budget, planning_prefix, seconds_to_tokens,
                        semantic_prefix, valid_song_id)

ALLOWED = frozenset({"id", "style", "tags", "lyrics", "cot", "seed", "abc", "abc_path", "cfg_scale", "abc_sampling",
                     "semantic_sampling"})
IGNORED = frozenset({"lang", "clip_id", "prompt"})  # plus every key starting with "eval_" (runtime.md §7.4)
MAX_REQUESTS_FILE = 64 * 2 ** 20  # 64 MiB: tens of thousands of rows with lyrics
MAX_SCORE_FILE = 1 << 20  # an abc_path file, as the CLI's --abc-file


@dataclass
class BatchRequest:
    """One valid row: its 1-based `line`, the `SongRequest` (id = the row's id), the `Budgets` of its two phases
    (the presets with the row's overrides and the command's --max-seconds / --max-abc-tokens caps) and `raw`, the
    row as read (recorded in batch.json)."""

    line: int
    request: SongRequest
    budgets: object  # pipeline.Budgets
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def id(self) -> str:
        return self.request.id


@dataclass
class RowError:
    """A row refused before any work: `line` (1-based), `id` when the row had a readable one, the message."""

    line: int
    id: str | None
    message: str


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list) -> dict:
    """json.loads object hook: a dict, or _DuplicateKey naming a key given twice in one object."""
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)
    return dict(pairs)


def read_requests(path: str | os.PathLike, *, max_seconds: float | None = None,
                  max_abc_tokens: int | None = None) -> tuple[list[BatchRequest], list[RowError]]:
    """Parse the JSONL file at `path` → (valid rows in file order, refused rows). `max_seconds` /
    `max_abc_tokens` cap every row's budgets (as `generate --max-seconds / --max-abc-tokens`).

    Raises RequestError for the file as a whole: missing, not a regular file, larger than 64 MiB, not UTF-8, or
    holding no request at all. Row problems (not JSON — with its line number —, not an object, no/unsafe/duplicate id
    or one differing from another only in case, unknown fields, `abc` with `abc_path`, an `abc_path` outside the
    request file's folder tree or missing, invalid values) are RowErrors."""
    path = Path(path)
    try:
        if not path.is_file():
            raise RequestError(f"request file {path} {_not_a_file(path)}; give the path of a JSONL file (one JSON "
                               "object per line)")
        if path.stat().st_size > MAX_REQUESTS_FILE:
            raise RequestError(f"request file {path} is {path.stat().st_size:,} bytes; at most "
                               f"{MAX_REQUESTS_FILE:,} are accepted")
        text = path.read_text("utf-8-sig")
    except UnicodeDecodeError as exc:
        from ..text_encoding import utf16_kind
        try:
            kind = utf16_kind(path.read_bytes()[:4096])
        except OSError:
            kind = None
        if kind:  # break-it: a UTF-16 file got only "invalid start byte at byte 0"
            raise RequestError(f"request file {path} is {kind} text; the request file must be UTF-8 (one JSON object "
                               "a line): save it as UTF-8") from None
        raise RequestError(f"request file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise RequestError(f"cannot read the request file {path}: {exc.strerror or exc}") from None
    root = path.resolve().parent
    scores: dict = {}  # one text per score file shared by the rows naming it (see read_score_file)
    good: list[BatchRequest] = []
    bad: list[RowError] = []
    first_line: dict[str, int] = {}
    folded: dict[str, tuple[str, int]] = {}  # casefolded id → (id, line)
    rows = 0
    # JSONL lines end at "\n" only: str.splitlines would also cut at U+2028, U+2029, U+0085 …, which JSON allows
    # unescaped inside strings (json.dumps(..., ensure_ascii=False) writes them so)
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        rows += 1
        try:
            row = json.loads(line, object_pairs_hook=_unique_keys)
        except _DuplicateKey as exc:
            bad.append(RowError(number, None, f"line {number}: the field {exc.args[0]!r} is given twice in one object; "
                                              "give each field once (JSON keeps only the last, silently)"))
            continue
        except RecursionError:  # valid JSON, but nested deeper than Python's parser goes
            bad.append(RowError(number, None, f"line {number} nests arrays or objects too deeply to read; a request "
                                              "is one flat object of texts and numbers"))
            continue
        except (ValueError, RecursionError) as exc:
            if not isinstance(exc, json.JSONDecodeError) and "digits" in str(exc):  # int(…) over Python's cap
                bad.append(RowError(number, None, f"line {number} holds a number with thousands of digits; seeds "
                                                  "are integers below 2**63"))
                continue
            where = ""
            if isinstance(exc, json.JSONDecodeError):
                at = exc.doc[exc.pos] if exc.pos < len(exc.doc) else ""
                # an invisible character (NUL bytes, a DOS end-of-file Ctrl+Z, a zero-width space) is named
                # (break-it, stop 39: "column 42: Extra data" for a trailing \x1a)
                hidden = (f", at an invisible character U+{ord(at):04X}"
                          if at and at != "\t" and unicodedata.category(at) in ("Cc", "Cf") else "")
                where = f" (column {exc.colno}: {exc.msg}{hidden})"
            bad.append(RowError(number, None, f"line {number} is not JSON{where}; each line must be one JSON "
                                              'object such as {"id": "song1", "style": "…", "lyrics": "…"}'))
            continue
        if not isinstance(row, dict):
            bad.append(RowError(number, None, f"line {number} is a JSON {type(row).__name__}, not an object "
                                              "({\"id\": …, \"style\": …, …})"))
            continue
        rid = row.get("id")
        rid_ok = valid_song_id(rid) and rid.lower() != "batch.json"  # the reserved id fails in parse_row
        if rid_ok and rid in first_line:
            bad.append(RowError(number, None, f"line {number}: id {rid!r} is already used on line {first_line[rid]}; "
                                              "every row needs a unique id (it names the song's folder)"))
            continue
        if rid_ok and rid.casefold() in folded:  # one folder on case-insensitive file systems (macOS, Windows)
            other, at = folded[rid.casefold()]
            bad.append(RowError(number, None, f"line {number}: id {rid!r} differs from {other!r} (line {at}) only "
                                              "in case; their song folders would be one folder on macOS and Windows "
                                              "file systems — give every row an id unique regardless of case"))
            continue
        if rid_ok:
            first_line[rid] = number
            folded[rid.casefold()] = (rid, number)
        try:
            good.append(parse_row(row, number, root, max_seconds=max_seconds, max_abc_tokens=max_abc_tokens,
                                  scores=scores))
        except YuE2Error as exc:
            bad.append(RowError(number, rid if rid_ok else None, f"line {number}: {exc}"))
    if rows == 0:
        raise RequestError(f"request file {path} holds no requests (one JSON object per line)")
    if not good and rows > 1 and all(" is not JSON" in e.message for e in bad):
        _refuse_one_document(path, text)
    return good, bad


def _refuse_one_document(path: Path, text: str) -> None:
    """RequestError when the whole file is one JSON document spread over lines (pretty-printed, a list of rows, a
    batch output's batch.json) — break-it finding: it was refused line by line, 138 "line N is not JSON" rows.
    Returns when the file is not valid JSON as a whole either (then the row errors stand)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return
    kind = {dict: "object", list: "list"}.get(type(doc), "value")
    hint = (" (it is a batch output's batch.json: to finish that batch run `batch` with the same request file, "
            "--output that folder and --resume)" if path.name == "batch.json" else "")
    fix = (" — a list of rows becomes JSONL with `jq -c '.[]' FILE`" if kind == "list" else "")
    raise RequestError(f"request file {path} is one JSON {kind} spread over {text.count(chr(10)) + 1} lines, not "
                       f"JSONL: batch reads one JSON object per line, each a request such as "
                       f'{{"id": "song1", "style": "…", "lyrics": "…"}}{fix}{hint}')


def parse_row(row: dict, line: int, root: Path, *, max_seconds=None, max_abc_tokens=None,
              scores: dict | None = None) -> BatchRequest:
    """One row (a dict) → BatchRequest. `root`: the request file's folder (abc_path is resolved against it);
    `scores`: score texts already read by this request file's rows (`read_score_file`'s cache).
    `max_seconds` / `max_abc_tokens` cap the row's music / ABC budget (a row asking for less keeps its own). Raises
    RequestError / ScoreError / BudgetError naming the field."""
    from ..pipeline import Budgets
    rid = row.get("id")
    if "id" not in row:
        raise RequestError("the row has no 'id'; every row needs a unique id (it names the song's folder)")
    if not valid_song_id(rid):
        raise RequestError(f"id {rid!r} is not a safe folder name: use 1–180 characters from A–Z a–z 0–9 _ . -, "
                           "starting with a letter or digit, not ending with '.', not a reserved name like CON")
    if rid.lower() == "batch.json":
        raise RequestError(f"id {rid!r} is reserved: the batch folder's summary file is batch.json; give the row "
                           "another id")
    unknown = sorted(k for k in row if k not in ALLOWED and k not in IGNORED and not str(k).startswith("eval_"))
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(map(repr, unknown))}; accepted: {', '.join(sorted(ALLOWED))}"
                           f" (ignored metadata: {', '.join(sorted(IGNORED))}, eval_*)")
    style = row.get("style", row.get("tags", ""))
    if "style" in row and "tags" in row and row["style"] != row["tags"]:
        raise RequestError("'style' and 'tags' are both given and differ; 'tags' is an alias of 'style' — give one")
    if "abc" in row and "abc_path" in row:
        raise RequestError("'abc' and 'abc_path' are both given; give the score inline or as a file, not both")
    abc = row.get("abc")
    if "abc_path" in row:
        abc = read_score_file(row["abc_path"], root, cache=scores)
    abc_preset = _preset(ABC_PRESET, row.get("abc_sampling"), "abc_sampling")
    sem_preset = _preset(SEMANTIC_PRESET, row.get("semantic_sampling"), "semantic_sampling")
    # the command's caps only ever shorten a row's own budgets (Budgets would replace them)
    if max_seconds is not None and seconds_to_tokens(max_seconds) >= sem_preset.max_tokens:
        max_seconds = None
    if max_abc_tokens is not None and max_abc_tokens >= abc_preset.max_tokens:
        max_abc_tokens = None
    budgets = Budgets(max_seconds, max_abc_tokens, abc=abc_preset, semantic=sem_preset)
    request = SongRequest(style=style, lyrics=row.get("lyrics", ""), cot=row.get("cot", "full"),
                          seed=row.get("seed", DEFAULT_SEED), abc=abc, cfg_scale=row.get("cfg_scale"),
                          id=rid).validate()
    if "prompt" in row and row["prompt"] != request.text():
        raise RequestError("'prompt' does not equal this request's prompt text (instruction for cot "
                           f"{request.cot!r}, [Tags], style, [Lyrics], lyrics); drop 'prompt' or fix style/lyrics/cot")
    budgets.abc_sampling(), budgets.semantic_sampling()  # bad overrides fail here, with the field named
    return BatchRequest(line, request, budgets, dict(row))


def budget_notes(item: BatchRequest) -> list[str]:
    """A row's own min_tokens that the command's caps (--max-seconds, --max-abc-tokens) lowered to fit its budget,
    in words (break-it finding: the lower value was recorded without a word)."""
    notes = []
    for name, sampling in (("abc_sampling", item.budgets.abc_sampling), ("semantic_sampling",
                                                                         item.budgets.semantic_sampling)):
        given = item.raw.get(name, {}).get("min_tokens") if isinstance(item.raw.get(name), dict) else None
        used = sampling().min_tokens
        if type(given) is int and given > used:
            cap = "--max-abc-tokens" if name == "abc_sampling" else "--max-seconds"
            notes.append(f"{name}.min_tokens {given} is more than {cap} leaves; lowered to {used}")
    return notes


def _preset(base, overrides, name: str):
    if overrides is None:
        return base
    if not isinstance(overrides, dict):
        raise RequestError(f"'{name}' must be an object of sampling fields, got {type(overrides).__name__}")
    phase = name.split("_")[0]
    try:
        return base.merged(overrides).validate(phase)
    except RequestError as exc:
        message = str(exc).removeprefix(f"{phase} sampling: ")  # the field's name is said once, below
        hint = ""
        short = overrides.get("max_tokens")
        if "min_tokens" not in overrides and type(short) is int and 0 < short < base.min_tokens:
            # the vendor refuses min > max too (runtime.md §2.1); say where the min comes from and what to add
            hint = (f" — the preset's min_tokens is {base.min_tokens} (the release's default); give min_tokens "
                    f"too, e.g. {{\"min_tokens\": 0, \"max_tokens\": {overrides['max_tokens']}}}")
        raise RequestError(f"{name}: {message}{hint}") from None


def _not_a_file(path: Path) -> str:
    """Why `path`, which is not a regular file, cannot be read: "does not exist", "is a directory, not a regular
    file", "is a FIFO (named pipe), not a regular file" … (break-it review, stop 48: a folder given as the request
    file or as an abc_path was "does not exist or is not a regular file", as the command line's text files were
    before stop 41)."""
    from ..weights.checkpoint import not_a_file
    kind = not_a_file(str(path))
    return "does not exist" if kind is None else f"is {kind}, not a regular file"


def read_score_file(value, root: Path, cache: dict | None = None) -> str:
    """The text of an `abc_path` (relative to the request file's folder `root`, or absolute but inside it): a regular
    UTF-8 file of at most 1 MiB within `root`'s tree after resolving links. Raises RequestError otherwise; a long
    path is quoted by its start and end (`_quoted`: a 5,000-character abc_path was quoted whole, twice).
    `cache`: {(file, size, mtime): text} of the files read so far — rows naming one file share one text (stop 58:
    10,000 rows naming one 200,000-character score held 10,000 copies, ≈ 2 GB)."""
    if not isinstance(value, str) or not value:
        raise RequestError(f"'abc_path' must be a file path (text), got {_quoted(value)}")
    name = f"abc_path {_quoted(value)}"
    if "\x00" in value:
        raise RequestError(f"{name} contains a NUL character; give a file path")
    try:
        target = (root / value).resolve()
    except (RuntimeError, OSError) as exc:  # a symbolic-link loop (RuntimeError before Python 3.13), a name too long
        why = "a symbolic-link loop" if "loop" in str(exc).lower() else getattr(exc, "strerror", None) or exc
        raise RequestError(f"{name}: cannot follow it ({why})") from None
    shown = _quoted(target, quote=False)
    try:
        target.relative_to(root)
    except ValueError:
        raise RequestError(f"{name} points outside the request file's folder {_quoted(root, quote=False)} (to "
                           f"{shown}); score files must lie in that folder or below it") from None
    try:
        if not target.is_file():
            raise RequestError(f"{name}: {shown} {_not_a_file(target)}; give the path of a UTF-8 score file")
        st = target.stat()
        if st.st_size > MAX_SCORE_FILE:
            raise RequestError(f"{name} is {st.st_size:,} bytes; at most {MAX_SCORE_FILE:,} are accepted")
        key = (str(target), st.st_size, st.st_mtime_ns)
        if cache is not None and key in cache:
            return cache[key]
        text = target.read_bytes().decode("utf-8")  # as --abc-file: nothing rewritten (a BOM, CRLF stay; warned)
        if cache is not None:
            cache[key] = text
        return text
    except UnicodeDecodeError:
        raise RequestError(f"{name} is not UTF-8 text") from None
    except OSError as exc:
        raise RequestError(f"{name}: cannot read {shown} ({exc.strerror or exc})") from None


def prompt_tokens(item: BatchRequest, encode) -> dict:
    """Token counts of a row before any generation: `planning` (the planning prefix, 0 without a planning stage),
    `semantic` (the semantic prefix — exact with a given score or cot off, else the planning prefix + the ABC budget
    + 2 markers: the longest it can get) and `negative` (the CFG prefix, 0 without CFG)."""
    from ..protocol import negative_prefix
    req, b = item.request, item.budgets
    if req.cot == "off" or req.abc is not None:
        ids = list(encode(req.abc)) if req.abc is not None else []
        sem = len(semantic_prefix(req, ids, encode))
        neg = len(negative_prefix(req, ids, encode)) if req.guidance != 1.0 else 0
        return {"planning": 0, "semantic": sem, "negative": neg}
    plan = len(planning_prefix(req, encode))
    sem = plan + b.abc_sampling().max_tokens + 2
    return {"planning": plan, "semantic": sem, "negative": sem if req.guidance != 1.0 else 0}


def check_context(item: BatchRequest, encode) -> dict:
    """Refuse a row whose prompt plus budget exceeds the context: the ABC phase (planning prefix + ABC budget), and
    the music phase with the shortest score (planning prefix + 2) or the exact prefix of a given score / cot off —
    the checks `generate` makes before it samples. Raises BudgetError saying how many tokens and seconds fit;
    returns `prompt_tokens`."""
    b = item.budgets
    sem = b.semantic_sampling()
    counts = prompt_tokens(item, encode)
    if counts["planning"]:
        check_budget(counts["planning"], b.abc_sampling().max_tokens, "ABC")
        check_budget(counts["planning"] + 2, sem.max_tokens, "semantic")
    else:
        check_budget(counts["semantic"], sem.max_tokens, "semantic")
    return counts


__all__ = ["BatchRequest", "RowError", "read_requests", "parse_row", "read_score_file", "check_context",
           "prompt_tokens", "ALLOWED", "IGNORED", "BudgetError"]
