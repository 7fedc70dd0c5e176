"""The text tokenizer: embedded in the Comfy-Org checkpoint (`text_encoders.yue2_tokenizer_json`, a U8 tensor holding a
Hugging Face `tokenizers` JSON; checkpoint_format.md §5) — `YuE2Tokenizer` — or the vendor folder's `qwen.tiktoken`
(one base64 token and its rank per line; weights_and_lora.md §4 "Tokenizer and ids") — `TiktokenTokenizer`. Both give
the same ids for the release files (the JSON vocabulary un-byte-mapped is `qwen.tiktoken` rank for rank).

Behaviour matches the official runtime's tokenizer (runtime.md §1.2): encode = NFC-normalise the whole string, then
ordinary BPE (special-token strings typed in the text are plain characters); decode writes text ids as text and the
specials (EOD … MUSIC_START − 1) by name, drops other ids and replaces invalid UTF-8. Protocol ids (EOD, ABC/MUSIC markers, codec ids) are never produced by this class: callers
insert them as integers.
"""
from __future__ import annotations

import base64
import binascii
import json
import unicodedata

import torch

from ..constants import EOD, MUSIC_START
from ..errors import RequestError, TokenizerError, json_number_too_long

#: Pre-tokenizer regex of the vendor tokenizer, verbatim (weights_and_lora.md §4; checkpoint_format.md §5).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Ranks the vendor loader requires in `qwen.tiktoken` (ids 0 … 151,642; weights_and_lora.md §4).
RELEASE_RANKS = EOD


def special_tokens() -> list[str]:
    """The 208 vendor special strings in id order: index i → id EOD + i (151,643 + i); `<abc>`/`</abc>` take list
    slots 204/205 (151,847 = ABC_START, 151,848 = ABC_END; weights_and_lora.md §4, runtime.md §1.1)."""
    extras = [{196: "<abc>", 197: "</abc>"}.get(i, f"<extra_{i}>") for i in range(200)]
    return ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<R>", "<S>", "<X>", "<mask>", "<sep>", *extras]


def decode_runs(ids, vocab_size: int) -> list:
    """What the vendor's decode makes of `ids` (runtime.md §1.2: ids outside [0, 151,851) dropped, the specials
    151,643 … 151,850 written as their strings): lists of consecutive text ids (< min(EOD, vocab_size)) to decode,
    and for each id in [EOD, MUSIC_START) its name (`<|endoftext|>`, `<|im_end|>`, `<abc>`, `<extra_7>` …), so a
    special id shows in the text a user sees instead of vanishing. Ids at or above MUSIC_START (protocol and codec
    ids) and ids the vocabulary lacks are dropped, as the vendor drops them."""
    names, runs = special_tokens(), []
    for value in ids:
        value = int(value)
        if 0 <= value < min(EOD, vocab_size):
            if not runs or isinstance(runs[-1], str):
                runs.append([])
            runs[-1].append(value)
        elif EOD <= value < MUSIC_START:
            runs.append(names[value - EOD])
    return runs


def _check_text(text) -> str:
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: the tokenizer libraries would raise a bare TypeError
        raise RequestError(f"the text contains an unpaired surrogate U+{ord(text[exc.start]):04X} at character "
                           f"{exc.start}; it is not valid Unicode and cannot be tokenized") from None
    return unicodedata.normalize("NFC", text)


class YuE2Tokenizer:
    """Wraps a `tokenizers.Tokenizer` built from the embedded JSON with its added (special) tokens removed, so text
    such as "<|endoftext|>" is encoded as ordinary characters, as the reference does."""

    def __init__(self, json_text: str):
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - dependency declared in pyproject
            raise TokenizerError("the 'tokenizers' package is required: pip install tokenizers") from exc
        try:
            doc = json.loads(json_text)
        except (ValueError, RecursionError) as exc:  # also a number past Python's digit cap, absurd nesting
            if too_long := json_number_too_long(exc):
                raise TokenizerError(f"the embedded tokenizer JSON holds {too_long}") from None
            where = (f"{exc.msg} at char {exc.pos}" if isinstance(exc, json.JSONDecodeError)
                     else str(exc).splitlines()[0][:120])
            raise TokenizerError(f"the embedded tokenizer is not valid JSON ({where})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
            raise TokenizerError("the embedded tokenizer JSON has no 'model' section (not a tokenizers document)")
        doc["added_tokens"] = []
        doc["post_processor"] = None
        try:
            self._tok = Tokenizer.from_str(json.dumps(doc))
        except Exception as exc:  # tokenizers raises a bare Exception subclass
            raise TokenizerError(f"the embedded tokenizer JSON cannot be loaded by 'tokenizers': {exc}") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=False)

    @classmethod
    def from_tensor(cls, blob: torch.Tensor) -> "YuE2Tokenizer":
        """Build from the U8 rank-1 tensor stored in the checkpoint (its length is the JSON length)."""
        if blob.dtype != torch.uint8 or blob.ndim != 1:
            raise TokenizerError(f"text_encoders.yue2_tokenizer_json must be a rank-1 uint8 tensor, got "
                                 f"{blob.dtype} {tuple(blob.shape)}")
        try:
            text = blob.cpu().numpy().tobytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TokenizerError(f"the embedded tokenizer blob is not UTF-8 (byte {exc.start})") from None
        return cls(text)

    def encode(self, text: str) -> list[int]:
        """NFC-normalise `text` and return its BPE ids (all < 151,643 for the release vocabulary)."""
        return self._tok.encode(_check_text(text), add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """Decode ids as the vendor does (`decode_runs`): text ids to text, specials by name, other ids dropped."""
        return "".join(run if isinstance(run, str) else self._tok.decode(run, skip_special_tokens=False)
                       for run in decode_runs(ids, self.vocab_size))


def read_tiktoken_ranks(path: str) -> dict[bytes, int]:
    """`qwen.tiktoken` → {token bytes: rank}: one `base64(token) rank` pair per line (blank lines ignored).
    TokenizerError naming the line for a malformed line, a duplicate token or rank, or ranks that are not exactly
    0 … n−1 (a rank is the token's id)."""
    ranks, seen = {}, set()
    try:
        with open(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                parts = line.split()
                try:
                    if len(parts) != 2:
                        raise ValueError
                    token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
                except (ValueError, binascii.Error):
                    raise TokenizerError(f"{path} line {number}: expected 'base64-token rank', got "
                                         f"{line[:60]!r}") from None
                if token in ranks or rank in seen or rank < 0:
                    raise TokenizerError(f"{path} line {number}: token or rank {rank} given twice (or negative)")
                ranks[token] = rank
                seen.add(rank)
    except OSError as exc:
        raise TokenizerError(f"cannot read {path}: {exc.strerror or exc}") from None
    if seen and max(seen) != len(seen) - 1:
        missing = next(i for i in range(len(seen)) if i not in seen)
        raise TokenizerError(f"{path}: ranks must be 0 … {len(seen) - 1} without gaps (each rank is a token id); "
                             f"rank {missing} is missing")
    return ranks


class TiktokenTokenizer:
    """The vendor tokenizer (runtime.md §1.2): a tiktoken `Encoding` named "YuE2" over the ranks of `qwen.tiktoken`,
    the Qwen pattern and the 208 specials at 151,643 + i. Same interface as `YuE2Tokenizer`: `encode` = NFC, then
    `encode_ordinary` (special strings in the text stay plain characters); `decode` as `decode_runs` (specials by
    name) and replaces invalid UTF-8; `vocab_size` = number of ranks."""

    def __init__(self, ranks: dict[bytes, int], name: str = "qwen.tiktoken"):
        try:
            import tiktoken
        except ImportError as exc:  # pragma: no cover - dependency declared in pyproject
            raise TokenizerError("the 'tiktoken' package is required for a vendor folder: pip install tiktoken") \
                from exc
        if not ranks:
            raise TokenizerError(f"{name} holds no tokens")
        specials = {s: EOD + i for i, s in enumerate(special_tokens())}
        try:
            self._enc = tiktoken.Encoding("YuE2", pat_str=QWEN_PATTERN, mergeable_ranks=ranks,
                                          special_tokens=specials)
        except Exception as exc:  # tiktoken raises ValueError/its own errors for inconsistent tables
            raise TokenizerError(f"{name} cannot be loaded by tiktoken: {exc}") from None
        self.vocab_size = len(ranks)

    @classmethod
    def from_file(cls, path: str, require: int | None = RELEASE_RANKS) -> "TiktokenTokenizer":
        """Read `qwen.tiktoken`; `require` = the exact rank count to insist on (151,643, as the vendor code does;
        None accepts any count — synthetic folders only). TokenizerError otherwise."""
        ranks = read_tiktoken_ranks(path)
        if require is not None and len(ranks) != require:
            raise TokenizerError(f"{path} has {len(ranks):,} ranks; the YuE2 tokenizer has exactly {require:,} "
                                 "(ids 0 … 151,642). A truncated or foreign table: download qwen.tiktoken again")
        return cls(ranks, name=path)

    def encode(self, text: str) -> list[int]:
        """NFC-normalise `text` and return its BPE ids (all < 151,643 for the release table)."""
        return self._enc.encode_ordinary(_check_text(text))

    def decode(self, ids) -> str:
        """Decode ids as the vendor does (`decode_runs`): text ids to text, specials by name, other ids dropped."""
        return "".join(run if isinstance(run, str) else self._enc.decode_bytes(run).decode("utf-8", errors="replace")
                       for run in decode_runs(ids, self.vocab_size))
