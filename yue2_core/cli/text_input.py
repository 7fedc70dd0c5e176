"""Style, lyrics and score text given on the command line: files (UTF-8, size-capped) or inline options,
with the notes the request shows for line ends and invisible characters."""
from __future__ import annotations

from pathlib import Path

from ..errors import YuE2Error
from ..text_encoding import utf16_kind as _utf16_kind


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
            from ..weights.checkpoint import not_a_file
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
