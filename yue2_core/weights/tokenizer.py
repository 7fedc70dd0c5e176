"""The text tokenizer embedded in the Comfy-Org checkpoint (`text_encoders.yue2_tokenizer_json`, a U8 tensor holding a
Hugging Face `tokenizers` JSON; checkpoint_format.md §5).

Behaviour matches the official runtime's tokenizer (runtime.md §1.2): encode = NFC-normalise the whole string, then
ordinary BPE (special-token strings typed in the text are plain characters); decode keeps only ids in [0, EOD) and
replaces invalid UTF-8. Protocol ids (EOD, ABC/MUSIC markers, codec ids) are never produced by this class: callers
insert them as integers.
"""
from __future__ import annotations

import json
import unicodedata

import torch

from ..constants import EOD
from ..errors import RequestError, TokenizerError


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
        except json.JSONDecodeError as exc:
            raise TokenizerError(f"the embedded tokenizer is not valid JSON ({exc.msg} at char {exc.pos})") from None
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
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: `tokenizers` would raise a bare TypeError
            raise RequestError(f"the text contains an unpaired surrogate U+{ord(text[exc.start]):04X} at character "
                               f"{exc.start}; it is not valid Unicode and cannot be tokenized") from None
        return self._tok.encode(unicodedata.normalize("NFC", text), add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """Decode ids, dropping any outside [0, EOD) (protocol ids have no text)."""
        keep = [int(i) for i in ids if 0 <= int(i) < min(EOD, self.vocab_size)]
        return self._tok.decode(keep, skip_special_tokens=False)
