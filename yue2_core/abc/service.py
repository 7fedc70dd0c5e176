"""`analyze(payload)`: the pure function behind the editor's HTTP route. It never raises on user input."""

from __future__ import annotations

import json
import logging
import math

from .engrave import render
from .errors import AbcError
from .parser import readable, scan
from .structure import describe
from .timeline import playback
from .validate import check

MAX_ABC_BYTES = 100_000  # 100 kB of UTF-8; a generated 6-minute score is about 10 kB
EDITOR_DURATION = "the Composer's max_seconds input"  # the editor's max_seconds comes from the Composer's widget
LOG = logging.getLogger(__name__)


def analyze(payload: dict) -> dict:
    """Check and describe one score for the editor.

    payload: {"abc": str (≤ 100 kB UTF-8), "instrumental": bool = False, "max_seconds": positive number | None,
    "engrave": bool = False}. Returns {"ok": no errors, "issues": [Issue dicts], "structure": dict | None,
    "timeline": dict | None, "svg": str | None, "svg_error": str | None, "time_map": list | None}; structure and
    timeline are None when the text does not parse (timeline: `timeline.playback`, what the synth plays — at most
    12,000 notes and chord symbols, "cut_s" saying where it stops when there are more), svg and time_map
    (engrave.time_map: SVG note ids -> seconds) are None unless engraving was asked for and worked (svg_error says
    why not). "ok" is False when the text has an
    error, an unpaired surrogate included (the Composer refuses such text). Lines may end in LF, CR LF or CR.
    Bad input gives {"error": "<what is wrong and what is accepted>"}; an unexpected internal failure gives
    {"error": "internal error: ..."} and is logged. Nothing is raised.
    """
    try:
        problem = _check_payload(payload)
        if problem:
            return {"error": problem}
        return _analyze(payload["abc"], bool(payload.get("instrumental", False)), payload.get("max_seconds"),
                        bool(payload.get("engrave", False)))
    except Exception as error:  # the route must answer; a bug here is reported, not raised
        LOG.exception("ABC analysis failed")
        return {"error": f"internal error while analysing the score: {type(error).__name__}: {error}"}


def _check_payload(payload) -> str | None:
    if not isinstance(payload, dict):
        return f"The request body must be a JSON object with an 'abc' string, not {type(payload).__name__}."
    abc = payload.get("abc")
    if not isinstance(abc, str):
        return f"'abc' must be a string with the score text, not {type(abc).__name__}."
    size = len(abc.encode("utf-8", "surrogatepass"))
    if size > MAX_ABC_BYTES:
        return f"The score is {size:,} bytes; the editor accepts at most {MAX_ABC_BYTES:,} bytes (100 kB)."
    for name in ("instrumental", "engrave"):
        if name in payload and not isinstance(payload[name], bool):
            return f"'{name}' must be true or false, not {_json_shown(payload[name])}."
    seconds = payload.get("max_seconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or not _finite(seconds) or seconds <= 0):
        return f"'max_seconds' must be a positive number of seconds or null, not {_json_shown(seconds)}."
    return None


def _json_shown(value) -> str:
    """A request value as the JSON the client sent spells it (null, true, -5, NaN, the text "false"; arrays and
    objects by kind), at most ≈ 40 characters: nodes break-it review, stop 51 — the refusals named Python's types
    ("not NoneType", "not str") or values ("not True")."""
    if isinstance(value, (list, tuple)):
        return "a JSON array"
    if isinstance(value, dict):
        return "a JSON object"
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > 40:
        text = f"{text[:20]}… ({len(text)} characters)"
    return f"the text {text}" if isinstance(value, str) else text


def _finite(x) -> bool:
    """math.isfinite that also says False for an int too large for a float (a JSON 1e400 written out in digits:
    break-it finding — OverflowError made an HTTP 500)."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def _analyze(abc: str, instrumental: bool, max_seconds, want_svg: bool) -> dict:
    score = scan(abc)  # read once; every part of the answer comes from this one parse
    issues = check(score, instrumental=instrumental, max_seconds=max_seconds, duration_setting=EDITOR_DURATION)
    result = {"ok": not any(i.severity == "error" for i in issues), "issues": [i.to_dict() for i in issues],
              "structure": None, "timeline": None, "svg": None, "svg_error": None, "time_map": None}
    try:
        readable(score)
    except AbcError as error:
        result["svg_error"] = f"The score does not parse ({error}); nothing to engrave." if want_svg else None
        return result
    result["structure"] = describe(score)
    result["timeline"] = playback(score)  # compact, capped: sent with every edit
    if want_svg:
        try:
            engraved = render(score)
            result["svg"], result["time_map"] = engraved["svg"], engraved["time_map"]
        except AbcError as error:
            result["svg_error"] = str(error)
    return result
