"""Which wide Unicode encoding a byte string is in, for the messages that refuse text files that are not UTF-8
(style, lyrics and score files of the command line, the batch command's request file)."""
from __future__ import annotations


def utf16_kind(data: bytes) -> str | None:
    """"UTF-16 LE" / "UTF-16 BE" / "UTF-32 LE" / "UTF-32 BE" when `data` is such text: its byte-order mark, or NUL
    bytes interleaved with the characters (ASCII text saved as UTF-32 without a mark: three bytes of 0 in every four;
    as UTF-16: every other byte). None otherwise."""
    if data[:4] in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff"):
        return "UTF-32 LE" if data[:4] == b"\xff\xfe\x00\x00" else "UTF-32 BE"
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "UTF-16 LE" if data[:2] == b"\xff\xfe" else "UTF-16 BE"
    pairs = len(data) // 2
    if pairs < 1 or b"\x00" not in data:
        return None
    quads = len(data) // 4
    if quads >= 1:  # UTF-32: the code point's top byte is always 0, the next one for all of the BMP (most text)
        zeros = [data[i:4 * quads:4].count(0) for i in range(4)]
        if zeros[3] >= 0.95 * quads and zeros[2] >= 0.7 * quads:
            return "UTF-32 LE"
        if zeros[0] >= 0.95 * quads and zeros[1] >= 0.7 * quads:
            return "UTF-32 BE"
    odd, even = data[1::2].count(0), data[0::2].count(0)
    if max(odd, even) >= max(2, 0.3 * pairs) and min(odd, even) <= max(odd, even) // 4:
        return "UTF-16 LE" if odd > even else "UTF-16 BE"
    return None
