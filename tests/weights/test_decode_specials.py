"""Issue #20 item 5: ids at or above EOD are named in decoded text, as the vendor's decode does.

The vendor (runtime.md §1.2) decodes with tiktoken over the ranks plus the 208 specials at 151,643 + i: ids in
[EOD, MUSIC_START) come out as their strings (`<|im_end|>`, `<abc>` …), ids from MUSIC_START up are dropped. Before
the fix both of our tokenizers dropped every id ≥ EOD, so a special in a decoded score vanished from the text the
user sees. Checked here against a tiktoken Encoding built the vendor's way over the same (small) rank table.
"""

from __future__ import annotations

import pytest

from yue2_core.constants import ABC_END, ABC_START, CODEC_OFFSET, EOD, MUSIC_END, MUSIC_START
from yue2_core.weights.synthetic_tokenizer import tokenizer_json
from yue2_core.weights.tokenizer import (QWEN_PATTERN, TiktokenTokenizer, YuE2Tokenizer, decode_runs,
                                         special_tokens)

BPE = 768  # the tiny profile's tokenizer size


@pytest.fixture(scope="module")
def json_tokenizer() -> YuE2Tokenizer:
    return YuE2Tokenizer(tokenizer_json(BPE).decode("utf-8"))


@pytest.fixture(scope="module")
def ranks(json_tokenizer) -> dict[bytes, int]:
    """The same BPE as a tiktoken rank table (the JSON's byte-level symbols mapped back to bytes)."""
    from yue2_core.weights.synthetic_tokenizer import bytes_to_unicode
    back = {c: b for b, c in bytes_to_unicode().items()}
    vocab = json_tokenizer._tok.get_vocab(with_added_tokens=False)
    return {bytes(back[c] for c in token): i for token, i in vocab.items()}


def vendor_decode(ranks: dict[bytes, int], ids: list[int]) -> str:
    """The vendor's decode: tiktoken with the specials, ids outside [0, 151,851) dropped, errors replaced."""
    import tiktoken
    specials = {s: EOD + i for i, s in enumerate(special_tokens())}
    enc = tiktoken.Encoding("YuE2", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
    keep = [i for i in ids if 0 <= i < MUSIC_START and (i < len(ranks) or i >= EOD)]
    return enc.decode_bytes(keep).decode("utf-8", errors="replace")


IDS_WITH_SPECIALS = [
    ("im_end", lambda t: t.encode("C8D8|") + [EOD + 2] + t.encode("E8|")),
    ("eod_first", lambda t: [EOD] + t.encode("X:1\nT:\n")),
    ("abc_markers", lambda t: [ABC_START] + t.encode("K:C") + [ABC_END]),
    ("extra", lambda t: t.encode("la") + [EOD + 8 + 7, EOD + 207]),
    ("protocol_and_codec_dropped", lambda t: t.encode("a") + [MUSIC_START, MUSIC_END, CODEC_OFFSET + 5, -1]),
]


@pytest.mark.parametrize("make", [m for _, m in IDS_WITH_SPECIALS], ids=[n for n, _ in IDS_WITH_SPECIALS])
def test_both_tokenizers_decode_as_the_vendor_does(make, json_tokenizer, ranks):
    ids = make(json_tokenizer)
    want = vendor_decode(ranks, ids)
    assert json_tokenizer.decode(ids) == want
    assert TiktokenTokenizer(ranks).decode(ids) == want


def test_a_special_is_named_where_it_was(json_tokenizer):
    ids = json_tokenizer.encode("C8D8|") + [EOD + 2] + json_tokenizer.encode("E8|")
    assert json_tokenizer.decode(ids) == "C8D8|<|im_end|>E8|"
    assert json_tokenizer.decode([ABC_START, EOD + 8, ABC_END]) == "<abc><extra_0></abc>"
    assert json_tokenizer.decode([MUSIC_START, CODEC_OFFSET]) == ""


def test_decode_runs_splits_text_and_names():
    assert decode_runs([1, 2, EOD + 2, 3, MUSIC_START, EOD + 4, 10**6], 1000) == [[1, 2], "<|im_end|>", [3], "<S>"]
    assert decode_runs([800, 5], 768) == [[5]]  # an id the vocabulary lacks is dropped


def test_a_score_shows_a_special_the_model_wrote(json_tokenizer):
    from yue2_core.pipeline import Score
    ids = json_tokenizer.encode("X:1\nT:\n") + [EOD + 1]
    score = Score(abc=json_tokenizer.decode(ids), abc_ids=ids, cot="full", seed=0, source="model")
    assert score.abc.endswith("<|im_start|>")
