"""HTTP routes behind the ABC editor widget (web/yue2_abc_editor.js).

    POST /yue2/abc/analyze  {abc, engrave?, instrumental?, max_seconds?}  -> yue2_core.abc.service.analyze (+ time_map)
    POST /yue2/abc/tool     {tool, abc, arg?}                            -> {abc} | {error}
    POST /yue2/abc/tokens   {abc, ckpt_name, style?, lyrics?, cot?}      -> {tokens, prefix_tokens?, ...} | {error}

ComfyUI also serves each under /api/... (PromptServer.add_routes). Every answer is JSON; every refusal is a 4xx with
{"error": "<what is wrong and what is accepted>"}; an unexpected failure is a 500 with a one-line message (the
traceback goes to the server log, never to the client). The work itself (parsing, engraving, tokenizing) runs in a
worker thread; Verovio's engraving does not release the Python lock, so scores are bounded before engraving
(yue2_core.abc.engrave.check_size: 48 notes and 48 chord symbols per bar, 3,000 of each in all: ≤ ~2 s of CPU) to
keep the server responsive.

Registration happens when this module is imported (nodes/__init__.py imports it). Outside a running ComfyUI server
(no `server` module, or no PromptServer.instance) nothing is registered and nothing is raised.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

LOG = logging.getLogger("ComfyUI-YuE2")

MAX_ABC_BYTES = 100_000  # the editor's score limit (yue2_core.abc.service.MAX_ABC_BYTES)
MAX_BODY_BYTES = 1_000_000  # request body: a 100 kB score (up to 3x longer when JSON escapes it), style, lyrics
MAX_NAME_CHARS = 512  # ckpt_name
MAX_PROMPT_CHARS = 100_000  # style / lyrics for the budget estimate
TOOLS = ("transpose", "set_tempo", "strip_chords", "silence_vocal")
TOKENIZER_CACHE_SIZE = 4  # tokenizers kept, keyed by (path, mtime, size)

_WORK = asyncio.Semaphore(4)  # requests being worked on at once; more wait their turn (the executors queue too)


def _init_verovio_thread() -> None:
    """Verovio keeps its resource path (music fonts) per thread and its Python module sets it only in the thread that
    imports it; in any other thread toolkit() cannot load fonts and loadData() fails ("Verovio could not read the
    score"). Set it in the worker thread that engraves."""
    try:
        from importlib.resources import files

        import verovio
    except ImportError:  # engraving is optional: analyze then reports svg_error with the install hint
        return
    verovio.setDefaultResourcePath(str(files("verovio") / "data"))


# One worker thread for parsing/engraving (Verovio's toolkit is serialised by a lock anyway) and one for tokenizers,
# so a slow tokenizer load never holds up the score view.
_SCORE_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="yue2-abc", initializer=_init_verovio_thread)
_TOKEN_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="yue2-tokens")


class RequestRefused(Exception):
    """A request the routes refuse: becomes {"error": message} with `status`."""

    def __init__(self, message: str, status: int = 400, **extra):
        super().__init__(message)
        self.status = status
        self.extra = extra


# --- request plumbing ----------------------------------------------------------------------------------------------
async def read_json_object(request: web.Request, limit: int = MAX_BODY_BYTES) -> dict:
    """The request body as a JSON object, read up to `limit` bytes (RequestRefused otherwise)."""
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(request.content_length, limit)
    body = bytearray()
    while True:
        try:
            chunk = await request.content.read(65536)
        except web.RequestPayloadError as exc:  # a Content-Encoding whose bytes do not decode (was a 500: stop 51)
            why = " ".join(str(exc).split()).removeprefix("400, message: ")
            encoding = request.headers.get("Content-Encoding", "")
            raise RequestRefused(f"The request body cannot be read ({why}"
                                 f"{f'; Content-Encoding: {_short(encoding)}' if encoding else ''}); send the JSON "
                                 "object uncompressed with Content-Type: application/json, or compressed as its "
                                 "Content-Encoding header says.") from None
        if not chunk:
            break
        body += chunk
        if len(body) > limit:
            raise _too_large(None, limit)
    if not body.strip():
        raise RequestRefused("The request body is empty; send a JSON object such as {\"abc\": \"X:1 ...\"}.")
    try:
        payload = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise RequestRefused("The request body is not UTF-8 text; send a JSON object.") from None
    except (ValueError, RecursionError) as exc:
        from yue2_core.errors import json_number_too_long
        if too_long := json_number_too_long(exc):  # valid JSON Python cannot read: say so, not "not valid JSON"
            raise RequestRefused(f"The request body holds {too_long}; send a JSON object such as "
                                 "{\"abc\": \"X:1 ...\"} whose numbers have at most a few digits.") from None
        raise RequestRefused("The request body is not valid JSON (or is nested too deeply); send a JSON object such "
                             "as {\"abc\": \"X:1 ...\"} with Content-Type: application/json.") from None
    if not isinstance(payload, dict):
        raise RequestRefused(f"The request body must be a JSON object, not a JSON {_json_type(payload)}.")
    return payload


def _too_large(size: int | None, limit: int) -> RequestRefused:
    told = f" ({size:,} bytes)" if size is not None else ""
    return RequestRefused(f"The request body is too large{told}: at most {limit:,} bytes are accepted; a score may "
                          f"be at most {MAX_ABC_BYTES:,} bytes (100 kB).", status=413)


def _json_type(value) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


def abc_field(payload: dict, *, allow_empty: bool = True) -> str:
    """payload["abc"]: a string of at most MAX_ABC_BYTES UTF-8 bytes."""
    abc = payload.get("abc")
    if not isinstance(abc, str):
        raise RequestRefused(f"'abc' must be a string with the score text, not {_json_type(abc)}.")
    size = len(abc.encode("utf-8", "surrogatepass"))
    if size > MAX_ABC_BYTES:
        raise RequestRefused(f"The score is {size:,} bytes; the editor accepts at most {MAX_ABC_BYTES:,} bytes "
                             f"(100 kB). A generated 6-minute score is about 10 kB.", status=413)
    if not allow_empty and not abc.strip():
        raise RequestRefused("The score is empty; write a score first.")
    return abc


def _respond(payload: dict, status: int = 200) -> web.Response:
    return web.json_response(payload, status=status, headers={"Cache-Control": "no-store"})


def check_fields(payload: dict, path: str, accepted: tuple) -> None:
    """Refuse a field the route does not read (400): a misspelt one (`"max_second": 5`) would otherwise be ignored
    and its check skipped without a word (break-it review, stop 55). `accepted`: the route's fields (`ROUTES`)."""
    unknown = sorted(k for k in payload if k not in accepted)
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        names = ", ".join(_short(k) for k in unknown[:5]) + more
        raise RequestRefused(f"{path} does not read the field{'s' if len(unknown) > 1 else ''} {names}; it takes "
                             f"{', '.join(accepted)}.")


def _route(work, executor: ThreadPoolExecutor, path: str = "", accepted: tuple | None = None):
    """Wrap `work(payload) -> dict` (sync, run on `executor`) as an aiohttp handler with the error policy above;
    `accepted`: the fields the route reads (others refused: `check_fields`; None: any)."""

    async def handler(request: web.Request) -> web.Response:
        try:
            payload = await read_json_object(request)
            if accepted is not None:
                check_fields(payload, path or request.path, accepted)
            async with _WORK:
                result = await asyncio.get_running_loop().run_in_executor(executor, work, payload)
            return _respond(result)
        except RequestRefused as refused:
            return _respond({"error": str(refused), **refused.extra}, refused.status)
        except Exception as error:  # a bug: log it fully, tell the client one line
            LOG.exception("[ComfyUI-YuE2] %s failed", request.path)
            return _respond({"error": f"internal error in {request.path}: {type(error).__name__} "
                                      f"(details are in the ComfyUI log)"}, 500)

    handler.__name__ = f"yue2_{work.__name__}"
    return handler


# --- /yue2/abc/analyze ---------------------------------------------------------------------------------------------
def analyze(payload: dict) -> dict:
    """service.analyze (with the engraving's time map, SVG note ids -> seconds, when an SVG was made)."""
    from yue2_core.abc.service import analyze as analyze_score

    abc_field(payload)  # our own size/type message and 413 before the service sees it
    result = analyze_score(payload)
    if "error" in result:
        if result["error"].startswith("internal error"):
            raise RuntimeError(result["error"])  # already logged by the service
        raise RequestRefused(result["error"])
    return result  # time_map comes with the SVG (one parse for the whole answer)


# --- /yue2/abc/tool ------------------------------------------------------------------------------------------------
def run_tool(payload: dict) -> dict:
    """One score tool on the text: {"abc": new text}. A score that does not parse gives {"error", "line", ...}."""
    from yue2_core.abc import AbcError, set_tempo, silence_vocal, strip_chords, transpose

    tool = payload.get("tool")
    if tool not in TOOLS:
        raise RequestRefused(f"Unknown tool {_short(tool)}; the tools are {', '.join(TOOLS)}.")
    abc = abc_field(payload, allow_empty=False)
    arg = payload.get("arg")
    try:
        if tool == "transpose":
            if not _is_whole(arg) or not -12 <= arg <= 12:
                raise RequestRefused(f"transpose needs 'arg': a whole number of semitones from -12 to 12, not "
                                     f"{_short(arg)}.")
            return {"abc": transpose(abc, int(arg))}
        if tool == "set_tempo":
            if not _is_whole(arg) or not 1 <= arg <= 1000:
                raise RequestRefused(f"set_tempo needs 'arg': a whole number of beats per minute from 1 to 1000, not "
                                     f"{_short(arg)}.")
            return {"abc": set_tempo(abc, int(arg))}
        if tool == "strip_chords":
            return {"abc": strip_chords(abc)}
        keep_chords = True if arg is None else arg
        if not isinstance(keep_chords, bool):
            raise RequestRefused(f"silence_vocal takes 'arg': true (keep chord symbols, the default) or false, not "
                                 f"{_short(arg)}.")
        return {"abc": silence_vocal(abc, keep_chords=keep_chords)}
    except AbcError as error:
        if error.code == "internal":
            raise RuntimeError(str(error)) from None
        raise RequestRefused(f"{tool}: {error}", status=422, code=error.code, line=error.line,
                             column=error.column) from None


def _is_whole(value) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or \
        (isinstance(value, float) and math.isfinite(value) and value.is_integer())


def _short(value) -> str:
    text = json.dumps(value, ensure_ascii=True) if _json_type(value) in ("null", "boolean", "number", "string") \
        else f"a JSON {_json_type(value)}"
    return text if len(text) <= 60 else text[:57] + "..."


# --- /yue2/abc/tokens ----------------------------------------------------------------------------------------------
_TOKENIZERS: OrderedDict = OrderedDict()
_TOKENIZERS_LOCK = threading.Lock()


def count_tokens(payload: dict) -> dict:
    """Tokens of the score under the tokenizer embedded in checkpoint `ckpt_name` (a name from ComfyUI's checkpoints
    list, never a path). With `style` and `lyrics` (strings) also the semantic stage's prefix and the music budget
    left in the context (yue2_core.pipeline.music_budget)."""
    from yue2_core.constants import CONTEXT, COT_MODES, FRAMES_PER_SECOND
    from yue2_core.errors import YuE2Error

    abc = abc_field(payload)
    name = payload.get("ckpt_name")
    if not isinstance(name, str) or not name.strip():
        raise RequestRefused(f"'ckpt_name' must be the name of a checkpoint (as listed by the checkpoint loader), "
                             f"not {_short(name)}.")
    if len(name) > MAX_NAME_CHARS or "\x00" in name:
        raise RequestRefused(f"'ckpt_name' is not a checkpoint name (at most {MAX_NAME_CHARS} characters).")
    style, lyrics, cot = payload.get("style"), payload.get("lyrics"), payload.get("cot", "full")
    for field, value in (("style", style), ("lyrics", lyrics)):
        if value is not None and (not isinstance(value, str) or len(value) > MAX_PROMPT_CHARS):
            raise RequestRefused(f"'{field}' must be a string of at most {MAX_PROMPT_CHARS:,} characters, or left out.")
    if cot not in COT_MODES or cot == "off":
        raise RequestRefused("'cot' must be \"full\" or \"melody\" (a score is only used in those modes).")

    tokenizer = _tokenizer_for(name)
    try:
        answer = {"tokens": len(tokenizer.encode(abc)) if abc else 0, "ckpt_name": name, "context": CONTEXT}
        if isinstance(style, str) and isinstance(lyrics, str) and abc.strip():
            from yue2_core.pipeline import Score, music_budget
            from yue2_core.protocol import SongRequest

            # validate() names the field a surrogate is in (break-it review 53b: the tokenizer's message gave its
            # place in the whole prompt, "at character 118" for the style's first character)
            request = SongRequest(style=style, lyrics=lyrics, cot=cot).validate()
            budget = music_budget(request, Score.from_text(abc, tokenizer, cot), tokenizer)
            answer.update(prefix_tokens=budget["prefix_tokens"], music_tokens_max=budget["music_tokens_max"],
                          music_seconds_max=budget["music_tokens_max"] / FRAMES_PER_SECOND)
    except YuE2Error as error:  # text the tokenizer refuses (unpaired surrogates), an empty score
        raise RequestRefused(f"Cannot count the tokens: {error}", status=422) from None
    return answer


def _checkpoint_path(name: str) -> str:
    """Full path of checkpoint `name`, only if the YuE2 checkpoint loader lists it (a file in ComfyUI's checkpoints
    folders, a vendor model folder "<name>/", or the Hugging Face cache entry — `nodes.loader.checkpoint_options`)."""
    from .loader import checkpoint_options, not_a_file_entry, resolve_checkpoint

    if name not in checkpoint_options():
        raise RequestRefused(f"No checkpoint named {_short(name)} in ComfyUI's checkpoints folders; pick one in the "
                             f"YuE2 checkpoint loader (refresh the page after adding files).", status=404)
    path = resolve_checkpoint(name)
    if path is None:
        raise RequestRefused(not_a_file_entry(name) or f"The checkpoint {_short(name)} is listed but cannot be found "
                             "on disk.", status=404)
    return path


def _tokenizer_for(name: str):
    """The embedded tokenizer of checkpoint `name`, cached per (path, mtime, size); reads the header and the one
    tokenizer tensor, never the weights."""
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_tokenizer
    from yue2_core.errors import YuE2Error

    path = _checkpoint_path(name)
    try:
        stat = os.stat(path)
    except OSError:
        raise RequestRefused(f"The checkpoint {_short(name)} cannot be read.", status=404) from None
    key = (path, stat.st_mtime_ns, stat.st_size)
    with _TOKENIZERS_LOCK:
        if key in _TOKENIZERS:
            _TOKENIZERS.move_to_end(key)
            return _TOKENIZERS[key]
    try:
        tokenizer = load_tokenizer(inspect_checkpoint(path, own_vae="optional"))  # the tokenizer only
    except YuE2Error as error:  # not a YuE2 file, truncated, bad tokenizer blob: say so without the server's paths
        message = str(error).replace(path, name).replace(os.path.dirname(path), "<checkpoints>")
        raise RequestRefused(f"Cannot count tokens with {_short(name)}: {message}", status=422) from None
    with _TOKENIZERS_LOCK:
        _TOKENIZERS[key] = tokenizer
        while len(_TOKENIZERS) > TOKENIZER_CACHE_SIZE:
            _TOKENIZERS.popitem(last=False)
    return tokenizer


# --- /yue2/abc/last_source -----------------------------------------------------------------------------------------
def last_source(payload: dict) -> dict:
    """{"workflow": the workflow's id, "node": the editor node's id} → {"source_abc": the connected score that node
    last received in this server, or null} (`nodes.editor.remember_source`): the widget of an empty box asks after
    a run that ComfyUI answered from its cache without executing the node."""
    from .editor import last_source as recorded
    ids = []
    for key in ("workflow", "node"):
        value = payload.get(key)
        if not isinstance(value, str) or not 0 < len(value) <= 200:
            raise RequestRefused(f"'{key}' must be a string of 1–200 characters (the workflow's and the node's id), "
                                 f"not {f'{len(value)} characters' if isinstance(value, str) else _json_type(value)}")
        ids.append(value)
    return {"source_abc": recorded(*ids)}


# --- registration --------------------------------------------------------------------------------------------------
# path: (work, its thread, the fields it reads — what web/abc_editor/editor.js and yue2_abc_editor.js send)
ROUTES = {"/yue2/abc/analyze": (analyze, _SCORE_THREAD, ("abc", "engrave", "instrumental", "max_seconds")),
          "/yue2/abc/tool": (run_tool, _SCORE_THREAD, ("tool", "abc", "arg")),
          "/yue2/abc/tokens": (count_tokens, _TOKEN_THREAD, ("abc", "ckpt_name", "cot", "style", "lyrics")),
          "/yue2/abc/last_source": (last_source, _SCORE_THREAD, ("workflow", "node"))}


def _other_method(path: str, accepted: tuple):
    """The answer to any method but POST on `path`: a 405 in the routes' JSON, naming what is taken (was aiohttp's
    plain-text "405: Method Not Allowed" for PUT / DELETE / PATCH and ComfyUI's static 404 for GET: break-it review,
    stop 56)."""

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"error": f"{path} takes POST with a JSON object ({', '.join(accepted)}), not "
                                           f"{request.method[:20]}."},
                                 status=405, headers={"Allow": "POST", "Cache-Control": "no-store"})

    handler.__name__ = f"yue2_{path.rsplit('/', 1)[-1]}_other_method"
    return handler


def register(routes) -> None:
    """Add the POST routes to an aiohttp RouteTableDef (PromptServer.instance.routes), each followed by a route for
    every other method (aiohttp's "*", matched after the POST on the same path) answering a JSON 405. ComfyUI copies
    both under /api (PromptServer.add_routes copies every RouteDef of the table)."""
    for path, (work, executor, accepted) in ROUTES.items():
        routes.post(path)(_route(work, executor, path, accepted))
        routes.route("*", path)(_other_method(path, accepted))


def _register_with_comfy() -> bool:
    try:
        from server import PromptServer
    except ImportError:  # not inside ComfyUI
        return False
    instance = getattr(PromptServer, "instance", None)
    if instance is None or getattr(instance, "_yue2_abc_routes", False):
        return False  # no server running (in-process tests), or already registered by an earlier import
    register(instance.routes)
    instance._yue2_abc_routes = True
    return True


try:
    _register_with_comfy()
except Exception:  # never break the pack's import over the editor's routes
    LOG.warning("[ComfyUI-YuE2] the ABC editor's HTTP routes could not be registered; the editor widget will show "
                "an error", exc_info=True)
